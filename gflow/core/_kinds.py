"""The data family (``data.kind``; docs/guides/data.md, docs/theory/mathematics.md §M1): one
abstract data distribution, :class:`AbstractDataKind`, with one final class per kind, looked up
by :func:`kind_of`, as the model family's members are by ``member_of``.

A kind declares

- the options it reads (``data.graph``, …; an option of another kind is refused by name),
- its **sampler** (the flow's fixed sample, :func:`gflow.core.sample`),
- its **Bayes rung**: the counts its Dirichlet posterior predictive reads, and whether that
  predictive is the exact posterior predictive of the sample,
- whether grid points may share one chain (the sample bank of ``gflow.runs``),
- the **theory** it supports (``has_laws``): the paper derives the modified χ²-MI Ĩ and its
  asymptotic statements for the n-gram mixture; for another kind the paper's rows say "no law for
  this data", while J, the GIH law and the ladder, properties of the run's own sample, are computed
  for every kind (finite-size laws; the theory's note says so).

Members:

- ``"ngram"`` (the default; the paper's mixture of n-gram Markov chains, parents at fixed
  offsets, the priors of :mod:`gflow.core._priors`);
- ``"graph"`` (Nichani, Damian and Lee's in-context causal graph, their Task 2.4): one parent
  position ``p(i) < i`` per position ``i = 1..L−1`` (0: a root), a kernel π with
  ``Dirichlet(α·1_d)`` rows (``data.prior``), roots from π's stationary law, the other positions
  from ``π(·|x_{p(i)})``; the last context position ``L`` is the query, uniform on ``[d]``, and the
  target ``x_{L+1} ~ π(·|x_L)`` (the loss's expected target is the row ``π(·|x_L)``). In gflow's
  convention the target's parent is the query, offset 1: a graph configuration has
  ``data.parents = [1]``.

The graphs (``data.graph``), as ``single_parent.py`` of their repository builds them (there
0-based; here 1-based positions):

- ``"chain"``: ``p(i) = i − 1`` (position 1 a root);
- ``"icl"``: even positions have parent ``i − 1``, odd positions are roots (pairs
  ``(x_{2j−1}, x_{2j})``, the in-context-learning layout);
- ``"random"``: ``p(i)`` uniform over ``{root, 1, …, i−1}``, drawn once from ``data.graph_seed``;
- an explicit list of ``L − 1`` integers, entry ``i − 1`` position i's parent (0 for a root).
  Position ``L``, the query, is drawn uniformly and has no entry.

**k parents per position** (``data.graph_parents = k >= 2``, their ``multi_parent.ipynb`` and
``InContextDAG``): every non-root position i has k parent positions ``p_1(i) > … > p_k(i)`` (listed
nearest first), a kernel π of ``d^k`` ``Dirichlet(α·1_d)`` rows indexed by the parents' tokens
(the configuration code ``Σ_h x_{p_h(i)} d^{k−h}``, the n-gram kind's ``z_q`` convention), roots
uniform (their ``pi[0]``), and no query: positions ``1..L`` all follow the graph and the target
``x_{L+1} ~ π(·|x_{p(L+1)})``, whose parent offsets ``L + 1 − p_h(L+1)`` are ``data.parents``. The
graphs (:func:`graph_parent_sets`, positions ``i ≤ k`` roots):

- ``"chain"``: ``p(i) = {i−1, …, i−k}`` (``data.parents = [1..k]``);
- ``"heap"`` (k = 2): ``p(i) = {i−1, ⌊i/2⌋}`` for ``i ≥ 3``, their notebook's graph
  ``dag[i] = [(i−1)//2, i−1]`` (0-based);
- ``"random"``: k distinct parents uniform on ``{1..i−1}``, drawn once from ``data.graph_seed``
  (their notebook's commented-out graph), the target's too;
- an explicit list of ``L + 1`` parent lists, ``[]`` for a root, the last the target's.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._priors import prior_of
from ._stationary import stationary_distribution

KINDS: dict[str, type] = {}
GRAPHS = ("chain", "icl", "random")
# the options each kind reads beyond d, alpha, L, prior, parents (and their defaults)
KIND_OPTIONS = {"graph": "chain", "graph_seed": 0, "graph_parents": 1, "triggers": 0, "trigger_mode": "fixed",
                "bigram_seed": 0}  # fmt: skip
TRIGGER_MODES = ("fixed", "random")
# the graphs of k >= 2 parents per position (``"heap"``: k = 2 only)
DAGS = ("chain", "heap", "random")


def _register(cls):
    KINDS[cls.name] = cls
    return cls


def kind_of(data) -> AbstractDataKind:
    """The data family's member of the configuration `data` (its ``data.kind``)."""
    return KINDS[data.kind]()


