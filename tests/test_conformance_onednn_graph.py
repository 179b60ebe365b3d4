"""Conformance with the oneDNN Graph library itself: the oneDNN dialect
(:mod:`convgrad.onednn`) against ``libdnnl.so.3`` of ``onednn-cpu-gomp``
2023.2.0 (oneDNN v3.2), run through its C API by ``tests/onednn_graph.py`` in
a child process (an abort of the library ends one case, not the run).

Every case calls convgrad with the arguments of the oneDNN Graph op and hands
the same tensors (same layout, float32) and attributes to the library:

- the library takes ``weights_shape`` and ``dst_shape`` as attributes in full
  form only: convgrad gets the full or the spatial form at random, the library
  the full one;
- auto_pad goes to the library in its schema's spelling (``None``,
  ``SAME_UPPER``...), to convgrad in a random one of the spellings it accepts;
  with auto_pad not explicit, both get the same junk pads half the time (the
  spec says they are ignored);
- defaults (data_format, weights_format, groups, auto_pad) are omitted on both
  sides at random, so the two sets of defaults are compared too;
- the older op names are mapped onto what the library has:
  ConvolutionBackpropFilters onto ConvolutionBackwardWeights (same formats),
  ConvTransposeBackpropFilters onto ConvTransposeBackwardWeights, its XIO/OIX
  results compared with the library's XOI/IOX ones through the transposition
  that relates the two formats (``(X, I, O/G)`` vs ``(X, O/G, I)``);
- ConvTransposeBackwardData/BackwardWeights have no output_padding attribute
  in the library: diff_dst's shape carries it, as the library's shape rules
  intend.

Data are quarter-integers in [-2, 2]: every sum is exact in float32, so the
library's and convgrad's results must be *equal*, whatever the summation order.

Each case's expected outcome is written down before it runs (:func:`expect`):
``agree``, ``refused`` (a feature the library does not run: the case is
skipped with the library's own reason -- or, where diff_dst's shape cannot
carry an output_padding >= stride, with the other shape it answers -- and
fails if the library computes it after all), or one of the library's three
known faults (:data:`FAULTS`), marked as strict xfails; for every fault case
PyTorch's autograd is asked too, and must side with convgrad.  An outcome other
than the expected one fails.
"""

import functools
import os
import pathlib
import re
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

import onednn_graph as dg
from convgrad import ConvGradError, onednn
from conftest import import_peer, peer_library

pytestmark = pytest.mark.peers

peer_library(dg.LIBRARY_PATH, "the oneDNN Graph library (pip install onednn-cpu-gomp==2023.2.0)")

MODES = ("explicit", "same_upper", "same_lower", "valid")
LIB_AUTO_PAD = {"explicit": "None", "same_upper": "SAME_UPPER", "same_lower": "SAME_LOWER",
                "valid": "VALID"}
CG_AUTO_PAD = {"explicit": ("None", "none", "NONE", None), "same_upper": ("SAME_UPPER",
               "same_upper"), "same_lower": ("SAME_LOWER", "same_lower"),
               "valid": ("VALID", "valid")}
DFS = ("NXC", "NCX")
CONV_WFS = ("XIO", "OIX")
CONVT_WFS = ("XOI", "IOX")                # what the library accepts
CONVT_ALL_WFS = ("XOI", "IOX", "OIX", "XIO")
# convgrad function -> (family, the library's op)
OPS = {"convolution": ("conv", "Convolution"),
       "convolution_backward_weights": ("conv", "ConvolutionBackwardWeights"),
       "convolution_backprop_filters": ("conv", "ConvolutionBackwardWeights"),
       "convolution_backward_data": ("conv", "ConvolutionBackwardData"),
       "conv_transpose": ("convt", "ConvTranspose"),
       "conv_transpose_backward_weights": ("convt", "ConvTransposeBackwardWeights"),
       "conv_transpose_backprop_filters": ("convt", "ConvTransposeBackwardWeights"),
       "conv_transpose_backward_data": ("convt", "ConvTransposeBackwardData")}
DEFAULT_WF = {"convolution": "XIO", "convolution_backward_weights": "XIO",
              "convolution_backprop_filters": "XIO", "convolution_backward_data": "XIO",
              "conv_transpose": "XOI", "conv_transpose_backward_weights": "XOI",
              "conv_transpose_backprop_filters": "XIO", "conv_transpose_backward_data": "XOI"}
# ConvTransposeBackpropFilters' formats (its page) -> the library's, and back
OLD_CONVT_WF = {"XIO": "XOI", "OIX": "IOX", "XOI": "XOI", "IOX": "IOX"}

# The library's three known faults (oneDNN v3.2): the cases in them are strict xfails.
FAULTS = {
    "ctbd-dilation": "ConvTransposeBackwardData ignores dilations (the backend's "
                     "deconvolution descriptor omits them): the dilation-1 result, or an abort "
                     "when the sizes do not fit dilation 1",
    "ctbw-same": "ConvTransposeBackwardWeights with SAME_* pads from src's size while its "
                 "shape inference uses diff_dst's: a wrong gradient, or an abort when the "
                 "sizes clash",
    "ctbd-same-output-padding": "ConvTransposeBackwardData with SAME_* and output_padding > 0 "
                                "applies the forward SAME rule to diff_dst, not "
                                "ConvTranspose's (docs/decisions.md D4)",
}


