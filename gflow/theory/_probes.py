"""Bietti et al.'s probes of a run on the triggers data (docs/results/comparison.md): their memory
probes of the member ``bietti`` (``gflow.core.bietti_probes``: W_O²'s and W_K²'s identity
fractions, layer 1's attention on offset 1) and the loss split into the trigger outputs' part and
the rest, at a run's saved times.

- ``loss_outputs``: the mean loss (the cross-entropy of the model's prediction against the target
  law) over the positions t whose token is a trigger seen before (their ``outs >= 2``: the output is
  in the context);
- ``loss_rest``: the same over the positions whose token is not a trigger (their ``outs == 0``,
  ``loss_bigram``), and ``entropy_rest``, the global bigram's entropy rate on those positions
  (``E H(π_b(·|x_t))``, the least ``loss_rest`` can be: the targets there are π_b's rows).

Both over every position of the run's own sample (a member that predicts the last position only:
over the last positions). Each saved time costs one gradient of the loss in its targets
(``gflow.theory.model_predictions``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

__all__ = ["PROBES", "probes_of"]

#: the probe arrays of a bietti run (``gflow.probes``)
PROBES = ("probe_wo2", "probe_wk2", "probe_wk1")


def probes_of(traj, *, every: int = 1, loss=None) -> dict:
    """The probes at every `every`-th saved time and the last: ``{"t", "probe_wo2", "probe_wk2",
    "probe_wk1"}`` for the member ``bietti``, ``{"loss_outputs", "loss_rest", "entropy_rest"}`` for
    the triggers data (module docstring); `loss`: the run's estimator when already built."""
    from ..core import Params, at_trigger, bietti_probes, fixed_triggers, kind_of, loss_sample, make_loss
    from ._ladder import entropy
    from ._strategies import model_predictions

    cfg, n = traj.config, len(traj.ts)
    bietti, triggers = cfg.model.member == "bietti", cfg.data.kind == "triggers"
    if not (bietti or triggers):
        raise ValueError(f"probes: they read model.member = 'bietti' or data.kind = 'triggers', got model.member = "
                         f"{cfg.model.member!r}, data.kind = {cfg.data.kind!r}")  # fmt: skip
    idx = sorted(set(range(0, n, every)) | {n - 1})
    out: dict = {"t": np.asarray(traj.ts, np.float64)[idx]}
    if bietti:
        rows = fixed_triggers(cfg.data) if triggers and cfg.data.trigger_mode == "fixed" else None
        blocks = {b: np.asarray(v)[idx] for b, v in traj.blocks().items()}
        out.update(bietti_probes(blocks, rows))
    if triggers:
        est = cfg.estimator
        if est.positions == "outputs":  # the same sample, every position's target
            est = dataclasses.replace(est, positions="all")
        if loss is None or est is not cfg.estimator:
            loss = make_loss(cfg.data, cfg.model, est)
        smp = loss_sample(cfg.data, cfg.estimator)
        kind = kind_of(cfg.data)
        law = np.asarray(kind.every_position(cfg.data, smp.X, smp.y, smp.pi)[0], np.float64)  # (N, L, d)
        outs = np.asarray(kind.output_positions(cfg.data, smp.X, smp.pi))
        rest = ~np.asarray(at_trigger(cfg.data, smp.X, smp.pi))
        if est.positions == "last":
            law, outs, rest = law[:, -1:], outs[:, -1:], rest[:, -1:]
        H = entropy(law)
        out["entropy_rest"] = float(H[rest].mean()) if rest.any() else float("nan")
        lo, lr = [], []
        dt = loss.eps.dtype
        for i in idx:
            p = model_predictions(loss, Params.from_blocks({b: jnp.asarray(v, dt) for b, v in traj.state(i).items()}))
            p = p.reshape(law.shape)
            ce = -np.sum(np.where(law > 0, law * np.log(np.maximum(p, 1e-300)), 0.0), -1)  # (N, L')
            lo.append(float(ce[outs].mean()) if outs.any() else float("nan"))
            lr.append(float(ce[rest].mean()) if rest.any() else float("nan"))
        out["loss_outputs"], out["loss_rest"] = np.asarray(lo), np.asarray(lr)
    return out
