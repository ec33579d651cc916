"""Scale-out of the estimator (README §M5): chunked evaluation and sharding of the
sequence axis over devices.

Truth: the unchunked, single-device estimator. Both transformations only
regroup the same sum over sequences (chunks of a ``lax.map``; shards of a
device mesh whose only cross-device reduction is the mean), so they must agree
with it to rounding: relative ``1e-12`` for values and gradients (a float64
sum of N ≤ 2000 terms regrouped differently differs by ~N·1e-16 relative at
worst), and the same for whole trajectories of a short staged flow (the
adaptive solver takes the same steps when its vector field differs only by
rounding, so the trajectories agree to rounding amplified by a few steps).

Several devices on a CPU: ``XLA_FLAGS=--xla_force_host_platform_device_count=4``
must be set before JAX is imported, so the sharded side runs in a
subprocess and prints its numbers (as exact float reprs) for this process,
which has one device, to compare with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gflow
from gflow.core._loss import StageLoss

# d = 3 trigram, L = 20, N = 200 (a multiple of 4), a short staged run (every
# stage 2 time units, one solve each).
TINY = gflow.Config().replace(
    data={"L": 20},
    estimator={"N": 200},
    schedule={"durations": [2.0, 2.0, 2.0]},
    solver={"save_per_decade": 3, "tau_min": 0.5},
)
RTOL = 1e-12


def _theta(cfg, seed=3):
    """A generic θ (not the initialisation, where many terms vanish by symmetry)."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    m = cfg.model
    return gflow.Params(
        w=jax.random.normal(k1, (m.H, m.M), jnp.float64),
        C=jax.random.uniform(k2, (len(m.subsets),), jnp.float64, 0.5, 1.5),
        a=jnp.asarray(1.7, jnp.float64),
    )


@eqx.filter_jit
def _everything(loss, p):
    """Loss, gradient, stats and the staged vector fields' values and gradients
    at θ (the quantities the flow uses)."""
    st = loss.stats(p)
    out = {"loss": st.loss, "loss_se": st.loss_se, "unseen": st.unseen, "grad_norm": st.grad_norm,
           "per_sequence": loss.per_sequence(p)}  # fmt: skip
    for k, x in zip("wCa", (st.grad.w, st.grad.C, st.grad.a)):
        out[f"grad_{k}"] = x
    for k, x in zip("wCa", (st.grad_se.w, st.grad_se.C, st.grad_se.a)):
        out[f"grad_se_{k}"] = x
    vg = loss.value_and_grad(p)
    out["vg_value"] = vg[0]
    out["vg_grad"] = jnp.concatenate([vg[1].w.ravel(), vg[1].C, vg[1].a[None]])
    for moves in (("C",), ("w",), ("a",)):
        sl = StageLoss(loss, p, moves)
        y = sl.init()
        v, g = jax.value_and_grad(sl)(y)
        out[f"stage_{moves[0]}_value"] = v
        out[f"stage_{moves[0]}_grad"] = g[moves[0]]
    return out


def _np(tree):
    return {k: np.asarray(v, np.float64) for k, v in tree.items()}


def _assert_same(got: dict, ref: dict, rtol=RTOL):
    assert set(got) == set(ref)
    for k in ref:
        scale = max(float(np.max(np.abs(ref[k]))), 1e-300)
        np.testing.assert_allclose(got[k], ref[k], rtol=rtol, atol=rtol * scale, err_msg=k)


def _traj_arrays(tr):
    return {
        "ts": tr.ts, "w": tr.w, "C": tr.C, "a": tr.a, "loss": tr.loss, "loss_se": tr.loss_se,
        "grad_norm": tr.grad_norm, "grad_C": tr.grad_C, "grad_se_C": tr.grad_se_C,
    }  # fmt: skip


# ---------------------------------------------------------------------------
# Chunks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["counts", "positions"])
def test_chunked_equals_unchunked(layout):
    """Loss, gradient, Monte Carlo standard errors, per-sequence losses and the
    three stages' vector fields: chunks of 64 (N = 200 is not a multiple: the
    last chunk is padded and the padding dropped) against one vmap."""
    cfg = TINY.replace(estimator={"layout": layout})
    full = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
    chunked = gflow.make_loss(cfg.data, cfg.model, cfg.replace(estimator={"chunk": 64}).estimator)
    assert chunked.chunk == 64 and full.chunk == 0
    p = _theta(cfg)
    ref = _np(_everything(full, p))
    _assert_same(_np(_everything(chunked, p)), ref)
    # a chunk as large as the sample is the unchunked path
    big = gflow.make_loss(cfg.data, cfg.model, cfg.replace(estimator={"chunk": 10_000}).estimator)
    np.testing.assert_allclose(np.asarray(big(p)), ref["loss"], rtol=RTOL)


@pytest.mark.slow
def test_chunked_flow_equals_unchunked():
    """A short staged flow (three stages) with a chunked estimator has the same
    trajectory as the unchunked one, to rounding, with the same solver steps."""
    ref = gflow.integrate(TINY)
    got = gflow.integrate(TINY.replace(estimator={"chunk": 64}))
    assert [s.steps for s in got.stages] == [s.steps for s in ref.stages]
    _assert_same(_traj_arrays(got), _traj_arrays(ref), rtol=1e-10)


