"""The grouped kernel (kernels/grouped.py, native/grouped.cpp): depthwise layers (one
input channel per group, any channel multiplier) and groups with few channels
(GroupConvolutionBackpropData's 5 -> 2, ResNeXt's 4 -> 4 at 32 groups, 8 groups of
32), all three ops, 1-D/2-D/3-D, strides, dilations, asymmetric pads, float16 and
bfloat16, channels-first and channels-last callers, on every instruction-set build
this CPU can run, against the naive float64 reference (tests/naive.py); exact
padding (D17) and a deterministic weight gradient."""

import ml_dtypes
import numpy as np
import pytest

import convgrad
from convgrad import kernels
from convgrad.dtypes import bfloat16
from convgrad.geometry import ConvGeometry
from convgrad.kernels import grouped, native

import naive
from cases import caller_arrays
from conftest import assert_close, engine_dbg, recycled_results_and_decisions

if native.available() is not None:
    pytest.skip(f"native engine unavailable: {native.available()}", allow_module_level=True)

ISAS = native.info()["loaded"]
OPS = ("fwd", "wgrad", "dgrad")


def case(r, *, groups, cg, og, size, k, s=1, d=1, pb=1, pe=1, n=2):
    sizes = (size,) * r if isinstance(size, int) else tuple(size)
    k, s, d = ((v,) * r if isinstance(v, int) else tuple(v) for v in (k, s, d))
    pb, pe = ((v,) * r if isinstance(v, int) else tuple(v) for v in (pb, pe))
    out = tuple((L + b + e - (kk - 1) * dd - 1) // ss + 1
                for L, kk, ss, dd, b, e in zip(sizes, k, s, d, pb, pe))
    return dict(n=n, c=cg * groups, o=og * groups, groups=groups, in_sizes=sizes, kernel=k,
                out_sizes=out, strides=s, dilations=d, pads_begin=pb, pads_end=pe)


CASES = {
    # depthwise, multiplier 1
    "dw-2d-k3": case(2, groups=24, cg=1, og=1, size=19, k=3),
    "dw-2d-k3-s2": case(2, groups=32, cg=1, og=1, size=21, k=3, s=2),
    "dw-2d-k5-s2-asym": case(2, groups=13, cg=1, og=1, size=(17, 22), k=5, s=2, pb=(2, 1),
                             pe=(1, 3)),
    "dw-1d-dilated": case(1, groups=40, cg=1, og=1, size=70, k=3, d=3, pb=4, pe=0),
    "dw-3d-k3-s2": case(3, groups=16, cg=1, og=1, size=9, k=3, s=2, pb=1, pe=0),
    "dw-2d-dilated-strided": case(2, groups=9, cg=1, og=1, size=25, k=3, s=3, d=2, pb=2, pe=0),
    # depthwise, multiplier > 1
    "dw-mult2-2d": case(2, groups=12, cg=1, og=2, size=15, k=3, s=2),
    "dw-mult3-1d": case(1, groups=7, cg=1, og=3, size=40, k=4, s=1, pb=2, pe=1),
    "dw-mult4-3d": case(3, groups=5, cg=1, og=4, size=6, k=2, pb=0, pe=1),
    # small groups
    "spec-5to2-2d": case(2, groups=4, cg=5, og=2, size=12, k=3, s=2, pb=1, pe=1, n=1),
    "spec-5to2-3d": case(3, groups=4, cg=5, og=2, size=7, k=3, s=2, pb=1, pe=1, n=1),
    "resnext-4to4x32": case(2, groups=32, cg=4, og=4, size=10, k=3, s=1),
    "resnext-4to4x32-s2": case(2, groups=32, cg=4, og=4, size=11, k=3, s=2),
    "g8-32to32": case(2, groups=8, cg=32, og=32, size=7, k=3, n=1),
    "g3-2to5-1d": case(1, groups=3, cg=2, og=5, size=33, k=5, s=2, d=2, pb=3, pe=2),
    "g6-3to1-dilated": case(2, groups=6, cg=3, og=1, size=14, k=2, d=3, pb=(0, 2), pe=(3, 1)),
    # expanded source rows four vectors wide, the last one partial (28 channels)
    "g7-4to3": case(2, groups=7, cg=4, og=3, size=9, k=3, s=2),
    "dw-1d-k10-wide": case(1, groups=13, cg=1, og=1, size=50, k=10, pb=3, pe=2),
    # every tap in the padding for some outputs
    "all-padding-taps": case(1, groups=8, cg=1, og=1, size=4, k=5, d=3, pb=6, pe=6),
}


def make_arrays(c, rng, dtype, channels_last):
    return caller_arrays(c, rng, dtype, channels_last)


