"""Tests of gflow.figures._plot (docs/theory/mathematics.md §M7): every figure from a small hand-built run whose
arrays are known, checked against those arrays (one line per subset with its
label, heatmaps holding s(t), the a-vs-log τ fit equal to an independent least
squares, the rate equal to −η_a ∂L̂/∂a·e^a), the files written by ``plot_run``
and ``gflow plot``, and the error paths.

The run is synthetic (no integration) and the theory a hand-made
:class:`gflow.Theory` with a made-up GIH law, so the file runs in seconds; a
slow test runs the real pipeline (integrate, theory, plot) on a tiny config.
"""

import dataclasses
import json
import re
import struct

import numpy as np
import pytest

import gflow
from gflow.cli import main
from gflow.config import Config
from gflow.figures import _plot as gplot
from gflow.figures._base import SIZE_SINGLE
from gflow.theory._theory import ChiSquaredRanking, Stage1Duration, StageIIILaw, StageIRates, Theory
from gflow.trajectory import StageRecord, Trajectory, save

NAMES = ["c_frac", "copier", "a_vs_logt", "rate", "loss", "summary", "strategies"]
ETA_A = 2.0  # not 1, so that a missing η_a factor in the rate would show
T0_III = 105.0  # Stage III starts late: plotting against t instead of τ would show


def _config(kind="staged"):
    return Config().replace(
        data={"d": 2, "L": 12},
        model={"M": 2, "H": 2, "D": 2},
        estimator={"N": 64},
        schedule={"kind": kind, "eta_a": ETA_A},
    )


def _a_of(tau):
    # a monotone path from 0 to 4 that is not a straight line in ln τ
    return 4.0 * np.tanh(np.log1p(tau) / 4.0) ** 1.3


def _rows(ts, stage, C, w, a):
    T = len(ts)
    zeros = {
        k: np.zeros_like(v) for k, v in (("grad_w", w), ("grad_C", C), ("grad_se_w", w), ("grad_se_C", C))
    }
    return {
        "ts": ts, "stage": np.full(T, stage), "w": w, "C": C, "a": a, "loss": 0.7 - 0.1 * a,
        "loss_se": np.full(T, 0.01), "unseen": np.zeros(T), "grad_se_a": np.full(T, 0.01),
        "grad_a": -0.3 * np.exp(-a) * (1 + 0.1 * np.arange(T)), "grad_norm": np.ones(T), **zeros,
    }  # fmt: skip


def _w(T, grow):
    w = np.full((T, 2, 2), 0.1)
    w[:, 0, 0] = w[:, 1, 1] = 3.0 + grow
    return w


RATES = np.array([-1.0, 0.2, 0.4, 1.0])  # 𝒮 = (∅, {1}, {2}, {1,2}): {1,2} wins


def _staged_traj() -> Trajectory:
    cfg = _config()
    traj = Trajectory.empty(cfg, 2, 2, 4)
    # Stage I: C moves, t in [0, 5]
    t1 = np.concatenate([[0.0], np.geomspace(1e-3, 5.0, 30)])
    C1 = 0.1 * np.exp(np.outer(t1, RATES))
    traj.append(**_rows(t1, 1, C1, _w(len(t1), 0.0), np.full(len(t1), 0.01)))
    # Stage II: w moves, t in [5, 105]
    t2 = 5.0 + np.geomspace(1e-2, 100.0, 20)
    traj.append(**_rows(t2, 2, np.repeat(C1[-1:], 20, 0), _w(20, np.linspace(0, 4, 20)), np.full(20, 0.01)))
    # Stage III: a moves, τ = t - 105 in [1e-2, 1e4]
    tau = np.geomspace(1e-2, 1e4, 60)
    traj.append(**_rows(T0_III + tau, 3, np.repeat(C1[-1:], 60, 0), _w(60, 4.0), _a_of(tau)))
    traj.stages = [
        StageRecord("I", ["C"], 0.0, 5.0, "event", True),
        StageRecord("II", ["w"], 5.0, T0_III, "event", True, selected=[1, 2]),
        StageRecord("III", ["a"], T0_III, T0_III + 1e4, "duration", True),
    ]
    traj.status = "complete"
    return traj


