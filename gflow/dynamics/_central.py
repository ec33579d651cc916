"""The central flow: what gradient descent at a step η follows on average once it reaches the edge
of stability (docs/theory/central-flow.md).

GD ``θ_{k+1} = θ_k − η Λ ∇L̂(θ_k)`` on the clock ``t = kη`` follows the gradient flow while every
eigenvalue of ``ΛH`` stays below ``2/η``. When one reaches it, GD oscillates along its eigenvector
and the oscillation's average effect on the gradient, ``½ ∇⟨Σ, H(θ)⟩``, holds the eigenvalue at
the edge. With ``P = Λ^{1/2} H Λ^{1/2} = Σ λ_i v_i v_iᵀ`` and ``u_i = Λ^{1/2} v_i`` for the
``k`` eigenvalues at the edge, the central flow is

    dθ/dt = −Λ [∇L̂ + ½ Σ_ij X_ij ∇S_ij],     S_ij(θ) = u_iᵀ H(θ) u_j   (u held fixed),

where the symmetric ``k × k`` matrix ``X ⪰ 0`` solves the complementarity problem

    X ⪰ 0,   M(X) = A + ½ B[X] ⪰ 0,   ⟨X, M(X)⟩ = 0,
    A_ij = ∇S_ijᵀ Λ ∇L̂ + κ (2/η − λ_i) δ_ij,   B[X]_ij = Σ_kl ∇S_ijᵀ Λ ∇S_kl X_kl,

``M`` being the rate at which the gaps ``2/η I − UᵀHU`` grow (plus the restoring term below):
the eigenvalues at the edge never cross it, and X is zero on any direction that leaves it. For
one eigenvalue it is the closed form ``X = max(0, −2 A/B)``; for several the problem is the
optimality condition of ``min_{X ⪰ 0} ¼⟨X, B[X]⟩ + ⟨A, X⟩`` (B is a Gram operator, so the
problem is convex), solved here by an accelerated projected gradient on the PSD cone
(:func:`solve_sdcp`), in JAX.

Choices (the paper is silent; Cohen, Damian et al. 2025 discretise the same equations by Euler
sub-steps of GD's step): gflow hands this field to diffrax's Tsit5 like the flow, so

- an eigenvalue counts as at the edge once ``λ_i ≥ (1 − EDGE_WINDOW)·2/η``, and a restoring term
  ``κ (2/η − λ_i)`` with ``κ = EDGE_RATE/η`` brings it onto the edge from there and keeps it
  there against the solver's drift: the field is continuous except where an eigenvalue enters
  the window (once per edge crossing), and the restoring rate is slow enough (one tenth of GD's
  own step rate) that the explicit solver is not held to steps of η;
- at most ``solver.edge_eigs`` eigenvalues are held (default 2); a further one past the edge is
  not held, and the run's report says so (:func:`edge_states` reports every eigenvalue);
- the eigenvectors come from the dense Hessian of the moving blocks (the κ table's structured
  Hessian in the counts and sparse layouts, else ``jax.hessian``): dim θ up to a few hundred;
  the derivatives ``∇S_ij`` are forward-over-forward-over-reverse products
  (``jvp`` of a Hessian-vector product), checked against finite differences in the tests.

What GD's time averages are predicted to be (:func:`edge_states`): the loss
``L̂(θ) + ½⟨Σ, H⟩ = L̂ + Σ_i X_ii λ_i / 2`` (``= L̂ + tr X/η`` at the edge), the squared gradient
``‖∇L̂‖² + ⟨X, Uᵀ H² U⟩``, and the oscillation's size along each edge direction, ``X_ii``
(the mean of ``(v_iᵀ Λ^{-1/2}(θ_GD − θ))²``; with Λ = I, of ``(v_iᵀ(θ_GD − θ))²``).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..core import Params, PopulationLoss, StageLoss, has_table, table_hessian

#: An eigenvalue is held at the edge once it is within this fraction of ``2/η``.
EDGE_WINDOW = 1e-3
#: The restoring rate ``κ = EDGE_RATE/η`` of an eigenvalue held at the edge.
EDGE_RATE = 0.1
#: Iterations of the projected gradient of :func:`solve_sdcp` (two or more eigenvalues held).
SDCP_ITERATIONS = 400
#: The largest relative residual of the complementarity problem (:func:`sdcp_residual`) the central flow
#: accepts at a saved state: 0 to rounding for one held eigenvalue, about 1e-12 for two or three on
#: well-conditioned problems. A stage stops at the first saved state past it (:func:`unsolved_state`),
#: and the report's row holds a run to it.
SDCP_TOL = 1e-6


# ---------------------------------------------------------------------------
# The complementarity problem
# ---------------------------------------------------------------------------


def _psd_part(X):
    lam, V = jnp.linalg.eigh(0.5 * (X + X.T))
    return (V * jnp.maximum(lam, 0.0)) @ V.T


def solve_sdcp(A, B, iterations: int = SDCP_ITERATIONS):
    """The symmetric ``k × k`` matrix X with ``X ⪰ 0``, ``M = A + ½ B[X] ⪰ 0`` and ``⟨X, M⟩ = 0``
    (``B`` a ``(k, k, k, k)`` array, ``B[X]_ij = Σ_kl B_ijkl X_kl``, symmetric positive
    semidefinite as an operator on symmetric matrices). ``k = 1``: ``max(0, −2A/B)``; otherwise
    the minimiser of ``¼⟨X, B[X]⟩ + ⟨A, X⟩`` over the PSD cone by Nesterov-accelerated projected
    gradient (`iterations` steps of ``1/ℓ``, ``ℓ = ½ ‖B‖``, starting from 0)."""
    k = A.shape[0]
    if k == 1:
        b = B.reshape(())
        return jnp.where(b > 0, jnp.maximum(0.0, -2.0 * A / jnp.where(b > 0, b, 1.0)), 0.0).reshape(1, 1)
    Bm = B.reshape(k * k, k * k)
    Bm = 0.5 * (Bm + Bm.T)
    ell = 0.5 * jnp.max(jnp.abs(jnp.linalg.eigvalsh(Bm)))
    step = jnp.where(ell > 0, 1.0 / jnp.where(ell > 0, ell, 1.0), 0.0)
    A = 0.5 * (A + A.T)

    def grad(X):
        return A + 0.5 * (Bm @ X.reshape(-1)).reshape(k, k)

    def body(i, val):
        X, Y, s = val
        Xn = _psd_part(Y - step * grad(Y))
        sn = 0.5 * (1.0 + jnp.sqrt(1.0 + 4.0 * s * s))
        Yn = Xn + ((s - 1.0) / sn) * (Xn - X)
        return Xn, Yn, sn

    Z = jnp.zeros_like(A)
    X, _, _ = jax.lax.fori_loop(0, iterations, body, (Z, Z, jnp.asarray(1.0, A.dtype)))
    return X


def sdcp_residual(A, B, X):
    """How far X is from solving the complementarity problem of :func:`solve_sdcp`, relative to
    the problem's scale: ``max(−λ_min(X), −λ_min(M), |⟨X, M⟩|/‖M‖) / ‖A‖`` with
    ``M = A + ½ B[X]`` (Frobenius norms; each part 0 at the solution). The one-eigenvalue closed
    form gives 0 to rounding; the projected gradient of two or more, what its iterations left."""
    k = A.shape[0]
    A = 0.5 * (A + A.T)
    M = A + 0.5 * (B.reshape(k * k, k * k) @ X.reshape(-1)).reshape(k, k)
    M = 0.5 * (M + M.T)
    Xs = 0.5 * (X + X.T)
    nA = jnp.maximum(jnp.linalg.norm(A), jnp.finfo(A.dtype).tiny)
    nM = jnp.maximum(jnp.linalg.norm(M), jnp.finfo(A.dtype).tiny)
    parts = jnp.stack([jnp.maximum(-jnp.linalg.eigvalsh(Xs)[0], 0.0) * nM / nA,
                       jnp.maximum(-jnp.linalg.eigvalsh(M)[0], 0.0) / nA,
                       jnp.abs(jnp.sum(Xs * M)) / nA])  # fmt: skip
    return jnp.max(parts)


# ---------------------------------------------------------------------------
# The field
# ---------------------------------------------------------------------------


class _Flat(eqx.Module):
    """The moving blocks of a stage as one vector, in flat θ's order (``gflow.core.flatten``)."""

    names: tuple[str, ...] = eqx.field(static=True)
    shapes: tuple[tuple[int, ...], ...] = eqx.field(static=True)

    @staticmethod
    def of(x: dict) -> _Flat:
        order = [b for b in Params.from_blocks({"w": 0, "C": 0, "a": 0, **x}).names if b in x]
        return _Flat(tuple(order), tuple(tuple(np.shape(x[b])) for b in order))

    def ravel(self, x: dict):
        return jnp.concatenate([jnp.ravel(x[b]) for b in self.names])

    def unravel(self, v) -> dict:
        out, i = {}, 0
        for b, sh in zip(self.names, self.shapes):
            n = int(np.prod(sh, dtype=int))
            out[b] = v[i : i + n].reshape(sh)
            i += n
        return out

    def columns(self, full: Params) -> np.ndarray:
        """The positions of these blocks' coordinates in the whole flat θ."""
        cols, i = [], 0
        for b in full.names:
            n = int(np.size(full.get(b)))
            if b in self.names:
                cols.extend(range(i, i + n))
            i += n
        return np.asarray(cols)


