"""Uniform and normal draws bit-identical to ``jax.random``'s, with the hash unrolled.

On CPU, JAX lowers its Threefry-2x32 hash as a rolled loop (five iterations of four
rounds), which XLA runs as separate passes over memory; the same twenty rounds written
out in ``jnp`` fuse into one elementwise kernel, about three times faster at 10⁵ draws
(0.17 against 0.49 ms on the 2-core test machine). XLA may fuse that kernel into every
consumer of the draws and compute it once per consumer: use it where the draws are
stored anyway (a ``scan``'s input), not where several fusions read them. :func:`uniform` and :func:`normal` compute
exactly what ``jax.random.uniform`` and ``jax.random.normal`` compute for a Threefry key
(the default implementation with ``jax_threefry_partitionable``, JAX's default): the
same counters, hash and bit-to-float map, so the same numbers, bit for bit (tested).
For any other key implementation, or with that flag off, they call ``jax.random``.

Used by the fresh-sequence sampler of online SGD (:func:`gflow.core._data.sample_fast`),
where drawing the random numbers was a third of a step.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 hash with 20 rounds (Salmon et al. 2011), as ``jax.random``
    uses it: key ``(k1, k2)``, counters ``(x1, x2)`` (``uint32`` arrays), unrolled."""
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x1 = x1 + ks[0]
    x2 = x2 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x1 = x1 + x2
            x2 = (x2 << np.uint32(r)) | (x2 >> np.uint32(32 - r))
            x2 = x1 ^ x2
        x1 = x1 + ks[(i + 1) % 3]
        x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x1, x2


def _fast_path(key) -> bool:
    return jax.random.key_impl(key) == "threefry2x32" and bool(jax.config.jax_threefry_partitionable)


def _bits(key, nbits: int, shape: tuple[int, ...]):
    """``jax.random.bits(key, shape, uint{nbits})`` for a Threefry key (partitionable)."""
    n = math.prod(shape)
    if n >= 2**32:
        raise ValueError(f"at most 2**32 - 1 draws per call, got {n}")
    k1, k2 = jax.random.key_data(key)
    lo = jax.lax.iota(jnp.uint32, n).reshape(shape)
    h1, h2 = threefry2x32(k1, k2, jnp.zeros(shape, jnp.uint32), lo)
    if nbits == 64:
        return (h1.astype(jnp.uint64) << np.uint64(32)) | h2.astype(jnp.uint64)
    return h1 ^ h2


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def uniform(key, shape, dtype=jnp.float64, minval=0.0, maxval=1.0):
    """``jax.random.uniform(key, shape, dtype, minval, maxval)``, bit for bit (float32
    or float64, scalar bounds; compiled as ``jax.random`` is, so that XLA contracts the
    scaling the same way)."""
    shape = tuple(int(s) for s in shape)
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)) or not _fast_path(key):
        return jax.random.uniform(key, shape, dtype, minval, maxval)
    finfo = jnp.finfo(dtype)
    nbits, nmant = finfo.bits, finfo.nmant
    udt = jnp.uint64 if nbits == 64 else jnp.uint32
    bits = _bits(key, nbits, shape)
    one = jnp.asarray(np.array(1.0, dtype).view(udt), udt)
    floats = jax.lax.bitcast_convert_type((bits >> udt(nbits - nmant)) | one, dtype) - jnp.asarray(1.0, dtype)
    lo, hi = jnp.asarray(minval, dtype), jnp.asarray(maxval, dtype)
    # Kept for speed, not for fusion: it does not stop XLA from fusing the hash into
    # several consumers (see above), but the SGD step is measured 0.4–5 % faster with it
    # (three paired runs of scripts/benchmarks/bench_joint.py --part sgd --devices 2).
    return jax.lax.optimization_barrier(jnp.maximum(lo, floats * (hi - lo) + lo))


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def normal(key, shape, dtype=jnp.float64):
    """``jax.random.normal(key, shape, dtype)``, bit for bit (real float32 or float64)."""
    shape = tuple(int(s) for s in shape)
    dtype = jnp.dtype(dtype)
    if not _fast_path(key):
        return jax.random.normal(key, shape, dtype)
    lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype), dtype=dtype)
    u = uniform(key, shape, dtype, lo, np.array(1.0, dtype))
    return jnp.asarray(np.sqrt(2), dtype) * jax.lax.erf_inv(u)
