"""The figures of a phase diagram (:func:`plot_phase`, drawn by [`gflow.run_phase`][gflow.run_phase]):
``phase_map`` (which set wins where, by the paper's Ĩ, by J and by the flow, and the J gap in
paired standard errors with its zero contour, the phase boundary) and ``phase_heat`` (a*, C*
and the Stage I duration, predicted and measured)."""

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
    """The points of ``phase.json`` laid out on the grid: one row per value of the first field,
    one column per value of the second (the field that varies fastest); a single row for one
    field."""

    def __init__(self, body: dict):
        fields, values = body["fields"], body["values"]
        self.rows = [phase_row(r) for r in body["results"]]
        self.flow = bool(body.get("flow"))
        self.n_pi = body.get("n_pi")
        self.N = (body.get("base_config") or {}).get("estimator", {}).get("N")
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
    atomic_savefig(phase_map_figure(grid), path, dpi=130)
    return path


def _signed_gap(grid: _Grid):
    """``z = ±J_gap/J_gap_se`` per cell, + where argmax J is the grid's most frequent J winner ``A``,
    − elsewhere: its zero contour is the boundary of A's phase, |z| < 3 the undecided band.
    Returns ``(z, A)``."""
    win = grid.of("argmax_J")
    gap = grid.of("J_gap", lambda v: np.nan if v is None else float(v)).astype(float)
    se = grid.of("J_gap_se", lambda v: np.nan if v is None else float(v)).astype(float)
    labs = [str(v) for v in win.ravel() if v is not None]
    A = max(sorted(set(labs)), key=labs.count) if labs else None
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, gap / se, np.where(gap > 0, np.inf, 0.0))
    sign = np.where(win.astype(str) == str(A), 1.0, -1.0)
    return sign * z, A


def _n_needed(grid: _Grid, body_N) -> tuple[int, float | None]:
    """The undecided J cells (``J_uncertain``) and the sample size that would decide the median
    one: the paired SE falls as 1/√N, so a gap of z SE at N needs ``N·(3/z)²``."""
    unc = grid.of("J_uncertain").astype(bool)
    z = np.abs(_signed_gap(grid)[0])
    N = grid.of("estimator.N", lambda v: np.nan if v is None else float(v)).astype(float)
    N = np.where(np.isfinite(N), N, float(body_N))
    need = [N[i] * (3.0 / z[i]) ** 2 for i in zip(*np.nonzero(unc)) if z[i] > 0]
    return int(unc.sum()), (float(np.median(need)) if need else None)


def phase_map_figure(grid: _Grid):
    """``phase_map``: the Stage I winner by argmax Ĩ, by argmax J and (with the flow) selected, and
    the J gap in standard errors with its zero contour; the legend lists the colours drawn (not
    those of undecided cells, drawn hatched grey), and the title says how many cells the sample
    is too small to decide and what N would decide them."""
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
    # the colours drawn: a cell's set unless the cell is undecided (grey) or has none
    drawn = sorted({str(v) for _, G, U in panels for v, u in zip(G.ravel(), U.ravel()) if v is not None and not u})
    every = sorted({str(v) for _, G, _ in panels for v in G.ravel() if v is not None})
    cmap = matplotlib.colormaps["tab10"]
    colour = {lab: cmap(i % 10) for i, lab in enumerate(every)}  # a set keeps its colour in every panel
    fig = Figure(figsize=(4.2 * (len(panels) + 1), 0.9 + 0.45 * grid.ny + 1.9))
    axes = fig.subplots(1, len(panels) + 1, squeeze=False)[0]
    for pan, (ax, (title, G, U)) in enumerate(zip(axes, panels)):
        _winner_panel(ax, grid, pan, G, U, colour, win_I, win_J)
        ax.set_title(title, fontsize=10)
        grid.ticks(ax)
    z, A = _signed_gap(grid)
    _gap_panel(fig, axes[-1], grid, z, A)
    handles = [Patch(color=colour[lab], label=lab) for lab in drawn]
    if any(bool(u) for _, _, U in panels for u in U.ravel()):
        handles.append(Patch(facecolor=(0.85, 0.85, 0.85), hatch="///", edgecolor="0.5",
                             label="undecided (top two within 3 paired SE)"))  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
    n_unc, need = _n_needed(grid, grid.N)
    lines = ["Stage I winner; × Ĩ and J disagree" + ("; ○ the flow differs from argmax J" if flow else "")]
    n = grid.nx * grid.ny
    if n_unc:
        lines.append(f"{n_unc} of {n} cells undecided by J: N is too small to decide them"
                     + (f" (the median one needs N ≈ {need:.3g}: the paired SE falls as 1/√N)" if need else ""))
    n_unc_I = int(unc_I.astype(bool).sum())
    if n_unc_I:
        lines.append(f"{n_unc_I} of {n} cells undecided by Ĩ: n_pi = {grid.n_pi} prior kernels too few")
    fig.suptitle("\n".join(lines), fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 0.95 - 0.035 * (len(lines) - 1)))
    return fig


def _gap_panel(fig, ax, grid: _Grid, z, A) -> None:
    """The signed J gap in paired SE (:func:`_signed_gap`), its zero contour (the boundary of A's
    phase) and the undecided band |z| < 3; one field: z against the field's values."""
    zc = np.clip(np.where(np.isfinite(z), z, np.sign(z) * 30.0), -30.0, 30.0)
    lim = max(3.5, float(np.nanmax(np.abs(zc)))) if np.isfinite(zc).any() else 3.5
    if grid.ny == 1:
        x = np.arange(grid.nx)
        ax.axhspan(-3, 3, color="0.85", alpha=0.6, lw=0, label="|z| < 3: undecided")
        ax.axhline(0.0, color="k", lw=1.0)
        ax.plot(x, zc[0], "-o", color="tab:blue", ms=4)
        ax.set_ylabel("z (paired SE)")
        ax.set_xticks(range(grid.nx), [_tick(v) for v in grid.xv], rotation=45 if grid.nx > 6 else 0, fontsize=8)
        ax.set_xlabel(grid.fx)
    else:
        im = ax.imshow(zc, origin="lower", aspect="auto", interpolation="nearest", cmap="RdBu", vmin=-lim, vmax=lim)
        fig.colorbar(im, ax=ax, shrink=0.85, label="z (paired SE)")
        if np.nanmin(zc) < 0 < np.nanmax(zc):
            ax.contour(zc, levels=[0.0], colors="k", linewidths=1.5)
        if np.nanmin(zc) < 3 and np.nanmax(zc) > -3:
            ax.contour(zc, levels=[-3.0, 3.0], colors="k", linewidths=0.8, linestyles="--")
        grid.ticks(ax)
    ax.set_title(f"J gap in SE: + where argmax J = {A}, − elsewhere\n(— 0: the phase boundary; - - ±3)", fontsize=9)


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
