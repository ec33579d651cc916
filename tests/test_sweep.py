"""Sweeps (gflow/sweep.py and `gflow sweep`): parsing, validation before any
run, one run folder per point of the cross product, and the CSV table."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

import gflow
from gflow.cli import main
from gflow.runs._sweep import COLUMNS, headline, parse_param, run_sweep, sweep_points

# The test-size run of tests/test_replicates.py (same shapes: shared compilations).
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


def test_parse_param():
    assert parse_param("data.L=50,100,200") == ("data.L", [50, 100, 200])
    assert parse_param("data.parents=[1],[1, 2]") == ("data.parents", [[1], [1, 2]])
    assert parse_param("schedule.durations=[1e3,1e10,1e4]") == ("schedule.durations", [[1e3, 1e10, 1e4]])
    assert parse_param("solver.method=tsit5,kvaerno5") == ("solver.method", ["tsit5", "kvaerno5"])
    assert parse_param('data.start="uniform"') == ("data.start", ["uniform"])
    assert parse_param("schedule.events=true,false") == ("schedule.events", [True, False])
    assert parse_param(" init.a0 = 0.5 ") == ("init.a0", [0.5])
    for bad, msg in [
        ("data.L", r"expected section\.key=value"),
        ("L=5", r"the field must be section\.key"),
        ("data.L=5,,6", r"empty value"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_param(bad)


def test_cross_product_and_values():
    pts = sweep_points(TINY, ["data.L=20,30", "estimator.N=100,200,400"])
    assert [p for p, _ in pts] == [{"data.L": L, "estimator.N": N} for L in (20, 30) for N in (100, 200, 400)]
    assert [(c.data.L, c.estimator.N) for _, c in pts] == [(L, N) for L in (20, 30) for N in (100, 200, 400)]
    # everything else is the base configuration's
    assert all(c.schedule == TINY.schedule and c.solver == TINY.solver for _, c in pts)
    # an int for a float field is accepted like in TOML
    (_, c), = sweep_points(TINY, {"init.a0": [1]})
    assert c.init.a0 == 1.0


@pytest.mark.parametrize(
    "param, msg",
    [
        ("data.LL=50,100", r"unknown config field 'data\.LL': \[data\] has no key 'LL' \(did you mean 'data\.L'\?\); keys of \[data\]: \['d'"),
        ("dta.L=50", r"unknown config field 'dta\.L': no section \[dta\]"),
        ("data.L=20,-3", r"sweep point estimator\.N=100, data\.L=-3: data\.L must be an integer"),
        ("solver.method=tsit5,rk4", r"sweep point estimator\.N=100, solver\.method=rk4: .*solver\.method must be"),
    ],
)
def test_bad_field_is_a_clear_error_before_any_run(tmp_path, param, msg):
    with pytest.raises(ValueError, match=msg):
        run_sweep(TINY, ["estimator.N=100,200", param], tmp_path / "sw")
    assert not (tmp_path / "sw").exists()


def test_field_twice_is_an_error():
    with pytest.raises(ValueError, match=r"'data\.L' is swept twice"):
        sweep_points(TINY, ["data.L=20", "data.L=30"])
    with pytest.raises(ValueError, match=r"at least one --param"):
        sweep_points(TINY, [])


def test_cli_sweep_bad_field(tmp_path, capsys):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_TOML)
    out = tmp_path / "sw"
    assert main(["sweep", str(cfg), "--param", "data.L=20,30", "--param", "model.heads=2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "gflow sweep: error: unknown config field 'model.heads'" in err and "keys of [model]" in err
    assert not out.exists()


def test_sweep_two_values(tmp_path):
    """Two values of one field: two run folders (each an ordinary run, checked)
    and a CSV with a header and one row each, the point's value first."""
    out = tmp_path / "sw"
    res = run_sweep(TINY, ["init.a0=0.01,0.05"], out, check=True)
    dirs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert dirs == ["000_init.a0=0.01", "001_init.a0=0.05"]
    for d, a0 in zip(dirs, (0.01, 0.05)):
        tr = gflow.load(out / d)
        assert tr.status == "complete" and tr.config.init.a0 == a0 and tr.a[0] == a0
        assert (out / d / "report.json").is_file()
    with open(out / "sweep.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2
    assert list(rows[0]) == ["init.a0", "dir", *COLUMNS]
    assert [float(r["init.a0"]) for r in rows] == [0.01, 0.05] and [r["dir"] for r in rows] == dirs
    for r, row in zip(res.rows, rows):
        tr = gflow.load(out / row["dir"])
        assert row["status"] == "complete"
        assert float(row["a_end"]) == pytest.approx(tr.a[-1], rel=1e-12)
        assert float(row["loss_end"]) == pytest.approx(tr.loss[-1], rel=1e-12)
        rep = json.loads((out / row["dir"] / "report.json").read_text())
        assert row["S_star"] == rep["theory"]["S_star"] and float(row["a_star"]) == pytest.approx(
            rep["theory"]["a_star"])  # fmt: skip
        assert int(row["checks_passed"]) + int(row["checks_failed"]) <= len(rep["rows"])
        assert float(row["wall_s"]) > 0
    # a larger a0 moves a further in Stage III
    assert res.rows[1]["a_end"] > res.rows[0]["a_end"]
    assert json.loads((out / "sweep.json").read_text())["fields"] == ["init.a0"]
    # the folders now hold runs: refused without --resume, reused with it
    with pytest.raises(ValueError, match=r"sweep folders already hold runs"):
        run_sweep(TINY, ["init.a0=0.01,0.05"], out, check=False)
    again = run_sweep(TINY, ["init.a0=0.01,0.05"], out, check=False, resume=True)
    assert [r["a_end"] for r in again.rows] == [r["a_end"] for r in res.rows]


def test_cli_sweep(tmp_path, capsys):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_TOML)
    out = tmp_path / "sw"
    assert main(["sweep", str(cfg), "--param", "estimator.seed=0,1", "--out", str(out), "--no-check"]) == 0
    printed = capsys.readouterr().out
    assert "estimator.seed" in printed and "sweep.csv" in printed
    with open(out / "sweep.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["estimator.seed"] for r in rows] == ["0", "1"]
    assert rows[0]["S_star"] == "" and rows[0]["S_measured"] != ""  # no check: no theory columns


def test_headline_without_report():
    tr = gflow.integrate(TINY)
    h = headline(tr)
    assert set(h) == set(COLUMNS)
    assert h["S_measured"] == gflow.core._model.subset_label(tr.subsets[int(np.argmax(tr.c_frac[tr.stage == 1][-1]))])
    assert h["S_star"] is None and h["slope"] is None and h["checks_passed"] is None
