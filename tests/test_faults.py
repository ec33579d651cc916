"""Issue 24: caches that cannot lie, outputs that are whole, one exit code for the unexpected, and
resume from the folder.

- the export cache (``GFLOW_CACHE/export``): each entry verified (its key, a SHA-256 of its bytes)
  before use; flipped bytes, a truncated file, another entry's bytes, or a program that fails when
  called are dropped with one line and the uncached path gives the same arrays;
- ``theory.json``: a tampered file (a* and C* doubled) is recomputed, never trusted;
- a run killed while drawing is not ``complete``, and ``gflow plot`` repairs it;
- an exception escaping gflow's handling exits 4 with one line, the traceback in ``DIR/gflow.log``
  and the run marked ``failed`` (resumable);
- ``gflow run --resume --out R`` without a configuration uses the saved one.
"""

from __future__ import annotations

import json
import shutil

import equinox as eqx
import jax
import numpy as np
import pytest
from equinox import _errors

import gflow
import gflow.dynamics._flow
import gflow.figures._plot
import gflow.runs
import gflow.runs._folder
from gflow._util import _export_cache, _io
from gflow.cli import main
from gflow.trajectory import _ARRAYS, WRITING, StageRecord, Trajectory, load, run_status, save

TINY_TOML = ("[data]\nL = 20\n[estimator]\nN = 200\n[schedule]\ndurations = [50.0, 1e10, 20.0]\n"
             "[solver]\nsave_per_decade = 3\n")  # fmt: skip


def _fresh_process_state():
    """What a new process would have: no program loaded, traced or warned about."""
    _export_cache._LOADED.clear()
    _export_cache._NOT_EXPORTABLE.clear()
    _export_cache._WARNED = False
    eqx.clear_caches()
    jax.clear_caches()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("EQX_ON_ERROR", raising=False)
    _fresh_process_state()
    yield tmp_path / "cache" / "export"
    _fresh_process_state()


def _arrays(d):
    tr = load(d)
    return {k: getattr(tr, k) for k in _ARRAYS}


