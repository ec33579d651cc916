"""Replicates (gflow/replicates.py): bands across independent samples, the
spread of check rows, the run folders, the vmapped batches
(gflow/vmapped.py), and the N^{-1/2} law of the bands.

Truth: hand-built trajectories whose values are known functions of each
stage's clock τ (the bands are then closed forms), hand-computed summaries,
the single runs of the same seeds (`gflow.integrate`, which a vmapped batch
must reproduce to rounding), and the central limit theorem (the spread of a
smooth functional of N i.i.d. sequences is ∝ N^{-1/2}).
"""

from __future__ import annotations

import json
import math
import shutil

import equinox as eqx
import jax
import numpy as np
import pytest

import gflow
from gflow.cli import main
from gflow.dynamics import _vmapped as vmapped
from gflow.dynamics._vmapped import sample_bytes
from gflow.runs import integrate_batch
from gflow.runs._replicates import (
    SAMPLE_BUDGET,
    bands,
    default_batch,
    load_replicates,
    replicate_seeds,
    row_spread,
    run_replicates,
    summarize,
)
from gflow.trajectory import StageRecord, Trajectory

# d = 3 trigram, L = 20, N = 200; a short staged run (every stage 2 time
# units, one solve each): the test-size replicate.
TINY = gflow.Config().replace(
    data={"L": 20},
    estimator={"N": 200},
    schedule={"durations": [2.0, 2.0, 2.0]},
    solver={"save_per_decade": 3, "tau_min": 0.5},
)

# ---------------------------------------------------------------------------
# Bands of hand-built trajectories
# ---------------------------------------------------------------------------

GRID = 0.1 * 10.0 ** (np.arange(12) / 2)  # the shared saved-τ grid, two points a decade
NAMES = ("I", "II", "III")


def _coef(r, k):
    """a = A + B log τ in stage k of replicate r (and the loss = 1/(1 + a²))."""
    return 1.0 + r + 0.3 * k, 0.2 + 0.05 * r - 0.03 * k


def _fake(cfg, r, lengths, a0):
    """A staged trajectory: stage k saves at τ ∈ GRID ∩ (0, length_k] and at its
    end τ = length_k (an 'event'); a(τ) = A + B log τ; C, w drift with τ."""
    H, M, nS = cfg.model.H, cfg.model.M, len(cfg.model.subsets)
    tr = Trajectory.empty(cfg, H, M, nS)

    def rows(ts, stage, a):
        n = len(ts)
        z = lambda *s: np.zeros((n,) + s)  # noqa: E731
        C = 0.1 + np.outer(np.log1p(a**2), np.arange(1, nS + 1)) / 10
        w = np.broadcast_to(np.arange(H * M).reshape(H, M), (n, H, M)) * a[:, None, None] / 10
        tr.append(ts=ts, stage=np.full(n, stage), w=w, C=C, a=a, loss=1 / (1 + a**2), loss_se=z(),
                  unseen=z(), grad_w=z(H, M), grad_C=z(nS), grad_a=z(), grad_se_w=z(H, M),
                  grad_se_C=z(nS), grad_se_a=z(), grad_norm=z())  # fmt: skip

    rows(np.zeros(1), 1, np.array([a0]))
    t0 = 0.0
    for k, (name, length) in enumerate(zip(NAMES, lengths)):
        tau = np.append(GRID[GRID < length], length)
        A, B = _coef(r, k)
        rows(t0 + tau, k + 1, A + B * np.log(tau))
        tr.stages.append(StageRecord(name=name, moves=[], t0=t0, t1=t0 + length, ended_by="event", complete=True,
                                     selected=[1, 2] if name == "II" else None))  # fmt: skip
        t0 += length
    tr.status = "complete"
    return tr


LENGTHS = [(3.7, 250.0, 50.0), (2.2, 900.0, 50.0), (8.0, 40.0, 50.0)]
A0 = [0.01, 0.02, 0.03]


