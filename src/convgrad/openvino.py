"""OpenVINO opset1 dialect: GroupConvolutionBackpropData and its family.

Layout is NCX; kernels are ``[C_OUT, C_IN, X]`` (Convolution),
``[G, C_OUT, C_IN, X]`` (GroupConvolution), ``[C_IN, C_OUT, X]``
(ConvolutionBackpropData) and ``[G, C_IN, C_OUT, X]``
(GroupConvolutionBackpropData); the backprop kernels are the same tensors as
the matching forward kernels.  Groups come from the kernel's first dim.

The backprop ops follow the OpenVINO runtime (docs/decisions.md D6): without
``output_shape``, same_* pads are zero; with it, same_upper puts the odd pad
at the *beginning* and output_padding counts in the total; output_padding may
be any non-negative value (positions past the full transposed extent are 0).
Integer dtypes are computed exactly (int64) and saturate to the dtype's range
(the CPU runtime computes in f32 and saturates; it loses precision past 2**24).
"""

from __future__ import annotations

from .errors import fail
from .frontends._common import check_equal, conv_attrs, data_shape, make_plan, weights_dims
from .frontends._plan import spec_op
from .geometry import (conv_out_sizes, make_geometry, openvino_backprop_pads, resolve_pads,
                       shape_input)
from .layouts import NCX, OV_GROUP_WEIGHTS, OV_WEIGHTS

DIALECT = "openvino"


def _kernel(op, filter, rank, grouped):
    """(layout, groups, canonical O, C/G, kernel) of an OpenVINO kernel tensor."""
    wl = OV_GROUP_WEIGHTS if grouped else OV_WEIGHTS
    want = wl.rank(rank - 2)
    if len(filter.shape) != want:
        raise fail(op, "rank of filter", len(filter.shape),
                   f"must be {want} for rank-{rank} data (shape {list(filter.shape)})")
    groups = filter.shape[0] if grouped else 1
    if groups < 1:
        raise fail(op, "filter groups (dim 0)", groups, "must be positive")
    o, cg, kernel = weights_dims(op, filter, rank, wl, groups, o_role="channels")
    return wl, groups, o, cg, kernel


def _forward(op, data, filter, strides, pads_begin, pads_end, dilations, auto_pad, grouped):
    n, c, in_sizes = data_shape(op, "data", data, NCX)
    rank = len(data.shape)
    wl, groups, o, cg, kernel = _kernel(op, filter, rank, grouped)
    check_equal(op, "data channels", c, cg * groups,
                f"filter input channels {cg} x groups {groups}")
    a = conv_attrs(op, rank - 2, strides=strides, pads_begin=pads_begin, pads_end=pads_end,
                   dilations=dilations, auto_pad=auto_pad)
    pb, pe = resolve_pads(op, a.mode, in_sizes, kernel, a.strides, a.dilations,
                          a.pads_begin, a.pads_end)
    out_sizes = conv_out_sizes(op, in_sizes, kernel, a.strides, a.dilations, pb, pe,
                               what="data")
    geom = make_geometry(op, n=n, c=c, o=o, groups=groups, in_sizes=in_sizes, kernel=kernel,
                         out_sizes=out_sizes, strides=a.strides, dilations=a.dilations,
                         pads_begin=pb, pads_end=pe)
    return make_plan(op, "fwd", geom, names={"x": "data", "w": "filter"}, data_layout=NCX,
                     weight_layout=wl, allow_int=True)


def _backprop(op, data, filter, output_shape, strides, pads_begin, pads_end, dilations,
              auto_pad, output_padding, grouped):
    # The op is the data gradient of the forward conv whose output is `data`:
    # canonical dy = data (N, G*C_IN, L); canonical w (G*C_IN, C_OUT, K); result x.
    n, c_in, in_sizes = data_shape(op, "data", data, NCX)
    if any(v < 1 for v in in_sizes):
        raise fail(op, "spatial shape of data", list(in_sizes), "must be positive")
    rank = len(data.shape)
    wl, groups, o, cg, kernel = _kernel(op, filter, rank, grouped)
    check_equal(op, "data channels", c_in, o,
                f"filter C_IN {o // groups} x groups {groups}" if grouped else "filter C_IN")
    a = conv_attrs(op, rank - 2, strides=strides, pads_begin=pads_begin, pads_end=pads_end,
                   dilations=dilations, auto_pad=auto_pad, output_padding=output_padding,
                   strict_output_padding=False)
    out_spatial = None
    if output_shape is not None:
        dims, full = shape_input(op, "output_shape", output_shape, rank)
        if full:
            check_equal(op, "output_shape batch", dims[0], n, "batch of data")
            check_equal(op, "output_shape channels", dims[1], cg * groups,
                        f"filter C_OUT {cg} x groups {groups}")
        out_spatial = dims[2:] if full else dims
    pb, pe, out_sizes = openvino_backprop_pads(op, a.mode, in_sizes, kernel, a.strides,
                                               a.dilations, a.pads_begin, a.pads_end,
                                               a.output_padding, out_spatial)
    geom = make_geometry(op, n=n, c=cg * groups, o=c_in, groups=groups, in_sizes=out_sizes,
                         kernel=kernel, out_sizes=in_sizes, strides=a.strides,
                         dilations=a.dilations, pads_begin=pb, pads_end=pe)
    return make_plan(op, "dgrad", geom, names={"w": "filter", "dy": "data"}, data_layout=NCX,
                     weight_layout=wl, allow_int=True)