def kwargs(c):
    return {k: c[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}


def run(c, x, w, dy, **config):
    kw = kwargs(c)
    with convgrad.config(algo="grouped", **config):
        return (convgrad.conv_forward(x, w, **kw),
                convgrad.conv_weight_grad(x, dy, w.shape, **kw),
                convgrad.conv_data_grad(w, dy, x.shape, **kw))


def check(c, rng, *, dtype=np.float32, channels_last=False, isa="auto", threads=None):
    x, w, dy = make_arrays(c, rng, dtype, channels_last)
    copies = [a.copy() for a in (x, w, dy)]
    args = dict(strides=c["strides"], dilations=c["dilations"], pads_begin=c["pads_begin"],
                groups=c["groups"])
    x64, w64, dy64 = (np.asarray(a, np.float64) for a in (x, w, dy))
    want = (naive.forward(x64, w64, c["out_sizes"], **args),
            naive.wgrad(x64, dy64, c["kernel"], **args),
            naive.dgrad(w64, dy64, c["in_sizes"], **args))
    got = run(c, x, w, dy, isa=isa, threads=threads)
    for g, e in zip(got, want):
        assert g.dtype == np.dtype(dtype)
        assert_close(g, e, dtype)
    for a, b in zip((x, w, dy), copies):      # the caller's arrays are not touched
        np.testing.assert_array_equal(a, b)
    return got


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("layout", ["ncx", "nxc"])
def test_every_case_matches_the_reference(isa, name, layout, rng):
    check(CASES[name], rng, isa=isa, channels_last=layout == "nxc")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("name", ["dw-2d-k3-s2", "dw-mult2-2d", "spec-5to2-2d",
                                  "resnext-4to4x32", "g3-2to5-1d"])
@pytest.mark.parametrize("layout", ["ncx", "nxc"])
def test_half_inputs(isa, dtype, name, layout, rng):
    """16-bit sources: channels-first lines converted into scratch, channels-last ones
    read in place (widened in the loads of the depthwise kernels and of the expanded
    rows of few-channel groups)."""
    check(CASES[name], rng, dtype=dtype, isa=isa, channels_last=layout == "nxc")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ["dw-2d-k3", "spec-5to2-2d", "resnext-4to4x32-s2"])
def test_small_scratch_cuts_lines(isa, name, rng, monkeypatch):
    """A tiny scratch budget cuts every line into pieces with their own windows."""
    grouped.plan.cache_clear()
    monkeypatch.setattr(grouped, "SCRATCH_BYTES", 1)
    monkeypatch.setattr(grouped, "SERIAL_BYTES", 0)
    try:
        check(CASES[name], rng, isa=isa, channels_last=True, threads=2)
    finally:
        grouped.plan.cache_clear()


@pytest.mark.parametrize("name", ["dw-2d-k3-s2", "spec-5to2-3d", "resnext-4to4x32"])
def test_weight_gradient_is_deterministic(name, rng, monkeypatch):
    """Bitwise the same over repeated calls and thread counts: partials over a fixed
    cut of the positions, summed in order."""
    monkeypatch.setattr(grouped, "SERIAL_BYTES", 0)
    c = CASES[name]
    x, w, dy = make_arrays(c, rng, np.float32, True)
    kw = kwargs(c)
    runs = []
    for threads in (1, 2, 3, 2, 1):
        with convgrad.config(algo="grouped", threads=threads):
            runs.append(convgrad.conv_weight_grad(x, dy, w.shape, **kw))
    for other in runs[1:]:
        np.testing.assert_array_equal(runs[0], other)


STREAMED = [name for name, c in CASES.items() if c["c"] == c["o"] == c["groups"]]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", STREAMED)
def test_channels_last_depthwise_gradients_stream(isa, name, rng, monkeypatch):
    """Channels-last depthwise weight and data gradients take the streaming kernels
    (cg_dw_wgrad_run: several passes for rows of more than 8 taps; cg_dw_dgrad_run:
    stride phases, up to 12 terms; both: a partial last lane vector, padding at both
    ends), float16 and bfloat16 converted in their loads and stores; channels-first
    callers take the tiles (or the planar kernels)."""
    taken = []
    for fn in ("_depthwise_wgrad", "_depthwise_dgrad"):
        streamed = getattr(grouped, fn)
        monkeypatch.setattr(grouped, fn,
                            lambda *a, f=streamed, n=fn: taken.append(n) or f(*a))
    for k, dtype in enumerate((np.float32, np.float16, bfloat16)):
        check(CASES[name], rng, isa=isa, channels_last=True, threads=2, dtype=dtype)
        assert sorted(taken) == sorted(["_depthwise_dgrad", "_depthwise_wgrad"] * (k + 1))
    check(CASES[name], rng, isa=isa, channels_last=False)
    assert len(taken) == 6


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("channels", [64, 48])
def test_depthwise_data_gradient_streams_into_recycled_results(isa, stride, dtype, channels,
                                                              rng, monkeypatch):
    """A large channels-last depthwise data gradient whose result memory comes back from
    the pool (its pages mapped) is written with streaming stores, whole cache lines at a
    time (16-bit: 64 channels, 128 bytes a pixel; float32: 48 channels, on AVX-512 a pair
    of lane vectors and a lone one, as MobileNetV2's 144), partial pixel blocks and padded
    edges included; a fresh result is not, nor pixels of part of a line (16-bit, 48)."""
    from convgrad.kernels import _results
    monkeypatch.setattr(_results, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(_results, "MIN_BYTES", 0)
    decided = []
    real = grouped._streams_dx
    monkeypatch.setattr(grouped, "_streams_dx", lambda dx, vl: decided.append(real(dx, vl))
                        or decided[-1])
    c = case(2, groups=channels, cg=1, og=1, size=(13, 23), k=3, s=stride, pb=1, pe=(0, 1),
             n=2)
    _, w, dy = make_arrays(c, rng, dtype, True)
    args = dict(strides=c["strides"], dilations=c["dilations"], pads_begin=c["pads_begin"],
                groups=c["groups"])
    want = naive.dgrad(np.asarray(w, np.float64), np.asarray(dy, np.float64), c["in_sizes"],
                       **args)
    _results.clear()
    with convgrad.config(algo="grouped", isa=isa, threads=2):
        for _ in range(3):
            dx = convgrad.conv_data_grad(w, dy, (2, channels, 13, 23), **kwargs(c))
            assert dx.dtype == np.dtype(dtype)
            assert_close(dx, want, dtype)
            del dx
    whole_lines = (channels * np.dtype(dtype).itemsize) % 64 == 0
    assert decided == [False, whole_lines, whole_lines]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ["spec-5to2-2d", "spec-5to2-3d", "resnext-4to4x32-s2",
                                  "g7-4to3"])
