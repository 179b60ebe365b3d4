"""oneDNN Graph dialect: ConvolutionBackwardWeights and its family.

Defaults follow oneDNN Graph: ``data_format="NXC"``, ``auto_pad="None"``,
``weights_format="XIO"`` for the Convolution family and ``"XOI"`` for the
ConvTranspose family (whose older ``*BackpropFilters-1`` page says ``XIO``).
All ConvTranspose ops accept the four ConvTranspose weight formats
(``IOX (I, O/G, X)``, ``XOI (X, O/G, I)``, ``OIX (O/G, I, X)``,
``XIO (X, I, O/G)``), where I and O are the ConvTranspose's own input and
output channels.

Decisions (docs/decisions.md): shape inputs are full or spatial; auto_pad is
case-insensitive; same_upper puts the odd pad at the end; the ConvTranspose
family resolves same_* as ConvTranspose does (total ``max(Ke - s, 0)``), so
each op is the exact gradient of the forward op with the same attributes;
output_padding must be in ``[0, max(stride, dilation))``.
"""

from __future__ import annotations

from .frontends._common import (check_bias, check_equal, check_kernel, conv_attrs,
                                data_shape, make_plan, same_rank, weights_dims)
from .frontends._plan import spec_op
from .geometry import (check_conv_output, check_divisible, conv_out_sizes, make_geometry,
                       parse_choice, positive_int, resolve_pads, shape_input,
                       transposed_sizes)
from .layouts import CONV_WEIGHTS, CONVT_WEIGHTS, NCX, NXC

DIALECT = "onednn"

_ATTRS_DOC = """\
    strides : list of int
        Stride per spatial axis (positive).
    pads_begin, pads_end : list of int, optional
        Non-negative padding per spatial axis; ignored unless ``auto_pad`` is
        explicit ("None"/"none").  Missing or empty means zeros.
    dilations : list of int, optional
        Dilation per spatial axis, 1 = dense (default).
    auto_pad : {"None", "SAME_UPPER", "SAME_LOWER", "VALID"}, optional
        Any case; %s
    groups : int, optional
        Input and output channels are split into ``groups`` contiguous blocks.
    data_format : {"NXC", "NCX"}, optional
        Layout of the data tensors.
"""


def _doc(fn):
    """Fill the common attribute descriptions into ``fn``'s docstring."""
    conv = _ATTRS_DOC % "same_upper puts an odd total padding at the end."
    convt = _ATTRS_DOC % ("same_* pad as ConvTranspose does (total ``max(Ke - s, 0)``,\n"
                          "        so the output is ``s * L``), same_upper putting an odd "
                          "element at the end.")
    fn.__doc__ = (fn.__doc__.replace("    <common attributes, ConvTranspose>\n", convt)
                  .replace("    <common attributes>\n", conv))
    return fn


def _data_layout(op, data_format):
    return {"NCX": NCX, "NXC": NXC}[parse_choice(op, "data_format", data_format,
                                                 ("NXC", "NCX"))]


def _weight_layout(op, name, value, table):
    return table[parse_choice(op, name, value, tuple(table))]


def _weights_from_shape(op, name, value, rank, wl, groups, *, o, c, o_what, c_what):
    """Kernel spatial shape from a full or spatial shape input; checks the
    channel dims of a full shape against ``o`` and ``c`` (canonical O, C/G)."""
    dims, full = shape_input(op, name, value, rank)
    if not full:
        check_kernel(op, name, dims)
        return dims
    parts = wl.split(dims, rank - 2)
    check_kernel(op, name, parts["x"])
    check_equal(op, f"{name} {o_what}", parts["o"], o, f"{name} = {list(dims)} in {wl.name}")
    check_equal(op, f"{name} {c_what}", parts["c"], c, f"{name} = {list(dims)} in {wl.name}")
    return parts["x"]