class AbstractDataKind(eqx.Module):
    """A member of the data family (module docstring)."""

    name: ClassVar[str]
    # the DataConfig options (of KIND_OPTIONS) this kind reads; the others must stay default
    options: ClassVar[tuple[str, ...]]
    # whether the paper's laws (Ĩ, the ranking it implies, the asymptotic rows) are derived for this
    # data; J, the GIH law and the ladder are computed on any kind's sample as finite-size laws
    has_laws: ClassVar[bool]
    # whether grid points differing in L or burn_in read one chain (the sample bank of gflow.runs)
    shares_chain: ClassVar[bool]

    @abc.abstractmethod
    def check(self, data) -> None:
        """``ValueError`` naming the key when `data` is not a valid configuration of this kind."""

    @abc.abstractmethod
    def draw(self, data, N: int, key, dtype):
        """``N`` sequences ``(X, y, zq, cond, pi)`` (the fields of :class:`gflow.core.Sample`), or
        ``None``: the n-gram chain's sampler of :func:`gflow.core.sample` draws them."""

    @abc.abstractmethod
    def bayes_counts(self, data, X):
        """The counts ``n(e)`` of the Bayes rung's Dirichlet predictive ``(n + α)/(Σn + dα)``,
        ``(N, d)``, from the context tokens ``X`` ``(N, L)`` (``None``: the n-gram rule of
        the loss ladder, which also reads the feature layouts)."""

    @abc.abstractmethod
    def bayes_exact(self, data) -> bool:
        """Whether the Bayes rung is the exact posterior predictive of this data."""

    @abc.abstractmethod
    def every_position(self, data, X, y, pi):
        """The target of every position ``t = 1..L`` (predicting ``x_{t+1}``; ``x_{L+1} = y``) for
        ``estimator.positions = "all"``: ``(cond, valid)``, ``cond`` ``(N, L, d)`` the law of
        ``x_{t+1}`` given the context, ``valid`` ``(L,)`` bool, the positions whose loss is taken;
        ``ValueError`` when this kind takes its loss at the query only."""

    @abc.abstractmethod
    def bayes_every(self, data, X, pi):
        """The Bayes rung's predictive at every position ``t = 1..L`` (of ``x_{t+1}`` from
        ``x_1..x_t``), ``(N, L, d)``, when this kind has its own (not a Dirichlet predictive of
        counts), else ``None``."""

    @abc.abstractmethod
    def output_positions(self, data, X, pi):
        """The positions whose loss ``estimator.positions = "outputs"`` takes, ``(N, L)`` bool;
        ``ValueError`` when this kind has no output tokens."""

    def check_options(self, data) -> None:
        """Refuse an option of another kind (final)."""
        for name, default in KIND_OPTIONS.items():
            if name not in self.options and getattr(data, name) != default:
                users = tuple(k for k, c in KINDS.items() if name in c.options)
                raise ValueError(f"data.{name} is an option of data.kind in {users}, not of data.kind = "
                                 f"{self.name!r} (leave it at its default {default!r})")  # fmt: skip


