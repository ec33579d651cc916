"""Stage I in theory (docs/theory/mathematics.md §M6.1, §M6.2, §M8.1), re-exported by :mod:`gflow.theory`:

- the modified χ²-mutual information ``Ĩ(S)`` of one kernel (:func:`chi2_mi`) and its
  prior average with paired standard errors, the ranking of 𝒮 and ``S* = argmax Ĩ``
  (:func:`modified_chi2_ranking`), beside the ordinary χ²-MI and the ordinary mutual
  information (:func:`gflow.theory.mutual_information`) and their own winners;
- the rates ``J(S) = −∂L̂/∂a`` at ``a = 0``, ``c = e_S`` on the run's own sample
  (:func:`stage1_rates`), the first-order rate and the predicted ``d/dt log c_S``
  (``first_order_slope``, ``dlogc_dt``, ``log_ratio_slope`` of ``gflow.theory._rates``);
- the linearised Stage I solved exactly: when it reaches its event
  (:func:`predicted_stage1_duration`).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._util import mean_se
from ..core import DataConfig, ModelConfig, Params, PopulationLoss, sample_kernels, window_law
from ._result import TIE_RTOL, ChiSquaredRanking, Stage1Duration, StageIRates


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


def unrepresented_parents(data_cfg: DataConfig, model_cfg: ModelConfig) -> str | None:
    """A warning when the true parents ``data.parents`` are no selector set of the model (``None``
    when they are one): 𝒮 holds the sets of at most ``D`` heads of ``1..H``, head h reading its
    own offset h, so parents with an offset beyond ``H`` (e.g. ``[1, 4]`` at the default
    ``H = M = 3``) or more than ``D`` of them cannot be represented, and Stage I, the Ĩ ranking
    and every check choose among sets that each miss a parent. A legitimate experiment (nothing
    refuses it; the exit status does not change): ``gflow run --dry-run``, ``gflow theory`` and
    the check report print it."""
    P = tuple(int(p) for p in data_cfg.parents)
    if P in model_cfg.subsets or len(model_cfg.subsets) == 1:  # one set (nichani): no choice to miss
        return None
    H, D = model_cfg.H, model_cfg.D
    why = []
    beyond = [p for p in P if p > H]
    if beyond:
        why.append(f"no head reads offset {', '.join(map(str, beyond))}: head h reads offset h, h ≤ H = {H}")
    if len(P) > D:
        why.append(f"{len(P)} parents, at most D = {D} heads a set")
    need = f"model.H = model.M = {max(max(P), H)}, model.D = {max(len(P), D)}"
    return (f"the true parents data.parents = {list(P)} are no selector set of the model ({'; '.join(why)}): "
            f"no S of 𝒮 represents them, and Stage I and the Ĩ ranking choose among sets that each miss a "
            f"parent (a legitimate experiment; {need} would represent them)")


def chi2_mi(
    pi: Float[Array, "K d"], cfg: DataConfig, sets
) -> tuple[Float[Array, " nS"], Float[Array, " nS"]]:
    """Exact modified and ordinary χ²-mutual information of one kernel (docs/theory/mathematics.md §M6.1).

    For a set of offsets ``S``, with ``μ`` the stationary law of the chain of
    ``π``, ``z = (x_{l-h})_{h∈S}`` and ``e = x_l``:

    - ``Ĩ(S) = Σ_z μ_S(z)² (Σ_e μ(e|z)²/μ(e) − 1) = Σ_{z,e} μ(z,e)²/μ(e) − Σ_z μ_S(z)²``
      (the paper's modified χ²-MI, the Stage I winner's criterion);
    - ``I_χ²(S) = Σ_z μ_S(z) (Σ_e μ(e|z)²/μ(e) − 1)`` (the ordinary χ²-MI).

    Both are 0 for ``S = ∅`` (set exactly). Computed by enumeration over the
    exact stationary law of ``W = max(max S, p_k) + 1`` consecutive tokens
    (``max(H, p_k) + 1`` for the model's 𝒮)
    (:func:`gflow.window_law`), marginalised onto ``(z, e)``. The second
    form of ``Ĩ`` never divides by ``μ_S(z)``; terms with ``μ(e) = 0`` (hence
    ``μ(z, e) = 0``) are 0.

    **Arguments:** `pi` the kernel ``(d**k, d)``; `cfg` the data
    configuration (parents, d); `sets` the sets of 1-based offsets (or a
    :class:`~gflow.ModelConfig`, meaning its 𝒮).

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


def mutual_information(pi: Float[Array, "K d"], cfg: DataConfig, sets) -> Float[Array, " nS"]:
    """Exact ordinary mutual information of one kernel (docs/theory/mathematics.md §M10, other
    rankings): ``I(S) = Σ_{z,e} μ(z, e) log(μ(z, e)/(μ_S(z) μ(e)))`` for every set of offsets
    (0 for ``∅``), from the same stationary law of ``W`` consecutive tokens as :func:`chi2_mi`;
    terms with ``μ(z, e) = 0`` are 0. Pure JAX; vmappable over ``pi``."""
    sets = _as_sets(sets)
    d = cfg.d
    W = _window_size(cfg, sets)
    P = window_law(pi, cfg, W).reshape((d,) * W)
    out = []
    for S in sets:
        if len(S) == 0:
            out.append(jnp.zeros((), P.dtype))
            continue
        keep = {W - 1 - h for h in S} | {W - 1}
        axes = tuple(t for t in range(W) if t not in keep)
        joint = (P.sum(axis=axes) if axes else P).reshape(-1, d)
        mz, me = joint.sum(1)[:, None], joint.sum(0)[None, :]
        prod = mz * me
        pos = joint > 0
        jp = jnp.where(pos, joint, 1.0)
        # where the marginals' product underflows (both ~1e-200 for a near-deterministic kernel)
        # the ratio is taken in logs; elsewhere log(joint/prod) as before
        log_ratio = jnp.where(prod > 0, jnp.log(jp / jnp.where(prod > 0, prod, 1.0)),
                              jnp.log(jp) - jnp.log(jnp.where(pos, mz, 1.0)) - jnp.log(jnp.where(pos, me, 1.0)))
        out.append(jnp.sum(jnp.where(pos, joint * log_ratio, 0.0)))
    return jnp.stack(out)


@eqx.filter_jit
def _mi_batch(pis, cfg, sets):
    return jax.vmap(lambda p: mutual_information(p, cfg, sets))(pis)


def modified_chi2_ranking(
    cfg: DataConfig, sets, *, n_pi: int = 2000, key: PRNGKeyArray | None = None
) -> ChiSquaredRanking:
    """Rank 𝒮 by the prior average of the modified χ²-MI (docs/theory/mathematics.md §M6.1; the paper's
    prediction ``c(t)/Σc → e_{S*}``, ``S* = argmax_S E_π Ĩ(S)``).

    ``E_π Ĩ(S)`` is estimated by Monte Carlo over `n_pi` kernels drawn from the
    prior with `key` (default ``jax.random.key(0)``) by
    :func:`gflow.core.sample_kernels`, ``Ĩ`` exact per kernel
    (:func:`chi2_mi`, vmapped). Standard errors are ``std/√n_pi``; the ranking's
    uncertainty is the SE of the *paired* differences ``Ĩ(S) − Ĩ(S')`` on the
    same draws, much smaller than either SE when the two are correlated. With
    a fixed kernel one evaluation is exact and every SE is 0.

    A ranking is a close call when ``Ĩ(first) − Ĩ(second) ≤ 3 SE_paired``
    (gflow's own choice of 3; docs/theory/mathematics.md §M6.1), exact ties (within relative
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
    # chi2_mi reads d and the parents only: one compilation for every α, L, start and burn-in
    It, ch = _chi2_mi_batch(pis, DataConfig(d=cfg.d, parents=cfg.parents, L=cfg.m), sets)
    It, ch = np.asarray(It), np.asarray(ch)
    Im, Ise = mean_se(It)
    cm, cse = mean_se(ch)
    mm, mse = mean_se(np.asarray(_mi_batch(pis, DataConfig(d=cfg.d, parents=cfg.parents, L=cfg.m), sets)))
    dse = _paired_se(It)
    order = tuple(int(i) for i in np.argsort(-Im, kind="stable"))
    if len(sets) > 1:
        i, j = order[0], order[1]
        gap, gap_se = float(Im[i] - Im[j]), float(dse[i, j])
        tie = gap <= TIE_RTOL * max(abs(Im[i]), abs(Im[j]), 1e-300)
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
        mi=mm,
        mi_se=mse,
    )


def ranking_of_sets(rank: ChiSquaredRanking, sets, reads) -> ChiSquaredRanking:
    """`rank` (over sets of offsets) carried to a member's own selector sets: set ``sets[i]``
    reads the offsets ``reads[i]`` with one-hot copiers (``AbstractModel.set_offsets``; ``()``
    for a set of no parents) and gets their Ĩ, χ²-MI and MI, paired SEs included; sets reading
    the same offsets tie exactly (a close call when they are the top two). The identity when
    every set reads itself."""
    sets, reads = tuple(sets), tuple(tuple(r) for r in reads)
    if reads == tuple(rank.sets) == sets:
        return rank
    idx = np.array([rank.sets.index(r) for r in reads])
    It, Ise, dse = rank.Itilde[idx], rank.Itilde_se[idx], rank.diff_se[np.ix_(idx, idx)]
    order = tuple(int(i) for i in np.argsort(-It, kind="stable"))
    if len(sets) > 1:
        i, j = order[0], order[1]
        gap, gap_se = float(It[i] - It[j]), float(dse[i, j])
        tie = gap <= TIE_RTOL * max(abs(It[i]), abs(It[j]), 1e-300)
        close = bool(tie or gap <= 3.0 * gap_se)
    else:
        gap, gap_se, close = math.inf, 0.0, False
    return ChiSquaredRanking(
        sets=sets, Itilde=It, Itilde_se=Ise, chi2=rank.chi2[idx], chi2_se=rank.chi2_se[idx], diff_se=dse, order=order,
        S_star=sets[order[0]], gap=gap, gap_se=gap_se, close_call=close, n_pi=rank.n_pi,
        samples=None if rank.samples is None else rank.samples[:, idx],
        mi=None if rank.mi is None else rank.mi[idx], mi_se=None if rank.mi_se is None else rank.mi_se[idx],
    )  # fmt: skip


# ---------------------------------------------------------------------------
# §6.2  Stage I rates
# ---------------------------------------------------------------------------


@eqx.filter_jit
def _per_sequence_dloss_da(loss: PopulationLoss, w, Cs):
    """``(∂ℓ_n/∂a at a = 0)`` for every sequence n and every row of ``Cs``: ``(nS, N)``;
    and the per-sequence loss at ``a = 0``."""
    zero = jnp.zeros((), Cs.dtype)

    def one(C):
        f = lambda a: loss.per_sequence(Params.assemble(w, C, a))
        return jax.jvp(f, (zero,), (jnp.ones_like(zero),))

    # one set at a time: memory stays that of one loss evaluation
    ls, ds = jax.lax.map(one, Cs)
    return ls[0], ds


def stage1_rates(loss: PopulationLoss, w: Float[Array, "H M"], *, sets=None) -> StageIRates:
    """Stage I rates ``J(S) := −∂L̂/∂a |_{a=0, c=e_S}`` at copier weights ``w``
    (docs/theory/mathematics.md §M6.2; gflow's own derivation, on the model itself).

    Computed from ``loss`` (the run's :class:`~gflow.PopulationLoss`, its
    own sample) with ``C`` one-hot on ``S`` (``C_S = 1``): one forward-mode
    derivative in ``a`` of the per-sequence losses, so every sequence gives
    its own ``−∂ℓ_n/∂a`` and the SEs (and the paired SEs of differences
    between sets, on the same sequences) are ``std/√N``.

    For ``norm="sum"`` and any ``c``, ``κ_l = Σ_S (c_S/Σc) P_l(S)`` is linear
    in ``c/Σc``, and ŷ at ``a = 0`` is the context's unigram whatever ``c``,
    so exactly to first order in ``a``:
    ``L̂(a) = L₀ − a Σ_S (c_S/Σc) J(S) + O(a²)`` (``gflow.theory._rates.first_order_slope``).
    With a one-hot copier on the offsets of ``S`` and ``L → ∞``,
    ``J(S) → Ĩ(S)`` (the paper's Stage I analysis; ε → 0 assumed). For
    ``norm="layer"`` J is still the derivative at ``c = e_S`` but the
    first-order expansion in ``c/Σc`` is not exact.

    A set outside the member's normaliser (``AbstractModel.normalising``: the Full model's sets
    holding the token component, whose share is always 0) has no ``c = e_S``; its J is its
    coefficient in the linear ``G(c) = Σ_S c_S J(S) / Σ_{normalising} c_S``, computed at
    ``C = e_S + e_R`` (R the first normalising set) minus ``J(R)``, exact for ``norm="sum"``.

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
    w = jax.tree.map(lambda v: jnp.asarray(v, loss.eps.dtype), w)
    # a set outside the normaliser (the Full model's sets holding the token) has no c = e_S (Σc = 0):
    # its J is its term's coefficient in the linear G(c) = Σ_S c_S J(S) / Σ_{S normalising} c_S,
    # read at C = e_S + e_R (R the first normalising set: Σc = 1) minus J(R)
    norm = np.asarray(loss.member.normalising(), bool)
    ref = int(np.flatnonzero(norm)[0])
    eye = np.eye(len(all_sets))
    outside = not norm[np.array(idx)].all()
    rows = [eye[i] if norm[i] else eye[i] + eye[ref] for i in idx] + ([eye[ref]] if outside else [])
    l0, ds = _per_sequence_dloss_da(loss, w, jnp.asarray(np.array(rows), loss.eps.dtype))
    per = -np.asarray(ds, np.float64).T  # (N, nS), and J(R)'s column last when a set is outside
    if outside:
        per = np.where(norm[np.array(idx)], per[:, :-1], per[:, :-1] - per[:, -1:])
    J, Jse = mean_se(per)
    return StageIRates(sets=sets, J=J, J_se=Jse, diff_se=_paired_se(per), L0=float(np.mean(np.asarray(l0))))


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
    """The time at which the linearised Stage I reaches its event (docs/theory/mathematics.md §M8.1;
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
# The theory of a configuration, and of a run folder
# ---------------------------------------------------------------------------
