"""Check-report rows of GD at the edge of stability (docs/theory/central-flow.md): for GD's central
flow (``solver.method = "central"``) the edge held, no eigenvalue past it left unheld, and its
predictions of GD's time averages at the run's end; for GD itself (``"gd"``) its sharpness
against the edge along the run and its catapults."""

from __future__ import annotations

import numpy as np

from ..dynamics import EDGE_RATE, EDGE_WINDOW, SDCP_TOL, central_predictions, find_catapults, sharpness
from ._base import Ctx
from ._report import decided_row

#: Saved states at which the central flow's terms are recomputed for the report (evenly spaced).
EDGE_ROWS = 60
#: Saved states of a GD run whose Hessian spectrum the report computes (evenly spaced; a run saved
#: at every step up to this many is read whole, catapults included).
GD_ROWS = 400


def rows_edge(ctx: Ctx) -> None:
    """The rows of a central-flow run (none for any other method).

    - ``central: held eigenvalues at the edge`` (exact): ``max |η λ_i / 2 − 1|`` over the saved
      states where an eigenvalue is held, after its first entry. The field holds an eigenvalue
      from ``(1 − EDGE_WINDOW)·2/η`` on and pulls it onto ``2/η`` at the rate ``EDGE_RATE/η``, so
      the measured gap is at most about EDGE_WINDOW, plus a run's start above the edge (pulled down
      at that rate): tolerance ``2·EDGE_WINDOW`` from one time unit ``η/EDGE_RATE`` after the entry
      on. Wrong answer: the eigenvalue 10 % off the edge.
    - ``central: complementarity residual of X`` (exact): the largest relative residual of the
      complementarity problem (:func:`gflow.dynamics._central.sdcp_residual`) over the recomputed
      states, at most ``SDCP_TOL``; past it the report names where. Wrong answer: 10⁻².
    - ``central: eigenvalues past the edge all held`` (exact): the count at or past the edge's
      window minus the count held, at every recomputed state: 0 unless more eigenvalues reached
      the edge than ``solver.edge_eigs`` holds (raise it). Wrong answer: one unheld.
    - informational: the first saved time at the edge; GD's predicted time-averaged loss
      ``L̂ + ½ Σ X_ii λ_i`` and ``‖∇L̂‖²`` beside the central flow's own at the end; ``tr X``.
    """
    sc = ctx.cfg.solver
    if sc.method_for("I") != "central":
        return
    es = central_predictions(ctx.traj, loss=ctx.loss, max_times=EDGE_ROWS)
    eta = float(sc.eta)
    held = np.flatnonzero(es.held > 0)
    if held.size == 0:
        ctx.info("central: first time at the edge 2/η", None, None,
                 f"never reached: max η λ_max/2 = {float(np.max(es.lam[:, 0]) / es.edge):.4g} on the recomputed "
                 f"states (the central flow is the flow here)", "exact")  # fmt: skip
        return
    t_in = float(es.ts[held[0]])
    ctx.info("central: first time at the edge 2/η", None, t_in, f"of {len(es.ts)} recomputed saved states", "exact")
    settled = held[es.ts[held] >= t_in + eta / EDGE_RATE]
    if settled.size:
        gap = max(float(np.max(np.abs(es.lam[i, : es.held[i]] / es.edge - 1.0))) for i in settled)
        tol = 2 * EDGE_WINDOW
        ctx.add(decided_row("central: held eigenvalues at the edge (max abs(η λ_i/2 − 1))", 0.0, gap, tol, claim="exact",
                            rule=("le", tol), wrong=0.1))  # fmt: skip
    else:
        ctx.skip("central: held eigenvalues at the edge", "no recomputed state a time unit η/EDGE_RATE after the entry")
    unheld = int(np.max(es.past - es.held))
    ctx.add(decided_row("central: eigenvalues past the edge all held (max past − held)", 0, unheld, 0, claim="exact",
                        rule=("le", 0), wrong=1))  # fmt: skip
    kkt = float(np.max(es.kkt))
    ctx.add(decided_row("central: complementarity residual of X (max over recomputed states)", 0.0, kkt, SDCP_TOL,
                        claim="exact", rule=("le", SDCP_TOL), wrong=1e-2))  # fmt: skip
    if kkt > SDCP_TOL:
        i = int(np.argmax(es.kkt))
        ctx.notes.append(f"warning: the central flow's complementarity problem was solved only to a relative residual "
                         f"{kkt:.3g} at t = {float(es.ts[i]):.4g} ({int(es.held[i])} eigenvalues held): X, and the "
                         "field there, are that inaccurate (gflow.dynamics.SDCP_ITERATIONS)")  # fmt: skip
    if unheld:
        ctx.notes.append(f"warning: {unheld} eigenvalue(s) of ΛH passed the edge 2/η unheld: raise solver.edge_eigs "
                         f"(now {sc.edge_eigs})")  # fmt: skip
    ctx.info("central: GD's time-averaged loss at the end (L̂, L̂ + ½ Σ X_ii λ_i)", float(es.loss[-1]),
             float(es.loss_gd[-1]), "the central flow's prediction of GD's average loss beside its own L̂", "finite")
    ctx.info("central: GD's time-averaged ‖∇L̂‖² at the end (flow's, predicted)", float(es.grad2[-1]),
             float(es.grad2_gd[-1]), "of the moving blocks; the oscillation adds ⟨X, UᵀH²U⟩", "finite")
    ctx.info("central: oscillation size tr X at the end", None, float(np.trace(es.X[-1])),
             "X_ii: GD's mean squared distance from the central flow along edge direction i (Λ^{-1/2} units)",
             "finite")  # fmt: skip


