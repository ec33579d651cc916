"""Bietti et al.'s setting: the triggers data kind (``data.kind = "triggers"``) and their model
(``model.member = "bietti"``). The sampler against its closed-form laws, the Bayes rung and the
output positions against per-sequence loops written from their ``ihead_data.py``, the member's loss
against an independent transcription of their ``ihead_basic_model.py`` forward pass (identity
embeddings in a residual stream wide enough to hold every part), its gradient against finite
differences and the zero start's vanishing gradients, and the refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gflow.config import from_dict
from gflow.core import DataConfig, ModelConfig, init_params, kind_of, make_loss, sample
from gflow.core._loss import EstimatorConfig

jax.config.update("jax_enable_x64", True)


def _trig(**kw):
    base = dict(kind="triggers", d=6, parents=[1], alpha=0.5, L=30, triggers=1, bigram_seed=3)
    return DataConfig(**{**base, **kw})


def _bigram_and_law(data):
    """π_b drawn as the docs say (numpy's default_rng(bigram_seed), Dirichlet rows), and its
    stationary law from the eigenvector of π_bᵀ (independent of gflow's GTH reduction)."""
    P = np.random.default_rng(data.bigram_seed).dirichlet(np.full(data.d, data.alpha), size=data.d)
    w, V = np.linalg.eig(P.T)
    mu = np.real(V[:, np.argmin(np.abs(w - 1))])
    return P, mu / mu.sum()


def test_triggers_sampler_matches_its_laws():
    """The first token's law is μ_b, a non-trigger token's successor law is π_b's row, a trigger is
    always followed by the same token within a sequence, the outputs are uniform, the fixed trigger
    is the most probable token; every count within 5 standard errors."""
    data = _trig()
    P, mu = _bigram_and_law(data)
    N = 4000
    s = sample(data, N, key=jax.random.key(7))
    X = np.concatenate([np.asarray(s.X), np.asarray(s.y)[:, None]], 1)
    q = int(np.argmax(mu))
    first = np.bincount(X[:, 0], minlength=data.d) / N
    assert np.all(np.abs(first - mu) <= 5 * np.sqrt(mu * (1 - mu) / N) + 1e-12)
    a, b = X[:, :-1].ravel(), X[:, 1:].ravel()
    keep = a != q
    n = np.zeros((data.d, data.d))
    np.add.at(n, (a[keep], b[keep]), 1.0)
    for r in range(data.d):
        if r == q:
            continue
        se = np.sqrt(P[r] * (1 - P[r]) / n[r].sum())
        assert np.all(np.abs(n[r] / n[r].sum() - P[r]) <= 5 * se + 1e-12), r
    outs = []
    for x in X:
        succ = {int(x[t + 1]) for t in range(len(x) - 1) if x[t] == q}
        assert len(succ) <= 1
        outs += list(succ)
    f = np.bincount(outs, minlength=data.d) / len(outs)
    assert np.all(np.abs(f - 1 / data.d) <= 5 * np.sqrt((1 / data.d) * (1 - 1 / data.d) / len(outs)))


def test_random_triggers_follow_sampling_without_replacement():
    """``trigger_mode = "random"``, K = 2: the chance that token e is a trigger is the successive
    (without replacement) law of their ``rng.choice(p=marginal, replace=False)``:
    ``μ_e + Σ_{f≠e} μ_f μ_e / (1 − μ_f)``, within 5 standard errors."""
    data = _trig(trigger_mode="random", triggers=2)
    _, mu = _bigram_and_law(data)
    N = 6000
    s = sample(data, N, key=jax.random.key(1))
    P = _bigram_and_law(data)[0]
    is_trig = np.any(np.asarray(s.pi) != P[None], axis=-1)  # (N, d)
    assert np.all(is_trig.sum(1) == 2)
    want = np.array([mu[e] + sum(mu[f] * mu[e] / (1 - mu[f]) for f in range(data.d) if f != e)
                     for e in range(data.d)])  # fmt: skip
    got = is_trig.mean(0)
    assert np.all(np.abs(got - want) <= 5 * np.sqrt(want * (1 - want) / N))


def _outs_loop(x, triggers):
    """Their ``outputs_seq`` (``ihead_data.py``'s ``gen_seq`` with ``output_counter``): at a trigger,
    the count of its occurrences so far; 0 elsewhere."""
    cnts, out = {}, []
    for t in x:
        if int(t) in triggers:
            cnts[int(t)] = cnts.get(int(t), 0) + 1
            out.append(cnts[int(t)])
        else:
            out.append(0)
    return np.array(out)


def test_bayes_rung_and_output_positions_are_the_per_sequence_rules():
    """The Bayes predictive of every position from a loop over the prefix (the output seen after
    the trigger's earlier occurrence; uniform at its first; π_b's row elsewhere), and the output
    positions their ``outs >= 2``."""
    data = _trig(triggers=2, d=6, L=20)
    P, _ = _bigram_and_law(data)
    s = sample(data, 50, key=jax.random.key(2))
    k = kind_of(data)
    bayes = np.asarray(k.bayes_every(data, s.X, s.pi))
    mask = np.asarray(k.output_positions(data, s.X, s.pi))
    from gflow.core._kinds import fixed_triggers

    trig = {int(e) for e in fixed_triggers(data)}
    for n in range(50):
        x = np.asarray(s.X[n])
        for t in range(data.L):
            if int(x[t]) in trig:
                prev = [u for u in range(t) if x[u] == x[t]]
                want = np.eye(data.d)[x[prev[0] + 1]] if prev else np.full(data.d, 1 / data.d)
            else:
                want = P[x[t]]
            np.testing.assert_allclose(bayes[n, t], want, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(mask[n], _outs_loop(x, trig) >= 2)


def _bietti_reference(v, WK, WO, WF, X, d):
    """Their Transformer.forward (ihead_basic_model.py), transcribed in numpy for one sequence with
    identity embeddings: the residual stream has four blocks, the token (d), the position (L),
    layer 1's output (d) and layer 2's value (d); ``dim = 3d + L``. Layer 1: wq = identity, wk on
    the positions (score of t on s = v[t − s], times √dim to undo their 1/√dim), wv (frozen) copies
    the token block into the layer-1 block, wo identity. Layer 2: wq identity, wk maps the layer-1
    block into the token block by W_K², wv (frozen) copies the token block into the value block,
    wo identity. Output: W_F on the token block, W_O² on the value block."""
    L = len(X)
    dim = 3 * d + L
    tok = np.zeros((d, dim))
    tok[:, :d] = np.eye(d)
    pe = np.zeros((L, dim))
    pe[:, d : d + L] = np.eye(L)
    sq = np.sqrt(dim)
    wk0 = np.zeros((dim, dim))
    for t in range(L):
        for u in range(t + 1):
            wk0[d + t, d + u] = v[t - u] * sq
    wv0 = np.zeros((dim, dim))
    wv0[d + L : 2 * d + L, :d] = np.eye(d)
    wk1 = np.zeros((dim, dim))
    wk1[:d, d + L : 2 * d + L] = WK * sq
    wv1 = np.zeros((dim, dim))
    wv1[2 * d + L :, :d] = np.eye(d)
    out = np.zeros((d, dim))
    out[:, :d] = WF.T
    out[:, 2 * d + L :] = WO.T
    mask = np.triu(np.full((L, L), -np.inf), 1)

    def attention(x, wk, wv):  # Attention.forward, one head, wq = wo = identity
        scores = x @ (x @ wk.T).T / sq + mask
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        return scores @ (x @ wv.T)

    h = tok[X] + pe
    h = h + attention(h, wk0, wv0)  # no_ffn: x + h
    h = h + attention(h, wk1, wv1)
    return h @ out.T  # (L, d) logits


def test_bietti_loss_is_their_forward_pass():
    data = _trig(d=5, L=12, triggers=2)
    model = ModelConfig(member="bietti", H=1, D=1, M=1)
    est = EstimatorConfig(N=20, seed=4, loss="ce_on_probs", eps=0.0, positions="all")
    loss = make_loss(data, model, est)
    rng = np.random.default_rng(5)
    v, WK, WO, WF = rng.normal(size=12), rng.normal(size=(5, 5)), rng.normal(size=(5, 5)), rng.normal(size=(5, 5))
    p = init_params(model, d=5, L=12).with_blocks({k: jnp.asarray(x) for k, x in
                                                    dict(v=v, WK=WK, WO=WO, WF=WF).items()})  # fmt: skip
    s = sample(data, 20, key=jax.random.key(4))
    want = []
    for n in range(20):
        lg = _bietti_reference(v, WK, WO, WF, np.asarray(s.X[n]), 5)
        logp = lg - lg.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        pi = np.asarray(s.pi[n])
        target = pi[np.asarray(s.X[n])]  # position t's target: the kernel's row of x_t
        want.append(np.mean(-np.sum(target * logp, -1)))
    np.testing.assert_allclose(np.asarray(loss.per_sequence(p)), want, rtol=1e-11)


def test_bietti_gradient_is_the_derivative_and_the_zero_start_is_partly_forced():
    """A central finite difference along a random direction; at the zero start ∂L/∂W_K² and ∂L/∂v
    vanish exactly while ∂L/∂W_O² and ∂L/∂W_F do not (the forced part of the top-down order)."""
    data = _trig(d=4, L=16, triggers=1)
    model = ModelConfig(member="bietti", H=1, D=1, M=1, random_init=0.3)
    loss = make_loss(data, model, EstimatorConfig(N=40, loss="ce_on_probs", eps=0.0, positions="outputs"))
    p = init_params(model, d=4, L=16)
    g = loss.grad(p)
    rng = np.random.default_rng(0)
    dirn = {k: rng.normal(size=np.shape(x)) for k, x in p.x.items()}
    h = 1e-5
    f = lambda s: float(loss(p.with_blocks({k: p.get(k) + s * dirn[k] for k in dirn})))  # noqa: E731
    fd = (f(h) - f(-h)) / (2 * h)
    an = sum(float(jnp.sum(g.x[k] * dirn[k])) for k in dirn)
    assert abs(fd - an) <= 1e-7 * max(1.0, abs(an))
    zero = make_loss(data, ModelConfig(member="bietti", H=1, D=1, M=1),
                     EstimatorConfig(N=40, loss="ce_on_probs", eps=0.0, positions="all"))  # fmt: skip
    g0 = zero.grad(init_params(ModelConfig(member="bietti", H=1, D=1, M=1), d=4, L=16))
    assert float(jnp.max(jnp.abs(g0.x["WK"]))) == 0.0 and float(jnp.max(jnp.abs(g0.x["v"]))) == 0.0
    assert float(jnp.max(jnp.abs(g0.x["WO"]))) > 1e-3 and float(jnp.max(jnp.abs(g0.x["WF"]))) > 1e-3


@pytest.mark.parametrize(
    "kw, key",
    [
        (dict(triggers=4), "data.triggers must be an integer in [1, d // 2 = 3]"),
        (dict(triggers=0), "data.triggers"),
        (dict(trigger_mode="all"), "data.trigger_mode"),
        (dict(parents=[1, 2]), "data.parents"),
        (dict(prior="unigram"), "data.prior"),
        (dict(kind="ngram", triggers=1), "data.triggers is an option of data.kind in ('triggers',)"),
    ],
)
def test_bad_triggers_data_is_refused_by_name(kw, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.").replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):  # fmt: skip
        _trig(**kw)


def test_outputs_positions_need_triggers_and_refusals_write_nothing(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"estimator\.positions = 'outputs'.*data\.kind = 'triggers'"):
        from_dict({"data": {"parents": [1], "d": 3}, "model": {"member": "bietti", "H": 1, "D": 1, "M": 1},
                   "estimator": {"loss": "ce_on_probs", "positions": "outputs"}})  # fmt: skip
    from gflow.cli import main

    for param in ("data.triggers=5", "estimator.positions=outputs", "data.graph=icl"):
        out = tmp_path / "r"
        argv = ["run", "scripts/configs/bietti.toml", "--out", str(out), "--param", param, "--dry-run"]
        if param.startswith("estimator"):
            argv += ["--param", "data.kind=ngram", "--param", "data.triggers=0"]
        assert main(argv) == 2, param
        err = capsys.readouterr().err
        assert param.split("=")[0] in err and not out.exists(), err


def test_zero_start_orders_the_blocks_by_their_powers_of_t():
    """From the zero start the flow moves W_O² and W_F at O(t) (their gradients are non-zero at
    t = 0), W_K² at O(t²) (its gradient is bilinear in W_O²: layer 2's output Σ A W_O²[x_s] does not
    depend on A while W_O² = 0) and layer 1's v at O(t⁴) (its gradient needs W_K² ≠ 0 to move the
    scores and W_O² ≠ 0 to move the output: O(t²·t)). The slopes of log‖Δ‖ against log t over the
    first saved times are 1, 1, 2, 4 to 0.01: the part of the top-down order the zero start forces."""
    import gflow

    cfg = gflow.Config().replace(
        data=dict(kind="triggers", d=4, parents=[1], alpha=0.5, L=16, triggers=1),
        model=dict(member="bietti", H=1, D=1, M=1),
        schedule=dict(kind="joint", t1=0.02),
        solver=dict(save_per_decade=8, tau_min=1e-4),
        estimator=dict(N=100, loss="ce_on_probs", eps=0.0, positions="all"),
    )
    tr = gflow.integrate(cfg)
    t = np.asarray(tr.ts)
    keep = t > 0
    for block, power in (("WO", 1), ("WF", 1), ("WK", 2), ("v", 4)):
        x = np.asarray(tr.x[block])
        n = np.sqrt(((x - x[0]) ** 2).reshape(len(t), -1).sum(-1))
        slope = np.polyfit(np.log(t[keep]), np.log(n[keep]), 1)[0]
        assert abs(slope - power) < 0.01, (block, slope)
