"""The built documentation site (``-m site``: ``.ci/run`` builds the site, then runs these with
``GFLOW_SITE`` naming it; outside the default suite, which builds no site)."""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = re.compile(r"<(pre|code)\b[^>]*>(.*?)</\1>", re.S)
TAG = re.compile(r"<[^>]+>")


def _site() -> Path:
    site = Path(os.environ.get("GFLOW_SITE", ROOT / "site"))
    if not (site / "index.html").is_file():
        pytest.skip(f"no built site in {str(site)!r}: build it (mkdocs build) and name it with GFLOW_SITE")
    return site


def escaped_in_code(page: str) -> list[str]:
    """The code blocks and spans of an HTML page that hold a Markdown escape (``\\_``, ``\\*``):
    text the page shows differently from what a reader must type."""
    bad = []
    for _, body in CODE.findall(page):
        text = html.unescape(TAG.sub("", body))
        if re.search(r"\\[_*]", text):
            bad.append(text.strip()[:120])
    return bad


def test_escape_finder_finds_escapes():
    """The finder itself (default suite): an escaped underscore in a <pre> is found, a plain one
    and one outside code are not."""
    assert escaped_in_code("<pre><code>--members value\\_ln</code></pre>") == ["--members value\\_ln"]
    assert escaped_in_code("<pre><code>--members value_ln</code></pre><p>a\\_b</p>") == []
    assert escaped_in_code('<code><span class="n">x</span>\\*y</code>') == ["x\\*y"]


@pytest.mark.slow
@pytest.mark.site
def test_no_escaped_character_in_any_code_block():
    """No ``<pre>``/``<code>`` of any built page holds an escaped ``_`` or ``*``."""
    site = _site()
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 20
    bad = {str(p.relative_to(site)): b for p in pages if (b := escaped_in_code(p.read_text(encoding="utf-8")))}
    assert not bad, bad