def rows_gd_edge(ctx: Ctx) -> None:
    """The rows of a GD run (none for any other method), from the sharpness λ_max(ΛH) at up to
    :data:`GD_ROWS` saved states (evenly spaced; :func:`gflow.dynamics.sharpness`: the κ table's
    Hessian where the layout has it, else warm-started Lanczos):

    - ``GD: η λ_max/2 along the run (max)``: GD is linearly stable where it is below 1; at its
      maximum, the time;
    - ``GD: first saved time past the edge (η λ_max > 2)``;
    - ``GD: catapults at the saved resolution``: every episode past the edge
      (:func:`gflow.dynamics.find_catapults`): its start, ``s_peak → s_after`` with the
      angle map's ``s_after`` beside it, and ‖C‖ before → after. Save every step
      (``solver.save_times``) to see each catapult whole; docs/results/gd-at-the-edge.md has the
      law's measurements;
    - ``GD: final ‖C‖ vs √(η max_t λ_max‖C‖²/2)``: the law that held there (within 5 % for
      η ≥ 0.05): the norm-free sharpness ``λ_max‖C‖²`` (L̂ depends on C only through C/‖C‖) is
      the flow's along the run, and at its maximum GD's catapults leave ``η λ_max = 2``, the
      central flow's final ‖C‖.

    All informational (``finite``): GD has no law of its own in the report beyond these."""
    sc = ctx.cfg.solver
    if sc.method_for("I") != "gd":
        return
    tr = ctx.traj
    if len(tr.ts) < 2:
        ctx.skip("GD edge rows", "fewer than two saved times")
        return
    eta = float(sc.eta)
    sp = sharpness(None, tr, loss=ctx.loss, max_times=GD_ROWS)  # λ_max alone (Lanczos without the κ table)
    s = eta * np.asarray(sp.lam_max)
    k = int(np.argmax(s))
    ctx.info("GD: η λ_max/2 along the run (max)", 1.0, float(s[k] / 2),
             f"at t = {float(sp.ts[k]):.4g}, of {len(sp.ts)} saved states; below 1 GD is linearly stable "
             f"(η_c = 2/λ_max: min {sp.eta_c_min:.4g})", "finite")  # fmt: skip
    past = np.flatnonzero(s > 2)
    ctx.info("GD: first saved time past the edge (η λ_max > 2)", None, float(sp.ts[past[0]]) if past.size else None,
             "never past the edge at the saved states" if not past.size else "the first saved state with η λ_max > 2",
             "finite")  # fmt: skip
    C = np.asarray(tr.C)[sp.index]
    cats = find_catapults(sp.ts, eta, sp.lam_max, C)
    desc = [f"t {c.t_start:.4g}: {c.s_peak:.3g} → {c.s_after:.3g} [map {c.s_after_map:.3g}], ‖C‖ "
            f"{c.norm_before:.4g} → {c.norm_after:.4g}" for c in cats]  # fmt: skip
    ctx.info("GD: catapults at the saved resolution (t, s_peak → s_after [map], ‖C‖ before → after)", None, len(cats),
             "; ".join(desc) if desc else "none: GD stayed below the edge at every saved state", "finite")  # fmt: skip
    # the final-norm law: the norm-free sharpness λ_max‖C‖² is the flow's along the run, and GD's
    # catapults leave ‖C‖ where the central flow holds λ_max at 2/η at the sharpest point
    n2 = np.sum(C**2, axis=1)
    bound = float(np.sqrt(eta * np.max(np.asarray(sp.lam_max) * n2) / 2))
    final = float(np.linalg.norm(np.asarray(tr.C)[-1]))
    ctx.info("GD: final ‖C‖ vs √(η max_t λ_max‖C‖²/2) (the central flow's)", bound, final,
             f"ratio {final / bound:.3f}; measured 1.013 at η = 0.1 and 1.145 at η = 0.025 on the small joint "
             "flow (docs/results/gd-at-the-edge.md)", "finite")  # fmt: skip