def _hessian(sl: StageLoss, x: dict, flat: _Flat, f):
    """The Hessian of the stage loss in the moving coordinates (flat order)."""
    if has_table(sl.loss):
        full = sl.full(x)
        c = jnp.asarray(flat.columns(full))
        Hf = table_hessian(sl.loss, full)
        return Hf[c[:, None], c[None, :]]
    return jax.hessian(f)(flat.ravel(x))


def _third(f, v, U, k: int):
    """``D[i, j] = ∇_θ(u_iᵀ H(θ) u_j)`` at `v` for the first `k` columns of `U`, ``(k, k, n)``:
    a forward derivative (along u_i) of the Hessian-vector product ``H(θ) u_j``."""
    g = jax.grad(f)

    def hvp_along(uj):
        return lambda th: jax.jvp(g, (th,), (uj,))[1]

    rows = {}
    for i in range(k):
        for j in range(i, k):
            rows[i, j] = jax.jvp(hvp_along(U[:, j]), (v,), (U[:, i],))[1]
    return jnp.stack([jnp.stack([rows[min(i, j), max(i, j)] for j in range(k)]) for i in range(k)])


class EdgeTerms(eqx.Module):
    """What the central flow computes at one state (flat moving coordinates): the gradient `g`,
    the top ``K`` eigenvalues `lam` of ``Λ^{1/2}HΛ^{1/2}`` (descending) with ``U = Λ^{1/2}V`` for
    their vectors V, the number `k` held at the edge (0 … K) and the number `past` of all its
    eigenvalues at or past the edge's window (more than `k` when K is too small), X ``(K, K)``
    (zero outside the held block), the correction ``½ Σ X_ij ∇S_ij`` (`push`), the Hessian `H`
    and the complementarity problem's residual `kkt` (:func:`sdcp_residual`; 0 with none held)."""

    g: jax.Array
    lam: jax.Array
    U: jax.Array
    k: jax.Array
    past: jax.Array
    X: jax.Array
    push: jax.Array
    H: jax.Array
    kkt: jax.Array


