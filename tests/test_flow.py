"""The gradient flow (gflow/flow.py): closed forms, convergence order of
gradient descent, stage masks, events, conservation laws, save/load/resume,
determinism and failures."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gflow
from gflow.core._model import Params
from gflow.trajectory import _ARRAYS

# The test-size staged run (scripts/configs/small.toml: d = 3, parents (1, 2), L = 40,
# N = 2000); the `small_run` fixture (conftest.py) integrates it once.
SMALL = gflow.load_config(Path(__file__).resolve().parents[1] / "scripts" / "configs" / "small.toml")


def _rows(traj, k):
    return np.flatnonzero(traj.stage == k)


# ---------------------------------------------------------------------------
# Closed form: Stage III of a hard induction head on a deterministic chain
# ---------------------------------------------------------------------------


def test_stage3_matches_closed_form():
    """Alternating chain x_l = 1 − x_{l−1}, one-hot copier on offset 1 and
    c = e_{1}: Stages I and II end at once (their events hold), and Stage III is
    da/dt = F(a) with ŷ_y = (A e^a + B)/(C e^a + D) for counts A, B, C, D read
    off the context, integrable by hand:
    t(a) = [AC(u − u0) + (AD + BC) log(u/u0) − BD(1/u − 1/u0)] / (AD − BC), u = e^a."""
    cfg = gflow.Config().replace(
        data={"d": 2, "parents": [1], "L": 12, "kernel": [[0.0, 1.0], [1.0, 0.0]]},
        model={"M": 2, "H": 2, "D": 1},
        estimator={"N": 8, "eps": 0.0},
        schedule={"durations": [1.0, 1.0, 50.0]},
        solver={"save_per_decade": 6},
    )
    subs = cfg.model.subsets
    C = np.zeros(len(subs))
    C[subs.index((1,))] = 1.0
    a0 = 0.5
    p0 = Params(w=jnp.asarray([[300.0, 0.0], [0.0, 300.0]]), C=jnp.asarray(C), a=jnp.asarray(a0))
    traj = gflow.integrate(cfg, params0=p0)
    assert [(st.name, st.ended_by) for st in traj.stages] == [("I", "event"), ("II", "event"), ("III", "duration")]
    assert traj.stages[2].t0 == 0.0

    X = np.asarray(gflow.sample(cfg.data, 8, key=jax.random.key(0)).X[0])
    L = len(X)
    y = 1 - X[-1]
    match = np.array([l >= 2 and X[l - 2] == X[-1] for l in range(1, L + 1)])  # x_{l-1} = x_{q-1}
    A = int(np.sum(match & (X == y)))
    B = int(np.sum(~match & (X == y)))
    Cn, D = int(match.sum()), int((~match).sum())
    assert A * D - B * Cn > 0

    rows = _rows(traj, 3)
    tau = traj.ts[rows] - traj.stages[2].t0
    u, u0 = np.exp(traj.a[rows]), np.exp(a0)
    t_exact = (A * Cn * (u - u0) + (A * D + B * Cn) * np.log(u / u0) - B * D * (1 / u - 1 / u0)) / (A * D - B * Cn)
    np.testing.assert_allclose(t_exact, tau, rtol=1e-6, atol=1e-9)
    # and a really moved over the stage
    assert traj.a[rows[-1]] > a0 + 2


# ---------------------------------------------------------------------------
# Gradient descent → flow as η → 0
# ---------------------------------------------------------------------------


def test_gd_converges_to_flow_first_order():
    """θ_GD(t) − θ_flow(t) = O(η): the fitted log-log slope over three step
    sizes is 1 (explicit Euler's global order)."""
    cfg = gflow.Config().replace(
        data={"L": 20},
        estimator={"N": 200},
        init={"a0": 1.0},
        schedule={"kind": "joint", "t1": 2.0, "eta_w": 1.0, "eta_C": 1.0, "eta_a": 1.0},
        solver={"save_per_decade": 1, "rtol": 1e-10, "atol": 1e-12},
    )
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    ref = gflow.integrate(cfg, loss=loss)
    assert ref.ts[-1] == pytest.approx(2.0)

    def theta(tr):
        return np.concatenate([tr.w[-1].ravel(), tr.C[-1], [tr.a[-1]]])

    etas = np.array([0.1, 0.05, 0.025])
    errs = []
    for eta in etas:
        gd = gflow.integrate(cfg.replace(solver={"method": "gd", "eta": float(eta)}), loss=loss)
        assert gd.ts[-1] == pytest.approx(2.0)
        # gd steps land on multiples of η
        k = gd.ts / eta
        np.testing.assert_allclose(k, np.round(k), atol=1e-9)
        errs.append(np.linalg.norm(theta(gd) - theta(ref)))
    errs = np.array(errs)
    assert np.all(errs > 0)
    order = np.polyfit(np.log(etas), np.log(errs), 1)[0]
    assert 0.9 < order < 1.1, (errs, order)


def test_gd_is_the_iteration():
    """GD steps are θ − ηΛ∇L̂(θ), computed here by hand; a duration that is
    not a multiple of η (0.25 with η = 0.1) takes ⌈T/η⌉ = 3 whole steps and
    ends at t = 0.3 (never a partial step), every saved time an iterate."""
    cfg = gflow.Config().replace(
        data={"L": 20}, estimator={"N": 100}, init={"a0": 1.0},
        schedule={"kind": "joint", "t1": 0.25, "eta_w": 0.5, "eta_C": 2.0, "eta_a": 1.0},
        solver={"method": "gd", "eta": 0.1, "save_per_decade": 1},
    )  # fmt: skip
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    tr = gflow.integrate(cfg, loss=loss)
    assert tr.ts[-1] == pytest.approx(0.3, abs=1e-12)
    k = tr.ts / 0.1
    np.testing.assert_allclose(k, np.round(k), atol=1e-9)
    assert tr.stages[0].nfev == 3 and tr.stages[0].steps == 3
    p = gflow.init_params(cfg.model, cfg.init)
    for _ in range(3):
        g = loss.grad(p)
        p = Params(w=p.w - 0.1 * 0.5 * g.w, C=p.C - 0.1 * 2.0 * g.C, a=p.a - 0.1 * 1.0 * g.a)
    np.testing.assert_allclose(tr.w[-1], p.w, rtol=1e-12)
    np.testing.assert_allclose(tr.C[-1], p.C, rtol=1e-12)
    np.testing.assert_allclose(tr.a[-1], p.a, rtol=1e-12)


def test_gd_that_diverges_at_the_start_is_refused_before_integrating(tmp_path):
    """One step θ₀ − ηΛ∇L̂(θ₀) decides: η = 10³⁰⁰ overflows C² (non-finite loss), refused with a
    ValueError naming solver.eta before anything is integrated or written (the folder stays
    without a run); η = 10⁶ — 2·10⁶ times the edge at the start — is a finite step and runs (GD on
    this model catapults the selector instead of diverging), its loss finite at the end."""
    base = gflow.Config().replace(data={"L": 12}, estimator={"N": 100}, schedule={"kind": "joint"})
    cfg = base.replace(schedule={"t1": 1e301}, solver={"method": "gd", "eta": 1e300})
    with pytest.raises(ValueError, match=r"solver.eta = 1e\+300: GD diverges at the start: .* take a smaller solver.eta"):
        gflow.integrate(cfg, out=tmp_path / "run")
    assert not (tmp_path / "run" / "trajectory.npz").exists()
    ok = gflow.integrate(base.replace(schedule={"t1": 3e6}, solver={"method": "gd", "eta": 1e6}))
    assert ok.status == "complete" and np.all(np.isfinite(ok.loss)) and ok.ts[-1] == pytest.approx(3e6)


# ---------------------------------------------------------------------------
# The staged run
# ---------------------------------------------------------------------------


def test_staged_run_selects_and_concentrates(small_run):
    traj, _ = small_run
    assert [st.name for st in traj.stages] == ["I", "II", "III"]
    assert traj.status == "complete"
    # Stage I picks {1, 2}; Stage II concentrates heads 1 and 2 on offsets 1 and 2.
    i1 = _rows(traj, 1)[-1]
    assert traj.subsets[int(np.argmax(traj.c_frac[i1]))] == (1, 2)
    assert traj.stages[1].selected == (1, 2)
    i2 = _rows(traj, 2)[-1]
    s = traj.s[i2]
    assert s[0, 0] >= 0.99 - 1e-9 and s[1, 1] >= 0.99 - 1e-9
    # Stage III lowers the loss well below its start
    assert traj.loss[-1] < traj.loss[i2] - 0.1


def test_stage_masks_are_exact(small_run):
    """Frozen blocks do not move, bit for bit."""
    traj, _ = small_run
    moves = {1: "C", 2: "w", 3: "a"}
    start = 0
    for k in (1, 2, 3):
        rows = _rows(traj, k)
        ref = rows[0] - 1 if k > 1 else 0  # the state the stage started from
        for block in ("w", "C", "a"):
            arr = getattr(traj, block)
            if block != moves[k]:
                assert np.array_equal(arr[rows], np.broadcast_to(arr[ref], arr[rows].shape)), (k, block)
            else:
                assert not np.array_equal(arr[rows[-1]], arr[ref]), (k, block)
        start = rows[-1]
    assert start == len(traj) - 1


def test_events_end_stages_at_the_right_state(small_run):
    traj, _ = small_run
    delta = SMALL.schedule.delta
    r1 = _rows(traj, 1)
    cmax = traj.c_frac[r1].max(-1)
    assert traj.stages[0].ended_by == "event"
    assert cmax[-1] == pytest.approx(1 - delta, abs=1e-9)  # root-found, not overshot
    assert np.all(cmax[:-1] < 1 - delta)
    r2 = _rows(traj, 2)
    sel = traj.stages[1].selected
    conc = np.min(np.stack([traj.s[r2, h - 1, h - 1] for h in sel]), axis=0)
    assert traj.stages[1].ended_by == "event"
    assert conc[-1] == pytest.approx(1 - delta, abs=1e-9)
    assert np.all(conc[:-1] < 1 - delta)
    assert traj.stages[1].t0 == traj.ts[r1[-1]] and traj.stages[2].t0 == traj.ts[r2[-1]]


def test_norm_of_C_conserved_in_stage1(small_run):
    """‖C‖ is a first integral of Stage I (⟨∇_C L̂, C⟩ = 0, docs/theory/mathematics.md §M6.2)."""
    traj, _ = small_run
    r1 = _rows(traj, 1)
    nrm = np.linalg.norm(traj.C[r1], axis=-1)
    assert np.max(np.abs(nrm / nrm[0] - 1)) < 1e-7


def test_solver_statistics_recorded(small_run):
    traj, _ = small_run
    for st in traj.stages:
        assert st.steps > 0 and st.nfev >= 6 * st.steps  # Tsit5: six new evaluations a step
        assert st.wall > 0


def test_save_load_roundtrip(small_run):
    traj, out = small_run
    back = gflow.load(out)
    for k in _ARRAYS:
        assert np.array_equal(getattr(back, k), getattr(traj, k)), k
    assert back.stages == traj.stages
    assert back.config == traj.config
    assert back.status == "complete" and back.versions == traj.versions


def test_same_seed_same_trajectory(small_run):
    traj, _ = small_run
    again = gflow.integrate(SMALL)
    for k in _ARRAYS:
        assert np.array_equal(getattr(again, k), getattr(traj, k)), k


def test_resume_extends_stage3(small_run, tmp_path):
    """A run to t₁ resumed to t₂ matches a single run to t₂ within the solver
    tolerance."""
    traj, _ = small_run
    d3 = SMALL.schedule.durations[2]
    short = SMALL.replace(schedule={"durations": [1e3, 1e10, d3 / 10]})  # stops mid-Stage III
    gflow.integrate(short, out=tmp_path)
    resumed = gflow.integrate(SMALL, out=tmp_path, resume=True)
    assert resumed.ts[-1] == pytest.approx(traj.ts[-1], rel=1e-12)
    assert resumed.stages[2].complete and resumed.stages[2].t1 == pytest.approx(traj.stages[2].t1)
    assert resumed.a[-1] == pytest.approx(traj.a[-1], rel=1e-6)
    assert np.array_equal(resumed.w[-1], traj.w[-1]) and np.array_equal(resumed.C[-1], traj.C[-1])
    # the saved folder is the resumed run
    assert gflow.load(tmp_path).ts[-1] == resumed.ts[-1]


def test_resume_refuses_other_data(small_run, tmp_path):
    _, out = small_run
    with pytest.raises(ValueError, match=r"cannot resume: data\.L = 31 differs from the saved run.s 40"):
        gflow.integrate(SMALL.replace(data={"L": 31}), out=out, resume=True)


# ---------------------------------------------------------------------------
# Failures
# ---------------------------------------------------------------------------


def test_non_finite_field_fails_before_integrating(tmp_path):
    """ε = 0 with tokens absent from some context: log(0) makes ∇L̂ NaN."""
    cfg = SMALL.replace(data={"L": 4}, estimator={"eps": 0.0, "N": 200})
    with pytest.raises(gflow.FlowError, match=r"Stage I failed at t = 0: the gradient of the loss is not finite") as e:
        gflow.integrate(cfg, out=tmp_path)
    assert e.value.stage == "I" and e.value.t == 0.0
    back = gflow.load(tmp_path)
    assert back.status.startswith("failed: Stage I")
    assert len(back.ts) == 1


def test_failed_solve_keeps_partial_trajectory(tmp_path):
    # (without the stiff switch, which would go on with kvaerno5 where tsit5 ran out of steps)
    cfg = SMALL.replace(solver={"max_steps": 10, "stiff_switch": False})
    with pytest.raises(gflow.FlowError, match=r"Stage I failed at t = .*maximum number of solver steps") as e:
        gflow.integrate(cfg, out=tmp_path)
    partial = e.value.trajectory
    back = gflow.load(tmp_path)
    assert back.status.startswith("failed: Stage I")
    assert back.stages[0].ended_by == "failed"
    assert np.array_equal(back.ts, partial.ts) and len(back.ts) >= 1
    assert e.value.t == pytest.approx(back.ts[-1])
    # throw=False: the same partial trajectory is returned, not raised; its record keeps the
    # stage's steps and evaluations up to the failure
    quiet = gflow.integrate(cfg, throw=False)
    assert quiet.status == back.status and np.array_equal(quiet.ts, back.ts)
    rec = quiet.stages[0]
    assert rec.ended_by == "failed" and rec.steps >= 10 and rec.nfev >= rec.steps


def test_batch_throw_raises_the_first_failure():
    """integrate_batch(throw=True) raises the first failed replicate's FlowError after
    the batch; throw=False returns every trajectory, the failed one marked."""
    from gflow.runs import integrate_batch

    cfgs = [SMALL.replace(data={"L": 4}, estimator={"eps": 0.0, "N": 200, "seed": s}) for s in (0, 1)]
    with pytest.raises(gflow.FlowError, match=r"Stage I failed at t = 0: the gradient of the loss is not finite"):
        integrate_batch(cfgs)
    got = integrate_batch(cfgs, throw=False)
    assert [tr.status.startswith("failed: Stage I at t = 0") for tr in got] == [True, True]


def test_stage_records_are_plain_data(small_run):
    traj, _ = small_run
    d = dataclasses.asdict(traj.stages[0])
    assert set(d) >= {"name", "t0", "t1", "ended_by", "steps", "rejected", "nfev", "wall"}


def test_resume_after_interruption(small_run, tmp_path):
    """A run cut in the middle of Stage II (as if killed after a segment)
    resumes from its last saved state and ends where the uninterrupted run
    ends, within the solver tolerance."""
    from gflow.trajectory import save

    traj, out = small_run
    back = gflow.load(out)
    r2 = _rows(back, 2)
    cut = r2[len(r2) // 2]
    for k in _ARRAYS:
        setattr(back, k, getattr(back, k)[: cut + 1])
    back.stages = back.stages[:2]
    back.stages[1] = dataclasses.replace(back.stages[1], complete=False, ended_by="duration", t1=float(back.ts[-1]))
    back.status = "running"
    save(back, tmp_path)
    resumed = gflow.integrate(SMALL, out=tmp_path, resume=True)
    assert [st.name for st in resumed.stages] == ["I", "II", "III"]
    assert resumed.stages[1].ended_by == "event"
    assert resumed.stages[1].t1 == pytest.approx(traj.stages[1].t1, rel=1e-6)
    np.testing.assert_allclose(resumed.w[-1], traj.w[-1], rtol=1e-6, atol=1e-9)
    assert resumed.a[-1] == pytest.approx(traj.a[-1], rel=1e-6)
    assert resumed.loss[-1] == pytest.approx(traj.loss[-1], rel=1e-8)
    # the rows before the cut are kept as they were
    assert np.array_equal(resumed.ts[: cut + 1], traj.ts[: cut + 1])


def test_existing_run_is_not_overwritten(small_run):
    _, out = small_run
    before = (out / "trajectory.npz").read_bytes()
    with pytest.raises(ValueError, match=r"already holds a run: resume it"):
        gflow.integrate(SMALL, out=out)
    assert (out / "trajectory.npz").read_bytes() == before


def test_bad_params0_named_before_sampling():
    p = gflow.init_params(SMALL.model)
    with pytest.raises(ValueError, match=r"params0\.w must be a finite array of shape \(3, 3\)"):
        gflow.integrate(SMALL, params0=Params(w=p.w[:2], C=p.C, a=p.a))
    with pytest.raises(ValueError, match=r"params0\.C must not be all zero"):
        gflow.integrate(SMALL, params0=Params(w=p.w, C=0 * p.C, a=p.a))


def test_step_control_carried_across_solves():
    """A stage is integrated one decade of τ (one diffeqsolve) at a time; the
    step-size controller's state is carried from each solve to the next, so
    the segmented run takes about the steps of one solve over the whole span
    (at most one extra, clipped, step per solve) and ends at the same state
    within the tolerance. Without the carry every solve restarts the
    controller with a guessed small step and climbs back: 73 steps here
    against 56 for one solve and 58 with the carry (measured), so the bound
    below fails without it.

    The flow of ``a`` alone (η_w = η_C = 0), as in Stage III: a ≈ log τ needs
    steps growing geometrically over four decades."""
    import diffrax

    from gflow.core._loss import StageLoss
    from gflow.dynamics._solve import VectorField, save_grid, split_segments

    T = 1e4
    cfg = gflow.Config().replace(
        data={"L": 20}, estimator={"N": 200}, init={"a0": 1.0},
        schedule={"kind": "joint", "t1": T, "eta_w": 0.0, "eta_C": 0.0},
    )  # fmt: skip
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    tr = gflow.integrate(cfg, loss=loss)
    n_solves = len(split_segments(save_grid(0.0, T, cfg), cfg.solver.save_per_decade))
    assert n_solves >= 6

    p0 = gflow.init_params(cfg.model, cfg.init)
    # the joint schedule's ODE state: every block, w and C with time scale 0
    moves = ("w", "C", "a")
    scale = {"w": jnp.asarray(0.0), "C": jnp.asarray(0.0), "a": jnp.asarray(1.0)}
    vf = VectorField(stage_loss=StageLoss(loss, p0, moves), scale=scale)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vf), diffrax.Tsit5(), 0.0, T, None, {b: getattr(p0, b) for b in moves},
        stepsize_controller=diffrax.PIDController(rtol=cfg.solver.rtol, atol=cfg.solver.atol), max_steps=100_000,
    )  # fmt: skip
    one = int(sol.stats["num_accepted_steps"])
    steps = tr.stages[0].steps
    assert one <= steps <= one + n_solves, (steps, one, n_solves)
    np.testing.assert_allclose(tr.a[-1], float(sol.ys["a"][-1]), rtol=1e-6)
    np.testing.assert_array_equal(tr.w[-1], np.asarray(p0.w))


