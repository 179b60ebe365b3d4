"""convgrad.op: names, attributes, infer_shape == the shape actually computed,
and the public signatures (a contract with code outside this repository)."""

import inspect

import numpy as np
import pytest

import convgrad
from convgrad import ConvGradError, onednn, openvino, tf

SPEC_NAMES = ["ConvolutionBackwardWeights", "ConvolutionBackpropFilters",
              "ConvTransposeBackpropFilters", "ConvTransposeBackwardWeights",
              "ConvolutionBackwardData", "ConvTransposeBackwardData",
              "GroupConvolutionBackpropData", "ConvolutionBackpropData", "GroupConvolution",
              "Conv2DBackpropFilter", "Conv2DBackpropInput", "Conv3DBackpropFilterV2",
              "Conv3DBackpropInputV2", "DepthwiseConv2dNativeBackpropFilter",
              "DepthwiseConv2dNativeBackpropInput", "onednn:Convolution",
              "openvino:Convolution", "ConvTranspose"]


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_spec_names_resolve(name):
    assert convgrad.op(name, strides=[1]).name == name.split(":")[-1]


def test_ambiguous_and_unknown_names_list_the_valid_ones():
    with pytest.raises(ConvGradError, match="onednn:Convolution.*openvino:Convolution"):
        convgrad.op("Convolution", strides=[1])
    with pytest.raises(ConvGradError, match="GroupConvolutionBackpropData"):
        convgrad.op("GroupConvolutionBackpropFilters")


def test_unknown_attribute_lists_the_valid_ones():
    with pytest.raises(ConvGradError, match="unknown attribute.*pads_begin.*output_padding"):
        convgrad.op("GroupConvolutionBackpropData", strides=[1], group=4)
    with pytest.raises(ConvGradError, match="weights_shape"):
        convgrad.op("ConvolutionBackwardWeights", strides=[1], filter_shape=[3])


def _nxc(shape):
    return (shape[0], *shape[2:], shape[1])


CALLS = [
    # (name, attrs, inputs given by shape/value)
    ("ConvolutionBackwardWeights", dict(strides=[2, 1], pads_begin=[1, 0], pads_end=[0, 1],
                                        groups=2, weights_shape=[3, 2]),
     [(2, 7, 6, 4), (2, 3, 6, 6)]),
    ("ConvolutionBackpropFilters", dict(strides=[1], data_format="NCX", filter_format="OIX"),
     [(1, 3, 8), [5, 3, 3], (1, 5, 6)]),
    ("ConvTransposeBackpropFilters", dict(strides=[2], output_padding=[1], filter_shape=[3]),
     [(1, 4, 6), (1, 10, 2)]),
    ("ConvTransposeBackwardWeights", dict(strides=[2, 2], auto_pad="SAME_UPPER",
                                          weights_format="IOX", groups=2),
     [(1, 3, 3, 4), (1, 6, 6, 6), [4, 3, 3, 3]]),
    ("ConvolutionBackwardData", dict(strides=[2], dst_shape=[9]), [(1, 4, 6), (3, 2, 6)]),
    ("ConvTransposeBackwardData", dict(strides=[2], pads_begin=[1], pads_end=[1]),
     [(1, 9, 6), (3, 6, 4)]),
    ("onednn:Convolution", dict(strides=[1, 1, 1], auto_pad="same_lower"),
     [(1, 5, 5, 5, 2), (3, 3, 3, 2, 4)]),
    ("ConvTranspose", dict(strides=[3], dilations=[2], output_padding=[2]),
     [(2, 4, 3), (3, 2, 3)]),
    ("GroupConvolutionBackpropData", dict(strides=[2, 2], auto_pad="same_upper"),
     [(1, 4, 3, 3), (2, 2, 3, 3, 3), [5, 6]]),
    ("ConvolutionBackpropData", dict(strides=[1], dilations=[2], output_padding=[3]),
     [(1, 2, 4), (2, 3, 3)]),
    ("GroupConvolution", dict(strides=[1], auto_pad="valid"), [(1, 6, 5), (3, 2, 2, 3)]),
    ("openvino:Convolution", dict(strides=[2], pads_begin=[1], pads_end=[1]),
     [(2, 3, 9), (4, 3, 3)]),
    ("Conv2DBackpropFilter", dict(strides=[1, 2, 2, 1], padding="SAME"),
     [(1, 5, 5, 4), [3, 3, 2, 6], (1, 3, 3, 6)]),
    ("Conv2DBackpropInput", dict(strides=[1, 1, 1, 1], padding="VALID",
                                 dilations=[1, 2, 2, 1]),
     [[1, 9, 9, 4], (3, 3, 4, 2), (1, 5, 5, 2)]),
    ("Conv3DBackpropFilterV2", dict(strides=[1, 1, 1, 1, 1], padding="SAME"),
     [(1, 3, 4, 5, 2), [1, 2, 3, 2, 3], (1, 3, 4, 5, 3)]),
    ("Conv3DBackpropInputV2", dict(strides=[1, 2, 1, 1, 1], padding="VALID"),
     [[1, 5, 4, 4, 2], (2, 2, 2, 2, 3), (1, 2, 3, 3, 3)]),
    ("DepthwiseConv2dNativeBackpropFilter", dict(strides=[1, 1, 1, 1], padding="SAME"),
     [(1, 4, 4, 3), [3, 3, 3, 2], (1, 4, 4, 6)]),
    ("DepthwiseConv2dNativeBackpropInput", dict(strides=[1, 2, 2, 1], padding="SAME"),
     [[1, 5, 5, 3], (3, 3, 3, 1), (1, 3, 3, 3)]),
    ("conv2d_transpose", dict(strides=2, padding="SAME"),
     [(1, 3, 3, 4), (3, 3, 5, 4), [1, 6, 6, 5]]),
    ("conv1d_transpose", dict(strides=[2], padding="VALID"),
     [(1, 3, 4), (3, 5, 4), [1, 7, 5]]),
]


