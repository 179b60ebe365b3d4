"""Depthwise and grouped convolutions with few channels per group, on the native engine.

``native/grouped.cpp`` computes all three ops with *lane-aligned* vectors: a
vector holds VL consecutive output channels of the op (the forward result's,
the data gradient's, dy's for the weight gradient), and the source operand is
read in the same lane order -- as it is for depthwise layers, through one
in-register permutation of a loaded vector when a lane block's source channels
lie within VL channels (ResNeXt's 4 -> 4, the forward and weight gradient of the
GroupConvolutionBackpropData spec example), or from lines expanded once into
``[w][j][lane]`` order otherwise (its data gradient: 5 dy channels per dx
channel).  Every multiply is a useful one: no block-diagonal zeros, no padding
operands (D17).  See docs/kernels.md, "Grouped kernels".

This module plans a call (cached per geometry): the stride phases, the taps of
each kernel row grouped into *sweeps* (taps whose source columns are a fixed
step apart, so a register tile loads each source vector once), the segments of
output pixels on which the same taps read the input, the lane permutation
tables, and the work items (output lines, cut along w when a line's scratch
would not fit the workspace budget).  It packs the weights (tiny), runs items
on the kernels' threads, and sums weight-gradient partials in a fixed order.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass

import numpy as np

from .. import settings
from ..geometry import ConvGeometry
from . import _blas, _bound, _pool, _results, native
from ._blas import scratch

# Per-thread scratch target: packed source lines (kept while the tiles of the
# next output lines read them) and one output line.
SCRATCH_BYTES = 1 * 2**20
# Items (output lines) per thread at least, so the threads finish together.
ITEMS_PER_THREAD = 4
# Weight gradients: the positions' items are cut into at most this many chunks,
# each with a partial gradient (summed in chunk order: deterministic).
WGRAD_CHUNKS = 16
PARTIALS_BYTES = 8 * 2**20
# Below this many bytes moved, one thread is faster than waking the others.
SERIAL_BYTES = 256 * 2**10
# Vector registers left to the compiler beyond a tile's accumulators, weights and
# source vector (fewer: it spills the accumulators).
REG_MARGIN = 0
# Source channels per lane above this: GEMM-shaped, the native kernel's domain.
MAX_J = 64
# Data gradients with more stride phases than this (product of the strides) are left to
# the other kernels: the plan lists the taps of every phase.
MAX_PHASES = 4096

_I64 = ctypes.c_int64
_VP = ctypes.c_void_p


class _Problem(ctypes.Structure):
    _fields_ = [("src", native._Tensor), ("dy", native._Tensor), ("out", _VP),
                ("ostride", _I64 * 5), ("out_dtype", _I64),
                ("N", _I64), ("Lin", _I64 * 3), ("Lout", _I64 * 3), ("Cin", _I64),
                ("lanes", _I64), ("J", _I64), ("nlv", _I64), ("perm", _I64),
                ("packed", _I64), ("expand", _I64), ("ps", _I64), ("dy_packed", _I64),
                ("wstart", _VP), ("perm_idx", _VP), ("gidx", _VP),
                ("is_", _I64 * 3), ("os", _I64 * 3), ("P", _I64), ("R", _I64),
                ("classes", _VP), ("wph", _VP), ("grp", _VP), ("seg", _VP), ("segk", _VP),
                ("W", _VP), ("nchunks", _I64), ("chunks", _VP), ("cache_lines", _I64),
                ("stream", _I64)]


class _DwWgrad(ctypes.Structure):
    _fields_ = [("x", native._Tensor), ("dy", native._Tensor), ("N", _I64), ("L", _I64 * 3),
                ("M", _I64 * 3), ("C", _I64), ("K", _I64 * 3), ("s", _I64 * 3),
                ("d", _I64 * 3), ("pb", _I64 * 3)]


class _DwDgrad(ctypes.Structure):
    _fields_ = [("dy", native._Tensor), ("dx", _VP), ("ostride", _I64 * 4), ("N", _I64),
                ("L", _I64 * 3), ("M", _I64 * 3), ("C", _I64), ("K", _I64 * 3),
                ("s", _I64 * 3), ("d", _I64 * 3), ("pb", _I64 * 3), ("w", _VP),
                ("stream", _I64)]


class _Planar(ctypes.Structure):
    _fields_ = [("src", native._Tensor), ("dy", native._Tensor), ("out", _VP),
                ("out_dtype", _I64), ("ostride", _I64 * 5), ("W", _VP), ("N", _I64),
                ("C", _I64), ("L", _I64 * 3), ("M", _I64 * 3), ("K", _I64 * 3),
                ("s", _I64 * 3), ("d", _I64 * 3), ("pb", _I64 * 3)]


class _Flat(ctypes.Structure):
    _fields_ = [("src", _VP), ("out", _VP), ("sn", _I64), ("sc", _I64), ("on", _I64),
                ("oc", _I64), ("w", _VP), ("N", _I64), ("C", _I64), ("H", _I64), ("W", _I64),
                ("ntap", _I64), ("off", _VP), ("yn", _I64), ("yc", _I64), ("sh", _I64),
                ("sw", _I64), ("phases", _VP), ("widx", _VP), ("dtype", _I64)]


_BOUND: dict[str, tuple[int, int]] = {}


def _lib(eng: native.Engine):
    """The engine's library with the grouped entry points declared (once per build)."""
    if eng.isa not in _BOUND or _BOUND[eng.isa][0] != id(eng.lib):
        lib, vp, i64 = eng.lib, ctypes.c_void_p, ctypes.c_int64
        for name, res, args in (("cg_grouped_rmax", i64, []), ("cg_grouped_nkmax", i64, []),
                                ("cg_grouped_regs", i64, []),
                                ("cg_grouped_scratch", i64, [vp, i64]),
                                ("cg_grouped_corr_run", None, [vp, i64, i64, vp]),
                                ("cg_grouped_wgrad_run", None, [vp, i64, i64, vp, vp]),
                                ("cg_dw_wgrad_run", None, [vp, i64, i64, vp]),
                                ("cg_dw_dgrad_terms", i64, []),
                                ("cg_dw_dgrad_run", None, [vp, i64, i64]),
                                ("cg_planar_scratch", i64, [vp]),
                                ("cg_planar_wgrad_run", None, [vp, i64, i64, vp]),
                                ("cg_planar_dgrad_run", None, [vp, i64, i64, vp]),
                                ("cg_flat_scratch", i64, [vp]),
                                ("cg_flat_corr_run", None, [vp, i64, i64, vp]),
                                ("cg_flat_wgrad_run", None, [vp, i64, i64, vp])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        _BOUND[eng.isa] = (id(eng.lib), int(lib.cg_grouped_rmax()))
    return eng.lib


# -- which problems ----------------------------------------------------------------------

def _operands(geom: ConvGeometry, op: str) -> tuple[int, int, int, int]:
    """(lanes, source channels, A, B): lane l meets source channels (l // A) * B + j, j < B."""
    cg, og = geom.c // geom.groups, geom.o // geom.groups
    if op == "dgrad":
        return geom.c, geom.o, cg, og
    return geom.o, geom.c, og, cg


def supports_op(op: str):
    def supports(geom: ConvGeometry, dtype) -> str | None:
        why = native.supports(geom, dtype)
        if why is not None:
            return why
        lanes, cin, a, b = _operands(geom, op)
        if op == "dgrad" and math.prod(geom.strides) > MAX_PHASES:
            return (f"{math.prod(geom.strides)} stride phases > {MAX_PHASES}: the plan lists "
                    f"every phase")
        if b > MAX_J:
            return (f"{b} source channels per {op} output channel > {MAX_J}: GEMM-shaped, "
                    f"the native kernel's")
        return None
    return supports


# -- plans -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    op: str
    vl: int
    n: int
    lin: tuple            # source spatial sizes (3-D)
    lout: tuple           # output (corr) / dy (wgrad) spatial sizes (3-D)
    cin: int
    lanes: int
    J: int
    nlv: int
    perm: bool
    expand: bool
    packed: bool
    ps: int
    wstart: np.ndarray    # [nlv][J] int32
    perm_idx: np.ndarray  # [nlv][J][VL] int32
    gidx: np.ndarray      # [J][LP] int32
    istep: tuple
    ostep: tuple
    P: int
    R: int
    classes: np.ndarray
    wph: np.ndarray
    grp: np.ndarray
    seg: np.ndarray
    segk: np.ndarray
    entries: np.ndarray   # per entry: its weight tap
    chunks: np.ndarray    # per chunk: u0, u1, i0, i1
    cache_lines: int

    @property
    def items(self) -> int:
        return self.n * self.lout[0] * self.lout[1] * (len(self.chunks) // 4)


def _pad3(v, fill):
    return native._pad3(v, fill)


def _taps(geom: ConvGeometry, op: str):
    """Per class (d, h stride phase of the output lines; one class unless a data
    gradient), per w-phase: (rw, Uq, taps) with taps (off_d, off_h, off_w, t)."""
    k3, s3, d3, p3 = (_pad3(geom.kernel, 1), _pad3(geom.strides, 1), _pad3(geom.dilations, 1),
                      _pad3(geom.pads_begin, 0))
    if op != "dgrad":
        m3 = _pad3(geom.out_sizes, 1)
        taps = [(kd * d3[0] - p3[0], kh * d3[1] - p3[1], kw * d3[2] - p3[2], t)
                for t, (kd, kh, kw) in enumerate(np.ndindex(*k3))]
        return [[(0, m3[2], taps)]]
    l3 = _pad3(geom.in_sizes, 1)
    classes = []
    for rd in range(s3[0]):
        for rh in range(s3[1]):
            phases = []
            for rw in range(s3[2]):
                uq = -(-(l3[2] - rw) // s3[2]) if rw < l3[2] else 0
                taps = []
                for t, k in enumerate(np.ndindex(*k3)):
                    num = [r + p - ki * d for r, p, ki, d in zip((rd, rh, rw), p3, k, d3)]
                    if all(v % s == 0 for v, s in zip(num, s3)):
                        taps.append((*(v // s for v, s in zip(num, s3)), t))
                phases.append((rw, uq, taps))
            classes.append(phases)
    return classes


def _valid_range(U: int, step: int, off: int, L: int) -> tuple[int, int]:
    """q in [0, U) with 0 <= q*step + off < L."""
    lo = 0 if off >= 0 else -(off // step)               # ceil(-off / step)
    hi = 0 if L - 1 - off < 0 else (L - 1 - off) // step + 1
    lo, hi = max(0, lo), min(U, hi)
    return lo, max(lo, hi)


def _lane_tables(lanes, cin, a, b, vl, bound):
    """Per (lane vector, j): the source channels of its lanes; the window
    [start, start + vl) holding them (start <= bound - vl) and the lanes'
    indices into it; None when some lane vector's channels span more than vl."""
    nlv = -(-lanes // vl)
    wstart = np.zeros((nlv, b), np.int32)
    perm = np.zeros((nlv, b, vl), np.int32)
    for lv in range(nlv):
        ls = np.arange(lv * vl, min(lanes, (lv + 1) * vl))
        for j in range(b):
            src = (ls // a) * b + j
            lo = int(min(src.min(), max(0, bound - vl)))
            if src.max() - lo >= vl:
                return None
            wstart[lv, j] = lo
            perm[lv, j, :len(ls)] = src - lo
    return wstart, perm


@functools.lru_cache(maxsize=256)
def plan(geom: ConvGeometry, op: str, vl: int, rmax: int, nkmax: int, regs: int,
         src_direct: bool, threads: int, budget: int) -> Plan:
    """Everything about a call that depends on its geometry (pure, cached).
    ``src_direct``: the source is float32 with unit channel stride (may be read in
    place); ``budget``: per-thread scratch bytes."""
    lanes, cin, a, b = _operands(geom, op)
    J = b
    nlv = -(-lanes // vl)
    LP = nlv * vl
    identity = a == 1 and b == 1
    wstart = np.zeros((nlv, J), np.int32)
    perm_idx = np.zeros((nlv, J, vl), np.int32)
    gidx = np.full((J, LP), -1, np.int32)
    perm = expand = False
    if identity:
        packed = not (src_direct and lanes % vl == 0)
        ps = LP
    else:
        packed = not (src_direct and cin >= vl)
        ps = max(cin, vl) if packed else cin
        tables = _lane_tables(lanes, cin, a, b, vl, ps)
        if tables is not None:
            perm = True
            wstart, perm_idx = tables
        else:
            expand = packed = True
            ps = J * LP
            ls = np.arange(lanes)
            gidx[:, :lanes] = (ls // a)[None, :] * b + np.arange(J)[:, None]
    s3, d3 = _pad3(geom.strides, 1), _pad3(geom.dilations, 1)
    if op == "dgrad":
        lin, lout = _pad3(geom.out_sizes, 1), _pad3(geom.in_sizes, 1)
        istep, ostep = (1, 1, 1), s3
    else:
        lin, lout = _pad3(geom.in_sizes, 1), _pad3(geom.out_sizes, 1)
        istep, ostep = s3, (1, 1, 1)
    # tile pixels P apart: the taps of a phase whose source offsets differ by P*is
    P = d3[2] // math.gcd(d3[2], s3[2])
    step = P * istep[2]
    classes, wph, grp, seg, segk, entries = [], [], [], [], [], []
    nk_used = 1
    rows_per_class = 1
    for phases in _taps(geom, op):
        first = len(wph) // 6
        rows = set()
        for rw, uq, taps in phases:
            g0 = len(grp) // 5
            by_key = {}
            for od, oh, ow, t in taps:
                by_key.setdefault((od, oh, ow % step), []).append((ow, t))
                rows.add((od, oh))
            groups = []
            for (od, oh, _), members in sorted(by_key.items()):
                members.sort()
                run = [members[0]]
                for ow, t in members[1:]:
                    if ow == run[-1][0] + step and len(run) < nkmax:
                        run.append((ow, t))
                    else:
                        groups.append((od, oh, run))
                        run = [(ow, t)]
                groups.append((od, oh, run))
            ranges = []
            for od, oh, run in groups:
                grp += [od, oh, run[0][0], len(run), len(entries)]
                entries += [t for _, t in run]
                nk_used = max(nk_used, len(run))
                ranges.append([_valid_range(uq, istep[2], ow, lin[2]) for ow, _ in run])
            g1 = len(grp) // 5
            bps = sorted({0, uq} | {v for rs in ranges for r in rs for v in r})
            s0 = len(seg) // 3
            for lo, hi in zip(bps, bps[1:]):
                if hi <= lo or hi > uq:
                    continue
                seg += [lo, hi, len(segk)]
                for rs in ranges:
                    ks = [k for k, (va, vb) in enumerate(rs) if va <= lo and vb >= hi]
                    if ks:
                        assert ks == list(range(ks[0], ks[-1] + 1)), ks
                        segk += [ks[0], ks[-1] + 1]
                    else:
                        segk += [0, 0]
            wph += [rw, uq, g0, g1, s0, len(seg) // 3]
        rows_per_class = max(rows_per_class, len(rows))
        classes += [first, len(wph) // 6]
    # registers: R accumulators (dy vectors), the sweep's weights (tap sums), the
    # source vector and the permutation (grouped.cpp: nk_fits)
    R = min(rmax, regs - 1 - nk_used - (1 if perm else 0) - REG_MARGIN)
    cache_lines = 2 * rows_per_class + 2 if packed else 0
    chunks = _chunks(geom, lin, lout, istep, ostep, step, wph, grp, seg, segk, _ChunkSizes(
        cin, ps, LP, lanes, packed, cache_lines, max(1, R) * P * ostep[2], threads, budget))
    arr = lambda v: np.ascontiguousarray(np.array(v, np.int64).reshape(-1))   # noqa: E731
    out = Plan(op, vl, geom.n, lin, lout, cin, lanes, J, nlv, perm, expand, packed, ps,
               np.ascontiguousarray(wstart), np.ascontiguousarray(perm_idx),
               np.ascontiguousarray(gidx), istep, ostep, P, max(1, R), arr(classes), arr(wph),
               arr(grp or [0]), arr(seg or [0]), arr(segk or [0]), arr(entries), arr(chunks),
               cache_lines)
    for v in (out.wstart, out.perm_idx, out.gidx, out.classes, out.wph, out.grp, out.seg,
              out.segk, out.entries, out.chunks):
        v.setflags(write=False)
    return out


@dataclass(frozen=True)
class _ChunkSizes:
    cin: int
    ps: int
    LP: int
    lanes: int
    packed: bool
    cache_lines: int
    min_width: int
    threads: int
    budget: int


def _window(lin_w, istep_w, ostep_w, tapstep, wph, grp, seg, segk, u0, u1):
    """The source w range [i0, i1) that the output pixels [u0, u1) read, over the
    w-phases of every class."""
    lo = hi = None
    for p in range(len(wph) // 6):
        rw, uq, g0, g1, s0, s1 = wph[6 * p: 6 * p + 6]
        qa = max(0, -(-(u0 - rw) // ostep_w))
        qb = min(uq, -(-(u1 - rw) // ostep_w))
        for sg in range(s0, s1):
            a, e, kofs = seg[3 * sg: 3 * sg + 3]
            a, e = max(a, qa), min(e, qb)
            if e <= a:
                continue
            for gi, g in enumerate(range(g0, g1)):
                k0, k1 = segk[kofs + 2 * gi], segk[kofs + 2 * gi + 1]
                if k1 <= k0:
                    continue
                ow0 = grp[5 * g + 2]
                first = a * istep_w + ow0 + k0 * tapstep
                last = (e - 1) * istep_w + ow0 + (k1 - 1) * tapstep
                lo = first if lo is None else min(lo, first)
                hi = last + 1 if hi is None else max(hi, last + 1)
    if lo is None:
        return 0, 0
    return max(0, lo), min(lin_w, hi)


def _chunks(geom, lin, lout, istep, ostep, tapstep, wph, grp, seg, segk, sz: _ChunkSizes):
    """Pieces [u0, u1) of the output w range with their source windows [i0, i1):
    one piece per line unless a line's scratch would exceed the budget, or there
    are too few lines to give every thread several."""
    W = lout[2]
    lines = geom.n * lout[0] * lout[1]
    if lines == 0 or W == 0:              # an empty problem (memory estimates plan it)
        return [0, 0, 0, 0]
    ratio = istep[2] / ostep[2]           # source pixels per output pixel
    per_out = 4 * sz.LP
    if sz.packed:
        per_out += 4 * (sz.cache_lines * sz.ps + sz.cin) * ratio
    width = max(sz.min_width, int(sz.budget // per_out))
    pieces = max(1, -(-W // width))
    want = ITEMS_PER_THREAD * sz.threads
    if lines * pieces < want:
        pieces = max(pieces, min(-(-want // lines), max(1, W // max(1, sz.min_width))))
    out = []
    for k in range(pieces):
        u0, u1 = W * k // pieces, W * (k + 1) // pieces
        if u1 <= u0:
            continue
        i0, i1 = _window(lin[2], istep[2], ostep[2], tapstep, wph, grp, seg, segk, u0, u1)
        out += [u0, u1, i0, max(i0, i1)]
    return out or [0, 0, 0, 0]


# -- running -------------------------------------------------------------------------------

def _threads(nbytes: int) -> int:
    n = settings.threads()
    n = _blas.cpu_count() if n is None else n
    return 1 if nbytes < SERIAL_BYTES else max(1, n)


def _budget(threads: int) -> int:
    per = max(64 * 2**10, settings.workspace_bytes() // (2 * max(1, threads)))
    return min(SCRATCH_BYTES, per)


def _source_direct(a: np.ndarray) -> bool:
    return a.dtype == np.float32 and a.strides[-1] == a.itemsize


def _unit_channels(a: np.ndarray) -> bool:
    """float32, float16 or bfloat16 with unit channel stride: what the streaming
    depthwise kernels read in place (16-bit elements converted in their loads)."""
    return a.dtype in native.DTYPE_CODES and a.strides[-1] == a.itemsize


def _tables(pl: Plan, src: np.ndarray, dy: np.ndarray | None, out: np.ndarray | None,
            weights: np.ndarray | None) -> _Problem:
    t_src = native._tensor(src)
    t_dy = native._tensor(dy) if dy is not None else native._Tensor()
    if out is not None:
        es = out.itemsize
        st = [s // es for s in out.strides]
        r = out.ndim - 2
        ostride = [st[0]] + [0] * (3 - r) + st[1:]
        out_ptr, out_code = out.ctypes.data, native.DTYPE_CODES[out.dtype]
    else:
        ostride, out_ptr, out_code = [0] * 5, None, 0
    dy_packed = dy is not None and not (_source_direct(dy) and pl.lanes % pl.vl == 0)
    return _Problem(t_src, t_dy, out_ptr, (_I64 * 5)(*ostride), out_code, pl.n,
                    (_I64 * 3)(*pl.lin), (_I64 * 3)(*pl.lout), pl.cin, pl.lanes, pl.J, pl.nlv,
                    int(pl.perm), int(pl.packed), int(pl.expand), pl.ps, int(dy_packed),
                    pl.wstart.ctypes.data, pl.perm_idx.ctypes.data, pl.gidx.ctypes.data,
                    (_I64 * 3)(*pl.istep), (_I64 * 3)(*pl.ostep), pl.P, pl.R,
                    pl.classes.ctypes.data, pl.wph.ctypes.data, pl.grp.ctypes.data,
                    pl.seg.ctypes.data, pl.segk.ctypes.data,
                    weights.ctypes.data if weights is not None else None,
                    len(pl.chunks) // 4, pl.chunks.ctypes.data, pl.cache_lines,
                    int(out is not None and _streams_lines(out)))


def _streams_lines(out: np.ndarray) -> bool:
    """Whether the grouped corr may write ``out`` a line piece at a time with streaming
    stores (grouped.cpp: Runner::streams, which also wants channels-last pixels of whole
    lane vectors, or of 8 lanes on AVX-512): a large result in recycled memory (its pages
    mapped; streaming stores past fresh pages measured slower), large counted as float32
    -- a float16/bfloat16 result streams where its float32 sibling does (the spec layer's
    3.2 MB float16 data gradient: 1.84 -> 1.65 ms after the pause, float32 1.58).
    Unaligned ends are stored plainly, so no stride needs to be a multiple of 64 bytes
    (the spec layer's pixels are 32)."""
    return out.size * 4 >= _results.STREAM_MIN_BYTES and _results.recycled(out)


def _plan_for(geom: ConvGeometry, op: str, src: np.ndarray, threads: int) -> Plan:
    eng = native.engine()
    _lib(eng)                                           # (declares the entry points)
    return plan(geom, op, eng.vl, *_limits(eng), _source_direct(src), threads,
                _budget(threads))


def _limits(eng: native.Engine | None) -> tuple[int, int, int]:
    """(largest tile, taps per sweep, vector registers) of a build."""
    if eng is None:
        return 12, 7, 16
    lib = _lib(eng)
    return int(lib.cg_grouped_rmax()), int(lib.cg_grouped_nkmax()), int(lib.cg_grouped_regs())


def _corr_weights(pl: Plan, w: np.ndarray, geom: ConvGeometry, op: str, vl: int) -> np.ndarray:
    """Weights [entry][j][lane] float32 (lanes padded with zeros)."""
    cg, og = geom.c // geom.groups, geom.o // geom.groups
    w3 = native._weights_2d(w)[pl.entries]             # (E, cg, O)
    out = np.zeros((len(pl.entries), pl.J, pl.nlv * vl), np.float32)
    if op == "fwd":
        out[:, :, :geom.o] = w3
    else:
        c = np.arange(geom.c)
        out[:, :, :geom.c] = w3[:, (c % cg)[None, :], ((c // cg) * og)[None, :] +
                                np.arange(og)[:, None]]
    return out


def _run_corr(op: str, src: np.ndarray, w: np.ndarray, out: np.ndarray, geom: ConvGeometry):
    eng = native.engine()
    lib = _lib(eng)
    nbytes = src.nbytes + out.nbytes
    threads = _threads(nbytes)
    pl = _plan_for(geom, op, src, threads)
    weights = _corr_weights(pl, w, geom, op, eng.vl)
    # (plain stores: the result's pages are fresh, zeroed into the caches by the page
    # faults, where streaming stores ran 1.3x slower: MobileNetV2's stride-2 data
    # gradient 14.7 against 11.2 ms)
    prob = _tables(pl, src, None, out, weights)
    pp = ctypes.addressof(prob)
    need = int(lib.cg_grouped_scratch(pp, 0))
    buf, per_thread = _pool.thread_scratch("grouped-scratch", need, threads)
    _pool.run_native(lib, "cg_grouped_corr_run",
                     [(pp, lo, hi) for lo, hi in _pool.split(pl.items, 4 * threads)],
                     threads, per_thread)
    del prob, weights, buf


def fwd(x: np.ndarray, w: np.ndarray, geom: ConvGeometry, out_dtype=None) -> np.ndarray:
    """Forward convolution: x (N, *L, C), w (*K, C/G, O) -> y (N, *M, O)."""
    y = native._alloc_like(x, geom.n, geom.out_sizes, geom.o, out_dtype or np.float32)
    if y.size == 0:
        return y
    if x.size == 0 or w.size == 0:
        y[...] = 0
        return y
    if _flat(geom, x, y):
        return _flat_run(_lib(native.engine()), "fwd", x, w, y, geom)
    _run_corr("fwd", x, w, y, geom)
    return y


def dgrad(w: np.ndarray, dy: np.ndarray, geom: ConvGeometry, out_dtype=None) -> np.ndarray:
    """Data gradient: w (*K, C/G, O), dy (N, *M, O) -> dx (N, *L, C), stride phases
    inside the kernel."""
    dx = native._alloc_like(dy, geom.n, geom.in_sizes, geom.c, out_dtype or np.float32)
    if dx.size == 0:
        return dx
    if dy.size == 0 or w.size == 0:
        dx[...] = 0
        return dx
    eng = native.engine()
    lib = _lib(eng)
    if _streams_depthwise_dgrad(geom, dy, dx, int(lib.cg_dw_dgrad_terms())):
        return _depthwise_dgrad(lib, eng.vl, w, dy, dx, geom)
    if _flat(geom, dy, dx, op="dgrad"):
        return _flat_run(lib, "dgrad", dy, w, dx, geom)
    if _planar(geom, "dgrad", dy, dx):
        return _planar_run(lib, "dgrad", dy, None, w, dx, geom,
                           _threads(dy.nbytes + dx.nbytes))
    _run_corr("dgrad", dy, w, dx, geom)
    return dx


def wgrad(x: np.ndarray, dy: np.ndarray, geom: ConvGeometry, out_dtype=None) -> np.ndarray:
    """Weight gradient: x (N, *L, C), dy (N, *M, O) -> dw (*K, C/G, O) float32 (whatever
    ``out_dtype``),
    partial sums over a fixed cut of the positions added in order."""
    shape = (*geom.kernel, geom.c // geom.groups, geom.o)
    if math.prod(shape) == 0 or x.size == 0 or dy.size == 0:
        return _results.zeros(shape, np.float32)
    eng = native.engine()
    lib = _lib(eng)
    threads = _threads(x.nbytes + dy.nbytes)
    if _streams_depthwise(geom, x, dy):
        return _depthwise_wgrad(lib, eng.vl, x, dy, geom, shape, threads)
    if _flat(geom, x, dy, op="wgrad"):
        return _flat_wgrad(lib, x, dy, geom, shape)
    if _planar(geom, "wgrad", x, dy):
        return _planar_run(lib, "wgrad", x, dy, None, _results.zeros(shape, np.float32), geom,
                           threads)
    return _bind_wgrad(x, dy, geom, shape)(x, dy)


def _streams_depthwise(geom: ConvGeometry, x: np.ndarray, dy: np.ndarray) -> bool:
    """Whether a weight gradient takes the streaming depthwise kernel: one channel per
    group and multiplier 1, x and dy of one dtype (float32, float16 or bfloat16) with
    unit channel stride (read in place)."""
    return (geom.groups == geom.c == geom.o and x.dtype == dy.dtype
            and _unit_channels(x) and _unit_channels(dy))


def _depthwise_wgrad(lib, vl: int, x: np.ndarray, dy: np.ndarray, geom: ConvGeometry,
                     shape, threads: int) -> np.ndarray:
    """The streaming depthwise weight gradient (grouped.cpp: cg_dw_wgrad_run): dy lines
    cut into a fixed number of chunks, one partial [tap][lane] each, summed in chunk
    order (the result does not depend on the threads); one call of its bound form
    (:func:`_bind_depthwise_wgrad`)."""
    return _bind_depthwise_wgrad(lib, vl, x, dy, geom, shape, threads)(x, dy)


# planar depthwise kernels: channels-first operands whose rows are at least this wide
# (weight gradients: x and dy rows; data gradients: dx rows, whose per-row work the
# line kernels beat on narrower rows: MobileNetV2's 56 and 112 wide data gradients
# 1.1-1.2x slower planar, 224 wide ones 1.1-1.3x faster)
PLANAR_MIN_WIDTH = 16
PLANAR_DGRAD_MIN_WIDTH = 192


def _planar(geom: ConvGeometry, op: str, *data: np.ndarray) -> bool:
    """Whether a depthwise gradient (one channel per group, multiplier 1) takes the
    planar kernels (grouped.cpp: cg_planar_*): every operand (N, *S, C) keeps a
    channel's rows together (unit stride along w, channels further apart: NCX
    callers), rows wide enough (PLANAR_MIN_WIDTH, PLANAR_DGRAD_MIN_WIDTH)."""
    width = min(geom.in_sizes[-1], geom.out_sizes[-1])
    if (not (geom.groups == geom.c == geom.o) or width < PLANAR_MIN_WIDTH
            or (op == "dgrad" and geom.in_sizes[-1] < PLANAR_DGRAD_MIN_WIDTH)):
        return False
    for a in data:
        es = a.itemsize
        if (a.dtype not in native.DTYPE_CODES or a.strides[-2] != es
                or abs(a.strides[-1]) < a.shape[-2] * es):
            return False
    return True


def _planar_run(lib, op: str, src: np.ndarray, dy: np.ndarray | None, w: np.ndarray | None,
                out: np.ndarray, geom: ConvGeometry, threads: int) -> np.ndarray:
    """The planar depthwise kernels over the channels, ranges of them per thread (each
    channel's result summed and written by one thread, in a fixed order)."""
    k3, s3, d3, p3 = (native._pad3(geom.kernel, 1), native._pad3(geom.strides, 1),
                      native._pad3(geom.dilations, 1), native._pad3(geom.pads_begin, 0))
    l3, m3 = native._pad3(geom.in_sizes, 1), native._pad3(geom.out_sizes, 1)
    ntap = math.prod(geom.kernel)
    wp = None
    if op == "dgrad":
        wp = np.ascontiguousarray(w.reshape(ntap, geom.c), np.float32)
        odt, ost = native.DTYPE_CODES[out.dtype], native._tensor(out).stride
    else:
        odt, ost = 0, (0,) * 5
    prob = _Planar(native._tensor(src), native._tensor(dy if dy is not None else src),
                   out.ctypes.data, odt, (_I64 * 5)(*ost),
                   wp.ctypes.data if wp is not None else None, geom.n, geom.c,
                   (_I64 * 3)(*l3), (_I64 * 3)(*m3), (_I64 * 3)(*k3), (_I64 * 3)(*s3),
                   (_I64 * 3)(*d3), (_I64 * 3)(*p3))
    pp = ctypes.addressof(prob)
    need = int(lib.cg_planar_scratch(pp))
    buf, per_thread = _pool.thread_scratch("grouped-scratch", need, threads)
    _pool.run_native(lib, f"cg_planar_{op}_run",
                     [(pp, lo, hi) for lo, hi in _pool.split(geom.c, 4 * threads)],
                     threads, per_thread)
    del prob, wp, buf
    return out


# Flat-plane kernels take taps up to this many (grouped.cpp: FLAT_TAPS).
FLAT_TAPS = 64
# A strided flat-plane call keeps the phase planes of one x (dx) plane per thread, at most
# this many bytes (larger planes take the planar kernels).
FLAT_PHASE_BYTES = 4 * 2**20


def _flat(geom: ConvGeometry, *data: np.ndarray, op: str = "fwd") -> bool:
    """Whether a depthwise problem takes the flat-plane kernels (grouped.cpp:
    cg_flat_*): one channel per group and multiplier 1, 1-D or 2-D, every operand
    float32 (a stride-1 weight gradient's also float16 or bfloat16) with each channel's
    plane contiguous (channels-first memory), and stride 1
    with a result the size of the input ("same" padding) -- or, for a data or weight
    gradient, strides whose every phase of x has dy's size (x s times dy on each axis)."""
    if (not (geom.groups == geom.c == geom.o) or geom.spatial_rank > 2
            or math.prod(geom.kernel) > FLAT_TAPS):
        return False
    if op in ("dgrad", "wgrad") and math.prod(geom.strides) > 1:
        # (each thread keeps the phase planes of one x or dx plane)
        if (math.prod(geom.strides) > 16 or 4 * math.prod(geom.in_sizes) > FLAT_PHASE_BYTES
                or any(L != s * m
                       for L, s, m in zip(geom.in_sizes, geom.strides, geom.out_sizes))):
            return False
    elif any(s != 1 for s in geom.strides) or geom.in_sizes != geom.out_sizes:
        return False
    # float32; a stride-1 weight gradient also float16 / bfloat16 (x and dy of one dtype,
    # widened as they are loaded: half the bytes of the planar kernel's converted rows)
    half = (op == "wgrad" and math.prod(geom.strides) == 1 and len({a.dtype for a in data}) == 1
            and data[0].dtype in native.DTYPE_CODES)
    for a in data:
        st, es = a.strides, a.itemsize
        if ((a.dtype != np.float32 and not half) or st[-2] != es
                or st[-1] < math.prod(a.shape[1:-1]) * es
                or (a.ndim == 4 and st[1] != a.shape[2] * es)):
            return False
    return True


def _flat_run(lib, op: str, src: np.ndarray, w: np.ndarray, out: np.ndarray,
              geom: ConvGeometry) -> np.ndarray:
    """The flat-plane depthwise kernel: a data gradient (or forward) over ranges of the
    result's planes (:func:`_flat_wgrad` for the weight gradient)."""
    H, W = native._pad3(geom.out_sizes, 1)[1:]       # the source planes (dy, or x)
    ntap = math.prod(geom.kernel)
    off, phases, widx = _flat_phase_table(geom, op)
    wt = np.ascontiguousarray(w.reshape(ntap, geom.c), np.float32)
    st, ost = [s // 4 for s in src.strides], [s // 4 for s in out.strides]
    sh, sw = native._pad3(geom.strides, 1)[1:] if op == "dgrad" else (1, 1)
    prob = _Flat(src.ctypes.data, out.ctypes.data, st[0], st[-1], ost[0], ost[-1],
                 wt.ctypes.data, geom.n, geom.c, H, W, len(widx), off.ctypes.data, 0, 0,
                 sh, sw, phases.ctypes.data, widx.ctypes.data, 0)
    pp = ctypes.addressof(prob)
    threads = _threads(src.nbytes + out.nbytes)
    buf, per_thread = _pool.thread_scratch("grouped-scratch", int(lib.cg_flat_scratch(pp)),
                                           threads)
    _pool.run_native(lib, "cg_flat_corr_run",
                     [(pp, lo, hi) for lo, hi in _pool.split(geom.n * geom.c, 4 * threads)],
                     threads, per_thread)
    del prob, buf, wt
    return out


@functools.lru_cache(maxsize=64)
def _flat_phase_table(geom: ConvGeometry, op: str) -> tuple:
    """(tap entries' offsets (row, column), phases (rh, rw, first, end entry), entries'
    weight taps) of a flat-plane problem, read-only: the forward convolution's taps, or
    the data gradient's per stride phase of dx -- tap (kh, kw) reaches dx[a*sh + rh] from
    dy[a + e] with e = (rh + pb - kh*d) / sh where that divides (every phase of the size
    of dy) -- or the weight gradient's per stride phase of x: dy[a] meets
    x[a*sh + kh*d - pb] = phase rh's row a + e, e = (kh*d - pb - rh) / sh where that
    divides (at stride 1: the forward's taps)."""
    k2, d2, p2 = (native._pad3(geom.kernel, 1)[1:], native._pad3(geom.dilations, 1)[1:],
                  native._pad3(geom.pads_begin, 0)[1:])
    s2 = native._pad3(geom.strides, 1)[1:] if op in ("dgrad", "wgrad") else (1, 1)
    off, phases, widx = [], [], []
    for rh in range(s2[0]):
        for rw in range(s2[1]):
            first = len(widx)
            for kh in range(k2[0]):
                for kw in range(k2[1]):
                    if op == "wgrad":
                        num = (kh * d2[0] - p2[0] - rh, kw * d2[1] - p2[1] - rw)
                        if num[0] % s2[0] or num[1] % s2[1]:
                            continue
                        e = (num[0] // s2[0], num[1] // s2[1])
                    elif op != "dgrad":
                        e = (kh * d2[0] - p2[0], kw * d2[1] - p2[1])
                    else:
                        num = (rh + p2[0] - kh * d2[0], rw + p2[1] - kw * d2[1])
                        if num[0] % s2[0] or num[1] % s2[1]:
                            continue
                        e = (num[0] // s2[0], num[1] // s2[1])
                    off.append(e)
                    widx.append(kh * k2[1] + kw)
            phases.append((rh, rw, first, len(widx)))
    table = (np.array(off, np.int64).reshape(-1), np.array(phases, np.int64).reshape(-1),
             np.array(widx, np.int64))
    for a in table:
        a.setflags(write=False)
    return table


def _flat_wgrad(lib, x: np.ndarray, dy: np.ndarray, geom: ConvGeometry, shape) -> np.ndarray:
    """The flat-plane depthwise weight gradient (cg_flat_wgrad_run), dw (*K, 1, C)
    float32: ranges of channels, each channel's sum over the samples in a fixed order by
    one thread.  At stride s each x plane is cut into its s x s phase planes (the size
    of dy's), and every tap reads one of them at a shift.  One call of its bound form
    (:func:`_bind_flat_wgrad`)."""
    return _bind_flat_wgrad(lib, x, dy, geom, shape)(x, dy)


def _phase_terms(geom: ConvGeometry) -> int:
    """The most (dy row, tap) terms one dx pixel meets: per axis, the most taps of one
    stride phase."""
    return math.prod(max(sum((r + p - t * d) % s == 0 for t in range(k)) for r in range(s))
                     for k, s, d, p in zip(geom.kernel, geom.strides, geom.dilations,
                                           geom.pads_begin))


def _streams_depthwise_dgrad(geom: ConvGeometry, dy: np.ndarray, dx: np.ndarray,
                             max_terms: int) -> bool:
    """Whether a data gradient takes the streaming depthwise kernel: one channel per
    group and multiplier 1, dy and dx of one dtype (float32, float16 or bfloat16) with
    unit channel stride, and at most ``max_terms`` weights per stride phase (they stay
    in registers)."""
    return (dy.dtype == dx.dtype and _unit_channels(dy) and _unit_channels(dx)
            and _depthwise_dgrad_fits(geom, max_terms))


def _depthwise_dgrad_fits(geom: ConvGeometry, max_terms: int) -> bool:
    """The geometry half of :func:`_streams_depthwise_dgrad`: one channel per group and
    multiplier 1, at most ``max_terms`` weights per stride phase."""
    return (geom.groups == geom.c == geom.o and math.prod(geom.strides) <= MAX_PHASES
            and _phase_terms(geom) <= max_terms)


def _dw_wgrad_chunks(geom: ConvGeometry, ntap: int, LP: int) -> int:
    """How many partial gradients the streaming depthwise weight gradient sums (a
    fixed cut of the dy lines, whatever the threads; fewer if they do not fit)."""
    lines = geom.n * math.prod(geom.out_sizes[:-1])
    return max(1, min(lines, WGRAD_CHUNKS, _budget_partials() // (4 * ntap * LP)))


def _depthwise_dgrad(lib, vl: int, w: np.ndarray, dy: np.ndarray, dx: np.ndarray,
                     geom: ConvGeometry) -> np.ndarray:
    """The streaming depthwise data gradient (grouped.cpp: cg_dw_dgrad_run) into ``dx``,
    dx lines shared among the threads (each written by one); one call of its bound form
    (:func:`_bind_depthwise_dgrad`)."""
    return _bind_depthwise_dgrad(lib, vl, w, dy, dx, geom, lambda: dx)(w, dy)


def _bind_depthwise_dgrad(lib, vl: int, w: np.ndarray, dy: np.ndarray, dx: np.ndarray,
                          geom: ConvGeometry, alloc):
    """:func:`_depthwise_dgrad` bound (``_bound``): its descriptor, packed weights and
    task table made once; a call fills the weights, the two data pointers and the
    streaming choice (which depends on where the result landed)."""
    ntap, LP = math.prod(geom.kernel), -(-geom.c // vl) * vl
    wp = np.zeros((ntap, LP), np.float32)
    k3, s3, d3, p3 = (native._pad3(geom.kernel, 1), native._pad3(geom.strides, 1),
                      native._pad3(geom.dilations, 1), native._pad3(geom.pads_begin, 0))
    l3, m3 = native._pad3(geom.in_sizes, 1), native._pad3(geom.out_sizes, 1)
    st = [s // dx.itemsize for s in dx.strides[:-1]]
    ostride = [st[0]] + [0] * (4 - len(st)) + st[1:]
    prob = _DwDgrad(native._tensor(dy), None, (_I64 * 4)(*ostride), geom.n,
                    (_I64 * 3)(*l3), (_I64 * 3)(*m3), geom.c, (_I64 * 3)(*k3),
                    (_I64 * 3)(*s3), (_I64 * 3)(*d3), (_I64 * 3)(*p3), wp.ctypes.data, 0)
    pp = ctypes.addressof(prob)
    lines = geom.n * prob.L[0] * prob.L[1]
    threads = _threads(dy.nbytes + dx.nbytes)
    table = _bound.task_table(lib, "cg_dw_dgrad_run",
                              [(pp, lo, hi) for lo, hi in _pool.split(lines, 4 * threads)])
    go = _bound.runner(lib, table, threads)
    wview, c, address = wp[:, :geom.c], geom.c, _bound.address

    def run(w, dy):
        dx = alloc()
        wview[...] = w.reshape(ntap, c)
        prob.dy.ptr, prob.dx = address(dy), address(dx)
        prob.stream = _streams_dx(dx, vl)
        go()
        return dx
    run.keep = (prob, wp, table)
    return _bound.guarded(run)


def _bind_flat_wgrad(lib, x: np.ndarray, dy: np.ndarray, geom: ConvGeometry, shape):
    """:func:`_flat_wgrad` bound (``_bound``): descriptor, phase tables, scratch size and
    task table made once; a call patches x, dy and the (zeroed) result."""
    H, W = native._pad3(geom.out_sizes, 1)[1:]
    off, phases, widx = _flat_phase_table(geom, "wgrad")
    sh, sw = native._pad3(geom.strides, 1)[1:]
    es = x.itemsize
    st, yst = [s // es for s in x.strides], [s // es for s in dy.strides]
    prob = _Flat(None, None, st[0], st[-1], 0, 0, None, geom.n, geom.c, H, W, len(widx),
                 off.ctypes.data, yst[0], yst[-1], sh, sw, phases.ctypes.data,
                 widx.ctypes.data, native.DTYPE_CODES[x.dtype])
    pp = ctypes.addressof(prob)
    threads = _threads(x.nbytes + dy.nbytes)
    need = int(lib.cg_flat_scratch(pp))
    per = _pool.scratch_bytes(need)
    go = _bound.runner(lib, _bound.task_table(
        lib, "cg_flat_wgrad_run", [(pp, lo, hi) for lo, hi in _pool.split(geom.c, 4 * threads)]),
        threads, per)
    zeros, thread_scratch, address = _results.zeros, _pool.thread_scratch, _bound.address

    def run(x, dy):
        dw = zeros(shape, np.float32)
        prob.src, prob.out, prob.w = address(x), address(dw), address(dy)
        buf, (base, _) = thread_scratch("grouped-scratch", need, threads)
        go(base)
        del buf
        return dw
    run.keep = (prob, off, phases, widx)
    return _bound.guarded(run)


def _bind_depthwise_wgrad(lib, vl: int, x: np.ndarray, dy: np.ndarray, geom: ConvGeometry,
                          shape, threads: int):
    """:func:`_depthwise_wgrad` bound (``_bound``): descriptor, chunks and task table
    made once; a call patches x and dy (and the partials' address when it moved)."""
    k3, s3, d3, p3 = (native._pad3(geom.kernel, 1), native._pad3(geom.strides, 1),
                      native._pad3(geom.dilations, 1), native._pad3(geom.pads_begin, 0))
    l3, m3 = native._pad3(geom.in_sizes, 1), native._pad3(geom.out_sizes, 1)
    prob = _DwWgrad(native._tensor(x), native._tensor(dy), geom.n, (_I64 * 3)(*l3),
                    (_I64 * 3)(*m3), geom.c, (_I64 * 3)(*k3), (_I64 * 3)(*s3),
                    (_I64 * 3)(*d3), (_I64 * 3)(*p3))
    pp = ctypes.addressof(prob)
    ntap, LP, o = math.prod(geom.kernel), -(-geom.c // vl) * vl, geom.o
    lines = geom.n * prob.M[0] * prob.M[1]
    nchunks = _dw_wgrad_chunks(geom, ntap, LP)
    cuts = _pool.split(lines, nchunks)
    table = _bound.task_table(lib, "cg_dw_wgrad_run", [(pp, lo, hi, 0) for lo, hi in cuts])
    row = ntap * LP * 4
    offs = np.arange(len(cuts), dtype=np.int64) * row
    go = _bound.runner(lib, table, threads)
    zeros, address, parts_at = _results.zeros, _bound.address, [None]

    def run(x, dy):
        result = zeros(shape, np.float32)
        parts = scratch("grouped-partials", (nchunks, ntap * LP), np.float32, zero=True)
        at = address(parts)
        if at != parts_at[0]:
            table[:, 5] = offs + at
            parts_at[0] = at
        prob.x.ptr, prob.dy.ptr = address(x), address(dy)
        go()
        total = np.add.reduce(parts, axis=0).reshape(ntap, LP)
        result.reshape(ntap, o)[...] = total[:, :o]
        return result
    run.keep = (prob,)
    return _bound.guarded(run)


def _bind_corr(op: str, src: np.ndarray, w: np.ndarray, out: np.ndarray,
               geom: ConvGeometry, alloc):
    """:func:`_run_corr` bound (``_bound``): plan, descriptor, weight buffer (its gather
    indices) and task table made once; a call gathers the new weights into the buffer
    and patches the source and result addresses."""
    eng = native.engine()
    lib = _lib(eng)
    threads = _threads(src.nbytes + out.nbytes)
    pl = _plan_for(geom, op, src, threads)
    weights = _corr_weights(pl, w, geom, op, eng.vl)       # (its padding lanes stay 0)
    cg, og = geom.c // geom.groups, geom.o // geom.groups
    e = np.asarray(pl.entries)[:, None, None]
    if op == "fwd":
        index = (e, np.arange(cg)[None, :, None], np.arange(geom.o)[None, None, :])
        view = weights[:, :, :geom.o]
    else:
        c = np.arange(geom.c)
        index = (e, (c % cg)[None, None, :],
                 ((c // cg) * og)[None, None, :] + np.arange(og)[None, :, None])
        view = weights[:, :, :geom.c]
    prob = _tables(pl, src, None, out, weights)
    pp = ctypes.addressof(prob)
    need = int(lib.cg_grouped_scratch(pp, 0))
    per = _pool.scratch_bytes(need)
    cuts = _pool.split(pl.items, 4 * threads)
    go = _bound.runner(lib, _bound.task_table(
        lib, "cg_grouped_corr_run", [(pp, lo, hi) for lo, hi in cuts]), threads, per)
    address, thread_scratch, weights_2d = _bound.address, _pool.thread_scratch, native._weights_2d

    def run(w, src):
        out = alloc()
        view[...] = weights_2d(w)[index]
        prob.src.ptr, prob.out = address(src), address(out)
        prob.stream = _streams_lines(out)
        buf, (base, _) = thread_scratch("grouped-scratch", need, threads)
        go(base)
        del buf
        return out
    run.keep = (prob, weights, pl)
    return _bound.guarded(run)


def _bind_wgrad(x: np.ndarray, dy: np.ndarray, geom: ConvGeometry, shape):
    """The grouped kernel's weight gradient (the end of :func:`wgrad`) bound
    (``_bound``): plan, descriptor, chunks and task table made once; a call patches x,
    dy and the partials' address, and adds the partials in order as :func:`wgrad` does."""
    eng = native.engine()
    lib = _lib(eng)
    threads = _threads(x.nbytes + dy.nbytes)
    cg = geom.c // geom.groups
    pl = _plan_for(geom, "wgrad", x, threads)
    LP = pl.nlv * eng.vl
    part_floats = len(pl.entries) * pl.J * LP
    nchunks = max(1, min(pl.items, WGRAD_CHUNKS,
                         _budget_partials() // max(1, 4 * part_floats)))
    prob = _tables(pl, x, dy, None, None)
    pp = ctypes.addressof(prob)
    need = int(lib.cg_grouped_scratch(pp, 1))
    per = _pool.scratch_bytes(need)
    cuts = _pool.split(pl.items, nchunks)
    table = _bound.task_table(lib, "cg_grouped_wgrad_run", [(pp, lo, hi, 0) for lo, hi in cuts])
    offs = np.arange(len(cuts), dtype=np.int64) * (4 * part_floats)
    go = _bound.runner(lib, table, threads, per)
    order = np.empty(len(pl.entries), np.int64)
    order[pl.entries] = np.arange(len(pl.entries))
    E, J, o = len(pl.entries), pl.J, geom.o
    address, thread_scratch, zeros = _bound.address, _pool.thread_scratch, _results.zeros
    parts_at = [None]

    def run(x, dy):
        result = zeros(shape, np.float32)
        parts = scratch("grouped-partials", (nchunks, part_floats), np.float32, zero=True)
        at = address(parts)
        if at != parts_at[0]:
            table[:, 5] = offs + at
            parts_at[0] = at
        prob.src.ptr, prob.dy.ptr = address(x), address(dy)
        buf, (base, _) = thread_scratch("grouped-scratch", need, threads)
        go(base)
        del buf
        total = np.add.reduce(parts, axis=0).reshape(E, J, LP)
        result.reshape(-1, cg, o)[...] = total[order, :, :o]
        return result
    run.keep = (prob, pl)
    return _bound.guarded(run)


def bind(op: str):
    """The kernel's ``bind`` for ``op`` (``_bound``): the streaming depthwise data
    gradient, the streaming and flat depthwise weight gradients and the grouped kernel's
    three ops bind; the flat and planar depthwise data / forward paths return None
    (they run unbound)."""
    if op == "fwd":
        def bind_fwd(x, w, geom, out_dtype=None):
            alloc = native.allocator(x, geom.n, geom.out_sizes, geom.o, out_dtype or np.float32)
            y = alloc()
            if y.size == 0 or x.size == 0 or w.size == 0 or _flat(geom, x, y):
                return None
            bound = _bind_corr("fwd", x, w, y, geom, alloc)
            return lambda x, w: bound(w, x)
        return bind_fwd
    if op == "wgrad":
        def bind_wgrad(x, dy, geom, out_dtype=None):
            shape = (*geom.kernel, geom.c // geom.groups, geom.o)
            if math.prod(shape) == 0 or x.size == 0 or dy.size == 0:
                return None
            eng = native.engine()
            lib = _lib(eng)
            if _streams_depthwise(geom, x, dy):
                return _bind_depthwise_wgrad(lib, eng.vl, x, dy, geom, shape,
                                             _threads(x.nbytes + dy.nbytes))
            if _flat(geom, x, dy, op="wgrad"):
                return _bind_flat_wgrad(lib, x, dy, geom, shape)
            if _planar(geom, "wgrad", x, dy):
                return None
            return _bind_wgrad(x, dy, geom, shape)
        return bind_wgrad
    if op != "dgrad":
        return None

    def bind_dgrad(w, dy, geom, out_dtype=None):
        dtype = out_dtype or np.float32
        dx = native._alloc_like(dy, geom.n, geom.in_sizes, geom.c, dtype)
        if dx.size == 0 or dy.size == 0 or w.size == 0:
            return None
        eng = native.engine()
        lib = _lib(eng)
        alloc = native.allocator(dy, geom.n, geom.in_sizes, geom.c, dtype)
        if _streams_depthwise_dgrad(geom, dy, dx, int(lib.cg_dw_dgrad_terms())):
            return _bind_depthwise_dgrad(lib, eng.vl, w, dy, dx, geom, alloc)
        if _flat(geom, dy, dx, op="dgrad") or _planar(geom, "dgrad", dy, dx):
            return None
        return _bind_corr("dgrad", dy, w, dx, geom, alloc)
    return bind_dgrad


def _streams_dx(dx: np.ndarray, vl: int) -> bool:
    """Whether the streaming depthwise data gradient writes ``dx`` with streaming
    stores (``_results.streams``; every pixel's channels whole cache lines, in any of
    the dtypes). MobileNetV2's stride-1 depthwise data gradient (14.5 MB): 1.3-1.4x
    against plain stores, which read every dx line before writing it; stride 2
    (38.5 MB) 1.6x; its float16 / bfloat16 result 1.4x / 1.16x.  The kernel streams pairs
    of lane vectors, and a lone vector too where it is a whole line (float32 lanes of
    64 bytes): MobileNetV2's 144 channels (4 pairs and one vector) stream on AVX-512."""
    es = dx.itemsize
    line = 64 if vl * es % 64 == 0 else 2 * vl * es
    return _results.streams(dx) and (dx.shape[-1] * es) % max(64, line) == 0


def _budget_partials() -> int:
    return min(PARTIALS_BYTES, settings.workspace_bytes() // 4)


# -- memory ----------------------------------------------------------------------------------

def _scratch_floats(pl: Plan, op: str, dy_packed: bool) -> int:
    """Floats of per-thread scratch of a run (the same sum as cg_grouped_scratch)."""
    LP = pl.nlv * pl.vl
    ch = pl.chunks.reshape(-1, 4)
    win, outw = int((ch[:, 3] - ch[:, 2]).max()), int((ch[:, 1] - ch[:, 0]).max())
    need = pl.cache_lines * win * pl.ps + win * pl.cin + pl.vl if pl.packed else 0
    if op != "wgrad":
        need += outw * LP
    elif dy_packed:
        need += outw * (LP + pl.lanes)
    return need + 16


def workspace(geom: ConvGeometry, op: str, src_direct: bool = False,
              dy_direct: bool = False) -> dict[str, int]:
    """An upper bound of the kernel's temporary memory for one call, by part: the
    per-thread scratch (packed source lines, one output line; reused across
    calls), the packed weights (fwd, dgrad) or the partial weight gradients."""
    avail = native.available() is None
    eng = native.engine() if avail else None
    vl = eng.vl if eng else 8
    nbytes = geom.n * (geom.c * math.prod(geom.in_sizes) + geom.o * math.prod(geom.out_sizes)) * 4
    threads = _threads(nbytes)
    pl = plan(geom, op, vl, *_limits(eng), src_direct, threads, _budget(threads))
    LP = pl.nlv * vl
    dy_packed = op == "wgrad" and not (dy_direct and pl.lanes % vl == 0)
    parts = {"per-thread scratch": threads * 4 * _scratch_floats(pl, op, dy_packed)}
    per_tap = len(pl.entries) * pl.J * LP * 4
    if op == "wgrad":
        parts["partial weight gradients"] = per_tap * max(1, min(
            pl.items, WGRAD_CHUNKS, _budget_partials() // max(1, per_tap)))
    else:
        parts["packed weights"] = per_tap
    return parts


def memory(call) -> dict[str, int]:
    """The registry's memory estimate (kernels.Call): no input copies, the float32
    result when the caller keeps another (native.result_copy), and :func:`workspace`
    (for the streaming depthwise kernels, which read their operands in place in any of
    the three dtypes: their partial gradients or packed weights)."""
    src, other = (call.b, call.a) if call.op == "dgrad" else (call.a, call.b)
    direct = lambda t: t.dtype == np.float32 and "nxc" in t.layouts   # noqa: E731
    parts = native.result_copy(call)
    streamed = _streamed_workspace(call)
    if streamed is not None:
        parts.update(streamed)
        return parts
    parts.update(workspace(call.geom, call.op, direct(src),
                           call.op == "wgrad" and direct(other)))
    return parts


def _streamed_workspace(call) -> dict[str, int] | None:
    """What a call the streaming depthwise kernels take (_streams_depthwise,
    _streams_depthwise_dgrad) allocates, or None when it does not surely take them
    (its data operands not channels-last in one float dtype: the tile kernel's
    estimate then, an upper bound)."""
    geom = call.geom
    data = (call.a, call.b) if call.op == "wgrad" else (call.b, call.out)
    if (call.op == "fwd" or not (geom.groups == geom.c == geom.o)
            or data[0].dtype != data[1].dtype or data[0].dtype not in native.DTYPE_CODES
            or not all("nxc" in t.layouts for t in data)
            or native.available() is not None):
        return None
    eng = native.engine()
    ntap, LP = math.prod(geom.kernel), -(-geom.c // eng.vl) * eng.vl
    if call.op == "dgrad":
        if not _depthwise_dgrad_fits(geom, int(_lib(eng).cg_dw_dgrad_terms())):
            return None
        return {"packed weights": ntap * LP * 4}
    return {"partial weight gradients": _dw_wgrad_chunks(geom, ntap, LP) * ntap * LP * 4}
