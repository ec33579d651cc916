"""A cache of traced programs on disk, for the command line's warm start
(docs/performance.md).

JAX's persistent compilation cache skips XLA compilation in a second process, but
not *tracing* and lowering: a warm ``gflow run`` still traced its three stage solves
(a ``diffeqsolve`` with events and the steady test each), about 5 s of a 20 s run.
:func:`cached_call` instead keeps each traced solve as a serialized ``jax.export`` program
(StableHLO) in ``GFLOW_CACHE/export``: a second process deserializes it and calls it,
and the compilation cache then supplies its executable.

Only the command line turns it on (:func:`enable_export_cache`, from ``gflow.cli``); importing gflow
changes nothing. A program is looked up by a hash of everything that determines it:
the structure and static fields of the arguments (``str`` of their tree definition),
the shapes and dtypes of their arrays, the static keywords, JAX's x64 flag, equinox's
error mode, the versions of gflow, jax, jaxlib, diffrax, equinox, optimistix and numpy, and the
source of every gflow module. Anything that cannot be exported (a host callback: the
progress meter, the host evaluation counter; several devices) is called the ordinary
way; a failure to read or write the cache only costs the trace.

**An entry cannot lie.** Each file is ``MAGIC``, the 32-character key it was made for, the
SHA-256 of the program's bytes, their length, then the bytes (:func:`_pack`). Before use the
header, the key, the length and the checksum are verified; a mismatch, a truncated file, or any
exception while reading, deserializing or calling the program drops the entry (the file is
removed and written afresh by the next export), says so once per process in one line on stderr,
and the call takes the uncached path, so a damaged cache never changes a result or stops a run.
Files are written to a temporary name and renamed (atomic: runs sharing a cache are safe).
"""

from __future__ import annotations

import gc
import hashlib
import os
import re
import struct
import sys
from pathlib import Path

import diffrax
import equinox as eqx
import jax

from ._io import versions

_DIR: Path | None = None
_NOT_EXPORTABLE: set[str] = set()
_LOADED: dict[str, object] = {}
_CALLERS: dict[str, object] = {}
_FINGERPRINT: str | None = None
_WARNED = False

MAGIC = b"gflow-export-v1\n"
_HEADER = struct.Struct("<32s32sQ")  # key (ascii), sha256 of the payload, payload length


class _Damaged(Exception):
    """A cache entry that is not the program written for its key."""


def _pack(key: str, blob: bytes) -> bytes:
    return MAGIC + _HEADER.pack(key.encode("ascii"), hashlib.sha256(blob).digest(), len(blob)) + blob


def _unpack(key: str, raw: bytes) -> bytes:
    """The program's bytes of a cache file, verified (``_Damaged`` saying what is wrong)."""
    n = len(MAGIC) + _HEADER.size
    if len(raw) < n or not raw.startswith(MAGIC):
        raise _Damaged("not a gflow cache entry (header missing or truncated)")
    k, digest, size = _HEADER.unpack_from(raw, len(MAGIC))
    blob = raw[n:]
    if k != key.encode("ascii"):
        raise _Damaged("made for another key")
    if len(blob) != size:
        raise _Damaged(f"truncated ({len(blob)} of {size} bytes)")
    if hashlib.sha256(blob).digest() != digest:
        raise _Damaged("checksum mismatch (the bytes changed after they were written)")
    return blob


def _drop(path: Path, why: str) -> None:
    """Remove a damaged entry and say so (once per process, one line)."""
    global _WARNED
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
    if not _WARNED:
        _WARNED = True
        print(f"gflow: warning: dropped the damaged program cache entry {str(path)!r} ({why}); it is recomputed "
              "and rewritten (further damaged entries are dropped silently)", file=sys.stderr)  # fmt: skip


def enable_export_cache(folder: str | os.PathLike) -> None:
    """Keep traced programs in `folder` (created when first written)."""
    global _DIR
    _DIR = Path(folder)


def disable_export_cache() -> None:
    global _DIR
    _DIR = None


def export_cache_folder() -> Path | None:
    """The folder :func:`enable_export_cache` named, or ``None`` when the cache is off."""
    return _DIR


def source_fingerprint() -> str:
    """A hash of the installed versions (:func:`gflow._util.versions`) and of gflow's source: two
    processes with the same fingerprint run the same code (a grid's workers are checked by it)."""
    return _fingerprint()


