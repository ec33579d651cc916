"""Every member of the model family through every path: GD, the modified flow, SGD, the SDE,
the Hessian spectrum, resume, the export cache, evaluation off the training distribution, and
``gflow run`` from a TOML file with its errors (docs/guides/models.md). The token-aware member
stands for the others here (it has an extra block, B, in every path); ``gflow run`` runs every
member (slow but one)."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from equinox import _errors

import gflow
import gflow.cli
from gflow._util import _export_cache
from gflow.core import MEMBERS, Params, flatten, init_params, make_loss, unflatten

JOINT = {"data": {"L": 12}, "estimator": {"N": 48}, "init": {"a0": 1.0},
         "model": {"member": "token", "token_init": 0.2},
         "schedule": {"kind": "joint", "t1": 0.25, "eta_w": 0.5, "eta_C": 2.0, "eta_a": 1.0}}  # fmt: skip


def _cfg(**over) -> gflow.Config:
    d = {k: dict(v) for k, v in JOINT.items()}
    for sec, vals in over.items():
        d.setdefault(sec, {}).update(vals)
    return gflow.config.from_dict(d)


def _step(p: Params, g: Params, eta: float, cfg) -> Params:
    """θ − ηΛg with each block's time scale (the token matrices move with the first layer's η_w)."""
    s = cfg.schedule
    scale = {"w": s.eta_w, "C": s.eta_C, "a": s.eta_a, "B": s.eta_w}
    return Params.from_blocks({b: v - eta * scale[b] * g.get(b) for b, v in p.blocks().items()})


def test_gd_of_a_member_is_the_iteration():
    """GD on the token member is θ − ηΛ∇L̂(θ) with B at η_w's scale, computed by hand."""
    cfg = _cfg(solver={"method": "gd", "eta": 0.1, "save_per_decade": 1})
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    tr = gflow.integrate(cfg, loss=loss)
    p = init_params(cfg.model, cfg.init, d=3, L=12)
    for _ in range(3):
        p = _step(p, loss.grad(p), 0.1, cfg)
    for b in ("w", "C", "a"):
        np.testing.assert_allclose(getattr(tr, b)[-1], np.asarray(p.get(b)), rtol=1e-12)
    np.testing.assert_allclose(tr.x["B"][-1], np.asarray(p.x["B"]), rtol=1e-12)
    assert tr.stages[0].moves == ["w", "B", "C", "a"]


