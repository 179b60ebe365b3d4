"""The engine's worker threads (pool.cpp: cg_run_tasks, _pool.run_native): every task
runs once, each thread gets its own scratch, callers from several Python threads and
forked children get their tasks done."""

import ctypes
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from convgrad.kernels import _pool, native

from conftest import engine_dbg

pytestmark = pytest.mark.skipif(native.available() is not None,
                                reason="the native engine is not built")


def _lib():
    lib = native.engine().lib
    lib.cg_pool_last.argtypes = [ctypes.c_void_p]
    lib.cg_pool_wake_record.argtypes = [ctypes.c_void_p]
    return lib


def _probe(lib, n, threads, spin=0, scratch_floats=None):
    """n probe tasks on ``threads`` threads: (counts, scratch pointers, scratch base, bytes)."""
    counts = np.zeros(n, np.int64)
    where = np.zeros(n, np.int64)
    buf = per_thread = None
    if scratch_floats is not None:
        buf, per_thread = _pool.thread_scratch("test-pool", scratch_floats, threads)
    _pool.run_native(lib, "cg_pool_probe",
                     [(counts.ctypes.data, i, spin, where.ctypes.data) for i in range(n)],
                     threads, per_thread)
    return counts, where, per_thread, buf


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_every_task_runs_once_with_its_threads_scratch(threads, n):
    lib = _lib()
    counts, where, (base, per), buf = _probe(lib, n, threads, spin=200, scratch_floats=100)
    assert (counts == 1).all()
    # each task got the scratch of the thread that ran it: one of `threads` parts,
    # 64-byte aligned apart
    assert per % 64 == 0 and per >= 400
    slot = (where - base) // per
    assert ((where - base) % per == 0).all()
    assert ((slot >= 0) & (slot < threads)).all()
    assert buf.nbytes >= threads * per


def test_tasks_without_scratch_get_no_extra_pointer():
    counts, where, _, _ = _probe(_lib(), 5, 2)
    assert (counts == 1).all()
    # (the probe's fifth parameter reads whatever the caller left: only check it ran)


def test_the_workers_take_part_and_one_thread_runs_alone():
    lib = _lib()
    stats = np.zeros(3, np.int64)
    _probe(lib, 16, 1, spin=20000)
    lib.cg_pool_last(stats.ctypes.data)
    before = stats.copy()
    # a section of one thread never reaches the workers (its figures are the last
    # section's, if any)
    _probe(lib, 64, 2, spin=50000)
    lib.cg_pool_last(stats.ctypes.data)
    assert stats[2] == 64
    assert 0 < stats[1] <= 64 and stats[0] >= 0, (before, stats)
    assert lib.cg_pool_workers() >= 1


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux CPU masks and two CPUs")
def test_the_workers_keep_off_the_callers_cpu():
    """A section sets its workers' CPUs to the caller's minus the one the caller runs on
    (woken after a pause, a worker was placed on the caller's vCPU and the two took
    turns); engine debug bit 262144 gives them the caller's CPUs back."""
    lib = _lib()
    mask = os.sched_getaffinity(0)
    _probe(lib, 16, 2, spin=2000)
    tid = lib.cg_pool_worker_tid(0)
    cpu = lib.cg_pool_kept_off_cpu()
    assert tid > 0 and cpu in mask
    assert os.sched_getaffinity(tid) == mask - {cpu}
    with engine_dbg(262144, lib):
        _probe(lib, 16, 2, spin=2000)
        assert lib.cg_pool_kept_off_cpu() == -1
        assert os.sched_getaffinity(tid) == mask
    counts, *_ = _probe(lib, 16, 2, spin=2000)
    assert (counts == 1).all()
    assert os.sched_getaffinity(tid) == mask - {lib.cg_pool_kept_off_cpu()}


def _run_ns(tid: int) -> int | None:
    """Nanoseconds thread ``tid`` of this process has run (None where the kernel does not
    say)."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def test_a_woken_worker_spins_for_the_coming_section_and_one_thread_wakes_none():
    """cg_pool_wake(threads) makes a sleeping worker spin (until WAKE_SPIN, 1 ms, after
    the request) for the section the caller is about to start; a one-thread call wakes
    nothing.  The worker's own record says so whatever the scheduler does (its run time,
    schedstat, depends on it: 7-22 us measured while another test process kept the CPU it
    is allowed, 2026-11-27); the run time is asserted only for the calls that do not wake
    it."""
    lib = _lib()
    _probe(lib, 16, 2, spin=2000)            # (the pool has its worker)
    tid = lib.cg_pool_worker_tid(0)
    record = np.zeros(2, np.int64)

    def ran(act):
        time.sleep(0.05)                     # (the worker asleep: SPIN is 0.3 ms)
        lib.cg_pool_wake_record(record.ctypes.data)
        spun, before = int(record[0]), _run_ns(tid)
        act()
        time.sleep(0.05)
        lib.cg_pool_wake_record(record.ctypes.data)
        after = _run_ns(tid)
        return (int(record[0]) - spun, int(record[1]),
                None if before is None or after is None else after - before)

    woke = [ran(lambda: lib.cg_pool_wake(2)) for _ in range(3)]
    idle = [ran(lambda: lib.cg_pool_wake(1)) for _ in range(3)] + [ran(lambda: None)]
    # each request woke the worker once, back to sleep no sooner than 1 ms after it
    # (spinning, or given a CPU only after its time was up); none for one thread
    assert all(n == 1 and slept >= 900_000 for n, slept, _ in woke), (woke, idle)
    assert all(n == 0 for n, _, _ in idle), (woke, idle)
    # its run time: (nearly) none when not asked to spin
    if all(t is not None for _, _, t in idle):
        assert max(t for _, _, t in idle) < 300_000, (woke, idle)
    counts, *_ = _probe(lib, 16, 2, spin=2000)
    assert (counts == 1).all()


def test_callers_on_several_python_threads_each_get_their_tasks_done():
    lib = _lib()
    errors = []

    def caller(k):
        try:
            for _ in range(30):
                counts, where, (base, per), buf = _probe(lib, 16 + k, 2, spin=500,
                                                         scratch_floats=64)
                assert (counts == 1).all()
                assert (((where - base) // per) < 2).all()
        except BaseException as exc:          # reported below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_starts_workers_of_its_own():
    code = """
import os, sys, numpy as np
sys.path.insert(0, %r)
from test_engine_pool import _lib, _probe
lib = _lib()
assert (_probe(lib, 32, 2, spin=1000)[0] == 1).all()        # the parent's workers exist
pid = os.fork()
if pid == 0:
    ok = (_probe(lib, 32, 2, spin=1000)[0] == 1).all()
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
""" % os.path.dirname(__file__)
    done = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert done.returncode == 0
