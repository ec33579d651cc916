"""How values are shown: a configuration value as ``--param`` spells it (``true``/``false``,
``[1,2]``: a shown value can be typed back), a cell of a CSV or console table, a cell of a
Markdown table."""

from __future__ import annotations

import math

import numpy as np


def show_value(v) -> str:
    """`v` as ``--param`` spells it: strings as they are, booleans ``true``/``false``, lists ``[a,b]``."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(show_value(u) for u in v) + "]"
    return str(v)


def format_cell(v, full: bool = False) -> str:
    """A table cell (``full``: every digit, for the CSV)."""
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else (repr(v) if full else format(v, ".6g"))
    if isinstance(v, (list, tuple)):
        return show_value(v)
    return str(v)


def table_cell(x) -> str:
    """A cell of a Markdown table (a report's, a replicates summary's): ``—`` for nothing,
    4 significant digits, lists in brackets."""
    if x is None:
        return "—"
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        return format(float(x), ".4g")
    if isinstance(x, (list, tuple, np.ndarray)):
        return "[" + ", ".join(table_cell(v) for v in x) + "]"
    return str(x)
