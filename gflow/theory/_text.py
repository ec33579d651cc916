"""The text rendering of a theory (``gflow theory``)."""

from __future__ import annotations

import numpy as np

from ..core import PRIORS, subset_label
from ._ladder import format_ladder


def _fmt(x, spec=".4g"):
    return "—" if x is None else format(x, spec)


def _pm(x, se, spec=".4g"):
    if x is None:
        return "—"
    return f"{x:{spec}} ± {_fmt(se, '.2g')}"


def _flat(J) -> bool:
    """Whether the Stage I rates are the same for every set (to rounding): no winner by them."""
    Jv = [float(x) for x in J]
    return len(Jv) > 1 and max(Jv) - min(Jv) <= 1e-12 * max(1.0, max(abs(x) for x in Jv))


def rate_symbol(member: str) -> str:
    """The Stage I rate's symbol for ``model.member = member``: ``"J"`` for the paper's model,
    ``"G"`` for another member of the family (the same derivative ``−∂L̂/∂a`` at ``a = 0``,
    ``c = e_S``, of the member's own loss, which the paper does not derive)."""
    return "J" if member == "paper" else "G"


def format_theory(theory) -> str:
    """A readable text rendering of a :class:`~gflow.theory.Theory` (or of its
    :meth:`~gflow.theory.Theory.to_json` dict)."""
    report = theory.to_json() if hasattr(theory, "to_json") else theory
    c = report["config"]
    dc, mc, ec, ic = c["data"], c["model"], c["estimator"], c["init"]
    mi, s1, s3 = report["mi"], report["stage1"], report["stage3"]
    labels = report["labels"]
    member = mc.get("member", "paper")
    R = rate_symbol(member)
    own = "" if R == "J" else " (the member's own loss)"
    out = []
    fixed = dc.get("fixed_kernel") or dc.get("kernel") is not None
    prior = "fixed kernel" if fixed else f"{PRIORS[dc.get('prior', 'dirichlet')].label}(alpha={dc['alpha']:g})"
    out.append(
        f"gflow theory — d={dc['d']}, parents {tuple(dc['parents'])}, {prior}, L={dc['L']}; "
        f"TF(M={mc['M']}, H={mc['H']}, D={mc['D']}, norm={mc['norm']}{'' if member == 'paper' else ', member=' + member}); "
        f"N={ec['N']}, seed={ec['seed']}, eps={ec['eps']:g}, loss={ec['loss']}"
    )
    out.append("")
    out.append(
        f"§M6.1 Stage I winner: modified χ²-MI Ĩ(S), mean over n_pi={c['n_pi']} prior kernels "
        f"(seed {c['pi_seed']}); gaps with paired SEs"
    )
    hdr = f"  {'rank':>4}  {'S':<7} {'Ĩ(S)':>22} {'gap to next':>22} {'χ²-MI':>22} {'MI':>22}"
    out.append(hdr)
    for r, row in enumerate(mi["ranking"], 1):
        mut = row.get("mutual_information")
        out.append(
            f"  {r:>4}  {row['label']:<7} {_pm(row['Itilde'], row['Itilde_se']):>22} "
            f"{_pm(row['gap_to_next'], row['gap_to_next_se']):>22} {_pm(row['chi2'], row['chi2_se']):>22} "
            f"{'—' if mut is None else _pm(mut, row.get('mutual_information_se')):>22}"
        )
    gap_sig = (
        "exact" if not mi["gap_se"] else f"{mi['gap'] / mi['gap_se']:.1f} paired SE"
    )
    out.append(
        f"  S* = argmax Ĩ = {mi['S_star_label']}   (gap to runner-up: {gap_sig}; "
        f"close call: {'YES' if mi['close_call'] else 'no'})"
    )
    if mi.get("argmax_chi2") is not None:
        ami = mi.get("argmax_mutual_information")

        def _ties(key):
            tied = mi.get(key) or []
            rest = [subset_label(tuple(S)) for S in tied[1:]]
            return f" (tied with {', '.join(rest)})" if rest else ""

        out.append(
            f"  the other rankings (§M10): argmax χ²-MI = {subset_label(tuple(mi['argmax_chi2']))}{_ties('tied_chi2')}, "
            f"argmax MI = {'—' if ami is None else subset_label(tuple(ami))}{_ties('tied_mutual_information')}, "
            f"argmax {R} = {'none (flat)' if _flat(s1['J']) else subset_label(tuple(s1['argmax_J']))}"
        )
        if any(len(mi.get(k) or []) > 1 for k in ("tied_chi2", "tied_mutual_information")):
            out.append("  (the ordinary χ²-MI and MI tie a set holding every parent with its supersets: "
                       "the smallest tied set is named)")
    out.append("")
    out.append(
        f"§M6.2 Stage I rates at init (w₊={ic['w_plus']:g}, w₋={ic['w_minus']:g}, c₀={ic['c0']:g}, "
        f"a₀={ic['a0']:g}): {R}(S) = −∂L̂/∂a|a=0,c=e_S on the run's sample{own}; L₀ = {_fmt(s1['L0'], '.6g')}"
    )
    out.append(f"  {'S':<7} {R + '(S)':>22} {'Ĩ(S)':>12} {'dlog c/dt (' + R + ')':>14} {'(Ĩ)':>10}")
    for i, lab in enumerate(labels):
        out.append(
            f"  {lab:<7} {_pm(s1['J'][i], s1['J_se'][i]):>22} {_fmt(mi['Itilde'][i]):>12} "
            f"{_fmt(s1['dlogc_dt_J'][i]):>14} {_fmt(s1['dlogc_dt_Itilde'][i]):>10}"
        )
    ru = "{" + ",".join(map(str, s1["runner_up"])) + "}" if s1["runner_up"] else "∅"
    if _flat(s1["J"]):
        out.append(f"  argmax {R}: none — {R}(S) is the same for every S: this member's loss at a = 0 does not read the "
                   f"selector C (its selector is elsewhere, or the classifier starts at zero), so {R} predicts no "
                   "Stage I winner; the flow decides it")  # fmt: skip
        s1 = {**s1, "duration": None}
    else:
        out.append(
            f"  argmax {R} = {'{' + ','.join(map(str, s1['argmax_J'])) + '}' if s1['argmax_J'] else '∅'}; "
            f"d/dt log(c_{mi['S_star_label']}/c_{ru}) = "
            f"{_pm(s1['slope_Sstar_vs_runner_up_J'], s1['slope_Sstar_vs_runner_up_J_se'])} ({R}), "
            f"{_fmt(s1['slope_Sstar_vs_runner_up_Itilde'])} (Ĩ)"
        )
    du = s1.get("duration")
    if du is not None:
        lab = "{" + ",".join(map(str, du["S"])) + "}" if du["S"] else "∅"
        when = "never (no set reaches 1 − δ)" if du["never"] else f"t = {du['t']:.6g}, set {lab}"
        out.append(
            f"  §M8.1 linearised Stage I (w, a frozen; η_C = {s1['eta_C']:g}): "
            f"max c/Σc reaches 1 − δ = {1 - s1['delta']:g} at {when}"
        )
    laws = report.get("laws") or {mi["S_star_label"]: s3}
    order = [mi["S_star_label"]] + [k for k in laws if k != mi["S_star_label"]]
    for k in order:
        out.extend(_law_lines(laws[k], "S*" if k == mi["S_star_label"] else "argmax J / selected"))
    if report.get("ladder"):
        out.append("")
        out.append("§M8.3 " + format_ladder(report["ladder"]))
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


def _law_lines(s3: dict, role: str) -> list[str]:
    """The lines of one GIH law (docs/theory/mathematics.md §M6.4, §M6.5)."""
    out = []
    out.append("")
    a_grid = s3["curve"]["a"]
    out.append(
        f"§M6.4 Stage III: GIH on S = {s3['label']} ({role}; one-hot copier, c = e_S), "
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
    out.append("§M6.5 Limit loss")
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
    return out
