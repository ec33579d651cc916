"""What the flow is compared with: the theory of docs/theory/mathematics.md §M6.

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
- **Stage I duration** (§M8.1): the linearised Stage I solved exactly
  (:func:`predicted_stage1_duration`).
- :func:`theory_report` gathers all of it into a typed :class:`Theory` (with
  ``to_json``/``from_json``; the GIH law of any set, and what each law covers,
  docs/theory/mathematics.md §M8.7), :func:`format_theory` prints it, and :func:`gflow.runs.load_or_compute`
  is the one rule that decides whether a run folder's ``theory.json`` belongs
  to the run.

The Stage I theory (Ĩ ranking, rates, duration) lives in ``gflow.theory._stage1``,
the GIH numerics in ``gflow.theory._gih``, the result types in
``gflow.theory._result``; all are re-exported here. Everything is
deterministic in its key/seed.
"""

from __future__ import annotations

import math
import time

import jax
import numpy as np

from ..config import Config
from ..core import (
    DataConfig,
    EstimatorConfig,
    InitConfig,
    ModelConfig,
    PopulationLoss,
    init_params,
    kernel_conditional,
    kind_of,
    make_loss,
    member_of,
    subset_label,
)
from ._gih import GIH, StageIIILaw, check_offsets, gih_counts, limit_loss, make_gih, stage3_law
from ._ladder import loss_ladder
from ._rates import dlogc_dt, first_order_slope, log_ratio_slope
from ._result import LAW_COVERAGE, ChiSquaredRanking, Stage1Duration, StageIRates, Theory, config_key, covers
from ._stage1 import (
    chi2_mi,
    modified_chi2_ranking,
    predicted_stage1_duration,
    ranking_of_sets,
    stage1_rates,
    unrepresented_parents,
)
from ._text import format_theory