@_register
class NgramKind(AbstractDataKind):
    """The paper's mixture of n-gram Markov chains (the default kind)."""

    name: ClassVar[str] = "ngram"
    options: ClassVar[tuple[str, ...]] = ()
    has_laws: ClassVar[bool] = True
    shares_chain: ClassVar[bool] = True

    def check(self, data) -> None:
        return None

    def draw(self, data, N, key, dtype):
        return None

    def bayes_counts(self, data, X):
        return None

    def bayes_exact(self, data) -> bool:
        return data.kernel is None and prior_of(data).bayes_exact(data)

    def bayes_every(self, data, X, pi):
        return None

    def output_positions(self, data, X, pi):
        raise _no_outputs(self.name)

    def every_position(self, data, X, y, pi):
        """Position t's target is ``π(·|z_{t+1})``, the row of x_{t+1}'s parents
        ``x_{t+1−p}``; the positions whose next token has every parent in the context
        (``t ≥ max(parents)``) take the loss."""
        return ngram_every_position(data, X, y, pi)


def graph_parents(data) -> np.ndarray:
    """The parent of every context position ``1..L−1``, ``(L−1,)`` int (1-based, 0 for a root), of
    the one-parent graph ``data.graph`` (module docstring; k parents: :func:`graph_parent_sets`)."""
    if data.graph_parents != 1:
        raise ValueError(f"graph_parents reads a one-parent graph; data.graph_parents = {data.graph_parents}: "
                         f"use graph_parent_sets")  # fmt: skip
    g, n = data.graph, data.L - 1
    if isinstance(g, tuple):
        return np.asarray(g, np.int64)
    i = np.arange(1, n + 1)
    if g == "chain":
        return i - 1
    if g == "icl":
        return np.where(i % 2 == 0, i - 1, 0)
    rng = np.random.default_rng(int(data.graph_seed))  # "random": p(i) uniform on {0 (root), 1..i−1}
    return np.array([rng.integers(0, k) for k in i], np.int64)


def graph_parent_sets(data) -> np.ndarray:
    """The k parents of every position ``1..L+1`` of the k-parent graph ``data.graph`` (``data.
    graph_parents = k >= 2``; the last row the target's), ``(L+1, k)`` int, 1-based, nearest first,
    a row of zeros for a root (module docstring)."""
    return dag_parent_sets(data.graph, int(data.graph_parents), data.L, int(data.graph_seed))


