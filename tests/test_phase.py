"""Phase diagrams (gflow/phase.py, `gflow phase`, `gflow phase-merge`): the
grid's numbers are exactly `gflow theory`'s, an interrupted grid resumes to the
same CSV, shards merge to the same CSV, the half-loss time in
closed form, and validation before any computation."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gflow
from gflow.cli import main
from gflow.runs._phase import _half_loss_time, merge_shards, phase_grid, point_flow, run_phase
from gflow.runs._sweep import parse_param, sweep_points
from gflow.theory._theory import theory_report

# The test-size sample of tests/test_sweep.py (L = 20, N = 200): shared compilations.
TINY = gflow.Config().replace(
    data={"L": 20},
    estimator={"N": 200},
    schedule={"durations": [2.0, 2.0, 2.0]},
    solver={"save_per_decade": 3, "tau_min": 0.5},
)
N_PI = 200
# w₊ = 1 blurs the copier: J prefers {1} while Ĩ prefers {1,2} (found with the tool).
GRID = ["init.w_plus=1,3", "data.alpha=0.1,0.3"]


@pytest.fixture(scope="module")
def full_grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("phase") / "full"
    res = run_phase(TINY, GRID, out, n_pi=N_PI, plot=True)
    return out, res


# ---------------------------------------------------------------------------
# Parsing and validation (no computation)
# ---------------------------------------------------------------------------


def test_ranges_and_separators():
    assert parse_param("init.w_plus=lin:1:3:5") == ("init.w_plus", [1.0, 1.5, 2.0, 2.5, 3.0])
    f, v = parse_param("data.alpha=log:0.01:1:3")
    assert f == "data.alpha" and v == pytest.approx([0.01, 0.1, 1.0], rel=1e-15)
    assert parse_param("data.parents=[1,2];[1,3];[2,3]") == ("data.parents", [[1, 2], [1, 3], [2, 3]])
    # integer fields: integral range values become ints, others are an error naming the field
    (p0, c0), (p1, _), (p2, _) = sweep_points(TINY, ["data.L=lin:20:40:3"])
    assert [p0["data.L"], p1["data.L"], p2["data.L"]] == [20, 30, 40] and isinstance(p0["data.L"], int)
    assert c0.data.L == 20
    with pytest.raises(ValueError, match=r"'data\.L' takes integers; the value 26\.66"):
        sweep_points(TINY, ["data.L=lin:20:40:4"])
    for bad, msg in [
        ("data.alpha=log:0:1:3", r"log range needs ends > 0"),
        ("data.alpha=lin:a:1:3", r"range lin:a:1:3 needs two numbers"),
        ("data.alpha=lin:1:2:0", r"n >= 1 points"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_param(bad)


@pytest.mark.parametrize(
    "params, kw, msg",
    [
        (["init.w_plus=1,2", "data.alpha=0.1", "data.L=20"], {}, r"one or two --param fields, got 3"),
        (["init.w_pluss=1,2"], {}, r"\[init\] has no key 'w_pluss' \(did you mean 'init\.w_plus'\?\); keys of \[init\]: \['w_plus'"),
        (["data.parents=[1,2];[2,1]"], {}, r"data\.parents=\[2,1\]: data\.parents must be strictly increasing"),
        (["init.w_plus=1,2"], {"shard": "3/2"}, r"--shard must be k/n with integers 1 <= k <= n, got 3/2"),
        (["init.w_plus=1,2"], {"shard": "x"}, r"--shard must be k/n .* got 'x'"),
        (["init.w_plus=1,2"], {"n_pi": 0}, r"n_pi must be a positive integer, got 0"),
    ],
)
def test_bad_input_before_any_computation(tmp_path, params, kw, msg):
    with pytest.raises(ValueError, match=msg):
        run_phase(TINY, params, tmp_path / "ph", **kw)
    assert not (tmp_path / "ph").exists()


def test_cli_bad_input_exit_2(tmp_path, capsys):
    out = tmp_path / "ph"
    assert main(["phase", "--param", "model.heads=1,2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "gflow phase: error: unknown config field 'model.heads'" in err and "keys of [model]" in err
    assert not out.exists()


def test_grid_order():
    fields, pts = phase_grid(TINY, GRID)
    assert fields == ["init.w_plus", "data.alpha"]
    assert [tuple(p.values()) for p, _ in pts] == [(1, 0.1), (1, 0.3), (3, 0.1), (3, 0.3)]


# ---------------------------------------------------------------------------
# Closed forms
# ---------------------------------------------------------------------------


def test_half_loss_time_interpolates():
    ts = np.array([0.0, 1.0, 2.0, 4.0])
    loss = np.array([1.0, 0.9, 0.5, 0.2])  # half of (1.0 + 0.2) = 0.6, between t = 1 and 2
    assert _half_loss_time(ts, loss) == pytest.approx(1.0 + (0.9 - 0.6) / (0.9 - 0.5), rel=1e-14)
    assert _half_loss_time(ts, np.ones(4)) == 0.0


# ---------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------


def test_grid_reproduces_gflow_theory_exactly(full_grid, tmp_path, capsys):
    """Every theory column equals theory_report's for the point's configuration
    with `==` (the GIH columns: of argmax J, and the S* ones of S*), and a point
    equals `gflow theory --json` printed by the command line."""
    out, res = full_grid
    _, pts = phase_grid(TINY, GRID)
    assert [r["index"] for r in res.rows] == [0, 1, 2, 3]
    disagree = 0
    for row, (_, cfg) in zip(res.rows, pts):
        sc = cfg.schedule
        th = theory_report(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=N_PI, eta_C=sc.eta_C, delta=sc.delta)
        rk, rt = th.ranking, th.rates
        assert row["S_star"] == gflow.core._model.subset_label(th.S_star)
        assert (row["Itilde_gap"], row["Itilde_gap_se"], row["Itilde_uncertain"]) == (
            rk.gap, rk.gap_se, rk.close_call)  # fmt: skip
        assert row["argmax_J"] == gflow.core._model.subset_label(th.argmax_J)
        iJ = th.sets.index(th.argmax_J)
        jJ = int(np.argsort(-rt.J, kind="stable")[1])
        assert row["J_gap"] == rt.J[iJ] - rt.J[jJ] and row["J_gap_se"] == rt.diff_se[iJ, jJ]
        assert row["stage1_duration"] == th.duration.t
        sel, star = th.laws[th.argmax_J], th.laws[th.S_star]
        assert (row["C_star"], row["window_lo"], row["window_hi"], row["a_star"], row["limit_loss"]) == (
            sel.C_star, sel.window[0], sel.window[1], sel.a_star, sel.limit_loss)  # fmt: skip
        assert row["a_star_S_star"] == star.a_star and row["limit_loss_S_star"] == star.limit_loss
        disagree += row["argmax_J"] != row["S_star"]
    assert 0 < disagree < len(res.rows)  # the grid holds both phases
    # the command line, point 0 (w₊ = 1, α = 0.1: argmax J ≠ S*)
    cfg_toml = tmp_path / "p.toml"
    cfg_toml.write_text("[data]\nL = 20\nalpha = 0.1\n[estimator]\nN = 200\n[init]\nw_plus = 1.0\n")
    assert main(["theory", str(cfg_toml), "--json", "--n-pi", str(N_PI)]) == 0
    rep = json.loads(capsys.readouterr().out)
    row = res.rows[0]
    assert row["S_star"] == rep["mi"]["S_star_label"] != row["argmax_J"]
    law = rep["laws"][row["argmax_J"]]
    assert (row["C_star"], row["a_star"], row["limit_loss"]) == (law["C_star"], law["a_star"], law["limit_loss"])
    assert row["a_star_S_star"] == rep["laws"][row["S_star"]]["a_star"]
    assert row["stage1_duration"] == rep["stage1"]["duration"]["t"]
    # the files
    body = json.loads((out / "phase.json").read_text())
    assert body["fields"] == ["init.w_plus", "data.alpha"] and len(body["results"]) == 4
    assert body["results"][0]["theory"]["C_star"] == row["C_star"]
    for name in ("phase_map.png", "phase_heat.png"):
        assert (out / "figures" / name).stat().st_size > 10_000


def test_interrupted_grid_resumes_to_the_same_csv(full_grid, tmp_path):
    out_full, _ = full_grid
    out = tmp_path / "ph"

    def stop_after_two(k):
        if k == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_phase(TINY, GRID, out, n_pi=N_PI, plot=False, on_point=stop_after_two)
    assert len((out / "phase.csv").read_text().splitlines()) == 3  # header + the two finished points
    seen = []
    res = run_phase(TINY, GRID, out, n_pi=N_PI, plot=False, on_point=seen.append)
    assert seen == [2, 3]  # only the missing points are computed
    assert (out / "phase.csv").read_bytes() == (out_full / "phase.csv").read_bytes()
    assert len(res.rows) == 4
    # a folder holding another grid is refused
    with pytest.raises(ValueError, match=r"holds a different phase grid"):
        run_phase(TINY, ["init.w_plus=1,2"], out, n_pi=N_PI, plot=False)


def test_shards_merge_to_the_same_csv(full_grid, tmp_path, capsys):
    out_full, _ = full_grid
    a, b = tmp_path / "s1", tmp_path / "s2"
    r1 = run_phase(TINY, GRID, a, n_pi=N_PI, shard="1/2")
    assert [r["index"] for r in r1.rows] == [0, 2] and r1.csv.name == "phase.shard1of2.csv"
    assert not (a / "phase.csv").exists() and not (a / "figures").exists()
    with pytest.raises(ValueError, match=r"2 of 4 points are not done yet \(indices \[1, 3\]\)"):
        merge_shards([a], tmp_path / "m")
    run_phase(TINY, GRID, b, n_pi=N_PI, shard=(2, 2))
    assert main(["phase-merge", str(a), str(b), "--out", str(tmp_path / "m"), "--no-plot"]) == 0
    assert (tmp_path / "m" / "phase.csv").read_bytes() == (out_full / "phase.csv").read_bytes()


@pytest.mark.slow
def test_flow_columns(tmp_path):
    """--flow: each point is an ordinary run folder; the row's selected set and
    event times are the run's; the linearised Stage I duration predicts the
    Stage I event time (first order in a₀ = 0.01) within 2 %."""
    cfg = TINY.replace(schedule={"durations": [1e3, 1e10, 10.0]})
    res = run_phase(cfg, ["init.w_plus=1,3"], tmp_path / "ph", n_pi=N_PI, flow=True, plot=True)
    for r in res.rows:
        d = next((tmp_path / "ph" / "runs").glob(f"{r['index']:03d}_*"))
        tr = gflow.load(d)
        f = point_flow(tr, json.loads((d / "report.json").read_text()))
        assert r["selected"] == f["selected"] == r["argmax_J"]
        st1 = next(s for s in tr.stages if s.name == "I")
        assert st1.ended_by == "event" and r["t_event_I"] == st1.t1 - st1.t0
        assert r["t_event_I"] == pytest.approx(r["stage1_duration"], rel=0.02)
        rep = json.loads((d / "report.json").read_text())
        assert (r["verdict_gflow"], r["verdict_paper"]) == (rep["verdict"]["gflow"], rep["verdict"]["paper"])
        assert r["a_end"] == float(tr.a[-1])
        # the paper's verdict fails exactly where its criterion picks another set
        assert r["verdict_paper"] == ("pass" if r["S_star"] == r["selected"] else "fail")
    assert res.rows[1]["verdict_gflow"] == "pass"  # w₊ = 3: gflow agrees with its own theory


def _synthetic_body():
    """A 4 × 3 grid of theory rows (no compute; the last field varies fastest): argmax J = {1,2},
    {2}, {1}, {1} along w₊ with gaps of 6, 2, 2, 6 paired SE (the middle two undecided), S* =
    {1,2} everywhere."""
    winners, z = ["{1,2}", "{2}", "{1}", "{1}"], [6.0, 2.0, 2.0, 6.0]
    xs, ys = [1.0, 2.0, 4.0, 8.0], [0.1, 0.3, 1.0]
    results = []
    for j, x in enumerate(xs):
        for i, y in enumerate(ys):
            se = 0.01 * (i + 1)
            results.append({"index": j * 3 + i, "point": {"init.w_plus": x, "data.alpha": y}, "theory": {
                "S_star": "{1,2}", "Itilde_uncertain": False, "argmax_J": winners[j], "J_gap": z[j] * se,
                "J_gap_se": se, "J_uncertain": z[j] < 3}})  # fmt: skip
    return {"fields": ["init.w_plus", "data.alpha"], "values": [xs, ys], "results": results, "flow": False,
            "n_pi": 100, "base_config": {"estimator": {"N": 200}}}  # fmt: skip


def test_phase_map_draws_the_gap_and_says_what_n_decides():
    """phase_map: the legend lists only the colours drawn ({2} is on an undecided cell only), the
    last panel is the signed J gap in SE with its zero contour (the boundary of the most frequent
    winner {1}'s phase), and the title counts the undecided cells with the N that would decide
    the median one, N·(3/z)² = 200·(3/2)² = 450."""
    from matplotlib.contour import ContourSet

    from gflow.figures._phase import _Grid, phase_map_figure

    fig = phase_map_figure(_Grid(_synthetic_body()))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["{1,2}", "{1}", "undecided (top two within 3 paired SE)"]
    gap = fig.axes[2]
    z = np.array([6.0, 2.0, 2.0, 6.0]) * np.array([-1, -1, 1, 1])
    np.testing.assert_allclose(gap.images[0].get_array(), np.tile(z[:, None], (1, 3)))  # a row per w₊
    contours = [c for c in gap.collections if isinstance(c, ContourSet)]
    assert [list(c.levels) for c in contours] == [[0.0], [-3.0, 3.0]]
    title = fig._suptitle.get_text()
    assert "6 of 12 cells undecided by J: N is too small to decide them" in title and "N ≈ 450" in title
    assert "undecided by Ĩ" not in title
