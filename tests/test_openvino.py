"""OpenVINO dialect: the spec page's examples, OpenVINO's op_reference literals,
and literal results of the OpenVINO CPU runtime (2026.4) on the corner cases
of (Group)ConvolutionBackpropData.  The live comparison with the runtime is in
test_conformance_openvino.py."""

import numpy as np
import pytest

import convgrad
from convgrad import ConvGradError, openvino as ov
from cases import arrays, case_id, random_case
from conftest import assert_close

# ---------------------------------------------------------------------------
# The three examples of the GroupConvolutionBackpropData-1 page


@pytest.mark.parametrize("spatial", [1, 2])
def test_spec_examples_run(spatial):
    rng = np.random.default_rng(spatial)
    data = rng.standard_normal((1, 20) + (224,) * spatial).astype(np.float32)
    kernel = rng.standard_normal((4, 5, 2) + (3,) * spatial).astype(np.float32)
    a = dict(strides=[2] * spatial, pads_begin=[1] * spatial, pads_end=[1] * spatial,
             dilations=[1] * spatial)
    out = ov.group_convolution_backprop_data(data, kernel, **a)
    assert out.shape == (1, 8) + (447,) * spatial and out.dtype == np.float32
    # it is the data gradient of the GroupConvolution with the same kernel tensor
    x = rng.standard_normal(out.shape).astype(np.float32)
    y = ov.group_convolution(x, kernel, **a)
    assert y.shape == data.shape
    lhs, rhs = np.vdot(y.astype(np.float64), data), np.vdot(x.astype(np.float64), out)
    assert abs(lhs - rhs) <= 1e-5 * np.abs(y).sum()
    # and equals the canonical data gradient
    w = kernel.reshape(20, 2, *kernel.shape[3:])
    want = convgrad.conv_data_grad(w, data, out.shape, groups=4, strides=a["strides"],
                                   pads_begin=a["pads_begin"], pads_end=a["pads_end"])
    assert_close(out, want)


def test_spec_example_3d_by_shape_inference():
    op = convgrad.op("GroupConvolutionBackpropData", strides=[2, 2, 2], pads_begin=[1, 1, 1],
                     pads_end=[1, 1, 1], dilations=[1, 1, 1])
    assert op.infer_shape((1, 20, 224, 224, 224), (4, 5, 2, 3, 3, 3)) == (1, 8, 447, 447, 447)


# ---------------------------------------------------------------------------
# OpenVINO's template-plugin op_reference literals (convolution_backprop.cpp,
# group_convolution_backprop.cpp)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int8,
                                   np.uint8])
def test_op_reference_1d_output_padding(dtype):
    out = ov.convolution_backprop_data(np.array([[[5, 6, 7, 2]]], dtype),
                                       np.array([[[2, 0, 1]]], dtype), strides=[1],
                                       pads_begin=[1], pads_end=[1], dilations=[1],
                                       output_padding=[1])
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out.ravel(), [12, 19, 10, 7, 2])


def test_op_reference_same_upper_with_output_shape():
    # 1x1x1x10 input, 1x1x1x1x5 kernel, output_shape {1, 14}: total padding 0
    data = np.arange(1, 11, dtype=np.float32).reshape(1, 1, 1, 10)
    kernel = np.ones((1, 1, 1, 1, 5), np.float32)
    out = ov.group_convolution_backprop_data(data, kernel, [1, 14], strides=[1, 1],
                                             pads_begin=[0, 0], pads_end=[0, 0],
                                             dilations=[1, 1], auto_pad="same_upper")
    want = np.convolve(np.arange(1, 11), np.ones(5))
    np.testing.assert_array_equal(out.ravel(), want)


def test_op_reference_2d_stride2_output_padding():
    # group_convolution_backprop.cpp: 1x1x3x3 -> 1x1x6x6, stride 2, pads 1, output_padding 1
    rng = np.random.default_rng(0)
    data = rng.integers(-5, 5, (1, 1, 3, 3)).astype(np.float64)
    kernel = rng.integers(-5, 5, (1, 1, 1, 3, 3)).astype(np.float64)
    out = ov.group_convolution_backprop_data(data, kernel, strides=[2, 2], pads_begin=[1, 1],
                                             pads_end=[1, 1], dilations=[1, 1],
                                             output_padding=[1, 1])
    assert out.shape == (1, 1, 6, 6)
    full = np.zeros((7, 7))
    for i in range(3):
        for j in range(3):
            full[2 * i:2 * i + 3, 2 * j:2 * j + 3] += data[0, 0, i, j] * kernel[0, 0, 0]
    np.testing.assert_array_equal(out[0, 0], full[1:7, 1:7])


