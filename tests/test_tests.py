"""The tests themselves: every test function asserts something that could fail.

Read with ``ast`` from the files of ``tests/`` (nothing is imported). A test function passes
this check if its body, at any depth, holds

- an ``assert`` statement or ``raise AssertionError``;
- ``pytest.raises`` / ``pytest.warns`` (as a context manager or a call), or ``pytest.fail``;
- a call of a function whose name starts with ``assert`` (``np.testing.assert_allclose``, …);
- or a call of a helper that passes this check itself: a function of the same file, of
  ``tests/helpers.py`` or of ``tests/conftest.py`` (followed to any depth).

A test that only runs code (``cli.main`` turns every exception into an exit code, so a call of
it proves nothing) fails here with its file and name. There is no allow-list: no test needs one.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SHARED = ("helpers.py", "conftest.py")
_RAISES = {"raises", "warns", "fail", "deprecated_call"}


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _asserts_itself(fn: ast.AST) -> bool:
    for n in ast.walk(fn):
        if isinstance(n, ast.Assert):
            return True
        if isinstance(n, ast.Raise) and n.exc is not None:
            exc = n.exc.func if isinstance(n.exc, ast.Call) else n.exc
            if isinstance(exc, ast.Name) and exc.id == "AssertionError":
                return True
        if isinstance(n, ast.Call):
            name = _name(n)
            if name.startswith("assert") or (isinstance(n.func, ast.Attribute) and name in _RAISES):
                return True
    return False


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for m in node.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{m.name}"] = m
    return out


def _asserting(funcs: dict[str, ast.AST]) -> set[str]:
    """The names of `funcs` that assert, themselves or through a helper among `funcs`."""
    good = {k for k, f in funcs.items() if _asserts_itself(f)}
    calls = {k: {_name(c) for c in ast.walk(f) if isinstance(c, ast.Call)} for k, f in funcs.items()}
    changed = True
    while changed:
        changed = False
        for k in funcs:
            if k not in good and calls[k] & {g.rsplit(".", 1)[-1] for g in good}:
                good.add(k)
                changed = True
    return good


def unasserted_tests(files) -> list[str]:
    """``file::test`` of every test function in `files` that can pass without asserting."""
    shared = {}
    for name in SHARED:
        p = TESTS / name
        if p.is_file():
            shared.update(_functions(ast.parse(p.read_text())))
    bad = []
    for path in files:
        own = _functions(ast.parse(Path(path).read_text()))
        good = _asserting({**shared, **own})
        bad += [f"{Path(path).name}::{k}" for k in own if k.rsplit(".", 1)[-1].startswith("test") and k not in good]
    return bad


def test_every_test_asserts_something():
    files = sorted(TESTS.glob("test_*.py"))
    assert len(files) > 20
    bad = unasserted_tests(files)
    assert not bad, "test functions that can pass without asserting anything:\n" + "\n".join(bad)


def test_the_check_rejects_a_test_that_only_runs_code(tmp_path):
    """The check itself: a test that only calls code is flagged; one that asserts, expects an
    exception, or calls an asserting helper is not."""
    src = '''
import pytest
def _check(x):
    assert x
def _quiet(x):
    return x
def test_runs_only():
    _quiet(1)
def test_asserts():
    assert 1 == 1
def test_raises():
    with pytest.raises(ValueError):
        int("x")
def test_helper():
    _check(True)
def test_numpy():
    np.testing.assert_allclose(1.0, 1.0)
class TestGroup:
    def test_in_class_runs_only(self):
        _quiet(2)
'''
    p = tmp_path / "test_sample.py"
    p.write_text(src)
    assert unasserted_tests([p]) == ["test_sample.py::test_runs_only", "test_sample.py::TestGroup.test_in_class_runs_only"]


def test_every_tiered_test_exists():
    """Every node id of conftest's SLOW and CI_TIER names a test function of its file (a renamed
    test would silently leave the tier and run nowhere, or in the default suite)."""
    import conftest

    names = {}
    for nodeid in conftest.SLOW | conftest.CI_TIER:
        path, func = nodeid.split("::")
        if path not in names:
            tree = ast.parse((TESTS.parent / path).read_text())
            names[path] = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert func.split("[")[0] in names[path], nodeid
    assert not conftest.SLOW & conftest.CI_TIER
