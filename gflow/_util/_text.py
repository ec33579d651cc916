"""How a configuration value is shown in a table, a folder name or a figure label: the
syntax of ``--param`` (``true``/``false``, ``[1,2]``), so a shown value can be typed back."""

from __future__ import annotations


def show_value(v) -> str:
    """`v` as ``--param`` spells it: strings as they are, booleans ``true``/``false``, lists ``[a,b]``."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(show_value(u) for u in v) + "]"
    return str(v)
