"""Direct BLAS GEMM on strided NumPy views, and the kernels' worker pool.

NumPy's ``matmul`` cannot accumulate into its output (BLAS ``beta = 1``) and
SciPy's ``sgemm`` wrapper takes no leading dimensions, so it copies views.
The GEMM kernels need both, so this module calls the BLAS that SciPy ships
(``scipy.linalg.cython_blas``, the library SciPy itself uses) through the
function pointers SciPy exports for that purpose, with ctypes.  ctypes drops
the GIL during the call, so the pool's threads run GEMMs in parallel.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy.linalg import cython_blas

_c_int_p = ctypes.POINTER(ctypes.c_int)


def _blas_fn(name: str, real):
    capsule = cython_blas.__pyx_capi__[name]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype, get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    ptr = get_ptr(capsule, get_name(capsule))
    proto = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, _c_int_p, _c_int_p, _c_int_p,
                             ctypes.POINTER(real), ctypes.c_void_p, _c_int_p, ctypes.c_void_p,
                             _c_int_p, ctypes.POINTER(real), ctypes.c_void_p, _c_int_p)
    return proto(ptr)


_GEMM = {np.dtype(np.float32): (_blas_fn("sgemm", ctypes.c_float), ctypes.c_float),
         np.dtype(np.float64): (_blas_fn("dgemm", ctypes.c_double), ctypes.c_double)}


def _colmajor(m: np.ndarray):
    """Describe a 2-D view as a column-major BLAS operand of ``m`` itself or of
    its transpose: (is_transposed, ld).  None if neither stride is unit."""
    rows, cols = m.shape
    sr, sc = (s // m.itemsize for s in m.strides)
    if (sr == 1 or rows <= 1) and (cols <= 1 or sc >= max(1, rows)):
        return False, max(1, rows, sc if cols > 1 else 1)        # column-major as is
    if (sc == 1 or cols <= 1) and (rows <= 1 or sr >= max(1, cols)):
        return True, max(1, cols, sr if rows > 1 else 1)         # row-major = transposed
    return None


def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, beta: float = 0.0) -> None:
    """``c = a @ b + beta * c`` in place, on 2-D views with one unit stride each
    (any leading dimension); all three share one dtype, float32 or float64."""
    m, k = a.shape
    n = c.shape[1]
    if m == 0 or n == 0:
        return
    if k == 0:
        if beta == 0.0:
            c[...] = 0
        else:
            c *= beta
        return
    fn, real = _GEMM[c.dtype]
    da, db, dc = _colmajor(a), _colmajor(b), _colmajor(c)
    if da is None:
        a, da = np.ascontiguousarray(a), _colmajor(np.ascontiguousarray(a))
    if db is None:
        b, db = np.ascontiguousarray(b), _colmajor(np.ascontiguousarray(b))
    if dc is None:
        raise ValueError("gemm: output view needs a unit stride")
    if dc[0]:
        # c row-major: compute c^T (column-major) = b^T @ a^T.
        a, b, da, db, m, n = b, a, (not db[0], db[1]), (not da[0], da[1]), n, m
    ta = b"T" if da[0] else b"N"
    tb = b"T" if db[0] else b"N"
    i = ctypes.c_int
    fn(ta, tb, ctypes.byref(i(m)), ctypes.byref(i(n)), ctypes.byref(i(k)),
       ctypes.byref(real(1.0)), a.ctypes.data, ctypes.byref(i(da[1])),
       b.ctypes.data, ctypes.byref(i(db[1])), ctypes.byref(real(beta)),
       c.ctypes.data, ctypes.byref(i(dc[1])))


# -- scratch buffers -----------------------------------------------------------

SCRATCH_BYTES = 128 * 2**20      # per thread: temporaries up to this size are reused
_local = threading.local()


def scratch(key: str, shape, dtype, zero: bool) -> np.ndarray:
    """A temporary array reused across calls of this thread (fresh memory costs
    a page fault per 4 KiB on first touch, often more than the compute).
    Never returned to callers; larger requests get fresh memory."""
    dtype = np.dtype(dtype)
    nbytes = int(math.prod(shape)) * dtype.itemsize   # (np.prod: 4 us a call)
    if nbytes > SCRATCH_BYTES:
        return np.zeros(shape, dtype) if zero else np.empty(shape, dtype)
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    buf = bufs.get(key)
    if buf is None or buf.nbytes < nbytes:
        buf = bufs[key] = np.empty(max(nbytes, 64), np.uint8)
    out = buf[:nbytes].view(dtype).reshape(shape)
    if zero:
        out.fill(0)
    return out


# -- worker pool --------------------------------------------------------------

_pool_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                                   # pragma: no cover
        return os.cpu_count() or 1


def workers() -> int:
    """Threads the kernels use: ``convgrad.config(threads=...)`` if set, else
    the CPUs this process may run on."""
    from .. import settings
    n = getattr(settings, "threads", lambda: None)()
    return max(1, int(n)) if n else cpu_count()


def run_parallel(tasks) -> list:
    """Run zero-argument callables on the pool; results in task order.

    The BLAS calls inside run single-threaded (see
    :func:`single_threaded_blas`): OpenBLAS's float32 results depend on its
    thread count, so a fixed count keeps repeated calls bitwise equal."""
    tasks = list(tasks)
    if not tasks:
        return []
    nw = max(1, min(workers(), len(tasks)))
    # Always on the pool's threads, even for one task: OpenBLAS (0.3.30 here)
    # returns different bits for the same GEMM called from the main thread and
    # from other threads, so the caller's thread must not matter.
    with single_threaded_blas():
        with _pool_lock:
            pool = _pools.get(nw)
            if pool is None:
                pool = _pools[nw] = ThreadPoolExecutor(nw, thread_name_prefix="convgrad")
        libs = [lc for lc, _ in (_limiter or ())]

        def pinned(task):
            # OpenBLAS 0.3.30 here keeps a thread count per calling thread when
            # it is set from a thread other than the one that loaded it: pin it
            # in the worker itself, so no caller thread changes the results.
            def run():
                for lc in libs:
                    lc.set_num_threads(1)
                return task()
            return run

        return [f.result() for f in [pool.submit(pinned(t)) for t in tasks]]


_controller = None
_limit_lock = threading.Lock()
_limit_depth = 0
_limiter = None


def _scipy_blas(controller):
    """The threadpoolctl controller of SciPy's own BLAS library only."""
    import scipy
    root = os.path.dirname(os.path.dirname(scipy.__file__))
    mine = [c.info()["filepath"] for c in controller.lib_controllers
            if c.info().get("user_api") == "blas"
            and os.path.realpath(c.info()["filepath"]).startswith(os.path.realpath(root))
            and "scipy" in os.path.basename(os.path.dirname(c.info()["filepath"]))]
    sel = controller.select(filepath=mine) if mine else controller.select(user_api="blas")
    return sel


class single_threaded_blas:
    """Limit the BLAS that :func:`gemm` calls (SciPy's) to one thread while the
    kernels' own threads run GEMMs side by side; nested and concurrent uses
    share one limit.  NumPy's BLAS, and so the im2col kernel and user code,
    is left alone."""

    def __enter__(self):
        global _controller, _limit_depth, _limiter
        with _limit_lock:
            if _limit_depth == 0:
                try:
                    if _controller is None:
                        from threadpoolctl import ThreadpoolController
                        _controller = _scipy_blas(ThreadpoolController()).lib_controllers
                    _limiter = [(lc, lc.get_num_threads()) for lc in _controller]
                    for lc, _ in _limiter:
                        lc.set_num_threads(1)
                except Exception:                            # pragma: no cover
                    _limiter = None
            _limit_depth += 1
        return self

    def __exit__(self, *exc):
        global _limit_depth, _limiter
        with _limit_lock:
            _limit_depth -= 1
            if _limit_depth == 0 and _limiter is not None:
                for lc, n in _limiter:
                    lc.set_num_threads(n)
                _limiter = None
        return False
