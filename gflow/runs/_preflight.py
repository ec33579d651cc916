"""The resource preflight: the memory a configuration needs, estimated before any compute.

:func:`estimate_memory` adds up, from the configuration alone (exact integer arithmetic on the
bounded sizes of :data:`gflow.config.LIMITS`, so no expression can hang), the largest
arrays a run allocates:

- the **sample** (always float64): the kernels ``N·d^k·d`` (the Dirichlet draw and
  ``log π`` beside it), the stationary start's window chain (``N·(d^m)²`` per transition
  matrix, vmapped over the sequences, and the host's table of the ``d^m`` windows), the
  chain's tokens ``N·(burn_in + L + 1)`` and its keys;
- the **features** of the layout (:func:`gflow.core.resolve_layout`): counts
  ``N·d·(d+1)^span``, positions ``N·L·span²`` (twice with ``norm = "layer"`` or
  ``head_norm``), heads ``N·(L+1)·H`` codes;
- the **loss**: one gradient's working set (``estimator.chunk`` sequences at a time when set)
  and the κ tables of the counts and heads layouts (``((d+1)^span)²·|𝒮|``);
- the **trajectory** (``save_per_decade`` × decades saved rows of every parameter and its
  gradient) and, for ``gflow theory`` and the checks, the Ĩ ranking over ``n_pi`` prior
  kernels;

times the number of replicates integrated at once (vmapped). :func:`preflight` refuses
(``ResourceError``, a ``ValueError``: exit 2 on the command line) when the estimate exceeds the
memory available: ``MemAvailable`` of ``/proc/meminfo`` (else ``os.sysconf``'s physical
pages), or the environment variable ``GFLOW_MAX_MEMORY`` when set (a size: ``64G``,
``500M``, ``1.5T``, a number of bytes; ``none`` turns the preflight off). The error names
the keys of the largest parts and the estimate.

**How close it is** (``scripts/benchmarks/preflight_calibrate.py``: the peak resident memory of a fresh
process that builds the loss and takes one gradient and the loss statistics, minus its resident
memory after importing gflow; float64, 2 CPU cores): the estimate is an upper bound within a
factor of 1.1–1.7 — default run 0.72 GB estimated / 0.64 GB measured; ``N = 10⁵`` 1.80 / 1.15;
``N = 2·10⁴, L = 200, M = 6`` (positions layout) 6.6 / 4.8; ``parents = [1, 2, 3, 4], N = 2·10⁴``
4.1 / 2.4. A fixed 0.6 GB is XLA's compiler and runtime (measured 0.55–0.6 GB whatever the
size); the rest over-counts because XLA reuses and fuses buffers. The preflight is meant to
refuse the requests that cannot fit (343 GB, 1.6 TB, 10¹⁰ PB) at once, not to pack memory
tightly; ``GFLOW_MAX_MEMORY`` overrides it.
"""

from __future__ import annotations

import math
import os
import re
from typing import NamedTuple

from ..config import Config, n_sets
from ..core import resolve_layout


class ResourceError(ValueError):
    """A configuration that needs more memory than is available (exit 2 on the command line)."""


class Part(NamedTuple):
    name: str
    bytes: int
    keys: tuple[str, ...]


def _sets(cfg: Config) -> int:
    return n_sets(cfg.model.H, cfg.model.D)


def _saved_rows(cfg: Config) -> int:
    sv, sc = cfg.solver, cfg.schedule
    ends = [sc.t1] if sc.kind == "joint" else list(sc.durations)
    rows = 1
    for T in ends:
        decades = max(0.0, math.log10(T / sv.tau_min)) if T > 0 else 0.0
        rows += int(math.ceil(decades * sv.save_per_decade)) + 3
    return rows