def dag_parent_sets(graph, k: int, L: int, seed: int = 0) -> np.ndarray:
    """:func:`graph_parent_sets` from the graph's options (``data.graph``, ``data.graph_parents``,
    ``data.L``, ``data.graph_seed``): ``(L+1, k)``; its last row gives the ``data.parents`` a
    configuration must state, ``L + 1 − p``."""
    g, n = graph, L + 1
    out = np.zeros((n, k), np.int64)
    if not isinstance(g, str):
        for i, ps in enumerate(g):
            out[i, : len(ps)] = sorted(ps, reverse=True)
        return out
    rng = np.random.default_rng(seed)
    for i in range(k + 1, n + 1):  # positions i <= k are roots
        if g == "chain":
            ps = range(i - 1, i - k - 1, -1)
        elif g == "heap":
            ps = (i - 1, i // 2)
        else:  # "random": k distinct parents uniform on 1..i−1
            ps = 1 + rng.choice(i - 1, size=k, replace=False)
        out[i - 1] = sorted(ps, reverse=True)
    return out


def _check_dag(data) -> None:
    """The k-parent graph's checks (:meth:`GraphKind.check`, ``data.graph_parents >= 2``)."""
    g, k, L = data.graph, int(data.graph_parents), data.L
    if L < k + 1:
        raise ValueError(f"data.graph_parents = {k} needs data.L >= {k + 1} (positions 1..k are roots), got {L}")
    if isinstance(g, str):
        if g not in DAGS:
            raise ValueError(f"data.graph with data.graph_parents = {k} must be one of {DAGS} or a list of data.L + 1 "
                             f"parent lists, got {g!r}")  # fmt: skip
        if g == "heap" and k != 2:
            raise ValueError(f"data.graph = 'heap' has two parents per position (i − 1 and ⌊i/2⌋): "
                             f"data.graph_parents must be 2, got {k}")  # fmt: skip
    else:
        if len(g) != L + 1 or any(isinstance(x, int) for x in g):
            raise ValueError(f"data.graph as a list with data.graph_parents = {k} holds the parent list of positions "
                             f"1..L+1 (the last the target's, [] for a root): {L + 1} lists for data.L = {L}")  # fmt: skip
        for i, ps in enumerate(g, start=1):
            if len(ps) not in (0, k) or len(set(ps)) != len(ps) or not all(1 <= p < i for p in ps):
                raise ValueError(f"data.graph: position {i}'s parents must be [] (a root) or {k} distinct positions "
                                 f"before it (1 <= p < {i}), got {list(ps)}")  # fmt: skip
        if len(g[-1]) == 0:
            raise ValueError("data.graph: the target's (last) entry must list its parents, got []")
    want = tuple(int(L + 1 - p) for p in graph_parent_sets(data)[-1])  # nearest parent first
    if data.parents != want:
        raise ValueError(f"data.parents must be the target's parent offsets L + 1 − p(L+1) of data.graph = "
                         f"{g if isinstance(g, str) else 'the list'}: {list(want)}, got {list(data.parents)}")  # fmt: skip


@_register
class GraphKind(AbstractDataKind):
    """Nichani, Damian and Lee's in-context causal graph (module docstring)."""

    name: ClassVar[str] = "graph"
    options: ClassVar[tuple[str, ...]] = ("graph", "graph_seed", "graph_parents")
    has_laws: ClassVar[bool] = False
    shares_chain: ClassVar[bool] = False

    def check(self, data) -> None:
        k = data.graph_parents
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"data.graph_parents must be an integer >= 1, got {k!r}")
        if data.kernel is not None:
            raise ValueError("data.kernel is an option of data.kind = 'ngram', not of data.kind = 'graph'")
        if data.start != "stationary" or data.burn_in != 0:
            raise ValueError("data.start and data.burn_in are options of data.kind = 'ngram' (a graph's roots are "
                             "drawn from the stationary law): leave them at 'stationary' and 0")  # fmt: skip
        if not isinstance(data.graph_seed, (int, np.integer)) or isinstance(data.graph_seed, bool):
            raise ValueError(f"data.graph_seed must be an integer, got {data.graph_seed!r}")
        if k > 1:
            return _check_dag(data)
        if data.parents != (1,):
            raise ValueError(f"data.kind = 'graph' predicts the successor of the query x_L, whose parent is the query "
                             f"itself: data.parents must be [1], got {list(data.parents)}")  # fmt: skip
        if data.L < 2:
            raise ValueError(f"data.kind = 'graph' needs data.L >= 2 (positions 1..L−1 and the query), got {data.L}")
        g = data.graph
        if isinstance(g, str):
            if g not in GRAPHS:
                raise ValueError(f"data.graph must be one of {GRAPHS} or a list of data.L − 1 parent positions, "
                                 f"got {g!r}")  # fmt: skip
        else:
            if len(g) != data.L - 1 or not all(isinstance(p, (int, np.integer)) for p in g):
                raise ValueError(f"data.graph as a list holds the parent of positions 1..L−1 (position L is the query, "
                                 f"drawn uniformly): {data.L - 1} entries for data.L = {data.L}, got {len(g)}")  # fmt: skip
            bad = [(i + 1, p) for i, p in enumerate(g) if not 0 <= p < i + 1]
            if bad:
                i, p = bad[0]
                raise ValueError(f"data.graph: position {i}'s parent must be a position before it (0 <= p(i) < i, 0 "
                                 f"for a root), got p({i}) = {p}")  # fmt: skip

    def draw(self, data, N, key, dtype):
        if data.graph_parents > 1:
            return _dag_draw(data, int(N), key, dtype)
        return _graph_draw(data, int(N), key, dtype)

    def bayes_counts(self, data, X):
        """``n(e) = #{i ≤ L−1 : p(i) ≠ 0, x_{p(i)} = x_L, x_i = e}`` (the repository's ``bayes``; every
        position ``i ≤ L−1`` for the unigram prior, whose rows are one). With k parents,
        ``n(e) = #{i ≤ L : i not a root, x_{p(i)} = x_{p(L+1)}, x_i = e}``, the parents' tokens
        compared as tuples (every non-root position for the unigram prior)."""
        X = jnp.asarray(X)
        if data.graph_parents > 1:
            ps = graph_parent_sets(data)
            onehot = jax.nn.one_hot(X, data.d, dtype=jnp.float64)  # (N, L, d)
            root = ps[: data.L, 0] == 0
            hit = jnp.broadcast_to(~root, X.shape)
            if data.prior != "unigram":
                own = X[:, np.maximum(ps[: data.L], 1) - 1]  # (N, L, k) the parents' tokens
                hit = hit & jnp.all(own == X[:, ps[-1] - 1][:, None, :], axis=-1)
            return jnp.einsum("nl,nld->nd", hit.astype(jnp.float64), onehot)
        par = graph_parents(data)
        child = X[:, : data.L - 1]
        onehot = jax.nn.one_hot(child, data.d, dtype=jnp.float64)  # (N, L−1, d)
        if data.prior == "unigram":
            return onehot.sum(1)
        hit = (par > 0)[None, :] & (X[:, np.maximum(par, 1) - 1] == X[:, -1:])  # (N, L−1)
        return jnp.einsum("nl,nld->nd", hit.astype(jnp.float64), onehot)

    def bayes_exact(self, data) -> bool:
        # one parent: the roots are drawn from π's stationary law, which the predictive ignores; k
        # parents: the roots are uniform, the rows independent, every transition counted
        return data.graph_parents > 1 and data.prior in ("dirichlet", "unigram")

    def bayes_every(self, data, X, pi):
        return None

    def output_positions(self, data, X, pi):
        raise _no_outputs(self.name)

    def every_position(self, data, X, y, pi):
        raise ValueError("estimator.positions = 'all' is not defined for data.kind = 'graph': the task predicts the "
                         "query's successor only (their loss is at the last position); use estimator.positions = "
                         "'last'")  # fmt: skip