def test_bands_of_known_trajectories():
    """Three replicates whose stages end at different τ: on each stage's clock
    the band grid is τ = 0, the shared saved grid and every replicate's end;
    a replicate counts until its stage ends; values are exact at saved τ and
    linear in log τ between (exact for a, linear in log τ; the loss is
    compared where every replicate saved); mean and std
    (ddof = 1) over the replicates present are the closed forms."""
    trajs = [_fake(TINY, r, LENGTHS[r], A0[r]) for r in range(3)]
    b = bands(trajs)
    assert list(b) == list(NAMES)
    for k, name in enumerate(NAMES):
        sb = b[name]
        ends = [ln[k] for ln in LENGTHS]
        want = np.unique(np.concatenate([[0.0], GRID[GRID < max(ends)], ends]))
        np.testing.assert_allclose(sb.tau, want, rtol=1e-12)
        np.testing.assert_array_equal(sb.length, ends)
        for j, tau in enumerate(sb.tau):
            present = [r for r in range(3) if tau <= ends[r] * (1 + 1e-9)]
            assert sb.count[j] == len(present)
            if tau == 0:  # the stage's start: the previous stage's end (or the initial state)
                a = [A0[r] if k == 0 else sum(_coef(r, k - 1) * np.array([1, math.log(LENGTHS[r][k - 1])]))
                     for r in present]  # fmt: skip
            else:
                a = [_coef(r, k)[0] + _coef(r, k)[1] * math.log(tau) for r in present]
            a = np.array(a)
            assert sb.mean["a"][j] == pytest.approx(a.mean(), rel=1e-10)
            if tau == 0 or np.any(np.isclose(GRID, tau, rtol=1e-12)):  # saved by every replicate present
                assert sb.mean["loss"][j] == pytest.approx(np.mean(1 / (1 + a**2)), rel=1e-10)
            if len(a) > 1:
                assert sb.std["a"][j] == pytest.approx(a.std(ddof=1), rel=1e-8)
                assert sb.sem["a"][j] == pytest.approx(a.std(ddof=1) / math.sqrt(len(a)), rel=1e-8)
            else:
                assert np.isnan(sb.std["a"][j])
            assert sb.min["a"][j] == pytest.approx(a.min()) and sb.max["a"][j] == pytest.approx(a.max())
            for r in range(3):
                assert np.isfinite(sb.values["a"][r, j]) == (r in present)
        # at a replicate's own saved rows, c/Σc and s are its own (no interpolation)
        for r, tr in enumerate(trajs):
            idx = np.flatnonzero(tr.stage == k + 1)
            tau_r = tr.ts[idx] - tr.stages[k].t0
            for i, t in zip(idx, tau_r):
                j = sb.at(t)
                np.testing.assert_allclose(sb.values["c_frac"][r, j], tr.c_frac[i], rtol=1e-12)
                np.testing.assert_allclose(sb.values["s"][r, j], tr.s[i], rtol=1e-12)
            np.testing.assert_allclose(sb.end["a"][r], tr.a[idx[-1]], rtol=1e-15)
    assert b["II"].selected == [(1, 2)] * 3 and b["I"].ended_by == ["event"] * 3


def test_bands_explicit_grid_and_single_replicate():
    trajs = [_fake(TINY, r, LENGTHS[r], A0[r]) for r in range(2)]
    b = bands(trajs, tau={"I": np.array([0.0, 1.0, 3.0])})
    A, B = np.array([_coef(r, 0) for r in range(2)]).T
    # τ = 3: only replicate 0 (Stage I length 3.7) is still in Stage I
    np.testing.assert_allclose(b["I"].values["a"][:, 1], A + B * math.log(1.0))
    assert b["I"].count.tolist() == [2, 2, 1]
    assert np.isnan(b["I"].std["a"][2])
    one = bands(trajs[:1])
    assert np.all(np.isnan(one["III"].std["a"])) and np.all(one["III"].count == 1)


