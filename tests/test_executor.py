"""Issue 30: a grid's points on an executor (gflow/runs/_executor.py).

- bad ``executor`` specs are a ``ValueError`` naming ``--executor`` before anything is computed;
- in-process workers (every task's function, arguments and result through pickle; the results
  arriving in reverse order) give the serial run's ``phase.csv`` byte for byte, and its sweep,
  replicates and evaluation numbers bit for bit;
- a lost worker's point is submitted again; a point lost for good leaves nothing of itself in the
  folder, the grid raises ``GridIncomplete`` with every other point written, and running it again
  gives the serial ``phase.csv``;
- (``-m cluster``, real engines: CI runs them) a Dask ``LocalCluster`` of two worker processes and
  a spawned process pool give the serial run's files; a worker process killed (SIGKILL) after
  computing its point loses nothing: Dask retries it, a broken pool's point is recomputed by the
  next run.
"""

from __future__ import annotations

import concurrent.futures
import json
import pickle
import queue
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np
import pytest

import gflow
from gflow.cli import main
from gflow.runs import GridIncomplete
from gflow.runs._executor import RETRIES, check_executor, folder_files
from gflow.runs._phase import run_phase
from gflow.trajectory import _ARRAYS

TINY = gflow.Config().replace(
    data={"L": 20},
    estimator={"N": 200},
    schedule={"durations": [2.0, 2.0, 2.0]},
    solver={"save_per_decade": 3, "tau_min": 0.5},
)
TINY_TOML = (
    "[data]\nL = 20\n[estimator]\nN = 200\n[schedule]\ndurations = [2.0, 2.0, 2.0]\n"
    "[solver]\nsave_per_decade = 3\ntau_min = 0.5\n"
)
N_PI = 200
GRID = ["init.w_plus=1,3", "data.alpha=0.1,0.3"]  # the grid of tests/test_phase.py: both phases


class KilledWorker(Exception):
    """Named as Dask's: a task whose worker died."""


class InProcessWorkers:
    """An executor in this process that behaves like remote workers where it matters here: each
    task's function and arguments, and its result, go through pickle; the first `n` tasks are
    held and then run in reverse order (results arrive out of grid order); `lose` = {index:
    times}: that point's task fails that many times with a lost worker's exception first."""

    def __init__(self, n: int, lose: dict[int, int] | None = None):
        self.n, self.lose, self.held, self.started = n, dict(lose or {}), [], False
        self.runs: list[int] = []
        self.q: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        threading.Thread(target=self._work, daemon=True).start()

    def submit(self, fn, *args):
        fut = concurrent.futures.Future()
        item = (fut, pickle.dumps((fn, args)))
        with self.lock:
            if self.started:
                self.q.put(item)
            else:
                self.held.append(item)
                if len(self.held) >= self.n:
                    self.started = True
                    for it in reversed(self.held):
                        self.q.put(it)
        return fut

    def _work(self):
        while True:
            fut, blob = self.q.get()
            fn, args = pickle.loads(blob)
            k = args[-1].get("index") if isinstance(args[-1], dict) else None
            if not fut.set_running_or_notify_cancel():
                continue
            if self.lose.get(k, 0) > 0:
                self.lose[k] -= 1
                fut.set_exception(KilledWorker(f"worker lost while running point {k}"))
                continue
            self.runs.append(k)
            try:
                fut.set_result(pickle.loads(pickle.dumps(fn(*args))))
            except BaseException as e:  # noqa: BLE001 (handed to the coordinator, as a pool does)
                fut.set_exception(e)
                time.sleep(0.5)  # the coordinator cancels what has not started (a pool's workers are busy)


@pytest.fixture(scope="module")
def serial_grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial") / "grid"
    return out, run_phase(TINY, GRID, out, n_pi=N_PI, plot=False)