def test_grouped_results_stream_into_recycled_memory(isa, name, rng, monkeypatch):
    """Forward and data results of few-channel groups (the spec op, ResNeXt) whose memory
    comes back from the pool go out a line piece at a time with streaming stores (line
    pieces of any alignment: the ends plainly), 1 and 2 threads; a fresh result is
    written tile by tile; the values are the same either way (g7-4to3's 21 lanes fill
    no whole vectors: always tile stores)."""
    from convgrad.kernels import _results
    decided = recycled_results_and_decisions(monkeypatch, grouped, "_streams_lines")
    c = CASES[name]
    x, w, dy = make_arrays(c, rng, np.float32, True)
    args = dict(strides=c["strides"], dilations=c["dilations"], pads_begin=c["pads_begin"],
                groups=c["groups"])
    x64, w64, dy64 = (np.asarray(a, np.float64) for a in (x, w, dy))
    want_y = naive.forward(x64, w64, c["out_sizes"], **args)
    want_dx = naive.dgrad(w64, dy64, c["in_sizes"], **args)
    _results.clear()
    for threads in (1, 2, 2):
        with convgrad.config(algo="grouped", isa=isa, threads=threads):
            y = convgrad.conv_forward(x, w, **kwargs(c))
            dx = convgrad.conv_data_grad(w, dy, x.shape, **kwargs(c))
        assert_close(y, want_y, np.float32)
        assert_close(dx, want_dx, np.float32)
        del y, dx
    assert len(decided) == 6 and not decided[0] and all(decided[2:])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("cg,og", [(2, 5), (5, 2)], ids=["spec-layer", "spec-transposed"])
def test_pixels_of_half_vectors_store_as_eight_float_runs(isa, cg, og, rng):
    """Channels-last float32 results of 8 lanes (the spec layer's 8 data-gradient
    channels, 4 groups of 2; half a vector on AVX-512) go out as 8-float vectors a
    pixel (grouped debug bit 128: a copy call per pixel): the same bits, equal to the
    reference, for the forward and the data gradient."""
    c = case(2, groups=4, cg=cg, og=og, size=23, k=3, s=2, pb=1, pe=1, n=1)
    x, w, dy = make_arrays(c, rng, np.float32, True)
    args = dict(strides=c["strides"], dilations=c["dilations"], pads_begin=c["pads_begin"],
                groups=c["groups"])
    x64, w64, dy64 = (np.asarray(a, np.float64) for a in (x, w, dy))
    want = (naive.forward(x64, w64, c["out_sizes"], **args),
            naive.dgrad(w64, dy64, c["in_sizes"], **args))
    lib = native.engine().lib
    got = {}
    try:
        for bit in (0, 128):
            lib.cg_grouped_dbg(bit)
            with convgrad.config(algo="grouped", isa=isa, threads=2):
                got[bit] = (convgrad.conv_forward(x, w, **kwargs(c)),
                            convgrad.conv_data_grad(w, dy, x.shape, **kwargs(c)))
    finally:
        lib.cg_grouped_dbg(0)
    for a, b, ref in zip(got[0], got[128], want):
        assert_close(a, ref, np.float32)
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("size", [23, 24])
@pytest.mark.parametrize("dtype,bit", [(np.float32, 256), (np.float16, 512), (bfloat16, 512)],
                         ids=["f32", "f16", "bf16"])
