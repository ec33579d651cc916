"""The check report's types and formats (docs/theory/mathematics.md §M7, §M8.1): :class:`Row`, one
prediction against the run, and :class:`Report`, the rows with the run's and
the theory's summaries, the two verdicts, and its JSON, Markdown and text forms."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from .._util import jsonable, table_cell

__all__ = ["CLAIMS", "SYMBOLS", "Report", "Row", "decided_row", "used_symbols"]

CLAIMS = ("paper", "finite", "exact")


@dataclasses.dataclass(frozen=True)
class Row:
    """One prediction against the run.

    - `name`: what is compared (unique within a report).
    - `predicted`, `measured`: numbers, short strings (``"{1,2}"``) or short lists.
    - `tolerance`: a number (an absolute bound on ``|measured − predicted|``)
      or a short string saying what is allowed; for an undecided row
      (``passed is None``) a string starting ``"info: "`` that says why.
    - `passed`: ``True``/``False``, or ``None`` (undecided: informational, not
      covered by the law, or not decidable by this run).
    - `claim`: ``"paper"`` (the paper's asymptotic statement), ``"finite"``
      (gflow's finite-size law on the run's sample and initialisation) or
      ``"exact"`` (an identity of the flow).
    - `rule`: how `measured` is decided, so that the same row can re-decide
      another value (:meth:`decide`): ``("abs", ref, tol)``: every
      ``|m − ref| ≤ tol``; ``("ge", ref)``; ``("le", ref)``; ``("in", refs)``;
      ``("interval", lo, hi)``; ``("true",)``.
    - `wrong`: a plausible wrong measurement (what a bug or another law would
      give, e.g. the other set, ``a + 1``, a slope × 1.5). A row is decided only
      when its rule rejects `wrong` (no vacuous rows).
    """

    name: str
    predicted: Any
    measured: Any
    tolerance: Any
    passed: bool | None
    claim: str = "finite"
    rule: tuple | None = dataclasses.field(default=None, compare=False, repr=False)
    wrong: Any = dataclasses.field(default=None, compare=False, repr=False)

    def decide(self, measured) -> bool:
        """Whether `measured` passes this row's rule (``ValueError`` without a rule)."""
        if self.rule is None:
            raise ValueError(f"row {self.name!r} has no rule to decide by")
        kind, *ref = self.rule
        if kind == "true":
            return bool(measured)
        if kind == "in":
            return measured in ref[0]
        m = np.asarray(measured, np.float64)
        if not np.all(np.isfinite(m)):
            return False
        if kind == "abs":
            return bool(np.all(np.abs(m - np.asarray(ref[0], np.float64)) <= np.asarray(ref[1], np.float64)))
        if kind == "ge":
            return bool(np.all(m >= ref[0]))
        if kind == "le":
            return bool(np.all(m <= ref[0]))
        if kind == "interval":
            return bool(np.all((m >= ref[0]) & (m <= ref[1])))
        raise ValueError(f"row {self.name!r}: unknown rule {kind!r}")


def decided_row(name, predicted, measured, tolerance, *, claim, rule, wrong, why_not=None) -> Row:
    """A row decided by `rule`, unless `why_not` (a reason) is given or the rule
    does not reject the plausible wrong answer `wrong` (then undecided, saying so)."""
    if claim not in CLAIMS:
        raise ValueError(f"claim must be one of {CLAIMS}, got {claim!r}")
    probe = Row(name, predicted, measured, tolerance, None, claim, rule, wrong)
    if why_not is None and wrong is not None and probe.decide(wrong):
        why_not = f"vacuous: a plausible wrong answer ({table_cell(wrong)}) would pass tolerance {table_cell(tolerance)}"
    if why_not is not None:
        return Row(name, predicted, measured, f"info: {why_not}", None, claim, rule, wrong)
    return Row(name, predicted, measured, tolerance, probe.decide(measured), claim, rule, wrong)



# What every symbol of a report means (report.md ends with the ones it uses; docs/guides/checks.md
# has the rows, docs/theory/mathematics.md the derivations). Order: as a reader meets them.
SYMBOLS: dict[str, str] = {
    "L̂": "the Monte Carlo population loss on the run's N sequences (its gradient ∇L̂ is what the flow follows)",
    "c/Σc": "the selector's weights c_S = C_S² normalised over the parent sets S of 𝒮",
    "𝒮": "the parent sets the selector can pick: every S ⊆ {1..H} with |S| ≤ D (head h reads offset h)",
    "Ĩ": "the modified χ²-mutual information of a parent set, averaged over the prior's kernels (the paper's Stage I criterion)",
    "S*": "argmax Ĩ: the paper's prediction of the set Stage I selects",
    "J": "J(S) = −∂L̂/∂a at a = 0 with c = e_S: gflow's finite-size Stage I rate of S on the run's own sample",
    "G": "G(c) = −∂L̂/∂a at a = 0: the Stage I rate of the model's own loss on the run's sample (L̂ ≈ L₀ − a·G(c) "
         "at small a); G(S) at c = e_S, what the paper's model (norm = sum) calls J(S)",
    "δ": "the stage events' threshold: Stage I ends when a set's c/Σc ≥ 1 − δ, Stage II when its heads' s^(h)_h ≥ 1 − δ",
    "s^(h)": "head h's copier attention softmax(w^(h)); s^(h)_h its weight on its own offset h",
    "β": "the Stage II exponent: 1 − s^(h)_h ~ τ^(−β)",
    "τ": "a stage's own clock, τ = t − t₀ from the stage's start (a joint run: τ = t)",
    "η_a": "the classifier's time scale: ∂ₜa = −η_a ∂L̂/∂a (schedule.eta_a); η_C, η_w likewise for C and w",
    "F(a)": "the GIH's force F(a) = −dL_GIH/da of the selected set (its law ∂τa = η_a F(a))",
    "L_GIH": "the loss of the generalised induction head (GIH) of a set at classifier scale a",
    "C*": "max_a F(a)·e^a: the constant of the paper's law ∂τa ≈ η_a C* e^{−a}",
    "window": "the validity window {a : F(a)e^a ≥ C*/2}, where a(τ) follows log τ",
    "a*": "the zero of F: the GIH's fixed point, where Stage III settles for a one-hot copier and c = e_S",
    "a°": "the zero of the model's own −∂L̂/∂a at Stage III's frozen (w, C): where staged Stage III settles exactly",
    "λ": "the contrast (c_S/Σc)·Π_{h∈S}(s^(h)_h)² of the selected set S: to first order the model is the GIH "
         "with a shrunk to λa (law λF(λa), zero a*/λ); λ_w is the copier's part Π(s^(h)_h)²",
    "ρ": "the measured effect of the selector's residual mass on other sets (the model at its c against c = e_S); "
         "ρ_a the same for the zero a°",
    "paired SE": "the standard error of the mean of a per-sequence difference (both sides on the same sequences)",
    "SE": "a Monte Carlo standard error (std/√N over the sequences; over the seeds for a stochastic run)",
}


def used_symbols(text: str) -> list[str]:
    """The symbols of :data:`SYMBOLS` that occur in `text` ("SE" only outside "paired SE")."""
    out = []
    for sym in SYMBOLS:
        if sym == "SE":
            if "SE" in text.replace("paired SE", ""):
                out.append(sym)
        elif sym == "G":  # the letter alone (not GIH, GD)
            if re.search(r"(?<![\w])G(?![\w])", text):
                out.append(sym)
        elif sym in text:
            out.append(sym)
    return out


def _result(p) -> str:
    return "info" if p is None else ("PASS" if p else "FAIL")


def _fold(rows) -> str:
    decided = [r.passed for r in rows if r.passed is not None]
    if not decided:
        return "undecided"
    return "pass" if all(decided) else "fail"


@dataclasses.dataclass
class Report:
    """The check report of a run: `rows`, `run` (a summary of the run), `theory`
    (a summary of the predictions), `skipped` (checks that do not apply, with
    the reason), `notes`, and the sets `selected` (what Stage I selected),
    `S_star` (``argmax Ĩ``) and `argmax_J`."""

    rows: list[Row]
    run: dict = dataclasses.field(default_factory=dict)
    theory: dict = dataclasses.field(default_factory=dict)
    skipped: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    selected: tuple[int, ...] | None = None
    S_star: tuple[int, ...] | None = None
    argmax_J: tuple[int, ...] | None = None

    @property
    def verdict(self) -> dict[str, str]:
        """``{"gflow": "pass"|"fail", "paper": "pass"|"fail"|"undecided"}``: `gflow`
        over the decided finite and exact rows (a fail: the flow disagrees with
        its own theory), `paper` over the decided paper rows (a fail: the
        paper's asymptotic statement does not hold at this size)."""
        g = _fold(r for r in self.rows if r.claim != "paper")
        return {"gflow": "fail" if g == "fail" else "pass", "paper": _fold(r for r in self.rows if r.claim == "paper")}

    @property
    def passed(self) -> bool:
        """The gflow verdict: every decided finite and exact row passed."""
        return self.verdict["gflow"] == "pass"

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.passed is False]

    def row(self, name: str) -> Row:
        """The row called `name` (``KeyError`` if there is none)."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row named {name!r}; rows: {[r.name for r in self.rows]}")

    def to_json(self) -> dict:
        """A JSON-serialisable dict: ``"rows"`` (objects with the keys name,
        claim, predicted, measured, tolerance, passed), ``"verdict"``,
        ``"passed"`` (the gflow verdict), ``"selected"``, ``"S_star"``,
        ``"argmax_J"``, ``"run"``, ``"theory"``, ``"skipped"``, ``"notes"``.
        Non-finite numbers are ``None`` (NaN) or ``"inf"``/``"-inf"``."""
        keys = ("name", "claim", "predicted", "measured", "tolerance", "passed")
        opt = lambda S: None if S is None else list(S)
        return {
            "rows": [{k: jsonable(getattr(r, k)) for k in keys} for r in self.rows],
            "verdict": self.verdict,
            "passed": self.passed,
            "selected": opt(self.selected),
            "S_star": opt(self.S_star),
            "argmax_J": opt(self.argmax_J),
            "run": jsonable(self.run),
            "theory": jsonable(self.theory),
            "skipped": list(self.skipped),
            "notes": list(self.notes),
        }

    def _header(self) -> list[str]:
        out = []
        r, t = self.run, self.theory
        if r:
            seeds = f", {r['seeds']} seeds (judged on their mean)" if r.get("seeds") else ""
            out.append(
                f"run: {r.get('schedule', '?')} schedule, solver {r.get('method', '?')}{seeds}, "
                f"status {r.get('status', '?')}; "
                + "; ".join(
                    f"{s['name']}: t ∈ [{s['t0']:.4g}, {s['t1']:.4g}] ended by {s['ended_by']}"
                    + (f" (stiff: {s['solver']} from t = {s['solver_from']:.6g})" if s.get("solver") else "")
                    for s in r.get("stages", [])
                )
            )
        if t:
            out.append(
                f"theory: S* = argmax Ĩ = {t.get('S_star')} (close call: {'yes' if t.get('close_call') else 'no'}); "
                f"argmax J = {t.get('argmax_J')}; selected = {t.get('selected')}; GIH of {t.get('selected')}: "
                f"C* = {table_cell(t.get('C_star'))}, window = {table_cell(t.get('window'))}, a* = {table_cell(t.get('a_star'))}, "
                f"inf L_GIH = {table_cell(t.get('limit_loss'))}"
            )
        out += [n for n in self.notes if n.startswith("warning: ")]
        v = self.verdict
        for claim, key in (("finite", "gflow"), ("paper", "paper")):
            rows = [x for x in self.rows if (x.claim == "paper") == (claim == "paper")]
            n_fail = sum(x.passed is False for x in rows)
            n_info = sum(x.passed is None for x in rows)
            what = f"{_run_kind(r.get('method'))} against gflow's own laws" if key == "gflow" else "the paper's asymptotic claims"
            out.append(
                f"verdict {key}: {v[key].upper()} — {what} "
                f"({len(rows) - n_fail - n_info} passed, {n_fail} failed, {n_info} undecided)"
            )
        return out

    def to_markdown(self) -> str:
        """The report as a Markdown document with one table."""

        def esc(s: str) -> str:
            return s.replace("|", "\\|")

        out = ["# gflow check report", ""]
        out += [f"- {esc(line)}" for line in self._header()]
        out += ["", "| check | claim | predicted | measured | tolerance | result |", "|---|---|---|---|---|---|"]
        for r in self.rows:
            cells = [r.name, r.claim, table_cell(r.predicted), table_cell(r.measured), table_cell(r.tolerance), _result(r.passed)]
            out.append("| " + " | ".join(esc(c) for c in cells) + " |")
        if self.skipped:
            out += ["", "Not applicable:", ""] + [f"- {esc(s)}" for s in self.skipped]
        if self.notes:
            out += ["", "Notes:", ""] + [f"- {esc(s)}" for s in self.notes]
        out.append("")
        out.append(
            "Rows with result `info` are undecided (informational, outside their law's coverage, or not "
            "decidable by this run; the tolerance says which) and count towards neither verdict. "
            "`gflow check` exits 1 only when the gflow verdict fails."
        )
        body = "\n".join(out)
        syms = used_symbols(body)
        if syms:
            out += ["", "Symbols (every row is explained in docs/guides/checks.md of gflow's documentation):", ""]
            out += [f"- **{esc(k)}**: {esc(SYMBOLS[k])}" for k in syms]
        return "\n".join(out) + "\n"

    def table(self) -> str:
        """A plain-text table for the terminal."""
        head = ("check", "claim", "predicted", "measured", "tolerance", "result")
        body = [
            (r.name, r.claim, table_cell(r.predicted), table_cell(r.measured), table_cell(r.tolerance), _result(r.passed))
            for r in self.rows
        ]
        width = [max(len(x[k]) for x in [head, *body]) for k in range(6)]
        width[4] = min(width[4], 60)  # a long tolerance would push the result off screen

        def line(cells):
            parts = []
            for k, c in enumerate(cells):
                c = c if len(c) <= width[k] else c[: width[k] - 1] + "…"
                parts.append(c.ljust(width[k]))
            return "  ".join(parts).rstrip()

        out = [*self._header(), "", line(head), line(tuple("-" * w for w in width))]
        out += [line(b) for b in body]
        if self.skipped:
            out += ["", "not applicable:"] + [f"  {s}" for s in self.skipped]
        if self.notes:
            out += ["", "notes:"] + [f"  {s}" for s in self.notes]
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()


def _run_kind(method) -> str:
    """What a run is, by its ``solver.method`` (a name, or a list of three): the flow, GD at a
    fixed step, GD's modified or central flow, SGD or the SDE."""
    m = method[0] if isinstance(method, (list, tuple)) and method else method
    return {"gd": "GD", "modified": "GD's modified flow", "central": "GD's central flow", "sgd": "SGD",
            "sde": "the SDE"}.get(m, "the flow")  # fmt: skip
