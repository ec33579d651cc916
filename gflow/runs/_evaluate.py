"""Evaluation off the training distribution (docs/theory/mathematics.md §M8.4).

``gflow eval RUN --param data.L=25,50,100 [--param …]`` evaluates a run's
final parameters θ on other data configurations — other ``L``, ``α``, parent
sets, start laws, burn-in or kernel, and other Monte Carlo samples
(``estimator.N``, ``estimator.seed``) — each with the loss ladder of its own
sample ([`gflow.loss_ladder`][gflow.loss_ladder]): length generalisation and robustness.

For each point of the cross product of the ``--param`` values (the syntax of
``gflow sweep``) the loss is built as the run built its own,
[`gflow.make_loss`][gflow.make_loss] of the point's data and estimator (key
``estimator.seed``, the layout of the model's span, the run's target, dtype and
sharding), so the training configuration itself reproduces the run's final loss.
The model, the loss definition (``estimator.loss``, ``ε``, ``estimator.target``)
and θ stay the run's; with a drawn target the oracle predicts with the kernel's
``π(·|z_q)`` (``kernel_conditional``), as in the run's report.

Choices (the paper is silent):

- The GIH rungs use the set the run selected (Stage II's heads; for a joint
  run, ``argmax c/Σc`` at the end), at each configuration's own
  ``argmin_a L_GIH`` ("the GIH at its own a*").
- Only ``data.*`` (except ``data.d``) and ``estimator.N``, ``estimator.seed``,
  ``estimator.chunk`` may change: ``data.d`` and every ``model.*`` /
  ``init.*`` key fix what θ means or its shape, the other ``estimator`` keys
  the loss's definition or precision, and ``schedule`` / ``solver`` are
  about training. Any other key is a ``ValueError`` naming it, before
  anything is computed.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._util import atomic_write_text, format_cell, jsonable, show_value, write_csv
from ..config import Config, from_dict
from ..core import Params, kernel_conditional, make_loss, member_of, subset_label
from ..core import sample as draw_sample
from ..figures import plot_eval
from ..theory import RUNGS, Ladder, loss_ladder
from ..trajectory import Trajectory, load, selected_set
from ._executor import GridIncomplete, check_executor, open_executor, run_points
from ._samples import SampleBank, worker_bank
from ._sweep import parse_param, sweep_points

__all__ = ["EVAL_KEYS", "EvalResult", "eval_point", "eval_task", "evaluate", "plot_eval"]

EVAL_KEYS = {
    "data": ("L", "alpha", "parents", "start", "burn_in", "kernel", "prior"),
    "estimator": ("N", "seed", "chunk"),
}
_WHY = {
    "data.d": "the trained parameters are for the run's vocabulary",
    "model": "the parameters' shapes and meaning depend on it",
    "init": "the parameters are the run's trained ones, not an initialisation",
    "estimator": "it changes the loss's definition or precision",
    "schedule": "it is about training, not evaluation",
    "solver": "it is about training, not evaluation",
}


def _allowed() -> list[str]:
    return [f"{s}.{k}" for s, ks in EVAL_KEYS.items() for k in ks]


def _check_eval_fields(traj: Trajectory, pairs: list[tuple[str, list]]) -> None:
    cfg = traj.config.to_dict()
    for field, vals in pairs:
        sec, _, key = field.partition(".")
        if sec in EVAL_KEYS and key in EVAL_KEYS[sec]:
            continue
        if sec in cfg and key in cfg[sec]:
            why = _WHY.get(field) or _WHY.get(sec, "")
            raise ValueError(
                f"{field} cannot change ({why}; the run has {field} = {show_value(cfg[sec][key])}, "
                f"asked {', '.join(show_value(v) for v in vals)}); eval can change only {_allowed()}"
            )
        raise ValueError(f"unknown config field {field!r}; eval can change only {_allowed()}")


def _pairs(params) -> list[tuple[str, list]]:
    if isinstance(params, dict):
        params = list(params.items())
    if isinstance(params, str):
        params = [params]
    return [parse_param(p) if isinstance(p, str) else (p[0], list(p[1])) for p in params]


def _selected_set(traj: Trajectory) -> tuple[int, ...]:
    """The set the run's Stage I selected (:func:`gflow.trajectory.selected_set`),
    else ``argmax c/Σc`` at the run's last saved time."""
    S = selected_set(traj)
    return S if S is not None else tuple(traj.subsets[int(np.argmax(traj.c_frac[-1]))])


