"""Laws per model: what the flow obeys for every model and loss gflow accepts
(docs/theory/mathematics.md §M8.7; extension).

Every law here states the model and loss options it was derived for
(``gflow.theory.LAW_COVERAGE``): a report row built on a law that does not cover the run's
options must be undecided, never decided against another model's law.

- **Stage I, any norm** (:func:`selector_gain`, :func:`stage1_rates_exact`,
  :func:`stage1_rates_small_a`, :func:`predict_selection`). At small ``a``,
  ``L̂ ≈ L₀ − a G(c)`` with ``G(c) := −∂L̂/∂a |_{a=0}`` as a function of the
  selector weights (autodiff on the run's own sample). With ``dC/dt =
  −η_C ∇_C L̂`` and ``c_S = C_S²``, ``d/dt log c_S = −2 η_C ∂_{C_S} L̂ / C_S``
  exactly, and ``≈ 2 a η_C ∂_{C_S} G / C_S`` to first order in ``a``. For
  ``norm="sum"`` ``G = Σ_S (c_S/Σc) J(S)`` and the rate differences are
  ``4 a η_C (J(S) − J(S'))/‖C‖²`` (docs/theory/mathematics.md §M6.2). For ``norm="layer"``
  ``κ_l = Σ_S c_S P_l(S)/√(Σ_S c_S Q_q(S) · Σ_S c_S Q_l(S))`` is not linear
  in ``c/Σc`` and the rates depend on the current ``c``. The selected set is
  predicted by integrating the small-``a`` flow ``dC/dτ = ∇_C G(C)``
  (``τ = a η_C t``) to the Stage I event ``max c/Σc ≥ 1 − δ``; ``τ/(a₀η_C)`` is
  the predicted Stage I duration (first order in ``a₀``).
- **Stage II** (:func:`copier_vertex_gradient`): whether the one-hot copier of
  the selected set is an attracting fixed point of the Stage II flow at the
  run's ``(C, a)``. No rate law is derived for ``norm="layer"``: its Stage II
  rows are undecided.
- **GIH**: with one-hot copiers and ``c = e_S`` both norms give the GIH model
  (docs/theory/mathematics.md §M6.4); at positions ``l ≤ max(S)`` (partial window, zero padding)
  ``Q_l(S) = 0`` and the code's floor makes ``κ_l = 0`` exactly as for
  ``norm="sum"``. For a copier that is only *near* one-hot, the layer-norm
  kernel there is the cosine of the partial windows, of order one (see
  :func:`partial_window_kernel`), so the layer-norm model tends to the GIH
  on positions with a full window only.
- **ce_on_probs GIH tail** (:func:`gih_tail`): ``K = lim_{a→∞} e^a F(a)``. If
  ``K > 0`` and F has no zero on the grid, ``a* = ∞``, and the approach is
  ``da/dt = η_a K e^{−a}(1 + O(e^{−a}))``: ``a(t) = log(η_a K t) + o(1)``
  (slope 1 against ``log t``) and ``L_GIH(a(t)) − L_∞ = K e^{−a} + … ≈
  1/(η_a t)`` (exponent −1 in t, constant ``1/η_a``, independent of K).

How they are wired into the report: ``gflow.checks._rows_laws`` (called by
``gflow.check``) decides the layer-norm Stage I slopes against
:func:`stage1_rates_exact` at the run's initial θ and the winner against
:func:`predict_selection`, where the sum-norm law does not cover the run;
reports every stage that ended ``"steady"`` with, for Stage II,
:func:`copier_vertex_gradient`; and, for ``loss = "ce_on_probs"`` with
``a* = ∞``, decides the approach exponent of ``L̂ − L∞`` (:func:`gih_tail`).
The coverage of each law is in ``gflow.theory.LAW_COVERAGE``
(``stage1_model``, ``stage2_vertex``, ``gih_tail``).
"""

from __future__ import annotations

import dataclasses

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from .._util import mean_se
from ..core import Params, PopulationLoss
from ._gih import GIH

__all__ = [
    "GIHTail",
    "SelectionPrediction",
    "SelectorRates",
    "VertexGradient",
    "copier_vertex_gradient",
    "gih_tail",
    "partial_window_kernel",
    "predict_selection",
    "selector_gain",
    "stage1_rates_exact",
    "stage1_rates_small_a",
]