# ---------------------------------------------------------------------------
# Literal results of the OpenVINO CPU runtime: dy = [1, 2], w = [1, 10, 100],
# stride 2, so the full transposed output is [1, 10, 102, 20, 200].

DY = np.array([[[1, 2]]], np.int64)
W = np.array([[[1, 10, 100]]], np.int64)

RUNTIME = [
    # (auto_pad, pads, output_padding, output_shape) -> result
    ("same_upper", (0, 0), 0, 4, [10, 102, 20, 200]),     # odd total 1 at the BEGIN
    ("same_upper", (0, 0), 1, 4, [10, 102, 20, 200]),     # output_padding counts: total 2
    ("same_upper", (0, 0), 2, 4, [102, 20, 200, 0]),
    ("same_upper", (0, 0), 0, 3, [10, 102, 20]),
    ("same_upper", (0, 0), 0, 2, [102, 20]),
    ("same_upper", (0, 0), 0, 6, [1, 10, 102, 20, 200, 0]),
    ("same_upper", (0, 0), 3, 4, [102, 20, 200, 0]),
    ("same_lower", (0, 0), 0, 4, [1, 10, 102, 20]),
    ("same_lower", (0, 0), 2, 4, [10, 102, 20, 200]),
    ("same_lower", (0, 0), 0, 2, [10, 102]),
    ("same_lower", (0, 0), 0, 7, [1, 10, 102, 20, 200, 0, 0]),
    ("explicit", (1, 3), 0, 4, [10, 102, 20, 200]),       # pads_begin used, pads_end ignored
    ("explicit", (1, 0), 0, 2, [10, 102]),
    ("explicit", (1, 0), 0, 7, [10, 102, 20, 200, 0, 0, 0]),
    ("explicit", (3, 0), 0, 4, [20, 200, 0, 0]),
    ("explicit", (1, 0), 1, 4, [10, 102, 20, 200]),
    ("valid", (1, 1), 0, 4, [1, 10, 102, 20]),
    ("explicit", (0, 0), 1, None, [1, 10, 102, 20, 200, 0]),     # no output_shape
    ("explicit", (0, 0), 3, None, [1, 10, 102, 20, 200, 0, 0, 0]),
    ("explicit", (1, 1), 3, None, [10, 102, 20, 200, 0, 0]),
    ("explicit", (2, 0), 0, None, [102, 20, 200]),
    ("same_upper", (1, 1), 3, None, [1, 10, 102, 20, 200, 0, 0, 0]),   # pads forced to 0
    ("same_lower", (1, 1), 3, None, [1, 10, 102, 20, 200, 0, 0, 0]),
    ("valid", (1, 1), 3, None, [1, 10, 102, 20, 200, 0, 0, 0]),
]


@pytest.mark.parametrize("grouped", [False, True], ids=["CBD", "GCBD"])
@pytest.mark.parametrize("row", RUNTIME, ids=lambda r: f"{r[0]}-p{r[1]}-op{r[2]}-out{r[3]}")
def test_runtime_literals(row, grouped):
    mode, (pb, pe), op, out, want = row
    fn = ov.group_convolution_backprop_data if grouped else ov.convolution_backprop_data
    w = W[None] if grouped else W
    got = fn(DY, w, None if out is None else [out], strides=[2], pads_begin=[pb],
             pads_end=[pe], dilations=[1], auto_pad=mode, output_padding=[op])
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got.ravel(), want)


