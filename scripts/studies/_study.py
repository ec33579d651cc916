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


def reuse_run(cfg, out, **options):
    """The complete run of `cfg` in the folder `out`: reused when it holds that run complete, else
    integrated (again, over any other run there; `options`: ``gflow.integrate``'s, e.g. ``params0``,
    ``loss``), so a study is resumable by rerunning it."""
    import gflow

    try:
        traj = gflow.load(out)
        if traj.status == "complete" and traj.config == cfg:
            return traj
    except Exception:  # noqa: BLE001  (absent or unreadable: integrated again)
        pass
    return gflow.integrate(cfg, out=out, overwrite=True, **options)
