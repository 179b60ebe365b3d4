"""Bound calls (kernels/_bound.py): from a runner's second call on, a kernel that binds
runs its kept decisions on the new arrays.  They must give what the full path gives,
bit for bit, for arrays anywhere in memory, from any thread, and never skip admission."""

import sys
import threading

import ml_dtypes
import numpy as np
import pytest

import convgrad
from convgrad import kernels, memory, onednn, openvino
from convgrad.memory import MemoryLimitError
from convgrad.frontends import _plan
from convgrad.kernels import _bound, native

if native.available() is not None:
    pytest.skip(f"native engine unavailable: {native.available()}", allow_module_level=True)

pytestmark = pytest.mark.bound_calls
ATTRS = dict(pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])


def _bound_runners():
    """The bound calls of runners made since the chooser last forgot (this test's)."""
    return [r._fast[1] for plan in _plan._PLANS.values() for r in plan._runners.values()
            if r._fast[1] and r.generation == kernels.generation()]


def _dense(rng, n, c, o, size, dtype=np.float32):
    x = rng.standard_normal((n, size, size, c)).astype(dtype)
    w = (rng.standard_normal((3, 3, c, o)) / 5).astype(dtype)
    dy = rng.standard_normal((n, size, size, o)).astype(dtype)
    return x, w, dy


# (name, function of (rng, layout, dtype) -> (call, inputs maker)): each a path that binds
def _dw_dgrad(rng, fmt, dtype, stride=1):
    c, size = 48, 12
    out = size // stride
    w = rng.standard_normal((3, 3, 1, c)).astype(dtype)
    def make():
        dy = rng.standard_normal((2, out, out, c)).astype(dtype)
        return (dy if fmt == "NXC" else np.ascontiguousarray(dy.transpose(0, 3, 1, 2))), w
    shape = [2, size, size, c] if fmt == "NXC" else [2, c, size, size]
    return (lambda dy, w: onednn.convolution_backward_data(
        dy, w, shape, strides=[stride, stride], groups=c, data_format=fmt,
        weights_format="XIO", pads_begin=[1, 1], pads_end=[1 - (stride - 1), 1 - (stride - 1)],
        dilations=[1, 1])), make


def _dw_wgrad(rng, fmt, dtype, stride=1):
    c, size = 40, 14
    out = size // stride
    def make():
        x = rng.standard_normal((2, size, size, c)).astype(dtype)
        dy = rng.standard_normal((2, out, out, c)).astype(dtype)
        if fmt == "NCX":
            x, dy = (np.ascontiguousarray(a.transpose(0, 3, 1, 2)) for a in (x, dy))
        return x, dy
    return (lambda x, dy: onednn.convolution_backward_weights(
        x, dy, [3, 3, 1, c], strides=[stride, stride], groups=c, data_format=fmt,
        weights_format="XIO", pads_begin=[1, 1], pads_end=[1 - (stride - 1), 1 - (stride - 1)],
        dilations=[1, 1])), make


def _wino(rng, fmt, dtype, op="dgrad"):
    x, w, dy = _dense(rng, 2, 32, 48, 12, np.float32)
    w = w.astype(dtype)
    if op == "wgrad":
        # (the chooser takes Winograd from about this size)
        n, c, o, size = 4, 64, 64, 14

        def make_w():
            x = rng.standard_normal((n, size, size, c)).astype(dtype)
            dy = rng.standard_normal((n, size, size, o)).astype(dtype)
            if fmt == "NCX":
                x, dy = (np.ascontiguousarray(a.transpose(0, 3, 1, 2)) for a in (x, dy))
            return x, dy
        return (lambda x, dy: onednn.convolution_backward_weights(
            x, dy, [3, 3, c, o], strides=[1, 1], data_format=fmt, weights_format="XIO",
            **ATTRS)), make_w

    def make():
        a = rng.standard_normal((2, 12, 12, 48 if op == "dgrad" else 32)).astype(dtype)
        if fmt == "NCX":
            a = np.ascontiguousarray(a.transpose(0, 3, 1, 2))
        return a, w
    shape = [2, 12, 12, 32] if fmt == "NXC" else [2, 32, 12, 12]
    if op == "dgrad":
        return (lambda dy, w: onednn.convolution_backward_data(
            dy, w, shape, strides=[1, 1], data_format=fmt, weights_format="XIO",
            **ATTRS)), make
    return (lambda x, w: onednn.convolution(x, w, strides=[1, 1], data_format=fmt,
                                            weights_format="XIO", **ATTRS)), make


