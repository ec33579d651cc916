"""The loss ladder: how good a loss is, against baselines on the same sample (docs/theory/mathematics.md §M8.3).

Every rung is a predictor ``p ∈ Δ_d`` of the target ``x_{L+1}`` from the
context ``X = (x_1, …, x_L)``, scored per sequence with the run's own loss
(``estimator.loss``, ``ε``; :func:`gflow.core.sequence_loss`), on the run's
own sample, so that the difference of two rungs has a *paired* standard error
(the per-sequence differences are i.i.d.). From the floor up:

- ``oracle``: ``p = π(·|z_q)``, the predictor that knows the kernel. With
  ``loss="log"`` its loss is ``−Σ_e π(e|z_q) log(π(e|z_q) + ε)``, the entropy
  ``H(π(·|z_q))`` up to at most ``d·ε`` (``entropy`` holds ``E H`` itself).
- ``bayes``: the Dirichlet posterior predictive from the context's
  transitions, ``p(e) = (n(z_q, e) + α) / (n(z_q) + dα)`` with ``n(z, e)`` the
  number of positions ``l ≤ L`` of ``X`` whose parents ``x_{l−p_1}, …,
  x_{l−p_k}`` all lie inside ``X`` (``l > p_k``), with parent configuration
  ``z`` and ``x_l = e``. ``n(z_q, e)`` is exactly the GIH's match count
  ``N₁(e)`` on the offset set ``S = parents`` (:func:`gflow.theory.gih_counts`,
  whose padding never matches), which is how it is computed.
- ``gih``: the generalized induction head of the selected set ``S`` at
  ``a = argmin_a L_GIH(a)`` (``inf_a L_GIH``; the theory's ``a`` when given,
  else :func:`gih_argmin`).
- ``unigram``: the context's unigram ``p(e) = #{l ≤ L : x_l = e} / L``, the
  GIH at ``a = 0`` (for any ``S``).
- ``flow``: the trained model ``TF(θ)`` at the given parameters.
- ``uniform``, ``unigram+1``, ``bigram+1``: Edelman et al.'s three strategies (add-one counts
  of the context's tokens, and of the current token's successors; :mod:`gflow.theory._strategies`).

With the loss at every position (``estimator.positions = "all"``) every rung predicts every
position t from ``x_1..x_t`` and is scored as the loss weighs the positions: the oracle with
``π(·|z_{t+1})``, Bayes with the counts of the prefix (positions ``s ≤ t`` whose parents lie in
it), the unigram with the prefix's; the GIH rung, a last-position law, is left out.

Gaps ``flow − bayes`` and ``gih − bayes`` (and ``unigram − bayes``,
``bayes − oracle``) carry the paired SE ``std(ℓ_A − ℓ_B)/√N``; ``captured`` is
the share of the in-context gain the flow realises,
``(unigram − flow) / (unigram − bayes)``, with a delta-method SE.

Choices (extension of the paper, which is silent here):

- **Bayes is Bayes-optimal only for** ``start="uniform"`` **without a fixed
  kernel**: the uniform start tokens' likelihood does not depend on ``π``, so
  the posterior of each row ``π(·|z)`` is ``Dirichlet(α + n(z, ·))``. With a
  stationary start the exact posterior also carries the start window's
  stationary probability ``μ_π(x_1..x_{p_k})``, which this predictor drops (a
  ``O(1/L)`` effect); with a burn-in the same holds; with a fixed kernel
  (``data.kernel``) the prior is a point mass and the oracle is the Bayes
  predictor, while the ``bayes`` rung still uses the ``Dirichlet(α)`` prior.
- **``loss="ce_on_probs"``** (for a member whose output is logits, as Edelman's, the rungs are
  scored with the log loss instead: its ``ce_on_probs`` is the log loss of softmax(ŷ)); otherwise
  every rung's probability vector is scored with that same functional, ``−Σ_e π(e|z_q) log softmax(p)_e``. That functional
  is not a proper scoring rule, so the oracle is then not a floor and the
  ladder's order is not guaranteed; the ``entropy`` field is still ``E H``.
- **Cost**: the Bayes counts and the GIH counts each take one pass over the
  sample (like one loss evaluation), the flow rung one loss evaluation; the
  oracle and the unigram are closed forms, and minimising ``L_GIH`` over
  ``a`` uses the GIH's ``O(N d)`` closed form, not the model.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..core import (
    CountFeatures,
    DataConfig,
    EstimatorConfig,
    Params,
    PopulationLoss,
    PositionFeatures,
    Sample,
    config_codes,
    kind_of,
    loss_sample,
    loss_targets,
    prior_of,
    sequence_loss,
    subset_label,
)
from ..core import mean_se as _loss_mean_se
from ..core import sample as draw_sample
from ._gih import gih_counts, make_gih
from ._strategies import score_probs, strategy_losses

__all__ = ["RUNGS", "Ladder", "bayes_counts", "bayes_predictive", "format_ladder", "gih_argmin", "loss_ladder"]

RUNGS = ("oracle", "bayes", "gih", "unigram", "flow")
#: Edelman et al.'s strategies as rungs (their name in the ladder)
STRATEGY_RUNGS = ("uniform", "unigram+1", "bigram+1")
_GAPS = (("flow", "bayes"), ("gih", "bayes"), ("unigram", "bayes"), ("bayes", "oracle"), ("flow", "gih"))


def bayes_counts(source, parents) -> jnp.ndarray:
    """``n(z_q, e)`` of every sequence, ``(N, d)`` float64: the number of
    positions ``l ≤ L`` with all parents inside ``X``, parent configuration
    equal to the query's ``z_q`` and ``x_l = e``.

    `source` is a :class:`~gflow.Sample` or
    :class:`~gflow.core.PositionFeatures` (any parents), or
    :class:`~gflow.core.CountFeatures` when ``p_k ≤ M`` (the window codes
    encode offsets ``1..M`` only). Computed as the GIH's ``N₁(e)`` on
    ``S = parents``.
    """
    parents = tuple(int(p) for p in parents)
    if isinstance(source, CountFeatures):
        M = _window_of(source)
        if parents and max(parents) > M:
            raise ValueError(
                f"the Bayes rung needs the context's tokens: parents {parents} reach beyond the model's "
                f"window M={M} of the counts layout; pass the Sample (sample=...) or use layout='positions'"
            )
        return gih_counts(source, parents, M=M)[0]
    if isinstance(source, (Sample, PositionFeatures)):
        return gih_counts(source, parents)[0]
    raise TypeError(f"bayes_counts: source must be a Sample or a feature set, got {type(source)}")


def _window_of(feats: CountFeatures) -> int:
    """The window M a counts layout encodes (its table has ``(d+1)**M`` windows)."""
    d, K = feats.counts.shape[1:]
    return round(math.log(K) / math.log(d + 1))


def _redraw(data: DataConfig, estimator, loss: PopulationLoss) -> Sample:
    """The sample `loss` was built on, drawn again as ``make_loss`` draws it (``ValueError`` if
    its targets are not the loss's: a loss built on another key)."""
    smp = draw_sample(data, estimator.N, key=jax.random.key(estimator.seed), dtype=jnp.float64)
    target = smp.cond if estimator.target != "drawn" else jax.nn.one_hot(smp.y, data.d, dtype=smp.cond.dtype)
    if target.shape != loss.feats.cond.shape or not np.allclose(np.asarray(target), np.asarray(loss.feats.cond)):
        raise ValueError("the Bayes rung needs the context's tokens, and the loss's sample is not the one "
                         "estimator.seed draws (a loss built from another key): its tokens are not known here")
    return smp


def _tokens_of(loss: PopulationLoss, data: DataConfig, estimator):
    """The sample whose tokens the loss's features hold (the positions layout), else drawn again."""
    if isinstance(loss.feats, PositionFeatures):
        return loss.feats
    if estimator is None:
        raise ValueError("the Bayes rung of this data kind needs the context's tokens: pass sample= or estimator=")
    return _redraw(data, estimator, loss)


def bayes_predictive(n: jnp.ndarray, alpha: float) -> jnp.ndarray:
    """The Dirichlet posterior predictive ``(n(z_q, e) + α) / (n(z_q) + dα)``
    from counts ``n`` of shape ``(..., d)``."""
    n = jnp.asarray(n, jnp.float64)
    d = n.shape[-1]
    return (n + alpha) / (n.sum(-1, keepdims=True) + d * alpha)


@functools.partial(jax.jit, static_argnames="kind")
def _score(p, cond, eps, kind: str):
    """Per-sequence loss of the rung `p` against `cond` (``0 log 0 = 0``: a rung that gives zero
    probability only where the target has none, as the triggers' Bayes rung, is finite)."""
    if kind == "log":
        ok = cond > 0
        return -jnp.sum(jnp.where(ok, cond * jnp.log(jnp.where(ok, p + eps, 1.0)), 0.0), -1)
    return jax.vmap(lambda pp, c: sequence_loss(pp, c, eps, kind))(p, cond)


def entropy(law) -> np.ndarray:
    """``−Σ_e p log p`` over the last axis of the laws `law` (numpy, ``0 log 0 = 0``)."""
    law = np.asarray(law, np.float64)
    return -np.sum(np.where(law > 0, law * np.log(np.where(law > 0, law, 1.0)), 0.0), -1)


@jax.jit
def _entropy(cond):
    """``H(π(·|z_q)) = −Σ_e π log π`` per sequence (``0 log 0 = 0``)."""
    return -jnp.sum(jnp.where(cond > 0, cond * jnp.log(jnp.where(cond > 0, cond, 1.0)), 0.0), -1)


@eqx.filter_jit
def _gih_mean_losses(gih, a_grid):
    return jax.lax.map(gih.loss, a_grid)


def gih_argmin(gih, *, a_max: float = 30.0, n: int = 61) -> float:
    """``argmin_a L_GIH(a)`` over ``[0, a_max] ∪ {∞}``: the grid minimum of
    ``n`` points, refined on a second grid of ``n`` points between its
    neighbours (two vectorised passes of the GIH's ``O(N d)`` closed form;
    ``a`` to ``a_max/(n−1)²``, the loss to second order in that). Returns
    ``math.inf`` when the limit ``a → ∞`` is lower. It agrees with
    :func:`gflow.theory.limit_loss`'s refined infimum (used by the theory
    and the check report, which pass their ``a``) to the grid's precision."""
    a = np.linspace(0.0, a_max, n)
    L = np.asarray(_gih_mean_losses(gih, jnp.asarray(a)))
    i = int(np.argmin(L))
    lo, hi = a[max(i - 1, 0)], a[min(i + 1, n - 1)]
    a2 = np.linspace(lo, hi, n)
    L2 = np.asarray(_gih_mean_losses(gih, jnp.asarray(a2)))
    j = int(np.argmin(L2))
    if float(jnp.mean(gih.per_sequence_loss_inf())) < L2[j]:
        return math.inf
    return float(a2[j])


def mean_se(x: np.ndarray) -> tuple[float, float]:
    """Mean and ``std/√N``, by the estimator's own reduction
    (:func:`gflow.core.mean_se`)."""
    m, se = _loss_mean_se(jnp.asarray(x))
    return float(m), float(se)


def _f(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


@dataclasses.dataclass(frozen=True)
class Ladder:
    """The ladder of one sample.

    - `values`: rung name → per-sequence losses ``(N,)`` (numpy), for the
      rungs of :data:`RUNGS` that were computed (``flow`` only with `params`).
    - `S`: the GIH's set of offsets; `a_gih`: where ``L_GIH`` is smallest
      (``math.inf`` for the limit ``a → ∞``).
    - `entropy`, `entropy_se`: ``E H(π(·|z_q))`` (exact per sequence).
    - `kind`, `eps`: the loss scored; `bayes_optimal`: whether the ``bayes``
      rung is exactly Bayes-optimal for this data configuration.
    """

    values: dict[str, np.ndarray]
    S: tuple[int, ...]
    a_gih: float
    entropy: float
    entropy_se: float
    kind: str
    eps: float
    alpha: float
    bayes_optimal: bool

    @property
    def N(self) -> int:
        return len(next(iter(self.values.values())))

    def mean(self, name: str) -> float:
        return mean_se(self.values[name])[0]

    def se(self, name: str) -> float:
        return mean_se(self.values[name])[1]

    def gap(self, a: str, b: str) -> tuple[float, float]:
        """``rung a − rung b`` and its paired SE."""
        return mean_se(self.values[a] - self.values[b])

    def captured(self) -> tuple[float, float] | None:
        """``(unigram − flow) / (unigram − bayes)`` and its delta-method SE
        (``None`` without the flow rung or when ``unigram = bayes``)."""
        if "flow" not in self.values or "unigram" not in self.values:
            return None
        u, f, b = (self.values[k] for k in ("unigram", "flow", "bayes"))
        num, den = u - f, u - b
        D = float(np.mean(den))
        if D == 0:
            return None
        R = float(np.mean(num)) / D
        resid = (num - R * den) / D
        return R, mean_se(resid)[1]

    def to_json(self) -> dict:
        rungs = [
            {"name": k, "loss": _f(self.mean(k)), "se": _f(self.se(k))} for k in RUNGS + STRATEGY_RUNGS
            if k in self.values
        ]
        gaps = []
        for a, b in _GAPS:
            if a in self.values and b in self.values:
                g, s = self.gap(a, b)
                gaps.append({"name": f"{a} − {b}", "a": a, "b": b, "gap": _f(g), "se": _f(s)})
        cap = self.captured()
        return {
            "rungs": rungs,
            "gaps": gaps,
            "captured": None if cap is None else {"value": _f(cap[0]), "se": _f(cap[1])},
            "S": list(self.S),
            "label": subset_label(self.S),
            "a_gih": _f(self.a_gih),
            "a_gih_is_inf": math.isinf(self.a_gih),
            "entropy": _f(self.entropy),
            "entropy_se": _f(self.entropy_se),
            "N": self.N,
            "loss": self.kind,
            "eps": self.eps,
            "alpha": self.alpha,
            "bayes_optimal": self.bayes_optimal,
        }


def loss_ladder(
    loss: PopulationLoss,
    data: DataConfig,
    *,
    S,
    params: Params | None = None,
    a_gih: float | None = None,
    sample: Sample | None = None,
    pi_cond=None,
    estimator=None,
) -> Ladder:
    """The ladder on `loss`'s sample (docs/theory/mathematics.md §M8.3); see the module docstring.

    **Arguments:**

    - `loss`: the run's estimator (its sample, ``ε`` and loss kind are used).
    - `data`: the data configuration that drew that sample (``α``, parents).
    - `S`: the GIH's set of offsets (the run's selected set, or ``S*``).
    - `params`: the trained θ for the ``flow`` rung (none: no flow rung).
    - `a_gih`: where to evaluate the GIH (``math.inf`` allowed), e.g. the
      theory's ``a_limit``; default ``argmin_a L_GIH(a)`` by :func:`gih_argmin`.
    - `sample`: the sample itself, needed for the Bayes counts only with the
      counts layout when the parents reach beyond the model's window ``M``.
    - `estimator`: the [`gflow.EstimatorConfig`][gflow.EstimatorConfig] that drew `loss`'s
      sample: when the Bayes counts need the context's tokens and no `sample` is given, the
      sample is drawn again as [`gflow.make_loss`][gflow.make_loss] draws it (key
      ``estimator.seed``, float64) and checked against the loss's targets.
    - `pi_cond`: ``π(·|z_q)`` of every sequence, ``(N, d)``, when the loss's target is not
      it (``estimator.target = "drawn"``, whose target is the drawn token ``e(y)``:
      :func:`gflow.core.kernel_conditional`). The oracle predicts with ``π(·|z_q)`` and is
      scored against the loss's target, and the entropy is that of ``π(·|z_q)``; without
      it a drawn target would make the oracle "know" the drawn token (loss ≈ 0) and the
      Bayes − oracle row vacuous.
    """
    if loss.d != data.d:
        raise ValueError(f"loss_ladder: the estimator has d={loss.d}, the data configuration data.d={data.d}")
    if np.ndim(loss.feats.cond) == 3:
        return _every_position_ladder(loss, data, params=params, sample=sample, estimator=estimator)
    kind, eps = _rung_kind(loss), float(loss.eps)
    cond = jnp.asarray(loss.feats.cond, jnp.float64)
    score = lambda p, c: _score(p, c, jnp.asarray(eps, jnp.float64), kind)

    values: dict[str, np.ndarray] = {}
    pi = cond if pi_cond is None else jnp.asarray(pi_cond, jnp.float64)
    if pi.shape != cond.shape:
        raise ValueError(f"loss_ladder: pi_cond has shape {pi.shape}, the loss's targets {cond.shape}")
    values["oracle"] = np.asarray(score(pi, cond))
    ent = np.asarray(_entropy(pi))

    if sample is None and estimator is not None and isinstance(loss.feats, CountFeatures) \
            and max(data.parents) > _window_of(loss.feats):  # fmt: skip
        sample = _redraw(data, estimator, loss)
    src = sample if sample is not None else loss.feats
    prior = prior_of(data)  # the Dirichlet rows' contexts, or (unigram) every token
    dkind = kind_of(data)  # the data family's member: the n-gram rule below, or its own counts
    if dkind.name != "ngram":
        src = sample if sample is not None else _tokens_of(loss, data, estimator)
        if getattr(src, "pi", None) is None and estimator is not None:  # the features hold no kernels
            src = _redraw(data, estimator, loss)
        own = dkind.bayes_every(data, src.X, getattr(src, "pi", None))
        n = None if own is not None else dkind.bayes_counts(data, src.X)
    else:
        own, n = None, bayes_counts(src, prior.bayes_offsets(data.parents))
    p_bayes = jnp.asarray(own[:, -1], jnp.float64) if own is not None else bayes_predictive(n, float(data.alpha))
    values["bayes"] = np.asarray(score(p_bayes, cond))

    gih = make_gih(loss, tuple(S)) if kind == loss.kind else make_gih(loss.feats, tuple(S), eps=eps, kind=kind,
                                                                       M=loss.model.M)  # fmt: skip
    a_gih = gih_argmin(gih) if a_gih is None else float(a_gih)
    if math.isinf(a_gih):
        values["gih"] = np.asarray(gih.per_sequence_loss_inf())
    else:
        values["gih"] = np.asarray(gih.per_sequence_loss(jnp.asarray(a_gih, jnp.float64)))
    values["unigram"] = np.asarray(gih.per_sequence_loss(jnp.asarray(0.0, jnp.float64)))
    if params is not None:
        values["flow"] = np.asarray(_per_sequence(loss, params), np.float64)
    try:
        X = (sample if sample is not None else _tokens_of(loss, data, estimator)).X
    except ValueError:  # the counts layout and no estimator: the tokens are not known here
        X = None
    if X is not None:
        for rung, v in zip(STRATEGY_RUNGS, strategy_losses(cond, X, eps, kind).values()):
            values[rung] = v

    values = _finite_rungs(values)
    e_m, e_se = mean_se(ent)
    optimal = dkind.bayes_exact(data)
    return Ladder(
        values=values, S=tuple(int(h) for h in S), a_gih=a_gih, entropy=e_m, entropy_se=e_se,
        kind=kind, eps=eps, alpha=float(data.alpha), bayes_optimal=optimal,
    )  # fmt: skip


def _every_position_ladder(loss, data, *, params, sample, estimator) -> Ladder:
    """:func:`loss_ladder` of a loss taken at every position (module docstring)."""
    if estimator is None and sample is None:
        raise ValueError("the ladder of a loss at every position needs the sample's kernels: pass estimator= or sample=")
    kind, eps = _rung_kind(loss), float(loss.eps)
    if sample is None:
        sample = loss_sample(data, estimator)
    target = np.asarray(loss.feats.cond, np.float64)
    est = estimator if estimator is not None else EstimatorConfig(positions="all")
    if not np.allclose(np.asarray(loss_targets(sample, data, est)), target):
        raise ValueError("the ladder needs the loss's own sample, and the loss's targets are not the ones "
                         "estimator.seed draws (a loss built from another key)")  # fmt: skip
    law, _ = kind_of(data).every_position(data, sample.X, sample.y, sample.pi)
    law, w = np.asarray(law, np.float64), target.sum(-1)  # (N, L): the loss's weight of each position
    X = np.asarray(sample.X)
    N, L = X.shape

    def score(p):  # an infinite loss (a zero probability with ε = 0) is left out by _finite_rungs
        return score_probs(p, target, eps, kind)

    values = {"oracle": score(law)}
    H = entropy(law)  # (N, L)
    ent = (H * w).sum(-1)
    own = kind_of(data).bayes_every(data, sample.X, sample.pi)
    if own is not None:
        values["bayes"] = score(np.asarray(own, np.float64))
    else:
        offs = prior_of(data).bayes_offsets(data.parents)
        values["bayes"] = score(np.asarray(bayes_predictive(_prefix_counts(X, np.asarray(sample.y), offs, data.d),
                                                            float(data.alpha))))  # fmt: skip
    E = np.eye(data.d)[X]
    values["unigram"] = score(np.cumsum(E, 1) / np.arange(1, L + 1)[None, :, None])
    if params is not None:
        values["flow"] = np.asarray(_per_sequence(loss, params), np.float64)
    for rung, v in zip(STRATEGY_RUNGS, strategy_losses(target, X, eps, kind).values()):
        values[rung] = v
    e_m, e_se = mean_se(ent)
    return Ladder(values=_finite_rungs(values), S=(), a_gih=math.nan,
                  entropy=e_m, entropy_se=e_se, kind=kind, eps=eps, alpha=float(data.alpha),
                  bayes_optimal=kind_of(data).bayes_exact(data))  # fmt: skip


def _rung_kind(loss) -> str:
    """How the rungs' probabilities are scored: the run's loss, or the log loss for a member whose
    output is logits (its ``ce_on_probs`` is the cross-entropy of softmax(ŷ), the log loss of its
    distribution; a rung's probabilities are a distribution already)."""
    return "log" if loss.member.outputs_logits else loss.kind


def _finite_rungs(values: dict) -> dict:
    """The rungs as float64 arrays, leaving out a baseline whose loss is infinite on some sequence
    (a zero probability on a target token, possible only with ε = 0: the context's unigram)."""
    out = {k: np.asarray(v, np.float64) for k, v in values.items()}
    return {k: v for k, v in out.items() if k == "flow" or np.all(np.isfinite(v))}


def _prefix_counts(X, y, offsets, d: int) -> np.ndarray:
    """``n_t(e)``, ``(N, L, d)``: the positions ``s ≤ t`` whose offsets ``x_{s−o}`` all lie in the
    context, with the configuration of ``x_{t+1}``'s and ``x_s = e`` (every ``s ≤ t`` for no
    offsets)."""
    N, L = X.shape
    full = np.concatenate([X, y[:, None]], axis=1)
    E = np.eye(d)[X]
    if not offsets:
        return np.cumsum(E, 1)
    K = d ** len(offsets)
    code = config_codes(full, offsets, d)  # (N, L+1): configuration of x_{i+1}
    ok = np.arange(L + 1) >= max(offsets)
    A = np.zeros((N, L, K, d))
    s = np.arange(L)
    A[np.arange(N)[:, None], s[None, :], code[:, :L], X] = ok[None, :L].astype(float)
    C = np.cumsum(A, 1)  # (N, L, K, d): up to position t
    return np.take_along_axis(C, code[:, 1:, None, None], axis=2)[:, :, 0]  # the configuration of x_{t+1}


@eqx.filter_jit
def _per_sequence(loss: PopulationLoss, params: Params):
    return loss.per_sequence(params)


_NAMES = {
    "oracle": "oracle  E −Σπ log(π+ε)  (knows π)",
    "bayes": "Bayes   Dirichlet posterior predictive",
    "gih": "GIH     inf_a L_GIH",
    "unigram": "unigram context (GIH at a = 0)",
    "flow": "flow    TF(θ) at the end",
    "uniform": "uniform 1/d (Edelman et al.'s strategies, add-one counts)",
    "unigram+1": "unigram+1 the context's tokens",
    "bigram+1": "bigram+1 the current token's successors",
}


def format_ladder(lad: dict) -> str:
    """Text rendering of :meth:`Ladder.to_json`'s dict."""
    if lad.get("a_gih") is None and not lad.get("a_gih_is_inf"):
        gih = "the loss at every position: no GIH rung"
    else:
        where = "a → ∞" if lad.get("a_gih_is_inf") else f"a = {lad['a_gih']:.4g}"
        gih = f"GIH on S = {lad['label']} at {where}"
    head = f"Loss ladder on the run's sample (N = {lad['N']}, loss {lad['loss']!r}, paired SEs; {gih})"
    out = [head]
    for r in lad["rungs"]:
        out.append(f"  {_NAMES[r['name']]:<42} {r['loss']:.6f} ± {r['se']:.2g}")
    out.append(f"  E H(π(·|z_q)) = {lad['entropy']:.6f} ± {lad['entropy_se']:.2g}")
    for g in lad["gaps"]:
        out.append(f"  gap {g['name']:<18} {g['gap']:+.6f} ± {g['se']:.2g}")
    if lad.get("captured"):
        c = lad["captured"]
        out.append(f"  captured (unigram − flow)/(unigram − Bayes) = {c['value']:.4f} ± {c['se']:.2g}")
    if not lad["bayes_optimal"]:
        out.append(
            "  note: Bayes is exactly Bayes-optimal only for start='uniform', no burn-in and no fixed kernel; "
            "here it drops the start's likelihood (or the prior is a point mass)"
        )
    return "\n".join(out)
