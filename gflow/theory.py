"""What the flow is compared with: the theory of SPEC §6.

- **Stage I winner** (§6.1): the modified χ²-mutual information ``Ĩ(S)`` of
  every selectable set of offsets, exact per kernel, averaged over the prior by
  Monte Carlo with paired standard errors; its ranking of 𝒮 and
  ``S* = argmax Ĩ``.
- **Stage I rates** (§6.2): ``J(S) = -∂L̂/∂a`` at ``a = 0``, ``c = e_S``,
  computed from the model on the run's own sample, and the predicted
  ``d/dt log c_S``.
- **Stage III** (§6.4): the generalized induction head (GIH) ``ŷ_e(a)``, its
  one-dimensional law ``F(a) = -dL_GIH/da``, ``C* = max F e^a``, the validity
  window ``{F e^a ≥ C*/2}`` and the zero ``a*`` of ``F``.
- **Limit loss** (§6.5): ``inf_a L_GIH(a)``.
- :func:`theory_report` gathers all of it into a JSON-serialisable dict, and
  :func:`format_theory` prints it.

Everything is deterministic in its key/seed. Functions are pure: they take
configurations and arrays and return small frozen dataclasses (numpy values)
or plain dicts, so ``gflow.checks`` can reuse them.
"""

from __future__ import annotations

import dataclasses
import math
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .data import DataConfig, Sample, sample_kernels, window_law
from .loss import EstimatorConfig, PopulationLoss, make_loss
from .model import (
    CountFeatures,
    InitConfig,
    ModelConfig,
    Params,
    PositionFeatures,
    init_params,
    subset_label,
    window_code_count,
)

__all__ = [
    "GIH",
    "ChiSquaredRanking",
    "Stage1Duration",
    "StageIIILaw",
    "StageIRates",
    "chi2_mi",
    "dlogc_dt",
    "first_order_slope",
    "format_theory",
    "gih_counts",
    "limit_loss",
    "log_ratio_slope",
    "make_gih",
    "modified_chi2_ranking",
    "predicted_stage1_duration",
    "stage1_rates",
    "stage3_law",
    "theory_report",
]

# Two Ĩ values whose paired difference is below this (relative to the larger
# |Ĩ|) are an exact tie: with a fixed kernel the SE is 0, and sets that tie in
# exact arithmetic differ by rounding only.
_TIE_RTOL = 1e-9


def _mean_se(x: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, np.float64)
    n = x.shape[axis]
    se = np.std(x, axis=axis, ddof=1) / np.sqrt(n) if n > 1 else np.zeros_like(np.mean(x, axis=axis))
    return np.mean(x, axis=axis), se


def _paired_se(x: np.ndarray) -> np.ndarray:
    """``se[i, j]`` = standard error of the mean of ``x[:, i] - x[:, j]`` (paired
    on the rows, which are the same draws): ``√((V_ii + V_jj − 2 V_ij)/n)``."""
    n = x.shape[0]
    if n < 2:
        return np.zeros((x.shape[1], x.shape[1]))
    V = np.atleast_2d(np.cov(np.asarray(x, np.float64), rowvar=False, ddof=1))
    v = np.diag(V)
    return np.sqrt(np.maximum(v[:, None] + v[None, :] - 2.0 * V, 0.0) / n)


def _as_sets(sets) -> tuple[tuple[int, ...], ...]:
    if isinstance(sets, ModelConfig):
        return sets.subsets
    return tuple(tuple(int(h) for h in S) for S in sets)


# ---------------------------------------------------------------------------
# §6.1  Modified χ²-mutual information
# ---------------------------------------------------------------------------


def _window_size(cfg: DataConfig, sets) -> int:
    H = max((max(S) for S in sets if len(S)), default=1)
    return max(H, cfg.m) + 1


def chi2_mi(
    pi: Float[Array, "K d"], cfg: DataConfig, sets
) -> tuple[Float[Array, " nS"], Float[Array, " nS"]]:
    """Exact modified and ordinary χ²-mutual information of one kernel (SPEC §6.1).

    For a set of offsets ``S``, with ``μ`` the stationary law of the chain of
    ``π``, ``z = (x_{l-h})_{h∈S}`` and ``e = x_l``:

    - ``Ĩ(S) = Σ_z μ_S(z)² (Σ_e μ(e|z)²/μ(e) − 1) = Σ_{z,e} μ(z,e)²/μ(e) − Σ_z μ_S(z)²``
      (the paper's modified χ²-MI, the Stage I winner's criterion);
    - ``I_χ²(S) = Σ_z μ_S(z) (Σ_e μ(e|z)²/μ(e) − 1)`` (the ordinary χ²-MI).

    Both are 0 for ``S = ∅`` (set exactly). Computed by enumeration over the
    exact stationary law of ``W = max(max S, p_k) + 1`` consecutive tokens
    (``max(H, p_k) + 1`` for the model's 𝒮)
    (:func:`gflow.data.window_law`), marginalised onto ``(z, e)``. The second
    form of ``Ĩ`` never divides by ``μ_S(z)``; terms with ``μ(e) = 0`` (hence
    ``μ(z, e) = 0``) are 0.

    **Arguments:** `pi` the kernel ``(d**k, d)``; `cfg` the data
    configuration (parents, d); `sets` the sets of 1-based offsets (or a
    :class:`~gflow.model.ModelConfig`, meaning its 𝒮).

    **Returns:** ``(Ĩ, I_χ²)``, each ``(len(sets),)``. Pure JAX; vmappable
    over ``pi``.
    """
    sets = _as_sets(sets)
    d = cfg.d
    W = _window_size(cfg, sets)
    P = window_law(pi, cfg, W).reshape((d,) * W)  # axis t holds x_{l-W+1+t}
    It, ch = [], []
    for S in sets:
        if len(S) == 0:
            It.append(jnp.zeros((), P.dtype))
            ch.append(jnp.zeros((), P.dtype))
            continue
        keep = {W - 1 - h for h in S} | {W - 1}
        axes = tuple(t for t in range(W) if t not in keep)
        joint = (P.sum(axis=axes) if axes else P).reshape(-1, d)  # (d**|S|, d), e last
        mu_z = joint.sum(1)
        mu_e = joint.sum(0)
        q = jnp.where(mu_e > 0, joint**2 / jnp.where(mu_e > 0, mu_e, 1.0), 0.0)
        It.append(q.sum() - jnp.sum(mu_z**2))
        qz = q.sum(1)
        ch.append(jnp.sum(jnp.where(mu_z > 0, qz / jnp.where(mu_z > 0, mu_z, 1.0), 0.0)) - 1.0)
    return jnp.stack(It), jnp.stack(ch)


