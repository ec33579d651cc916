"""The transformer TF(M, H, d, D) (docs/theory/mathematics.md §M2).

The reference is :func:`helpers.naive_forward`, which builds the features
φ_l as explicit tensor products from the definitions of docs/theory/mathematics.md §M2; gflow never
materialises φ (match tensors for the per-position map, a κ table on window
pairs for the counts layout), so agreement is a real check of both.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import gih_counts, naive_forward, random_params, subsets_by_definition

import gflow
from gflow.core import _paper as gmodel

# ---------------------------------------------------------------------------
# Index set, configuration, initialisation
# ---------------------------------------------------------------------------


def test_subsets_order():
    # docs/theory/mathematics.md §M2: by size, then lexicographically, ∅ included; heads are 1-based.
    assert gflow.subsets(3, 2) == ((), (1,), (2,), (3,), (1, 2), (1, 3), (2, 3))
    assert gflow.subsets(2, 0) == ((),)
    for H in range(1, 6):
        for D in range(0, H + 1):
            S = gflow.subsets(H, D)
            assert list(S) == subsets_by_definition(H, D)
            assert len(S) == sum(math.comb(H, r) for r in range(D + 1))


def test_membership():
    model = gflow.ModelConfig(M=4, H=3, D=2)
    mem = model.membership
    for row, S in zip(mem, model.subsets):
        assert set(np.flatnonzero(row) + 1) == set(S)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(M=0), "model.M"),
        (dict(M=2.0), "model.M"),
        (dict(H=0), "model.H"),
        (dict(H=-1), "model.H"),
        (dict(D=-1), "model.D"),
        (dict(H=2, M=3, D=3), "model.D"),  # D > H
        (dict(D=1.0), "model.D"),
        (dict(norm="l2"), "model.norm"),
    ],
)
def test_model_config_errors(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        gflow.ModelConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(w_plus=float("inf")), "init.w_plus"),
        (dict(w_plus=float("nan")), "init.w_plus"),
        (dict(w_minus=float("-inf")), "init.w_minus"),
        (dict(c0=0.0), "init.c0"),
        (dict(c0=float("nan")), "init.c0"),
        (dict(a0=float("nan")), "init.a0"),
        (dict(a0=float("inf")), "init.a0"),
    ],
)
def test_init_config_errors(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        gflow.InitConfig(**kwargs)


def test_init_params():
    model = gflow.ModelConfig(M=4, H=3, D=2)
    init = gflow.InitConfig(w_plus=2.5, w_minus=-0.3, c0=0.2, a0=0.7)
    p = gflow.init_params(model, init)
    assert p.w.shape == (3, 4) and p.C.shape == (7,) and p.a.shape == ()
    assert p.w.dtype == jnp.float64
    for h in range(1, 4):  # head h starts on offset h
        for i in range(1, 5):
            assert float(p.w[h - 1, i - 1]) == (2.5 if i == h else -0.3)
    np.testing.assert_array_equal(np.asarray(p.C), np.full(7, 0.2))
    assert float(p.a) == 0.7
    np.testing.assert_allclose(np.asarray(p.c_frac), np.full(7, 1 / 7), rtol=1e-15)
    s = np.asarray(p.s)
    np.testing.assert_allclose(s.sum(1), 1.0, rtol=1e-15)
    np.testing.assert_allclose(s[0, 0] / s[0, 1], np.exp(2.8), rtol=1e-13)


def test_init_params_needs_H_le_M():
    with pytest.raises(ValueError, match=r"model\.H"):
        gflow.init_params(gflow.ModelConfig(M=2, H=3, D=1))


# ---------------------------------------------------------------------------
# The forward map against the materialised features
# ---------------------------------------------------------------------------


@functools.cache
def _forward_fns(model: gflow.ModelConfig, d: int):
    """Jitted batch forward maps of both layouts: (κ, ŷ) per position map and
    ŷ from window counts (one compilation per model)."""

    @jax.jit
    def positions(params, X):
        def one(x):
            G, Gs = gmodel.match_tensors(x, model.M, self_match=model.norm == "layer")
            return gmodel.kappa(params, G, Gs, model), gmodel.predict(params, x, model, d)

        return jax.vmap(one)(X)

    @jax.jit
    def counts(params, X):
        N = X.shape[0]
        smp = gflow.Sample(
            X=X,
            y=jnp.zeros(N, jnp.int32),
            zq=jnp.zeros(N, jnp.int32),
            cond=jnp.full((N, d), 1.0 / d),
            pi=jnp.full((N, 1, d), 1.0 / d),
        )
        f = gflow.core.features(smp, model, layout="counts")
        table = gmodel.kappa_table(params.w, params.C, model, d)
        codes = jax.vmap(lambda x: gmodel.window_codes(x, model.M, d))(X)  # (N, L+1)
        kap = jax.vmap(lambda c: table[c[-1], c[:-1]])(codes)
        yhat = jax.vmap(gmodel.predict_from_counts, in_axes=(None, 0, 0))(params.a, table[f.qcode], f.counts)
        return kap, yhat

    return positions, counts


# Every batch is (6, L): the GIH tests below reuse the first case's compilation.
_CASES = [  # d, L, M, H, D
    (3, 30, 3, 3, 2),  # the paper's sizes
    (2, 3, 4, 2, 2),  # L < M (the query's window is padded), H < M, D = H
]


@pytest.mark.parametrize("norm", ["sum", "layer"])
@pytest.mark.parametrize("d, L, M, H, D", _CASES)
def test_forward_matches_materialised_features(getkey, norm, d, L, M, H, D):
    model = gflow.ModelConfig(M=M, H=H, D=D, norm=norm)
    params = random_params(getkey(), model, a=3.0, w_scale=1.5)
    X = jax.random.randint(getkey(), (6, L), 0, d).astype(jnp.int32)
    positions, counts = _forward_fns(model, d)
    kap_p, yhat_p = positions(params, X)
    kap_c, yhat_c = counts(params, X)
    for n in range(X.shape[0]):
        kap, yhat = naive_forward(params.w, params.C, params.a, np.asarray(X[n]), d, D, norm)
        np.testing.assert_allclose(np.asarray(kap_p[n]), kap, rtol=0, atol=1e-12)
        np.testing.assert_allclose(np.asarray(kap_c[n]), kap, rtol=0, atol=1e-12)
        np.testing.assert_allclose(np.asarray(yhat_p[n]), yhat, rtol=0, atol=1e-12)
        np.testing.assert_allclose(np.asarray(yhat_c[n]), yhat, rtol=0, atol=1e-12)
    assert np.ptp(np.asarray(kap_p)) > 1e-3  # a generic θ: κ is not constant


# ---------------------------------------------------------------------------
# One-hot copier and selector: the generalized induction head
# ---------------------------------------------------------------------------

_GIH_MODEL = dict(M=3, H=3, D=2)
_GIH_D, _GIH_L = 3, 30


def _gih_params(S, a, model):
    """Head h on offset h with all but e^-60 of the mass (w₊ - w₋ = 60), c = e_S."""
    w = 0.1 + 60.0 * jnp.eye(model.H, model.M)
    C = jnp.asarray([1.0 if T == S else 0.0 for T in model.subsets])
    return gflow.Params(w=w, C=C, a=jnp.asarray(a, jnp.float64))


def _gih_sequences(key):
    X = np.array(jax.random.randint(key, (6, _GIH_L), 0, _GIH_D))
    # a context in which the query's last two tokens (2, 2) never occur as
    # (x_{l-1}, x_{l-2}) for l <= L: N₁ = 0 for S = {1, 2}
    X[-1] = np.tile([0, 1], _GIH_L // 2)
    X[-1, -2:] = [2, 2]
    return jnp.asarray(X, jnp.int32)


@pytest.mark.parametrize("norm", ["sum", "layer"])
def test_one_hot_copier_kappa_is_match_indicator(getkey, norm):
    """c = e_S and a one-hot copier: κ_l = 1{x_{l-h} = x_{q-h} ∀ h ∈ S}.

    Positions l <= max(S), where a selected head reads padding: with
    norm="sum" they match nothing (κ_l = 0, up to e^-60). With norm="layer",
    φ_l is tiny there (the head's e^-60 of mass on real tokens) and docs/theory/mathematics.md §M2's
    Z = ‖φ_q‖‖φ_l‖ normalises it, so κ_l is a cosine, not an indicator: those
    positions are compared with the materialised features instead (this
    needs the products of tiny inner products to be computed accurately)."""
    model = gflow.ModelConfig(**_GIH_MODEL, norm=norm)
    X = _gih_sequences(getkey())
    positions, counts = _forward_fns(model, _GIH_D)
    for S in [(), (1,), (2,), (3,), (1, 2), (1, 3), (2, 3)]:
        params = _gih_params(S, 1.0, model)
        kap_p, _ = positions(params, X)
        kap_c, _ = counts(params, X)
        matches = np.stack([gih_counts(np.asarray(x), S, _GIH_D)[0] for x in X])
        assert 0 < matches.mean() < 1 or S == ()
        inside = slice(max(S, default=0), None) if norm == "layer" else slice(None)
        np.testing.assert_allclose(np.asarray(kap_p)[:, inside], matches[:, inside], rtol=0, atol=1e-12)
        np.testing.assert_allclose(np.asarray(kap_c)[:, inside], matches[:, inside], rtol=0, atol=1e-12)
        if norm == "layer":
            for n, x in enumerate(np.asarray(X)):
                kap, _ = naive_forward(params.w, params.C, params.a, x, _GIH_D, model.D, norm)
                np.testing.assert_allclose(np.asarray(kap_p[n]), kap, rtol=0, atol=1e-12)
                np.testing.assert_allclose(np.asarray(kap_c[n]), kap, rtol=0, atol=1e-12)


def test_gih_limit(getkey):
    """With c = e_S and a one-hot copier (norm="sum"), ŷ is the generalized
    induction head: ŷ_e = (e^a N₁(e) + N₀(e)) / (e^a N₁ + N₀) (docs/theory/mathematics.md §M6.4) at
    finite a, and at a = 200 the in-context conditional frequencies
    N₁(e)/N₁, computed by counting (the unigram frequencies when N₁ = 0)."""
    model = gflow.ModelConfig(**_GIH_MODEL, norm="sum")
    X = _gih_sequences(getkey())
    positions, counts = _forward_fns(model, _GIH_D)
    seen_empty = False
    for S in [(1,), (1, 2), (2, 3)]:
        for a in (1.3, 200.0):
            params = _gih_params(S, a, model)
            _, yhat_p = positions(params, X)
            _, yhat_c = counts(params, X)
            for n in range(X.shape[0]):
                _, N1, N0 = gih_counts(np.asarray(X[n]), S, _GIH_D)
                if a == 200.0:
                    if N1.sum() > 0:
                        want = N1 / N1.sum()
                    else:
                        seen_empty = True
                        want = (N0 + N1) / _GIH_L
                else:
                    want = (np.exp(a) * N1 + N0) / (np.exp(a) * N1.sum() + N0.sum())
                np.testing.assert_allclose(np.asarray(yhat_p[n]), want, rtol=0, atol=1e-12)
                np.testing.assert_allclose(np.asarray(yhat_c[n]), want, rtol=0, atol=1e-12)
    assert seen_empty


@pytest.mark.parametrize("norm", ["sum", "layer"])
def test_forward_scale_invariant_in_C(getkey, norm):
    """κ and ŷ depend on C only through c / Σc (sum) or φ / ‖φ‖ (layer)."""
    model = gflow.ModelConfig(M=3, H=3, D=2, norm=norm)
    params = random_params(getkey(), model, a=3.0)
    X = jax.random.randint(getkey(), (6, 30), 0, 3).astype(jnp.int32)
    positions, counts = _forward_fns(model, 3)
    for lam in (1e-3, 7.5):
        scaled = gflow.Params(w=params.w, C=lam * params.C, a=params.a)
        for fn in (positions, counts):
            for x, y in zip(fn(params, X), fn(scaled, X)):
                np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-12, atol=1e-14)
