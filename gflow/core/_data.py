"""The data model: a mixture of n-gram Markov chains (docs/theory/mathematics.md §M1).

A sequence is drawn by first drawing a transition kernel ``π`` from the prior
(independent ``Dirichlet(α·1_d)`` rows, one per parent configuration, or a
fixed kernel given by the user) and then running the chain.

Conventions used throughout gflow:

- tokens are integers in ``[d] = {0, …, d-1}``;
- the parent configuration ``z = (x_{l-p_1}, …, x_{l-p_k})`` is encoded as the
  mixed-radix integer ``z_1 d^{k-1} + … + z_k`` (first parent most
  significant), so a kernel is an array ``pi[z, e] = π(e | z)`` of shape
  ``(d**k, d)``;
- the *window chain* has state ``(x_{l-m+1}, …, x_l)`` with ``m = p_k``,
  encoded the same way (oldest token most significant), ``d**m`` states.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._util import rng_normal, rng_uniform
from ._kinds import KINDS, kind_of
from ._priors import PRIORS, prior_of
from ._stationary import stationary_distribution

_STARTS = ("stationary", "uniform")


def _as_graph(g):
    if isinstance(g, str):
        return g
    try:
        # one parent per position: integers; k parents: a list per position ([] for a root)
        return tuple(int(x) if np.ndim(x) == 0 else tuple(int(v) for v in x) for x in g)
    except (TypeError, ValueError):
        return g


def _as_parents(p) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in p)
    except TypeError:
        return (int(p),)


class DataConfig(eqx.Module):
    """The n-gram Markov mixture of docs/theory/mathematics.md §M1.

    **Arguments:**

    - `d`: vocabulary size, at least 2.
    - `parents`: the parent offsets ``p_1 < … < p_k``, positive and strictly
      increasing (``(1, 2)``, a 3-gram, by default).
    - `alpha`: Dirichlet concentration of the prior, ``> 0``.
    - `L`: context length; at least the largest parent offset.
    - `start`: ``"stationary"`` (the first ``p_k`` tokens from the stationary
      law of the window chain, computed exactly per ``π``) or ``"uniform"``
      (i.i.d. uniform, as in the reference simulations).
    - `burn_in`: number of chain steps run (and discarded) after the start and
      before ``x_1``; ``>= 0``.
    - `kernel`: optional fixed kernel (extension: a point-mass prior), shape
      ``(d**k, d)`` or ``(d,)*k + (d,)``, rows non-negative summing to one.
      When given, ``alpha`` and ``prior`` are unused.
    - `kind`: the data family's member (:mod:`gflow.core._kinds`): ``"ngram"`` (this mixture, the
      default) or ``"graph"`` (extension, Nichani et al.'s in-context causal graph: positions
      ``1..L−1`` follow the graph ``data.graph``, the query ``x_L`` is uniform and the target is
      ``x_{L+1} ~ π(·|x_L)``; ``data.parents = [1]``) or ``"triggers"`` (extension, Bietti et al.'s
      triggers: a fixed global bigram, and ``data.triggers`` tokens per sequence always followed by
      their own output; ``data.parents = [1]``).
    - `graph`: (graph) ``"chain"``, ``"icl"``, ``"random"`` or an explicit list of ``L − 1``
      parent positions (entry ``i − 1`` is ``p(i) < i``, 0 for a root); with ``graph_parents = k
      >= 2``: ``"chain"``, ``"heap"`` (``k = 2``), ``"random"`` or a list of ``L + 1`` parent
      lists (entry ``i − 1`` position i's k parents, ``[]`` for a root; the last the target's).
    - `graph_seed`: (graph) the seed of ``graph = "random"``.
    - `graph_parents`: (graph) the parents of every non-root position, ``k >= 1`` (1, the
      default: their Task 2.4 with its uniform query; ``k >= 2``: their k-parent DAGs, no query,
      roots uniform, ``parents`` the target's parent offsets).
    - `triggers`: (triggers) the number K of trigger tokens per sequence, ``1 <= K <= d // 2``
      (0, the default, unset: the triggers kind needs it).
    - `trigger_mode`: (triggers) ``"fixed"`` (the K most probable tokens under the global bigram's
      stationary law, the same in every sequence) or ``"random"`` (drawn per sequence from that law,
      without replacement).
    - `bigram_seed`: (triggers) the seed of the global bigram π_b (rows ``Dirichlet(α·1_d)``).
    - `prior`: the kernels' prior (:mod:`gflow.core._priors`): ``"dirichlet"`` (the paper's,
      independent ``Dirichlet(α·1_d)`` rows), ``"doubly_stochastic"`` (extension, Edelman et al.:
      Dirichlet rows balanced by Sinkhorn's iteration, uniform stationary law; one parent only) or
      ``"unigram"`` (extension, Edelman et al.: one ``Dirichlet(α·1_d)`` row shared by every
      parent configuration, i.i.d. tokens).
    """

    d: int = eqx.field(static=True, default=3)
    parents: tuple[int, ...] = eqx.field(static=True, default=(1, 2), converter=_as_parents)
    alpha: float = 0.1
    L: int = eqx.field(static=True, default=100)
    start: Literal["stationary", "uniform"] = eqx.field(static=True, default="stationary")
    burn_in: int = eqx.field(static=True, default=0)
    kernel: Float[np.ndarray, "K d"] | None = eqx.field(
        static=True, default=None, converter=lambda k: None if k is None else _HashableArray(k)
    )
    kind: Literal["ngram", "graph", "triggers"] = eqx.field(static=True, default="ngram")
    prior: Literal["dirichlet", "doubly_stochastic", "unigram"] = eqx.field(static=True, default="dirichlet")
    graph: str | tuple[int, ...] = eqx.field(static=True, default="chain", converter=_as_graph)
    graph_seed: int = eqx.field(static=True, default=0)
    graph_parents: int = eqx.field(static=True, default=1)
    triggers: int = eqx.field(static=True, default=0)
    trigger_mode: Literal["fixed", "random"] = eqx.field(static=True, default="fixed")
    bigram_seed: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        if not isinstance(self.d, (int, np.integer)) or self.d < 2:
            raise ValueError(f"data.d must be an integer >= 2, got {self.d!r}")
        p = self.parents
        if len(p) == 0:
            raise ValueError("data.parents must be a non-empty list of positive offsets, got ()")
        if any(x <= 0 for x in p):
            raise ValueError(f"data.parents must be positive offsets, got {p}")
        if any(b <= a for a, b in zip(p, p[1:])):
            raise ValueError(f"data.parents must be strictly increasing (sorted, no duplicates), got {p}")
        if not (np.isfinite(float(self.alpha)) and float(self.alpha) > 0):
            raise ValueError(f"data.alpha must be a finite number > 0, got {self.alpha!r}")
        if not isinstance(self.L, (int, np.integer)) or self.L < max(p):
            raise ValueError(f"data.L must be an integer >= the largest parent offset {max(p)}, got {self.L!r}")
        if self.start not in _STARTS:
            raise ValueError(f"data.start must be one of {_STARTS}, got {self.start!r}")
        if not isinstance(self.burn_in, (int, np.integer)) or self.burn_in < 0:
            raise ValueError(f"data.burn_in must be an integer >= 0, got {self.burn_in!r}")
        if self.kind not in KINDS:
            raise ValueError(f"data.kind must be one of {tuple(KINDS)}, got {self.kind!r}")
        kind_of(self).check_options(self)
        kind_of(self).check(self)
        if self.prior not in PRIORS:
            raise ValueError(f"data.prior must be one of {tuple(PRIORS)}, got {self.prior!r}")
        why = None if self.kernel is not None else prior_of(self).refusal(p, self.alpha)
        if why is not None:
            raise ValueError(why)
        if self.kernel is not None:
            k = self.kernel.array
            K = self.d ** len(p)
            if k.size != K * self.d:
                raise ValueError(
                    f"data.kernel must have shape ({K}, {self.d}) (d**k rows, d columns), got {k.shape}"
                )
            k = k.reshape(K, self.d)
            if not np.all(np.isfinite(k)) or np.any(k < 0) or not np.allclose(k.sum(-1), 1.0, atol=1e-10):
                raise ValueError("data.kernel must have non-negative finite rows that sum to 1")

    @property
    def k(self) -> int:
        """Number of parents."""
        return len(self.parents)

    @property
    def m(self) -> int:
        """Length of the window chain's state, ``p_k``."""
        return self.parents[-1]

    @property
    def n_configs(self) -> int:
        """Number of parent configurations, ``d**k``."""
        return self.d**self.k

    def fixed_kernel(self) -> Float[Array, "K d"] | None:
        """The fixed kernel as a ``(d**k, d)`` array, or ``None``."""
        if self.kernel is None:
            return None
        return jnp.asarray(self.kernel.array.reshape(self.n_configs, self.d))


class _HashableArray:
    """A read-only numpy array wrapper that can live in a static field."""

    def __init__(self, a):
        if isinstance(a, _HashableArray):
            a = a.array
        self.array = np.array(a, dtype=np.float64)
        self.array.flags.writeable = False

    def __hash__(self):
        return hash((self.array.shape, self.array.tobytes()))

    def __eq__(self, other):
        return isinstance(other, _HashableArray) and np.array_equal(self.array, other.array)

    def __repr__(self):
        return f"kernel{self.array.tolist()}"


# ---------------------------------------------------------------------------
# Exact per-π quantities
# ---------------------------------------------------------------------------


def all_windows(d: int, W: int) -> np.ndarray:
    """All ``d**W`` windows as an int array ``(d**W, W)``, in mixed-radix order
    (the first column most significant)."""
    return np.array(list(itertools.product(range(d), repeat=W)), dtype=np.int32).reshape(d**W, W)


def encode(tokens, d: int):
    """Mixed-radix code of the last axis of ``tokens`` (first entry most significant)."""
    W = tokens.shape[-1]
    weights = d ** np.arange(W - 1, -1, -1)
    return (tokens * weights).sum(-1)


def window_transition(pi: Float[Array, "K d"], cfg: DataConfig) -> Float[Array, "S S"]:
    """Transition matrix of the window chain (state ``(x_{l-m+1}, …, x_l)``).

    ``T[s, s']`` is ``π(e | z(s))`` when ``s'`` is ``s`` shifted by one with
    new token ``e``, and zero otherwise.
    """
    d, m = cfg.d, cfg.m
    win = all_windows(d, m)  # (S, m)
    # x_{l+1-p} sits at column m - p of the current window.
    z = encode(win[:, [m - p for p in cfg.parents]], d)  # (S,)
    # code of the next window for each (state, new token)
    tail = encode(win[:, 1:], d) if m > 1 else np.zeros(len(win), dtype=np.int64)
    nxt = tail[:, None] * d + np.arange(d)[None, :]  # (S, d)
    S = d**m
    T = jnp.zeros((S, S), dtype=pi.dtype)
    T = T.at[np.arange(S)[:, None], nxt].add(pi[z, :])
    return T


def stationary_window(pi: Float[Array, "K d"], cfg: DataConfig) -> Float[Array, " S"]:
    """Exact stationary law of the window chain, over ``d**p_k`` states."""
    return stationary_distribution(window_transition(pi, cfg))


def window_law(pi: Float[Array, "K d"], cfg: DataConfig, W: int) -> Float[Array, " dW"]:
    """Exact stationary law of ``W`` consecutive tokens ``(x_{l-W+1}, …, x_l)``.

    Returned flat over ``d**W`` windows in :func:`all_windows` order. For
    ``W >= p_k`` it is ``μ_m(first m tokens) Π_t π(x_t | parents)``; for
    ``W < p_k`` the marginal of the last ``W`` tokens of the window chain.
    """
    d, m = cfg.d, cfg.m
    mu_m = stationary_window(pi, cfg)
    if W <= m:
        return mu_m.reshape((d ** (m - W), d**W)).sum(0)
    win = all_windows(d, W)
    p = mu_m[encode(win[:, :m], d)]
    for t in range(m, W):
        z = encode(win[:, [t - q for q in cfg.parents]], d)
        p = p * pi[z, win[:, t]]
    return p


# ---------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------


class Sample(eqx.Module):
    """``N`` sequences drawn from the mixture.

    - `X`: the inputs ``x_1..x_L``, ``(N, L)`` int32.
    - `y`: the targets ``x_{L+1}``, ``(N,)``.
    - `zq`: the query's parent configuration code, ``(N,)``.
    - `cond`: the exact conditional ``π(· | z_q)``, ``(N, d)``.
    - `pi`: each sequence's kernel, ``(N, d**k, d)``.
    """

    X: Int[Array, "N L"]
    y: Int[Array, " N"]
    zq: Int[Array, " N"]
    cond: Float[Array, "N d"]
    pi: Float[Array, "N K d"]


def sample_kernels(cfg: DataConfig, N: int, *, key: PRNGKeyArray, dtype=jnp.float64) -> Float[Array, "N K d"]:
    """``N`` kernels from the prior ``data.prior`` (:mod:`gflow.core._priors`: i.i.d.
    ``Dirichlet(α·1_d)`` rows by default), or the fixed kernel."""
    fixed = cfg.fixed_kernel()
    if fixed is not None:
        return jnp.broadcast_to(fixed.astype(dtype), (N, cfg.n_configs, cfg.d))
    # jax.random.dirichlet normalises Gamma draws in log space: with α = 0.1 a
    # Gamma draw underflows in float32 with non-negligible probability.
    dirichlet = lambda shape: jax.random.dirichlet(key, jnp.full(shape, cfg.alpha, dtype), dtype=dtype)
    return prior_of(cfg).kernels(dirichlet, (N, cfg.n_configs, cfg.d))


def sample(cfg: DataConfig, N: int, *, key: PRNGKeyArray, dtype=jnp.float64, steps: int | None = None) -> Sample:
    """Draw ``N`` independent ``(π, X, y, z_q, π(·|z_q))`` (docs/theory/mathematics.md §M1).

    Vectorised over sequences; a single ``lax.scan`` over positions. The
    first ``p_k`` tokens come from the window chain's exact stationary law
    (``start="stationary"``) or are i.i.d. uniform (``"uniform"``); then
    ``burn_in`` steps are run and discarded before ``x_1``.
    Deterministic in ``key``.

    `steps`: run the chain for that many steps (at least :func:`chain_steps`, the
    ``burn_in + L + 1 − p_k`` the sample uses) and keep the sample's part: the same
    sample bit for bit, as every step's key is the same whatever the length (JAX's
    partitionable Threefry splits are prefix-stable). So one compiled chain (and one
    draw, :func:`draw_chain` and :func:`sample_from_chain`) serves every ``L`` and
    ``burn_in`` up to it.
    """
    if int(N) < 1:
        raise ValueError(f"estimator.N must be a positive integer, got {N!r}")
    need = chain_steps(cfg)
    if steps is not None and int(steps) < need:
        raise ValueError(f"steps must be at least burn_in + L + 1 - p_k = {need}, got {steps!r}")
    drawn = kind_of(cfg).draw(cfg, int(N), key, dtype)  # the data family's other members' own samplers
    if drawn is not None:
        return Sample(*drawn)
    T = need if steps is None or not chain_prefix_stable() else int(steps)  # the same sample either way
    return sample_from_chain(draw_chain(cfg, int(N), key=key, dtype=dtype, steps=T), cfg)


def chain_prefix_stable() -> bool:
    """Whether a longer chain holds the shorter one as its prefix: JAX's partitionable Threefry
    (``jax_threefry_partitionable``, the default), whose ``split(key, n)[i]`` does not depend on n."""
    return bool(jax.config.jax_threefry_partitionable)


def chain_steps(cfg: DataConfig) -> int:
    """The chain steps a sample of `cfg` uses after its first ``p_k`` tokens: ``burn_in + L + 1 − p_k``."""
    return cfg.burn_in + cfg.L + 1 - cfg.m


def chain_key(cfg: DataConfig) -> DataConfig:
    """`cfg` without what only selects a part of the chain (``L``, ``burn_in``): configurations with one
    chain key and one seed share their chain (:func:`draw_chain`)."""
    return DataConfig(d=cfg.d, parents=cfg.parents, alpha=cfg.alpha, L=cfg.m, start=cfg.start, burn_in=0,
                      kernel=None if cfg.kernel is None else cfg.kernel.array, prior=cfg.prior)  # fmt: skip


class Chain(eqx.Module):
    """``N`` runs of the chain (:func:`draw_chain`): `pi` each run's kernel ``(N, d**k, d)`` and
    `tokens` its first ``p_k`` tokens and then ``steps`` more, ``(N, p_k + steps)``."""

    pi: Float[Array, "N K d"]
    tokens: Int[Array, "N T"]


def draw_chain(cfg: DataConfig, N: int, *, key: PRNGKeyArray, dtype=jnp.float64, steps: int) -> Chain:
    """The kernels, the start and `steps` steps of the chain of :func:`sample`: two compiled programs,
    the kernels' (once per ``d``, parents, ``α``, kernel, ``N`` and dtype) and the walk's (once per
    ``d``, parents, start law, ``N``, dtype and `steps`); ``L`` and ``burn_in`` enter neither, ``α``
    only the first (a traced ``α`` would change the kernels in their last bits: XLA folds the
    constant)."""
    ck = chain_key(cfg)
    walk = DataConfig(d=ck.d, parents=ck.parents, L=ck.m, start=ck.start)  # the walk reads only these
    return _walk(walk, _kernels(ck, int(N), key, dtype), key, int(steps))


def sample_from_chain(chain: Chain, cfg: DataConfig) -> Sample:
    """The sample of `cfg` in a chain drawn for at least :func:`chain_steps` steps: tokens
    ``burn_in … burn_in + L`` of each run (integer slices and a gather, exact; on the host,
    nothing to compile, unless the chain is traced)."""
    d, L, b = cfg.d, cfg.L, cfg.burn_in
    xp = jnp if isinstance(chain.tokens, jax.core.Tracer) else np
    tokens = chain.tokens if xp is jnp else np.asarray(chain.tokens)
    pi = chain.pi if xp is jnp else np.asarray(chain.pi)
    full = tokens[:, b : b + L + 1]  # (N, L+1)
    zw = xp.asarray(d ** np.arange(cfg.k - 1, -1, -1), np.int32)
    X, y = full[:, :L], full[:, L]
    zq = (full[:, [L - p for p in cfg.parents]] * zw).sum(-1)  # int64 with x64, as jnp's sum
    cond = pi[xp.arange(full.shape[0]), zq]
    if xp is np:
        X, y, zq, cond = (jnp.asarray(np.ascontiguousarray(v)) for v in (X, y, zq, cond))
    return Sample(X=X, y=y, zq=zq, cond=cond, pi=chain.pi)


@eqx.filter_jit
def _kernels(cfg: DataConfig, N: int, key, dtype):
    return sample_kernels(cfg, N, key=jax.random.split(key, 3)[0], dtype=dtype)


@eqx.filter_jit
def _walk(cfg: DataConfig, pi, key, n_steps: int):
    N = pi.shape[0]
    d, m, k = cfg.d, cfg.m, cfg.k
    _, kstart, kchain = jax.random.split(key, 3)
    if cfg.start == "stationary":
        mu = jax.vmap(lambda p: stationary_window(p, cfg))(pi)  # (N, d**m)
        code = jax.random.categorical(kstart, jnp.log(mu), axis=-1)
        win0 = (code[:, None] // (d ** np.arange(m - 1, -1, -1))[None, :]) % d
    else:
        win0 = jax.random.randint(kstart, (N, m), 0, d)
    win0 = win0.astype(jnp.int32)
    logpi = jnp.log(pi)
    zw = jnp.asarray(d ** np.arange(k - 1, -1, -1), jnp.int32)
    cols = np.array([m - p for p in cfg.parents])
    rows = jnp.arange(N)

    def step(win, key_t):
        z = (win[:, cols] * zw).sum(-1)
        x = jax.random.categorical(key_t, logpi[rows, z], axis=-1).astype(jnp.int32)
        win = jnp.concatenate([win[:, 1:], x[:, None]], axis=1)
        return win, x

    _, xs = jax.lax.scan(step, win0, jax.random.split(kchain, n_steps))
    return Chain(pi=pi, tokens=jnp.concatenate([win0, xs.T], axis=1))


# ---------------------------------------------------------------------------
# A faster sampler of the same law (online SGD's fresh sequences)
# ---------------------------------------------------------------------------


def _compact(key, n: int, propose, dtype):
    """The first ``n`` accepted of i.i.d. proposals: ``propose(key) -> (values, ok)`` draws a
    pool; the outputs are its accepted values in order, and further pools are drawn (a
    ``while_loop``, rarely entered) until all ``n`` slots are filled. The accepted proposals
    of an i.i.d. sequence are i.i.d. with the target law, and which of them come first
    does not depend on their values, so the ``n`` outputs are exactly i.i.d. draws."""

    def fill(i, val, count):
        v, ok = propose(jax.random.fold_in(key, i))
        pos = jnp.where(ok, count + jnp.cumsum(ok) - 1, n)  # slot of each accepted proposal; n: dropped
        return i + 1, val.at[pos].set(v, mode="drop"), count + jnp.sum(ok)

    state = fill(0, jnp.zeros(n, dtype), jnp.asarray(0))
    return jax.lax.while_loop(lambda s: s[2] < n, lambda s: fill(*s), state)[1]


def _log_gamma_small(key, alpha: float, n: int, dtype):
    """``log G`` of ``n`` i.i.d. ``Gamma(alpha, 1)`` draws for ``0 < alpha < 1``, exactly:
    Ahrens & Dieter's rejection algorithm GS (Devroye 1986, §IX.6): with ``b = 1 + alpha/e``
    and ``p = b·U₁``, propose ``x = p^{1/alpha}`` (``p ≤ 1``; accept if ``E ≥ x``) or
    ``x = −log((b − p)/alpha)`` (``p > 1``; accept if ``E ≥ (1 − alpha) log x``), ``E`` a
    standard exponential. Two uniforms a proposal, no normal; acceptance 0.92 at
    ``alpha = 0.1``, so a pool of ``⌈1.12 n⌉ + 64`` proposals (:func:`_compact`).
    Computed in log space (``log x = log(p)/alpha``): ``alpha = 0.1`` never underflows."""
    b = 1.0 + alpha / math.e
    P = int(np.ceil(1.12 * n)) + 64

    def propose(k):
        # (0, 1]: finite logs. jax.random, not _rng: XLA would fuse _rng's hash into both
        # consumers of u and compute it twice (measured slower); JAX's rolled loop stores u.
        u = 1.0 - jax.random.uniform(k, (2, P), dtype)
        p, E = b * u[0], -jnp.log(u[1])
        small = p <= 1.0
        logx = jnp.where(small, jnp.log(p) / alpha, jnp.log(-jnp.log(jnp.where(small, 0.5, b - p) / alpha)))
        ok = jnp.where(small, E >= jnp.exp(logx), E >= (1.0 - alpha) * logx)
        return logx, ok

    return _compact(key, n, propose, dtype)


def _log_gamma_mt(key, alpha, n: int, dtype):
    """``log G`` of ``n`` i.i.d. ``Gamma(alpha, 1)`` draws, exactly, for any ``alpha > 0``
    (traced or not): Marsaglia & Tsang (2000) for the shape ``a = alpha`` (``alpha ≥ 1``)
    or ``a = alpha + 1`` boosted by ``U^{1/alpha}`` in log space (``alpha < 1``); acceptance
    ≥ 0.95 for ``a ≥ 1``, a pool of ``⌈1.06 n⌉ + 64`` proposals (:func:`_compact`)."""
    alpha = jnp.asarray(alpha, dtype)
    a = jnp.where(alpha < 1, alpha + 1, alpha)
    dd = a - 1.0 / 3.0
    c = 1.0 / jnp.sqrt(9.0 * dd)
    P = int(np.ceil(1.06 * n)) + 64

    def propose(k):
        kx, ku = jax.random.split(k)
        x = rng_normal(kx, (P,), dtype)
        u = rng_uniform(ku, (P,), dtype)
        v = 1.0 + c * x
        v3 = v * v * v
        lv3 = jnp.log(jnp.where(v > 0, v3, 1.0))
        ok = (v > 0) & (jnp.log(u) < 0.5 * x * x + dd - dd * v3 + dd * lv3)
        return jnp.log(dd) + lv3, ok

    kloop, kboost = jax.random.split(key)
    val = _compact(kloop, n, propose, dtype)
    boost = jnp.log1p(-rng_uniform(kboost, (n,), dtype)) / alpha  # U ∈ (0, 1]
    return val + jnp.where(alpha < 1, boost, 0.0)


def _log_gamma(key, alpha, n: int, dtype):
    """``log G`` of ``n`` i.i.d. ``Gamma(alpha, 1)`` draws (exact rejection samplers; the same
    law as ``jax.random.gamma``, a different random stream, several times cheaper on CPU,
    where ``jax.random.gamma`` runs a vmapped ``while_loop`` per element)."""
    try:
        a = float(alpha)
    except (TypeError, jax.errors.ConcretizationTypeError):  # traced: the general sampler
        return _log_gamma_mt(key, alpha, n, dtype)
    return _log_gamma_small(key, a, n, dtype) if a < 1 else _log_gamma_mt(key, a, n, dtype)


def _dirichlet_fast(cfg: DataConfig, N: int, key, dtype):
    fixed = cfg.fixed_kernel()
    if fixed is not None:
        return jnp.broadcast_to(fixed.astype(dtype), (N, cfg.n_configs, cfg.d))

    def dirichlet(shape):  # normalised Gamma draws, in log space
        return jax.nn.softmax(_log_gamma(key, cfg.alpha, int(np.prod(shape)), dtype).reshape(shape), axis=-1)

    return prior_of(cfg).kernels(dirichlet, (N, cfg.n_configs, cfg.d))


def sample_fast(cfg: DataConfig, N: int, key, dtype=jnp.float64) -> Sample:
    """``N`` independent sequences of the same law as :func:`sample` (docs/theory/mathematics.md §M1), drawn
    by cheaper exact algorithms, from a different random stream (so not the same
    sequences as :func:`sample` for the same key). Used for online SGD's fresh batches,
    where sampling dominates the step; the fixed samples of the flow stay
    :func:`sample`'s. Traceable (call it inside ``jit``/``vmap``); deterministic in ``key``.

    - kernels: Dirichlet rows as normalised Gamma draws (:func:`_log_gamma_mt`, exact
      rejection sampling) instead of ``jax.random.dirichlet``;
    - the chain: one float64 uniform ``u`` per position and sequence, all drawn at once,
      and the next token by inversion, ``x = #{e < d−1 : u ≥ F(e | z)}`` with ``F`` the
      cumulative kernel (``P(x = e) = π(e|z)`` up to float64 rounding, as the Gumbel
      trick of ``jax.random.categorical``); a ``lax.scan`` over positions that only
      gathers and compares;
    - the start: as :func:`sample` (``"uniform"``: i.i.d. uniform tokens;
      ``"stationary"``: the window chain's exact stationary law per π), then ``burn_in``.
    """
    tokens, zq, cond, pi = sample_fast_time_major(cfg, N, key, dtype)
    X = tokens[: cfg.L].T  # (N, L)
    return Sample(X=X, y=tokens[cfg.L], zq=zq, cond=cond, pi=pi)


def sample_fast_time_major(cfg: DataConfig, N: int, key, dtype=jnp.float64):
    """:func:`sample_fast`'s draw (the same key gives the same sequences) in the layout its
    sampler produces: ``(tokens, zq, cond, pi)`` with ``tokens`` ``(L+1, N)`` holding
    ``x_1..x_{L+1}`` position-major (no transpose; online SGD counts windows from it). The data
    family's other kinds (:mod:`gflow.core._kinds`) draw with their own sampler."""
    drawn = kind_of(cfg).draw(cfg, int(N), key, dtype)
    if drawn is not None:
        X, y, zq, cond, pi = drawn
        return jnp.concatenate([X.T, y[None].astype(X.dtype)]), zq, cond, pi
    d, m, k = cfg.d, cfg.m, cfg.k
    kpi, kstart, kchain = jax.random.split(key, 3)
    pi = _dirichlet_fast(cfg, N, kpi, dtype)
    if cfg.start == "stationary":
        mu = jax.vmap(lambda p: stationary_window(p, cfg))(pi)
        cmu = jnp.cumsum(mu, -1)[:, :-1]
        u0 = rng_uniform(kstart, (N, 1), dtype)
        code = jnp.sum(u0 >= cmu, -1)
        win0 = (code[:, None] // (d ** np.arange(m - 1, -1, -1))[None, :]) % d
    else:
        win0 = jax.random.randint(kstart, (N, m), 0, d)
    win0 = win0.astype(jnp.int32)
    n_steps = cfg.burn_in + cfg.L + 1 - m
    F = jnp.cumsum(pi, -1)[..., :-1].reshape(N * d**k, d - 1)  # (N·K, d-1)
    zw = jnp.asarray(d ** np.arange(k - 1, -1, -1), jnp.int32)
    U = rng_uniform(kchain, (n_steps, N), dtype)
    base = jnp.arange(N, dtype=jnp.int32) * d**k
    w0 = (win0 * jnp.asarray(d ** np.arange(m - 1, -1, -1), jnp.int32)).sum(-1)  # window code

    def step(w, u):
        # parent p is the window's digit of weight d^(p-1)
        z = sum(((w // d ** (p - 1)) % d) * d ** (k - 1 - j) for j, p in enumerate(cfg.parents))
        x = jnp.sum(u[:, None] >= F[base + z], -1).astype(jnp.int32)
        # one parent: the window is the token itself, kept in the window code's integer type
        return (w % d ** (m - 1)) * d + x if m > 1 else x.astype(w.dtype), x

    _, xs = jax.lax.scan(step, w0, U)  # (n_steps, N); one iteration a position (unrolling was slower)
    tokens = jnp.concatenate([win0.T, xs], axis=0)[cfg.burn_in :]  # (L+1, N)
    zq = sum(tokens[cfg.L - p] * zw[j] for j, p in enumerate(cfg.parents))
    return tokens, zq, pi[jnp.arange(N), zq], pi
