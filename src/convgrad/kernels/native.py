"""The native engine: register-blocked direct convolution compiled from C++.

``native/engine.cpp`` is built three times by ``pip install`` (``setup.py``):
for AVX-512, for AVX2 + FMA + F16C, and for the compiler's baseline (portable)
-- ``convgrad.kernels._engine_{avx512,avx2,generic}``.  At run time the best
build this CPU can run is used (``convgrad.config(isa=...)`` forces one, for
tests and comparisons); the libraries are loaded with ctypes, which releases
the GIL during every call, and this module's worker threads run ranges of
work items side by side (``config(threads=n)``).

Every problem maps onto two compiled kernels (see docs/kernels.md):

- ``corr`` for the forward convolution and, one stride phase at a time, the
  data gradient;
- ``wgrad`` for the weight gradient.

The kernels read the caller's views as they are -- float32, float16 or
bfloat16, channels last or first -- and convert blocks of lines into per-thread
scratch only when a view is not float32 with unit channel stride: no
whole-tensor layout or dtype copy is made.  A forward or data gradient result is
laid out in the memory order of its data input (an NCX caller gets NCX memory,
seen here as an NXC view), so no layout copy is needed on the way back either,
and comes back in float32 or, when asked, in the call's float16/bfloat16 dtype
(rounded once, as it is stored); weight gradients are float32.

If no build can be loaded, :func:`available` says why and the registry falls
back to the NumPy/numba kernels (with one warning at import).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.util
import math
import os
import warnings
from dataclasses import dataclass

import numpy as np

from .. import settings
from ..errors import ConvGradError
from ..geometry import ConvGeometry
from . import _bound, _pool, _results
from ._blas import cpu_count, scratch

ISAS = ("avx512", "avx2", "generic")
MODULES = {isa: f"convgrad.kernels._engine_{isa}" for isa in ISAS}

# cg_cpu_features() bits
_AVX2, _FMA, _F16C, _AVX512F, _AVX512BW, _AVX512VL, _AVX512DQ = (1 << i for i in range(7))
REQUIRES = {"avx512": (_AVX512F | _AVX512BW | _AVX512VL | _AVX512DQ | _AVX2 | _FMA | _F16C,
                       "avx512f, avx512bw, avx512vl, avx512dq"),
            "avx2": (_AVX2 | _FMA | _F16C, "avx2, fma, f16c"),
            "generic": (0, "")}

DTYPE_CODES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}
try:
    import ml_dtypes
    DTYPE_CODES[np.dtype(ml_dtypes.bfloat16)] = 2
except ImportError:                                       # pragma: no cover
    pass

# Below this many FLOPs one thread is faster than waking the others.
SERIAL_FLOPS = 2**21
# corr: per-thread scratch for an item's converted input lines; the input rows
# an item reads (kept in cache while the item's weight blocks sweep them); the
# weight panels an item sweeps at once (kept in L2).
PACK_BYTES = 1 * 2**20
CORR_ITEM_BYTES = 512 * 2**10
CORR_OUT_BYTES = 1 * 2**20
CORR_WEIGHT_BYTES = 256 * 2**10
CORR_L1_WEIGHT_BYTES = 0        # (measured no gain yet; see docs/kernels.md)
# buffered data gradients compute all w phases of a line in one item, and all (h, w)
# phases where the h phases have as many rows each (corr_plan)
MERGE_W_PHASES = True
MERGE_H_PHASES = True
# channels-first weight gradients of one group take cg_cfw_run (_cf_wgrad), float16 /
# bfloat16 ones too (CF_WGRAD_16BIT, 2026-11-27), and channels-last ones with fewer input
# channels than its tile has rows (CF_WGRAD_FEW_CHANNELS, 2026-11-27: ResNet's conv1);
# its dy panel: at most this many floats
CF_WGRAD = True
CF_WGRAD_16BIT = True
CF_WGRAD_FEW_CHANNELS = True
CFW_PANEL_FLOATS = 32 << 10
# float32 pointwise weight gradients take cg_pw_run (_pointwise_wgrad), cut into at
# least this many position ranges
POINTWISE_KERNEL = True
POINTWISE_PARTS = 8
# ... and float16/bfloat16 ones too, each chunk's rows widened into scratch first
# (2026-11-26 evening; they had taken the per-sample correlation: see docs/kernels.md)
POINTWISE_16BIT = True
# channels-first pointwise problems a sample per task on the engine's workers
PW_SAMPLE_TASKS = True
# ... bound (_bind_transposed_pointwise: 2026-11-27; False for A/B)
BIND_PW = True
# wgrad: the packed panels of one chunk of positions (x rows, dy rows; swept in
# L2-sized blocks) take about this much; a chunk has at least / at most this
# many positions.
WGRAD_PANEL_BYTES = 1 * 2**20
WGRAD_MIN_CHUNK = 32
WGRAD_MAX_CHUNK = 512
# wgrad: output lines at least this long have their x rows read in place (lines
# shorter than a chunk gathered several of one (n, d) per chunk, longer ones cut into
# chunks along w); shorter ones are gathered into chunks with x packed per tap.
# Measured (2 threads): DCGAN's 16-position lines 1.10-1.13x faster in place,
# ResNet-50 res4's 14 level or 1.05x, res5's 7 1.06-1.13x slower.
WGRAD_LINE_MIN = 12
# wgrad: read float32 channels-last x rows in place (False: pack them too; tests)
WGRAD_DIRECT_X = True
# 1x1 stride-1 problems with at least this many samples run as 1-D ones (one line a sample)
POINTWISE_MIN_SAMPLES = 4
# ... forward and data gradients only where their lines are shorter than this (one
# register tile): the work items of a call are ranges of lines, and one line a sample
# left 8 items for ResNet-50 res2's 1x1 data gradient, the caller waiting on a
# worker that woke late after the benchmark's pause (its 448 lines of 56: 1.16x
# faster after the pause, level hot; 28, 14 and 7-pixel lines 1.04-1.07x / level)
CORR_FLAT_BELOW = 6
# wgrad: positions are cut into this many chunks with partial weight gradients
# if they take at most PARTIALS_BYTES, else the output channels are split.
WGRAD_CHUNKS = 8
# ... each holding the same number of work items (wgrad_plan)
WGRAD_EVEN_CHUNKS = True
PARTIALS_BYTES = 8 * 2**20
# partial gradients are summed (_sum_parts) in ranges of whole blocks of this many floats
SUM_BLOCK = 4096
# ... or, stored as an OIX result (cg_sum_parts_oix), in ranges of channels whose rows of
# every tap take at most this many bytes of a thread's buffer
SUM_OIX_BYTES = 256 << 10
# the channels-first weight gradient writes an OIX caller's result itself (_cf_oix)
CF_WGRAD_OIX = True
# wgrad split by outputs (channels-last float32): a grid of tap rows x output-block
# ranges, at least this many tasks a thread (_wgrad_grid).  The tap-only split gave
# ResNet-50 res4 4 tasks of 2-3 taps: 12% of a hot call lost to the uneven last task,
# and a worker woken 2-3 ms late after the benchmark's pause left the caller alone with
# a 3-tap task.  Grid of 12 (2 threads): level hot, after the pause res4 1.04x, DCGAN
# 1.18x, res5 1.02x, DeepLab 0.99x (alternating, 2026-11-26).
WGRAD_GRID_TASKS = True
WGRAD_TASKS_PER_THREAD = 4
# wgrad split by outputs, one group, for a caller who keeps an OIX result: each task
# sums every tap of a range of output blocks in scratch (at most this many bytes) and
# writes it into the OIX result itself (_oix_tasks); otherwise the (*K, C, O) result
# is permuted afterwards (layouts.contiguous).  ResNet-50 res5 NCX, 2 threads,
# separate processes: 1.25-1.29x after the benchmark's pause with parts of 1.13 MiB
# (8 tasks), but 16 tasks of 0.56 MiB (each re-packing x) were 1.05-1.13x after the
# pause and 0.82-0.89x hot: so the tasks are as many as the grid's (the fewest equal
# ranges of at least WGRAD_TASKS_PER_THREAD a thread), and a part takes at most this
# and at most 5/8 of a core's L2 (l2_bytes: 2 MiB on a Sapphire Rapids, 1 MiB on a Zen 4
# or Zen 5, where res5 keeps the permuted copy: its 16 tasks of one block, 0.56 MiB
# parts, measured 0.88x after the pause on a Zen 5, separate processes, 2026-11-27).
WGRAD_OIX = True
WGRAD_OIX_PART_BYTES = 5 * 2**18
WGRAD_OIX_PART_L2 = 5 / 8
# wgrad split by outputs, one group, a (*K, C, O) result of at least WGRAD_STREAM_MIN_BYTES:
# each task sums its part in scratch too (within the same limits as the OIX parts) and
# streams its whole dw rows into the result (streaming stores where a row is whole cache
# lines), instead of adding into the result's rows in place (_stream_part).  After the
# benchmark's pause the result's lines no longer had to be read before they were written:
# ResNet-50 res5 NXC 7.15-7.21 -> 5.91-5.98 ms (1.21x; hot 1.03x), DCGAN NXC 1.07x (hot
# 1.08x: the tiles' sums in a compact part), NCX 1.02x; res3 stride 2 (0.6 MB) level or
# 0.97-0.99x, so not below 1 MiB (2 threads, separate processes, 2026-11-27).  A streamed
# part may take 3/4 of a core's L2 (its sums are all it keeps there): on a Zen 5 (1 MiB
# L2) res5's 768 KiB parts, against the unstreamed kernel, after the pause, 6 rounds of
# separate processes: NXC float32 7.30 -> 6.79 ms, bfloat16 7.68 -> 6.67 (2026-11-27).
WGRAD_STREAM = True
WGRAD_STREAM_MIN_BYTES = 2**20
WGRAD_STREAM_PART_L2 = 3 / 4


class _Tensor(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("dtype", ctypes.c_int64),
                ("stride", ctypes.c_int64 * 5)]


_I64 = ctypes.c_int64
_I64P = ctypes.POINTER(ctypes.c_int64)
_F32P = ctypes.c_void_p


class _Corr(ctypes.Structure):
    _fields_ = [("inp", _Tensor), ("out", ctypes.c_void_p), ("ostride", _I64 * 5),
                ("out_dtype", _I64),
                ("N", _I64), ("Lin", _I64 * 3), ("Cin", _I64), ("Cout", _I64),
                ("groups", _I64), ("is_", _I64 * 3), ("os", _I64 * 3),
                ("phases", ctypes.c_void_p), ("taps", ctypes.c_void_p),
                ("wpk", ctypes.c_void_p), ("wg", _I64), ("wob", _I64), ("wt", _I64),
                ("wc", _I64), ("ntap_w", _I64), ("nv", _I64), ("r", _I64),
                ("ob_group", _I64), ("items", ctypes.c_void_p), ("stream", _I64),
                ("wphases", _I64), ("hphases", _I64)]


class _Pw(ctypes.Structure):
    _fields_ = [("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("an", _I64), ("ac", _I64),
                ("bn", _I64), ("bc", _I64), ("A", _I64), ("B", _I64), ("bpad", _I64),
                ("tasks", ctypes.c_void_p), ("dtype", _I64)]


class _Cfw(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("dy", ctypes.c_void_p), ("xs", _I64 * 4),
                ("ys", _I64 * 4), ("N", _I64), ("C", _I64), ("O", _I64), ("L", _I64 * 3),
                ("M", _I64 * 3), ("K", _I64 * 3), ("s", _I64 * 3), ("d", _I64 * 3),
                ("pb", _I64 * 3), ("nv", _I64), ("lines", _I64), ("tasks", ctypes.c_void_p),
                ("dtype", _I64), ("xw", _I64), ("yw", _I64)]


class _Wgrad(ctypes.Structure):
    _fields_ = [("x", _Tensor), ("dy", _Tensor), ("N", _I64), ("L", _I64 * 3), ("C", _I64),
                ("M", _I64 * 3), ("O", _I64), ("groups", _I64), ("K", _I64 * 3),
                ("s", _I64 * 3), ("d", _I64 * 3), ("pb", _I64 * 3), ("nv", _I64),
                ("chunk", _I64), ("line_min", _I64), ("direct_x", _I64),
                ("items", ctypes.c_void_p), ("oix", _I64), ("part", _I64),
                ("out_dtype", _I64)]


class _StreamFma(ctypes.Structure):
    _fields_ = [("src", ctypes.c_void_p), ("dst", ctypes.c_void_p), ("rlines", _I64),
                ("wlines", _I64), ("rounds", _I64), ("tasks", _I64), ("sums", ctypes.c_void_p)]


class _PartsSum(ctypes.Structure):
    _fields_ = [("parts", ctypes.c_void_p), ("n", _I64), ("stride", _I64),
                ("out", ctypes.c_void_p)]


class _PartsSumOix(ctypes.Structure):
    _fields_ = [("sum", _PartsSum), ("T", _I64), ("C", _I64), ("O", _I64)]


# The engine's source files (native/*.cpp), each reporting the build it was compiled for.
UNITS = ("engine", "grouped", "winograd", "pool", "cfwgrad")


def check_units(lib, built: str, path: str) -> None:
    """ImportError unless every source file of a loaded library was compiled for its
    build (``cg_isa_<unit>``, see simd.h: CG_ISA_OF)."""
    for unit in UNITS:
        fn = getattr(lib, f"cg_isa_{unit}", None)
        if fn is None:
            raise ImportError(f"{path} has no {unit} code (cg_isa_{unit}): a partial build")
        fn.restype, fn.argtypes = ctypes.c_char_p, []
        got = fn().decode()
        if got != built:
            raise ImportError(f"{path} is the {built!r} build but its {unit} code was "
                              f"compiled for {got!r}: a mixed build")


class Engine:
    """One loaded build of the engine."""

    def __init__(self, isa: str, path: str, built_as: str | None = None):
        lib = ctypes.CDLL(path)
        self.isa, self.path, self.lib = isa, path, lib
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        for name, res, args in (
                ("cg_isa", ctypes.c_char_p, []),
                ("cg_vector_floats", i64, []),
                ("cg_cpu_features", i64, []),
                ("cg_corr_rmax", i64, [i64]),
                ("cg_wgrad_mr", i64, [i64]),
                ("cg_corr_scratch", i64, [vp, i64, i64]),
                ("cg_corr_run", None, [vp, i64, i64, vp]),
                ("cg_corr_run_shared", None, [vp, vp, i64, vp]),
                ("cg_wgrad_scratch", i64, [vp, i64, i64]),
                ("cg_wgrad_run", None, [vp, i64, i64, i64, i64, i64, i64, vp, vp]),
                ("cg_wgrad_run_shared", None, [vp, vp, i64, vp, vp]),
                ("cg_sum_parts", None, [vp, i64, i64]),
                ("cg_sum_parts_oix", None, [vp, i64, i64]),
                ("cg_permute_task", None, [vp, i64, i64]),
                ("cg_pack_panels_task", None, [vp, i64, i64]),
                ("cg_pw_sample_task", None, [vp, i64, vp]),
                ("cg_pw_nb", i64, []),
                ("cg_cfw_scratch", i64, [vp]),
                ("cg_pw_chunk", i64, [vp]),
                ("cg_pw_scratch", i64, [vp]),
                ("cg_fma_loop", ctypes.c_float, [i64]),
                ("cg_store_floats", None, [vp, i64, vp, i64]),
                ("cg_load_floats", None, [vp, vp, i64, i64]),
                ("cg_store_vectors", None, [vp, i64, vp, i64]),
                ("cg_load_vectors", None, [vp, vp, i64, i64]),
                ("cg_fma_loop_flops", i64, []),
                ("cg_fma_task", None, [i64]),
                ("cg_run_tasks", None, [vp, i64, i64, vp, i64]),
                ("cg_pool_workers", i64, []),
                ("cg_pool_wake", None, [i64]),
                ("cg_pool_worker_tid", i64, [i64]),
                ("cg_pool_kept_off_cpu", i64, [])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        built = lib.cg_isa().decode()
        if built != (built_as or isa):
            raise ImportError(f"{path} is the {built!r} build, not {isa!r}")
        check_units(lib, built, path)
        self.vl = int(lib.cg_vector_floats())
        self.corr_rmax = {nv: int(lib.cg_corr_rmax(nv)) for nv in (1, 2, 3, 4)}
        self.rmax_of = tuple(self.corr_rmax[nv] for nv in (1, 2, 3, 4))
        self.wgrad_mr = {nv: int(lib.cg_wgrad_mr(nv)) for nv in (1, 2, 3, 4)}
        self.mr_of = tuple(self.wgrad_mr[nv] for nv in (1, 2, 3, 4))


# -- loading -------------------------------------------------------------------------------

_ENGINES: dict[str, Engine] = {}
_MISSING: dict[str, str] = {}
_FEATURES: int | None = None
_LOADED = False


def _library_path(isa: str) -> str:
    spec = importlib.util.find_spec(MODULES[isa])
    if spec is None or not spec.origin:
        raise ImportError(f"{MODULES[isa]} is not built (reinstall convgrad with a C++ compiler)")
    return spec.origin


def _load() -> None:
    """Load every build this CPU can run (once)."""
    global _LOADED, _FEATURES
    if _LOADED:
        return
    _LOADED = True
    if os.environ.get("CONVGRAD_NATIVE", "").lower() in ("0", "off", "no", "false"):
        for isa in ISAS:
            _MISSING[isa] = "disabled by CONVGRAD_NATIVE=0"
        return
    # the portable build first: it reports the CPU's features; a build for an
    # instruction set the CPU lacks is never loaded (its code could not run)
    for isa in reversed(ISAS):
        need, names = REQUIRES[isa]
        if need and _FEATURES is None:
            _FEATURES = _features_from_proc()
        if _FEATURES is not None and (_FEATURES & need) != need:
            _MISSING[isa] = f"this CPU lacks {names}"
            continue
        try:
            eng = Engine(isa, _library_path(isa))
        except (ImportError, OSError, AttributeError) as exc:
            _MISSING[isa] = str(exc)
            continue
        _ENGINES[isa] = eng
        if _FEATURES is None:
            _FEATURES = int(eng.lib.cg_cpu_features())
    if _FEATURES is None:
        _FEATURES = _features_from_proc()


def _features_from_proc() -> int:
    """The CPU features from /proc/cpuinfo, when no build reports them."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh
                          if line.startswith("flags")), [])
    except OSError:
        return 0
    names = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq")
    return sum(1 << i for i, n in enumerate(names) if n in flags)