def test_member_sgd_full_batch_without_replacement_is_gd():
    """Online SGD with the whole fixed sample as every batch (sampling "fixed", B = N) takes GD's
    steps: the same θ after 3 steps, to rounding (the batch is a permutation of the sample)."""
    cfg = _cfg(solver={"method": "gd", "eta": 0.1, "save_per_decade": 1})
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    run = gflow.sgd(cfg, gflow.SGDConfig(eta=0.1, steps=3, batch=48, seeds=1, sampling="fixed"), loss=loss)
    p = init_params(cfg.model, cfg.init, d=3, L=12)
    for _ in range(3):
        p = _step(p, loss.grad(p), 0.1, cfg)
    assert run.x["B"].shape == (1, len(run.ts), 3, 3, 3)
    np.testing.assert_allclose(run.x["B"][0, -1], np.asarray(p.x["B"]), rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(run.C[0, -1], np.asarray(p.C), rtol=1e-11)


def test_member_sde_without_noise_is_euler():
    """The SDE with its noise off is the explicit Euler iteration of the flow at the SDE's step."""
    cfg = _cfg(solver={"method": "sde", "eta": 0.1, "save_per_decade": 1})
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    run = gflow.sde(cfg, gflow.SDEConfig(eta=0.1, batch=48, t1=0.25, dt=0.125, noise=0.0, seeds=1), loss=loss)
    p = init_params(cfg.model, cfg.init, d=3, L=12)
    for _ in range(2):  # t1 = 0.25 at dt = 0.125
        p = _step(p, loss.grad(p), 0.125, cfg)
    np.testing.assert_allclose(run.x["B"][0, -1], np.asarray(p.x["B"]), rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(run.a[0, -1], float(p.a), rtol=1e-11)


def test_member_spectrum_is_the_dense_hessian():
    """The Hessian spectrum of a member's run: the eigenvalues of Λ^{1/2}∇²L̂Λ^{1/2} at a saved
    state, flat θ with B's coordinates, against numpy's of jax.hessian (1e-9 relative)."""
    cfg = _cfg(solver={"save_per_decade": 1})
    loss = make_loss(cfg.data, cfg.model, cfg.estimator)
    tr = gflow.integrate(cfg, loss=loss)
    spec = gflow.hessian_spectrum(cfg, tr, loss=loss, indices=[-1])
    like = init_params(cfg.model, cfg.init, d=3, L=12)
    theta = Params.from_blocks({b: jnp.asarray(v) for b, v in tr.state(-1).items()})
    Hm = np.asarray(jax.hessian(lambda x: loss(unflatten(x, 3, 3, like=like)))(flatten(theta)))
    s = np.sqrt(spec.scales[0])
    ref = np.sort(np.linalg.eigvalsh(s[:, None] * Hm * s[None, :]))[::-1]
    np.testing.assert_allclose(spec.eigvals[0], ref, rtol=1e-9, atol=1e-10 * abs(ref).max())
    assert spec.eigvals.shape[-1] == 9 + 7 + 1 + 27 and "B[1,1,1]" in spec.labels


def test_member_modified_flow_at_eta_zero_is_the_flow():
    """GD's modified flow at η = 0 is the gradient flow, for a member too (JAX's Hessian-vector
    products: its κ table has no structured second derivatives): within the solvers' tolerance."""
    cfg = _cfg(solver={"save_per_decade": 2})
    flow = gflow.integrate(cfg)
    mod = gflow.integrate(cfg.replace(solver={"method": "modified", "eta": 0.0}))
    np.testing.assert_allclose(mod.x["B"][-1], flow.x["B"][-1], rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(mod.a[-1], flow.a[-1], rtol=1e-7)


def test_member_run_resumes_where_it_stopped(tmp_path):
    """A member's staged run cut in the middle of Stage II resumes from its last saved state
    (B included) and ends where the uninterrupted run ends."""
    cfg = _cfg(schedule={"kind": "staged", "durations": [20.0, 20.0, 5.0]}, solver={"save_per_decade": 2})
    full = gflow.integrate(cfg, out=tmp_path / "full")
    back = gflow.load(tmp_path / "full")
    r2 = np.flatnonzero(back.stage == 2)
    cut = int(r2[len(r2) // 2])
    for k in back.array_names:
        back.set_array(k, back.array(k)[: cut + 1])
    back.stages = back.stages[:2]
    back.stages[1] = dataclasses.replace(back.stages[1], complete=False, ended_by="duration", t1=float(back.ts[-1]))
    back.status = "running"
    gflow.trajectory.save(back, tmp_path / "cut")
    res = gflow.integrate(cfg, out=tmp_path / "cut", resume=True)
    assert [s.name for s in res.stages] == ["I", "II", "III"]
    np.testing.assert_array_equal(res.x["B"][: cut + 1], full.x["B"][: cut + 1])
    np.testing.assert_allclose(res.x["B"][-1], full.x["B"][-1], rtol=1e-6, atol=1e-9)
    assert res.a[-1] == pytest.approx(full.a[-1], rel=1e-6)


@pytest.fixture
def cli_mode(tmp_path, monkeypatch):
    monkeypatch.setattr(_errors, "EQX_ON_ERROR", "nan")
    eqx.clear_caches()
    jax.clear_caches()
    yield tmp_path / "export"
    _export_cache.disable_export_cache()
    _export_cache._LOADED.clear()
    monkeypatch.undo()
    eqx.clear_caches()
    jax.clear_caches()


def test_member_export_cache_is_bit_for_bit(cli_mode):
    """The export cache of traced stage solves, for a member: exported and loaded programs
    give the run without the cache bit for bit, B included."""
    cfg = _cfg(schedule={"kind": "staged", "durations": [20.0, 5.0, 5.0]}, solver={"save_per_decade": 2})
    plain = gflow.integrate(cfg)
    _export_cache.enable_export_cache(cli_mode)
    gflow.integrate(cfg)
    _export_cache._LOADED.clear()
    loaded = gflow.integrate(cfg)
    assert len(list(cli_mode.glob("*.jaxexport"))) >= 3
    for name in plain.array_names:
        np.testing.assert_array_equal(loaded.array(name), plain.array(name), err_msg=name)


def test_member_evaluation_off_the_training_distribution():
    """``gflow.evaluate`` of a member's run at another context length: its flow rung is the
    member's loss at the trained θ on that configuration's own sample."""
    cfg = _cfg(solver={"save_per_decade": 1})
    tr = gflow.integrate(cfg)
    res = gflow.evaluate(tr, {"data.L": [16]}, plot=False)
    theta = Params.from_blocks({b: jnp.asarray(v) for b, v in tr.state(-1).items()})
    other = cfg.replace(data={"L": 16})
    want = float(make_loss(other.data, other.model, other.estimator)(theta))
    assert res.rows[0]["loss"] == pytest.approx(want, rel=1e-12)


_TOML = """
[data]
L = 12
[estimator]
N = 48
[model]
member = "{member}"
[schedule]
durations = [20.0, 20.0, 5.0]
[solver]
save_per_decade = 2
"""


@pytest.mark.parametrize("member", [m if m == "value" else pytest.param(m, marks=pytest.mark.slow) for m in MEMBERS])
def test_every_member_runs_through_gflow_run(tmp_path, member):
    """``gflow run`` of each member from a TOML file: exit 0 or 1 (a verdict), a complete run folder
    with the member's blocks, a report whose paper rows say there is no law for a member
    other than the paper's."""
    p = tmp_path / "m.toml"
    extra = {"nichani": "H = 1\nD = 1\nM = 1\n", "edelman": "H = 1\nD = 1\nM = 1\n", "bietti": "H = 1\nD = 1\nM = 1\n"}
    text = _TOML.format(member=member).replace(f'member = "{member}"\n', f'member = "{member}"\n{extra.get(member, "")}')
    if member in ("edelman", "bietti"):  # logits: their cross-entropy
        text = text.replace("N = 48\n", 'N = 48\nloss = "ce_on_probs"\n')
    p.write_text(text)
    rc = gflow.cli.main(["run", str(p), "--out", str(tmp_path / "run"), "--quiet"])
    assert rc in (0, 1)
    tr = gflow.load(tmp_path / "run")
    assert tr.status == "complete" and tr.config.model.member == member
    blocks = init_params(tr.config.model, tr.config.init, d=3, L=12).x
    assert set(tr.x) == set(blocks)
    rep = (tmp_path / "run" / "report.md").read_text()
    assert ("no law for this model" in rep) == (member != "paper")


@pytest.mark.parametrize(("text", "key"), [
    ('[model]\nmember = "transformer"\n', "model.member"),
    ('[model]\ntoken_form = "factorised"\n', "model.token_form"),
    ('[model]\nmember = "absolute"\n[estimator]\nlayout = "counts"\n', "estimator.layout"),
    ('[model]\nmember = "residual"\nD = 7\n', "model.D"),
    ('[model]\nmember = "token"\ntoken_form = "low-rank"\n', "model.token_form"),
])  # fmt: skip
def test_bad_member_values_exit_2_naming_the_key(tmp_path, capsys, text, key):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    assert gflow.cli.main(["run", str(p), "--out", str(tmp_path / "run"), "--dry-run"]) == 2
    assert key in capsys.readouterr().err
    assert not (tmp_path / "run" / "trajectory.npz").exists()


@pytest.mark.slow
def test_member_central_flow_holds_its_edge_and_is_the_flow_below_it():
    """The token member through solver.method = "central": at a step whose edge is never reached it
    integrates the flow's own field (in C: the same trajectory to rounding); at a step whose edge
    the flow passes, its report's central rows are decided and pass."""
    cfg = _cfg(solver={"joint_coords": "C"})
    flow = gflow.integrate(cfg)
    below = gflow.integrate(_cfg(solver={"method": "central", "eta": 1e-4}))
    for b in ("w", "C", "a", "B"):
        np.testing.assert_allclose(below.state(-1)[b], flow.state(-1)[b], rtol=1e-11, atol=1e-13)
    lam0 = float(gflow.hessian_spectrum(None, flow).lam_max.max())
    past = _cfg(solver={"method": "central", "eta": 1.5 * 2 / lam0}, schedule={"t1": 2.0})
    rows = {r.name: r for r in gflow.check(gflow.integrate(past)).rows if r.name.startswith("central:")}
    assert rows["central: eigenvalues past the edge all held (max past − held)"].passed is True
    assert rows["central: first time at the edge 2/η"].measured is not None