__all__ = [
    "GIH",
    "LAW_COVERAGE",
    "ChiSquaredRanking",
    "Stage1Duration",
    "StageIIILaw",
    "StageIRates",
    "Theory",
    "chi2_mi",
    "config_key",
    "covers",
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

def _notes(rank, laws, model_cfg, data_cfg, duration) -> tuple[str, ...]:
    notes = []
    unrep = unrepresented_parents(data_cfg, model_cfg)
    if unrep is not None:
        notes.append(unrep)
    if rank.close_call:
        notes.append(
            f"close call: the top two sets of the Ĩ ranking are within 3 paired SEs "
            f"(gap {rank.gap:.3g} ± {rank.gap_se:.3g})"
        )
    for S, law in laws.items():
        who = f"GIH of {subset_label(S)}"
        if law.a_star is None:
            span = f"[{law.a_grid[0]:g}, {law.a_grid[-1]:g}]"
            if np.all(law.F > 0):
                notes.append(f"{who}: F > 0 on the whole grid {span}: a* = ∞ as far as the grid tells")
            else:
                notes.append(f"{who}: F never turns from > 0 to <= 0 on the grid {span}: no finite a*")
        if not law.window_is_interval:
            notes.append(f"{who}: the validity window {{F e^a ≥ C*/2}} is not an interval")
        if law.window_clipped[0]:
            notes.append(f"{who}: the validity window starts at the grid's first point")
        if law.window_clipped[1]:
            notes.append(f"{who}: the validity window reaches the grid's last point")
    if not math.isfinite(duration.t):
        notes.append("the linearised Stage I never reaches 1 − δ (a tie for the top J)")
    if model_cfg.norm != "sum":
        notes.append("norm='layer': L ≈ L₀ − a Σ (c_S/Σc) J(S) is not exact to first order")
    if not kind_of(data_cfg).has_laws:
        notes.append(f"data.kind = {data_cfg.kind!r}: no law for this data (the paper derives Ĩ for the n-gram "
                     "mixture; here Ĩ is ranked as for the n-gram chain of the same prior with parents 1..k, the law "
                     "of the target given its k parents): the paper's rows are undecided; J, the GIH law and the "
                     "ladder are computed on this sample (the GIH scored at its last position), finite-size laws "
                     "of the sample, not the paper's")  # fmt: skip
    if data_cfg.start != "stationary" and data_cfg.burn_in == 0:
        notes.append("start='uniform' without burn-in: Ĩ assumes the stationary law, the sample does not")
    return tuple(notes)


def theory_report(
    data_cfg: Config | DataConfig | None = None,
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
    eta_C: float | None = None,
    delta: float | None = None,
) -> Theory:
    """Every prediction of docs/theory/mathematics.md §M6 and §M8.1 for one configuration, as a :class:`Theory`.

    Called with a whole configuration, ``theory_report(cfg)`` (a [`gflow.Config`][gflow.Config]),
    its data, model, estimator and initialisation sections are used and its schedule's ``η_C``
    and ``δ`` (unless `eta_C`, `delta` are given); the four-section form
    ``theory_report(cfg.data, cfg.model, cfg.estimator, cfg.init)`` takes ``η_C``, ``δ`` from
    `eta_C`, `delta` (default: the default schedule's, 1 and 0.01). Absent sections are the
    paper's defaults.

    - the Ĩ ranking of 𝒮 over `n_pi` prior kernels (key ``jax.random.key(pi_seed)``)
      with SEs and paired SEs, ``S*`` and the close-call flag (:func:`modified_chi2_ranking`);
    - ``J(S)`` with SEs at the initial ``w`` of `init_cfg`, on the run's sample
      (``make_loss(data, model, estimator)``, or `loss` if given; :func:`stage1_rates`),
      and the linearised Stage I's duration for the selector time scale `eta_C` and the
      event's `delta` (:func:`predicted_stage1_duration`; the schedule's defaults);
    - the GIH law (:func:`stage3_law` on ``[0, a_max]``, `n_grid` points) of ``S*``, of
      ``argmax J`` and of `S` if given, on the same sample.

    - the loss ladder of the sample (docs/theory/mathematics.md §M8.3: oracle, Bayes, the GIH of ``S*``
      at its best a, the context unigram; [`gflow.loss_ladder`][gflow.loss_ladder]).

    :meth:`Theory.to_json` is the JSON form (``theory.json``, ``gflow theory --json``).
    """
    t0 = time.perf_counter()
    if isinstance(data_cfg, Config):
        if any(x is not None for x in (model_cfg, estimator_cfg, init_cfg)):
            raise TypeError("theory_report(cfg): a Config holds every section; pass no model/estimator/init section")
        cfg = data_cfg
        data_cfg, model_cfg, estimator_cfg, init_cfg = cfg.data, cfg.model, cfg.estimator, cfg.init
        schedule = cfg.schedule
    else:
        schedule = Config().schedule
    eta_C = schedule.eta_C if eta_C is None else eta_C
    delta = schedule.delta if delta is None else delta
    data_cfg = DataConfig() if data_cfg is None else data_cfg
    model_cfg = ModelConfig() if model_cfg is None else model_cfg
    estimator_cfg = EstimatorConfig() if estimator_cfg is None else estimator_cfg
    init_cfg = InitConfig() if init_cfg is None else init_cfg
    sets = model_cfg.subsets
    member = member_of(model_cfg)
    # Ĩ ranks sets of offsets: a member's sets through the offsets they read with one-hot copiers
    # (the token component of the residual stream reads offset 1; a set of no parents counts as ∅)
    reads = tuple(member.set_offsets(S) or () for S in sets)
    # another kind has no Ĩ: ranked as for the n-gram chain of the same prior and consecutive parents
    # 1..k (the law of the target given its k parents; a window of d^k states, whatever offsets
    # data.parents names)
    rank_data = data_cfg if data_cfg.kind == "ngram" else DataConfig(
        d=data_cfg.d, parents=tuple(range(1, len(data_cfg.parents) + 1)), alpha=data_cfg.alpha, L=data_cfg.L,
        prior=data_cfg.prior)  # fmt: skip
    rank = modified_chi2_ranking(rank_data, tuple(dict.fromkeys(reads)), n_pi=n_pi, key=jax.random.key(pi_seed))
    rank = ranking_of_sets(rank, sets, reads)
    t1 = time.perf_counter()

    if loss is None:
        loss = make_loss(data_cfg, model_cfg, estimator_cfg)
    params = init_params(model_cfg, init_cfg, d=data_cfg.d, L=data_cfg.L)
    rates = stage1_rates(loss, params.first_layer)
    if not np.all(np.isfinite(rates.J)):
        why = ("estimator.eps = 0 with a target token absent from some context (ŷ = 0, an infinite loss): set "
               "estimator.eps > 0" if float(estimator_cfg.eps) == 0 and estimator_cfg.loss == "log" else
               f"check init.w_plus = {init_cfg.w_plus!r}, init.w_minus = {init_cfg.w_minus!r} and estimator.eps = "
               f"{estimator_cfg.eps!r}")  # fmt: skip
        raise ValueError(f"the Stage I rates J(S) = −∂L̂/∂a are not finite: {why}")
    C0 = np.asarray(params.C, np.float64)
    a0 = float(init_cfg.a0)
    duration = predicted_stage1_duration(rates.J, C0**2, a0, delta, eta_C=eta_C, sets=sets)
    t2 = time.perf_counter()

    want = [rank.S_star, sets[int(np.argmax(rates.J))]]
    if S is not None:
        want.append(tuple(S) if tuple(S) in sets else check_offsets(S, model_cfg.M))
    laws = {}
    # the GIH is a last-position law: with the loss at every position, the last position's sample
    gih_loss = loss.at_last_position()
    for S_ in want:  # keyed by the member's set; the GIH of the offsets it reads
        offs = member.gih_offsets(S_)
        if S_ not in laws and offs is not None:
            laws[S_] = stage3_law(make_gih(gih_loss, offs), a_max=a_max, n_grid=n_grid)
    t3 = time.perf_counter()

    key = config_key(
        data_cfg, model_cfg, estimator_cfg, init_cfg, n_pi=rank.n_pi, pi_seed=pi_seed, eta_C=eta_C, delta=delta
    )
    key["n_pi_asked"] = int(n_pi)
    ladder = _ladder(loss, data_cfg, member.set_offsets(rank.S_star) or (), laws.get(rank.S_star),
                     kernel_conditional(data_cfg, estimator_cfg),
                     estimator_cfg)
    return Theory(
        config=key,
        sets=sets,
        ranking=rank,
        rates=rates,
        a0=a0,
        C0=C0,
        eta_C=float(eta_C),
        delta=float(delta),
        duration=duration,
        laws=laws,
        notes=_notes(rank, laws, model_cfg, data_cfg, duration),
        timing={"mi_s": t1 - t0, "stage1_s": t2 - t1, "stage3_s": t3 - t2, "total_s": t3 - t0},
        ladder=ladder,
    )


def _ladder(loss, data_cfg, S, law, pi_cond, estimator_cfg) -> dict | None:
    """The loss ladder of the sample (docs/theory/mathematics.md §M8.3; :mod:`gflow.theory._ladder`), the GIH
    rung at the law's ``argmin_a L_GIH``; ``None`` when the Bayes counts need the
    tokens (parents beyond the counts layout's window)."""
    try:
        return loss_ladder(loss, data_cfg, S=S, a_gih=None if law is None else law.a_limit, pi_cond=pi_cond,
                           estimator=estimator_cfg).to_json()  # fmt: skip
    except ValueError:
        return None