def _joint_traj() -> Trajectory:
    cfg = _config("joint")
    traj = Trajectory.empty(cfg, 2, 2, 4)
    t = np.concatenate([[0.0], np.geomspace(1e-3, 1e4, 80)])
    C = 0.1 * np.exp(np.outer(np.minimum(t, 5.0), RATES))
    traj.append(**_rows(t, 0, C, _w(len(t), 4 * t / t[-1]), _a_of(t)))
    traj.stages = [StageRecord("joint", ["w", "C", "a"], 0.0, 1e4, "duration", True)]
    traj.status = "complete"
    return traj


def _theory(sets) -> Theory:
    """A :class:`gflow.Theory` whose GIH law of {1,2} is the made-up law
    F(a)·e^a = 0.5 (1 + a)(1 − e^{a − 3.5}) (zero at a* = 3.5), with {1,2} winning
    every ranking (the Stage I numbers are placeholders the figures do not read)."""
    sets = tuple(tuple(S) for S in sets)
    a = np.linspace(0.0, 30.0, 601)
    Fexp = 0.5 * (1 + a) * (1 - np.exp(a - 3.5))
    F = Fexp * np.exp(-a)
    i = int(np.argmax(Fexp))
    inside = np.flatnonzero(Fexp >= Fexp[i] / 2)
    L = 0.7 - np.cumsum(F) * (a[1] - a[0])
    win = (float(a[inside[0]]), float(a[inside[-1]]))
    law = StageIIILaw(
        S=(1, 2), a_grid=a, F=F, F_se=0.01 * np.exp(-a), Fexp=Fexp, Fexp_se=np.full_like(a, 0.01), L=L,
        L_se=np.full_like(a, 0.005), C_star=float(Fexp[i]), C_star_se=0.01, a_C_star=float(a[i]), window=win,
        window_intervals=(win,), window_is_interval=True, window_clipped=(False, False), a_star=3.5,
        a_star_se=0.05, F_zeros=(3.5,), L_inf=float(L[-1]), limit_loss=float(L.min()), limit_loss_se=0.005,
        a_limit=3.5,
    )  # fmt: skip
    n = len(sets)
    top = sets.index((1, 2)) if (1, 2) in sets else n - 1
    score = np.arange(n, dtype=float)
    score[top] = n
    order = tuple(int(j) for j in np.argsort(-score, kind="stable"))
    zeros = np.zeros(n)
    rank = ChiSquaredRanking(
        sets=sets, Itilde=score, Itilde_se=zeros, chi2=score, chi2_se=zeros, diff_se=np.zeros((n, n)), order=order,
        S_star=sets[top], gap=1.0, gap_se=0.0, close_call=False, n_pi=1,
    )  # fmt: skip
    rates = StageIRates(sets=sets, J=score, J_se=zeros, diff_se=np.zeros((n, n)), L0=0.7)
    return Theory(
        config={}, sets=sets, ranking=rank, rates=rates, a0=0.01, C0=np.full(n, 0.1), eta_C=1.0, delta=0.01,
        duration=Stage1Duration(t=5.0, S=sets[top], index=top, rate=1.0), laws={sets[top]: law},
    )  # fmt: skip


@pytest.fixture(scope="module")
def traj():
    return _staged_traj()


@pytest.fixture(scope="module")
def theory(traj):
    return _theory(traj.subsets)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, traj, theory):
    d = tmp_path_factory.mktemp("run")
    save(traj, d)
    gflow.runs.save_theory(d / "theory.json", theory)  # with its checksum, as gflow writes it
    return d


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert len(data) > 5000, f"{path} is suspiciously small ({len(data)} bytes)"
    return struct.unpack(">II", data[16:24])


def _save(fig, tmp_path, name, size=None):
    p = tmp_path / f"{name}.png"
    fig.savefig(p, dpi=gplot.DPI)
    w, h = _png_size(p)
    if size is not None:
        assert (w, h) == (round(size[0] * gplot.DPI), round(size[1] * gplot.DPI))
    return p


