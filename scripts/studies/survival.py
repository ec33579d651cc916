"""What survives of the paper's three-stage picture in each member of the model family.

What it shows
-------------
For every member (``model.member``; docs/guides/models.md) at the paper's default data
(d = 3, parents (1, 2), α = 0.1, L = 100, stationary start) and at parents (1, 3), the
paper's staged flow (Stage I the selector, II the first layer, III the classifier; the
default durations and events) and, member by member:

- the set the selector picks at the end of Stage I, its share, the parent offsets that set
  reads (``AbstractModel.set_offsets``) and whether they are the true parents (= argmax Ĩ
  here);
- per head of that set, the query's attention mass on the true parent offsets at the end of
  Stage II, and for the token-aware members how much a key's head output depends on its own
  token (the mean over the sample's key windows of max_{e,e'} ‖v(e, window) − v(e', window)‖,
  relative to the mean ‖v‖; 0 for a token-blind head);
- the growth law of the classifier scale: the slope of a against log τ in Stage III, fitted
  where a has left its plateau (a ≥ a₀ + log 2) and before it settles (τ·∂τa ≥ 0.2), for the
  output-matrix member also of its temperature ω = mean diag W_O;
- the loss at the end against the loss ladder's model-free rungs on the run's own sample:
  Bayes, the GIH limit of the true parents (inf_a L_GIH), the context unigram (the GIH at
  a = 0), each with its paired standard error;
- the stage timings: where Stage I and II ended (event, steady or duration) and at what time,
  and each stage's wall time (of the run the numbers come from, on the machine as loaded then).

A member whose integration fails (the default tsit5 at rtol 10⁻⁸ runs out of steps where a
LayerNorm makes the flow stiff, or where a stage's vector field is round-off noise; the study caps
the steps per decade of saves at ``MAX_STEPS``) does not stop the study: the failure (solver, stage, time,
reason) is recorded in its row and the run is made again with kvaerno5 (``--retry``); the row
says which solver its numbers come from, or that they are the partial run's.

It writes ``--out``/``<member>_p<parents>[_<solver>[<eta>]][_T<I>-<II>-<III>]/`` run folders
(the solver when it is not tsit5, GD's step, the stage caps when given; resumable; a stored
failed run is reported, not retried), ``survival.json`` and prints the results page's table;
``--plot`` draws ``figures/survival.png`` and copies the json beside it (``figures/survival.json``,
from which the page's table is rendered and checked: tests/test_study_pages.py).

Usage::

    # the results page's runs, both parent sets: the LayerNorm members with their own solver and
    # stage caps (docs/results/survival.md says why), then every other member and the figure
    python3 scripts/studies/survival.py --N 1000 --L 40 --members value_ln --method kvaerno5 --durations 1000,100000,10000
    python3 scripts/studies/survival.py --N 1000 --L 40 --members full --method gd --eta 0.0004 --retry '' \
        --durations 1000,40,100 --max-steps 1000000
    python3 scripts/studies/survival.py --N 1000 --L 40 --members paper,token,token_factorised,value,absolute,residual,linear_query,linear_output,bilinear --plot
    python3 scripts/studies/survival.py --N 4000                 # every member at L = 100
    python3 scripts/studies/survival.py --members paper,full --parents 1,2
    python3 scripts/studies/survival.py --members value_ln --method kvaerno5   # skip a known tsit5 failure
    python3 scripts/studies/survival.py --table-only             # from survival.json
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import gflow
from gflow.core import Params, make_loss, member_of

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

# the members, each with the options it is studied at (the factorised token form and the
# LayerNorm are the official code's choices)
VARIANTS = {
    "paper": {},
    "token": {"token_form": "direct"},
    "token_factorised": {"token_form": "factorised", "token_init": 0.1},
    "value": {},
    "value_ln": {"layernorm": True},
    "full": {},
    "absolute": {},
    "residual": {},
    "linear_query": {},
    "linear_output": {},
    "bilinear": {},
}
MEMBER = {"token_factorised": "token", "value_ln": "value"}


# steps per decade of saved times: the staged default takes at most a few thousand; a stage whose
# vector field sits at the float64 round-off floor (a member whose Stage II leaves a stationary, so
# that Stage III's ∂L/∂a is ±10⁻⁷ noise) makes tsit5's error control crawl at dt ≈ 10⁻³, and the
# cap makes such a run fail in minutes (and be made again with `retry`) instead of in days
MAX_STEPS = 20_000


def config_of(variant: str, parents, N: int, L: int, method: str = "tsit5", max_steps: int = MAX_STEPS,
              durations=None, eta: float | None = None) -> gflow.Config:
    """The member's staged run; `durations` (three flow times) replaces the default stage caps,
    `eta` is the step of ``method = "gd"`` (explicit Euler on the flow's time)."""
    model = {"member": MEMBER.get(variant, variant), **VARIANTS[variant]}
    solver = {"method": method, "max_steps": max_steps, **({} if eta is None else {"eta": eta})}
    cfg = gflow.Config().replace(data={"parents": list(parents), "L": L}, estimator={"N": N}, model=model,
                                 solver=solver)  # fmt: skip
    return cfg if durations is None else cfg.replace(schedule={"durations": tuple(durations)})


def folder_tag(variant: str, parents, method: str = "tsit5", durations=None, eta: float | None = None) -> str:
    """``<member>_p<parents>[_<solver>[<eta>]][_T<I>-<II>-<III>]``: the run folder of one row."""
    tag = f"{variant}_p{''.join(map(str, parents))}"
    if method != "tsit5":
        tag += f"_{method}" + ("" if eta is None else f"{eta:g}")
    if durations is not None:
        tag += "_T" + "-".join(f"{x:g}" for x in durations)
    return tag


def _theta(tr, i) -> Params:
    return Params.from_blocks({b: jnp.asarray(v) for b, v in tr.state(i).items()})


def _end_of(tr, name: str) -> int:
    idx = np.flatnonzero(tr.stage == {"I": 1, "II": 2, "III": 3}[name])
    return int(idx[-1]) if idx.size else 0


def head_offsets(model, h: int) -> list[int]:
    """The offsets head h's M attention weights are on (aligned 1..M; the Full model's h..h+M−1)."""
    first = 1 if model.span == model.M else h
    return list(range(first, first + model.M))


def token_dependence(member, theta, loss) -> list[float]:
    """Per head: mean over the sample's key windows of max_{e,e'} ‖v(e, w) − v(e', w)‖ / mean ‖v‖
    (0 when a key's head output does not read its own token)."""
    if not member.own_token:
        return [0.0] * member.model.H
    d = loss.d
    feats = loss.feats
    from gflow.core._paper import sparse_windows

    if feats.name == "counts":  # the windows present in the sample
        present = np.flatnonzero(np.asarray(feats.counts).sum((0, 1)) > 0)
        digits = np.array([[(k // (d + 1) ** (member.span - 1 - i)) % (d + 1) for i in range(member.span)] for k in present])
    else:
        W = sparse_windows(d, member.span)
        present = np.unique(np.asarray(feats.G)[np.asarray(feats.counts).sum(1) > 0])
        digits = W[present]
    wins = jnp.asarray(np.repeat(digits, d, axis=0))
    own = jnp.asarray(np.tile(np.arange(d), len(digits)))
    V = np.asarray(member.vectors(theta, wins, own, query=False, d=d))  # (comps, n·d, dv)
    V = V.reshape(V.shape[0], len(digits), d, -1)
    heads = range(V.shape[0] - member.model.H, V.shape[0])
    out = []
    for c in heads:
        diff = np.max(np.linalg.norm(V[c][:, :, None] - V[c][:, None, :], axis=-1), axis=(1, 2))
        out.append(float(diff.mean() / max(np.linalg.norm(V[c], axis=-1).mean(), 1e-300)))
    return out


def growth_slope(tr, values, a0: float) -> tuple[float, float, float] | None:
    """Slope of `values` against log τ over Stage III where a ≥ a₀ + log 2 and τ·∂τa ≥ 0.2."""
    idx = np.flatnonzero(tr.stage == 3)
    if idx.size < 4:
        return None
    t0 = tr.stages[-1].t0
    tau = tr.ts[idx] - t0
    a = tr.a[idx]
    v = np.asarray(values)[idx]
    ok = (tau > 0) & (a >= a0 + math.log(2))
    if ok.sum() >= 3:
        lt = np.log(tau)
        dadlt = np.gradient(a, lt, edge_order=1) if len(a) > 2 else np.zeros_like(a)
        ok &= dadlt >= 0.2
    if ok.sum() < 3:
        return None
    x, y = np.log(tau[ok]), v[ok]
    slope = float(np.polyfit(x, y, 1)[0])
    return slope, float(tau[ok][0]), float(tau[ok][-1])


def _integrate(cfg: gflow.Config, folder: Path):
    """The run in `folder` (resumed or started); a failed integration returns its FlowError."""
    try:
        try:
            tr = gflow.load(folder)
            if tr.integrated:
                return tr, None
            m = re.match(r"failed: Stage (\S+) at t = (\S+): (.*)", tr.status or "")
            if m:  # the stored run failed: keep its record rather than fail again
                return tr, {"stage": m[1], "t": float(m[2]), "reason": m[3]}
            return gflow.integrate(cfg, out=folder, resume=True), None
        except (FileNotFoundError, ValueError):
            return gflow.integrate(cfg, out=folder, overwrite=True), None
    except gflow.FlowError as e:
        reason = str(e).split(": ", 1)[-1].split(" (partial trajectory")[0]
        return e.trajectory, {"stage": e.stage, "t": float(e.t), "reason": reason}


def study_one(variant: str, parents, N: int, L: int, out: Path, retry: str | None = "kvaerno5",
              method: str = "tsit5", max_steps: int = MAX_STEPS, durations=None, eta: float | None = None) -> dict:
    """One member at one parent set: the row of the table. A failed integration is recorded
    (its stage, time and reason) and, with `retry`, the run is made again with that solver; the
    row says which solver its numbers come from and what failed before. `method` is the first
    solver (each run's folder is :func:`folder_tag` of its solver and settings); `max_steps`
    caps its steps per decade of saves (a stored unfinished run resumes under the new cap, so a
    smaller cap turns a run that would take too long into a recorded failure with its partial
    trajectory); `durations` replaces the stage caps (the row records them, the folder name
    ends in ``_T<I>-<II>-<III>``); `eta` is the first solver's step when it is ``"gd"``
    (explicit Euler, for a member whose field is discontinuous)."""
    t0 = time.perf_counter()
    cfg = config_of(variant, parents, N, L, method=method, max_steps=max_steps, durations=durations, eta=eta)
    tr, fail = _integrate(cfg, out / folder_tag(variant, parents, method, durations, eta))
    failures = []
    if fail is not None:
        failures.append({"method": cfg.solver.method, **fail})
        if retry:
            cfg = config_of(variant, parents, N, L, method=retry, max_steps=max_steps, durations=durations)
            tr, fail = _integrate(cfg, out / folder_tag(variant, parents, retry, durations))
            if fail is not None:
                failures.append({"method": retry, **fail})
    wall = time.perf_counter() - t0
    row = {"variant": variant, "member": cfg.model.member, "options": VARIANTS[variant], "parents": list(parents),
           "N": N, "L": L, "method": cfg.solver.method, "durations": None if durations is None else list(durations),
           "eta": eta if cfg.solver.method == "gd" else None,
           "failures": failures, "completed": fail is None, "wall": wall}  # fmt: skip
    try:
        row.update(summarise(cfg, tr, parents))
    except (IndexError, ValueError) as e:  # a run that failed before Stage I ended has no set to report
        row["summary_error"] = str(e)
    return row


def summarise(cfg: gflow.Config, tr, parents) -> dict:
    """The numbers of one run (complete or the partial trajectory of a failed one)."""
    model = cfg.model
    member = member_of(model)
    loss = make_loss(cfg.data, model, cfg.estimator)
    i1, i2, i3 = _end_of(tr, "I"), _end_of(tr, "II"), len(tr.ts) - 1
    S = tuple(tr.subsets[int(np.argmax(tr.c_frac[i1]))])
    share = float(np.max(tr.c_frac[i1]))
    offs = member.set_offsets(S)
    s2 = np.asarray(tr.s[i2])
    attn = {}
    for h in member.heads_of(S):
        o = head_offsets(model, h)
        attn[h] = float(sum(s2[h - 1, j] for j, off in enumerate(o) if off in parents))
    tok = token_dependence(member, _theta(tr, i2), loss)
    slope = growth_slope(tr, tr.a, cfg.init.a0)
    temp = None
    if "O" in tr.x:
        omega = np.mean(np.diagonal(tr.x["O"], axis1=-2, axis2=-1), axis=-1)
        temp = {"omega_end": float(omega[-1]), "omega0": float(omega[0]),
                "slope": (growth_slope(tr, omega, cfg.init.a0) or (None,))[0]}  # fmt: skip
    lad = gflow.loss_ladder(loss, cfg.data, S=tuple(parents), params=_theta(tr, i3))
    verdict = verdict_of(gflow.check(tr, loss=loss))
    rungs = {k: (lad.mean(k), lad.se(k)) for k in ("bayes", "gih", "unigram", "flow")}
    gaps = {f"flow-{k}": lad.gap("flow", k) for k in ("bayes", "gih", "unigram")}
    stages = [{"name": r.name, "ended_by": r.ended_by, "t0": r.t0, "t1": r.t1, "nfev": r.nfev, "wall": r.wall,
               **({"solver": r.solver, "solver_from": r.solver_from} if r.solver else {})}
              for r in tr.stages]  # fmt: skip
    return {
        "selected": list(S), "share": share, "offsets": None if offs is None else list(offs),
        "parents_picked": offs is not None and tuple(offs) == tuple(parents),
        "attention_on_parents": attn, "token_dependence": tok,
        "a_end": float(tr.a[-1]), "slope": None if slope is None else slope[0],
        "slope_window": None if slope is None else slope[1:], "temperature": temp,
        "rungs": rungs, "gaps": gaps, "loss_end": float(tr.loss[-1]), "stages": stages,
        "extra_end": {b: float(np.linalg.norm(v[-1] - v[0])) for b, v in tr.x.items()},
        "verdict": verdict,
    }  # fmt: skip


#: the study's three conclusions and the report rows that check each on any run (``gflow check``;
#: docs/guides/checks.md): the set Stage I picks (argmax J for the paper's model, the set the
#: small-a flow of the member's own G selects for another), the growth of a in the member's own
#: Stage III window, and the limit loss of that law. A row name is matched by its prefix.
CONCLUSIONS = {
    "set": ("I: winner argmax c/Σc = argmax J at", "I: winner argmax c/Σc = the set the small-a flow of a·G selects"),
    "slope": ("III: slope of a vs log τ in the member's own window",),
    "limit": ("limit loss: L̂ at end vs L̂(θ_II, a°)",),
}


def verdict_of(report) -> dict:
    """The run's gflow verdict (its finite and exact rows) and paper verdict, and for each of
    :data:`CONCLUSIONS` the row that checks it (name, predicted, measured, passed: ``None`` when
    undecided), or ``None`` when the report has no such row."""
    js = report.to_json()["rows"]
    pick = lambda prefixes: next((r for r in js if r["name"].startswith(prefixes)), None)  # noqa: E731
    keys = ("name", "predicted", "measured", "passed")
    rows = {k: (lambda r: None if r is None else {x: r[x] for x in keys})(pick(p)) for k, p in CONCLUSIONS.items()}
    return {**report.verdict, "rows": rows}


def in_table_order(results: list[dict]) -> list[dict]:
    """The rows by parent set, then in the order of ``VARIANTS`` (the page's order)."""
    order = {v: i for i, v in enumerate(VARIANTS)}
    return sorted(results, key=lambda r: (tuple(r["parents"]), order.get(r["variant"], 99)))


def verdict_cell(r: dict) -> str:
    """``pass (✓ ✓ ✓)``: the run's gflow verdict, then each conclusion's row (:data:`CONCLUSIONS`):
    ✓ passed, ✗ failed, – undecided, · no such row; "—" for a row summarised without them."""
    v = r.get("verdict")
    if v is None:  # a row summarised before the verdicts were recorded
        return "—"
    mark = lambda x: "·" if x is None else "–" if x["passed"] is None else "✓" if x["passed"] else "✗"  # noqa: E731
    return f"{v['gflow']} ({' '.join(mark(v['rows'][k]) for k in CONCLUSIONS)})"


def table(results: list[dict]) -> str:
    verdicts = any("verdict" in r for r in results)  # a json written before the verdicts: no column
    head = ("| member | parents | selector picks (share) | reads offsets | attention on parents, per head | "
            "token dependence | slope of a vs log τ | L̂ − Bayes | L̂ − GIH | L̂ − unigram | "
            + ("gflow verdict (set, slope, limit) | " if verdicts else "")
            + "Stage I / II end (wall I + II + III) |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in results:
        P = f"({','.join(map(str, r['parents']))})"
        fails = "; ".join(f"{f['method']} failed in Stage {f['stage']} at t = {f['t']:.4g} ({f['reason']})"
                          for f in r.get("failures", []))  # fmt: skip
        if "selected" not in r:
            lines.append(f"| {r['variant']} | {P} |" + " — |" * (10 if verdicts else 9) + f" {fails} |")
            continue
        S = gflow.core.subset_label(tuple(r["selected"]))
        offs = "—" if r["offsets"] is None else gflow.core.subset_label(tuple(r["offsets"]))
        att = ", ".join(f"h{h}: {v:.3f}" for h, v in r["attention_on_parents"].items()) or "—"
        tok = "—" if not any(r["token_dependence"]) else ", ".join(f"{v:.2g}" for v in r["token_dependence"])
        sl = "—" if r["slope"] is None else f"{r['slope']:.2f}"
        if r["temperature"] and r["temperature"]["slope"] is not None:
            sl += f" (ω: {r['temperature']['slope']:.2f})"
        g = {k: f"{m:+.4f} ± {se:.4f}" for k, (m, se) in r["gaps"].items()}
        st = " / ".join(f"{s['ended_by']} {s['t1'] - s['t0']:.3g}" for s in r["stages"][:2])
        st += " (" + " + ".join(f"{s['wall']:.0f}" for s in r["stages"]) + " s)"
        if r.get("durations"):
            st += "; stage caps " + " / ".join(f"{x:g}" for x in r["durations"])
        if r.get("eta"):
            st += f"; Euler steps (gd) of η = {r['eta']:g}"
        for s in r["stages"]:
            if s.get("solver"):  # solver.stiff_switch
                st += f"; Stage {s['name']} stiff: {s['solver']} from τ = {s['solver_from'] - s['t0']:.3g}"
        if fails:
            st += f"; {fails}" + ("" if r.get("completed", True) else " — numbers from the partial run")
            if r.get("completed", True):
                st += f"; numbers from {r['method']}"
        mark = "" if r["parents_picked"] else " ✗"
        vc = (verdict_cell(r) + " | ") if verdicts else ""
        lines.append(f"| {r['variant']} | {P} | {S} ({r['share']:.3f}) | {offs}{mark} | "
                     f"{att} | {tok} | {sl} | {g['flow-bayes']} | {g['flow-gih']} | {g['flow-unigram']} | {vc}{st} |")  # fmt: skip
    return "\n".join(lines)


def member_law(cfg: gflow.Config, tr, loss) -> tuple[np.ndarray, np.ndarray] | None:
    """The member's own Stage III law at the run's saved Stage III times: ``(τ, a_law(τ))``,
    the solution of ``da/dτ = η_a F(a)``, ``F(a) = −∂L̂(θ_II, a)/∂a`` on the run's sample from a's
    value at Stage III's start (``gflow.theory.LawCurve`` on a grid of F from that value to 30);
    ``None`` for a member whose Stage III moves more than a (its law is not one-dimensional) or a
    run without a saved Stage III. The report's row "III: slope of a vs log τ in the member's own
    window" fits this law against the flow."""
    import jax

    from gflow.theory import LawCurve

    idx = np.flatnonzero(tr.stage == 3)
    if idx.size < 2 or tuple(member_of(cfg.model).stage_moves["III"]) != ("a",):
        return None
    i0 = int(idx[0]) - 1  # the last saved point before Stage III: θ_II
    a0, theta = float(tr.a[i0]), tr.state(i0)
    w, C = tr.first_layer(i0), jnp.asarray(theta["C"])
    mean_loss = lambda a: jnp.mean(loss.per_sequence(Params.assemble(w, C, a)))  # noqa: E731
    grid = np.linspace(min(a0, 0.0), 30.0, 1201)
    F = -np.asarray(jax.vmap(jax.grad(mean_loss))(jnp.asarray(grid)), np.float64)
    tau = tr.ts[idx] - tr.stages[-1].t0
    law = LawCurve(grid, F, F * np.exp(grid), a0, float(cfg.schedule.eta_a))
    return tau, np.asarray(law.a(tau), np.float64)


def plot(results: list[dict], out: Path, path: Path) -> None:
    """Per parent set, three panels: the selected set's share of the selector against t; a against
    Stage III's own clock τ (log), each member's flow (solid) beside its own law (dashed,
    :func:`member_law`); the limit loss above Bayes, L̂ − Bayes, on a log axis (so the 0.02–0.06
    spread of the members that learn the parents is not flattened by the one that does not)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from _study import save_figure

    parents_sets = sorted({tuple(r["parents"]) for r in results})
    fig, axes = plt.subplots(len(parents_sets), 3, figsize=(17, 4.8 * len(parents_sets)), squeeze=False)
    for row, P in enumerate(parents_sets):
        rs = [r for r in results if tuple(r["parents"]) == P]
        ax_c, ax_a, ax_l = axes[row]
        rs = [r for r in rs if "selected" in r]
        for k, r in enumerate(rs):
            tr = gflow.load(out / folder_tag(r["variant"], P, r.get("method", "tsit5"), r.get("durations"), r.get("eta")))
            cfg = tr.config
            col = plt.cm.tab20(k / max(1, len(rs) - 1))
            S = tuple(r["selected"])
            j = tr.subsets.index(S)
            t = np.maximum(tr.ts, 1e-3)
            ax_c.semilogx(t, tr.c_frac[:, j], color=col, label=f"{r['variant']}: {gflow.core.subset_label(S)}")
            idx = np.flatnonzero(tr.stage == 3)
            if idx.size:
                tau = tr.ts[idx] - tr.stages[-1].t0
                ok = tau > 0
                ax_a.semilogx(tau[ok], tr.a[idx][ok], color=col, lw=1.6, label=r["variant"])
                law = member_law(cfg, tr, make_loss(cfg.data, cfg.model, cfg.estimator))
                if law is not None:
                    ax_a.semilogx(law[0][ok], law[1][ok], color=col, lw=1.0, ls="--")
            gap = r["gaps"]["flow-bayes"][0]
            ax_l.bar(k, max(gap, 1e-4), color=col)
            ax_l.text(k, max(gap, 1e-4) * 1.08, f"{gap:.3f}", ha="center", fontsize=7)
        gih = np.mean([r["rungs"]["gih"][0] - r["rungs"]["bayes"][0] for r in rs])
        uni = np.mean([r["rungs"]["unigram"][0] - r["rungs"]["bayes"][0] for r in rs])
        ax_l.axhline(gih, color="k", ls="--", lw=1, label="GIH limit of the parents")
        ax_l.axhline(uni, color="gray", ls=":", lw=1, label="context unigram")
        ax_l.set_yscale("log")
        ax_l.set_xticks(range(len(rs)), [r["variant"] for r in rs], rotation=60, ha="right", fontsize=8)
        ax_c.set(xlabel="t", ylabel="share of the set Stage I picked", title=f"parents {P}: the selector")
        ax_a.set(xlabel="τ = t − t₀ (Stage III's clock)", ylabel="a",
                 title=f"parents {P}: a(τ), the flow (solid) and its own law da/dτ = η_a F(a) (dashed)")
        ax_l.set(ylabel="L̂(end) − Bayes (log)", title=f"parents {P}: the limit loss above Bayes")
        ax_c.legend(fontsize=7, ncol=2)
        ax_a.legend(fontsize=7, ncol=2)
        ax_l.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", default=",".join(VARIANTS))
    ap.add_argument("--parents", nargs="+", default=["1,2", "1,3"])
    ap.add_argument("--N", type=int, default=4000)
    ap.add_argument("--L", type=int, default=100)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "survival")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--plot", action="store_true")
    ap.add_argument("--retry", default="kvaerno5", help="the solver a failed run is made again with ('' for none)")
    ap.add_argument("--method", default="tsit5", help="the first solver (kvaerno5 for a member known to be stiff)")
    ap.add_argument("--max-steps", type=int, default=MAX_STEPS, help="steps per decade of saves")
    ap.add_argument("--durations", type=lambda x: tuple(float(v) for v in x.split(",")), default=None,
                    help="the stages' caps I,II,III in flow time (default the staged default's)")
    ap.add_argument("--eta", type=float, default=None, help="the step of --method gd")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "survival.json"

    def stored() -> list[dict]:
        return json.loads(store.read_text()) if store.exists() else []

    if not args.table_only:
        for P in args.parents:
            parents = tuple(int(x) for x in P.split(","))
            for v in args.members.split(","):
                r = study_one(v, parents, args.N, args.L, args.out, retry=args.retry or None, method=args.method,
                              max_steps=args.max_steps, durations=args.durations, eta=args.eta)
                if r["failures"]:
                    print(f"{v} {parents}: failures {r['failures']}", flush=True)
                if "selected" in r:
                    print(f"{v} {parents} ({r['method']}): picks {r['selected']} ({r['share']:.3f}), offsets {r['offsets']}, "
                          f"slope {r['slope']}, L-Bayes {r['gaps']['flow-bayes'][0]:+.4f}, {r['wall']:.0f} s", flush=True)
                # one row per member and set, merged with what other processes of the study wrote meanwhile
                rows = [d for d in stored() if not (d["variant"] == v and tuple(d["parents"]) == parents)]
                store.write_text(json.dumps(rows + [r], indent=1, default=float))
    results = in_table_order(stored())
    print(table(results))
    if args.plot:
        plot(results, args.out, ROOT / "figures" / "survival.png")
        (ROOT / "figures" / "survival.json").write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    main()
