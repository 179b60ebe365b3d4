"""Memory policy, admission check, determinism and threads.

- the default workspace is a fraction of the available memory, and
  ``config(workspace_bytes=...)`` still overrides it;
- a call whose result plus minimum working set cannot fit is refused with a
  ``MemoryLimitError`` (a ConvGradError) naming the sizes, before allocating;
- the same call gives bitwise the same result every time, for every kernel;
- calls from several Python threads give the results of sequential calls;
- ``config(threads=n)`` limits the BLAS pools (process-wide) and is visible to
  kernels through ``settings.threads()``; threads=1 is bitwise deterministic
  and agrees with threads=2.
"""

from __future__ import annotations

import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import convgrad
from convgrad.geometry import make_geometry
from convgrad import ConvGradError, kernels, memory, onednn, openvino, settings
from convgrad.memory import MemoryLimitError

from cases import arrays, attrs, random_case
from conftest import assert_close

CASES = [random_case(500 + i) for i in range(12)]


# ---- memory policy --------------------------------------------------------------------

def test_available_memory_is_read_from_meminfo():
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    avail = memory.available_bytes()
    assert 0 < avail <= info["MemTotal"]
    # MemAvailable, not MemFree (which excludes reclaimable page cache)
    assert abs(avail - info["MemAvailable"]) < info["MemTotal"] // 10


def test_default_workspace_is_a_fraction_of_available_memory(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 64 * 2**30)
    assert settings.workspace_bytes() == int(64 * 2**30 * settings.WORKSPACE_FRACTION)
    monkeypatch.setattr(memory, "available_bytes", lambda: 2**20)     # tiny machine: a floor
    assert settings.workspace_bytes() == settings.MIN_WORKSPACE_BYTES
    monkeypatch.setattr(memory, "available_bytes", lambda: None)      # unknown: a fallback
    assert settings.workspace_bytes() == settings.FALLBACK_WORKSPACE_BYTES
    with convgrad.config(workspace_bytes=12345):
        assert settings.workspace_bytes() == 12345
    assert settings.workspace_bytes() == settings.FALLBACK_WORKSPACE_BYTES


def test_available_memory_falls_back_without_proc(monkeypatch):
    real_open = open

    def no_proc(path, *a, **k):
        if str(path).startswith("/proc"):
            raise FileNotFoundError(path)
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", no_proc)
    avail = memory.available_bytes()       # sysconf free pages on Linux
    assert avail is None or avail > 0


def test_a_problem_that_cannot_fit_is_refused_before_allocating():
    data = np.ones((1, 1, 1), np.float32)
    filt = np.ones((1, 1, 1), np.float32)
    avail = memory.available_bytes()
    size = int(avail // 4 * 2)              # the result alone needs twice what is free
    tracemalloc.start()
    try:
        with pytest.raises(MemoryLimitError) as info:
            openvino.convolution_backprop_data(data, filt, [size], strides=[1])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20                     # nothing large was allocated
    msg = str(info.value)
    assert msg.startswith("ConvolutionBackpropData: output shape")
    assert f"{size}" in msg and "GiB" in msg and "memory is available" in msg
    assert isinstance(info.value, ConvGradError) and isinstance(info.value, ValueError)
    assert isinstance(info.value, MemoryError)


def test_admission_counts_result_copies_and_working_set(monkeypatch):
    rng = np.random.default_rng(0)
    src = rng.standard_normal((2, 6, 6, 4)).astype(np.float16)      # NXC: copied to NCX f32
    dd = rng.standard_normal((2, 6, 6, 5)).astype(np.float16)
    seen = {}
    real = memory.minimum_bytes

    def spy(*args):
        seen.update(real(*args))
        return seen

    monkeypatch.setattr(memory, "minimum_bytes", spy)
    onednn.convolution_backward_weights(src, dd, [3, 3], strides=[1, 1], pads_begin=[1, 1],
                                        pads_end=[1, 1])
    assert seen == {"result": 5 * 4 * 9 * 4, "input copies": (src.size + dd.size) * 4,
                    "cast of the result": 5 * 4 * 9 * 2, "working set": 4 * 36 * 4}
    # a machine with less than that refuses, naming every part
    monkeypatch.setattr(memory, "available_bytes", lambda: 1000)
    with pytest.raises(MemoryLimitError, match="input copies .* but only 1000 B"):
        onednn.convolution_backward_weights(src, dd, [3, 3], strides=[1, 1],
                                            pads_begin=[1, 1], pads_end=[1, 1])
    # unknown available memory never refuses
    monkeypatch.setattr(memory, "available_bytes", lambda: None)
    onednn.convolution_backward_weights(src, dd, [3, 3], strides=[1, 1], pads_begin=[1, 1],
                                        pads_end=[1, 1])


# ---- determinism ----------------------------------------------------------------------

def _all_three(case, x, w, dy):
    kw = attrs(case)
    return (convgrad.conv_forward(x, w, **kw), convgrad.conv_weight_grad(x, dy, w.shape, **kw),
            convgrad.conv_data_grad(w, dy, x.shape, **kw))


@pytest.mark.parametrize("algo", kernels.names())
def test_same_call_is_bitwise_identical(algo):
    rng = np.random.default_rng(11)
    for case in CASES[:6]:
        x, w, dy = arrays(case, rng, np.float32)
        with convgrad.config(algo=algo):
            first = _all_three(case, x, w, dy)
            for _ in range(3):
                for a, b in zip(first, _all_three(case, x, w, dy)):
                    np.testing.assert_array_equal(a, b)


def _big_case():
    # large enough that BLAS uses its threads
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 32, 24, 24)).astype(np.float32)
    dy = rng.standard_normal((4, 48, 24, 24)).astype(np.float32)
    return x, dy