def _conv_wgrad(op, x_name, x, dy_name, dy, shape_name, shape, *, strides, pads_begin,
                pads_end, dilations, auto_pad, groups, data_format, fmt_name, fmt):
    dl = _data_layout(op, data_format)
    rank = same_rank(op, (x_name, dy_name), (x, dy))
    n, c, in_sizes = data_shape(op, x_name, x, dl)
    n2, o, out_sizes = data_shape(op, dy_name, dy, dl)
    check_equal(op, f"batch of {dy_name}", n2, n, f"batch of {x_name}")
    groups = positive_int(op, "groups", groups)
    check_divisible(op, f"{x_name} channels", c, groups)
    wl = _weight_layout(op, fmt_name, fmt, CONV_WEIGHTS)
    a = conv_attrs(op, rank - 2, strides=strides, pads_begin=pads_begin, pads_end=pads_end,
                   dilations=dilations, auto_pad=auto_pad)
    kernel = _weights_from_shape(op, shape_name, shape, rank, wl, groups, o=o,
                                 c=c // groups, o_what="output channels",
                                 c_what="input channels per group")
    pb, pe = resolve_pads(op, a.mode, in_sizes, kernel, a.strides, a.dilations,
                          a.pads_begin, a.pads_end)
    check_conv_output(op, dy_name, out_sizes, x_name, in_sizes, kernel, a.strides,
                      a.dilations, pb, pe)
    geom = make_geometry(op, n=n, c=c, o=o, groups=groups, in_sizes=in_sizes, kernel=kernel,
                         out_sizes=out_sizes, strides=a.strides, dilations=a.dilations,
                         pads_begin=pb, pads_end=pe,
                         channel_names=(f"{x_name} channels", f"{dy_name} channels"))
    return make_plan(op, "wgrad", geom, names={"x": x_name, "dy": dy_name},
                     data_layout=dl, weight_layout=wl)


def _convt_pads(op, a, kernel):
    """ConvTranspose pads, and the equivalent forward conv's end pad (pe - op)."""
    pb, pe = resolve_pads(op, a.mode, None, kernel, a.strides, a.dilations,
                          a.pads_begin, a.pads_end, transposed=True)
    return pb, pe, tuple(e - p for e, p in zip(pe, a.output_padding))


def _convt_wgrad(op, src_name, src, dd_name, dd, shape_name, shape, *, strides, pads_begin,
                 pads_end, dilations, auto_pad, output_padding, groups, data_format,
                 fmt_name, fmt):
    # The ConvTranspose maps src (N, I, L) to dst (N, O, L_big); as a conv, x = diff_dst
    # (C = O) and dy = src (O_conv = I): the weight gradient is wgrad(diff_dst, src).
    dl = _data_layout(op, data_format)
    rank = same_rank(op, (src_name, dd_name), (src, dd))
    n, i_ch, small = data_shape(op, src_name, src, dl)
    n2, o_ch, big = data_shape(op, dd_name, dd, dl)
    check_equal(op, f"batch of {dd_name}", n2, n, f"batch of {src_name}")
    groups = positive_int(op, "groups", groups)
    check_divisible(op, f"{dd_name} channels", o_ch, groups)
    wl = _weight_layout(op, fmt_name, fmt, CONVT_WEIGHTS)
    a = conv_attrs(op, rank - 2, strides=strides, pads_begin=pads_begin, pads_end=pads_end,
                   dilations=dilations, auto_pad=auto_pad, output_padding=output_padding)
    kernel = _weights_from_shape(op, shape_name, shape, rank, wl, groups, o=i_ch,
                                 c=o_ch // groups, o_what="input channels (I)",
                                 c_what="output channels per group (O/G)")
    pb, pe, pe_conv = _convt_pads(op, a, kernel)
    check_conv_output(op, src_name, small, dd_name, big, kernel, a.strides, a.dilations,
                      pb, pe_conv, note=f" (pads_end {list(pe)} minus output_padding "
                                        f"{list(a.output_padding)})")
    geom = make_geometry(op, n=n, c=o_ch, o=i_ch, groups=groups, in_sizes=big, kernel=kernel,
                         out_sizes=small, strides=a.strides, dilations=a.dilations,
                         pads_begin=pb, pads_end=pe_conv,
                         channel_names=(f"{dd_name} channels", f"{src_name} channels"))
    return make_plan(op, "wgrad", geom, names={"x": dd_name, "dy": src_name},
                     data_layout=dl, weight_layout=wl)


@spec_op("ConvolutionBackwardWeights", DIALECT, inputs=("src", "diff_dst", "weights_shape"),
         tensors=("src", "diff_dst"), shape_attrs=("weights_shape",))
