"""Online stochastic gradient descent on the joint schedule (extension; docs/theory/mathematics.md §M8.6).

``θ_{k+1} = θ_k − η Λ ∇L̂_{B,k}(θ_k)`` with ``Λ = diag(η_w, η_C, η_a)``
(``config.schedule``) and ``L̂_{B,k}`` the mean loss of the k-th batch of ``B``
sequences, on the time axis ``t = kη`` shared with gradient descent
(``solver.method = "gd"``) and the gradient flow. Every block moves at every step
(the joint schedule). ``R`` seeds run as one ``jax.vmap`` batch.

Two ways to draw batches:

- ``sampling = "fresh"`` (online SGD, what practitioners run): every step draws
  ``B`` new sequences (each with its own kernel π) from the data model, from the key
  ``fold_in(fold_in(key(seed), r), k)`` of seed r and step k, so the expected
  gradient is the population gradient ∇L. They are drawn by
  :func:`gflow.core._data.sample_fast` (the data model's law exactly, by cheaper algorithms
  than the fixed sample's :func:`gflow.sample`), their window counts for all seeds
  at once (``gflow.core.features_time_major``); ``estimator.target = "drawn"`` uses each
  sequence's sampled ``x_{L+1}``, as ``make_loss`` does;
- ``sampling = "fixed"``: batches are drawn *without replacement* from the flow's fixed
  sample (``make_loss``'s ``L̂_N``): epoch e is a random permutation of the N
  sequences cut into ``N // B`` batches (a remainder ``N mod B`` is left out of that
  epoch). The expected gradient is then exactly ∇L̂_N, the flow's; with ``B = N`` one
  step is one epoch and equals one GD step. Random reshuffling makes the noise cancel
  over each epoch (at the end of whole epochs the spread over seeds is far below
  √(η/B): measured 8e-6 for a at η = 0.0125 after 8 epochs, against 0.012 at η = 0.2
  within one epoch);
- ``sampling = "replace"``: each batch is B i.i.d. uniform draws (with replacement)
  from the fixed sample: the one-step covariance is exactly η²ΛΣΛ/B, the SME's.

The loss recorded at saved times is ``L̂_N`` of the fixed sample (the flow's), so
SGD, GD, the flow and the SDE (:mod:`gflow.sde`) are measured on one yardstick.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from ..config import Config, check_sgd_sampling
from ..core import (
    Params,
    PopulationLoss,
    Sample,
    features_time_major,
    init_params,
    loss_targets,
    make_loss,
    member_of,
    resolve_layout,
    sample_fast_time_major,
)


class SGDConfig(eqx.Module):
    """Settings of an SGD run (the model, data and Λ come from a :class:`~gflow.Config`).

    - `eta`: the step η (time per step), ``> 0``.
    - `batch`: sequences per step B, ``>= 1`` (``<= N`` for ``sampling="fixed"``).
    - `steps`: number of steps K (the run ends at ``t = Kη``), ``>= 1``.
    - `seeds`: number of independent runs R (vmapped), ``>= 1``.
    - `seed`: base PRNG seed of the batches (seed r uses ``fold_in(key(seed), r)``).
    - `sampling`: ``"fresh"`` (default), ``"fixed"`` or ``"replace"`` (see the module docstring).
    - `save_per_decade`: saved steps per decade of k (a log grid from k = 1, plus k = 0
      and k = K), default 12.
    - `shard`: how the work is split over the devices ``jax.devices()`` (on a CPU, one
      device a core with ``XLA_FLAGS=--xla_force_host_platform_device_count=D`` set
      before JAX starts): ``"none"`` (default: one device), ``"seeds"`` (each device runs
      R/D of the seeds; every seed's trajectory is the one ``"none"`` gives; R must be a
      multiple of D) or ``"batch"`` (``sampling="fresh"`` only: each device draws B/D of
      every seed's sequences, device j from ``fold_in(key, j)`` of the step's key, and the
      gradients are averaged over the devices; the same law as ``"none"``, another
      random stream; B must be a multiple of D). ``"batch"`` is how one seed uses
      several cores: XLA runs a step of B = 1000 on one core.
    """

    eta: float = eqx.field(static=True, default=0.1)
    batch: int = eqx.field(static=True, default=1000)
    steps: int = eqx.field(static=True, default=1000)
    seeds: int = eqx.field(static=True, default=8)
    seed: int = eqx.field(static=True, default=0)
    sampling: Literal["fresh", "fixed", "replace"] = eqx.field(static=True, default="fresh")
    save_per_decade: int = eqx.field(static=True, default=12)
    shard: Literal["none", "seeds", "batch"] = eqx.field(static=True, default="none")

    def __check_init__(self):
        if not (isinstance(self.eta, (int, float)) and np.isfinite(self.eta) and self.eta > 0):
            raise ValueError(f"sgd.eta must be a finite number > 0, got {self.eta!r}")
        for name in ("batch", "steps", "seeds", "save_per_decade"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"sgd.{name} must be an integer >= 1, got {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"sgd.seed must be an integer >= 0, got {self.seed!r}")
        check_sgd_sampling(self.sampling, self.shard)


@dataclasses.dataclass
class SGDRun:
    """Saved states of R SGD runs: ``ts`` ``(T,)`` (``t = kη``), ``steps`` ``(T,)``
    (k), ``w`` ``(R, T, H, M)``, ``C`` ``(R, T, |𝒮|)``, ``a`` ``(R, T)``, ``loss``
    ``(R, T)`` (``L̂_N`` of the fixed sample), the settings and the wall time."""

    ts: np.ndarray
    steps: np.ndarray
    w: np.ndarray
    C: np.ndarray
    a: np.ndarray
    loss: np.ndarray
    config: Config
    sgd: SGDConfig
    wall: float
    x: dict = dataclasses.field(default_factory=dict)  # a member's extra blocks, (R, T, ...) each

    @property
    def c_frac(self) -> np.ndarray:
        return np.asarray(member_of(self.config.model).shares({"C": self.C, **self.x}))


def _scale(cfg: Config, dtype, like: Params) -> Params:
    """Λ as a θ of scalars: every block's time scale (its group's η, as the flow's)."""
    s = cfg.schedule
    eta = {"w": s.eta_w, "C": s.eta_C, "a": s.eta_a}
    group = member_of(cfg.model).block_group
    return Params.from_blocks({b: jnp.asarray(eta[group(b)], dtype) for b in like.names})


