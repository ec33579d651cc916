"""The information between positions of an in-context causal graph (``data.kind = "graph"``):
the χ²-mutual information between ``x_i`` and ``x_j`` under the prior, whose order along a row
Nichani et al.'s first-layer gradient follows at the start (the data-processing inequality makes
the parent the most informative earlier position)."""

from __future__ import annotations

import jax
import numpy as np

from ..core import DataConfig, graph_parents, prior_of

__all__ = ["graph_chi2_mi"]


def _ancestors(par: np.ndarray, i: int) -> dict[int, int]:
    """``{ancestor position: its distance}`` of position i (1-based), i itself at distance 0."""
    out, k, dist = {}, i, 0
    while True:
        out[k] = dist
        if par[k - 1] == 0:
            return out
        k, dist = int(par[k - 1]), dist + 1


def graph_chi2_mi(data: DataConfig, *, n_pi: int = 500, seed: int = 0) -> np.ndarray:
    """``I[i, j] = E_π[χ²(P_ij ‖ μ ⊗ μ)]`` for the context positions ``j < i < L`` (0-based
    indices, ``(L−1, L−1)``, 0 on and above the diagonal), averaged over `n_pi` kernels of the
    prior (key ``jax.random.key(seed)``): ``P_ij(a, b) = Σ_c μ(c) πᵐ(c, a) πⁿ(c, b)`` through the
    nearest common ancestor c at distances m (to j) and n (to i), every position's marginal the
    stationary law μ; positions without a common ancestor are independent (0).
    ``χ²(P ‖ μ⊗μ) = Σ_{a,b} P(a,b)²/(μ(a)μ(b)) − 1``."""
    if data.kind != "graph":
        raise ValueError(f"graph_chi2_mi needs data.kind = 'graph', got data.kind = {data.kind!r}")
    if data.graph_parents != 1:
        raise ValueError(f"graph_chi2_mi is derived for one parent per position (a tree of common ancestors), got "
                         f"data.graph_parents = {data.graph_parents}")  # fmt: skip
    d, n = data.d, data.L - 1
    par = graph_parents(data)
    key = jax.random.key(seed)
    dirichlet = lambda shape: jax.random.dirichlet(key, np.full(shape, data.alpha), dtype=np.float64)
    pis = np.asarray(prior_of(data).kernels(dirichlet, (n_pi, d, d)), np.float64)
    anc = [_ancestors(par, i) for i in range(1, n + 1)]
    pairs = {}
    for i in range(1, n + 1):
        for j in range(1, i):
            common = [c for c in anc[j - 1] if c in anc[i - 1]]
            if common:
                c = max(common)  # the nearest common ancestor: the latest position among the common ones
                pairs[(i, j)] = (anc[j - 1][c], anc[i - 1][c])
    out = np.zeros((n, n))
    if not pairs:
        return out
    total = np.zeros((n, n))
    for P in pis:
        w, v = np.linalg.eig(P.T)
        mu = np.real(v[:, np.argmin(np.abs(w - 1))])
        mu = mu / mu.sum()
        powers = {0: np.eye(d)}
        for (i, j), (m, k) in pairs.items():
            for e in (m, k):
                if e not in powers:
                    powers[e] = np.linalg.matrix_power(P, e)
            joint = (mu[:, None] * powers[m]).T @ powers[k]  # (a, b): Σ_c μ(c) Pᵐ(c, a) Pᵏ(c, b)
            total[i - 1, j - 1] += np.sum(joint**2 / np.outer(mu, mu)) - 1.0
    return total / len(pis)
