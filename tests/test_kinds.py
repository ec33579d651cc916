"""The data family (``data.kind``) and Nichani et al.'s member: the graph sampler against its
closed-form conditional laws, the graphs against their repository's construction, the Bayes counts
against a per-sequence loop, the member's loss against an independent transcription of their
reduced model and its gradient against finite differences, and the refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gflow
from gflow.config import from_dict
from gflow.core import DataConfig, ModelConfig, graph_parents, init_params, kind_of, make_loss, sample
from gflow.core._loss import EstimatorConfig

jax.config.update("jax_enable_x64", True)


def _graph(**kw):
    return DataConfig(kind="graph", parents=[1], **kw)


def test_named_graphs_are_the_repository_graphs():
    """single_parent.py builds 0-based dags over seq_len − 1 positions (−1 a root); ours are 1-based."""
    T = 9
    chain = np.arange(T - 1) - 1
    icl = np.full(T - 1, -1)
    icl[1::2] = 2 * np.arange((T - 1) // 2)
    for name, dag in (("chain", chain), ("icl", icl)):
        np.testing.assert_array_equal(graph_parents(_graph(L=T, graph=name)), dag + 1)
    r = graph_parents(_graph(L=40, graph="random", graph_seed=3))
    assert r[0] == 0 and np.all(r < np.arange(1, 40)) and np.all(r >= 0)
    assert not np.array_equal(r, graph_parents(_graph(L=40, graph="random", graph_seed=4)))  # the seed is read
    np.testing.assert_array_equal(graph_parents(_graph(L=4, graph=[0, 1, 1])), [0, 1, 1])


@pytest.mark.parametrize("graph", ["chain", "icl", [0, 1, 1, 2, 0, 3]])
def test_graph_sampler_matches_its_conditional_laws(graph):
    """Given π: a root ~ μ_π, a child ~ π(·|x_{p(i)}), the query ~ Unif[d], y ~ π(·|x_L) = cond. Each
    indicator minus its conditional probability has mean 0: within 4.5 SEs, every position, token."""
    d, L, N = 3, 7, 20000
    data = _graph(d=d, L=L, alpha=1.0, graph=graph)
    smp = sample(data, N, key=jax.random.key(1))
    X, pi, y = np.asarray(smp.X), np.asarray(smp.pi), np.asarray(smp.y)
    mu = np.stack([np.linalg.matrix_power(p, 200)[0] for p in pi])  # stationary law of each π
    par = graph_parents(data)
    rows = np.arange(N)
    for i in range(L + 1):
        if i == L:  # the target
            x, p = y, np.asarray(smp.cond)
        elif i == L - 1:  # the query
            x, p = X[:, i], np.full((N, d), 1.0 / d)
        else:
            x, p = X[:, i], (mu if par[i] == 0 else pi[rows, X[:, par[i] - 1]])
        resid = (x[:, None] == np.arange(d)) - p
        z = resid.mean(0) / (resid.std(0) / np.sqrt(N))
        assert np.all(np.abs(z) < 4.5), (i, z)
    np.testing.assert_array_equal(np.asarray(smp.cond), pi[rows, X[:, -1]])  # the expected target
    np.testing.assert_array_equal(np.asarray(smp.zq), X[:, -1])
    # deterministic in the key
    np.testing.assert_array_equal(np.asarray(sample(data, N, key=jax.random.key(1)).X), X)


def test_graph_bayes_counts_are_the_repository_counts():
    """n(e) = #{i < L: p(i) ≠ 0, x_{p(i)} = x_L, x_i = e}, by a loop over sequences and positions."""
    data = _graph(d=3, L=9, graph="random", graph_seed=2)
    smp = sample(data, 50, key=jax.random.key(0))
    X = np.asarray(smp.X)
    par = graph_parents(data)
    want = np.zeros((50, 3))
    for n in range(50):
        for i in range(data.L - 1):
            if par[i] and X[n, par[i] - 1] == X[n, -1]:
                want[n, X[n, i]] += 1
    np.testing.assert_array_equal(np.asarray(kind_of(data).bayes_counts(data, X)), want)


def _reference_loss(A, a, X, cond, eps):
    """Their reduced model, written from the description (numpy, one sequence): layer 1
    h_l = Σ_{j≤l} softmax(A[l, :l+1]) e(x_j); layer 2 from the query x_L over the keys l < L,
    ŷ = Σ_l softmax(a ⟨e(x_L), h_l⟩) e(x_l); loss −Σ_e π(e|x_L) log(ŷ_e + ε)."""
    L, d = len(X), len(cond)
    E = np.eye(d)[X]
    h = np.zeros((L, d))
    for l in range(L):
        s = np.exp(A[l, : l + 1] - A[l, : l + 1].max())
        h[l] = (s / s.sum()) @ E[: l + 1]
    score = a * h[: L - 1] @ E[L - 1]
    w = np.exp(score - score.max())
    yhat = (w / w.sum()) @ E[: L - 1]
    return -np.sum(cond * np.log(yhat + eps))