# ---------------------------------------------------------------------------
# Stage I for any norm
# ---------------------------------------------------------------------------


@eqx.filter_jit
def _gain_per_sequence(loss: PopulationLoss, w, C):
    """``G_n(C) = −∂ℓ_n/∂a`` at ``a = 0`` for every sequence, ``(N,)``."""
    zero = jnp.zeros((), C.dtype)
    f = lambda a: loss.per_sequence(Params.assemble(w, C, a))
    return -jax.jvp(f, (zero,), (jnp.ones_like(zero),))[1]


def selector_gain(loss: PopulationLoss, w, C) -> tuple[float, float]:
    """``G(c) = −∂L̂/∂a |_{a=0}`` at selector weights ``C`` (``c = C²``) and
    copier ``w``, and its Monte Carlo SE (docs/theory/mathematics.md §M8.7).

    At ``a = 0`` ŷ is the context's unigram ``u`` whatever θ, so
    ``L̂ = L₀ − a G(c) + O(a²)`` with, for the log loss,
    ``G = E[(1/L) Σ_l κ_l (π(x_l|z_q)/(u_{x_l}+ε) − Σ_e π(e|z_q) u_e/(u_e+ε))]``;
    computed here by forward-mode autodiff of the run's own per-sequence loss,
    so it holds for either norm and either loss.
    """
    g = np.asarray(_gain_per_sequence(loss, jax.tree.map(jnp.asarray, w), jnp.asarray(C)), np.float64)
    m, se = mean_se(g)
    return float(m), float(se)


@dataclasses.dataclass(frozen=True)
class SelectorRates:
    """Stage I rates ``r_S = d/dt log c_S`` at one θ (docs/theory/mathematics.md §M8.7).

    - `sets`: 𝒮 in order; `rate`: ``η_C``; `a`: the classifier scale used.
    - `r`, `r_se`: ``(nS,)`` mean rates and SEs over sequences.
    - `diff`, `diff_se`: ``(nS, nS)``, ``d/dt log(c_Si/c_Sj)`` and its SE,
      paired on the same sequences.
    - `kind`: ``"exact"`` (the gradient at θ) or ``"small_a"`` (first order in a).
    """

    sets: tuple[tuple[int, ...], ...]
    a: float
    rate: float
    r: np.ndarray
    r_se: np.ndarray
    diff: np.ndarray
    diff_se: np.ndarray
    kind: str

    def slope(self, S, Sp) -> tuple[float, float]:
        """``d/dt log(c_S/c_S')`` and its paired SE."""
        i, j = self.sets.index(tuple(S)), self.sets.index(tuple(Sp))
        return float(self.diff[i, j]), float(self.diff_se[i, j])


def _rates_from_per_sequence(per, sets, a, rate, kind) -> SelectorRates:
    per = np.asarray(per, np.float64)  # (N, nS)
    r, rse = mean_se(per)
    diff = r[:, None] - r[None, :]
    n = per.shape[0]
    if n > 1:
        V = np.atleast_2d(np.cov(per, rowvar=False, ddof=1))
        v = np.diag(V)
        dse = np.sqrt(np.maximum(v[:, None] + v[None, :] - 2.0 * V, 0.0) / n)
    else:
        dse = np.zeros_like(diff)
    return SelectorRates(sets=tuple(sets), a=float(a), rate=float(rate), r=r, r_se=rse, diff=diff, diff_se=dse,
                         kind=kind)  # fmt: skip


@eqx.filter_jit
def _dC_per_sequence(loss: PopulationLoss, params: Params):
    _, g = loss.per_sequence_grads(params)
    return g.C


