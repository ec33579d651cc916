"""The model family (gflow.core.AbstractModel and its members): every member against its
definition, against the paper's model at neutral values, against finite differences, across
layouts, and the relabelling symmetry (docs/guides/models.md, docs/theory/mathematics.md §M10)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gflow
from gflow.core import (
    MEMBERS,
    DataConfig,
    EstimatorConfig,
    InitConfig,
    ModelConfig,
    Params,
    PopulationLoss,
    Sample,
    features,
    init_params,
    make_loss,
    member_of,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import official_full  # noqa: E402

# The estimator's calls go through helpers' compiled wrappers: called eagerly, each of their few
# hundred primitives is compiled on its own (measured: 453 compilations, 13 s of 20, in one test
# of this module).
from helpers import loss_grad, loss_per_sequence, loss_value, loss_value_and_grad  # noqa: E402

DATA = DataConfig(L=12)
MEMBER_OPTIONS = {  # one configuration of every member, off its neutral values where it has some
    "paper": {},
    "token": {"token_init": 0.3},
    "token_factorised": {"token_form": "factorised", "token_init": 0.5},
    "value": {"value_init": 0.8},
    "value_ln": {"layernorm": True},
    "full": {"proj_init": 0.5},
    "full_layer": {"proj_init": 0.5, "norm": "layer"},
    "absolute": {},
    "residual": {},
    "linear_query": {},
    "linear_output": {"omega0": 2.0},
    "bilinear": {},
    "nichani": {"H": 1, "D": 1, "M": 1},
    "edelman": {"H": 1, "D": 1, "M": 1},
    "bietti": {"H": 1, "D": 1, "M": 1, "random_init": 0.1},
}


def _model(key: str) -> ModelConfig:
    name = {"token_factorised": "token", "value_ln": "value", "full_layer": "full"}.get(key, key)
    return ModelConfig(member=name, **MEMBER_OPTIONS[key])


def _theta(model: ModelConfig, d: int = 3, L: int = 12, seed: int = 1) -> Params:
    """θ₀ of the member, moved off its starting point by a random perturbation (so that every
    block's gradient is generic)."""
    p = init_params(model, InitConfig(), d=d, L=L)
    rng = np.random.default_rng(seed)
    blocks = {b: jnp.asarray(np.asarray(v) + 0.3 * rng.normal(size=np.shape(v))) for b, v in p.blocks().items()}
    blocks["a"] = jnp.asarray(1.3)
    return Params.from_blocks(blocks)


def test_registry_names_every_member_and_members_declare_their_blocks():
    assert tuple(MEMBERS) == ("paper", "token", "value", "full", "absolute", "residual", "linear_query",
                              "linear_output", "bilinear", "nichani", "edelman", "bietti")  # fmt: skip
    for key in MEMBER_OPTIONS:
        model = _model(key)
        m = member_of(model)
        p = init_params(model, InitConfig(), d=3, L=12)
        moves = m.stage_moves
        assert set(moves) == {"I", "II", "III", "joint"}
        trained = set(moves["I"]) | set(moves["II"]) | set(moves["III"])
        assert trained == set(moves["joint"]) and trained <= set(p.names), key
        assert {m.block_group(b) for b in p.names} <= {"w", "C", "a"}
        assert m.auto_layout(3) in m.layouts


def test_unknown_member_and_foreign_options_name_the_key():
    with pytest.raises(ValueError, match=r"model.member must be one of \('paper', 'token'"):
        ModelConfig(member="transformer")
    with pytest.raises(ValueError, match=r"model.token_form = 'factorised' is an option of model.member in \('token',\)"):
        ModelConfig(token_form="factorised")
    with pytest.raises(ValueError, match=r"model.layernorm = True is an option of model.member in \('value',\)"):
        ModelConfig(member="full", layernorm=True)
    with pytest.raises(ValueError, match=r"model.D must be an integer in \[0, H\+1=4 for model.member = 'residual'\]"):
        ModelConfig(member="residual", D=5)
    with pytest.raises(ValueError, match=r"estimator.layout must be one of \('auto', 'positions'\) for model.member = 'absolute'"):
        make_loss(DATA, ModelConfig(member="absolute"), EstimatorConfig(N=8, layout="counts"))


@pytest.mark.parametrize("key", ["token", "value", "absolute", "residual"])
def test_neutral_values_give_the_papers_model(key):
    """Token matrix 0, value matrix I without LayerNorm, absolute bands at the RPE's Toeplitz
    values, no residual (c_S = 0 on the sets holding the token): the loss and the gradient of
    the paper's blocks are the paper's, to 1e-12, in every layout the member has."""
    model = ModelConfig(member=key)
    paper = ModelConfig()
    pp = _theta(paper)
    blocks = init_params(model, InitConfig(), d=3, L=12).blocks()
    blocks.update(w=pp.w, a=pp.a)
    if key == "residual":
        C = dict(zip(paper.subsets, np.asarray(pp.C)))
        blocks["C"] = jnp.asarray([C.get(S, 0.0) for S in model.subsets])
    else:
        blocks["C"] = pp.C
    if key == "absolute":
        blocks["pos"] = jnp.broadcast_to(pp.w[:, None, :], blocks["pos"].shape)
    p = Params.from_blocks(blocks)
    ref = make_loss(DATA, paper, EstimatorConfig(N=64))
    v0, g0 = loss_value_and_grad(ref, pp)
    for layout in member_of(model).layouts:
        loss = make_loss(DATA, model, EstimatorConfig(N=64, layout=layout))
        v, g = loss_value_and_grad(loss, p)
        assert abs(float(v - v0)) < 1e-12, layout
        assert float(jnp.max(jnp.abs(g.a - g0.a))) < 1e-12
        if key == "absolute":  # the RPE's gradient is the sum of the bands' gradient along each diagonal
            np.testing.assert_allclose(np.asarray(g.x["pos"].sum(1)), np.asarray(g0.w), rtol=0, atol=1e-12)
            assert float(jnp.max(jnp.abs(g.w))) == 0.0  # w is unread
        else:
            np.testing.assert_allclose(np.asarray(g.w), np.asarray(g0.w), rtol=0, atol=1e-12)
        gC = np.asarray(g.C)
        if key == "residual":
            gC = np.asarray([gC[model.subsets.index(S)] for S in paper.subsets])
        np.testing.assert_allclose(gC, np.asarray(g0.C), rtol=0, atol=1e-12)


@pytest.mark.parametrize("key", ["token", "value", "residual"])
def test_neutral_members_stage_I_flow_is_the_papers(key):
    """The staged flow's Stage I (C moves, every other block frozen at its neutral value) is the
    paper model's flow: its vector field at every saved state of the paper's Stage I equals the
    paper's to 1e-12, and the integrated trajectories agree to 1e-12 where the two fields are
    equal bit for bit (token, value: the same adaptive steps). The residual member computes κ
    with another summation order (rounding 1e-16), which can move an accept/reject decision of
    the step control: its trajectory then stays within the solver's tolerance (rtol 1e-8) of
    the paper's, on a different path of steps (measured: 2.5e-9 in c/Σc)."""
    base = gflow.Config().replace(data={"L": 12}, estimator={"N": 64},
                                  schedule={"durations": [20.0, 1.0, 1.0], "events": False},
                                  solver={"save_per_decade": 3})  # fmt: skip
    cfg = base.replace(model={"member": key})
    ref = gflow.integrate(base)
    p0 = init_params(cfg.model, cfg.init, d=3, L=12)
    order = [cfg.model.subsets.index(S) for S in base.model.subsets]
    if key == "residual":
        C = jnp.asarray([0.0 if 0 in S else cfg.init.c0 for S in cfg.model.subsets])
        p0 = p0.with_blocks({"C": C})
    loss, loss0 = make_loss(cfg.data, cfg.model, cfg.estimator), make_loss(base.data, base.model, base.estimator)
    r1 = np.flatnonzero(ref.stage == 1)
    for i in r1:
        C = np.zeros(len(cfg.model.subsets))
        C[order] = ref.C[i]
        p = p0.with_blocks({"C": jnp.asarray(C)})
        g, g0 = loss_grad(loss, p), loss_grad(loss0, Params(w=jnp.asarray(ref.w[i]), C=jnp.asarray(ref.C[i]), a=jnp.asarray(ref.a[i])))
        np.testing.assert_allclose(np.asarray(g.C)[order], np.asarray(g0.C), rtol=0, atol=1e-12)
    tr = gflow.integrate(cfg, params0=p0)
    t1 = tr.stage == 1
    np.testing.assert_array_equal(ref.ts[r1], tr.ts[t1])
    fr = tr.c_frac[t1][:, order]
    tol = 1e-12 if key != "residual" else 1e-7
    np.testing.assert_allclose(tr.loss[t1], ref.loss[r1], rtol=0, atol=tol)
    np.testing.assert_allclose(fr, ref.c_frac[r1], rtol=0, atol=tol)


def _official_parameters(p: Params, model: ModelConfig, L: int):
    """gflow's Full-model θ in the official code's layout (``RPE/model.py``)."""
    H, M, D = model.H, model.M, model.D
    W = np.full((L, H), 0.123)  # entries the official heads never read
    for h in range(H):
        for j in range(M):
            W[j + h, h] = float(p.w[h, j])
    deg = official_full.official_degrees(H, D)
    sets = model.subsets
    C = np.asarray(p.C)
    Coff = np.array([C[sets.index(tuple(c for c in range(H + 1) if r[c] == 1))] for r in deg])[None]
    x = {k: np.asarray(v) for k, v in p.x.items()}
    return dict(W=W, q_proj=np.moveaxis(x["Q"], 0, -1), k_proj=np.moveaxis(x["K"], 0, -1),
                o_v_proj=np.moveaxis(x["V"], 0, -1), ln_weight=x["gamma"], ln_bias=x["beta"], C_alpha=Coff,
                a=float(p.a), D=D)  # fmt: skip


@pytest.mark.parametrize(("seed", "norm"), [(0, "sum"), (1, "sum"), (2, "layer"), (3, "layer")])
def test_full_model_equals_the_official_forward_pass(seed, norm):
    """gflow's Full model against an independent transcription of the official forward pass
    (tests/official_full.py) on random tokens and random parameters: the per-sequence
    cross-entropy on the probability vector agrees to 1e-10 in every layout, with the final
    code's selector normalisation (norm "sum") and with its standard_LN of the stored runs
    (norm "layer")."""
    rng = np.random.default_rng(seed)
    d, L, N = 3, 11 + seed, 7
    model = ModelConfig(member="full", H=3, M=3, D=2, norm=norm)
    X, y = rng.integers(0, d, (N, L)), rng.integers(0, d, N)
    blocks = {b: jnp.asarray(rng.normal(size=np.shape(v))) for b, v in init_params(model, InitConfig(), d=d).blocks().items()}
    p = Params.from_blocks(blocks)
    o = official_full.forward(X, d, **_official_parameters(p, model, L), standard_LN=norm == "layer")
    ref = official_full.cross_entropy(o, y)
    smp = Sample(X=jnp.asarray(X), y=jnp.asarray(y), zq=jnp.zeros(N, int), cond=jax.nn.one_hot(y, d, dtype=jnp.float64),
                 pi=jnp.zeros((N, d * d, d)))  # fmt: skip
    m = member_of(model)
    for layout in m.layouts:
        loss = PopulationLoss(feats=features(smp, m, layout=layout), model=model, eps=jnp.asarray(1e-6),
                              kind="ce_on_probs")  # fmt: skip
        np.testing.assert_allclose(np.asarray(loss_per_sequence(loss, p)), ref, rtol=0, atol=1e-10)


def test_full_model_dead_head_carries_nothing():
    """A head whose value matrix has equal entries maps every input to a constant vector, so
    after the LayerNorm it outputs β whatever the token: changing the tokens its window reads
    leaves its component unchanged (the official w₊ = 3 run's head 3)."""
    model = ModelConfig(member="full")
    p = _theta(model)
    V = np.asarray(p.x["V"]).copy()
    V[2] = 0.0033
    p = p.with_blocks({"V": jnp.asarray(V)})
    m = member_of(model)
    rng = np.random.default_rng(0)
    W = jnp.asarray(rng.integers(0, 3, (20, m.span)))
    own = jnp.asarray(rng.integers(0, 3, 20))
    comp = m.vectors(p, W, own, query=False, d=3)
    np.testing.assert_allclose(np.asarray(comp[3]), np.broadcast_to(np.asarray(p.x["beta"]), (20, 3)), atol=1e-12)
    assert float(jnp.std(comp[1], axis=0).max()) > 1e-3  # a live head does depend on its tokens


# the Full model's counts and sparse layouts cost 25 s of compilation: their losses are checked
# against the official forward pass in the default suite, their gradients here under -m slow
_HEAVY_LAYOUTS = {"full": ("counts", "sparse"), "full_layer": ("counts", "sparse")}


@pytest.mark.parametrize("key", [k for k in MEMBER_OPTIONS if len(member_of(_model(k)).layouts) > 1])
def test_loss_and_gradient_agree_across_layouts(key):
    """The loss and its gradient agree to 1e-12 in every layout of a member (the default
    suite's part of the next test; the Full model's counts and sparse layouts under -m slow)."""
    model = _model(key)
    m = member_of(model)
    p = _theta(model)
    layouts = [ly for ly in m.layouts if ly not in _HEAVY_LAYOUTS.get(key, ())]
    ref = None
    for layout in layouts:
        got = loss_value_and_grad(make_loss(DATA, model, EstimatorConfig(N=48, layout=layout)), p)
        ref = got if ref is None else ref
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-13, err_msg=f"{key} {layout}")