def _fresh_features(cfg: Config, keys, B: int):
    """Features of B fresh sequences for every seed (``keys`` ``(R,)``, one key a seed
    and step): each seed's sequences from its own key (so seed r's batches do not depend
    on R), the features computed on the R·B sequences at once; leaves ``(R, B, ...)``."""
    L = cfg.data.L
    tokens, zq, cond, pi = jax.vmap(lambda key: sample_fast_time_major(cfg.data, B, key, jnp.float64))(keys)
    R = keys.shape[0]
    tokens = jnp.moveaxis(tokens, 0, 1).reshape(L + 1, R * B)  # (L+1, R·B), seed-major columns
    cond = cond.reshape(R * B, -1)
    layout = resolve_layout(cfg.estimator.layout, cfg.data.d, cfg.model)
    smp = Sample(X=tokens[:L].T, y=tokens[L], zq=zq.reshape(-1), cond=cond, pi=pi.reshape((R * B,) + pi.shape[2:]))
    smp = eqx.tree_at(lambda s: s.cond, smp, loss_targets(smp, cfg.data, cfg.estimator))  # as make_loss does
    feats = features_time_major(tokens, smp, cfg.model, layout=layout, dtype=cfg.estimator.jdtype)
    return jax.tree.map(lambda x: x.reshape((R, B) + x.shape[1:]), feats)


