"""Edelman et al.'s three in-context strategies, and the model's distance to each
(docs/guides/data.md, "Strategies").

At every position where the loss is taken (the last, or with ``estimator.positions = "all"``
every position t, predicting ``x_{t+1}`` from ``x_1..x_t``), three predictors built from the
context alone, with add-one counts (their ``test_error.py``, the rule of succession):

- ``uniform``: ``1/d``;
- ``unigram``: ``(#{s ≤ t : x_s = e} + 1) / (t + d)``;
- ``bigram``: ``(#{s < t : x_s = x_t, x_{s+1} = e} + 1) / (#{s < t : x_s = x_t} + d)``, the
  successors of the current token's earlier occurrences.

Whatever the data's parents, the strategies read the previous token (they are Edelman's
phases: uniform → unigram → bigram). :func:`model_predictions` reads the model's predictive
distribution off any member and layout, as ``exp(−∂ℓ/∂target)`` (every layout's loss is
``−Σ_e target_e log p_e`` with ``p = ŷ + ε``, or ``softmax(ŷ)`` for ``ce_on_probs``: its
derivative in the target is ``−log p``); :func:`strategy_kl` is the mean KL from each strategy to
the model, ``Σ_t w_t KL(s_t ‖ p_t)`` averaged over the sample (``w_t`` the loss's weight of
position t), and :func:`strategy_losses` each strategy's loss per sequence (the ladder's rungs).
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

STRATEGIES = ("uniform", "unigram", "bigram")

__all__ = ["STRATEGIES", "model_predictions", "position_weights", "score_probs", "strategies_along", "strategies_of", "strategy_arrays",
           "strategy_kl", "strategy_losses", "strategy_phases", "strategy_predictions"]  # fmt: skip


@functools.partial(jax.jit, static_argnames="d")
def _every_position(X, d: int):
    X = jnp.asarray(X)
    N, L = X.shape
    E = jax.nn.one_hot(X, d, dtype=jnp.float64)  # (N, L, d)
    t = jnp.arange(1, L + 1, dtype=jnp.float64)[None, :, None]
    uni = (jnp.cumsum(E, 1) + 1.0) / (t + d)
    trans = jnp.einsum("nsa,nsb->nsab", E[:, :-1], E[:, 1:])  # transition s → s+1, known at position s+1
    T = jnp.concatenate([jnp.zeros((N, 1, d, d)), jnp.cumsum(trans, 1)], axis=1)  # (N, L, d, d): up to t
    row = jnp.einsum("nta,ntab->ntb", E, T)  # the current token's successors so far
    big = (row + 1.0) / (row.sum(-1, keepdims=True) + d)
    return jnp.stack([jnp.full_like(uni, 1.0 / d), uni, big])


def strategy_predictions(X, d: int, every: bool = False) -> np.ndarray:
    """The three strategies' predictions, ``(3, N, d)`` at the last position of the contexts
    ``X`` ``(N, L)``, or ``(3, N, L, d)`` at every position (``every``)."""
    S = np.asarray(_every_position(jnp.asarray(X), int(d)))
    return S if every else S[:, :, -1]


def position_weights(target) -> np.ndarray:
    """The loss's weight of each position of each sequence, from its target: ``(N,)`` ones for a
    last-position target ``(N, d)``, the row sums of a weighted every-position target ``(N, L, d)``."""
    target = np.asarray(target, np.float64)
    return np.ones(target.shape[0]) if target.ndim == 2 else target.sum(-1)


@eqx.filter_jit
def _neg_log_p(loss, params):
    cond = loss.feats.cond
    f = lambda c: jnp.sum(eqx.tree_at(lambda l_: l_.feats.cond, loss, c).per_sequence(params))  # noqa: E731
    return jax.grad(f)(cond)


def model_predictions(loss, params) -> np.ndarray:
    """The model's predictive distribution at every position where `loss` takes its loss,
    ``(N, d)`` (or ``(N, L, d)``), renormalised (``ŷ + ε`` sums to ``1 + dε``): ``exp(−∂ℓ/∂target)``
    (module docstring), so it holds for every member and layout."""
    p = np.exp(-np.asarray(_neg_log_p(loss, params), np.float64))
    return p / p.sum(-1, keepdims=True)


def _xlogy_ratio(s, p):
    return np.sum(s * (np.log(s) - np.log(np.maximum(p, 1e-300))), -1)


def strategy_kl(loss, params, X, S=None) -> dict[str, float]:
    """The mean KL from each strategy's prediction to the model's, over the sample's positions
    where the loss is taken (weighted as the loss weighs them), ``{name: value}``. `X`: the
    loss's contexts ``(N, L)``; `S`: their :func:`strategy_predictions`, when already computed."""
    every = np.asarray(loss.feats.cond).ndim == 3
    S = strategy_predictions(X, loss.d, every) if S is None else S
    p = model_predictions(loss, params)
    w = position_weights(loss.feats.cond)
    per = [w * _xlogy_ratio(S[i], p) for i in range(len(STRATEGIES))]  # (N,) or (N, L)
    return {k: float(np.mean(v.reshape(v.shape[0], -1).sum(-1))) for k, v in zip(STRATEGIES, per)}