def test_threads_setting_limits_blas_and_is_restored():
    def blas_threads():
        return {i["internal_api"]: i["num_threads"] for i in threadpool_info()
                if i["user_api"] == "blas"}

    before = blas_threads()
    assert settings.threads() is None
    with convgrad.config(threads=1):
        assert settings.threads() == 1
        assert blas_threads() and set(blas_threads().values()) == {1}
    assert settings.threads() is None and blas_threads() == before
    for bad, exc in ((0, ValueError), (-2, ValueError), ("2", TypeError), (True, TypeError),
                     (1.5, TypeError)):
        with pytest.raises(exc, match="threads"):
            with convgrad.config(threads=bad, algo="reference"):
                pass
        assert settings.threads() is None and settings.algo() == "auto"


def test_one_thread_is_deterministic_and_agrees_with_two():
    x, dy = _big_case()
    with convgrad.config(threads=1):
        one = [convgrad.conv_weight_grad(x, dy, (48, 32, 3, 3), pads_begin=[1, 1],
                                         pads_end=[1, 1]) for _ in range(3)]
    with convgrad.config(threads=2):
        two = convgrad.conv_weight_grad(x, dy, (48, 32, 3, 3), pads_begin=[1, 1],
                                        pads_end=[1, 1])
    np.testing.assert_array_equal(one[0], one[1])
    np.testing.assert_array_equal(one[0], one[2])
    assert_close(two, one[0].astype(np.float64), np.float32)


def _supports(algo, case):
    geom = make_geometry("test", **case)
    return algo == "auto" or all(
        dict((k.name, why) for k, why in kernels.candidates(op, geom, np.float32))[algo] is None
        for op in kernels.OPS)


# Kernels whose float32 GEMMs run in SciPy's OpenBLAS: last-bit differences between
# a call made from the main thread and one from another thread (D21).
BLAS_GAP = ("known gap: the shifted and im2col kernels' float32 GEMMs (SciPy's / NumPy's "
            "OpenBLAS 0.3.30) can differ in the last bits between a call made from the main "
            "thread and one made from another thread: openblas_set_num_threads(1) measured as "
            "not taking effect in the kernel's workers when the limit is entered from a "
            "non-main thread. Repeated calls from one thread are bitwise equal "
            "(test_same_call_is_bitwise_identical); values agree to float32 tolerance")


@pytest.mark.parametrize("algo", ["auto", "mixed"] + kernels.names())
def test_concurrent_calls_equal_sequential_calls(algo, request):
    """Calls from several threads at once give bitwise the results of sequential calls.
    Strict for the default path (``auto``: the native engine for float32, no BLAS in its
    hot path) and every kernel but the BLAS ones (``mixed`` interleaves all kernels)."""
    if algo in ("shifted", "im2col", "mixed"):
        request.applymarker(pytest.mark.xfail(strict=False, reason=BLAS_GAP))
    rng = np.random.default_rng(21)
    jobs = []
    names = kernels.names()
    for i, case in enumerate(CASES):
        x, w, dy = arrays(case, rng, np.float32)
        name = names[i % len(names)] if algo == "mixed" else algo
        if _supports(name, case):
            jobs.append((case, x, w, dy, name))
    x, dy = _big_case()
    big_algo = algo if algo not in ("mixed", "direct") else "auto"   # (direct: small groups)

    def run(job):
        case, x, w, dy, algo = job
        with convgrad.config(algo=algo):      # context-local: other threads keep theirs
            out = _all_three(case, x, w, dy)
            assert settings.algo() == algo
        return out

    def big(_):
        with convgrad.config(algo=big_algo):
            return convgrad.conv_weight_grad(x, dy, (48, 32, 3, 3), pads_begin=[1, 1],
                                             pads_end=[1, 1])

    sequential = [run(j) for j in jobs]
    sequential_big = big(0)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(run, j) for j in jobs * 2] + [pool.submit(big, 0)
                                                             for _ in range(4)]
        results = [f.result() for f in futures]
    for got, want in zip(results[:2 * len(jobs)], sequential * 2):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    for got in results[2 * len(jobs):]:
        np.testing.assert_array_equal(got, sequential_big)