def test_summaries_and_row_spread():
    """Numbers: mean, std (ddof = 1), min, max over the finite ones; lists
    elementwise; anything else: counts of distinct values; rows matched by
    name with pass/fail/info counts."""
    s = summarize([1.0, 2.0, 4.0, None, float("nan")])
    assert s == {"mean": pytest.approx(7 / 3), "std": pytest.approx(np.std([1, 2, 4], ddof=1)), "min": 1.0,
                 "max": 4.0, "n": 3}  # fmt: skip
    s = summarize([[1, 2], [3, 6]])
    assert s["mean"] == [2.0, 4.0] and s["std"] == pytest.approx([math.sqrt(2), math.sqrt(8)])
    assert summarize(["{1,2}", "{1,2}", "{2}"]) == {"values": {"{1,2}": 2, "{2}": 1}}
    reps = [
        {"rows": [{"name": "x", "predicted": 1.0, "measured": 1.1, "tolerance": 0.2, "passed": True},
                  {"name": "w", "predicted": "{1,2}", "measured": "{1,2}", "tolerance": "exact", "passed": True}]},
        {"rows": [{"name": "x", "predicted": 1.0, "measured": 1.5, "tolerance": 0.2, "passed": False},
                  {"name": "w", "predicted": "{1,2}", "measured": "{2,3}", "tolerance": "exact", "passed": False},
                  {"name": "i", "predicted": 1.0, "measured": 2.0, "tolerance": "info: …", "passed": None}]},
        None,
    ]  # fmt: skip
    sp = {r.name: r for r in row_spread(reps)}
    assert list(sp) == ["x", "w", "i"]
    assert (sp["x"].n, sp["x"].passed, sp["x"].failed, sp["x"].info) == (2, 1, 1, 0)
    assert sp["x"].measured["mean"] == pytest.approx(1.3) and sp["x"].predicted["std"] == 0.0
    assert sp["w"].measured == {"values": {"{1,2}": 1, "{2,3}": 1}}
    assert (sp["i"].n, sp["i"].info) == (1, 1)
    json.dumps([r.to_json() for r in sp.values()])


def test_seeds():
    assert replicate_seeds(TINY, 3) == [0, 1, 2]
    assert replicate_seeds(TINY.replace(estimator={"seed": 7}), 2) == [7, 8]
    assert replicate_seeds(TINY, 2, base_seed=100) == [100, 101]
    with pytest.raises(ValueError, match=r"number of replicates R must be an integer >= 1, got 0"):
        replicate_seeds(TINY, 0)


# ---------------------------------------------------------------------------
# Real runs
# ---------------------------------------------------------------------------


def test_run_replicates_are_the_single_runs(tmp_path):
    """Replicate r is `gflow run` with estimator.seed = base + r (to
    rounding: the three run as one vmapped batch), written to out/rep00r; the
    summaries are written and read back; existing replicate folders are
    refused before anything runs, and reused with resume (in their batch),
    while the missing ones are integrated."""
    out = tmp_path / "reps"
    res = run_replicates(TINY, 3, out=out, base_seed=5)  # R = 3: the batch size of the tests below (one compilation)
    assert res.seeds == [5, 6, 7] and [tr.seed for tr in res.trajectories] == [5, 6, 7]
    assert res.batches == [[0, 1, 2]]
    single = gflow.integrate(TINY.replace(estimator={"seed": 6}))
    _assert_same_run(res.trajectories[1], single)
    assert sorted(p.name for p in out.iterdir()) == ["bands.npz", "rep000", "rep001", "rep002", "replicates.json",
                                                     "replicates.md"]  # fmt: skip
    summ = json.loads((out / "replicates.json").read_text())
    assert summ["seeds"] == [5, 6, 7] and summ["R"] == 3 and set(summ["bands"]) == {"I", "II", "III"}
    with np.load(out / "bands.npz") as z:
        np.testing.assert_allclose(z["III/a/values"], res.bands["III"].values["a"])
        assert z["I/c_frac/mean"].shape == (len(res.bands["I"].tau), len(TINY.model.subsets))
    # the samples differ, so the bands have a width; at τ = 0 of Stage I (the
    # common initialisation) a has none
    assert np.all(res.bands["III"].std["a"][1:] > 0) and res.bands["I"].std["a"][0] == 0
    back = load_replicates(out)
    assert back.seeds == [5, 6, 7]
    np.testing.assert_array_equal(back.bands["II"].values["loss"], res.bands["II"].values["loss"])
    assert back.batches == [[0, 1, 2]] and "batches of replicates (vmapped) 3 in" in back.table()
    with pytest.raises(ValueError, match=r"replicate folders already hold runs .*rep000"):
        run_replicates(TINY, 4, out=out, base_seed=5)
    assert not (out / "rep003").exists()
    # in batches of three: the three complete runs resumed as one batch (reused as they are), then rep003
    again = run_replicates(TINY, 4, out=out, base_seed=5, resume=True, batch=3)
    assert again.batches == [[0, 1, 2], [3]] and again.seeds == [5, 6, 7, 8]
    for r in range(3):
        np.testing.assert_array_equal(again.trajectories[r].a, res.trajectories[r].a)
    np.testing.assert_array_equal(again.trajectories[3].a, gflow.integrate(TINY.replace(estimator={"seed": 8})).a)