def _no_outputs(name: str) -> ValueError:
    return ValueError(f"estimator.positions = 'outputs' takes the loss at the triggers' output tokens: it needs "
                      f"data.kind = 'triggers', got data.kind = {name!r}")  # fmt: skip


def trigger_bigram(data) -> np.ndarray:
    """The global bigram π_b of ``data.kind = "triggers"``, ``(d, d)`` float64: rows
    ``Dirichlet(α·1_d)`` drawn once from ``numpy.random.default_rng(data.bigram_seed)``."""
    rng = np.random.default_rng(int(data.bigram_seed))
    return rng.dirichlet(np.full(data.d, float(data.alpha)), size=data.d)


def trigger_stationary(data) -> np.ndarray:
    """The stationary law of :func:`trigger_bigram`, ``(d,)`` (the first token's law, and the law
    the triggers are drawn from)."""
    return np.asarray(stationary_distribution(jnp.asarray(trigger_bigram(data))), np.float64)


def fixed_triggers(data) -> np.ndarray:
    """``data.trigger_mode = "fixed"``: the ``data.triggers`` most probable tokens under π_b's
    stationary law, most probable first, ``(K,)`` int."""
    return np.argsort(-trigger_stationary(data), kind="stable")[: int(data.triggers)]


def trigger_rows(data, pi) -> jnp.ndarray:
    """Which tokens are a sequence's triggers, ``(N, d)`` bool: the rows of its kernel ``pi``
    ``(N, d, d)`` that differ from π_b (a trigger's row is its output's one-hot vector)."""
    return jnp.any(jnp.asarray(pi) != jnp.asarray(trigger_bigram(data))[None], axis=-1)


def at_trigger(data, X, pi) -> jnp.ndarray:
    """Whether each position's token is one of its sequence's triggers, ``(N, L)`` bool, from the
    tokens ``X`` ``(N, L)`` and the kernels ``pi`` (:func:`trigger_rows`)."""
    return jnp.take_along_axis(trigger_rows(data, pi), jnp.asarray(X), axis=1)