# A core's L2 when the system does not say (sysfs): 1 MiB (Zen 4; Sapphire Rapids has 2,
# Zen 3 512 KiB).
L2_DEFAULT_BYTES = 1 << 20


@functools.lru_cache(maxsize=None)
def l2_bytes() -> int:
    """The size of a core's L2 cache (Linux sysfs, cpu0), or L2_DEFAULT_BYTES."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            path = os.path.join(base, entry)
            with open(os.path.join(path, "level")) as fh:
                if fh.read().strip() != "2":
                    continue
            with open(os.path.join(path, "size")) as fh:
                text = fh.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
            value = int(text.rstrip("KM")) * scale
            if value > 0:
                return value
    except (OSError, ValueError):
        pass
    return L2_DEFAULT_BYTES


def available() -> str | None:
    """None when at least one build is loaded, else why none is."""
    _load()
    if _ENGINES:
        return None
    return "; ".join(f"{isa}: {why}" for isa, why in _MISSING.items())


def info() -> dict:
    """Which builds are loaded, which one runs by default, and why others are not."""
    _load()
    best = next((isa for isa in ISAS if isa in _ENGINES), None)
    return {"default": best, "loaded": [isa for isa in ISAS if isa in _ENGINES],
            "unavailable": dict(_MISSING),
            "cpu_features": [n for i, n in enumerate(
                ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"))
                if (_FEATURES or 0) >> i & 1]}


def warn_if_unavailable() -> None:
    """One warning when the engine cannot run on a CPU that should run it."""
    why = available()
    if why is not None and "CONVGRAD_NATIVE=0" not in why:
        warnings.warn(f"convgrad: the native engine could not be loaded ({why}); using the "
                      f"slower NumPy/numba kernels", RuntimeWarning, stacklevel=3)


def engine() -> Engine:
    """The build selected by ``convgrad.config(isa=...)`` (default: the best one)."""
    _load()
    want = settings.isa()
    if want == "auto":
        for isa in ISAS:
            if isa in _ENGINES:
                return _ENGINES[isa]
        raise ConvGradError(f"the native engine is not available: {available()}")
    if want not in _ENGINES:
        raise ConvGradError(f"isa = {want!r}: that build of the native engine cannot run here "
                            f"({_MISSING.get(want, 'unknown')})")
    return _ENGINES[want]


# -- the registry's interface -------------------------------------------------------------

def fma_peak(threads: int | None = None, seconds: float = 0.2, repeat: int = 5) -> dict:
    """The FMA peak of this machine as the engine's build sees it: every thread
    runs a loop of independent vector multiply-adds at once; the median GFLOP/s of
    ``repeat`` runs of about ``seconds`` each."""
    import statistics
    import time
    eng = engine()
    threads = threads or settings.threads() or cpu_count()
    per_iter = int(eng.lib.cg_fma_loop_flops())
    iters = 1 << 16
    t0 = time.perf_counter()
    eng.lib.cg_fma_loop(iters)
    iters = max(iters, int(iters * seconds / max(time.perf_counter() - t0, 1e-6)))
    rates = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        _pool.run_tasks([lambda: eng.lib.cg_fma_loop(iters)] * threads, threads)
        rates.append(threads * iters * per_iter / (time.perf_counter() - t0) / 1e9)
    return {"gflops": statistics.median(rates), "threads": threads, "isa": eng.isa,
            "runs": rates}


def fma_runner(flops: int, threads: int):
    """A function that does about ``flops`` floating-point operations as nothing but the
    engine's FMA loop, one task on each of ``threads`` threads in one engine section
    (bound: the least Python a call into the engine takes), and the FLOPs it does
    (``flops`` rounded up to whole loop iterations on every thread)."""
    lib = engine().lib
    threads = max(1, threads)
    per_iter = int(lib.cg_fma_loop_flops())
    iters = max(1, -(-flops // (per_iter * threads)))
    go = _bound.runner(lib, _bound.task_table(lib, "cg_fma_task", [(iters,)] * threads),
                       threads)
    return go, iters * per_iter * threads


def roof_runner(flops: int, read_bytes: int, write_bytes: int, threads: int):
    """:func:`fma_runner`'s FMA loop while ``read_bytes`` are read and ``write_bytes``
    written with streaming stores, both spread evenly over its rounds (engine.cpp:
    cg_stream_fma_task), in 64-byte lines of buffers of its own (touched once here): a
    call that does a row's FLOPs and moves the bytes it must, with nothing else.  The
    function, the FLOPs it does, and its ``(source, destination, per-task sums)``."""
    lib = engine().lib
    threads = max(1, threads)
    per_round = int(lib.cg_fma_loop_flops())
    rounds = max(1, -(-flops // (per_round * threads))) * threads
    rlines, wlines = -(-read_bytes // 64), -(-write_bytes // 64)
    bufs = (_lines(rlines, 1.0), _lines(wlines, 0.0), np.zeros(threads, np.float32))
    desc = _StreamFma(bufs[0].ctypes.data, bufs[1].ctypes.data, rlines, wlines, rounds,
                      threads, bufs[2].ctypes.data)
    go = _bound.runner(lib, _bound.task_table(
        lib, "cg_stream_fma_task", [(ctypes.addressof(desc), k) for k in range(threads)]),
        threads)
    go.keep = (go.table, desc, bufs)
    return go, rounds * per_round, bufs


def _lines(n: int, value: float) -> np.ndarray:
    """n 64-byte lines of float32 ``value``, 64-byte aligned."""
    raw = np.full(n * 16 + 16, value, np.float32)
    off = (-raw.ctypes.data % 64) // 4
    return raw[off:off + n * 16]


def supports(geom: ConvGeometry, dtype) -> str | None:
    why = available()
    if why is not None:
        return f"native engine unavailable: {why}"
    if np.dtype(dtype) != np.float32:
        return f"computes in float32 only, not {np.dtype(dtype)}"
    if geom.spatial_rank > 3:
        return "1-D, 2-D and 3-D only"
    return None


def _budgets(threads: int) -> tuple[int, int, int, int]:
    """Per-thread scratch targets (converted input lines, buffered output lines,
    weight-gradient panels) and the bytes of partial weight gradients: the
    cache-sized defaults, less when the workspace budget (settings.workspace_bytes)
    is smaller than they would take."""
    budget = settings.workspace_bytes()
    per = max(64 * 2**10, budget // (2 * max(1, threads)))
    return (min(PACK_BYTES, per // 2), min(CORR_OUT_BYTES, per // 2),
            min(WGRAD_PANEL_BYTES, per), min(PARTIALS_BYTES, budget // 4))


def workspace(geom: ConvGeometry, op: str) -> dict[str, int]:
    """An upper bound of the engine's temporary memory for one call, by part: the
    per-thread scratch (converted input lines, channels-first output lines, weight
    gradient panels; reused across calls), the packed weights, the partial weight
    gradients.  Nothing is proportional to a whole data tensor."""
    threads = _threads(geom.flops)
    eng = engine() if available() is None else None
    vl = eng.vl if eng else 8
    G, cg, og = geom.groups, geom.c // geom.groups, geom.o // geom.groups
    T = math.prod(geom.kernel)
    k3, s3 = _pad3(geom.kernel, 1), _pad3(geom.strides, 1)
    if op in ("fwd", "dgrad"):
        cin, cout = (geom.c, geom.o) if op == "fwd" else (geom.o, geom.c)
        lin = _pad3(geom.in_sizes if op == "fwd" else geom.out_sizes, 1)
        uw = _pad3(geom.out_sizes if op == "fwd" else geom.in_sizes, 1)[2]
        # at least one output line's input rows and output row, whatever the budgets
        rows = k3[0] * k3[1] * lin[2] * cin * 4
        pack, out = _budgets(threads)[:2]
        per_thread = max(pack, rows) + max(out, uw * cout * 4)
        nb = _nv_for(cout // G, vl) * vl
        panels = G * -(-(cout // G) // nb) * nb * T * (cin // G) * 4
        return {"per-thread scratch": threads * per_thread, "weight panels": panels}
    nv = _nv_for(og, vl)
    nb, mr = nv * vl, (eng.mr_of if eng else (12, 6, 4, 3))[nv - 1]
    apad, bpad = G * -(-cg // mr) * mr, G * -(-og // nb) * nb
    per_position = 4 * (apad + bpad)
    plan_chunk = max(WGRAD_MIN_CHUNK, min(WGRAD_MAX_CHUNK, _budgets(threads)[2] // per_position))
    l3, m3 = _pad3(geom.in_sizes, 1), _pad3(geom.out_sizes, 1)
    band = max(1, -(-plan_chunk // max(1, m3[2])))
    lines = ((band * s3[1] + k3[1]) * k3[0] * l3[2] * geom.c + band * m3[2] * geom.o) * 4
    per_thread = 4 * ((plan_chunk + 64) * apad + 2 * plan_chunk * bpad) + lines
    dw = 4 * T * cg * geom.o
    chunks = max(1, min(geom.n * m3[0] * m3[1], WGRAD_CHUNKS))
    parts = {"per-thread scratch": threads * per_thread}
    if dw * chunks <= _budgets(threads)[3]:
        parts["partial weight gradients"] = dw * chunks
    return parts


def memory(call) -> dict[str, int]:
    """The registry's memory estimate (kernels.Call): no input copies (inputs are
    read in place or converted a block of lines at a time), the float32 result
    when the caller keeps another (:func:`result_copy`), and :func:`workspace`."""
    from . import ROLES
    parts = result_copy(call)
    if call.op != "wgrad":
        data = call.a if call.op == "fwd" else call.b
        if data.dtype != np.float32 or "nxc" not in data.layouts:
            eng = engine() if available() is None else None
            if _weight_stationary(call.geom, call.op, eng.vl if eng else 8):
                parts[f"{ROLES[call.op][0 if call.op == 'fwd' else 1]} in float32 channels "
                      "last"] = math.prod(data.shape) * 4
    if call.op == "wgrad" and _small_wgrad_inputs(call.geom):
        for role, d in (("x", call.a), ("dy", call.b)):
            if d.dtype != np.float32 or "nxc" not in d.layouts:
                parts[f"{role} in float32 channels last"] = math.prod(d.shape) * 4
    parts.update(workspace(call.geom, call.op))
    if call.op == "wgrad":
        part, oix = _part_bytes(call)
        if part:
            if call.out.dtype == np.float32 and oix:
                parts.pop("dw before the caller's copy", None)
            parts[f"a task's part of {'the OIX result' if oix else 'dw'}, per thread"] = part
    data_ops = {"fwd": (call.a,), "dgrad": (call.b,), "wgrad": (call.a, call.b)}[call.op]
    g = call.geom
    if (call.op == "wgrad" and CF_WGRAD and g.groups == 1 and not _plain_pointwise(g)
            and _cf_wgrad_fits(g) and _cf_wgrad_layouts(call)):
        # _cf_wgrad: a dy panel per thread (at least one output line), no conversions
        # (16-bit: a staging row of dy's block and the x rows of a panel's lines)
        eng = engine() if available() is None else None
        vl = eng.vl if eng else 8
        nb = _nv_for(g.o, vl) * vl
        m3, l3 = _pad3(g.out_sizes, 1), _pad3(g.in_sizes, 1)
        line = m3[2] * -(-g.o // nb) * nb                  # (a line of the panel)
        panel = max(CFW_PANEL_FLOATS, line) + 64
        lines = max(1, CFW_PANEL_FLOATS // max(1, line))     # (no output channels: 0)
        if call.a.dtype != np.float32:
            k, st, dl = _pad3(g.kernel, 1)[1], _pad3(g.strides, 1)[1], _pad3(g.dilations, 1)[1]
            rows = min(l3[1], (lines - 1) * st + (k - 1) * dl + 1)
            panel += nb * m3[2] + 64 + g.c * rows * l3[2] + 64
        parts["per-thread scratch"] = _threads(g.flops) * panel * 4
        if call.out.dtype == np.float32 and _cf_oix(
                g, "ncx" if call.out.layouts == frozenset({"ncx"}) else None):
            # (the partials' sum writes the OIX result: no copy; a buffer per thread)
            parts.pop("dw before the caller's copy", None)
            parts["the OIX sum's rows, per thread"] = _threads(g.flops) * min(
                SUM_OIX_BYTES, 4 * math.prod(g.kernel) * g.c * g.o)
    if _plain_pointwise(call.geom) and all("nxc" not in d.layouts and "ncx" in d.layouts
                                           for d in data_ops):
        # channels-first 1x1 calls (_transposed_pointwise): a sample's panels per thread
        g, threads = call.geom, _threads(call.geom.flops)
        if call.op == "wgrad" and all(d.dtype == np.float32 for d in data_ops):
            # _pointwise_wgrad: a chunk's panels per thread (cg_pw_scratch: at most 192
            # KiB or 64 positions), partial gradients and their sum
            slots, part = _pointwise_parts(g, threads)
            parts["a chunk's panels, per thread"] = threads * 4 * (
                max(48 << 10, 64 * -(-min(g.c, g.o) // 32) * 32) + 64)
            parts["partial weight gradients"] = (min(g.n + POINTWISE_PARTS, slots) + 1) * part
            return parts
        p = math.prod(g.in_sizes)
        b = {"fwd": g.c, "dgrad": g.o, "wgrad": g.c}[call.op] * (p + 64)
        parts["a sample's panels, per thread"] = threads * b * 4
        if call.op == "wgrad":
            parts["per-sample weight gradients"] = (min(threads, g.n) + 1) * g.o * g.c * 4
    return parts


def result_copy(call) -> dict[str, int]:
    """The float32 result of an engine kernel when the caller keeps another (another
    layout; a float16/bfloat16 weight gradient, or a data result the call does not
    take in its own dtype); nothing otherwise."""
    from . import ROLES
    parts = {}
    if call.op == "wgrad":
        layout = "nxc"
    else:
        data = call.a if call.op == "fwd" else call.b
        layout = "nxc" if "nxc" in data.layouts or "ncx" not in data.layouts else "ncx"
    direct = call.op != "wgrad" and call.direct_result and call.out.dtype in DTYPE_CODES
    if (call.out.dtype != np.float32 and not direct) or layout not in call.out.layouts:
        parts[f"{ROLES[call.op][2]} before the caller's copy"] = call.out.size * 4
    return parts


# permuted copies smaller than this stay with NumPy
PERMUTE_MIN_ELEMENTS = 1 << 15


def permuted_copy(a: np.ndarray) -> np.ndarray | None:
    """A C-contiguous copy of ``a`` (a permuted view, e.g. a weight gradient in the
    engine's ``(*K, C/G, O)`` order seen as ``OIX``) made by the engine's 8 x 8
    transposes, or None where NumPy's copy is as good (``a``'s last axis already
    contiguous in memory, small or odd arrays) or no engine is loaded.  NumPy
    copies such views element by element at cache-missing strides: a 512 x 512 x
    3 x 3 weight gradient took 10 ms, the transposes about 1 ms.

    The copy of a view is planned once per shape, strides, dtype, build and thread
    count (:func:`_bind_permute`); a call patches two addresses and runs the kept
    tasks (a channels-first caller's dy or result copied on every call: ResNet-50
    res5's 0.8 MB dy 0.45 -> 0.28 ms after the benchmark's pause, 0.057 -> 0.025
    hot)."""
    if (a.ndim < 2 or a.ndim > 5 or a.itemsize not in (2, 4) or a.size < PERMUTE_MIN_ELEMENTS
            or a.dtype.kind not in "fV" or a.flags.c_contiguous or a.dtype.hasobject):
        return None
    try:
        eng = engine()
    except ConvGradError:
        return None
    threads = _threads(a.size * 64)
    key = (a.shape, a.strides, a.dtype, eng.isa, threads)
    bound = _PERMUTES.get(key)
    if bound is None:
        bound = _bind_permute(eng, a, threads)
        if len(_PERMUTES) >= _PERMUTES_MAX:
            _PERMUTES.clear()
        _PERMUTES[key] = bound
    if bound is False:
        return None
    out = bound(a, None)
    if out is None:         # (another thread runs this view's copy: the unbound way)
        out = _bind_permute(eng, a, threads)(a, None)
    return out


# Permuted copies planned per view (permuted_copy), at most _PERMUTES_MAX of them.
_PERMUTES: dict = {}
_PERMUTES_MAX = 64


def _bind_permute(eng: Engine, a: np.ndarray, threads: int):
    """The copy of views laid out as ``a`` (shape, strides, dtype) on ``threads`` of
    ``eng``'s threads, bound: ``run(view, None)`` -> the copy (None while another
    thread runs it); False where NumPy's copy is as good."""
    es = a.itemsize
    if any(s % es for s in a.strides):
        return False
    out_shape = a.shape
    # axes consecutive in both orders merge (a weight gradient's 3 x 3 taps, from
    # (*K, C, O) to OIX: 9 contiguous floats a row instead of 3, so the 8 x 8
    # transposes take them: ResNet-50 res5's 3.5 -> 1.7-2.2 ms on 2 threads)
    shape, sstr = [a.shape[0]], [a.strides[0] // es]
    for n, st in zip(a.shape[1:], a.strides[1:]):
        if sstr[-1] == st // es * n:
            shape[-1] *= n
            sstr[-1] = st // es
        else:
            shape.append(n)
            sstr.append(st // es)
    if len(shape) < 2:
        return False
    last = len(shape) - 1
    rows = min(range(len(shape)), key=lambda i: (abs(sstr[i]) if shape[i] > 1 else 1 << 62))
    if rows == last or sstr[rows] != 1:
        return False
    dstr = [math.prod(shape[i + 1:]) for i in range(len(shape))]       # (C order)
    batch = [i for i in range(len(shape)) if i not in (rows, last)]
    pad = 3 - len(batch)
    dims = _i64([1] * pad + [shape[i] for i in batch] + [shape[rows], shape[last]])
    ss = _i64([0] * pad + [sstr[i] for i in batch] + [sstr[rows], sstr[last]])
    ds = _i64([0] * pad + [dstr[i] for i in batch] + [dstr[rows], dstr[last]])
    nb = int(math.prod(dims[:3]))
    # (view, result: patched per call), element size, then the three descriptors
    d = _i64([0, 0, es, dims.ctypes.data, ss.ctypes.data, ds.ctypes.data])
    lib, dtype, address, empty = eng.lib, a.dtype, _bound.address, _results.empty
    if threads <= 1 or nb <= 1:
        fn, at = lib.cg_permute_task, d.ctypes.data

        def go():
            fn(at, 0, nb)
    else:
        # on the engine's workers, ranges taken in order (Python's pool threads were
        # slow after the benchmark's pause: placed on the caller's vCPU)
        go = _bound.runner(lib, _bound.task_table(
            lib, "cg_permute_task",
            [(d.ctypes.data, lo, hi) for lo, hi in _pool.split(nb, 4 * threads)]), threads)

    def run(view, _unused):
        result = empty(out_shape, dtype)
        d[0], d[1] = address(view), address(result)
        go()
        return result
    run.keep = (d, dims, ss, ds)
    return _bound.guarded(run)


def _shared(eng: Engine, fn: str, before: tuple, after: tuple, ntasks: int, threads: int,
            need: int) -> None:
    """``fn(*before, counter, *after, scratch)`` on ``min(threads, ntasks)`` threads at
    once: the compiled loop takes task after task from one shared atomic counter (an
    int64 starting at 0) until ``ntasks`` are done, so no thread idles while another
    finishes a backlog (static blocks did: a late-waking worker left the other a task
    or two to do alone)."""
    counter = np.zeros(1, np.int64)
    n = max(1, min(threads, ntasks))
    buf, per_thread = _pool.thread_scratch("native-pack", need, n)
    _pool.run_native(eng.lib, fn, [(*before, counter.ctypes.data, *after)] * n, n, per_thread)
    del counter, buf


def _sum_parts(eng: Engine, parts: np.ndarray, out: np.ndarray, threads: int) -> None:
    """``out`` (C-contiguous float32) = ``parts[0] + parts[1] + ...`` summed in that
    order, as ``np.add.reduce(parts, axis=0)`` sums (the same bits, NaN and Inf
    included, and no warnings), ranges of elements on the engine's threads: partial
    weight gradients (megabytes, summed after the benchmark's pause single-threaded
    at a fraction of the bandwidth)."""
    n = out.size
    prob = _PartsSum(parts.ctypes.data, parts.shape[0], parts.strides[0] // 4, out.ctypes.data)
    pp = ctypes.addressof(prob)
    blocks = -(-n // SUM_BLOCK)
    threads = max(1, min(threads, blocks))
    ranges = _pool.split(blocks, 4 * threads) if threads > 1 else [(0, blocks)]
    _pool.run_native(eng.lib, "cg_sum_parts",
                     [(pp, lo * SUM_BLOCK, min(n, hi * SUM_BLOCK)) for lo, hi in ranges], threads)
    del prob


def waker(flops: int):
    """A function that asks the engine's sleeping workers to wake and spin for the
    section a call of ``flops`` is about to start (``cg_pool_wake``), or None where the
    call runs on one thread or no engine is loaded yet: a bound call's first act, ahead
    of its own Python (after a pause of the process a sleeping worker took 50-110 us to
    join the first section)."""
    threads = _threads(flops)
    if threads <= 1 or not _ENGINES:
        return None
    wake = engine().lib.cg_pool_wake
    return lambda: wake(threads)


def _threads(flops: int) -> int:
    n = settings.threads()
    n = cpu_count() if n is None else n
    return 1 if flops < SERIAL_FLOPS else max(1, n)


def _tensor(a: np.ndarray) -> _Tensor:
    """An (N, *S, C) view as a 5-axis descriptor (leading spatial axes of size 1)."""
    code = DTYPE_CODES.get(a.dtype)
    if code is None:
        raise ConvGradError(f"native engine: unsupported dtype {a.dtype}")
    es = a.itemsize
    st = [s // es for s in a.strides]
    r = a.ndim - 2
    strides = [st[0]] + [0] * (3 - r) + st[1:]
    return _Tensor(a.ctypes.data, code, (ctypes.c_int64 * 5)(*strides))


def _pad3(v, fill):
    v = tuple(v)
    return (fill,) * (3 - len(v)) + v


def _i64(values) -> np.ndarray:
    return np.ascontiguousarray(np.array(values, dtype=np.int64).reshape(-1))


def _nv_for(channels: int, vl: int) -> int:
    """Vectors per output block: few wasted lanes, else the widest block."""
    best, best_key = 1, None
    for nv in (1, 2, 3, 4):
        nb = nv * vl
        blocks = -(-channels // nb)
        waste = blocks * nb - channels
        if nv > 1 and nb > channels + vl - 1:
            continue
        key = (waste > (vl // 2) * blocks, -nv if nv <= 2 else -1.5, waste)
        if best_key is None or key < best_key:
            best, best_key = nv, key
    return best


def _alloc_like(data: np.ndarray, n: int, sizes, channels: int, dtype=np.float32) -> np.ndarray:
    """A result (N, *sizes, channels) laid out in ``data``'s memory order: channels
    first in memory when ``data`` is (an NXC view of) an NCX array."""
    return allocator(data, n, sizes, channels, dtype)()


def allocator(data: np.ndarray, n: int, sizes, channels: int, dtype=np.float32):
    """A function that returns a new :func:`_alloc_like` result each call (for bound
    calls: it keeps no reference to ``data``)."""
    chan_first = data.ndim > 2 and data.shape[-1] > 1 and all(
        data.strides[-1] >= abs(s) for s, m in zip(data.strides[1:-1], data.shape[1:-1])
        if m > 1)
    empty = _results.empty
    if chan_first:
        shape, axes = (n, channels, *sizes), (0, *range(2, len(sizes) + 2), 1)
        return lambda: empty(shape, dtype).transpose(axes)
    shape = (n, *sizes, channels)
    return lambda: empty(shape, dtype)


def _weights_2d(w: np.ndarray) -> np.ndarray:
    """``(*K, A, B)`` weights as ``(T, A, B)`` (a view when the taps flatten)."""
    return w.reshape(-1, w.shape[-2], w.shape[-1])


def _weights(eng: Engine, w3: np.ndarray, A: int, B: int, sa: int, sb: int, gstride: int,
             groups: int, nv: int, threads: int):
    """The corr kernel's weights: ``(array, wg, wob, wt, wc)``, block ``ob`` of group
    ``g``, tap ``t``, row ``a`` (an input channel of the correlation) at element
    ``g*wg + ob*wob + t*wt + a*wc`` (NB = nv * VL columns from there).  ``w3``
    (T, ., .) holds element (t, a, b) of group g at ``t*st + a*sa + b*sb + g*gstride``.
    Always packed into panels [g][ob][t][a][NB] (zero columns past B): read in
    place, the rows of one block are the row length apart -- a power of two for
    most layers, which maps them onto a few cache sets (measured: ResNet-50 res5
    forward at 38 GFLOP/s on one core in place, 82 packed)."""
    T = w3.shape[0]
    blocks, *steps = _panel_steps(groups, T, A, B, nv * eng.vl)
    st = w3.strides[0] // w3.itemsize
    out = scratch("native-panels", (blocks * steps[1],), np.float32, zero=False)
    d = _i64([w3.ctypes.data, DTYPE_CODES[w3.dtype], T, A, B, st, sa, sb, gstride, nv,
              out.ctypes.data])
    # (on the engine's workers: see permuted_copy)
    _pool.run_native_ranges(eng.lib, "cg_pack_panels_task", (d.ctypes.data,), blocks,
                            threads if out.nbytes > 2**20 else 1)
    return (out, *steps)


def _panel_steps(groups: int, T: int, A: int, B: int, nb: int) -> tuple:
    """Weight panels [g][ob][t][a][nb] of ``groups`` groups, T taps, A rows and B columns:
    (blocks (g, ob) in all, wg, wob, wt, wc) -- the steps of :func:`_weights`, a block
    wob floats."""
    nblk = -(-B // nb)
    return groups * nblk, nblk * T * A * nb, T * A * nb, A * nb, nb


# -- plans: everything about a call that depends on its geometry only (cached) ---------------

@dataclass(frozen=True)
class CorrPlan:
    """One corr problem: the forward convolution (``kind="fwd"``) or the data
    gradient (``"dgrad"``) as a correlation of ``inp`` (x or dy) into ``out``."""
    n: int
    lin: tuple            # input spatial sizes (3-D)
    cin: int              # input channels of the correlation (C for fwd, O for dgrad)
    cout: int
    groups: int
    istep: tuple
    ostep: tuple
    phases: np.ndarray    # per phase: or[3], U[3], tap_begin, tap_end
    taps: np.ndarray      # per tap entry: off[3], weight tap
    ntap_w: int
    nv: int
    rmax: int
    ob_group: int
    items: np.ndarray     # per item: phase, first line, end line, first and end block
    wphases: int = 1      # phases an item computes (see corr_plan)
    hphases: int = 1      # of those, h phases (output rows per line)


def _corr_taps(geom: ConvGeometry, kind: str):
    """The phases and tap entries of the correlation (see engine.cpp)."""
    k3, s3, d3, p3 = (_pad3(geom.kernel, 1), _pad3(geom.strides, 1), _pad3(geom.dilations, 1),
                      _pad3(geom.pads_begin, 0))
    if kind == "fwd":
        taps = [(kd * d3[0] - p3[0], kh * d3[1] - p3[1], kw * d3[2] - p3[2], t)
                for t, (kd, kh, kw) in enumerate(np.ndindex(*k3))]
        return [(0, 0, 0, *_pad3(geom.out_sizes, 1), 0, len(taps))], taps
    # dgrad, one stride phase r at a time: dx[q*s + r] = sum over the taps with
    # (r + pb - t*d) % s == 0 of dy[q + (r + pb - t*d) / s] . w[t]^T
    l3 = _pad3(geom.in_sizes, 1)
    taps, phases = [], []
    for r in np.ndindex(*s3):
        counts = [-(-(L - ri) // s) if ri < L else 0 for L, ri, s in zip(l3, r, s3)]
        begin = len(taps)
        for t, k in enumerate(np.ndindex(*k3)):
            num = [ri + p - ki * d for ri, p, ki, d in zip(r, p3, k, d3)]
            if all(v % s == 0 for v, s in zip(num, s3)):
                taps.append((*(v // s for v, s in zip(num, s3)), t))
        if all(counts):
            phases.append((*r, *counts, begin, len(taps)))
    return phases, taps


def _weight_stationary(geom: ConvGeometry, kind: str, vl: int) -> bool:
    """Whether a forward or data gradient call's weights outweigh its input so far
    that its items split the output blocks, a few blocks' weights each (ResNet-50
    res5: 9.4 MB of weights, 0.8 MB of dy), instead of every item streaming all
    the weights.  The input is then read in place, or converted once beforehand
    (NCX or 16-bit callers): every item would convert its lines again."""
    G = geom.groups
    cin, cout = (geom.c, geom.o) if kind == "fwd" else (geom.o, geom.c)
    lin = _pad3(geom.in_sizes if kind == "fwd" else geom.out_sizes, 1)
    nb = _nv_for(cout // G, vl) * vl
    panel_bytes = math.prod(geom.kernel) * (cin // G) * nb * 4
    ob_group = 1 if panel_bytes <= CORR_L1_WEIGHT_BYTES else max(
        1, min(-(-(cout // G) // nb), CORR_WEIGHT_BYTES // max(1, panel_bytes)))
    nob = -(-(cout // G) // nb)
    weight_bytes = G * nob * panel_bytes
    data_bytes = geom.n * math.prod(lin) * cin * 4
    return nob > ob_group and weight_bytes > CORR_WEIGHT_BYTES and weight_bytes > 2 * data_bytes


def _w_phase_families(ph: np.ndarray, ostep) -> int:
    """``ostep[2]`` when the phases (rows of ``ph``: or[3], U[3], tap range) come as
    runs of the ``ostep[2]`` w phases 0, 1, ... of one (d, h) phase, else 1."""
    sw = int(ostep[2])
    if sw <= 1 or len(ph) % sw:
        return 1
    fam = ph.reshape(-1, sw, 8)
    same = (fam[:, :, :2] == fam[:, :1, :2]).all() and (fam[:, :, 3:5] == fam[:, :1, 3:5]).all()
    return sw if same and (fam[:, :, 2] == np.arange(sw)).all() else 1


def _phase_families(ph: np.ndarray, ostep, merge_h: bool) -> tuple[int, int]:
    """(phases, h phases) an item of a buffered data gradient computes: every (h, w)
    phase of one d phase when the phases come as runs of them (h fastest but w) and
    the h phases have as many rows each (then each line of the item is ``ostep[1]``
    consecutive output rows), else the w phases of a (d, h) phase
    (:func:`_w_phase_families`)."""
    wf = _w_phase_families(ph, ostep)
    sh, sw = int(ostep[1]), int(ostep[2])
    size = sh * sw
    if not merge_h or sh <= 1 or (sw > 1 and wf != sw) or len(ph) % size:
        return wf, 1
    fam = ph.reshape(-1, size, 8)
    rh, rw = np.divmod(np.arange(size), sw)
    same = ((fam[:, :, [0, 3, 4]] == fam[:, :1, [0, 3, 4]]).all()
            and (fam[:, :, 1] == rh).all() and (fam[:, :, 2] == rw).all())
    return (size, sh) if same else (wf, 1)


@functools.lru_cache(maxsize=256)
def corr_plan(geom: ConvGeometry, kind: str, vl: int, rmax_of: tuple, threads: int,
              packed: bool, out_buffered: bool, budgets: tuple) -> CorrPlan:
    """The work decomposition of a forward or data gradient call (pure, cached)."""
    G = geom.groups
    if kind == "fwd":
        n, lin, cin, cout = geom.n, _pad3(geom.in_sizes, 1), geom.c, geom.o
        istep, ostep = _pad3(geom.strides, 1), (1, 1, 1)
    else:
        n, lin, cin, cout = geom.n, _pad3(geom.out_sizes, 1), geom.o, geom.c
        istep, ostep = (1, 1, 1), _pad3(geom.strides, 1)
    nv = _nv_for(cout // G, vl)
    phases, taps = _corr_taps(geom, kind)
    ph = np.asarray(phases, np.int64).reshape(-1, 8)
    t4 = _i64(taps or [(0, 0, 0, 0)]).reshape(-1, 4)
    ntap_w = math.prod(geom.kernel)
    nb = nv * vl
    panel_bytes = ntap_w * (cin // G) * nb * 4
    # weight blocks small enough for L1 are swept one at a time (each stays in L1
    # while the item's pixels pass), larger ones a few at a time (in L2)
    ob_group = 1 if panel_bytes <= CORR_L1_WEIGHT_BYTES else max(
        1, min(-(-(cout // G) // nb), CORR_WEIGHT_BYTES // max(1, panel_bytes)))
    # work items: ranges of output lines of one phase (lines numbered over n, d, h):
    # several per thread; an item's input rows stay in cache (and, when they are
    # converted, in the per-thread scratch), its output rows too when they are
    # computed into a buffer (channels-first results)
    total = sum(int(p[3] * p[4]) for p in ph) * n
    line_bytes = lin[2] * cin * 4
    pack_bytes, out_bytes = budgets[:2]
    budget = pack_bytes if packed else CORR_ITEM_BYTES
    # weight-stationary items (see _weight_stationary; the callers convert a packed
    # input beforehand)
    nob = -(-(cout // G) // nb)
    ob_split = not packed and _weight_stationary(geom, kind, vl)
    ob_ranges = ([(b, min(nob, b + ob_group)) for b in range(0, nob, ob_group)] if ob_split
                 else [(0, nob)])
    # a data gradient whose result is computed into line buffers (channels-first or
    # 16-bit callers) takes the w phases of one (d, h) phase in one item, or all the
    # (h, w) phases of a d phase: its buffer then holds whole output lines (rows),
    # stored once (engine.cpp: cg_corr_run)
    wphases, hphases = (_phase_families(ph, ostep, MERGE_H_PHASES)
                        if out_buffered and MERGE_W_PHASES else (1, 1))
    items = []
    for k in range(0, len(ph), wphases):
        fam = ph[k:k + wphases]
        p = fam[0]
        lines = n * int(p[3] * p[4])
        ftaps = np.concatenate([t4[q[6]:q[7]] for q in fam])
        rows_h = len(set(ftaps[:, 1].tolist())) or 1
        rows_d = len(set(ftaps[:, 0].tolist())) or 1
        out_line = int(fam[:, 5].sum()) * cout * 4 if out_buffered else 0
        band = max(1, total * len(ob_ranges) // (8 * threads) if not ob_split else lines)
        while band > 1 and (rows_d * (band * istep[1] + rows_h) * line_bytes > budget
                            or band * out_line > out_bytes):
            band = max(1, band // 2)
        items += [(k, lo, min(lines, lo + band), b0, b1) for b0, b1 in ob_ranges
                  for lo in range(0, lines, band)]
    # the phases of a data gradient read the same dy rows for the same line numbers:
    # their items follow each other (a thread finds those rows still in cache)
    items.sort(key=lambda it: (it[3], it[1], it[0]))
    plan = CorrPlan(n, lin, cin, cout, G, istep, ostep, ph, t4, ntap_w, nv, rmax_of[nv - 1],
                    ob_group, _i64(items).reshape(-1, 5), wphases, hphases)
    for a in (plan.phases, plan.taps, plan.items):
        a.setflags(write=False)
    return plan


def _pointwise(geom: ConvGeometry, *data: np.ndarray):
    """A 1x1, stride-1, unpadded convolution in 2-D or 3-D is one in 1-D over the
    flattened positions (longer lines: fewer, larger register tiles and chunks).
    Returns that geometry and (N, positions, C) views of the (N, *S, C) arrays, or
    the problem as it is when an array's positions do not flatten into a view, or
    when there would be too few lines (samples) to share among threads."""
    r = geom.spatial_rank
    if (r < 2 or geom.n < POINTWISE_MIN_SAMPLES or any(k != 1 for k in geom.kernel)
            or any(s != 1 for s in geom.strides)
            or any(geom.pads_begin) or tuple(geom.in_sizes) != tuple(geom.out_sizes)):
        return geom, data
    flat = []
    for a in data:
        sh, st = a.shape, a.strides
        if any(st[1 + i] != sh[2 + i] * st[2 + i] for i in range(r - 1)):
            return geom, data
        flat.append(np.lib.stride_tricks.as_strided(
            a, (sh[0], math.prod(sh[1:-1]), sh[-1]), (st[0], st[r], st[-1]),
            writeable=a.flags.writeable))
    p = math.prod(geom.in_sizes)
    return dataclasses.replace(geom, in_sizes=(p,), out_sizes=(p,), kernel=(1,), strides=(1,),
                               dilations=(1,), pads_begin=(0,), pads_end=(0,)), tuple(flat)


def _plain_pointwise(geom: ConvGeometry) -> bool:
    """1x1, stride 1, unpadded, ungrouped."""
    return (geom.groups == 1 and all(k == 1 for k in geom.kernel)
            and all(s == 1 for s in geom.strides) and not any(geom.pads_begin)
            and tuple(geom.in_sizes) == tuple(geom.out_sizes))


def _channels_first_pointwise(geom: ConvGeometry, *data: np.ndarray):
    """Per-sample ``(channels, positions)`` views of (N, *S, C) arrays whose every
    sample is channels-first and contiguous (NCX memory), for a 1x1, stride-1,
    unpadded, ungrouped problem; None otherwise."""
    if not _plain_pointwise(geom):
        return None
    p = math.prod(geom.in_sizes)
    views = []
    for a in data:
        es = a.itemsize
        flat = a.reshape(a.shape[0], p, a.shape[-1]) if p > 0 else None
        if (flat is None or a.dtype not in DTYPE_CODES or flat.strides[1] != es
                or flat.strides[2] != p * es or p < 64 or a.shape[-1] < 8):
            return None
        views.append(np.swapaxes(flat, 1, 2))        # (N, channels, positions)
    return views


def _pixel_grid(m: int) -> tuple[int, int]:
    """``m`` pixels as h x w lines (several lines: work items for the threads)."""
    h = max((d for d in range(1, int(math.isqrt(m)) + 1) if m % d == 0), default=1)
    return h, m // h


def _transposed_pointwise(eng: Engine, a_of, b_of, outs, threads: int,
                          stream: bool = False) -> None:
    """Channels-first 1x1 problems as correlations whose pixels are channels: for
    every sample k, ``outs[k]`` (M, B) = ``a_of(k)`` (M, A) @ ``b_of(k)`` (A, B), a
    sample's positions being the correlation's channels (contiguous in NCX memory:
    no layout change but the packing of the panels).  Whole samples per thread
    when they share out evenly, else the threads inside each sample."""
    n = len(outs)
    per_sample = threads > 1 and n >= threads and n % threads == 0
    t_in = 1 if per_sample else threads

    def one(k):
        a2, b2 = a_of(k), b_of(k)
        (m, a), b = a2.shape, b2.shape[1]
        h, w = _pixel_grid(m)
        inp, out, b3 = a2.reshape(1, h, w, a), outs[k].view(), b2[None]
        out.shape = (1, h, w, b)                     # (a view: raises rather than copy)
        g = ConvGeometry(1, a, b, 1, (h, w), (1, 1), (h, w), (1, 1), (1, 1), (0, 0), (0, 0))
        plan = corr_plan(g, "fwd", eng.vl, eng.rmax_of, t_in, _is_packed(inp), _out_buffered(out),
                         _budgets(t_in))
        es = b3.itemsize
        weights = _weights(eng, b3, a, b, b3.strides[1] // es, b3.strides[2] // es, 0, 1,
                           plan.nv, t_in)
        _corr(eng, plan, inp, out, weights, t_in, stream)
    if per_sample and PW_SAMPLE_TASKS and _pw_samples(eng, a_of, b_of, outs, threads, stream):
        return
    if per_sample:
        _pool.run_each([lambda lo=lo, hi=hi: [one(k) for k in range(lo, hi)]
                        for lo, hi in _pool.split(n, threads)], threads)
    else:
        for k in range(n):
            one(k)


class _PwSamples(ctypes.Structure):
    _fields_ = [("base", _Corr), ("ins", ctypes.c_void_p), ("outs", ctypes.c_void_p),
                ("srcs", ctypes.c_void_p)] + [(f, _I64) for f in (
                    "dtype", "T", "A", "B", "st", "sa", "sb", "gstride", "nv", "nblk",
                    "panel_floats", "nitems")]


def _pw_samples(eng: Engine, a_of, b_of, outs, threads: int, stream: bool) -> bool:
    """:func:`_transposed_pointwise`'s samples as tasks of the engine's workers
    (cg_pw_sample_task: a sample's weight panels packed into the thread's scratch, then
    its correlation, on one thread): the same calls as one Python pool thread per
    sample made, without the GIL between them.  False (nothing done) where the samples'
    arrays differ in anything but their addresses."""
    made = _pw_samples_problem(eng, a_of, b_of, outs, stream)
    if made is None or made is True:
        return made is True
    prob, tables, need = made
    buf, per_thread = _pool.thread_scratch("native-pack", need, threads)
    _pool.run_native(eng.lib, "cg_pw_sample_task",
                     [(ctypes.addressof(prob), k) for k in range(len(outs))], threads,
                     per_thread)
    del prob, buf, tables
    return True


def _pw_samples_problem(eng: Engine, a_of, b_of, outs, stream: bool):
    """:func:`_pw_samples`' descriptor: ``(problem, its three address tables (a, out,
    b per sample), per-thread scratch floats)``; None where the samples' arrays differ
    in anything but their addresses, True where there is nothing to compute."""
    n = len(outs)
    a0, b0 = a_of(0), b_of(0)
    (m, a), b = a0.shape, b0.shape[1]
    h, w = _pixel_grid(m)
    views = [(a_of(k).reshape(1, h, w, a), outs[k].view(), b_of(k)[None]) for k in range(n)]
    for v in views:
        v[1].shape = (1, h, w, b)
    first = views[0]
    if any(tuple(x.strides) != tuple(y.strides) or x.dtype != y.dtype
           for v in views[1:] for x, y in zip(v, first)):
        return None
    inp, out, b3 = first
    g = ConvGeometry(1, a, b, 1, (h, w), (1, 1), (h, w), (1, 1), (1, 1), (0, 0), (0, 0))
    plan = corr_plan(g, "fwd", eng.vl, eng.rmax_of, 1, _is_packed(inp), _out_buffered(out),
                     _budgets(1))
    if not len(plan.items):
        return True
    es = b3.itemsize
    T = b3.shape[0]
    blocks, *steps = _panel_steps(1, T, a, b, plan.nv * eng.vl)
    panel_floats = blocks * steps[1]
    base = _corr_problem(plan, inp, out, 0, steps, stream)
    tables = [_i64([v[i].ctypes.data for v in views]) for i in range(3)]
    prob = _PwSamples(base, tables[0].ctypes.data, tables[1].ctypes.data,
                      tables[2].ctypes.data, DTYPE_CODES[b3.dtype], T, a, b,
                      b3.strides[0] // es, b3.strides[1] // es, b3.strides[2] // es, 0,
                      plan.nv, blocks, panel_floats, len(plan.items))
    need = -(-panel_floats // 16) * 16 + int(eng.lib.cg_corr_scratch(
        ctypes.addressof(prob.base), 0, len(plan.items)))
    prob.keep = (plan, tables)
    return prob, tables, need


def _bind_transposed_pointwise(kind: str, inp: np.ndarray, w: np.ndarray, out: np.ndarray,
                               geom: ConvGeometry, alloc):
    """:func:`_corr_into`'s channels-first 1x1 path (:func:`_transposed_pointwise`) bound
    (``_bound``) where it runs whole samples as the engine's tasks (:func:`_pw_samples`):
    plan, descriptor, task table made once; a call writes the samples' addresses (the
    weights, its result's and its input's, a fixed step apart) into the descriptor's
    tables and whether its result streams.  None otherwise."""
    eng = engine()
    lib = eng.lib
    threads = _threads(geom.flops)
    ins, outs = _channels_first_pointwise(geom, inp, out)
    n = len(outs)
    if not (PW_SAMPLE_TASKS and threads > 1 and n >= threads and n % threads == 0):
        return None
    w2 = _weights_2d(w)[0].T if kind == "fwd" else _weights_2d(w)[0]
    made = _pw_samples_problem(eng, lambda k: w2, lambda k: ins[k], outs, False)
    if made is None or made is True:
        return None
    prob, (ta, to, tb), need = made
    address = _bound.address
    # (each sample's views a fixed step from their array's address)
    w_off = address(w2) - address(w)
    o_off, o_step = address(outs[0]) - address(out), out.strides[0]
    i_off, i_step = address(ins[0]) - address(inp), inp.strides[0]
    aligned = o_off % 64 == 0 and o_step % 64 == 0 and outs[0].strides[0] % 64 == 0
    ks = np.arange(n, dtype=np.int64)
    per = _pool.scratch_bytes(need)
    go = _bound.runner(lib, _bound.task_table(
        lib, "cg_pw_sample_task", [(ctypes.addressof(prob), k) for k in range(n)]), threads, per)
    streams_runs, thread_scratch = _results.streams_runs, _pool.thread_scratch

    def run(w, inp):
        res = alloc()
        ta[:] = address(w) + w_off
        np.add(ks * o_step, address(res) + o_off, out=to)
        np.add(ks * i_step, address(inp) + i_off, out=tb)
        prob.base.stream = int(aligned and streams_runs(res))
        buf, (base, _) = thread_scratch("native-pack", need, threads)
        go(base)
        del buf
        return res
    run.keep = (prob, ta, to, tb)
    return _bound.guarded(run)


def _small_wgrad_inputs(geom: ConvGeometry) -> bool:
    """Whether a weight gradient's inputs are small beside its result (float32
    copies of both at most a quarter of it: ResNet-50 res5, 1.6 MB against 9.4):
    packed ones (NCX, 16-bit) are then converted once, not once per tap."""
    data = geom.n * geom.c * math.prod(geom.in_sizes) + geom.n * geom.o * math.prod(
        geom.out_sizes)
    return 4 * data <= math.prod(geom.kernel) * (geom.c // geom.groups) * geom.o


def _stationary_input(a: np.ndarray, geom: ConvGeometry, kind: str, vl: int) -> np.ndarray:
    """A packed input (NCX or 16-bit) of a weight-stationary call, or of a weight
    gradient with small inputs (``kind="wgrad"``), as a float32 channels-last
    copy, made once (at most half the weights' bytes); else ``a``."""
    if not _is_packed(a) or not (_small_wgrad_inputs(geom) if kind == "wgrad"
                                 else _weight_stationary(geom, kind, vl)):
        return a
    out = a if a.flags.c_contiguous else permuted_copy(a)
    return float32_copy(np.ascontiguousarray(a) if out is None else out)


def float32_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous float16/bfloat16 array converted to float32 by the engine (the
    same values as NumPy's and ml_dtypes' casts, D23); a float32 one as it is."""
    if a.dtype == np.float32:
        return a
    assert a.flags.c_contiguous
    f32 = _results.empty(a.shape, np.float32)       # (mapped memory: see wgrad)
    engine().lib.cg_load_floats(f32.ctypes.data, a.ctypes.data, DTYPE_CODES[a.dtype], a.size)
    return f32


# float32 results cast to 16 bits by the engine from this many elements on
NARROW_MIN_ELEMENTS = 1 << 16


def narrowed_copy(a: np.ndarray, dtype) -> np.ndarray | None:
    """A C-contiguous float32 array rounded to float16 / bfloat16 by the engine's
    threads, ranges of elements: the rounding of the kernels' 16-bit stores (NumPy's /
    ml_dtypes' bit for bit, NaN kept quiet with its sign: D23).  A large weight
    gradient is computed in float32 and cast afterwards: ResNet-50 res5's 9.4 MB took
    2.7 ms (float16, one thread) / 1.8 ms (bfloat16, NumPy) of an 11-12 ms call after
    the benchmark's pause.  None where it does not apply (small, strided or other
    arrays, no engine)."""
    dtype = np.dtype(dtype)
    if (a.dtype != np.float32 or dtype == np.float32 or dtype not in DTYPE_CODES
            or not a.flags.c_contiguous or a.size < NARROW_MIN_ELEMENTS
            or available() is not None):
        return None
    out = _results.empty(a.shape, dtype)
    threads = _threads(a.size * 64)
    src, dst, code = a.ctypes.data, out.ctypes.data, DTYPE_CODES[dtype]
    _pool.run_native(engine().lib, "cg_store_floats",
                     [(dst + 2 * lo, code, src + 4 * lo, hi - lo)
                      for lo, hi in _pool.split(a.size, 4 * threads)], threads)
    return out


def parallel_copy(dst: np.ndarray, src: np.ndarray, threads: int) -> np.ndarray:
    """``dst[...] = src`` (C-contiguous float32 arrays of one size) by the engine's
    threads, 4 ranges a thread: the benchmark's measure of moving a row's bytes."""
    _pool.run_native(engine().lib, "cg_load_floats",
                     [(dst.ctypes.data + 4 * lo, src.ctypes.data + 4 * lo, 0, hi - lo)
                      for lo, hi in _pool.split(src.size, 4 * max(1, threads))], threads)
    return dst


def _is_packed(a: np.ndarray) -> bool:
    """Whether the kernels convert ``a`` (not float32 with unit channel stride)."""
    return not (a.dtype == np.float32 and a.strides[-1] == a.itemsize)


def _out_buffered(out: np.ndarray) -> bool:
    """Whether the corr kernel computes ``out`` through float32 line buffers: a
    channels-first result.  The tiles store a channels-last one themselves, float16 /
    bfloat16 rounded in registers (engine.cpp: out_buffered): its data gradient's
    stride phases then take one item each (2026-11-27, Zen 5, in one process against
    merged phases in line buffers: ResNet-50 res3 stride 2 level, DCGAN 1.03-1.05x
    faster)."""
    return out.strides[-1] != out.itemsize


def _corr_problem(plan: CorrPlan, inp: np.ndarray, out: np.ndarray, wpk: int, steps,
                  stream: bool) -> _Corr:
    """The engine's description of ``plan`` on ``inp`` into ``out``, the weight panels at
    address ``wpk`` with steps (wg, wob, wt, wc) (:func:`_weights`)."""
    ostr = [s // out.itemsize for s in out.strides]
    r = out.ndim - 2
    ostr5 = [ostr[0]] + [0] * (3 - r) + ostr[1:]
    return _Corr(_tensor(inp), out.ctypes.data, (_I64 * 5)(*ostr5), DTYPE_CODES[out.dtype],
                 plan.n, (_I64 * 3)(*plan.lin), plan.cin, plan.cout, plan.groups,
                 (_I64 * 3)(*plan.istep), (_I64 * 3)(*plan.ostep), plan.phases.ctypes.data,
                 plan.taps.ctypes.data, wpk, *steps, plan.ntap_w, plan.nv, plan.rmax,
                 plan.ob_group, plan.items.ctypes.data, int(stream), plan.wphases,
                 plan.hphases)


def _streams(out: np.ndarray) -> bool:
    """Whether the corr kernel may write ``out`` with streaming stores: a channels-last
    result (``_results.streams``; the kernel streams float32 tiles or converted lines) or
    a channels-first float32 one (``_results.streams_channels``; the kernel streams the
    channel runs of its line buffers that fill whole cache lines)."""
    return _results.streams(out) or _results.streams_channels(out)


def _corr(eng: Engine, plan: CorrPlan, inp: np.ndarray, out: np.ndarray, weights,
          threads: int, stream: bool = False) -> None:
    """Run the corr kernel over every work item of ``plan`` (see engine.cpp);
    ``stream``: ``out`` may be written with streaming stores (``_results.streams``)."""
    if not len(plan.items):
        return
    warr, *steps = weights
    prob = _corr_problem(plan, inp, out, warr.ctypes.data, steps, stream)
    pp = ctypes.addressof(prob)

    n = len(plan.items)
    need = int(eng.lib.cg_corr_scratch(pp, 0, n))
    _shared(eng, "cg_corr_run_shared", (pp,), (n,), n, threads, need)
    del prob


def fwd(x: np.ndarray, w: np.ndarray, geom: ConvGeometry, out_dtype=None) -> np.ndarray:
    """Forward convolution: x (N, *L, C), w (*K, C/G, O) -> y (N, *M, O), float32 or
    ``out_dtype`` (float16/bfloat16: rounded once, as the result is stored)."""
    y = _alloc_like(x, geom.n, geom.out_sizes, geom.o, out_dtype or np.float32)
    return _corr_into("fwd", x, w, y, geom)


def dgrad(w: np.ndarray, dy: np.ndarray, geom: ConvGeometry, out_dtype=None) -> np.ndarray:
    """Data gradient: w (*K, C/G, O), dy (N, *M, O) -> dx (N, *L, C), float32 or
    ``out_dtype``, one stride phase at a time (see :func:`_corr_taps`)."""
    dx = _alloc_like(dy, geom.n, geom.in_sizes, geom.c, out_dtype or np.float32)
    return _corr_into("dgrad", dy, w, dx, geom)


def recompute_lines(kind: str, inp: np.ndarray, w: np.ndarray, out: np.ndarray,
                    geom: ConvGeometry, lines: np.ndarray) -> None:
    """Compute the output lines ``lines`` (numbered ``(n * M0 + m0) * M1 + m1`` over
    the result's leading axes) of a stride-1 forward (``inp`` = x) or data gradient
    (``inp`` = dy) into ``out``, leaving the other lines as they are: how a kernel
    that mixes its operands (Winograd) hands the lines where a NaN or Inf came out
    to the exact kernel (docs/decisions.md D17)."""
    assert all(s == 1 for s in geom.strides), "stride-1 problems only"
    _corr_into(kind, inp, w, out, geom, lines=np.asarray(lines, np.int64))


def _corr_into(kind: str, inp: np.ndarray, w: np.ndarray, out: np.ndarray, geom: ConvGeometry,
               lines: np.ndarray | None = None) -> np.ndarray:
    """The forward convolution (``kind="fwd"``: inp = x) or data gradient (inp = dy)
    into ``out``: every line, or only ``lines`` (stride 1)."""
    eng = engine()
    G, cg, og = geom.groups, geom.c // geom.groups, geom.o // geom.groups
    if out.size == 0:
        return out
    if inp.size == 0 or w.size == 0:
        out[...] = 0
        return out
    threads = _threads(geom.flops)
    if lines is None:
        cf = _channels_first_pointwise(geom, inp, out)
        if cf is not None:
            # fwd: y[n] (O, P) = w (O, C) @ x[n] (C, P); dgrad: dx[n] (C, P) = w^T (C, O)
            # @ dy[n] (O, P)
            ins, outs = cf
            w2 = _weights_2d(w)[0].T if kind == "fwd" else _weights_2d(w)[0]
            stream = (_results.recycled(out) and out.nbytes >= _results.STREAM_MIN_BYTES
                      and all(o.ctypes.data % 64 == 0 and o.strides[0] % 64 == 0 for o in outs))
            _transposed_pointwise(eng, lambda k: w2, lambda k: ins[k], outs, threads, stream)
            return out
        # (a recomputation of a few lines reads its input in place)
        inp = _stationary_input(inp, geom, kind, eng.vl)
    # (decided on the result itself: the flattened views below hide its memory's origin)
    stream = lines is None and _streams(out)
    if (lines is None and not (_is_packed(inp) or _is_packed(out))
            and geom.in_sizes[-1] < CORR_FLAT_BELOW):
        geom, (inp_f, out_f) = _pointwise(geom, inp, out)
    else:
        inp_f, out_f = inp, out
    plan = corr_plan(geom, kind, eng.vl, eng.rmax_of, threads, _is_packed(inp_f),
                     _out_buffered(out_f), _budgets(threads))
    if lines is not None:
        # runs of consecutive lines, every output block (one phase at stride 1)
        nob = int(plan.items[:, 4].max()) if len(plan.items) else 0
        cut = np.flatnonzero(np.diff(lines) != 1) + 1
        runs = [(0, int(r[0]), int(r[-1]) + 1, 0, nob) for r in np.split(lines, cut) if len(r)]
        plan = dataclasses.replace(plan, items=_i64(runs).reshape(-1, 5))
    w3 = _weights_2d(w)
    es = w3.itemsize
    rows, cols = (cg, og) if kind == "fwd" else (og, cg)
    srow, scol = (w3.strides[1] // es, w3.strides[2] // es)[::1 if kind == "fwd" else -1]
    # panel rows: the correlation's input channels of a group; columns: its outputs
    weights = _weights(eng, w3, rows, cols, srow, scol, og * (w3.strides[2] // es), G,
                       plan.nv, threads)
    _corr(eng, plan, inp_f, out_f, weights, threads, stream)
    return out


def _bound_weights(eng: Engine, w3: np.ndarray, A: int, B: int, sa: int, sb: int,
                   gstride: int, groups: int, nv: int, threads: int):
    """:func:`_weights` bound (``_bound``): ``(pack(w) -> (panels, address), steps)``,
    the packing's descriptor and task table made once."""
    T = w3.shape[0]
    blocks, *steps = _panel_steps(groups, T, A, B, nv * eng.vl)
    floats = blocks * steps[1]
    d = _i64([0, DTYPE_CODES[w3.dtype], T, A, B, w3.strides[0] // w3.itemsize, sa, sb,
              gstride, nv, 0])
    n = threads if floats * 4 > 2**20 else 1
    cuts = _pool.split(blocks, 4 * n) if n > 1 else [(0, blocks)]
    go = _bound.runner(eng.lib, _bound.task_table(
        eng.lib, "cg_pack_panels_task", [(d.ctypes.data, lo, hi) for lo, hi in cuts]), n)
    address = _bound.address

    def pack(w):
        panels = scratch("native-panels", (floats,), np.float32, zero=False)
        at = address(panels)
        d[0], d[10] = address(w), at
        go()
        return panels, at
    pack.keep = d
    return pack, steps


def _bind_corr(kind: str, inp: np.ndarray, w: np.ndarray, out: np.ndarray,
               geom: ConvGeometry, alloc):
    """:func:`_corr_into` bound (``_bound``) where it runs the corr kernel on the
    caller's arrays as they are (no channels-first 1x1 path, no stationary copy):
    plan, weight packing, descriptor and task table made once; a call packs the new
    weights and patches the data, result, panel and scratch addresses."""
    eng = engine()
    lib = eng.lib
    if out.size == 0 or inp.size == 0 or w.size == 0:
        return None
    threads = _threads(geom.flops)
    if _channels_first_pointwise(geom, inp, out) is not None:
        return _bind_transposed_pointwise(kind, inp, w, out, geom, alloc) if BIND_PW else None
    if _stationary_input(inp, geom, kind, eng.vl) is not inp:
        return None
    address = _bound.address
    inp_f, out_f = inp, out
    if not (_is_packed(inp) or _is_packed(out)) and geom.in_sizes[-1] < CORR_FLAT_BELOW:
        geom, (inp_f, out_f) = _pointwise(geom, inp, out)
        if address(inp_f) != address(inp) or address(out_f) != address(out):
            return None
    plan = corr_plan(geom, kind, eng.vl, eng.rmax_of, threads, _is_packed(inp_f),
                     _out_buffered(out_f), _budgets(threads))
    w3 = _weights_2d(w)
    if not len(plan.items) or address(w3) != address(w):
        return None
    G, cg, og = geom.groups, geom.c // geom.groups, geom.o // geom.groups
    es = w3.itemsize
    rows, cols = (cg, og) if kind == "fwd" else (og, cg)
    srow, scol = (w3.strides[1] // es, w3.strides[2] // es)[::1 if kind == "fwd" else -1]
    pack, steps = _bound_weights(eng, w3, rows, cols, srow, scol,
                                 og * (w3.strides[2] // es), G, plan.nv, threads)
    prob = _corr_problem(plan, inp_f, out_f, 0, steps, False)
    pp = ctypes.addressof(prob)
    n_items = len(plan.items)
    need = int(lib.cg_corr_scratch(pp, 0, n_items))
    counter = np.zeros(1, np.int64)
    n = max(1, min(threads, n_items))
    per = _pool.scratch_bytes(need)
    corr = _bound.runner(lib, _bound.task_table(
        lib, "cg_corr_run_shared", [(pp, counter.ctypes.data, n_items)] * n), n, per)
    streams, thread_scratch = _streams, _pool.thread_scratch

    def run(w, inp):
        out = alloc()
        panels, at = pack(w)
        prob.inp.ptr, prob.out, prob.wpk = address(inp), address(out), at
        prob.stream = streams(out)
        counter[0] = 0
        buf, (base, _) = thread_scratch("native-pack", need, n)
        corr(base)
        del buf, panels
        return out
    run.keep = (prob, counter, plan)
    return _bound.guarded(run)


def bind(op: str):
    """The kernel's ``bind`` for ``op`` (``_bound``): the corr kernel's forward and data
    gradients on the caller's arrays, the wgrad kernel's weight gradients; None where
    another path runs."""
    if op == "wgrad":
        return lambda x, dy, geom, out_dtype=None, result_layout=None: _bind_wgrad(
            x, dy, geom, result_layout, out_dtype)
    return corr_binder(op, _bind_corr) if op in ("fwd", "dgrad") else None


def corr_binder(op: str, bind_corr):
    """A kernel's ``bind`` for a forward (``op="fwd"``: a, b = x, w) or data gradient
    (a, b = w, dy) from ``bind_corr(op, inp, w, out, geom, alloc)``, which binds the
    correlation of ``inp`` into a sample result ``out`` made by ``alloc`` (and returns
    ``run(w, inp)``, or None)."""
    def bind_corr_op(a, b, geom, out_dtype=None):
        dtype = out_dtype or np.float32
        if op == "fwd":
            inp, w, sizes, ch = a, b, geom.out_sizes, geom.o
        else:
            w, inp, sizes, ch = a, b, geom.in_sizes, geom.c
        alloc = allocator(inp, geom.n, sizes, ch, dtype)
        bound = bind_corr(op, inp, w, alloc(), geom, alloc)
        if bound is None or op == "dgrad":
            return bound
        return lambda x, w: bound(w, x)
    return bind_corr_op


@dataclass(frozen=True)
class WgradPlan:
    nv: int
    chunk: int            # positions per packed chunk
    items: np.ndarray     # per item: first and end output line (numbered over n, d, h)
    split_outputs: bool   # threads split the output channels (else the positions)
    chunks: int           # position chunks with partial gradients (not split_outputs)
    nblocks: int          # output blocks over all groups


@functools.lru_cache(maxsize=256)
def wgrad_plan(geom: ConvGeometry, vl: int, mr_of: tuple, consts: tuple) -> WgradPlan:
    """The work decomposition of a weight gradient (pure, cached).  Results do not
    depend on the thread count: either every output block sums all positions in
    order (split over the output channels), or the positions are cut into
    ``chunks`` chunks, one partial gradient each, summed in chunk order.  Work
    items are ranges of output lines, a chunk of positions or more each."""
    panel_bytes, min_chunk, max_chunk, nchunks, partials_bytes = consts
    G, cg, og = geom.groups, geom.c // geom.groups, geom.o // geom.groups
    nv = _nv_for(og, vl)
    nb, mr = nv * vl, mr_of[nv - 1]
    m3 = _pad3(geom.out_sizes, 1)
    # positions per packed chunk: its panels (x rows and dy rows of the chunk)
    per_position = 4 * G * (-(-cg // mr) * mr + -(-og // nb) * nb)
    chunk = max(min_chunk, min(max_chunk, panel_bytes // per_position))
    lines = geom.n * m3[0] * m3[1]
    nblocks = G * -(-og // nb)
    chunks = max(1, min(lines, nchunks))
    dw_bytes = 4 * math.prod(geom.kernel) * cg * geom.o
    split_outputs = dw_bytes * chunks > partials_bytes and nblocks >= 2
    band = max(1, -(-chunk // max(1, m3[2])))
    if not split_outputs:
        band = max(1, min(band, lines // chunks))
    if not split_outputs and WGRAD_EVEN_CHUNKS and chunks > 1:
        # the same number of items in every chunk (a task each, from a shared counter),
        # the chunks' lines near-equal: ResNet-50 res3 stride 2's 224 lines had made 12
        # items of 19 lines in chunks of 1 or 2 items (a thread idle for up to 2 of its 6
        # at the end), res2 1x1's 448 made 45 in chunks of 5 or 6; now 16 and 48
        n_items = -(-lines // band)
        per = -(-n_items // chunks)
        items = _i64([(lo + a, lo + b) for lo, hi in _pool.split(lines, chunks)
                      for a, b in _pool.split(hi - lo, per)]).reshape(-1, 2)
    else:
        items = _i64([(lo, min(lines, lo + band))
                      for lo in range(0, lines, band)]).reshape(-1, 2)
    items.setflags(write=False)
    return WgradPlan(nv, chunk, items, split_outputs, min(chunks, len(items)), nblocks)


def _pointwise_parts(geom: ConvGeometry, threads: int) -> tuple[int, int]:
    """Partial gradients :func:`_pointwise_wgrad` keeps at once (at least one per thread,
    more within the partials budget) and the bytes of each (its columns rounded up to
    the widest block of any build)."""
    part = 4 * max(geom.c, geom.o) * -(-min(geom.c, geom.o) // 32) * 32
    return max(threads, _budgets(threads)[3] // part), part


def _wgrad_grid(kw: int, ntap: int, nblocks: int, threads: int) -> list[tuple]:
    """Tasks of a weight gradient split by outputs: rows of Kw taps (one (kd, kh) each:
    a task's taps read the same x rows) x equal ranges of output blocks, at least
    WGRAD_TASKS_PER_THREAD a thread where the blocks allow, row by row."""
    rows = ntap // kw
    target = WGRAD_TASKS_PER_THREAD * threads
    q = next((d for d in range(1, nblocks + 1) if nblocks % d == 0 and rows * d >= target),
             nblocks)
    return [(r * kw, (r + 1) * kw, b * nblocks // q, (b + 1) * nblocks // q)
            for r in range(rows) for b in range(q)]


def _pointwise_wgrad(x3: np.ndarray, dy3: np.ndarray, geom: ConvGeometry, shape) -> np.ndarray:
    """The weight gradient (``shape``) of a 1x1, stride-1, unpadded, one-group problem on
    channels-first memory, from (N, P, C) and (N, P, O) views whose positions are
    contiguous: engine.cpp's cg_pw_run on fixed position ranges (at least
    POINTWISE_PARTS over all samples, a few chunks each), one partial gradient each,
    summed in order, so results never depend on the thread count; one call of its bound
    form (:func:`_bind_pointwise_wgrad`)."""
    return _bind_pointwise_wgrad(x3, dy3, geom, shape)(x3, dy3)


def _pointwise_kernel_takes(dtype) -> bool:
    """Whether cg_pw_run computes a channels-first 1x1 weight gradient in this dtype."""
    return POINTWISE_KERNEL and (dtype == np.float32 or (POINTWISE_16BIT and dtype in DTYPE_CODES))


def _channels_first(a: np.ndarray, dtypes=(np.float32,)) -> bool:
    """An (N, *S, C) view of channels-first memory in one of ``dtypes``: w contiguous,
    channels not."""
    return (a.dtype in dtypes and a.ndim >= 3 and a.strides[-2] == a.itemsize
            and a.strides[-1] != a.itemsize and a.shape[-2] > 1)


def _pixels(a: np.ndarray) -> bool:
    """An (N, *S, C) view whose pixels are runs of C contiguous channels."""
    return a.ndim >= 3 and a.strides[-1] == a.itemsize and a.strides[-2] == a.shape[-1] * a.itemsize


def _cf_few_channels(geom: ConvGeometry) -> bool:
    """Whether a one-group weight gradient has fewer input channels than
    :func:`_cf_wgrad`'s tile has rows (several w taps then share a tile; channels-last
    memory takes it too, ``CF_WGRAD_FEW_CHANNELS``)."""
    if not CF_WGRAD_FEW_CHANNELS or available() is not None:
        return False
    eng = engine()
    return geom.c < int(eng.lib.cg_cfw_mr(_nv_for(geom.o, eng.vl)))


def _cf_wgrad_takes(x: np.ndarray, dy: np.ndarray, geom: ConvGeometry) -> bool:
    """Whether x and dy are memory :func:`_cf_wgrad` reads: one dtype (float32, or
    float16 / bfloat16, widened in its scratch), channels-first, or channels-last pixels
    where the input channels are few (:func:`_cf_few_channels`)."""
    dtypes = DTYPE_CODES if CF_WGRAD_16BIT else (np.float32,)
    if x.dtype != dy.dtype or x.dtype not in dtypes:
        return False
    return (all(_channels_first(a, dtypes) for a in (x, dy))
            or (_pixels(x) and _pixels(dy) and _cf_few_channels(geom)))


def _cf_wgrad_layouts(call) -> bool:
    """:func:`_cf_wgrad_takes` for a weight gradient's description (its inputs' dtypes
    and possible layouts, no arrays)."""
    dtypes = DTYPE_CODES if CF_WGRAD_16BIT else (np.float32,)
    if call.a.dtype != call.b.dtype or call.a.dtype not in dtypes:
        return False
    ops = (call.a, call.b)
    return (all("nxc" not in d.layouts and "ncx" in d.layouts for d in ops)
            or (all("nxc" in d.layouts for d in ops) and _cf_few_channels(call.geom)))


def _cf_wgrad_fits(geom: ConvGeometry) -> bool:
    """Whether :func:`_cf_wgrad` takes a problem: its line ranges' partial gradients fit
    the partials budget (tasks then come from a shared counter, several per thread).
    Otherwise it would give each thread one range of output blocks, and after the
    benchmark's pause a worker that wakes late leaves the caller its whole range to wait
    for: ResNet-50 res5 and DCGAN ran 1.2-1.3x slower than the conversion path then."""
    dw_bytes = 4 * math.prod(geom.kernel) * geom.c * geom.o
    return dw_bytes * _cf_wgrad_chunks(geom) <= _budgets(_threads(geom.flops))[3]


def _cf_wgrad_chunks(geom: ConvGeometry) -> int:
    """The line ranges (one partial gradient each) :func:`_cf_wgrad` cuts a call into."""
    m3 = _pad3(geom.out_sizes, 1)
    return max(1, min(geom.n * m3[0] * m3[1], WGRAD_CHUNKS))


def _cfw_strides(a: np.ndarray, r: int) -> tuple:
    """cg_cfw_run's strides of an (N, *S, C) view of rank r: n, c, d, h (elements;
    leading spatial axes of size 1: 0)."""
    st = [v // a.itemsize for v in a.strides]
    return (st[0], st[-1], *([0] * (3 - r) + st[1:r + 1])[:2])


def _w_step(a: np.ndarray) -> int:
    """Its w stride in elements: 1 for channels-first memory, C for channels-last pixels."""
    return a.strides[-2] // a.itemsize


def _cf_wgrad(eng: Engine, x: np.ndarray, dy: np.ndarray, geom: ConvGeometry, dw: np.ndarray,
              threads: int) -> None:
    """The weight gradient of a one-group problem on channels-first memory (or
    channels-last pixels of few input channels: :func:`_cf_wgrad_takes`) into ``dw``
    (*K, C, O), or a transposed view of OIX memory (:func:`_cf_oix`), by engine.cpp's
    neighbour cfwgrad.cpp (cg_cfw_run): x read in place as the tile's broadcasts (16-bit
    rows widened first), dy transposed into panels.  Results never depend on the thread count:
    the lines are cut into a fixed number of ranges (WGRAD_CHUNKS), one partial
    gradient each (:func:`_cf_wgrad_fits`), summed in order."""
    oix = not dw.flags.c_contiguous
    r = geom.spatial_rank
    k3, s3, d3, p3 = (_pad3(geom.kernel, 1), _pad3(geom.strides, 1), _pad3(geom.dilations, 1),
                      _pad3(geom.pads_begin, 0))
    l3, m3 = _pad3(geom.in_sizes, 1), _pad3(geom.out_sizes, 1)

    nv = _nv_for(geom.o, eng.vl)
    nb = nv * eng.vl
    nob = -(-geom.o // nb)
    lines = geom.n * m3[0] * m3[1]
    panel_lines = max(1, CFW_PANEL_FLOATS // (m3[2] * nob * nb))
    chunks = _cf_wgrad_chunks(geom)
    parts = None
    # (each task zeroes the gradient or partial it adds into first)
    if chunks == 1:
        tasks = [(0, lines, 0, nob, dw.ctypes.data)]
    else:
        parts = scratch("native-partials", (chunks, dw.size), np.float32, zero=False)
        tasks = [(lo, hi, 0, nob, parts[i].ctypes.data)
                 for i, (lo, hi) in enumerate(_pool.split(lines, chunks))]
    table = _i64(tasks).reshape(-1, 5)
    prob = _Cfw(x.ctypes.data, dy.ctypes.data, (_I64 * 4)(*_cfw_strides(x, r)),
                (_I64 * 4)(*_cfw_strides(dy, r)), geom.n, geom.c, geom.o, (_I64 * 3)(*l3),
                (_I64 * 3)(*m3), (_I64 * 3)(*k3), (_I64 * 3)(*s3), (_I64 * 3)(*d3),
                (_I64 * 3)(*p3), nv, panel_lines, table.ctypes.data, DTYPE_CODES[x.dtype],
                _w_step(x), _w_step(dy))
    pp = ctypes.addressof(prob)
    n = min(threads, len(tasks))
    buf, per_thread = _pool.thread_scratch("native-pack", int(eng.lib.cg_cfw_scratch(pp)), n)
    _pool.run_native(eng.lib, "cg_cfw_run", [(pp, k) for k in range(len(tasks))], n,
                     per_thread)
    if parts is not None and oix:
        _bind_sum_parts(eng.lib, dw.size, chunks, threads, geom)(parts.ctypes.data,
                                                                 dw.ctypes.data)
    elif parts is not None:
        _sum_parts(eng, parts, dw, threads)
    del prob, buf, table


def _cf_oix(geom: ConvGeometry, result_layout) -> bool:
    """Whether the channels-first weight gradient writes the OIX memory of a caller who
    keeps OIX (``result_layout="ncx"``): where it sums partial gradients, their sum
    stores OIX rows (cg_sum_parts_oix), in place of a permuted copy of dw
    afterwards (CF_WGRAD_OIX)."""
    return CF_WGRAD_OIX and result_layout == "ncx" and _cf_wgrad_chunks(geom) > 1


def wgrad(x: np.ndarray, dy: np.ndarray, geom: ConvGeometry, result_layout=None,
          out_dtype=None) -> np.ndarray:
    """Weight gradient: x (N, *L, C), dy (N, *M, O) -> dw (*K, C/G, O) float32; with
    ``result_layout="ncx"`` (a caller who keeps OIX) its memory may be OIX (the
    returned array then a transposed view of it); with ``out_dtype`` (float16 /
    bfloat16) dw may come in it, where the tasks stream their dw rows
    (:func:`_streamed_dtype`)."""
    eng = engine()
    G, cg = geom.groups, geom.c // geom.groups
    shape = (*geom.kernel, cg, geom.o)
    if math.prod(shape) == 0 or x.size == 0 or dy.size == 0:
        return _results.zeros(shape, np.float32)
    # (the kernels' tasks zero the parts they add into, in parallel, just before: a
    # separate zeroing pass over a 9.4 MB gradient took 3 ms after the benchmark's pause)
    threads = _threads(geom.flops)
    if (CF_WGRAD and G == 1 and _cf_wgrad_takes(x, dy, geom)
            and not (_plain_pointwise(geom) and POINTWISE_KERNEL) and _cf_wgrad_fits(geom)):
        if _cf_oix(geom, result_layout):
            oix = _results.empty((geom.o, cg, *geom.kernel), np.float32)
            result = oix.transpose(_OIX_AS_XIO[oix.ndim])
        else:
            result = _results.empty(shape, np.float32)
        _cf_wgrad(eng, x, dy, geom, result, threads)
        return result
    x, dy = (_stationary_input(a, geom, "wgrad", eng.vl) for a in (x, dy))
    cf = _channels_first_pointwise(geom, x, dy)
    if cf is not None and x.dtype == dy.dtype and _pointwise_kernel_takes(x.dtype):
        return _pointwise_wgrad(cf[0].swapaxes(1, 2), cf[1].swapaxes(1, 2), geom, shape)
    if cf is not None:
        # dw^T (O, C) = sum over n, in order, of dy[n] (O, P) @ x[n]^T (P, C): a block
        # of one sample per thread at a time, so the sums never depend on threads
        xs, dys = cf
        acc = np.zeros((geom.o, geom.c), np.float32)
        parts = np.empty((min(threads, geom.n), geom.o, geom.c), np.float32)
        for n0 in range(0, geom.n, len(parts)):
            k = min(len(parts), geom.n - n0)
            _transposed_pointwise(eng, lambda j, n0=n0: dys[n0 + j],
                                  lambda j, n0=n0: xs[n0 + j].T,
                                  parts[:k], threads)
            for j in range(k):
                acc += parts[j]
        return acc.T.reshape(shape)
    if not (_is_packed(x) or _is_packed(dy)):     # (converted lines stay short)
        geom, (x, dy) = _pointwise(geom, x, dy)
    plan, prob = _wgrad_problem(eng, x, dy, geom, threads)
    nitems = len(plan.items)
    pp = ctypes.addressof(prob)
    tasks, prob.part, oix = _kernel_tasks(plan, geom, _is_packed(x) or _is_packed(dy), threads,
                                          eng.vl, result_layout)
    prob.oix = int(oix)
    result = _results.empty((geom.o, cg, *geom.kernel) if oix else shape,
                            _streamed_dtype(prob, out_dtype))
    if plan.split_outputs or plan.chunks == 1:
        tasks = [(*t, result.ctypes.data) for t in tasks]
    else:
        parts = scratch("native-partials", (plan.chunks, result.size), np.float32, zero=False)
        tasks = [(*t, parts[i].ctypes.data) for i, t in enumerate(tasks)]
    tasks_a = _i64(tasks)
    need = int(eng.lib.cg_wgrad_scratch(pp, 0, nitems))
    _shared(eng, "cg_wgrad_run_shared", (pp,), (len(tasks), tasks_a.ctypes.data), len(tasks),
            threads, need)
    if not plan.split_outputs and plan.chunks > 1:
        _sum_parts(eng, parts, result, threads)
    del prob
    return result.transpose(_OIX_AS_XIO[result.ndim]) if oix else result


def _streamed_dtype(prob: _Wgrad, out_dtype) -> np.dtype:
    """The dtype of the wgrad kernel's result, set in ``prob``: ``out_dtype`` (float16 or
    bfloat16) where its tasks stream their dw rows (``prob.part`` without ``prob.oix``:
    each sum, complete in scratch, rounded once as it is stored, so the result equals
    the float32 one narrowed; ResNet-50 res5's 16-bit weight gradient skipped a
    narrowing pass over 9.4 MB of float32 dw), else float32."""
    dtype = np.dtype(np.float32)
    if (out_dtype is not None and prob.part > 0 and not prob.oix
            and np.dtype(out_dtype) in DTYPE_CODES):
        dtype = np.dtype(out_dtype)
    prob.out_dtype = DTYPE_CODES[dtype]
    return dtype


def _part_bytes(call) -> tuple[int, bool]:
    """The bytes the threads of a weight gradient's wgrad kernel sum at once in scratch,
    and whether they are parts of an OIX result the tasks write (:func:`_oix_tasks`), else
    of dw they stream (:func:`_stream_part`); (0, False) without parts."""
    g = call.geom
    if available() is not None:
        return 0, False
    if g.groups > 1 or (_cf_wgrad_layouts(call) and CF_WGRAD and not _plain_pointwise(g)
                        and _cf_wgrad_fits(g)):
        return 0, False                             # (the channels-first kernel runs)
    in_place = all((d.dtype == np.float32 and "nxc" in d.layouts) or _small_wgrad_inputs(g)
                   for d in (call.a, call.b))
    eng, threads = engine(), _threads(g.flops)
    tasks, part, oix = _kernel_tasks(
        _wgrad_plan_of(eng, g, threads), g, not in_place, threads, eng.vl,
        "ncx" if call.out.layouts == frozenset({"ncx"}) else None)
    return 4 * part * min(threads, len(tasks)), oix


# an OIX array (O, C, *K) seen as (*K, C, O), by its rank
_OIX_AS_XIO = {r: (*range(2, r), 1, 0) for r in range(3, 6)}


def _kernel_tasks(plan: WgradPlan, geom: ConvGeometry, packed: bool, threads: int, vl: int,
                  result_layout) -> tuple[list[tuple], int, bool]:
    """The wgrad kernel's tasks (:func:`_oix_tasks`, else :func:`_wgrad_tasks`), the floats
    of the largest task's part in scratch (0: none) and whether it writes an OIX result;
    ``packed``: x or dy converted as read (:func:`_is_packed`)."""
    tasks, part = _oix_tasks(plan, geom, not packed, threads, vl, result_layout)
    if part:
        return tasks, part, True
    tasks = _wgrad_tasks(plan, geom, packed, threads)
    return tasks, _stream_part(plan, geom, tasks, vl), False


def _oix_tasks(plan: WgradPlan, geom: ConvGeometry, in_place: bool, threads: int, vl: int,
               result_layout) -> tuple[list[tuple], int]:
    """The wgrad kernel's tasks where they write an OIX result themselves, and the floats
    of the largest task's part (WGRAD_OIX: a caller who keeps OIX, one group, tasks
    split by outputs, ``in_place``: x and dy read as they are): every tap of a range of
    output blocks a task, so that each task writes whole OIX rows; the fewest equal
    ranges of at least WGRAD_TASKS_PER_THREAD a thread where the blocks allow, whose
    parts stay within WGRAD_OIX_PART_BYTES and 5/8 of the L2.  Else ([], 0)."""
    ntap = math.prod(geom.kernel)
    if not (WGRAD_OIX and result_layout == "ncx" and geom.groups == 1 and plan.split_outputs
            and ntap >= 2 and in_place):
        return [], 0
    # the grid of one row of every tap: its block ranges
    tasks = [(0, len(plan.items), b0, b1, t0, t1)
             for t0, t1, b0, b1 in _wgrad_grid(ntap, ntap, plan.nblocks, threads)]
    part = ntap * geom.c * max(b1 - b0 for _, _, b0, b1, _, _ in tasks) * plan.nv * vl
    return (tasks, part) if _part_fits(part, WGRAD_OIX_PART_L2) else ([], 0)


def _part_fits(floats: int, l2_share: float) -> bool:
    """Whether a task's part of the gradient, summed in scratch, stays within
    WGRAD_OIX_PART_BYTES and ``l2_share`` of a core's L2."""
    return 4 * floats <= min(WGRAD_OIX_PART_BYTES, int(l2_bytes() * l2_share))


def _stream_part(plan: WgradPlan, geom: ConvGeometry, tasks: list, vl: int) -> int:
    """The floats of the largest part of the wgrad kernel's ``tasks`` (lo, hi, b0, b1,
    t0, t1) where each sums its part in scratch and streams its dw rows into a (*K, C, O)
    result (WGRAD_STREAM: one group, tasks split by outputs, a result of at least
    WGRAD_STREAM_MIN_BYTES, parts within WGRAD_OIX_PART_BYTES and WGRAD_STREAM_PART_L2
    of the L2); else 0."""
    if not (WGRAD_STREAM and geom.groups == 1 and plan.split_outputs and tasks
            and 4 * math.prod(geom.kernel) * geom.c * geom.o >= WGRAD_STREAM_MIN_BYTES):
        return 0
    part = max((t[5] - t[4]) * geom.c * (t[3] - t[2]) for t in tasks) * plan.nv * vl
    return part if _part_fits(part, WGRAD_STREAM_PART_L2) else 0


def _bind_sum_parts(lib, size: int, chunks: int, threads: int, oix: ConvGeometry = None):
    """:func:`_sum_parts` of ``chunks`` partials of ``size`` floats bound: ``add(parts
    address, out address)``; with ``oix`` (the geometry of a one-group weight gradient,
    partials (*K, C, O)) the sums are stored as its OIX result (cg_sum_parts_oix, ranges
    of channels whose rows of every tap take at most SUM_OIX_BYTES of a thread's
    buffer)."""
    if oix is None:
        sums = _PartsSum(None, chunks, size, None)
        blocks = -(-size // SUM_BLOCK)
        st = max(1, min(threads, blocks))
        ranges = [(lo * SUM_BLOCK, min(size, hi * SUM_BLOCK)) for lo, hi in
                  (_pool.split(blocks, 4 * st) if st > 1 else [(0, blocks)])]
        fn, top = "cg_sum_parts", sums
    else:
        T, c, o = math.prod(oix.kernel), oix.c, oix.o
        top = _PartsSumOix(_PartsSum(None, chunks, size, None), T, c, o)
        sums = top.sum
        per = max(1, SUM_OIX_BYTES // (4 * T * o))
        st = max(1, min(threads, c))
        ranges = _pool.split(c, min(c, max(4 * st if st > 1 else 1, -(-c // per))))
        fn = "cg_sum_parts_oix"
    go = _bound.runner(lib, _bound.task_table(
        lib, fn, [(ctypes.addressof(top), lo, hi) for lo, hi in ranges]), st)

    def add(parts_at: int, out_at: int) -> None:
        sums.parts, sums.out = parts_at, out_at
        go()
    add.keep = top
    return add


def _bind_cf_wgrad(x: np.ndarray, dy: np.ndarray, geom: ConvGeometry, shape,
                   result_layout=None):
    """:func:`_cf_wgrad` bound (``_bound``): descriptor, task table and the partials' sum
    made once; a call patches x, dy, the result and the partials' address."""
    eng = engine()
    lib = eng.lib
    threads = _threads(geom.flops)
    r = geom.spatial_rank
    k3, s3, d3, p3 = (_pad3(geom.kernel, 1), _pad3(geom.strides, 1), _pad3(geom.dilations, 1),
                      _pad3(geom.pads_begin, 0))
    l3, m3 = _pad3(geom.in_sizes, 1), _pad3(geom.out_sizes, 1)
    nv = _nv_for(geom.o, eng.vl)
    nob = -(-geom.o // (nv * eng.vl))
    lines = geom.n * m3[0] * m3[1]
    panel_lines = max(1, CFW_PANEL_FLOATS // (m3[2] * nob * nv * eng.vl))
    chunks = _cf_wgrad_chunks(geom)
    size = math.prod(shape)
    cuts = [(0, lines)] if chunks == 1 else _pool.split(lines, chunks)
    table = _i64([(lo, hi, 0, nob, 0) for lo, hi in cuts]).reshape(-1, 5)
    offs = np.arange(len(cuts), dtype=np.int64) * (4 * size)
    prob = _Cfw(None, None, (_I64 * 4)(*_cfw_strides(x, r)), (_I64 * 4)(*_cfw_strides(dy, r)),
                geom.n,
                geom.c, geom.o, (_I64 * 3)(*l3), (_I64 * 3)(*m3), (_I64 * 3)(*k3),
                (_I64 * 3)(*s3), (_I64 * 3)(*d3), (_I64 * 3)(*p3), nv, panel_lines,
                table.ctypes.data, DTYPE_CODES[x.dtype], _w_step(x), _w_step(dy))
    pp = ctypes.addressof(prob)
    n = min(threads, len(cuts))
    need = int(lib.cg_cfw_scratch(pp))
    per = _pool.scratch_bytes(need)
    go = _bound.runner(lib, _bound.task_table(lib, "cg_cfw_run",
                                              [(pp, k) for k in range(len(cuts))]), n, per)
    oix = _cf_oix(geom, result_layout)
    add = (_bind_sum_parts(lib, size, chunks, threads, geom if oix else None)
           if chunks > 1 else None)
    empty, address, thread_scratch = _results.empty, _bound.address, _pool.thread_scratch
    oix_shape, as_xio = (geom.o, geom.c, *geom.kernel), _OIX_AS_XIO.get(len(shape))

    def run(x, dy):
        if oix:
            mem = empty(oix_shape, np.float32)
            dw, at = mem.transpose(as_xio), address(mem)
        else:
            dw = empty(shape, np.float32)
            at = address(dw)
        prob.x, prob.dy = address(x), address(dy)
        if add is not None:
            parts = scratch("native-partials", (chunks, size), np.float32, zero=False)
            table[:, 4] = offs + address(parts)
        else:
            table[:, 4] = at
        buf, (base, _) = thread_scratch("native-pack", need, n)
        go(base)
        del buf
        if add is not None:
            add(address(parts), at)
        return dw
    run.keep = (prob, table)
    bound = _bound.guarded(run)
    bound.sums = chunks                                # (what the tests look at)
    return bound


def _bind_pointwise_wgrad(x3: np.ndarray, dy3: np.ndarray, geom: ConvGeometry, shape):
    """:func:`_pointwise_wgrad` (on the (N, P, C) / (N, P, O) views of channels-first
    memory) bound (``_bound``): descriptor, position ranges and one task table per round
    made once; a call patches x, dy and the partials' address and adds the partials in
    the same order."""
    eng = engine()
    lib = eng.lib
    threads = _threads(geom.flops)
    n, p, c = x3.shape
    o = dy3.shape[2]
    # b, the vector operand, is transposed into panels: the one with fewer channels;
    # a, the broadcasts, is read in place
    b_is_x = c <= o
    a3, b3 = (dy3, x3) if b_is_x else (x3, dy3)
    A, B = a3.shape[2], b3.shape[2]
    nb = int(lib.cg_pw_nb())
    bpad = -(-B // nb) * nb
    es = a3.itemsize
    prob = _Pw(None, None, a3.strides[0] // es, a3.strides[2] // es, b3.strides[0] // es,
               b3.strides[2] // es, A, B, bpad, None, DTYPE_CODES[a3.dtype])
    kc = int(lib.cg_pw_chunk(ctypes.addressof(prob)))
    chunks = -(-p // kc)
    q = max(1, min(-(-POINTWISE_PARTS // n), chunks // 2))
    tasks = [(s, min(p, kc * (chunks * i // q)), min(p, kc * (chunks * (i + 1) // q)))
             for s in range(n) for i in range(q)]
    slots = min(len(tasks), _pointwise_parts(geom, threads)[0])
    table = _i64([(*t, 0) for t in tasks]).reshape(-1, 4)
    offs = np.array([(j % slots) * A * bpad * 4 for j in range(len(tasks))], np.int64)
    prob.tasks = table.ctypes.data
    pp = ctypes.addressof(prob)
    need = int(lib.cg_pw_scratch(pp))
    per = _pool.scratch_bytes(need)
    nthreads = min(threads, slots)
    rounds = []
    for r0 in range(0, len(tasks), slots):
        m = min(slots, len(tasks) - r0)
        rounds.append((m, _bound.runner(lib, _bound.task_table(
            lib, "cg_pw_run", [(pp, r0 + j) for j in range(m)]), min(threads, m), per)))
    address, thread_scratch, parts_at = _bound.address, _pool.thread_scratch, [None]

    def run(x, dy):
        a, b = (dy, x) if b_is_x else (x, dy)
        prob.a, prob.b = address(a), address(b)
        parts = scratch("native-pw-parts", (slots, A, bpad), np.float32, zero=False)
        at = address(parts)
        if at != parts_at[0]:
            table[:, 3] = offs + at
            parts_at[0] = at
        acc = np.zeros((A, bpad), np.float32)
        buf, (base, _) = thread_scratch("native-pack", need, nthreads)
        for m, go in rounds:
            go(base)
            with np.errstate(invalid="ignore", over="ignore"):     # (Inf - Inf: NaN, D17)
                for j in range(m):
                    acc += parts[j]
        del buf
        return (acc[:, :B].T if b_is_x else acc[:, :B]).reshape(shape)
    run.keep = (prob, table)
    return _bound.guarded(run)


def _bind_wgrad(x: np.ndarray, dy: np.ndarray, geom: ConvGeometry, result_layout=None,
                out_dtype=None):
    """:func:`wgrad` bound (``_bound``) where it runs the wgrad kernel (not the
    channels-first or 1x1 paths): plan, descriptor, tasks and the partials' sum made
    once; a call makes the inputs' stationary copies where :func:`wgrad` makes them and
    patches the data, result, partials and scratch addresses."""
    eng = engine()
    lib = eng.lib
    G, cg = geom.groups, geom.c // geom.groups
    shape = (*geom.kernel, cg, geom.o)
    if math.prod(shape) == 0 or x.size == 0 or dy.size == 0:
        return None
    threads = _threads(geom.flops)
    if (CF_WGRAD and G == 1 and _cf_wgrad_takes(x, dy, geom)
            and not (_plain_pointwise(geom) and POINTWISE_KERNEL) and _cf_wgrad_fits(geom)):
        return _bind_cf_wgrad(x, dy, geom, shape, result_layout)
    geom0 = geom
    xs, dys = (_stationary_input(a, geom, "wgrad", eng.vl) for a in (x, dy))
    copied = (xs is not x, dys is not dy)
    cf = _channels_first_pointwise(geom, xs, dys)
    if cf is not None:
        if xs.dtype == dys.dtype and _pointwise_kernel_takes(xs.dtype) and not any(copied):
            return _bind_pointwise_wgrad(cf[0].swapaxes(1, 2), cf[1].swapaxes(1, 2), geom,
                                         shape)
        return None
    address = _bound.address
    if not (_is_packed(xs) or _is_packed(dys)):
        geom, (xf, dyf) = _pointwise(geom, xs, dys)
        if address(xf) != address(xs) or address(dyf) != address(dys):
            return None
        xs, dys = xf, dyf
    plan, prob = _wgrad_problem(eng, xs, dys, geom, threads)
    nitems = len(plan.items)
    pp = ctypes.addressof(prob)
    tasks, prob.part, oix = _kernel_tasks(plan, geom, _is_packed(xs) or _is_packed(dys),
                                          threads, eng.vl, result_layout)
    prob.oix = int(oix)
    dtype = _streamed_dtype(prob, out_dtype)
    if oix:
        shape = (geom.o, cg, *geom.kernel)
    xio = _OIX_AS_XIO[len(shape)] if oix else None
    tasks = _i64([(*t, 0) for t in tasks]).reshape(-1, 7)
    size = math.prod(shape)
    partials = not (plan.split_outputs or plan.chunks == 1)
    offs = np.arange(len(tasks), dtype=np.int64) * (4 * size) if partials else 0
    need = int(lib.cg_wgrad_scratch(pp, 0, nitems))
    counter = np.zeros(1, np.int64)
    n = max(1, min(threads, len(tasks)))
    per = _pool.scratch_bytes(need)
    kernel = _bound.runner(lib, _bound.task_table(
        lib, "cg_wgrad_run_shared", [(pp, counter.ctypes.data, len(tasks), tasks.ctypes.data)]
        * n), n, per)
    add = _bind_sum_parts(lib, size, plan.chunks, threads) if partials else None
    stationary, vl = _stationary_input, eng.vl
    empty, thread_scratch = _results.empty, _pool.thread_scratch

    def run(x, dy):
        if copied[0]:
            x = stationary(x, geom0, "wgrad", vl)
        if copied[1]:
            dy = stationary(dy, geom0, "wgrad", vl)
        result = empty(shape, dtype)
        prob.x.ptr, prob.dy.ptr = address(x), address(dy)
        counter[0] = 0
        if partials:
            parts = scratch("native-partials", (plan.chunks, size), np.float32, zero=False)
            at = address(parts)
            tasks[:, 6] = offs + at
        else:
            tasks[:, 6] = address(result)
        buf, (base, _) = thread_scratch("native-pack", need, n)
        kernel(base)
        del buf
        if partials:
            add(at, address(result))
        return result if xio is None else result.transpose(xio)
    run.keep = (prob, tasks, counter, plan)
    bound = _bound.guarded(run)
    bound.partials, bound.copied = partials, copied        # (what the tests look at)
    return bound


def _wgrad_plan_of(eng: Engine, geom: ConvGeometry, threads: int) -> WgradPlan:
    """:func:`wgrad_plan` of ``geom`` for this engine build and thread count."""
    budgets = _budgets(threads)
    return wgrad_plan(geom, eng.vl, eng.mr_of, (budgets[2], WGRAD_MIN_CHUNK, WGRAD_MAX_CHUNK,
                                                WGRAD_CHUNKS, budgets[3]))


def _wgrad_problem(eng: Engine, x: np.ndarray, dy: np.ndarray, geom: ConvGeometry,
                   threads: int) -> tuple:
    """The wgrad kernel's plan and descriptor of x and dy (the plan's items array is kept
    alive by the plan, which the caller keeps)."""
    plan = _wgrad_plan_of(eng, geom, threads)
    k3, s3, d3, p3 = (_pad3(geom.kernel, 1), _pad3(geom.strides, 1), _pad3(geom.dilations, 1),
                      _pad3(geom.pads_begin, 0))
    l3, m3 = _pad3(geom.in_sizes, 1), _pad3(geom.out_sizes, 1)
    prob = _Wgrad(_tensor(x), _tensor(dy), geom.n, (_I64 * 3)(*l3), geom.c, (_I64 * 3)(*m3),
                  geom.o, geom.groups, (_I64 * 3)(*k3), (_I64 * 3)(*s3), (_I64 * 3)(*d3),
                  (_I64 * 3)(*p3), plan.nv, plan.chunk, WGRAD_LINE_MIN, int(WGRAD_DIRECT_X),
                  plan.items.ctypes.data)
    return plan, prob


def _wgrad_tasks(plan: WgradPlan, geom: ConvGeometry, packed: bool,
                 threads: int) -> list[tuple]:
    """The tasks of :func:`wgrad`'s kernel (items lo, hi, output blocks b0, b1, taps t0,
    t1; the address each adds into is the caller's: dw, or partial i with
    ``plan.chunks`` partials)."""
    nitems, nblocks, ntap = len(plan.items), plan.nblocks, math.prod(geom.kernel)
    kw = geom.kernel[-1]
    # split outputs: each task reads (and converts, for NCX or 16-bit callers) every
    # position, so fewer tasks when that costs a conversion
    nsplit = threads if packed else 2 * threads
    # (every task zeroes the part of dw, or the partial, it adds into)
    if plan.split_outputs and WGRAD_GRID_TASKS and not packed:
        return [(0, nitems, b0, b1, t0, t1)
                for t0, t1, b0, b1 in _wgrad_grid(kw, ntap, nblocks, threads)]
    if plan.split_outputs and ntap >= nsplit:
        # whole taps per task: every x panel is packed by one task only
        return [(0, nitems, 0, nblocks, lo, hi) for lo, hi in _pool.split(ntap, nsplit)]
    if plan.split_outputs:
        return [(0, nitems, lo, hi, 0, ntap) for lo, hi in _pool.split(nblocks, nsplit)]
    if plan.chunks == 1:
        return [(0, nitems, 0, nblocks, 0, ntap)]
    return [(lo, hi, 0, nblocks, 0, ntap) for lo, hi in _pool.split(nitems, plan.chunks)]