def test_failed_replicate_is_kept(tmp_path):
    """With ε = 0 and tokens absent from a context the loss is infinite and
    every replicate fails at the start of Stage I: each is kept with its
    status, the others still run, and `gflow run --replicates` exits with 1."""
    bad = TINY.replace(estimator={"eps": 0.0})
    res = run_replicates(bad, 3, out=tmp_path / "a")
    assert res.failed == [0, 1, 2] and res.batches == [[0, 1, 2]]
    assert all(tr.status.startswith("failed: Stage I at t = 0: the gradient") for tr in res.trajectories)
    assert len(res.notes) == 3 and "replicate 1 (seed 1) failed: Stage I failed at t = 0" in res.notes[1]
    assert res.bands["I"].count.tolist() == [3]  # only the initial state
    toml = tmp_path / "bad.toml"
    toml.write_text("[data]\nL = 20\n[estimator]\nN = 200\neps = 0.0\n[schedule]\ndurations = [2.0, 2.0, 2.0]\n"
                    "[solver]\nsave_per_decade = 3\ntau_min = 0.5\n")  # fmt: skip
    # exit 3: the integration failed
    assert main(["run", str(toml), "--out", str(tmp_path / "b"), "--replicates", "3", "--quiet"]) == 3


def test_cli_run_replicates_with_checks(tmp_path):
    """`gflow run CONFIG --replicates 2`: two checked replicate folders and the
    spread of every check row across them."""
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(
        "[data]\nL = 20\n[estimator]\nN = 200\n[schedule]\ndurations = [2.0, 2.0, 2.0]\n"
        "[solver]\nsave_per_decade = 3\ntau_min = 0.5\n"
    )
    out = tmp_path / "run"
    # one at a time (the batched path is tested above and below; here the check reports and the option)
    assert main(["run", str(cfg), "--out", str(out), "--replicates", "2", "--replicates-batch", "1", "--no-plot",
                 "--quiet"]) == 0  # fmt: skip
    for r in range(2):
        rep = json.loads((out / f"rep00{r}" / "report.json").read_text())
        assert rep["rows"]
    summ = json.loads((out / "replicates.json").read_text())
    names = [row["name"] for row in json.loads((out / "rep000" / "report.json").read_text())["rows"]]
    assert [c["name"] for c in summ["checks"]][: len(names)] == names
    assert all(c["passed"] + c["failed"] + c["info"] == c["n"] for c in summ["checks"])
    assert "check rows across replicates" in (out / "replicates.md").read_text()
    assert summ["batches"] == [[0], [1]]
    # replicate folders exist: refused, with exit code 2 and the reason
    assert main(["run", str(cfg), "--out", str(out), "--replicates", "2", "--no-plot", "--quiet"]) == 2
    assert main(["run", str(cfg), "--out", str(tmp_path / "x"), "--replicates-batch", "2", "--quiet"]) == 2
    assert main(["run", str(cfg), "--out", str(tmp_path / "x"), "--replicates", "2", "--replicates-batch", "0",
                 "--quiet"]) == 2  # fmt: skip
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------
# Vmapped batches (gflow/vmapped.py)
# ---------------------------------------------------------------------------

# TINY with Stage I ending at its event, at a different time for each seed:
# seeds 1, 2, 3 reach it at t ≈ 9.9, 8.0, 4.6. With τ from 0.1 and three saved
# points a decade, a stage's solves cover τ ∈ (0, 0.46], (0.46, 4.6], (4.6, 46]:
# seed 3's event falls in the second solve, the others' in the third (seed 3
# idles through it). Stage II runs its whole duration, on each replicate's own
# clock. Same shapes and solver settings as TINY: the same compiled solves.
EVENTS = TINY.replace(schedule={"durations": [100.0, 100.0, 2.0]}, solver={"tau_min": 0.1})
SEEDS = [1, 2, 3]


def _cfgs(seeds=SEEDS, base=EVENTS):
    return [base.replace(estimator={"seed": s}) for s in seeds]


