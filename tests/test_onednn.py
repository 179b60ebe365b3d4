"""oneDNN Graph dialect: layouts, shape inputs, auto_pad and ConvTranspose rules.

Values are checked against the canonical API (itself checked against the naive
reference in test_kernels.py) with layouts converted by hand here, and by the
adjoint identities between each op and its forward op.  The comparison with
PyTorch lives in test_conformance_torch.py.
"""

import numpy as np
import pytest

import convgrad
from convgrad import ConvGradError, onednn
from cases import arrays, attrs, case_id, random_case
from conftest import assert_close

CASES = [random_case(3000 + s) for s in range(24)]


def nxc(a):          # NCX -> NXC
    return np.moveaxis(a, 1, -1)


def xio(w):          # (O, I/G, X) -> (X, I/G, O)
    return np.moveaxis(w, (0, 1), (-1, -2))


def explicit(case):
    return dict(strides=case["strides"], pads_begin=case["pads_begin"],
                pads_end=case["pads_end"], dilations=case["dilations"], groups=case["groups"])


@pytest.mark.parametrize("fmt", ["NXC:XIO", "NCX:OIX", "NXC:OIX", "NCX:XIO"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_convolution_family_layouts(case, fmt, rng):
    x, w, dy = arrays(case, rng)
    data_format, weights_format = fmt.split(":")
    d = nxc if data_format == "NXC" else (lambda a: a)
    k = xio if weights_format == "XIO" else (lambda a: a)
    kw = dict(explicit(case), data_format=data_format, weights_format=weights_format)
    want_dw = convgrad.conv_weight_grad(x, dy, w.shape, **attrs(case))
    want_dx = convgrad.conv_data_grad(w, dy, x.shape, **attrs(case))
    want_y = convgrad.conv_forward(x, w, **attrs(case))
    full_w = k(np.empty(w.shape)).shape
    for shape in (full_w, case["kernel"], np.array(full_w, np.int32)):
        assert_close(onednn.convolution_backward_weights(d(x), d(dy), shape, **kw), k(want_dw))
    assert_close(onednn.convolution_backprop_filters(
        d(x), case["kernel"], d(dy), filter_format=weights_format,
        **{a: v for a, v in kw.items() if a != "weights_format"}), k(want_dw))
    for dst_shape in (d(np.empty(x.shape)).shape, case["in_sizes"]):
        assert_close(onednn.convolution_backward_data(d(dy), k(w), dst_shape, **kw), d(want_dx))
    assert_close(onednn.convolution(d(x), k(w), **kw), d(want_y))


CONVT_FORMATS = {  # ConvTranspose weights from the canonical conv OIX = ConvTranspose (I, O/G, X)
    "IOX": lambda w: w,
    "XOI": lambda w: np.moveaxis(w, (0, 1), (-1, -2)),
    "OIX": lambda w: np.swapaxes(w, 0, 1),
    "XIO": lambda w: np.moveaxis(w, (0, 1), (-2, -1)),
}


@pytest.mark.parametrize("fmt", list(CONVT_FORMATS))
@pytest.mark.parametrize("seed", range(4000, 4016))
def test_conv_transpose_family(seed, fmt, rng):
    case = random_case(seed)
    x, w, dy = arrays(case, rng)      # ConvTranspose: src = dy (small), dst = x (big)
    # ConvTranspose attributes whose output is exactly x's size: output_padding takes the
    # slack of the floor division, pads_end is the conv's.
    s, pb, pe = case["strides"], case["pads_begin"], case["pads_end"]
    full = [(m - 1) * st + (k - 1) * dd + 1 for m, st, k, dd in
            zip(case["out_sizes"], s, case["kernel"], case["dilations"])]
    opad = [L - (f - b - e) for L, f, b, e in zip(case["in_sizes"], full, pb, pe)]
    if any(p < 0 or p >= max(st, dd) for p, st, dd in zip(opad, s, case["dilations"])):
        pytest.skip("no ConvTranspose output_padding reproduces this size")
    kw = dict(explicit(case), output_padding=opad)
    wt = CONVT_FORMATS[fmt](w)
    for data_format, d in (("NCX", lambda a: a), ("NXC", nxc)):
        out = onednn.conv_transpose(d(dy), wt, weights_format=fmt, data_format=data_format, **kw)
        assert_close(out, d(convgrad.conv_data_grad(w, dy, x.shape, **attrs(case))))
        back = onednn.conv_transpose_backward_data(d(x), wt, weights_format=fmt,
                                                   data_format=data_format, **kw)
        assert_close(back, d(convgrad.conv_forward(x, w, **attrs(case))))
        want_dw = CONVT_FORMATS[fmt](convgrad.conv_weight_grad(x, dy, w.shape, **attrs(case)))
        for shape in (wt.shape, case["kernel"]):
            got = onednn.conv_transpose_backward_weights(d(dy), d(x), shape, weights_format=fmt,
                                                         data_format=data_format, **kw)
            assert_close(got, want_dw)
            got = onednn.conv_transpose_backprop_filters(d(dy), d(x), shape, filter_format=fmt,
                                                         data_format=data_format, **kw)
            assert_close(got, want_dw)


def test_default_formats_follow_onednn():
    # data NXC; Convolution weights XIO; ConvTranspose weights XOI (current code) and
    # XIO for the older ConvTransposeBackpropFilters-1 page.
    rng = np.random.default_rng(0)
    src = rng.standard_normal((1, 5, 5, 4))           # NXC, C = 4
    dst = rng.standard_normal((1, 3, 3, 6))           # NXC, O = 6
    assert onednn.convolution_backward_weights(src, dst, [3, 3], strides=[1, 1]).shape == \
        (3, 3, 4, 6)
    u = rng.standard_normal((1, 3, 3, 6))             # ConvTranspose src, I = 6
    v = rng.standard_normal((1, 5, 5, 4))             # ConvTranspose dst, O = 4
    assert onednn.conv_transpose_backward_weights(u, v, [3, 3], strides=[1, 1]).shape == \
        (3, 3, 4, 6)                                  # XOI = (X, O/G, I)
    assert onednn.conv_transpose_backprop_filters(u, v, [3, 3], strides=[1, 1]).shape == \
        (3, 3, 6, 4)                                  # XIO = (X, I, O/G)


def test_same_upper_puts_the_odd_pad_at_the_end():
    # 1-D: L = 4, K = 3, s = 2 -> total 1; same_upper (0, 1), same_lower (1, 0)
    x = np.arange(1.0, 5.0).reshape(1, 4, 1)
    dy = np.array([1.0, 10.0]).reshape(1, 2, 1)
    upper = onednn.convolution_backward_weights(x, dy, [3], strides=[2], auto_pad="SAME_UPPER")
    lower = onednn.convolution_backward_weights(x, dy, [3], strides=[2], auto_pad="same_lower")
    # upper: windows [1,2,3], [3,4,0]; lower: [0,1,2], [2,3,4]
    np.testing.assert_array_equal(upper.ravel(), [1 + 30, 2 + 40, 3])
    np.testing.assert_array_equal(lower.ravel(), [20, 1 + 30, 2 + 40])
    dx = onednn.convolution_backward_data(dy, np.ones((3, 1, 1)), [4], strides=[2],
                                          auto_pad="same_upper")
    np.testing.assert_array_equal(dx.ravel(), [1, 1, 11, 10])


def test_same_with_dilation_uses_the_effective_kernel():
    x = np.ones((1, 7, 1))
    dy = np.ones((1, 7, 1))
    dw = onednn.convolution_backward_weights(x, dy, [3], strides=[1], dilations=[3],
                                             auto_pad="SAME_UPPER")
    np.testing.assert_array_equal(dw.ravel(), [4, 7, 4])     # pads (3, 3)


def test_auto_pad_ignores_pads():
    x = np.ones((1, 4, 1))
    dy = np.ones((1, 4, 1))
    a = onednn.convolution_backward_weights(x, dy, [3], strides=[1], auto_pad="SAME_UPPER",
                                            pads_begin=[7], pads_end=[-3])
    b = onednn.convolution_backward_weights(x, dy, [3], strides=[1], auto_pad="SAME_UPPER")
    np.testing.assert_array_equal(a, b)


def test_conv_transpose_same_gives_stride_times_input():
    u = np.ones((1, 3, 2))
    w = np.ones((4, 2, 2))                 # XOI: K=4, O/G=2, I=2
    out = onednn.conv_transpose(u, w, strides=[2], auto_pad="SAME_UPPER")
    assert out.shape == (1, 6, 2)
    out = onednn.conv_transpose(u, w, strides=[2], auto_pad="same_lower", output_padding=[1])
    assert out.shape == (1, 7, 2)
    # and its weight gradient accepts exactly that pair of shapes
    v = np.ones((1, 7, 2))
    assert onednn.conv_transpose_backward_weights(u, v, [4], strides=[2], auto_pad="same_lower",
                                                  output_padding=[1]).shape == (4, 2, 2)


def test_convolution_backward_data_without_dst_shape_matches_conv_transpose():
    rng = np.random.default_rng(1)
    dy = rng.standard_normal((2, 3, 5))            # NXC, O = 5
    w = rng.standard_normal((3, 4, 5))             # XIO (K=3, I=4, O=5)
    a = onednn.convolution_backward_data(dy, w, strides=[2], pads_begin=[1], pads_end=[0],
                                         output_padding=[1])
    assert a.shape == (2, 2 * 2 + 3 - 1 - 0 + 1, 4)
    b = onednn.convolution_backward_data(dy, w, [7], strides=[2], pads_begin=[1], pads_end=[0])
    assert_close(a, b)


def test_input_weights_shape_wins_over_attribute_in_op():
    op = convgrad.op("ConvolutionBackwardWeights", strides=[1], weights_shape=[3, 2, 5])
    assert op.infer_shape((1, 6, 2), (1, 4, 3), [3, 2, 3]) == (3, 2, 3)
    assert op.infer_shape((1, 6, 2), (1, 4, 3), [3]) == (3, 2, 3)
    with pytest.raises(ConvGradError, match="weights_shape output channels"):
        op.infer_shape((1, 6, 2), (1, 4, 3))        # the attribute alone: O = 5 != 3


@pytest.mark.parametrize("kwargs,match", [
    (dict(strides=[0]), "strides.*positive"),
    (dict(strides=[1, 1]), "strides.*1 value"),
    (dict(strides=[1], pads_begin=[-1]), "pads_begin.*>= 0"),
    (dict(strides=[1], dilations=[0]), "dilations.*positive"),
    (dict(strides=[1], groups=0), "groups.*positive"),
    (dict(strides=[1], groups=4), "divisible by groups"),
    (dict(strides=[1], auto_pad="same"), "auto_pad"),
    (dict(strides=[1], data_format="NHWC"), "data_format"),
    (dict(strides=[1], weights_format="HWIO"), "weights_format"),
    (dict(strides=[2]), "spatial shape of diff_dst"),
    (dict(strides=[1], weights_shape=[3, 3, 3, 3]), "weights_shape.*3 values.*got 4"),
    (dict(strides=[1], weights_shape=[3, 6, 3]), "weights_shape output channels"),
    (dict(strides=[1], weights_shape=[3, 2, 4]), "weights_shape input channels per group"),
])
def test_errors_name_attribute_and_rule(kwargs, match):
    kwargs = dict(kwargs)
    shape = kwargs.pop("weights_shape", [3])
    src = np.ones((1, 6, 6))          # NXC, C = 6
    dst = np.ones((1, 4, 4))          # O = 4, K = 3 -> M = 4
    with pytest.raises(ConvGradError, match=match) as err:
        onednn.convolution_backward_weights(src, dst, shape, **kwargs)
    assert str(err.value).startswith("ConvolutionBackwardWeights: ")


@pytest.mark.parametrize("op", [1, 2, 5])
def test_output_padding_must_be_below_max_stride_dilation(op):
    u = np.ones((1, 3, 2))
    w = np.ones((3, 2, 2))
    if op < 2:
        onednn.conv_transpose(u, w, strides=[2], output_padding=[op])
    else:
        with pytest.raises(ConvGradError, match="output_padding.*max\\(stride, dilation\\)"):
            onednn.conv_transpose(u, w, strides=[2], output_padding=[op])
    with pytest.raises(ConvGradError, match="output_padding.*negative"):
        onednn.conv_transpose(u, w, strides=[2], output_padding=[-1])


def test_rank_errors():
    with pytest.raises(ConvGradError, match="rank of src"):
        onednn.convolution_backward_weights(np.ones((4, 4)), np.ones((4, 4)), [1], strides=[1])
    with pytest.raises(ConvGradError, match="rank of diff_dst"):
        onednn.convolution_backward_weights(np.ones((1, 4, 4)), np.ones((1, 4, 4, 1)), [1],
                                            strides=[1])
    with pytest.raises(ConvGradError, match="rank of weights"):
        onednn.convolution(np.ones((1, 4, 4)), np.ones((1, 4, 4, 1)), strides=[1])


def test_inputs_are_not_modified_and_outputs_are_new():
    rng = np.random.default_rng(3)
    src = rng.standard_normal((2, 6, 5, 4)).astype(np.float32)
    dst = rng.standard_normal((2, 6, 5, 3)).astype(np.float32)
    src.flags.writeable = False
    dst.flags.writeable = False
    before = (src.copy(), dst.copy())
    dw = onednn.convolution_backward_weights(src, dst, [3, 3], strides=[1, 1], pads_begin=[1, 1],
                                             pads_end=[1, 1])
    np.testing.assert_array_equal(src, before[0])
    np.testing.assert_array_equal(dst, before[1])
    assert dw.flags.c_contiguous and dw.flags.writeable and dw.flags.owndata


def test_benchdnn_graph_cases():
    # oneDNN's benchdnn graph inputs: conv_bwd_w_2d / conv_bwd_d_2d (NCX, OIX) and
    # deconv_bwd_w / deconv_bwd_d (IOX weights [32, 128, 3, 3], stride 2, pads_end 41:
    # a ConvTranspose from 28x28 down to 16x16, 2*27 + 3 - 41 = 16).
    rng = np.random.default_rng(9)
    ncx = dict(data_format="NCX", dilations=[1, 1], pads_begin=[0, 0])
    src = rng.standard_normal((1, 32, 28, 28)).astype(np.float32)
    dd = rng.standard_normal((1, 128, 14, 14)).astype(np.float32)
    dw = onednn.convolution_backward_weights(src, dd, [128, 32, 1, 1], strides=[2, 2],
                                             pads_end=[0, 0], weights_format="OIX", **ncx)
    assert_close(dw, convgrad.conv_weight_grad(src, dd, (128, 32, 1, 1), strides=[2, 2]),
                 np.float32)
    dx = onednn.convolution_backward_data(dd, dw, [1, 32, 28, 28], strides=[2, 2],
                                          pads_end=[0, 0], weights_format="OIX", **ncx)
    assert dx.shape == (1, 32, 28, 28)
    u = rng.standard_normal((1, 32, 28, 28)).astype(np.float32)
    v = rng.standard_normal((1, 128, 16, 16)).astype(np.float32)
    t = dict(strides=[2, 2], pads_end=[41, 41], weights_format="IOX", **ncx)
    dw = onednn.conv_transpose_backward_weights(u, v, [32, 128, 3, 3], **t)
    assert_close(dw, convgrad.conv_weight_grad(v, u, (32, 128, 3, 3), strides=[2, 2],
                                               pads_end=[41, 41]), np.float32)
    assert onednn.conv_transpose(u, dw, **t).shape == (1, 128, 16, 16)
    assert onednn.conv_transpose_backward_data(v, dw, **t).shape == (1, 32, 28, 28)