def _dense_stride2(rng, fmt, dtype, op, n=2, c=32, o=48, size=12):
    """The native engine's corr and wgrad kernels (stride 2: never Winograd)."""
    out = size // 2
    w = (rng.standard_normal((3, 3, c, o)) / 5).astype(dtype)
    kw = dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[0, 0], dilations=[1, 1],
              data_format=fmt, weights_format="XIO")

    def nchw(a):
        return a if fmt == "NXC" else np.ascontiguousarray(a.transpose(0, 3, 1, 2))
    xshape = [n, size, size, c] if fmt == "NXC" else [n, c, size, size]
    if op == "dgrad":
        return (lambda dy, w: onednn.convolution_backward_data(dy, w, xshape, **kw),
                lambda: (nchw(rng.standard_normal((n, out, out, o)).astype(dtype)), w))
    if op == "fwd":
        return (lambda x, w: onednn.convolution(x, w, **kw),
                lambda: (nchw(rng.standard_normal((n, size, size, c)).astype(dtype)), w))
    return (lambda x, dy: onednn.convolution_backward_weights(x, dy, [3, 3, c, o], **kw),
            lambda: (nchw(rng.standard_normal((n, size, size, c)).astype(dtype)),
                     nchw(rng.standard_normal((n, out, out, o)).astype(dtype))))


def _grouped(rng, fmt, dtype, op, groups=8, cg=4, og=4, size=10):
    """The grouped kernel's corr and wgrad (few channels per group)."""
    c, o = groups * cg, groups * og
    w = rng.standard_normal((3, 3, cg, o)).astype(dtype)
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
              groups=groups, data_format=fmt, weights_format="XIO")

    def nchw(a):
        return a if fmt == "NXC" else np.ascontiguousarray(a.transpose(0, 3, 1, 2))
    xshape = [2, size, size, c] if fmt == "NXC" else [2, c, size, size]
    if op == "dgrad":
        return (lambda dy, w: onednn.convolution_backward_data(dy, w, xshape, **kw),
                lambda: (nchw(rng.standard_normal((2, size, size, o)).astype(dtype)), w))
    if op == "fwd":
        return (lambda x, w: onednn.convolution(x, w, **kw),
                lambda: (nchw(rng.standard_normal((2, size, size, c)).astype(dtype)), w))
    return (lambda x, dy: onednn.convolution_backward_weights(x, dy, [3, 3, cg, o], **kw),
            lambda: (nchw(rng.standard_normal((2, size, size, c)).astype(dtype)),
                     nchw(rng.standard_normal((2, size, size, o)).astype(dtype))))


