"""Run configuration (gflow/config.py): TOML files, defaults, errors naming the key."""

from __future__ import annotations

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
    # the SPEC's defaults (§1, §2, §4)
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
