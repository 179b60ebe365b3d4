"""Property-based tests over the whole public API on valid random geometries.

One random canonical problem (hypothesis draws rank, groups, channels, kernel,
strides, dilations, asymmetric pads and sizes) is mapped onto every public op
of every dialect -- the canonical API, oneDNN Graph, OpenVINO, TensorFlow and
``convgrad.op`` -- with layouts converted here, by hand, independently of
``convgrad.layouts``.  For every registered kernel that supports the problem
(``kernels.candidates``, forced with ``config(algo=...)``, so kernels added
later are covered without editing this file):

- the result equals the independent float64 reference (tests/naive.py);
- ``convgrad.op(...).infer_shape`` equals the shape computed;
- the inputs are not modified;
- a NaN (or an Inf) placed in one input reaches exactly the outputs that
  depend on it, as IEEE arithmetic says, and no others.

The adjoint identities are checked through each dialect's own forward and
backward ops.  ``CONVGRAD_PROPERTY_EXAMPLES`` (default 150) bounds the examples
per test in ``make test``; ``make fuzz`` raises it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import convgrad
from convgrad import kernels, onednn, openvino, tf
from convgrad.geometry import make_geometry

import naive
from conftest import assert_close

EXAMPLES = int(os.environ.get("CONVGRAD_PROPERTY_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), database=None)


@st.composite
def problems(draw, ranks=(1, 2, 3)):
    """A valid canonical problem: sizes, attributes, and consistent out_sizes."""
    r = draw(st.sampled_from(ranks))
    if draw(st.integers(0, 4)) == 0:                     # depthwise, maybe a multiplier
        groups, cg, og = draw(st.integers(2, 4)), 1, draw(st.integers(1, 2))
    else:
        groups = draw(st.sampled_from([1, 1, 2, 3]))
        cg, og = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    axes = st.integers(1, 3 if r < 3 else 2)
    kernel = tuple(draw(st.lists(axes, min_size=r, max_size=r)))
    strides = tuple(draw(st.lists(st.integers(1, 3), min_size=r, max_size=r)))
    dilations = tuple(draw(st.lists(axes, min_size=r, max_size=r)))
    pb = tuple(draw(st.lists(st.integers(0, 2), min_size=r, max_size=r)))
    pe = tuple(draw(st.lists(st.integers(0, 2), min_size=r, max_size=r)))
    top = {1: 10, 2: 7, 3: 5}[r]
    in_sizes = []
    for k, d, b, e in zip(kernel, dilations, pb, pe):
        lo = max(1, (k - 1) * d + 1 - b - e)
        in_sizes.append(draw(st.integers(lo, max(lo, top))))
    out_sizes = tuple((L + b + e - ((k - 1) * d + 1)) // s + 1 for L, k, s, d, b, e in
                      zip(in_sizes, kernel, strides, dilations, pb, pe))
    return Problem(n=draw(st.integers(1, 2)), c=cg * groups, o=og * groups, groups=groups,
                   in_sizes=tuple(in_sizes), kernel=kernel, out_sizes=out_sizes,
                   strides=strides, dilations=dilations, pads_begin=pb, pads_end=pe)


@dataclass(frozen=True)
class Problem:
    n: int
    c: int
    o: int
    groups: int
    in_sizes: tuple
    kernel: tuple
    out_sizes: tuple
    strides: tuple
    dilations: tuple
    pads_begin: tuple
    pads_end: tuple

    @property
    def rank(self):
        return len(self.kernel)

    def geometry(self):
        return make_geometry("test", **self.__dict__)

    def arrays(self, seed, dtype=np.float64):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((self.n, self.c, *self.in_sizes))
        w = rng.standard_normal((self.o, self.c // self.groups, *self.kernel))
        dy = rng.standard_normal((self.n, self.o, *self.out_sizes))
        return x.astype(dtype), w.astype(dtype), dy.astype(dtype)

    def reference(self, kind, a, b):
        kw = dict(strides=self.strides, dilations=self.dilations,
                  pads_begin=self.pads_begin, groups=self.groups)
        if kind == "fwd":
            return naive.forward(a, b, self.out_sizes, **kw)
        if kind == "wgrad":
            return naive.wgrad(a, b, self.kernel, **kw)
        return naive.dgrad(a, b, self.in_sizes, **kw)

    def transpose_pads(self):
        """ConvTranspose (pads_end, output_padding) whose output has in_sizes and whose
        equivalent conv has this problem's pads_begin (and values)."""
        pe, op = [], []
        for L, M, k, s, d, b in zip(self.in_sizes, self.out_sizes, self.kernel, self.strides,
                                    self.dilations, self.pads_begin):
            e = s * (M - 1) + (k - 1) * d + 1 - b - L
            p = max(0, -e)
            pe.append(e + p)
            op.append(p)
        return pe, op