def _package_root() -> Path:
    return Path(__file__).resolve().parents[1]  # gflow/, this file being gflow/_util/_export_cache.py


def _fingerprint() -> str:
    """What every key shares, computed once per process: the installed versions and a
    hash of gflow's source (every ``.py`` file of the package, its subpackages included,
    with its path inside the package: a change anywhere misses the cache)."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        h = hashlib.sha256(repr(sorted(versions().items())).encode())
        root = _package_root()
        for p in sorted(root.rglob("*.py")):
            h.update(p.relative_to(root).as_posix().encode())
            h.update(p.read_bytes())
        _FINGERPRINT = h.hexdigest()
    return _FINGERPRINT


def _key(name: str, treedef, leaves, static) -> str:
    from equinox import _errors

    parts = [
        name,
        str(treedef),
        repr([(tuple(x.shape), str(x.dtype)) for x in leaves]),
        repr(jax.tree.flatten(static)),
        str(jax.config.jax_enable_x64),
        str(getattr(_errors, "EQX_ON_ERROR", "?")),
        _fingerprint(),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _plain(tree):
    """diffrax's result code (an equinox enumeration item) as its int32 value, so that the
    program's outputs are built-in containers only (``jax.export`` serializes those)."""
    return jax.tree.map(lambda x: x._value if isinstance(x, type(diffrax.RESULTS.successful)) else x, tree,
                        is_leaf=lambda x: isinstance(x, type(diffrax.RESULTS.successful)))  # fmt: skip


def _result_item(value):
    return jax.tree.unflatten(jax.tree.structure(diffrax.RESULTS.successful), [value])


def cached_call(fn, args: tuple, kwargs: dict, *, result_at: int | None = None):
    """``fn(*args, **kwargs)`` for an ``eqx.filter_jit`` function `fn` (arrays traced,
    everything else static, as ``eqx.filter_jit`` does), through the export cache when it
    is on (module docstring). `result_at`: the index of a diffrax result code in the
    returned tuple (restored after the call)."""
    if _DIR is None or jax.device_count() != 1:
        return fn(*args, **kwargs)
    dyn, static = eqx.partition((args, kwargs), eqx.is_array)
    leaves, treedef = jax.tree.flatten(dyn)
    key = _key(getattr(fn, "__name__", repr(fn)), treedef, leaves, static)
    if key in _NOT_EXPORTABLE:
        return fn(*args, **kwargs)
    exp = _LOADED.get(key)
    if exp is None:
        exp = _load_or_export(key, fn, treedef, static, leaves)
        if exp is None:
            _NOT_EXPORTABLE.add(key)
            return fn(*args, **kwargs)
        _LOADED[key] = exp
    # committed to the one device: a freshly made array is uncommitted and an output of a
    # previous call committed, and the call's compiled program is keyed by that too (without
    # this, every stage compiled its program twice)
    dev = jax.devices()[0]
    try:
        out = _caller(key, exp)(*[jax.device_put(x, dev) for x in leaves])
    except Exception as e:  # a program that deserialized but cannot run: drop it, the uncached call
        _LOADED.pop(key, None)
        _CALLERS.pop(key, None)
        _NOT_EXPORTABLE.add(key)
        _drop(_DIR / f"{key}.jaxexport", f"calling it failed: {type(e).__name__}")
        return fn(*args, **kwargs)
    if result_at is not None:
        out = tuple(_result_item(x) if i == result_at else x for i, x in enumerate(out))
    return out


def _caller(key: str, exp):
    """The jitted call of an exported program, one object per key (so that :func:`prepare_call`
    can compile it ahead of the call)."""
    c = _CALLERS.get(key)
    if c is None or c[0] is not exp:  # a program loaded again (a damaged entry dropped) gets its own
        c = _CALLERS[key] = (exp, jax.jit(exp.call))
    return c[1]