def edge_terms(sl: StageLoss, scale: dict, x: dict, eta, K: int) -> EdgeTerms:
    """The central flow's terms at the moving blocks `x` of the stage loss `sl` (``scale``: the
    time scale Λ of each moving block; ``eta``: GD's step; ``K``: at most this many eigenvalues
    held at the edge); see the module docstring."""
    flat = _Flat.of(x)
    f = lambda v: sl(flat.unravel(v))  # noqa: E731
    v = flat.ravel(x)
    lam_diag = flat.ravel({b: jnp.broadcast_to(scale[b], jnp.shape(x[b])) for b in flat.names})
    g = jax.grad(f)(v)
    H = _hessian(sl, x, flat, f)
    H = 0.5 * (H + H.T)
    rs = jnp.sqrt(lam_diag)
    P = rs[:, None] * H * rs[None, :]
    K = min(K, v.shape[0])
    lam_all, V_all = jnp.linalg.eigh(P)
    lam = lam_all[::-1][:K]
    V = V_all[:, ::-1][:, :K]
    U = rs[:, None] * V
    edge = 2.0 / eta
    kappa = EDGE_RATE / eta
    window = (1.0 - EDGE_WINDOW) * edge
    held = jnp.sum(lam >= window).astype(jnp.int32)
    lg = lam_diag * g

    def branch(k):
        def run(_):
            if k == 0:
                return jnp.zeros((K, K), v.dtype), jnp.zeros_like(v), jnp.zeros((), v.dtype)
            D = _third(f, v, U, k)  # (k, k, n)
            A = jnp.einsum("ijn,n->ij", D, lg) + kappa * jnp.diag(edge - lam[:k])
            B = jnp.einsum("ijn,n,kln->ijkl", D, lam_diag, D)
            Xk = solve_sdcp(A, B)
            push = 0.5 * jnp.einsum("ij,ijn->n", Xk, D)
            return jnp.zeros((K, K), v.dtype).at[:k, :k].set(Xk), push, sdcp_residual(A, B, Xk)
        return run

    X, push, kkt = jax.lax.switch(jnp.minimum(held, K), [branch(k) for k in range(K + 1)], None)
    return EdgeTerms(g=g, lam=lam, U=U, k=held, past=jnp.sum(lam_all >= window), X=X, push=push, H=H, kkt=kkt)