@_doc
def convolution_backward_weights(src, diff_dst, weights_shape=None, *, strides,
                                 pads_begin=None, pads_end=None, dilations=None,
                                 auto_pad="None", groups=1, data_format="NXC",
                                 weights_format="XIO"):
    """oneDNN Graph ConvolutionBackwardWeights: the weight gradient of Convolution.

    Parameters
    ----------
    src : ndarray
        The Convolution's input, rank 3 to 5, in ``data_format``.
    diff_dst : ndarray
        The gradient of its output; its spatial shape must be exactly the
        Convolution's output size.
    weights_shape : list of int
        The full weights shape in ``weights_format`` -- OIX ``(O, I/G, X)`` or
        XIO ``(X, I/G, O)`` -- or only its spatial part ``X``.  Required.
    <common attributes>
    weights_format : {"XIO", "OIX"}, optional
        Layout of the result.

    Returns
    -------
    ndarray
        diff_weights in ``weights_format``, with the inputs' dtype.

    Raises
    ------
    ConvGradError
        An attribute or shape breaks a rule (the message names it).
    TypeError
        Unsupported or mixed dtypes.

    Examples
    --------
    >>> src = np.arange(1.0, 9.0).reshape(1, 4, 2)        # NXC: 4 positions, 2 channels
    >>> diff_dst = np.array([[[1.0], [0.0], [2.0]]])      # 3 positions, 1 channel
    >>> convolution_backward_weights(src, diff_dst, [2], strides=[1],
    ...                              weights_format="OIX")
    array([[[11., 17.],
            [14., 20.]]])
    """
    return _conv_wgrad("ConvolutionBackwardWeights", "src", src, "diff_dst", diff_dst,
                       "weights_shape", weights_shape, strides=strides,
                       pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
                       auto_pad=auto_pad, groups=groups, data_format=data_format,
                       fmt_name="weights_format", fmt=weights_format)


@spec_op("ConvolutionBackpropFilters", DIALECT, inputs=("input", "filters_shape", "output_delta"),
         tensors=("input", "output_delta"))
@_doc
def convolution_backprop_filters(input, filters_shape, output_delta, *, strides,  # noqa: A002
                                 pads_begin=None, pads_end=None, dilations=None, auto_pad=None,
                                 groups=1, data_format="NXC", filter_format="XIO"):
    """oneDNN Graph ConvolutionBackpropFilters-1: the older name of
    ConvolutionBackwardWeights, with its input order.

    Parameters
    ----------
    input : ndarray
        The Convolution's input, rank 3 to 5, in ``data_format``.
    filters_shape : list of int
        The filter's spatial shape (as the page says), or its full shape in
        ``filter_format``.
    output_delta : ndarray
        The gradient of the Convolution's output.
    <common attributes>
    filter_format : {"XIO", "OIX"}, optional
        Layout of the result: XIO ``(X, I/G, O)`` or OIX ``(O, I/G, X)``.

    Returns
    -------
    ndarray
        filter_delta in ``filter_format``.

    Examples
    --------
    >>> x = np.arange(1.0, 9.0).reshape(1, 4, 2)
    >>> convolution_backprop_filters(x, [2], np.array([[[1.0], [0.0], [2.0]]]),
    ...                              strides=[1]).shape                   # XIO
    (2, 2, 1)
    """
    return _conv_wgrad("ConvolutionBackpropFilters", "input", input, "output_delta",
                       output_delta, "filters_shape", filters_shape, strides=strides,
                       pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
                       auto_pad=auto_pad, groups=groups, data_format=data_format,
                       fmt_name="filter_format", fmt=filter_format)


@spec_op("ConvTransposeBackpropFilters", DIALECT,
         inputs=("input", "output_delta", "filter_shape"), tensors=("input", "output_delta"),
         shape_attrs=("filter_shape",))