def final_params(traj: Trajectory) -> Params:
    """θ at the run's last saved time (every block, a member's included), in the run's estimator dtype."""
    dt = traj.config.estimator.jdtype
    return Params.from_blocks({b: jnp.asarray(v, dt) for b, v in traj.state(-1).items()})


@dataclasses.dataclass
class EvalResult:
    """What :func:`evaluate` returns.

    - `fields`: the swept fields; `rows`: one flat dict per point (the point's
      values, ``loss`` ± ``loss_se`` of θ, ``unseen``, every rung's mean and
      SE, the gaps with their paired SEs, ``a_gih``, ``captured``);
    - `ladders`: the :class:`~gflow.Ladder` of each point;
    - `S`: the GIH's set; `run_loss`: the run's final loss; `files`: what
      was written.
    """

    fields: list[str]
    rows: list[dict[str, Any]]
    ladders: list[Ladder]
    S: tuple[int, ...]
    run_loss: float
    wall: float
    files: list[Path] = dataclasses.field(default_factory=list)

    def table(self) -> str:
        cols = ["loss", "oracle", "bayes", "gih", "unigram", "flow_minus_bayes"]
        head = "  ".join(f"{f:>12}" for f in self.fields) + "  " + "  ".join(f"{c:>18}" for c in cols)
        out = [head]
        for r in self.rows:
            cells = [f"{show_value(r[f]):>12}" for f in self.fields]
            for c in cols:
                se = r.get("loss_se" if c == "loss" else f"{c}_se")
                cells.append(f"{r[c]:>9.5f} ± {se:<6.2g}" if r.get(c) is not None else f"{'—':>18}")
            out.append("  ".join(cells))
        return "\n".join(out)


def evaluate(
    run: str | Path | Trajectory,
    params,
    *,
    out: str | Path | None = None,
    plot: bool = True,
    verbose: bool = False,
    executor=None,
) -> EvalResult:
    """Evaluate a run's final θ on other data configurations (docs/theory/mathematics.md §M8.4).

    **Arguments:**

    - `run`: a run folder or a :class:`~gflow.trajectory.Trajectory`.
    - `params`: ``--param`` strings (``"data.L=25,50,100"``), a dict
      ``{field: values}`` or ``[(field, values)]``; the cross product is
      evaluated (the last field varies fastest). See :data:`EVAL_KEYS`.
    - `out`: where to write ``eval.csv``, ``eval.json`` and (with `plot`)
      ``eval.png``; default ``RUN/eval`` for a folder, nothing for a
      trajectory.
    - `executor`: where the points run (:mod:`gflow.runs._executor`; default this process);
      the same rows bit for bit, the files written by this process.

    **Returns:** an :class:`EvalResult`.

    **Raises:** ``ValueError`` naming the field for a field eval cannot
    change (``data.d``, ``model.H``, …), an unknown field or a value the
    configuration rejects, before anything is computed.
    """
    t0 = time.perf_counter()
    check_executor(executor)
    if isinstance(run, Trajectory):
        traj = run
    else:
        traj = load(run)
        if out is None:
            out = Path(run) / "eval"
    pairs = _pairs(params)
    _check_eval_fields(traj, pairs)
    points = sweep_points(traj.config, pairs)  # validates every value before any compute
    if len(traj.ts) == 0:
        raise ValueError("the run has no saved time (no trained parameters)")
    fields = [f for f, _ in pairs]
    cfg = traj.config
    theta = final_params(traj)
    S = _selected_set(traj)

    found: dict[int, tuple[dict, Ladder]] = {}
    bank = SampleBank([pc for _, pc in points])  # points differing in L or burn_in: one chain

    def accept(k, res):
        row, lad = res
        found[k] = ({**points[k][0], **row}, lad)
        if verbose:
            row = found[k][0]
            print(f"  {', '.join(f'{f}={show_value(v)}' for f, v in points[k][0].items())}: loss {row['loss']:.5f} ± "
                  f"{row['loss_se']:.2g}, Bayes {row['bayes']:.5f}, GIH {row['gih']:.5f}, "
                  f"unigram {row['unigram']:.5f}", flush=True)  # fmt: skip

    with open_executor(executor) as engine:
        if engine is None:
            lost = run_points(None, lambda k: eval_point(cfg, points[k][1], theta, S, bank),
                              [(k, k) for k in range(len(points))], accept)  # fmt: skip
        else:
            last = {b: np.asarray(v) for b, v in traj.state(-1).items()}
            tasks = [(k, {"run_config": cfg.to_dict(), "config": pc.to_dict(), "theta": last, "S": S,
                          "steps": bank.steps_for(pc)}) for k, (_, pc) in enumerate(points)]  # fmt: skip
            lost = run_points(engine, eval_task, tasks, accept, verbose=verbose)
    if lost:
        raise GridIncomplete("evaluation", lost, None, "run it again")
    rows = [found[k][0] for k in range(len(points))]
    ladders = [found[k][1] for k in range(len(points))]

    res = EvalResult(
        fields=fields, rows=rows, ladders=ladders, S=S, run_loss=float(traj.loss[-1]),
        wall=time.perf_counter() - t0,
    )  # fmt: skip
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        res.files.append(_write_csv(res, out / "eval.csv"))
        res.files.append(_write_json(res, traj, out / "eval.json"))
        if plot:
            res.files.append(plot_eval(res, out / "eval.png"))
    return res