@_register
class TriggersKind(AbstractDataKind):
    """Bietti et al.'s triggers (their ``ihead_data.py``, with a seeded synthetic bigram in place of
    Tiny Shakespeare's): a global bigram π_b (:func:`trigger_bigram`), K triggers per sequence
    (``data.trigger_mode``), each trigger ``q_k`` with an output ``o_k`` uniform on ``[d]`` drawn
    per sequence (their default: the output may equal a trigger or another output); ``x_1`` from
    π_b's stationary law, then ``x_{t+1} = o_k`` after ``x_t = q_k``, else ``x_{t+1} ~ π_b(·|x_t)``.
    Each sequence is a Markov chain whose kernel is π_b with the triggers' rows replaced by their
    outputs' one-hot vectors: that kernel is the sample's ``pi`` ``(N, d, d)``, the target of
    position t is its row of ``x_t`` (``data.parents = [1]``).

    **Bayes**: with fixed triggers the posterior predictive of ``x_{t+1}`` is exact and simple: the
    output seen after an earlier occurrence of the trigger ``x_t``; uniform at a trigger's first
    occurrence (its output is uniform and nothing before reveals it); ``π_b(·|x_t)`` after any other
    token. With random triggers the same predictive knows the sequence's trigger set, which the
    Bayes predictor would infer: the rung is then an oracle on the set (``bayes_exact`` false).
    K is at most ``d // 2`` (the triggers and the tokens that are not triggers both span at least
    half the vocabulary)."""

    name: ClassVar[str] = "triggers"
    options: ClassVar[tuple[str, ...]] = ("triggers", "trigger_mode", "bigram_seed")
    has_laws: ClassVar[bool] = False
    shares_chain: ClassVar[bool] = False

    def check(self, data) -> None:
        K = data.triggers
        if not isinstance(K, (int, np.integer)) or isinstance(K, bool) or not 1 <= K <= data.d // 2:
            raise ValueError(f"data.triggers must be an integer in [1, d // 2 = {data.d // 2}] for data.kind = "
                             f"'triggers' (the number of trigger tokens per sequence), got {K!r}")  # fmt: skip
        if data.trigger_mode not in TRIGGER_MODES:
            raise ValueError(f"data.trigger_mode must be one of {TRIGGER_MODES}, got {data.trigger_mode!r}")
        if not isinstance(data.bigram_seed, (int, np.integer)) or isinstance(data.bigram_seed, bool):
            raise ValueError(f"data.bigram_seed must be an integer, got {data.bigram_seed!r}")
        if data.parents != (1,):
            raise ValueError(f"data.kind = 'triggers' is a Markov chain on the previous token: data.parents must be "
                             f"[1], got {list(data.parents)}")  # fmt: skip
        if data.kernel is not None:
            raise ValueError("data.kernel is an option of data.kind = 'ngram', not of data.kind = 'triggers' (the "
                             "global bigram is drawn from data.bigram_seed)")  # fmt: skip
        if data.start != "stationary" or data.burn_in != 0:
            raise ValueError("data.start and data.burn_in are options of data.kind = 'ngram' (the first token of a "
                             "triggers sequence is drawn from the bigram's stationary law): leave them at "
                             "'stationary' and 0")  # fmt: skip
        if data.prior != "dirichlet":
            raise ValueError(f"data.prior is an option of data.kind in ('ngram', 'graph'): the triggers' global "
                             f"bigram has Dirichlet(alpha) rows; leave data.prior at 'dirichlet', got "
                             f"{data.prior!r}")  # fmt: skip
        if data.L < 2:
            raise ValueError(f"data.kind = 'triggers' needs data.L >= 2, got {data.L}")

    def draw(self, data, N, key, dtype):
        fixed = jnp.asarray(fixed_triggers(data)) if data.trigger_mode == "fixed" else None
        return _triggers_draw(data, int(N), key, dtype, jnp.asarray(trigger_bigram(data), dtype),
                              jnp.asarray(trigger_stationary(data), dtype), fixed)  # fmt: skip

    def bayes_counts(self, data, X):
        return None

    def bayes_exact(self, data) -> bool:
        return data.trigger_mode == "fixed"

    def bayes_every(self, data, X, pi):
        if pi is None:
            raise ValueError("the Bayes rung of data.kind = 'triggers' needs the sample's kernels (its triggers): "
                             "pass sample= or estimator=")  # fmt: skip
        X, pi = jnp.asarray(X), jnp.asarray(pi)
        d = data.d
        trig = at_trigger(data, X, pi)
        seen = _seen_before(X, d)
        rows = jnp.take_along_axis(pi, X[:, :, None], axis=1)  # (N, L, d): the kernel's row of x_t
        glob = jnp.asarray(trigger_bigram(data))[X]
        return jnp.where((trig & seen)[..., None], rows, jnp.where(trig[..., None], 1.0 / d, glob))

    def output_positions(self, data, X, pi):
        """The positions t where ``x_t`` is a trigger that occurred before (so its output is in the
        context): their ``outs >= 2``, the output tokens from their second occurrence on."""
        return at_trigger(data, X, pi) & _seen_before(jnp.asarray(X), data.d)

    def every_position(self, data, X, y, pi):
        return ngram_every_position(data, X, y, pi)


