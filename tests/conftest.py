import os

# The test suite is dominated by XLA compile time, not run time (every test
# problem is tiny). Compiling without LLVM's optimisation passes roughly halves
# it and leaves IEEE float64 semantics unchanged. Set GFLOW_TEST_XLA_OPT=1 to
# test with the default (optimised) pipeline instead.
if os.environ.get("GFLOW_TEST_XLA_OPT", "0") != "1":
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" not in _flags:
        os.environ["XLA_FLAGS"] = (
            _flags + " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
        ).strip()

import jax  # noqa: E402
import pytest  # noqa: E402

import gflow  # noqa: E402,F401  (importing gflow turns on float64)

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