def _one_line(rng, c=32, o=48, size=40):
    """A 1-D channels-first weight gradient of one sample: one line, one sum (cg_cfw_run)."""
    kw = dict(strides=[2], pads_begin=[1], pads_end=[0], dilations=[1], data_format="NCX",
              weights_format="OIX")
    return (lambda x, dy: onednn.convolution_backward_weights(x, dy, [o, c, 3], **kw),
            lambda: (rng.standard_normal((1, c, size)).astype(np.float32),
                     rng.standard_normal((1, o, size // 2)).astype(np.float32)))


def _pointwise(rng, n=2, c=48, o=80, size=9):
    """A 1x1 channels-first weight gradient (cg_pw_run)."""
    kw = dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
              data_format="NCX", weights_format="OIX")
    return (lambda x, dy: onednn.convolution_backward_weights(x, dy, [o, c, 1, 1], **kw),
            lambda: (rng.standard_normal((n, c, size, size)).astype(np.float32),
                     rng.standard_normal((n, o, size, size)).astype(np.float32)))


CASES = {
    "grouped dgrad NXC": lambda rng: _grouped(rng, "NXC", np.float32, "dgrad"),
    "grouped dgrad NCX float16": lambda rng: _grouped(rng, "NCX", np.float16, "dgrad"),
    "grouped fwd NXC": lambda rng: _grouped(rng, "NXC", np.float32, "fwd"),
    "grouped wgrad NXC": lambda rng: _grouped(rng, "NXC", np.float32, "wgrad"),
    "grouped wgrad NCX bfloat16": lambda rng: _grouped(rng, "NCX", ml_dtypes.bfloat16, "wgrad"),
    "native dgrad NXC": lambda rng: _dense_stride2(rng, "NXC", np.float32, "dgrad"),
    "native dgrad NCX float16": lambda rng: _dense_stride2(rng, "NCX", np.float16, "dgrad"),
    "native fwd NXC bfloat16": lambda rng: _dense_stride2(rng, "NXC", ml_dtypes.bfloat16,
                                                          "fwd"),
    # partial gradients summed (few outputs, many positions)
    "native wgrad NXC partials": lambda rng: _dense_stride2(rng, "NXC", np.float32, "wgrad"),
    # each task its block of the result (many outputs)
    "native wgrad NXC split outputs": lambda rng: _dense_stride2(
        rng, "NXC", np.float32, "wgrad", n=1, c=256, o=256, size=8),
    # channels-first inputs small beside the result: float32 channels-last copies first
    "native wgrad NCX stationary copies": lambda rng: _dense_stride2(
        rng, "NCX", np.float32, "wgrad", n=1, c=256, o=256, size=8),
    "native wgrad NXC float16 copies": lambda rng: _dense_stride2(
        rng, "NXC", np.float16, "wgrad", n=1, c=64, o=64, size=8),
    # float32 channels-first: x read in place (cg_cfw_run), partial sums or not
    "native wgrad NCX in place": lambda rng: _dense_stride2(rng, "NCX", np.float32, "wgrad"),
    "native wgrad NCX in place one sum": lambda rng: _one_line(rng),
    "native wgrad NCX 1x1": lambda rng: _pointwise(rng),
    "depthwise dgrad NXC": lambda rng: _dw_dgrad(rng, "NXC", np.float32),
    "depthwise dgrad NXC bfloat16": lambda rng: _dw_dgrad(rng, "NXC", ml_dtypes.bfloat16),
    "depthwise dgrad NXC stride 2": lambda rng: _dw_dgrad(rng, "NXC", np.float32, 2),
    "depthwise wgrad NXC": lambda rng: _dw_wgrad(rng, "NXC", np.float32),
    "depthwise wgrad NXC stride 2 float16": lambda rng: _dw_wgrad(rng, "NXC", np.float16, 2),
    "flat depthwise wgrad NCX": lambda rng: _dw_wgrad(rng, "NCX", np.float32),
    "flat depthwise wgrad NCX float16": lambda rng: _dw_wgrad(rng, "NCX", np.float16),
    "winograd dgrad NXC": lambda rng: _wino(rng, "NXC", np.float32),
    "winograd dgrad NCX": lambda rng: _wino(rng, "NCX", np.float32),
    "winograd dgrad NXC float16": lambda rng: _wino(rng, "NXC", np.float16),
    "winograd dgrad NCX bfloat16": lambda rng: _wino(rng, "NCX", ml_dtypes.bfloat16),
    "winograd fwd NXC": lambda rng: _wino(rng, "NXC", np.float32, "fwd"),
    "winograd wgrad NXC": lambda rng: _wino(rng, "NXC", np.float32, "wgrad"),
    "winograd wgrad NCX": lambda rng: _wino(rng, "NCX", np.float32, "wgrad"),
}


@pytest.mark.parametrize("case", CASES)
def test_bound_calls_equal_the_full_path_on_new_arrays(rng, case):
    call, make = CASES[case](rng)
    inputs = [make() for _ in range(4)]
    first = [np.array(call(*inputs[0]))]
    assert not _bound_runners()                  # (a first call runs the full path)
    got = [np.array(call(*a)) for a in inputs[1:]]
    assert _bound_runners(), "the second call should have bound the kernel"
    bound = _bound_runners()[0].bound
    names = {r.prepared.kernel.name for plan in _plan._PLANS.values()
             for r in plan._runners.values() if r._fast[1]
             and r.generation == kernels.generation()}
    assert names == {"winograd" if case.startswith("winograd") else
                     "native" if case.startswith("native") else "grouped"}
    if "partials" in case or "split outputs" in case:
        assert bound.partials == ("partials" in case)
    if "copies" in case:
        assert bound.copied == (True, True)
    if "in place" in case:
        assert bound.sums == (1 if "one sum" in case else 8)
    for a, g in zip(inputs[1:], got):
        kernels.clear_choices()                  # a new runner: the full path again
        want = call(*a)
        assert g.dtype == want.dtype and g.shape == want.shape
        np.testing.assert_array_equal(g, want)
    # each result is its own inputs' (not a stale pointer's)
    assert not np.array_equal(got[0], got[1]) and not np.array_equal(first[0], got[0])
    # and right: against the reference kernel
    with convgrad.config(algo="reference"):
        ref = np.asarray(call(*inputs[-1]), np.float64)
    scale = np.abs(ref).max()
    tol = 1e-5 if got[-1].dtype == np.float32 else 1e-2
    np.testing.assert_allclose(np.asarray(got[-1], np.float64), ref, atol=tol * scale)


@pytest.mark.parametrize("case", CASES)
def test_a_bound_call_runs_no_import_machinery(rng, case):
    """No function-level (relative) import on a bound call's path: each runs importlib's
    Python, whose cold code cost microseconds a call after a pause of the process
    (docs/kernels.md, "Where a call's time goes after the pause")."""
    call, make = CASES[case](rng)
    args = make()
    call(*args)
    call(*args)
    assert _bound_runners()
    entered = []

    def watch(frame, event, arg):
        if event == "call" and "importlib" in frame.f_code.co_filename:
            back = frame.f_back
            while back is not None and "importlib" in back.f_code.co_filename:
                back = back.f_back
            entered.append(f"{back.f_code.co_filename}:{back.f_lineno}" if back else "?")
    sys.setprofile(watch)
    try:
        call(*args)
    finally:
        sys.setprofile(None)
    assert entered == []


def test_a_bound_call_results_are_owned_and_writable(rng):
    call, make = CASES["depthwise dgrad NXC"](rng)
    a = make()
    call(*a)
    out = call(*a)
    assert _bound_runners()
    assert out.flags.c_contiguous and out.flags.writeable
    before = out.copy()
    again = call(*a)                           # a later result does not reuse out's memory
    np.testing.assert_array_equal(out, before)
    assert not np.shares_memory(out, again)


def test_bound_calls_from_many_threads_give_the_same_results(rng):
    call, make = CASES["winograd dgrad NXC"](rng)
    inputs = [make() for _ in range(6)]
    want = [np.array(call(*a)) for a in inputs]         # (binds on the second)
    assert _bound_runners()
    errors, results = [], {}

    def work(k):
        try:
            for rep in range(8):
                i = (k + rep) % len(inputs)
                results[k, rep] = (i, np.array(call(*inputs[i])))
        except Exception as e:                         # pragma: no cover
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, r in results.values():
        np.testing.assert_array_equal(r, want[i])


def test_a_busy_bound_call_sends_the_caller_to_the_full_path():
    seen = []

    def body(a, b):
        seen.append(gate(a, b))      # entered again while running, as by a second thread
        return a + b
    gate = _bound.guarded(body)
    assert gate(1, 2) == 3
    assert seen == [None]            # the second caller was told to take the full path
    assert gate(2, 2) == 4 and seen == [None, None]


def test_bound_calls_still_admit_large_calls(rng, monkeypatch):
    call, make = CASES["depthwise dgrad NXC"](rng)
    a = make()
    call(*a)
    call(*a)
    assert _bound_runners()
    monkeypatch.setattr(memory, "available_bytes", lambda: 1024)
    monkeypatch.setattr(memory, "refresh_available", lambda: None)
    with pytest.raises(MemoryLimitError):
        call(*a)


def test_openvino_grouped_filters_bind_through_their_reshape(rng):
    # GroupConvolutionBackpropData's [G, C_IN, C_OUT, Y, X] filter (the spec example's 4
    # groups of 5 -> 2) is a reshape of the canonical weights: the bound call makes the
    # same view of each new filter
    data = [rng.standard_normal((1, 20, 12, 12)).astype(np.float32) for _ in range(3)]
    filters = [rng.standard_normal((4, 5, 2, 3, 3)).astype(np.float32) for _ in range(3)]

    def call(d, f):
        return openvino.group_convolution_backprop_data(
            d, f, strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
    got = [np.array(call(d, f)) for d, f in zip(data, filters)]
    assert _bound_runners()
    for d, f, g in zip(data[1:], filters[1:], got[1:]):
        kernels.clear_choices()
        np.testing.assert_array_equal(g, call(d, f))


def test_the_data_address_is_numpys(rng):
    base = rng.standard_normal((6, 7, 8)).astype(np.float32)
    for a in (base, base[1:], base[:, ::2], base.T, base[2, 3], np.empty(0, np.float16),
              base.astype(ml_dtypes.bfloat16)):
        assert _bound.address(a) == a.ctypes.data


def test_winograd_transforming_its_input_per_group_of_tiles_binds(rng, monkeypatch):
    # transformed weights too large for the shared budget: the "weights" regime, whose
    # work runs group of tiles by group of tiles, each with its transformed input
    from convgrad.kernels import winograd
    monkeypatch.setattr(winograd, "SHARED_U_BYTES", 4096)
    call, make = CASES["winograd dgrad NXC"](rng)
    inputs = [make() for _ in range(3)]
    got = [np.array(call(*a)) for a in inputs]
    bound = _bound_runners()[0].bound
    assert bound.regime == "weights"
    for a, g in zip(inputs[1:], got[1:]):
        kernels.clear_choices()
        np.testing.assert_array_equal(g, call(*a))


@pytest.mark.parametrize("case", ["winograd wgrad NXC", "winograd dgrad NXC",
                                  "native wgrad NXC partials"])
def test_bound_calls_hand_nan_and_inf_on_as_the_full_path(rng, case):
    call, make = CASES[case](rng)
    inputs = [make() for _ in range(2)]
    call(*inputs[0])
    for a in inputs:
        a[1][0, 1, 2, 3] = np.nan
        a[1][1, 2, 1, 0] = np.inf
    with np.errstate(invalid="ignore"):
        got = np.array(call(*inputs[1]))
        assert _bound_runners()
        kernels.clear_choices()
        np.testing.assert_array_equal(got, call(*inputs[1]))
    assert np.isnan(got).any() and np.isfinite(got).any()


def test_bound_calls_wake_the_workers_first(monkeypatch):
    """The front-end's bound call (frontends._plan._fast_call) asks the engine's workers
    to wake before its own Python runs (native.waker), for calls that use threads."""
    woken = []
    monkeypatch.setattr(native, "waker",
                        lambda flops: (lambda: woken.append(flops)) if flops > 1e6 else None)
    _plan._PLANS.clear()
    rng = np.random.default_rng(5)
    w = rng.standard_normal((3, 3, 40, 36)).astype(np.float32)
    dy = rng.standard_normal((2, 29, 31, 36)).astype(np.float32)
    for _ in range(3):
        convgrad.onednn.convolution_backward_data(
            dy, w, [2, 29, 31, 40], strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1],
            dilations=[1, 1], data_format="NXC", weights_format="XIO")
    assert len(woken) >= 1 and woken[0] > 1e6


def test_the_waker_is_for_calls_on_threads():
    """native.waker: a function for a call the engine runs on threads, None for one it
    runs on the caller's thread alone (small, or threads=1)."""
    big = 10**10
    with convgrad.config(threads=2):
        assert callable(native.waker(big))
        native.waker(big)()                  # (wakes the worker, if the pool has one)
        assert native.waker(1) is None
    with convgrad.config(threads=1):
        assert native.waker(big) is None


def _pointwise_corr(rng, fmt_op, dtype, n=4, c=48, o=80, size=12):
    """A 1x1 channels-first data gradient or forward convolution (whole samples as the
    engine's tasks: cg_pw_sample_task)."""
    kw = dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
              data_format="NCX", weights_format="OIX")
    w = (rng.standard_normal((o, c, 1, 1)) / 5).astype(dtype)
    if fmt_op == "dgrad":
        return (lambda dy, w: onednn.convolution_backward_data(dy, w, [n, c, size, size], **kw),
                lambda: (rng.standard_normal((n, o, size, size)).astype(dtype), w))
    return (lambda x, w: onednn.convolution(x, w, **kw),
            lambda: (rng.standard_normal((n, c, size, size)).astype(dtype), w))


@pytest.mark.parametrize("op,dtype", [("dgrad", np.float32), ("fwd", np.float32),
                                      ("dgrad", np.float16), ("fwd", ml_dtypes.bfloat16)])
def test_channels_first_pointwise_calls_bind(rng, monkeypatch, op, dtype):
    """Channels-first 1x1 data gradients and forward convolutions that run whole samples
    as the engine's tasks bind (``native.BIND_PW``): from the second call on, each new
    call's weights, input and result addresses are written into the kept descriptor's
    tables; bitwise the full path's result on new arrays, new weights included, and
    right against the reference."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    call, make = _pointwise_corr(rng, op, dtype)
    inputs = [make() for _ in range(4)]
    inputs[2] = (inputs[2][0], (inputs[2][1] * 3).astype(dtype))         # new weights
    got = [np.array(call(*a)) for a in inputs]
    bound = _bound_runners()
    assert bound, "the second call should have bound the kernel"
    for a, g in zip(inputs[1:], got[1:]):
        kernels.clear_choices()
        monkeypatch.setattr(native, "BIND_PW", False)
        want = call(*a)
        assert g.dtype == want.dtype
        np.testing.assert_array_equal(g, want)
    assert not np.array_equal(got[1], got[2])
    with convgrad.config(algo="reference"):
        ref = np.asarray(call(*inputs[-1]), np.float64)
    tol = 1e-5 if dtype == np.float32 else 1e-2
    np.testing.assert_allclose(np.asarray(got[-1], np.float64), ref,
                               atol=tol * np.abs(ref).max())


def test_a_bound_result_of_another_dtype_than_the_first_is_finished_in_full(rng):
    """A bound call keeps how it finished its first result (a view) for results of that
    dtype only: a float16 Winograd weight gradient comes back from the kernel in float16,
    but in float32 from the direct engine's recomputation when a value is not finite
    (D17); that call's result is still rounded to float16 as the full path's is, its
    NaN where the full path puts it."""
    call, make = _wino(rng, "NXC", np.float16, "wgrad")
    inputs = [make() for _ in range(3)]
    x, dy = make()
    x = x.copy()
    x[1, 2, 3, 4] = np.nan
    inputs.append((x, dy))
    got = [call(*a) for a in inputs]
    assert _bound_runners(), "the second call should have bound the kernel"
    assert {g.dtype for g in got} == {np.dtype(np.float16)}
    assert np.isnan(got[-1]).any() and not np.isnan(got[-2]).any()
    kernels.clear_choices()                      # (the full path, a new runner)
    want = call(*inputs[-1])
    assert want.dtype == np.float16
    np.testing.assert_array_equal(got[-1], want)
