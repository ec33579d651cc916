"""Evaluation off the training distribution (docs/theory/mathematics.md §M8.4): the training
configuration reproduces the run's final loss, and bad configurations are
clear errors raised before any computation."""

import csv
import json

import numpy as np
import pytest

import gflow
from gflow import evaluate
from gflow.cli import main


def test_gflow_evaluate_is_the_function():
    """`gflow.evaluate` is the function, not a module it could be confused with: its
    implementation module is private, and no module `gflow.evaluate` exists."""
    import importlib
    import inspect

    assert inspect.isfunction(gflow.evaluate) and callable(gflow.evaluate)
    assert gflow.evaluate is evaluate is importlib.import_module("gflow.runs._evaluate").evaluate
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("gflow.evaluate")
    with pytest.raises(TypeError):  # a function's signature, not a module's attribute lookup
        gflow.evaluate()


def test_eval_at_the_training_configuration_reproduces_the_final_loss(small_run, small_loss, tmp_path):
    traj, _ = small_run
    L = traj.config.data.L
    res = evaluate(traj, [f"data.L={L}"], out=tmp_path, plot=False)
    row = res.rows[0]
    # the same sample, θ and loss: equal to the last bit or two (the run's statistics are
    # compiled for a block of saved times, so XLA may order the final sum differently)
    assert abs(row["loss"] - float(traj.loss[-1])) <= 4 * np.spacing(float(traj.loss[-1]))
    assert row["loss_se"] == pytest.approx(float(traj.loss_se[-1]), rel=1e-12)
    assert row["unseen"] == pytest.approx(float(traj.unseen[-1]), rel=1e-12)
    # the ladder is the one of the run's own sample
    np.testing.assert_allclose(res.ladders[0].values["flow"], np.asarray(small_loss.per_sequence(
        gflow.Params(w=traj.w[-1], C=traj.C[-1], a=traj.a[-1]))), rtol=1e-13)  # fmt: skip
    assert res.S == tuple(traj.stages[1].selected)
    with open(tmp_path / "eval.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert float(rows[0]["loss"]) == row["loss"] and rows[0]["data.L"] == str(L)
    js = json.loads((tmp_path / "eval.json").read_text())
    names = [r["name"] for r in js["points"][0]["ladder"]["rungs"]]
    assert names == ["oracle", "bayes", "gih", "unigram", "flow", "uniform", "unigram+1", "bigram+1"]
    assert js["points"][0]["loss"] == row["loss"]


def test_eval_builds_the_runs_own_loss_for_the_official_options(tmp_path):
    """``gflow eval`` builds its loss by ``make_loss``, as the run did: with the official code's
    options (shifted windows, whose span H+M−1 exceeds M; the drawn target e(y)) the training
    configuration reproduces the run's final loss, and the oracle rung predicts with π(·|z_q),
    not with the drawn token (a loss of about 0)."""
    cfg = gflow.Config().replace(data={"L": 12}, model={"windows": "shifted"}, estimator={"N": 120, "target": "drawn"},
                                 schedule={"kind": "joint", "t1": 0.3}, solver={"save_per_decade": 2})  # fmt: skip
    traj = gflow.integrate(cfg)
    res = evaluate(traj, ["data.L=12"], plot=False)
    assert abs(res.rows[0]["loss"] - float(traj.loss[-1])) <= 4 * np.spacing(float(traj.loss[-1]))
    loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    assert np.all(np.asarray(loss.feats.cond).max(-1) == 1.0)  # the run's targets are one-hot e(y)
    lad = res.ladders[0]  # the oracle's log loss against e(y) has mean E H(π(·|z_q)), not the drawn token's ≈ 0
    assert lad.mean("oracle") > 0.05 and abs(lad.mean("oracle") - lad.entropy) <= 4 * lad.se("oracle")


def _empty_run(**sections):
    cfg = gflow.Config().replace(**sections) if sections else gflow.Config()
    m = cfg.model
    return gflow.Trajectory.empty(cfg, m.H, m.M, len(m.subsets))


@pytest.mark.parametrize(
    "param,match",
    [
        ("data.d=4", r"data\.d cannot change .*run has data\.d = 3, asked 4"),
        ("model.H=2", r"model\.H cannot change \(the parameters' shapes.*run has model\.H = 3"),
        ("estimator.eps=0.1", r"estimator\.eps cannot change"),
        ("data.LL=5", r"unknown config field 'data\.LL'"),
        ("data.L=0", r"data\.L must be an integer >= the largest parent offset"),
    ],
)
def test_eval_bad_configuration_is_a_clear_error(param, match):
    with pytest.raises(ValueError, match=match):
        evaluate(_empty_run(), [param])


def test_eval_cli_bad_input_exit_code_2(tmp_path, capsys):
    traj = _empty_run()
    from gflow.trajectory import save

    save(traj, tmp_path)
    assert main(["eval", str(tmp_path), "--param", "model.H=2"]) == 2
    err = capsys.readouterr().err
    assert "gflow eval: error:" in err and "model.H" in err
    assert not (tmp_path / "eval").exists()
