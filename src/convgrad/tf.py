"""TensorFlow dialect: conv2d_backprop_filter and its siblings.

Argument names and defaults follow TensorFlow (raw ops / ``tf.nn`` wrappers).
Beyond what TensorFlow's own CPU kernels accept, this dialect computes what
the ops define for dilations > 1, grouped convolution (input depth a multiple
of the filter's in-depth) and explicit padding in every op.

- ``strides`` / ``dilations``: an int, one value per spatial axis, or one value
  per dimension in ``data_format`` order (batch and channel entries must be 1).
- ``padding``: ``"SAME"`` (odd pad at the end), ``"VALID"``, ``"EXPLICIT"``
  (with ``explicit_paddings``, ``2 * rank`` values in ``data_format`` order), or
  a list of ``[before, after]`` pairs (one per dimension, or one per spatial axis).
- Shape inputs (``filter_sizes``, ``input_sizes``, ``output_shape``): full, or
  spatial only (then groups = 1, channels taken from the tensors).
"""

from __future__ import annotations

import numpy as np

from .errors import fail
from .frontends._common import (ConvAttrs, check_equal, check_kernel, data_shape, make_plan,
                                same_rank, weights_dims)
from .frontends._plan import spec_op
from .geometry import check_conv_output, int_tuple, make_geometry, resolve_pads, shape_input
from .layouts import NCX, NXC, TF_DEPTHWISE_WEIGHTS, TF_WEIGHTS

DIALECT = "tf"

_FORMATS = {3: ("NWC", "NCW"), 4: ("NHWC", "NCHW"), 5: ("NDHWC", "NCDHW")}


def _layout(op, data_format, rank):
    if data_format is None:
        data_format = _FORMATS[rank][0]
    if not isinstance(data_format, str) or data_format.upper() not in _FORMATS[rank]:
        raise fail(op, "data_format", data_format,
                   f"must be one of {', '.join(_FORMATS[rank])} for rank-{rank} tensors")
    return NXC if data_format.upper().endswith("C") else NCX


def _per_dim(op, name, value, rank, dl, default=1):
    """strides/dilations: int, spatial list, or full list (batch/channel = 1)."""
    if value is None:
        return (default,) * (rank - 2)
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if isinstance(value, (list, tuple)) and len(value) == rank:
        vals = int_tuple(op, name, value, rank, minimum=1)
        canon = dl.canonical_shape(vals)
        if canon[0] != 1 or canon[1] != 1:
            raise fail(op, name, list(vals), "the batch and channel entries must be 1")
        return tuple(canon[2:])
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return int_tuple(op, name, value, rank - 2, minimum=1)


def _given(value) -> bool:
    """True unless ``value`` is None or an empty sequence (TF's default ``[]``)."""
    if value is None:
        return False
    try:
        return len(value) > 0
    except TypeError:
        return True


