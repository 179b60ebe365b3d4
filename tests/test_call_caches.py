"""What a repeated call reuses (plans by the call as spelled, the chooser's decisions by
call and settings, call descriptions by shapes, strides and dtypes, depthwise problem
descriptors by geometry and strides) never changes what a call validates, chooses or
computes."""

import numpy as np
import pytest

import convgrad
from convgrad import kernels, onednn, ops
from convgrad.errors import ConvGradError
from convgrad.geometry import make_geometry

from test_memory_threads import _call, _spec_3d

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