# ---------------------------------------------------------------------------
# Validation (no computation)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("processes:0", r"--executor 'processes:0': processes:N needs a positive integer N"),
        ("processes", r"processes:N needs a positive integer N"),
        ("dask-local:x", r"dask-local:N needs a positive integer N"),
        ("dask:", r"dask:ADDRESS needs the scheduler's address"),
        ("threads:2", r"--executor 'threads:2': unknown executor; allowed: serial, processes:N, dask-local:N, "
                      r"dask:ADDRESS"),
        (3, r"not a spec string and has no submit\(fn, \*args\) method"),
    ],
)
def test_bad_executor_before_any_computation(tmp_path, spec, msg):
    with pytest.raises(ValueError, match=msg):
        run_phase(TINY, GRID, tmp_path / "ph", n_pi=N_PI, executor=spec)
    assert not (tmp_path / "ph").exists()
    with pytest.raises(ValueError, match=msg):
        gflow.run_sweep(TINY, ["init.w_plus=1,3"], tmp_path / "sw", executor=spec)
    assert not (tmp_path / "sw").exists()
    with pytest.raises(ValueError, match=msg):
        gflow.run_replicates(TINY, 2, out=tmp_path / "reps", executor=spec)
    assert not (tmp_path / "reps").exists()


def test_cli_bad_executor_exit_2(tmp_path, capsys):
    toml = tmp_path / "t.toml"
    toml.write_text(TINY_TOML)
    for argv in (["phase", str(toml), "--param", "init.w_plus=1,3", "--out", str(tmp_path / "ph")],
                 ["sweep", str(toml), "--param", "init.w_plus=1,3", "--out", str(tmp_path / "sw")],
                 ["run", str(toml), "--replicates", "2", "--out", str(tmp_path / "reps")]):  # fmt: skip
        assert main([*argv, "--executor", "processes:-1"]) == 2
        err = capsys.readouterr().err
        assert "error: --executor 'processes:-1': processes:N needs a positive integer N" in err, err
    assert main(["run", str(toml), "--executor", "processes:2", "--out", str(tmp_path / "one")]) == 2
    assert "--executor needs --replicates R" in capsys.readouterr().err
    assert not any((tmp_path / d).exists() for d in ("ph", "sw", "reps", "one"))


def test_spec_forms():
    assert check_executor(None) == ("serial", None) == check_executor("serial")
    assert check_executor("processes:4") == ("processes", 4)
    pool = InProcessWorkers(1)
    assert check_executor(pool) == ("object", pool)
    pytest.importorskip("distributed")
    assert check_executor("dask-local:2") == ("dask-local", 2)
    assert check_executor("dask:tcp://10.0.0.1:8786") == ("dask", "tcp://10.0.0.1:8786")


# ---------------------------------------------------------------------------
# In-process workers: the serial run's files
# ---------------------------------------------------------------------------


def test_workers_give_the_serial_phase_csv(serial_grid, tmp_path):
    ref, serial = serial_grid
    pool = InProcessWorkers(4)
    seen = []
    res = run_phase(TINY, GRID, tmp_path / "ph", n_pi=N_PI, plot=False, executor=pool, on_point=seen.append)
    assert seen == [3, 2, 1, 0] and pool.runs == [3, 2, 1, 0]  # out of order, written as they came
    assert (tmp_path / "ph" / "phase.csv").read_bytes() == (ref / "phase.csv").read_bytes()
    assert res.rows == serial.rows
    for k in range(4):
        a, b = (json.loads((d / "points" / f"{k:05d}.json").read_text()) for d in (tmp_path / "ph", ref))
        assert a["theory"] == b["theory"] and a["point"] == b["point"]


def test_lost_worker_is_retried(serial_grid, tmp_path):
    ref, _ = serial_grid
    pool = InProcessWorkers(4, lose={1: RETRIES})  # lost twice, then computed
    run_phase(TINY, GRID, tmp_path / "ph", n_pi=N_PI, plot=False, executor=pool)
    assert pool.runs == [3, 2, 1, 0] or sorted(pool.runs) == [0, 1, 2, 3]
    assert pool.lose[1] == 0
    assert (tmp_path / "ph" / "phase.csv").read_bytes() == (ref / "phase.csv").read_bytes()


def test_point_lost_for_good_is_not_written_and_the_next_run_finishes(serial_grid, tmp_path):
    ref, _ = serial_grid
    out = tmp_path / "ph"
    pool = InProcessWorkers(4, lose={2: RETRIES + 1})
    with pytest.raises(GridIncomplete, match=r"1 point not computed, their workers lost \(indices \[2\]; "
                                             r"KilledWorker: worker lost while running point 2\)") as e:
        run_phase(TINY, GRID, out, n_pi=N_PI, plot=False, executor=pool)
    assert list(e.value.lost) == [2] and [r["index"] for r in e.value.result.rows] == [0, 1, 3]
    assert sorted(p.name for p in (out / "points").iterdir()) == ["00000.json", "00001.json", "00003.json"]
    lines = (out / "phase.csv").read_text().splitlines()
    ref_lines = (ref / "phase.csv").read_text().splitlines()
    assert lines == [ref_lines[i] for i in (0, 1, 2, 4)]  # the header and the three points, the serial rows
    seen = []
    run_phase(TINY, GRID, out, n_pi=N_PI, plot=False, executor=InProcessWorkers(1), on_point=seen.append)
    assert seen == [2]
    assert (out / "phase.csv").read_bytes() == (ref / "phase.csv").read_bytes()