@spec_op("GroupConvolutionBackpropData", DIALECT, inputs=("data", "filter", "output_shape"),
         tensors=("data", "filter"))
def group_convolution_backprop_data(data, filter, output_shape=None, *,  # noqa: A002
                                    strides, pads_begin=None, pads_end=None, dilations=None,
                                    auto_pad="explicit", output_padding=None):
    """OpenVINO GroupConvolutionBackpropData-1.

    Parameters
    ----------
    data : ndarray
        ``[N, GROUPS * C_IN, Z, Y, X]`` (rank 3 to 5), any numeric dtype.
    filter : ndarray
        ``[GROUPS, C_IN, C_OUT, Z, Y, X]``; the number of groups is its first dim.
    output_shape : list of int, optional
        Spatial output shape (or the full ``[N, GROUPS * C_OUT, ...]``).
    strides : list of int
        Positive, per spatial axis.
    pads_begin, pads_end : list of int, optional
        Non-negative; used with ``auto_pad="explicit"`` only.  With
        output_shape, only pads_begin matters.
    dilations : list of int, optional
        Positive, default 1.
    auto_pad : {"explicit", "same_upper", "same_lower", "valid"}, optional
        Without output_shape, same_* and valid use zero pads.  With it, same_*
        split ``max(0, s*(L-1) + Ke - out + output_padding)`` with the odd
        element at the *beginning* for same_upper (the runtime's rule).
    output_padding : list of int, optional
        Non-negative; extra positions at the end (zeros past the full extent).

    Returns
    -------
    ndarray
        ``[N, GROUPS * C_OUT, ...]`` with the data's dtype (integers saturate).

    Examples
    --------
    >>> data = np.array([[[1.0, 2.0]]])
    >>> kernel = np.array([[[[1.0, 10.0, 100.0]]]])
    >>> group_convolution_backprop_data(data, kernel, strides=[2])
    array([[[  1.,  10., 102.,  20., 200.]]])
    >>> group_convolution_backprop_data(data, kernel, [4], strides=[2], auto_pad="same_upper")
    array([[[ 10., 102.,  20., 200.]]])
    """
    return _backprop("GroupConvolutionBackpropData", data, filter, output_shape, strides,
                     pads_begin, pads_end, dilations, auto_pad, output_padding, grouped=True)


@spec_op("ConvolutionBackpropData", DIALECT, inputs=("data", "filter", "output_shape"),
         tensors=("data", "filter"))
def convolution_backprop_data(data, filter, output_shape=None, *, strides,  # noqa: A002
                              pads_begin=None, pads_end=None, dilations=None,
                              auto_pad="explicit", output_padding=None):
    """OpenVINO ConvolutionBackpropData-1: data ``[N, C_IN, X...]``, filter
    ``[C_IN, C_OUT, X...]``; returns ``[N, C_OUT, X'...]``.

    See Also
    --------
    group_convolution_backprop_data : the attributes (strides, pads, dilations,
        auto_pad, output_padding, output_shape) in full.
    """
    return _backprop("ConvolutionBackpropData", data, filter, output_shape, strides,
                     pads_begin, pads_end, dilations, auto_pad, output_padding, grouped=False)


@spec_op("Convolution", DIALECT, inputs=("data", "filter"), tensors=("data", "filter"))
def convolution(data, filter, *, strides, pads_begin=None, pads_end=None,  # noqa: A002
                dilations=None, auto_pad="explicit"):
    """OpenVINO Convolution-1: data ``[N, C_IN, X...]``, filter ``[C_OUT, C_IN, X...]``.

    See Also
    --------
    group_convolution_backprop_data : the attributes (strides, pads, dilations,
        auto_pad, output_padding, output_shape) in full.
    """
    return _forward("Convolution", data, filter, strides, pads_begin, pads_end, dilations,
                    auto_pad, grouped=False)


@spec_op("GroupConvolution", DIALECT, inputs=("data", "filter"), tensors=("data", "filter"))
def group_convolution(data, filter, *, strides, pads_begin=None, pads_end=None,  # noqa: A002
                      dilations=None, auto_pad="explicit"):
    """OpenVINO GroupConvolution-1: data ``[N, G*C_IN, X...]``, filter
    ``[G, C_OUT, C_IN, X...]``.

    See Also
    --------
    group_convolution_backprop_data : the attributes (strides, pads, dilations,
        auto_pad, output_padding, output_shape) in full.
    """
    return _forward("GroupConvolution", data, filter, strides, pads_begin, pads_end,
                    dilations, auto_pad, grouped=True)


__all__ = ["group_convolution_backprop_data", "convolution_backprop_data", "convolution",
           "group_convolution"]
