"""im2col + GEMM kernels, N-d, grouped, strided, dilated.

For a block of samples and a block of kernel taps, the input values each tap
reads are gathered once into a column buffer ``col[G, C/G, T, nb, *M]``
(zeros where a tap reads padding), and each op becomes one batched GEMM over
the groups:

- fwd:   ``y[g]   (O/G, nb*M)   = w[g] (O/G, C/G*T) @ col[g] (C/G*T, nb*M)``
- wgrad: ``dw[g]  (O/G, C/G*T)  = dy[g] (O/G, nb*M) @ col[g]^T``
- dgrad: ``col[g] (C/G*T, nb*M) = w[g]^T @ dy[g]``, then scattered back
  (col2im) onto the taps' input positions.

The column buffer and the output (or gathered dy) block are bounded by the
workspace budget together (``convgrad.config``): samples are processed in
blocks, and taps too when one sample does not fit; each block's buffers are
freed before the next block's are allocated, so one set is alive at a time.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .. import settings
from ..geometry import ConvGeometry


def _block_sizes(geom: ConvGeometry, op: str, itemsize: int) -> tuple[int, int]:
    """(samples, taps) per block: the column buffer and the block of the
    output (fwd) or of dy gathered by group (several samples) fit the
    workspace together; at least one tap of one sample."""
    ntaps = math.prod(geom.kernel)
    m = math.prod(geom.out_sizes)
    per_tap = max(1, geom.c * m * itemsize)       # one tap of one sample in the column buffer
    per_out = geom.o * m * itemsize               # one sample of y, or of dy gathered
    budget = settings.workspace_bytes()
    nb = budget // (ntaps * per_tap + per_out)
    if nb >= 1:
        return max(1, min(geom.n, nb)), ntaps
    single = per_out if op == "fwd" else 0        # one sample of dy is a view, no copy
    return 1, max(1, min(ntaps, (budget - single) // per_tap))


def workspace(geom: ConvGeometry, op: str, itemsize: int) -> dict[str, int]:
    """Bytes by part this kernel allocates besides its result (see
    ``kernels.estimate``): one column buffer (the previous block's is freed
    first), the output block or gathered dy block, weights-sized pieces."""
    nb, tb = _block_sizes(geom, op, itemsize)
    m = math.prod(geom.out_sizes)
    parts = {"column buffer": geom.c * tb * nb * m * itemsize}
    if op == "fwd" or nb > 1:
        parts["output block" if op == "fwd" else "dy block"] = geom.o * nb * m * itemsize
    parts["weight pieces"] = (2 if op == "wgrad" else 1) * math.prod(geom.w_shape) * itemsize
    return parts


def _blocks(geom: ConvGeometry, op: str, itemsize: int):
    """Yield (n0, n1, taps) blocks of :func:`_block_sizes`."""
    taps = list(enumerate(itertools.product(*(range(k) for k in geom.kernel))))
    nb, tb = _block_sizes(geom, op, itemsize)
    for n0 in range(0, geom.n, nb):
        for t0 in range(0, len(taps), tb):
            yield n0, min(geom.n, n0 + nb), taps[t0:t0 + tb]


def _gview(a: np.ndarray, groups: int) -> np.ndarray:
    """(nb, C, *S) -> view (G, C/G, nb, *S)."""
    nb, c = a.shape[:2]
    g = a.reshape(nb, groups, c // groups, *a.shape[2:])
    return np.moveaxis(g, 0, 2)


def _im2col(x: np.ndarray, geom: ConvGeometry, taps) -> np.ndarray:
    """col[G, C/G, T, nb, *M] for the taps given; zero where a tap reads padding."""
    G = geom.groups
    nb = x.shape[0]
    col = np.zeros((G, geom.c // G, len(taps), nb, *geom.out_sizes), x.dtype)
    xg = _gview(x, G)                                   # (G, C/G, nb, *L)
    for j, (_, tap) in enumerate(taps):
        sl = geom.tap_slices(tap)
        if sl is not None:
            ps, qs = sl
            col[(slice(None), slice(None), j, slice(None)) + ps] = xg[(..., ) + qs]
    return col


def _col_matrix(col: np.ndarray) -> np.ndarray:
    """col[G, C/G, T, nb, *M] -> (G, C/G*T, nb*M)."""
    g, cg, t, nb = col.shape[:4]
    return col.reshape(g, cg * t, nb * math.prod(col.shape[4:]))


def _w_taps(w: np.ndarray, geom: ConvGeometry, taps) -> np.ndarray:
    """(O, C/G, *K) -> (G, O/G, C/G, T) restricted to the taps given."""
    G = geom.groups
    wf = w.reshape(G, geom.o // G, geom.c // G, math.prod(geom.kernel))
    idx = [i for i, _ in taps]
    return wf if len(idx) == wf.shape[-1] else wf[..., idx]


def _dy_block(dy: np.ndarray, geom: ConvGeometry, n0: int, n1: int) -> np.ndarray:
    """dy[n0:n1] (nb, O, *M) -> contiguous (G, O/G, nb*M)."""
    G = geom.groups
    v = _gview(dy[n0:n1], G)
    return np.ascontiguousarray(v).reshape(G, geom.o // G, (n1 - n0) * math.prod(geom.out_sizes))


def fwd(x, w, geom: ConvGeometry):
    G = geom.groups
    y = np.zeros(geom.y_shape, x.dtype)
    for n0, n1, taps in _blocks(geom, "fwd", x.itemsize):
        col = _im2col(x[n0:n1], geom, taps)
        cg, t = col.shape[1], col.shape[2]
        wt = _w_taps(w, geom, taps).reshape(G, geom.o // G, cg * t)
        # (G, O/G, nb*M) = (G, O/G, C/G*T) @ (G, C/G*T, nb*M)
        yb = np.matmul(wt, _col_matrix(col))
        yv = _gview(y[n0:n1], G)
        yv += yb.reshape(yv.shape)
        del col, yb                  # before the next block allocates its own
    return y


def wgrad(x, dy, geom: ConvGeometry):
    G = geom.groups
    og, cg = geom.o // G, geom.c // G
    dw = np.zeros((G, og, cg, math.prod(geom.kernel)), x.dtype)
    for n0, n1, taps in _blocks(geom, "wgrad", x.itemsize):
        col = _im2col(x[n0:n1], geom, taps)
        t = col.shape[2]
        # (G, O/G, C/G*T) = (G, O/G, nb*M) @ (G, nb*M, C/G*T)
        part = np.matmul(_dy_block(dy, geom, n0, n1),
                         _col_matrix(col).transpose(0, 2, 1))
        dw[..., [i for i, _ in taps]] += part.reshape(G, og, cg, t)
        del col                      # before the next block allocates its own
    return dw.reshape(geom.w_shape)


def dgrad(w, dy, geom: ConvGeometry):
    G = geom.groups
    cg = geom.c // G
    dx = np.zeros(geom.x_shape, w.dtype)
    for n0, n1, taps in _blocks(geom, "dgrad", w.itemsize):
        nb = n1 - n0
        wt = _w_taps(w, geom, taps)                          # (G, O/G, C/G, T)
        t = wt.shape[-1]
        # (G, C/G*T, nb*M) = (G, C/G*T, O/G) @ (G, O/G, nb*M)
        col = np.matmul(wt.reshape(G, geom.o // G, cg * t).transpose(0, 2, 1),
                        _dy_block(dy, geom, n0, n1))
        col = col.reshape(G, cg, t, nb, *geom.out_sizes)
        dxv = _gview(dx[n0:n1], G)                           # (G, C/G, nb, *L)
        for j, (_, tap) in enumerate(taps):
            sl = geom.tap_slices(tap)
            if sl is not None:
                ps, qs = sl
                dxv[(...,) + qs] += col[(slice(None), slice(None), j, slice(None)) + ps]
        del col                      # before the next block allocates its own
    return dx
