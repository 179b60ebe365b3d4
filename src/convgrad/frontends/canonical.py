"""The plain canonical API: NCX data, OIX weights ``(O, C/G, *K)``, explicit pads.

Every dialect maps onto the same canonical problem (``geometry.ConvGeometry``)
and the same compute entry point (``ops.compute``) as these functions.
"""

from __future__ import annotations

from ..geometry import (check_conv_output, conv_out_sizes, make_geometry, positive_int,
                        shape_input, transposed_sizes)
from ..layouts import NCX, OIX
from ._common import check_equal, conv_attrs, data_shape, make_plan, same_rank, weights_dims
from ._plan import spec_op

DIALECT = "canonical"


def _attrs(op, rank, strides, pads_begin, pads_end, dilations, output_padding=None):
    return conv_attrs(op, rank - 2, strides=(1,) * (rank - 2) if strides is None else strides,
                      pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
                      output_padding=output_padding)


def _check_out(op, name, got, in_sizes, kernel, a):
    check_conv_output(op, name, got, "input", in_sizes, kernel, a.strides, a.dilations,
                      a.pads_begin, a.pads_end)


@spec_op("conv_weight_grad", DIALECT, inputs=("x", "dy", "kernel_shape"), tensors=("x", "dy"))
def conv_weight_grad(x, dy, kernel_shape, *, strides=None, pads_begin=None, pads_end=None,
                     dilations=None, groups=1):
    """Weight gradient ``dw[O, C/G, *K]`` of ``y = conv(x, w)``.

    Parameters
    ----------
    x : ndarray
        The convolution's input ``(N, C, *S)``, rank 3 to 5.
    dy : ndarray
        The gradient of its output ``(N, O, *M)``; ``M`` must be exactly
        ``floor((S + pb + pe - Ke) / s) + 1``.
    kernel_shape : list of int
        ``(O, C/G, *K)`` or ``K``.
    strides : list of int, optional
        Stride per spatial axis (positive), default 1.
    pads_begin, pads_end : list of int, optional
        Non-negative explicit padding per spatial axis, default 0.
    dilations : list of int, optional
        Dilation per spatial axis, 1 = dense (default).
    groups : int, optional
        Channels split into ``groups`` contiguous blocks (default 1).

    Returns
    -------
    ndarray
        ``dw`` of shape ``(O, C/G, *K)``, with the inputs' dtype.

    Raises
    ------
    ConvGradError
        An attribute or shape breaks a rule (the message names it).
    """
    op = "conv_weight_grad"
    rank = same_rank(op, ("x", "dy"), (x, dy))
    n, c, in_sizes = data_shape(op, "x", x, NCX)
    n2, o, out_sizes = data_shape(op, "dy", dy, NCX)
    check_equal(op, "batch of dy", n2, n, "batch of x")
    groups = positive_int(op, "groups", groups)
    dims, full = shape_input(op, "kernel_shape", kernel_shape, rank)
    if full:
        check_equal(op, "kernel_shape[0]", dims[0], o, "channels of dy")
        check_equal(op, "kernel_shape[1]", dims[1] * groups, c,
                    f"channels of x / groups {groups}")
    kernel = dims[2:] if full else dims
    a = _attrs(op, rank, strides, pads_begin, pads_end, dilations)
    _check_out(op, "dy", out_sizes, in_sizes, kernel, a)
    geom = make_geometry(op, n=n, c=c, o=o, groups=groups, in_sizes=in_sizes, kernel=kernel,
                         out_sizes=out_sizes, strides=a.strides, dilations=a.dilations,
                         pads_begin=a.pads_begin, pads_end=a.pads_end)
    return make_plan(op, "wgrad", geom, names={"x": "x", "dy": "dy"}, data_layout=NCX,
                     weight_layout=OIX)