def _padding(op, padding, explicit_paddings, rank, dl):
    """(mode, pads_begin, pads_end) from TF's padding arguments."""
    pairs = None
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "SAME":
            if _given(explicit_paddings):
                raise fail(op, "explicit_paddings", explicit_paddings,
                           "must be empty unless padding is 'EXPLICIT'")
            return "same_upper", None, None
        if mode == "VALID":
            if _given(explicit_paddings):
                raise fail(op, "explicit_paddings", explicit_paddings,
                           "must be empty unless padding is 'EXPLICIT'")
            return "valid", None, None
        if mode != "EXPLICIT":
            raise fail(op, "padding", padding,
                       "must be 'SAME', 'VALID', 'EXPLICIT' or a list of [before, after] pairs")
        flat = int_tuple(op, "explicit_paddings", [] if explicit_paddings is None
                         else explicit_paddings, 2 * rank, allow_scalar=False)
        pairs = [flat[2 * i:2 * i + 2] for i in range(rank)]
    else:
        try:
            pairs = [tuple(p) for p in padding]
        except TypeError:
            raise fail(op, "padding", padding, "must be 'SAME', 'VALID', 'EXPLICIT' or a "
                                               "list of [before, after] pairs") from None
        if _given(explicit_paddings):
            raise fail(op, "explicit_paddings", explicit_paddings,
                       "must be empty when padding is a list of pairs")
        for p in pairs:
            int_tuple(op, "padding", list(p), 2, allow_scalar=False)
        if len(pairs) not in (rank, rank - 2):
            raise fail(op, "padding", [list(p) for p in pairs],
                       f"must have {rank} pairs (one per dimension) or {rank - 2} "
                       "(one per spatial axis)")
    if len(pairs) == rank:
        canon = dl.canonical_shape(pairs)
        if any(v != 0 for v in (*canon[0], *canon[1])):
            raise fail(op, "padding", [list(p) for p in pairs],
                       "the batch and channel pairs must be [0, 0]")
        pairs = canon[2:]
    flat = [v for p in pairs for v in p]
    if any(v < 0 for v in flat):
        raise fail(op, "padding", [list(p) for p in pairs],
                   "all explicit paddings must be non-negative")
    return "explicit", tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def _attrs(op, rank, dl, strides, padding, dilations, explicit_paddings):
    if strides is None:
        raise fail(op, "strides", strides, "is required")
    s = _per_dim(op, "strides", strides, rank, dl)
    d = _per_dim(op, "dilations", dilations, rank, dl)
    mode, pb, pe = _padding(op, padding, explicit_paddings, rank, dl)
    zeros = (0,) * (rank - 2)
    return ConvAttrs(s, d, pb or zeros, pe or zeros, mode, zeros)


def _wgrad(op, input, filter_sizes, out_backprop, strides, padding, data_format, dilations,
           explicit_paddings, *, rank, depthwise=False):
    dl = _layout(op, data_format, rank)
    same_rank(op, ("input", "out_backprop"), (input, out_backprop))
    n, c, in_sizes = data_shape(op, "input", input, dl, rank)
    n2, o, out_sizes = data_shape(op, "out_backprop", out_backprop, dl, rank)
    check_equal(op, "batch of out_backprop", n2, n, "batch of input")
    a = _attrs(op, rank, dl, strides, padding, dilations, explicit_paddings)
    dims, full = shape_input(op, "filter_sizes", filter_sizes, rank)
    wl = TF_DEPTHWISE_WEIGHTS if depthwise else TF_WEIGHTS
    kernel = dims[:rank - 2]
    check_kernel(op, "filter_sizes", kernel)
    if depthwise:
        groups = c
        if full:
            check_equal(op, "filter_sizes in_channels", dims[-2], c, "channels of input")
            check_equal(op, "filter_sizes in_channels x channel_multiplier",
                        dims[-2] * dims[-1], o, "channels of out_backprop")
        elif c == 0 or o % c:
            raise fail(op, "channels of out_backprop", o,
                       f"must be a multiple of the input channels {c}")
    elif full:
        fin, fout = dims[-2], dims[-1]
        check_equal(op, "filter_sizes out_channels", fout, o, "channels of out_backprop")
        if fin < 1 or c % fin:
            raise fail(op, "filter_sizes in_channels", fin,
                       f"must be positive and divide the input depth {c}")
        groups = c // fin
    else:
        groups = 1
    pb, pe = resolve_pads(op, a.mode, in_sizes, kernel, a.strides, a.dilations,
                          a.pads_begin, a.pads_end)
    check_conv_output(op, "out_backprop", out_sizes, "input", in_sizes, kernel, a.strides,
                      a.dilations, pb, pe)
    geom = make_geometry(op, n=n, c=c, o=o, groups=groups, in_sizes=in_sizes, kernel=kernel,
                         out_sizes=out_sizes, strides=a.strides, dilations=a.dilations,
                         pads_begin=pb, pads_end=pe,
                         channel_names=("input depth", "out_backprop depth"))
    return make_plan(op, "wgrad", geom, names={"x": "input", "dy": "out_backprop"},
                     data_layout=dl, weight_layout=wl)