def strategy_phases(t, kl, factor: float = 2.0) -> list[tuple[str, float, float]]:
    """The phases of a run: maximal stretches of saved times ``t`` where one strategy's KL to
    the model is the smallest by `factor` (below `1/factor` of the next), ``[(name, t_first,
    t_last)]`` in time order. `kl`: ``{name: (T,)}`` (or ``(T, 3)`` in :data:`STRATEGIES`'
    order). Times where no strategy leads by the factor belong to no phase."""
    K = np.stack([np.asarray(kl[k]) for k in STRATEGIES], -1) if isinstance(kl, dict) else np.asarray(kl)
    t = np.asarray(t, np.float64)
    out: list[list] = []
    prev = None
    for i in range(len(t)):
        o = np.argsort(K[i])
        best = STRATEGIES[o[0]] if K[i, o[0]] * factor <= K[i, o[1]] else None
        if best is not None and best == prev and out and out[-1][0] == best:
            out[-1][2] = float(t[i])
        elif best is not None:
            out.append([best, float(t[i]), float(t[i])])
        prev = best
    return [tuple(p) for p in out]


def score_probs(p, target, eps: float, kind: str) -> np.ndarray:
    """Per-sequence loss of the probability vectors `p` against `target` (both ``(N, d)``, or
    ``(N, L, d)`` with the every-position target's weights), numpy: ``−Σ target log(p + ε)``, or
    ``−Σ target log softmax(p)`` for ``ce_on_probs`` (``0 log 0 = 0``); a zero probability where the
    target has mass, with ε = 0, gives ``inf``."""
    target = np.asarray(target, np.float64)
    if kind == "log":
        with np.errstate(divide="ignore"):
            lp = np.log(p + eps)
    else:
        z = p - p.max(-1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.sum(np.where(target > 0, target * np.where(target > 0, lp, 0.0), 0.0), axis=tuple(range(1, target.ndim)))


def strategy_losses(target, X, eps: float, kind: str) -> dict[str, np.ndarray]:
    """Each strategy's loss per sequence, ``{name: (N,)}``, scored as the run's loss
    (:func:`score_probs`) against the loss's target (``(N, d)``, or the weighted ``(N, L, d)`` of
    every position)."""
    S = strategy_predictions(X, np.shape(target)[-1], np.ndim(target) == 3)
    return {k: score_probs(S[i], target, eps, kind) for i, k in enumerate(STRATEGIES)}


def strategies_along(loss, X, thetas, ts) -> dict:
    """:func:`strategy_kl` at each θ of `thetas` (at the times `ts`): ``{"t", "kl_uniform",
    "kl_unigram", "kl_bigram", "phases"}`` (arrays over the times; the phases of
    :func:`strategy_phases`)."""
    S = strategy_predictions(X, loss.d, np.ndim(loss.feats.cond) == 3)
    kl = {k: [] for k in STRATEGIES}
    for theta in thetas:
        for k, v in strategy_kl(loss, theta, X, S).items():
            kl[k].append(v)
    t = np.asarray(ts, np.float64)
    out = {"t": t, **{f"kl_{k}": np.asarray(v) for k, v in kl.items()}}
    out["phases"] = strategy_phases(t, kl)
    return out


def strategies_of(traj, *, every: int = 1, loss=None) -> dict:
    """:func:`strategies_along` of a run (a :class:`gflow.Trajectory`: its configuration, saved
    times and θ) at every `every`-th saved time and the last, on the run's own sample (`loss`:
    the run's estimator when already built). A run that stores them (:attr:`gflow.Trajectory.kl`,
    written once it is integrated) is read, not recomputed: the same numbers."""
    n = len(traj.ts)
    idx = sorted(set(range(0, n, every)) | {n - 1})
    kl = getattr(traj, "kl", None) or {}
    if all(np.shape(kl.get(f"kl_{k}")) == (n,) for k in STRATEGIES):
        t = np.asarray(traj.ts, np.float64)[idx]
        out = {"t": t, **{f"kl_{k}": np.asarray(kl[f"kl_{k}"])[idx] for k in STRATEGIES}}
        out["phases"] = strategy_phases(t, {k: out[f"kl_{k}"] for k in STRATEGIES})
        return out
    return _computed(traj, idx, loss)


def strategy_arrays(traj, loss=None) -> dict[str, np.ndarray]:
    """The arrays a run stores once integrated (:attr:`gflow.Trajectory.kl`): ``{"kl_uniform",
    "kl_unigram", "kl_bigram"}``, each ``(T,)``, the mean KL from each strategy to the model at
    every saved time, computed from θ on the run's own sample (`loss`: its estimator, when built)."""
    s = _computed(traj, list(range(len(traj.ts))), loss)
    return {f"kl_{k}": s[f"kl_{k}"] for k in STRATEGIES}


def _computed(traj, idx, loss) -> dict:
    from ..core import Params, loss_sample, make_loss

    cfg = traj.config
    loss = make_loss(cfg.data, cfg.model, cfg.estimator) if loss is None else loss
    dt = loss.eps.dtype
    thetas = (Params.from_blocks({b: jnp.asarray(v, dt) for b, v in traj.state(i).items()}) for i in idx)
    return strategies_along(loss, loss_sample(cfg.data, cfg.estimator).X, thetas, np.asarray(traj.ts)[idx])