# ----------------------------------------------------------------------------
# Layouts, padding rules and data, written here independently of convgrad
# ----------------------------------------------------------------------------


def _sp(a):
    return tuple(range(2, a.ndim))


def to_df(a, df):
    """NCX -> ``df``."""
    return a if df == "NCX" else np.transpose(a, (0, *_sp(a), 1))


def conv_w(w, wf):
    """Convolution weights OIX ``(O, C/G, *K)`` -> OIX or XIO ``(*K, C/G, O)``."""
    return w if wf == "OIX" else np.transpose(w, (*_sp(w), 1, 0))


def convt_w(w, wf):
    """ConvTranspose weights IOX ``(I, O/G, *K)`` -> IOX, XOI ``(*K, O/G, I)``,
    OIX ``(O/G, I, *K)`` or XIO ``(*K, I, O/G)``."""
    sp = _sp(w)
    return np.transpose(w, {"IOX": (0, 1, *sp), "XOI": (*sp, 1, 0), "OIX": (1, 0, *sp),
                            "XIO": (*sp, 0, 1)}[wf])


def convt_w_between(w, src_wf, dst_wf):
    """A ConvTranspose weights tensor in ``src_wf`` re-laid out in ``dst_wf``."""
    r = w.ndim - 2
    to_iox = {"IOX": tuple(range(r + 2)), "XOI": (r + 1, r, *range(r)),
              "OIX": (1, 0, *range(2, r + 2)), "XIO": (r, r + 1, *range(r))}[src_wf]
    return convt_w(np.transpose(w, to_iox), dst_wf)


def split(total, mode):
    small, big = total // 2, total - total // 2
    return (small, big) if mode == "same_upper" else (big, small)


