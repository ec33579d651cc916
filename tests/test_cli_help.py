"""The command line explains itself: a description, examples and the exit codes in
``gflow --help``, a description for every subcommand and help for every argument,
``--version``, and the progress options of SGD and the SDE."""

from __future__ import annotations

import argparse

import pytest

import gflow
from gflow import cli


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_help_has_description_examples_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out  # no reStructuredText leaking through
    assert "Unveiling Induction Heads" in out and "examples:" in out
    for code in (cli.EXIT_OK, cli.EXIT_VERDICT, cli.EXIT_INPUT, cli.EXIT_FAILED, cli.EXIT_UNEXPECTED, cli.EXIT_INTERRUPTED):
        assert f"\n  {code} " in out, code
    assert "lin:A:B:N" in out and "data.parents=[1],[1,2]" in out


def test_every_subcommand_and_argument_is_described():
    subs = _subparsers(cli.build_parser())
    assert set(subs) == {"run", "theory", "check", "sweep", "eval", "phase", "phase-merge", "plot", "limit"}
    for name, sp in subs.items():
        assert sp.description and len(sp.description) > 40, name
        for a in sp._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            assert a.help, f"gflow {name}: {a.dest} has no help"


def test_one_param_syntax():
    """sweep, phase, eval and limit document --param the same way, and the documented forms parse."""
    from gflow.runs._sweep import parse_param

    helps = {
        name: next(a.help for a in sp._actions if a.dest == "param")
        for name, sp in _subparsers(cli.build_parser()).items()
        if any(a.dest == "param" for a in sp._actions)
    }
    assert set(helps) == {"run", "sweep", "phase", "eval", "limit"}
    run = helps.pop("run")  # one value a field, in the grids' syntax
    assert "one value each, the sweep's syntax" in run and "gflow sweep" in run
    assert all(h.startswith(cli.PARAM_HELP) for h in helps.values())
    assert parse_param("data.parents=[1],[1,2]") == ("data.parents", [[1], [1, 2]])
    assert parse_param("data.L=50,100,200") == ("data.L", [50, 100, 200])
    assert parse_param("init.w_plus=log:1:100:3")[1] == pytest.approx([1.0, 10.0, 100.0])


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"gflow {gflow.__version__}"


@pytest.mark.parametrize("quiet", [False, True])
def test_run_announces_the_compilation(tmp_path, capsys, monkeypatch, quiet):
    """``gflow run`` prints the compiling line before the long silent compilation (the
    integration, stubbed here), and nothing of it with --quiet."""
    import importlib
    import inspect
    import re

    where = re.search(r"from \.\.(\S+) import .*\bintegrate\b", inspect.getsource(cli._commands._run)).group(1)
    mod = importlib.import_module(f"gflow.{where}")

    def stub(*args, **kwargs):
        print("INTEGRATING")
        raise ValueError("stopped by the test")

    monkeypatch.setattr(mod, "integrate", stub)
    code = cli.main(["run", "--out", str(tmp_path / "run"), *(["--quiet"] if quiet else [])])
    assert code == cli.EXIT_INPUT
    out = capsys.readouterr().out
    assert "INTEGRATING" in out
    if quiet:
        assert "compiling" not in out
    else:
        assert "compiling (first run" in out and out.index("compiling") < out.index("INTEGRATING")


# the tiny size of docs/examples/stochastic_vs_flow.py: the compiled programs are shared
_TINY = dict(data={"L": 20}, estimator={"N": 200}, schedule={"kind": "joint", "t1": 5.0})


def test_sgd_progress(capsys):
    cfg = gflow.Config().replace(**_TINY)
    gflow.sgd(cfg, gflow.SGDConfig(eta=0.05, batch=20, steps=100, seeds=4), progress=True)
    err = capsys.readouterr().err
    assert "gflow.sgd" in err and "100/100" in err
    gflow.sgd(cfg, gflow.SGDConfig(eta=0.05, batch=20, steps=100, seeds=4))
    assert "gflow.sgd" not in capsys.readouterr().err  # off by default


def test_sde_progress(capsys):
    import inspect

    cfg = gflow.Config().replace(**_TINY)
    gflow.sde(cfg, gflow.SDEConfig(eta=0.05, batch=20, t1=5.0, seeds=4), progress=True)
    assert "100.00%" in capsys.readouterr().err
    assert inspect.signature(gflow.sde).parameters["progress"].default is False  # off by default
