"""Issue 24: no traceback from any input. A seeded fuzz of generated configurations (valid and
invalid: huge, negative, wrong types, NaN/inf, bools, nested lists, ragged and deep kernels, bad
methods, unknown keys, sizes beyond memory) through ``gflow run CONFIG --dry-run`` in-process
(validation and the memory preflight, no compute): every invalid one exits 2 with one message
naming a key, every valid one passes, no traceback, no hang. The generator and the classes are
those of ``tests/fuzz_inputs.py``, which prints the counts for larger samples."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_inputs", ROOT / "tests" / "fuzz_inputs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fuzz_every_input_is_answered_cleanly(tmp_path, monkeypatch):
    fz = _fuzz()
    monkeypatch.setenv("GFLOW_MAX_MEMORY", "8G")  # the classes must not depend on the machine
    monkeypatch.setenv("GFLOW_CACHE", "none")
    cases = fz.generate(220, seed=24)
    expects = Counter(e for _, _, e in cases)
    assert expects["invalid"] >= 100 and expects["valid"] >= 30 and expects["either"] >= 5, expects
    counts, bad = Counter(), []
    for i, (d, keys, expect) in enumerate(cases):
        cls, out = fz.classify(d, keys, expect, tmp_path, timeout=20.0)
        counts[cls] += 1
        if cls not in ("clean", "clean (other key)", "accepted"):
            bad.append((i, cls, keys, d, out[:400]))
        if expect in ("invalid", "either") and cls.startswith("clean"):
            assert out.count("\n") == 1 and out.startswith("gflow run: error: "), out  # one line
    assert not bad, bad[:5]
    assert counts["clean"] + counts["clean (other key)"] >= expects["invalid"], counts


@pytest.mark.parametrize(
    "toml, fragment",
    [
        ("[model]\nM = 1000000000000000000000000000000\n", "model.M must be an integer <= 1024"),
        ("[estimator]\nseed = 9223372036854775807\n", "estimator.seed must be an integer <= 4294967295"),
        ("[data]\nburn_in = 1000000000\n", "data.burn_in must be an integer <= 10000000"),
        ("[data]\nburn_in = 10000000\n", "data.burn_in"),  # within the bound: the preflight refuses it
        ("[data]\nparents = [20]\nL = 40\n", "data.parents"),
        ("[data]\nparents = [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]\nL = 40\n", "data.parents"),
        ("[model]\nM = 8\n[estimator]\nlayout = 'counts'\n", "model.M"),
        ("[model]\nH = 30\nM = 30\nD = 30\n", "model.H = 30 with model.D = 30"),
        ("[model]\nH = 30\nM = 30\nD = 3\n", "model.M"),
        ("[solver]\nmethod = ['tsit5']\n", "solver.method as a list needs one entry per stage"),
        ("[solver]\nmax_steps = 1000000000000000000000000000000\n", "solver.max_steps must be an integer <="),
        ("[init]\na0 = 1e308\n", "init.a0 must satisfy |a0| <= 709.783"),
        ("[init]\nw_plus = 1e308\nw_minus = -1e308\n", "init.w_plus must satisfy"),
        ("[init]\nw_plus = 400.0\nw_minus = -400.0\n", "init.w_plus and init.w_minus must satisfy |w_plus − w_minus|"),
        ("[data]\nkernel = [[1.0, 0.0], [0.5]]\n", "data.kernel must be rectangular"),
    ],
)
def test_issue_cases_exit_2_naming_the_key(tmp_path, capsys, monkeypatch, toml, fragment):
    from gflow.cli import main

    monkeypatch.setenv("GFLOW_MAX_MEMORY", "8G")
    p = tmp_path / "c.toml"
    p.write_text(toml)
    assert main(["run", str(p), "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()  # refused before anything is created


def test_config_path_kinds_are_named(tmp_path, capsys):
    from gflow.cli import main

    for path, what in ((tmp_path, "is a directory"), ("/dev/null", "is a character device"),
                       (tmp_path / "nope.toml", "does not exist")):  # fmt: skip
        assert main(["run", str(path), "--out", str(tmp_path / "o"), "--dry-run"]) == 2
        assert what in capsys.readouterr().err
    deep = tmp_path / "deep.toml"
    deep.write_text("[data]\nkernel = " + "[" * 3000 + "0.5" + "]" * 3000 + "\n")
    assert main(["run", str(deep), "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    assert "nests arrays or tables too deeply" in capsys.readouterr().err


def test_memory_budget_override(tmp_path, capsys, monkeypatch):
    """GFLOW_MAX_MEMORY replaces the available memory: a budget below the estimate refuses naming
    the keys and the estimate, `none` turns the preflight off, a bad value names the variable."""
    from gflow.cli import main

    argv = ["run", "--out", str(tmp_path / "o"), "--dry-run"]
    monkeypatch.setenv("GFLOW_MAX_MEMORY", "100M")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "needs about" in err and "more than the 105 MB available (GFLOW_MAX_MEMORY=100M)" in err
    assert "estimator.N" in err
    monkeypatch.setenv("GFLOW_MAX_MEMORY", "none")
    assert main(argv) == 0 and "memory estimate" in capsys.readouterr().out
    monkeypatch.setenv("GFLOW_MAX_MEMORY", "lots")
    assert main(argv) == 2 and "GFLOW_MAX_MEMORY must be a size" in capsys.readouterr().err