class _Stepper(eqx.Module):
    """One SGD step of every seed: ``θ_r − η Λ ∇L̂_{B,k,r}(θ_r)``."""

    loss: PopulationLoss  # the fixed sample (the batches of "fixed"; a template for "fresh")
    scale: Params
    cfg: Config = eqx.field(static=True)
    sc: SGDConfig = eqx.field(static=True)
    devices: int = eqx.field(static=True, default=1)  # D, the devices sgd.shard splits over

    def batch_feats(self, keys, k):
        """The k-th batch's features of every seed (leaves ``(R, B, ...)``)."""
        B, L = self.sc.batch, self.loss
        if self.sc.sampling == "fresh":
            return _fresh_features(self.cfg, jax.vmap(lambda key: jax.random.fold_in(key, k))(keys), B)

        def one(key):
            if self.sc.sampling == "replace":
                idx = jax.random.randint(jax.random.fold_in(key, k), (B,), 0, L.N)
            else:
                nb = L.N // B
                perm = jax.random.permutation(jax.random.fold_in(key, k // nb), L.N)
                idx = jax.lax.dynamic_slice(perm, ((k % nb) * B,), (B,))
            return jax.tree.map(lambda x: x[idx], L.feats)

        return jax.vmap(one)(keys)

    def __call__(self, P: Params, keys, k) -> Params:
        grad = jax.vmap(lambda p, f: eqx.tree_at(lambda m: m.feats, self.loss, f).grad(p))
        if self.sc.shard == "batch":  # inside shard_map: this device's B/D sequences of every seed
            j = jax.lax.axis_index(_AXIS)
            keys_k = jax.vmap(lambda key: jax.random.fold_in(jax.random.fold_in(key, k), j))(keys)
            G = jax.lax.pmean(grad(P, _fresh_features(self.cfg, keys_k, self.sc.batch // self.devices)), _AXIS)
        else:
            G = grad(P, self.batch_feats(keys, k))
        eta = self.sc.eta
        return jax.tree.map(lambda x, s, gx: x - eta * s * gx, P, self.scale, G)


_AXIS = "devices"


def _loop(stepper: _Stepper, P: Params, keys, k0, k1):
    return jax.lax.fori_loop(k0, k1, lambda k, P: stepper(P, keys, k), P)


# XLA:CPU hands reductions to the YNNPACK library by default; on this step's small
# reductions (over 64 windows, 3 tokens) its own loops are faster: 2.97 → 2.60 ms a step
# (scripts/benchmarks/bench_joint.py --part sgd). A compile option of these programs only.
_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


@eqx.filter_jit(compiler_options=_COMPILER_OPTIONS)
def _advance(stepper: _Stepper, P: Params, keys, k0, k1):
    """Steps ``k0 .. k1−1`` of every seed (leading axis of ``P`` and ``keys``), fused in one
    ``fori_loop`` (no dispatch per step); with ``sgd.shard``, one loop per device
    (``shard_map``): the seeds split over the devices, or every batch."""
    if stepper.sc.shard == "none":
        return _loop(stepper, P, keys, k0, k1)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[: stepper.devices]), (_AXIS,))
    rep, split = jax.sharding.PartitionSpec(), jax.sharding.PartitionSpec(_AXIS)
    spec = split if stepper.sc.shard == "seeds" else rep
    fn = jax.shard_map(_loop, mesh=mesh, in_specs=(rep, spec, spec, rep, rep), out_specs=spec, check_vma=False)
    return fn(stepper, P, keys, k0, k1)


def _make_stepper(cfg: Config, sc: SGDConfig, loss: PopulationLoss) -> _Stepper:
    D = jax.device_count() if sc.shard != "none" else 1
    like = jax.eval_shape(lambda: init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L))
    return _Stepper(loss=loss, scale=_scale(cfg, cfg.estimator.jdtype, like), cfg=cfg, sc=sc, devices=D)


@eqx.filter_jit
def _losses(loss: PopulationLoss, P: Params):
    return jax.lax.map(loss, P)


def save_steps(K: int, per_decade: int) -> np.ndarray:
    n = int(np.floor(per_decade * np.log10(K) + 1e-9)) + 1
    g = np.round(10.0 ** (np.arange(n) / per_decade)).astype(int)
    return np.unique(np.concatenate([[0], g[g < K], [K]]))


def _check(cfg: Config, sc: SGDConfig, loss: PopulationLoss | None):
    """Bad requests fail here, before the sample is drawn."""
    N = cfg.estimator.N if loss is None else loss.N
    if cfg.schedule.kind != "joint":
        raise ValueError(f"SGD runs the joint schedule: schedule.kind must be 'joint', got {cfg.schedule.kind!r}")
    if sc.sampling == "fixed" and sc.batch > N:
        raise ValueError(f"sgd.batch = {sc.batch} must be <= estimator.N = {N} for sampling='fixed'")
    if cfg.estimator.shard or cfg.estimator.chunk:
        raise ValueError("SGD does not support estimator.shard or estimator.chunk (batches are small; "
                         "sgd.shard splits SGD's work over the devices)")  # fmt: skip
    D = jax.device_count()
    if sc.shard == "seeds" and sc.seeds % D:
        raise ValueError(f"sgd.shard = 'seeds' needs sgd.seeds a multiple of the {D} devices, got {sc.seeds}")
    if sc.shard == "batch" and sc.batch % D:
        raise ValueError(f"sgd.shard = 'batch' needs sgd.batch a multiple of the {D} devices, got {sc.batch}")


def _sgd_runner(cfg: Config, sc: SGDConfig, loss: PopulationLoss | None = None, params0: Params | None = None):
    """``(step, state)``: ``step(state)`` advances every seed by one step (for timing);
    ``state = (P, keys, k)``."""
    dtype = cfg.estimator.jdtype
    _check(cfg, sc, loss)
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    stepper = _make_stepper(cfg, sc, loss)
    p0 = params0 if params0 is not None else init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L, dtype=dtype)
    P = jax.tree.map(lambda x: jnp.broadcast_to(jnp.asarray(x, dtype), (sc.seeds,) + jnp.shape(x)), p0)
    base = jax.random.key(sc.seed)
    keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(sc.seeds))

    def step(state):
        P, keys, k = state
        return _advance(stepper, P, keys, k, k + 1), keys, k + 1

    return step, (P, keys, jnp.asarray(0))