# ---------------------------------------------------------------------------
# Shards (a subprocess with 4 forced host devices)
# ---------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import json, sys
    import jax
    if len(sys.argv) > 3:  # one process of a multi-process run: jax.distributed over CPU (gloo)
        pid, nproc, port = (int(x) for x in sys.argv[3:6])
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=nproc, process_id=pid)
    import numpy as np
    import gflow
    sys.path.insert(0, sys.argv[2])
    import test_scale as T

    job = json.loads(sys.argv[1])
    assert len(jax.devices()) == 4, jax.devices()
    out = {"devices": len(jax.devices()), "local_devices": len(jax.local_devices()), "layouts": {}}

    def fetch(v):  # per-sequence values stay sharded across processes: gather them
        if v.is_fully_addressable or v.is_fully_replicated:
            return np.asarray(v)
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(v, tiled=True))

    cfg = gflow.config.from_dict(job["config"]).replace(estimator={"shard": True})
    for layout in job["layouts"]:
        c = cfg.replace(estimator={"layout": layout})
        loss = gflow.make_loss(c.data, c.model, c.estimator)
        sh = loss.feats.cond.sharding
        vals = T._everything(loss, T._theta(c))
        out["layouts"][layout] = {
            "feature_devices": len(sh.device_set),
            "fully_replicated": bool(sh.is_fully_replicated),
            "values": {k: fetch(v).tolist() for k, v in vals.items()},
        }
    if job.get("values_only"):
        print("RESULT " + json.dumps(out))
        sys.exit(0)
    try:
        bad = cfg.replace(estimator={"N": 202})
        gflow.make_loss(bad.data, bad.model, bad.estimator)
        out["error"] = None
    except ValueError as e:
        out["error"] = str(e)
    if job["flow"]:
        tr = gflow.integrate(cfg)
        out["steps"] = [s.steps for s in tr.stages]
        out["traj"] = {k: np.asarray(v).tolist() for k, v in T._traj_arrays(tr).items()}
    print("RESULT " + json.dumps(out))
    """
)


def _run_sharded(cfg, *, flow: bool, layouts=()) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    env["JAX_PLATFORMS"] = "cpu"
    here = os.path.dirname(os.path.abspath(__file__))
    job = json.dumps({"config": cfg.to_dict(), "flow": flow, "layouts": list(layouts)})
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, job, here], env=env, capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_sharded_equals_single_device():
    """On 4 forced host devices, with the sequence axis sharded (N = 200 → 50 a
    device), loss, gradient, standard errors, per-sequence losses and the
    stages' vector fields equal this process's single-device values, for
    both layouts of the sample; a sample size that is not a multiple of the
    device count is a clear error."""
    layouts = ("counts", "positions")
    child = _run_sharded(TINY, flow=False, layouts=layouts)
    assert child["devices"] == 4
    for layout in layouts:
        got = child["layouts"][layout]
        assert got["feature_devices"] == 4 and not got["fully_replicated"]
        cfg = TINY.replace(estimator={"layout": layout})
        loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
        ref = _np(_everything(loss, _theta(cfg)))
        _assert_same({k: np.asarray(v) for k, v in got["values"].items()}, ref)
    assert child["error"] is not None and "estimator.N = 202 must be a multiple of the number of devices (4)" in child["error"]


@pytest.mark.slow
def test_sharded_flow_equals_single_device():
    """A short staged flow on 4 sharded devices has this process's
    single-device trajectory, to rounding, with the same solver steps."""
    child = _run_sharded(TINY, flow=True)
    ref = gflow.integrate(TINY)
    assert child["steps"] == [s.steps for s in ref.stages]
    _assert_same({k: np.asarray(v) for k, v in child["traj"].items()}, _traj_arrays(ref), rtol=1e-10)


@pytest.mark.slow
def test_multiprocess_sharded_equals_single_device():
    """Two processes joined by ``jax.distributed`` (CPU collectives over gloo),
    two forced host devices each: the sequence axis sharded over the 4 global
    devices gives, in both processes, the single-device loss, gradient,
    standard errors and stage vector fields (the multi-host launch of the
    README, on one machine)."""
    import socket

    with socket.socket() as sk:
        sk.bind(("localhost", 0))
        port = sk.getsockname()[1]
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
    env["JAX_PLATFORMS"] = "cpu"
    here = os.path.dirname(os.path.abspath(__file__))
    job = json.dumps({"config": TINY.to_dict(), "flow": False, "values_only": True, "layouts": ["counts"]})
    procs = [
        subprocess.Popen([sys.executable, "-c", _CHILD, job, here, str(pid), "2", str(port)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        for pid in range(2)
    ]
    outs = [p.communicate(timeout=1200) for p in procs]
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e[-4000:]
    loss = gflow.make_loss(TINY.data, TINY.model, TINY.estimator)
    ref = _np(_everything(loss, _theta(TINY)))
    for o, _ in outs:
        child = json.loads(next(x for x in o.splitlines() if x.startswith("RESULT "))[len("RESULT ") :])
        got = child["layouts"]["counts"]
        assert (child["devices"], child["local_devices"], got["feature_devices"]) == (4, 2, 4)
        _assert_same({k: np.asarray(v) for k, v in got["values"].items()}, ref)