def test_nichani_loss_is_their_reduced_model_and_its_gradient_is_the_derivative():
    data = _graph(d=3, L=8, alpha=1.0, graph="icl")
    model = ModelConfig(member="nichani", H=1, D=1, M=1)
    est = EstimatorConfig(N=40, seed=0, layout="positions")
    loss = make_loss(data, model, est)
    rng = np.random.default_rng(0)
    p = init_params(model, d=3, L=8)
    A = rng.normal(size=(1, 8, 8))
    p = p.with_blocks({"A1": jnp.asarray(A), "a": jnp.asarray(1.7)})
    smp = sample(data, 40, key=jax.random.key(0))
    want = [_reference_loss(A[0], 1.7, np.asarray(smp.X[n]), np.asarray(smp.cond[n]), est.eps) for n in range(40)]
    np.testing.assert_allclose(np.asarray(loss.per_sequence(p)), want, rtol=1e-12)
    # the gradient against central differences, along a random direction of (A1, a)
    g = jax.grad(lambda q: loss(q))(p)
    dA, da = rng.normal(size=A.shape), 0.3
    h = 1e-5
    f = lambda s: float(loss(p.with_blocks({"A1": jnp.asarray(A + s * dA), "a": jnp.asarray(1.7 + s * da)})))
    fd = (f(h) - f(-h)) / (2 * h)
    exact = float(jnp.sum(g.get("A1") * dA) + g.a * da)
    assert abs(fd - exact) < 1e-7 * max(1.0, abs(exact))
    # entries above the diagonal are never read
    assert float(jnp.max(jnp.abs(jnp.triu(g.get("A1")[0], 1)))) == 0.0


