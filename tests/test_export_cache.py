"""The command line's cache of traced stage solves (gflow/_export_cache.py): a run through
it, first exporting and then loading the serialized programs, is bit for bit the run
without it, and the cache is keyed by what determines the program."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import pytest
from equinox import _errors

import gflow
from gflow._util import _export_cache
from gflow.trajectory import _ARRAYS

TINY = {"data": {"d": 3, "L": 20}, "estimator": {"N": 200}, "schedule": {"durations": [50.0, 1e10, 20.0]}}


@pytest.fixture
def cli_mode(tmp_path, monkeypatch):
    """What `gflow` on the command line sets (gflow.cli.enable_compilation_cache): equinox's
    checks in "nan" mode (no host callback) and the export cache on; caches cleared before
    and after so that no trace of the other mode is reused."""
    monkeypatch.setattr(_errors, "EQX_ON_ERROR", "nan")
    eqx.clear_caches()
    jax.clear_caches()
    _export_cache.enable_export_cache(tmp_path / "export")
    yield tmp_path / "export"
    _export_cache.disable_export_cache()
    _export_cache._LOADED.clear()
    monkeypatch.undo()
    eqx.clear_caches()
    jax.clear_caches()


def test_export_cache_reproduces_the_run_bit_for_bit(cli_mode):
    cfg = gflow.config.from_dict(TINY)
    _export_cache.disable_export_cache()
    plain = gflow.integrate(cfg)
    _export_cache.enable_export_cache(cli_mode)
    exported = gflow.integrate(cfg)  # traces, exports, writes, calls
    files = sorted(cli_mode.glob("*.jaxexport"))
    assert len(files) == 3  # one program per stage (events and moving blocks differ)
    _export_cache._LOADED.clear()
    loaded = gflow.integrate(cfg)  # reads the three programs back from disk
    for tr in (exported, loaded):
        assert [(s.name, s.ended_by, s.steps, s.rejected, s.nfev) for s in tr.stages] == [
            (s.name, s.ended_by, s.steps, s.rejected, s.nfev) for s in plain.stages
        ]
        for name in _ARRAYS:
            np.testing.assert_array_equal(getattr(tr, name), getattr(plain, name), err_msg=name)


def test_export_cache_key_and_fallback(cli_mode):
    """The key changes with a static keyword and with an array's shape; a function with a host
    callback (as the progress meter's) is not exportable: it runs the ordinary way, nothing
    written, same value."""

    @eqx.filter_jit
    def f(x, *, scale):
        return x * scale

    @eqx.filter_jit
    def g(x):
        jax.debug.callback(lambda v: None, x)
        return 2 * x

    def key(x, scale):
        dyn, static = eqx.partition(((x,), {"scale": scale}), eqx.is_array)
        leaves, treedef = jax.tree.flatten(dyn)
        return _export_cache._key("f", treedef, leaves, static)

    x3, x4 = jax.numpy.ones(3), jax.numpy.ones(4)
    assert len({key(x3, 2.0), key(x3, 3.0), key(x4, 2.0)}) == 3 and key(x3, 2.0) == key(x3, 2.0)
    np.testing.assert_array_equal(_export_cache.cached_call(f, (x3,), {"scale": 2.0}), 2 * np.ones(3))
    assert len(list(cli_mode.glob("*.jaxexport"))) == 1
    np.testing.assert_array_equal(_export_cache.cached_call(g, (x3,), {}), 2 * np.ones(3))
    assert len(list(cli_mode.glob("*.jaxexport"))) == 1


def test_cli_main_restores_what_it_set(tmp_path, monkeypatch):
    """`gflow` in-process (gflow.cli.main) sets the compilation cache, equinox's "nan" mode
    and the export cache for its own work and restores all of them when it returns."""
    from gflow.cli import main

    monkeypatch.setenv("GFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("EQX_ON_ERROR", raising=False)
    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = {k: getattr(jax.config, k) for k in keys}
    seen = {}
    monkeypatch.setattr("gflow.cli._dispatch", lambda args: seen.update(
        eqx=_errors.EQX_ON_ERROR, dir=_export_cache._DIR, cache=jax.config.jax_compilation_cache_dir) or 0)  # fmt: skip
    assert main(["check", str(tmp_path)]) == 0
    assert seen == {"eqx": "nan", "dir": tmp_path / "cache" / "export", "cache": str(tmp_path / "cache")}
    assert {k: getattr(jax.config, k) for k in keys} == before
    assert _errors.EQX_ON_ERROR == "raise" and _export_cache._DIR is None


def test_fingerprint_covers_every_subpackage(tmp_path, monkeypatch):
    """The key's source fingerprint hashes every module of the package, the subpackages'
    included: editing gflow/core/_loss.py (or any file below gflow/) changes it, so a program
    exported by other code is never served (it would be read under another key)."""
    import shutil

    root = tmp_path / "gflow"
    shutil.copytree(_export_cache._package_root(), root, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(_export_cache, "_package_root", lambda: root)
    prints = {}
    for what, path in [("base", None), ("core", "core/_loss.py"), ("dynamics", "dynamics/_solve.py"),
                       ("util", "_util/_io.py"), ("top", "trajectory.py")]:  # fmt: skip
        if path is not None:
            (root / path).write_text((root / path).read_text() + "\n# edited\n")
        monkeypatch.setattr(_export_cache, "_FINGERPRINT", None)
        prints[what] = _export_cache._fingerprint()
    assert len(set(prints.values())) == len(prints), prints
    # renaming a module (same bytes, another path) changes it too
    (root / "core" / "_loss.py").rename(root / "core" / "_loss2.py")
    monkeypatch.setattr(_export_cache, "_FINGERPRINT", None)
    assert _export_cache._fingerprint() not in prints.values()


@pytest.mark.skipif(_export_cache.mapped_regions() is None, reason="memory maps are read from /proc (Linux)")
def test_freeing_compiled_programs_returns_their_memory_maps():
    """Compiled programs hold memory maps until they are freed (about 16 each on XLA:CPU); freeing
    them returns the maps, and a freed program compiles again to the same result."""
    import jax.numpy as jnp

    free_ = _export_cache.free_compiled_programs
    free_()
    n0 = _export_cache.mapped_regions()
    fs = [jax.jit(lambda x, k=k: jnp.sin(x) * k + jnp.cumsum(x)) for k in range(40)]
    first = [np.asarray(f(jnp.linspace(0.0, 1.0, k + 1))) for k, f in enumerate(fs)]
    n1 = _export_cache.mapped_regions()
    assert n1 - n0 >= 40 * 4  # each distinct program holds maps of its own while cached
    free_()
    n2 = _export_cache.mapped_regions()
    assert n1 - n2 >= 0.8 * (n1 - n0)  # at least 80 % of them are returned
    again = [np.asarray(f(jnp.linspace(0.0, 1.0, k + 1))) for k, f in enumerate(fs)]
    for x, y in zip(first, again):
        np.testing.assert_array_equal(x, y)  # recompiled, bit for bit


@pytest.mark.skipif(_export_cache.mapped_regions() is None, reason="memory maps are read from /proc (Linux)")
def test_relieve_memory_maps_frees_only_above_its_threshold(monkeypatch):
    n = _export_cache.mapped_regions()
    assert 0 < n < _export_cache.map_limit()
    freed = []
    monkeypatch.setattr(_export_cache, "free_compiled_programs", lambda: freed.append(1))
    assert _export_cache.relieve_memory_maps(0.5, limit=4 * n) is False and not freed  # n < 0.5 * 4n
    assert _export_cache.relieve_memory_maps(0.5, limit=n) is True and freed == [1]  # n > 0.5 * n
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\], got 0"):
        _export_cache.relieve_memory_maps(0)


def test_a_serial_grid_relieves_the_maps_after_each_point(monkeypatch):
    from gflow.runs import _executor

    seen = []
    monkeypatch.setattr(_executor, "relieve_memory_maps", lambda: seen.append("relieve"))
    lost = _executor.run_points(None, lambda x: x * x, [(0, 2), (1, 3)], lambda k, v: seen.append((k, v)))
    assert lost == {} and seen == ["relieve", (0, 4), "relieve", (1, 9)]
    seen.clear()
    assert _executor.call(_executor.worker_environment(), lambda x: x + 1, 4) == 5 and seen == ["relieve"]
