"""TensorFlow dialect: literals from TensorFlow's own tests, layouts, groups,
depthwise, dilations and padding forms.  The comparison with the real
TensorFlow raw ops lives in test_conformance_tf.py."""

import numpy as np
import pytest

import convgrad
from convgrad import ConvGradError, tf
from cases import arrays, attrs, case_id, random_case
from conftest import assert_close

CASES = [c for c in (random_case(5000 + s, max_rank=3) for s in range(60))
         if len(c["kernel"]) == 2][:14]
CASES3 = [c for c in (random_case(5100 + s, max_rank=3) for s in range(60))
          if len(c["kernel"]) == 3][:6]


def nhwc(a):
    return np.moveaxis(a, 1, -1)


def hwio(w):
    return np.moveaxis(w, (0, 1), (-1, -2))


def explicit_pairs(case):
    return [[0, 0]] + [[b, e] for b, e in zip(case["pads_begin"], case["pads_end"])] + [[0, 0]]


# Literal expectations of TensorFlow's conv_ops_test.py and XLA's conv2d_test.py.
LITERALS = [
    # (x shape, x, filter_sizes, dy shape, dy, strides, padding, dilations, expected)
    ((1, 2, 3, 1), np.arange(1, 7), [2, 2, 1, 1], (1, 1, 2, 1), [1, 2], [1, 1, 1, 1], "VALID",
     None, [5, 8, 14, 17]),
    ((1, 4, 4, 1), np.arange(1, 17), [1, 1, 1, 1], (1, 2, 2, 1), np.arange(1, 5), [1, 2, 2, 1],
     "SAME", None, [78]),
    ((1, 2, 3, 1), np.arange(1, 7), [2, 2, 1, 1], (1, 1, 2, 1), np.arange(1, 3), [1, 2, 2, 1],
     "SAME", None, [7, 2, 16, 5]),
]


@pytest.mark.parametrize("lit", LITERALS, ids=range(len(LITERALS)))
def test_tensorflow_literals(lit):
    xs, x, fs, ds, dy, strides, padding, dil, want = lit
    x = np.asarray(x, np.float32).reshape(xs)
    dy = np.asarray(dy, np.float32).reshape(ds)
    got = tf.conv2d_backprop_filter(x, fs, dy, strides, padding, dilations=dil)
    np.testing.assert_array_equal(got.ravel(), want)
    # NCHW gives the same filter gradient
    got = tf.conv2d_backprop_filter(np.moveaxis(x, -1, 1), fs, np.moveaxis(dy, -1, 1),
                                    [strides[0], strides[3], strides[1], strides[2]], padding,
                                    data_format="NCHW")
    np.testing.assert_array_equal(got.ravel(), want)


# XLA conv2d_test.py Conv2DBackpropFilterTest: inputs are 1..N in NHWC.
XLA = [
    ([1, 3, 5, 1], [1, 3, 1, 1], [1, 2, 2, 1], [2, 2], None, "VALID", [92, 102, 112]),
    ([1, 3, 6, 1], [2, 2, 1, 1], [1, 1, 5, 1], [1, 1], [2, 1], "VALID", [55, 70, 235, 250]),
    ([1, 2, 3, 1], [2, 2, 1, 1], [1, 1, 1, 1], [1, 1], [1, 2], "VALID", [1, 3, 4, 6]),
    ([1, 2, 3, 1], [2, 2, 1, 0], [1, 1, 1, 0], [1, 1], [1, 2], "VALID", []),
]


@pytest.mark.parametrize("lit", XLA, ids=range(len(XLA)))
def test_xla_literals(lit):
    xs, fs, ds, strides, dilations, padding, want = lit
    x = np.arange(1, np.prod(xs) + 1, dtype=np.float32).reshape(xs)
    dy = np.arange(1, np.prod(ds) + 1, dtype=np.float32).reshape(ds)
    got = tf.conv2d_backprop_filter(x, fs, dy, strides, padding, dilations=dilations)
    assert got.shape == tuple(fs)
    np.testing.assert_array_equal(got.ravel(), want)