def sgd_settings(cfg: Config) -> SGDConfig:
    """The :class:`SGDConfig` of a configuration: η = ``solver.eta``, ``⌈schedule.t1/η⌉``
    steps (as GD), ``solver.save_per_decade``, and B, R, the seed, the sampling and the
    sharding from its ``[sgd]`` section (what ``gflow run`` runs for ``solver.method = "sgd"``)."""
    g = cfg.sgd
    eta = cfg.solver.eta
    return SGDConfig(eta=eta, steps=max(1, math.ceil(cfg.schedule.t1 / eta - 1e-9)), batch=g.batch, seeds=g.seeds,
                     seed=g.seed, sampling=g.sampling, shard=g.shard,
                     save_per_decade=cfg.solver.save_per_decade)  # fmt: skip


def _settings(cfg: Config, sc: SGDConfig | None) -> SGDConfig:
    """The run's :class:`SGDConfig`. With ``solver.method = "sgd"`` the config says it
    (:func:`sgd_settings`: η from ``solver.eta``, the end from ``schedule.t1``, the rest
    from ``[sgd]``); a given `sc` replaces it, but must agree on η and the steps (an error
    naming both)."""
    if cfg.solver.method_for("I") != "sgd":
        return SGDConfig() if sc is None else sc
    own = sgd_settings(cfg)
    if sc is None:
        return own
    eta, K = own.eta, own.steps
    if sc.eta != eta or sc.steps != K:
        raise ValueError(
            f"solver.method = 'sgd' takes η = solver.eta = {eta!r} and ⌈schedule.t1/η⌉ = {K} steps, but "
            f"sgd.eta = {sc.eta!r}, sgd.steps = {sc.steps!r}: make them agree, or pass no SGDConfig "
            f"settings for η and the steps"
        )
    return sc


def sgd(config: Config, sgd: SGDConfig | None = None, *, loss: PopulationLoss | None = None,
        params0: Params | None = None, progress: bool = False) -> SGDRun:  # fmt: skip
    """Run ``sgd.seeds`` independent SGD runs of ``sgd.steps`` steps (see the module
    docstring) and return their saved states.

    **Arguments:**

    - `config`: the model, data, initialisation, time scales Λ (``schedule``, which must
      be ``"joint"``) and the fixed sample's estimator (``estimator``: the loss recorded
      at saved times and the sample that ``sampling="fixed"`` draws from).
    - `sgd`: an :class:`SGDConfig` (default ``SGDConfig()``; with ``solver.method = "sgd"``
      the default is the configuration's own, :func:`sgd_settings`: η from ``solver.eta``,
      ``⌈schedule.t1/η⌉`` steps, the rest from its ``[sgd]`` section; a given one must agree
      on η and the steps).
    - `loss`: the fixed sample's ``L̂_N`` (default ``make_loss`` of the config).
    - `params0`: the initial θ (default: the paper's initialisation), shared by all seeds.
    - `progress`: show a tqdm progress bar of the steps (updated at every saved step), as
      ``solver.progress`` does for the flow. Default off.
    """
    t_wall = time.perf_counter()
    cfg, sc = config, _settings(config, sgd)
    _check(cfg, sc, loss)
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    _, (P, keys, _) = _sgd_runner(cfg, sc, loss, params0)
    stepper = _make_stepper(cfg, sc, loss)
    ks = save_steps(sc.steps, sc.save_per_decade)
    saved = [P]
    bar = tqdm.tqdm(total=int(sc.steps), desc="gflow.sgd", unit="step") if progress else None
    for k0, k1 in itertools.pairwise(ks):
        P = _advance(stepper, P, keys, jnp.asarray(int(k0)), jnp.asarray(int(k1)))
        saved.append(P)
        if bar is not None:
            jax.block_until_ready(P)
            bar.update(int(k1) - int(k0))
    if bar is not None:
        bar.close()
    S = jax.device_get(jax.tree.map(lambda *xs: jnp.stack(xs, axis=1), *saved))  # (R, T, ...)
    flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), S)
    losses = np.asarray(_losses(loss, jax.tree.map(jnp.asarray, flat))).reshape(sc.seeds, len(ks))
    return SGDRun(ts=ks * sc.eta, steps=ks, w=np.asarray(S.w), C=np.asarray(S.C), a=np.asarray(S.a), loss=losses,
                  config=cfg, sgd=sc, wall=time.perf_counter() - t_wall,
                  x={b: np.asarray(v) for b, v in S.x.items()})  # fmt: skip
