from pathlib import Path

import jax
import pytest

import gflow  # noqa: F401  (importing gflow turns on float64)

jax.config.update("jax_enable_x64", True)


@pytest.fixture
def getkey():
    """A function returning a fresh PRNG key at every call, from a fixed seed:
    keys differ within a test and every test is deterministic."""
    base = jax.random.key(5678)
    counter = iter(range(10**9))

    def _getkey():
        return jax.random.fold_in(base, next(counter))

    return _getkey


SMALL_TOML = Path(__file__).resolve().parents[1] / "scripts" / "small.toml"


@pytest.fixture(scope="session")
def small_config():
    """The test-size staged run (scripts/small.toml: d = 3, parents (1, 2),
    L = 40, N = 2000)."""
    return gflow.load_config(SMALL_TOML)


@pytest.fixture(scope="session")
def small_loss(small_config):
    c = small_config
    return gflow.make_loss(c.data, c.model, c.estimator)


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, small_config, small_loss):
    """The small staged flow, integrated once per session and shared by the
    flow and check tests: ``(trajectory, run folder)``."""
    out = tmp_path_factory.mktemp("small_run")
    return gflow.integrate(small_config, out=out, loss=small_loss), out