@_doc
def conv_transpose_backprop_filters(input, output_delta, filter_shape=None, *,  # noqa: A002
                                    strides, pads_begin=None, pads_end=None, dilations=None,
                                    auto_pad=None, output_padding=None, groups=1,
                                    data_format="NXC", filter_format="XIO"):
    """oneDNN Graph ConvTransposeBackpropFilters-1: the weight gradient of ConvTranspose.

    Parameters
    ----------
    input : ndarray
        The ConvTranspose's input, channels I.
    output_delta : ndarray
        The gradient of its output, channels O, spatial size exactly
        ``s*(L-1) + (K-1)*d + 1 - pads_begin - pads_end + output_padding``.
    filter_shape : list of int
        Full shape in ``filter_format`` -- OIX ``(O/G, I, X)``, XIO ``(X, I, O/G)``,
        or IOX ``(I, O/G, X)``, XOI ``(X, O/G, I)`` -- or spatial only.
    <common attributes, ConvTranspose>
    output_padding : list of int, optional
        Extra output positions at the end, ``0 <= op < max(stride, dilation)``.
    filter_format : {"XIO", "OIX", "IOX", "XOI"}, optional
        Layout of the result.

    Returns
    -------
    ndarray
        filter_delta in ``filter_format``.

    Examples
    --------
    >>> u = np.array([[[1.0], [2.0]]])                 # ConvTranspose input, NXC
    >>> v = np.arange(1.0, 6.0).reshape(1, 5, 1)       # gradient of its 5-long output
    >>> conv_transpose_backprop_filters(u, v, [3], strides=[2]).ravel()
    array([ 7., 10., 13.])
    """
    return _convt_wgrad("ConvTransposeBackpropFilters", "input", input, "output_delta",
                        output_delta, "filter_shape", filter_shape, strides=strides,
                        pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
                        auto_pad=auto_pad, output_padding=output_padding, groups=groups,
                        data_format=data_format, fmt_name="filter_format", fmt=filter_format)


@spec_op("ConvTransposeBackwardWeights", DIALECT, inputs=("src", "diff_dst", "weights_shape"),
         tensors=("src", "diff_dst"), shape_attrs=("weights_shape",))
@_doc
def conv_transpose_backward_weights(src, diff_dst, weights_shape=None, *, strides,
                                    pads_begin=None, pads_end=None, dilations=None,
                                    auto_pad="None", output_padding=None, groups=1,
                                    data_format="NXC", weights_format="XOI"):
    """oneDNN Graph ConvTransposeBackwardWeights: the weight gradient of ConvTranspose.

    Parameters
    ----------
    src : ndarray
        The ConvTranspose's input, channels I, rank 3 to 5, in ``data_format``.
    diff_dst : ndarray
        The gradient of its output, channels O, spatial size exactly
        ``s*(L-1) + (K-1)*d + 1 - pads_begin - pads_end + output_padding``.
    weights_shape : list of int
        Full shape in ``weights_format`` -- XOI ``(X, O/G, I)``, IOX
        ``(I, O/G, X)``, OIX ``(O/G, I, X)`` or XIO ``(X, I, O/G)`` -- or
        spatial only.  Required.
    <common attributes, ConvTranspose>
    output_padding : list of int, optional
        Extra output positions at the end, ``0 <= op < max(stride, dilation)``.
    weights_format : {"XOI", "IOX", "OIX", "XIO"}, optional
        Layout of the result.

    Returns
    -------
    ndarray
        diff_weights in ``weights_format``.

    Examples
    --------
    >>> u = np.array([[[1.0], [2.0]]])                 # ConvTranspose input, NXC
    >>> v = np.arange(1.0, 6.0).reshape(1, 5, 1)       # gradient of its 5-long output
    >>> conv_transpose_backward_weights(u, v, [3], strides=[2]).ravel()
    array([ 7., 10., 13.])
    """
    return _convt_wgrad("ConvTransposeBackwardWeights", "src", src, "diff_dst", diff_dst,
                        "weights_shape", weights_shape, strides=strides,
                        pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
                        auto_pad=auto_pad, output_padding=output_padding, groups=groups,
                        data_format=data_format, fmt_name="weights_format", fmt=weights_format)


@spec_op("ConvolutionBackwardData", DIALECT, inputs=("diff_dst", "weights", "dst_shape"),
         tensors=("diff_dst", "weights"), shape_attrs=("dst_shape",))
