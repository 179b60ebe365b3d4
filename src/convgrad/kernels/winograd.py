"""Winograd convolution for 3-tap stride-1 layers, on the native engine's builds.

``native/winograd.cpp`` computes a stride-1 correlation whose last one (1-D) or two
(2-D, 3-D) spatial axes have 3 taps (any dilation, any padding) with Winograd's
minimal filtering F(m, 3) per axis, m = 4 (6 transform points per axis) or m = 2
(4 points): 36 (or 16) products per 4x4 (2x2) output tile instead of 144 (36).  A
3-D problem's depth taps (any number, dilation 1) are extra terms of the products'
reduction, so its multiplications are those of the 2-D transform: F(1x4x4, Kx3x3).
The forward convolution is that correlation (x, w); the data gradient is the
correlation of dy with the flipped taps, channels swapped (stride 1 only).  The
weight gradient (a correlation of x with dy) uses the transposed algorithm
``dw = G^T [(B^T x B) . (A dy A^T)] G`` summed over tiles.

Dilated layers need no split: along an axis of dilation d, a tile's outputs are d
apart (the interleaved sub-grid's tiles), and so are the inputs it reads.

Accuracy: the transforms' rounding makes results less accurate than direct
convolution's (docs/kernels.md has the measured errors, docs/decisions.md D24 the
bound the chooser keeps).  NaN and Inf: the transforms mix a tile's inputs (and a
filter's taps), so a NaN or Inf would reach outputs it is not connected to, or turn
into NaN.  Every output line where a non-finite value came out is therefore computed
again by the direct engine (``native.recompute_lines``), and a non-finite weight
gradient entirely, which gives exactly the direct kernels' NaN/Inf semantics (D17).
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass

import numpy as np

from .. import settings
from ..layouts import contiguous
from ..geometry import ConvGeometry
from . import _bound, _pool, _results, native
from ._blas import scratch

_I64 = ctypes.c_int64
_VP = ctypes.c_void_p

# Per-thread transformed input of a work item (regime "tiles"): about this much.
ITEM_V_BYTES = 192 * 2**10
# Tiles per item at most.
ITEM_TILES = 96
# Regime "tiles" with transformed weights larger than half a core's L2: every item
# streams all of them (from L3) to multiply its tiles, each weight block once per 14 or
# so tiles; such items take a transformed input of up to half the L2 and up to this
# many tiles.  DeepLab d6's data gradient (4.2 MB of weights; 14 -> 54 tiles an item on
# a Sapphire Rapids, 2 MiB L2), 2 threads, alternating: 1.06x after the benchmark's
# pause (NXC), 1.17x (NCX), 1.15x hot.  Not for weights that fit: ResNet-50 res2 (0.6
# MB) with 1 MiB items was 0.89x (fewer items: the last ones leave a thread idle).
LARGE_U_ITEM_TILES = 192
# Transformed weights computed once and shared (regime "tiles") up to this size;
# larger ones are transformed block by block by the items that use them (regime
# "weights", where the transformed input is shared instead).
SHARED_U_BYTES = 8 * 2**20
# The shared transformed input of regime "weights", at most (more tiles: several
# groups of tiles, the weights transformed once per group).  10 MiB (8 until
# 2026-11-27): DeepLab d6's F(6, 3) data gradient (144 tiles a plane, 9.4 MB) in one
# group (below, WEIGHTS_ITEM_L2).
SHARED_V_BYTES = 10 * 2**20
# Output planes (3-D) an item of regime "tiles" covers: its input planes are transformed
# once for all of them (the depth taps' reach is transformed again by the next item).
ITEM_PLANES = 4
# Regime "weights": input channels per chunk of the shared transformed input and of the
# weights an item transforms at once (CorrPlan.kc) -- all of them where their transformed
# weights (points x channels x an output block) fit in this share of a core's L2: one
# GEMM call a point sums every channel, none adds into the products of another chunk
# (ResNet-50 res4's data gradient, F(4, 3), 1.18 MB: 1.07x hot and after the pause,
# alternating; res5's 2.4 MB in chunks of 256: 0.95-0.98x, of 128: 1.01-1.02x, so 64).
WEIGHT_CHUNK = 64
WHOLE_CHUNK_L2 = 0.625
# Regime "weights": tiles per item (each item transforms the weights of its output block
# again): at least WEIGHTS_ITEM_TILES, more while what its GEMMs keep in L2 fits in this
# share of a core's L2: its products and its chunk of transformed weights (all points),
# 4 * points * NB * (tiles + kc) bytes, and the input rows of the point being multiplied
# and of the next one, prefetched (2 * 4 * tiles * kc).  ResNet-50 res4's data gradient
# on a Zen 5 (1 MiB L2, chunks of 64): items of all 128 tiles (0.95 MB) instead of 64
# transform each block's weights once, not twice -- 1.06x NXC, 1.05x NCX after the pause
# (separate processes alternating, 4-5 rounds); the per-phase profile: weight transform
# 0.80-1.04 -> 0.43-0.58 core-ms, GEMMs level.  On a 2 MiB L2 res4 takes whole-channel
# chunks (1.18 MB), and 128 tiles would need 2.03 MB: it keeps the 64-tile items it was
# measured with.
# DeepLab d6's F(6, 3) data gradient (64 points: 8 KB of products a tile and a 32-channel
# block) takes 1.8: its 144 tiles one item per output block, each block's weights
# transformed once, its products (1.2 MB) and chunk of weights (0.5 MB) spilling from
# the L2.  Zen 5, 2 threads, in-process A/B: against groups of 128 + 16 tiles in items
# of 64 + 64 + 16 (0.92, 8 MiB of V: three weight transforms a block) two groups of 72
# in an item each (1.2) were 1.03x after the pause, 1.08x hot; one group in one item
# (1.8, 10 MiB) against that 1.06x / 1.06x (NCX 1.02x).  res4 at N = 32 (512 tiles: 2
# groups of 256 in an item each, not 3 of 171) level (0.98x / 1.03x); the suite's res4
# (128 tiles) and res5 (32) plan as before.
WEIGHTS_ITEM_TILES = 64
WEIGHTS_ITEM_L2 = 1.8
# ... but 1.2 for a buffered result (channels-first or 16-bit: an item buffers all its
# tiles' outputs, 36 x channels floats a tile): DeepLab's NCX data gradient, in-process
# A/Bs of items of 144 tiles against 72, measured 1.02x, 0.96x and 1.07x after the pause
# and 1.05x hot, while their buffers took 5.3 MB a thread instead of 2.7 (its declared
# workspace 23.5 MB instead of 17; 7.6 with F(3, 3) before 2026-11-27).
WEIGHTS_ITEM_L2_BUFFERED = 1.2
# A correlation's work items: a task each, taken from the pool's shared counter (ITEM_TASKS;
# False: 4 ranges of consecutive items a thread, as before 2026-11-27).  DeepLab's 44
# items in 8 ranges of 5 or 6 left a thread idle for up to an item at the end, U-Net's
# 304 in ranges of 38 the same: in-process A/B after the pause, NXC DeepLab 1.08x,
# U-Net 1.10x, NCX 1.05x / 1.03x; hot 1.04-1.08x; TCN and res2 level; the same bits.
ITEM_TASKS = True


def _item_ranges(first: int, count: int, threads: int) -> list[tuple[int, int]]:
    """Work items [first, first + count) as task ranges (ITEM_TASKS)."""
    if ITEM_TASKS:
        return [(first + i, first + i + 1) for i in range(count)]
    return [(first + lo, first + hi) for lo, hi in _pool.split(count, 4 * threads)]


class _TileGeom(ctypes.Structure):
    _fields_ = [("axes", _I64), ("m", _I64), ("dil", _I64 * 3), ("off", _I64 * 3),
                ("kd", _I64), ("tiles_h", _VP), ("nth", _I64), ("tiles_w", _VP), ("ntw", _I64)]


class _Source(ctypes.Structure):
    _fields_ = [("t", native._Tensor), ("L", _I64 * 3), ("C", _I64)]


class _Wino(ctypes.Structure):
    _fields_ = [("inp", _Source), ("out", _VP), ("ostride", _I64 * 5), ("out_dtype", _I64),
                ("Lout", _I64 * 3), ("Cout", _I64), ("groups", _I64), ("tg", _TileGeom),
                ("U", _VP), ("w", _VP), ("wdtype", _I64), ("wst", _I64), ("wsa", _I64),
                ("wsb", _I64), ("wgs", _I64), ("wflip", _I64), ("cpad", _I64), ("nv", _I64),
                ("V", _VP), ("vs0", _I64), ("vs1", _I64), ("vd0", _I64), ("vd1", _I64),
                ("items", _VP), ("bad", _VP), ("stream", _I64), ("wchunk", _I64)]


class _WinoWgrad(ctypes.Structure):
    _fields_ = [("x", _Source), ("dy", _Source), ("groups", _I64), ("tg", _TileGeom),
                ("cpad", _I64), ("nv", _I64), ("items", _VP), ("bad", _VP), ("oix", _I64),
                ("out_dtype", _I64), ("stream", _I64)]


def _lib(eng: native.Engine):
    """The engine's library with the Winograd entry points declared (once)."""
    lib = eng.lib
    if not getattr(lib, "_wino_bound", False):
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        for name, res, args in (("cg_wino_points", i64, [i64, i64]),
                                ("cg_wino_mr", i64, [i64]),
                                ("cg_wino_scratch", i64, [vp, i64, i64]),
                                ("cg_wino_run", None, [vp, i64, i64, vp]),
                                ("cg_wino_input_scratch", i64, [vp, i64, i64]),
                                ("cg_wino_input", None, [vp, i64, i64, vp, vp]),
                                ("cg_wino_weights", None, [vp, i64, i64, vp]),
                                ("cg_wino_wgrad_scratch", i64, [vp, i64, i64]),
                                ("cg_wino_wgrad_fused_floats", i64, [vp]),
                                ("cg_wino_wgrad_task", None, [vp, vp, i64, vp]),
                                ("cg_wino_wgrad_finish_rows", None, [vp, vp, i64, i64])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        lib._wino_bound = True
    return lib


# -- which problems -------------------------------------------------------------------------

def axes(geom: ConvGeometry) -> int | None:
    """The Winograd axes of a problem (1: w; 2: h and w), None if it has none: stride 1,
    3 taps along the last one (1-D) or two (2-D, 3-D) axes, depth dilation 1 (3-D)."""
    r = geom.spatial_rank
    if r not in (1, 2, 3) or any(s != 1 for s in geom.strides):
        return None
    if r == 1:
        return 1 if geom.kernel == (3,) else None
    if tuple(geom.kernel[-2:]) != (3, 3):
        return None
    if r == 3 and geom.dilations[0] != 1:
        return None
    return 2


def supports(geom: ConvGeometry, dtype) -> str | None:
    why = native.available()
    if why is not None:
        return f"native engine unavailable: {why}"
    if np.dtype(dtype) != np.float32:
        return f"computes in float32 only, not {np.dtype(dtype)}"
    if any(s != 1 for s in geom.strides):
        return "stride 1 only"
    if axes(geom) is None:
        return ("3 taps along the last axis (1-D) or the last two (2-D; 3-D with depth "
                "dilation 1) only")
    return None


def _tiles(size: int, dil: int, m: int) -> np.ndarray:
    """Tiles of m outputs d apart along an axis of ``size`` outputs: per tile, its first
    output and how many of its m outputs exist (the sub-grid r, r + d, ... of each
    residue r, cut into runs of m).  Ordered by run, then residue: consecutive tiles --
    the tiles of one work item -- cover consecutive outputs (the d sub-grids of a span
    of m * d outputs), so an item converting its input window (float16, channels-first)
    converts only pixels it reads, not d times as many (the TCN row, d = 8, float16:
    its conversions took a fifth of the weight gradient's time)."""
    counts = [len(range(r, size, dil)) for r in range(min(dil, size))]
    out = [(r + dil * m * b, min(m, count - m * b))
           for b in range(-(-max(counts, default=0) // m))
           for r, count in enumerate(counts) if m * b < count]
    return np.asarray(out, np.int64).reshape(-1, 2)


@functools.lru_cache(maxsize=1024)
def products(geom: ConvGeometry, m: int, out_sizes=None) -> int:
    """Multiplications per (input, output) channel pair over the output: tiles times
    transform points (the direct kernels: outputs times taps)."""
    ax = axes(geom)
    sizes = tuple(out_sizes or geom.out_sizes)
    dil = geom.dilations
    per_axis = [len(_tiles(s, d, m)) for s, d in zip(sizes[-ax:], dil[-ax:])]
    lead = math.prod(sizes[:-ax]) * math.prod(geom.kernel[:-ax])
    return geom.n * lead * math.prod(per_axis) * (m + 2) ** ax


# Outputs per tile along an axis: F(6, 3), F(4, 3), F(3, 3), F(2, 3).
TILE_SIZES = (6, 4, 3, 2)
# The weight gradient's: not F(6, 3) (its sums per point would grow 64 / 36 and its
# error about twice F(4, 3)'s, for no row that needs it).
WGRAD_TILE_SIZES = (4, 3, 2)
# F(6, 3) transforms cost more per value than the smaller tiles' and its float32 error is
# about twice F(4, 3)'s: a correlation takes it only where it multiplies at most this
# fraction of the best other tile's products (and its estimated error is within the
# bound; else the next tile).  Measured (docs/kernels.md): DeepLab d6 (0.64) 1.12x,
# U-Net 3-D (0.84) 1.09x after the benchmark's pause; TCN (0.90) 1.03-1.10x after it,
# 0.97x hot; ResNet-50 res2 (0.91) 0.98x.
F6_MAX_PRODUCTS = 0.85


@functools.lru_cache(maxsize=1024)
def tile_size(geom: ConvGeometry, op: str) -> int:
    """The tile of :data:`TILE_SIZES` that multiplies least (of equals, the smaller: the
    more accurate; F(6, 3) only by :data:`F6_MAX_PRODUCTS`, for correlations).  F(4, 3)
    on large images; its tiles waste the saving on small ones and on dilated layers'
    short sub-grids, where F(3, 3) (a weight gradient on DeepLab d6's 5- and 6-wide ones;
    its correlations take F(6, 3)) or F(2, 3) multiplies less.  The correlation's output
    sizes decide (dgrad: dx).  A weight gradient skips a tile whose sums are too large
    for the AVX-512 build's rule (:func:`_sums_too_large`) where another tile's are not
    -- on every build, since the tile does not depend on the build."""
    sizes = geom.in_sizes if op == "dgrad" else geom.out_sizes
    ranked = sorted(WGRAD_TILE_SIZES if op == "wgrad" else TILE_SIZES[1:],
                    key=lambda m: (products(geom, m, sizes), m))
    if op == "wgrad":
        fits = [m for m in ranked if not _sums_too_large(geom, m)]
        return (fits or ranked)[0]
    if (products(geom, 6, sizes) <= F6_MAX_PRODUCTS * products(geom, ranked[0], sizes)
            and error_estimate(geom, op, 6) <= ERROR_BOUND):
        return 6
    return ranked[0]


# -- when to use it: error and speed models ------------------------------------------------

ERROR_BOUND = 1e-5
"""The largest relative L2 error (on standard normal data, against the float64 result)
``algo="auto"`` accepts from Winograd (docs/decisions.md D24)."""

UNIT_ROUNDOFF = 2.0 ** -24
# Estimated relative L2 error = UNIT_ROUNDOFF * (a0 + a1 * sqrt(n)): for the forward
# correlation (fwd, dgrad) n is its reduction length (input channels of a group x
# taps); for the weight gradient, the positions summed (N x output positions).  Fitted
# above the errors measured on standard normal data (docs/kernels.md, "Winograd"), by
# (variant: op family, Winograd axes, m).  tests/test_winograd.py holds every measured
# error below its estimate.
ERROR_MODEL = {("corr", 2, 4): (12.0, 1.3), ("corr", 1, 4): (5.0, 0.7),
               ("corr", 2, 3): (8.0, 0.8), ("corr", 1, 3): (4.0, 0.55),
               ("corr", 2, 2): (3.0, 0.3), ("corr", 1, 2): (3.0, 0.3),
               ("wgrad", 2, 4): (30.0, 0.06), ("wgrad", 1, 4): (12.0, 0.04),
               ("wgrad", 2, 3): (14.0, 0.1), ("wgrad", 1, 3): (7.0, 0.1),
               ("wgrad", 2, 2): (8.0, 0.02), ("wgrad", 1, 2): (8.0, 0.02),
               ("corr", 2, 6): (22.0, 1.9), ("corr", 1, 6): (7.0, 0.85),
               ("wgrad", 2, 6): (45.0, 0.12), ("wgrad", 1, 6): (16.0, 0.08)}


def error_estimate(geom: ConvGeometry, op: str, m: int | None = None) -> float:
    """The relative L2 error Winograd is expected to reach on this problem at most
    (standard normal data), from :data:`ERROR_MODEL`."""
    m = m or tile_size(geom, op)
    if op == "wgrad":
        a0, a1 = ERROR_MODEL[("wgrad", axes(geom), m)]
        n = geom.n * math.prod(geom.out_sizes)
    else:
        a0, a1 = ERROR_MODEL[("corr", axes(geom), m)]
        n = (geom.c if op == "fwd" else geom.o) // geom.groups * math.prod(geom.kernel)
    return UNIT_ROUNDOFF * (a0 + a1 * math.sqrt(n))


# The speed model: work in units of one multiply-add of a GEMM.  A transform costs
# about TRANSFORM_COST[side] per transformed value (fitted to the measured split of
# res2's time: input transform 15%, GEMMs 55%, output transform 30%).
TRANSFORM_COST = {"in": 16.0, "out": 32.0}
# algo="auto" takes Winograd when the direct kernels' work is at least this many times
# Winograd's.
SPEEDUP_MARGIN = 1.15


def speedup_estimate(geom: ConvGeometry, op: str, m: int | None = None) -> float:
    """Estimated (direct time / Winograd time) of a problem Winograd supports: products
    per channel pair (outputs x taps, against tiles x transform points) times the
    channels they meet, plus the transforms' cost per channel."""
    m = m or tile_size(geom, op)
    G = geom.groups
    cg, og = geom.c // G, geom.o // G
    a, b = (cg, og) if op != "dgrad" else (og, cg)        # the correlation's in, out
    direct = geom.n * math.prod(geom.out_sizes if op != "dgrad" else geom.in_sizes) * \
        math.prod(geom.kernel)
    sizes = geom.in_sizes if op == "dgrad" else geom.out_sizes
    wino = products(geom, m, sizes)
    values = wino // (geom.kernel[0] if geom.spatial_rank == 3 else 1)  # per channel
    work = wino * a * b + values * (TRANSFORM_COST["in"] * a + TRANSFORM_COST["out"] * b)
    return direct * a * b / work


def preferred(geom: ConvGeometry, op: str) -> bool:
    """Whether ``algo="auto"`` should try Winograd first: a problem it runs, faster by
    :data:`SPEEDUP_MARGIN` (:func:`speedup_estimate`), with an estimated error within
    :data:`ERROR_BOUND`, unless ``config(precision="highest")``."""
    if settings.precision() == "highest" or axes(geom) is None or geom.flops == 0:
        return False
    vl = native.engine().vl if native.available() is None else 8
    m = tile_size(geom, op)
    fused = op == "wgrad" and _fused(wgrad_plan(geom, vl, m, _wgrad_budgets()))
    return _preferred(geom, op, m, vl, fused)


@functools.lru_cache(maxsize=1024)
def _preferred(geom: ConvGeometry, op: str, m: int, vl: int = 8, fused: bool = False) -> bool:
    """:func:`preferred` at the default precision with tiles of m, for the engine build
    of ``vl`` floats a vector, a weight gradient's tasks ``fused`` or not (pure: cached
    per problem)."""
    if error_estimate(geom, op, m) > ERROR_BOUND:
        return False
    if op == "wgrad" and wgrad_tiles(geom, m) < (WGRAD_FUSED_MIN_TILES if fused
                                                 else WGRAD_MIN_TILES):
        return False
    speedup = speedup_estimate(geom, op, m)
    if vl >= 16 and op == "wgrad" and _sums_too_large(geom, m):
        return False
    return speedup >= SPEEDUP_MARGIN


def _sums_too_large(geom: ConvGeometry, m: int) -> bool:
    """Whether a weight gradient's sums with tiles of m are cut into boxes that outgrow
    the L2 (the rule below) and Winograd is not estimated fast enough to win anyway."""
    sums = wgrad_sums_bytes(geom, m)
    return (sums > WGRAD_MAX_SUMS_BYTES and 2 * sums > PARTIALS_BYTES
            and speedup_estimate(geom, "wgrad", m) < WGRAD_LARGE_SUMS_SPEEDUP)


# A weight gradient adds every block of tiles' products into one set of sums per
# transform point (points x channels in x channels out floats, per partial); where that
# set outgrows a core's L2, each block of tiles streams it from L3 or memory, and on the
# AVX-512 build the direct kernels (twice the AVX2 build's lanes) then win.  Measured
# 2026-11-26 on a Sapphire Rapids (2 MiB L2), 2 threads, Winograd against direct,
# alternating in one process: DeepLab d6 (4 MiB of sums) 1.28x slower after the
# benchmark's pause, level hot, NCX 1.11x slower; ResNet-50 res4 (9.4 MiB) 1.09x / level
# NCX; below it Winograd stays ahead (res2, 0.6 MiB: 1.33x faster; the 3-D U-Net 0.4 MiB:
# 2.0x; the TCN 0.4 MiB: 1.7x).  On a Zen 3 (AVX2) DeepLab's Winograd weight gradient was
# 1.45x faster than direct: the rule holds for AVX-512 builds only.  Re-measured the same
# way later that day, once the tasks ran on the engine's workers (they had run on Python's
# pool threads, 2.3x slower after the pause): res4 (9 MiB of sums, estimated speedup 2.58)
# now 1.17x faster after the pause (1.35x hot), NCX level (1.13x hot); DeepLab (4 MiB,
# F(2, 3) on its 6 x 6 dilated sub-grids, estimate 1.59) still 1.06-1.12x slower.  So the
# sums rule holds only below an estimated speedup of WGRAD_LARGE_SUMS_SPEEDUP.  And only
# where the sums are cut into boxes: a weight gradient whose two sets of partial sums fit
# PARTIALS_BYTES takes items of several times their bytes of tiles when they outgrow the
# L2 (WGRAD_LARGE_SUMS_ITEMS), and DeepLab's then ran 1.09x (NXC) / 1.13x (NCX) faster
# than direct after the pause (2026-11-26 evening, same protocol).
WGRAD_MAX_SUMS_BYTES = 2 * 2**20
WGRAD_LARGE_SUMS_SPEEDUP = 2.0


def wgrad_sums_bytes(geom: ConvGeometry, m: int | None = None) -> int:
    """Bytes of one set of a weight gradient's sums: transform points (x depth taps) x
    input channels of a group x output channels."""
    m = m or tile_size(geom, "wgrad")
    kd = geom.kernel[0] if geom.spatial_rank == 3 else 1
    points = (m + 2) ** 2 if axes(geom) == 2 else m + 2
    return 4 * points * kd * (geom.c // geom.groups) * geom.o


# A weight gradient sums its products over the tiles: with few tiles its GEMMs are too
# short to pay for the transforms.  Measured, 2 threads, Winograd / direct engine time:
# ResNet-50 res5 (8 x 2 x 2 = 32 tiles of 4x4) 1.53 NXC / 1.24 NCX (slower); res4 (128
# tiles) 0.99 / 0.74; DeepLab d6 (324) 0.69 / 0.68.
WGRAD_MIN_TILES = 64
# ... unless its tasks are fused (WgradPlan.fused: one item of every tile per box of
# channels, each register tile's sums finished as made, where the box's sums were
# written, zeroed and read back from L3).  Zen 5 (1 MiB L2), 2 threads, separate
# processes, after the benchmark's 0.15 s pause, direct -> Winograd (2026-11-27):
# res5 (32 tiles) NXC 5.7-6.5 -> 4.1-4.6 ms, NCX 7.5-8.7 -> 5.8-7.0; res5 at N = 4 (16
# tiles) NXC 3.47 -> 2.73, NCX 4.95 -> 4.22; res4 at N = 2 (32 tiles) NXC 1.90 -> 1.67, NCX
# 2.71 -> 2.61; but res4 at N = 1 (16 tiles) NCX 1.59 -> 1.80 (NXC 1.34 -> 1.11) and res5
# at N = 2 (8 tiles) level, N = 1 (4 tiles) 1.44 -> 1.91.
WGRAD_FUSED_MIN_TILES = 32


def wgrad_tiles(geom: ConvGeometry, m: int | None = None) -> int:
    """The tiles a weight gradient sums over: samples x output positions per tile
    (m x m on the last two axes, one per position on a 3-D problem's depth)."""
    m = m or tile_size(geom, "wgrad")
    wa = min(geom.spatial_rank, 2)
    outer = math.prod(geom.out_sizes[:-wa]) if geom.spatial_rank > wa else 1
    return geom.n * outer * math.prod(-(-s // m) for s in geom.out_sizes[-wa:])


# -- forward and data gradient: plans -------------------------------------------------------

@dataclass(frozen=True)
class CorrPlan:
    """A Winograd correlation: everything that depends on the geometry only."""
    axes: int
    m: int
    lin: tuple            # input spatial sizes (3-D)
    lout: tuple
    cin: int
    cout: int
    groups: int
    dil: tuple
    off: tuple
    kd: int
    flip: bool
    tiles_h: np.ndarray
    tiles_w: np.ndarray
    nv: int
    cpad: int
    regime: str           # "tiles": weights transformed once, items = blocks of tiles;
                          # "weights": input transformed once per group of tiles, items =
                          # output blocks transforming their own weights
    groups_of_tiles: tuple    # regime "weights": (s0, s1, d0, d1) per group
    group_items: tuple        # regime "weights": per group, its first and end item (groups
                              # cut into different numbers of items: a short last one)
    items: np.ndarray     # per item: s0, s1, d0, d1, k0, k1
    u_floats: int         # regime "tiles": the transformed weights
    v_floats: tuple       # regime "weights": per group, its transformed input
    kc: int               # regime "weights": input channels whose weights an item
                          # transforms at a time (WEIGHT_CHUNK, or all: WHOLE_CHUNK_L2)


def _corr_geometry(geom: ConvGeometry, kind: str):
    """(lin, lout, cin, cout, dil, off) of the correlation, 3-D padded; dgrad: dy with the
    flipped taps, ``off = pb - (K-1)*d``."""
    pad3 = native._pad3
    k3, d3, p3 = pad3(geom.kernel, 1), pad3(geom.dilations, 1), pad3(geom.pads_begin, 0)
    if kind == "fwd":
        return (pad3(geom.in_sizes, 1), pad3(geom.out_sizes, 1), geom.c, geom.o, d3,
                tuple(-p for p in p3))
    return (pad3(geom.out_sizes, 1), pad3(geom.in_sizes, 1), geom.o, geom.c, d3,
            tuple(p - (k - 1) * d for p, k, d in zip(p3, k3, d3)))


@functools.lru_cache(maxsize=256)
def corr_plan(geom: ConvGeometry, kind: str, vl: int, mr_of: tuple, m: int,
              budgets: tuple, converted: bool = False, buffered: bool = False) -> CorrPlan:
    """The work decomposition of a Winograd forward / data gradient (pure, cached);
    ``converted``: its input is converted line by line (:func:`_converted`);
    ``buffered``: its result goes through the items' buffers (:func:`_buffered`)."""
    (item_v_bytes, item_tiles, shared_u, shared_v, item_planes, weights_tiles, half_l2,
     large_u_tiles, whole_chunk, weights_l2, weights_l2_buffered) = budgets
    if buffered:
        weights_l2 = min(weights_l2, weights_l2_buffered)
    ax = axes(geom)
    lin, lout, cin, cout, dil, off = _corr_geometry(geom, kind)
    G = geom.groups
    kd = geom.kernel[0] if geom.spatial_rank == 3 else 1
    na = (m + 2) ** ax
    nv = native._nv_for(cout // G, vl)
    nb, mr = nv * vl, mr_of[nv - 1]
    cpad = -(-(cin // G) // vl) * vl
    nob = -(-(cout // G) // nb)
    th = _tiles(lout[1], dil[1], m) if ax == 2 else np.asarray([[0, 1]], np.int64)
    tw = _tiles(lout[2], dil[2], m)
    per_plane = geom.n * len(th) * len(tw)
    u_floats = G * nob * na * _spread(kd * cpad * nb)
    depth = lout[0]
    items, groups_of_tiles, group_items, v_floats = [], [], [], []
    kc = cpad if 4 * na * cpad * nb <= whole_chunk else min(WEIGHT_CHUNK, cpad)
    if u_floats * 4 <= shared_u:
        regime = "tiles"
        if u_floats * 4 > half_l2:
            item_v_bytes, item_tiles = max(item_v_bytes, half_l2), max(item_tiles, large_u_tiles)
        planes = min(depth, item_planes)
        rowlen = (planes + kd - 1) * G * cpad
        t = max(mr, min(item_tiles, item_v_bytes // (4 * na * rowlen)) // mr * mr)
        for d0 in range(0, depth, planes):
            for s0, s1 in _tile_blocks(per_plane, len(th) * len(tw), t,
                                       len(tw) if converted and ROW_ITEMS else 0):
                items.append((s0, s1, d0, min(depth, d0 + planes), 0, G * nob))
    else:
        regime = "weights"
        # groups of tiles whose transformed input fits: whole planes of tiles first
        rowlen1 = kd * G * cpad
        weights_fit = (int(weights_l2) // 4 - na * nb * kc) // (na * nb + 2 * kc)
        tiles_fit = max(mr, shared_v // (4 * na * rowlen1))
        if tiles_fit >= per_plane:
            planes = max(1, min(depth, (shared_v // (4 * na * per_plane * G * cpad)) - kd + 1))
            spans = [(0, per_plane, d0, min(depth, d0 + planes)) for d0 in range(0, depth, planes)]
        else:
            # groups of near-equal tiles: a short last group would transform every
            # block's weights again for a few tiles (DeepLab's F(6, 3): 128 + 16)
            spans = [(s0, s1, d0, d0 + 1) for d0 in range(depth)
                     for s0, s1 in _pool.split(per_plane, -(-per_plane // tiles_fit))]
        for s0, s1, d0, d1 in spans:
            groups_of_tiles.append((s0, s1, d0, d1))
            v_floats.append(na * _spread((s1 - s0) * (d1 - d0 + kd - 1) * G * -(-cpad // kc) * kc))
            cut = -(-(s1 - s0) // max(weights_tiles, weights_fit))
            bounds = [s0 + (s1 - s0) * i // cut for i in range(cut + 1)]
            first = len(items)
            items += [(a, b, d0, d1, k, k + 1) for k in range(G * nob)
                      for a, b in zip(bounds, bounds[1:])]
            group_items.append((first, len(items)))
    items = native._i64(items).reshape(-1, 6)
    plan = CorrPlan(ax, m, lin, lout, cin, cout, G, dil, off, kd, kind == "dgrad",
                    th.reshape(-1).copy(), tw.reshape(-1).copy(), nv, cpad, regime,
                    tuple(groups_of_tiles), tuple(group_items), items, u_floats,
                    tuple(v_floats), kc)
    for a in (plan.tiles_h, plan.tiles_w, plan.items):
        a.setflags(write=False)
    return plan


# Items of a converted input (channels-first or, on the portable build, 16-bit) stay
# within one row of tiles: an item converts its input lines over the w range of all its
# tiles, so one of 13 tiles that ended a row of 16 and began the next converted two rows
# of lines over the whole width (the 3-D U-Net NCX data gradient, 2 threads, separate
# processes: 26.9 -> 21.6 ms after the pause, 26.0 -> 20.8 hot).  Inputs read in place
# keep the items of t tiles (8-tile row pieces were 0.93x on the U-Net's NXC call).
ROW_ITEMS = True
# Weight-gradient items likewise, whatever the input: the 3-D U-Net's (items of 22 tiles
# on rows of 16, x and dy lines converted or transformed over two rows) NCX 38.8 ->
# 29.0 ms after the pause, NXC 23.0 -> 20.9 (separate processes).
WGRAD_ROW_ITEMS = True


def _tile_blocks(per_plane: int, per_sample: int, t: int, row: int = 0) -> list[tuple[int, int]]:
    """The tiles [0, per_plane) (samples of per_sample tiles) cut into work items of
    about t tiles.  Where a sample has t tiles or more, items do not cross samples: an
    item converts (float16, channels-first) the input lines of every sample it touches
    over the w range of all its tiles, so one straddling two 1-D samples converted both
    whole lines (the TCN row: 1.8 times its input per call).  With ``row`` (tiles per
    row: :data:`ROW_ITEMS`, :data:`WGRAD_ROW_ITEMS`) and items of less than two rows,
    items do not cross rows either: a row longer than t is cut into near-equal pieces,
    one that t holds is one item (where t holds two rows or more, an item crossing a
    row converts a small share twice: ResNet-50 res2's weight gradient, items of 56
    tiles on rows of 14, measured 0.89x NCX in whole rows)."""
    if per_sample < t:
        return [(s0, min(per_plane, s0 + t)) for s0 in range(0, per_plane, t)]
    if row and per_sample % row == 0 and t < 2 * row:
        k = -(-row // t)
        return [(r0 + row * i // k, r0 + row * (i + 1) // k)
                for r0 in range(0, per_plane, row) for i in range(k)]
    k = -(-per_sample // t)
    return [(n0 + per_sample * i // k, n0 + per_sample * (i + 1) // k)
            for n0 in range(0, per_plane, per_sample) for i in range(k)]


def _spread(floats: int) -> int:
    """engine: spread()"""
    return ((-(-floats // 16)) | 1) * 16


def _budgets() -> tuple:
    w = settings.workspace_bytes()
    return (ITEM_V_BYTES, ITEM_TILES, min(SHARED_U_BYTES, w // 4), min(SHARED_V_BYTES, w // 4),
            ITEM_PLANES, WEIGHTS_ITEM_TILES, native.l2_bytes() // 2, LARGE_U_ITEM_TILES,
            int(native.l2_bytes() * WHOLE_CHUNK_L2), int(native.l2_bytes() * WEIGHTS_ITEM_L2),
            int(native.l2_bytes() * WEIGHTS_ITEM_L2_BUFFERED))


def _buffered(out: np.ndarray) -> bool:
    """Whether a correlation's result goes through its items' buffers (winograd.cpp:
    direct_out): channels not innermost, or not float32."""
    return out.dtype != np.float32 or out.strides[-1] != out.itemsize


def _converted(a: np.ndarray, isa: str) -> bool:
    """Whether the kernels convert ``a``'s lines into scratch (winograd.cpp: in_place):
    channels not innermost, or 16 bits on the portable build (the AVX-512 and AVX2
    builds widen 16-bit channels-last lines in their loads)."""
    return a.strides[-1] != a.itemsize or (a.dtype != np.float32 and isa == "generic")


def _source(a: np.ndarray) -> _Source:
    """An (N, *S, C) view as a source (3-D sizes)."""
    return _Source(native._tensor(a), (_I64 * 3)(*native._pad3(a.shape[1:-1], 1)), a.shape[-1])


def _tile_geom(plan) -> _TileGeom:
    return _TileGeom(plan.axes, plan.m, (_I64 * 3)(*plan.dil), (_I64 * 3)(*plan.off), plan.kd,
                     plan.tiles_h.ctypes.data, len(plan.tiles_h) // 2, plan.tiles_w.ctypes.data,
                     len(plan.tiles_w) // 2)


def _problem(plan: CorrPlan, inp: np.ndarray, w: np.ndarray, out: np.ndarray, U, bad):
    """The C problem (the arrays it points into are kept alive by the caller)."""
    w3 = native._weights_2d(w)
    es = w3.itemsize
    sc, so = w3.strides[1] // es, w3.strides[2] // es
    G = plan.groups
    og = (plan.cin if plan.flip else plan.cout) // G
    # rows: the correlation's input channels of a group; columns: its outputs
    wsa, wsb = (so, sc) if plan.flip else (sc, so)
    ostr = [s // out.itemsize for s in out.strides]
    r = out.ndim - 2
    ostr5 = [ostr[0]] + [0] * (3 - r) + ostr[1:]
    return _Wino(_source(inp), out.ctypes.data, (_I64 * 5)(*ostr5),
                 native.DTYPE_CODES[out.dtype], (_I64 * 3)(*plan.lout), plan.cout, G,
                 _tile_geom(plan), U.ctypes.data if U is not None else None,
                 w3.ctypes.data, native.DTYPE_CODES[w3.dtype], w3.strides[0] // es, wsa, wsb,
                 og * so, int(plan.flip), plan.cpad, plan.nv, None, 0, 0, 0, 0,
                 plan.items.ctypes.data, bad.ctypes.data, int(native._streams(out)),
                 plan.kc)


# 16-bit weights: converted to a float32 copy once per call (True), or read in place by
# the weight transforms, 8 x 8 blocks widened and transposed (False; 2026-11-26 evening).
# The copy had replaced an element-by-element conversion at the weights' stride (ResNet-50
# res4 data gradient, float16: 13% of its time); the blocks read the 16-bit weights at
# about the speed of float32 ones and save the copy: res5 float16 data gradient (9.4 MB of
# float32 weights, transformed once per call), after the pause, alternating: see
# docs/kernels.md.
FLOAT32_WEIGHTS_COPY = False


def _float32_weights(w: np.ndarray) -> np.ndarray:
    """float16/bfloat16 weights as a float32 array of the same memory order when
    FLOAT32_WEIGHTS_COPY (converted once by the engine), else w itself."""
    if w.dtype == np.float32 or not FLOAT32_WEIGHTS_COPY:
        return w
    order = np.argsort(w.strides, kind="stable")[::-1]      # memory order, outermost first
    base = np.ascontiguousarray(w.transpose(order))         # no copy for a permuted view
    return native.float32_copy(base).transpose(np.argsort(order))


def _run_corr(kind: str, inp: np.ndarray, w: np.ndarray, out: np.ndarray,
              geom: ConvGeometry) -> np.ndarray:
    eng = native.engine()
    lib = _lib(eng)
    if out.size == 0:
        return out
    if inp.size == 0 or w.size == 0:
        out[...] = 0
        return out
    w = _float32_weights(w)
    threads = native._threads(geom.flops)
    m = tile_size(geom, kind)
    plan = corr_plan(geom, kind, eng.vl, eng.mr_of_wino if hasattr(eng, "mr_of_wino") else
                     _mr_of(eng), m, _budgets(), _converted(inp, eng.isa), _buffered(out))
    lines = out.shape[0] * math.prod(plan.lout[:2])
    bad = scratch("winograd-bad", (lines,), np.uint8, zero=True)
    nblk = len(plan.items) and int(plan.items[0, 5] if plan.regime == "tiles" else
                                   plan.items[:, 5].max())
    U = None
    if plan.regime == "tiles":
        U = scratch("winograd-U", (plan.u_floats,), np.float32, zero=False)
    prob = _problem(plan, inp, w, out, U, bad)
    pp = ctypes.addressof(prob)
    if U is not None:
        ub = plan.u_floats // max(1, nblk)
        wt = threads if U.nbytes > 2**20 else 1
        _pool.run_native(lib, "cg_wino_weights",
                         [(pp, lo, hi, U[lo * ub:].ctypes.data)
                          for lo, hi in _pool.split(nblk, wt)], wt)

    def run(first, count):
        """The work items [first, first + count), a task each (_item_ranges)."""
        ranges = _item_ranges(first, count, threads)
        need = int(lib.cg_wino_scratch(pp, first, first + count))
        buf, per_thread = _pool.thread_scratch("native-pack", need, threads)
        _pool.run_native(lib, "cg_wino_run", [(pp, lo, hi) for lo, hi in ranges], threads,
                         per_thread)
        del buf

    if plan.regime == "tiles":
        run(0, len(plan.items))
    else:
        for (s0, s1, d0, d1), (i0, i1), vf in zip(plan.groups_of_tiles, plan.group_items,
                                                  plan.v_floats):
            V = scratch("winograd-V", (vf,), np.float32, zero=False)
            prob.V, prob.vs0, prob.vs1, prob.vd0, prob.vd1 = V.ctypes.data, s0, s1, d0, d1
            ranges = [(s0 + lo, s0 + hi) for lo, hi in _pool.split(s1 - s0, 4 * threads)]
            need = max(int(lib.cg_wino_input_scratch(pp, lo, hi)) for lo, hi in ranges)
            buf, per_thread = _pool.thread_scratch("native-pack", need, threads)
            _pool.run_native(lib, "cg_wino_input", [(pp, lo, hi, V.ctypes.data)
                                                    for lo, hi in ranges], threads, per_thread)
            del buf
            run(i0, i1 - i0)
    if bad.any():
        native.recompute_lines(kind, inp, w, out, geom, np.flatnonzero(bad))
    del prob
    return out


def _bind_corr(kind: str, inp: np.ndarray, w: np.ndarray, out: np.ndarray,
               geom: ConvGeometry, alloc):
    """:func:`_run_corr` bound (``_bound``), in either regime (16-bit weights read as
    there):
    descriptor, work ranges, scratch sizes and task tables made once; a call patches the
    data, result and scratch addresses (transformed weights U, or each group's
    transformed input V).  None where it would do otherwise."""
    if out.size == 0 or inp.size == 0 or w.size == 0:
        return None
    convert = w.dtype != np.float32 and FLOAT32_WEIGHTS_COPY    # (a float32 copy each call)
    w = _float32_weights(w)
    wstrides = w.strides
    eng = native.engine()
    lib = _lib(eng)
    threads = native._threads(geom.flops)
    m = tile_size(geom, kind)
    plan = corr_plan(geom, kind, eng.vl, eng.mr_of_wino if hasattr(eng, "mr_of_wino") else
                     _mr_of(eng), m, _budgets(), _converted(inp, eng.isa), _buffered(out))
    if not len(plan.items):
        return None
    if native._weights_2d(w).ctypes.data != w.ctypes.data:
        return None                          # (weights copied to flatten their taps)
    lines = out.shape[0] * math.prod(plan.lout[:2])
    bad = np.zeros(lines, np.uint8)
    tiles = plan.regime == "tiles"
    u_floats = plan.u_floats
    U = scratch("winograd-U", (u_floats,), np.float32, zero=False) if tiles else None
    prob = _problem(plan, inp, w, out, U, bad)
    pp = ctypes.addressof(prob)
    thread_scratch, streams, address = (_pool.thread_scratch, native._streams,
                                         _bound.address)

    def items(first, count):
        """The runner of work items [first, first + count) and its scratch floats."""
        ranges = _item_ranges(first, count, threads)
        need = int(lib.cg_wino_scratch(pp, first, first + count))
        per = _pool.scratch_bytes(need)
        return _bound.runner(lib, _bound.task_table(
            lib, "cg_wino_run", [(pp, lo, hi) for lo, hi in ranges]), threads, per), need

    if tiles:
        nblk = int(plan.items[0, 5])
        ub = u_floats // max(1, nblk)
        wt = threads if U.nbytes > 2**20 else 1
        wsplit = _pool.split(nblk, wt)
        wtable = _bound.task_table(lib, "cg_wino_weights",
                                   [(pp, lo, hi, 0) for lo, hi in wsplit])
        woffs = np.array([lo * ub * 4 for lo, _ in wsplit], np.int64)
        weights = _bound.runner(lib, wtable, wt)
        compute, need = items(0, len(plan.items))
        u_at = [None]
    else:
        # per group of tiles: its transformed input V (fields of the problem), the input
        # transform's runner (V's address in its table) and the work items' runner
        steps = []
        for (s0, s1, d0, d1), (i0, i1), vf in zip(plan.groups_of_tiles, plan.group_items,
                                                  plan.v_floats):
            prob.vs0, prob.vs1, prob.vd0, prob.vd1 = s0, s1, d0, d1
            ranges = [(s0 + lo, s0 + hi) for lo, hi in _pool.split(s1 - s0, 4 * threads)]
            ineed = max(int(lib.cg_wino_input_scratch(pp, lo, hi)) for lo, hi in ranges)
            iper = _pool.scratch_bytes(ineed)
            itable = _bound.task_table(lib, "cg_wino_input",
                                       [(pp, lo, hi, 0) for lo, hi in ranges])
            compute, need = items(i0, i1 - i0)
            steps.append(((s0, s1, d0, d1), vf, itable, _bound.runner(lib, itable, threads, iper),
                          ineed, compute, need))

    def run(w, inp):
        out = alloc()
        if convert:
            w = _float32_weights(w)
            if w.strides != wstrides:
                return None                    # (not the memory order bound: full path)
        prob.inp.t.ptr, prob.w, prob.out = address(inp), address(w), address(out)
        prob.stream = streams(out)
        if tiles:
            U = scratch("winograd-U", (u_floats,), np.float32, zero=False)
            at = address(U)
            if at != u_at[0]:
                prob.U, u_at[0] = at, at
                wtable[:, 5] = woffs + at
            weights()
            buf, (base, _) = thread_scratch("native-pack", need, threads)
            compute(base)
            del buf
        else:
            for (s0, s1, d0, d1), vf, itable, transform, ineed, gcompute, gneed in steps:
                V = scratch("winograd-V", (vf,), np.float32, zero=False)
                at = address(V)
                prob.V, prob.vs0, prob.vs1, prob.vd0, prob.vd1 = at, s0, s1, d0, d1
                itable[:, 5] = at
                buf, (base, _) = thread_scratch("native-pack", ineed, threads)
                transform(base)
                del buf
                buf, (base, _) = thread_scratch("native-pack", gneed, threads)
                gcompute(base)
                del buf
        if bad.any():
            native.recompute_lines(kind, inp, w, out, geom, np.flatnonzero(bad))
            bad.fill(0)
        return out
    run.keep = (prob, bad, plan)
    bound = _bound.guarded(run)
    bound.regime = plan.regime                  # (what the tests look at)
    return bound


def bind(op: str):
    """The kernel's ``bind`` for ``op`` (``_bound``): its three ops."""
    if op == "wgrad":
        return lambda x, dy, geom, out_dtype=None, result_layout=None: _bind_wgrad(
            x, dy, geom, result_layout, out_dtype)
    return native.corr_binder(op, _bind_corr) if op in ("fwd", "dgrad") else None


# Weight gradients whose tasks split the input channels convert each line of a
# channels-first dy once per channel block (ResNet-50 res4: 4 blocks of 64, each task
# converting the half of dy its output blocks read): a float32 channels-first dy is then
# transposed once per call into channels-last scratch and read in place (res4 NCX, 2
# threads, 2026-11-26 evening: 6.35 -> 5.49 ms hot, 8.27 -> 7.65 after the pause).
# Where each dy line is converted once anyway (DeepLab's one box, U-Net's 32 channels)
# the copy measured level or worse, and is not made.
DY_ONCE = True


def _dy_once(plan: "WgradPlan", dy_channels_first: bool) -> bool:
    """Whether a weight gradient transposes its float32 channels-first dy once into
    channels-last scratch (``DY_ONCE``): the plan's items would convert each dy line
    at least twice (several channel blocks over the same tiles and output blocks)."""
    if not (DY_ONCE and dy_channels_first) or not len(plan.items):
        return False
    it = plan.items
    same_dy = {tuple(r[:5]) + tuple(r[7:9]) for r in it.tolist()}
    return len(it) >= 2 * len(same_dy)


def _writes_oix(plan: WgradPlan, result_layout) -> bool:
    """Whether a weight gradient stores its result in OIX memory, (O, C/G, *K): for a
    caller who keeps OIX (``result_layout="ncx"``), by fused tasks (each finishes its
    register tiles' rows of every output channel), so that no (*K, C/G, O) result and
    permuted copy are made (``WGRAD_OIX``)."""
    return WGRAD_OIX and result_layout == "ncx" and _fused(plan)


def _bind_wgrad(x: np.ndarray, dy: np.ndarray, geom: ConvGeometry, result_layout=None,
                out_dtype=None):
    """The Winograd weight gradient bound (``_bound``): plan, descriptor and task tables
    made once; a call patches x, dy, the result (every element stored: the finish step
    covers dw with its boxes) and the partial sums' address.  None for an empty one.
    ``result_layout="ncx"``: the result's memory may be OIX (:func:`_writes_oix`), still
    seen as (*K, C/G, O).  ``out_dtype`` float16 / bfloat16: a (*K, C/G, O) result comes
    in it (its float32 values rounded once as the finish step stores them: no float32
    dw, no narrowing pass afterwards), an OIX one in float32, and so is a result
    recomputed by the direct engine (a value not finite)."""
    eng = native.engine()
    lib = _lib(eng)
    G, cg = geom.groups, geom.c // geom.groups
    shape = (*geom.kernel, cg, geom.o)
    if math.prod(shape) == 0 or x.size == 0 or dy.size == 0:
        return None
    threads = native._threads(geom.flops)
    m = tile_size(geom, "wgrad")
    plan = wgrad_plan(geom, eng.vl, m, _wgrad_budgets())
    # (the transposed dy: channels-last float32 strides, its address patched per call)
    dy_once = _dy_once(plan, native._channels_first(dy))
    dy_src = _dummy_source(geom.out_sizes, geom.o, False) if dy_once else _source(dy)
    bad = np.zeros(1, np.int64)         # (set by the finish step: a value not finite)
    oix = _writes_oix(plan, result_layout)
    dtype = np.dtype(np.float32)
    if (not oix and out_dtype is not None and np.dtype(out_dtype) in native.DTYPE_CODES
            and WGRAD_16BIT_RESULT):
        dtype = np.dtype(out_dtype)
    prob = _WinoWgrad(_source(x), dy_src, G, _tile_geom(plan), plan.cpad, plan.nv,
                      plan.items.ctypes.data, bad.ctypes.data, int(oix),
                      native.DTYPE_CODES[dtype])
    pp = ctypes.addressof(prob)
    alloc_shape = (geom.o, cg, *geom.kernel) if oix else shape
    as_xio = native._OIX_AS_XIO[len(shape)] if oix else None
    task_sums = plan.box_floats if plan.parts else _task_sums_floats(lib, pp, plan)
    fused = int(_fused(plan))
    # (first and end item, box, sums' address (patched), their floats, dw (patched), fused)
    table = native._i64([(t[0], t[1], *t[2:], 0, task_sums, 0, fused)
                         for t in plan.tasks]).reshape(len(plan.tasks), -1)
    offs = np.arange(len(plan.tasks), dtype=np.int64) * (4 * plan.box_floats)
    need = max(int(lib.cg_wino_wgrad_scratch(pp, t[0], t[1])) for t in plan.tasks)
    need += 0 if plan.parts else -(-task_sums // 16) * 16
    n = min(threads, len(plan.tasks))
    per = _pool.scratch_bytes(need)
    # the tasks run on the engine's workers (cg_wino_wgrad_task: zero the task's sums,
    # add its items, store its box of dw), taken in order by whichever thread is free;
    # on Python's pool threads they ran 2.3x slower after the benchmark's pause than
    # back to back (ResNet-50 res2, 2 threads; the native workers keep off the
    # caller's CPU, see pool.cpp)
    tasks = _bound.runner(lib, _bound.task_table(
        lib, "cg_wino_wgrad_task", [(pp, table.ctypes.data, k) for k in range(len(plan.tasks))]),
        n, per)
    if plan.parts:
        rows = G * plan.cpad
        fin = native._i64([0, G, 0, plan.cpad, 0, plan.nob, 0, plan.parts, plan.box_floats, 0])
        ft = threads if rows >= 64 else 1
        cuts = _pool.split(rows, 4 * ft) if ft > 1 else [(0, rows)]
        finish = _bound.runner(lib, _bound.task_table(
            lib, "cg_wino_wgrad_finish_rows", [(pp, fin.ctypes.data, lo, hi) for lo, hi in cuts]),
            ft)
    empty, thread_scratch, address = _results.empty, _pool.thread_scratch, _bound.address
    # (a result of this size may be streamed: WgradFinish, finish_tile_oix)
    least = WGRAD_STREAM_MIN_BYTES
    may_stream = WGRAD_STREAM and dtype.itemsize * math.prod(shape) >= least
    streams = _results.streams_runs if oix else _results.streams

    def run(x, dy):
        dw = empty(alloc_shape, dtype)
        at = address(dw)
        prob.stream = may_stream and streams(dw, least)
        dy_read = contiguous(dy) if dy_once else dy
        prob.x.t.ptr, prob.dy.t.ptr = address(x), address(dy_read)
        table[:, 10] = at
        if plan.parts:
            sums = scratch("winograd-sums", (plan.parts, plan.box_floats), np.float32,
                           zero=False)
            table[:, 8] = offs + address(sums)
            fin[6], fin[9] = address(sums), at
        buf, (base, _) = thread_scratch("native-pack", need, n)
        tasks(base)
        del buf, dy_read
        if plan.parts:
            finish()
        if bad[0]:
            # a NaN or Inf mixed into every tap's sums by the transforms: the direct
            # engine gives each tap only the products it has (D17), in float32 (the
            # front-end rounds it to the call's dtype)
            bad[0] = 0
            return native.wgrad(x, dy, geom)
        return dw.transpose(as_xio) if oix else dw
    run.keep = (prob, table, plan, bad) + ((fin,) if plan.parts else ())
    return _bound.guarded(run)


# -- memory -----------------------------------------------------------------------------------

def _dummy_source(sizes, channels: int, packed: bool) -> _Source:
    """A source with channels-last strides and no data: what the scratch functions
    need (float16 stands for any view the kernels convert)."""
    sizes = native._pad3(sizes, 1)
    st = [math.prod(sizes) * channels, sizes[1] * sizes[2] * channels, sizes[2] * channels,
          channels, 1]
    return _Source(native._Tensor(None, 1 if packed else 0, (_I64 * 5)(*st)),
                   (_I64 * 3)(*sizes), channels)


def workspace(geom: ConvGeometry, op: str, packed_in: bool = True,
              buffered_out: bool = True) -> dict[str, int]:
    """An upper bound of the kernels' temporary memory for one call, by part: the
    per-thread scratch (an item's transformed tiles, products, converted input lines
    when ``packed_in``, a buffered output when ``buffered_out``), the shared
    transformed weights or input (fwd, dgrad) or partial sums (wgrad).  Nothing
    proportional to a whole data tensor: shared parts are bounded by the workspace
    budget (``settings.workspace_bytes() / 4``), per-thread parts by constants."""
    eng = native.engine()
    return dict(_workspace(geom, op, packed_in, buffered_out, tile_size(geom, op), eng.isa,
                           native._threads(geom.flops), _budgets(), _wgrad_budgets()))


@functools.lru_cache(maxsize=256)
def _workspace(geom: ConvGeometry, op: str, packed_in: bool, buffered_out: bool, m: int,
               isa: str, threads: int, budgets: tuple, wgrad_budgets: tuple) -> tuple:
    """:func:`workspace` with tiles of m, of a build, thread count and budgets, as (part,
    bytes) pairs (planned once per problem: the chooser asks on every call)."""
    eng = native.engine()
    lib = _lib(eng)
    if op == "wgrad":
        plan = wgrad_plan(geom, eng.vl, m, wgrad_budgets)
        prob = _WinoWgrad(_dummy_source(geom.in_sizes, geom.c, packed_in),
                          _dummy_source(geom.out_sizes, geom.o, packed_in), geom.groups,
                          _tile_geom(plan), plan.cpad, plan.nv, plan.items.ctypes.data)
        pp = ctypes.addressof(prob)
        per = max(int(lib.cg_wino_wgrad_scratch(pp, t[0], t[1])) for t in plan.tasks)
        parts = {"per-thread scratch": threads * 4 * (per + _task_sums_floats(lib, pp, plan))}
        if plan.parts:
            parts["partial sums"] = 4 * plan.parts * plan.box_floats
        return tuple(parts.items())
    # (a packed input may still be read in place -- 16 bits on the AVX-512 / AVX2 builds
    # -- and take the plan of an unconverted one: the larger of the two)
    per = 0
    for converted in sorted({packed_in, False}):
        plan = corr_plan(geom, op, eng.vl, _mr_of(eng), m, budgets, converted, buffered_out)
        out = _dummy_source(plan.lout, plan.cout, False)
        prob = _Wino(_dummy_source(plan.lin, plan.cin, packed_in), None, out.t.stride,
                     1 if buffered_out else 0, (_I64 * 3)(*plan.lout), plan.cout, plan.groups,
                     _tile_geom(plan), 1 if plan.regime == "tiles" else None, None, 0, 0, 0, 0,
                     0, 0, plan.cpad, plan.nv, None if plan.regime == "tiles" else 1, 0, 0, 0,
                     0, plan.items.ctypes.data, None, 0, plan.kc)
        pp = ctypes.addressof(prob)
        per = max(per, int(lib.cg_wino_scratch(pp, 0, len(plan.items))))
    lout_n = geom.n * math.prod(plan.lout[:2])
    parts = {"bad-line flags": lout_n}
    if plan.regime == "tiles":
        parts["transformed weights"] = 4 * plan.u_floats
    else:
        for s0, s1, d0, d1 in plan.groups_of_tiles:
            prob.vs0, prob.vs1, prob.vd0, prob.vd1 = s0, s1, d0, d1
            per = max(per, int(lib.cg_wino_input_scratch(pp, s0, s1)))
        parts["transformed input"] = 4 * max(plan.v_floats)
    parts["per-thread scratch"] = threads * 4 * per
    return tuple(parts.items())


def memory(call) -> dict[str, int]:
    """The registry's memory estimate (kernels.Call): no input copies (inputs are read
    in place or converted a block of lines at a time) but a float32 channels-first dy
    that a weight gradient transposes once (:func:`_dy_once`), the float32 result when
    the caller keeps another, and :func:`workspace`."""
    from . import ROLES
    f32 = np.dtype(np.float32)
    parts = {}
    if call.op == "wgrad":
        layout = "nxc"
        ins = (call.a, call.b)
    else:
        data = call.a if call.op == "fwd" else call.b
        layout = "nxc" if "nxc" in data.layouts or "ncx" not in data.layouts else "ncx"
        ins = (data,)
    direct = call.op != "wgrad" and call.direct_result and call.out.dtype in native.DTYPE_CODES
    if call.op == "wgrad" and call.out.layouts == frozenset({"ncx"}):
        eng = native.engine()
        plan = wgrad_plan(call.geom, eng.vl, tile_size(call.geom, "wgrad"), _wgrad_budgets())
        if _writes_oix(plan, "ncx"):
            layout = "ncx"                  # (the result in the caller's OIX memory)
    if (call.out.dtype != f32 and not direct) or layout not in call.out.layouts:
        parts[f"{ROLES[call.op][2]} before the caller's copy"] = call.out.size * 4
    packed = any(t.dtype != f32 or "nxc" not in t.layouts for t in ins)
    if call.op == "wgrad" and call.b.dtype == f32 and "nxc" not in call.b.layouts:
        eng = native.engine()
        plan = wgrad_plan(call.geom, eng.vl, tile_size(call.geom, "wgrad"), _wgrad_budgets())
        if _dy_once(plan, True):
            parts["dy transposed to channels last"] = call.b.size * 4
    buffered = call.op != "wgrad" and (layout != "nxc" or (direct and call.out.dtype != f32))
    weights = call.a if call.op == "dgrad" else call.b
    if call.op != "wgrad" and weights.dtype != f32 and FLOAT32_WEIGHTS_COPY:
        parts["float32 weights"] = weights.size * 4         # _float32_weights
    parts.update(workspace(call.geom, call.op, packed, buffered))
    return parts


def _mr_of(eng) -> tuple:
    lib = _lib(eng)
    eng.mr_of_wino = tuple(int(lib.cg_wino_mr(nv)) for nv in (1, 2, 3, 4))
    return eng.mr_of_wino


def fwd(x: np.ndarray, w: np.ndarray, geom: ConvGeometry, out_dtype=None) -> np.ndarray:
    """Forward convolution: x (N, *L, C), w (*K, C/G, O) -> y (N, *M, O)."""
    y = native._alloc_like(x, geom.n, geom.out_sizes, geom.o, out_dtype or np.float32)
    return _run_corr("fwd", x, w, y, geom)


def dgrad(w: np.ndarray, dy: np.ndarray, geom: ConvGeometry, out_dtype=None) -> np.ndarray:
    """Data gradient: w (*K, C/G, O), dy (N, *M, O) -> dx (N, *L, C)."""
    dx = native._alloc_like(dy, geom.n, geom.in_sizes, geom.c, out_dtype or np.float32)
    return _run_corr("dgrad", dy, w, dx, geom)


# -- weight gradient ------------------------------------------------------------------------

# An item's transformed x and dy tiles: about this much.
WGRAD_ITEM_BYTES = 1 * 2**20
# ... except where a set of partial sums outgrows half a core's L2: every item then
# reads and writes all of it (L3) to add its tiles' products, so items take about
# WGRAD_LARGE_SUMS_ITEMS times its bytes of transformed tiles (at most an eighth of the
# workspace).  DeepLab d6 (4.2 MB of sums, 30 -> 162 tiles an item), Sapphire Rapids
# (2 MiB L2), 2 threads, after the benchmark's pause, alternating: NXC 1.19-1.21x
# (13.2-13.5 ms), NCX 1.34x; 4 times the sums' bytes 0.95x (too few items for the two
# parts).  Not for sums that fit (items of 4 MiB: res2 0.51x, res4 0.81x, U-Net 0.68x,
# TCN 0.90x).
WGRAD_LARGE_SUMS_ITEMS = 2
# ... and where boxed sums (below) outgrow half a core's L2, items of this much: each
# of an item's GEMM tiles adds its products into a box's sums (read and written from
# L3 then) once per item, so a longer reduction per item (more tiles) moves fewer bytes
# per product; the item's transformed tiles, streamed point by point, may leave the L2.
# Zen 5 (1 MiB L2), 2 threads, in-process A/B against 1 MiB items (2026-11-27):
# DeepLab d6 (1.56 MiB boxes, 36 -> 72 tiles an item) after the pause 10.71 -> 9.48 ms,
# hot 7.12 -> 6.48; ResNet-50 res4 (1.1 MiB boxes) 3.60 -> 3.42 / 2.42 -> 2.30; items
# of 4 MiB no better than 2 (DeepLab 0.98x after the pause, 1.06x hot).
WGRAD_BOXED_ITEM_BYTES = 2 * 2**20
# Output planes (3-D) per item.
WGRAD_ITEM_PLANES = 4
# Chunks of tiles with partial sums of the products (when they fit PARTIALS_BYTES);
# otherwise the sums are cut into boxes of channels, each summing every tile.  Two
# (one per thread of the 2-core machines this is tuned on), not 8: zeroing, filling and
# reducing 8 sets of sums (res2: 8 x 0.6 MB) cost more than the balance they bought
# (2026-11-26, AVX-512, alternating in one process: res2 NXC 5.5 -> 4.4 ms hot, 18.2 ->
# 14.4 ms after the 0.15 s pause; U-Net 1.06x / 1.08x, TCN 1.07x / 1.03x).  A fixed
# count, never the thread count, so results stay the same for any thread count (D19).
WGRAD_PARTS = 2
PARTIALS_BYTES = 8 * 2**20
# A box's sums at most (per-thread scratch).
WGRAD_BOX_BYTES = 2 * 2**20


@dataclass(frozen=True)
class WgradPlan:
    axes: int
    m: int
    dil: tuple
    off: tuple
    kd: int
    tiles_h: np.ndarray
    tiles_w: np.ndarray
    nv: int
    cpad: int
    nob: int
    items: np.ndarray     # per item: s0, s1, d0, d1, g, c0, c1, ob0, ob1
    tasks: tuple          # per task: first and end item, box (g0, ng, c0, nc, ob0, nob)
    parts: int            # > 0: tasks are chunks of tiles with partial sums of one box
    box_floats: int       # the products' sums of a task

    @property
    def fused(self) -> bool:
        """Whether every task is one item (all the tiles of its box): its sums are then
        finished into dw a register tile at a time as they are made, never kept for the
        whole box (``cg_wino_wgrad_task``)."""
        return not self.parts and all(t[1] - t[0] == 1 for t in self.tasks)


# Fused tasks where the plan allows (WgradPlan.fused; False keeps the box's sums, for A/B).
WGRAD_FUSED = True
# Fused tasks store an OIX caller's result in OIX memory (_writes_oix; False: a
# (*K, C/G, O) result and the caller's permuted copy, for A/B).
WGRAD_OIX = True
# A float16 / bfloat16 caller's (*K, C/G, O) result stored in its dtype by the finish step
# (2026-11-27; False: float32, rounded by the front-end afterwards, for A/B).
WGRAD_16BIT_RESULT = True
# A large result written with streaming stores by the finish step (2026-11-27; False:
# plain stores, for A/B).
WGRAD_STREAM = True
WGRAD_STREAM_MIN_BYTES = 2 * 2**20


def _fused(plan: WgradPlan) -> bool:
    """Whether the plan's tasks run fused (``WGRAD_FUSED`` and ``WgradPlan.fused``)."""
    return WGRAD_FUSED and plan.fused


def _task_sums_floats(lib, pp: int, plan: WgradPlan) -> int:
    """The sums a task keeps in its thread's scratch: none with partial sums (shared),
    one register tile's when fused, else its box's."""
    if plan.parts:
        return 0
    if _fused(plan):
        return min(plan.box_floats, int(lib.cg_wino_wgrad_fused_floats(pp)))
    return plan.box_floats


def _boxes(G: int, cpad: int, nob: int, nb: int, na: int, kd: int, vl: int, x_bytes: int,
           dy_bytes: int, limit: int) -> list:
    """Boxes (g, c0, nc, ob0, nob) of the sums, each within ``limit`` bytes, with the
    fewest repeated transforms: x is transformed once per range of output blocks, dy
    once per range of input channels."""
    best = None
    for nc in sorted({max(vl, cpad // k // vl * vl) for k in (1, 2, 4, 8, 16, 32, 64)}):
        for nobr in sorted({max(1, nob // k) for k in (1, 2, 4, 8, 16, 32, 64)}):
            if na * kd * nc * nobr * nb * 4 > limit:
                continue
            cr, orr = -(-cpad // nc), -(-nob // nobr)
            cost = (orr * x_bytes + cr * dy_bytes, -(cr * orr))
            if best is None or cost < best[0]:
                best = (cost, nc, nobr)
    _, nc, nobr = best or (None, vl, 1)
    return [(g, c0, min(nc, cpad - c0), ob0, min(nobr, nob - ob0))
            for g in range(G) for c0 in range(0, cpad, nc) for ob0 in range(0, nob, nobr)]


@functools.lru_cache(maxsize=256)
def wgrad_plan(geom: ConvGeometry, vl: int, m: int, budgets: tuple) -> WgradPlan:
    """The work decomposition of a Winograd weight gradient (pure, cached).  Results do
    not depend on the thread count: every sum runs over the same blocks of tiles in the
    same order, whichever thread runs it."""
    item_bytes, item_planes, nparts, partials, box_bytes, half_l2, large_item_max = budgets
    ax = axes(geom)
    pad3 = native._pad3
    lin, lout = pad3(geom.in_sizes, 1), pad3(geom.out_sizes, 1)
    dil = pad3(geom.dilations, 1)
    off = tuple(-p for p in pad3(geom.pads_begin, 0))
    G, cg, og = geom.groups, geom.c // geom.groups, geom.o // geom.groups
    kd = geom.kernel[0] if geom.spatial_rank == 3 else 1
    na = (m + 2) ** ax
    nv = native._nv_for(og, vl)
    nb = nv * vl
    cpad, nob = -(-cg // vl) * vl, -(-og // nb)
    th = _tiles(lout[1], dil[1], m) if ax == 2 else np.asarray([[0, 1]], np.int64)
    tw = _tiles(lout[2], dil[2], m)
    per_plane, depth = geom.n * len(th) * len(tw), lout[0]
    all_floats = G * na * kd * cpad * nob * nb
    # parts: every (group, channel, block) in one box, tiles in chunks
    parts_mode = 2 * all_floats * 4 <= partials and G * cpad * nob * nb * na * kd * 4 <= partials
    if parts_mode:
        boxes = [(g, 0, cpad, 0, nob) for g in range(G)]
        if all_floats * 4 > half_l2:
            item_bytes = max(item_bytes, min(large_item_max,
                                             WGRAD_LARGE_SUMS_ITEMS * all_floats * 4))
    else:
        x_bytes = geom.n * math.prod(lin) * cg * 4
        dy_bytes = geom.n * math.prod(lout) * og * 4
        boxes = _boxes(G, cpad, nob, nb, na, kd, vl, x_bytes, dy_bytes, box_bytes)
        box_floats = max(na * kd * b[2] * b[4] * nb for b in boxes)
        if box_floats * 4 > half_l2:
            item_bytes = max(item_bytes, min(large_item_max, WGRAD_BOXED_ITEM_BYTES))
    nd = min(depth, item_planes)
    # tiles per item, for the widest box
    cw, nobr = max(b[2] for b in boxes), max(b[4] for b in boxes)
    per_tile = 4 * na * ((nd + kd - 1) * cw + nd * nobr * nb)
    t = int(max(8, min(per_plane, item_bytes // per_tile)))
    blocks = [(s0, s1, d0, min(depth, d0 + nd)) for d0 in range(0, depth, nd)
              for s0, s1 in _tile_blocks(per_plane, len(th) * len(tw), t,
                                         len(tw) if WGRAD_ROW_ITEMS else 0)]
    items, tasks = [], []
    if parts_mode:
        # chunks of position blocks, every group in each
        k = max(1, min(nparts, partials // (all_floats * 4), len(blocks)))
        for lo, hi in _pool.split(len(blocks), k):
            first = len(items)
            items += [(*blk, g, 0, cg, 0, nob) for blk in blocks[lo:hi] for g in range(G)]
            tasks.append((first, len(items), 0, G, 0, cpad, 0, nob))
        parts, box_floats = len(tasks), all_floats
    else:
        for g, c0, nc, ob0, nobr_ in boxes:
            first = len(items)
            items += [(*blk, g, c0, min(cg, c0 + nc), ob0, ob0 + nobr_) for blk in blocks
                      if c0 < cg]
            if len(items) > first:
                tasks.append((first, len(items), g, 1, c0, nc, ob0, nobr_))
        parts = 0
    plan = WgradPlan(ax, m, dil, off, kd, th.reshape(-1).copy(), tw.reshape(-1).copy(), nv,
                     cpad, nob, native._i64(items).reshape(-1, 9), tuple(tasks), parts,
                     box_floats)
    for a in (plan.tiles_h, plan.tiles_w, plan.items):
        a.setflags(write=False)
    return plan


def _wgrad_budgets() -> tuple:
    w = settings.workspace_bytes()
    return (WGRAD_ITEM_BYTES, WGRAD_ITEM_PLANES, WGRAD_PARTS, min(PARTIALS_BYTES, w // 4),
            min(WGRAD_BOX_BYTES, max(2**16, w // 16)), native.l2_bytes() // 2, w // 8)


def wgrad(x: np.ndarray, dy: np.ndarray, geom: ConvGeometry, out_dtype=None,
          result_layout=None) -> np.ndarray:
    """Weight gradient: x (N, *L, C), dy (N, *M, O) -> dw (*K, C/G, O), float32 or
    ``out_dtype`` (see :func:`_bind_wgrad`; in OIX memory where :func:`_writes_oix`):
    one call of its bound form."""
    bound = _bind_wgrad(x, dy, geom, result_layout, out_dtype)
    if bound is None:
        return _results.zeros((*geom.kernel, geom.c // geom.groups, geom.o), np.float32)
    return bound(x, dy)