def test_runtime_literals_2d_same():
    dy = np.array([[1, 2], [3, 4]], np.float32).reshape(1, 1, 2, 2)
    w = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    kw = dict(strides=[2, 2], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1])
    up = ov.convolution_backprop_data(dy, w, [4, 4], auto_pad="same_upper", **kw)
    np.testing.assert_array_equal(up[0, 0], [[5, 14, 10, 12], [14, 36, 24, 30],
                                             [15, 34, 20, 24], [24, 55, 32, 36]])
    lo = ov.convolution_backprop_data(dy, w, [4, 4], auto_pad="same_lower", **kw)
    np.testing.assert_array_equal(lo[0, 0], [[1, 2, 5, 4], [4, 5, 14, 10], [10, 14, 36, 24],
                                             [12, 15, 34, 20]])


def test_runtime_literals_same_with_dilation():
    dy = np.array([[[1, 2]]], np.float32)
    w = np.array([[[1, 10]]], np.float32)
    kw = dict(strides=[1], pads_begin=[0], pads_end=[0], dilations=[3])
    np.testing.assert_array_equal(
        ov.convolution_backprop_data(dy, w, [4], auto_pad="same_upper", **kw).ravel(),
        [2, 0, 10, 20])
    np.testing.assert_array_equal(
        ov.convolution_backprop_data(dy, w, [4], auto_pad="same_lower", **kw).ravel(),
        [1, 2, 0, 10])


FORWARD = [
    ("same_upper", [1, 10], 1, 1, [21, 32, 43, 54, 5]),
    ("same_upper", [1, 10], 2, 1, [21, 43, 5]),
    ("same_upper", [1, 10, 100], 2, 1, [210, 432, 54]),
    ("same_upper", [1, 10], 1, 2, [20, 31, 42, 53, 4]),
    ("same_upper", [1, 10, 100], 1, 2, [310, 420, 531, 42, 53]),
    ("same_upper", [1, 10, 100, 1000], 1, 1, [3210, 4321, 5432, 543, 54]),
    ("same_lower", [1, 10], 1, 1, [10, 21, 32, 43, 54]),
    ("same_lower", [1, 10], 2, 1, [10, 32, 54]),
    ("same_lower", [1, 10, 100, 1000], 1, 1, [2100, 3210, 4321, 5432, 543]),
]


@pytest.mark.parametrize("row", FORWARD, ids=lambda r: f"{r[0]}-k{len(r[1])}-s{r[2]}-d{r[3]}")
def test_runtime_literals_forward(row):
    mode, w, s, d, want = row
    x = np.arange(1, 6, dtype=np.int32).reshape(1, 1, 5)
    got = ov.convolution(x, np.array(w, np.int32).reshape(1, 1, -1), strides=[s],
                         dilations=[d], pads_begin=[0], pads_end=[0], auto_pad=mode)
    np.testing.assert_array_equal(got.ravel(), want)
    x = np.arange(1, 6, dtype=np.float32).reshape(1, 1, 5)
    got = ov.convolution(x, np.array(w, np.float32).reshape(1, 1, -1), strides=[s],
                         dilations=[d], pads_begin=[4], pads_end=[0], auto_pad="explicit")
    assert got.shape[-1] == (5 + 4 - ((len(w) - 1) * d + 1)) // s + 1


# ---------------------------------------------------------------------------
# Groups, layouts, dtypes and shape inputs


@pytest.mark.parametrize("case", [random_case(6000 + s) for s in range(20)], ids=case_id)
def test_group_backprop_is_the_canonical_data_gradient(case, rng):
    x, w, dy = arrays(case, rng)
    g = case["groups"]
    kernel = w.reshape(g, case["o"] // g, *w.shape[1:])         # [G, C_IN, C_OUT, X]
    kw = dict(strides=case["strides"], pads_begin=case["pads_begin"],
              pads_end=case["pads_end"], dilations=case["dilations"])
    want = convgrad.conv_data_grad(w, dy, x.shape, groups=g, **kw)
    got = ov.group_convolution_backprop_data(dy, kernel, case["in_sizes"], **kw)
    assert_close(got, want)
    got = ov.group_convolution_backprop_data(dy, kernel, np.array(x.shape), **kw)  # full shape
    assert_close(got, want)
    assert_close(ov.group_convolution(x, kernel, **kw),
                 convgrad.conv_forward(x, w, groups=g, **kw))
    if g == 1:
        assert_close(ov.convolution_backprop_data(dy, w, case["in_sizes"], **kw), want)
        assert_close(ov.convolution(x, w, **kw), convgrad.conv_forward(x, w, **kw))


@pytest.mark.parametrize("dtype,want", [
    (np.int8, [127, 127, 127]), (np.uint8, [200, 255, 200]), (np.int16, [200, 400, 200])])
def test_integers_are_exact_and_saturate_like_the_runtime(dtype, want):
    dy = np.full((1, 1, 2), 100, dtype)
    w = np.full((1, 1, 2), 2, dtype)
    got = ov.convolution_backprop_data(dy, w, strides=[1], pads_begin=[0], pads_end=[0],
                                       dilations=[1])
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.ravel(), want)
    neg = ov.convolution_backprop_data(-dy.astype(np.int16), w.astype(np.int16) * 100,
                                       strides=[1], pads_begin=[0], pads_end=[0], dilations=[1])
    np.testing.assert_array_equal(neg.ravel(), [-20000, -32768, -20000])


