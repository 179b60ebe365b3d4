"""Result arrays whose memory is recycled across calls (docs/decisions.md D25).

A large result allocated afresh costs its page faults: the kernel zeroes every new
page before the kernels write it.  For the data gradient of MobileNetV2's stride-2
depthwise layer (a 38.5 MB result) that was more than the computation: 5.3 ms into a
reused buffer against 8.2-18 ms into a fresh one (2 threads).  So a result of at
least :data:`MIN_BYTES` is a view of a buffer that goes back to a small pool when the
caller's last reference to it (or to any view of it) is dropped, and the next result
of the same size takes it from there: a training loop, which computes the same shapes
again and again, then writes into memory that is already mapped.

The caller sees an ordinary writable NumPy array (its ``base`` is a :class:`Lease`);
its contents are undefined until the kernel writes them, as with ``np.empty``.  Idle
buffers are bounded by :data:`POOL_BYTES` and by ``convgrad.config(workspace_bytes=...)``
(oldest dropped first); :func:`clear` releases them.  A forked child starts with an
empty pool.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict

import numpy as np

from .. import settings
from ._bound import address

# Results smaller than this come from NumPy (the heap reuses small blocks by itself).
MIN_BYTES = 1 * 2**20
# Idle buffers kept at most (and at most the workspace budget).
POOL_BYTES = 256 * 2**20
# Buffer sizes are rounded up to this, so that nearly equal results share buffers.
GRAIN = 64 * 2**10
ALIGN = 64

_lock = threading.Lock()
_idle: OrderedDict[int, list] = OrderedDict()     # size -> raw buffers, oldest size first
_idle_bytes = 0


def _reset_after_fork() -> None:
    global _lock, _idle, _idle_bytes
    _lock, _idle, _idle_bytes = threading.Lock(), OrderedDict(), 0


os.register_at_fork(after_in_child=_reset_after_fork)


class Lease:
    """The owner of a result's memory: exposes it as an array, and returns the buffer
    to the pool when the last array using it is gone."""

    def __init__(self, raw: np.ndarray, shape: tuple, typestr: str, recycled: bool = False):
        self._raw = raw
        self.recycled = recycled        # the memory was used before (its pages mapped)
        at = address(raw)
        self.__array_interface__ = {"shape": shape, "typestr": typestr,
                                    "data": (at + (-at) % ALIGN, False), "version": 3}

    def __del__(self):
        try:
            _give_back(self._raw)
        except Exception:                          # (interpreter shutdown)
            pass


def _take(size: int) -> np.ndarray | None:
    global _idle_bytes
    with _lock:
        bufs = _idle.get(size)
        if not bufs:
            return None
        raw = bufs.pop()
        if not bufs:
            del _idle[size]
        _idle_bytes -= size
        return raw


def _give_back(raw: np.ndarray) -> None:
    global _idle_bytes
    size = raw.nbytes - ALIGN
    limit = min(POOL_BYTES, settings.workspace_bytes())
    with _lock:
        if size > limit:
            return
        while _idle_bytes + size > limit and _idle:
            old, bufs = next(iter(_idle.items()))
            bufs.pop(0)
            _idle_bytes -= old
            if not bufs:
                del _idle[old]
        _idle.setdefault(size, []).append(raw)
        _idle.move_to_end(size)
        _idle_bytes += size


def empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array, ``ALIGN``-byte aligned when it is large
    enough to come from the pool."""
    dtype = np.dtype(dtype)
    nbytes = int(math.prod(shape)) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(shape, dtype)
    size = -(-nbytes // GRAIN) * GRAIN
    raw = _take(size)
    recycled = raw is not None
    if raw is None:
        raw = np.empty(size + ALIGN, np.uint8)
    if dtype.kind == "f" and dtype.isnative:
        # the array as it is returned, straight from the lease, not a byte array
        # viewed and reshaped: after a pause of the process every NumPy call and
        # object a call touches costs 20-30x its hot time (docs/kernels.md, "Where a
        # call's time goes after the pause"); ResNet-50 res2's 25.7 MB 1x1 data
        # gradient's result after the 0.15 s pause: 67-76 -> 55-57 us in two runs
        # (figures that move by 10 us from run to run)
        return np.asarray(Lease(raw, tuple(map(int, shape)), dtype.str, recycled))
    # (bytes viewed as the dtype: an array interface cannot name a dtype such as
    # ml_dtypes' bfloat16, whose typestr is a void '<V2')
    flat = np.asarray(Lease(raw, (nbytes,), "|u1", recycled))
    return flat.view(dtype).reshape(shape)


def zeros(shape, dtype) -> np.ndarray:
    """:func:`empty`, zeroed: for results the kernels add into (weight gradients).  A
    fresh ``np.zeros`` reuses the heap only while nothing else runs: alternating with
    another library, glibc gives trimmed memory back and every call faults its pages
    again (ResNet-50 res5's 9.4 MB weight gradient: 26-36 ms instead of 12-14)."""
    out = empty(shape, dtype)
    out.fill(0)
    return out


def recycled(a: np.ndarray) -> bool:
    """Whether ``a`` (or the array it views) is a result of :func:`empty` in memory
    taken back from the pool: its pages are mapped, so a kernel may write it with
    streaming stores (into fresh pages, which the kernel zeroes through the caches
    first, they ran 1.3x slower than plain stores)."""
    while isinstance(a, np.ndarray):
        a = a.base
    return isinstance(a, Lease) and a.recycled


# Results at least this large may be written with streaming stores (streams()).
STREAM_MIN_BYTES = 4 * 2**20


def streams(a: np.ndarray, min_bytes: int | None = None) -> bool:
    """Whether a kernel may write ``a`` with streaming stores (which skip reading each
    cache line before it is written, and leave it out of the caches): a large result
    (beyond what the caches would keep of it) in recycled memory (:func:`recycled`),
    its base and every stride but the last a multiple of 64 bytes.  The kernels
    stream only stores that fill whole cache lines.  ``min_bytes``: another size from which
    on (default ``STREAM_MIN_BYTES``)."""
    least = STREAM_MIN_BYTES if min_bytes is None else min_bytes
    return (a.nbytes >= least and recycled(a) and address(a) % 64 == 0
            and all(s % 64 == 0 for s in a.strides[:-1]))


def idle_bytes() -> int:
    """Bytes of the buffers waiting in the pool."""
    return _idle_bytes


def clear() -> None:
    """Release every idle buffer."""
    global _idle_bytes
    with _lock:
        _idle.clear()
        _idle_bytes = 0


def streams_runs(a: np.ndarray, min_bytes: int | None = None) -> bool:
    """Whether a kernel that writes ``a`` in runs may stream the whole cache lines of
    each run (the rest with plain stores): a large result in recycled memory
    (:func:`recycled`), its base 64-byte aligned; ``min_bytes`` as in :func:`streams`."""
    least = STREAM_MIN_BYTES if min_bytes is None else min_bytes
    return a.nbytes >= least and recycled(a) and address(a) % 64 == 0


def streams_channels(a: np.ndarray) -> bool:
    """Whether a channels-first float32 result (an (N, *S, C) view whose channels are
    the outermost axis after N) may take streaming stores for whole cache lines of a
    channel's runs: a large result in recycled memory (:func:`recycled`), its base and
    channel rows 64-byte aligned.  The kernels check each run's own alignment."""
    return (a.dtype == np.float32 and a.ndim >= 3 and a.strides[-2] == 4
            and a.strides[-1] % 64 == 0 and a.nbytes >= STREAM_MIN_BYTES
            and address(a) % 64 == 0 and recycled(a))