def _seen_before(X, d: int):
    """``(N, L)`` bool: ``x_t`` occurs at some position ``s < t``."""
    E = jax.nn.one_hot(X, d, dtype=jnp.int32)
    before = jnp.cumsum(E, axis=1) - E
    return jnp.take_along_axis(before, X[:, :, None], axis=2)[..., 0] > 0


@eqx.filter_jit
def _triggers_draw(data, N: int, key, dtype, pib, mu, fixed):
    """:class:`TriggersKind`'s sampler: ``(X, y, zq, cond, pi)`` (π_b, its stationary law and the
    fixed triggers computed outside, in numpy)."""
    d, L, K = data.d, data.L, int(data.triggers)
    ktrig, kout, kseq = jax.random.split(key, 3)
    if data.trigger_mode == "fixed":
        q = jnp.broadcast_to(fixed, (N, K))
    else:  # K distinct tokens from μ_b without replacement: the top K of log μ + Gumbel noise
        g = jnp.log(mu)[None] + jax.random.gumbel(ktrig, (N, d), dtype)
        q = jax.lax.top_k(g, K)[1]
    o = jax.random.randint(kout, (N, K), 0, d)
    rows = jnp.arange(N)[:, None]
    pi = jnp.broadcast_to(pib, (N, d, d)).at[rows, q].set(jax.nn.one_hot(o, d, dtype=dtype))
    u = jax.random.uniform(kseq, (L + 1, N), dtype=dtype)
    x1 = _inverse_draw(jnp.broadcast_to(mu, (N, d)), u[0])
    n = jnp.arange(N)

    def step(x, ut):
        nxt = _inverse_draw(pi[n, x], ut)
        return nxt, nxt

    _, rest = jax.lax.scan(step, x1, u[1:])  # x_2..x_{L+1}
    X = jnp.concatenate([x1[None], rest[:-1]], axis=0).T.astype(jnp.int32)
    y = rest[-1]
    q_last = X[:, -1]
    return X, y, q_last.astype(jnp.int64 if jax.config.jax_enable_x64 else jnp.int32), pi[n, q_last], pi


def config_codes(full, offsets, d: int):
    """The configuration code of every token of ``full`` ``(N, n)`` (0-based index i):
    ``Σ_k x_{i−o_k} d^{K−1−k}`` over the `offsets` (the first most significant, as ``z_q``'s),
    ``(N, n)``, numpy or JAX as ``full``; an offset before the sequence reads ``x_0`` (the caller
    masks those indices, ``i < max(offsets)``)."""
    i = np.arange(full.shape[1])
    zw = d ** np.arange(len(offsets) - 1, -1, -1)
    return sum(full[:, np.maximum(i - o, 0)] * int(w) for o, w in zip(offsets, zw))


