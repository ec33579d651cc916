"""The diffusion limit of online SGD: its stochastic modified equation (extension; docs/theory/mathematics.md §M8.6).

``dθ = −Λ ∇L̂_N(θ) dt + √(η/B) Λ Σ(θ)^{1/2} dW``  (Itô),

the SME of Li, Tai & E (2017) to first order in η: the drift is the gradient
flow's, the diffusion matches the covariance of one SGD step,
``Cov(θ_{k+1} − θ_k) = η² ΛΣΛ / B``, over a time step ``dt = η``. ``Σ(θ)`` is the
covariance of the per-sequence gradients ``∇ℓ_n(θ)`` over the fixed sample of N
sequences (``make_loss``): ``Σ = (1/N) Σ_n (∇ℓ_n − ∇L̂)(∇ℓ_n − ∇L̂)ᵀ`` (ddof 0: a
batch of B drawn with replacement from the sample has covariance exactly Σ/B; drawn
fresh, Σ estimates the population covariance). θ has only ``H·M + |𝒮| + 1`` entries
(17 at the paper's sizes), so Σ is formed in full and ``Σ^{1/2}`` is its symmetric
square root (``eigh``, negative rounding eigenvalues clipped to 0); choice (a low-rank factor
would also do): no low-rank factor is needed at these sizes.

Integrated with diffrax: Euler–Maruyama (``diffrax.Euler`` on an ``ODETerm`` plus a
``ControlTerm`` driven by a ``VirtualBrownianTree``) with the constant step ``dt``
(default ``η/4``); R seeds, seed r's Brownian motion from
``fold_in(key(seed), r)`` (vmapped in groups of 32). With ``noise = 0`` the equation is the gradient flow and the
scheme is gradient descent with step ``dt``.
"""

from __future__ import annotations

import math
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..config import Config
from ..core import Params, PopulationLoss, init_params, make_loss, member_of
from ._sgd import SGDRun, save_steps