def _dgrad(op, sizes_name, input_sizes, filter_name, filter, out_backprop, strides, padding,
           data_format, dilations, explicit_paddings, *, rank, depthwise=False,
           dy_name="out_backprop"):
    dl = _layout(op, data_format, rank)
    n, o, out_sizes = data_shape(op, dy_name, out_backprop, dl, rank)
    a = _attrs(op, rank, dl, strides, padding, dilations, explicit_paddings)
    wl = TF_DEPTHWISE_WEIGHTS if depthwise else TF_WEIGHTS
    o_w, cg, kernel = weights_dims(op, filter, rank, wl, 1, o_role="out_channels",
                                   name=filter_name)
    check_equal(op, f"{filter_name} out_channels", o_w, o, f"channels of {dy_name}")
    dims, full = shape_input(op, sizes_name, input_sizes, rank)
    if full:
        nn, c, *in_sizes = dl.canonical_shape(dims)
        in_sizes = tuple(in_sizes)
        check_equal(op, f"{sizes_name} batch", nn, n, f"batch of {dy_name}")
    else:
        c, in_sizes = (filter.shape[-2] if depthwise else cg), dims
    if depthwise:
        groups = c
        check_equal(op, f"{sizes_name} channels", c, filter.shape[-2],
                    f"{filter_name} in_channels")
    else:
        if cg < 1 or c % cg:
            raise fail(op, f"{sizes_name} channels", c,
                       f"must be a multiple of the {filter_name} in_channels {cg}")
        groups = c // cg
    pb, pe = resolve_pads(op, a.mode, in_sizes, kernel, a.strides, a.dilations,
                          a.pads_begin, a.pads_end)
    check_conv_output(op, dy_name, out_sizes, sizes_name, in_sizes, kernel, a.strides,
                      a.dilations, pb, pe)
    geom = make_geometry(op, n=n, c=c, o=o, groups=groups, in_sizes=in_sizes, kernel=kernel,
                         out_sizes=out_sizes, strides=a.strides, dilations=a.dilations,
                         pads_begin=pb, pads_end=pe,
                         channel_names=(f"{sizes_name} depth", f"{dy_name} depth"))
    return make_plan(op, "dgrad", geom, names={"w": filter_name, "dy": dy_name},
                     data_layout=dl, weight_layout=wl)


@spec_op("Conv2DBackpropFilter", DIALECT, inputs=("input", "filter_sizes", "out_backprop"),
         tensors=("input", "out_backprop"))
def conv2d_backprop_filter(input, filter_sizes, out_backprop, strides, padding,  # noqa: A002
                           data_format="NHWC", dilations=None, explicit_paddings=None, *,
                           use_cudnn_on_gpu=True, name=None):
    """TensorFlow Conv2DBackpropFilter: the gradient w.r.t. the filter.

    Parameters
    ----------
    input : ndarray
        4-D, ``[batch, in_height, in_width, in_channels]`` (NHWC) or NCHW.
    filter_sizes : list of int
        ``[filter_height, filter_width, in_channels / groups, out_channels]``
        (or the 2 spatial sizes, then groups = 1).
    out_backprop : ndarray
        The gradient of the conv output, of exactly the output size.
    strides : int or list of int
        One per spatial axis, or 4 in ``data_format`` order (batch/channel 1).
    padding : {"SAME", "VALID", "EXPLICIT"} or list of [before, after] pairs
        SAME puts an odd total at the end.
    data_format : {"NHWC", "NCHW"}, optional
    dilations : int or list of int, optional
        Computed for any value (TensorFlow's CPU kernels refuse > 1).
    explicit_paddings : list of int, optional
        With padding="EXPLICIT": 8 values, [before, after] per dimension.

    Returns
    -------
    ndarray
        The filter gradient, HWIO, with the input's dtype.

    Examples
    --------
    >>> x = np.arange(1.0, 7.0).reshape(1, 2, 3, 1)
    >>> dy = np.array([1.0, 2.0]).reshape(1, 1, 2, 1)
    >>> conv2d_backprop_filter(x, [2, 2, 1, 1], dy, [1, 1, 1, 1], "VALID").ravel()
    array([ 5.,  8., 14., 17.])
    """
    return _wgrad("Conv2DBackpropFilter", input, filter_sizes, out_backprop, strides, padding,
                  data_format, dilations, explicit_paddings, rank=4)


