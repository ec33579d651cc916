"""Second derivatives of L̂ through the κ table (gflow.core.table_hessian, grad_hvp; docs/theory/mathematics.md §M9):
the same numbers as JAX's own second derivatives, in every layout and loss they apply to."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gflow
from gflow.core import (
    StageLoss,
    flatten,
    grad_hvp,
    has_table,
    outer_derivatives,
    sequence_loss,
    table_hessian,
    unflatten,
)
from gflow.dynamics import VectorField, block_scales

BASE = gflow.Config().replace(data={"d": 3, "L": 20}, estimator={"N": 300}, schedule={"kind": "joint"})
OFFICIAL = {"head_norm": True, "windows": "shifted"}

# (model, estimator): the counts and sparse layouts, both losses and both targets, chunked
CASES = {
    "counts": ({}, {}),
    "counts-ce-drawn": ({}, {"loss": "ce_on_probs", "target": "drawn"}),
    "counts-chunked": ({}, {"chunk": 64}),
    "sparse": ({}, {"layout": "sparse"}),
    "sparse-official-ce": (OFFICIAL, {"loss": "ce_on_probs", "target": "drawn"}),
    "sparse-official-chunked": (OFFICIAL, {"chunk": 64, "eps": 1e-3}),
}


def _setup(model, est, seed=0):
    cfg = BASE.replace(model=model, estimator=est)
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    rng = np.random.default_rng(seed)
    p = gflow.init_params(cfg.model, cfg.init)
    p = gflow.Params(w=p.w + 0.4 * rng.standard_normal(p.w.shape),
                     C=p.C * np.exp(0.5 * rng.standard_normal(p.C.shape)), a=jnp.asarray(2.0))  # fmt: skip
    return cfg, loss, p


@eqx.filter_jit
def _GHV(loss, p, v):
    """grad_hvp with the direction v (flat), or g itself when v is None."""
    return grad_hvp(loss, p, (lambda g: g) if v is None else (lambda g: unflatten(v, *p.w.shape)))


@pytest.mark.parametrize("name", list(CASES))
def test_table_hessian_and_hvp_are_jax_second_derivatives(name):
    """The structured Hessian equals jax.hessian of the loss, and grad_hvp's (g, Hv) equal
    jax.grad and the dense Hessian times v, to rounding (relative 1e-12)."""
    model, est = CASES[name]
    _, loss, p = _setup(model, est)
    assert has_table(loss)
    f = lambda x: loss(unflatten(x, *p.w.shape))  # noqa: E731
    x = flatten(p)
    H_ref = np.asarray(jax.jit(jax.hessian(f))(x))
    H = np.asarray(eqx.filter_jit(table_hessian)(loss, p))
    scale = np.max(np.abs(H_ref))
    assert np.max(np.abs(H - H_ref)) <= 1e-12 * scale
    g_ref = np.asarray(jax.jit(jax.grad(f))(x))
    rng = np.random.default_rng(1)
    v = jnp.asarray(rng.standard_normal(x.shape[0]))
    g, hv = _GHV(loss, p, v)
    assert np.max(np.abs(np.asarray(flatten(g)) - g_ref)) <= 1e-12 * np.max(np.abs(g_ref))
    want = H_ref @ v
    assert np.max(np.abs(np.asarray(flatten(hv)) - want)) <= 1e-12 * np.max(np.abs(want))
    # the direction may depend on g (the modified flow's Λg)
    _, hg = _GHV(loss, p, None)
    assert np.max(np.abs(np.asarray(flatten(hg)) - H_ref @ g_ref)) <= 1e-12 * np.max(np.abs(H_ref @ g_ref))


def test_outer_derivatives_closed_form():
    """g_y and H_y = diag(h) − mσσᵀ are jax.grad and jax.hessian of sequence_loss."""
    rng = np.random.default_rng(2)
    for kind in ("log", "ce_on_probs"):
        for _ in range(3):
            y = jnp.asarray(rng.dirichlet(np.ones(3)))
            c = jnp.asarray(rng.dirichlet(np.ones(3)) * rng.uniform(0.5, 2.0))
            f = lambda y: sequence_loss(y, c, 1e-3, kind)  # noqa: E731
            gy, h, s, m = outer_derivatives(y, c, 1e-3, kind)
            Hy = jnp.diag(h) - m * jnp.outer(s, s)
            assert np.allclose(gy, jax.grad(f)(y), rtol=1e-13, atol=1e-15)
            assert np.allclose(Hy, jax.hessian(f)(y), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("moves", [("w", "C", "a"), ("C",), ("w",), ("a",)])
def test_modified_field_structured_equals_linearised(moves):
    """The modified field by the table's structure (counts layout) equals the one by
    jax.linearize of the stage loss's gradient (the positions layout of the same sample:
    the same L̂ to rounding), in every stage's blocks."""
    cfg, loss, p = _setup({}, {})
    pos = cfg.replace(estimator={"layout": "positions"})
    loss_pos = gflow.make_loss(pos.data, pos.model, pos.estimator)
    assert has_table(loss) and not has_table(loss_pos)
    sc = block_scales(cfg.replace(schedule={"eta_w": 0.7, "eta_C": 0.5, "eta_a": 1.3}), moves, jnp.float64)
    x = {b: getattr(p, b) for b in moves}
    out = []
    for L in (loss, loss_pos):
        vf = VectorField(stage_loss=StageLoss(L, p, moves), scale=sc, eta_mod=jnp.asarray(0.4))
        out.append(vf.theta_field(x))
    for b in moves:
        assert np.allclose(out[0][b], out[1][b], rtol=1e-10, atol=1e-14), b


def test_table_hessian_chunks_large_gathers(monkeypatch):
    """Past _GATHER_MAX numbers the per-sequence gathers run in chunks (the memory of
    N = 10⁶): the same Hessian to rounding."""
    from gflow.core import _second

    _, loss, p = _setup({}, {})
    whole = np.asarray(eqx.filter_jit(lambda L, q: table_hessian(L, q))(loss, p))
    monkeypatch.setattr(_second, "_GATHER_MAX", 64 * 17 * 50)  # chunks of 50 sequences of 300
    chunked = np.asarray(eqx.filter_jit(lambda L, q: table_hessian(L, q))(loss, p))  # a new program
    assert np.max(np.abs(chunked - whole)) <= 1e-13 * np.max(np.abs(whole))