def prepare_call(fn, args: tuple, kwargs: dict) -> None:
    """Trace, lower and compile what :func:`cached_call` of the same arguments will call, without
    calling it: run ahead of the call (in another thread), the call then finds its program compiled
    (same shapes, dtypes and static arguments; the values do not matter). Any failure only loses
    that head start."""
    try:
        if _DIR is None or jax.device_count() != 1:
            fn.lower(*args, **kwargs).compile()
            return
        dyn, static = eqx.partition((args, kwargs), eqx.is_array)
        leaves, treedef = jax.tree.flatten(dyn)
        key = _key(getattr(fn, "__name__", repr(fn)), treedef, leaves, static)
        exp = None if key in _NOT_EXPORTABLE else (_LOADED.get(key) or _load_or_export(key, fn, treedef, static, leaves))
        if exp is None:
            fn.lower(*args, **kwargs).compile()
            return
        _LOADED.setdefault(key, exp)
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        _caller(key, _LOADED[key]).lower(*[jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev)
                                           for x in leaves]).compile()  # fmt: skip
    except Exception:  # noqa: BLE001 (ahead-of-time work only: the call itself does it again)
        return


def _load_or_export(key: str, fn, treedef, static, leaves):
    path = _DIR / f"{key}.jaxexport"
    try:
        raw_file = path.read_bytes()
    except OSError:  # not cached yet (or unreadable): export it
        raw_file = None
    if raw_file is not None:
        try:
            return jax.export.deserialize(bytearray(_unpack(key, raw_file)))
        except _Damaged as e:
            _drop(path, str(e))
        except Exception as e:  # any failure to deserialize: the entry is dropped, never trusted
            _drop(path, f"cannot be deserialized: {type(e).__name__}")
    raw = getattr(fn, "__wrapped__", fn)

    def flat(*xs):
        a, k = eqx.combine(jax.tree.unflatten(treedef, list(xs)), static)
        return _plain(raw(*a, **k))

    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    jf = jax.jit(flat)  # one object: a retry below reuses its trace
    allowed: list[str] = []
    for _ in range(8):
        try:
            checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in allowed]
            exp = jax.export.export(jf, disabled_checks=checks)(*specs)
            blob = exp.serialize()
            break
        except ValueError as e:
            # LAPACK kernels (the event's Newton root find solves a small linear system) are
            # not on jax.export's list of stable targets; they are stable within one jaxlib,
            # which is part of the key. Anything else (a host callback): the ordinary call.
            new = {t for t in re.findall(r"custom_call @(\w+)", str(e)) if t.startswith("lapack_")}
            if "no compatibility guarantees" not in str(e) or not new - set(allowed):
                return None
            allowed += sorted(new - set(allowed))
        except Exception:  # an unserializable output, serialization unavailable: the ordinary call
            return None
    else:
        return None
    try:
        _DIR.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(_pack(key, bytes(blob)))
        os.replace(tmp, path)
    except OSError:
        pass
    return exp


# ---------------------------------------------------------------------------
# Compiled programs and the process's memory maps
# ---------------------------------------------------------------------------
#
# Every program XLA:CPU compiles keeps its machine code in memory maps of its own, for as long
# as the program is cached (jax's caches, and _LOADED / _CALLERS here). Linux caps a process's
# maps at vm.max_map_count (65,530 by default), and jaxlib does not survive reaching it: the
# next compilation dies of a segmentation fault. A process that compiles thousands of distinct
# programs (a grid whose points differ in shape, a test suite: one module of gflow's reached
# 26,000 maps) must free them.


def mapped_regions() -> int | None:
    """The number of memory maps this process holds (``/proc/self/maps``; ``None`` off Linux)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def map_limit() -> int | None:
    """The kernel's cap on a process's memory maps (``vm.max_map_count``; ``None`` off Linux)."""
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_compiled_programs() -> None:
    """Drop every compiled program this process caches: jax's caches (``jax.clear_caches``) and
    the export cache's loaded programs (the files on disk stay). The next call of a program
    compiles it again, to the same executable: results do not change, only the time."""
    _LOADED.clear()
    _CALLERS.clear()
    jax.clear_caches()
    gc.collect()


def relieve_memory_maps(fraction: float = 0.5, *, limit: int | None = None) -> bool:
    """:func:`free_compiled_programs` when this process holds more than `fraction` of its memory
    maps' cap (`limit`, by default :func:`map_limit`); ``True`` when it did. A grid calls it
    after each point (``gflow.runs``), so that a long grid in one process never reaches the cap."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"relieve_memory_maps: fraction must be in (0, 1], got {fraction!r}")
    limit = map_limit() if limit is None else limit
    n = mapped_regions()
    if limit is None or n is None or n <= fraction * limit:
        return False
    free_compiled_programs()
    return True