def _flat_run(tr) -> np.ndarray:
    """θ at every saved time as rows ``(T, P)``: every block flattened, in name order."""
    b = tr.blocks()
    return np.concatenate([np.asarray(b[k], np.float64).reshape(len(tr.ts), -1) for k in sorted(b)], axis=1)


def check_beside(traj, others) -> None:
    """Refuse, before any computation, runs that cannot be compared with `traj` by θ: the same data,
    model, estimator and initialisation (the methods and schedules may differ), and saved times
    that overlap `traj`'s. ``ValueError`` naming the first section that differs."""
    cfg = traj.config.to_dict()
    for k, o in enumerate(others):
        oc = o.config.to_dict()
        for sec in ("data", "model", "estimator", "init"):
            if oc.get(sec) != cfg.get(sec):
                diff = sorted(key for key in set(oc[sec]) | set(cfg[sec]) if oc[sec].get(key) != cfg[sec].get(key))
                raise ValueError(f"beside[{k}]: its {sec} differs from the run's ({', '.join(f'{sec}.{d}' for d in diff)}):"
                                 " only runs of the same data, model, estimator and init are compared")  # fmt: skip
        if float(o.ts[-1]) < float(traj.ts[0]) or float(o.ts[0]) > float(traj.ts[-1]):
            raise ValueError(f"beside[{k}]: its saved times [{o.ts[0]:.4g}, {o.ts[-1]:.4g}] do not overlap the run's "
                             f"[{traj.ts[0]:.4g}, {traj.ts[-1]:.4g}]")  # fmt: skip


def rows_beside(ctx: Ctx, others) -> None:
    """Informational rows comparing the run with other runs of the same data, model, estimator and
    initialisation (``check(traj, beside=[...])``, ``gflow check DIR --beside DIR2``): for a GD
    run, the flow and its central flow side by side. For each: ``‖θ − θ_other‖`` at the run's saved
    times inside the other run's span (θ: every block; the other run linearly interpolated between
    its saved times) — mean, max and at the last common time; ‖C‖ and the loss at that time."""
    tr = ctx.traj
    me, ts = _flat_run(tr), np.asarray(tr.ts, np.float64)
    for o in others:
        meth = o.config.solver.method_for("I")
        m = {"gd": "GD", "central": "central flow", "modified": "modified flow"}.get(meth, f"flow ({meth})")
        ok = (ts >= float(o.ts[0])) & (ts <= float(o.ts[-1]))
        ot, ov = np.asarray(o.ts, np.float64), _flat_run(o)
        keep = np.concatenate([[True], np.diff(ot) > 0])  # a stage boundary saves its time twice
        ot, ov = ot[keep], ov[keep]
        ref = np.stack([np.interp(ts[ok], ot, ov[:, j]) for j in range(ov.shape[1])], axis=1)
        dist = np.linalg.norm(me[ok] - ref, axis=1)
        last = int(np.flatnonzero(ok)[-1])
        where = f"{int(ok.sum())} saved times t ∈ [{ts[ok][0]:.4g}, {ts[ok][-1]:.4g}]; the {m} linearly interpolated"
        ctx.info(f"beside the {m}: ‖θ − θ_{meth}‖ (mean, max, at the last common time)", None,
                 [float(dist.mean()), float(dist.max()), float(dist[-1])], where, "finite")  # fmt: skip
        oc = np.stack([np.interp(ts[last], ot, np.asarray(o.C, np.float64)[keep][:, j]) for j in range(o.C.shape[1])])
        ctx.info(f"beside the {m}: ‖C‖ at t = {ts[last]:.4g} ({meth}, this run)", float(np.linalg.norm(oc)),
                 float(np.linalg.norm(np.asarray(tr.C[last], np.float64))), "the selector's norm: the flow conserves it, GD's "
                 "catapults grow it", "finite")  # fmt: skip
        ol = float(np.interp(ts[last], ot, np.asarray(o.loss, np.float64)[keep]))
        ctx.info(f"beside the {m}: loss at t = {ts[last]:.4g} ({meth}, this run)", ol, float(tr.loss[last]),
                 "the saved L̂ of each (not GD's time average)", "finite")