class SDEConfig(eqx.Module):
    """Settings of an SME run.

    - `eta`, `batch`: the SGD step η and batch B it models (noise scale ``√(η/B)``).
    - `t1`: end time, ``> 0``.
    - `seeds`: number of independent paths R (vmapped).
    - `seed`: base PRNG seed of the Brownian motions.
    - `dt`: the Euler–Maruyama step (default ``0``: ``η/4``); ``t1/dt`` is rounded up
      to whole steps.
    - `noise`: multiplies the diffusion (1: the SME; 0: the gradient flow).
    - `save_per_decade`: saved steps per decade of the step count (as :func:`gflow.sgd`).
    - `sigma_sample`: ``0`` (default: Σ from all N sequences of the fixed sample) or M with
      ``1 <= M <= N``: Σ from the first M sequences only (the sample is i.i.d., so a random
      subsample; the drift stays the full ``L̂_N``'s). Forming Σ costs M per-sequence
      gradients at every step, so M ≪ N makes long or many-path runs affordable; the noise
      is then that of a Σ estimated from M sequences (relative error ~ 1/√M).
    """

    eta: float = eqx.field(static=True, default=0.1)
    batch: int = eqx.field(static=True, default=1000)
    t1: float = eqx.field(static=True, default=100.0)
    seeds: int = eqx.field(static=True, default=8)
    seed: int = eqx.field(static=True, default=0)
    dt: float = eqx.field(static=True, default=0.0)
    noise: float = eqx.field(static=True, default=1.0)
    save_per_decade: int = eqx.field(static=True, default=12)
    sigma_sample: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        if isinstance(self.sigma_sample, bool) or not isinstance(self.sigma_sample, (int, np.integer)) or self.sigma_sample < 0:
            raise ValueError(f"sde.sigma_sample must be an integer >= 0 (0: the whole sample), got {self.sigma_sample!r}")
        for name, lo in (("eta", 0.0), ("t1", 0.0)):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > lo):
                raise ValueError(f"sde.{name} must be a finite number > 0, got {v!r}")
        for name in ("dt", "noise"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"sde.{name} must be a finite number >= 0, got {v!r}")
        for name in ("batch", "seeds", "save_per_decade"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"sde.{name} must be an integer >= 1, got {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"sde.seed must be an integer >= 0, got {self.seed!r}")

    @property
    def step(self) -> float:
        return self.dt if self.dt > 0 else self.eta / 4


def gradient_covariance(loss: PopulationLoss, params: Params) -> jax.Array:
    """``Σ(θ)``: the covariance (ddof 0) of the per-sequence gradients over the sample,
    on the flattened θ (``jax.flatten_util.ravel_pytree`` order: a, C, w)."""
    _, g = loss.per_sequence_grads(params)
    G = jax.vmap(lambda x: ravel_pytree(x)[0])(g)  # (N, P)
    Gc = G - G.mean(0)
    return Gc.T @ Gc / G.shape[0]


def _sqrtm_psd(S):
    lam, V = jnp.linalg.eigh(S)
    return (V * jnp.sqrt(jnp.clip(lam, 0.0))) @ V.T


class _Terms(eqx.Module):
    loss: PopulationLoss
    sig_loss: PopulationLoss  # the sequences whose per-sequence gradients give Σ
    lam: jax.Array  # Λ on the flattened θ
    unravel: object = eqx.field(static=True)
    noise: jax.Array  # √(η/B)·noise

    def drift(self, t, y, args):
        g = ravel_pytree(self.loss.grad(self.unravel(y)))[0]
        return -self.lam * g

    def diffusion(self, t, y, args):
        root = _sqrtm_psd(gradient_covariance(self.sig_loss, self.unravel(y)))
        return self.noise * self.lam[:, None] * root


@eqx.filter_jit
def _solve(terms: _Terms, y0, key, t1, dt, ts, n_steps: int, progress: bool = False):
    bm = diffrax.VirtualBrownianTree(0.0, t1, tol=dt / 8, shape=y0.shape, key=key)
    term = diffrax.MultiTerm(diffrax.ODETerm(terms.drift), diffrax.ControlTerm(terms.diffusion, bm))
    sol = diffrax.diffeqsolve(
        term, diffrax.Euler(), 0.0, t1, dt, y0,
        saveat=diffrax.SaveAt(ts=ts), stepsize_controller=diffrax.ConstantStepSize(),
        max_steps=n_steps + 2, adjoint=diffrax.ForwardMode(),
        progress_meter=diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter(),
    )  # fmt: skip
    return sol.ys


def sde_settings(cfg: Config) -> SDEConfig:
    """The :class:`SDEConfig` of a configuration (what ``gflow run`` runs for
    ``solver.method = "sde"``): η = ``solver.eta``, ``t1 = schedule.t1``,
    ``save_per_decade`` from ``[solver]``; B, R and the seed from ``[sgd]`` (the SGD it
    models); dt, the noise factor and Σ's sample from ``[sde]``."""
    g, e = cfg.sgd, cfg.sde
    return SDEConfig(eta=cfg.solver.eta, batch=g.batch, t1=cfg.schedule.t1, seeds=g.seeds, seed=g.seed, dt=e.dt,
                     noise=e.noise, save_per_decade=cfg.solver.save_per_decade,
                     sigma_sample=e.sigma_sample)  # fmt: skip


def _sde_settings(cfg: Config, sc: SDEConfig | None) -> SDEConfig:
    """``sc``, or with ``solver.method = "sde"`` the configuration's own (:func:`sde_settings`);
    a given `sc` must then agree with it on η and t1 (an error naming both)."""
    if cfg.solver.method_for("I") != "sde":
        return SDEConfig() if sc is None else sc
    own = sde_settings(cfg)
    if sc is None:
        return own
    if sc.eta != own.eta or sc.t1 != own.t1:
        raise ValueError(
            f"solver.method = 'sde' takes η = solver.eta = {own.eta!r} and t1 = schedule.t1 = {own.t1!r}, but "
            f"sde.eta = {sc.eta!r}, sde.t1 = {sc.t1!r}: make them agree, or pass no SDEConfig"
        )
    return sc


def sde(config: Config, sde: SDEConfig | None = None, *, loss: PopulationLoss | None = None,
        params0: Params | None = None, progress: bool = False) -> SGDRun:  # fmt: skip
    """Integrate ``sde.seeds`` paths of the SME of ``config`` (module docstring) and
    return them as an :class:`~gflow.SGDRun` (``steps`` counts Euler–Maruyama steps;
    ``ts = steps·dt``).

    ``config.schedule`` (which must be ``"joint"``) gives Λ; ``config.estimator`` the
    fixed sample whose ``L̂_N`` is the drift's and whose per-sequence gradients give Σ.
    `sde` defaults to ``SDEConfig()``, or with ``solver.method = "sde"`` to the
    configuration's own (:func:`sde_settings`), with which a given one must agree on η and t1.
    `progress`: show diffrax's tqdm progress meter of the Euler–Maruyama solve (one bar per
    group of at most 32 vmapped seeds), as ``solver.progress`` does for the flow.
    """
    t_wall = time.perf_counter()
    cfg, sc = config, _sde_settings(config, sde)
    if cfg.schedule.kind != "joint":
        raise ValueError(f"the SDE runs the joint schedule: schedule.kind must be 'joint', got {cfg.schedule.kind!r}")
    if cfg.estimator.shard or cfg.estimator.chunk:
        raise ValueError("the SDE does not support estimator.shard or estimator.chunk")
    dtype = cfg.estimator.jdtype
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    if sc.sigma_sample > loss.N:
        raise ValueError(f"sde.sigma_sample = {sc.sigma_sample} must be <= the sample's N = {loss.N} (0: all of it)")
    M = sc.sigma_sample or loss.N
    sig_loss = loss if M == loss.N else eqx.tree_at(lambda m: m.feats, loss, jax.tree.map(lambda x: x[:M], loss.feats))
    p0 = params0 if params0 is not None else init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L, dtype=dtype)
    y0, unravel = ravel_pytree(p0)
    s = cfg.schedule
    eta, group = {"w": s.eta_w, "C": s.eta_C, "a": s.eta_a}, member_of(cfg.model).block_group
    lam = ravel_pytree(Params.from_blocks({b: jnp.full_like(v, eta[group(b)]) for b, v in p0.blocks().items()}))[0]
    terms = _Terms(loss=loss, sig_loss=sig_loss, lam=lam, unravel=unravel, noise=jnp.asarray(sc.noise * math.sqrt(sc.eta / sc.batch), dtype))
    dt = sc.step
    K = max(1, math.ceil(sc.t1 / dt - 1e-9))
    ks = save_steps(K, sc.save_per_decade)
    ts = jnp.asarray(ks * dt, jnp.float64)
    base = jax.random.key(sc.seed)
    keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(sc.seeds))
    f64 = jnp.float64
    one = lambda k: _solve(terms, y0, k, jnp.asarray(K * dt, f64), jnp.asarray(dt, f64), ts, K, progress)
    # seeds vmapped in groups of 32 (the per-sequence gradients of every path at once would be R·N·|θ|)
    Y = np.asarray(jax.lax.map(one, keys, batch_size=min(sc.seeds, 32)))  # (R, T, P)
    flat = Y.reshape(-1, Y.shape[-1])
    P = jax.vmap(unravel)(jnp.asarray(flat))
    losses = np.asarray(jax.lax.map(loss, P)).reshape(sc.seeds, len(ks))
    P = jax.tree.map(lambda x: np.asarray(x).reshape((sc.seeds, len(ks)) + x.shape[1:]), P)
    return SGDRun(ts=np.asarray(ts), steps=ks, w=P.w, C=P.C, a=P.a, loss=losses, config=cfg, sgd=sc,
                  wall=time.perf_counter() - t_wall, x=dict(P.x))  # fmt: skip
