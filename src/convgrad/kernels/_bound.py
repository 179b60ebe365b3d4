"""Bound calls: a kernel's decisions for one call kept, to run again on new data.

After a pause of the process (a training step's other work, the benchmark's
0.15 s), every Python object and line of code a call touches is out of the
caches: a call's own Python cost 0.7-1.3 ms there against 0.1-0.3 back to back
(docs/kernels.md, "What limits speed"), about 8 us per Python function it
enters.  What a kernel decides from its inputs' shapes, strides and dtypes --
its descriptors, work items, thread count, task tables -- is the same for every
call that brings the same ones (a front-end's runner: ``frontends._plan``), so
a kernel may *bind* a call: ``kernel.bind(a, b, geom, out_dtype)`` returns a
function ``run(a, b)`` that computes the same result as ``kernel.fn`` for
arrays of those shapes, strides and dtypes (anywhere in memory), touching only
what changes: data pointers, the result, scratch addresses.

A bound call owns its descriptors, so two threads cannot run it at once:
``run`` returns None when another thread is inside it, and the caller takes the
unbound path (:func:`guarded`).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np


# Whether runners bind their kernels (the tests of kernel internals turn it off: they
# change kernel constants between calls of one shape, which bound calls would not see).
ENABLED = True


def _data_offset() -> int | None:
    """Where an ndarray object keeps its data pointer, as an offset from the object's
    address (NumPy's ``PyArrayObject_fields.data``, right after the object header),
    verified on probe arrays; None if not found there."""
    probes = [np.empty(n, dtype) for n, dtype in ((3, np.float32), (1000, np.uint8))]
    for off in (16,):
        try:
            if all(ctypes.c_void_p.from_address(id(p) + off).value == p.ctypes.data
                   for p in probes):
                return off
        except (OSError, ValueError):                    # pragma: no cover
            pass
    return None                                          # pragma: no cover


_OFFSET = _data_offset()


def _address_read(a: np.ndarray, _from=ctypes.c_void_p.from_address, _off=_OFFSET) -> int:
    return _from(id(a) + _off).value


def _address_ctypes(a: np.ndarray) -> int:               # pragma: no cover
    return a.ctypes.data


# The address of an array's data.  ``a.ctypes.data`` runs NumPy's Python code: right
# after a pause of the process, 84 us for the first one of a call against 38 for this
# read of the pointer through ctypes (which the call uses anyway).
address = _address_read if _OFFSET is not None else _address_ctypes


def guarded(body):
    """``body`` behind a non-blocking lock: a second thread arriving while the first
    runs it gets None (and computes the call the unbound way)."""
    lock = threading.Lock()
    acquire, release = lock.acquire, lock.release

    def run(a, b):
        if not acquire(False):
            return None
        try:
            return body(a, b)
        finally:
            release()
    return run


def task_table(lib, fn: str, args: list[tuple]) -> np.ndarray:
    """The tasks ``_pool.run_native(lib, fn, args, ...)`` builds, made once:
    ``(entry point, argument count, up to four arguments)`` rows."""
    addr = ctypes.cast(getattr(lib, fn), ctypes.c_void_p).value
    return np.array([(addr, len(a), *a) + (0,) * (4 - len(a)) for a in args], np.int64)


def runner(lib, table: np.ndarray, threads: int, scratch_per: int = 0):
    """A function ``go(scratch_base=None)`` that runs ``table`` on the engine's threads
    (``cg_run_tasks``, as ``_pool.run_native`` does) with the arguments fixed."""
    run_tasks, at, n, t = lib.cg_run_tasks, table.ctypes.data, len(table), max(1, threads)
    if n == 0:
        return lambda base=None: None

    def go(base=None):
        run_tasks(at, n, t, base, scratch_per)
    go.table = table                        # (kept alive with the function)
    return go