def conv_same_total(L, ke, s):
    return max(0, (-(-L // s) - 1) * s + ke - L)


def quarters(rng, shape, distinct=False):
    """Non-zero quarter-integers in [-2, 2]: float32 sums of their products are
    exact, and no tensor is all zeros (a one-element src of 0 once made the
    library's wrong gradient equal the right one).  ``distinct`` (the cases of a
    known fault): a tensor of at most 16 elements takes each value once, so that
    a fault reading another element of it reads another value (a diff_dst of
    (0.5, 1.5, 1.5) once made a shifted read agree)."""
    size = int(np.prod(shape))
    if distinct and size <= 16:
        values = np.concatenate([np.arange(1, 9), -np.arange(1, 9)]) / 4
        return rng.permutation(values)[:size].reshape(shape).astype(np.float32)
    magnitude = rng.integers(1, 9, shape) / 4
    return (magnitude * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def _rng(*key):
    return np.random.default_rng([zlib.crc32(str(k).encode()) for k in key])


# ----------------------------------------------------------------------------
# Cases: pure functions of (tag, index), so ids and data are stable
# ----------------------------------------------------------------------------


def gen(name, tag, i, **over):
    """A random case of op ``name``; ``over`` fixes any field.  A geometry in
    which some axis has no tap that reads the input (an all-zero result, which
    compares nothing) is drawn again."""
    for attempt in range(100):
        c = _draw(name, tag, i, attempt, over)
        if over or all(_reads_input(c, ax) for ax in range(c.r)):
            return c
    raise AssertionError(f"no case for {name} {tag} {i}")


def _reads_input(c, ax):
    """Does some output position of the equivalent convolution read a real
    input position through some tap on axis ``ax``?"""
    big, small = (c.L, c.M) if c.fam == "conv" else (c.B, c.L)
    return any(0 <= m * c.s[ax] + k * c.d[ax] - c.pb[ax] < big[ax]
               for m in range(small[ax]) for k in range(c.K[ax]))


def _draw(name, tag, i, attempt, over):
    rng = _rng(tag, i) if attempt == 0 else _rng(tag, i, attempt)
    fam = OPS[name][0]
    c = SimpleNamespace(name=name, fam=fam, tag=tag, i=i)
    c.r = over.get("r", 1 + int(rng.integers(0, 3)))
    c.mode = over.get("mode", MODES[int(rng.integers(0, 4))])
    c.df = over.get("df", DFS[int(rng.integers(0, 2))])
    if fam == "conv":
        wfs = CONV_WFS
    elif name == "conv_transpose_backprop_filters":
        wfs = CONVT_ALL_WFS
    else:                           # the current names: OIX/XIO now and then (refused)
        wfs = CONVT_WFS * 4 + ("OIX", "XIO")
    c.wf = over.get("wf", wfs[int(rng.integers(0, len(wfs)))])
    kind = over.get("groups", ("1", "1", "2", "3", "dw")[int(rng.integers(0, 5))])
    if kind == "dw":
        c.G, c.in_g, c.out_g = int(rng.integers(2, 5)), 1, int(rng.integers(1, 3))
    else:
        c.G, c.in_g, c.out_g = int(kind), int(rng.integers(1, 3)), int(rng.integers(1, 3))
    c.kind = kind
    r = c.r
    c.K = tuple(over.get("K") or (int(v) for v in rng.integers(1, 5 if r < 3 else 4, r)))
    c.s = tuple(over.get("s") or (int(v) for v in rng.integers(1, 4, r)))
    c.d = tuple(over.get("d") or (int(v) for v in rng.integers(1, 4 if r < 3 else 3, r)))
    if name == "conv_transpose_backward_data" and "d" not in over and rng.random() < 0.6:
        c.d = (1,) * r                  # fewer cases in the library's fault 1
    c.ke = tuple((k - 1) * d + 1 for k, d in zip(c.K, c.d))
    c.n = over.get("n", int(rng.integers(1, 3)))
    c.full = over.get("full", bool(rng.random() < 0.5))
    c.bias = over.get("bias", bool(rng.random() < 0.5))
    c.junk = over.get("junk", bool(rng.random() < 0.5))
    c.omit = over.get("omit", bool(rng.random() < 0.3))
    spellings = CG_AUTO_PAD[c.mode]
    c.cg_auto_pad = spellings[int(rng.integers(0, len(spellings)))]
    if fam == "conv":
        _conv_geometry(c, rng, over)
    else:
        _convt_geometry(c, rng, over)
    c.id = case_id(c)
    c.expect = expect(c)
    return c


def _conv_geometry(c, rng, over):
    """x (n, C, *L) -> y (n, O, *M); C = G*in_g, O = G*out_g."""
    c.C, c.O = c.G * c.in_g, c.G * c.out_g
    pb, pe, L = [], [], []
    for i, (ke, s) in enumerate(zip(c.ke, c.s)):
        if c.mode == "explicit":
            b, e = (int(v) for v in rng.integers(0, 4, 2))
            lo = max(1, ke - b - e)
            n = int(rng.integers(lo, lo + 4))
        else:
            n = int(rng.integers(ke, ke + 4)) if c.mode == "valid" else int(rng.integers(1, 8))
        if "L" in over:
            n = over["L"][i]
        if c.mode == "valid":
            b = e = 0
        elif c.mode != "explicit":
            b, e = split(conv_same_total(n, ke, s), c.mode)
        pb.append(b), pe.append(e), L.append(n)
    c.L, c.pb, c.pe = tuple(L), tuple(pb), tuple(pe)
    c.M = tuple((n + b + e - ke) // s + 1 for n, b, e, ke, s in zip(L, pb, pe, c.ke, c.s))
    assert min(c.M) >= 1, c
    # ConvolutionBackwardData: dst_shape full, spatial, or absent (D5; the library refuses)
    c.dst = over.get("dst", ("full", "spatial", "full", "spatial", None)[int(rng.integers(0, 5))])
    c.op = (0,) * c.r
    if c.name == "convolution_backward_data" and c.dst is not None and rng.random() < 0.3:
        # with dst_shape, output_padding is only range-checked (D5; the library ignores it)
        c.op = tuple(int(rng.integers(0, max(s, d))) for s, d in zip(c.s, c.d))


def _convt_geometry(c, rng, over):
    """src (n, I, *L) -> dst (n, O, *B); I = G*in_g, O = G*out_g,
    ``B = s*(L-1) + Ke - pb - pe + output_padding``."""
    c.I, c.O = c.G * c.in_g, c.G * c.out_g
    c.op = tuple(over.get("op") or (int(rng.integers(0, max(s, d)))
                                    for s, d in zip(c.s, c.d)))
    c.L = tuple(over.get("L") or (int(v) for v in rng.integers(1, 5, c.r)))
    pb, pe = [], []
    for n, ke, s, op in zip(c.L, c.ke, c.s, c.op):
        if c.mode == "explicit":
            while True:
                b, e = (int(v) for v in rng.integers(0, 4, 2))
                if s * (n - 1) + ke - b - e + op >= 1:
                    break
        elif c.mode == "valid":
            b = e = 0
        else:
            b, e = split(max(ke - s, 0), c.mode)
        pb.append(b), pe.append(e)
    c.pb, c.pe = tuple(pb), tuple(pe)
    c.B = tuple(s * (n - 1) + ke - b - e + op
                for n, ke, s, b, e, op in zip(c.L, c.ke, c.s, c.pb, c.pe, c.op))
    assert min(c.B) >= 1, c
    c.dst = None


def case_id(c):
    g = f"dw{c.G}" if c.kind == "dw" else f"g{c.G}"
    parts = [f"{c.i:03d}", f"{c.r}d", g, c.df, c.wf, c.mode,
             "x".join(map(str, c.K)), "s" + "x".join(map(str, c.s)),
             "d" + "x".join(map(str, c.d))]
    if any(c.op):
        parts.append("op" + "x".join(map(str, c.op)))
    if c.name == "convolution_backward_data":
        parts.append(f"dst-{c.dst}" if c.dst else "no-dst")
    return "-".join(parts)


# ----------------------------------------------------------------------------
# What the library is expected to do with a case
# ----------------------------------------------------------------------------


def lib_wf(c):
    return OLD_CONVT_WF[c.wf] if c.name == "conv_transpose_backprop_filters" else c.wf


def expect(c):
    """``("agree",)``, ``("refused", why)`` or ``("fault", key)``, from the
    library's rules as measured (each rule a model of what the library does,
    checked against every case of the module: an outcome other than the
    expected one fails)."""
    lib_op = OPS[c.name][1]
    if lib_op == "ConvolutionBackwardData":
        if c.dst is None:
            return ("refused", "ConvolutionBackwardData without dst_shape")
        if c.G > 1:
            return ("refused", "ConvolutionBackwardData with groups > 1")
    if c.fam == "convt" and lib_wf(c) not in CONVT_WFS:
        return ("refused", f"the ConvTranspose family's weights_format {c.wf}")
    if c.fam == "convt" and any(op >= s for op, s in zip(c.op, c.s)):
        # PyTorch's rule allows output_padding < max(stride, dilation) (D7); the
        # library's primitives need output_padding < stride (a unique small side)
        return ("refused", "output_padding >= stride")
    if lib_op == "ConvTransposeBackwardData":
        if ctbd_dilation_matters(c):
            return ("fault", "ctbd-dilation")
        if lib_same_pads_differ(c, c.B):
            return ("fault", "ctbd-same-output-padding")
    if lib_op == "ConvTransposeBackwardWeights" and lib_same_pads_differ(c, c.L):
        return ("fault", "ctbw-same")
    return ("agree",)


def lib_same_pads(n, ke, s, mode):
    """The library's SAME_* pads for a convolution whose input size is ``n``
    (v3.2 ``infer_auto_pad``): total ``Ke - s`` or ``Ke - n % s``, at least 0."""
    return split(max(0, ke - (n % s or s)), mode)


def lib_same_pads_differ(c, sizes):
    """With SAME_*, would the library's pads, taken from ``sizes`` per axis,
    give another begin pad than ConvTranspose's, or another small side?
    ConvTransposeBackwardData takes them from diff_dst's size (the same pads as
    ConvTranspose's unless output_padding > 0: fault 3),
    ConvTransposeBackwardWeights from src's (fault 2)."""
    if not c.mode.startswith("same"):
        return False
    for n, big, small, ke, s, pb in zip(sizes, c.B, c.L, c.ke, c.s, c.pb):
        b, e = lib_same_pads(n, ke, s, c.mode)
        if b != pb or (big + b + e - ke) // s + 1 != small:
            return True
    return False


def ctbd_dilation_matters(c):
    """ConvTransposeBackwardData runs its convolution without the dilations
    (fault 1): the result is still right only where every tap but the first
    of a dilated axis reads padding, dilated or not, and the undilated
    kernel gives the same small side."""
    for i, (k, d) in enumerate(zip(c.K, c.d)):
        if d == 1 or k == 1:
            continue
        if c.mode == "explicit":
            b, e = c.pb[i], c.pe[i]
        elif c.mode == "valid":
            b = e = 0
        else:
            b, e = lib_same_pads(c.B[i], c.ke[i], c.s[i], c.mode)
        s, big = c.s[i], c.B[i]
        if (big + b + e - k) // s != (big + b + e - c.ke[i]) // s:
            return True
        for m in range(c.L[i]):
            for t in range(1, k):
                if 0 <= m * s + t * d - b < big or 0 <= m * s + t - b < big:
                    return True
    return False


# ----------------------------------------------------------------------------
# One case: the arrays, convgrad's call and the library's request
# ----------------------------------------------------------------------------


def tensors(c):
    """The canonical (NCX, OIX / IOX) arrays of a case and its shape inputs."""
    rng = _rng(c.tag, c.i, "data")
    t = SimpleNamespace()
    q = functools.partial(quarters, rng, distinct=c.expect[0] == "fault")
    if c.fam == "conv":
        t.x = q((c.n, c.C, *c.L))
        t.w = q((c.O, c.C // c.G, *c.K))
        t.dy = q((c.n, c.O, *c.M))
    else:
        t.src = q((c.n, c.I, *c.L))
        t.w = q((c.I, c.O // c.G, *c.K))
        t.dd = q((c.n, c.O, *c.B))
    t.bias = q((c.O,)) if c.bias else None
    return t


def _common_attrs(c):
    """(convgrad keyword arguments, library attributes) shared by every op."""
    r = c.r
    lib = dict(strides=list(c.s), dilations=list(c.d))
    cg = dict(strides=list(c.s), dilations=list(c.d))
    if c.mode == "explicit":
        lib.update(pads_begin=list(c.pb), pads_end=list(c.pe))
        cg.update(pads_begin=list(c.pb), pads_end=list(c.pe))
    else:
        junk = ([3] * r, [1] * r) if c.junk else ([0] * r, [0] * r)
        lib.update(pads_begin=junk[0], pads_end=junk[1])
        if c.junk:
            cg.update(pads_begin=junk[0], pads_end=junk[1])
    if not (c.omit and c.mode == "explicit"):
        lib["auto_pad"] = LIB_AUTO_PAD[c.mode]
        if c.cg_auto_pad is not None:
            cg["auto_pad"] = c.cg_auto_pad
    if not (c.omit and c.G == 1):
        lib["groups"] = cg["groups"] = c.G
    if not (c.omit and c.df == "NXC"):
        lib["data_format"] = cg["data_format"] = c.df
    fmt = "filter_format" if "backprop_filters" in c.name else "weights_format"
    if not (c.omit and c.wf == DEFAULT_WF[c.name]):
        cg[fmt] = c.wf
        lib["weights_format"] = lib_wf(c)
    return cg, lib


def calls(c):
    """(convgrad's call as a thunk, the library's Request, a function turning
    the library's result into convgrad's format)."""
    t = tensors(c)
    cg, lib = _common_attrs(c)
    df, same = c.df, (lambda a: a)
    nd = c.r + 2
    if c.name in ("convolution_backward_weights", "convolution_backprop_filters"):
        x, dy = to_df(t.x, df), to_df(t.dy, df)
        full = conv_w(np.empty((c.O, c.C // c.G, *c.K)), c.wf).shape
        shape = list(full) if c.full else list(c.K)
        lib["weights_shape"] = list(full)
        if c.name == "convolution_backward_weights":
            run = lambda: onednn.convolution_backward_weights(x, dy, shape, **cg)  # noqa: E731
        else:
            run = lambda: onednn.convolution_backprop_filters(x, shape, dy, **cg)  # noqa: E731
        return run, dg.Request("ConvolutionBackwardWeights", [x, dy], lib, nd), same
    if c.name == "convolution_backward_data":
        dy, w = to_df(t.dy, df), conv_w(t.w, c.wf)
        full = to_df(np.empty((c.n, c.C, *c.L)), df).shape
        dst = {"full": list(full), "spatial": list(c.L), None: None}[c.dst]
        if c.dst is not None:
            lib["dst_shape"] = list(full)
        if any(c.op):
            cg["output_padding"] = lib["output_padding"] = list(c.op)
        run = lambda: onednn.convolution_backward_data(dy, w, dst, **cg)  # noqa: E731
        return run, dg.Request("ConvolutionBackwardData", [dy, w], lib, nd), same
    if c.name == "convolution":
        x, w = to_df(t.x, df), conv_w(t.w, c.wf)
        run = lambda: onednn.convolution(x, w, t.bias, **cg)  # noqa: E731
        ins = [x, w] + ([t.bias] if c.bias else [])
        return run, dg.Request("Convolution", ins, lib, nd), same
    # the ConvTranspose family
    w_cg, w_lib = convt_w(t.w, c.wf), convt_w(t.w, lib_wf(c))
    if c.name == "conv_transpose":
        src = to_df(t.src, df)
        if any(c.op) or not c.omit:
            cg["output_padding"] = lib["output_padding"] = list(c.op)
        run = lambda: onednn.conv_transpose(src, w_cg, t.bias, **cg)  # noqa: E731
        ins = [src, w_lib] + ([t.bias] if c.bias else [])
        return run, dg.Request("ConvTranspose", ins, lib, nd), same
    if any(c.op) or not c.omit:           # convgrad only: diff_dst's shape tells the library
        cg["output_padding"] = list(c.op)
    if c.name == "conv_transpose_backward_data":
        dd = to_df(t.dd, df)
        run = lambda: onednn.conv_transpose_backward_data(dd, w_cg, **cg)  # noqa: E731
        return run, dg.Request("ConvTransposeBackwardData", [dd, w_lib], lib, nd), same
    src, dd = to_df(t.src, df), to_df(t.dd, df)
    shape = list(w_cg.shape) if c.full else list(c.K)
    lib["weights_shape"] = list(w_lib.shape)
    if c.name == "conv_transpose_backward_weights":
        run = lambda: onednn.conv_transpose_backward_weights(src, dd, shape, **cg)  # noqa: E731
        back = same
    else:
        run = lambda: onednn.conv_transpose_backprop_filters(src, dd, shape, **cg)  # noqa: E731
        back = lambda a: convt_w_between(a, lib_wf(c), c.wf)  # noqa: E731
    return run, dg.Request("ConvTransposeBackwardWeights", [src, dd], lib, nd), back


# ----------------------------------------------------------------------------
# Running a case
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def library():
    """One worker process per test process (xdist worker)."""
    runner = dg.Runner()
    try:
        runner.start()
    except RuntimeError as exc:          # the file is there but does not load
        if os.environ.get("CONVGRAD_REQUIRE_PEERS") == "1":
            raise
        pytest.skip(str(exc))
    yield runner
    runner.close()


def check(library, c):
    run, req, back = calls(c)
    outcome = library.run(req)
    kind = c.expect[0]
    if kind == "refused":
        if outcome.status == "ok":     # then it must have answered another question
            got, want = run(), back(outcome.output)
            assert got.shape != want.shape, (
                f"the library computed a case expected to be refused ({c.expect[1]})")
        pytest.skip(f"oneDNN Graph refuses {c.expect[1]}: {outcome.describe()}")
    assert outcome.status == "ok", f"oneDNN Graph {outcome.describe()}"
    got = run()
    want = back(outcome.output)
    assert got.dtype == np.float32
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(got, want, err_msg=c.id)


def params(cases):
    out = []
    for c in cases:
        marks = ()
        if c.expect[0] == "fault":
            marks = (pytest.mark.xfail(strict=True, reason=FAULTS[c.expect[1]]),)
        out.append(pytest.param(c, id=f"{c.name}-{c.id}", marks=marks))
    return out


# ----------------------------------------------------------------------------
# Random cases, and corner cases on a grid
# ----------------------------------------------------------------------------

# 120 per op in `make test` (the module takes about 30 s on 2 cores); the README also
# gives the counts of CONVGRAD_ONEDNN_CASES=1000, for which every expectation holds too.
N_RANDOM = int(os.environ.get("CONVGRAD_ONEDNN_CASES", "120"))
RANDOM = [gen(name, f"rand-{name}", i) for name in OPS for i in range(N_RANDOM)]


def _formats(name):
    if OPS[name][0] == "conv":
        return CONV_WFS
    return CONVT_ALL_WFS if name == "conv_transpose_backprop_filters" else CONVT_WFS


# Every op x rank x auto_pad mode, the weights formats and data formats in turn.
GRID = [gen(name, f"grid-{name}", j, r=r, mode=mode, groups=("1", "2", "dw")[j % 3],
            wf=_formats(name)[j % len(_formats(name))], df=DFS[(j // 2) % 2])
        for name in OPS
        for j, (r, mode) in enumerate((r, m) for r in (1, 2, 3) for m in MODES)]

# Odd SAME totals, where same_upper and same_lower differ.  Convolution family:
# L=5, K=4, s=1 -> total 3; L=7, K=2, d=3, s=2 -> Ke=4, total (4-1)*2 + 4 - 7 = 3.
# ConvTranspose family: Ke - s = 3 on both axes (K=4, s=1; K=5, s=2).
_ODD = {"conv": dict(r=2, K=(4, 2), s=(1, 2), d=(1, 3), L=(5, 7), dst="full"),
        "convt": dict(r=2, K=(4, 5), s=(1, 2), d=(1, 1), L=(3, 2), op=(0, 1))}
ODD = [gen(name, f"odd-{name}", j, mode=mode, df=df, wf=_formats(name)[j % 2],
           groups="1" if name == "convolution_backward_data" else "2",
           **dict(_ODD[OPS[name][0]], **({"op": (0, 0)} if "backward_data" in name else {})))
       for name in OPS
       for j, (mode, df) in enumerate((m, d) for m in ("same_upper", "same_lower") for d in DFS)]


def counts(n_random):
    """(cases, agree, refused, faults) of the compared cases with ``n_random``
    random cases per op."""
    cases = RANDOM + GRID + ODD
    if n_random != N_RANDOM:
        cases = [gen(name, f"rand-{name}", i) for name in OPS for i in range(n_random)]
        cases += GRID + ODD
    kinds = [c.expect[0] for c in cases]
    return len(cases), kinds.count("agree"), kinds.count("refused"), kinds.count("fault")


def test_readme_states_the_counts():
    """The README's counts are this module's (each case's outcome is checked
    against its expectation, so these are the measured counts when it passes)."""
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    text = readme.split("### Conformance with the oneDNN Graph library", 1)[1]
    nums = lambda pattern: tuple(int(v.replace(",", "")) for v in  # noqa: E731
                                 re.search(pattern, text, re.S).groups())
    assert nums(r"On\s+([\d,]+) cases \(120 random.*?\*\*([\d,]+) agree\s+exactly\*\*.*?"
                r"([\d,]+) are refused.*?and ([\d,]+) fall in its three known faults"
                ) == counts(120)
    assert nums(r"CONVGRAD_ONEDNN_CASES=1000` \(.*?\): ([\d,]+) cases, ([\d,]+)\s+agree, "
                r"([\d,]+) refused, ([\d,]+) faults") == counts(1000)
    assert re.search(r"with\s+convgrad on all (\d+)", text).group(1) == str(counts(120)[3])


@pytest.mark.parametrize("c", params(RANDOM))
def test_random(library, c):
    check(library, c)


@pytest.mark.parametrize("c", params(GRID))
def test_every_rank_and_auto_pad(library, c):
    check(library, c)


@pytest.mark.parametrize("c", params(ODD))
def test_odd_same_totals(library, c):
    """same_upper puts the odd element at the end, same_lower at the beginning,
    in every op (docs/decisions.md D3, D4)."""
    check(library, c)


def test_odd_cases_have_odd_totals_split_as_documented():
    for c in ODD:
        assert all((b + e) % 2 == 1 for b, e in zip(c.pb, c.pe)), c.id
        big = [max(b, e) for b, e in zip(c.pb, c.pe)]
        assert list(c.pe if c.mode == "same_upper" else c.pb) == big, c.id


def test_the_cases_cover_what_they_claim():
    """Every op, rank, auto_pad mode, data format, weights format, group kind
    and shape-input form is in the module, and so is each expected outcome."""
    cases = RANDOM + GRID + ODD
    for name in OPS:
        mine = [c for c in cases if c.name == name]
        assert {c.r for c in mine} == {1, 2, 3}, name
        assert {c.mode for c in mine} == set(MODES), name
        assert {c.df for c in mine} == set(DFS), name
        assert {c.wf for c in mine} >= set(_formats(name)), name
        assert {c.kind for c in mine} >= {"1", "2", "dw"}, name
        assert sum(c.expect == ("agree",) for c in mine) >= 40, name
    assert {c.full for c in cases} == {True, False}
    assert {c.dst for c in cases if c.name == "convolution_backward_data"} == {
        "full", "spatial", None}
    assert any(any(c.op) for c in cases if c.name == "convolution_backward_data")
    assert {c.expect[1] for c in cases if c.expect[0] == "fault"} == set(FAULTS)
    assert len({c.expect[1] for c in cases if c.expect[0] == "refused"}) >= 5


# ----------------------------------------------------------------------------
# What the library refuses that convgrad runs, one case each
# ----------------------------------------------------------------------------


def _request(c, **change):
    """A case's request to the library with attributes changed (None removes)."""
    _, req, _ = calls(c)
    attrs = dict(req.attrs, **change)
    return dg.Request(req.op, req.inputs, {k: v for k, v in attrs.items() if v is not None},
                      req.out_ndims)


_BASE = dict(r=2, mode="explicit", groups="1", omit=False, junk=False, df="NCX", dst="full")
_CBW = gen("convolution_backward_weights", "refuse", 0, **dict(_BASE, mode="same_upper"))
_CBD = gen("convolution_backward_data", "refuse", 1, **_BASE)
_CTBD = gen("conv_transpose_backward_data", "refuse", 2, **dict(_BASE, op=(1, 1), s=(2, 2),
                                                                 d=(1, 1), wf="XOI"))
_CTBW = gen("conv_transpose_backward_weights", "refuse", 3, **dict(_BASE, op=(1, 1), s=(2, 2),
                                                                    wf="XOI"))
_INVALID = "refused at add_op: invalid_graph_op"
_SHAPE = "refused at compile: invalid_shape"
_ABORT = "aborted the process (SIGABRT) -- terminate called after throwing"
# what: (a case, the change to its request (None removes an attribute; "input":
# move a shape attribute to an input tensor), what the library says)
REFUSALS = {
    # the schema's spellings only; convgrad takes any case (D2)
    "lower-case auto_pad": (_CBW, dict(auto_pad="same_upper"),
                            f"{_INVALID} -- ConvolutionBackwardWeights,attribute auto_pad "
                            "has invalid value"),
    "auto_pad NONE": (_CBW, dict(auto_pad="NONE"), "attribute auto_pad has invalid value"),
    # no output_padding in the 3.2 schema of the ConvTranspose backward ops
    "output_padding on ConvTransposeBackwardData": (
        _CTBD, dict(output_padding=[1, 1]), "attribute output_padding is not defined in spec"),
    "output_padding on ConvTransposeBackwardWeights": (
        _CTBW, dict(output_padding=[1, 1]), "attribute output_padding is not defined in spec"),
    # a shape as an input tensor, as the spec allows
    "weights_shape as an input": (_CBW, dict(input="weights_shape"), _SHAPE),
    "dst_shape as an input": (_CBD, dict(input="dst_shape"), _SHAPE),
    "ConvolutionBackwardData without dst_shape": (_CBD, dict(dst_shape=None), _SHAPE),
    "ConvolutionBackwardData with groups": (
        gen("convolution_backward_data", "refuse", 4, **dict(_BASE, groups="2")), {}, _SHAPE),
    "ConvTranspose weights_format XIO": (
        gen("conv_transpose", "refuse", 5, **dict(_BASE, wf="XIO")), {},
        "attribute weights_format has invalid value"),
    # its shape inference reads empty pads as zeros (so does convgrad), its backend does not
    "empty pads_begin and pads_end": (_CTBW, dict(pads_begin=[], pads_end=[]),
                                      f"{_ABORT} an instance of 'dnnl::error' /   what():  "
                                      "dimensions are invalid"),
    "ConvTranspose output_padding >= stride (< dilation)": (
        gen("conv_transpose", "refuse", 6, **dict(_BASE, s=(1, 1), d=(2, 2), op=(1, 0),
                                                     K=(2, 2), wf="XOI")), {},
        f"{_ABORT} an instance of 'dnnl::error' /   what():  could not create a primitive "
        "descriptor for a deconvolution forward propagation primitive"),
}


@pytest.mark.parametrize("what", REFUSALS)
def test_refusal(library, what):
    """The library refuses (or aborts on) a spec feature that convgrad computes:
    a skip with the library's reason, which must be the one expected.  Where
    the case without the feature agrees, that is checked first, so the feature
    alone is what the library refuses."""
    c, change, reason = REFUSALS[what]
    if c.expect == ("agree",):
        check(library, c)
    run, req, _ = calls(c)
    got = run()
    attrs = dict(req.attrs)
    inputs = list(req.inputs)
    for name, value in change.items():
        if name == "input":
            inputs.append(np.array(attrs.pop(value), np.int32))
        elif value is None:
            del attrs[name]
        else:
            attrs[name] = value
    outcome = library.run(dg.Request(req.op, inputs, attrs, req.out_ndims))
    if outcome.status == "ok":
        assert outcome.output.shape != got.shape, f"the library computes {what}"
    assert reason in outcome.describe(), outcome.describe()
    pytest.skip(f"oneDNN Graph refuses {what}: {outcome.describe()}")


def test_library_aborts_where_convgrad_raises(library):
    """Input both specs call invalid: convgrad raises ConvGradError naming the
    rule, the library aborts the process (the worker survives it)."""
    w = np.ones((2, 1, 2), np.float32)
    attrs = dict(strides=[1], pads_begin=[0], pads_end=[0], dilations=[1],
                 data_format="NCX", weights_format="OIX")
    for what, channels, change, rule in (
            ("a negative pad", 1, dict(pads_end=[-1]), "pads_end = \\[-1\\]"),
            ("3 channels in 2 groups", 3, dict(groups=2), "src channels = 3")):
        x = np.ones((1, channels, 4), np.float32)
        with pytest.raises(ConvGradError, match=rule):
            onednn.convolution(x, w, **dict(attrs, **change))
        outcome = library.run(dg.Request("Convolution", [x, w], dict(attrs, **change), 3))
        assert outcome.status == "aborted", (what, outcome.describe())
        assert "could not create a primitive descriptor" in outcome.reason, outcome.reason
    x = np.ones((1, 1, 4), np.float32)
    assert library.run(dg.Request("Convolution", [x, w], attrs, 3)).status == "ok"


# ----------------------------------------------------------------------------
# The library's three known faults: a repro each, and PyTorch's verdict
# ----------------------------------------------------------------------------

_REPRO = dict(r=1, groups="1", n=1, in_g=1, omit=False, junk=False, df="NCX", full=True,
              bias=False)
REPROS = {
    # s*(L-1) + Ke = 2 + 3: with the dilation dropped the sizes still fit (K=2:
    # (5 - 2)//2 + 1 = 2), so the library answers, with the dilation-1 taps
    "ctbd-dilation": gen("conv_transpose_backward_data", "repro", 1, **dict(
        _REPRO, mode="explicit", K=(2,), s=(2,), d=(2,), L=(2,), op=(0,), wf="IOX")),
    # src L=3, s=2: the library pads by the forward rule on 3 (total 2: 1/1), the
    # ConvTranspose by Ke - s = 1 (0/1); the sizes fit, the taps are shifted
    "ctbw-same": gen("conv_transpose_backward_weights", "repro", 2, **dict(
        _REPRO, mode="same_upper", K=(3,), s=(2,), d=(1,), L=(3,), op=(0,), wf="IOX")),
    # diff_dst of 2*2 + 1 = 5: the forward rule on 5 gives total 2 (1/1) and a
    # diff_src of 3, ConvTranspose's rule total 1 (0/1) and its src of 2
    "ctbd-same-output-padding": gen("conv_transpose_backward_data", "repro", 3, **dict(
        _REPRO, mode="same_upper", K=(3,), s=(2,), d=(1,), L=(2,), op=(1,), wf="IOX")),
}


@pytest.mark.parametrize("key", [pytest.param(k, marks=pytest.mark.xfail(
    strict=True, reason=FAULTS[k])) for k in REPROS])
def test_known_fault(library, key):
    """Repro of a fault of oneDNN v3.2 (strict xfail: fixed, it would XPASS)."""
    c = REPROS[key]
    assert c.expect == ("fault", key)
    check(library, c)


def torch_conv_transpose_grads(c):
    """The gradients of oneDNN's ConvTranspose with the case's attributes by
    PyTorch autograd, in the case's layouts: (d diff_dst-side src, d weights).
    ConvTranspose's output is the full transposed convolution (no padding)
    cropped by pads_begin at the front and ending at size B, output_padding
    positions past the full extent being zeros."""
    torch = import_peer("torch")
    F = torch.nn.functional
    t = tensors(c)
    src = torch.tensor(t.src, dtype=torch.float64, requires_grad=True)
    w = torch.tensor(t.w, dtype=torch.float64, requires_grad=True)
    conv_t = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[c.r]
    full = conv_t(src, w, stride=c.s, dilation=c.d, groups=c.G)
    extra = [max(0, b + big - n) for b, big, n in zip(c.pb, c.B, full.shape[2:])]
    pad = [v for e in reversed(extra) for v in (0, e)]
    y = F.pad(full, pad)[(slice(None), slice(None)) + tuple(
        slice(b, b + big) for b, big in zip(c.pb, c.B))]
    (y * torch.tensor(t.dd, dtype=torch.float64)).sum().backward()
    return to_df(src.grad.numpy(), c.df), w.grad.numpy()


def _pytorch_sides_with_convgrad(library, c):
    run, req, back = calls(c)
    d_src, d_w = torch_conv_transpose_grads(c)
    want = d_src if "backward_data" in c.name else convt_w(d_w, c.wf)
    got = run()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=c.id)
    outcome = library.run(req)
    if outcome.status == "ok":
        lib = back(outcome.output)
        assert lib.shape != want.shape or not np.allclose(lib, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("key", REPROS)
def test_pytorch_sides_with_convgrad_on_the_repro(library, key):
    """On each repro, PyTorch's autograd gives convgrad's result, not the library's."""
    _pytorch_sides_with_convgrad(library, REPROS[key])


FAULT_CASES = [c for c in RANDOM + GRID + ODD if c.expect[0] == "fault"]


@pytest.mark.parametrize("c", [pytest.param(c, id=f"{c.name}-{c.id}") for c in FAULT_CASES])
def test_pytorch_sides_with_convgrad_on_every_fault_case(library, c):
    _pytorch_sides_with_convgrad(library, c)
