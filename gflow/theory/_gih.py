"""The generalized induction head (GIH) and its one-dimensional law (docs/theory/mathematics.md
§M6.4, §M6.5): the model's limit with a one-hot copier and the selector on one
set ``S``, and the numerics on it (jitted force and loss, its landmarks ``C*``,
the validity window, ``a*``, the limit loss, and the ODE ``da/dτ = λF(λa)``).
Re-exported by :mod:`gflow.theory`."""

from __future__ import annotations

import dataclasses
import math

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._util import bisect_root, golden_max, mean_se
from ..core import CountFeatures, PopulationLoss, PositionFeatures, Sample, subset_label, window_code_count
from ._lawcurve import LawCurve, grid_force

# ---------------------------------------------------------------------------
# §6.4  Stage III: the generalized induction head
# ---------------------------------------------------------------------------


def check_offsets(S, M: int | None = None) -> tuple[int, ...]:
    S = tuple(int(h) for h in S)
    if any(h < 1 for h in S) or list(S) != sorted(set(S)):
        raise ValueError(f"the GIH's set of offsets must be strictly increasing positive offsets, got {S}")
    if M is not None and S and max(S) > M:
        raise ValueError(f"the GIH's offsets {S} exceed the model's window M={M}")
    return S


def _counts_from_X(X, S, d):
    N, L = X.shape
    if len(S) == 0:
        match = jnp.ones((N, L), bool)
    else:
        hmax = max(S)
        pad = jnp.concatenate([jnp.full((N, hmax), -1, X.dtype), X], axis=1)  # x_j at hmax + j - 1
        match = jnp.ones((N, L), bool)
        for h in S:
            keys = pad[:, hmax - h : hmax - h + L]  # x_{l-h}, l = 1..L (-1: padding)
            query = pad[:, hmax + L - h][:, None]  # x_{q-h}, q = L + 1
            match = match & (keys == query) & (query >= 0)
    onehot = jax.nn.one_hot(X, d, dtype=jnp.float64)
    N1e = jnp.einsum("nl,nle->ne", match.astype(jnp.float64), onehot)
    return N1e, onehot.sum(1) - N1e


