"""Shared test utilities: tree comparison, and small problems with answers
computed independently of gflow's implementation (exact enumeration, the
window chain built with loops, the model with its features φ materialised).

Conventions shared with gflow because they are part of its documented
interface (gflow/data.py): tokens are ``0..d-1``; a window or a parent
configuration ``(t_1, …, t_W)`` is coded as ``Σ_j t_j d^(W-j)`` (first entry
most significant); a kernel is ``pi[z, e] = π(e | z)``.
"""

from __future__ import annotations

import functools
import itertools
from statistics import NormalDist

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import gflow
from gflow.core import _paper as gmodel

# ---------------------------------------------------------------------------
# Generic
# ---------------------------------------------------------------------------


def tree_allclose(x, y, *, rtol=1e-5, atol=1e-8) -> bool:
    """Same structure and every leaf close (as ``np.allclose``)."""
    return bool(eqx.tree_equal(x, y, typematch=True, rtol=rtol, atol=atol))


def tree_leaves_np(t) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(t)]


def chi2_stat(counts, probs) -> float:
    """Pearson's χ² of observed ``counts`` against cell probabilities ``probs``."""
    counts = np.asarray(counts, float)
    probs = np.asarray(probs, float)
    n = counts.sum()
    return float(np.sum((counts - n * probs) ** 2 / (n * probs)))


def chi2_quantile(q: float, dof: int) -> float:
    """The ``q`` quantile of χ²(dof) by the Wilson–Hilferty cube-root normal
    approximation (relative error below 1% in the upper tail for dof >= 3;
    in the far lower tail it errs low, which only widens a two-sided band).
    Keeps scipy out of the test dependencies."""
    z = NormalDist().inv_cdf(q)
    h = 2.0 / (9.0 * dof)
    return float(dof * max(1.0 - h + z * np.sqrt(h), 0.0) ** 3)


def chi2_critical(dof: int, p: float = 1e-4) -> float:
    """Upper ``p`` quantile of χ²(dof)."""
    return chi2_quantile(1.0 - p, dof)


# ---------------------------------------------------------------------------
# Markov chains, built with loops from the definition (docs/theory/mathematics.md §M1)
# ---------------------------------------------------------------------------


def code(tokens, d: int):
    """Mixed-radix code of the last axis (first entry most significant)."""
    tokens = np.asarray(tokens)
    W = tokens.shape[-1]
    out = np.zeros(tokens.shape[:-1], dtype=np.int64)
    for j in range(W):
        out = out * d + tokens[..., j]
    return out


