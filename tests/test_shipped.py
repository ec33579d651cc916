"""The settings a user meets first, run to their report through ``gflow run``: the published
run's reference-compatible setting and every shipped configuration (``scripts/configs``), at a
tiny size (``--param``), each to its report, its theory and its figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import gflow
from gflow.cli import main
from gflow.trajectory import selected_set

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "scripts" / "configs").glob("*.toml"))

# the published run's setting (docs/results/published-run.md): the official code's options
PUBLISHED = """\
[data]
start = "uniform"
[model]
head_norm = true
windows = "shifted"
[estimator]
N = 9000
loss = "ce_on_probs"
[schedule]
kind = "joint"
t1 = 5e4
"""
TINY = ["--param", "data.L=30", "--param", "estimator.N=500"]
# per shipped configuration, what else makes it tiny (the official Full run: 40 Euler steps)
TINY_EXTRA = {"official_full.toml": ["--param", "schedule.t1=0.2"], "edelman.toml": ["--param", "schedule.t1=20"],
              "bietti.toml": ["--param", "schedule.t1=20"],
              "nichani.toml": ["--param", "schedule.durations=[1,1000,1000]"],
              # the heap graph's target at L = 30 has the parents 30 and 15: offsets 1 and 16
              "nichani_dag.toml": ["--param", "schedule.durations=[1,1000,1000]", "--param", "data.parents=[1,16]"]}  # fmt: skip
FIGURES = ("c_frac", "copier", "a_vs_logt", "rate", "loss", "summary", "strategies")


def _finished(out: Path) -> dict:
    rep = json.loads((out / "report.json").read_text())
    assert (out / "report.md").is_file() and (out / "theory.json").is_file()
    for name in FIGURES:
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000, name
    return rep


def test_published_setting_runs_to_its_verdict(tmp_path):
    """The published setting ended with exit 4 (no GIH law for a set of shifted heads): it now
    ends with its verdict, and the report decides the rows of the selected set's GIH law."""
    toml = tmp_path / "published.toml"
    toml.write_text(PUBLISHED)
    out = tmp_path / "run"
    assert main(["run", str(toml), "--out", str(out), "--quiet", *TINY]) == 0  # the gflow verdict passes
    rep = _finished(out)
    traj = gflow.load(out)
    assert selected_set(traj) == (1, 2) and rep["selected"] == [1, 2]
    theory = gflow.Theory.from_json(json.loads((out / "theory.json").read_text()))
    assert (1, 2) in theory.laws
    # the law is the GIH of offsets {1, 2} on the run's own sample: its limit loss is the flow's
    # end (a → ∞ along a joint run with a one-hot copier), to the row's tolerance
    row = next(r for r in rep["rows"] if r["name"].startswith("limit loss"))
    assert abs(row["measured"] - row["predicted"]) <= 0.01 * row["predicted"], row


def test_shifted_sets_read_their_heads_offsets():
    """Shifted windows put head h's copier on its own offset h (w[h−1, 0]), so a set of heads
    reads the parent offsets of the same numbers: the Ĩ ranking of the shifted model is the aligned
    model's, set by set (it was every set at Ĩ(∅) when the sets read no offsets)."""
    cfg = gflow.Config().replace(data={"L": 20}, estimator={"N": 200})
    shifted = cfg.replace(model={"windows": "shifted"}, schedule={"kind": "joint"})
    member = gflow.member_of(shifted.model)
    assert [member.set_offsets(S) for S in shifted.model.subsets] == [tuple(S) for S in cfg.model.subsets]
    a = gflow.theory_report(cfg, n_pi=200)
    b = gflow.theory_report(shifted, n_pi=200)
    np.testing.assert_array_equal(a.ranking.Itilde, b.ranking.Itilde)
    assert b.S_star == (1, 2) and len(set(np.round(b.ranking.Itilde, 12))) == len(cfg.model.subsets)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configuration_runs_to_its_report(tmp_path, path):
    """Each shipped configuration, at the test size, through ``gflow run`` to its report: the
    run ends with its verdict and the report holds every row of its theory."""
    out = tmp_path / "run"
    rc = main(["run", str(path), "--out", str(out), "--quiet", *TINY, *TINY_EXTRA.get(path.name, [])])
    assert rc in (0, 1)
    rep = _finished(out)
    assert rc == (1 if rep["verdict"]["gflow"] == "fail" else 0)
    traj = gflow.load(out)
    assert traj.config.data.L == 30 and traj.config.estimator.N == 500  # --param reached the run
    first = rep["rows"][0]
    assert first["name"].startswith("trajectory finite") and first["passed"] is True
    assert np.all(np.isfinite(traj.a)) and rep["selected"] is not None


def test_run_param_takes_one_value_and_names_the_field(tmp_path, capsys):
    """``gflow run --param``: one value a field, the sweep's syntax, errors before any compute."""
    out = tmp_path / "o"
    assert main(["run", "--out", str(out), "--param", "data.L=20,30", "--dry-run"]) == 2
    assert "one value for 'data.L'" in capsys.readouterr().err
    assert main(["run", "--out", str(out), "--param", "data.N=20", "--dry-run"]) == 2
    assert "did you mean 'estimator.N'" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(ValueError, match=r"did you mean 'data\.L'"):
        gflow.Config().replace(data={"Lx": 3})


def test_run_refuses_a_folder_of_other_files(tmp_path, capsys):
    """A folder that holds other files and no run is refused (exit 2, nothing written) unless
    ``--overwrite`` asks; an empty folder, or one holding only gflow's log, is taken."""
    out = tmp_path / "notes"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["run", "--out", str(out), "--param", "data.L=20", "--dry-run"]) == 2
    assert "holds other files (notes.txt) and no run" in capsys.readouterr().err
    assert main(["run", "--out", str(out), "--param", "data.L=20", "--quiet", "--no-check", "--no-plot"]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert main(["run", "--out", str(out), "--param", "data.L=20", "--dry-run", "--overwrite"]) == 0
    log = tmp_path / "log"
    log.mkdir()
    (log / "gflow.log").write_text("an earlier attempt")
    assert main(["run", "--out", str(log), "--param", "data.L=20", "--dry-run"]) == 0