def eval_point(cfg: Config, pcfg: Config, theta: Params, S: tuple[int, ...],
               bank: SampleBank | None = None) -> tuple[dict[str, Any], Ladder]:  # fmt: skip
    """θ of a run of configuration `cfg` on the data of `pcfg` (one point of :func:`evaluate`):
    its sample drawn as the run's estimator draws it (``sample(data, N, key=jax.random.key(seed))``,
    from `bank`'s shared chain if given: the same sample), the loss ladder with the GIH of `S`.
    **Returns** the point's row (without the point's values) and its :class:`Ladder`."""
    est = pcfg.estimator
    if bank is None:
        smp = draw_sample(pcfg.data, est.N, key=jax.random.key(est.seed), dtype=jnp.float64)
    else:
        smp = bank.sample(pcfg)
    # the run's own estimator on the point's data and sample: make_loss, as the run built its loss
    # (the layout of the model's span, the run's target, dtype and sharding), on the point's sample
    loss = make_loss(pcfg.data, cfg.model, est, drawn=smp)
    offs = member_of(cfg.model).gih_offsets(S)  # the GIH of the offsets S reads
    lad = loss_ladder(loss, pcfg.data, S=offs if offs is not None else (), params=theta, estimator=est,
                      pi_cond=kernel_conditional(pcfg.data, est))  # fmt: skip
    row: dict[str, Any] = {"N": est.N}
    row["loss"], row["loss_se"] = lad.mean("flow"), lad.se("flow")
    row["unseen"] = float(loss.unseen())
    for k in RUNGS:
        row[k], row[f"{k}_se"] = lad.mean(k), lad.se(k)
    for a, b in (("flow", "bayes"), ("gih", "bayes"), ("flow", "gih")):
        row[f"{a}_minus_{b}"], row[f"{a}_minus_{b}_se"] = lad.gap(a, b)
    row["a_gih"] = lad.a_gih
    cap = lad.captured()
    row["captured"], row["captured_se"] = (None, None) if cap is None else cap
    row["bayes_optimal"] = lad.bayes_optimal
    return row, lad


def eval_task(payload: dict[str, Any]) -> tuple[dict[str, Any], Ladder]:
    """:func:`eval_point` in a worker (:mod:`gflow.runs._executor`), from plain data: the run's and
    the point's configurations (``Config.to_dict()``), θ's last saved values and the set."""
    cfg = from_dict(payload["run_config"])
    dt = cfg.estimator.jdtype
    theta = Params.from_blocks({b: jnp.asarray(v, dt) for b, v in payload["theta"].items()})
    pcfg = from_dict(payload["config"])
    return eval_point(cfg, pcfg, theta, tuple(payload["S"]), worker_bank(pcfg, payload["steps"]))


def _write_csv(res: EvalResult, path: Path) -> Path:
    cols = list(res.rows[0].keys())
    return write_csv(path, cols, ([format_cell(r[c], full=True) for c in cols] for r in res.rows))


def _write_json(res: EvalResult, traj: Trajectory, path: Path) -> Path:
    obj = {
        "fields": res.fields,
        "S": list(res.S),
        "S_label": subset_label(res.S),
        "run_loss": res.run_loss,
        "run_config": {k: v for k, v in traj.config.to_dict().items() if k in ("data", "model", "estimator")},
        "points": [
            {"point": {f: jsonable(r[f], inf_as_str=False) for f in res.fields}, "loss": r["loss"], "loss_se": r["loss_se"],
             "unseen": r["unseen"], "ladder": lad.to_json()}
            for r, lad in zip(res.rows, res.ladders)
        ],
        "wall_s": res.wall,
    }  # fmt: skip
    atomic_write_text(path, json.dumps(obj, indent=1, ensure_ascii=False, default=str))
    return path