def _assert_same_run(b: Trajectory, s: Trajectory):
    """`b` is the run `s` to rounding: the same saved times and stages, values
    within 1e-9 of each array's scale (in practice ~1e-12: under vmap each
    replicate takes the steps it takes alone, with batched arithmetic).

    Accepted steps agree exactly in Stage I; in the later stages they may
    differ by one per solve: in Stage II w barely moves, the error estimate
    of a step is at the level of rounding, and rounding can decide whether a
    solve takes one step or two (seeds 2 and 3 here: 5 steps batched, 6 alone)."""
    assert b.status == s.status
    assert b.ts.shape == s.ts.shape
    np.testing.assert_allclose(b.ts, s.ts, rtol=1e-9)
    np.testing.assert_array_equal(b.stage, s.stage)
    for k in ("w", "C", "a", "loss", "loss_se", "unseen", "grad_w", "grad_C", "grad_a", "grad_se_C", "grad_norm"):
        x, y = getattr(b, k), getattr(s, k)
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-9 * np.max(np.abs(y)), err_msg=k)
    assert len(b.stages) == len(s.stages)
    for rb, rs in zip(b.stages, s.stages):
        assert (rb.name, rb.ended_by, rb.complete, rb.selected) == (rs.name, rs.ended_by, rs.complete, rs.selected)
        assert rb.t0 == pytest.approx(rs.t0, rel=1e-9, abs=1e-12) and rb.t1 == pytest.approx(rs.t1, rel=1e-9)
        n_solves = -(-int(np.sum(s.stage == {"I": 1, "II": 2, "III": 3}[rs.name])) // EVENTS.solver.save_per_decade)
        assert abs(rb.steps - rs.steps) <= (0 if rs.name == "I" else n_solves), (rs.name, rb.steps, rs.steps)


@pytest.fixture(scope="module")
def sequential():
    """`gflow.integrate` of each seed."""
    return [gflow.integrate(c) for c in _cfgs()]


@pytest.fixture(scope="module")
def batched():
    """The three seeds as one vmapped batch."""
    return integrate_batch(_cfgs())


def test_batch_is_the_single_runs(sequential, batched, tmp_path):
    """A vmapped batch of three replicates gives the three runs of
    `gflow.integrate`: times, states, loss and gradient statistics, and each
    stage's start, end, how it ended and its accepted steps."""
    for b, s in zip(batched, sequential):
        _assert_same_run(b, s)
    # written like gflow.integrate's folders; existing ones refused
    outs = [tmp_path / f"r{r}" for r in range(3)]
    gflow.runs.integrate_batch_with_errors(_cfgs(), outs=outs)
    _assert_same_run(gflow.load(outs[2]), sequential[2])
    with pytest.raises(ValueError, match=r"already holds a run"):
        integrate_batch(_cfgs(), outs=outs)
    with pytest.raises(ValueError, match=r"differ only in estimator.seed; configs\[1\] differs .* in data.L"):
        integrate_batch([EVENTS, EVENTS.replace(data={"L": 21})])


def test_batch_replicates_keep_their_own_events_and_clocks(sequential, batched):
    """Stage I ends at each replicate's own event (three different times;
    seed 3 in an earlier solve than the others, after which it idles in
    zero-length solves without moving), and each later stage saves on its own
    clock: at t0_r + τ for the shared τ grid. The solver statistics are the
    replicate's own (steps) or the batch's (nfev: evaluations of the batched
    field, the same for every replicate, at least each single run's)."""
    ends = [tr.stages[0].t1 for tr in batched]
    assert [tr.stages[0].ended_by for tr in batched] == ["event"] * 3
    assert len(set(np.round(ends, 6))) == 3 and ends[2] < 4.64 < min(ends[:2])
    assert [tr.stages[0].t1 for tr in batched] == pytest.approx([tr.stages[0].t1 for tr in sequential], rel=1e-12)
    last = [tr.ts[tr.stage == 1][-1] for tr in batched]
    assert last == pytest.approx(ends, rel=1e-15)  # the event is the stage's last saved row
    # seed 3 saved nothing after its event (its last Stage I row is its event time)
    assert np.sum(batched[2].stage == 1) < np.sum(batched[0].stage == 1)
    taus = [tr.ts[tr.stage == 2] - tr.stages[1].t0 for tr in batched]
    for tau in taus[1:]:
        np.testing.assert_allclose(tau, taus[0], rtol=1e-12)
    for k in range(3):
        nf = {tr.stages[k].nfev for tr in batched}
        assert len(nf) == 1
    assert batched[0].stages[0].nfev >= max(tr.stages[0].nfev for tr in sequential)


def test_batch_replicate_that_fails_leaves_the_others(monkeypatch, sequential):
    """A replicate whose stage cannot start (ε = 0 in its loss only: the
    gradient is infinite) is marked failed as `gflow.integrate` would mark
    it, without raising; the others of its batch run on, unchanged, and
    `run_replicates` reports the failure."""
    make = vmapped.make_loss

    def make_loss(data, model, estimator):
        L = make(data, model, estimator)
        return eqx.tree_at(lambda L: L.eps, L, L.eps * 0) if estimator.seed == 2 else L

    monkeypatch.setattr(vmapped, "make_loss", make_loss)
    res = run_replicates(EVENTS, 3, base_seed=1, batch=3)
    assert res.failed == [1] and res.batches == [[0, 1, 2]]
    bad = res.trajectories[1]
    assert bad.status.startswith("failed: Stage I at t = 0: the gradient of the loss is not finite")
    assert [(s.name, s.ended_by) for s in bad.stages] == [("I", "failed")] and len(bad.ts) == 1
    assert len(res.notes) == 1 and res.notes[0].startswith("replicate 1 (seed 2) failed: Stage I failed at t = 0")
    _assert_same_run(res.trajectories[0], sequential[0])
    _assert_same_run(res.trajectories[2], sequential[2])


@pytest.mark.slow
def test_batch_replicate_whose_solve_fails_leaves_the_others():
    """A replicate whose solve fails mid-stage fails alone: with 33 steps a
    solve, seeds 1 and 3 (34 steps in their second Stage I solve) fail as
    `gflow.integrate` fails them, with the same status and partial
    trajectory, while seed 2 (33 steps) runs on in the same batch to the end
    and is its single run. (New solver settings: one compilation of the
    single and of the batched solves, ~1 min.)"""
    # (without the stiff switch: a single run would go on with kvaerno5, a batch does not switch)
    cfgs = _cfgs(base=EVENTS.replace(solver={"max_steps": 33, "stiff_switch": False}))
    seq = []
    for c in cfgs:
        try:
            seq.append(gflow.integrate(c))
        except gflow.FlowError as e:
            seq.append(e.trajectory)
    got, errors = gflow.runs.integrate_batch_with_errors(cfgs)
    assert [e is None for e in errors] == [False, True, False]
    assert "maximum number of solver steps" in str(errors[0])
    for b, s in zip(got, seq):
        _assert_same_run(b, s)
    assert got[0].status.startswith("failed: Stage I at t = 4.547") and got[1].status == "complete"


def test_batch_groups_stage_II_by_selected_set(monkeypatch, sequential):
    """Stage II's event heads are static: replicates that selected different
    sets run as different batches (here a forced split: seed 2 "selects"
    {1}; its Stage II runs alone and ends by its duration all the same), and
    all are together again in Stage III."""
    monkeypatch.setattr(vmapped, "stage1_selection", lambda tr: [1] if tr.seed == 2 else [1, 2])
    got = integrate_batch(_cfgs())
    assert [tr.stages[1].selected for tr in got] == [(1, 2), (1,), (1, 2)]
    for b, s in zip(got, sequential):
        b.stages[1].selected = s.stages[1].selected
        _assert_same_run(b, s)


def _interrupted(cfg, out, n_solves):
    """`gflow.integrate` of `cfg` into `out`, interrupted (SIGINT) after its `n_solves`-th solve:
    the folder holds the snapshot of that solve, marked "interrupted", with its controller state."""
    settle = gflow.dynamics._flow.StageRun.settle
    count = [0]

    def interrupt_after(run, outcome):
        settle(run, outcome)
        count[0] += 1
        if count[0] == n_solves:
            raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gflow.dynamics._flow.StageRun, "settle", interrupt_after)
        with pytest.raises(KeyboardInterrupt):
            gflow.integrate(cfg, out=out)
    return gflow.load(out)