def _render(fig):
    """Lay out and draw at a low resolution: errors that only show at drawing
    time surface, at a fraction of the cost of a full-size PNG."""
    import io

    fig.savefig(io.BytesIO(), format="png", dpi=30)


@pytest.fixture
def one_figure(monkeypatch):
    """plot_run drawing the copier only: for tests of the files and paths, not
    of the figures."""
    monkeypatch.setattr(gplot, "_FIGURES", {"copier": gplot.plot_copier})


def _data_axes(fig):
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


# ---------------------------------------------------------------------------
# The figures
# ---------------------------------------------------------------------------


def test_c_frac_one_line_per_subset_per_stage(traj, theory, tmp_path):
    fig = gplot.plot_c_frac(traj, theory)
    axes = _data_axes(fig)
    assert len(axes) == 3
    cf = traj.c_frac
    for ax, code, t0 in zip(axes, (1, 2, 3), (0.0, 5.0, T0_III)):
        assert ax.get_xscale() == "log"
        lines = ax.get_lines()
        assert [ln.get_label() for ln in lines] == traj.labels == ["∅", "{1}", "{2}", "{1,2}"]
        idx = np.flatnonzero(traj.stage == code)
        idx = idx[traj.ts[idx] > t0]  # τ = 0 is not on a log axis
        for j, ln in enumerate(lines):
            np.testing.assert_allclose(ln.get_xdata(), traj.ts[idx] - t0)  # each stage's own clock
            np.testing.assert_allclose(ln.get_ydata(), cf[idx, j])
        # S* = {1,2} is the thick one
        assert lines[3].get_linewidth() > max(ln.get_linewidth() for ln in lines[:3])
    assert "III" in axes[2].get_xlabel() and "tau" in axes[2].get_xlabel()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == traj.labels
    # Stage I ends with c concentrated on {1,2}
    assert axes[0].get_lines()[3].get_ydata()[-1] > 0.9
    _save(fig, tmp_path, "c_frac")


def test_c_frac_selected_stages(traj, theory):
    fig = gplot.plot_c_frac(traj, theory, stages=["I"])
    assert len(_data_axes(fig)) == 1
    with pytest.raises(ValueError, match="no saved points in the stages"):
        gplot.plot_c_frac(traj, theory, stages=["IV"])


def test_copier_heatmaps_hold_s_before_and_after(traj, theory, tmp_path):
    fig = gplot.plot_copier(traj, theory)
    axes = _data_axes(fig)
    assert len(axes) == 2 and len(fig.axes) == 3  # two heatmaps and a colorbar
    for ax, i in zip(axes, (0, -1)):
        (im,) = ax.get_images()
        np.testing.assert_allclose(im.get_array(), traj.s[i])
        vals = sorted(float(t.get_text()) for t in ax.texts)
        np.testing.assert_allclose(vals, np.sort(traj.s[i].ravel()), atol=5e-4)
        # the selected heads' cells s^(h)_h are outlined
        assert len(ax.patches) == 2
    assert traj.s[-1, 0, 0] > traj.s[0, 0, 0]
    _save(fig, tmp_path, "copier")


def test_a_vs_logt_slope_is_an_independent_least_squares(traj, theory, tmp_path):
    fig = gplot.plot_a_vs_logt(traj, theory)
    (ax,) = fig.axes
    assert ax.get_xscale() == "log"
    lo, hi = theory["stage3"]["window"]
    # independent fit: Stage III points with a in the window, against ln(t - t_III)
    m = (traj.stage == 3) & (traj.a >= lo) & (traj.a <= hi)
    assert 5 < m.sum() < (traj.stage == 3).sum()
    slope, icpt = np.polyfit(np.log(traj.ts[m] - T0_III), traj.a[m], 1)
    assert abs(slope - 1.0) > 0.05  # the synthetic path is not slope 1: the test can tell
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    (fit_label,) = [s for s in labels if "slope" in s and "least squares" in s]
    shown = float(re.search(r"slope (-?[0-9.]+)", fit_label).group(1))
    assert shown == pytest.approx(slope, abs=6e-5)
    assert f"n = {m.sum()}" in fit_label
    fit = gplot.fit_a_log_tau(traj, theory)
    assert fit["slope"] == pytest.approx(slope, rel=1e-10)
    assert fit["intercept"] == pytest.approx(icpt, rel=1e-10)
    # the data line is against τ, not t; a* is a horizontal line
    (data,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("$a(")]
    np.testing.assert_allclose(data.get_xdata(), traj.ts[traj.stage == 3] - T0_III)
    (astar,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("$a^*$")]
    assert set(np.ravel(astar.get_ydata())) == {3.5}
    assert "t_{\\rm III}" in ax.get_xlabel()
    _save(fig, tmp_path, "a_vs_logt", size=SIZE_SINGLE)