def test_pixels_of_half_vectors_stream_in_pairs(isa, size, dtype, bit, rng, monkeypatch):
    """A recycled channels-last result of 8 lanes (the spec layer's data gradient; half
    a vector on AVX-512) goes out a line piece at a time with streaming stores: float32
    pairs of pixels in one vector (a line piece starting half a cache line in: its first
    pixel plainly; 23-pixel rows start so every other row), float16/bfloat16 packed
    together and converted, whole cache lines streamed: the same bits as the tile stores
    (grouped debug bit 256 / 512), equal to the reference."""
    from convgrad.kernels import _results
    recycled_results_and_decisions(monkeypatch)
    c = case(2, groups=4, cg=2, og=5, size=size, k=3, s=2, pb=1, pe=1, n=2)
    x, w, dy = make_arrays(c, rng, dtype, True)
    args = dict(strides=c["strides"], dilations=c["dilations"], pads_begin=c["pads_begin"],
                groups=c["groups"])
    want = naive.dgrad(np.asarray(w, np.float64), np.asarray(dy, np.float64), c["in_sizes"],
                       **args)
    lib = native.engine().lib
    _results.clear()
    got = {}
    try:
        for b in (0, bit, 0, bit):
            lib.cg_grouped_dbg(b)
            with convgrad.config(algo="grouped", isa=isa, threads=2):
                dx = convgrad.conv_data_grad(w, dy, x.shape, **kwargs(c))
            got.setdefault(b, []).append(dx.copy())
            del dx                          # (its memory back to the pool)
    finally:
        lib.cg_grouped_dbg(0)
    for dx in got[0] + got[bit]:
        assert dx.dtype == dtype
        assert_close(dx, want, dtype)
    np.testing.assert_array_equal(got[0][1], got[bit][1])