def test_resumed_replicates_run_as_a_batch(tmp_path, monkeypatch, sequential):
    """Replicates interrupted at different points (seeds 1 and 2 in Stage I,
    after one and two solves; seed 3 in Stage II, after its first solve there)
    are resumed by `run_replicates(resume=True)` as one vmapped batch, each
    from its own saved state, time and step-size controller (seed 3 idles
    through Stage I): each is the single path's resumed run of the same
    folder, and the uninterrupted run, to rounding. The single driver is
    never called: no replicate resumes one by one."""
    out = tmp_path / "reps"
    where = {}
    for r, (cfg, n) in enumerate(zip(_cfgs(), (1, 2, 3))):
        part = _interrupted(cfg, out / f"rep00{r}", n)
        where[r] = [(s.name, s.complete) for s in part.stages]
        assert part.status == "interrupted" and part.controller is not None
        shutil.copytree(out / f"rep00{r}", tmp_path / f"single{r}")
    assert where == {0: [("I", False)], 1: [("I", False)], 2: [("I", True), ("II", False)]}
    single = [gflow.integrate(c, out=tmp_path / f"single{r}", resume=True) for r, c in enumerate(_cfgs())]

    def boom(*a, **k):
        raise AssertionError("a resumed replicate took the single path")

    monkeypatch.setattr(vmapped, "integrate", boom)
    monkeypatch.setattr(vmapped, "run_stage", boom)
    res = run_replicates(EVENTS, 3, base_seed=1, out=out, resume=True)
    assert res.batches == [[0, 1, 2]] and res.failed == []
    diff = 0.0
    for b, s, u in zip(res.trajectories, single, sequential):
        _assert_same_run(b, s)
        _assert_same_run(b, u)
        diff = max(diff, *(float(np.max(np.abs(getattr(b, k) - getattr(s, k)))) for k in ("ts", "w", "C", "a", "loss")))
        assert b.controller["stage"] == "III" and b.wall > 0
    assert diff <= 1e-9
    for r in range(3):  # written to the folders
        _assert_same_run(gflow.load(out / f"rep00{r}"), single[r])