@eqx.filter_jit
def _chi2_mi_batch(pis, cfg, sets):
    return jax.vmap(lambda p: chi2_mi(p, cfg, sets))(pis)


@dataclasses.dataclass(frozen=True)
class ChiSquaredRanking:
    """The prior average of ``Ĩ`` and ``I_χ²`` over 𝒮 and its ranking (SPEC §6.1).

    - `sets`: the sets of offsets, in 𝒮 order.
    - `Itilde`, `Itilde_se`: ``E_π Ĩ(S)`` and its Monte Carlo SE, ``(nS,)``.
    - `chi2`, `chi2_se`: the same for the ordinary χ²-MI.
    - `diff_se`: ``(nS, nS)``, SE of ``Ĩ(S_i) − Ĩ(S_j)`` paired on the same π draws.
    - `order`: indices of `sets` by decreasing ``Ĩ``.
    - `S_star`: ``argmax Ĩ``.
    - `gap`, `gap_se`: ``Ĩ(first) − Ĩ(second)`` and its paired SE.
    - `close_call`: the top two are within 3 paired SEs (or tie exactly).
    - `n_pi`: number of kernels averaged (1 for a fixed kernel, SEs 0).
    - `samples`: per-kernel ``Ĩ``, ``(n_pi, nS)`` (for further paired tests).
    """

    sets: tuple[tuple[int, ...], ...]
    Itilde: np.ndarray
    Itilde_se: np.ndarray
    chi2: np.ndarray
    chi2_se: np.ndarray
    diff_se: np.ndarray
    order: tuple[int, ...]
    S_star: tuple[int, ...]
    gap: float
    gap_se: float
    close_call: bool
    n_pi: int
    samples: np.ndarray = dataclasses.field(repr=False)


def modified_chi2_ranking(
    cfg: DataConfig, sets, *, n_pi: int = 2000, key: PRNGKeyArray | None = None
) -> ChiSquaredRanking:
    """Rank 𝒮 by the prior average of the modified χ²-MI (SPEC §6.1; the paper's
    prediction ``c(t)/Σc → e_{S*}``, ``S* = argmax_S E_π Ĩ(S)``).

    ``E_π Ĩ(S)`` is estimated by Monte Carlo over `n_pi` kernels drawn from the
    prior with `key` (default ``jax.random.key(0)``) by
    :func:`gflow.data.sample_kernels`, ``Ĩ`` exact per kernel
    (:func:`chi2_mi`, vmapped). Standard errors are ``std/√n_pi``; the ranking's
    uncertainty is the SE of the *paired* differences ``Ĩ(S) − Ĩ(S')`` on the
    same draws, much smaller than either SE when the two are correlated. With
    a fixed kernel one evaluation is exact and every SE is 0.

    A ranking is a close call when ``Ĩ(first) − Ĩ(second) ≤ 3 SE_paired``
    (gflow's own choice of 3; SPEC §6.1), exact ties (within relative
    ``1e-9``) included.
    """
    sets = _as_sets(sets)
    if len(sets) == 0:
        raise ValueError("modified_chi2_ranking needs at least one set of offsets, got none")
    if cfg.kernel is not None:
        n_pi = 1
    if int(n_pi) < 1:
        raise ValueError(f"n_pi must be a positive integer, got {n_pi!r}")
    if key is None:
        key = jax.random.key(0)
    pis = sample_kernels(cfg, int(n_pi), key=key)
    It, ch = _chi2_mi_batch(pis, cfg, sets)
    It, ch = np.asarray(It), np.asarray(ch)
    Im, Ise = _mean_se(It)
    cm, cse = _mean_se(ch)
    dse = _paired_se(It)
    order = tuple(int(i) for i in np.argsort(-Im, kind="stable"))
    if len(sets) > 1:
        i, j = order[0], order[1]
        gap, gap_se = float(Im[i] - Im[j]), float(dse[i, j])
        tie = gap <= _TIE_RTOL * max(abs(Im[i]), abs(Im[j]), 1e-300)
        close = bool(tie or gap <= 3.0 * gap_se)
    else:
        gap, gap_se, close = math.inf, 0.0, False
    return ChiSquaredRanking(
        sets=sets,
        Itilde=Im,
        Itilde_se=Ise,
        chi2=cm,
        chi2_se=cse,
        diff_se=dse,
        order=order,
        S_star=sets[order[0]],
        gap=gap,
        gap_se=gap_se,
        close_call=close,
        n_pi=int(n_pi),
        samples=It,
    )