@pytest.mark.parametrize("isa", ISAS)
def test_streamed_gradients_never_multiply_padding(isa):
    """The streaming depthwise kernels' edge pixels skip the taps that read padding: a
    NaN in dy where tap 0 reads x[-1] stays out of that tap's gradient, a NaN weight out
    of the dx pixel whose tap reads past dy (D17)."""
    x = np.moveaxis(np.ones((1, 3, 3), np.float32), -1, 1)          # NXC memory
    dy_nxc = np.ones((1, 3, 3), np.float32)
    dy_nxc[0, 0, :] = np.nan
    dy = np.moveaxis(dy_nxc, -1, 1)
    w_shape = (3, 1, 3)
    with convgrad.config(algo="grouped", isa=isa):
        dw = convgrad.conv_weight_grad(x, dy, w_shape, pads_begin=[1], pads_end=[1], groups=3)
    for ch in range(3):
        np.testing.assert_array_equal(np.isnan(dw[ch, 0]), [False, True, True])
        np.testing.assert_array_equal(dw[ch, 0, 0], 2.0)
    # the data gradient: the NaN tap 0 meets dy[q + 1], outside dy for the last pixel
    w = np.tile(np.array([np.nan, 1.0, 1.0], np.float32), (3, 1, 1))
    with convgrad.config(algo="grouped", isa=isa):
        dx = convgrad.conv_data_grad(w, np.moveaxis(np.ones((1, 3, 3), np.float32), -1, 1),
                                     x.shape, pads_begin=[1], pads_end=[1], groups=3)
    for ch in range(3):
        np.testing.assert_array_equal(np.isnan(dx[0, ch]), [True, True, False])
        np.testing.assert_array_equal(dx[0, ch, 2], 2.0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", STREAMED)
def test_channels_first_depthwise_gradients_planar(isa, name, rng, monkeypatch):
    """Channels-first depthwise weight and data gradients take the planar kernels
    (cg_planar_*: one channel plane at a time, w stride phases, every tap over the
    positions where it reads the input, ends pixel by pixel) in every dtype; the weight
    gradient is bitwise the same on 1, 2 and 3 threads; channels-last callers keep the
    streaming kernels."""
    taken = []
    planar = grouped._planar_run
    monkeypatch.setattr(grouped, "_planar_run", lambda *a: taken.append(a[1]) or planar(*a))
    monkeypatch.setattr(grouped, "PLANAR_MIN_WIDTH", 1)
    monkeypatch.setattr(grouped, "PLANAR_DGRAD_MIN_WIDTH", 1)
    monkeypatch.setattr(grouped, "_flat", lambda *a, **k: False)    # (its own tests below)
    for dtype in (np.float32, np.float16, bfloat16):
        check(CASES[name], rng, isa=isa, channels_last=False, dtype=dtype, threads=2)
    assert sorted(taken) == ["dgrad"] * 3 + ["wgrad"] * 3
    check(CASES[name], rng, isa=isa, channels_last=True)
    assert len(taken) == 6
    c = CASES[name]
    x, w, dy = make_arrays(c, rng, np.float32, False)
    runs = []
    for threads in (1, 2, 3):
        with convgrad.config(algo="grouped", isa=isa, threads=threads):
            runs.append(convgrad.conv_weight_grad(x, dy, w.shape, **kwargs(c)))
    for other in runs[1:]:
        np.testing.assert_array_equal(runs[0], other)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("stride", [1, 2])
def test_planar_gradients_never_multiply_padding(isa, stride, monkeypatch):
    """The planar kernels skip the taps that read padding (D17): a NaN in dy where
    tap 0 reads x[-1] stays out of tap 0's weight gradient; a NaN weight stays out of
    the dx pixels whose tap reads outside dy."""
    monkeypatch.setattr(grouped, "PLANAR_MIN_WIDTH", 1)
    monkeypatch.setattr(grouped, "PLANAR_DGRAD_MIN_WIDTH", 1)
    W = 21
    M = (W + 2 - 3) // stride + 1
    x = np.ones((1, 2, W), np.float32)
    dy = np.ones((1, 2, M), np.float32)
    dy[..., 0] = np.nan
    attrs = dict(strides=[stride], pads_begin=[1], pads_end=[1], groups=2)
    with convgrad.config(algo="grouped", isa=isa):
        dw = convgrad.conv_weight_grad(x, dy, (2, 1, 3), **attrs)
    np.testing.assert_array_equal(np.isnan(dw[:, 0]), [[False, True, True]] * 2)
    # tap 0 reads x[ow * stride - 1]: valid for ow >= 1
    np.testing.assert_array_equal(dw[:, 0, 0], float(M - 1))
    w = np.tile(np.array([np.nan, 1.0, 1.0], np.float32), (2, 1, 1))
    with convgrad.config(algo="grouped", isa=isa):
        dx = convgrad.conv_data_grad(w, np.ones((1, 2, M), np.float32), x.shape, **attrs)
    want = naive.dgrad(np.asarray(w, np.float64), np.ones((1, 2, M)), (W,), strides=(stride,),
                       dilations=(1,), pads_begin=(1,), groups=2)
    np.testing.assert_array_equal(np.isnan(dx), np.isnan(want))
    assert np.isfinite(dx).any() and np.isnan(dx).any()


def _flat_calls(monkeypatch) -> list:
    """The ops the flat-plane kernels run from now on ("fwd", "dgrad", "wgrad"), in order."""
    taken = []
    real, real_w = grouped._flat_run, grouped._flat_wgrad
    monkeypatch.setattr(grouped, "_flat_run", lambda *a: taken.append(a[1]) or real(*a))
    monkeypatch.setattr(grouped, "_flat_wgrad",
                        lambda *a: taken.append("wgrad") or real_w(*a))
    return taken


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("hw,k,d", [((9, 13), 3, 1), ((56, 56), 3, 1), ((1, 40), 3, 1),
                                    ((2, 3), 5, 1), ((3, 17), 7, 2), ((7,), 3, 1),
                                    ((20, 21), 3, 2), ((11, 37), 5, 1)],
                         ids=["odd", "mobilenet", "one-row", "tiny", "dilated7x7", "1d",
                              "dilated3x3", "5x5"])
def test_flat_planes_take_same_size_channels_first_depthwise(isa, hw, k, d, rng, monkeypatch):
    """Channels-first float32 depthwise gradients of stride 1 whose result has the input's
    size run on flat planes (cg_flat_corr_run, cg_flat_wgrad_run: vectors across row ends,
    column masks, the rows where a tap leaves the plane in row pieces): equal to the
    reference on planes smaller than a vector, one row, dilations; a NaN and an Inf at row
    ends (where masked lanes read) reach exactly the outputs the float64 definition gives
    them (D17); the weight gradient bitwise the same on 1-3 threads, and in float16 /
    bfloat16 too.  Channels-last calls and 16-bit forward / data gradients do not take
    them (strided ones: the test below)."""
    taken = _flat_calls(monkeypatch)
    C, n, r = 20, 2, len(hw)
    p = (k - 1) * d // 2
    kw = dict(strides=[1] * r, pads_begin=[p] * r, pads_end=[p] * r, dilations=[d] * r,
              groups=C)
    x = rng.standard_normal((n, C, *hw)).astype(np.float32)
    w = rng.standard_normal((C, 1) + (k,) * r).astype(np.float32)
    dy = rng.standard_normal((n, C, *hw)).astype(np.float32)
    x[0, 1, ..., -1] = np.nan
    x[1, 2, ..., 0] = np.inf
    dy[0, 3, ..., -1] = -np.inf
    dy[1, 4, ..., 0] = np.nan
    geo = dict(strides=(1,) * r, dilations=(d,) * r, pads_begin=(p,) * r, groups=C)
    with np.errstate(invalid="ignore"):               # (Inf - Inf in the reference)
        want_y = naive.forward(x.astype(np.float64), w.astype(np.float64), hw, **geo)
        want_dx = naive.dgrad(w.astype(np.float64), dy.astype(np.float64), hw, **geo)
        want_dw = naive.wgrad(x.astype(np.float64), dy.astype(np.float64), (k,) * r, **geo)
    dws = []
    for threads in (1, 2, 3):
        with convgrad.config(algo="grouped", isa=isa, threads=threads):
            y = convgrad.conv_forward(x, w, **kw)
            dx = convgrad.conv_data_grad(w, dy, x.shape, **kw)
            dws.append(convgrad.conv_weight_grad(x, dy, w.shape, **kw))
    assert taken == ["fwd", "dgrad", "wgrad"] * 3
    # engine debug bit 524288: the weight gradient's rows ends in scalar row pieces and
    # a pointer a tap (the code before the masked vector ends and row / column pointers)
    with convgrad.config(algo="grouped", isa=isa, threads=2), engine_dbg(524288):
        dw_old = convgrad.conv_weight_grad(x, dy, w.shape, **kw)
    taken.pop()
    np.testing.assert_array_equal(np.isnan(dw_old), np.isnan(want_dw))
    fin = np.isfinite(want_dw)
    assert_close(dw_old[fin], want_dw[fin], np.float32)
    # float16 / bfloat16 weight gradients read their planes in place, widened as they
    # are loaded (masked loads at the ends): against the definition on the rounded inputs
    for dt in (np.float16, bfloat16):
        xh, dyh = x.astype(dt), dy.astype(dt)
        with np.errstate(invalid="ignore"):
            want_h = naive.wgrad(xh.astype(np.float64), dyh.astype(np.float64), (k,) * r,
                                 **geo)
        with convgrad.config(algo="grouped", isa=isa, threads=2):
            got_h = convgrad.conv_weight_grad(xh, dyh, w.shape, **kw)
        assert taken.pop() == "wgrad"
        assert got_h.dtype == np.dtype(dt)
        np.testing.assert_array_equal(np.isnan(got_h), np.isnan(want_h))
        np.testing.assert_array_equal(np.isinf(got_h), np.isinf(want_h))
        fin = np.isfinite(want_h)
        assert_close(got_h[fin], want_h[fin], dt)
    for other in dws[1:]:                    # a fixed order whatever the threads
        np.testing.assert_array_equal(other, dws[0])
    for got, want in ((y, want_y), (dx, want_dx), (dws[0], want_dw)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        fin = np.isfinite(want)
        assert fin.any()
        assert_close(got[fin], want[fin], np.float32)
    # channels-last memory, stride 2, float16: other kernels
    with convgrad.config(algo="grouped", isa=isa):
        convgrad.conv_data_grad(w, np.moveaxis(np.ascontiguousarray(np.moveaxis(dy, 1, -1)),
                                               -1, 1), x.shape, **kw)
        convgrad.conv_data_grad(w.astype(np.float16), dy.astype(np.float16), x.shape, **kw)
    assert taken == ["fwd", "dgrad", "wgrad"] * 3


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("hw,k,s,d,pb,pe", [((16, 22), 3, 2, 1, 1, 0), ((12, 10), 4, 2, 1, 1, 1),
                                            ((9, 12), 3, 3, 1, 1, 1), ((14,), 5, 2, 1, 2, 1),
                                            ((6, 8), 2, 2, 1, 0, 0), ((16, 16), 3, 2, 2, 2, 1)],
                         ids=["mobilenet-s2", "k4s2", "s3", "1d-k5s2", "k2s2", "s2-dilated"])
def test_flat_planes_take_strided_depthwise_gradients(isa, hw, k, s, d, pb, pe, rng,
                                                      monkeypatch):
    """Channels-first float32 depthwise data and weight gradients whose x is s times dy on
    every axis run on flat planes phase by phase: each stride phase of dx one flat
    correlation of dy, interleaved into the rows; each x plane cut into its phase planes,
    every tap a shift of one of them.  Equal to the float64 definition, NaN and Inf at
    row ends included (D17); the weight gradient bitwise the same on 1-3 threads."""
    taken = _flat_calls(monkeypatch)
    C, n, r = 12, 2, len(hw)
    out = tuple((L + pb + pe - d * (k - 1) - 1) // s + 1 for L in hw)
    assert all(L == s * m for L, m in zip(hw, out))
    x = rng.standard_normal((n, C) + hw).astype(np.float32)
    w = rng.standard_normal((C, 1) + (k,) * r).astype(np.float32)
    dy = rng.standard_normal((n, C) + out).astype(np.float32)
    x[0, 1, ..., -1] = np.nan
    x[1, 2, ..., 0] = np.inf
    x[0, 6, ..., -2] = -np.inf
    dy[0, 3, ..., -1] = -np.inf
    dy[1, 4, ..., 0] = np.nan
    w[5].flat[0] = np.nan
    geo = dict(strides=(s,) * r, dilations=(d,) * r, pads_begin=(pb,) * r, groups=C)
    with np.errstate(invalid="ignore"):
        want = naive.dgrad(w.astype(np.float64), dy.astype(np.float64), hw, **geo)
        want_dw = naive.wgrad(x.astype(np.float64), dy.astype(np.float64), (k,) * r, **geo)
    kw = dict(strides=[s] * r, dilations=[d] * r, pads_begin=[pb] * r, pads_end=[pe] * r,
              groups=C)
    dws = []
    for threads in (2, 1, 3):
        with convgrad.config(algo="grouped", isa=isa, threads=threads):
            if threads == 2:
                dx = convgrad.conv_data_grad(w, dy, (n, C) + hw, **kw)
            dws.append(convgrad.conv_weight_grad(x, dy, w.shape, **kw))
    assert taken == ["dgrad", "wgrad", "wgrad", "wgrad"]
    for other in dws[1:]:
        np.testing.assert_array_equal(other, dws[0])
    for got, ref in ((dx, want), (dws[0], want_dw)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
        fin = np.isfinite(ref)
        assert fin.any() and not fin.all()
        assert_close(got[fin], ref[fin], np.float32)


@pytest.mark.parametrize("isa", ISAS)
def test_padding_is_never_an_operand(isa):
    # depthwise, 3 channels: the NaN tap reads x[p - 1]
    x = np.ones((1, 3, 3), np.float32)
    w = np.tile(np.array([np.nan, 1.0, 1.0], np.float32), (3, 1, 1))
    with convgrad.config(algo="grouped", isa=isa):
        y = convgrad.conv_forward(x, w, pads_begin=[1], pads_end=[1], groups=3)
        dx = convgrad.conv_data_grad(w, np.ones((1, 3, 3), np.float32), x.shape,
                                     pads_begin=[1], pads_end=[1], groups=3)
        dy = np.tile(np.array([np.nan, 1.0, 1.0], np.float32), (1, 3, 1))
        dw = convgrad.conv_weight_grad(x, dy, w.shape, pads_begin=[1], pads_end=[1], groups=3)
    for ch in range(3):
        np.testing.assert_array_equal(np.isnan(y[0, ch]), [False, True, True])
        np.testing.assert_array_equal(np.isnan(dx[0, ch]), [True, True, False])
        np.testing.assert_array_equal(np.isnan(dw[ch, 0]), [False, True, True])


def test_wide_groups_are_left_to_the_native_kernel():
    geom = ConvGeometry(**case(2, groups=1, cg=128, og=128, size=8, k=3))
    for op in OPS:
        assert grouped.supports_op(op)(geom, np.float32) is not None
    geom = ConvGeometry(**case(2, groups=32, cg=4, og=4, size=8, k=3))
    for op in OPS:
        assert grouped.supports_op(op)(geom, np.float32) is None


@pytest.mark.parametrize("op", OPS)
def test_empty_batch(op):
    """N = 0: empty results, a zero weight gradient; the memory estimate plans it too."""
    c = case(2, groups=4, cg=1, og=2, size=6, k=3, n=0)
    geom = ConvGeometry(**c)
    call = kernels.Call.assumed(op, geom, np.float32)
    kernel = kernels.select(op, geom, np.float32, "grouped")
    assert sum(kernels.estimate(kernel, call).values()) >= 0
    x, w, dy = make_arrays(c, np.random.default_rng(0), np.float32, True)
    got = run(c, x, w, dy)[OPS.index(op)]
    if op == "wgrad":
        np.testing.assert_array_equal(got, np.zeros(w.shape, np.float32))
    else:
        assert got.size == 0


@pytest.mark.parametrize("op", ["wgrad", "dgrad"])
def test_streaming_depthwise_estimates_count_what_they_allocate(op):
    """The chooser's estimate of a call the streaming depthwise kernels take (channels
    last, one dtype of the three) is what they allocate: the partial weight gradients or
    the packed weights, whatever the dtype (they convert 16-bit elements in their loads,
    into no scratch); channels-first calls keep the tile kernel's estimate."""
    geom = ConvGeometry(**CASES["dw-2d-k3"])
    eng = native.engine()
    LP = -(-geom.c // eng.vl) * eng.vl
    shapes = kernels.canonical_shapes(op, geom)
    key = "partial weight gradients" if op == "wgrad" else "packed weights"
    found = {}
    for dtype in (np.float32, np.float16, bfloat16):
        for layout in ("nxc", "ncx"):
            lay = frozenset({layout})
            a, b, out = (kernels.Operand(tuple(sh), np.dtype(dtype), lay) for sh in shapes)
            call = kernels.Call(op, geom, np.dtype(np.float32), a, b, out, direct_result=True)
            found[np.dtype(dtype).name, layout] = est = grouped.memory(call)
            if layout == "nxc":
                assert est[key] % (9 * LP * 4) == 0
                assert est[key] <= 9 * LP * 4 * (grouped.WGRAD_CHUNKS if op == "wgrad" else 1)
                assert "per-thread scratch" not in est
            else:
                assert "per-thread scratch" in est
    assert found["float16", "nxc"] == found["bfloat16", "nxc"]
    assert found["float16", "nxc"][key] == found["float32", "nxc"][key]


@pytest.mark.parametrize("op", OPS)
def test_auto_sends_few_channel_groups_to_the_grouped_kernel(op):
    """The chooser (kernels/chooser.py, measured): depthwise (multiplier <= 8),
    ResNeXt's 4 -> 4 and the spec op's 2 -> 5 go to the grouped kernel; 16 channels
    per group and more are GEMM-shaped (the native engine)."""
    for name in ("dw-2d-k3", "dw-mult4-3d", "resnext-4to4x32", "spec-5to2-3d"):
        geom = ConvGeometry(**CASES[name])
        assert kernels.select(op, geom, np.float32).name == "grouped", name
    wide = ConvGeometry(**case(2, groups=4, cg=16, og=16, size=9, k=3))
    assert kernels.select(op, wide, np.float32).name == "native"


@pytest.mark.parametrize("isa", ISAS)
def test_huge_dilation_costs_no_empty_passes(isa, rng):
    """A dilation of 10^6 (taps 10^6 pixels apart; padding makes the problem valid):
    one pass per residue class present, not 10^6 empty ones (this hung once)."""
    c = case(1, groups=4, cg=1, og=2, size=5, k=2, d=10**6, pb=500_000, pe=499_999, n=1)
    check(c, rng, isa=isa, channels_last=True)


def test_data_gradients_with_too_many_stride_phases_are_declined():
    geom = ConvGeometry(**case(2, groups=4, cg=1, og=1, size=3, k=1, s=(100, 100), pb=0,
                               pe=0))
    assert "stride phases" in grouped.supports_op("dgrad")(geom, np.float32)
    assert grouped.supports_op("fwd")(geom, np.float32) is None
    assert kernels.select("dgrad", geom, np.float32).name != "grouped"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("name", ["dw-2d-k3", "dw-2d-k5-s2-asym", "dw-1d-k10-wide",
                                  "spec-5to2-2d"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # sums past the maximum
def test_half_depthwise_streams_convert_exactly(isa, dtype, name, rng):
    """The streaming depthwise kernels (and the grouped kernel of the spec layer, whose
    dx pixels are 8 channels: stored 8 at a time) convert 16-bit elements in their loads
    and round each result once in their stores: bitwise what the float32 kernel computes
    from the same values widened, then rounded (NumPy's / ml_dtypes' casts), tiny results
    that round to float16 subnormals and values that round to infinity included."""
    c = CASES[name]
    x, w, dy = make_arrays(c, rng, dtype, True)
    big = np.asarray(ml_dtypes.finfo(dtype).max, np.float32) / 2
    flat = np.moveaxis(dy, 1, -1).reshape(-1)                         # a view: NXC memory
    assert np.shares_memory(flat, dy)
    flat[:: 7] = np.asarray(big, dtype)                               # sums past the maximum
    flat[3:: 11] = np.asarray(3e-6, dtype)                            # float16 subnormals
    kw = kwargs(c)
    with convgrad.config(algo="grouped", isa=isa):
        dx16 = convgrad.conv_data_grad(w, dy, x.shape, **kw)
        dw16 = convgrad.conv_weight_grad(x, dy, w.shape, **kw)
        x32, w32, dy32 = (np.asarray(a, np.float32) for a in (x, w, dy))
        dx32 = convgrad.conv_data_grad(w32, dy32, x.shape, **kw)
        dw32 = convgrad.conv_weight_grad(x32, dy32, w.shape, **kw)
    assert dx16.dtype == np.dtype(dtype)
    assert np.isinf(np.asarray(dx32, np.float32).astype(dtype).astype(np.float32)).any()
    np.testing.assert_array_equal(np.asarray(dx16).view(np.uint16),
                                  dx32.astype(dtype).view(np.uint16))
    np.testing.assert_array_equal(np.asarray(dw16, np.float64), np.asarray(
        np.asarray(dw32, np.float32).astype(dw16.dtype), np.float64))


@pytest.mark.parametrize("isa", ISAS)
def test_bfloat16_results_of_eight_channel_pixels_round_ties_to_even(isa):
    """The spec layer's grouped data gradient stores pixels of 8 dx channels, rounded to
    bfloat16 8 at a time: results exactly halfway between two bfloat16 values round to
    the even one (1 + 2^-7 + 2^-8 -> 1 + 2^-6; 1 + 2^-8 -> 1), as ml_dtypes rounds the
    float32 result, in the channels-last memory the kernel stores whole pixels into."""
    g, n, hw = 4, 2, (5, 7)
    dy = np.zeros((n, *hw, 20), np.float32)                  # NXC memory, 4 groups of 5
    dy[..., 0] = 1 + 2.0 ** -7
    dy[..., 1] = 2.0 ** -8
    dy[..., 5] = 1.0
    dy[..., 6] = 2.0 ** -8
    w = np.zeros((20, 2, 3, 3), np.float32)                   # OIX: 2 dx channels a group
    w[0, 0, 1, 1] = w[1, 0, 1, 1] = 1.0                       # dx channel 0: a tie, odd
    w[5, 1, 1, 1] = w[6, 1, 1, 1] = 1.0                       # dx channel 3: a tie, even
    dyv = np.moveaxis(dy.astype(bfloat16), -1, 1)
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], groups=g)
    with convgrad.config(algo="grouped", isa=isa, threads=2):
        got = convgrad.conv_data_grad(w.astype(bfloat16), dyv, (n, 8, *hw), **kw)
        want = convgrad.conv_data_grad(w, np.moveaxis(dy, -1, 1), (n, 8, *hw), **kw)
    assert got.dtype == np.dtype(bfloat16)
    assert (np.asarray(want)[:, 0] == 1 + 2.0 ** -7 + 2.0 ** -8).all()
    assert (np.asarray(got, np.float32)[:, 0] == 1 + 2.0 ** -6).all()
    assert (np.asarray(got, np.float32)[:, 3] == 1.0).all()
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16),
                                  np.asarray(want, np.float32).astype(bfloat16).view(np.uint16))
