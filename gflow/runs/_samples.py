"""The samples of a grid's points, drawn once per chain (docs/performance.md, "Phase grids").

Points whose data differ only in ``L`` or ``burn_in`` (the same ``d``, parents, ``α``,
start law and kernel, the same ``estimator.N`` and seed) read their samples off one run of
the chain: :func:`gflow.core.draw_chain` for the most steps any of them needs, and
:func:`gflow.core.sample_from_chain` for each. JAX's partitionable Threefry gives every step
the same key whatever the chain's length, so each point's sample is the one ``gflow run`` /
``gflow theory`` draws for its configuration, bit for bit (``tests/test_prefix.py``), while
the grid compiles and runs the chain once instead of once per ``L``. Without partitionable
Threefry (``jax_threefry_partitionable = False``) every sample is drawn on its own.
"""

from __future__ import annotations

import json
from collections import OrderedDict

import jax
import jax.numpy as jnp

from ..config import Config
from ..core import (
    PopulationLoss,
    Sample,
    chain_prefix_stable,
    chain_steps,
    draw_chain,
    make_loss,
    sample,
    sample_from_chain,
)

__all__ = ["SampleBank", "chain_id", "worker_bank"]


def chain_id(cfg: Config) -> str:
    """What a point's chain depends on: its data without ``L`` and ``burn_in``, ``estimator.N``
    and ``estimator.seed`` (the sample is always drawn in float64)."""
    dd = cfg.to_dict()
    data = {k: v for k, v in dd["data"].items() if k not in ("L", "burn_in")}
    return json.dumps([data, dd["estimator"]["N"], dd["estimator"]["seed"]], sort_keys=True, default=str)


class SampleBank:
    """Samples (and losses) of a grid's points from shared chains (module docstring).

    `configs`: the grid's configurations, so that each chain is drawn once for the longest of
    its points (``steps``); `keep`: how many chains are held (the last used; at N = 10⁴, L = 200
    one is ~10 MB)."""

    def __init__(self, configs=(), *, keep: int = 4):
        self.steps: dict[str, int] = {}
        for c in configs:
            k = chain_id(c)
            self.steps[k] = max(self.steps.get(k, 0), chain_steps(c.data))
        self.keep = keep
        self.chains: OrderedDict[str, object] = OrderedDict()

    def steps_for(self, cfg: Config) -> int:
        """The chain length point `cfg`'s chain is drawn for (the grid's longest of its chain)."""
        return max(self.steps.get(chain_id(cfg), 0), chain_steps(cfg.data))

    def sample(self, cfg: Config, steps: int | None = None) -> Sample:
        """The sample of `cfg` (``sample(cfg.data, N, key=jax.random.key(seed))`` bit for bit), from its
        chain: drawn for ``max(steps, steps_for(cfg))`` steps when no chain held is long enough."""
        need = chain_steps(cfg.data)
        est = cfg.estimator
        if not chain_prefix_stable():
            return sample(cfg.data, est.N, key=jax.random.key(est.seed), dtype=jnp.float64)
        k = chain_id(cfg)
        ch = self.chains.get(k)
        if ch is None or ch.tokens.shape[1] - cfg.data.m < need:
            T = max(need, self.steps_for(cfg), int(steps or 0))
            while len(self.chains) >= self.keep:
                self.chains.popitem(last=False)
            ch = self.chains[k] = draw_chain(cfg.data, est.N, key=jax.random.key(est.seed), dtype=jnp.float64, steps=T)
        self.chains.move_to_end(k)
        return sample_from_chain(ch, cfg.data)

    def loss(self, cfg: Config, steps: int | None = None) -> PopulationLoss:
        """``make_loss(cfg.data, cfg.model, cfg.estimator)``, its sample from :meth:`sample`."""
        return make_loss(cfg.data, cfg.model, cfg.estimator, drawn=self.sample(cfg, steps))


_WORKER_BANK = SampleBank()


def worker_bank(cfg: Config, steps: int) -> SampleBank:
    """The bank of this worker process (:mod:`gflow.runs._executor`), told that `cfg`'s chain is
    drawn for at least `steps` steps (what the coordinator's bank would draw)."""
    k = chain_id(cfg)
    _WORKER_BANK.steps[k] = max(_WORKER_BANK.steps.get(k, 0), int(steps))
    return _WORKER_BANK