@_doc
def convolution_backward_data(diff_dst, weights, dst_shape=None, *, strides, pads_begin=None,
                              pads_end=None, dilations=None, auto_pad="None",
                              output_padding=None, groups=1, data_format="NXC",
                              weights_format="XIO"):
    """oneDNN Graph ConvolutionBackwardData: the data gradient of Convolution.

    Parameters
    ----------
    diff_dst : ndarray
        The gradient of the Convolution's output, rank 3 to 5, in ``data_format``.
    weights : ndarray
        The Convolution's weights in ``weights_format``: XIO ``(X, I/G, O)`` or
        OIX ``(O, I/G, X)``.
    dst_shape : list of int, optional
        The shape of the result (diff_src, the Convolution's input), full in
        ``data_format`` or spatial.  Without it the size is
        ``s*(M-1) + Ke - pb - pe + output_padding`` (``s*M + output_padding``
        for same_*), as the matching ConvTranspose gives.
    <common attributes>
    output_padding : list of int, optional
        ``0 <= op < max(stride, dilation)``; used only without ``dst_shape``.
    weights_format : {"XIO", "OIX"}, optional
        Layout of ``weights``.

    Returns
    -------
    ndarray
        diff_src in ``data_format``.

    Examples
    --------
    >>> w = np.array([[[1.0]], [[10.0]]])              # XIO: K=2, one channel in and out
    >>> convolution_backward_data(np.array([[[1.0], [2.0]]]), w, [3], strides=[1]).ravel()
    array([ 1., 12., 20.])
    """
    op = "ConvolutionBackwardData"
    dl = _data_layout(op, data_format)
    rank = len(diff_dst.shape)
    n, o, out_sizes = data_shape(op, "diff_dst", diff_dst, dl)
    groups = positive_int(op, "groups", groups)
    wl = _weight_layout(op, "weights_format", weights_format, CONV_WEIGHTS)
    o_w, cg, kernel = weights_dims(op, weights, rank, wl, groups, o_role="output channels")
    check_equal(op, "weights output channels", o_w, o, "channels of diff_dst")
    c = cg * groups
    a = conv_attrs(op, rank - 2, strides=strides, pads_begin=pads_begin, pads_end=pads_end,
                   dilations=dilations, auto_pad=auto_pad, output_padding=output_padding)
    if dst_shape is None:
        pb, pe, pe_conv = _convt_pads(op, a, kernel)
        in_sizes = transposed_sizes(op, out_sizes, kernel, a.strides, a.dilations, pb, pe,
                                    a.output_padding)
    else:
        dims, full = shape_input(op, "dst_shape", dst_shape, rank)
        if full:
            nn, cc, *in_sizes = dl.canonical_shape(dims)
            in_sizes = tuple(in_sizes)
            check_equal(op, "dst_shape batch", nn, n, "batch of diff_dst")
            check_equal(op, "dst_shape channels", cc, c,
                        f"weights input channels per group {cg} x groups {groups}")
        else:
            in_sizes = dims
        pb, pe_conv = resolve_pads(op, a.mode, in_sizes, kernel, a.strides, a.dilations,
                                   a.pads_begin, a.pads_end)
        check_conv_output(op, "diff_dst", out_sizes, "dst_shape", in_sizes, kernel,
                          a.strides, a.dilations, pb, pe_conv)
    geom = make_geometry(op, n=n, c=c, o=o, groups=groups, in_sizes=in_sizes, kernel=kernel,
                         out_sizes=out_sizes, strides=a.strides, dilations=a.dilations,
                         pads_begin=pb, pads_end=pe_conv)
    return make_plan(op, "dgrad", geom, names={"w": "weights", "dy": "diff_dst"},
                     data_layout=dl, weight_layout=wl)


@spec_op("ConvTransposeBackwardData", DIALECT, inputs=("diff_dst", "weights"),
         tensors=("diff_dst", "weights"))