def stage1_rates_exact(loss: PopulationLoss, params: Params, *, rate: float = 1.0) -> SelectorRates:
    """The exact Stage I rates at θ: ``d/dt log c_S = −2 η_C ∂_{C_S} L̂ / C_S``
    (from ``dC/dt = −η_C ∇_C L̂`` and ``c_S = C_S²``; any norm, any loss),
    with per-sequence values ``−2 η_C ∂_{C_S} ℓ_n / C_S`` for the paired SEs.
    At the run's initial θ these are the flow's own rates at ``t = 0``."""
    C = np.asarray(params.C, np.float64)
    if np.any(C == 0):
        raise ValueError("stage1_rates_exact: every C_S must be non-zero (log c_S is undefined at C_S = 0)")
    g = np.asarray(_dC_per_sequence(loss, params), np.float64)
    per = -2.0 * rate * g / C[None, :]
    return _rates_from_per_sequence(per, loss.model.subsets, float(params.a), rate, "exact")


@eqx.filter_jit
def _dG_per_sequence(loss: PopulationLoss, w, C):
    return jax.jacfwd(lambda C_: _gain_per_sequence(loss, w, C_))(C)  # (N, nS)


def stage1_rates_small_a(loss: PopulationLoss, w, C, a: float, *, rate: float = 1.0) -> SelectorRates:
    """Stage I rates to first order in ``a``: ``d/dt log c_S = 2 a η_C ∂_{C_S} G / C_S``
    (docs/theory/mathematics.md §M8.7). For ``norm="sum"``, ``G = Σ_S C_S² J(S)/‖C‖²`` gives
    ``2∂_{C_S}G/C_S = 4 (J(S) − G)/‖C‖²``, so the differences are the paper's
    linearisation ``4 a η_C (J(S) − J(S'))/‖C‖²`` (docs/theory/mathematics.md §M6.2)."""
    C = np.asarray(C, np.float64)
    if np.any(C == 0):
        raise ValueError("stage1_rates_small_a: every C_S must be non-zero")
    dG = np.asarray(_dG_per_sequence(loss, jax.tree.map(jnp.asarray, w), jnp.asarray(C)), np.float64)
    per = 2.0 * float(a) * rate * dG / C[None, :]
    return _rates_from_per_sequence(per, loss.model.subsets, a, rate, "small_a")


@dataclasses.dataclass(frozen=True)
class SelectionPrediction:
    """The set the small-``a`` Stage I flow selects (docs/theory/mathematics.md §M8.7).

    - `selected`: the set whose ``c_S/Σc`` reaches ``1 − δ`` (``None`` if
      none did by ``tau_max``); `c_frac`: ``c/Σc`` there.
    - `tau`: the rescaled time ``τ = a₀ η_C t`` of the event; `duration`:
      ``τ/(a₀ η_C)``, the predicted Stage I duration to first order in ``a₀``.
    - `ranking_t0`: the sets ordered by their instantaneous rate at ``t = 0``.
    """

    selected: tuple[int, ...] | None
    c_frac: np.ndarray
    tau: float
    duration: float
    ranking_t0: tuple[tuple[int, ...], ...]


def predict_selection(loss: PopulationLoss, w, C0, a0: float, *, rate: float = 1.0, delta: float = 0.01,
                      tau_max: float = 1e8, rtol: float = 1e-8, atol: float = 1e-10) -> SelectionPrediction:  # fmt: skip
    """Integrate the small-``a`` Stage I flow ``dC/dτ = ∇_C G(C)`` (``τ = a₀η_C t``,
    ``w`` frozen) from ``C0`` to the event ``max_S c_S/Σc ≥ 1 − δ``.

    Choice: the flow of ``a·G`` rather than the instantaneous ranking at
    ``t = 0``: for ``norm="layer"`` the rates depend on the current ``c`` and
    the ranking can change on the way (the ranking at ``t = 0`` is returned as
    `ranking_t0` for comparison). Tsit5 with the given tolerances; the event
    time is located by Newton root finding.
    """
    if not (a0 > 0 and rate > 0):
        raise ValueError(f"predict_selection: a0 and rate must be > 0, got a0={a0!r}, rate={rate!r}")
    w = jax.tree.map(jnp.asarray, w)
    C0 = jnp.asarray(C0, jax.tree.leaves(w)[0].dtype)
    sets = loss.model.subsets
    gain = lambda C: jnp.mean(_gain_per_sequence(loss, w, C))
    vf = lambda t, C, args: jax.grad(gain)(C)
    # the member's own shares: over the sets that normalise κ (the Full model's token sets hold none:
    # with them in the sum the event could never fire, their C being frozen by a zero gain)
    shares = lambda C: loss.member.shares({"C": C})  # noqa: E731

    def ev(t, y, args, **kw):
        return jnp.max(shares(y)) - (1.0 - delta)

    r0 = np.asarray(jax.grad(gain)(C0)) / np.asarray(C0)
    ranking = tuple(sets[i] for i in np.argsort(-r0, kind="stable"))
    sol = _select_solve(vf, ev, C0, tau_max, rtol, atol)
    c = np.asarray(shares(np.asarray(sol.ys[-1], np.float64)), np.float64)
    tau = float(sol.ts[-1])
    hit = sol.result == diffrax.RESULTS.event_occurred
    sel = sets[int(np.argmax(c))] if hit else None
    return SelectionPrediction(selected=sel, c_frac=c, tau=tau, duration=tau / (a0 * rate), ranking_t0=ranking)