@pytest.fixture(scope="module")
def chunked(tmp_path_factory):
    """Four replicates in vmapped batches of three: seeds 1, 2, 3 together
    (the batch size compiled above), then seed 4 alone."""
    return run_replicates(EVENTS, 4, base_seed=1, batch=3, out=tmp_path_factory.mktemp("chunked"))


def test_run_replicates_in_chunks(chunked, batched, sequential):
    """R = 4 in batches of three: the first three are the batch of three,
    written to the usual folders; the last chunk, of one, is `gflow.integrate`."""
    assert chunked.batches == [[0, 1, 2], [3]] and chunked.seeds == [1, 2, 3, 4]
    for c, b in zip(chunked.trajectories, batched):
        _assert_same_run(c, b)
    last = gflow.integrate(EVENTS.replace(estimator={"seed": 4}))
    for k in ("ts", "w", "C", "a", "loss"):
        np.testing.assert_array_equal(getattr(chunked.trajectories[3], k), getattr(last, k))
    _assert_same_run(gflow.load(chunked.dirs[1]), sequential[1])
    assert chunked.wall[0] == chunked.wall[1] == chunked.wall[2] != chunked.wall[3]
    assert "batches of replicates (vmapped) 3 in" in chunked.table()


@pytest.mark.slow
def test_run_replicates_in_chunks_of_two(batched):
    """R = 3 in batches of two (seeds 1, 2 together, then seed 3 alone) gives
    the batch of three. (A new batch size: one more compilation, ~30 s.)"""
    res = run_replicates(EVENTS, 3, base_seed=1, batch=2)
    assert res.batches == [[0, 1], [2]]
    for c, b in zip(res.trajectories, batched):
        _assert_same_run(c, b)


def test_run_replicates_bands_batched_and_sequential(chunked):
    """The bands of vmapped replicates are those of the sequential path
    (``batch=1``): the same τ grids and counts, values to rounding."""
    seq = run_replicates(EVENTS, 4, base_seed=1, batch=1)
    assert seq.batches == [[0], [1], [2], [3]]
    assert list(seq.bands) == list(chunked.bands) == ["I", "II", "III"]
    for name, sb in seq.bands.items():
        cb = chunked.bands[name]
        np.testing.assert_allclose(cb.tau, sb.tau, rtol=1e-9)
        np.testing.assert_array_equal(cb.count, sb.count)
        np.testing.assert_allclose(cb.length, sb.length, rtol=1e-9)
        assert cb.ended_by == sb.ended_by and cb.selected == sb.selected
        for q in ("c_frac", "s", "a", "loss"):
            tol = 1e-9 * np.nanmax(np.abs(sb.values[q]))  # the quantity's scale (a std can be ~0)
            np.testing.assert_allclose(cb.values[q], sb.values[q], rtol=0, atol=tol, err_msg=f"{name} {q}")
            for stat in ("mean", "std", "min", "max"):
                x, y = getattr(cb, stat)[q], getattr(sb, stat)[q]
                np.testing.assert_allclose(x, y, rtol=0, atol=tol, err_msg=f"{name} {q} {stat}")
    assert seq.bands["I"].count.tolist()[-1] == 1  # only seed 1 (t ≈ 9.9) reaches the last τ of Stage I