def test_fit_needs_a_window(traj, theory):
    assert gplot.fit_a_log_tau(traj, None) is None
    narrow = json.loads(json.dumps(theory.to_json()))
    narrow["laws"]["{1,2}"]["window"] = [10.0, 11.0]  # no saved a there
    assert gplot.fit_a_log_tau(traj, narrow) is None
    gplot.plot_a_vs_logt(traj, narrow)  # still draws, without the fit


def test_rate_is_minus_eta_grad_times_exp_a(traj, theory, tmp_path):
    fig = gplot.plot_rate(traj, theory)
    (ax,) = fig.axes
    m = traj.stage == 3
    (eb,) = ax.containers
    x, y = eb.lines[0].get_data()
    np.testing.assert_allclose(x, traj.a[m])
    np.testing.assert_allclose(y, -ETA_A * traj.grad_a[m] * np.exp(traj.a[m]))
    (curve,) = [ln for ln in ax.get_lines() if "F(a)" in ln.get_label()]
    ca, cy = curve.get_data()
    np.testing.assert_allclose(
        cy, np.interp(ca, theory["stage3"]["curve"]["a"], theory["stage3"]["curve"]["Fexp"])
    )
    labels = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    for key in ("C^*", "C^*/2", "window", "a^*", "±1 SE"):
        assert key in labels
    assert ax.get_xlim()[1] < 10  # not the whole theory grid (up to a = 30)
    _save(fig, tmp_path, "rate", size=SIZE_SINGLE)


def test_loss_panels_and_limit(traj, theory, tmp_path):
    fig = gplot.plot_loss(traj, theory)
    axes = _data_axes(fig)
    assert len(axes) == 3
    lim = theory["stage3"]["limit_loss"]
    for ax, code, t0 in zip(axes, (1, 2, 3), (0.0, 5.0, T0_III)):
        (L,) = [ln for ln in ax.get_lines() if "loss" in ln.get_label()]
        idx = np.flatnonzero((traj.stage == code) & (traj.ts > t0))
        np.testing.assert_allclose(L.get_xdata(), traj.ts[idx] - t0)
        np.testing.assert_allclose(L.get_ydata(), traj.loss[idx])
        (hl,) = [ln for ln in ax.get_lines() if "GIH limit" in ln.get_label()]
        assert set(np.ravel(hl.get_ydata())) == {lim}
        # the change of loss over the stage, from the previous stage's last state
        i0 = max(idx[0] - 1, 0) if code > 1 else 0
        dL = traj.loss[np.flatnonzero(traj.stage == code)[-1]] - traj.loss[i0]
        assert rf"$\Delta L$ = {dL:+.2g}" in ax.get_title()
    # the GIH's loss along the measured a, in Stage III only
    assert any("L_{\\rm GIH}(a" in ln.get_label() for ln in axes[2].get_lines())
    assert not any("L_{\\rm GIH}(a" in ln.get_label() for ln in axes[0].get_lines())
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(f"{lim:.4g}" in s for s in legend) and any("SE" in s for s in legend)
    _save(fig, tmp_path, "loss")


def test_summary_page(traj, theory, tmp_path):
    fig = gplot.plot_summary(traj, theory)
    assert tuple(fig.get_size_inches()) == (15.0, 9.0)
    assert len(fig.subfigs) == 6
    # c (Stage I only), copier (2 + colorbar), a, loss (3 stages), rate, text
    assert len(fig.axes) == 1 + 3 + 1 + 3 + 1 + 1
    text = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "S* = argmax Ĩ = {1,2}" in text and "slope of a vs ln τ" in text
    _save(fig, tmp_path, "summary", size=(15, 9))