def estimate_memory(cfg: Config, *, replicates: int = 1, n_pi: int = 0) -> list[Part]:
    """The parts of the memory `cfg` needs (bytes, and the keys each depends on), largest first.
    `replicates`: samples held at once (vmapped); `n_pi`: prior kernels of the Ĩ ranking (theory)."""
    d, est, m = cfg.data, cfg.estimator, cfg.model
    N, dd, L = int(est.N), int(d.d), int(d.L)
    item = 8 if est.dtype == "float64" else 4
    k, pk = len(d.parents), int(max(d.parents))
    K = dd**k
    span = int(m.span)
    nS = _sets(cfg)
    R = max(1, int(replicates))
    Nw = int(est.chunk) if 0 < est.chunk < N else N
    work_keys = ("estimator.N",) if Nw == N else ("estimator.chunk",)
    parts = []
    # the sample (float64): Dirichlet gamma draws, π and log π
    parts.append(Part("the kernels (N·d^k·d numbers)", R * 4 * N * K * dd * 8, ("estimator.N", "data.d", "data.parents")))
    ngram = d.kind == "ngram"  # the other kinds draw no window chain and have no Ĩ ranking
    if d.start == "stationary" and ngram:
        S = dd**pk
        parts.append(Part("the stationary start's window chain (N·(d^m)² numbers, m the largest parent)",
                          R * 3 * N * S * S * 8, ("estimator.N", "data.d", "data.parents", "data.start")))  # fmt: skip
        parts.append(Part("the table of the d^m windows (host)", S * (64 + 12 * pk), ("data.d", "data.parents", "data.start")))
    steps = int(d.burn_in) + L + 1
    parts.append(Part("the chain's tokens (N·(burn_in + L + 1))", R * (3 * N * steps * 4 + steps * 16),
                      ("estimator.N", "data.burn_in", "data.L")))  # fmt: skip
    layout = resolve_layout(est.layout, dd, m)
    span_keys = ("model.M",) if m.windows == "aligned" else ("model.M", "model.H")
    if layout == "counts":
        K1 = (dd + 1) ** span
        parts.append(Part("the counts features (N·d·(d+1)^span numbers)", R * 2 * N * dd * K1 * item,
                          ("estimator.N", "data.d", *span_keys, "estimator.layout")))  # fmt: skip
        parts.append(Part("the loss's working set (N·d·(d+1)^span per gradient)", R * 3 * Nw * dd * K1 * item,
                          (*work_keys, "data.d", *span_keys, "estimator.layout")))  # fmt: skip
        parts.append(Part("the κ tables (((d+1)^span)²·|𝒮| numbers)", R * 2 * K1 * K1 * (nS + 1) * item
                          + K1 * span * (12 + 8 * dd), ("data.d", *span_keys, "model.H", "model.D", "estimator.layout")))  # fmt: skip
    elif layout == "positions":
        mult = 2 if m.self_match else 1
        parts.append(Part("the positions features (N·L·span² numbers)", R * mult * 2 * N * (L + 1) * span * span * item,
                          ("estimator.N", "data.L", *span_keys, "estimator.layout")))  # fmt: skip
        parts.append(Part("the loss's working set (N·L·(span² + |𝒮| + H) per gradient)",
                          R * Nw * L * (2 * span * span + 4 * (nS + m.H)) * item,
                          (*work_keys, "data.L", *span_keys, "model.H", "model.D")))  # fmt: skip
    else:  # heads
        K1 = (dd + 1) ** int(m.M)
        parts.append(Part("the heads features (N·L·H codes)", R * N * (L + 1) * (m.H + span) * 8,
                          ("estimator.N", "data.L", "model.H", "estimator.layout")))  # fmt: skip
        parts.append(Part("the loss's working set (N·L·(H + |𝒮|) per gradient)", R * 4 * Nw * L * (m.H + nS) * item,
                          (*work_keys, "data.L", "model.H", "model.D")))  # fmt: skip
        parts.append(Part("the head tables (H·((d+1)^M)² numbers)", R * 2 * m.H * K1 * K1 * item + K1 * m.M * (12 + 8 * dd),
                          ("data.d", "model.M", "model.H")))  # fmt: skip
    parts.append(Part("the per-sequence gradients (N·(H·span + |𝒮|))", R * 2 * N * (m.H * span + nS + 2) * item,
                      ("estimator.N", "model.H", *span_keys, "model.D")))  # fmt: skip
    row = (3 * m.H * span + 3 * nS + 12) * 8
    parts.append(Part("the saved trajectory (rows × parameters and gradients)", R * 3 * _saved_rows(cfg) * row,
                      ("solver.save_per_decade", "schedule.durations", "solver.tau_min", "model.H", "model.D")))  # fmt: skip
    if n_pi and ngram:
        npi = 1 if d.kernel is not None else int(n_pi)
        W = max(int(m.H), pk) + 1
        S = dd**pk
        parts.append(Part("the theory's Ĩ ranking (n_pi kernels × d^W window laws)",
                          3 * npi * (S * S + dd**W + K * dd) * 8 + dd**W * (64 + 12 * W),
                          ("data.d", "data.parents", "model.H")))  # fmt: skip
    # XLA's compiler and the compiled programs of a run, whatever its size (measured: 0.55–0.6 GB)
    parts.append(Part("XLA's compiler and runtime (fixed)", _RUNTIME, ()))
    return sorted(parts, key=lambda p: -p.bytes)


