"""The compiled kernels' work splitting (kernels._pool): every block once, on the
calling thread too, and failures raised."""

import threading
import time

import pytest

from convgrad.kernels import _pool


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("ntasks", [0, 1, 2, 7, 100])
@pytest.mark.parametrize("per_thread", [1, 4])
def test_run_ranges_covers_every_task_once(threads, ntasks, per_thread):
    seen, lock = [], threading.Lock()

    def fn(lo, hi):
        assert 0 <= lo < hi <= ntasks
        with lock:
            seen.extend(range(lo, hi))
    _pool.run_ranges(fn, ntasks, threads, per_thread)
    assert sorted(seen) == list(range(ntasks))


def test_run_ranges_runs_blocks_on_the_calling_thread_and_a_pool_thread():
    who, lock = set(), threading.Lock()

    def fn(lo, hi):
        with lock:
            who.add(threading.get_ident())
        time.sleep(0.01)
    _pool.run_ranges(fn, 16, 2)
    assert threading.get_ident() in who and len(who) == 2


@pytest.mark.parametrize("failing", [0, 5])
def test_run_ranges_raises_the_first_failure_and_stops_taking_blocks(failing):
    started = []

    def fn(lo, hi):
        started.append(lo)
        time.sleep(0.005)
        if lo == failing:
            raise ValueError(f"block {lo}")
    with pytest.raises(ValueError, match=f"block {failing}"):
        _pool.run_ranges(fn, 64, 2, per_thread=32)
    # the other thread may have taken one more block while the failing one ran
    assert len(started) <= failing + 3 and len(started) < 64


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("ntasks", [0, 1, 5, 40])
def test_run_each_returns_results_in_task_order(threads, ntasks):
    got = _pool.run_each([lambda k=k: k * k for k in range(ntasks)], threads)
    assert got == [k * k for k in range(ntasks)]


def test_run_each_runs_tasks_on_the_calling_thread_too_and_raises_failures():
    who, lock = set(), threading.Lock()

    def task():
        with lock:
            who.add(threading.get_ident())
        time.sleep(0.01)
    _pool.run_each([task] * 12, 2)
    assert threading.get_ident() in who and len(who) == 2

    def bad():
        raise KeyError("task failed")
    with pytest.raises(KeyError, match="task failed"):
        _pool.run_each([task, bad, task, task], 2)


def test_run_tasks_runs_its_tasks_side_by_side():
    """run_tasks (the FMA peak's loops) runs every task at the same time: each waits
    for the others to start."""
    barrier = threading.Barrier(3, timeout=10)
    assert _pool.run_tasks([barrier.wait] * 3, 3) is not None