def test_a_points_own_error_is_raised_after_the_running_points_are_written(tmp_path, monkeypatch):
    """Not a lost worker: the computation's exception reaches the caller; what finished is kept."""
    import gflow.runs._phase as ph

    real = ph.point_theory

    def fails_at_alpha_03(cfg, **kw):
        if cfg.data.alpha == 0.3 and cfg.init.w_plus == 3:
            raise FloatingPointError("a point's own failure")
        return real(cfg, **kw)

    monkeypatch.setattr(ph, "point_theory", fails_at_alpha_03)
    pool = InProcessWorkers(4)  # the failing point (3) runs first: the others are cancelled
    with pytest.raises(FloatingPointError, match="a point's own failure"):
        run_phase(TINY, GRID, tmp_path / "ph", n_pi=N_PI, plot=False, executor=pool)
    assert pool.runs == [3]  # the others were cancelled before they started
    assert not list((tmp_path / "ph" / "points").iterdir())


def _arrays(d):
    tr = gflow.load(d)
    return {k: getattr(tr, k) for k in _ARRAYS}


def _rows(report: dict) -> list:
    return [{k: v for k, v in r.items()} for r in report["rows"]]


def _same_run(a, b):
    """Two run folders hold the same trajectory (every array, bit for bit) and the same report rows."""
    xa, xb = _arrays(a), _arrays(b)
    assert all(np.array_equal(xa[k], xb[k], equal_nan=True) for k in _ARRAYS), [
        k for k in _ARRAYS if not np.array_equal(xa[k], xb[k], equal_nan=True)]  # fmt: skip
    ra, rb = (json.loads((d / "report.json").read_text()) for d in (a, b))
    assert _rows(ra) == _rows(rb) and ra["verdict"] == rb["verdict"]
    assert sorted(folder_files(a)) == sorted(folder_files(b))


@pytest.mark.slow
def test_workers_give_the_serial_sweep_replicates_and_evaluation(tmp_path):
    """Each grid function through in-process workers: the serial run's folders and numbers."""
    sw_s = gflow.run_sweep(TINY, ["init.w_plus=1,3"], tmp_path / "sw_s")
    sw_w = gflow.run_sweep(TINY, ["init.w_plus=1,3"], tmp_path / "sw_w", executor=InProcessWorkers(2))
    drop = lambda r: {k: v for k, v in r.items() if k != "wall_s"}  # noqa: E731
    assert [drop(r) for r in sw_w.rows] == [drop(r) for r in sw_s.rows]
    for r in sw_s.rows:
        _same_run(tmp_path / "sw_s" / r["dir"], tmp_path / "sw_w" / r["dir"])

    rp_s = gflow.run_replicates(TINY, 3, out=tmp_path / "rp_s", batch=2, check=True)
    rp_w = gflow.run_replicates(TINY, 3, out=tmp_path / "rp_w", batch=2, check=True, executor=InProcessWorkers(2))
    assert rp_w.batches == rp_s.batches == [[0, 1], [2]]
    for r in range(3):
        _same_run(tmp_path / "rp_s" / f"rep{r:03d}", tmp_path / "rp_w" / f"rep{r:03d}")
    assert rp_w.reports == rp_s.reports or all(
        _rows(a) == _rows(b) for a, b in zip(rp_w.reports, rp_s.reports))  # fmt: skip
    for name, b in rp_s.bands.items():
        for q, v in b.mean.items():
            assert np.array_equal(v, rp_w.bands[name].mean[q], equal_nan=True), (name, q)

    run = tmp_path / "sw_s" / sw_s.rows[1]["dir"]
    ev_s = gflow.evaluate(run, ["data.L=10,30"], out=tmp_path / "ev_s", plot=False)
    ev_w = gflow.evaluate(run, ["data.L=10,30"], out=tmp_path / "ev_w", plot=False, executor=InProcessWorkers(2))
    assert ev_w.rows == ev_s.rows
    assert (tmp_path / "ev_w" / "eval.csv").read_bytes() == (tmp_path / "ev_s" / "eval.csv").read_bytes()