# ---------------------------------------------------------------------------
# §6.2  Stage I rates
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StageIRates:
    """``J(S) = −∂L̂/∂a`` at ``a = 0``, ``c = e_S`` (SPEC §6.2).

    - `sets`: the sets, in 𝒮 order.
    - `J`, `J_se`: the sample mean over sequences and its SE, ``(nS,)``.
    - `diff_se`: ``(nS, nS)``, SE of ``J(S_i) − J(S_j)`` paired on the same sequences.
    - `L0`: ``L̂`` at ``a = 0`` (independent of ``w`` and ``c``).
    """

    sets: tuple[tuple[int, ...], ...]
    J: np.ndarray
    J_se: np.ndarray
    diff_se: np.ndarray
    L0: float


@eqx.filter_jit
def _per_sequence_dloss_da(loss: PopulationLoss, w, Cs):
    """``(∂ℓ_n/∂a at a = 0)`` for every sequence n and every row of ``Cs``: ``(nS, N)``;
    and the per-sequence loss at ``a = 0``."""
    zero = jnp.zeros((), w.dtype)

    def one(C):
        f = lambda a: loss.per_sequence(Params(w=w, C=C, a=a))
        return jax.jvp(f, (zero,), (jnp.ones_like(zero),))

    # one set at a time: memory stays that of one loss evaluation
    ls, ds = jax.lax.map(one, Cs)
    return ls[0], ds


def stage1_rates(loss: PopulationLoss, w: Float[Array, "H M"], *, sets=None) -> StageIRates:
    """Stage I rates ``J(S) := −∂L̂/∂a |_{a=0, c=e_S}`` at copier weights ``w``
    (SPEC §6.2; gflow's own derivation, on the model itself).

    Computed from ``loss`` (the run's :class:`~gflow.loss.PopulationLoss`, its
    own sample) with ``C`` one-hot on ``S`` (``C_S = 1``): one forward-mode
    derivative in ``a`` of the per-sequence losses, so every sequence gives
    its own ``−∂ℓ_n/∂a`` and the SEs (and the paired SEs of differences
    between sets, on the same sequences) are ``std/√N``.

    For ``norm="sum"`` and any ``c``, ``κ_l = Σ_S (c_S/Σc) P_l(S)`` is linear
    in ``c/Σc``, and ŷ at ``a = 0`` is the context's unigram whatever ``c``,
    so exactly to first order in ``a``:
    ``L̂(a) = L₀ − a Σ_S (c_S/Σc) J(S) + O(a²)`` (:func:`first_order_slope`).
    With a one-hot copier on the offsets of ``S`` and ``L → ∞``,
    ``J(S) → Ĩ(S)`` (the paper's Stage I analysis; ε → 0 assumed). For
    ``norm="layer"`` J is still the derivative at ``c = e_S`` but the
    first-order expansion in ``c/Σc`` is not exact.

    `sets` defaults to ``loss.model.subsets``; offsets must lie in ``1..H``.
    """
    model = loss.model
    all_sets = model.subsets
    sets = all_sets if sets is None else _as_sets(sets)
    idx = []
    for S in sets:
        if S not in all_sets:
            raise ValueError(f"stage1_rates: set {S} is not in the model's 𝒮 = {all_sets}")
        idx.append(all_sets.index(S))
    w = jnp.asarray(w, loss.eps.dtype)
    Cs = jnp.eye(len(all_sets), dtype=w.dtype)[np.array(idx)]
    l0, ds = _per_sequence_dloss_da(loss, w, Cs)
    per = -np.asarray(ds, np.float64).T  # (N, nS)
    J, Jse = _mean_se(per)
    return StageIRates(sets=sets, J=J, J_se=Jse, diff_se=_paired_se(per), L0=float(np.mean(np.asarray(l0))))


def first_order_slope(c, J) -> float:
    """``Σ_S (c_S/Σc) J(S)``: the exact first-order rate ``−∂L̂/∂a`` at ``a = 0``
    for selector weights ``c`` (``norm="sum"``; SPEC §6.2)."""
    c = np.asarray(c, np.float64)
    return float(np.dot(c / c.sum(), np.asarray(J, np.float64)))


def dlogc_dt(J, C, a, *, rate: float = 1.0) -> np.ndarray:
    """Predicted ``d/dt log c_S = 4 a rate (J(S) − Σ_S' (c_S'/Σc) J(S'))/‖C‖²`` for
    every S (SPEC §6.2), with ``c = C²``.

    Derivation (gflow's own, from ``L ≈ L₀ − a Σ_S (C_S²/‖C‖²) J(S)`` and
    ``dC/dt = −rate ∂L/∂C``): ``dC_S/dt = 2 a rate C_S (J(S) − J̄)/‖C‖²``, so
    ``‖C‖`` is conserved and ``d log c_S/dt = 2 d log|C_S|/dt``. `rate` is
    the selector block's time scale ``η_C`` (1 for the paper's flow). `J` may
    be ``J`` or ``Ĩ`` in its place.
    """
    C = np.asarray(C, np.float64)
    J = np.asarray(J, np.float64)
    c = C**2
    return 4.0 * float(a) * float(rate) * (J - np.dot(c / c.sum(), J)) / c.sum()


def log_ratio_slope(J, i: int, j: int, C, a, *, rate: float = 1.0) -> float:
    """Predicted ``d/dt log(c_{S_i}/c_{S_j}) = 4 a rate (J(S_i) − J(S_j))/‖C‖²``
    (SPEC §6.2); constant in Stage I since ``‖C‖`` is conserved."""
    C = np.asarray(C, np.float64)
    J = np.asarray(J, np.float64)
    return 4.0 * float(a) * float(rate) * float(J[i] - J[j]) / float(np.sum(C**2))


