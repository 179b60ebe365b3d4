"""Conformance with PyTorch 2.13 (CPU, float64): the oneDNN Graph dialect and the
canonical API against ``torch.ops.aten.convolution_backward`` and
``torch.nn.functional.conv{1,2,3}d`` / ``conv_transpose{1,2,3}d``.

The data path is independent of convgrad: every tensor is built in NCX (data),
OIX ``(O, C/G, *K)`` (Convolution weights) or PyTorch's IOX ``(I, O/G, *K)``
(ConvTranspose weights) float64, and converted to the requested layout here
with ``np.transpose``.  PyTorch only knows symmetric padding, so asymmetric pads
are applied (or cropped) explicitly with :func:`window` and PyTorch runs with
padding 0.  The auto_pad rules are re-derived here:

- Convolution family: ``total = max(0, (ceil(L/s)-1)*s + Ke - L)``;
- ConvTranspose family: ``total = max(Ke - s, 0)``;

``same_upper`` -> ``(total//2, total - total//2)``, ``same_lower`` the mirror.

A ConvTranspose with pads (pb, pe) and output_padding op is PyTorch's
conv_transpose with padding 0 and the same output_padding (length
``s*(L-1) + Ke + op``, the output_padding positions being real, zero-valued,
positions) cropped to ``[pb : s*(L-1) + Ke + op - pe]``.
"""

import itertools
import os
import zlib
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

import convgrad
from conftest import CONFORMANCE_SCALE
from convgrad import onednn

pytestmark = pytest.mark.peers


def _import_torch():
    """torch, or a skip -- a failure when CONVGRAD_REQUIRE_PEERS=1 (CI)."""
    if os.environ.get("CONVGRAD_REQUIRE_PEERS") == "1":
        import torch
        return torch
    return pytest.importorskip("torch")


torch = _import_torch()
F = torch.nn.functional
torch.set_num_threads(2)

F64, F32, F16 = np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
DT_NAME = {F64: "f64", F32: "f32", F16: "f16", BF16: "bf16"}
# Max abs error allowed, relative to max(1, max |reference|).
TOL = {F64: 1e-10, F32: 1e-4, F16: 2e-3, BF16: 1.5e-2}

DFS = ("NXC", "NCX")
CONV_WFS = ("XIO", "OIX")
CONVT_WFS = ("XOI", "IOX", "OIX", "XIO")
MODES = ("explicit", "same_upper", "same_lower", "valid")
SPELLINGS = {"explicit": ("None", "none", None), "same_upper": ("SAME_UPPER", "same_upper"),
             "same_lower": ("SAME_LOWER", "same_lower"), "valid": ("VALID", "valid")}
DEFAULT_WF = {"convolution_backward_weights": "XIO", "convolution_backprop_filters": "XIO",
              "conv_transpose_backprop_filters": "XIO",
              "conv_transpose_backward_weights": "XOI", "convolution_backward_data": "XIO",
              "conv_transpose_backward_data": "XOI", "convolution": "XIO",
              "conv_transpose": "XOI"}
FCONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
FCONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


# ----------------------------------------------------------------------------
# Independent layout conversions and padding
# ----------------------------------------------------------------------------


def _sp(a):
    return tuple(range(2, a.ndim))


def to_df(a, df):
    """NCX -> the requested data format."""
    return a if df == "NCX" else np.transpose(a, (0, *_sp(a), 1))


def conv_w_to(w, wf):
    """Convolution weights (O, C/G, *K) -> OIX or XIO (*K, C/G, O)."""
    return w if wf == "OIX" else np.transpose(w, (*_sp(w), 1, 0))


def convt_w_to(w, wf):
    """ConvTranspose weights IOX (I, O/G, *K) -> IOX, XOI (*K, O/G, I),
    OIX (O/G, I, *K) or XIO (*K, I, O/G)."""
    sp = _sp(w)
    perm = {"IOX": (0, 1, *sp), "XOI": (*sp, 1, 0), "OIX": (1, 0, *sp), "XIO": (*sp, 0, 1)}
    return np.transpose(w, perm[wf])