def central_field(sl: StageLoss, scale: dict, x: dict, eta, K: int) -> dict:
    """``−Λ[∇L̂ + ½ Σ X_ij ∇S_ij]`` at the moving blocks `x` (a dict like `x`)."""
    flat = _Flat.of(x)
    e = edge_terms(sl, scale, x, eta, K)
    d = flat.unravel(e.g + e.push)
    return {b: -scale[b] * d[b] for b in x}


# ---------------------------------------------------------------------------
# Predictions at saved states
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class EdgeStates:
    """The central flow's predictions at saved states of a run (:func:`edge_states`).

    - `ts` ``(T,)``; `lam` ``(T, K)``: the top eigenvalues of ``ΛH``; `edge`: ``2/η``;
    - `held` ``(T,)``: how many eigenvalues are held at the edge; `past` ``(T,)``: how many
      eigenvalues are at or past the edge's window in all (more than `held` when the run's
      ``solver.edge_eigs`` was too small);
    - `X` ``(T, K, K)``: the oscillation's covariance in the eigenbasis;
    - `loss` ``(T,)``: ``L̂(θ)``; `loss_gd` ``(T,)``: GD's predicted time-averaged loss
      ``L̂ + ½ Σ_i X_ii λ_i``; `grad2` ``(T,)``: ``‖∇L̂‖²``; `grad2_gd` ``(T,)``: GD's predicted
      time-averaged ``‖∇L̂‖² + ⟨X, UᵀH²U⟩`` (of the moving blocks);
    - `kkt` ``(T,)``: the complementarity problem's relative residual at each state
      (:func:`sdcp_residual`; 0 where nothing is held).
    """

    ts: np.ndarray
    lam: np.ndarray
    edge: float
    held: np.ndarray
    past: np.ndarray
    X: np.ndarray
    loss: np.ndarray
    loss_gd: np.ndarray
    grad2: np.ndarray
    grad2_gd: np.ndarray
    kkt: np.ndarray