@dataclasses.dataclass(frozen=True)
class Stage1Duration:
    """The linearised Stage I's predicted duration (README §M8.1).

    - `t`: the first time at which ``max_S c_S/Σc`` reaches ``1 − δ``
      (``math.inf`` if it never does; ``0.0`` if it starts there).
    - `S`: the set that crosses (``None`` if none does), `index` its position
      in 𝒮 (``-1`` if none).
    - `rate`: ``k = 4 a₀ η_C/‖C‖²``, so ``log c_S(t) = log c_S(0) + k J(S) t`` up to a
      common normalisation.
    """

    t: float
    S: tuple[int, ...] | None
    index: int
    rate: float


def _first_sublevel_time(x0: np.ndarray, v: np.ndarray, i: int, level: float) -> float:
    """First ``t ≥ 0`` with ``h(t) := logsumexp_{j≠i}(x0_j − x0_i + (v_j − v_i) t) ≤ level``
    (``math.inf`` if none). ``h`` is convex (a log-sum-exp of affine functions),
    so ``{h ≤ level}`` is an interval: bracket it by doubling, then bisect."""
    others = np.arange(x0.size) != i
    b = x0[others] - x0[i]
    m = v[others] - v[i]

    def h(t):
        z = b + m * t
        zm = z.max()
        return float(zm + np.log(np.sum(np.exp(z - zm))))

    def dh(t):
        z = b + m * t
        w = np.exp(z - z.max())
        return float(np.dot(w, m) / w.sum())

    if h(0.0) <= level:
        return 0.0
    if dh(0.0) >= 0.0:
        return math.inf  # convex and non-decreasing from t = 0: never lower than h(0)
    T_prev, T = 0.0, 1.0 / max(float(np.max(np.abs(m))), 1e-300)
    hi = None
    for _ in range(2100):
        if not math.isfinite(T):
            return math.inf
        if h(T) <= level:
            hi = T
            break
        if dh(T) >= 0.0:
            # past the minimum of h: locate it in [T_prev, T] (dh is increasing)
            a_, b_ = T_prev, T
            for _ in range(200):
                mid = 0.5 * (a_ + b_)
                if dh(mid) >= 0.0:
                    b_ = mid
                else:
                    a_ = mid
            if h(b_) > level:
                return math.inf  # the minimum of h is above the level
            hi = b_
            break
        T_prev, T = T, 2.0 * T
    if hi is None:
        return math.inf
    lo = 0.0
    for _ in range(200):  # h > level on [0, lo], h ≤ level at hi
        mid = 0.5 * (lo + hi)
        if h(mid) <= level:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-15 * hi:
            break
    return hi


def predicted_stage1_duration(J, c0, a0: float, delta: float, *, eta_C: float = 1.0, sets=None) -> Stage1Duration:
    """The time at which the linearised Stage I reaches its event (README §M8.1;
    gflow's own finite-size law, an extension of the paper's Stage I analysis).

    With ``w`` and ``a = a₀`` frozen and ``L̂ ≈ L₀ − a Σ_S (c_S/Σc) J(S)``
    (exact to first order in ``a`` for ``norm="sum"``), ``‖C‖`` is conserved and
    ``d/dt log(c_S/c_S') = 4 a₀ η_C (J(S) − J(S'))/‖C‖²`` is constant, so

        c(t)/Σc = softmax_S(log c_S(0) + 4 a₀ η_C J(S) t/‖C‖²),   ‖C‖² = Σ_S c_S(0).

    Returns the first ``t ≥ 0`` at which ``max_S c_S/Σc ≥ 1 − δ`` and the set
    that gets there. For each ``S``, ``c_S/Σc ≥ 1 − δ`` iff
    ``log Σ_{S'≠S} c_S'/c_S ≤ log(δ/(1 − δ))``, a convex function of ``t``
    whose sublevel set is an interval; its first point is found by bisection
    (to relative ``1e-15``), and the earliest over ``S`` is returned. The set
    that crosses first need not be ``argmax J`` (a set with a large
    ``c_S(0)`` can cross transiently); ``math.inf`` when no set ever crosses
    (e.g. a tie for the top ``J``).

    **Arguments:** `J` the Stage I rates ``J(S)`` in 𝒮 order; `c0` the initial
    ``c_S = C_S²`` (all > 0); `a0`; `delta` in ``(0, 1)``; `eta_C` the selector's
    time scale; `sets` (optional) 𝒮, to name the crossing set.
    """
    J = np.asarray(J, np.float64).ravel()
    c0 = np.asarray(c0, np.float64).ravel()
    if J.shape != c0.shape or J.size == 0:
        raise ValueError(f"predicted_stage1_duration: J {J.shape} and c0 {c0.shape} must be equal non-empty vectors")
    if not np.all(np.isfinite(J)):
        raise ValueError(f"predicted_stage1_duration: J must be finite, got {J.tolist()}")
    if not np.all(c0 > 0) or not np.all(np.isfinite(c0)):
        raise ValueError(f"predicted_stage1_duration: c0 must be finite and > 0, got {c0.tolist()}")
    if not 0.0 < float(delta) < 1.0:
        raise ValueError(f"predicted_stage1_duration: delta must lie in (0, 1), got {delta!r}")
    k = 4.0 * float(a0) * float(eta_C) / float(c0.sum())
    names = None if sets is None else _as_sets(sets)
    if J.size == 1:
        return Stage1Duration(0.0, None if names is None else names[0], 0, k)
    level = math.log(float(delta) / (1.0 - float(delta)))
    x0, v = np.log(c0), k * J
    times = [_first_sublevel_time(x0, v, i, level) for i in range(J.size)]
    i = int(np.argmin(times))
    if not math.isfinite(times[i]):
        return Stage1Duration(math.inf, None, -1, k)
    return Stage1Duration(float(times[i]), None if names is None else names[i], i, k)


