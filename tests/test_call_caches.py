"""What a repeated call reuses (plans by the call as spelled, the chooser's decisions by
call and settings, call descriptions by shapes, strides and dtypes, a kernel's decisions
in bound calls) never changes what a call validates, chooses or computes."""

import numpy as np
import pytest

import convgrad
from convgrad import kernels, onednn, ops
from convgrad.errors import ConvGradError
from convgrad.geometry import make_geometry

from test_memory_threads import _call, _spec_3d

pytestmark = pytest.mark.bound_calls
ATTRS = dict(pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], data_format="NXC",
             weights_format="XIO")


def _depthwise(rng, c=24, size=9):
    dy = rng.standard_normal((2, size, size, c)).astype(np.float32)
    w = rng.standard_normal((3, 3, 1, c)).astype(np.float32)
    return dy, w


def _reference(dy, w, shape, strides):
    with convgrad.config(algo="reference"):
        return onednn.convolution_backward_data(dy, w, shape, strides=strides,
                                                groups=w.shape[-1], **ATTRS)


def test_a_cached_plan_never_hides_validation(rng):
    dy, w = _depthwise(rng)
    shape = [2, 9, 9, 24]
    good = onednn.convolution_backward_data(dy, w, shape, strides=[1, 1], groups=24, **ATTRS)
    for _ in range(2):          # the same call again, and spelled otherwise
        again = onednn.convolution_backward_data(dy, w, shape, strides=[1, 1], groups=24,
                                                 **ATTRS)
        np.testing.assert_array_equal(again, good)
        with pytest.raises(TypeError):     # strides is keyword-only
            onednn.convolution_backward_data(dy, w, shape, [1, 1], groups=24, **ATTRS)
        np.testing.assert_array_equal(
            onednn.convolution_backward_data(dy, w, tuple(shape), strides=(1, 1), groups=24,
                                             **ATTRS), good)
        # 1.0 and True equal 1 as keys would, and are still refused
        for bad in ([1.0, 1.0], [True, True]):
            with pytest.raises(ConvGradError, match="strides"):
                onednn.convolution_backward_data(dy, w, shape, strides=bad, groups=24,
                                                 **ATTRS)
        with pytest.raises(ConvGradError, match="groups"):
            onednn.convolution_backward_data(dy, w, shape, strides=[1, 1], groups=24.0,
                                             **ATTRS)
    np.testing.assert_allclose(good, _reference(dy, w, shape, [1, 1]), rtol=1e-5, atol=1e-5)


def test_calls_that_differ_only_in_shapes_dtypes_or_strides_get_their_own_results(rng):
    dy, w = _depthwise(rng)
    # the same attributes on other shapes, a channels-first view, another dtype, stride 2
    small = dy[:1, :5, :5]
    cases = [(dy, w, [2, 9, 9, 24], [1, 1]),
             (np.ascontiguousarray(small), w, [1, 5, 5, 24], [1, 1]),
             (np.moveaxis(np.ascontiguousarray(np.moveaxis(dy, -1, 1)), 1, -1), w,
              [2, 9, 9, 24], [1, 1]),
             (dy, w, [2, 17, 17, 24], [2, 2])]
    for _ in range(2):
        for d, ww, shape, strides in cases:
            got = onednn.convolution_backward_data(d, ww, shape, strides=strides, groups=24,
                                                   **ATTRS)
            assert got.shape == tuple(shape)
            np.testing.assert_allclose(got, _reference(d, ww, shape, strides), rtol=1e-5,
                                       atol=1e-5)
        half = onednn.convolution_backward_data(dy.astype(np.float16), w.astype(np.float16),
                                                [2, 9, 9, 24], strides=[1, 1], groups=24,
                                                **ATTRS)
        assert half.dtype == np.float16


