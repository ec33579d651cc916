"""Every kind of training through ``gflow run``: each ``solver.method`` a configuration accepts
writes a run folder that ``gflow.load``, ``gflow check`` and ``gflow plot`` accept; the
stochastic ones (SGD, the SDE: R seeds) keep a seed axis equal to the Python functions'
seeds, and their report is judged on the seed mean with its standard error.

One tiny joint problem (d = 3, L = 12, N = 120, t1 = 0.3, η = 0.1, R = 2 seeds of B = 10),
run once per method for the whole module; its theory is computed by the first check and
copied into every other folder (``theory.json`` belongs to a run by its data, model,
estimator and initialisation, the same for every method)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

import gflow
import gflow.cli
from gflow.checks import Row
from gflow.checks._seeds import combine_row
from gflow.config import METHODS, STOCHASTIC_METHODS
from gflow.trajectory import SEED_ARRAYS, RunFolderError, load, save

BASE = """
[data]
L = 12
[estimator]
N = 120
[init]
a0 = 1.0
[schedule]
kind = "joint"
t1 = 0.3
[solver]
eta = 0.1
save_per_decade = 2
method = "{method}"
[sgd]
batch = 10
seeds = 2
"""


def _toml(tmp, method, replace=()):
    """The problem's TOML with `method`; `replace`: ``(old, new)`` text replacements."""
    text = BASE.format(method=method)
    for a, b in replace:
        assert a in text
        text = text.replace(a, b)
    p = tmp / f"{method}.toml"
    p.write_text(text)
    return p