def ngram_every_position(data, X, y, pi):
    """:meth:`NgramKind.every_position`: ``(cond (N, L, d), valid (L,))``."""
    full = jnp.concatenate([jnp.asarray(X), jnp.asarray(y)[:, None].astype(X.dtype)], axis=1)  # x_1..x_{L+1}
    codes = config_codes(full, data.parents, data.d)[:, 1:]  # position t predicts x_{t+1}, index t of `full`
    cond = jnp.take_along_axis(jnp.asarray(pi), codes[:, :, None], axis=1)  # (N, L, d)
    return cond, np.arange(1, data.L + 1) >= max(data.parents)


def _inverse_draw(p, u):
    """One token per row of the laws `p` ``(N, d)`` from uniforms `u` ``(N,)`` by inversion:
    ``#{e < d−1 : u ≥ F(e)}`` (the graph samplers')."""
    return jnp.sum(u[:, None] >= jnp.cumsum(p, axis=-1)[:, :-1], axis=-1).astype(jnp.int32)


@eqx.filter_jit
def _graph_draw(data, N: int, key, dtype):
    d, L = data.d, data.L
    kpi, kseq, kq, ky = jax.random.split(key, 4)
    dirichlet = lambda shape: jax.random.dirichlet(kpi, jnp.full(shape, data.alpha, dtype), dtype=dtype)
    pi = prior_of(data).kernels(dirichlet, (N, d, d))  # one parent: a (d, d) kernel per sequence
    mu = jax.vmap(stationary_distribution)(pi)  # (N, d)
    par = jnp.asarray(graph_parents(data))
    u = jax.random.uniform(kseq, (L - 1, N), dtype=dtype)
    rows = jnp.arange(N)

    def step(X, i):
        parent_tok = X[:, jnp.maximum(par[i], 1) - 1]
        p = jnp.where(par[i] > 0, pi[rows, parent_tok], mu)
        return X.at[:, i].set(_inverse_draw(p, u[i])), None

    X0 = jnp.zeros((N, L), jnp.int32).at[:, L - 1].set(jax.random.randint(kq, (N,), 0, d, dtype=jnp.int32))
    X, _ = jax.lax.scan(step, X0, jnp.arange(L - 1))
    q = X[:, L - 1]
    cond = pi[rows, q]
    y = _inverse_draw(cond, jax.random.uniform(ky, (N,), dtype=dtype))
    return X, y, q.astype(jnp.int64 if jax.config.jax_enable_x64 else jnp.int32), cond, pi


@eqx.filter_jit
def _dag_draw(data, N: int, key, dtype):
    """The k-parent graph's sampler (module docstring): ``(X, y, zq, cond, pi)``."""
    d, L, k = data.d, data.L, int(data.graph_parents)
    kpi, kseq = jax.random.split(key)
    dirichlet = lambda shape: jax.random.dirichlet(kpi, jnp.full(shape, data.alpha, dtype), dtype=dtype)
    pi = prior_of(data).kernels(dirichlet, (N, d**k, d))
    ps = graph_parent_sets(data)  # (L+1, k)
    zw = jnp.asarray(d ** np.arange(k - 1, -1, -1))
    u = jax.random.uniform(kseq, (L + 1, N), dtype=dtype)
    rows = jnp.arange(N)
    par, root = jnp.asarray(np.maximum(ps, 1) - 1), jnp.asarray(ps[:, 0] == 0)

    def law(X, i):
        code = X[:, par[i]] @ zw  # the parents' configuration
        return jnp.where(root[i], jnp.full((N, d), 1.0 / d, dtype), pi[rows, code]), code

    def step(X, i):
        p, _ = law(X, i)
        return X.at[:, i].set(_inverse_draw(p, u[i])), None

    X, _ = jax.lax.scan(step, jnp.zeros((N, L + 1), jnp.int32), jnp.arange(L))
    cond, code = law(X, L)
    y = _inverse_draw(cond, u[L])
    return X[:, :L], y, code.astype(jnp.int64 if jax.config.jax_enable_x64 else jnp.int32), cond, pi