def test_joint_run_plots_against_t(theory, tmp_path):
    jt = _joint_traj()
    figs = {name: f(jt, theory) for name, f in gplot._FIGURES.items()}
    (ax,) = _data_axes(figs["c_frac"])
    assert ax.get_xlabel() == "$t$" and len(ax.get_lines()) == 4
    (ax,) = figs["a_vs_logt"].axes
    (data,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("$a(")]
    np.testing.assert_allclose(data.get_xdata(), jt.ts[jt.ts > 0])
    lo, hi = theory["stage3"]["window"]
    m = (jt.a >= lo) & (jt.a <= hi) & (jt.ts > 0)
    assert gplot.fit_a_log_tau(jt, theory)["slope"] == pytest.approx(
        np.polyfit(np.log(jt.ts[m]), jt.a[m], 1)[0]
    )
    _render(figs["summary"])  # every panel, compact


def test_run_without_stage_III_still_plots(traj, theory, tmp_path):
    part = _staged_traj()
    keep = part.stage < 3
    for k in gflow.trajectory._ARRAYS:
        setattr(part, k, getattr(part, k)[keep])
    part.stages = part.stages[:2]
    part.status = "running"
    assert gplot.fit_a_log_tau(part, theory) is None
    figs = {name: f(part, theory) for name, f in gplot._FIGURES.items()}
    assert "never moves" in figs["a_vs_logt"].axes[0].texts[0].get_text()
    assert len(_data_axes(figs["loss"])) == 2
    _render(figs["summary"])


def test_no_pyplot_state(traj, theory):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    gplot.plot_rate(traj, theory)
    gplot.plot_summary(traj, theory)
    assert plt.get_fignums() == before


# ---------------------------------------------------------------------------
# Run folders and the command line
# ---------------------------------------------------------------------------


def test_plot_run_writes_every_figure(run_dir, tmp_path):
    out = tmp_path / "figs"
    paths = gflow.plot_run(run_dir, out)
    assert [p.name for p in paths] == [f"{n}.png" for n in NAMES]
    for p in paths:
        assert p.parent == out
        _png_size(p)
    assert _png_size(out / "summary.png") == (1800, 1080)
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []  # no figure left in pyplot's state (the docs' examples collect those)


def test_plot_run_formats(run_dir, tmp_path, one_figure):
    (svg,) = gflow.plot_run(run_dir, tmp_path / "svg", fmt="svg")
    assert svg.name == "copier.svg" and svg.read_text().lstrip().startswith("<?xml")
    with pytest.raises(ValueError, match="fmt must be one of"):
        gflow.plot_run(run_dir, tmp_path, fmt="jpg")


def test_plot_run_on_a_folder_without_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no gflow run: expected trajectory.npz"):
        gflow.plot_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no gflow run"):
        gflow.plot_run(tmp_path / "nowhere")


def _without_config(th) -> dict:
    js = json.loads(json.dumps(th.to_json() if isinstance(th, Theory) else th))
    js.pop("config")
    js.pop("sha256", None)  # theory.json's checksum (of its content, config included)
    return js