def test_chooser_decisions_follow_the_budget_and_the_registry():
    geom = _spec_3d(56)
    ncx = _call("dgrad", geom, "ncx")
    direct = kernels.select("dgrad", geom, np.float32, "direct")
    parts = kernels.estimate(direct, ncx)
    copies = parts["copy of dy"] + parts["dx before the caller's copy"]
    picks = []
    for budget in (copies * 4, copies // 2, copies * 4, copies // 2):
        with convgrad.config(workspace_bytes=budget):
            picks.append(kernels.select("dgrad", geom, np.float32, call=ncx).name)
            # the uncached decision, for comparison
            assert picks[-1] == kernels._select("dgrad", geom, np.float32, "auto", ncx).name
    assert picks[0] == picks[2] and picks[1] == picks[3]
    assert kernels._decided.cache_info().currsize
    kernels.register(direct)         # (the same kernel again)
    assert not kernels._decided.cache_info().currsize


def test_a_call_description_is_per_layout(rng):
    a = rng.standard_normal((2, 6, 5, 5)).astype(np.float32)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    nxc = np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 1, -1)), -1, 1)
    geom = make_geometry("test", n=2, c=6, o=6, groups=6, in_sizes=(5, 5), kernel=(3, 3),
                         out_sizes=(5, 5), strides=(1, 1), dilations=(1, 1),
                         pads_begin=(1, 1), pads_end=(1, 1))
    first = ops.describe("dgrad", w, a, geom, np.float32)
    second = ops.describe("dgrad", w, nxc, geom, np.float32)
    assert first.b.layouts == frozenset({"ncx"}) and second.b.layouts == frozenset({"nxc"})
    assert ops.describe("dgrad", w, a, geom, np.float32) == first


def _selects(monkeypatch):
    """The kernels ``kernels.select`` picks from now on (a list that grows)."""
    seen = []
    real = kernels.select

    def spy(*args, **kwargs):
        k = real(*args, **kwargs)
        seen.append(k.name)
        return k
    monkeypatch.setattr(kernels, "select", spy)
    return seen


def test_a_repeated_call_runs_the_kernel_its_plan_kept(rng, monkeypatch):
    """The second of two calls alike (shapes, strides, dtypes, settings) runs what the
    first decided without choosing again; the same call under other settings, with
    arrays of other strides, or after the registry changed decides afresh."""
    dy, w = _depthwise(rng)
    shape = [2, 9, 9, 24]
    want = _reference(dy, w, shape, [1, 1])

    def call(d=dy):
        return onednn.convolution_backward_data(d, w, shape, strides=[1, 1], groups=24,
                                                **ATTRS)
    call()
    seen = _selects(monkeypatch)
    for _ in range(3):
        np.testing.assert_allclose(call(), want, rtol=1e-5, atol=1e-5)
    assert seen == []
    with convgrad.config(algo="im2col"):              # other settings: decided again
        np.testing.assert_allclose(call(), want, rtol=1e-5, atol=1e-5)
    assert seen == ["im2col"]
    with convgrad.config(threads=1):
        call()
    assert len(seen) == 2
    ncx_memory = np.moveaxis(np.ascontiguousarray(np.moveaxis(dy, -1, 1)), 1, -1)
    np.testing.assert_allclose(call(ncx_memory), want, rtol=1e-5, atol=1e-5)
    assert len(seen) == 3
    call()
    assert len(seen) == 3                              # (all of them still kept)
    kernels.register(kernels.select("dgrad", make_geometry(
        "t", n=1, c=1, o=1, groups=1, in_sizes=(3,), kernel=(1,), out_sizes=(3,),
        strides=(1,), dilations=(1,), pads_begin=(0,), pads_end=(0,)), np.float32, "direct"))
    seen.clear()
    np.testing.assert_allclose(call(), want, rtol=1e-5, atol=1e-5)
    assert len(seen) == 1                              # a new registry: decided again


def test_a_repeated_call_is_admitted_again(rng, monkeypatch):
    """A call decided before is still refused when the memory it needs is no longer
    there, with the same message."""
    from convgrad import memory
    dy, w = _depthwise(rng)

    def call():
        return onednn.convolution_backward_data(dy, w, [2, 9, 9, 24], strides=[1, 1],
                                                groups=24, **ATTRS)
    call()
    call()
    monkeypatch.setattr(memory, "available_bytes", lambda: 1000)
    with pytest.raises(memory.MemoryLimitError, match="but only 1000 B"):
        call()


def test_repeated_calls_with_a_bias_add_it_each_time(rng):
    """The runner a plan keeps adds the bias of each call (and leaves the caller's
    arrays as they were)."""
    x = rng.standard_normal((2, 8, 8, 6)).astype(np.float32)
    w = rng.standard_normal((3, 3, 6, 5)).astype(np.float32)
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
    with convgrad.config(algo="reference"):
        plain = onednn.convolution(x, w, **kw)
    for k in range(3):
        bias = np.full(5, float(k), np.float32)
        keep = (x.copy(), w.copy(), bias.copy())
        got = onednn.convolution(x, w, bias, **kw)
        np.testing.assert_allclose(got, plain + k, rtol=1e-5, atol=1e-5)
        for a, b in zip((x, w, bias), keep):
            np.testing.assert_array_equal(a, b)