def _faults(raw: bytes, other: bytes) -> dict[str, bytes]:
    """Damaged versions of a cache file: bytes flipped in its payload (16, spread), cut in half,
    replaced by another entry's bytes."""
    flipped = bytearray(raw)
    for i in np.linspace(len(raw) // 4, len(raw) - 1, 16).astype(int):
        flipped[i] ^= 0x5A
    return {"flipped": bytes(flipped), "truncated": raw[: len(raw) // 2], "replaced": other}


# ---------------------------------------------------------------------------
# The export cache, at the level of one call (fast)
# ---------------------------------------------------------------------------



def _killed_at_copier(real):
    """``atomic_savefig`` killed (SIGINT: KeyboardInterrupt) while the copier figure is written,
    its temporary left half-written; the other figures written by `real`."""

    def killed(fig, path, **kw):
        if path.name.startswith("copier"):
            _io._temporary(path).write_bytes(b"\x89PNG half")
            raise KeyboardInterrupt
        return real(fig, path, **kw)

    return killed

def test_damaged_entry_is_dropped_and_recomputed(tmp_path, monkeypatch, capsys):
    @eqx.filter_jit
    def f(x, *, scale):
        return jax.numpy.sin(x) * scale

    monkeypatch.setattr(_errors, "EQX_ON_ERROR", "nan")
    _fresh_process_state()
    _export_cache.enable_export_cache(tmp_path / "export")
    try:
        x = jax.numpy.linspace(0.0, 1.0, 5)
        ref = np.asarray(_export_cache.cached_call(f, (x,), {"scale": 2.0}))
        (path,) = list((tmp_path / "export").glob("*.jaxexport"))
        good = path.read_bytes()
        assert good.startswith(_export_cache.MAGIC)
        other = _export_cache._pack("0" * 32, good[len(_export_cache.MAGIC) + _export_cache._HEADER.size :])
        for name, bad in {**_faults(good, other), "empty": b"", "garbage": b"\x00" * 100}.items():
            path.write_bytes(bad)
            _fresh_process_state()
            got = np.asarray(_export_cache.cached_call(f, (x,), {"scale": 2.0}))
            np.testing.assert_array_equal(got, ref, err_msg=name)
            err = capsys.readouterr().err
            assert err.count("dropped the damaged program cache entry") == 1 and err.count("\n") == 1, (name, err)
            key = path.stem  # replaced by the next write: a whole, verified entry for its key
            _export_cache._unpack(key, path.read_bytes())
        # a program that deserializes but fails when called: dropped, the uncached call
        _fresh_process_state()
        _export_cache.cached_call(f, (x,), {"scale": 2.0})

        class Broken:
            def call(self, *a):
                raise RuntimeError("Failed to deserialize StableHLO")

        key = next(iter(_export_cache._LOADED))
        _export_cache._LOADED[key] = Broken()
        np.testing.assert_array_equal(np.asarray(_export_cache.cached_call(f, (x,), {"scale": 2.0})), ref)
        assert "calling it failed: RuntimeError" in capsys.readouterr().err
        assert not path.exists()  # dropped; the next process exports it again
    finally:
        _export_cache.disable_export_cache()
        _fresh_process_state()


# ---------------------------------------------------------------------------
# Whole runs through the command line
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_cache_faults_never_change_a_run(tmp_path, cache, capsys):
    """After a reference run, every cache file in turn (the exported programs, theory.json) is
    flipped, truncated or replaced by another file's bytes; each following run exits 0 with arrays
    equal to the reference (the check report too)."""
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_TOML)
    ref = tmp_path / "ref"
    assert main(["run", str(cfg), "--out", str(ref), "--no-plot", "--quiet"]) == 0
    want = _arrays(ref)
    report = json.loads((ref / "report.json").read_text())
    entries = sorted(cache.glob("*.jaxexport"))
    assert len(entries) >= 3
    outcomes = {}
    for i, entry in enumerate(entries):
        good = entry.read_bytes()
        for fault, bad in _faults(good, entries[(i + 1) % len(entries)].read_bytes()).items():
            entry.write_bytes(bad)
            _fresh_process_state()
            out = tmp_path / f"run_{i}_{fault}"
            rc = main(["run", str(cfg), "--out", str(out), "--no-plot", "--quiet"])  # the checks use a program too
            err = capsys.readouterr().err
            outcomes[(entry.name[:8], fault)] = rc
            assert rc == 0, err
            assert "dropped the damaged program cache entry" in err and "Traceback" not in err, err
            for k, v in _arrays(out).items():
                np.testing.assert_array_equal(v, want[k], err_msg=f"{entry.name} {fault} {k}")
            assert json.loads((out / "report.json").read_text())["theory"] == report["theory"]
            _export_cache._unpack(entry.stem, entry.read_bytes())  # rewritten whole, verified
    print("cache-fault outcomes (exit codes):", outcomes)


@pytest.mark.slow
def test_theory_json_faults_never_change_a_report(tmp_path, cache, capsys):
    """theory.json flipped, truncated, replaced, or well-formed with a*, C* and the limit loss
    doubled: `gflow check` recomputes it (exit 0) and the report's theory is the reference's."""
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_TOML)
    ref = tmp_path / "ref"
    assert main(["run", str(cfg), "--out", str(ref), "--no-plot", "--quiet"]) == 0
    report = json.loads((ref / "report.json").read_text())
    outcomes = {}
    th_path = ref / "theory.json"
    good = th_path.read_bytes()
    doubled = json.loads(good)
    for law in doubled["laws"].values():
        for k in ("a_star", "C_star", "limit_loss"):
            if law.get(k) is not None:
                law[k] *= 2
    for fault, bad in {**_faults(good, b"{}"), "doubled": json.dumps(doubled).encode()}.items():
        th_path.write_bytes(bad)
        rc = main(["check", str(ref)])
        capsys.readouterr()
        outcomes[("theory.json", fault)] = rc
        assert rc == 0
        again = json.loads((ref / "report.json").read_text())
        assert again["theory"] == report["theory"], fault
        new = json.loads(th_path.read_text())  # rewritten: the recomputed theory (its timings differ)
        assert new["laws"] == json.loads(good)["laws"] and new["config"] == json.loads(good)["config"], fault
    print("theory.json fault outcomes (exit codes):", outcomes)


def test_killed_while_drawing_fast(tmp_path, monkeypatch, capsys):
    """The same as the slow test below, with the integration, the theory and the figures replaced by
    cheap stand-ins (a saved synthetic run, one line per figure)."""
    import matplotlib.figure

    def fake_integrate(config, *, out, outputs=None, **kw):
        tr = _running(config, out)
        tr.status, tr.files = WRITING, {n: None for n in outputs}
        save(tr, out)
        return tr

    def cheap(traj, theory=None):
        fig = matplotlib.figure.Figure(figsize=(2, 2))
        fig.subplots().plot(traj.ts, traj.a)
        return fig

    monkeypatch.setattr(gflow.runs, "integrate", fake_integrate)
    monkeypatch.setattr(gflow.figures._plot, "_FIGURES", dict.fromkeys(gflow.figures._plot._FIGURES, cheap))
    monkeypatch.setattr(gflow.runs._folder, "load_or_compute", lambda *a, **k: (None, "computed"))
    real = _io.atomic_savefig
    monkeypatch.setattr(gflow.figures._plot, "atomic_savefig", _killed_at_copier(real))
    out = tmp_path / "run"
    toml = tmp_path / "c.toml"
    toml.write_text("[data]\nL = 10\n[estimator]\nN = 200\n[schedule]\ndurations = [1.0, 1.0, 1.0]\n")
    assert main(["run", str(toml), "--out", str(out), "--no-check", "--quiet"]) == 130
    capsys.readouterr()
    tr = load(out)
    assert tr.status == WRITING and run_status(out) == WRITING and tr.files["figures/copier.png"] is None
    assert not (out / "figures" / "copier.png").exists() and (out / "figures" / "c_frac.png").stat().st_size > 0
    assert list((out / "figures").glob(".copier.*.tmp.png"))  # the kill's half-written temporary
    monkeypatch.setattr(gflow.figures._plot, "atomic_savefig", real)
    assert main(["plot", str(out)]) == 0
    assert "is complete" in capsys.readouterr().out
    assert load(out).status == "complete" and run_status(out) == "complete"
    assert not list((out / "figures").glob(".*.tmp.*"))  # removed under the lock
    files = load(out).files
    assert sorted(files) == sorted(f"figures/{n}.png" for n in gflow.figures._plot._FIGURES)
    assert all(r["bytes"] == (out / n).stat().st_size for n, r in files.items())
    (out / "figures" / "loss.png").write_bytes(b"")  # damaged after the fact
    assert run_status(out).startswith("incomplete: figures/loss.png")
    assert main(["plot", str(out)]) == 0 and run_status(out) == "complete"


@pytest.mark.slow
def test_run_killed_while_drawing_is_not_complete_and_plot_repairs_it(tmp_path, cache, monkeypatch, capsys):
    """A kill (SIGINT here: KeyboardInterrupt) while the second figure is written leaves its temporary
    half-written; the run is not complete, its figure absent (never a 0-byte file). `gflow plot`
    redraws, removes the temporary and completes the run; a figure damaged later is seen by
    run_status and repaired the same way."""
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_TOML)
    out = tmp_path / "run"
    real = _io.atomic_savefig
    monkeypatch.setattr(gflow.figures._plot, "atomic_savefig", _killed_at_copier(real))
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 130
    capsys.readouterr()
    tr = load(out)
    assert tr.status == WRITING and run_status(out) != "complete"
    assert tr.files is not None and tr.files["figures/copier.png"] is None
    assert not (out / "figures" / "copier.png").exists() and (out / "figures" / "c_frac.png").stat().st_size > 0
    monkeypatch.setattr(gflow.figures._plot, "atomic_savefig", real)
    assert main(["plot", str(out)]) == 0
    assert "is complete" in capsys.readouterr().out
    assert load(out).status == "complete" and run_status(out) == "complete"
    assert not list((out / "figures").glob(".*.tmp.*"))
    # damaged after the fact: run_status sees it, gflow plot repairs it
    (out / "figures" / "loss.png").write_bytes(b"")
    assert run_status(out).startswith("incomplete: figures/loss.png")
    assert main(["plot", str(out)]) == 0 and run_status(out) == "complete"