@pytest.mark.parametrize("padding", ["explicit", "pairs", "spatial_pairs"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_conv2d_backprops_match_canonical(case, padding, rng):
    x, w, dy = arrays(case, rng)
    s = [1, *case["strides"], 1]
    d = [1, *case["dilations"], 1]
    pairs = explicit_pairs(case)
    pad = {"explicit": dict(padding="EXPLICIT",
                            explicit_paddings=[v for p in pairs for v in p]),
           "pairs": dict(padding=pairs),
           "spatial_pairs": dict(padding=pairs[1:-1])}[padding]
    want_dw = hwio(convgrad.conv_weight_grad(x, dy, w.shape, **attrs(case)))
    got = tf.conv2d_backprop_filter(nhwc(x), hwio(np.empty(w.shape)).shape, nhwc(dy), s,
                                    dilations=d, **pad)
    assert_close(got, want_dw)
    want_dx = nhwc(convgrad.conv_data_grad(w, dy, x.shape, **attrs(case)))
    got = tf.conv2d_backprop_input(nhwc(np.empty(x.shape)).shape, hwio(w), nhwc(dy), s,
                                   dilations=d, **pad)
    assert_close(got, want_dx)
    if case["groups"] == 1:                  # spatial input_sizes: channels from the filter
        got = tf.conv2d_backprop_input(case["in_sizes"], hwio(w), nhwc(dy), case["strides"],
                                       dilations=case["dilations"], **pad)
        assert_close(got, want_dx)
    got = tf.conv2d_transpose(nhwc(dy), hwio(w), nhwc(np.empty(x.shape)).shape, s,
                              dilations=d, padding=pairs)
    assert_close(got, want_dx)


@pytest.mark.parametrize("case", CASES3, ids=case_id)
def test_conv3d_backprops_match_canonical(case, rng):
    x, w, dy = arrays(case, rng)
    pairs = explicit_pairs(case)
    got = tf.conv3d_backprop_filter_v2(nhwc(x), hwio(np.empty(w.shape)).shape, nhwc(dy),
                                       [1, *case["strides"], 1], pairs,
                                       dilations=[1, *case["dilations"], 1])
    assert_close(got, hwio(convgrad.conv_weight_grad(x, dy, w.shape, **attrs(case))))
    got = tf.conv3d_backprop_input_v2(np.array(x.shape), hwio(w), dy, [1, 1, *case["strides"]],
                                      [[0, 0], [0, 0], *pairs[1:-1]], data_format="NCDHW",
                                      dilations=[1, 1, *case["dilations"]])
    assert_close(got, convgrad.conv_data_grad(w, dy, x.shape, **attrs(case)))


@pytest.mark.parametrize("mult", [1, 2])
def test_depthwise_is_grouped_conv_with_channel_multiplier(mult):
    rng = np.random.default_rng(mult)
    c = 3
    x = rng.standard_normal((2, 7, 6, c))
    f = rng.standard_normal((3, 2, c, mult))              # [H, W, C, M]
    fwd = dict(strides=[1, 2], pads_begin=[1, 0], pads_end=[1, 1], dilations=[2, 1], groups=c)
    # canonical weights: output channel k*mult + q from input channel k
    w = np.moveaxis(f, (2, 3), (0, 1)).reshape(c * mult, 1, 3, 2)
    dy = rng.standard_normal((2, c * mult, *convgrad.conv_forward(
        np.moveaxis(x, -1, 1), w, **fwd).shape[2:]))
    pad = [[0, 0], [1, 1], [0, 1], [0, 0]]
    got = tf.depthwise_conv2d_native_backprop_filter(x, f.shape, nhwc(dy), [1, 1, 2, 1], pad,
                                                     dilations=[1, 2, 1, 1])
    want = convgrad.conv_weight_grad(np.moveaxis(x, -1, 1), dy, w.shape, **fwd)
    assert_close(got, np.moveaxis(want.reshape(c, mult, 3, 2), (0, 1), (2, 3)))
    got = tf.depthwise_conv2d_native_backprop_input(x.shape, f, nhwc(dy), [1, 1, 2, 1], pad,
                                                    dilations=[1, 2, 1, 1])
    assert_close(got, nhwc(convgrad.conv_data_grad(w, dy, (2, c, 7, 6), **fwd)))


def test_grouped_conv2d_backprop_filter():
    # input depth 6, filter in-depth 2 -> 3 groups
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 5, 5, 6))
    dy = rng.standard_normal((1, 5, 5, 9))
    got = tf.conv2d_backprop_filter(x, [3, 3, 2, 9], dy, [1, 1, 1, 1], "SAME")
    want = convgrad.conv_weight_grad(np.moveaxis(x, -1, 1), np.moveaxis(dy, -1, 1),
                                     (9, 2, 3, 3), pads_begin=[1, 1], pads_end=[1, 1], groups=3)
    assert_close(got, hwio(want))


