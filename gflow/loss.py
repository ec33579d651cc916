"""The Monte Carlo population ICL loss and its gradient (SPEC §3, §5).

``L̂_N(θ) = (1/N) Σ_n ℓ_RB(θ; X_n, π_n)`` on a sample drawn once from a fixed
key (common random numbers), so ``L̂_N`` is a deterministic smooth function of
θ and ``-∇L̂_N`` is a proper vector field for an ODE solver. The target is
Rao–Blackwellised: ``ℓ_RB = -Σ_e π(e | z_q) log(ŷ_e + ε)``.
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from . import model as _model
from .data import DataConfig, sample
from .model import CountFeatures, ModelConfig, Params, PositionFeatures, features

_LOSSES = ("log", "ce_on_probs")
_DTYPES = ("float64", "float32")
_LAYOUTS = ("auto", "counts", "positions")


class EstimatorConfig(eqx.Module):
    """How the population loss is estimated.

    - `N`: number of sequences (each with its own π), ``>= 1``.
    - `seed`: the sample's PRNG seed (common random numbers: drawn once).
    - `eps`: ``ε`` in ``-log(ŷ_e + ε)``, ``>= 0`` (default ``1e-6``).
    - `loss`: ``"log"`` (the paper's ICL loss, Rao–Blackwellised) or
      ``"ce_on_probs"`` (extension: cross-entropy applied to ŷ as if it were
      logits, as in the reference simulations).
    - `dtype`: ``"float64"`` (default) or ``"float32"``.
    - `layout`: how the sample is stored: ``"counts"`` (κ tabulated on the
      ``(d+1)**M`` windows, each sequence as window counts; exact and fast
      for small ``d**M``), ``"positions"`` (per-position match tensors, any
      size) or ``"auto"`` (default: counts when ``(d+1)**M <= 512``).
    """

    N: int = eqx.field(static=True, default=10_000)
    seed: int = eqx.field(static=True, default=0)
    eps: float = 1e-6
    loss: Literal["log", "ce_on_probs"] = eqx.field(static=True, default="log")
    dtype: Literal["float64", "float32"] = eqx.field(static=True, default="float64")
    layout: Literal["auto", "counts", "positions"] = eqx.field(static=True, default="auto")

    def __check_init__(self):
        if not isinstance(self.N, (int, np.integer)) or self.N < 1:
            raise ValueError(f"estimator.N must be an integer >= 1, got {self.N!r}")
        if not isinstance(self.seed, (int, np.integer)):
            raise ValueError(f"estimator.seed must be an integer, got {self.seed!r}")
        if not (np.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"estimator.eps must be a finite number >= 0, got {self.eps!r}")
        if self.loss not in _LOSSES:
            raise ValueError(f"estimator.loss must be one of {_LOSSES}, got {self.loss!r}")
        if self.layout not in _LAYOUTS:
            raise ValueError(f"estimator.layout must be one of {_LAYOUTS}, got {self.layout!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"estimator.dtype must be one of {_DTYPES}, got {self.dtype!r}")

    @property
    def jdtype(self):
        return jnp.float64 if self.dtype == "float64" else jnp.float32


def sequence_loss(yhat: Float[Array, " d"], cond: Float[Array, " d"], eps, kind: str) -> Float[Array, ""]:
    """Rao–Blackwellised loss of one sequence, ``-Σ_e π(e|z_q) log(ŷ_e + ε)``
    (``kind="log"``), or ``-Σ_e π(e|z_q) log softmax(ŷ)_e``
    (``kind="ce_on_probs"``)."""
    if kind == "log":
        return -jnp.sum(cond * jnp.log(yhat + eps))
    return -jnp.sum(cond * jax.nn.log_softmax(yhat))


def unseen_mass(X, cond: Float[Array, " d"]) -> Float[Array, ""]:
    """``Σ_e π(e|z_q) 1{e absent from x_1..x_L}``: the target mass the model
    cannot predict for any θ (``ŷ_e = 0``), whose loss is capped by ε."""
    seen = jax.nn.one_hot(X, cond.shape[-1], dtype=cond.dtype).max(0)
    return jnp.sum(cond * (1.0 - seen))


class LossStats(eqx.Module):
    """Loss and gradient at one θ with Monte Carlo standard errors (SPEC §5).

    The standard errors are ``std_n / sqrt(N)`` of the per-sequence values,
    which are i.i.d. across sequences.
    """

    loss: Float[Array, ""]
    loss_se: Float[Array, ""]
    unseen: Float[Array, ""]
    grad: Params
    grad_se: Params
    grad_norm: Float[Array, ""]


# Largest number of padded windows (d+1)**M for which layout="auto" tabulates
# κ on window pairs: the table is ((d+1)**M)**2 entries, the counts
# (d+1)**M * d per sequence.
_AUTO_MAX_WINDOWS = 512


def resolve_layout(layout: str, d: int, M: int) -> str:
    """``"auto"`` is ``"counts"`` when ``(d+1)**M <= 512``, else ``"positions"``."""
    if layout not in _LAYOUTS:
        raise ValueError(f"estimator.layout must be one of {_LAYOUTS}, got {layout!r}")
    if layout == "auto":
        return "counts" if (d + 1) ** M <= _AUTO_MAX_WINDOWS else "positions"
    return layout


def _tree_norm(t) -> Float[Array, ""]:
    return jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(t)))


def _mean_se(x):
    n = x.shape[0]
    se = jnp.std(x, axis=0, ddof=1 if n > 1 else 0) / jnp.sqrt(n)
    return jnp.mean(x, axis=0), se


class PopulationLoss(eqx.Module):
    """The estimator ``L̂_N(θ)`` on a fixed sample (SPEC §3, §5).

    Build with :func:`make_loss`. Calling it returns the mean loss; see
    :meth:`value_and_grad`, :meth:`stats`, :meth:`per_sequence`.

    Two exact layouts of the same sample: ``CountFeatures`` (κ tabulated on
    window pairs, the sample as window counts; fast) and ``PositionFeatures``
    (per-position match tensors; general). They agree to rounding.
    """

    feats: CountFeatures | PositionFeatures
    model: ModelConfig
    eps: Float[Array, ""]
    kind: str = eqx.field(static=True, default="log")

    @property
    def N(self) -> int:
        return self.feats.cond.shape[0]

    @property
    def d(self) -> int:
        return self.feats.cond.shape[-1]

    # -- one sequence ------------------------------------------------------
    def _one_positions(self, params: Params, X, G, Gs, cond):
        kap = _model.kappa(params, G, Gs, self.model)
        yhat = _model.predict_from_kappa(params.a, kap, X, cond.shape[-1])
        return sequence_loss(yhat, cond, self.eps, self.kind)

    def _one_counts(self, a, row, counts, cond):
        return sequence_loss(_model.predict_from_counts(a, row, counts), cond, self.eps, self.kind)

    def _table(self, w, C):
        return _model.kappa_table(w, C, self.model, self.d)

    def _vmap_positions(self, fn):
        Gs_axis = None if self.feats.Gs is None else 0
        return jax.vmap(fn, in_axes=(None, 0, 0, Gs_axis, 0))

    # -- the estimator -----------------------------------------------------
    def per_sequence(self, params: Params) -> Float[Array, " N"]:
        """``ℓ_RB`` of every sequence, ``(N,)``."""
        f = self.feats
        if isinstance(f, PositionFeatures):
            return self._vmap_positions(self._one_positions)(params, f.X, f.G, f.Gs, f.cond)
        rows = self._table(params.w, params.C)[f.qcode]
        return jax.vmap(self._one_counts, in_axes=(None, 0, 0, 0))(params.a, rows, f.counts, f.cond)

    def __call__(self, params: Params) -> Float[Array, ""]:
        return jnp.mean(self.per_sequence(params))

    def value_and_grad(self, params: Params) -> tuple[Float[Array, ""], Params]:
        return jax.value_and_grad(self.__call__)(params)

    def grad(self, params: Params) -> Params:
        return jax.grad(self.__call__)(params)

    def unseen(self) -> Float[Array, ""]:
        """Mean unseen mass (θ-independent): the target mass on tokens absent
        from the context."""
        f = self.feats
        if isinstance(f, PositionFeatures):
            return jnp.mean(jax.vmap(unseen_mass)(f.X, f.cond))
        seen = f.counts.sum(1) > 0
        return jnp.mean(jnp.sum(jnp.where(seen, 0.0, f.cond), -1))

    def per_sequence_grads(self, params: Params) -> tuple[Float[Array, " N"], Params]:
        """Per-sequence losses and gradients (leaves with a leading N axis)."""
        f = self.feats
        if isinstance(f, PositionFeatures):
            return self._vmap_positions(jax.value_and_grad(self._one_positions))(
                params, f.X, f.G, f.Gs, f.cond
            )
        # Chain rule through the shared table: the per-sequence gradient with
        # respect to (a, its row of κ), then the table's Jacobian (16 tangents).
        table = self._table(params.w, params.C)
        vg = jax.vmap(jax.value_and_grad(self._one_counts, argnums=(0, 1)), in_axes=(None, 0, 0, 0))
        ls, (ga, grow) = vg(params.a, table[f.qcode], f.counts, f.cond)
        Jw, JC = jax.jacfwd(self._table, argnums=(0, 1))(params.w, params.C)
        gw = jnp.einsum("nk,nkhm->nhm", grow, Jw[f.qcode])
        gC = jnp.einsum("nk,nks->ns", grow, JC[f.qcode])
        return ls, Params(w=gw, C=gC, a=ga)

    def stats(self, params: Params) -> LossStats:
        """Loss, gradient and their Monte Carlo standard errors
        (``std/sqrt(N)`` of the i.i.d. per-sequence values)."""
        ls, gs = self.per_sequence_grads(params)
        loss, loss_se = _mean_se(ls)
        ms = jax.tree.map(_mean_se, gs)
        g = jax.tree.map(lambda t: t[0], ms, is_leaf=lambda t: isinstance(t, tuple))
        g_se = jax.tree.map(lambda t: t[1], ms, is_leaf=lambda t: isinstance(t, tuple))
        return LossStats(
            loss=loss, loss_se=loss_se, unseen=self.unseen(), grad=g, grad_se=g_se, grad_norm=_tree_norm(g)
        )


def make_loss(
    data: DataConfig = DataConfig(),
    model: ModelConfig = ModelConfig(),
    estimator: EstimatorConfig = EstimatorConfig(),
    *,
    key: PRNGKeyArray | None = None,
) -> PopulationLoss:
    """Draw the common random numbers and build ``L̂_N``.

    The sample is drawn from ``key`` if given, else from
    ``jax.random.key(estimator.seed)``: the same configuration and seed give a
    bit-identical estimator. The sample is always drawn in float64; the
    features and the loss use ``estimator.dtype``.
    """
    if key is None:
        key = jax.random.key(estimator.seed)
    dt = estimator.jdtype
    layout = resolve_layout(estimator.layout, data.d, model.M)
    smp = sample(data, estimator.N, key=key, dtype=jnp.float64)
    feats = features(smp, model, layout=layout, dtype=dt)
    return PopulationLoss(feats=feats, model=model, eps=jnp.asarray(estimator.eps, dt), kind=estimator.loss)