def _count_match_table(d: int, M: int, S) -> np.ndarray:
    """``T[q, k] = 1`` if windows ``q`` and ``k`` (base ``d+1``, offset 1 most
    significant, digit ``d`` = padding) agree, unpadded, at every offset of S."""
    K = window_code_count(d, M)
    codes = np.arange(K)
    digits = np.stack([(codes // (d + 1) ** (M - h)) % (d + 1) for h in range(1, M + 1)], 1)  # (K, M)
    T = np.ones((K, K), bool)
    for h in S:
        dq = digits[:, h - 1]
        T &= (dq[:, None] == dq[None, :]) & (dq[:, None] != d)
    return T.astype(np.float64)


def gih_counts(source, S, *, M: int | None = None) -> tuple[Float[Array, "N d"], Float[Array, "N d"]]:
    """Match counts of the generalized induction head on offsets ``S`` (docs/theory/mathematics.md §M6.4).

    ``N₁(e) = #{l ≤ L : x_{l-h} = x_{q-h} ∀ h ∈ S, x_l = e}`` (query ``q = L+1``;
    the zero padding ``x_j``, ``j ≤ 0``, never matches) and
    ``N₀(e) = #{l ≤ L : x_l = e} − N₁(e)``. For ``S = ∅`` every position matches.

    `source` is a :class:`~gflow.Sample` or
    :class:`~gflow.core.PositionFeatures` (read from ``X``), or
    :class:`~gflow.core.CountFeatures` (read from the window codes, which
    encode offsets ``1..M``; ``M`` is inferred from the table size unless
    given). All give the same counts on the same sample. Returns float64
    ``(N, d)`` arrays.
    """
    S = check_offsets(S)
    if isinstance(source, (Sample, PositionFeatures)):
        d = source.cond.shape[-1]
        return _counts_from_X(jnp.asarray(source.X), S, d)
    if isinstance(source, CountFeatures):
        d, K = source.counts.shape[1:]
        if M is None:
            M = round(math.log(K) / math.log(d + 1))
        if window_code_count(d, M) != K:
            raise ValueError(f"gih_counts: counts have {K} windows, not (d+1)**M with d={d}, M={M}")
        check_offsets(S, M)
        T = jnp.asarray(_count_match_table(d, M, S))
        counts = jnp.asarray(source.counts, jnp.float64)
        N1e = jnp.einsum("nk,nek->ne", T[source.qcode], counts)
        return N1e, counts.sum(-1) - N1e
    raise TypeError(f"gih_counts: source must be a Sample, PositionFeatures or CountFeatures, got {type(source)}")


class GIH(eqx.Module):
    """The generalized induction head on a sample (docs/theory/mathematics.md §M6.4; the paper's GIH,
    the model's limit with a one-hot copier and ``c = e_{S*}``).

    ``ŷ_e(a) = (e^a N₁(e) + N₀(e)) / (e^a N₁ + N₀) = r p₁(e) + (1 − r) p₀(e)``
    with ``r = σ(a + log N₁ − log N₀)`` (``r = 0`` if ``N₁ = 0``, ``1`` if
    ``N₀ = 0``), ``p₁ = N₁(e)/N₁``, ``p₀ = N₀(e)/N₀``; hence
    ``dŷ_e/da = r(1 − r)(p₁(e) − p₀(e))``. Per sequence
    ``ℓ = −Σ_e π(e|z_q) log(ŷ_e + ε)`` (``kind="log"``) or
    ``−Σ_e π(e|z_q) log softmax(ŷ)_e`` (``"ce_on_probs"``), the estimator's
    Rao–Blackwellised loss; ``L_GIH(a)`` is its mean over sequences and

    - ``F = −dℓ/da = Σ_e π(e|z_q) ŷ'_e/(ŷ_e + ε)`` (log), or
      ``Σ_e (π(e|z_q) − softmax(ŷ)_e) ŷ'_e`` (ce_on_probs), in closed form.

    Build with :func:`make_gih`.
    """

    N1e: Float[Array, "N d"]
    N0e: Float[Array, "N d"]
    cond: Float[Array, "N d"]
    eps: Float[Array, ""]
    kind: str = eqx.field(static=True, default="log")
    S: tuple[int, ...] = eqx.field(static=True, default=())

    @property
    def N(self) -> int:
        return self.cond.shape[0]

    def _parts(self, a):
        N1 = self.N1e.sum(-1)
        N0 = self.N0e.sum(-1)
        p1 = self.N1e / jnp.where(N1 > 0, N1, 1.0)[:, None]
        p0 = self.N0e / jnp.where(N0 > 0, N0, 1.0)[:, None]
        logit = a + jnp.log(jnp.where(N1 > 0, N1, 1.0)) - jnp.log(jnp.where(N0 > 0, N0, 1.0))
        r = jnp.where(N1 == 0, 0.0, jnp.where(N0 == 0, 1.0, jax.nn.sigmoid(logit)))
        # r(1 - r) without cancellation, and exactly 0 when one side is empty
        rr = jnp.where((N1 == 0) | (N0 == 0), 0.0, jax.nn.sigmoid(logit) * jax.nn.sigmoid(-logit))
        yhat = r[:, None] * p1 + (1.0 - r[:, None]) * p0
        dy = rr[:, None] * (p1 - p0)
        return yhat, dy

    def _loss_of(self, yhat):
        if self.kind == "log":
            return -jnp.sum(self.cond * jnp.log(yhat + self.eps), -1)
        return -jnp.sum(self.cond * jax.nn.log_softmax(yhat, axis=-1), -1)

    def per_sequence_loss(self, a) -> Float[Array, " N"]:
        """``ℓ_n(a)`` for every sequence."""
        yhat, _ = self._parts(a)
        return self._loss_of(yhat)

    def per_sequence_force(self, a) -> Float[Array, " N"]:
        """``F_n(a) = −dℓ_n/da`` for every sequence (closed form)."""
        yhat, dy = self._parts(a)
        if self.kind == "log":
            return jnp.sum(self.cond * dy / (yhat + self.eps), -1)
        return jnp.sum((self.cond - jax.nn.softmax(yhat, axis=-1)) * dy, -1)

    def per_sequence_loss_inf(self) -> Float[Array, " N"]:
        """``lim_{a→∞} ℓ_n(a)``: ``ŷ = p₁`` where the context has a match, else ``p₀``."""
        N1 = self.N1e.sum(-1)
        N0 = self.N0e.sum(-1)
        p1 = self.N1e / jnp.where(N1 > 0, N1, 1.0)[:, None]
        p0 = self.N0e / jnp.where(N0 > 0, N0, 1.0)[:, None]
        return self._loss_of(jnp.where((N1 > 0)[:, None], p1, p0))

    def loss(self, a) -> Float[Array, ""]:
        """``L_GIH(a)``."""
        return jnp.mean(self.per_sequence_loss(a))

    def force(self, a) -> Float[Array, ""]:
        """``F(a) = −dL_GIH/da``."""
        return jnp.mean(self.per_sequence_force(a))


def set_gih(loss, S) -> GIH:
    """The GIH of a model's set `S` on the run's estimator `loss` (a :class:`~gflow.PopulationLoss`):
    of the offsets the set reads (``AbstractModel.gih_offsets``), at the last position of its sample
    (the GIH is a last-position law). ``KeyError`` when the set reads no parent offsets."""
    offs = loss.member.gih_offsets(S)
    if offs is None:
        raise KeyError(f"no GIH law for {subset_label(tuple(S))}: the set reads no parent offsets")
    return make_gih(loss.at_last_position(), offs)


def make_gih(source, S, *, cond=None, eps: float = 1e-6, kind: str = "log", M: int | None = None) -> GIH:
    """The GIH on offsets ``S`` for a sample (docs/theory/mathematics.md §M6.4).

    `source` is a :class:`~gflow.PopulationLoss` (its sample, ε and loss
    kind are used: the run's own common random numbers), or a
    :class:`~gflow.Sample` / feature set (then `eps` and `kind` apply).
    ``π(·|z_q)`` is taken from the source unless `cond` is given.
    """
    if isinstance(source, PopulationLoss):
        eps, kind, M = float(source.eps), source.kind, source.model.M
        feats = source.feats
        if S and max(check_offsets(S)) > M:
            raise ValueError(f"the GIH's offsets {tuple(S)} exceed the model's window M={M}")
    else:
        feats = source
    if kind not in ("log", "ce_on_probs"):
        raise ValueError(f"kind must be 'log' or 'ce_on_probs', got {kind!r}")
    N1e, N0e = gih_counts(feats, S, M=M)
    cond = jnp.asarray(feats.cond if cond is None else cond, jnp.float64)
    return GIH(N1e=N1e, N0e=N0e, cond=cond, eps=jnp.asarray(eps, jnp.float64), kind=kind, S=check_offsets(S))


@eqx.filter_jit
def _grid_eval(gih: GIH, a_grid):
    def one(a):
        F = gih.per_sequence_force(a)
        ell = gih.per_sequence_loss(a)
        n = F.shape[0]
        ddof = 1 if n > 1 else 0
        sq = jnp.sqrt(n)
        return (
            F.mean(),
            F.std(ddof=ddof) / sq,
            ell.mean(),
            ell.std(ddof=ddof) / sq,
        )

    return jax.lax.map(one, a_grid)


@eqx.filter_jit
def _force_mean(gih: GIH, a):
    return gih.force(a)


@eqx.filter_jit
def _force_mean_and_se(gih: GIH, a):
    F = gih.per_sequence_force(a)
    n = F.shape[0]
    return F.mean(), F.std(ddof=1 if n > 1 else 0) / jnp.sqrt(n)


@eqx.filter_jit
def _dforce_mean(gih: GIH, a):
    return jax.grad(gih.force)(a)


@eqx.filter_jit
def _loss_mean_and_se(gih: GIH, a):
    ell = gih.per_sequence_loss(a)
    n = ell.shape[0]
    return ell.mean(), ell.std(ddof=1 if n > 1 else 0) / jnp.sqrt(n)


@dataclasses.dataclass(frozen=True)
class StageIIILaw:
    """The GIH's one-dimensional law (docs/theory/mathematics.md §M6.4, §M6.5): its force on a grid
    of ``a``, its landmarks, and its prediction of a(τ) (:meth:`a`, :meth:`a_paper`).
    ``theory.laws[S]`` (:class:`gflow.Theory`) is the law of the set ``S``.

    Grid values (``(n_grid,)`` numpy arrays): `a_grid`, `F` (``F(a) = −dL_GIH/da``) and
    `F_se`, `Fexp` (``F e^a``) and `Fexp_se`, `L` (``L_GIH``) and `L_se`; `S`, the set of
    offsets.

    Landmarks, all from the exact per-sample function (grid + refinement):

    - `C_star`, `C_star_se`, `a_C_star`: ``C* = max_a F(a) e^a`` over the grid
      range (golden-section refined) and where.
    - `window`: ``(lo, hi)``, the ends of ``{a : F e^a ≥ C*/2}`` (bisection
      refined); `window_intervals` all its components; `window_is_interval`;
      `window_clipped` ``(lo at grid start, hi at grid end)``: an end at a
      grid boundary is the boundary, not a crossing.
    - `a_star`, `a_star_se`: the first down-crossing of ``F`` (``F`` from > 0 to
      ≤ 0; bisection refined), ``None`` when ``F > 0`` on the whole grid (then
      ``a* = ∞`` as far as the grid can tell); SE by the delta method,
      ``SE(F(a*))/|F'(a*)|``. `F_zeros`: every sign change of ``F``, refined.
    - `L_inf`: ``lim_{a→∞} L_GIH``. `limit_loss`, `limit_loss_se`, `a_limit`:
      ``inf_{a ≥ a_grid[0]} L_GIH(a)`` and where (``math.inf`` for the limit
      ``a → ∞``), over the grid, the refined down-crossings of ``F`` and ``∞``.

    The law's predictions on any τ (``τ = t − t₀``, Stage III's own clock; the arrays of any
    shape), from the grid's F (``gflow.theory._lawcurve``: the cubic through the four nearest
    grid values, ``F e^a`` held beyond the grid; at the default grid within 10⁻⁶ of the ODE
    solved on the exact sample mean, tested):

    - :meth:`force`: ``F(a)`` at any a;
    - :meth:`a`: the solution of the law ``da/dτ = η_a λF(λa)``, ``a(0) = a₀`` — the GIH's
      own law at ``λ = 1``; with the contrast λ of a model near the GIH
      (``λ = (c_S/Σc)·Π_{h∈S}(s^(h)_h)²``, docs/guides/checks.md) the first-order law of the
      model, whose zero is ``a*/λ``;
    - :meth:`a_paper`: the paper's ``log(e^{a₀} + C*·η_a·τ)`` (``∂τa = η_a C* e^{−a}``);
    - :meth:`tau_to`: the time the law takes from a₀ to a given a (∞ at or past its zero).
    """

    S: tuple[int, ...]
    a_grid: np.ndarray
    F: np.ndarray
    F_se: np.ndarray
    Fexp: np.ndarray
    Fexp_se: np.ndarray
    L: np.ndarray
    L_se: np.ndarray
    C_star: float
    C_star_se: float
    a_C_star: float
    window: tuple[float, float]
    window_intervals: tuple[tuple[float, float], ...]
    window_is_interval: bool
    window_clipped: tuple[bool, bool]
    a_star: float | None
    a_star_se: float | None
    F_zeros: tuple[float, ...]
    L_inf: float
    limit_loss: float
    limit_loss_se: float
    a_limit: float

    def force(self, a) -> np.ndarray:
        """``F(a) = −dL_GIH/da`` at `a` (any shape), from the grid (see the class docstring)."""
        return grid_force(self.a_grid, self.F, self.Fexp, a)

    def a(self, tau, a0: float, eta_a: float, *, lam: float = 1.0) -> np.ndarray:
        """The law's predicted a at the times `tau` (``τ ≥ 0``, any shape): the solution of
        ``da/dτ = η_a λF(λa)`` with ``a(0) = a0`` (λ = 1: the GIH's own law). `a0` is a at
        τ = 0 (Stage III's start, or ``init.a0`` of a joint run), `eta_a` the schedule's
        ``η_a``. Settles at the zero of λF(λ·) it moves to (``a*/λ`` to first order)."""
        return LawCurve(self.a_grid, self.F, self.Fexp, a0, eta_a, lam).a(tau)

    def a_paper(self, tau, a0: float, eta_a: float) -> np.ndarray:
        """The paper's Stage III law, ``log(e^{a0} + C*·η_a·τ)``: the solution of
        ``∂τa = η_a C* e^{−a}`` (``F e^a`` at its maximum C* throughout), at `tau` (τ ≥ 0)."""
        tau = np.asarray(tau, np.float64)
        if np.any(~np.isfinite(tau)) or np.any(tau < 0):
            raise ValueError("tau must be finite and >= 0")
        return np.log(np.exp(float(a0)) + self.C_star * float(eta_a) * tau)

    def tau_to(self, a, a0: float, eta_a: float, *, lam: float = 1.0) -> np.ndarray:
        """The time the law ``da/dτ = η_a λF(λa)`` takes from `a0` to `a` (any shape): ``inf``
        for an a at or past the zero it settles at, or behind `a0`."""
        return LawCurve(self.a_grid, self.F, self.Fexp, a0, eta_a, lam).tau_to(a)


def stage3_law(gih: GIH, *, a_grid=None, a_max: float = 30.0, n_grid: int = 601) -> StageIIILaw:
    """``F(a) = −dL_GIH/da`` on a grid and its landmarks (docs/theory/mathematics.md §M6.4: the paper's
    Stage III law ``∂_t a = F(a) ≍ e^{−a}``; the window, ``C*`` and ``a*`` are
    gflow's own definitions of where that law holds at finite L).

    `a_grid` defaults to ``linspace(0, a_max, n_grid)``. Monte Carlo SEs are
    ``std/√N`` over the sequences. ``C*`` is the grid maximum of ``F e^a``
    refined by golden section between its grid neighbours; the window's ends
    and ``a*`` are grid crossings refined by bisection on the exact sample
    mean (to ``1e-12``). See :class:`StageIIILaw`.
    """
    a = np.asarray(np.linspace(0.0, a_max, int(n_grid)) if a_grid is None else a_grid, np.float64)
    if a.ndim != 1 or a.size < 3 or np.any(np.diff(a) <= 0):
        raise ValueError("a_grid must be a strictly increasing 1-d grid of at least 3 points")
    F, Fse, L, Lse = (np.asarray(x, np.float64) for x in _grid_eval(gih, jnp.asarray(a)))
    ea = np.exp(a)
    Fexp, Fexp_se = F * ea, Fse * ea

    fF = lambda x: float(_force_mean(gih, jnp.asarray(x, jnp.float64)))
    fFe = lambda x: fF(x) * math.exp(x)

    # C* = max F e^a
    i = int(np.argmax(Fexp))
    lo, hi = a[max(i - 1, 0)], a[min(i + 1, a.size - 1)]
    a_c = golden_max(fFe, float(lo), float(hi)) if 0 < i < a.size - 1 else float(a[i])
    C_star = max(fFe(a_c), float(Fexp[i]))
    if C_star == float(Fexp[i]):
        a_c = float(a[i])
    C_star_se = float(_force_mean_and_se(gih, jnp.asarray(a_c))[1]) * math.exp(a_c)

    # validity window {F e^a >= C*/2}
    half = 0.5 * C_star
    g = lambda x: fFe(x) - half
    inside = Fexp >= half
    intervals = []
    j = 0
    while j < a.size:
        if not inside[j]:
            j += 1
            continue
        k = j
        while k + 1 < a.size and inside[k + 1]:
            k += 1
        left = float(a[0]) if j == 0 else bisect_root(g, float(a[j - 1]), float(a[j]), float(Fexp[j - 1] - half))
        right = (
            float(a[-1]) if k == a.size - 1 else bisect_root(g, float(a[k]), float(a[k + 1]), float(Fexp[k] - half))
        )
        intervals.append((left, right))
        j = k + 1
    if not intervals:  # C* > 0 guarantees one; C* <= 0 means F <= 0 everywhere
        intervals = [(a_c, a_c)]
    window = (intervals[0][0], intervals[-1][1])
    clipped = (bool(inside[0]), bool(inside[-1]))

    # zeros of F
    zeros, down = [], []
    for j in range(a.size - 1):
        if (F[j] > 0) != (F[j + 1] > 0):
            z = bisect_root(fF, float(a[j]), float(a[j + 1]), float(F[j]))
            zeros.append(z)
            if F[j] > 0:
                down.append(z)
    a_star = down[0] if down else None
    a_star_se = None
    if a_star is not None:
        se = float(_force_mean_and_se(gih, jnp.asarray(a_star))[1])
        slope = float(_dforce_mean(gih, jnp.asarray(a_star)))
        a_star_se = se / abs(slope) if slope != 0 else math.inf

    # inf_a L_GIH over [a_0, ∞]
    L_inf = float(jnp.mean(gih.per_sequence_loss_inf()))
    cands = [(float(L[int(np.argmin(L))]), float(a[int(np.argmin(L))]))]
    cands += [(float(_loss_mean_and_se(gih, jnp.asarray(z))[0]), z) for z in down]
    cands.append((L_inf, math.inf))
    lim, a_lim = min(cands, key=lambda t: t[0])
    if math.isinf(a_lim):
        ell = np.asarray(gih.per_sequence_loss_inf())
        lim_se = float(mean_se(ell)[1])
    else:
        lim_se = float(_loss_mean_and_se(gih, jnp.asarray(a_lim))[1])

    return StageIIILaw(
        S=gih.S,
        a_grid=a,
        F=F,
        F_se=Fse,
        Fexp=Fexp,
        Fexp_se=Fexp_se,
        L=L,
        L_se=Lse,
        C_star=float(C_star),
        C_star_se=C_star_se,
        a_C_star=float(a_c),
        window=window,
        window_intervals=tuple(intervals),
        window_is_interval=len(intervals) == 1,
        window_clipped=clipped,
        a_star=a_star,
        a_star_se=a_star_se,
        F_zeros=tuple(zeros),
        L_inf=L_inf,
        limit_loss=float(lim),
        limit_loss_se=lim_se,
        a_limit=float(a_lim),
    )


def limit_loss(gih: GIH, *, a=None, a_grid=None, a_max: float = 30.0, n_grid: int = 601) -> dict:
    """The GIH's loss (docs/theory/mathematics.md §M6.5): ``L_GIH(a)`` with its SE at a given `a`
    (``math.inf`` for the limit ``a → ∞``), or, with ``a=None``, its infimum
    ``inf_{a ≥ a_grid[0]} L_GIH(a)`` (see :func:`stage3_law`).

    Returns ``{"a", "loss", "loss_se"}``.
    """
    if a is None:
        law = stage3_law(gih, a_grid=a_grid, a_max=a_max, n_grid=n_grid)
        return {"a": law.a_limit, "loss": law.limit_loss, "loss_se": law.limit_loss_se}
    if math.isinf(float(a)) and float(a) > 0:
        m, se = mean_se(np.asarray(gih.per_sequence_loss_inf()))
    else:
        m, se = _loss_mean_and_se(gih, jnp.asarray(float(a), jnp.float64))
    return {"a": float(a), "loss": float(m), "loss_se": float(se)}



# ---------------------------------------------------------------------------
# Jitted helpers (used by the checks)
# ---------------------------------------------------------------------------


@eqx.filter_jit
def gih_force(gih, a):
    return jax.vmap(gih.force)(a)


@eqx.filter_jit
def gih_force_per_seq(gih, a):
    return gih.per_sequence_force(a)


@eqx.filter_jit
def gih_dforce(gih, a):
    return jax.grad(gih.force)(a)


@eqx.filter_jit
def gih_ode(gih, a0, lam, rate, ts):
    """``a(τ)`` at `ts` for ``da/dτ = rate·λF(λa)``, ``a(0) = a0`` (λ = 1: the GIH law)."""

    def vf(t, y, args):
        return rate * lam * gih.force(lam * y)

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vf),
        diffrax.Tsit5(),
        0.0,
        ts[-1],
        None,
        a0,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=1e-9, atol=1e-12),
        max_steps=100_000,
        throw=False,
    )
    return sol.ys