# ---------------------------------------------------------------------------
# §6.4  Stage III: the generalized induction head
# ---------------------------------------------------------------------------


def _check_S(S, M: int | None = None) -> tuple[int, ...]:
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
    """Match counts of the generalized induction head on offsets ``S`` (SPEC §6.4).

    ``N₁(e) = #{l ≤ L : x_{l-h} = x_{q-h} ∀ h ∈ S, x_l = e}`` (query ``q = L+1``;
    the zero padding ``x_j``, ``j ≤ 0``, never matches) and
    ``N₀(e) = #{l ≤ L : x_l = e} − N₁(e)``. For ``S = ∅`` every position matches.

    `source` is a :class:`~gflow.data.Sample` or
    :class:`~gflow.model.PositionFeatures` (read from ``X``), or
    :class:`~gflow.model.CountFeatures` (read from the window codes, which
    encode offsets ``1..M``; ``M`` is inferred from the table size unless
    given). All give the same counts on the same sample. Returns float64
    ``(N, d)`` arrays.
    """
    S = _check_S(S)
    if isinstance(source, (Sample, PositionFeatures)):
        d = source.cond.shape[-1]
        return _counts_from_X(jnp.asarray(source.X), S, d)
    if isinstance(source, CountFeatures):
        d, K = source.counts.shape[1:]
        if M is None:
            M = round(math.log(K) / math.log(d + 1))
        if window_code_count(d, M) != K:
            raise ValueError(f"gih_counts: counts have {K} windows, not (d+1)**M with d={d}, M={M}")
        _check_S(S, M)
        T = jnp.asarray(_count_match_table(d, M, S))
        counts = jnp.asarray(source.counts, jnp.float64)
        N1e = jnp.einsum("nk,nek->ne", T[source.qcode], counts)
        return N1e, counts.sum(-1) - N1e
    raise TypeError(f"gih_counts: source must be a Sample, PositionFeatures or CountFeatures, got {type(source)}")