_DONE: dict = {}  # method -> (folder, exit codes of run, check, plot); the module's runs, made on demand


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``folders(method)``: ``(folder, exit codes of run, check, plot)``: ``gflow run`` (trajectory
    only), then ``gflow check`` and ``gflow plot`` on the folder, once per method. The theory is
    computed by the first check and copied into the later folders; the figures are cut to
    ``loss`` (and ``seeds``, which only a stochastic run has) to keep the test short."""
    from gflow.figures import _plot

    _DONE.clear()

    def get(m):
        if m in _DONE:
            return _DONE[m]
        theory = next((d / "theory.json" for d, *_ in _DONE.values() if (d / "theory.json").is_file()), None)
        tmp = tmp_path_factory.mktemp(m)
        d = tmp / "run"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_plot, "_FIGURES", {"loss": _plot.plot_loss})
            rc_run = gflow.cli.main(["run", str(_toml(tmp, m)), "--out", str(d), "--quiet", "--no-check", "--no-plot"])
            if theory is not None and (d / "trajectory.npz").is_file():
                shutil.copy(theory, d / "theory.json")
            rc_check = gflow.cli.main(["check", str(d)])
            rc_plot = gflow.cli.main(["plot", str(d)])
        _DONE[m] = (d, rc_run, rc_check, rc_plot)
        return _DONE[m]

    return get


# GD and the stochastic methods by default; the adaptive flows (long covered by the CLI tests of
# test_robust and test_plot) and any other flow method only with the slow tests (-m slow).
_FAST = ("gd", *STOCHASTIC_METHODS)


@pytest.mark.parametrize("method", [m if m in _FAST else pytest.param(m, marks=pytest.mark.slow) for m in METHODS])
def test_every_method_writes_a_folder_load_check_and_plot_accept(folders, method):
    """``gflow run`` with the method exits 0 and writes a complete run; ``gflow check`` exits
    0 or 1 (a verdict, not an error) and writes the report; ``gflow plot`` exits 0 and draws
    every figure (with ``seeds`` for a stochastic method only); ``gflow.load`` reads it back
    with a seed axis exactly for the stochastic methods."""
    d, rc_run, rc_check, rc_plot = folders(method)
    assert rc_run == 0
    tr = gflow.load(d)
    assert tr.status == "complete" and tr.config.solver.method == method
    assert tr.ts[-1] == pytest.approx(0.3) and np.all(np.isfinite(tr.a))
    assert rc_check in (0, 1)
    rep = json.loads((d / "report.json").read_text())
    assert rep["passed"] == (rc_check == 0) and rep["rows"][0]["passed"] is True  # the trajectory is finite
    assert rc_plot == 0
    figs = sorted(p.stem for p in (d / "figures").iterdir())
    stochastic = method in STOCHASTIC_METHODS
    assert figs == (["loss", "seeds"] if stochastic else ["loss"])
    assert tr.n_seeds == (2 if stochastic else 0)
    assert json.loads((d / "run.json").read_text())["seeds"] == tr.n_seeds


@pytest.mark.parametrize("method", STOCHASTIC_METHODS)
# the report's rows divide by nothing that can be 0 (the Stage III force row once divided by F(a) at a
# saved a on its zero and warned; now the relative tolerance is over the points where F(a) ≠ 0)
@pytest.mark.filterwarnings("error:divide by zero:RuntimeWarning")
def test_stochastic_run_equals_the_python_functions(folders, method):
    """The folder's seed axis is seed r of ``gflow.sgd(config)`` / ``gflow.sde(config)`` for the
    same configuration, bit for bit; the ordinary arrays are the seed means; ``gflow.integrate``
    returns the same trajectory as ``gflow.load``."""
    d = folders(method)[0]
    tr = gflow.load(d)
    cfg = tr.config
    run = (gflow.sgd if method == "sgd" else gflow.sde)(cfg)
    assert run.a.shape == (2, len(tr.ts))
    np.testing.assert_array_equal(run.ts, tr.ts)
    for k in ("w", "C", "a", "loss"):
        np.testing.assert_array_equal(tr.per_seed[k], getattr(run, k))
        np.testing.assert_array_equal(getattr(tr, k), getattr(run, k).mean(0))
    assert not np.array_equal(tr.per_seed["a"][0], tr.per_seed["a"][1])  # two seeds, two paths
    again = gflow.integrate(cfg)
    for k in SEED_ARRAYS:
        np.testing.assert_array_equal(again.per_seed[k], tr.per_seed[k])
    assert again.stages[0].steps == tr.stages[0].steps == (3 if method == "sgd" else 12)


@pytest.mark.parametrize("method", STOCHASTIC_METHODS)
# the report's rows divide by nothing that can be 0 (the Stage III force row once divided by F(a) at a
# saved a on its zero and warned; now the relative tolerance is over the points where F(a) ≠ 0)
@pytest.mark.filterwarnings("error:divide by zero:RuntimeWarning")
def test_stochastic_report_is_judged_on_the_seed_mean(folders, method):
    """The report says it was judged on the mean of 2 seeds; every decided numeric row's measured
    value is the mean of the rows of ``gflow.check`` on each seed alone, and its tolerance is
    widened by 4 standard errors of that mean."""
    d = folders(method)[0]
    tr = gflow.load(d)
    rep = json.loads((d / "report.json").read_text())
    assert rep["run"]["seeds"] == 2 and "judged on the mean of 2 seeds" in rep["notes"][1]
    assert rep["notes"][-1].startswith("checks computed in") and "3 reports" in rep["notes"][-1]
    assert "2 seeds (judged on their mean)" in (d / "report.md").read_text()
    theory = gflow.Theory.from_json(json.loads((d / "theory.json").read_text()))
    seeds = [gflow.check(tr.seed_run(r), theory=theory) for r in range(2)]
    numeric = [r for r in rep["rows"] if r["passed"] is not None and isinstance(r["measured"], float)]
    assert numeric
    for row in numeric:
        vals = [s.row(row["name"]).measured for s in seeds]
        assert row["measured"] == pytest.approx(np.mean(vals), rel=1e-12, abs=1e-15)
        assert "4·SE(seeds)" in str(row["tolerance"])


def test_resume_reuses_the_same_complete_run_and_refuses_another(folders, capsys):
    """``gflow run --resume`` of a complete stochastic run with the same configuration has nothing
    to run: exit 0, the saved snapshot untouched; with another configuration (R = 3) it is refused
    (exit 2) naming why, the saved run untouched."""
    d = folders("sgd")[0]
    before = gflow.load(d).generation
    toml = _toml(d.parent, "sgd")
    assert gflow.cli.main(["run", str(toml), "--out", str(d), "--resume", "--quiet", "--no-check", "--no-plot"]) == 0
    assert gflow.load(d).generation == before
    other = _toml(d.parent, "sgd", [("seeds = 2", "seeds = 3")])
    assert gflow.cli.main(["run", str(other), "--out", str(d), "--resume", "--quiet", "--no-check", "--no-plot"]) == 2
    assert "cannot be resumed (the saved run was made by another configuration)" in capsys.readouterr().err
    assert gflow.load(d).generation == before and gflow.load(d).n_seeds == 2


def test_seeds_figure_draws_every_seed_their_mean_and_spread(folders):
    """figures/seeds: in the a panel, one thin line per seed (seed r's a), the mean line (the
    seeds' mean a) and two bands; a deterministic run has no seeds figure to draw."""
    from gflow.figures import plot_seeds

    tr = gflow.load(folders("sgd")[0])
    fig = plot_seeds(tr)
    ax = fig.axes[0]
    pos = tr.ts > 0
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    np.testing.assert_array_equal(lines["mean of 2 seeds"].get_ydata(), tr.per_seed["a"][:, pos].mean(0))
    seeds = [ln for ln in ax.get_lines() if ln.get_linewidth() == 0.6]
    assert len(seeds) == 2
    np.testing.assert_array_equal(seeds[1].get_ydata(), tr.per_seed["a"][1, pos])
    assert len(ax.collections) == 2  # the spread and the ±2 SE bands
    with pytest.raises(ValueError, match="no seed axis"):
        plot_seeds(tr.seed_run(0))


def test_load_round_trip_and_inconsistent_seed_arrays(folders, tmp_path):
    """``gflow.load`` of a saved stochastic run gives the same trajectory (every seed array);
    seed arrays of the wrong shape are a RunFolderError naming the file."""
    tr = gflow.load(folders("sgd")[0])
    save(tr, tmp_path / "copy")
    back = load(tmp_path / "copy")
    assert back.n_seeds == 2 and back.config == tr.config and back.stages == tr.stages
    for k in SEED_ARRAYS:
        np.testing.assert_array_equal(back.per_seed[k], tr.per_seed[k])
        np.testing.assert_array_equal(getattr(back, k), getattr(tr, k))
    one = tr.seed_run(1)
    assert one.n_seeds == 0 and np.array_equal(one.a, tr.per_seed["a"][1])
    np.testing.assert_allclose(tr.seed_se("a"), tr.per_seed["a"].std(0, ddof=1) / np.sqrt(2))
    tr.per_seed["a"] = tr.per_seed["a"][:, :-1]
    save(tr, tmp_path / "bad")
    with pytest.raises(RunFolderError, match=r"trajectory\.npz.*seed arrays"):
        load(tmp_path / "bad")
    deterministic = gflow.load(folders("sgd")[0]).seed_run(0)
    save(deterministic, tmp_path / "det")
    with np.load(tmp_path / "det" / "trajectory.npz") as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta"][()]))
    meta["seeds"] = "two"
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(tmp_path / "det" / "trajectory.npz", **arrays)
    with pytest.raises(RunFolderError, match=r"the metadata says two seeds, the arrays 0"):
        load(tmp_path / "det")


def _numeric_row(measured=1.0, tol=0.5, wrong=3.0):
    return Row("x", 1.0, measured, tol, True, "finite", ("abs", 1.0, tol), wrong)


def _seed_row(m):
    return Row("x", 1.0, m, 0.5, None, "finite", ("abs", 1.0, 0.5), None)


def test_combine_row_mean_and_standard_error():
    """A numeric row: measured = the seeds' mean, tolerance + k·SE; a seed mean outside it fails;
    a tolerance so wide that the wrong answer passes is vacuous (undecided); one seed: undecided;
    a true/false row fails when one seed fails though the mean passes."""
    row = combine_row(_numeric_row(), [_seed_row(1.2), _seed_row(1.4), _seed_row(1.6)], 4.0)
    se = np.std([1.2, 1.4, 1.6], ddof=1) / np.sqrt(3)
    assert row.measured == pytest.approx(1.4) and row.passed is True
    assert row.rule[2] == pytest.approx(0.5 + 4 * se) and "4·SE(seeds)" in row.tolerance
    far = combine_row(_numeric_row(), [_seed_row(1.55), _seed_row(1.56), _seed_row(1.57)], 4.0)
    assert far.passed is False  # mean 1.56: |0.56| > 0.5 + 4·0.0058
    noisy = combine_row(_numeric_row(), [_seed_row(-2.0), _seed_row(1.0), _seed_row(4.0)], 4.0)
    assert noisy.passed is None and "vacuous" in noisy.tolerance
    single = combine_row(_numeric_row(), [_seed_row(1.1)], 4.0)
    assert single.passed is None and "one seed" in single.tolerance
    finite = Row("finite", True, True, "exact", True, "exact", ("true",), False)
    seeds = [Row("finite", True, v, "exact", None, "exact", ("true",), False) for v in (True, False)]
    assert combine_row(finite, seeds, 4.0).passed is False
    assert combine_row(finite, seeds[:1], 4.0).passed is True
    missing = combine_row(_numeric_row(), [_seed_row(1.0), None], 4.0)
    assert missing.passed is None and "not measured on seeds [1]" in missing.tolerance


@pytest.mark.parametrize("replace, arg, match", [
    ([("seeds = 2", 'seeds = 2\nsampling = "bogus"')], [],
     r"sgd\.sampling must be one of \('fresh', 'fixed', 'replace'\), got 'bogus'"),
    ([("seeds = 2", "seeds = 0")], [], r"sgd\.seeds must be an integer >= 1, got 0"),
    ([("batch = 10", 'batch = 121\nsampling = "fixed"')], [], r"sgd\.batch = 121 must be <= estimator\.N = 120"),
    ([("seeds = 2", "seeds = 2\n[sde]\ndt = -1.0")], [], r"sde\.dt must be a finite number >= 0"),
    ([("seeds = 2", "seeds = 2\n[sde]\nsigma_sample = 121"), ('"sgd"', '"sde"')], [],
     r"sde\.sigma_sample = 121 must be <= estimator\.N = 120"),
    ([], ["--replicates", "2"], r"gflow run --replicates integrates flows"),
])  # fmt: skip
def test_bad_stochastic_requests_exit_2_before_anything_is_written(tmp_path, capsys, monkeypatch, replace, arg, match):
    """Bad settings of the stochastic methods, resuming one, or replicating one: exit 2 with one
    line naming the key and what is allowed, before any compute and without touching --out."""

    def boom(*a, **k):
        raise AssertionError("compute reached")

    monkeypatch.setattr(gflow.dynamics._stochastic, "make_loss", boom)
    p = _toml(tmp_path, "sgd", replace)
    out = tmp_path / "out"
    assert gflow.cli.main(["run", str(p), "--out", str(out), "--quiet", *arg]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gflow run: error:") and re.search(match, err), err
    assert not out.exists()


def test_staged_schedule_is_refused_for_the_sde():
    with pytest.raises(ValueError, match=r"solver\.method = 'sde' needs schedule\.kind = 'joint'"):
        gflow.Config().replace(solver={"method": "sde"})


def test_diverging_seed_fails_the_run_with_exit_3(tmp_path, capsys):
    """A seed whose θ becomes non-finite fails the run as a flow's non-finite state does:
    exit 3, the trajectory kept with the status "failed: …" naming the seeds."""
    p = _toml(tmp_path, "sgd", [("eta = 0.1", "eta = 1e300"), ("t1 = 0.3", "t1 = 3e300")])
    out = tmp_path / "out"
    assert gflow.cli.main(["run", str(p), "--out", str(out), "--quiet", "--no-plot"]) == 3
    assert "non-finite in seeds" in capsys.readouterr().err
    tr = gflow.load(out)
    assert tr.status.startswith("failed: sgd θ became non-finite") and tr.stages[0].ended_by == "failed"


def test_heun_converges_to_the_flow_as_its_tolerance_falls():
    """``solver.method = "heun"`` (adaptive, order 2, Euler's step its error estimate) integrates the
    flow: against tsit5 at rtol 10⁻¹⁰ its error at the end falls in proportion to its tolerance
    (measured: 2.1·10⁻⁴, 2.1·10⁻⁵, 2.1·10⁻⁶ at rtol 10⁻⁴, 10⁻⁵, 10⁻⁶); its evaluations are counted
    on the host: two per step, accepted or rejected, and two for the first step's heuristic (the
    later solves of the stage go on with the last step)."""
    cfg = gflow.Config().replace(data={"L": 12}, estimator={"N": 120}, schedule={"kind": "joint", "t1": 2.0},
                                 solver={"save_per_decade": 2})  # fmt: skip
    loss = gflow.core.make_loss(cfg.data, cfg.model, cfg.estimator)
    ref = gflow.integrate(cfg.replace(solver={"rtol": 1e-10, "atol": 1e-13}), loss=loss)
    theta = lambda tr: np.concatenate([tr.w[-1].ravel(), tr.C[-1], [tr.a[-1]]])  # noqa: E731
    err = {}
    for r in (1e-4, 1e-6):
        tr = gflow.integrate(cfg.replace(solver={"method": "heun", "rtol": r, "atol": r * 1e-3}), loss=loss)
        assert tr.ts[-1] == ref.ts[-1] and tr.stages[0].solver is None
        st = tr.stages[0]
        assert st.nfev == 2 * (st.steps + st.rejected) + 2
        err[r] = float(np.max(np.abs(theta(tr) - theta(ref)) / np.maximum(np.abs(theta(ref)), 1e-3)))
    assert 50 < err[1e-4] / err[1e-6] < 200, err
    assert err[1e-6] < 5e-6, err