@spec_op("Conv2DBackpropInput", DIALECT, inputs=("input_sizes", "filter", "out_backprop"),
         tensors=("filter", "out_backprop"))
def conv2d_backprop_input(input_sizes, filter, out_backprop, strides, padding,  # noqa: A002
                          data_format="NHWC", dilations=None, explicit_paddings=None, *,
                          use_cudnn_on_gpu=True, name=None):
    """TensorFlow Conv2DBackpropInput: gradient w.r.t. the input, of shape
    ``input_sizes`` (4 values, or 2 spatial values).

    See Also
    --------
    conv2d_backprop_filter : the arguments shared by every op (strides,
        padding, data_format, dilations, explicit_paddings), in full.
    """
    return _dgrad("Conv2DBackpropInput", "input_sizes", input_sizes, "filter", filter,
                  out_backprop, strides, padding, data_format, dilations, explicit_paddings,
                  rank=4)


@spec_op("Conv3DBackpropFilterV2", DIALECT, inputs=("input", "filter_sizes", "out_backprop"),
         tensors=("input", "out_backprop"))
def conv3d_backprop_filter_v2(input, filter_sizes, out_backprop, strides, padding,  # noqa: A002
                              data_format="NDHWC", dilations=None, explicit_paddings=None, *,
                              name=None):
    """TensorFlow Conv3DBackpropFilterV2: gradient w.r.t. the DHWIO filter.

    See Also
    --------
    conv2d_backprop_filter : the arguments shared by every op (strides,
        padding, data_format, dilations, explicit_paddings), in full.
    """
    return _wgrad("Conv3DBackpropFilterV2", input, filter_sizes, out_backprop, strides,
                  padding, data_format, dilations, explicit_paddings, rank=5)


@spec_op("Conv3DBackpropInputV2", DIALECT, inputs=("input_sizes", "filter", "out_backprop"),
         tensors=("filter", "out_backprop"))
def conv3d_backprop_input_v2(input_sizes, filter, out_backprop, strides, padding,  # noqa: A002
                             data_format="NDHWC", dilations=None, explicit_paddings=None, *,
                             name=None):
    """TensorFlow Conv3DBackpropInputV2: gradient w.r.t. the input.

    See Also
    --------
    conv2d_backprop_filter : the arguments shared by every op (strides,
        padding, data_format, dilations, explicit_paddings), in full.
    """
    return _dgrad("Conv3DBackpropInputV2", "input_sizes", input_sizes, "filter", filter,
                  out_backprop, strides, padding, data_format, dilations, explicit_paddings,
                  rank=5)


@spec_op("DepthwiseConv2dNativeBackpropFilter", DIALECT,
         inputs=("input", "filter_sizes", "out_backprop"), tensors=("input", "out_backprop"))