def test_nichani_flow_learns_the_chain():
    """Their headline at a tiny size: after Stage II (A⁽¹⁾ at fixed a) every non-root position of the
    chain attends mostly to its parent, more than to any other position, and the loss went down."""
    cfg = from_dict({"data": {"kind": "graph", "graph": "chain", "parents": [1], "d": 3, "alpha": 1.0, "L": 8},
                     "model": {"member": "nichani", "H": 1, "D": 1, "M": 1}, "init": {"a0": 0.5},
                     "schedule": {"durations": [1.0, 3e4, 1.0]}, "estimator": {"N": 400}})  # fmt: skip
    traj = gflow.integrate(cfg)
    A = traj.state(-1)["A1"][0]
    z = np.where(np.tril(np.ones((8, 8), bool)), A, -np.inf)
    s = np.exp(z - z.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    on_parent = np.array([s[i, i - 1] for i in range(1, 7)])  # positions 2..7 (position 8 is the query)
    assert np.all(on_parent > 0.5), on_parent
    assert np.all(on_parent >= s[1:7].max(-1) - 1e-12)
    assert traj.loss[-1] < traj.loss[0]
    assert traj.stages[0].t1 == 0.0 and traj.stages[0].ended_by == "event"  # no selector: Stage I is empty


@pytest.mark.parametrize(
    "kw, key",
    [
        (dict(graph="icl"), "data.graph"),
        (dict(graph_seed=3), "data.graph_seed"),
        (dict(kind="graph"), "data.parents"),
        (dict(kind="graph", parents=[1], graph="tree"), "data.graph"),
        (dict(kind="graph", parents=[1], L=4, graph=[0, 1]), "data.graph"),
        (dict(kind="graph", parents=[1], L=4, graph=[0, 2, 1]), "data.graph"),
        (dict(kind="graph", parents=[1], start="uniform"), "data.start"),
        (dict(kind="tree"), "data.kind"),
    ],
)
def test_bad_data_is_refused_by_name(kw, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        DataConfig(**kw)


def test_bad_nichani_model_and_layout_are_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"model\.H must be 1"):
        ModelConfig(member="nichani", H=2, D=1, M=2)
    with pytest.raises(ValueError, match=r"model\.D must be 1"):
        ModelConfig(member="nichani", H=1, D=0, M=1)
    from gflow.cli import main

    out = tmp_path / "r"
    argv = ["run", "scripts/configs/nichani.toml", "--out", str(out), "--param", "estimator.layout=counts", "--dry-run"]
    assert main(argv) == 2
    assert "estimator.layout" in capsys.readouterr().err and not out.exists()


def _edelman_reference(v, W, X, cond):
    """Their min_model.forward at the last position, written from the repository (numpy, one
    sequence), with the causal mask applied: layer 1 attention[s, j] = softmax_j(v[s−j]) for
    j ≤ s; layer 2 logits = Σ_{s≤L} (x_Lᵀ W h_s) e(x_s); cross-entropy of softmax(logits)."""
    L, d = len(X), len(cond)
    E = np.eye(d)[X]
    pos = np.arange(L)[:, None] - np.arange(L)[None, :]
    att = np.where(pos >= 0, v[np.clip(pos, 0, None)], -np.inf)
    att = np.exp(att - att.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    h = att @ E
    logits = ((E @ W) @ h.T)[-1] @ E  # e_Lᵀ W h_s summed against e(x_s)
    logp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    return -np.sum(cond * logp)


def test_edelman_loss_is_their_minimal_model():
    data = DataConfig(d=3, parents=[1], alpha=1.0, L=10)
    model = ModelConfig(member="edelman", H=1, D=1, M=1)
    est = EstimatorConfig(N=30, seed=2, loss="ce_on_probs", eps=0.0)
    loss = make_loss(data, model, est)
    rng = np.random.default_rng(1)
    v, W = rng.normal(size=10), rng.normal(size=(3, 3))
    p = init_params(model, d=3, L=10).with_blocks({"v": jnp.asarray(v), "W": jnp.asarray(W)})
    smp = sample(data, 30, key=jax.random.key(2))
    want = [_edelman_reference(v, W, np.asarray(smp.X[n]), np.asarray(smp.cond[n])) for n in range(30)]
    np.testing.assert_allclose(np.asarray(loss.per_sequence(p)), want, rtol=1e-12)
    # their start: v = 0, W = 0.01 everywhere
    p0 = init_params(model, d=3, L=10)
    assert float(jnp.max(jnp.abs(p0.get("v")))) == 0.0 and np.all(np.asarray(p0.get("W")) == 0.01)
    with pytest.raises(ValueError, match=r"estimator\.loss must be 'ce_on_probs'"):
        make_loss(data, model, EstimatorConfig(N=30))(p0)
    with pytest.raises(ValueError, match=r"estimator\.loss must be 'ce_on_probs'"):  # a run: before any compute
        from_dict({"data": {"parents": [1]}, "model": {"member": "edelman", "H": 1, "D": 1, "M": 1}})


def test_attention_along_the_sequence_for_every_positional_member():
    """gflow.attention: the paper's RPE laid along the sequence (closed form at the start), the
    absolute member at its Toeplitz start equal to it, Nichani's and Edelman's rows summing to one."""
    from gflow.core import sequence_attention

    L = 7
    m = ModelConfig()  # the paper's, H = M = 3 aligned
    p = init_params(m, d=3, L=L)
    A = sequence_attention(m, p.blocks(), L)
    s = np.exp(np.asarray(p.w)) / np.exp(np.asarray(p.w)).sum(-1, keepdims=True)
    for h in range(3):
        for l in range(L):
            for j in range(L):
                want = s[h, l - j - 1] if 1 <= l - j <= 3 else 0.0
                assert abs(A[h, l, j] - want) <= 1e-15
    np.testing.assert_allclose(A[:, 3:].sum(-1), 1.0, rtol=1e-14)  # full windows
    ab = ModelConfig(member="absolute")
    np.testing.assert_allclose(sequence_attention(ab, init_params(ab, d=3, L=L).blocks(), L), A, rtol=1e-14)
    sh = ModelConfig(windows="shifted", M=2)
    S = sequence_attention(sh, init_params(sh, d=3, L=L).blocks(), L)
    assert S[2, 6, 3] > 0 and S[2, 6, 4] == 0  # head 3 reads offsets 3, 4
    for member in ("nichani", "edelman"):
        mm = ModelConfig(member=member, H=1, D=1, M=1)
        pp = init_params(mm, d=3, L=L)
        blocks = {b: np.random.default_rng(0).normal(size=np.shape(v)) for b, v in pp.blocks().items()}
        R = sequence_attention(mm, blocks, L)
        np.testing.assert_allclose(R.sum(-1), 1.0, rtol=1e-14)
        assert np.all(np.triu(R[0], 1) == 0)
    with pytest.raises(ValueError, match="reads the tokens"):
        sequence_attention(ModelConfig(member="token"), {}, L)
    traj = gflow.integrate(from_dict({"data": {"L": 12}, "estimator": {"N": 50}, "schedule": {"durations": [1, 1, 1]}}))
    assert abs(gflow.attention(traj, 0)[0, 5, 4] - s[0, 0]) <= 1e-15
    with pytest.raises(ValueError, match="outside the run's"):
        gflow.attention(traj, len(traj.ts))


def test_graph_chi2_mi_follows_the_data_processing_inequality():
    """Along the chain the information falls with the distance (strictly, for generic kernels);
    positions of different roots (icl pairs) share none; the unigram prior's i.i.d. tokens none."""
    from gflow.theory import graph_chi2_mi

    chain = graph_chi2_mi(_graph(d=3, L=8, alpha=1.0, graph="chain"), n_pi=40)
    for i in range(2, 7):
        row = chain[i, :i][::-1]  # distance 1, 2, …
        assert np.all(np.diff(row) < 0) and row[-1] > 0
    icl = graph_chi2_mi(_graph(d=3, L=8, alpha=1.0, graph="icl"), n_pi=40)
    assert icl[1, 0] > 0 and icl[3, 2] > 0 and icl[3, 1] == 0 and icl[2, 1] == 0
    np.testing.assert_allclose(icl[1, 0], chain[1, 0], rtol=1e-12)  # one edge, the same kernels
    uni = graph_chi2_mi(_graph(d=3, L=8, alpha=1.0, graph="chain", prior="unigram"), n_pi=10)
    assert np.max(np.abs(uni)) < 1e-10
