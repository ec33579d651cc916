"""The typed results of :mod:`gflow.theory` and their JSON form (docs/theory/mathematics.md §M6,
§M8.1, §M8.7).

- :class:`ChiSquaredRanking`, :class:`StageIRates`, :class:`Stage1Duration`,
  and the GIH law :class:`~gflow.StageIIILaw`: one per computation.
- :class:`Theory`: everything ``gflow theory`` computes for one configuration,
  with the GIH law of any number of sets (S*, argmax J, the set a run
  selected), ``to_json``/``from_json``.
- **Coverage** (docs/theory/mathematics.md §M8.7): every law records the model and loss options it
  was derived for (:data:`LAW_COVERAGE`); :func:`covers` says whether a run's
  configuration lies inside it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._util import jsonable
from ..core import KINDS, subset_label
from ._gih import StageIIILaw, set_gih, stage3_law
from ._rates import dlogc_dt, log_ratio_slope

__all__ = [
    "LAW_COVERAGE",
    "ChiSquaredRanking",
    "Stage1Duration",
    "StageIRates",
    "Theory",
    "config_key",
    "covers",
]

# ---------------------------------------------------------------------------
# What each law covers (docs/theory/mathematics.md §M8.7)
# ---------------------------------------------------------------------------

# The value an option has when the running gflow does not know it yet (options
# other branches add: a config without the field behaves as the paper's model).
_OPTION_DEFAULTS: dict[str, Any] = {
    "model.member": "paper",
    "model.norm": "sum",
    "model.head_norm": False,
    "model.windows": "aligned",
    "estimator.target": "expected",
    "estimator.loss": "log",
    "data.kind": "ngram",
    "estimator.positions": "last",
}

# The paper's model: sum-normalised selector, no per-head normalisation,
# aligned windows (head h on offsets 1..M), the expected (Rao–Blackwellised) target.
_PAPER_MODEL: dict[str, tuple] = {
    # the paper's data: the kinds the paper's laws are derived for (AbstractDataKind.has_laws: the n-gram mixture)
    "data.kind": tuple(name for name, kind in KINDS.items() if kind.has_laws),
    "model.member": ("paper",),
    "model.norm": ("sum",),
    "model.head_norm": (False,),
    "model.windows": ("aligned",),
    "estimator.target": ("expected",),
    "estimator.positions": ("last",),  # the paper's loss: the last position
}

# the members whose first layer is the paper's copier softmax(w) (their Stage II laws)
_SOFTMAX_COPIERS = ("paper", "value", "residual", "linear_query", "linear_output", "bilinear")

LAW_COVERAGE: dict[str, dict[str, tuple]] = {
    # Ĩ ranking, S* = argmax Ĩ, a ~ log t: the paper's statements about its model
    "paper": {**_PAPER_MODEL, "estimator.loss": ("log", "ce_on_probs")},
    # J(S), the log-ratio slopes, the predicted Stage I duration: L̂ ≈ L₀ − a Σ (c_S/Σc) J(S)
    # is exact to first order in a for norm="sum" (κ linear in c/Σc), whatever the loss
    "stage1": {**_PAPER_MODEL, "estimator.loss": ("log", "ce_on_probs")},
    # Stage II: the one-line softmax argument (β = 1) and the heads outside the set. Not the
    # paper's formulas: an argument about a softmax copier w whose gradient is the selector's
    # mass times a smooth function, so it covers every member whose copier is the paper's
    # softmax(w) on aligned windows (the members of stage2_vertex; β's tolerance adds the
    # measured drift of the member's own K)
    "stage2": {**_PAPER_MODEL, "model.member": _SOFTMAX_COPIERS, "estimator.loss": ("log", "ce_on_probs")},
    # the GIH's F(a) (computed for the run's own loss), C*, window, and the contrast λ
    # (the sum-norm selector's weight on the match indicator)
    "gih": {**_PAPER_MODEL, "estimator.loss": ("log", "ce_on_probs")},
    # a* and inf_a L_GIH as the flow's limit: for loss="log" (for ce_on_probs F may have
    # no finite zero and the infimum is then reached only as a → ∞)
    "gih_limit": {**_PAPER_MODEL, "estimator.loss": ("log",)},
    # gflow.theory._laws (docs/theory/mathematics.md §M8.7). Stage I from the model's own G(c) = −∂L̂/∂a|_{a=0}: exact rates
    # at t = 0 and the small-a flow of a·G, autodiff of the run's own loss: any model and loss
    # (every member whose selector is C and whose gain at a = 0 reads it: not the bilinear second
    # layer, whose selector is A, nor the linear classifier on the query, whose loss at W = 0
    # does not depend on C)
    "stage1_model": {"model.member": ("paper", "token", "value", "full", "absolute", "residual", "linear_output")},
    # the one-hot copier as a fixed point of Stage II (directional derivatives of the run's loss
    # in w: the members whose copier is the paper's softmax(w) on aligned windows)
    "stage2_vertex": {"model.member": _SOFTMAX_COPIERS},
    # the GIH's tail K = lim e^a F(a) and the approach L̂ − L∞ ~ 1/(η_a λ² τ) when a* = ∞
    "gih_tail": {**_PAPER_MODEL, "estimator.loss": ("ce_on_probs",)},
}


def covers(law_coverage: Mapping[str, tuple], cfg) -> tuple[bool, str]:
    """Whether the configuration `cfg` (a :class:`~gflow.config.Config`, or any
    object with ``model``/``estimator``/… sections) lies inside a law's coverage.

    `law_coverage` maps ``"section.option"`` to the covered values. Options are
    read with ``getattr(section, option, default)`` (the default is the
    paper's value), so options a gflow version does not have yet count as the
    paper's. **Returns** ``(True, "")`` or ``(False, reason)`` naming the first
    option outside, its value and the covered values.
    """
    for key, allowed in law_coverage.items():
        sec, opt = key.split(".", 1)
        section = getattr(cfg, sec, None)
        value = getattr(section, opt, _OPTION_DEFAULTS.get(key)) if section is not None else _OPTION_DEFAULTS.get(key)
        if value not in tuple(allowed):
            if key == "data.kind":
                return False, (f"no law for this data: data.kind = {value!r} (the law was derived for "
                               f"data.kind ∈ {tuple(allowed)!r})")  # fmt: skip
            if key == "model.member":
                return False, (f"no law for this model: model.member = {value!r} (the law was derived for "
                               f"model.member ∈ {tuple(allowed)!r})")  # fmt: skip
            return False, f"{key} = {value!r}: the law was derived for {key} ∈ {tuple(allowed)!r}"
    return True, ""


def _S_of_label(label: str, default) -> tuple[int, ...]:
    """The set a label names (``"∅"``, ``"{0,2}"``), else `default`."""
    if label == "∅":
        return ()
    try:
        return tuple(int(x) for x in label.strip("{}").split(","))
    except ValueError:
        return default


def _section_dict(obj) -> dict:
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if f.name == "kernel":
            v = None if v is None else np.asarray(v.array).tolist()
        elif isinstance(v, tuple):
            v = list(v)
        elif isinstance(v, np.generic):
            v = v.item()
        out[f.name] = v
    return out


def config_key(data, model, estimator, init, *, n_pi: int, pi_seed: int, eta_C: float, delta: float) -> dict:
    """What a theory depends on, as plain JSON: every field of the data, model,
    estimator and initialisation sections, the prior sample (`n_pi`,
    `pi_seed`) and the schedule's ``η_C`` and ``δ`` (the Stage I duration).
    Two theories with equal keys are the same numbers."""
    return jsonable(
        {
            "data": _section_dict(data),
            "model": _section_dict(model),
            "estimator": _section_dict(estimator),
            "init": _section_dict(init),
            "schedule": {"eta_C": float(eta_C), "delta": float(delta)},
            "n_pi": int(n_pi),
            "pi_seed": int(pi_seed),
        }
    )


# ---------------------------------------------------------------------------
# The results of one computation
# ---------------------------------------------------------------------------


# Two values whose difference is below this (relative to the larger magnitude) are an exact tie:
# with a fixed kernel the SE is 0, and sets that tie in exact arithmetic differ by rounding only
# (the Ĩ ranking's close call; the ordinary rankings' superset ties).
TIE_RTOL = 1e-9


@dataclasses.dataclass(frozen=True)
class ChiSquaredRanking:
    """The prior average of ``Ĩ`` and ``I_χ²`` over 𝒮 and its ranking (docs/theory/mathematics.md §M6.1).

    - `sets`: the sets of offsets, in 𝒮 order.
    - `Itilde`, `Itilde_se`: ``E_π Ĩ(S)`` and its Monte Carlo SE, ``(nS,)``.
    - `chi2`, `chi2_se`: the same for the ordinary χ²-MI.
    - `diff_se`: ``(nS, nS)``, SE of ``Ĩ(S_i) − Ĩ(S_j)`` paired on the same π draws.
    - `order`: indices of `sets` by decreasing ``Ĩ``.
    - `S_star`: ``argmax Ĩ``.
    - `gap`, `gap_se`: ``Ĩ(first) − Ĩ(second)`` and its paired SE.
    - `close_call`: the top two are within 3 paired SEs (or tie exactly).
    - `n_pi`: number of kernels averaged (1 for a fixed kernel, SEs 0).
    - `samples`: per-kernel ``Ĩ``, ``(n_pi, nS)`` (for further paired tests; ``None``
      when read back from JSON).
    - `mi`, `mi_se`: the prior average of the ordinary mutual information ``I(S)`` and its SE
      (``None`` in a theory saved before gflow computed it).

    The winners of the other rankings: :attr:`gflow.ChiSquaredRanking.S_chi2` (``argmax I_χ²``), :attr:`gflow.ChiSquaredRanking.S_mi`
    (``argmax I``); docs/theory/mathematics.md §M10 ("Other rankings").
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
    samples: np.ndarray | None = dataclasses.field(default=None, repr=False)
    mi: np.ndarray | None = None
    mi_se: np.ndarray | None = None

    @property
    def S_chi2(self) -> tuple[int, ...]:
        """``argmax_S E_π I_χ²(S)``: of the sets tied at the maximum (:attr:`chi2_tied`), the
        smallest (fewest offsets, then 𝒮 order)."""
        return _smallest_maximiser(self.sets, self.chi2)[0]

    @property
    def S_mi(self) -> tuple[int, ...] | None:
        """``argmax_S E_π I(S)`` (``None`` when not computed): of the sets tied at the maximum
        (:attr:`mi_tied`), the smallest."""
        return None if self.mi is None else _smallest_maximiser(self.sets, self.mi)[0]

    @property
    def chi2_tied(self) -> tuple[tuple[int, ...], ...]:
        """Every set whose ``E_π I_χ²`` equals the maximum to relative ``1e-9``, smallest first.

        The ordinary χ²-MI and MI never decrease when offsets are added, and a set that holds
        every parent carries all the information (``μ(e | z_S) = π(e | parents)``): each
        superset of the parents ties with them exactly, so these rankings cannot tell the
        parents from a superset. The winner reported is the smallest tied set, and the tie is
        shown beside it (``gflow theory``), instead of letting rounding pick a superset."""
        return _smallest_maximiser(self.sets, self.chi2)[1]

    @property
    def mi_tied(self) -> tuple[tuple[int, ...], ...] | None:
        """The same as :attr:`chi2_tied` for the mutual information (``None`` when not computed)."""
        return None if self.mi is None else _smallest_maximiser(self.sets, self.mi)[1]


def _smallest_maximiser(sets, values) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """The smallest set attaining ``max(values)`` to relative ``TIE_RTOL`` (fewest offsets, then
    the given order) and every set attaining it, smallest first."""
    v = np.asarray(values, dtype=float)
    top = float(np.max(v))
    tied = [i for i in range(len(sets)) if v[i] >= top - TIE_RTOL * max(abs(top), 1e-300)]
    tied.sort(key=lambda i: (len(sets[i]), i))
    return sets[tied[0]], tuple(sets[i] for i in tied)


@dataclasses.dataclass(frozen=True)
class StageIRates:
    """``J(S) = −∂L̂/∂a`` at ``a = 0``, ``c = e_S`` (docs/theory/mathematics.md §M6.2).

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

    def top_two(self) -> tuple[int, int | None, float, float]:
        """``(i, j, gap, gap_se)``: the index of argmax J, of the runner-up (``None`` for one
        set; ties go to the earlier set), ``J_i − J_j`` and its paired SE (``inf``, 0 for one set)."""
        J = np.asarray(self.J)
        order = np.argsort(-J, kind="stable")
        i = int(order[0])
        if len(J) < 2:
            return i, None, math.inf, 0.0
        j = int(order[1])
        return i, j, float(J[i] - J[j]), float(np.asarray(self.diff_se)[i, j])



@dataclasses.dataclass(frozen=True)
class Stage1Duration:
    """The linearised Stage I's predicted duration (docs/theory/mathematics.md §M8.1).

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




# ---------------------------------------------------------------------------
# JSON helpers
# ---------------------------------------------------------------------------


def _f(x):
    """A JSON-safe float (``None`` for non-finite values)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _fl(xs):
    return [_f(x) for x in np.asarray(xs, np.float64).ravel()]


def _arr(xs) -> np.ndarray:
    """A JSON list (``None`` for non-finite values) back to a float array (NaN)."""
    return np.array([math.nan if x is None else float(x) for x in np.ravel(np.asarray(xs, dtype=object))], np.float64)


def _mat(rows) -> np.ndarray:
    return np.array([_arr(r) for r in rows], np.float64).reshape(len(rows), -1)


def _opt(x) -> float | None:
    return None if x is None else float(x)


def _S(x) -> tuple[int, ...]:
    return tuple(int(h) for h in x)


def law_to_json(law: StageIIILaw) -> dict:
    """The JSON form of a GIH law (keys as ``theory.json``'s ``"stage3"``)."""
    return {
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
        "curve": {"a": _fl(law.a_grid), **{k: _fl(getattr(law, k)) for k in ("F", "F_se", "Fexp", "Fexp_se", "L", "L_se")}},
    }


def law_from_json(d: dict) -> StageIIILaw:
    """Inverse of :func:`law_to_json`."""
    c = d["curve"]
    return StageIIILaw(
        S=_S(d["S"]),
        a_grid=_arr(c["a"]),
        **{k: _arr(c[k]) for k in ("F", "F_se", "Fexp", "Fexp_se", "L", "L_se")},
        C_star=float(d["C_star"]),
        C_star_se=float(d.get("C_star_se") or 0.0),
        a_C_star=float(d["a_C_star"]),
        window=(float(d["window"][0]), float(d["window"][1])),
        window_intervals=tuple((float(x), float(y)) for x, y in d.get("window_intervals") or [d["window"]]),
        window_is_interval=bool(d.get("window_is_interval", True)),
        window_clipped=tuple(bool(x) for x in d.get("window_clipped", (False, False))),
        a_star=_opt(d.get("a_star")),
        a_star_se=_opt(d.get("a_star_se")),
        F_zeros=tuple(float(x) for x in d.get("F_zeros") or ()),
        L_inf=float(d["L_GIH_inf"]) if d.get("L_GIH_inf") is not None else math.nan,
        limit_loss=float(d["limit_loss"]),
        limit_loss_se=float(d.get("limit_loss_se") or 0.0),
        a_limit=math.inf if d.get("a_limit_is_inf") else float(d["a_limit"]),
    )


# ---------------------------------------------------------------------------
# The theory of one configuration
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Theory:
    """Everything :func:`gflow.theory.theory_report` computes for one configuration.

    - `config`: :func:`config_key` of the configuration it was computed for
      (what :func:`gflow.runs.load_or_compute` compares with a run's).
    - `sets`: 𝒮, in the model's order.
    - `ranking`: the Ĩ ranking (:class:`ChiSquaredRanking`; docs/theory/mathematics.md §M6.1), the
      paper's claim ``S* = argmax Ĩ``.
    - `rates`: ``J(S)`` at the initial copier on the run's sample
      (:class:`StageIRates`; docs/theory/mathematics.md §M6.2), gflow's finite-size Stage I law.
    - `a0`, `C0`, `eta_C`, `delta`: the initial ``a`` and ``C``, the selector's
      time scale and the Stage I event's ``δ``.
    - `duration`: the linearised Stage I's predicted duration
      (:class:`Stage1Duration`; docs/theory/mathematics.md §M8.1).
    - `laws`: ``{S: StageIIILaw}``, the GIH law (docs/theory/mathematics.md §M6.4, §M6.5) of every
      set it was computed for: always ``S*`` and ``argmax J``; a run's selected
      set is added by :meth:`with_law`.
    - `coverage`: ``{law name: {option: covered values}}`` (docs/theory/mathematics.md §M8.7;
      :data:`LAW_COVERAGE`).
    - `notes`, `timing`.
    - `ladder`: the loss ladder of the sample without a flow rung (docs/theory/mathematics.md §M8.3;
      :meth:`gflow.Ladder.to_json`), or ``None``.
    """

    config: dict
    sets: tuple[tuple[int, ...], ...]
    ranking: ChiSquaredRanking
    rates: StageIRates
    a0: float
    C0: np.ndarray
    eta_C: float
    delta: float
    duration: Stage1Duration
    laws: dict
    coverage: dict = dataclasses.field(default_factory=lambda: {k: dict(v) for k, v in LAW_COVERAGE.items()})
    notes: tuple[str, ...] = ()
    timing: dict = dataclasses.field(default_factory=dict)
    ladder: dict | None = None

    @property
    def labels(self) -> list[str]:
        return [subset_label(S) for S in self.sets]

    @property
    def S_star(self) -> tuple[int, ...]:
        """``argmax Ĩ`` (the paper's Stage I winner)."""
        return self.ranking.S_star

    @property
    def argmax_J(self) -> tuple[int, ...]:
        """``argmax J`` (gflow's finite-size Stage I winner)."""
        return self.sets[int(np.argmax(self.rates.J))]

    @property
    def stage3(self) -> StageIIILaw:
        """The GIH law of ``S*``."""
        return self.laws[self.S_star]

    def law(self, S) -> StageIIILaw:
        """The GIH law of the set `S` (``KeyError`` if not computed: see :meth:`with_law`)."""
        S = _S(S)
        if S not in self.laws:
            raise KeyError(f"no GIH law for {subset_label(S)}; computed for {[subset_label(s) for s in self.laws]}")
        return self.laws[S]

    def covers(self, law: str, cfg) -> tuple[bool, str]:
        """:func:`covers` with this theory's coverage of `law` ("paper", "stage1", …)."""
        return covers(self.coverage[law], cfg)

    def with_law(self, loss, S, *, a_max: float = 30.0, n_grid: int | None = None) -> Theory:
        """This theory with the GIH law of `S` on `loss`'s sample added (itself if present).
        The grid is that of the laws already computed (`n_grid` points on ``[0, a_max]``)."""
        S = _S(S)
        if S in self.laws:
            return self
        ref = next(iter(self.laws.values()), None)
        if n_grid is None:
            n_grid = 601 if ref is None else ref.a_grid.size
            a_max = a_max if ref is None else float(ref.a_grid[-1])
        law = stage3_law(set_gih(loss, S), a_max=a_max, n_grid=n_grid)  # the GIH of the offsets the set reads
        return dataclasses.replace(self, laws={**self.laws, S: law})

    def __getitem__(self, key: str):
        """Read-only dict access to :meth:`to_json` (for scripts written against the
        former dict result; new code reads the attributes)."""
        return self.to_json()[key]

    # -- JSON ---------------------------------------------------------------

    def to_json(self) -> dict:
        """A JSON-serialisable dict. Keys: ``config``, ``sets``, ``labels``,
        ``mi`` (the Ĩ ranking), ``stage1`` (J, its SEs, the predicted rates and
        the Stage I duration), ``stage3`` (the GIH law of S*), ``laws`` (label →
        GIH law of every set computed), ``S_star``, ``argmax_J``, ``coverage``,
        ``notes``, ``timing``, ``ladder``. Non-finite numbers are ``None``."""
        rk, rt, sets = self.ranking, self.rates, self.sets
        ranking = []
        for pos, i in enumerate(rk.order):
            nxt = rk.order[pos + 1] if pos + 1 < len(rk.order) else None
            ranking.append(
                {
                    "S": list(sets[i]),
                    "label": subset_label(sets[i]),
                    "Itilde": _f(rk.Itilde[i]),
                    "Itilde_se": _f(rk.Itilde_se[i]),
                    "gap_to_next": None if nxt is None else _f(rk.Itilde[i] - rk.Itilde[nxt]),
                    "gap_to_next_se": None if nxt is None else _f(rk.diff_se[i, nxt]),
                    "chi2": _f(rk.chi2[i]),
                    "chi2_se": _f(rk.chi2_se[i]),
                    "mutual_information": None if rk.mi is None else _f(rk.mi[i]),
                    "mutual_information_se": None if rk.mi_se is None else _f(rk.mi_se[i]),
                }
            )
        C0 = np.asarray(self.C0, np.float64)
        iS = sets.index(rk.S_star)
        runner = rk.order[1] if len(sets) > 1 else rk.order[0]
        k = 4.0 * self.a0 * self.eta_C / float(np.sum(C0**2))
        du = self.duration
        return {
            "config": self.config,
            "sets": [list(S) for S in sets],
            "labels": self.labels,
            "S_star": list(self.S_star),
            "argmax_J": list(self.argmax_J),
            "mi": {
                "Itilde": _fl(rk.Itilde),
                "Itilde_se": _fl(rk.Itilde_se),
                "chi2": _fl(rk.chi2),
                "chi2_se": _fl(rk.chi2_se),
                "mutual_information": None if rk.mi is None else _fl(rk.mi),
                "mutual_information_se": None if rk.mi_se is None else _fl(rk.mi_se),
                "argmax_chi2": list(rk.S_chi2),
                "argmax_mutual_information": None if rk.S_mi is None else list(rk.S_mi),
                "tied_chi2": [list(S) for S in rk.chi2_tied],
                "tied_mutual_information": None if rk.mi_tied is None else [list(S) for S in rk.mi_tied],
                "diff_se": [_fl(r) for r in rk.diff_se],
                "order": list(rk.order),
                "ranking": ranking,
                "S_star": list(rk.S_star),
                "S_star_label": subset_label(rk.S_star),
                "gap": _f(rk.gap),
                "gap_se": _f(rk.gap_se),
                "close_call": rk.close_call,
                "n_pi": rk.n_pi,
            },
            "stage1": {
                "J": _fl(rt.J),
                "J_se": _fl(rt.J_se),
                "J_diff_se": [_fl(r) for r in rt.diff_se],
                "argmax_J": list(self.argmax_J),
                "L0": _f(rt.L0),
                "a0": self.a0,
                "C0": _fl(C0),
                "eta_C": self.eta_C,
                "delta": self.delta,
                "C_norm_sq": _f(np.sum(C0**2)),
                "dlogc_dt_J": _fl(self.eta_C * dlogc_dt(rt.J, C0, self.a0)),
                "dlogc_dt_Itilde": _fl(self.eta_C * dlogc_dt(rk.Itilde, C0, self.a0)),
                "runner_up": list(sets[runner]),
                "slope_Sstar_vs_runner_up_J": _f(self.eta_C * log_ratio_slope(rt.J, iS, runner, C0, self.a0)),
                "slope_Sstar_vs_runner_up_J_se": _f(k * rt.diff_se[iS, runner]),
                "slope_Sstar_vs_runner_up_Itilde": _f(
                    self.eta_C * log_ratio_slope(rk.Itilde, iS, runner, C0, self.a0)
                ),
                "duration": {
                    "t": _f(du.t),
                    "never": not math.isfinite(du.t),
                    "S": None if du.S is None else list(du.S),
                    "index": du.index,
                    "rate": _f(du.rate),
                },
            },
            "stage3": law_to_json(self.stage3),
            "laws": {subset_label(S): law_to_json(law) for S, law in self.laws.items()},
            "coverage": {k_: {o: list(v) for o, v in c.items()} for k_, c in self.coverage.items()},
            "notes": list(self.notes),
            "timing": dict(self.timing),
            "ladder": self.ladder,
        }

    @classmethod
    def from_json(cls, d: dict) -> Theory:
        """Inverse of :meth:`to_json` (``ValueError`` naming the missing key for
        a dict that is not one)."""
        try:
            sets = tuple(_S(S) for S in d["sets"])
            mi, s1 = d["mi"], d["stage1"]
            ranking = ChiSquaredRanking(
                sets=sets,
                Itilde=_arr(mi["Itilde"]),
                Itilde_se=_arr(mi["Itilde_se"]),
                chi2=_arr(mi["chi2"]),
                chi2_se=_arr(mi["chi2_se"]),
                diff_se=_mat(mi["diff_se"]),
                order=tuple(int(i) for i in mi["order"]),
                S_star=_S(mi["S_star"]),
                gap=math.inf if mi["gap"] is None else float(mi["gap"]),
                gap_se=float(mi["gap_se"] or 0.0),
                close_call=bool(mi["close_call"]),
                n_pi=int(mi["n_pi"]),
                mi=None if mi.get("mutual_information") is None else _arr(mi["mutual_information"]),
                mi_se=None if mi.get("mutual_information_se") is None else _arr(mi["mutual_information_se"]),
            )
            rates = StageIRates(
                sets=sets, J=_arr(s1["J"]), J_se=_arr(s1["J_se"]), diff_se=_mat(s1["J_diff_se"]), L0=float(s1["L0"])
            )
            du = s1["duration"]
            duration = Stage1Duration(
                t=math.inf if du["never"] else float(du["t"]),
                S=None if du["S"] is None else _S(du["S"]),
                index=int(du["index"]),
                rate=float(du["rate"]),
            )
            laws = {}
            for label, law in d["laws"].items():
                law = law_from_json(law)
                laws[_S_of_label(label, law.S)] = law
            coverage = {k: {o: tuple(v) for o, v in c.items()} for k, c in d["coverage"].items()}
            return cls(
                config=d["config"],
                sets=sets,
                ranking=ranking,
                rates=rates,
                a0=float(s1["a0"]),
                C0=_arr(s1["C0"]),
                eta_C=float(s1["eta_C"]),
                delta=float(s1["delta"]),
                duration=duration,
                laws=laws,
                coverage=coverage,
                notes=tuple(d.get("notes") or ()),
                timing=dict(d.get("timing") or {}),
                ladder=d.get("ladder"),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a gflow theory (as Theory.to_json writes it): missing or bad {e}") from e
