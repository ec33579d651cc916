"""The priors of the n-gram mixture's kernels (``data.prior``; docs/theory/mathematics.md §M1): a
small family, one final class per prior, looked up by :func:`prior_of`. Every sampler of gflow draws
its kernels through it (the flow's fixed sample, online SGD's fresh batches and the Ĩ average), and
the loss ladder asks it for its Bayes rung.

- ``"dirichlet"`` (the paper's, the default): independent ``Dirichlet(α·1_d)`` rows, one per parent
  configuration.
- ``"doubly_stochastic"`` (Edelman et al.'s variant, extension): ``Dirichlet(α·1_d)`` rows balanced
  by Sinkhorn's iteration (columns, then rows, normalised in turn until every column sum is 1 to
  1e-12), so that the stationary law is uniform and the in-context unigram statistics carry no
  information about π. One parent only (a bigram kernel is a square matrix), and α ≥ 0.3 (below,
  Dirichlet rows have entries so small that the iteration does not converge in time). Their code balances
  Dirichlet(1) rows the same way for d ≥ 6 and samples the Birkhoff polytope uniformly by
  rejection below; the two laws share their support and the uniform stationary law, not their
  density.
- ``"unigram"`` (Edelman et al.'s variant, extension): one row ``ρ ~ Dirichlet(α·1_d)`` shared by
  every parent configuration: the tokens are i.i.d. ``ρ`` and no parent carries information.
- a fixed kernel (``data.kernel``, a point-mass prior) takes precedence over all three.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

PRIORS: dict[str, type] = {}
#: the smallest α the doubly stochastic prior takes (:meth:`DoublyStochasticPrior.refusal`)
MIN_BALANCED_ALPHA = 0.3


def _register(cls):
    PRIORS[cls.name] = cls
    return cls


class AbstractPrior(eqx.Module):
    """What a prior provides: its kernels, by the flow's sampler and by online SGD's, and the
    offsets its Bayes predictive conditions on."""

    name: ClassVar[str]
    label: ClassVar[str]  # what the theory's text calls it: "{label}(alpha=…)"

    @abc.abstractmethod
    def kernels(self, dirichlet, shape: tuple[int, int, int]):
        """``(N, K, d)`` kernels from ``dirichlet(shape)``, i.i.d. ``Dirichlet(α·1_d)`` rows of the
        requested shape ``(n, k, d)`` (the flow's and online SGD's samplers pass their own)."""

    @abc.abstractmethod
    def bayes_offsets(self, parents: tuple[int, ...]) -> tuple[int, ...]:
        """The offsets whose context the add-α predictive ``(n(z, e) + α)/(n(z) + dα)`` counts on:
        it is the exact posterior predictive for the Dirichlet and unigram priors."""

    @abc.abstractmethod
    def refusal(self, parents: tuple[int, ...], alpha: float) -> str | None:
        """Why this prior cannot draw kernels for these parent offsets and concentration, or ``None``."""

    @abc.abstractmethod
    def bayes_exact(self, data) -> bool:
        """Whether the add-α predictive on :meth:`bayes_offsets` is the exact posterior predictive of
        the data `data` describes (its start law and burn-in included)."""


@_register
class DirichletPrior(AbstractPrior):
    """Independent ``Dirichlet(α·1_d)`` rows (the paper's prior)."""

    name: ClassVar[str] = "dirichlet"
    label: ClassVar[str] = "Dirichlet"

    def kernels(self, dirichlet, shape):
        return dirichlet(shape)

    def bayes_offsets(self, parents):
        return tuple(parents)

    def refusal(self, parents, alpha):
        return None

    def bayes_exact(self, data):
        # a uniform start carries no information about π and every transition is counted; a
        # stationary start's first tokens do carry some, which the counts leave out
        return data.start == "uniform" and data.burn_in == 0


@_register
class DoublyStochasticPrior(AbstractPrior):
    """``Dirichlet(α·1_d)`` rows balanced by Sinkhorn's iteration to a doubly stochastic matrix
    (one parent: ``K = d``)."""

    name: ClassVar[str] = "doubly_stochastic"
    label: ClassVar[str] = "doubly stochastic Dirichlet"

    def kernels(self, dirichlet, shape):
        return sinkhorn(dirichlet(shape))

    def bayes_offsets(self, parents):
        return tuple(parents)

    def refusal(self, parents, alpha):
        if len(parents) != 1:
            return (f"data.prior = 'doubly_stochastic' balances a square (bigram) kernel: it needs one parent, "
                    f"data.parents = [p], got data.parents = {list(parents)}")
        if float(alpha) < MIN_BALANCED_ALPHA:
            # measured at d = 3: at α = 0.1, 212 of 2,000 draws were not balanced to 1e-12 in 100,000
            # iterations (entries near 1e-25 leave the matrix almost without total support); at
            # α = 0.3 every draw was
            return (f"data.prior = 'doubly_stochastic' needs data.alpha >= {MIN_BALANCED_ALPHA} (Sinkhorn's "
                    f"balancing of Dirichlet rows does not converge in time below), got data.alpha = {alpha!r}")
        return None

    def bayes_exact(self, data):
        return False  # the posterior under the balanced law has no closed form


@_register
class UnigramPrior(AbstractPrior):
    """One row ``ρ ~ Dirichlet(α·1_d)`` shared by every parent configuration."""

    name: ClassVar[str] = "unigram"
    label: ClassVar[str] = "unigram Dirichlet"

    def kernels(self, dirichlet, shape):
        N, K, d = shape
        return jnp.broadcast_to(dirichlet((N, 1, d)), shape)

    def bayes_offsets(self, parents):
        return ()  # every token counts, whatever its context

    def refusal(self, parents, alpha):
        return None

    def bayes_exact(self, data):
        # every token is i.i.d. ρ when the start is stationary (ρ itself); a uniform start's first
        # p_k tokens are not ρ's, yet the counts include them
        return data.start == "stationary"


def sinkhorn(P, *, tol: float = 1e-12, max_iter: int = 100_000):
    """Sinkhorn–Knopp balancing of the square matrices ``P`` ``(..., d, d)`` with positive entries:
    columns then rows normalised in turn until every column sum is within `tol` of 1 (the rows sum
    to 1 after the last step). Converges for positive matrices (Sinkhorn 1964); Dirichlet rows with a
    small α have entries near 0 and need more iterations, never more than `max_iter`."""

    def cond(s):
        i, Q = s
        return (i < max_iter) & (jnp.max(jnp.abs(Q.sum(-2) - 1.0)) > tol)

    def body(s):
        i, Q = s
        Q = Q / Q.sum(-2, keepdims=True)
        return i + 1, Q / Q.sum(-1, keepdims=True)

    i, Q = jax.lax.while_loop(cond, body, (0, P))
    # never an unbalanced kernel handed on as a balanced one
    return eqx.error_if(Q, jnp.max(jnp.abs(Q.sum(-2) - 1.0)) > tol,
                        f"sinkhorn: not balanced to {tol:g} in {max_iter} iterations")  # fmt: skip


def prior_of(data) -> AbstractPrior:
    """The prior `data` (a :class:`gflow.DataConfig`) names, an instance of its final class."""
    return PRIORS[data.prior]()