@spec_op("conv_data_grad", DIALECT, inputs=("w", "dy", "input_shape"), tensors=("w", "dy"))
def conv_data_grad(w, dy, input_shape=None, *, strides=None, pads_begin=None, pads_end=None,
                   dilations=None, groups=1, output_padding=None):
    """Data gradient ``dx[N, C, *S]`` of ``y = conv(x, w)``: the transposed
    convolution of ``dy``.

    Parameters
    ----------
    w : ndarray
        The convolution's weights ``(O, C/G, *K)``.
    dy : ndarray
        The gradient of its output ``(N, O, *M)``.
    input_shape : list of int, optional
        ``(N, C, *S)`` or ``S``; without it
        ``S = s*(M-1) + Ke - pb - pe + output_padding``.
    strides : list of int, optional
        Stride per spatial axis (positive), default 1.
    pads_begin, pads_end : list of int, optional
        Non-negative explicit padding per spatial axis, default 0.
    dilations : list of int, optional
        Dilation per spatial axis, 1 = dense (default).
    groups : int, optional
        Channels split into ``groups`` contiguous blocks (default 1).
    output_padding : list of int, optional
        Used only without ``input_shape``: ``0 <= op < max(stride, dilation)``.

    Returns
    -------
    ndarray
        ``dx`` of shape ``(N, C, *S)``, with the inputs' dtype.

    Raises
    ------
    ConvGradError
        An attribute or shape breaks a rule (the message names it).
    """
    op = "conv_data_grad"
    rank = len(dy.shape)
    n, o, out_sizes = data_shape(op, "dy", dy, NCX)
    groups = positive_int(op, "groups", groups)
    o_w, cg, kernel = weights_dims(op, w, rank, OIX, groups, o_role="output channels", name="w")
    check_equal(op, "w output channels", o_w, o, "channels of dy")
    a = _attrs(op, rank, strides, pads_begin, pads_end, dilations, output_padding)
    if input_shape is None:
        in_sizes = transposed_sizes(op, out_sizes, kernel, a.strides, a.dilations,
                                    a.pads_begin, a.pads_end, a.output_padding)
    else:
        dims, full = shape_input(op, "input_shape", input_shape, rank)
        if full:
            check_equal(op, "input_shape[0]", dims[0], n, "batch of dy")
            check_equal(op, "input_shape[1]", dims[1], cg * groups,
                        f"w input channels per group {cg} x groups {groups}")
        in_sizes = dims[2:] if full else dims
        _check_out(op, "dy", out_sizes, in_sizes, kernel, a)
    geom = make_geometry(op, n=n, c=cg * groups, o=o, groups=groups, in_sizes=in_sizes,
                         kernel=kernel, out_sizes=out_sizes, strides=a.strides,
                         dilations=a.dilations, pads_begin=a.pads_begin, pads_end=a.pads_end)
    return make_plan(op, "dgrad", geom, names={"w": "w", "dy": "dy"}, data_layout=NCX,
                     weight_layout=OIX)


@spec_op("conv_forward", DIALECT, inputs=("x", "w"), tensors=("x", "w"))
def conv_forward(x, w, *, strides=None, pads_begin=None, pads_end=None, dilations=None,
                 groups=1):
    """Forward convolution ``y[N, O, *M]`` of ``x[N, C, *S]`` with ``w[O, C/G, *K]``.

    Parameters
    ----------
    x : ndarray
        The input ``(N, C, *S)``, rank 3 to 5.
    w : ndarray
        The weights ``(O, C/G, *K)``.
    strides : list of int, optional
        Stride per spatial axis (positive), default 1.
    pads_begin, pads_end : list of int, optional
        Non-negative explicit padding per spatial axis, default 0.
    dilations : list of int, optional
        Dilation per spatial axis, 1 = dense (default).
    groups : int, optional
        Channels split into ``groups`` contiguous blocks (default 1).

    Returns
    -------
    ndarray
        ``y`` of shape ``(N, O, *M)``, ``M = floor((S + pb + pe - Ke) / s) + 1``.

    Raises
    ------
    ConvGradError
        An attribute or shape breaks a rule (the message names it).
    """
    op = "conv_forward"
    rank = len(x.shape)
    n, c, in_sizes = data_shape(op, "x", x, NCX)
    groups = positive_int(op, "groups", groups)
    o, cg, kernel = weights_dims(op, w, rank, OIX, groups, o_role="output channels", name="w")
    check_equal(op, "channels of x", c, cg * groups,
                f"w input channels per group {cg} x groups {groups}")
    a = _attrs(op, rank, strides, pads_begin, pads_end, dilations)
    out_sizes = conv_out_sizes(op, in_sizes, kernel, a.strides, a.dilations, a.pads_begin,
                               a.pads_end)
    geom = make_geometry(op, n=n, c=c, o=o, groups=groups, in_sizes=in_sizes, kernel=kernel,
                         out_sizes=out_sizes, strides=a.strides, dilations=a.dilations,
                         pads_begin=a.pads_begin, pads_end=a.pads_end)
    return make_plan(op, "fwd", geom, names={"x": "x", "w": "w"}, data_layout=NCX,
                     weight_layout=OIX)