@pytest.mark.parametrize("name,attrs,inputs", CALLS, ids=[c[0] for c in CALLS])
def test_infer_shape_equals_computed_shape(name, attrs, inputs):
    op = convgrad.op(name, **attrs)
    shape = op.infer_shape(*inputs)
    rng = np.random.default_rng(0)
    entry = op.entry
    arrays = [rng.standard_normal(v).astype(np.float32) if n in entry.tensors else v
              for n, v in zip(entry.inputs, inputs)]
    out = op(*arrays)
    assert out.shape == shape and out.dtype == np.float32


def test_infer_shape_rejects_bad_tensor_shapes():
    op = convgrad.op("ConvolutionBackwardWeights", strides=[1], weights_shape=[3])
    with pytest.raises(ConvGradError, match="shape of src"):
        op.infer_shape((1, -4, 2), (1, 2, 2))
    with pytest.raises(ConvGradError, match="shape of src"):
        op.infer_shape(5, (1, 2, 2))


SIGNATURES = {
    onednn.convolution_backward_weights:
        "(src, diff_dst, weights_shape=None, *, strides, pads_begin=None, pads_end=None, "
        "dilations=None, auto_pad='None', groups=1, data_format='NXC', weights_format='XIO')",
    onednn.convolution_backprop_filters:
        "(input, filters_shape, output_delta, *, strides, pads_begin=None, pads_end=None, "
        "dilations=None, auto_pad=None, groups=1, data_format='NXC', filter_format='XIO')",
    onednn.conv_transpose_backprop_filters:
        "(input, output_delta, filter_shape=None, *, strides, pads_begin=None, pads_end=None, "
        "dilations=None, auto_pad=None, output_padding=None, groups=1, data_format='NXC', "
        "filter_format='XIO')",
    openvino.group_convolution_backprop_data:
        "(data, filter, output_shape=None, *, strides, pads_begin=None, pads_end=None, "
        "dilations=None, auto_pad='explicit', output_padding=None)",
    convgrad.conv_weight_grad:
        "(x, dy, kernel_shape, *, strides=None, pads_begin=None, pads_end=None, "
        "dilations=None, groups=1)",
}


@pytest.mark.parametrize("fn", list(SIGNATURES), ids=lambda f: f.__name__)
def test_public_signatures(fn):
    assert str(inspect.signature(fn)) == SIGNATURES[fn]


def test_tf_signature_starts_with_tensorflow_argument_order():
    params = list(inspect.signature(tf.conv2d_backprop_filter).parameters)
    assert params[:8] == ["input", "filter_sizes", "out_backprop", "strides", "padding",
                          "data_format", "dilations", "explicit_paddings"]