def all_sequences(d: int, n: int) -> np.ndarray:
    """Every sequence in ``[d]^n``, ``(d**n, n)``, row ``r`` having code ``r``."""
    r = np.arange(d**n)
    return np.stack([(r // d ** (n - 1 - j)) % d for j in range(n)], axis=1)


def random_kernel(rng: np.random.Generator, d: int, k: int, alpha: float = 1.0, floor: float = 0.0):
    """A ``(d**k, d)`` kernel with Dirichlet(alpha) rows, optionally mixed
    with the uniform row (``floor`` = weight of the uniform)."""
    p = rng.dirichlet(np.full(d, alpha), size=d**k)
    return (1 - floor) * p + floor / d


def window_transition_loops(pi, d: int, parents) -> np.ndarray:
    """Transition matrix of the window chain, state ``(x_{l-m+1}, …, x_l)``,
    ``m = max(parents)``, by looping over states and next tokens."""
    pi = np.asarray(pi, float)
    m = max(parents)
    T = np.zeros((d**m, d**m))
    for state in itertools.product(range(d), repeat=m):
        # the new token is x_{l+1}; its parent x_{l+1-p} is state[m - p]
        z = code([state[m - p] for p in parents], d)
        for e in range(d):
            T[code(state, d), code(state[1:] + (e,), d)] += pi[z, e]
    return T


def sequence_probs(pi, d: int, parents, n: int, start_law) -> np.ndarray:
    """Probability of every sequence ``x_1..x_n`` (rows of ``all_sequences``)
    when ``(x_1..x_m)`` has law ``start_law`` (over ``d**m`` windows) and then
    ``x_t ~ π(· | x_{t-p_1}, …, x_{t-p_k})``."""
    pi = np.asarray(pi, float)
    m = max(parents)
    seqs = all_sequences(d, n)
    p = np.asarray(start_law, float)[code(seqs[:, :m], d)]
    for t in range(m, n):  # 0-based column t is x_{t+1}
        z = code(np.stack([seqs[:, t - q] for q in parents], axis=1), d)
        p = p * pi[z, seqs[:, t]]
    return p


def parents_code(X, parents, d: int, pos: int):
    """Code of ``(x_{pos-p_1}, …, x_{pos-p_k})`` for 1-based position ``pos``
    of each row of ``X`` (``X[:, j]`` is ``x_{j+1}``)."""
    X = np.asarray(X)
    return code(np.stack([X[:, pos - 1 - p] for p in parents], axis=1), d)


# ---------------------------------------------------------------------------
# The model with φ materialised (docs/theory/mathematics.md §M2 verbatim; numpy, float64)
# ---------------------------------------------------------------------------


def subsets_by_definition(H: int, D: int):
    """𝒮 = {S ⊆ {1..H} : |S| <= D}, by size then lexicographically."""
    all_sets = [S for r in range(H + 1) for S in itertools.combinations(range(1, H + 1), r)]
    return sorted([S for S in all_sets if len(S) <= D], key=lambda S: (len(S), S))


def naive_forward(w, C, a, X, d: int, D: int, norm: str):
    """``(κ_1..κ_L, ŷ)`` for one sequence, materialising v_l^(h) and the
    tensor-product features φ_l."""
    w = np.asarray(w, float)
    C = np.asarray(C, float)
    a = float(a)
    X = np.asarray(X)
    H, M = w.shape
    L = len(X)
    s = np.exp(w - w.max(-1, keepdims=True))
    s = s / s.sum(-1, keepdims=True)

    def onehot(j):  # e(x_j), zero padding for j <= 0
        v = np.zeros(d)
        if j >= 1:
            v[X[j - 1]] = 1.0
        return v

    def v(l, h):
        return sum(s[h - 1, i - 1] * onehot(l - i) for i in range(1, M + 1))

    def phi(l):
        parts = []
        for S, CS in zip(subsets_by_definition(H, D), C):
            t = np.ones(1)
            for h in S:
                t = np.kron(t, v(l, h))
            parts.append(abs(CS) * t)  # √c_S = |C_S|
        return np.concatenate(parts)

    q = L + 1
    phq = phi(q)
    kap = np.zeros(L)
    for l in range(1, L + 1):
        phl = phi(l)
        Z = np.sum(C**2) if norm == "sum" else np.linalg.norm(phq) * np.linalg.norm(phl)
        # a zero feature vector (every selected head reads only padding)
        # matches nothing: κ = 0 rather than 0/0
        kap[l - 1] = 0.0 if Z == 0 else phq @ phl / Z
    z = a * kap
    att = np.exp(z - z.max())
    att = att / att.sum()
    yhat = np.zeros(d)
    for l in range(L):
        yhat[X[l]] += att[l]
    return kap, yhat


def gih_counts(X, S, d: int, q: int | None = None):
    """Direct counts for the generalized induction head on offsets ``S``:
    ``match[l-1] = 1{x_{l-h} = x_{q-h} for all h in S, all existing}``,
    ``N1[e] = #{l : match, x_l = e}``, ``N0[e] = #{l : not match, x_l = e}``."""
    X = np.asarray(X)
    L = len(X)
    q = L + 1 if q is None else q

    def x(j):
        return X[j - 1] if j >= 1 else None

    match = np.array(
        [all(x(l - h) is not None and x(l - h) == x(q - h) for h in S) for l in range(1, L + 1)], float
    )
    N1 = np.array([np.sum(match * (X == e)) for e in range(d)])
    N0 = np.array([np.sum((1 - match) * (X == e)) for e in range(d)])
    return match, N1, N0


def random_params(key, model: gflow.ModelConfig, *, a: float = 2.0, w_scale: float = 1.0) -> gflow.Params:
    """A generic θ: ``w ~ N(0, w_scale²)``, ``C ~ ±U(0.5, 1.5)``, given ``a``."""
    kw, kc, ks = jax.random.split(key, 3)
    nS = len(model.subsets)
    w = w_scale * jax.random.normal(kw, (model.H, model.M), jnp.float64)
    C = jax.random.uniform(kc, (nS,), jnp.float64, 0.5, 1.5)
    C = C * jnp.where(jax.random.bernoulli(ks, 0.5, (nS,)), 1.0, -1.0)
    return gflow.Params(w=w, C=C, a=jnp.asarray(a, jnp.float64))


# ---------------------------------------------------------------------------
# The exact population loss by enumeration (d^(L+1) sequences)
# ---------------------------------------------------------------------------


_stationary_jit = jax.jit(gflow.stationary_window, static_argnums=1)


def stationary(pi, cfg: gflow.DataConfig) -> np.ndarray:
    """gflow's exact stationary window law (one compilation per configuration)."""
    return np.asarray(_stationary_jit(jnp.asarray(pi, jnp.float64), cfg))


def start_law(cfg: gflow.DataConfig, pi) -> np.ndarray:
    """Law of the first window ``(x_1..x_m)`` of a sample (burn-in included)."""
    d, m = cfg.d, max(cfg.parents)
    if cfg.start == "stationary":
        law = stationary(pi, cfg)
    else:
        law = np.full(d**m, float(d) ** -m)
    T = window_transition_loops(pi, d, cfg.parents)
    for _ in range(cfg.burn_in):
        law = law @ T
    return law


@eqx.filter_jit
def _exact_eval(params, probs, X, y, cond, unseen, model, d, eps, kind):
    def ell(yhat):  # (n, d) -> loss for every possible target e, (n, d)
        if kind == "log":
            return -jnp.log(yhat + eps)
        return -jax.nn.log_softmax(yhat, axis=-1)

    def quantities(params):
        yhat = jax.vmap(lambda x: gmodel.predict(params, x, model, d))(X)
        le = ell(yhat)
        loss = jnp.sum(probs * jnp.take_along_axis(le, y[:, None], axis=1)[:, 0])
        rb = jnp.sum(cond * le, -1)
        loss_rb = jnp.sum(probs * rb)
        aux = dict(
            loss=loss,
            loss_rb=loss_rb,
            var_rb=jnp.sum(probs * rb**2) - loss_rb**2,
            unseen=jnp.sum(probs * unseen),
        )
        return loss, aux

    (_, aux), grad = jax.value_and_grad(quantities, has_aux=True)(params)
    return aux, grad


def exact_problem(
    cfg: gflow.DataConfig,
    model: gflow.ModelConfig,
    params: gflow.Params,
    *,
    eps: float = 1e-6,
    kind: str = "log",
):
    """Exact population quantities of a fixed-kernel problem at ``params``, by
    enumerating all ``d**(L+1)`` sequences ``(x_1..x_{L+1})`` with their
    probabilities and running the reference per-position forward map
    :func:`gflow.core._model.predict` on each (not the counts layout used by
    default in the loss).

    Returns ``(quantities, grad)`` with ``quantities`` a dict of floats

    - ``loss``: ``E[ℓ(ŷ, y)]`` with the actual target ``y = x_{L+1}``
      (the definition, docs/theory/mathematics.md §M3: ``-log(ŷ_y + ε)`` or ``-log softmax(ŷ)_y``);
    - ``loss_rb``: ``E[ℓ_RB]``, with ``ℓ_RB = Σ_e π(e | z_q) ℓ(ŷ, e)``;
    - ``var_rb``: ``Var[ℓ_RB]``, the per-sequence variance of the estimator;
    - ``unseen``: ``E[Σ_e π(e|z_q) 1{e not in x_1..x_L}]``;

    and ``grad`` the exact gradient of ``loss`` (a :class:`gflow.Params`).
    """
    assert cfg.kernel is not None
    d, L = cfg.d, cfg.L
    pi = np.asarray(cfg.fixed_kernel())
    seqs = all_sequences(d, L + 1)
    probs = sequence_probs(pi, d, cfg.parents, L + 1, start_law(cfg, pi))
    assert abs(probs.sum() - 1) < 1e-12
    cond = pi[parents_code(seqs, cfg.parents, d, L + 1)]
    unseen = np.sum(cond * (1 - np.stack([(seqs[:, :L] == e).any(1) for e in range(d)], 1)), 1)
    aux, grad = _exact_eval(
        params,
        jnp.asarray(probs),
        jnp.asarray(seqs[:, :L], jnp.int32),
        jnp.asarray(seqs[:, L], jnp.int32),
        jnp.asarray(cond),
        jnp.asarray(unseen),
        model,
        d,
        eps,
        kind,
    )
    return {k: float(v) for k, v in aux.items()}, grad


# ---------------------------------------------------------------------------
# Shared, cached problems (each distinct static configuration costs an XLA
# compilation of the sampler and of the loss, which dominates the test time)
# ---------------------------------------------------------------------------

# Small fixed-kernel problems (d = 2) whose population loss is enumerated.
K_BIGRAM = np.array([[0.7, 0.3], [0.25, 0.75]])
K_TRIGRAM = np.array([[0.8, 0.2], [0.35, 0.65], [0.55, 0.45], [0.1, 0.9]])
EXACT_CFGS = {
    "bigram-stationary": gflow.DataConfig(d=2, parents=(1,), L=5, kernel=K_BIGRAM),
    "trigram-stationary": gflow.DataConfig(d=2, parents=(1, 2), L=6, kernel=K_TRIGRAM),
    "trigram-uniform": gflow.DataConfig(d=2, parents=(1, 2), L=6, kernel=K_TRIGRAM, start="uniform"),
}

# The paper's prior (Dirichlet(0.1), 3-gram, d = 3) at a short context.
PRIOR_CFG = gflow.DataConfig(d=3, parents=(1, 2), alpha=0.1, L=20)
PRIOR_N = 1000


@functools.cache
def prior_sample(seed: int) -> gflow.Sample:
    return gflow.sample(PRIOR_CFG, PRIOR_N, key=jax.random.key(seed))


@functools.cache
def prior_loss(seed: int, layout: str, norm: str = "sum", kind: str = "log") -> gflow.PopulationLoss:
    model = gflow.ModelConfig(M=3, H=3, D=2, norm=norm)
    est = gflow.EstimatorConfig(N=PRIOR_N, seed=seed, layout=layout, loss=kind)
    return gflow.make_loss(PRIOR_CFG, model, est)


# One compiled function per job, shared by every test module (jit caches on
# the loss's static configuration and shapes).
loss_value = eqx.filter_jit(lambda f, p: f(p))  # (value_and_grad is used where possible: one compile)
loss_value_and_grad = eqx.filter_jit(lambda f, p: f.value_and_grad(p))
loss_grad = eqx.filter_jit(lambda f, p: f.grad(p))
loss_stats = eqx.filter_jit(lambda f, p: f.stats(p))
loss_per_sequence = eqx.filter_jit(lambda f, p: f.per_sequence(p))


# ---------------------------------------------------------------------------
# A worker process that dies (tests/test_executor.py)
# ---------------------------------------------------------------------------


def kill_worker_once(marker: str, index: int, fn, *args):
    """``fn(*args)`` as an executor's task; the task of grid point `index` then kills its own worker
    process (SIGKILL, after computing the point and before handing it back) the first time it runs,
    recording the pid in the file `marker`."""
    import os
    import signal
    from pathlib import Path

    out = fn(*args)
    payload = args[-1]
    if isinstance(payload, dict) and payload.get("index") == index and not Path(marker).exists():
        Path(marker).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return out