def test_int32_beyond_float32_precision_is_exact():
    dy = np.array([[[2**24, 1]]], np.int32)
    w = np.array([[[1, 1]]], np.int32)
    got = ov.convolution_backprop_data(dy, w, strides=[1], pads_begin=[0], pads_end=[0],
                                       dilations=[1])
    np.testing.assert_array_equal(got.ravel(), [2**24, 2**24 + 1, 1])


def test_zero_output_size_is_an_empty_result():
    got = ov.convolution_backprop_data(np.ones((1, 1, 1), np.float32),
                                       np.ones((1, 1, 1), np.float32), strides=[1],
                                       pads_begin=[1], pads_end=[0], dilations=[1])
    assert got.shape == (1, 1, 0)


@pytest.mark.parametrize("call,match", [
    (lambda: ov.group_convolution_backprop_data(np.ones((1, 6, 4)), np.ones((4, 5, 2, 3)),
                                                strides=[1]), "data channels"),
    (lambda: ov.group_convolution_backprop_data(np.ones((1, 8, 4)), np.ones((4, 2, 3)),
                                                strides=[1]), "rank of filter"),
    (lambda: ov.convolution_backprop_data(np.ones((1, 2, 4)), np.ones((2, 1, 3)),
                                          strides=[0]), "strides.*positive"),
    (lambda: ov.convolution_backprop_data(np.ones((1, 2, 4)), np.ones((2, 1, 3)),
                                          strides=[1], pads_begin=[-1]), "pads_begin"),
    (lambda: ov.convolution_backprop_data(np.ones((1, 2, 4)), np.ones((2, 1, 3)),
                                          strides=[1], output_padding=[-1]), "output_padding"),
    (lambda: ov.convolution_backprop_data(np.ones((1, 2, 4)), np.ones((2, 1, 3)), [4, 4],
                                          strides=[1]), "output_shape"),
    (lambda: ov.convolution_backprop_data(np.ones((1, 2, 4)), np.ones((2, 1, 3)),
                                          [1, 3, 9], strides=[1]), "output_shape channels"),
    (lambda: ov.convolution_backprop_data(np.ones((1, 2, 4)), np.ones((2, 1, 3)),
                                          strides=[1], auto_pad="same"), "auto_pad"),
    (lambda: ov.convolution(np.ones((1, 2, 4)), np.ones((2, 3, 3)), strides=[1]),
     "data channels"),
    (lambda: ov.convolution_backprop_data(np.ones((1, 2, 0)), np.ones((2, 1, 3)),
                                          strides=[1]), "spatial shape of data"),
])
def test_errors(call, match):
    with pytest.raises(ConvGradError, match=match):
        call()


def test_mixed_dtypes_are_a_type_error():
    with pytest.raises(TypeError, match="same dtype"):
        ov.convolution_backprop_data(np.ones((1, 2, 4), np.float32), np.ones((2, 1, 3)),
                                     strides=[1])


def test_output_padding_beyond_stride_is_accepted():
    got = ov.convolution_backprop_data(DY, W, strides=[2], pads_begin=[0], pads_end=[0],
                                       dilations=[1], output_padding=[17])
    np.testing.assert_array_equal(got.ravel(), [1, 10, 102, 20, 200] + [0] * 17)