_RUNTIME = 600 * 10**6


def fmt_bytes(n: int) -> str:
    """``1.6 TB``; exact-integer safe (a size beyond a float's range prints as ``10^k B``)."""
    if n.bit_length() > 1000:
        return f"10^{int(n.bit_length() * math.log10(2))} B"
    for unit, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            x = n / size
            return f"{x:.3g} {unit}" if x < 1e6 else f"{x:.3e} {unit}"
    return f"{n} B"


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}


def available() -> tuple[int | None, str]:
    """``(bytes, where the number comes from)``; ``(None, …)`` when the preflight is turned off."""
    raw = os.environ.get("GFLOW_MAX_MEMORY")
    if raw is not None and raw.strip():
        s = raw.strip()
        if s.lower() in ("none", "off", "inf"):
            return None, "GFLOW_MAX_MEMORY=none"
        m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMgGtTpP]?)(?:i?[bB])?", s)
        x = float(m.group(1)) * _UNITS[m.group(2).upper()] if m else 0.0
        if not (math.isfinite(x) and x >= 1):
            raise ValueError(
                f"GFLOW_MAX_MEMORY must be a size such as 64G, 500M, 1.5T or a number of bytes (or none), got {raw!r}"
            )
        return int(x), f"GFLOW_MAX_MEMORY={s}"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "os.sysconf's available pages"
    except (ValueError, OSError, AttributeError):
        return None, "unknown (no /proc/meminfo or sysconf)"


def preflight(cfg: Config, *, replicates: int = 1, n_pi: int = 0) -> tuple[int, int | None, str]:
    """Refuse `cfg` (``ResourceError`` naming the keys of the largest parts and the estimate) when
    its estimated memory exceeds the memory available (module docstring). Returns ``(estimate,
    available, where)``."""
    parts = estimate_memory(cfg, replicates=replicates, n_pi=n_pi)
    total = sum(p.bytes for p in parts)
    avail, where = available()
    if avail is not None and total > avail:
        sized = [p for p in parts if p.keys]  # the parts the configuration can change
        big = [p for p in sized if p.bytes * 4 >= sized[0].bytes][:3]
        keys = list(dict.fromkeys(k for p in big for k in p.keys))
        what = "; ".join(f"{p.name}: {fmt_bytes(p.bytes)}" for p in big)
        rep = f" for {replicates} replicates at once" if replicates > 1 else ""
        raise ResourceError(
            f"this configuration needs about {fmt_bytes(total)} of memory{rep} (estimated before any compute), more "
            f"than the {fmt_bytes(avail)} available ({where}); largest: {what}; lower {', '.join(keys)}, or set "
            "GFLOW_MAX_MEMORY to a larger budget (e.g. GFLOW_MAX_MEMORY=200G) to try anyway"
        )
    return total, avail, where