def test_conv1d_transpose_same():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 3))                    # NWC, in_channels 3
    f = rng.standard_normal((3, 5, 3))                    # [W, out_channels, in_channels]
    got = tf.conv1d_transpose(x, f, [2, 8, 5], 2, padding="SAME")
    # SAME on the forward conv of length 8, K 3, s 2: total 1 -> pads (0, 1)
    want = convgrad.conv_data_grad(np.moveaxis(f, 0, -1).swapaxes(0, 1), np.moveaxis(x, -1, 1),
                                   (2, 5, 8), strides=[2], pads_begin=[0], pads_end=[1])
    assert_close(got, nhwc(want))


@pytest.mark.parametrize("kwargs,match", [
    (dict(strides=[1, 1, 1, 2]), "strides.*batch and channel"),
    (dict(strides=[1, 1, 1]), "strides"),
    (dict(padding="SAMEISH"), "padding"),
    (dict(padding="EXPLICIT", explicit_paddings=[0, 0, 1, 1, 1, 1]), "explicit_paddings"),
    (dict(padding="EXPLICIT", explicit_paddings=[0, 0, -1, 1, 1, 1, 0, 0]), "non-negative"),
    (dict(padding=[[1, 1], [1, 1], [1, 1], [1, 1]]), "batch and channel"),
    (dict(padding="SAME", explicit_paddings=[0] * 8), "explicit_paddings.*empty"),
    (dict(data_format="NCDHW"), "data_format"),
    (dict(filter_sizes=[3, 3, 4, 4]), "filter_sizes in_channels"),
    (dict(filter_sizes=[3, 3, 2, 5]), "filter_sizes out_channels"),
    (dict(filter_sizes=[3, 3, 2]), "filter_sizes.*4 values"),
    (dict(strides=[1, 2, 2, 1]), "spatial shape of out_backprop"),
])
def test_errors(kwargs, match):
    args = dict(input=np.ones((1, 5, 5, 6)), filter_sizes=[3, 3, 2, 4],
                out_backprop=np.ones((1, 5, 5, 4)), strides=[1, 1, 1, 1], padding="SAME")
    args.update(kwargs)
    with pytest.raises(ConvGradError, match=match) as err:
        tf.conv2d_backprop_filter(**args)
    assert str(err.value).startswith("Conv2DBackpropFilter: ")


@pytest.mark.parametrize("pads", [[[0, 0], [0, 0]], [[1, 1], [1, 1]], [[2, 2], [2, 2]],
                                  [[1, 8], [4, 2]], [[5, 0], [2, 2]]], ids=str)
def test_explicit_padding_equals_valid_on_the_padded_input(pads):
    # TensorFlow's _RunAndVerifyBackpropFilterExplicitPadding: expected values come from
    # padding the input explicitly and running the VALID op.
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5, 6, 3))
    xp = np.pad(x, [[0, 0], *pads, [0, 0]])
    m = [(xp.shape[1] - 3) // 2 + 1, (xp.shape[2] - 2) // 1 + 1]
    dy = rng.standard_normal((2, *m, 4))
    explicit = [0, 0, *pads[0], *pads[1], 0, 0]
    got = tf.conv2d_backprop_filter(x, [3, 2, 3, 4], dy, [1, 2, 1, 1], "EXPLICIT",
                                    explicit_paddings=explicit)
    want = tf.conv2d_backprop_filter(xp, [3, 2, 3, 4], dy, [1, 2, 1, 1], "VALID")
    assert_close(got, want)
    w = rng.standard_normal((3, 2, 3, 4))
    got = tf.conv2d_backprop_input(x.shape, w, dy, [1, 2, 1, 1], "EXPLICIT",
                                   explicit_paddings=explicit)
    want = tf.conv2d_backprop_input(xp.shape, w, dy, [1, 2, 1, 1], "VALID")
    assert_close(got, want[:, pads[0][0]:pads[0][0] + 5, pads[1][0]:pads[1][0] + 6])