@pytest.mark.slow
@pytest.mark.parametrize("key", [k for k in MEMBER_OPTIONS if len(member_of(_model(k)).layouts) > 1])
def test_layouts_agree_per_member(key):
    """The loss, its gradient, the batch standard errors and the per-sequence gradients of
    every layout of a member agree to 1e-12 (the counts, sparse and positions layouts store the
    same sample differently; the positions layout computes every position's window itself)."""
    model = _model(key)
    m = member_of(model)
    p = _theta(model)
    out = {}
    for layout in m.layouts:
        loss = make_loss(DATA, model, EstimatorConfig(N=48, layout=layout))
        st = loss.stats(p, batches=6)
        ls, pg = loss.per_sequence_grads(p)
        out[layout] = (st.loss, st.grad, st.grad_se, ls, pg)
    ref = out[m.layouts[0]]
    for layout, got in out.items():
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-13, err_msg=f"{key} {layout}")
    # the mean of the per-sequence gradients is the gradient
    for a, b in zip(jax.tree.leaves(ref[4]), jax.tree.leaves(ref[1])):
        np.testing.assert_allclose(np.asarray(a).mean(0), np.asarray(b), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("key", list(MEMBER_OPTIONS))
def test_member_gradient_equals_finite_differences(key):
    """Every block's gradient against a central finite difference along a random direction
    (step 1e-5, float64: truncation ~1e-10, rounding ~1e-11)."""
    model = _model(key)
    p = _theta(model, seed=3)
    loss = make_loss(DATA, model, EstimatorConfig(N=40, loss="ce_on_probs" if key in ("edelman", "bietti") else "log"))
    g = loss_grad(loss, p)
    rng = np.random.default_rng(7)
    for b in p.names:
        v = jnp.asarray(rng.normal(size=np.shape(p.get(b))))
        h = 1e-5
        fd = (loss_value(loss, p.with_blocks({b: p.get(b) + h * v})) - loss_value(loss, p.with_blocks({b: p.get(b) - h * v}))) / (2 * h)
        an = jnp.sum(g.get(b) * v)
        assert abs(float(fd - an)) <= 1e-7 * max(1.0, abs(float(an))), (key, b, float(fd), float(an))


def _in_span_I_11(B: np.ndarray) -> float:
    """The largest distance of a d×d matrix (per head) from span{I, 11ᵀ}."""
    d = B.shape[-1]
    basis = np.stack([np.eye(d).ravel(), np.ones((d, d)).ravel()], 1)
    flat = B.reshape(-1, d * d)
    coef, *_ = np.linalg.lstsq(basis, flat.T, rcond=None)
    return float(np.abs(flat.T - basis @ coef).max())


def test_relabelling_symmetry_keeps_token_matrices_in_span_I_11():
    """With the loss averaged over the d! relabellings of the sample (estimator.relabel), a
    token matrix started in span{I, 11ᵀ} stays there along the joint flow to 1e-12; on the plain
    sample (a Monte Carlo draw, not symmetric) it leaves it (here by more than 1e-6)."""
    base = gflow.Config().replace(data={"L": 12}, estimator={"N": 32, "relabel": True},
                                  model={"member": "token", "token_init": 0.2},
                                  schedule={"kind": "joint", "t1": 3.0}, solver={"save_per_decade": 2})  # fmt: skip
    p0 = init_params(base.model, base.init, d=3, L=12)
    B0 = np.asarray(p0.x["B"]) + 0.15  # 0.2 I + 0.15 11ᵀ
    p0 = p0.with_blocks({"B": jnp.asarray(B0)})
    tr = gflow.integrate(base, params0=p0)
    assert np.max(np.abs(tr.x["B"][-1] - B0)) > 1e-4  # the matrices do move
    assert max(_in_span_I_11(tr.x["B"][i]) for i in range(len(tr.ts))) < 1e-12
    plain = gflow.integrate(base.replace(estimator={"relabel": False}), params0=p0)
    assert _in_span_I_11(plain.x["B"][-1]) > 1e-6


def test_relabelled_sample_is_every_permutation_of_the_drawn_one():
    data = DataConfig(L=10)
    smp = gflow.sample(data, 5, key=jax.random.key(0))
    rel = gflow.core.relabel_sample(smp, data)
    assert rel.X.shape == (5 * 6, 10)
    perms = list(itertools.permutations(range(3)))
    for i, P in enumerate(perms):
        P = np.asarray(P)
        blk = slice(5 * i, 5 * (i + 1))
        np.testing.assert_array_equal(np.asarray(rel.X[blk]), P[np.asarray(smp.X)])
        # π'(P e | P z) = π(e | z): the relabelled conditional of the relabelled target
        np.testing.assert_array_equal(np.asarray(rel.cond[blk])[:, P], np.asarray(smp.cond))
        pz = np.asarray(rel.pi[blk])
        for z in range(9):
            z1, z2 = divmod(z, 3)
            pzc = P[z1] * 3 + P[z2]
            np.testing.assert_array_equal(pz[:, pzc][:, P], np.asarray(smp.pi)[:, z])