@eqx.filter_jit
def _state_predictions(sl: StageLoss, scale: dict, x: dict, eta, K: int):
    e = edge_terms(sl, scale, x, eta, K)
    HU = e.H @ e.U
    loss = sl(x)
    half_sigma_h = 0.5 * jnp.sum(jnp.diag(e.X) * e.lam)
    extra = jnp.sum(e.X * (HU.T @ HU))
    g2 = jnp.sum(e.g**2)
    return e.lam, e.k, e.past, e.X, loss, loss + half_sigma_h, g2, g2 + extra, e.kkt


def edge_states(loss: PopulationLoss, params_list, moves_list, scales_list, ts, eta: float, K: int) -> EdgeStates:
    """The central flow's terms at saved states: ``params_list[i]`` (a :class:`~gflow.Params`)
    with its moving blocks ``moves_list[i]`` and their time scales ``scales_list[i]`` (a dict),
    at times `ts`; GD's step `eta`, at most `K` eigenvalues held (see :class:`EdgeStates`)."""
    out = []
    for p, moves, scale in zip(params_list, moves_list, scales_list):
        sl = StageLoss(loss, p, moves)
        x = {b: p.get(b) for b in moves}
        out.append(jax.device_get(_state_predictions(sl, scale, x, jnp.asarray(eta, jnp.float64), K)))
    Kk = max(len(o[0]) for o in out) if out else K
    pad = lambda a, n: np.pad(np.asarray(a, np.float64), [(0, n - np.shape(a)[0])] + [(0, 0)] * (np.ndim(a) - 1))  # noqa: E731
    lam = np.stack([pad(o[0], Kk) for o in out]) if out else np.zeros((0, K))
    X = np.stack([np.pad(np.asarray(o[3]), [(0, Kk - len(o[3]))] * 2) for o in out]) if out else np.zeros((0, K, K))
    col = lambda j, dt=np.float64: np.array([o[j] for o in out], dt)  # noqa: E731
    return EdgeStates(ts=np.asarray(ts, np.float64), lam=lam, edge=2.0 / float(eta), held=col(1, int), past=col(2, int),
                      X=X, loss=col(4), loss_gd=col(5), grad2=col(6), grad2_gd=col(7), kkt=col(8))


@eqx.filter_jit
def _held_residual(sl: StageLoss, scale: dict, x: dict, eta, K: int):
    e = edge_terms(sl, scale, x, eta, K)
    return e.k, e.kkt


def unsolved_state(sl: StageLoss, scale: dict, eta: float, K: int, ts, full: dict) -> tuple[int, str] | None:
    """The first of a solve's saved states (``ts``, the blocks' rows `full`) at which the complementarity
    problem was not solved: eigenvalues held at the edge and a relative residual past :data:`SDCP_TOL`;
    ``(its index, the reason)``, or ``None``. Read at saved states only (one more evaluation of the
    central flow's terms each), not at every step: a stage's solve stops at its next saved state."""
    eta = jnp.asarray(eta, jnp.float64)
    for i, t in enumerate(np.asarray(ts, np.float64)):
        k, kkt = jax.device_get(_held_residual(sl, scale, {b: jnp.asarray(full[b][i]) for b in sl.moves}, eta, K))
        if int(k) > 0 and not float(kkt) <= SDCP_TOL:
            return i, (f"the central flow's complementarity problem for X was not solved at t = {t:.6g}: relative "
                       f"residual {float(kkt):.3g} > {SDCP_TOL:g} with {int(k)} eigenvalue(s) held at the edge "
                       f"({SDCP_ITERATIONS} projected-gradient iterations); hold fewer (solver.edge_eigs = "
                       f"{max(1, min(int(k), K) - 1)}) or take a smaller solver.eta")  # fmt: skip
    return None
