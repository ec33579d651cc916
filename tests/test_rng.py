"""gflow._util._rng: Threefry draws with the hash unrolled, bit for bit jax.random's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gflow._util import _rng


@pytest.mark.parametrize("shape", [(), (7,), (2, 1001), (3, 5, 4)])
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_uniform_and_normal_equal_jax_random(shape, dtype):
    """uniform (with and without bounds) and normal equal jax.random's bit for bit,
    eagerly, under jit and under vmap over keys."""
    key = jax.random.fold_in(jax.random.key(3), 5)
    pairs = [
        (jax.random.uniform(key, shape, dtype), _rng.uniform(key, shape, dtype)),
        (jax.random.uniform(key, shape, dtype, -2.5, 3.0), jax.jit(lambda k: _rng.uniform(k, shape, dtype, -2.5, 3.0))(key)),
        (jax.random.normal(key, shape, dtype), _rng.normal(key, shape, dtype)),
    ]
    keys = jax.random.split(key, 3)
    pairs.append((jax.vmap(lambda k: jax.random.uniform(k, shape, dtype))(keys),
                  jax.vmap(lambda k: _rng.uniform(k, shape, dtype))(keys)))  # fmt: skip
    for want, got in pairs:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_hash_is_threefry_2x32():
    """The unrolled hash equals JAX's Threefry-2x32 primitive on random keys and counters,
    including the all-ones words where the 32-bit additions wrap."""
    import jax.extend.random as jr

    rng = np.random.default_rng(0)
    for k1, k2 in [(0, 0), (0xFFFFFFFF, 0xFFFFFFFF), tuple(rng.integers(0, 2**32, 2))]:
        x = jnp.asarray(rng.integers(0, 2**32, 2 * 999), jnp.uint32)
        x = x.at[:2].set(jnp.uint32(0xFFFFFFFF))
        want = jr.threefry_2x32((jnp.uint32(k1), jnp.uint32(k2)), x)
        h1, h2 = _rng.threefry2x32(jnp.uint32(k1), jnp.uint32(k2), x[:999], x[999:])
        np.testing.assert_array_equal(np.asarray(jnp.concatenate([h1, h2])), np.asarray(want))


def test_other_key_implementations_fall_back_to_jax_random():
    """An RBG key is not Threefry: the draws are jax.random's for that key."""
    key = jax.random.key(1, impl="rbg")
    np.testing.assert_array_equal(np.asarray(_rng.uniform(key, (5,))), np.asarray(jax.random.uniform(key, (5,))))