@_doc
def conv_transpose_backward_data(diff_dst, weights, *, strides, pads_begin=None,
                                 pads_end=None, dilations=None, auto_pad="None",
                                 output_padding=None, groups=1, data_format="NXC",
                                 weights_format="XOI"):
    """oneDNN Graph ConvTransposeBackwardData: the data gradient of ConvTranspose,
    i.e. the forward Convolution of diff_dst with the same weights and pads.

    Parameters
    ----------
    diff_dst : ndarray
        The gradient of the ConvTranspose's output, channels O, rank 3 to 5,
        in ``data_format``.
    weights : ndarray
        The ConvTranspose's weights in ``weights_format``: XOI ``(X, O/G, I)``,
        IOX ``(I, O/G, X)``, OIX ``(O/G, I, X)`` or XIO ``(X, I, O/G)``.
    <common attributes, ConvTranspose>
    output_padding : list of int, optional
        The ConvTranspose's, ``0 <= op < max(stride, dilation)``: the result's
        size is ``floor((L + pb + pe - output_padding - Ke) / s) + 1``.
    weights_format : {"XOI", "IOX", "OIX", "XIO"}, optional
        Layout of ``weights``.

    Returns
    -------
    ndarray
        diff_src (channels I) in ``data_format``.

    Examples
    --------
    >>> w = np.array([[[1.0]], [[10.0]], [[100.0]]])   # XOI: K=3, one channel out and in
    >>> dd = np.arange(1.0, 6.0).reshape(1, 5, 1)
    >>> conv_transpose_backward_data(dd, w, strides=[2]).ravel()
    array([321., 543.])
    """
    op = "ConvTransposeBackwardData"
    dl = _data_layout(op, data_format)
    rank = len(diff_dst.shape)
    n, o_t, big = data_shape(op, "diff_dst", diff_dst, dl)
    groups = positive_int(op, "groups", groups)
    wl = _weight_layout(op, "weights_format", weights_format, CONVT_WEIGHTS)
    i_t, og_t, kernel = weights_dims(op, weights, rank, wl, groups, o_role="input channels (I)")
    check_equal(op, "diff_dst channels", o_t, og_t * groups,
                f"weights output channels per group {og_t} x groups {groups}")
    a = conv_attrs(op, rank - 2, strides=strides, pads_begin=pads_begin, pads_end=pads_end,
                   dilations=dilations, auto_pad=auto_pad, output_padding=output_padding)
    pb, pe, pe_conv = _convt_pads(op, a, kernel)
    small = conv_out_sizes(op, big, kernel, a.strides, a.dilations, pb, pe_conv,
                           what="diff_dst")
    geom = make_geometry(op, n=n, c=o_t, o=i_t, groups=groups, in_sizes=big, kernel=kernel,
                         out_sizes=small, strides=a.strides, dilations=a.dilations,
                         pads_begin=pb, pads_end=pe_conv)
    return make_plan(op, "fwd", geom, names={"x": "diff_dst", "w": "weights"},
                     data_layout=dl, weight_layout=wl)


@spec_op("Convolution", DIALECT, inputs=("src", "weights", "bias"),
         tensors=("src", "weights", "bias"))
@_doc
def convolution(src, weights, bias=None, *, strides, pads_begin=None, pads_end=None,
                dilations=None, auto_pad="None", groups=1, data_format="NXC",
                weights_format="XIO"):
    """oneDNN Graph Convolution (forward), with an optional per-channel bias.

    Parameters
    ----------
    src : ndarray
        The input, rank 3 to 5, in ``data_format``.
    weights : ndarray
        XIO ``(X, I/G, O)`` or OIX ``(O, I/G, X)``, as ``weights_format`` says.
    bias : ndarray, optional
        Shape ``(O,)``, added to every output position.
    <common attributes>
    weights_format : {"XIO", "OIX"}, optional
        Layout of ``weights``.

    Returns
    -------
    ndarray
        dst in ``data_format``, spatial size ``floor((L + pb + pe - Ke) / s) + 1``
        (``ceil(L / s)`` for same_*).

    Examples
    --------
    >>> src = np.array([[[1.0], [2.0], [3.0]]])         # NXC: 3 positions, 1 channel
    >>> convolution(src, np.array([[[1.0]], [[10.0]]]), np.array([0.5]), strides=[1]).ravel()
    array([21.5, 32.5])
    """
    op = "Convolution"
    dl = _data_layout(op, data_format)
    rank = len(src.shape)
    n, c, in_sizes = data_shape(op, "src", src, dl)
    groups = positive_int(op, "groups", groups)
    wl = _weight_layout(op, "weights_format", weights_format, CONV_WEIGHTS)
    o, cg, kernel = weights_dims(op, weights, rank, wl, groups, o_role="output channels")
    check_equal(op, "src channels", c, cg * groups,
                f"weights input channels per group {cg} x groups {groups}")
    check_bias(op, bias, o)
    a = conv_attrs(op, rank - 2, strides=strides, pads_begin=pads_begin, pads_end=pads_end,
                   dilations=dilations, auto_pad=auto_pad)
    pb, pe = resolve_pads(op, a.mode, in_sizes, kernel, a.strides, a.dilations,
                          a.pads_begin, a.pads_end)
    out_sizes = conv_out_sizes(op, in_sizes, kernel, a.strides, a.dilations, pb, pe, what="src")
    geom = make_geometry(op, n=n, c=c, o=o, groups=groups, in_sizes=in_sizes, kernel=kernel,
                         out_sizes=out_sizes, strides=a.strides, dilations=a.dilations,
                         pads_begin=pb, pads_end=pe)
    names = {"x": "src", "w": "weights"} | ({"bias": "bias"} if bias is not None else {})
    return make_plan(op, "fwd", geom, names=names, data_layout=dl, weight_layout=wl)