def window(a, lo, hi):
    """``a[..., lo:hi]`` on every spatial axis, reading zeros outside the array
    (``lo`` may be negative, ``hi`` beyond the end)."""
    lead = a.ndim - len(lo)
    before = [max(0, -v) for v in lo]
    after = [max(0, h - n) for h, n in zip(hi, a.shape[lead:])]
    a = np.pad(a, [(0, 0)] * lead + list(zip(before, after)))
    return a[(slice(None),) * lead + tuple(slice(v + b, h + b)
                                           for v, h, b in zip(lo, hi, before))]


def split_same(total, mode):
    small, big = total // 2, total - total // 2
    return (small, big) if mode == "same_upper" else (big, small)


def conv_auto_pads(mode, L, ke, s):
    if mode == "valid":
        return 0, 0
    total = max(0, (-(-L // s) - 1) * s + ke - L)
    return split_same(total, mode)


def convt_auto_pads(mode, ke, s):
    if mode == "valid":
        return 0, 0
    return split_same(max(ke - s, 0), mode)


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def _ints(v):
    return tuple(int(x) for x in v)


# ----------------------------------------------------------------------------
# PyTorch references, canonical layouts, float64
# ----------------------------------------------------------------------------


def _sym(pb, pe):
    return tuple(pb) == tuple(pe)


def ref_conv_fwd(x, w, c, bias=None):
    r = w.ndim - 2
    b = None if bias is None else _t(bias)
    if _sym(c.pb, c.pe):
        y = FCONV[r](_t(x), _t(w), b, stride=c.s, padding=c.pb, dilation=c.d, groups=c.G)
    else:
        xp = window(x, [-v for v in c.pb], [n + e for n, e in zip(x.shape[2:], c.pe)])
        y = FCONV[r](_t(xp), _t(w), b, stride=c.s, padding=0, dilation=c.d, groups=c.G)
    return y.numpy()


def ref_conv_wgrad(x, dy, w_shape, s, d, pb, pe, groups):
    r = len(s)
    w0 = torch.zeros(w_shape, dtype=torch.float64)
    if _sym(pb, pe):
        xp, pad = x, list(pb)
    else:
        xp, pad = window(x, [-v for v in pb], [n + e for n, e in zip(x.shape[2:], pe)]), [0] * r
    _, gw, _ = torch.ops.aten.convolution_backward(
        _t(dy), _t(xp), w0, None, list(s), pad, list(d), False, [0] * r, groups,
        [False, True, False])
    return gw.numpy()


def ref_conv_dgrad(w, dy, x_shape, s, d, pb, pe, groups):
    """Gradient of the forward conv of an x of ``x_shape`` with pads (pb, pe);
    pe may be negative (the input is then cropped at the end)."""
    r = len(s)
    sizes = x_shape[2:]
    if _sym(pb, pe):
        x0 = torch.zeros(x_shape, dtype=torch.float64)
        gx, _, _ = torch.ops.aten.convolution_backward(
            _t(dy), x0, _t(w), None, list(s), list(pb), list(d), False, [0] * r, groups,
            [True, False, False])
        return gx.numpy()
    padded = (*x_shape[:2], *(n + b + e for n, b, e in zip(sizes, pb, pe)))
    x0 = torch.zeros(padded, dtype=torch.float64)
    gxp, _, _ = torch.ops.aten.convolution_backward(
        _t(dy), x0, _t(w), None, list(s), [0] * r, list(d), False, [0] * r, groups,
        [True, False, False])
    return window(gxp.numpy(), list(pb), [b + n for b, n in zip(pb, sizes)])


def ref_convt_fwd(src, w, c, bias=None):
    r = w.ndim - 2
    b = None if bias is None else _t(bias)
    if _sym(c.pb, c.pe):
        return FCONVT[r](_t(src), _t(w), b, stride=c.s, padding=c.pb,
                         output_padding=c.op, groups=c.G, dilation=c.d).numpy()
    full = FCONVT[r](_t(src), _t(w), b, stride=c.s, padding=0, output_padding=c.op,
                     groups=c.G, dilation=c.d).numpy()
    return window(full, list(c.pb), [b_ + n for b_, n in zip(c.pb, c.B)])


def _convt_backward(src, dd, w, c, mask):
    r = len(c.s)
    if _sym(c.pb, c.pe):
        ddf, pad = dd, list(c.pb)
    else:
        ddf = window(dd, [-v for v in c.pb], [n + e for n, e in zip(c.B, c.pe)])
        pad = [0] * r
    return torch.ops.aten.convolution_backward(
        _t(ddf), src, w, None, list(c.s), pad, list(c.d), True, list(c.op), c.G, mask)


def ref_convt_wgrad(src, dd, c):
    w0 = torch.zeros((c.I, c.O // c.G, *c.K), dtype=torch.float64)
    return _convt_backward(_t(src), dd, w0, c, [False, True, False])[1].numpy()


def ref_convt_dgrad(dd, w, c):
    s0 = torch.zeros((c.n, c.I, *c.L), dtype=torch.float64)
    return _convt_backward(s0, dd, _t(w), c, [True, False, False])[0].numpy()


# ----------------------------------------------------------------------------
# Random configurations (pure functions of (tag, index): ids are stable)
# ----------------------------------------------------------------------------


def _rng(tag, i, *extra):
    return np.random.default_rng([zlib.crc32(tag.encode()), i, *extra])


def _common(tag, i, rng, wfs, modes, dtype, over):
    r = over.get("r", 1 + i % 3)
    nm = len(modes)
    mode = over.get("mode", modes[i % nm])
    df = over.get("df", DFS[(i // nm + i // (2 * nm)) % 2])
    wf = over.get("wf", wfs[(i // 2 + i // (2 * nm)) % len(wfs)])
    kind = over.get("groups", str(rng.choice(["1", "2", "3", "dw"])))
    if dtype is None:
        dtype = (F64, F64, F32)[int(rng.integers(0, 3))]
    K = over.get("K") or _ints(rng.integers(1, 5 if r < 3 else 4, r))
    s = over.get("s") or _ints(rng.integers(1, 4, r))
    d = over.get("d") or _ints(rng.integers(1, 4 if r < 3 else 3, r))
    c = SimpleNamespace(tag=tag, i=i, r=r, mode=mode, df=df, wf=wf, kind=kind,
                        dtype=np.dtype(dtype), K=K, s=s, d=d,
                        ke=tuple((k - 1) * dd + 1 for k, dd in zip(K, d)),
                        n=int(rng.integers(1, 4)),
                        full=bool(rng.random() < 0.5), bias=bool(rng.random() < 0.5),
                        junk_pads=bool(rng.random() < 0.5),
                        omit_defaults=bool(rng.random() < 0.3),
                        auto_pad=SPELLINGS[mode][int(rng.integers(0, len(SPELLINGS[mode])))])
    if kind == "dw":
        c.G, c.in_g, c.out_g = int(rng.integers(2, 5)), 1, int(rng.integers(1, 3))
    else:
        lo, hi = over.get("ch", (1, 3))           # channels a group: [lo, hi)
        c.G, c.in_g, c.out_g = int(kind), int(rng.integers(lo, hi)), int(rng.integers(lo, hi))
    return c


def _id(c, extra=""):
    g = f"dw{c.G}" if c.kind == "dw" else f"g{c.G}"
    return (f"{c.i:02d}-{c.r}d-{g}-{c.df}-{c.wf}-{c.mode}-"
            f"{'full' if c.full else 'spatial'}-{DT_NAME[c.dtype]}{extra}")


def gen_conv(tag, i, *, wfs=CONV_WFS, modes=MODES, dtype=None, **over):
    """A Convolution: x (n, C, *L) -> y (n, O, *M); C = G*in_g, O = G*out_g."""
    rng = _rng(tag, i)
    c = _common(tag, i, rng, wfs, modes, dtype, over)
    c.C, c.O = c.G * c.in_g, c.G * c.out_g
    pb, pe, L = [], [], []
    for ke, s in zip(c.ke, c.s):
        if c.mode == "explicit":
            b, e = (int(v) for v in rng.integers(0, 4, 2))
            lo = max(1, ke - b - e)
            n = int(rng.integers(lo, lo + 4))
        else:
            n = int(rng.integers(ke, ke + 4)) if c.mode == "valid" else int(rng.integers(1, 7))
            b, e = conv_auto_pads(c.mode, n, ke, s)
        pb.append(b), pe.append(e), L.append(n)
    c.L = tuple(over.get("L") or L)
    if "L" in over and c.mode != "explicit":
        pe_pb = [conv_auto_pads(c.mode, n, ke, s) for n, ke, s in zip(c.L, c.ke, c.s)]
        pb, pe = [p[0] for p in pe_pb], [p[1] for p in pe_pb]
    c.pb, c.pe = tuple(pb), tuple(pe)
    c.M = tuple((n + b + e - ke) // s + 1
                for n, b, e, ke, s in zip(c.L, c.pb, c.pe, c.ke, c.s))
    assert min(c.M) >= 1
    c.id = _id(c)
    return c


def gen_convt(tag, i, *, wfs=CONVT_WFS, modes=MODES, dtype=None, **over):
    """A ConvTranspose: src (n, I, *L) -> dst (n, O, *B); I = G*in_g, O = G*out_g,
    ``B = s*(L-1) + Ke - pb - pe + op``."""
    rng = _rng(tag, i)
    c = _common(tag, i, rng, wfs, modes, dtype, over)
    c.I, c.O = c.G * c.in_g, c.G * c.out_g
    c.op = over.get("op") or _ints(rng.integers(0, max(s, d)) for s, d in zip(c.s, c.d))
    c.L = over.get("L") or _ints(rng.integers(1, 5, c.r))
    pb, pe = [], []
    for n, ke, s, op in zip(c.L, c.ke, c.s, c.op):
        if c.mode == "explicit":
            while True:
                b, e = (int(v) for v in rng.integers(0, 4, 2))
                if s * (n - 1) + ke - b - e + op >= 1:
                    break
        else:
            b, e = convt_auto_pads(c.mode, ke, s)
        pb.append(b), pe.append(e)
    c.pb, c.pe = tuple(pb), tuple(pe)
    c.B = tuple(s * (n - 1) + ke - b - e + op
                for n, ke, s, b, e, op in zip(c.L, c.ke, c.s, c.pb, c.pe, c.op))
    assert min(c.B) >= 1
    c.id = _id(c, f"-op{'x'.join(map(str, c.op))}")
    return c


def _data(c, *shapes):
    """Standard-normal float64 arrays holding values exactly representable in c.dtype."""
    rng = _rng(c.tag, c.i, 1)
    return [rng.standard_normal(sh).astype(c.dtype).astype(np.float64) for sh in shapes]


def _in(a, c):
    """A canonical NCX float64 array as the library's input: data format and dtype."""
    return to_df(a, c.df).astype(c.dtype)


def _pad_kw(c):
    kw = {}
    if c.auto_pad is not None:
        kw["auto_pad"] = c.auto_pad
    if c.mode == "explicit":
        if any(c.pb) or any(c.pe) or not c.omit_defaults:
            kw.update(pads_begin=list(c.pb), pads_end=list(c.pe))
    elif c.junk_pads:          # the specs: pads are ignored unless auto_pad is explicit
        kw.update(pads_begin=[3] * c.r, pads_end=[1] * c.r)
    return kw


def _attr_kw(c, op, fmt_name, *, transposed=False):
    kw = dict(strides=list(c.s), dilations=list(c.d), groups=c.G, **_pad_kw(c))
    if not (c.omit_defaults and c.df == "NXC"):
        kw["data_format"] = c.df
    if not (c.omit_defaults and c.wf == DEFAULT_WF[op]):
        kw[fmt_name] = c.wf
    if transposed and (any(c.op) or not c.omit_defaults):
        kw["output_padding"] = list(c.op)
    return kw


# ----------------------------------------------------------------------------
# Runners: (convgrad result, PyTorch result in the spec layout)
# ----------------------------------------------------------------------------


def run_conv_wgrad(c, op):
    w_shape = (c.O, c.C // c.G, *c.K)
    x, dy = _data(c, (c.n, c.C, *c.L), (c.n, c.O, *c.M))
    want = conv_w_to(ref_conv_wgrad(x, dy, w_shape, c.s, c.d, c.pb, c.pe, c.G), c.wf)
    shape = conv_w_to(np.empty(w_shape), c.wf).shape if c.full else c.K
    fmt = "weights_format" if op == "convolution_backward_weights" else "filter_format"
    kw = _attr_kw(c, op, fmt)
    if op == "convolution_backward_weights":
        got = onednn.convolution_backward_weights(_in(x, c), _in(dy, c), shape, **kw)
    else:
        got = onednn.convolution_backprop_filters(_in(x, c), shape, _in(dy, c), **kw)
    return got, want


def run_convt_wgrad(c, op):
    src, dd = _data(c, (c.n, c.I, *c.L), (c.n, c.O, *c.B))
    want = convt_w_to(ref_convt_wgrad(src, dd, c), c.wf)
    shape = convt_w_to(np.empty((c.I, c.O // c.G, *c.K)), c.wf).shape if c.full else c.K
    if op == "conv_transpose_backward_weights":
        kw = _attr_kw(c, op, "weights_format", transposed=True)
        got = onednn.conv_transpose_backward_weights(_in(src, c), _in(dd, c), shape, **kw)
    else:
        kw = _attr_kw(c, op, "filter_format", transposed=True)
        got = onednn.conv_transpose_backprop_filters(_in(src, c), _in(dd, c), shape, **kw)
    return got, want


def run_conv_dgrad(c, op="convolution_backward_data"):
    """ConvolutionBackwardData with dst_shape (full in data_format, or spatial)."""
    x_shape = (c.n, c.C, *c.L)
    w, dy = _data(c, (c.O, c.C // c.G, *c.K), (c.n, c.O, *c.M))
    want = to_df(ref_conv_dgrad(w, dy, x_shape, c.s, c.d, c.pb, c.pe, c.G), c.df)
    dst = to_df(np.empty(x_shape), c.df).shape if c.full else c.L
    kw = _attr_kw(c, op, "weights_format")
    got = onednn.convolution_backward_data(_in(dy, c), conv_w_to(w, c.wf).astype(c.dtype),
                                           dst, **kw)
    return got, want


def run_conv_dgrad_no_dst(c, op="convolution_backward_data"):
    """ConvolutionBackwardData without dst_shape, on a ConvTranspose case: the
    conv's dy is the ConvTranspose src (n, I, *L), its input has O channels and
    size B, its weights (I, O/G, *K) are OIX; conv pads are (pb, pe - op)."""
    w, dy = _data(c, (c.I, c.O // c.G, *c.K), (c.n, c.I, *c.L))
    pe_conv = [e - p for e, p in zip(c.pe, c.op)]
    want = to_df(ref_conv_dgrad(w, dy, (c.n, c.O, *c.B), c.s, c.d, c.pb, pe_conv, c.G), c.df)
    kw = _attr_kw(c, op, "weights_format", transposed=True)
    got = onednn.convolution_backward_data(_in(dy, c), conv_w_to(w, c.wf).astype(c.dtype),
                                           **kw)
    return got, want


def run_convt_dgrad(c, op="conv_transpose_backward_data"):
    w, dd = _data(c, (c.I, c.O // c.G, *c.K), (c.n, c.O, *c.B))
    want = to_df(ref_convt_dgrad(dd, w, c), c.df)
    kw = _attr_kw(c, op, "weights_format", transposed=True)
    got = onednn.conv_transpose_backward_data(_in(dd, c), convt_w_to(w, c.wf).astype(c.dtype),
                                              **kw)
    return got, want


def run_conv_fwd(c, op="convolution"):
    x, w, bias = _data(c, (c.n, c.C, *c.L), (c.O, c.C // c.G, *c.K), (c.O,))
    bias = bias if c.bias else None
    want = to_df(ref_conv_fwd(x, w, c, bias), c.df)
    kw = _attr_kw(c, op, "weights_format")
    got = onednn.convolution(_in(x, c), conv_w_to(w, c.wf).astype(c.dtype),
                             None if bias is None else bias.astype(c.dtype), **kw)
    return got, want


def run_convt_fwd(c, op="conv_transpose"):
    src, w, bias = _data(c, (c.n, c.I, *c.L), (c.I, c.O // c.G, *c.K), (c.O,))
    bias = bias if c.bias else None
    want = to_df(ref_convt_fwd(src, w, c, bias), c.df)
    kw = _attr_kw(c, op, "weights_format", transposed=True)
    got = onednn.conv_transpose(_in(src, c), convt_w_to(w, c.wf).astype(c.dtype),
                                None if bias is None else bias.astype(c.dtype), **kw)
    return got, want


def check(c, got, want):
    assert isinstance(got, np.ndarray)
    assert got.dtype == c.dtype, (got.dtype, c.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0,
                               atol=TOL[c.dtype] * scale, err_msg=c.id)


def _ids(cases):
    return [c.id for c in cases]


# ----------------------------------------------------------------------------
# oneDNN Graph dialect, random configurations
# ----------------------------------------------------------------------------

# CONVGRAD_CONFORMANCE_SCALE=k (`make conformance-long`): k times as many cases per op.
SCALE = CONFORMANCE_SCALE
CBW = [gen_conv("cbw", i) for i in range(12 * SCALE)]
CBPF = [gen_conv("cbpf", i) for i in range(6 * SCALE)]
CTBW = [gen_convt("ctbw", i) for i in range(12 * SCALE)]
CTBPF = [gen_convt("ctbpf", i) for i in range(8 * SCALE)]
CBD = [gen_conv("cbd", i) for i in range(8 * SCALE)]
CBD_NO_DST = [gen_convt("cbd0", i, wfs=CONV_WFS) for i in range(8 * SCALE)]
CTBD = [gen_convt("ctbd", i) for i in range(10 * SCALE)]
CONV = [gen_conv("conv", i) for i in range(6 * SCALE)]
CONVT = [gen_convt("convt", i) for i in range(10 * SCALE)]


@pytest.mark.parametrize("c", CBW, ids=_ids(CBW))
def test_convolution_backward_weights(c):
    check(c, *run_conv_wgrad(c, "convolution_backward_weights"))


@pytest.mark.parametrize("c", CBPF, ids=_ids(CBPF))
def test_convolution_backprop_filters(c):
    check(c, *run_conv_wgrad(c, "convolution_backprop_filters"))


@pytest.mark.parametrize("c", CTBW, ids=_ids(CTBW))
def test_conv_transpose_backward_weights(c):
    check(c, *run_convt_wgrad(c, "conv_transpose_backward_weights"))


@pytest.mark.parametrize("c", CTBPF, ids=_ids(CTBPF))
def test_conv_transpose_backprop_filters(c):
    check(c, *run_convt_wgrad(c, "conv_transpose_backprop_filters"))


@pytest.mark.parametrize("c", CBD, ids=_ids(CBD))
def test_convolution_backward_data(c):
    check(c, *run_conv_dgrad(c))


@pytest.mark.parametrize("c", CBD_NO_DST, ids=_ids(CBD_NO_DST))
def test_convolution_backward_data_without_dst_shape(c):
    check(c, *run_conv_dgrad_no_dst(c))


@pytest.mark.parametrize("c", CTBD, ids=_ids(CTBD))
def test_conv_transpose_backward_data(c):
    check(c, *run_convt_dgrad(c))


@pytest.mark.parametrize("c", CONV, ids=[i + ("-bias" if c.bias else "")
                                         for c, i in zip(CONV, _ids(CONV))])
def test_convolution(c):
    check(c, *run_conv_fwd(c))


@pytest.mark.parametrize("c", CONVT, ids=[i + ("-bias" if c.bias else "")
                                          for c, i in zip(CONVT, _ids(CONVT))])
def test_conv_transpose(c):
    check(c, *run_convt_fwd(c))


# ----------------------------------------------------------------------------
# auto_pad with an odd total (where same_upper and same_lower differ)
# ----------------------------------------------------------------------------

# Convolution family: L=5, K=4, s=1 -> total 3; L=7, K=2, d=3, s=2 -> Ke=4,
# ceil(7/2)=4, total (4-1)*2 + 4 - 7 = 3.  ConvTranspose family: Ke=4, s=1 ->
# total 3; Ke=7 (K=3, d=3), s=2 -> total 5.
_ODD_CONV = dict(r=2, K=(4, 2), s=(1, 2), d=(1, 3), L=(5, 7), groups="2")
_ODD_CONVT = dict(r=2, K=(4, 3), s=(1, 2), d=(1, 3), L=(3, 2), op=(0, 1), groups="2")
ODD = []
for _mode, (_name, _run, _gen, _over) in itertools.product(
        ("same_upper", "same_lower"),
        (("convolution_backward_weights",
          lambda c: run_conv_wgrad(c, "convolution_backward_weights"), gen_conv, _ODD_CONV),
         ("convolution_backward_data", run_conv_dgrad, gen_conv, _ODD_CONV),
         ("convolution", run_conv_fwd, gen_conv, _ODD_CONV),
         ("conv_transpose_backward_weights",
          lambda c: run_convt_wgrad(c, "conv_transpose_backward_weights"), gen_convt,
          _ODD_CONVT),
         ("convolution_backward_data-no_dst_shape",
          run_conv_dgrad_no_dst, lambda *a, **k: gen_convt(*a, wfs=CONV_WFS, **k),
          _ODD_CONVT),
         ("conv_transpose_backward_data", run_convt_dgrad, gen_convt, _ODD_CONVT),
         ("conv_transpose", run_convt_fwd, gen_convt, _ODD_CONVT))):
    _c = _gen(f"odd-{_name}", 0, mode=_mode, dtype=F64, **_over)
    ODD.append(pytest.param(_c, _run, id=f"{_name}-{_mode}-{_c.df}-{_c.wf}"))


def test_odd_total_pads_are_split_as_documented():
    """The cases below really have an odd total, split as the rules say."""
    for p in ODD:
        c = p.values[0]
        assert all((b + e) % 2 == 1 for b, e in zip(c.pb, c.pe)), c.id
        big = [max(b, e) for b, e in zip(c.pb, c.pe)]
        if c.mode == "same_upper":
            assert list(c.pe) == big, c.id
        else:
            assert list(c.pb) == big, c.id


@pytest.mark.parametrize("c, run", ODD)
def test_auto_pad_odd_total(c, run):
    check(c, *run(c))


# ----------------------------------------------------------------------------
# float16 / bfloat16 (computed in float32, rounded once; vs PyTorch float64)
# ----------------------------------------------------------------------------

# the four gradient ops: (case generator, run)
GRAD_OPS = {
    "convolution_backward_weights":
        (gen_conv, lambda c: run_conv_wgrad(c, "convolution_backward_weights")),
    "conv_transpose_backward_weights":
        (gen_convt, lambda c: run_convt_wgrad(c, "conv_transpose_backward_weights")),
    "convolution_backward_data": (gen_conv, run_conv_dgrad),
    "conv_transpose_backward_data": (gen_convt, run_convt_dgrad),
}
_LOWP_OPS = {**GRAD_OPS, "convolution": (gen_conv, run_conv_fwd),
             "conv_transpose": (gen_convt, run_convt_fwd)}
LOWP = []
for _j, (_name, (_gen, _run)) in enumerate(_LOWP_OPS.items()):
    for _dt in (F16, BF16):
        _c = _gen(f"lowp-{_name}", _j + (3 if _dt == BF16 else 0), dtype=_dt)
        LOWP.append(pytest.param(_c, _run, id=f"{_name}-{_c.id}"))


@pytest.mark.parametrize("c, run", LOWP)
def test_low_precision(c, run):
    check(c, *run(c))


# ----------------------------------------------------------------------------
# Engine-sized channels: the same ops where the native engine's register tiles run
# ----------------------------------------------------------------------------

# The random cases above have 1-2 channels a group, which the grouped kernel takes;
# these have 16-71 (channel tails of every size against the tiles' 16-lane blocks), 1 or
# 2 groups, float32 / float16 / bfloat16 / float64 in turn, with the default chooser
# (D21): the native engine, Winograd where it takes the problem, and for float64 the
# fallback kernels at the same sizes.
ENG_DT = (F32, F16, BF16, F32, F64)
ENGINE = []
for _name, (_gen, _run) in GRAD_OPS.items():
    for _i in range(5 * SCALE):
        _c = _gen(f"eng-{_name}", _i, ch=(16, 72), groups=str(1 + _i % 2),
                  dtype=ENG_DT[_i % len(ENG_DT)])
        ENGINE.append(pytest.param(_c, _run, id=f"{_name}-{_c.id}"))


@pytest.mark.parametrize("c, run", ENGINE)
def test_engine_sized(c, run):
    check(c, *run(c))


# ----------------------------------------------------------------------------
# Canonical API (NCX data, OIX weights, explicit pads)
# ----------------------------------------------------------------------------

_CAN = dict(modes=("explicit",), wfs=("OIX",), df="NCX")
CAN_W = [gen_conv("can-w", i, **_CAN) for i in range(6)]
CAN_D = [gen_conv("can-d", i, **_CAN) for i in range(6)]
CAN_D0 = [gen_convt("can-d0", i, **_CAN) for i in range(5)]
CAN_F = [gen_conv("can-f", i, **_CAN) for i in range(5)]


def _can_kw(c):
    kw = dict(pads_begin=list(c.pb), pads_end=list(c.pe), dilations=list(c.d), groups=c.G)
    if any(v != 1 for v in c.s) or c.i % 2:
        kw["strides"] = list(c.s)
    return kw


@pytest.mark.parametrize("c", CAN_W, ids=_ids(CAN_W))
def test_canonical_conv_weight_grad(c):
    w_shape = (c.O, c.C // c.G, *c.K)
    x, dy = _data(c, (c.n, c.C, *c.L), (c.n, c.O, *c.M))
    want = ref_conv_wgrad(x, dy, w_shape, c.s, c.d, c.pb, c.pe, c.G)
    got = convgrad.conv_weight_grad(x.astype(c.dtype), dy.astype(c.dtype),
                                    w_shape if c.full else c.K, **_can_kw(c))
    check(c, got, want)


@pytest.mark.parametrize("c", CAN_D, ids=_ids(CAN_D))
def test_canonical_conv_data_grad(c):
    x_shape = (c.n, c.C, *c.L)
    w, dy = _data(c, (c.O, c.C // c.G, *c.K), (c.n, c.O, *c.M))
    want = ref_conv_dgrad(w, dy, x_shape, c.s, c.d, c.pb, c.pe, c.G)
    got = convgrad.conv_data_grad(w.astype(c.dtype), dy.astype(c.dtype),
                                  x_shape if c.full else c.L, **_can_kw(c))
    check(c, got, want)


@pytest.mark.parametrize("c", CAN_D0, ids=_ids(CAN_D0))
def test_canonical_conv_data_grad_without_input_shape(c):
    """S = s*(M-1) + Ke - pb - pe + output_padding: the conv's pads are (pb, pe - op)."""
    w, dy = _data(c, (c.I, c.O // c.G, *c.K), (c.n, c.I, *c.L))
    pe_conv = [e - p for e, p in zip(c.pe, c.op)]
    want = ref_conv_dgrad(w, dy, (c.n, c.O, *c.B), c.s, c.d, c.pb, pe_conv, c.G)
    kw = _can_kw(c)
    if any(c.op) or c.i % 2:
        kw["output_padding"] = list(c.op)
    got = convgrad.conv_data_grad(w.astype(c.dtype), dy.astype(c.dtype), **kw)
    check(c, got, want)


@pytest.mark.parametrize("c", CAN_F, ids=_ids(CAN_F))
def test_canonical_conv_forward(c):
    x, w = _data(c, (c.n, c.C, *c.L), (c.O, c.C // c.G, *c.K))
    want = ref_conv_fwd(x, w, c)
    got = convgrad.conv_forward(x.astype(c.dtype), w.astype(c.dtype), **_can_kw(c))
    check(c, got, want)
