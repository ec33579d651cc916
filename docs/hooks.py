"""mkdocs hooks: the parts of the site generated from the code at build time, so that
they cannot drift from it.

- ``<!-- gflow:config-keys -->`` in a page becomes the table of every configuration key
  (:func:`config_keys_markdown`): its type (the configuration's declared key types), its
  default (``gflow.Config()``), the values it allows (found by handing the configuration
  an out-of-range value and reading the error it raises) and its meaning (the config
  classes' docstrings).
- ``<!-- gflow:cli -->`` becomes ``gflow --help`` and every subcommand's ``--help``
  (:func:`cli_markdown`), printed by the argparse parser itself.
- ``<!-- gflow:symbols -->`` becomes the table of every symbol a check report uses
  (:func:`symbols_markdown`, the legend ``report.md`` ends with).
- every ``docs/examples/*.py`` (jupytext percent format) becomes a page
  ``examples/<name>.md`` (:func:`render_example`): markdown cells as text, code cells as
  code followed by what they printed and the figures they drew. The examples are executed
  at the tiny size (``GFLOW_EXAMPLE_SIZE=tiny`` unless set otherwise) once per version of
  their source, of gflow's and of the libraries (:func:`cached_example`, in
  ``GFLOW_CACHE/docs``): the test suite renders and stores them, so a build after it runs
  none; ``GFLOW_DOCS_EXECUTE=0`` renders them without running them.
- the repository's ``figures/*.png`` are served as ``figures/`` of the site.
- MathJax (the ``mathjax`` package on PyPI, a dependency of the ``docs`` extra) is copied
  into the site, so the mathematics renders offline, with no request to a CDN.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import io
import os
import re
import tempfile
import typing
from pathlib import Path

EXAMPLES = "examples"
_COLUMNS = "100"  # the width the CLI reference is printed at


# -- configuration keys -----------------------------------------------------------------


def _roles():
    """docs/roles.py (the docstrings' Sphinx roles as cross-references), loaded by path."""
    import importlib.util
    import sys

    if "gflow_docs_roles" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gflow_docs_roles", Path(__file__).with_name("roles.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["gflow_docs_roles"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["gflow_docs_roles"]


def _docstring_fields(cls) -> dict[str, str]:
    """``{field: text}`` from a class docstring's bullets ``- `a`, `b`: text``, its Sphinx roles
    as cross-references (docs/roles.py)."""
    out: dict[str, str] = {}
    doc = _roles().convert(cls.__doc__ or "", cls.__module__, f"{cls.__module__}.{cls.__qualname__}")
    bullets = re.split(r"\n\s*- (?=`)", "\n" + doc)
    for b in bullets[1:]:
        b = re.split(r"\n\s*\n", b)[0]  # a bullet ends at a blank line
        head, _, text = b.partition(":")
        names = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", head)
        text = " ".join(text.split())
        text = text.replace("``", "`")
        for n in names:
            out[n] = text
    return out


def _probe_values(t_expected: str) -> list:
    if t_expected.startswith("a string"):
        return ["__not_a_value__"]
    if "list of integers" in t_expected:
        return [[0], [1, 1]]
    if "list of finite numbers" in t_expected and "nested" not in t_expected:
        return [[-1.0, -1.0, -1.0], [1.0]]
    if "nested" in t_expected:
        return [[[-1.0]]]
    if t_expected.startswith("an integer"):
        return [-1, 0]
    if t_expected.startswith("a finite number"):
        return [-1.0, 0.0]
    return []


def _allowed(sec: str, key: str, t_expected: str) -> str:
    """What the configuration accepts, read from the error it raises for an out-of-range value."""
    from gflow import config as C

    for bad in _probe_values(t_expected):
        try:
            C.from_dict({sec: {key: bad}})
        except ValueError as e:
            m = re.search(r"must (?:be|have) (.*?)(?:, got |$)", str(e))
            if m:
                return m.group(1)
    return "any value of its type"


def _fmt_default(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "none"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, tuple):
        return "[" + ", ".join(_fmt_default(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def config_keys() -> list[dict]:
    """Every configuration key: ``{key, section, type, default, allowed, meaning}``."""
    import gflow
    from gflow import config as C

    cfg = gflow.Config()
    rows = []
    docs = {sec: _docstring_fields(cls) for sec, cls in C._SECTIONS.items()}
    for full, t in C._KEY_TYPES.items():
        sec, key = full.split(".")
        rows.append(
            {
                "key": full,
                "section": sec,
                "type": t.expected,
                "default": _fmt_default(getattr(getattr(cfg, sec), key)),
                "allowed": _allowed(sec, key, t.expected),
                "meaning": docs[sec].get(key, ""),
            }
        )
    return rows


def config_keys_markdown() -> str:
    out = []
    sec = None
    for r in config_keys():
        if r["section"] != sec:
            sec = r["section"]
            out += ["", f"### `[{sec}]`", "", "| key | type | default | allowed | meaning |", "| --- | --- | --- | --- | --- |"]
        out.append(
            f"| `{r['key']}` | {_cell(r['type'])} | `{_cell(r['default'])}` | {_cell(r['allowed'])} | {_cell(r['meaning'])} |"
        )
    return "\n".join(out) + "\n"


# -- command line -------------------------------------------------------------------------


def cli_helps() -> dict[str, str]:
    """``{"gflow": help, "gflow run": help, …}``: argparse's own ``--help`` texts."""
    from gflow import cli

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = _COLUMNS
    try:
        p = cli.build_parser()
        out = {"gflow": p.format_help()}
        sub = next(a for a in p._actions if a.__class__.__name__ == "_SubParsersAction")
        for name, sp in sub.choices.items():
            out[f"gflow {name}"] = sp.format_help()
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return out


def cli_markdown() -> str:
    out = []
    for name, text in cli_helps().items():
        anchor = name.replace(" ", "-")
        out += [f"## `{name}` {{ #{anchor} }}", "", "```text", f"$ {name} --help", text.rstrip("\n"), "```", ""]
    return "\n".join(out)


# -- examples ----------------------------------------------------------------------------


def split_cells(source: str) -> list[tuple[str, str]]:
    """A jupytext percent-format script as ``[(kind, text)]``, kind ``"markdown"`` or ``"code"``."""
    cells: list[tuple[str, list[str]]] = []
    for line in source.splitlines():
        m = re.match(r"^# %%(.*)$", line)
        if m:
            cells.append(("markdown" if "[markdown]" in m.group(1) else "code", []))
        elif cells:
            cells[-1][1].append(line)
    out = []
    for kind, lines in cells:
        if kind == "markdown":
            text = "\n".join(re.sub(r"^# ?", "", ln) for ln in lines).strip("\n")
        else:
            text = "\n".join(lines).strip("\n")
        if text.strip():
            out.append((kind, text))
    return out


def render_example(path: Path, *, execute: bool) -> tuple[str, dict[str, bytes]]:
    """The page of one example and its figures ``{file name: PNG bytes}``."""
    name = path.stem
    cells = split_cells(path.read_text())
    md: list[str] = []
    images: dict[str, bytes] = {}
    ns: dict = {"__name__": "__main__", "__file__": str(path)}
    cwd = os.getcwd()
    size = os.environ.get("GFLOW_EXAMPLE_SIZE", "tiny")
    with tempfile.TemporaryDirectory() as tmp, _env("GFLOW_EXAMPLE_SIZE", size):
        if execute:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            os.chdir(tmp)
        try:
            for kind, text in cells:
                if kind == "markdown":
                    md += [text, ""]
                    continue
                md += ["```python", text, "```", ""]
                if not execute:
                    continue
                buf = io.StringIO()
                # stderr (progress bars) is dropped: the page shows what the cell printed
                with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
                    exec(compile(text + "\n", str(path), "exec"), ns)
                printed = buf.getvalue().rstrip()
                if printed:
                    md += ["```text", printed, "```", ""]
                for num in plt.get_fignums():
                    fig = plt.figure(num)
                    png = io.BytesIO()
                    fig.savefig(png, format="png", dpi=100, bbox_inches="tight")
                    plt.close(fig)
                    fname = f"{name}-{len(images) + 1}.png"
                    images[fname] = png.getvalue()
                    md += [f"![figure {len(images)}]({fname})", ""]
        finally:
            os.chdir(cwd)
    if execute:
        note = (f"*Rendered by running the script at `GFLOW_EXAMPLE_SIZE={size}` (once per version of its "
                "source and of gflow's: the build reuses the pages the test suite rendered).*")
    else:
        note = "*Rendered without running the script (`GFLOW_DOCS_EXECUTE=0`).*"
    head = f"[Download the script]({path.name}): `python3 {path.name}` runs it (full size; `GFLOW_EXAMPLE_SIZE=tiny` for seconds). {note}\n"
    first = md.index("") + 1 if "" in md else 0  # after the first markdown cell (the title and introduction)
    return "\n".join([*md[:first], head, *md[first:]]), images


# -- the examples' rendered pages, cached -------------------------------------------------


def example_key(path: Path, size: str) -> str:
    """What an example's rendered page depends on: its source, its size, every source file of
    gflow and the versions of the libraries that compute and draw it (SHA-256)."""
    import hashlib
    import importlib.metadata

    import gflow

    h = hashlib.sha256()
    h.update(path.read_bytes() + size.encode())
    pkg = Path(gflow.__file__).resolve().parent
    for f in sorted(pkg.rglob("*.py")):
        h.update(str(f.relative_to(pkg)).encode() + f.read_bytes())
    for lib in ("jax", "jaxlib", "numpy", "diffrax", "equinox", "matplotlib"):
        try:
            h.update(f"{lib}={importlib.metadata.version(lib)}".encode())
        except importlib.metadata.PackageNotFoundError:
            pass
    return h.hexdigest()


def _example_cache() -> Path | None:
    """``GFLOW_CACHE/docs`` (default ``~/.cache/gflow/docs``); ``None`` for ``GFLOW_CACHE=none``."""
    where = os.environ.get("GFLOW_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "gflow"))
    return None if where.lower() == "none" else Path(where) / "docs"


def store_example(path: Path, page: str, images: dict[str, bytes], size: str) -> None:
    """Keep a rendered page and its figures under its :func:`example_key` (written to a temporary
    folder, then renamed: a reader never sees half an entry)."""
    root = _example_cache()
    if root is None:
        return
    dest = root / f"{path.stem}-{example_key(path, size)[:32]}"
    if dest.is_dir():
        return
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=root))
    (tmp / "page.md").write_text(page)
    for name, data in images.items():
        (tmp / name).write_bytes(data)
    try:
        os.replace(tmp, dest)
    except OSError:  # another process stored the same entry first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def cached_example(path: Path, *, execute: bool) -> tuple[str, dict[str, bytes]]:
    """:func:`render_example`, from the cache when the example, gflow and the libraries are those
    it was rendered with (``tests/test_docs.py`` renders every example at the tiny size and stores
    it, so a build after the test suite runs none), else rendered now and stored."""
    size = os.environ.get("GFLOW_EXAMPLE_SIZE", "tiny")
    root = _example_cache()
    if execute and root is not None:
        entry = root / f"{path.stem}-{example_key(path, size)[:32]}"
        if (entry / "page.md").is_file():
            images = {f.name: f.read_bytes() for f in sorted(entry.iterdir()) if f.suffix == ".png"}
            return (entry / "page.md").read_text(), images
    page, images = render_example(path, execute=execute)
    if execute:
        store_example(path, page, images, size)
    return page, images


@contextlib.contextmanager
def _env(key: str, value: str):
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


# -- mkdocs events -----------------------------------------------------------------------


def on_files(files, config):
    from mkdocs.structure.files import File

    mj = importlib.resources.files("mathjax") / "static" / "mathjax" / "es5" / "tex-svg.js"
    files.append(File.generated(config, "assets/mathjax/tex-svg.js", abs_src_path=str(mj)))
    docs = Path(config["docs_dir"])
    for png in sorted((docs.parent / "figures").glob("*.png")):  # the repository's committed figures
        files.append(File.generated(config, f"figures/{png.name}", abs_src_path=str(png)))
    execute = os.environ.get("GFLOW_DOCS_EXECUTE", "1") != "0"
    for path in sorted((docs / EXAMPLES).glob("*.py")):
        page, images = cached_example(path, execute=execute)
        files.append(File.generated(config, f"{EXAMPLES}/{path.stem}.md", content=page))
        for fname, data in images.items():
            files.append(File.generated(config, f"{EXAMPLES}/{fname}", content=data))
    return files


def symbols_markdown() -> str:
    """The rows ``| symbol | meaning |`` of every symbol a check report can use
    (``gflow.checks._report.SYMBOLS``, the legend ``report.md`` ends with)."""
    from gflow.checks._report import SYMBOLS

    return "\n".join(f"| {_cell(k)} | {_cell(v)} |" for k, v in SYMBOLS.items()) + "\n"


_MARKERS: dict[str, typing.Callable[[], str]] = {
    "<!-- gflow:config-keys -->": config_keys_markdown,
    "<!-- gflow:cli -->": cli_markdown,
    "<!-- gflow:symbols -->": symbols_markdown,
}


_PROTECTED = re.compile(
    r"((`+)[\s\S]+?(?<!`)\2(?!`)"  # code spans, closed by a run of as many backticks as opened them
    r"|\$\$.*?\$\$|\$[^$\n]+\$|\\\(.*?\\\)"  # math
    r"|\]\([^)]*\)|<[^>]+>|\{[^}]*#[^}]*\}"  # link targets, HTML tags, attribute lists
    r"|(?<![\w*\\])\*[^\s*][^*\n]*?(?<=[^\s*\\])\*(?![\w*]))"  # *italic* (opened after a space)
)


_LIST_ITEM = re.compile(r"\s*(?:[-*+]|\d+\.)\s")


def escape_emphasis(markdown: str) -> str:
    """Escape the ``_`` and the ``*`` after a symbol (``a*``, ``S*``) of plain text, which the
    pages use as mathematical notation (``x_{l−i}``, ``C*/2``, a star after a one-letter symbol), never as emphasis: Python-Markdown
    would otherwise italicise the text between two of them. Code (fenced, inline and indented
    blocks), math, link targets, HTML, mkdocstrings lines (``:::``) and ``**bold**`` are left alone."""
    out: list[str] = []
    para: list[str] = []  # a paragraph is escaped whole: a code span may run over two lines
    fence, math = None, False
    in_list, code = False, False  # inside a list item; inside an indented code block

    def flush():
        if para:
            text, parts, pos = "\n".join(para), [], 0
            for m in _PROTECTED.finditer(text):  # [text, protected, text, …, text]
                parts += [text[pos : m.start()], m.group(0)]
                pos = m.end()
            parts.append(text[pos:])
            for i in range(0, len(parts), 2):  # the text between the protected pieces
                t = re.sub(r"(?<!\\)_", r"\\_", parts[i])
                # a star after a one-letter symbol or a bracket (a*, S*, C*/2, F(a)*): notation
                parts[i] = re.sub(r"(?:(?<=(?<![\w\\])[A-Za-z])|(?<=[)\]}′']))\*(?!\*)", r"\\*", t)
            out.append("".join(parts))
            para.clear()

    for line in markdown.split("\n"):
        s = line.lstrip()
        indent = len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())
        if s.strip() and not fence and not math:
            # an indented code block: after a blank line (or within one), indented 4 columns past
            # the text it sits in (8 inside a list item, whose paragraphs are indented 4)
            code = (code or (not para and (not out or not out[-1].strip()))) and indent >= (8 if in_list else 4)
            if not code and indent == 0:
                in_list = bool(_LIST_ITEM.match(line))
            elif not code and _LIST_ITEM.match(line):
                in_list = True
        if code and s.strip():
            out.append(line)
        elif fence:
            fence = None if s.startswith(fence) else fence
            out.append(line)
        elif s.startswith(("```", "~~~")):
            flush()
            fence = s[:3]
            out.append(line)
        elif s.strip() == "$$":
            flush()
            math = not math
            out.append(line)
        elif math or s.startswith(":::") or not s.strip():
            flush()
            out.append(line)
        else:
            para.append(line)
    flush()
    return "\n".join(out)


def fill_markers(markdown: str) -> str:
    """The page with every generated section written afresh: the text between
    ``<!-- gflow:NAME -->`` and ``<!-- /gflow:NAME -->`` (or after a marker without its end,
    which gains one) is what :data:`_MARKERS`' function for ``NAME`` makes now."""
    for marker, make in _MARKERS.items():
        if marker not in markdown:
            continue
        end = marker.replace("<!-- gflow:", "<!-- /gflow:")
        head, _, rest = markdown.partition(marker)
        tail = rest.partition(end)[2] if end in rest else rest  # the old section goes, the text after stays
        body = make().strip("\n")
        markdown = f"{head}{marker}\n{body}\n{end}{tail}"
    return markdown


def generated_pages(root: Path = Path(__file__).resolve().parent) -> dict[Path, tuple[str, str]]:
    """``{page: (committed text, fresh text)}`` of every page of `root` with a generated section:
    the pages carry their generated tables in the repository, so that a reader of the files sees
    them; ``tests/test_docs.py`` asserts they are fresh and ``python docs/hooks.py`` rewrites them."""
    out = {}
    for page in sorted(root.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        if any(m in text for m in _MARKERS):
            out[page] = (text, fill_markers(text))
    return out


def on_page_markdown(markdown, page, config, files):
    return escape_emphasis(fill_markers(markdown))


if __name__ == "__main__":  # python docs/hooks.py: rewrite the generated sections of the pages
    for page, (old, new) in generated_pages().items():
        if new != old:
            page.write_text(new, encoding="utf-8")
            print(f"rewrote {page}")