# ---------------------------------------------------------------------------
# Evaluation counts: in the compiled program (explicit solvers) = on the host
# ---------------------------------------------------------------------------


def _host_counted(monkeypatch, cfg, **kw):
    from gflow.dynamics._flow import StageRun

    monkeypatch.setattr(StageRun, "host_count", True)
    try:
        return gflow.integrate(cfg, **kw)
    finally:
        monkeypatch.setattr(StageRun, "host_count", False)


def test_evaluation_count_in_program_equals_host_count(monkeypatch, small_run, small_config, small_loss):
    """The single driver counts an explicit solver's evaluations from what each solve did
    (gflow.dynamics._solve._tsit5_nfev: the initial-step heuristic, first stages up to the first
    accepted step, six a step, the steady test), so its compiled program has no host
    callback. That count equals the host counter's (a callback per evaluation) stage by
    stage, over a run with first and continued solves, rejected steps, events and the steady
    test, and the trajectory is the same."""
    traj, _ = small_run
    host = _host_counted(monkeypatch, small_config, loss=small_loss)
    assert sum(s.rejected for s in traj.stages) > 0  # the count covers rejected steps
    assert [(s.name, s.nfev, s.steps, s.rejected) for s in traj.stages] == [
        (s.name, s.nfev, s.steps, s.rejected) for s in host.stages
    ]
    for name in _ARRAYS:
        np.testing.assert_array_equal(getattr(traj, name), getattr(host, name), err_msg=name)