def depthwise_conv2d_native_backprop_filter(input, filter_sizes, out_backprop,  # noqa: A002
                                            strides, padding, data_format="NHWC",
                                            dilations=None, explicit_paddings=None, *,
                                            name=None):
    """TensorFlow DepthwiseConv2dNativeBackpropFilter: gradient w.r.t. the
    filter ``[filter_height, filter_width, in_channels, channel_multiplier]``
    (output channel ``k * multiplier + q`` comes from input channel ``k``).

    See Also
    --------
    conv2d_backprop_filter : the arguments shared by every op (strides,
        padding, data_format, dilations, explicit_paddings), in full.
    """
    return _wgrad("DepthwiseConv2dNativeBackpropFilter", input, filter_sizes, out_backprop,
                  strides, padding, data_format, dilations, explicit_paddings, rank=4,
                  depthwise=True)


@spec_op("DepthwiseConv2dNativeBackpropInput", DIALECT,
         inputs=("input_sizes", "filter", "out_backprop"), tensors=("filter", "out_backprop"))
def depthwise_conv2d_native_backprop_input(input_sizes, filter, out_backprop,  # noqa: A002
                                           strides, padding, data_format="NHWC",
                                           dilations=None, explicit_paddings=None, *,
                                           name=None):
    """TensorFlow DepthwiseConv2dNativeBackpropInput: gradient w.r.t. the input.

    See Also
    --------
    conv2d_backprop_filter : the arguments shared by every op (strides,
        padding, data_format, dilations, explicit_paddings), in full.
    depthwise_conv2d_native_backprop_filter : the depthwise filter layout.
    """
    return _dgrad("DepthwiseConv2dNativeBackpropInput", "input_sizes", input_sizes, "filter",
                  filter, out_backprop, strides, padding, data_format, dilations,
                  explicit_paddings, rank=4, depthwise=True)


def _transpose(op, input, filters, output_shape, strides, padding, data_format, dilations,
               rank):
    # tf.nn.convNd_transpose(x) = ConvNDBackpropInput(input_sizes=output_shape,
    # filter=filters, out_backprop=x): filters are [*K, out_channels, in_channels].
    explicit = None
    return _dgrad(op, "output_shape", output_shape, "filters", filters, input, strides,
                  padding, data_format, dilations, explicit, rank=rank, dy_name="input")


@spec_op("conv1d_transpose", DIALECT, inputs=("input", "filters", "output_shape"),
         tensors=("input", "filters"))
def conv1d_transpose(input, filters, output_shape, strides, padding="SAME",  # noqa: A002
                     data_format="NWC", dilations=None, name=None):
    """``tf.nn.conv1d_transpose``: filters ``[width, out_channels, in_channels]``;
    the result has shape ``output_shape`` (3 values, or 1 spatial value).

    See Also
    --------
    conv2d_backprop_filter : the arguments shared by every op (strides,
        padding, data_format, dilations, explicit_paddings), in full.
    conv2d_transpose : the same op in 2-D.
    """
    return _transpose("conv1d_transpose", input, filters, output_shape, strides, padding,
                      data_format, dilations, rank=3)


@spec_op("conv2d_transpose", DIALECT, inputs=("input", "filters", "output_shape"),
         tensors=("input", "filters"))
def conv2d_transpose(input, filters, output_shape, strides, padding="SAME",  # noqa: A002
                     data_format="NHWC", dilations=None, name=None):
    """``tf.nn.conv2d_transpose``: filters ``[height, width, out_channels,
    in_channels]``; the result has shape ``output_shape`` (4 values, or 2 spatial).

    See Also
    --------
    conv2d_backprop_filter : the arguments shared by every op (strides,
        padding, data_format, dilations, explicit_paddings), in full.
    conv2d_backprop_input : the op it computes, ``input_sizes = output_shape``.
    """
    return _transpose("conv2d_transpose", input, filters, output_shape, strides, padding,
                      data_format, dilations, rank=4)


__all__ = ["conv2d_backprop_filter", "conv2d_backprop_input", "conv3d_backprop_filter_v2",
           "conv3d_backprop_input_v2", "depthwise_conv2d_native_backprop_filter",
           "depthwise_conv2d_native_backprop_input", "conv1d_transpose", "conv2d_transpose"]
