"""gflow's docstrings name other objects with Sphinx roles (``:func:`gflow.sgd```,
``:class:`~gflow.Trajectory```, ``:meth:`to_json```); this module makes them render as links on
the site, resolves every ``gflow.…`` name, and lists the names that do not resolve.

- :func:`convert` rewrites the roles of a docstring as mkdocstrings/autorefs cross-references:
  a role whose target is a public name of ``gflow`` (``gflow.sgd``, or a member of a public
  class, ``gflow.Theory.to_json``) becomes ``[`gflow.sgd`][gflow.sgd]`` (a member links to its
  class's entry), any other role plain code; a ``~`` keeps only the last component as the
  title, as in Sphinx. A relative target (``:meth:`to_json```) is resolved in the docstring's
  class and module, as Sphinx does.
- :class:`SphinxRoles` is the griffe extension (``mkdocs.yml``: the Python handler's
  ``extensions``) that applies it to every docstring of the package before mkdocstrings renders
  it, so the built site has no raw role; ``docs/hooks.py`` applies it to the configuration
  table it generates from the config classes' docstrings.
- :func:`resolve` says whether a dotted ``gflow.…`` name is an object (a module, a class, a
  function, an attribute, a dataclass or equinox field); :func:`unresolved_names` lists, file by
  file, every ``gflow.…`` name and role target of the docs and of the package's docstrings that
  is not (``tests/test_docs.py`` asserts there is none).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import types
from pathlib import Path

try:  # the site's build has it (the docs extra); the tests' uses of convert/resolve do not need it
    import griffe
except ImportError:  # pragma: no cover - a test-only install
    griffe = None

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`(~?)([^`<>]+?)`")
# a dotted gflow name in prose or code (not a file such as DIR/gflow.log, nor part of a longer word)
NAME = re.compile(r"(?<![\w/.\-])gflow(?:\.[A-Za-z_]\w*)+")
_FILES = (".log", ".toml", ".json", ".md", ".py", ".npz", ".png", ".csv", ".txt")


def _import_longest(parts: list[str]):
    """The object of the longest importable module prefix of `parts`, and the rest."""
    for k in range(len(parts), 0, -1):
        try:
            return importlib.import_module(".".join(parts[:k])), parts[k:]
        except ImportError:
            continue
    return None, parts


def _member(obj, name: str):
    """``getattr(obj, name)``, or a marker for a field a class declares without a class value
    (a dataclass or equinox field, an annotation); ``AttributeError`` if none."""
    try:
        return getattr(obj, name)
    except AttributeError:
        if isinstance(obj, type):
            if dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
                return _Field(obj, name)
            for klass in obj.__mro__:
                if name in getattr(klass, "__annotations__", {}):
                    return _Field(obj, name)
        raise


class _Field:
    """A field a class declares without a class value (what :func:`resolve` returns for it)."""

    def __init__(self, owner: type, name: str):
        self.owner, self.name = owner, name


MISSING = object()  # what :func:`resolve` returns for a name that names nothing


def resolve(path: str):
    """The object a dotted name names (:data:`MISSING` if it names none; an attribute may be ``None``)."""
    obj, rest = _import_longest(path.split("."))
    if obj is None:
        return MISSING
    for name in rest:
        try:
            obj = _member(obj, name)
        except AttributeError:
            return MISSING
    return obj


def _scope_path(target: str, module: str, cls: str | None) -> str | None:
    """The absolute dotted path of a role's `target` written in a docstring of `module` (and of
    the class `cls`, a dotted path, if any); ``None`` if it names nothing there."""
    if target.startswith("gflow.") or target == "gflow":
        return target if resolve(target) is not MISSING else None
    first, _, rest = target.partition(".")
    if cls is not None:
        owner = resolve(cls)
        if owner is not MISSING:
            try:
                _member(owner, first)
                return f"{cls}.{target}"
            except AttributeError:
                pass
    mod = resolve(module)
    scope = vars(mod) if isinstance(mod, types.ModuleType) else {}
    if first not in scope:
        return None
    obj = scope[first]
    if isinstance(obj, types.ModuleType):
        base = obj.__name__
    elif hasattr(obj, "__module__") and hasattr(obj, "__qualname__"):
        base = f"{obj.__module__}.{obj.__qualname__}"
    else:
        base = f"{module}.{first}"
    full = base + (f".{rest}" if rest else "")
    return full if resolve(full) is not MISSING else None


def _public() -> dict[int, str]:
    import gflow

    out = {}
    for name in dir(gflow):
        if name.startswith("_"):
            continue
        obj = getattr(gflow, name)
        if not isinstance(obj, types.ModuleType):
            out.setdefault(id(obj), f"gflow.{name}")
    return out


def public_identifier(path: str) -> str | None:
    """The name under which the site documents `path`: ``gflow.X`` when the object is the public
    ``gflow.X``, ``gflow.X`` too for a member of a public class ``X`` (its entry documents its
    members), else ``None``."""
    pub = _public()
    obj = resolve(path)
    if obj is MISSING:
        return None
    if id(obj) in pub and not isinstance(obj, (int, float, str, bool, type(None))):
        return pub[id(obj)]
    head, _, _ = path.rpartition(".")
    owner = resolve(head) if head else MISSING
    if isinstance(owner, type) and id(owner) in pub:
        return pub[id(owner)]
    return None


def convert(text: str, module: str, cls: str | None = None, unresolved: list | None = None) -> str:
    """`text` with its Sphinx roles as autorefs cross-references or code (module docstring).
    Targets that name nothing are appended to `unresolved` (rendered as code)."""

    def one(m: re.Match) -> str:
        tilde, target = m.group(1), m.group(2).strip()
        title = target.rsplit(".", 1)[-1] if tilde else target
        full = _scope_path(target, module, cls)
        if full is None:
            if unresolved is not None:
                unresolved.append(target)
            return f"`{title}`"
        ident = public_identifier(full)
        return f"[`{title}`][{ident}]" if ident else f"`{title}`"

    return ROLE.sub(one, text)


class SphinxRoles(griffe.Extension if griffe is not None else object):
    """Rewrites the Sphinx roles of every docstring of the loaded package (:func:`convert`): a
    griffe extension when griffe is installed (the ``docs`` extra), unused otherwise."""

    def on_package(self, *, pkg, **kwargs) -> None:
        seen = set()

        def walk(obj, cls):
            if obj.is_alias or id(obj) in seen:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                module = obj.module.path
                owner = obj.path if obj.is_class else cls
                obj.docstring.value = convert(obj.docstring.value, module, owner)
            for member in obj.members.values():
                walk(member, obj.path if obj.is_class else None)

        walk(pkg, None)


# ---------------------------------------------------------------------------
# Every gflow name of the docs and of the docstrings
# ---------------------------------------------------------------------------


def _docstrings(path: Path):
    """``(line, text, module, class)`` of every docstring of a module of the package."""
    tree = ast.parse(path.read_text())
    mod = ".".join(path.with_suffix("").relative_to(_package_root(path)).parts)
    mod = mod[: -len(".__init__")] if mod.endswith(".__init__") else mod

    def walk(node, cls):
        doc = ast.get_docstring(node, clean=False)
        if doc is not None:
            yield node.body[0].lineno if node.body else 1, doc, mod, cls
        for child in getattr(node, "body", []):
            if isinstance(child, ast.ClassDef):
                yield from walk(child, f"{mod}.{child.name}" if cls is None else f"{cls}.{child.name}")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(child, cls)

    yield from walk(tree, None)


def _package_root(path: Path) -> Path:
    p = path.parent
    while (p / "__init__.py").is_file():
        p = p.parent
    return p


def _names_in(text: str):
    for m in NAME.finditer(text):
        name = m.group(0)
        if name.endswith(_FILES) or text[m.end() : m.end() + 1] in ("/", "-"):
            continue
        yield name


def unresolved_names(root: Path) -> dict[str, list[str]]:
    """``{file: ["line: name", …]}``: every ``gflow.…`` name of README.md and docs/**/*.md, and every
    ``gflow.…`` name and role target of the docstrings of gflow/, that names no object."""
    out: dict[str, list[str]] = {}
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    for page in pages:
        for k, line in enumerate(page.read_text().splitlines(), 1):
            bad = [n for n in _names_in(line) if resolve(n) is MISSING]
            if bad:
                out.setdefault(str(page.relative_to(root)), []).extend(f"{k}: {n}" for n in bad)
    for path in sorted((root / "gflow").rglob("*.py")):
        rel = str(path.relative_to(root))
        for line, doc, mod, cls in _docstrings(path):
            bad = [n for n in _names_in(doc) if resolve(n) is MISSING]
            miss: list[str] = []
            convert(doc, mod, cls, miss)
            bad += [f":role:`{t}`" for t in miss]
            if bad:
                out.setdefault(rel, []).extend(f"{line}: {n}" for n in bad)
    return out
