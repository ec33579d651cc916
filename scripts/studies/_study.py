"""Helpers shared by the study scripts (the figures of ``figures/``).

The scripts run as ``python scripts/studies/x.py``, so this folder is on ``sys.path`` and
``import _study`` finds this file.
"""

from __future__ import annotations


def save_figure(fig, path, dpi: int = 120):
    """Write a script's figure to `path` (its folder created), returning the path."""
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
