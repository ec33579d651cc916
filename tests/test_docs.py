"""The documentation is tested: every Python block of the README and of docs/ runs (in
order, one namespace per page, in a fresh folder), every worked example in
docs/examples/ runs at the tiny size (at full size under ``-m slow``), and the pages
generated at build time (configuration keys, command-line reference, API list) are
checked against the code they come from.

A block that must not run in the suite is preceded by the line
``<!-- skip-test: <why> -->`` right above its opening fence.
"""

from __future__ import annotations

import importlib.util
import re
import runpy
from pathlib import Path

import pytest

import gflow

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
EXAMPLES = sorted((DOCS / "examples").glob("*.py"))
SKIP = "<!-- skip-test:"

_FENCE = re.compile(r"^(?P<before>.*\n)?```python\n(?P<code>.*?)^```", re.M | re.S)


def python_blocks(text: str) -> list[tuple[str, bool]]:
    """``[(code, skipped)]``: the ```python blocks of a markdown text, in order."""
    out = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if lines[i].rstrip("\n") == "```python":
            skipped = i > 0 and lines[i - 1].strip().startswith(SKIP)
            j = i + 1
            while j < len(lines) and lines[j].rstrip("\n") != "```":
                j += 1
            out.append(("".join(lines[i + 1 : j]), skipped))
            i = j + 1
        else:
            i += 1
    return out


