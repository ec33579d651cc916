"""The figures of a phase diagram (:func:`plot_phase`, exported by :mod:`gflow.phase`):
``phase_map`` (which set wins where, by the paper's Ĩ, by J and by the flow) and
``phase_heat`` (a*, C* and the Stage I duration, predicted and measured)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._util import atomic_savefig

_GREY = (0.85, 0.85, 0.85, 1.0)  # a point without a winner, or an uncertain one


def phase_row(rec: dict) -> dict:
    """One point of ``phase.json`` as a flat row (the columns of ``phase.csv``)."""
    return {"index": rec["index"], **rec["point"], **rec["theory"], **(rec.get("flow") or {})}


class _Grid:
    """The points of ``phase.json`` laid out on the grid: one row per value of the second field
    (a single row for one field), one column per value of the first."""

    def __init__(self, body: dict):
        fields, values = body["fields"], body["values"]
        self.rows = [phase_row(r) for r in body["results"]]
        self.flow = bool(body.get("flow"))
        if len(fields) == 1:
            self.fy, self.fx, self.ny, self.nx = None, fields[0], 1, len(values[0])
            self.yv, self.xv = [""], values[0]
        else:
            self.fy, self.fx = fields
            self.yv, self.xv = values
            self.ny, self.nx = len(self.yv), len(self.xv)

    def of(self, key, cast=lambda v: v):
        """The column `key` of every point, as a ``(ny, nx)`` object array."""
        G = np.empty((self.ny, self.nx), dtype=object)
        for k, r in enumerate(self.rows):
            G[k // self.nx, k % self.nx] = cast(r.get(key))
        return G

    def ticks(self, ax) -> None:
        nx, ny = self.nx, self.ny
        ax.set_xticks(range(nx), [_tick(v) for v in self.xv], rotation=45 if nx > 6 else 0, fontsize=8)
        ax.set_xlabel(self.fx)
        if self.fy is None:
            ax.set_yticks([])
        else:
            ax.set_yticks(range(ny), [_tick(v) for v in self.yv], fontsize=8)
            ax.set_ylabel(self.fy)


def plot_phase(out: str | Path, figdir: str | Path | None = None, *, fmt: str = "png") -> list[Path]:
    """Draw ``phase_map`` and ``phase_heat`` from ``out/phase.json`` into
    `figdir` (default ``out/figures``). A one-field grid is drawn as one row.
    Returns the paths."""
    out = Path(out)
    grid = _Grid(json.loads((out / "phase.json").read_text()))
    figdir = Path(figdir) if figdir is not None else out / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    return [_phase_map(grid, figdir / f"phase_map.{fmt}"), _phase_heat(grid, figdir / f"phase_heat.{fmt}")]


def _winner_panel(ax, grid: _Grid, pan: int, G, U, colour, win_I, win_J) -> None:
    """One map of winners: each point's colour (grey when uncertain, hatched), × where Ĩ and J
    disagree (first two panels), ○ where the flow's set differs from argmax J (third)."""
    from matplotlib.patches import Rectangle

    ny, nx = grid.ny, grid.nx
    img = np.ones((ny, nx, 4))
    for i in range(ny):
        for j in range(nx):
            img[i, j] = colour[str(G[i, j])] if G[i, j] is not None and not U[i, j] else _GREY
    ax.imshow(img, origin="lower", aspect="auto", interpolation="nearest")
    for i in range(ny):
        for j in range(nx):
            if U[i, j]:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", lw=0,
                                           edgecolor="0.5"))  # fmt: skip
            if pan < 2 and win_I[i, j] != win_J[i, j]:
                ax.text(j, i, "×", ha="center", va="center", fontsize=11, color="k")
            if pan == 2 and G[i, j] != win_J[i, j]:
                ax.text(j, i, "○", ha="center", va="center", fontsize=11, color="k")


def _phase_map(grid: _Grid, path: Path) -> Path:
    """``phase_map``: the Stage I winner by argmax Ĩ, by argmax J and (with the flow) selected."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    flow = grid.flow
    win_I, win_J = grid.of("S_star"), grid.of("argmax_J")
    unc_I, unc_J = grid.of("Itilde_uncertain"), grid.of("J_uncertain")
    panels = [("argmax Ĩ (paper, L → ∞)", win_I, unc_I), ("argmax J (finite size)", win_J, unc_J)]
    if flow:
        sel = grid.of("selected")
        panels.append(("selected by the flow", sel, np.zeros_like(sel, dtype=bool)))
    labels = sorted({str(v) for _, G, _ in panels for v in G.ravel() if v is not None})
    cmap = matplotlib.colormaps["tab10"]
    colour = {lab: cmap(i % 10) for i, lab in enumerate(labels)}
    fig = Figure(figsize=(4.2 * len(panels), 0.9 + 0.45 * grid.ny + 1.6))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for pan, (ax, (title, G, U)) in enumerate(zip(axes[0], panels)):
        _winner_panel(ax, grid, pan, G, U, colour, win_I, win_J)
        ax.set_title(title, fontsize=10)
        grid.ticks(ax)
    handles = [Patch(color=colour[lab], label=lab) for lab in labels]
    handles.append(Patch(facecolor=(0.85, 0.85, 0.85), hatch="///", edgecolor="0.5",
                         label="uncertain (top two within 3 paired SE)"))  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
    fig.suptitle("Stage I winner; × Ĩ and J disagree" + ("; ○ the flow differs from argmax J" if flow else ""),
                 fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    atomic_savefig(fig, path, dpi=130)
    return path


def _phase_heat(grid: _Grid, path: Path) -> Path:
    """``phase_heat``: a* and C* of the selected set, the predicted and (with the flow) measured durations."""
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    fnum = lambda v: np.nan if v is None else float(v)
    heats = [("a* of the selected set (∞: blank)", "a_star", False), ("C* of the selected set", "C_star", False),
             ("predicted Stage I duration", "stage1_duration", True)]  # fmt: skip
    if grid.flow:
        heats += [("measured Stage I duration", "t_event_I", True), ("measured Stage II duration", "t_event_II", True)]
    fig = Figure(figsize=(4.2 * len(heats), 0.9 + 0.45 * grid.ny + 1.2))
    axes = fig.subplots(1, len(heats), squeeze=False)
    for ax, (title, key, logc) in zip(axes[0], heats):
        Z = grid.of(key, fnum).astype(float)
        ok = np.isfinite(Z) & ((Z > 0) if logc else True)
        norm = LogNorm(vmin=Z[ok].min(), vmax=Z[ok].max()) if logc and ok.any() and Z[ok].min() > 0 else None
        im = ax.imshow(np.where(ok, Z, np.nan), origin="lower", aspect="auto", interpolation="nearest",
                       norm=norm, cmap="viridis")  # fmt: skip
        fig.colorbar(im, ax=ax, shrink=0.85)
        ax.set_title(title, fontsize=10)
        grid.ticks(ax)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=130)
    return path


def _tick(v) -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    return format(x, ".3g")