def _select_solve(vf, ev, C0, tau_max, rtol, atol):
    @eqx.filter_jit
    def run(C0):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(vf), diffrax.Tsit5(), 0.0, tau_max, None, C0,
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            event=diffrax.Event(ev, root_finder=optx.Newton(rtol=1e-12, atol=1e-12), direction=True),
            max_steps=100_000, throw=False, adjoint=diffrax.ForwardMode(),
        )  # fmt: skip

    return run(C0)


# ---------------------------------------------------------------------------
# Stage II: is the one-hot copier a fixed point that attracts?
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class VertexGradient:
    """Directional derivatives of ``L̂`` on the simplex at the one-hot copier.

    ``g[h][i] = ∂L̂/∂s^(h)_i − ∂L̂/∂s^(h)_h`` (``i ≠ h``; ``g[h][h-1] = 0``):
    the change of the loss per unit of attention mass moved from offset h to
    offset i, at ``s^(h) = e_h`` for every head h of `selected` (other heads
    and ``C, a`` as given). Under the logit flow, near the vertex,
    ``d s_i/dt ≈ −η_w s_i g_i``: the vertex attracts iff every ``g_i > 0``;
    a head with some ``g_i < 0`` settles at an interior point instead.
    `g_se`: Monte Carlo SEs (per-sequence values). `attracting`: per head.
    """

    selected: tuple[int, ...]
    g: dict
    g_se: dict
    attracting: dict


def copier_vertex_gradient(loss: PopulationLoss, params: Params, selected, *, gap: float = 60.0) -> VertexGradient:
    """:class:`VertexGradient` at the one-hot copier of `selected` (docs/theory/mathematics.md §M8.7).

    Computed with logits ``w^(h) = gap·e_h`` (``s_i = e^{−gap}``, so ``s_h``
    rounds to 1): ``∂L̂/∂w_i = s_i (∂L̂/∂s_i − Σ_j s_j ∂L̂/∂s_j)``, hence
    ``g_i = (∂L̂/∂w_i)/s_i`` to relative rounding. Per-sequence gradients
    give the SEs. The vertex limit is smooth when ``‖φ_l‖² > 0`` on every
    position, e.g. when ``c_∅ > 0`` (always so along the flow).
    """
    selected = tuple(int(h) for h in selected)
    H, M = loss.model.H, loss.model.M
    w = np.array(params.w, np.float64)
    for h in selected:
        if not 1 <= h <= min(H, M):
            raise ValueError(f"copier_vertex_gradient: head {h} must be in 1..{min(H, M)}")
        w[h - 1] = 0.0
        w[h - 1, h - 1] = gap
    p = params.with_blocks({"w": jnp.asarray(w, params.C.dtype)})
    gw = np.asarray(_dW_per_sequence(loss, p), np.float64)  # (N, H, M)
    s = np.asarray(jax.nn.softmax(jnp.asarray(w), axis=-1))
    g, g_se, att = {}, {}, {}
    for h in selected:
        per = gw[:, h - 1, :] / s[h - 1][None, :]
        per[:, h - 1] = 0.0
        m, se = mean_se(per)
        g[h], g_se[h] = m, se
        att[h] = bool(np.all(np.delete(m, h - 1) > 0))
    return VertexGradient(selected=selected, g=g, g_se=g_se, attracting=att)


