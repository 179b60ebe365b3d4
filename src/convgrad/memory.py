"""Memory policy: how much memory the machine has free, and the admission
check every call passes before anything large is allocated.

- :func:`available_bytes` reads ``MemAvailable`` from ``/proc/meminfo`` (Linux);
  elsewhere it falls back to ``os.sysconf`` free physical pages, and to None
  when nothing is known (then no call is refused for lack of memory).
- :func:`admit` estimates the *minimum* a call needs -- the result in the
  compute dtype, the compute-dtype copies of inputs in another dtype,
  the cast of the result back to a narrower dtype, and the smallest working
  set a kernel can run in -- and raises :class:`MemoryLimitError` (a
  ``ConvGradError``, hence a ``ValueError``; also a ``MemoryError``) naming the
  sizes when that cannot fit into the available memory.  It is a lower bound:
  a call it admits may still need more (kernels use up to the workspace budget
  on top); a call it refuses would need more than the free physical memory
  (swap is not counted: a call that would only run by swapping is refused).
"""

from __future__ import annotations

import math
import os
import time

import numpy as np

from .dtypes import compute_dtype
from .errors import ConvGradError
from .geometry import ConvGeometry


class MemoryLimitError(ConvGradError, MemoryError):
    """A call needs more memory than the machine has available."""


# A reading is reused for this long (seconds): reading /proc/meminfo costs about
# 70 us hot, and 0.6-1.5 ms in a call that follows a pause of the process (the
# kernel's memory counters are cold by then: measured after the benchmark's 0.15 s
# pause), while the memory a machine has free rarely changes that fast.  A call that
# needs more than 1/ADMIT_FRESH of a reading is admitted on a fresh one (admit).
AVAILABLE_TTL = 5.0
ADMIT_FRESH = 4
# Readings keep their 7 leading bits (a relative precision of 1/64 or better), so
# that what is derived from them -- the default workspace budget, and with it the
# kernel chooser's cached decisions -- stays the same from one reading to the next.
AVAILABLE_BITS = 7
_last_reading: tuple[float, int | None] = (-1e9, None)


def available_bytes() -> int | None:
    """Memory the machine can give this process now, in bytes (None if unknown),
    rounded down to its ``AVAILABLE_BITS`` leading bits; a reading at most
    ``AVAILABLE_TTL`` seconds old."""
    global _last_reading
    now = time.monotonic()
    if now - _last_reading[0] < AVAILABLE_TTL:
        return _last_reading[1]
    value = _read_available()
    if value is not None:
        shift = max(0, value.bit_length() - AVAILABLE_BITS)
        value = value >> shift << shift
    _last_reading = (now, value)
    return value


def refresh_available() -> None:
    """Make the next :func:`available_bytes` read the memory afresh."""
    global _last_reading
    _last_reading = (-1e9, None)


def _read_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _fmt(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


OUTPUT_SHAPES = {"fwd": "y_shape", "wgrad": "w_shape", "dgrad": "x_shape"}


def minimum_bytes(kind: str, a: np.ndarray, b: np.ndarray, geom: ConvGeometry,
                  dtype: np.dtype, cdt: np.dtype) -> dict[str, int]:
    """The parts of the smallest working set of one canonical call, in bytes."""
    out_elems = math.prod(getattr(geom, OUTPUT_SHAPES[kind]))
    parts = {"result": out_elems * cdt.itemsize}
    # dtype conversions only: a layout copy depends on the kernel chosen (a
    # channels-last kernel reads an NXC caller's array as it is)
    copies = sum(x.size * cdt.itemsize for x in (a, b) if x.dtype != cdt)
    if copies:
        parts["input copies"] = copies
    if dtype != cdt:
        parts["cast of the result"] = out_elems * dtype.itemsize
    # a kernel needs at least one kernel tap of one sample at a time: the
    # output positions of one sample for C/G channels (im2col's column buffer)
    if geom.n and math.prod(geom.out_sizes):
        parts["working set"] = (geom.c // geom.groups * math.prod(geom.out_sizes)
                                * cdt.itemsize)
    return parts


def admit_again(need: int, op: str, kind: str, a: np.ndarray, b: np.ndarray,
                geom: ConvGeometry, dtype) -> None:
    """:func:`admit` for a call whose minimum working set ``need`` is known (the same
    call admitted before): nothing to do while the memory reading at hand has room
    for it ``ADMIT_FRESH`` times over, else the whole check on a fresh reading."""
    avail = available_bytes()
    if avail is None or need * ADMIT_FRESH <= avail:
        return
    admit(op, kind, a, b, geom, dtype)


def admit(op: str, kind: str, a: np.ndarray, b: np.ndarray, geom: ConvGeometry,
          dtype) -> int:
    """Raise MemoryLimitError if the minimum working set of ``ops.compute(kind,
    a, b, geom, dtype)`` exceeds the available memory; otherwise (or when the
    available memory is unknown) return that working set, in bytes."""
    dtype = np.dtype(dtype)
    parts = minimum_bytes(kind, a, b, geom, dtype, compute_dtype(dtype))
    need = sum(parts.values())
    avail = available_bytes()
    if avail is not None and need * ADMIT_FRESH > avail:
        refresh_available()            # (a large call: decided on a fresh reading)
        avail = available_bytes()
    if avail is None or need <= avail:
        return need
    detail = ", ".join(f"{k} {_fmt(v)}" for k, v in parts.items())
    raise MemoryLimitError(
        f"{op}: output shape = {list(getattr(geom, OUTPUT_SHAPES[kind]))}: needs at least "
        f"{_fmt(need)} ({detail}) but only {_fmt(avail)} of memory is available")