# ---- layouts, written here independently of convgrad.layouts ------------------------

def nxc(a):                     # (N, C, *S) -> (N, *S, C)
    return np.moveaxis(a, 1, -1)


def from_nxc(a):
    return np.moveaxis(a, -1, 1)


def xco(w):                     # (O, C/G, *K) -> (*K, C/G, O)   XIO, HWIO, XOI of ConvTranspose
    return np.moveaxis(w, (0, 1), (-1, -2))


def xoc(w):                     # (O, C/G, *K) -> (*K, O, C/G)   ConvTranspose XIO
    return np.moveaxis(w, (0, 1), (-2, -1))


def cox(w):                     # (O, C/G, *K) -> (C/G, O, *K)   ConvTranspose OIX
    return np.swapaxes(w, 0, 1)


def gocx(w, groups):            # (O, C/G, *K) -> (G, O/G, C/G, *K)  OpenVINO grouped
    return w.reshape(groups, w.shape[0] // groups, *w.shape[1:])


def depthwise(w, groups):       # (C*M, 1, *K) -> (*K, C, M)   TF depthwise
    m = w.shape[0] // groups
    return np.moveaxis(w.reshape(groups, m, *w.shape[2:]), (0, 1), (-2, -1))


# ---- every public op, fed from one canonical problem ---------------------------------

@dataclass(frozen=True)
class Call:
    """One public op on a problem: ``kind`` says which canonical op it computes;
    ``args(x, w, dy)`` gives its positional inputs; ``back(result)`` maps the
    canonical result to the op's layout."""

    name: str            # convgrad.op name
    fn: object
    kind: str
    args: object
    attrs: dict
    back: object
    tensors: tuple       # positions of tensor inputs (the others are shapes)


def calls(p: Problem, variant: int) -> list[Call]:
    """Every public op this problem can be expressed in."""
    r, G = p.rank, p.groups
    s, d, pb, pe = list(p.strides), list(p.dilations), list(p.pads_begin), list(p.pads_end)
    exp = dict(strides=s, pads_begin=pb, pads_end=pe, dilations=d)
    ncx = variant % 2 == 1
    df = dict(data_format="NCX") if ncx else {}
    dl, dlb = (lambda a: a, lambda a: a) if ncx else (nxc, nxc)
    tpe, top = p.transpose_pads()
    texp = dict(strides=s, pads_begin=pb, pads_end=tpe, dilations=d, output_padding=top)
    w_spatial = list(p.kernel)
    out = [
        Call("conv_forward", convgrad.conv_forward, "fwd", lambda x, w, dy: (x, w),
             dict(exp, groups=G), lambda a: a, (0, 1)),
        Call("conv_weight_grad", convgrad.conv_weight_grad, "wgrad",
             lambda x, w, dy: (x, dy, w.shape), dict(exp, groups=G), lambda a: a, (0, 1)),
        Call("conv_data_grad", convgrad.conv_data_grad, "dgrad",
             lambda x, w, dy: (w, dy, x.shape), dict(exp, groups=G), lambda a: a, (0, 1)),
        # oneDNN Graph, forward family (XIO default; OIX with NCX)
        Call("ConvolutionBackwardWeights", onednn.convolution_backward_weights, "wgrad",
             lambda x, w, dy: (dl(x), dl(dy), w_spatial),
             dict(exp, groups=G, **df, **({"weights_format": "OIX"} if ncx else {})),
             (lambda a: a) if ncx else xco, (0, 1)),
        Call("ConvolutionBackpropFilters", onednn.convolution_backprop_filters, "wgrad",
             lambda x, w, dy: (dl(x), xco(w).shape, dl(dy)), dict(exp, groups=G, **df),
             xco, (0, 2)),
        Call("ConvolutionBackwardData", onednn.convolution_backward_data, "dgrad",
             lambda x, w, dy: (dl(dy), xco(w), list(p.in_sizes)), dict(exp, groups=G, **df),
             dlb, (0, 1)),
        Call("onednn:Convolution", onednn.convolution, "fwd",
             lambda x, w, dy: (dl(x), xco(w)), dict(exp, groups=G, **df), dlb, (0, 1)),
        # oneDNN Graph, ConvTranspose family: its input is dy, its output x
        Call("ConvTranspose", onednn.conv_transpose, "dgrad",
             lambda x, w, dy: (dl(dy), xco(w)), dict(texp, groups=G, **df), dlb, (0, 1)),
        Call("ConvTransposeBackwardData", onednn.conv_transpose_backward_data, "fwd",
             lambda x, w, dy: (dl(x), w), dict(texp, groups=G, weights_format="IOX", **df),
             dlb, (0, 1)),
        Call("ConvTransposeBackwardWeights", onednn.conv_transpose_backward_weights, "wgrad",
             lambda x, w, dy: (dl(dy), dl(x), w_spatial), dict(texp, groups=G, **df),
             xco, (0, 1)),
        Call("ConvTransposeBackpropFilters", onednn.conv_transpose_backprop_filters, "wgrad",
             lambda x, w, dy: (dl(dy), dl(x), list(xoc(w).shape)),
             dict(texp, groups=G, **df), xoc, (0, 1)),
        Call("ConvTransposeBackpropFilters", onednn.conv_transpose_backprop_filters, "wgrad",
             lambda x, w, dy: (dl(dy), dl(x), w_spatial),
             dict(texp, groups=G, filter_format="OIX", **df), cox, (0, 1)),
        # OpenVINO (NCX; backprop with output_shape uses pads_begin)
        Call("GroupConvolution", openvino.group_convolution, "fwd",
             lambda x, w, dy: (x, gocx(w, G)), exp, lambda a: a, (0, 1)),
        Call("GroupConvolutionBackpropData", openvino.group_convolution_backprop_data,
             "dgrad", lambda x, w, dy: (dy, gocx(w, G), list(p.in_sizes)), exp,
             lambda a: a, (0, 1)),
    ]
    if G == 1:
        out += [
            Call("openvino:Convolution", openvino.convolution, "fwd",
                 lambda x, w, dy: (x, w), exp, lambda a: a, (0, 1)),
            Call("ConvolutionBackpropData", openvino.convolution_backprop_data, "dgrad",
                 lambda x, w, dy: (dy, w, list(p.in_sizes)), exp, lambda a: a, (0, 1)),
        ]
    # TensorFlow: NHWC, padding as [before, after] pairs per spatial axis
    pairs = [[b, e] for b, e in zip(pb, pe)]
    tfa = dict(strides=s, padding=pairs, dilations=d)
    tfn = {1: ("NWC", 3), 2: ("NHWC", 4), 3: ("NDHWC", 5)}[r]
    if r in (2, 3):
        wg, dg = {2: (tf.conv2d_backprop_filter, tf.conv2d_backprop_input),
                  3: (tf.conv3d_backprop_filter_v2, tf.conv3d_backprop_input_v2)}[r]
        names = {2: ("Conv2DBackpropFilter", "Conv2DBackpropInput"),
                 3: ("Conv3DBackpropFilterV2", "Conv3DBackpropInputV2")}[r]
        out += [
            Call(names[0], wg, "wgrad", lambda x, w, dy: (nxc(x), xco(w).shape, nxc(dy)),
                 tfa, xco, (0, 2)),
            Call(names[1], dg, "dgrad", lambda x, w, dy: (nxc(x).shape, xco(w), nxc(dy)),
                 tfa, nxc, (1, 2)),
        ]
    if r == 2 and p.c == G:
        out += [
            Call("DepthwiseConv2dNativeBackpropFilter", tf.depthwise_conv2d_native_backprop_filter,
                 "wgrad", lambda x, w, dy: (nxc(x), depthwise(w, G).shape, nxc(dy)), tfa,
                 lambda a: depthwise(a, G), (0, 2)),
            Call("DepthwiseConv2dNativeBackpropInput", tf.depthwise_conv2d_native_backprop_input,
                 "dgrad", lambda x, w, dy: (nxc(x).shape, depthwise(w, G), nxc(dy)), tfa,
                 nxc, (1, 2)),
        ]
    if r in (1, 2) and G == 1:
        fn, name = {1: (tf.conv1d_transpose, "conv1d_transpose"),
                    2: (tf.conv2d_transpose, "conv2d_transpose")}[r]
        out.append(Call(name, fn, "dgrad", lambda x, w, dy: (nxc(dy), xco(w), nxc(x).shape),
                        dict(tfa, data_format=tfn[0]), nxc, (0, 1)))
    return out


CANONICAL = ("conv_forward", "conv_weight_grad", "conv_data_grad")


def kernel_names(p: Problem, kind: str, dtype=np.float64) -> list[str]:
    """Every registered kernel of ``kind`` that supports the problem."""
    found = [k.name for k, why in kernels.candidates(kind, p.geometry(), dtype) if why is None]
    assert found, f"no kernel supports {kind} on {p}"
    return found


def canonical_inputs(kind, x, w, dy):
    return {"fwd": (x, w), "wgrad": (x, dy), "dgrad": (w, dy)}[kind]


def _shapes(call, args):
    return [np.shape(a) if i in call.tensors else a for i, a in enumerate(args)]


# ---- the properties -------------------------------------------------------------------

@SETTINGS
@given(p=problems(), variant=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_every_op_and_kernel_equals_the_reference(p, variant, seed):
    check_problem(p, variant, seed)


def check_problem(p: Problem, variant: int, seed: int) -> None:
    """Every op on ``p`` with every kernel: the reference's values, the inferred shape,
    inputs unmodified (also the fuzz target)."""
    x, w, dy = p.arrays(seed)
    for call in calls(p, variant):
        want = call.back(p.reference(call.kind, *canonical_inputs(call.kind, x, w, dy)))
        args = call.args(x, w, dy)
        before = [np.array(a, copy=True) for a in args]
        if call.name in CANONICAL:              # not in convgrad.op's table
            shape = want.shape
        else:
            op = convgrad.op(call.name, **call.attrs)
            shape = op.infer_shape(*_shapes(call, args))
            np.testing.assert_array_equal(op(*args), call.fn(*args, **call.attrs))
        for algo in kernel_names(p, call.kind):
            with convgrad.config(algo=algo):
                got = call.fn(*args, **call.attrs)
            assert got.shape == shape == want.shape, (call.name, algo)
            assert got.flags.c_contiguous and got.dtype == np.float64
            assert_close(got, want, np.float64)
        for a, b in zip(args, before):
            np.testing.assert_array_equal(a, b)      # inputs never modified


@SETTINGS
@given(p=problems(), dtype=st.sampled_from([np.float32, np.float16, "bfloat16"]),
       seed=st.integers(0, 2**16))
def test_every_kernel_in_every_dtype(p, dtype, seed):
    from convgrad.dtypes import bfloat16
    dtype = bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x, w, dy = (a.astype(dtype) for a in p.arrays(seed))
    for call in calls(p, seed % 4)[:3]:                   # the canonical API
        a, b = canonical_inputs(call.kind, x, w, dy)
        want = p.reference(call.kind, a.astype(np.float64), b.astype(np.float64))
        for algo in kernel_names(p, call.kind, dtype):
            with convgrad.config(algo=algo):
                got = call.fn(*call.args(x, w, dy), **call.attrs)
            assert got.dtype == dtype
            assert_close(got, want, dtype)


@SETTINGS
@given(p=problems(), seed=st.integers(0, 2**16))
def test_adjoint_identities_in_every_dialect(p, seed):
    # <fwd(x, w), dy> = <x, dgrad(w, dy)> = <w, wgrad(x, dy)>, each op in its own layout
    x, w, dy = p.arrays(seed)
    by_kind = {}
    for call in calls(p, seed % 4):
        got = call.fn(*call.args(x, w, dy), **call.attrs)
        # undo the op's layout with the reference's shape as the witness
        canon = {"fwd": (p.n, p.o, *p.out_sizes), "wgrad": w.shape, "dgrad": x.shape}
        flat = _unlayout(call, got, canon[call.kind])
        by_kind.setdefault(call.kind, []).append((call.name, flat))
    lhs = [np.vdot(y, dy) for _, y in by_kind["fwd"]]
    scale = float(np.abs(p.reference("fwd", x, w)).sum() * np.abs(dy).max() + 1)
    for value in lhs:
        assert abs(value - lhs[0]) <= 1e-12 * scale
    for name, dx in by_kind["dgrad"]:
        assert abs(np.vdot(x, dx) - lhs[0]) <= 1e-12 * scale, name
    for name, dw in by_kind["wgrad"]:
        assert abs(np.vdot(w, dw) - lhs[0]) <= 1e-12 * scale, name


def _unlayout(call, got, canonical_shape):
    """Bring an op's result back to the canonical layout: the one permutation of its
    axes (and reshape) under which ``call.back`` maps it onto itself."""
    probe = np.arange(np.prod(canonical_shape)).reshape(canonical_shape)
    laid = call.back(probe)
    assert laid.shape == got.shape, (call.name, laid.shape, got.shape)
    out = np.empty(probe.size, got.dtype)
    out[laid.ravel()] = got.ravel()
    return out.reshape(canonical_shape)


def _reach(p: Problem, kind: str, which: int, index, x, w, dy):
    """Which outputs depend on input ``which`` (0 or 1 of the canonical pair) at
    ``index``: the reference on an indicator of that element and all-ones for the
    other input (a sum of non-negative products: non-zero exactly where connected)."""
    a, b = (np.ones_like(t) for t in canonical_inputs(kind, x, w, dy))
    ind = np.zeros_like(a if which == 0 else b)
    ind[index] = 1.0
    a, b = (ind, b) if which == 0 else (a, ind)
    return p.reference(kind, a, b) != 0


@SETTINGS
@given(p=problems(), which=st.integers(0, 1), value=st.sampled_from([np.nan, np.inf, -np.inf]),
       dtype=st.sampled_from([np.float64, np.float32]), seed=st.integers(0, 2**16),
       data=st.data())
def test_nan_and_inf_reach_exactly_the_outputs_they_should(p, which, value, dtype, seed,
                                                          data):
    x, w, dy = p.arrays(seed, dtype)
    for call in calls(p, seed % 4):
        pair = list(canonical_inputs(call.kind, x, w, dy))
        if pair[which].size == 0:
            continue
        index = tuple(data.draw(st.integers(0, n - 1)) for n in pair[which].shape)
        reach = call.back(_reach(p, call.kind, which, index, x, w, dy))
        pair[which] = pair[which].copy()
        pair[which][index] = value
        xs = {"fwd": (pair[0], pair[1], dy), "wgrad": (pair[0], w, pair[1]),
              "dgrad": (x, pair[0], pair[1])}[call.kind]
        args = call.args(*xs)
        for algo in kernel_names(p, call.kind, dtype):
            with convgrad.config(algo=algo):
                got = call.fn(*args, **call.attrs)
            bad = np.isnan(got) if np.isnan(value) else ~np.isfinite(got)
            if algo in PADDING_AS_OPERAND:
                # known deviation (see PADDING_AS_OPERAND): at least the outputs it must reach
                assert (bad | ~reach).all(), (call.name, algo)
                continue
            np.testing.assert_array_equal(bad, reach, err_msg=f"{call.name} {algo}")
            if not np.isnan(value):
                # one Inf times non-zero finite values: +-Inf, never NaN, where it reaches
                assert not np.isnan(got).any(), (call.name, algo)


# Kernels that multiply by the zeros of the padding (NaN * 0 = NaN), so a NaN or
# Inf in the weights, or in dy for a weight gradient, also reaches outputs whose
# tap reads only padding.  convgrad's definition (docs/decisions.md D17) sums over
# the taps that read the input; the kernels in this set are being rewritten.
# test_padding_is_not_an_operand pins the deviation (strict xfail): when a kernel
# is fixed, that test XPASSes and its name must leave this set.
PADDING_AS_OPERAND = {"im2col", "shifted"}


@pytest.mark.parametrize("algo", sorted(PADDING_AS_OPERAND & set(kernels.names())))
@pytest.mark.xfail(strict=True, reason="kernel multiplies NaN weights by padding zeros (D17)")
def test_padding_is_not_an_operand(algo):
    x = np.ones((1, 1, 3))
    w = np.array([[[np.nan, 1.0, 1.0]]])
    with convgrad.config(algo=algo):
        y = convgrad.conv_forward(x, w, pads_begin=[1], pads_end=[1])
    # the NaN tap reads x[p - 1]: padding for p = 0, input for p = 1, 2
    np.testing.assert_array_equal(np.isnan(y[0, 0]), [False, True, True])


def test_reference_kernel_does_not_multiply_padding():
    x = np.ones((1, 1, 3))
    w = np.array([[[np.nan, 1.0, 1.0]]])
    with convgrad.config(algo="reference"):
        y = convgrad.conv_forward(x, w, pads_begin=[1], pads_end=[1])
    np.testing.assert_array_equal(y[0, 0], [2.0, np.nan, np.nan])


@pytest.mark.parametrize("ranks", [(1,), (2,), (3,)], ids=["1d", "2d", "3d"])
def test_strategy_reaches_every_rank_and_depthwise(ranks):
    # the generator really produces what the properties claim to cover
    seen = set()

    @settings(max_examples=40, derandomize=True, database=None, deadline=None)
    @given(p=problems(ranks))
    def collect(p):
        seen.add((p.rank, p.groups > 1, p.c == p.groups and p.groups > 1,
                  max(p.strides) > 1, max(p.dilations) > 1))

    collect()
    assert {s[0] for s in seen} == set(ranks)
    assert all(any(s[i] for s in seen) for i in (1, 2, 3, 4))   # groups, depthwise, s, d