def _tiny_cfg():
    return gflow.config.from_dict({"data": {"L": 10}, "estimator": {"N": 200},
                                   "schedule": {"durations": [1.0, 1.0, 1.0]}})  # fmt: skip


def _running(cfg, out):
    tr = Trajectory.empty(cfg, cfg.model.H, cfg.model.M, len(cfg.model.subsets))
    rows = {k: np.zeros((2,) + getattr(tr, k).shape[1:]) for k in _ARRAYS if k not in ("ts", "stage")}
    tr.append(ts=np.array([0.0, 0.1]), stage=np.ones(2, int), **rows)
    tr.stages = [StageRecord(name="I", moves=["C"], t0=0.0, t1=0.1)]
    tr.status = "running"
    save(tr, out)
    return tr


def test_unexpected_error_exits_4_logs_and_marks_failed(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    cfg = _tiny_cfg()

    def bug(config, *, out, **kw):
        _running(config, out)
        raise TypeError("an unforeseen bug\nover two lines")

    monkeypatch.setattr(gflow.runs, "integrate", bug)
    toml = tmp_path / "c.toml"
    toml.write_text("[data]\nL = 10\n[estimator]\nN = 200\n[schedule]\ndurations = [1.0, 1.0, 1.0]\n")
    assert main(["run", str(toml), "--out", str(out), "--quiet"]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "gflow run: unexpected error (exit 4): TypeError: an unforeseen bug over two lines" in err
    assert str(out / "gflow.log") in err and "marked 'failed'" in err
    log = (out / "gflow.log").read_text()
    assert "Traceback" in log and "TypeError: an unforeseen bug" in log
    tr = load(out)
    assert tr.status.startswith("failed: unexpected TypeError")
    gflow.dynamics._flow.check_resumable(tr, cfg)  # resumable with its configuration
    # a command without a folder: the traceback goes to a temporary file that the line names
    monkeypatch.setattr("gflow.cli._commands.cmd_theory", lambda args: 1 / 0)
    assert main(["theory"]) == 4
    err = capsys.readouterr().err
    assert "ZeroDivisionError" in err and "gflow-" in err and err.count("\n") == 1


def test_resume_without_config_uses_the_saved_one(tmp_path, capsys, monkeypatch):
    """`gflow run --resume --out R` reads R's configuration (not the defaults); a config that differs
    is still refused naming the key."""
    out = tmp_path / "run"
    _running(_tiny_cfg(), out)

    def stop(*a, **k):
        raise ValueError("stopped at the sampling")

    monkeypatch.setattr(gflow.dynamics._flow, "make_loss", stop)
    assert main(["run", "--resume", "--out", str(out), "--quiet"]) == 2
    assert "stopped at the sampling" in capsys.readouterr().err  # got past check_resumable
    assert main(["run", "--resume", "--out", str(out), "--dry-run"]) == 0
    capsys.readouterr()
    other = tmp_path / "other.toml"
    other.write_text("[data]\nL = 12\n[estimator]\nN = 200\n[schedule]\ndurations = [1.0, 1.0, 1.0]\n")
    assert main(["run", str(other), "--resume", "--out", str(out), "--quiet"]) == 2
    assert "cannot resume: data.L = 12 differs from the saved run's 10" in capsys.readouterr().err
    shutil.rmtree(out)
    assert main(["run", "--resume", "--out", str(out), "--quiet"]) == 2  # nothing saved: one clear error
    assert "holds no gflow run" in capsys.readouterr().err
