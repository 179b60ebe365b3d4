"""The compiled kernels' worker threads.

The native engine's sections run on its own threads (:func:`run_native`,
pool.cpp): the calls of a section go to the engine in one ctypes call.  Work
made of Python callables (the numba kernels, a few engine paths whose ranges
do Python work between calls) runs on a Python thread pool, one per (process,
thread count): a forked child gets pools of its own (it would otherwise wait
forever on threads that exist only in its parent).  The compiled loops
release the GIL, so the pool's threads compute side by side.  Work is always
split by the caller into ranges whose results do not depend on which thread
runs them.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

from . import _blas
from ._bound import address

_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def pool(threads: int) -> ThreadPoolExecutor:
    key = (os.getpid(), threads)
    with _LOCK:
        found = _POOLS.get(key)
        if found is None:
            found = _POOLS[key] = ThreadPoolExecutor(threads, "convgrad-kernel")
        return found


def run_tasks(tasks, threads: int) -> list:
    """Run zero-argument callables side by side, on ``threads`` pool threads (the
    caller waits); results in task order.  With one thread (or one task) they run in
    the calling thread.  For tasks that must run at the same time (the FMA peak's
    loops); other work takes :func:`run_each`."""
    tasks = list(tasks)
    if threads <= 1 or len(tasks) <= 1:
        return [t() for t in tasks]
    futures = [pool(threads).submit(t) for t in tasks]
    return [f.result() for f in futures]


def split(ntasks: int, nblocks: int) -> list[tuple[int, int]]:
    """``[0, ntasks)`` cut into at most ``nblocks`` contiguous, near-equal ranges."""
    nblocks = max(1, min(ntasks, nblocks))
    bounds = [ntasks * i // nblocks for i in range(nblocks + 1)]
    return [(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


def run_each(tasks, threads: int) -> list:
    """Run zero-argument callables on the calling thread and ``threads - 1`` pool
    threads, each taking the next task in order when it is free (the caller starts at
    once; a pool thread may take a while to wake); results in task order.  Tasks must
    not depend on running at the same time (:func:`run_tasks` runs them side by side).
    The first exception stops the taking of tasks and is raised once every thread has
    stopped."""
    tasks = list(tasks)
    if threads <= 1 or len(tasks) <= 1:
        return [t() for t in tasks]
    results = [None] * len(tasks)
    lock = threading.Lock()
    state = {"next": 0, "failed": False}

    def work():
        while True:
            with lock:
                i = state["next"]
                if state["failed"] or i >= len(tasks):
                    return
                state["next"] = i + 1
            try:
                results[i] = tasks[i]()
            except BaseException:
                state["failed"] = True
                raise

    futures = [pool(threads).submit(work) for _ in range(min(threads, len(tasks)) - 1)]
    try:
        work()
    finally:
        wait(futures)
    for f in futures:
        f.result()
    return results


def run_ranges(fn, ntasks: int, threads: int, per_thread: int = 4) -> None:
    """``fn(lo, hi)`` over ``[0, ntasks)`` in ``per_thread * threads`` blocks, taken in
    order by whichever thread is free (:func:`run_each`).  The blocks write disjoint
    results, so who runs which does not change them."""
    if threads <= 1 or ntasks <= 1:
        if ntasks > 0:
            fn(0, ntasks)
        return
    run_each([lambda lo=lo, hi=hi: fn(lo, hi) for lo, hi in split(ntasks, per_thread * threads)],
             threads)


# entry points' addresses, by (library, name)
_ADDRESSES: dict[tuple[int, str], int] = {}


def run_native(lib, fn: str, args: list[tuple], threads: int,
               scratch: tuple[int, int] | None = None) -> None:
    """Call the engine entry point ``fn`` once per tuple of ``args`` (at most four
    integers or addresses each), on the calling thread and ``threads - 1`` of the
    engine's own workers, each call taken in order by whichever is free
    (pool.cpp: cg_run_tasks; one ctypes call, the GIL released throughout).
    ``scratch``: (address, bytes per thread): each call gets one more argument, the
    running thread's scratch (thread t of the section: address + t * bytes).  The
    calls must write results of their own (which thread runs one changes nothing)."""
    if not args:
        return
    key = (id(lib), fn)
    addr = _ADDRESSES.get(key)
    if addr is None:
        addr = _ADDRESSES[key] = ctypes.cast(getattr(lib, fn), ctypes.c_void_p).value
    tasks = np.array([(addr, len(a), *a) + (0,) * (4 - len(a)) for a in args], np.int64)
    base, per = scratch if scratch is not None else (None, 0)
    lib.cg_run_tasks(address(tasks), len(args), max(1, threads), base, per)


def run_native_ranges(lib, fn: str, head: tuple, ntasks: int, threads: int,
                      per_thread: int = 4) -> None:
    """``fn(*head, lo, hi)`` over ``[0, ntasks)``: one call on the calling thread with one
    thread (or one task), else ``per_thread * threads`` ranges on :func:`run_native`."""
    if threads <= 1 or ntasks <= 1:
        if ntasks > 0:
            getattr(lib, fn)(*head, 0, ntasks)
        return
    run_native(lib, fn, [(*head, lo, hi) for lo, hi in split(ntasks, per_thread * threads)],
               threads)


def thread_scratch(key: str, floats: int, threads: int):
    """Scratch of ``floats`` float32 for each of ``threads`` threads of a
    :func:`run_native` section, in one buffer of the calling thread
    (``_blas.scratch``), each thread's part 64-byte aligned as the buffer is:
    (the buffer, to keep while the section runs; its ``scratch`` argument)."""
    per = scratch_bytes(floats) // 4
    buf = _blas.scratch(key, (threads * per,), np.float32, zero=False)
    return buf, (address(buf), per * 4)


def scratch_bytes(floats: int) -> int:
    """Bytes of one thread's part of :func:`thread_scratch` for ``floats`` floats (at
    least 16, a multiple of 16: each part 64-byte aligned)."""
    return -(-max(floats, 16) // 16) * 64