@eqx.filter_jit
def _dW_per_sequence(loss: PopulationLoss, params: Params):
    _, g = loss.per_sequence_grads(params)
    return g.w


# ---------------------------------------------------------------------------
# GIH under layer norm: positions with a partial window
# ---------------------------------------------------------------------------


def partial_window_kernel(X, S, l: int, M: int) -> float:
    """The limit of the layer-norm kernel ``κ_l`` at a position ``l ≤ max(S)``
    for a copier tending to one-hot on S with ``c = e_S``: per head h ∈ S with
    ``h ≥ l``, ``v_l^(h)`` is carried by the small weights on offsets
    ``i < l`` only. With those weights equal (the paper's initialisation,
    ``w₋`` on every offset but h), ``v_l^(h)/‖v_l^(h)‖ = Σ_{i<l} e(x_{l−i})/
    ‖Σ_{i<l} e(x_{l−i})‖`` and ``v_q^(h) → e(x_{q−h})``; the factor of a head
    with ``h < l`` is ``1{x_{q−h} = x_{l−h}}``. Returns ``Π_h`` of these
    (0 when ``l = 1``: ``v_1 = 0``). For ``norm="sum"`` the same position has
    ``κ_l → 0``. (Tokens ``X = (x_1..x_L)``, positions 1-based.)"""
    X = np.asarray(X)
    q = X.shape[0] + 1
    x = lambda j: int(X[j - 1])
    out = 1.0
    for h in S:
        if h < l:
            out *= float(x(q - h) == x(l - h))
            continue
        if l == 1:
            return 0.0
        v = np.zeros(int(X.max()) + 1 if X.size else 1)
        for i in range(1, min(l, M + 1)):
            if i != h:
                v[x(l - i)] += 1.0
        nv = np.linalg.norm(v)
        if nv == 0:
            return 0.0
        out *= v[x(q - h)] / nv
    return out


# ---------------------------------------------------------------------------
# The GIH's tail: a* = ∞ and the approach
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GIHTail:
    """``K = lim_{a→∞} e^a F(a)`` of the GIH (docs/theory/mathematics.md §M8.7) with its SE.

    Per sequence with both ``N₁, N₀ > 0``: ``e^a r(1−r) → N₀/N₁``, so
    ``K_n = (N₀/N₁) Σ_e (π(e|z_q) − softmax(p₁)_e)(p₁(e) − p₀(e))`` for
    ``ce_on_probs`` and ``(N₀/N₁) Σ_e π(e|z_q)(p₁(e) − p₀(e))/(p₁(e) + ε)`` for
    the log loss; 0 otherwise. ``K > 0`` means ``F > 0`` for all large a
    (no zero beyond the grid): then ``a(t) = log(η_a K t) + o(1)`` and
    ``L_GIH(a(t)) − L_∞ ≈ 1/(η_a t)``.
    """

    K: float
    K_se: float
    L_inf: float
    L_inf_se: float


def gih_tail(gih: GIH) -> GIHTail:
    """:class:`GIHTail` of a GIH, in closed form."""
    N1 = np.asarray(gih.N1e.sum(-1), np.float64)
    N0 = np.asarray(gih.N0e.sum(-1), np.float64)
    both = (N1 > 0) & (N0 > 0)
    p1 = np.asarray(gih.N1e) / np.where(N1 > 0, N1, 1.0)[:, None]
    p0 = np.asarray(gih.N0e) / np.where(N0 > 0, N0, 1.0)[:, None]
    pi = np.asarray(gih.cond, np.float64)
    if gih.kind == "ce_on_probs":
        sm = np.exp(p1 - p1.max(-1, keepdims=True))
        sm /= sm.sum(-1, keepdims=True)
        k = np.sum((pi - sm) * (p1 - p0), -1)
    else:
        k = np.sum(pi * (p1 - p0) / (p1 + float(gih.eps)), -1)
    Kn = np.where(both, np.where(N1 > 0, N0 / np.where(N1 > 0, N1, 1.0), 0.0) * k, 0.0)
    K, Kse = mean_se(Kn)
    Li, Lise = mean_se(np.asarray(gih.per_sequence_loss_inf()))
    return GIHTail(K=float(K), K_se=float(Kse), L_inf=float(Li), L_inf_se=float(Lise))