# ---------------------------------------------------------------------------
# Real engines: worker processes (`-m cluster`; CI runs them)
# ---------------------------------------------------------------------------


class Killing:
    """Wraps an executor: the task of point `index` kills its worker process (SIGKILL) after computing
    its result, before returning it, the first time it runs (`marker` records the killed pid)."""

    def __init__(self, inner, marker, index):
        self.inner, self.marker, self.index = inner, str(marker), index

    def submit(self, fn, *args):
        from helpers import kill_worker_once

        return self.inner.submit(kill_worker_once, self.marker, self.index, fn, *args)


def _serial_flow_cli(tmp_path, toml, capsys):
    out = tmp_path / "serial"
    assert main(["phase", str(toml), "--param", "init.w_plus=1,3", "--flow", "--n-pi", str(N_PI), "--no-plot",
                 "--out", str(out), "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    return out


@pytest.mark.slow
@pytest.mark.cluster
def test_dask_local_flow_grid_is_the_serial_run(tmp_path, capsys):
    """The issue's "done when": ``gflow phase … --flow --executor dask-local:2`` writes the serial run's
    phase.csv byte for byte, and every point's run folder holds the same trajectory and report rows."""
    pytest.importorskip("distributed")
    toml = tmp_path / "t.toml"
    toml.write_text(TINY_TOML)
    ref = _serial_flow_cli(tmp_path, toml, capsys)
    out = tmp_path / "dask"
    assert main(["phase", str(toml), "--param", "init.w_plus=1,3", "--flow", "--n-pi", str(N_PI), "--no-plot",
                 "--out", str(out), "--quiet", "--executor", "dask-local:2"]) == 0  # fmt: skip
    assert (out / "phase.csv").read_bytes() == (ref / "phase.csv").read_bytes()
    runs = sorted(p.name for p in (ref / "runs").iterdir())
    assert runs == sorted(p.name for p in (out / "runs").iterdir()) and len(runs) == 2
    for name in runs:
        _same_run(ref / "runs" / name, out / "runs" / name)


@pytest.mark.slow
@pytest.mark.cluster
def test_killed_dask_worker_is_retried(serial_grid, tmp_path):
    """A Dask worker process SIGKILLed after computing point 1: Dask runs the point again on a
    worker that is alive; the grid is the serial one, byte for byte."""
    distributed = pytest.importorskip("distributed")
    ref, _ = serial_grid
    marker = tmp_path / "killed"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:  # fmt: skip
        run_phase(TINY, GRID, tmp_path / "ph", n_pi=N_PI, plot=False,
                  executor=Killing(client.get_executor(), marker, 1))  # fmt: skip
    assert marker.read_text().isdigit()  # a worker process was killed
    assert (tmp_path / "ph" / "phase.csv").read_bytes() == (ref / "phase.csv").read_bytes()


@pytest.mark.slow
@pytest.mark.cluster
def test_killed_pool_worker_loses_nothing(serial_grid, tmp_path):
    """A process pool's worker SIGKILLed after computing point 1 (before handing it back): the pool
    is broken, its unfinished points are lost, nothing of them is in the folder, the grid raises
    GridIncomplete; the same grid on a new pool (`processes:2`) computes only those and ends with
    the serial phase.csv."""
    ref, _ = serial_grid
    out, marker = tmp_path / "ph", tmp_path / "killed"
    with ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn")) as pool:
        with pytest.raises(GridIncomplete) as e:
            run_phase(TINY, GRID, out, n_pi=N_PI, plot=False, executor=Killing(pool, marker, 1))
    assert marker.read_text().isdigit()
    lost = sorted(e.value.lost)
    assert 1 in lost and "BrokenProcessPool" in str(e.value)
    assert sorted(p.name for p in (out / "points").iterdir()) == [f"{k:05d}.json" for k in range(4) if k not in lost]
    seen = []
    run_phase(TINY, GRID, out, n_pi=N_PI, plot=False, executor="processes:2", on_point=seen.append)
    assert sorted(seen) == lost
    assert (out / "phase.csv").read_bytes() == (ref / "phase.csv").read_bytes()
