"""Run configuration (gflow/config.py): TOML files, defaults, errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

import gflow
import gflow.cli
from gflow.config import Config, from_dict, load_config


def test_empty_file_is_the_paper_default(tmp_path):
    p = tmp_path / "empty.toml"
    p.write_text("")
    assert load_config(p) == Config()
    assert load_config(None) == Config()
    c = Config()
    # the paper's defaults (docs/theory/mathematics.md §M1, §M2, §M4)
    assert (c.data.d, c.data.parents, c.data.alpha, c.data.L) == (3, (1, 2), 0.1, 100)
    assert (c.model.M, c.model.H, c.model.D, c.model.norm) == (3, 3, 2, "sum")
    assert (c.init.w_plus, c.init.w_minus, c.init.c0, c.init.a0) == (3.0, 0.1, 0.01, 0.01)
    assert c.schedule.kind == "staged" and c.solver.method == "tsit5" and c.estimator.eps == 1e-6


def test_toml_fields_are_read(tmp_path):
    p = tmp_path / "run.toml"
    p.write_text(
        '[data]\nL = 40\nparents = [1, 3]\nalpha = 1\n'
        '[schedule]\nkind = "joint"\nt1 = 100\n'
        '[solver]\nmethod = ["tsit5", "tsit5", "kvaerno5"]\n'
        '[estimator]\nN = 2000\nseed = 7\n'
    )
    c = load_config(p)
    assert c.data.L == 40 and c.data.parents == (1, 3) and c.data.alpha == 1.0
    assert c.schedule.kind == "joint" and c.schedule.t1 == 100.0
    assert c.solver.method_for("III") == "kvaerno5" and c.solver.method_for("I") == "tsit5"
    assert c.estimator.N == 2000 and c.estimator.seed == 7
    assert from_dict(c.to_dict()) == c


@pytest.mark.parametrize(
    "text, match",
    [
        ("[data]\nLL = 3\n", r"unknown config key data\.LL"),
        ("[dta]\nL = 3\n", r"unknown config section 'dta'"),
        ("[data]\nL = 1\n", r"data\.L must be"),
        ("[data]\nparents = [2, 1]\n", r"data\.parents must be strictly increasing"),
        ("[model]\nnorm = 'batch'\n", r"model\.norm must be one of"),
        ("[init]\nc0 = 0\n", r"init\.c0 must be non-zero"),
        ("[schedule]\nkind = 'mixed'\n", r"schedule\.kind must be one of"),
        ("[schedule]\ndurations = [1, 2]\n", r"schedule\.durations must be three"),
        ("[schedule]\ndelta = 1.5\n", r"schedule\.delta must be in \(0, 1\)"),
        ("[schedule]\neta_C = -1\n", r"schedule\.eta_C must be"),
        ("[solver]\nmethod = 'rk4'\n", r"solver\.method must be one of"),
        ("[solver]\nmethod = ['gd', 'tsit5', 'tsit5']\n", r"solver\.method: 'gd' cannot be mixed"),
        ("[solver]\nmethod = ['sgd', 'tsit5', 'tsit5']\n", r"solver\.method: 'sgd' cannot be mixed"),
        ("[solver]\nmethod = 'sgd'\n", r"solver\.method = 'sgd' needs schedule\.kind = 'joint'"),
        ("[solver]\nmethod = 'sdg'\n", r"solver\.method must be one of \('tsit5', 'kvaerno5', 'heun', 'gd', 'modified', 'central', 'sgd', 'sde'\)"),
        ("[solver]\nrtol = 0\n", r"solver\.rtol must be"),
        ("[solver]\nsave_per_decade = 0\n", r"solver\.save_per_decade must be an integer >= 1"),
        ("[solver]\ntau_min = 0\n", r"solver\.tau_min must be"),
        ("[estimator]\nN = 0\n", r"estimator\.N must be"),
        ("[estimator]\nchunk = -1\n", r"estimator\.chunk must be"),
        ("[model]\nH = 4\n", r"model\.D must be|model\.H must be <= model\.M"),
        ("[data]\nL = 'x'\n", r"data\.L must be"),
        ("[data\n", r"not valid TOML"),
    ],
)
def test_bad_values_name_the_key(tmp_path, text, match):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ValueError, match=match):
        load_config(p)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"config file .* does not exist"):
        load_config(tmp_path / "nope.toml")


def test_replace_and_unknown_section():
    c = Config().replace(data={"L": 40})
    assert c.data.L == 40 and c.data.d == 3
    with pytest.raises(ValueError, match=r"unknown config section 'model_'"):
        Config().replace(model_={"M": 3})
    with pytest.raises(ValueError, match=r"unknown config key estimator\.n"):
        Config().replace(estimator={"n": 3})


def test_cli_reports_config_errors(tmp_path, capsys):
    p = tmp_path / "bad.toml"
    p.write_text("[data]\nLL = 3\n")
    rc = gflow.cli.main(["run", str(p), "--out", str(tmp_path / "out")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown config key data.LL" in err
    assert not (tmp_path / "out").exists()  # raised before anything was computed


# ---------------------------------------------------------------------------
# Issue 13: every key type-checked; a table-driven sweep of bad configurations
# ---------------------------------------------------------------------------

# (TOML text, the key the error must name, a fragment of the value it must show)
BAD_CONFIGS = [
    # bools where numbers are expected (bool is not an int in gflow)
    ("[estimator]\nN = true", "estimator.N", "True"),
    ("[estimator]\nseed = false", "estimator.seed", "False"),
    ("[estimator]\nchunk = true", "estimator.chunk", "True"),
    ("[estimator]\neps = true", "estimator.eps", "True"),
    ("[data]\nL = true", "data.L", "True"),
    ("[data]\nd = true", "data.d", "True"),
    ("[data]\nburn_in = true", "data.burn_in", "True"),
    ("[data]\nalpha = false", "data.alpha", "False"),
    ("[data]\nparents = [true, 2]", "data.parents", "True"),
    ("[model]\nM = true", "model.M", "True"),
    ("[model]\nH = false", "model.H", "False"),
    ("[model]\nD = true", "model.D", "True"),
    ("[init]\nc0 = true", "init.c0", "True"),
    ("[init]\nw_plus = true", "init.w_plus", "True"),
    ("[schedule]\ndelta = true", "schedule.delta", "True"),
    ("[schedule]\nt1 = true", "schedule.t1", "True"),
    ("[schedule]\ndurations = [true, 1, 1]", "schedule.durations", "True"),
    ("[solver]\nrtol = true", "solver.rtol", "True"),
    ("[solver]\natol = true", "solver.atol", "True"),
    ("[solver]\nmax_steps = true", "solver.max_steps", "True"),
    ("[solver]\nsave_per_decade = true", "solver.save_per_decade", "True"),
    ("[solver]\neta = true", "solver.eta", "True"),
    # floats where integers are expected (never truncated)
    ("[data]\nparents = [1.7, 2.2]", "data.parents", "1.7"),
    ("[data]\nL = 40.0", "data.L", "40.0"),
    ("[data]\nd = 3.5", "data.d", "3.5"),
    ("[data]\nburn_in = 1.0", "data.burn_in", "1.0"),
    ("[model]\nM = 3.0", "model.M", "3.0"),
    ("[model]\nH = 2.5", "model.H", "2.5"),
    ("[model]\nD = 1.0", "model.D", "1.0"),
    ("[estimator]\nN = 2000.0", "estimator.N", "2000.0"),
    ("[estimator]\nN = 1e4", "estimator.N", "10000.0"),
    ("[estimator]\nseed = 0.5", "estimator.seed", "0.5"),
    ("[estimator]\nchunk = 10.0", "estimator.chunk", "10.0"),
    ("[solver]\nmax_steps = 1e5", "solver.max_steps", "100000.0"),
    ("[solver]\nsave_per_decade = 12.0", "solver.save_per_decade", "12.0"),
    # strings where numbers are expected
    ("[data]\nalpha = '0.1'", "data.alpha", "'0.1'"),
    ("[data]\nL = '40'", "data.L", "'40'"),
    ("[data]\nparents = ['a', 'b']", "data.parents", "'a'"),
    ("[data]\nkernel = 'uniform'", "data.kernel", "'uniform'"),
    ("[data]\nkernel = [[0.5, 'x']]", "data.kernel", "'x'"),
    ("[estimator]\neps = '1e-6'", "estimator.eps", "'1e-6'"),
    ("[estimator]\nN = '2000'", "estimator.N", "'2000'"),
    ("[init]\nw_plus = 'big'", "init.w_plus", "'big'"),
    ("[init]\nc0 = '0.01'", "init.c0", "'0.01'"),
    ("[schedule]\ndelta = '0.01'", "schedule.delta", "'0.01'"),
    ("[schedule]\nt1 = '1e6'", "schedule.t1", "'1e6'"),
    ("[schedule]\ndurations = ['1e3', 1, 1]", "schedule.durations", "'1e3'"),
    ("[schedule]\ndurations = 'long'", "schedule.durations", "'long'"),
    ("[schedule]\neta_w = 'fast'", "schedule.eta_w", "'fast'"),
    ("[solver]\nrtol = '1e-8'", "solver.rtol", "'1e-8'"),
    ("[solver]\ntau_min = 'small'", "solver.tau_min", "'small'"),
    # other wrong types
    ("[solver]\nmethod = 5", "solver.method", "5"),
    ("[solver]\nmethod = [1, 2, 3]", "solver.method", "[1, 2, 3]"),
    ("[solver]\nprogress = 1", "solver.progress", "1"),
    ("[schedule]\nevents = 'yes'", "schedule.events", "'yes'"),
    ("[schedule]\nevents = 0", "schedule.events", "0"),
    ("[estimator]\nshard = 'no'", "estimator.shard", "'no'"),
    ("[estimator]\ndtype = 32", "estimator.dtype", "32"),
    ("[estimator]\nloss = 1", "estimator.loss", "1"),
    ("[estimator]\nlayout = false", "estimator.layout", "False"),
    ("[model]\nnorm = 1", "model.norm", "1"),
    ("[schedule]\nkind = true", "schedule.kind", "True"),
    ("[data]\nstart = 0", "data.start", "0"),
    ("[data]\nalpha = [0.1]", "data.alpha", "[0.1]"),
    ("[estimator]\nN = [2000]", "estimator.N", "[2000]"),
    ("[data]\nL = {x = 1}", "data.L", "{'x': 1}"),
    # NaN and infinities
    ("[data]\nalpha = nan", "data.alpha", "nan"),
    ("[data]\nalpha = inf", "data.alpha", "inf"),
    ("[estimator]\neps = nan", "estimator.eps", "nan"),
    ("[init]\nc0 = inf", "init.c0", "inf"),
    ("[init]\nw_minus = -inf", "init.w_minus", "-inf"),
    ("[init]\na0 = nan", "init.a0", "nan"),
    ("[schedule]\ndelta = nan", "schedule.delta", "nan"),
    ("[schedule]\nt1 = inf", "schedule.t1", "inf"),
    ("[schedule]\ndurations = [1e3, inf, 1e4]", "schedule.durations", "inf"),
    ("[schedule]\neta_a = nan", "schedule.eta_a", "nan"),
    ("[solver]\nrtol = nan", "solver.rtol", "nan"),
    ("[solver]\neta = inf", "solver.eta", "inf"),
    ("[data]\nkernel = [[nan, 1.0]]", "data.kernel", "nan"),
    # out of range
    ("[data]\nd = 1", "data.d", "1"),
    ("[data]\nL = 1", "data.L", "1"),
    ("[data]\nalpha = -0.1", "data.alpha", "-0.1"),
    ("[data]\nparents = [0, 1]", "data.parents", "0"),
    ("[data]\nburn_in = -1", "data.burn_in", "-1"),
    ("[model]\nM = 0", "model.M", "0"),
    ("[model]\nD = 5", "model.D", "5"),
    ("[init]\nc0 = 0", "init.c0", "0"),
    ("[init]\nc0 = 1e-200", "init.c0", "1e-200"),
    ("[init]\nc0 = 1e300", "init.c0", "1e+300"),
    ("[schedule]\ndelta = 1.5", "schedule.delta", "1.5"),
    ("[schedule]\ndelta = 0", "schedule.delta", "0"),
    ("[schedule]\ndurations = [1, 2]", "schedule.durations", "(1.0, 2.0)"),
    ("[schedule]\ndurations = [1, -2, 3]", "schedule.durations", "-2.0"),
    ("[schedule]\neta_C = -1", "schedule.eta_C", "-1"),
    ("[schedule]\nt1 = 0", "schedule.t1", "0"),
    ("[solver]\nrtol = -1e-8", "solver.rtol", "-1e-08"),
    ("[solver]\nmax_steps = 0", "solver.max_steps", "0"),
    ("[solver]\nmethod = 'rk4'", "solver.method", "'rk4'"),
    ("[estimator]\nN = 0", "estimator.N", "0"),
    ("[estimator]\nN = -5", "estimator.N", "-5"),
    ("[estimator]\neps = -1e-6", "estimator.eps", "-1e-06"),
    ("[estimator]\ndtype = 'float16'", "estimator.dtype", "'float16'"),
    ("[estimator]\nlayout = 'rows'", "estimator.layout", "'rows'"),
    # unknown keys and sections
    ("[data]\nLL = 40", "data.LL", "data.LL"),
    ("[estimator]\nn = 2000", "estimator.n", "estimator.n"),
    ("[solver]\nRtol = 1e-8", "solver.Rtol", "solver.Rtol"),
    ("[model]\nheads = 3", "model.heads", "model.heads"),
    ("[dataa]\nL = 40", "'dataa'", "dataa"),
    ("L = 40", "'L'", "L"),
]


def _bad_ids():
    return [f"{i:03d}-{key}" for i, (_, key, _) in enumerate(BAD_CONFIGS)]


def test_bad_config_table_is_large():
    assert len(BAD_CONFIGS) >= 80
    assert len({t for t, _, _ in BAD_CONFIGS}) == len(BAD_CONFIGS)


@pytest.mark.parametrize("text, key, shown", BAD_CONFIGS, ids=_bad_ids())
def test_bad_config_names_key_and_value(tmp_path, text, key, shown):
    p = tmp_path / "bad.toml"
    p.write_text(text + "\n")
    with pytest.raises(ValueError) as e:
        load_config(p)
    msg = str(e.value)
    assert key in msg and shown in msg and "\n" not in msg, msg


def test_bad_configs_exit_2_before_any_compute(tmp_path, capsys, monkeypatch):
    """All of BAD_CONFIGS through `gflow run`: exit 2, the key named, no sampling or integration
    reached (both replaced by functions that fail the test), no output folder created."""
    import gflow.core._loss
    import gflow.dynamics._flow

    def boom(*a, **k):
        raise AssertionError("compute reached")

    monkeypatch.setattr(gflow.runs, "integrate", boom)
    monkeypatch.setattr(gflow.dynamics._flow, "make_loss", boom)
    monkeypatch.setattr(gflow.core._loss, "make_loss", boom)
    clean = 0
    for i, (text, key, _) in enumerate(BAD_CONFIGS):
        p = tmp_path / f"bad{i}.toml"
        p.write_text(text + "\n")
        out = tmp_path / f"out{i}"
        rc = gflow.cli.main(["run", str(p), "--out", str(out), "--quiet"])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("gflow run: error:") and key in err, (text, rc, err)
        assert not out.exists()
        clean += 1
    assert clean == len(BAD_CONFIGS)


def test_bad_config_subprocess_sample(tmp_path):
    """One real process: exit status 2 and a one-line message (no traceback)."""
    import os
    import subprocess
    import sys

    p = tmp_path / "bad.toml"
    p.write_text("[estimator]\nN = true\n")
    env = dict(os.environ, PYTHONPATH=str(Path(gflow.__file__).parents[1]), GFLOW_CACHE="none")
    r = subprocess.run([sys.executable, "-m", "gflow", "run", str(p), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, env=env, timeout=120, check=False)  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "gflow run: error: estimator.N must be an integer (not a float or a bool), got True (bool)"
    )


def test_every_field_has_a_type():
    """Adding a key to a section needs its line in config._KEY_TYPES."""
    import dataclasses

    from gflow.config import _KEY_TYPES, _SECTIONS

    missing = [f"{s}.{f.name}" for s, cls in _SECTIONS.items() for f in dataclasses.fields(cls)
               if f"{s}.{f.name}" not in _KEY_TYPES]  # fmt: skip
    assert missing == []


def test_binary_config_file_is_named(tmp_path):
    p = tmp_path / "model.bin"
    p.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"config file '.*model\.bin' is not a text \(UTF-8\) TOML file"):
        load_config(p)


def test_ints_of_float_keys_become_floats_and_good_values_pass(tmp_path):
    c = from_dict({"data": {"alpha": 1}, "schedule": {"durations": [1, 2, 3]}, "init": {"c0": 1}})
    assert type(c.data.alpha) is float and c.schedule.durations == (1.0, 2.0, 3.0) and c.init.c0 == 1.0
    assert from_dict(Config().to_dict()) == Config()  # None kernel, lists, bools round-trip


def test_small_N_warns(tmp_path, capsys, monkeypatch):
    import gflow.runs

    def stop(*a, **k):
        raise ValueError("stopped before compute")

    monkeypatch.setattr(gflow.runs, "integrate", stop)  # what `gflow run` calls (gflow.runs binds the flow's)
    p = tmp_path / "n10.toml"
    p.write_text("[estimator]\nN = 10\n")
    assert gflow.cli.main(["run", str(p), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "warning: estimator.N = 10 < 100" in err
    p.write_text("[estimator]\nN = 100\n")
    gflow.cli.main(["run", str(p), "--out", str(tmp_path / "o2"), "--quiet"])
    assert "warning" not in capsys.readouterr().err


def test_unknown_names_suggest_the_closest():
    """A misspelt section or key names the closest allowed ones, and a key of another section."""
    with pytest.raises(ValueError, match=r"unknown config section 'estimater' \(did you mean 'estimator'\?\)"):
        from_dict({"estimater": {}})
    with pytest.raises(ValueError, match=r"unknown config key data.N \(did you mean 'estimator.N'\?\)"):
        from_dict({"data": {"N": 3}})
    with pytest.raises(ValueError, match=r"unknown config key model.membr \(did you mean 'model.member'\?\)"):
        from_dict({"model": {"membr": "full"}})
    with pytest.raises(ValueError, match=r"unknown config key solver.zzz; allowed keys of \[solver\]"):
        from_dict({"solver": {"zzz": 1}})
