"""Shifted-GEMM kernels: channels last, no im2col copy.

In channels-last layout a tensor is a matrix of rows (one per position) and
channels.  Pad the input once onto a *grid* and flatten it to rows: the rows
kernel tap ``t`` reads for all output positions are then one contiguous row
range at a fixed offset ``off[t]``, if the output is laid out on the same grid
(rows of the grid that are not output positions are computed and dropped, or
hold zeros).  Each op becomes one GEMM per tap on views, in place:

- fwd:   ``y[p]     += xg[p + off[t]] @ w[t]``         (C/G -> O/G per group)
- wgrad: ``dw[t]     = xg[off[t] : off[t]+P]^T @ dyg``  (dyg: dy on the grid)
- dgrad: a forward correlation of the gridded ``dy`` with the flipped taps.

Strides > 1 split into stride phases (space to depth): tap ``k`` with
``k*d = q*s + r`` reads phase ``r`` of the input at offset ``q``, so every
phase is a stride-1 problem on its own grid; a data gradient computes each
output phase separately.

Rows are processed in blocks that fit in cache, the blocks in parallel on the
kernels' pool with single-threaded BLAS; every output row block is owned by
one task, so results do not depend on scheduling.  The grids cost one copy of
each input; a problem whose grids exceed the workspace budget is processed in
batch blocks, and one that still does not fit is left to im2col.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .. import settings
from ..geometry import ConvGeometry
from ._blas import gemm, run_parallel, scratch, workers

ROW_BLOCK = 1024           # rows per chunk of a weight-gradient GEMM
BLOCK_BYTES = 2 * 2**20    # bytes of input + output rows per data-/forward GEMM block
FOLD_MAX_CHANNELS = 16     # channels per group up to which the taps are folded into one GEMM
FOLD_BYTES = 1 * 2**20     # the folded (local im2col) block
WGRAD_L2_BYTES = 1 << 20   # weight gradients up to this size are accumulated per row block


# -- problem decomposition (integers only) -------------------------------------------

def _taps(geom: ConvGeometry):
    """Per tap (index, phase, q): ``k*d = q*s + r``, phase = tuple(r)."""
    out = []
    for idx, k in enumerate(itertools.product(*(range(n) for n in geom.kernel))):
        r = tuple(ki * d % s for ki, d, s in zip(k, geom.dilations, geom.strides))
        q = tuple(ki * d // s for ki, d, s in zip(k, geom.dilations, geom.strides))
        out.append((idx, r, q))
    return out


def _flat(v, extents) -> int:
    """Row offset of grid position ``v`` in a grid of ``extents``."""
    off = 0
    for x, e in zip(v, extents):
        off = off * e + x
    return off


def _phase_copy(src_len, s, r, pb, grid_len, shift):
    """For grid index ``u`` (``j = u + shift``) holding source ``i = j*s + r - pb``:
    the grid range ``[u0, u1)`` and source slice that are inside ``[0, src_len)``."""
    # i >= 0  <=>  j >= ceil((pb - r) / s)
    j0 = max(shift, -((r - pb) // s))
    j1 = min(shift + grid_len, (src_len - 1 - r + pb) // s + 1)
    if j1 <= j0:
        return None
    i0 = j0 * s + r - pb
    return slice(j0 - shift, j1 - shift), slice(i0, i0 + (j1 - j0 - 1) * s + 1, s)


def _forward_grid(geom: ConvGeometry):
    """Input-phase grids of the forward correlation (fwd and wgrad)."""
    taps = _taps(geom)
    qmax = tuple(max(q[i] for _, _, q in taps) for i in range(geom.spatial_rank))
    extents = tuple(m + qm for m, qm in zip(geom.out_sizes, qmax))
    phases = sorted({r for _, r, _ in taps})
    return taps, extents, phases


def _identity_grid(geom: ConvGeometry, extents, phases) -> bool:
    """True when the single phase grid *is* the input (stride 1, no begin pad,
    grid extents equal to the input sizes): no copy needed."""
    return (phases == [tuple(0 for _ in extents)] and all(s == 1 for s in geom.strides)
            and all(b == 0 for b in geom.pads_begin) and tuple(extents) == geom.in_sizes)


def workspace_rows(geom: ConvGeometry, op: str) -> int:
    """Grid rows per sample (all phases, inputs and outputs), for budgeting."""
    taps, extents, phases = _forward_grid(geom)
    per = math.prod(extents)
    if op == "dgrad":
        return per * (2 + len(phases))
    return per * (len(phases) + 1)


# -- the GEMM cores ---------------------------------------------------------------

def _row_blocks(P: int, per_task: int):
    return [(r, min(P, r + per_task)) for r in range(0, P, per_task)]


def _gather(inputs, taps, out, P, groups):
    """``out[p, :] = sum_t inputs[i_t][p + off_t, :] @ W_t`` for ``p < P``.

    ``taps``: (input index, row offset, W (C/G, OC) with per-group column
    blocks); ``out`` (rows >= P, OC) is fully written for rows < P."""
    if P <= 0:
        return
    cin = inputs[0].shape[1] // groups if inputs else 0
    cout = out.shape[1] // groups
    if not taps or cin == 0:
        out[:P] = 0
        return

    def per_tap(r0, r1):
        def run():
            for g in range(groups):
                oc = out[r0:r1, g * cout:(g + 1) * cout]
                for j, (i, off, w) in enumerate(taps):
                    gemm(inputs[i][r0 + off:r1 + off, g * cin:(g + 1) * cin],
                         w[:, g * cout:(g + 1) * cout], oc, beta=0.0 if j == 0 else 1.0)
        return run

    fold = _fold_plan(inputs, taps, cin)
    if fold is not None:
        from ._fold_jit import gather_taps
        # all taps' weights on the inner dimension, per group: (T*C/G, OC/G)
        wcat = [np.ascontiguousarray(np.concatenate(
            [w[:, g * cout:(g + 1) * cout] for _, _, w in taps], axis=0)) for g in range(groups)]

        def folded(r0, r1):
            def run():
                step = max(16, FOLD_BYTES // (len(taps) * cin * out.itemsize))
                buf = scratch("fold", (min(step, r1 - r0), len(taps) * cin), out.dtype,
                              zero=False)
                for g in range(groups):
                    for b0 in range(r0, r1, step):
                        b1 = min(r1, b0 + step)
                        gather_taps(fold[0], inputs[0].shape[1], g * cin, cin, fold[1], b0,
                                    b1 - b0, buf)
                        gemm(buf[:b1 - b0], wcat[g], out[b0:b1, g * cout:(g + 1) * cout])
            return run

    block = per_tap if fold is None else folded
    row_bytes = (inputs[0].shape[1] + out.shape[1]) * out.itemsize
    run_parallel(block(r0, r1) for r0, r1 in _row_blocks(P, _block_rows(P, row_bytes)))


def _fold_plan(inputs, taps, cin):
    """The flat source for folded GEMMs, or None to keep one GEMM per tap.

    Folding copies every tap's rows once more (in cache, compiled, without
    the GIL), and pays where a GEMM per tap is too thin to run well: few
    channels per group (ResNet-50 conv1's weight gradient, 3 channels: 3.4x
    faster); from 32 channels on the per-tap GEMMs measured as fast or faster.
    """
    if len(taps) < 2 or cin > FOLD_MAX_CHANNELS:
        return None
    first, rows = inputs[0], inputs[0].shape[0]
    for i, a in enumerate(inputs):            # phase grids: consecutive blocks of one array
        if (not a.flags.c_contiguous or a.shape != first.shape
                or a.ctypes.data != first.ctypes.data + i * first.nbytes):
            return None
    flat = np.lib.stride_tricks.as_strided(first.reshape(-1), shape=(len(inputs) * first.size,),
                                           strides=(first.itemsize,), writeable=False)
    offs = np.array([off + i * rows for i, off, _ in taps], np.int64)
    return flat, offs


def _block_rows(P: int, row_bytes: int) -> int:
    """Rows per task: a block of every operand stays in L2, and every worker
    gets work."""
    rows = min(4096, max(128, BLOCK_BYTES // max(1, row_bytes)))
    return max(1, min(rows, -(-P // workers())))


def _wgrad_chunks(P: int, T: int, dw_bytes: int) -> int:
    """Row chunks of a weight gradient over ``P`` rows (one partial each)."""
    nw = workers()
    if dw_bytes <= WGRAD_L2_BYTES:
        return max(1, min(nw, P // ROW_BLOCK)) if nw > 1 else 1
    if P < 2 * ROW_BLOCK:
        return 1
    if T >= 4 * nw:
        return nw // math.gcd(T, nw)          # tasks divide evenly among workers
    return max(1, min(-(-4 * nw // T), P // ROW_BLOCK))


def _wgrad_core(inputs, taps, dyg, P, groups, dw):
    """``dw[t] = sum_p inputs[i_t][p + off_t]^T @ dyg[p]`` over ``p < P``;
    ``dw`` (T, C/G, OC).

    Small ``dw`` (it stays in L2): tasks are row chunks, each running every
    tap over cache-sized row blocks into its own partial ``dw`` (the rows of
    ``x`` and ``dy`` are read from memory once).  Large ``dw``: tasks are
    (tap, row chunk) GEMMs, big enough on their own.  Partials are summed in
    a fixed order, so scheduling never changes the result."""
    T = len(taps)
    if T == 0:
        return
    cin = dw.shape[1]
    cout = dw.shape[2] // groups
    by_rows = dw.nbytes <= WGRAD_L2_BYTES
    chunks = _wgrad_chunks(P, T, dw.nbytes)
    bounds = [round(P * c / chunks) for c in range(chunks + 1)]
    parts = scratch("parts", (chunks,) + dw.shape, dw.dtype, zero=False) if chunks > 1 \
        else dw[None]

    def gemm_tap(c, t, r0, r1, beta):
        i, off, _ = taps[t]
        for g in range(groups):
            gemm(inputs[i][r0 + off:r1 + off, g * cin:(g + 1) * cin].T,
                 dyg[r0:r1, g * cout:(g + 1) * cout], parts[c, t, :, g * cout:(g + 1) * cout],
                 beta=beta)

    def per_tap_chunk(c):
        def run():
            r0, r1 = bounds[c], bounds[c + 1]
            step = max(128, BLOCK_BYTES // max(1, (inputs[0].shape[1] + dyg.shape[1])
                                                 * dw.itemsize))
            for b0 in range(r0, r1, step):
                for t in range(T):
                    gemm_tap(c, t, b0, min(r1, b0 + step), 0.0 if b0 == r0 else 1.0)
        return run

    fold = _fold_plan(inputs, taps, cin) if by_rows else None
    if fold is not None:
        from ._fold_jit import gather_taps

        def folded_chunk(c):
            def run():
                r0, r1 = bounds[c], bounds[c + 1]
                step = max(16, FOLD_BYTES // (T * cin * dw.itemsize))
                buf = scratch("fold", (min(step, r1 - r0), T * cin), dw.dtype, zero=False)
                for g in range(groups):
                    gs = slice(g * cout, (g + 1) * cout)
                    target = parts[c, :, :, gs]
                    target.shape = (T * cin, cout)          # a view, never a copy
                    for b0 in range(r0, r1, step):
                        b1 = min(r1, b0 + step)
                        gather_taps(fold[0], inputs[0].shape[1], g * cin, cin, fold[1], b0,
                                    b1 - b0, buf)
                        gemm(buf[:b1 - b0].T, dyg[b0:b1, gs], target,
                             beta=0.0 if b0 == r0 else 1.0)
            return run

    def tap_task(t, c):
        return lambda: gemm_tap(c, t, bounds[c], bounds[c + 1], 0.0)

    if by_rows:
        chunk_task = per_tap_chunk if fold is None else folded_chunk
        run_parallel(chunk_task(c) for c in range(chunks))
    else:
        run_parallel(tap_task(t, c) for t in range(T) for c in range(chunks))
    if chunks > 1:
        np.sum(parts, axis=0, out=dw)


# -- grids ----------------------------------------------------------------------

def _input_phases(x, geom: ConvGeometry, extents, phases, n0, n1, cdt):
    """Phase grids of ``x[n0:n1]`` flattened to rows: list of (rows, C), in
    the compute dtype (the copy onto the grid converts)."""
    nb, C = n1 - n0, x.shape[-1]
    if _identity_grid(geom, extents, phases):
        return [np.ascontiguousarray(x[n0:n1], dtype=cdt).reshape(-1, C)]
    grids = scratch("phases", (len(phases), nb, *extents, C), cdt, zero=True)
    for pi, r in enumerate(phases):
        dst, src = [], []
        for L, s, ri, pb, e in zip(geom.in_sizes, geom.strides, r, geom.pads_begin, extents):
            sl = _phase_copy(L, s, ri, pb, e, 0)
            if sl is None:
                break
            dst.append(sl[0])
            src.append(sl[1])
        else:
            grids[(pi, slice(None), *dst)] = x[(slice(n0, n1), *src)]
    return [g.reshape(-1, C) for g in grids]


def _embed(t, n0, n1, extents, begin, cdt, key="embed"):
    """``t[n0:n1]`` (nb, *M, C) placed at ``begin`` (may be negative: cropped)
    on a zero grid of ``extents``, flattened to rows."""
    nb, C = n1 - n0, t.shape[-1]
    sizes = t.shape[1:-1]
    if all(b == 0 for b in begin) and tuple(extents) == tuple(sizes):
        return np.ascontiguousarray(t[n0:n1], dtype=cdt).reshape(-1, C)
    g = scratch(key, (nb, *extents, C), cdt, zero=True)
    dst, src = [], []
    for m, e, b in zip(sizes, extents, begin):
        lo, hi = max(0, b), min(e, b + m)
        if hi <= lo:
            return g.reshape(-1, C)
        dst.append(slice(lo, hi))
        src.append(slice(lo - b, hi - b))
    g[(slice(None), *dst)] = t[(slice(n0, n1), *src)]
    return g.reshape(-1, C)


def _last_row(nb, extents, last) -> int:
    """Rows needed to cover every valid position ``< last`` of ``nb`` samples."""
    if nb == 0 or any(v <= 0 for v in last):
        return 0
    return (nb - 1) * math.prod(extents) + _flat([v - 1 for v in last], extents) + 1


def _batch_blocks(geom: ConvGeometry, op: str, itemsize: int):
    per_sample = workspace_rows(geom, op) * max(geom.c, geom.o) * itemsize
    nb = max(1, min(geom.n, settings.workspace_bytes() // max(1, per_sample)))
    return [(n0, min(geom.n, n0 + nb)) for n0 in range(0, geom.n, nb)]


def workspace(geom: ConvGeometry, op: str, itemsize: int) -> dict[str, int]:
    """Bytes by part this kernel allocates besides its result (see
    ``kernels.estimate``): the grids of one batch block (per-thread scratch
    buffers, kept for the next call when they are small enough), weights
    reordered per tap, partial weight gradients, the folded GEMMs' buffers."""
    if _empty(geom):
        return {}
    taps, extents, phases = _forward_grid(geom)
    per = math.prod(extents)
    per_sample = per * (len(phases) + (2 if op == "dgrad" else 1)) * max(geom.c, geom.o) \
        * itemsize                                   # as workspace_rows, _batch_blocks
    nb = max(1, min(geom.n, settings.workspace_bytes() // max(1, per_sample)))
    w_bytes = math.prod(geom.w_shape) * itemsize
    parts = {"grids": nb * per_sample}
    if op == "wgrad":
        rows = _last_row(nb, extents, geom.out_sizes)
        parts["partial weight gradients"] = w_bytes * (
            _wgrad_chunks(rows, len(taps), w_bytes) + (nb < geom.n))
    else:
        parts["reordered weights"] = 2 * w_bytes        # per tap, and folded per group
    if geom.c // geom.groups <= FOLD_MAX_CHANNELS:
        parts["fold buffers"] = workers() * FOLD_BYTES
    return parts


def fits(geom: ConvGeometry, op: str, itemsize: int) -> bool:
    per_sample = workspace_rows(geom, op) * max(geom.c, geom.o) * itemsize
    return per_sample <= settings.workspace_bytes()


def _empty(geom: ConvGeometry) -> bool:
    return 0 in (geom.n, geom.c, geom.o, *geom.kernel, *geom.in_sizes, *geom.out_sizes)


# -- the three ops (channels last: x (N,*S,C), w (*K,C/G,OC), y (N,*OS,OC)) ---------

def compute_dtype(*arrays) -> np.dtype:
    """Inputs may arrive in their own float dtype and strides (the kernel
    converts while it copies onto its grids): float64 stays, the rest
    computes in float32."""
    f64 = any(a.dtype == np.float64 for a in arrays)
    return np.dtype(np.float64 if f64 else np.float32)


def fwd(x, w, geom: ConvGeometry):
    cdt = compute_dtype(x, w)
    w = np.ascontiguousarray(w, dtype=cdt)
    taps, extents, phases = _forward_grid(geom)
    G, OC = geom.groups, geom.o
    y = np.empty((geom.n, *geom.out_sizes, OC), cdt)
    if _empty(geom):
        y[...] = 0
        return y
    wt = w.reshape(-1, geom.c // G, OC)
    direct = tuple(extents) == geom.out_sizes
    for n0, n1 in _batch_blocks(geom, "fwd", cdt.itemsize):
        nb = n1 - n0
        inputs = _input_phases(x, geom, extents, phases, n0, n1, cdt)
        tl = [(phases.index(r), _flat(q, extents), wt[idx]) for idx, r, q in taps]
        if direct:
            _gather(inputs, tl, y[n0:n1].reshape(-1, OC), nb * math.prod(extents), G)
        else:
            grid = scratch("out", (nb, *extents, OC), cdt, zero=False)
            _gather(inputs, tl, grid.reshape(-1, OC), _last_row(nb, extents, geom.out_sizes), G)
            y[n0:n1] = grid[(slice(None), *(slice(0, m) for m in geom.out_sizes))]
        inputs = grid = None        # free fresh copies before the next block makes its own
    return y


def wgrad(x, dy, geom: ConvGeometry):
    taps, extents, phases = _forward_grid(geom)
    G, OC, cg = geom.groups, geom.o, geom.c // geom.groups
    T = len(taps)
    cdt = compute_dtype(x, dy)
    result = np.zeros((*geom.kernel, cg, OC), cdt)
    dw = result.reshape(T, cg, OC)
    if _empty(geom):
        return result
    blocks = _batch_blocks(geom, "wgrad", cdt.itemsize)
    part = np.empty_like(dw) if len(blocks) > 1 else dw
    for n0, n1 in blocks:
        inputs = _input_phases(x, geom, extents, phases, n0, n1, cdt)
        dyg = _embed(dy, n0, n1, extents, [0] * geom.spatial_rank, cdt)
        P = _last_row(n1 - n0, extents, geom.out_sizes)
        tl = [(phases.index(r), _flat(q, extents), None) for idx, r, q in taps]
        if P == 0:
            part[...] = 0
        else:
            _wgrad_core(inputs, tl, dyg, P, G, part)
        if part is not dw:
            dw += part
        inputs = dyg = None         # free fresh copies before the next block makes its own
    return result


def _dgrad_plan(geom: ConvGeometry):
    """Output-phase grids of the data gradient.

    Per axis: ``B = floor(pb/s)``; phase grid index ``u`` is ``j = u + B``
    (padded input position ``j*s + r``); ``U`` covers every ``j`` with an input
    position; ``dy`` sits at ``Qmax - B`` on a grid of ``U + Qmax``."""
    taps = _taps(geom)
    rank = geom.spatial_rank
    qmax = tuple(max(q[i] for _, _, q in taps) for i in range(rank))
    B = tuple(pb // s for pb, s in zip(geom.pads_begin, geom.strides))
    J = tuple(-(-(L + pb) // s) for L, pb, s in zip(geom.in_sizes, geom.pads_begin,
                                                    geom.strides))
    U = tuple(max(0, j - b) for j, b in zip(J, B))
    extents = tuple(u + qm for u, qm in zip(U, qmax))
    begin = tuple(qm - b for qm, b in zip(qmax, B))
    # only phases some tap reaches: the others stay zero (dx is zero-filled),
    # and a huge stride must not enumerate its empty phases
    phases = sorted({r for _, r, _ in taps})
    return taps, qmax, B, U, extents, begin, phases


def dgrad(w, dy, geom: ConvGeometry):
    taps, qmax, B, U, extents, begin, phases = _dgrad_plan(geom)
    G, C, cg = geom.groups, geom.c, geom.c // geom.groups
    OC = geom.o
    if _empty(geom):
        return np.zeros((geom.n, *geom.in_sizes, C), compute_dtype(w, dy))
    cdt = compute_dtype(w, dy)
    # W_t^T per group: (O/G, C/G) blocks -> one (O/G, C) matrix per tap.
    wt = w.reshape(-1, cg, OC)
    og = OC // G
    wT = np.empty((len(taps), og, C), cdt)
    for g in range(G):
        wT[:, :, g * cg:(g + 1) * cg] = wt[:, :, g * og:(g + 1) * og].transpose(0, 2, 1)
    dx = np.zeros((geom.n, *geom.in_sizes, C), cdt)
    single = (all(s == 1 for s in geom.strides) and tuple(extents) == geom.in_sizes
              and tuple(U) == geom.in_sizes)
    for n0, n1 in _batch_blocks(geom, "dgrad", cdt.itemsize):
        nb = n1 - n0
        dyg = _embed(dy, n0, n1, extents, begin, cdt)
        grid = None if single else scratch("out", (nb, *extents, C), cdt, zero=False)
        for r in phases:
            tl = [(0, _flat([qm - qi for qm, qi in zip(qmax, q)], extents), wT[idx])
                  for idx, rr, q in taps if rr == r]
            sel = []
            for L, s, ri, pb, u, b in zip(geom.in_sizes, geom.strides, r, geom.pads_begin,
                                          U, B):
                sl = _phase_copy(L, s, ri, pb, u, b)
                if sl is None:
                    break
                sel.append(sl)
            else:
                if not tl:
                    continue                                  # no tap reaches: zeros
                if single:
                    _gather([dyg], tl, dx[n0:n1].reshape(-1, C), nb * math.prod(extents), G)
                    continue
                last = [s_[0].stop for s_ in sel]
                _gather([dyg], tl, grid.reshape(-1, C), _last_row(nb, extents, last), G)
                dx[(slice(n0, n1), *(s_[1] for s_ in sel))] = \
                    grid[(slice(None), *(s_[0] for s_ in sel))]
        dyg = grid = None           # free fresh copies before the next block makes its own
    return dx
