"""Direct kernels for depthwise and small-group convolutions (channels last).

When a group holds few channels (depthwise: ``C/G = 1``; ResNeXt: 4 by 4) a
convolution is not GEMM-shaped: each output value is a sum of a few dozen
products and the work is bound by memory traffic, not arithmetic.  These
kernels read every input once and write every output once, in the ``"nxc"``
layout, looping over output rows in parallel with the channel vector
innermost (compiled with numba, see :mod:`convgrad.kernels._direct_jit`).

Results are bitwise reproducible for any thread count: fwd and dgrad give
each output row to exactly one worker; wgrad sums a fixed list of row chunks
(set by the geometry, not by the thread count) in chunk order.

The compiled loops are imported on first use, so ``import convgrad`` does not
pay numba's import time.
"""

from __future__ import annotations

import math

import numpy as np

from ..geometry import ConvGeometry
from ._pool import run_ranges

# C/G * O/G above this, oneDNN-class GEMM kernels win (benchmarks/direct_kernel.py
# --crossover: at 4x4 the direct kernel is about even with PyTorch, at 8x8
# 0.45-0.6x, at 16x16 0.2-0.3x; it beats im2col at every size).
MAX_GROUP_PRODUCT = 16
# Below this many FLOPs one thread is faster than waking the others.
SERIAL_FLOPS = 2**18
# wgrad sums at most this many per-chunk partial weight gradients ...
MAX_CHUNKS = 64
# ... and keeps them under this many bytes.
PARTIALS_BYTES = 32 * 2**20

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def supports(geom: ConvGeometry, dtype) -> str | None:
    if np.dtype(dtype) not in _DTYPES:
        return f"computes in float32/float64 only, not {np.dtype(dtype)}"
    cg, og = geom.c // geom.groups, geom.o // geom.groups
    if cg * og > MAX_GROUP_PRODUCT:
        return (f"C/G * O/G = {cg} * {og} > {MAX_GROUP_PRODUCT}: GEMM-shaped, "
                f"the GEMM kernels are faster")
    return None


def workspace(geom: ConvGeometry, op: str, itemsize: int) -> dict[str, int]:
    """Bytes by part this kernel allocates besides its result (see
    ``kernels.estimate``): the compiled loops' row caches (one per running
    task), the reordered weights of a data gradient, the per-chunk partial
    weight gradients."""
    from ._blas import workers
    cg, og = geom.c // geom.groups, geom.o // geom.groups
    k = (1,) * (3 - geom.spatial_rank) + tuple(geom.kernel)
    s = (1,) * (3 - geom.spatial_rank) + tuple(geom.in_sizes)
    m = (1,) * (3 - geom.spatial_rank) + tuple(geom.out_sizes)
    rows = {"fwd": s[2] * cg * geom.o, "wgrad": s[2] * cg * geom.o, "dgrad": m[2] * og * geom.c}
    parts = {"row caches": workers() * k[0] * k[1] * rows[op] * itemsize}
    w_bytes = math.prod(geom.w_shape) * itemsize
    if op == "dgrad":
        parts["reordered weights"] = w_bytes
    elif op == "wgrad":
        parts["partial weight gradients"] = _wgrad_chunks(geom, w_bytes) * w_bytes
    return parts


def _wgrad_chunks(geom: ConvGeometry, w_bytes: int) -> int:
    rows = geom.n * math.prod(geom.out_sizes[:-1])
    return max(1, min(rows, MAX_CHUNKS, PARTIALS_BYTES // max(1, w_bytes)))


def _jit():
    from . import _direct_jit
    return _direct_jit


def _threads(geom: ConvGeometry) -> int:
    """``settings.threads()`` (the CPU count without it), one for problems too
    small to repay starting the others."""
    from ._blas import workers
    return 1 if geom.flops < SERIAL_FLOPS else workers()


def _run(fn, args, ntasks: int, threads: int) -> None:
    """``fn(*args, lo, hi)`` over ``[0, ntasks)``, split into blocks run on
    ``threads`` threads (a block's result does not depend on the split)."""
    run_ranges(lambda lo, hi: fn(*args, lo, hi), ntasks, threads)


def _args(geom: ConvGeometry):
    """Sizes and (s, d, pb) as int64 arrays of 3 (or 4: batch first), leading
    spatial axes padded neutrally, then C, O, C/G, O/G."""
    pad = 3 - geom.spatial_rank

    def a3(v, fill, lead=()):
        return np.array(tuple(lead) + (fill,) * pad + tuple(v), np.int64)

    cg, og = geom.c // geom.groups, geom.o // geom.groups
    return (a3(geom.in_sizes, 1, (geom.n,)), a3(geom.kernel, 1), a3(geom.out_sizes, 1, (geom.n,)),
            geom.c, geom.o, a3(geom.strides, 1), a3(geom.dilations, 1), a3(geom.pads_begin, 0),
            cg, og)


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1)


def fwd(x: np.ndarray, w: np.ndarray, geom: ConvGeometry) -> np.ndarray:
    y = np.empty((geom.n, *geom.out_sizes, geom.o), x.dtype)
    if y.size == 0:
        return y
    if x.size == 0 or w.size == 0:
        y[...] = 0
        return y
    _run(_jit().fwd, (_flat(x), _flat(w), _flat(y), *_args(geom)),
         geom.n * math.prod(geom.out_sizes[:-1]), _threads(geom))
    return y


def dgrad(w: np.ndarray, dy: np.ndarray, geom: ConvGeometry) -> np.ndarray:
    dx = np.empty((geom.n, *geom.in_sizes, geom.c), w.dtype)
    if dx.size == 0:
        return dx
    if dy.size == 0 or w.size == 0:
        dx[...] = 0
        return dx
    cg, og = geom.c // geom.groups, geom.o // geom.groups
    # we[t, j, c] = w[t, c % cg, g(c)*og + j]: the weights each input channel
    # meets, indexed by its position j inside its group's output channels
    k = w.shape[:-2]
    r = len(k)
    wg = w.reshape(*k, cg, geom.groups, og)                      # (*K, i, g, j)
    we = np.ascontiguousarray(wg.transpose(*range(r), r + 2, r + 1, r))
    _run(_jit().dgrad, (_flat(we), _flat(dy), _flat(dx), *_args(geom)),
         geom.n * math.prod(geom.in_sizes[:-1]), _threads(geom))
    return dx


def wgrad(x: np.ndarray, dy: np.ndarray, geom: ConvGeometry) -> np.ndarray:
    cg = geom.c // geom.groups
    dw = np.zeros((*geom.kernel, cg, geom.o), x.dtype)
    if dw.size == 0 or x.size == 0 or dy.size == 0:
        return dw
    nchunks = _wgrad_chunks(geom, dw.size * x.itemsize)
    part = np.empty((nchunks, dw.size), x.dtype)
    _run(lambda *a: _jit().wgrad_partials(*a, nchunks),
         (_flat(x), _flat(dy), _flat(part), *_args(geom)), nchunks, _threads(geom))
    # in chunk order, whatever the thread count
    np.add.reduce(part, axis=0, out=_flat(dw))
    return dw