def test_theory_is_computed_once_and_saved(traj, theory, tmp_path, monkeypatch, one_figure):
    import gflow.runs._folder

    calls = []

    def fake_report(data, model, estimator, init, **kw):
        calls.append((data, model, estimator, init, kw))
        return theory

    monkeypatch.setattr(gflow.runs._folder, "theory_report", fake_report)
    monkeypatch.setattr(gflow.runs._folder, "make_loss", lambda *cfgs: ("the run's loss", cfgs))
    d = tmp_path / "run"
    save(traj, d)
    (path,) = gflow.plot_run(d)
    assert len(calls) == 1 and path == d / "figures" / "copier.png"
    cfg = traj.config
    data, model, estimator, init, kw = calls[0]
    assert (data, model, estimator, init) == (cfg.data, cfg.model, cfg.estimator, cfg.init)
    assert kw["loss"] == ("the run's loss", (cfg.data, cfg.model, cfg.estimator))
    assert (kw["eta_C"], kw["delta"]) == (cfg.schedule.eta_C, cfg.schedule.delta)
    stored = json.loads((d / "theory.json").read_text())
    assert _without_config(stored) == _without_config(theory)
    # stamped with what it was computed for: the run's configuration key
    assert stored["config"]["estimator"]["seed"] == cfg.estimator.seed and stored["config"]["n_pi"] == 2000
    assert _without_config(gflow.runs.load_or_compute(d)[0]) == _without_config(theory)  # read back, not recomputed
    assert len(calls) == 1
    # a theory.json for another 𝒮, another configuration, or unreadable is recomputed
    other = json.loads(json.dumps(stored))
    other["config"]["data"]["L"] += 1
    wrong_sets = _theory([(), (1,)]).to_json()
    for text in (json.dumps(wrong_sets), json.dumps(other), "{not json"):
        (d / "theory.json").write_text(text)
        n = len(calls)
        assert _without_config(gflow.runs.load_or_compute(d)[0]) == _without_config(theory) and len(calls) == n + 1
        assert json.loads((d / "theory.json").read_text()) == stored


def test_theory_json_belongs_to_the_run_by_its_config(traj, theory, tmp_path, monkeypatch):
    """load_or_compute reuses a theory.json whose configuration key is the run's,
    and recomputes one with another estimator seed."""
    import gflow.runs._folder
    from gflow.runs import load_or_compute
    from gflow.theory._result import config_key

    cfg = traj.config
    key = config_key(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=2000, pi_seed=0,
                     eta_C=cfg.schedule.eta_C, delta=cfg.schedule.delta)  # fmt: skip
    key["n_pi_asked"] = 2000
    d = tmp_path / "run"
    save(traj, d)
    js = dataclasses.replace(theory, config=key).to_json()
    gflow.runs.save_theory(d / "theory.json", js)
    got, how = load_or_compute(d, traj)
    assert how == "reused" and got.S_star == (1, 2) and got.law((1, 2)).a_star == 3.5

    def fail(*a, **k):
        raise RuntimeError("recomputed")

    monkeypatch.setattr(gflow.runs._folder, "theory_report", fail)
    monkeypatch.setattr(gflow.runs._folder, "make_loss", lambda *cfgs: None)
    js["config"]["estimator"]["seed"] += 1
    gflow.runs.save_theory(d / "theory.json", js)  # a valid checksum, another key: recomputed
    with pytest.raises(RuntimeError, match="recomputed"):
        load_or_compute(d, traj)
    # the run's key, a valid file, but a* doubled by hand (checksum not updated): recomputed, not trusted
    js["config"]["estimator"]["seed"] -= 1
    gflow.runs.save_theory(d / "theory.json", js)
    tampered = json.loads((d / "theory.json").read_text())
    for law in tampered["laws"].values():
        if law.get("a_star") is not None:
            law["a_star"] *= 2
    (d / "theory.json").write_text(json.dumps(tampered))
    with pytest.raises(RuntimeError, match="recomputed"):
        load_or_compute(d, traj)


def test_cli_plot(run_dir, tmp_path, capsys, one_figure):
    assert main(["plot", str(run_dir)]) == 0
    _png_size(run_dir / "figures" / "copier.png")
    assert "figures:" in capsys.readouterr().out
    assert main(["plot", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "gflow plot: error:" in err and "holds no gflow run" in err


def test_cli_plot_out_and_format(run_dir, tmp_path, one_figure):
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "f"), "--format", "pdf"]) == 0
    assert (tmp_path / "f" / "copier.pdf").read_bytes()[:4] == b"%PDF"


@pytest.mark.slow
def test_real_pipeline(tmp_path):
    """Integrate a tiny configuration, then plot it with the real theory."""
    cfg = Config().replace(
        data={"d": 2, "L": 16}, model={"M": 2, "H": 2, "D": 2}, estimator={"N": 200},
        schedule={"durations": [1e3, 1e10, 1e3]}, solver={"save_per_decade": 4},
    )  # fmt: skip
    gflow.integrate(cfg, out=tmp_path)
    paths = gflow.plot_run(tmp_path)
    assert (tmp_path / "theory.json").is_file()
    for p in paths:
        _png_size(p)