class GIH(eqx.Module):
    """The generalized induction head on a sample (SPEC §6.4; the paper's GIH,
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


def make_gih(source, S, *, cond=None, eps: float = 1e-6, kind: str = "log", M: int | None = None) -> GIH:
    """The GIH on offsets ``S`` for a sample (SPEC §6.4).

    `source` is a :class:`~gflow.loss.PopulationLoss` (its sample, ε and loss
    kind are used: the run's own common random numbers), or a
    :class:`~gflow.data.Sample` / feature set (then `eps` and `kind` apply).
    ``π(·|z_q)`` is taken from the source unless `cond` is given.
    """
    if isinstance(source, PopulationLoss):
        eps, kind, M = float(source.eps), source.kind, source.model.M
        feats = source.feats
        if S and max(_check_S(S)) > M:
            raise ValueError(f"the GIH's offsets {tuple(S)} exceed the model's window M={M}")
    else:
        feats = source
    if kind not in ("log", "ce_on_probs"):
        raise ValueError(f"kind must be 'log' or 'ce_on_probs', got {kind!r}")
    N1e, N0e = gih_counts(feats, S, M=M)
    cond = jnp.asarray(feats.cond if cond is None else cond, jnp.float64)
    return GIH(N1e=N1e, N0e=N0e, cond=cond, eps=jnp.asarray(eps, jnp.float64), kind=kind, S=_check_S(S))


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


def _bisect(f, lo: float, hi: float, flo: float, *, tol: float = 1e-12, maxiter: int = 200) -> float:
    """Root of ``f`` in ``[lo, hi]`` given ``sign f(lo) = sign flo ≠ sign f(hi)``."""
    for _ in range(maxiter):
        mid = 0.5 * (lo + hi)
        fm = f(mid)
        if fm == 0.0:
            return mid
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
        if hi - lo <= tol * max(1.0, abs(mid)):
            break
    return 0.5 * (lo + hi)


def _golden_max(f, lo: float, hi: float, *, tol: float = 1e-10, maxiter: int = 200) -> float:
    """Argmax of a unimodal ``f`` on ``[lo, hi]`` by golden-section search."""
    g = (math.sqrt(5.0) - 1.0) / 2.0
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = f(x1), f(x2)
    for _ in range(maxiter):
        if hi - lo <= tol * max(1.0, abs(hi)):
            break
        if f1 >= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - g * (hi - lo)
            f1 = f(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + g * (hi - lo)
            f2 = f(x2)
    return 0.5 * (lo + hi)


@dataclasses.dataclass(frozen=True)
class StageIIILaw:
    """The GIH's one-dimensional law on a grid of ``a`` and its landmarks (SPEC §6.4, §6.5).

    Grid values (``(n_grid,)`` numpy arrays): `a`, `F` (``−dL_GIH/da``) and
    `F_se`, `Fexp` (``F e^a``) and `Fexp_se`, `L` (``L_GIH``) and `L_se`.

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
    """

    S: tuple[int, ...]
    a: np.ndarray
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


def stage3_law(gih: GIH, *, a_grid=None, a_max: float = 30.0, n_grid: int = 601) -> StageIIILaw:
    """``F(a) = −dL_GIH/da`` on a grid and its landmarks (SPEC §6.4: the paper's
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
    a_c = _golden_max(fFe, float(lo), float(hi)) if 0 < i < a.size - 1 else float(a[i])
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
        left = float(a[0]) if j == 0 else _bisect(g, float(a[j - 1]), float(a[j]), float(Fexp[j - 1] - half))
        right = (
            float(a[-1]) if k == a.size - 1 else _bisect(g, float(a[k]), float(a[k + 1]), float(Fexp[k] - half))
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
            z = _bisect(fF, float(a[j]), float(a[j + 1]), float(F[j]))
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
        lim_se = float(_mean_se(ell)[1])
    else:
        lim_se = float(_loss_mean_and_se(gih, jnp.asarray(a_lim))[1])

    return StageIIILaw(
        S=gih.S,
        a=a,
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
    """The GIH's loss (SPEC §6.5): ``L_GIH(a)`` with its SE at a given `a`
    (``math.inf`` for the limit ``a → ∞``), or, with ``a=None``, its infimum
    ``inf_{a ≥ a_grid[0]} L_GIH(a)`` (see :func:`stage3_law`).

    Returns ``{"a", "loss", "loss_se"}``.
    """
    if a is None:
        law = stage3_law(gih, a_grid=a_grid, a_max=a_max, n_grid=n_grid)
        return {"a": law.a_limit, "loss": law.limit_loss, "loss_se": law.limit_loss_se}
    if math.isinf(float(a)) and float(a) > 0:
        m, se = _mean_se(np.asarray(gih.per_sequence_loss_inf()))
    else:
        m, se = _loss_mean_and_se(gih, jnp.asarray(float(a), jnp.float64))
    return {"a": float(a), "loss": float(m), "loss_se": float(se)}


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


def _f(x):
    """A JSON-safe float (``None`` for non-finite values)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _fl(xs):
    return [_f(x) for x in np.asarray(xs, np.float64).ravel()]


def theory_report(
    data_cfg: DataConfig | None = None,
    model_cfg: ModelConfig | None = None,
    estimator_cfg: EstimatorConfig | None = None,
    init_cfg: InitConfig | None = None,
    *,
    n_pi: int = 2000,
    pi_seed: int = 0,
    S: tuple[int, ...] | None = None,
    a_max: float = 30.0,
    n_grid: int = 601,
    loss: PopulationLoss | None = None,
) -> dict:
    """Every prediction of SPEC §6 for one configuration, as a JSON-serialisable dict.

    - ``"mi"``: the Ĩ ranking of 𝒮 over `n_pi` prior kernels (key
      ``jax.random.key(pi_seed)``) with SEs, the paired SE of each gap to the
      next set, the χ²-MI, ``S*`` and the close-call flag
      (:func:`modified_chi2_ranking`).
    - ``"stage1"``: ``J(S)`` with SEs at the initial ``w`` of `init_cfg`, on the
      run's sample (``make_loss(data, model, estimator)``, or `loss` if
      given), ``L₀``, and the predicted initial ``d/dt log c_S`` from ``J`` and
      from ``Ĩ`` at ``a = a₀``, ``C = c₀`` (:func:`dlogc_dt`), and the slope
      of ``log(c_{S*}/c_{S'})`` for the runner-up ``S'``.
    - ``"stage3"``: the GIH with ``c = e_{S*}`` (or the given `S`) on the same
      sample: ``C*``, the window, ``a*``, the limit loss, and the grid curves
      (:func:`stage3_law`).
    - ``"config"``, ``"timing"``.

    Non-finite numbers are ``None`` (with a note). Lists follow 𝒮's order
    unless named ``ranking``.
    """
    t0 = time.perf_counter()
    data_cfg = DataConfig() if data_cfg is None else data_cfg
    model_cfg = ModelConfig() if model_cfg is None else model_cfg
    estimator_cfg = EstimatorConfig() if estimator_cfg is None else estimator_cfg
    init_cfg = InitConfig() if init_cfg is None else init_cfg
    sets = model_cfg.subsets
    rank = modified_chi2_ranking(data_cfg, sets, n_pi=n_pi, key=jax.random.key(pi_seed))
    t1 = time.perf_counter()

    if loss is None:
        loss = make_loss(data_cfg, model_cfg, estimator_cfg)
    params = init_params(model_cfg, init_cfg)
    rates = stage1_rates(loss, params.w)
    C0 = np.asarray(params.C)
    a0 = float(init_cfg.a0)
    dl_J = dlogc_dt(rates.J, C0, a0)
    dl_I = dlogc_dt(rank.Itilde, C0, a0)
    iJ = sets.index(rank.S_star)
    runner = rank.order[1] if len(sets) > 1 else rank.order[0]
    t2 = time.perf_counter()

    S_gih = rank.S_star if S is None else _check_S(S, model_cfg.M)
    gih = make_gih(loss, S_gih)
    law = stage3_law(gih, a_max=a_max, n_grid=n_grid)
    t3 = time.perf_counter()

    ranking = []
    for pos, i in enumerate(rank.order):
        nxt = rank.order[pos + 1] if pos + 1 < len(rank.order) else None
        ranking.append(
            {
                "S": list(sets[i]),
                "label": subset_label(sets[i]),
                "Itilde": _f(rank.Itilde[i]),
                "Itilde_se": _f(rank.Itilde_se[i]),
                "gap_to_next": None if nxt is None else _f(rank.Itilde[i] - rank.Itilde[nxt]),
                "gap_to_next_se": None if nxt is None else _f(rank.diff_se[i, nxt]),
                "chi2": _f(rank.chi2[i]),
                "chi2_se": _f(rank.chi2_se[i]),
            }
        )
    notes = []
    if rank.close_call:
        notes.append(
            f"close call: the top two sets of the Ĩ ranking are within 3 paired SEs "
            f"(gap {rank.gap:.3g} ± {rank.gap_se:.3g})"
        )
    if law.a_star is None:
        span = f"[{law.a[0]:g}, {law.a[-1]:g}]"
        if np.all(law.F > 0):
            notes.append(f"F > 0 on the whole grid {span}: a* = ∞ as far as the grid tells")
        else:
            notes.append(f"F never turns from > 0 to <= 0 on the grid {span}: no finite a*")
    if not law.window_is_interval:
        notes.append("the validity window {F e^a ≥ C*/2} is not an interval")
    if law.window_clipped[0]:
        notes.append("the validity window starts at the grid's first point")
    if law.window_clipped[1]:
        notes.append("the validity window reaches the grid's last point")
    if model_cfg.norm != "sum":
        notes.append("norm='layer': L ≈ L₀ − a Σ (c_S/Σc) J(S) is not exact to first order")
    if data_cfg.start != "stationary" and data_cfg.burn_in == 0:
        notes.append("start='uniform' without burn-in: Ĩ assumes the stationary law, the sample does not")

    report = {
        "config": {
            "data": {
                "d": data_cfg.d,
                "parents": list(data_cfg.parents),
                "alpha": _f(data_cfg.alpha),
                "L": data_cfg.L,
                "start": data_cfg.start,
                "burn_in": data_cfg.burn_in,
                "fixed_kernel": data_cfg.kernel is not None,
            },
            "model": {"M": model_cfg.M, "H": model_cfg.H, "D": model_cfg.D, "norm": model_cfg.norm},
            "estimator": {
                "N": estimator_cfg.N,
                "seed": estimator_cfg.seed,
                "eps": _f(estimator_cfg.eps),
                "loss": estimator_cfg.loss,
            },
            "init": {
                "w_plus": _f(init_cfg.w_plus),
                "w_minus": _f(init_cfg.w_minus),
                "c0": _f(init_cfg.c0),
                "a0": _f(init_cfg.a0),
            },
            "n_pi": rank.n_pi,
            "pi_seed": pi_seed,
        },
        "sets": [list(S_) for S_ in sets],
        "labels": [subset_label(S_) for S_ in sets],
        "mi": {
            "Itilde": _fl(rank.Itilde),
            "Itilde_se": _fl(rank.Itilde_se),
            "chi2": _fl(rank.chi2),
            "chi2_se": _fl(rank.chi2_se),
            "ranking": ranking,
            "S_star": list(rank.S_star),
            "S_star_label": subset_label(rank.S_star),
            "gap": _f(rank.gap),
            "gap_se": _f(rank.gap_se),
            "close_call": rank.close_call,
        },
        "stage1": {
            "J": _fl(rates.J),
            "J_se": _fl(rates.J_se),
            "J_diff_se": [_fl(r) for r in rates.diff_se],
            "argmax_J": list(sets[int(np.argmax(rates.J))]),
            "L0": _f(rates.L0),
            "a0": a0,
            "C_norm_sq": _f(np.sum(C0**2)),
            "dlogc_dt_J": _fl(dl_J),
            "dlogc_dt_Itilde": _fl(dl_I),
            "runner_up": list(sets[runner]),
            "slope_Sstar_vs_runner_up_J": _f(log_ratio_slope(rates.J, iJ, runner, C0, a0)),
            "slope_Sstar_vs_runner_up_J_se": _f(
                4 * a0 * rates.diff_se[iJ, runner] / np.sum(C0**2)
            ),
            "slope_Sstar_vs_runner_up_Itilde": _f(log_ratio_slope(rank.Itilde, iJ, runner, C0, a0)),
        },
        "stage3": {
            "S": list(law.S),
            "label": subset_label(law.S),
            "C_star": _f(law.C_star),
            "C_star_se": _f(law.C_star_se),
            "a_C_star": _f(law.a_C_star),
            "window": [_f(law.window[0]), _f(law.window[1])],
            "window_intervals": [[_f(x), _f(y)] for x, y in law.window_intervals],
            "window_is_interval": law.window_is_interval,
            "window_clipped": list(law.window_clipped),
            "a_star": _f(law.a_star),
            "a_star_se": _f(law.a_star_se),
            "F_zeros": _fl(law.F_zeros),
            "L_GIH_0": _f(law.L[0]),
            "L_GIH_inf": _f(law.L_inf),
            "limit_loss": _f(law.limit_loss),
            "limit_loss_se": _f(law.limit_loss_se),
            "a_limit": _f(law.a_limit),
            "a_limit_is_inf": math.isinf(law.a_limit),
            "curve": {
                "a": _fl(law.a),
                "F": _fl(law.F),
                "F_se": _fl(law.F_se),
                "Fexp": _fl(law.Fexp),
                "Fexp_se": _fl(law.Fexp_se),
                "L": _fl(law.L),
                "L_se": _fl(law.L_se),
            },
        },
        "notes": notes,
        "timing": {"mi_s": t1 - t0, "stage1_s": t2 - t1, "stage3_s": t3 - t2, "total_s": t3 - t0},
    }
    return report


def _fmt(x, spec=".4g"):
    return "—" if x is None else format(x, spec)


def _pm(x, se, spec=".4g"):
    if x is None:
        return "—"
    return f"{x:{spec}} ± {_fmt(se, '.2g')}"


def format_theory(report: dict) -> str:
    """A readable text rendering of :func:`theory_report`'s dict."""
    c = report["config"]
    dc, mc, ec, ic = c["data"], c["model"], c["estimator"], c["init"]
    mi, s1, s3 = report["mi"], report["stage1"], report["stage3"]
    labels = report["labels"]
    out = []
    prior = "fixed kernel" if dc["fixed_kernel"] else f"Dirichlet(alpha={dc['alpha']:g})"
    out.append(
        f"gflow theory — d={dc['d']}, parents {tuple(dc['parents'])}, {prior}, L={dc['L']}; "
        f"TF(M={mc['M']}, H={mc['H']}, D={mc['D']}, norm={mc['norm']}); "
        f"N={ec['N']}, seed={ec['seed']}, eps={ec['eps']:g}, loss={ec['loss']}"
    )
    out.append("")
    out.append(
        f"§6.1 Stage I winner: modified χ²-MI Ĩ(S), mean over n_pi={c['n_pi']} prior kernels "
        f"(seed {c['pi_seed']}); gaps with paired SEs"
    )
    hdr = f"  {'rank':>4}  {'S':<7} {'Ĩ(S)':>22} {'gap to next':>22} {'χ²-MI':>22}"
    out.append(hdr)
    for r, row in enumerate(mi["ranking"], 1):
        out.append(
            f"  {r:>4}  {row['label']:<7} {_pm(row['Itilde'], row['Itilde_se']):>22} "
            f"{_pm(row['gap_to_next'], row['gap_to_next_se']):>22} {_pm(row['chi2'], row['chi2_se']):>22}"
        )
    gap_sig = (
        "exact" if not mi["gap_se"] else f"{mi['gap'] / mi['gap_se']:.1f} paired SE"
    )
    out.append(
        f"  S* = argmax Ĩ = {mi['S_star_label']}   (gap to runner-up: {gap_sig}; "
        f"close call: {'YES' if mi['close_call'] else 'no'})"
    )
    out.append("")
    out.append(
        f"§6.2 Stage I rates at init (w₊={ic['w_plus']:g}, w₋={ic['w_minus']:g}, c₀={ic['c0']:g}, "
        f"a₀={ic['a0']:g}): J(S) = −∂L̂/∂a|a=0,c=e_S on the run's sample; L₀ = {_fmt(s1['L0'], '.6g')}"
    )
    out.append(f"  {'S':<7} {'J(S)':>22} {'Ĩ(S)':>12} {'dlog c/dt (J)':>14} {'(Ĩ)':>10}")
    for i, lab in enumerate(labels):
        out.append(
            f"  {lab:<7} {_pm(s1['J'][i], s1['J_se'][i]):>22} {_fmt(mi['Itilde'][i]):>12} "
            f"{_fmt(s1['dlogc_dt_J'][i]):>14} {_fmt(s1['dlogc_dt_Itilde'][i]):>10}"
        )
    ru = "{" + ",".join(map(str, s1["runner_up"])) + "}" if s1["runner_up"] else "∅"
    out.append(
        f"  argmax J = {'{' + ','.join(map(str, s1['argmax_J'])) + '}' if s1['argmax_J'] else '∅'}; "
        f"d/dt log(c_{mi['S_star_label']}/c_{ru}) = "
        f"{_pm(s1['slope_Sstar_vs_runner_up_J'], s1['slope_Sstar_vs_runner_up_J_se'])} (J), "
        f"{_fmt(s1['slope_Sstar_vs_runner_up_Itilde'])} (Ĩ)"
    )
    out.append("")
    a_grid = s3["curve"]["a"]
    out.append(
        f"§6.4 Stage III: GIH on S = {s3['label']} (one-hot copier, c = e_S), "
        f"F(a) = −dL_GIH/da on a ∈ [{a_grid[0]:g}, {a_grid[-1]:g}] ({len(a_grid)} points)"
    )
    out.append(f"  C* = max F·e^a     = {_pm(s3['C_star'], s3['C_star_se'])}  at a = {_fmt(s3['a_C_star'], '.4f')}")
    lo, hi = s3["window"]
    clip = s3["window_clipped"]
    win = (
        f"[{'≤' if clip[0] else ''}{_fmt(lo, '.4f')}, {'≥' if clip[1] else ''}{_fmt(hi, '.4f')}]"
    )
    shape = "an interval" if s3["window_is_interval"] else (
        "NOT an interval: " + ", ".join(f"[{x:.3f}, {y:.3f}]" for x, y in s3["window_intervals"])
    )
    out.append(f"  window F·e^a ≥ C*/2 = {win}  ({shape})")
    if s3["a_star"] is None:
        out.append("  a* (F = 0)          = ∞ (F > 0 on the whole grid)")
    else:
        out.append(f"  a* (F = 0)          = {_pm(s3['a_star'], s3['a_star_se'], '.4f')}")
    out.append("")
    out.append("§6.5 Limit loss")
    where = "a → ∞" if s3["a_limit_is_inf"] else f"a = {s3['a_limit']:.4f}"
    out.append(
        f"  L_GIH(0) = {_fmt(s3['L_GIH_0'], '.6g')};  inf_a L_GIH = "
        f"{_pm(s3['limit_loss'], s3['limit_loss_se'], '.6g')} at {where};  L_GIH(∞) = {_fmt(s3['L_GIH_inf'], '.6g')}"
    )
    out.append("")
    out.append(f"  {'a':>6} {'F(a)':>12} {'F·e^a':>12} {'L_GIH(a)':>12}")
    curve = s3["curve"]
    n = len(curve["a"])
    picks = sorted(set(np.linspace(0, n - 1, min(n, 11)).round().astype(int).tolist()))
    for k in picks:
        out.append(
            f"  {curve['a'][k]:>6.2f} {_fmt(curve['F'][k], '.4g'):>12} {_fmt(curve['Fexp'][k], '.4g'):>12} "
            f"{_fmt(curve['L'][k], '.6g'):>12}"
        )
    if report.get("notes"):
        out.append("")
        out.extend(f"note: {n_}" for n_ in report["notes"])
    t = report.get("timing")
    if t:
        out.append(
            f"(computed in {t['total_s']:.1f} s: Ĩ {t['mi_s']:.1f} s, J {t['stage1_s']:.1f} s, "
            f"GIH {t['stage3_s']:.1f} s)"
        )
    return "\n".join(out)