def test_evaluation_count_gd_in_program_equals_host_count(monkeypatch):
    """GD (explicit Euler): one evaluation a step, counted in the program, equals the host count."""
    cfg = SMALL.replace(estimator={"N": 200}, solver={"method": "gd", "eta": 0.5},
                        schedule={"durations": [20.0, 10.0, 5.0]})  # fmt: skip
    prog = gflow.integrate(cfg)
    host = _host_counted(monkeypatch, cfg)
    assert [(s.nfev, s.steps) for s in prog.stages] == [(s.nfev, s.steps) for s in host.stages]
    assert all(s.nfev == s.steps > 0 for s in prog.stages)


def test_stage3_out_of_explicit_steps_names_the_implicit_setting():
    """A tsit5 Stage III (moving a alone) that runs out of steps says what to set: an implicit
    Stage III, the other stages' methods kept; another stage's failure, or an implicit Stage III's,
    carries no such advice."""
    import diffrax

    from gflow.dynamics._solve import failure_reason as _failure

    sc = gflow.Config().solver
    msg = _failure(diffrax.RESULTS.max_steps_reached, False, sc, "III", ("a",))
    assert "max_steps=100000" in msg and "solver.method = ['tsit5', 'tsit5', 'kvaerno5']" in msg
    assert "kvaerno5" not in _failure(diffrax.RESULTS.max_steps_reached, False, sc, "II", ("w",))
    imp = gflow.Config().replace(solver={"method": ["tsit5", "tsit5", "kvaerno5"]}).solver
    assert "solver.method =" not in _failure(diffrax.RESULTS.max_steps_reached, False, imp, "III", ("a",))
