"""The stochastic methods as runs: ``solver.method = "sgd"`` or ``"sde"`` to a
:class:`~gflow.trajectory.Trajectory` with a seed axis (docs/guides/stochastic.md,
"Every method through ``gflow run``").

:func:`integrate_stochastic` runs :func:`~gflow.dynamics.sgd` or
:func:`~gflow.dynamics.sde` with the configuration's own settings
(:func:`sgd_settings`, :func:`sde_settings`: η from ``solver.eta``, the end from
``schedule.t1``, B, R and the seed from ``[sgd]``, the SDE's dt, noise and Σ's sample from
``[sde]``), so its seeds are exactly those the Python functions give for the same
configuration, and makes the run a trajectory like a flow's:

- every seed's saved states with their loss ``L̂_N``, gradient and Monte Carlo
  standard errors at every saved time (``loss.stats``, as the flow saves them), in
  :attr:`Trajectory.per_seed` ``(R, T, ...)``;
- the ordinary arrays are the seed means of those (θ̄ the mean parameters, the mean
  loss, the mean gradient, …): everything that reads a trajectory (the check rows, the
  figures, a sweep's table) reads the seed mean;
- one stage record ``"joint"`` from 0 to ``Kη`` (SGD) or ``K·dt`` (SDE), ``steps`` the
  K steps of one seed, ``nfev`` the steps of all seeds, ``K·R`` (each one gradient of a
  batch of B for SGD; one drift and one covariance Σ of the sample for the SDE).

It writes nothing itself: with `out` (the run layer's folder hook), the finished run is
saved once, complete (a stochastic run is not resumable: it is written whole or not at
all). A seed whose θ becomes non-finite fails the run (status ``"failed: …"``,
:class:`~gflow.dynamics.FlowError` unless ``throw=False``), as a flow's non-finite state does.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from .._util import versions
from ..config import Config
from ..core import Params, PopulationLoss, init_params, make_loss, member_of
from ..trajectory import SEED_ARRAYS, WRITING, StageRecord, Trajectory
from ._flow import FlowError, run_options
from ._resume import check_params
from ._sde import sde, sde_settings
from ._sgd import sgd, sgd_settings
from ._solve import stats_at


def check_stochastic(config: Config) -> None:
    """Refuse, before any compute, a stochastic request that cannot run: ``ValueError`` naming it."""
    m = config.solver.method_for("I")
    if not config.solver.is_stochastic:
        raise ValueError(f"solver.method = {m!r} is not a stochastic method ('sgd' or 'sde')")
    (sgd_settings if m == "sgd" else sde_settings)(config)  # the settings' own checks


def _resumed(config: Config, out, outputs=None) -> Trajectory:
    """`resume` of a stochastic run: the saved run itself when it is complete and was made by the
    very same configuration (there is nothing left to run); otherwise ``ValueError``: a stochastic
    run is written once, complete, and is not continued."""
    m = config.solver.method_for("I")
    if out is None:
        raise ValueError("resume=True needs the run folder `out`")
    saved = out.load()
    quiet = {"progress": False}  # the progress meter changes no number
    same = saved.config.replace(solver=quiet) == config.replace(solver=quiet)
    if saved.integrated and same and saved.n_seeds:
        if outputs and out is not None:  # the caller rewrites them: complete again once recorded
            saved.status, saved.files = WRITING, {str(n): None for n in outputs}
            out.save(saved)
        return saved
    why = (f"its status is {saved.status!r}" if not saved.integrated else
           "the saved run was made by another configuration" if not same else "it has no seed axis")
    raise ValueError(
        f"solver.method = {m!r}: a stochastic run is written once, complete, and cannot be resumed ({why}); "
        "run it again (with overwrite=True, `gflow run --overwrite`)"
    )


def _stats(loss: PopulationLoss, blocks: dict, block: int):
    """``loss.stats`` at every state (θ's `blocks`, leading axis), in blocks of `block` (one compiled shape)."""
    n = blocks["a"].shape[0]
    parts = []
    for i in range(0, n, block):
        sl = slice(i, i + block)
        m = blocks["a"][sl].shape[0]
        pad = lambda x: np.concatenate([x, np.repeat(x[-1:], block - m, axis=0)])  # noqa: E731
        st = jax.device_get(stats_at(loss, Params.from_blocks({b: jnp.asarray(pad(v[sl])) for b, v in blocks.items()})))
        parts.append(jax.tree.map(lambda x: np.asarray(x)[:m], st))
    return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


def stochastic_trajectory(config: Config, run, loss: PopulationLoss, *, wall: float | None = None) -> Trajectory:
    """The :class:`Trajectory` of an :class:`~gflow.dynamics.SGDRun` (SGD's or the SDE's R seeds):
    see the module docstring."""
    R, T = run.a.shape
    xs = getattr(run, "x", {}) or {}
    blocks = {b: np.asarray(v, np.float64).reshape((R * T,) + np.shape(v)[2:])
              for b, v in {"w": run.w, "C": run.C, "a": run.a, **xs}.items()}  # fmt: skip
    st = _stats(loss, blocks, block=min(R * T, 64))
    w, C, a = blocks["w"], blocks["C"], blocks["a"]
    flat = {
        "w": w, "C": C, "a": a, "loss": st.loss, "loss_se": st.loss_se, "unseen": st.unseen,
        "grad_w": st.grad.w, "grad_C": st.grad.C, "grad_a": st.grad.a,
        "grad_se_w": st.grad_se.w, "grad_se_C": st.grad_se.C, "grad_se_a": st.grad_se.a, "grad_norm": st.grad_norm,
    }  # fmt: skip
    for b in xs:
        flat.update({f"x_{b}": blocks[b], f"grad_x_{b}": st.grad.x[b], f"grad_se_x_{b}": st.grad_se.x[b]})
    names = SEED_ARRAYS + tuple(f"{k}_{b}" for b in sorted(xs) for k in ("x", "grad_x", "grad_se_x"))
    per_seed = {k: np.asarray(flat[k], np.float64).reshape((R, T) + np.shape(flat[k])[1:]) for k in names}
    means = {k: v.mean(axis=0) for k, v in per_seed.items()}
    steps = int(run.steps[-1])
    moves = list(member_of(config.model).stage_moves["joint"])
    rec = StageRecord(name="joint", moves=moves, t0=0.0, t1=float(run.ts[-1]), ended_by="duration",
                      complete=True, steps=steps, nfev=steps * R, wall=float(run.wall if wall is None else wall))  # fmt: skip
    traj = Trajectory(ts=np.asarray(run.ts, np.float64), stage=np.zeros(T, np.int32),
                      **{k: v for k, v in means.items() if k in SEED_ARRAYS}, stages=[rec], config=config,
                      status="complete", versions=versions(), wall=rec.wall, per_seed=per_seed)  # fmt: skip
    for k, v in means.items():
        if k not in SEED_ARRAYS:
            traj.set_array(k, v)
    return traj


def integrate_stochastic(config: Config, *, out=None, **options) -> Trajectory:
    """Run the stochastic method of ``config`` (``solver.method = "sgd"`` or ``"sde"``) and
    return its trajectory with a seed axis (module docstring); the arguments are
    :func:`gflow.integrate`'s; `resume` returns the saved run when it is complete and was made by
    the same configuration (nothing is left to run) and is refused otherwise (a stochastic run is
    written once, complete, and never continued). `outputs`: as for the flow, the files the
    caller writes afterwards: the run is saved with status ``WRITING`` and them in its
    manifest, ``"complete"`` once they are recorded.

    **Returns:** a :class:`~gflow.trajectory.Trajectory` whose ``per_seed[k][r]`` is seed r
    of ``gflow.sgd(config)`` (or ``gflow.sde(config)``) exactly, for ``k`` in w, C, a, loss.

    **Raises:** ``ValueError`` before any compute for a request it cannot run (`resume` of
    another or an unfinished run, a folder holding a run without `overwrite`, bad settings); :class:`FlowError` (with the
    trajectory, saved to `out`) when a seed's θ becomes non-finite, unless ``throw=False``.
    """
    check_stochastic(config)
    kw = run_options(options)
    resume, outputs = kw.pop("resume"), kw["outputs"]
    if resume:
        if out is None:
            return _resumed(config, None)
        with out.lock():
            return _resumed(config, out, outputs)
    if out is None:
        return _run(config, out=None, **kw)
    with out.lock():
        return _run(config, out=out, **kw)


def _run(cfg: Config, *, out, overwrite, loss, params0, verbose, throw, outputs, on_loss=None) -> Trajectory:
    t_wall = time.perf_counter()
    if out is not None and out.holds_run() and not overwrite:
        raise ValueError(
            f"{str(out)!r} already holds a run: pass overwrite=True (`--overwrite`) (a stochastic run is "
            "not continued: `--resume` only reuses the same configuration's complete run)"
        )
    if params0 is not None:
        check_params(params0, cfg)
    method = cfg.solver.method_for("I")
    sc = sgd_settings(cfg) if method == "sgd" else sde_settings(cfg)
    if out is not None and overwrite:
        out.remove_stale()
    if loss is None:
        loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    if on_loss is not None:
        on_loss(loss)
    if params0 is None:
        params0 = init_params(cfg.model, cfg.init, d=cfg.data.d, L=cfg.data.L, dtype=cfg.estimator.jdtype)
    if verbose:
        what = (f"{sc.steps} steps of η = {sc.eta:g}, batch {sc.batch} ({sc.sampling})" if method == "sgd"
                else f"Euler–Maruyama to t = {sc.t1:g} with dt = {sc.step:g}, η = {sc.eta:g}, B = {sc.batch}")
        print(f"  {method}: {sc.seeds} seeds, {what}", flush=True)  # fmt: skip
    run = (sgd if method == "sgd" else sde)(cfg, sc, loss=loss, params0=params0, progress=cfg.solver.progress)
    traj = stochastic_trajectory(cfg, run, loss, wall=time.perf_counter() - t_wall)
    theta = ("w", "C", "a") + tuple(f"x_{b}" for b in traj.x)
    bad = [r for r in range(traj.n_seeds) if not all(np.all(np.isfinite(traj.per_seed[k][r])) for k in theta)]
    error = None
    if bad:
        r = bad[0]
        ok = np.array([all(np.all(np.isfinite(traj.per_seed[k][r][i])) for k in theta) for i in range(len(traj.ts))])
        t_bad = float(traj.ts[int(np.argmin(ok))])
        msg = f"θ became non-finite in seeds {bad} (seed {r} by t = {t_bad:.6g}; η = {cfg.solver.eta:g})"
        traj.status = f"failed: {method} {msg}"
        traj.stages[0].ended_by, traj.stages[0].complete = "failed", False
        error = FlowError(f"{method}: {msg}", stage="joint", t=t_bad, trajectory=traj, out=out)
    if error is None and outputs and out is not None:  # complete once the caller has written (and recorded) them
        traj.status, traj.files = WRITING, {str(n): None for n in outputs}
    traj.wall = time.perf_counter() - t_wall
    traj.stages[0].wall = traj.wall
    if out is not None:
        out.save(traj)
    if error is not None and throw:
        raise error
    return traj