def _hooks():
    spec = importlib.util.spec_from_file_location("gflow_docs_hooks", DOCS / "hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_python_blocks_found():
    """The extraction finds the blocks (a regression would silently test nothing)."""
    blocks = {p.name: python_blocks(p.read_text()) for p in PAGES}
    assert len(blocks["README.md"]) >= 1
    assert sum(len(b) for b in blocks.values()) >= 8
    assert python_blocks("x\n```python\na = 1\n```\n<!-- skip-test: long -->\n```python\nb = 2\n```\n") == [
        ("a = 1\n", False),
        ("b = 2\n", True),
    ]


_WITH_BLOCKS = [p for p in PAGES if any(not s for _, s in python_blocks(p.read_text()))]


@pytest.mark.parametrize("page", _WITH_BLOCKS, ids=[str(p.relative_to(ROOT)) for p in _WITH_BLOCKS])
def test_python_blocks_run(page, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__main__"}
    blocks = [code for code, skipped in python_blocks(page.read_text()) if not skipped]
    # a page's examples check what they show (an exception in a block fails the test)
    assert any("assert " in code for code in blocks), f"{page.name}: its examples assert nothing of what they show"
    try:
        for k, (code, skipped) in enumerate(python_blocks(page.read_text())):
            if not skipped:
                exec(compile(code, f"{page.relative_to(ROOT)} (python block {k + 1})", "exec"), ns)
    finally:
        plt.close("all")


def _run_example(example, tmp_path, monkeypatch, size: str) -> int:
    """Run a worked example as a script at `size` in a fresh folder; return how many figures it
    drew (the examples assert on their own results)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GFLOW_EXAMPLE_SIZE", size)
    try:
        runpy.run_path(str(example), run_name="__main__")
        return len(plt.get_fignums())
    finally:
        plt.close("all")


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_tiny(example, tmp_path, monkeypatch):
    """Each worked example at the tiny size, rendered as the site shows it (its cells run in
    order, what they print and draw kept); the examples assert on their own results. The page
    is stored where the site's build finds it (docs/hooks.py ``cached_example``), so a build
    after the suite executes no example."""
    hooks = _hooks()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GFLOW_EXAMPLE_SIZE", "tiny")
    page, images = hooks.render_example(example, execute=True)
    assert images, f"{example.name} draws no figure"
    assert page.count("```python") == sum(k == "code" for k, _ in hooks.split_cells(example.read_text()))
    hooks.store_example(example, page, images, "tiny")
    if hooks._example_cache() is not None:  # what the build reads is what the example printed now
        assert hooks.cached_example(example, execute=True)[0] == page


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_full(example, tmp_path, monkeypatch):
    """Each worked example at the full size: it runs to its end (its own asserts on its results
    hold) and draws a figure."""
    assert _run_example(example, tmp_path, monkeypatch, "full") > 0, f"{example.name} draws no figure"


def test_examples_are_percent_scripts():
    hooks = _hooks()
    assert len(EXAMPLES) >= 5
    for p in EXAMPLES:
        cells = hooks.split_cells(p.read_text())
        kinds = [k for k, _ in cells]
        assert kinds[0] == "markdown" and "code" in kinds, p.name
        assert "GFLOW_EXAMPLE_SIZE" in p.read_text(), p.name


def test_config_reference_has_every_key():
    """The generated configuration table: every declared key with its default, the
    choices of every string key, and a meaning for each."""
    from gflow import config as C

    hooks = _hooks()
    rows = {r["key"]: r for r in hooks.config_keys()}
    assert set(rows) == set(C._KEY_TYPES)
    assert rows["data.L"]["default"] == "100" and "integer" in rows["data.L"]["type"]
    assert rows["estimator.layout"]["allowed"] == "one of ('auto', 'counts', 'positions', 'heads', 'sparse', 'vectors')"
    assert rows["model.D"]["allowed"].startswith("an integer in [0, H=3]")
    assert all(r["meaning"] for r in rows.values()), [k for k, r in rows.items() if not r["meaning"]]
    md = hooks.config_keys_markdown()
    assert all(f"`{k}`" in md for k in C._KEY_TYPES)


def test_generated_sections_are_fresh():
    """The configuration table, the command-line help and the report's symbols are written into
    their pages (readable in the repository) and are what the code generates now."""
    pages = _hooks().generated_pages(DOCS)
    names = {p.relative_to(DOCS).as_posix() for p in pages}
    assert {"guides/configuration.md", "reference/cli.md", "guides/checks.md"} <= names
    stale = [str(p.relative_to(ROOT)) for p, (old, new) in pages.items() if old != new]
    assert not stale, f"generated sections out of date in {stale}: run python docs/hooks.py"
    assert "`estimator.layout`" in pages[DOCS / "guides" / "configuration.md"][0]
    assert "--param SECTION.KEY=VALUE" in pages[DOCS / "reference" / "cli.md"][0]


def test_cli_reference_is_the_help(capsys, monkeypatch):
    """The command-line page holds, verbatim, what ``gflow … --help`` prints."""
    from gflow import cli

    hooks = _hooks()
    md = hooks.cli_markdown()
    monkeypatch.setenv("COLUMNS", hooks._COLUMNS)
    commands = [k.split(" ", 1)[1] for k in hooks.cli_helps() if " " in k]
    assert {"run", "theory", "check", "sweep", "phase", "phase-merge", "eval", "plot"} <= set(commands)
    for argv in ([], *([c] for c in commands)):
        with pytest.raises(SystemExit) as e:
            cli.main([*argv, "--help"])
        assert e.value.code == 0
        printed = capsys.readouterr().out
        assert printed.rstrip("\n") in md, argv


def test_api_reference_lists_every_public_name():
    src = (ROOT / "gflow" / "__init__.py").read_text()
    names = set(re.findall(r"import (\w+) as \1", src))
    page = (DOCS / "reference" / "api.md").read_text()
    listed = set(re.findall(r"^::: gflow\.(\w+)$", page, re.M))
    assert names <= listed, sorted(names - listed)
    assert all(hasattr(gflow, n) for n in listed)


def test_mathematics_keeps_the_anchors_the_code_cites():
    """Every §M anchor cited in gflow/ exists on the mathematics page."""
    cited = set()
    for f in (ROOT / "gflow").rglob("*.py"):
        cited |= set(re.findall(r"§(M\d(?:\.\d)?)", f.read_text()))
    page = (DOCS / "theory" / "mathematics.md").read_text()
    anchors = set(re.findall(r"\{ #(M\d(?:\.\d)?) \}", page))
    assert cited and cited <= anchors, sorted(cited - anchors)


def test_notation_is_not_emphasis():
    """``x_{l−i}`` and ``a*`` are notation on the pages, not emphasis; code, math, links,
    ``**bold**``, ``*italic*`` and mkdocstrings lines stay as written."""
    hooks = _hooks()
    src = "s^(h)_i e(x_{l−i}), C*/2, a* and S*; *extension*, **Bold** `a_b` $x_1$ [l](a_b.md)\n::: gflow.run_phase"
    assert hooks.escape_emphasis(src) == (
        "s^(h)\\_i e(x\\_{l−i}), C\\*/2, a\\* and S\\*; *extension*, **Bold** `a_b` $x_1$ [l](a_b.md)\n::: gflow.run_phase"
    )
    fenced = "```python\nx_1 = a*b\n```"
    assert hooks.escape_emphasis(fenced) == fenced
    # an indented code block is code (a command copied from the page must run): left as written,
    # also inside a list item at 8 columns, while a list item's 4-column paragraph is text
    indented = "Run it with\n\n    python3 survival.py --members value_ln,token_factorised\n    gflow run x_y.toml\n\nthen a_b"
    assert hooks.escape_emphasis(indented) == indented.replace("then a_b", "then a\\_b")
    # a code span holding backticks is closed by a run as long as the one that opened it
    spans = "runs every ```` ```python ```` block at `GFLOW_EXAMPLE_SIZE=tiny`; `tests/test_cli_help.py` x_1"
    assert hooks.escape_emphasis(spans) == spans.replace("x_1", "x\\_1")
    listed = "- item a_b\n\n    more c_d\n\n        code e_f\n"
    assert hooks.escape_emphasis(listed) == "- item a\\_b\n\n    more c\\_d\n\n        code e_f\n"


def _roles():
    return _hooks()._roles()


def test_every_gflow_name_resolves():
    """Every ``gflow.…`` name of README.md and docs/, and every ``gflow.…`` name and Sphinx-role
    target of the package's docstrings, names an object (a module, class, function, attribute or
    field): no docstring names a module that no longer exists. The failure lists them by file
    and line, those under gflow/core/ apart."""
    bad = _roles().unresolved_names(ROOT)
    core = {f: v for f, v in bad.items() if f.startswith("gflow/core/")}
    rest = {f: v for f, v in bad.items() if f not in core}
    msg = "\n".join(f"{f}: {', '.join(v)}" for f, v in (rest | core).items())
    assert not bad, f"names that resolve to nothing ({sum(map(len, core.values()))} in gflow/core/):\n{msg}"


def test_docstring_roles_become_links():
    """The docstrings' Sphinx roles become autorefs cross-references to the public name (a member
    links to its class's entry) or plain code: no raw role is left in any docstring nor in the
    generated configuration table, and a relative target resolves in the docstring's scope."""

    roles = _roles()
    assert roles.convert(":func:`gflow.sgd`", "gflow") == "[`gflow.sgd`][gflow.sgd]"
    assert roles.convert(":class:`~gflow.theory.Theory`", "gflow") == "[`Theory`][gflow.Theory]"
    assert roles.convert(":meth:`to_json`", "gflow.theory._result", "gflow.theory._result.Theory") == \
        "[`to_json`][gflow.Theory]"  # fmt: skip
    assert roles.convert(":func:`stage3_law`", "gflow.theory._theory") == "`stage3_law`"  # not a public name
    missing: list = []
    assert roles.convert(":mod:`gflow.ladder`", "gflow", None, missing) == "`gflow.ladder`" and missing == ["gflow.ladder"]
    raw = re.compile(r":[a-z]+:`")
    left = []
    for path in sorted((ROOT / "gflow").rglob("*.py")):
        for line, doc, mod, cls in roles._docstrings(path):
            if raw.search(roles.convert(doc, mod, cls)):
                left.append(f"{path.relative_to(ROOT)}:{line}")
    assert not left, left
    assert not raw.search(_hooks().config_keys_markdown())


def test_exit_codes_are_listed_everywhere():
    """Every exit code (0, 1, 2, 3, 4, 130) is in the README, the getting-started table and
    ``gflow --help`` (the command line's own test reads the help; here the pages)."""
    from gflow import cli

    codes = (cli.EXIT_OK, cli.EXIT_VERDICT, cli.EXIT_INPUT, cli.EXIT_FAILED, cli.EXIT_UNEXPECTED, cli.EXIT_INTERRUPTED)
    readme = " ".join((ROOT / "README.md").read_text().split())  # a code's phrase may wrap
    table = (DOCS / "getting-started.md").read_text().split("## Exit codes")[1]
    helptext = cli.build_parser().format_help().split("exit codes (every command):")[1]
    for code in codes:
        assert re.search(rf"\b{code} (done|the gflow verdict|bad input|the integration|an unexpected|interrupted)", readme), code
        assert f"\n| {code} |" in table, code
        assert f"\n  {code} " in helptext, code


def test_ci_runs_the_readmes_two_commands_first():
    """``.ci/run`` takes the README's first bash block (its two commands: install + the default run,
    install the test extra + the suite) as written, before installing anything else."""
    import subprocess

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"^```bash\n(.*?)^```$", readme, re.S | re.M).group(1).splitlines()
    assert block == [
        "python3 -m pip install -e . && python3 -m gflow run --out runs/default",
        "python3 -m pip install -e '.[test]' && python3 -m pytest",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    awk = re.search(r"awk '([^']*)' README\.md", ci).group(1)
    got = subprocess.run(["awk", awk, str(ROOT / "README.md")], capture_output=True, text=True, check=True).stdout
    assert got.splitlines() == block
    assert ci.index('"${README_COMMANDS[@]}"') < ci.index("'.[test,docs,cluster]'")  # nothing installed before
