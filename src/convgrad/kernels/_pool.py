"""The compiled kernels' worker threads.

One thread pool per (process, thread count): a forked child gets pools of its
own (it would otherwise wait forever on threads that exist only in its
parent).  The compiled loops release the GIL, so the pool's threads compute
side by side.  Work is always split by the caller into ranges whose results
do not depend on which thread runs them.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

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


def run_shared(fn, ntasks: int, threads: int) -> None:
    """``fn(counter_address)`` on ``min(threads, ntasks)`` threads at once: the
    compiled loop behind ``fn`` takes task after task from one shared atomic
    counter (an int64 starting at 0) until ``ntasks`` are done, so no thread idles
    while another finishes a backlog (static blocks did: a late-waking worker left
    the other a task or two to do alone)."""
    import numpy as np
    counter = np.zeros(1, np.int64)
    address = counter.ctypes.data
    n = max(1, min(threads, ntasks))
    # the calling thread works too: it starts at once, while a pool thread may take a
    # while to wake (and then finds less left to do)
    futures = [pool(n).submit(fn, address) for _ in range(n - 1)]
    fn(address)
    for f in futures:
        f.result()
    del counter