def test_sample_bytes_and_default_batch():
    """`sample_bytes` is the size of a sample's features (counted from the
    arrays of `make_loss`, both layouts; the integers are counted as 8
    bytes, an upper bound), and the default batch is as many samples as fit
    in 2 GiB."""
    for layout in ("counts", "positions"):
        cfg = TINY.replace(estimator={"layout": layout})
        L = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
        nbytes = sum(x.nbytes for x in jax.tree.leaves(L.feats))
        assert nbytes <= sample_bytes(cfg) <= 1.1 * nbytes, (layout, nbytes, sample_bytes(cfg))
    paper = gflow.Config()  # d = 3, M = 3, N = 10⁴, counts: 10⁴·(3·4³·8 + 8 + 3·8) bytes
    assert sample_bytes(paper) == 10_000 * 1568
    assert default_batch(paper, 10) == 10 and default_batch(paper, 10, budget=5 * 15_680_000) == 5
    big = paper.replace(estimator={"N": 10**6})
    assert SAMPLE_BUDGET == 2 * 2**30 and default_batch(big, 10) == 1
    with pytest.raises(ValueError, match=r"batch must be an integer >= 1"):
        run_replicates(TINY, 2, batch=0)


# ---------------------------------------------------------------------------
# The N^{-1/2} law
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_bands_shrink_like_inverse_sqrt_N():
    """The spread across replicates of c_S*/Σc at the end of Stage I and of a
    at the end of Stage III (fixed saved times on the stages' clocks) is
    ∝ N^{-1/2}: the log-log slope of the band width (std over R = 16
    replicates) against N = 125, 500, 2000 is −1/2.

    Tolerance: with R replicates, log(std) has a sampling standard deviation
    ≈ 1/√(2(R−1)) = 0.18 (Gaussian values); the least-squares slope over
    three sizes a factor 4 apart then has a standard error
    0.18/(ln 4·√2) = 0.093; we allow 3 of them (0.28), which also covers the
    O(N^{-1}) corrections to the delta method at N = 125.

    The loss band is printed but not asserted: at L = 20 and α = 0.1 many
    targets are absent from the context and cost −log ε ≈ 13.8 each, so the
    per-sequence loss is heavy-tailed (kurtosis ≈ 100) and the std of 16
    replicates at N = 125 underestimates the spread. Measured at the
    initialisation (no flow): the std of L̂ over 200 seeds falls with slope
    −0.47 over these sizes, over the first 16 seeds with slope −0.38 (and
    the loss band of this test with −0.36).
    """
    R = 16
    sizes = (125, 500, 2000)
    iS = TINY.model.subsets.index((1, 2))
    widths = {"c_frac": [], "a": [], "loss": []}
    for N in sizes:
        res = run_replicates(TINY.replace(estimator={"N": N}), R)
        b1, b3 = res.bands["I"], res.bands["III"]
        assert np.all(b1.count == R) and np.all(b3.count == R)
        assert b1.tau[-1] == pytest.approx(2.0) and b3.tau[-1] == pytest.approx(2.0)
        widths["c_frac"].append(b1.std["c_frac"][-1, iS])
        widths["a"].append(b3.std["a"][-1])
        widths["loss"].append(b3.std["loss"][-1])
    se = 1 / math.sqrt(2 * (R - 1)) / (math.log(4) * math.sqrt(2))
    slopes = {q: np.polyfit(np.log(sizes), np.log(w), 1)[0] for q, w in widths.items()}
    for q, w in widths.items():
        print(f"{q}: widths {np.round(w, 6).tolist()}, log-log slope {slopes[q]:.3f} (SE {se:.3f})")
    for q in ("c_frac", "a"):
        assert abs(slopes[q] + 0.5) <= 3 * se, (q, widths[q], slopes[q])