@spec_op("ConvTranspose", DIALECT, inputs=("src", "weights", "bias"),
         tensors=("src", "weights", "bias"))
@_doc
def conv_transpose(src, weights, bias=None, *, strides, pads_begin=None, pads_end=None,
                   dilations=None, auto_pad="None", output_padding=None, groups=1,
                   data_format="NXC", weights_format="XOI"):
    """oneDNN Graph ConvTranspose (forward): the transposed convolution.

    Parameters
    ----------
    src : ndarray
        The input, channels I, rank 3 to 5, in ``data_format``.
    weights : ndarray
        XOI ``(X, O/G, I)``, IOX ``(I, O/G, X)``, OIX ``(O/G, I, X)`` or XIO
        ``(X, I, O/G)``, as ``weights_format`` says.
    bias : ndarray, optional
        Shape ``(O,)``.
    <common attributes, ConvTranspose>
    output_padding : list of int, optional
        Extra output positions at the end, ``0 <= op < max(stride, dilation)``.
    weights_format : {"XOI", "IOX", "OIX", "XIO"}, optional
        Layout of ``weights``.

    Returns
    -------
    ndarray
        dst (channels O) in ``data_format``, spatial size
        ``s*(L-1) + Ke - pb - pe + output_padding`` (``s*L + output_padding``
        for same_*).

    Examples
    --------
    >>> w = np.array([[[1.0]], [[10.0]], [[100.0]]])   # XOI: K=3
    >>> conv_transpose(np.array([[[1.0], [2.0]]]), w, strides=[2]).ravel()
    array([  1.,  10., 102.,  20., 200.])
    """
    op = "ConvTranspose"
    dl = _data_layout(op, data_format)
    rank = len(src.shape)
    n, i_t, small = data_shape(op, "src", src, dl)
    groups = positive_int(op, "groups", groups)
    wl = _weight_layout(op, "weights_format", weights_format, CONVT_WEIGHTS)
    i_w, og_t, kernel = weights_dims(op, weights, rank, wl, groups, o_role="input channels (I)")
    check_equal(op, "src channels", i_t, i_w, "weights input channels (I)")
    check_bias(op, bias, og_t * groups)
    a = conv_attrs(op, rank - 2, strides=strides, pads_begin=pads_begin, pads_end=pads_end,
                   dilations=dilations, auto_pad=auto_pad, output_padding=output_padding)
    pb, pe, pe_conv = _convt_pads(op, a, kernel)
    big = transposed_sizes(op, small, kernel, a.strides, a.dilations, pb, pe, a.output_padding)
    geom = make_geometry(op, n=n, c=og_t * groups, o=i_t, groups=groups, in_sizes=big,
                         kernel=kernel, out_sizes=small, strides=a.strides,
                         dilations=a.dilations, pads_begin=pb, pads_end=pe_conv)
    names = {"w": "weights", "dy": "src"} | ({"bias": "bias"} if bias is not None else {})
    return make_plan(op, "dgrad", geom, names=names, data_layout=dl, weight_layout=wl)


__all__ = ["convolution_backward_weights", "convolution_backprop_filters",
           "conv_transpose_backprop_filters", "conv_transpose_backward_weights",
           "convolution_backward_data", "conv_transpose_backward_data", "convolution",
           "conv_transpose"]
