"""Every registered kernel against the independent naive reference (tests/naive.py)
and against the package's float64 reference kernel, over a sweep of geometries."""

import numpy as np
import pytest

import convgrad
from convgrad import kernels, ops
from convgrad.kernels import native
from convgrad.dtypes import bfloat16
from convgrad.geometry import make_geometry

import naive
from cases import arrays, attrs, case_id, random_case
from conftest import assert_close

CASES = [random_case(seed) for seed in range(60)]


def geometry(case):
    return make_geometry("test", **case)


@pytest.mark.parametrize("algo", kernels.names())
@pytest.mark.parametrize("case", CASES[:30], ids=case_id)
def test_kernel_matches_naive(algo, case, rng):
    x, w, dy = arrays(case, rng)
    geom = geometry(case)
    for op, args, want in naive.three_ops(x, w, dy, case):
        # in float64 where the kernel computes it (the native engine: float32); a kernel
        # for some geometries only (winograd: 3-tap stride-1) skips the others
        why = {dt: dict((k.name, why) for k, why in kernels.candidates(op, geom, dt))[algo]
               for dt in (np.float64, np.float32)}
        if why[np.float64] is not None and why[np.float32] is not None:
            continue
        dtype = np.float64 if why[np.float64] is None else np.float32
        kernel = kernels.select(op, geom, dtype, algo)
        args = [a.astype(dtype) for a in args]
        assert_close(ops.run_kernel(kernel, *args, geom, dtype), want, dtype)


FAST = [name for name in kernels.names() if name != "reference"]


def _three_ops(x, w, dy, kw, only=None):
    calls = (lambda: convgrad.conv_forward(x, w, **kw),
             lambda: convgrad.conv_weight_grad(x, dy, w.shape, **kw),
             lambda: convgrad.conv_data_grad(w, dy, x.shape, **kw))
    return [c() if only in (None, i) else None for i, c in enumerate(calls)]


def _check_kernel_against_reference(algo, case, workspace, rng):
    x, w, dy = arrays(case, rng, np.float32)
    kw = attrs(case)
    with convgrad.config(algo="reference"):
        want = _three_ops(x, w, dy, kw)
    geom = geometry(case)
    ran = 0
    for i, (op, r) in enumerate(zip(("fwd", "wgrad", "dgrad"), want)):
        with convgrad.config(algo=algo, workspace_bytes=workspace):
            why = dict((k.name, why) for k, why in kernels.candidates(op, geom, np.float32))
            if why[algo] is not None:
                continue
            g = _three_ops(x, w, dy, kw, only=i)[i]
        assert g.dtype == np.float32
        assert_close(g, r, np.float32)
        ran += 1
    return ran


@pytest.mark.parametrize("algo", FAST)
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("workspace", [None, 1])
def test_fast_kernels_match_reference_canonical_api(algo, case, workspace, rng):
    _check_kernel_against_reference(algo, case, workspace, rng)


# Larger problems: several row blocks and weight-gradient chunks per worker, and
# (with a small workspace) several batch blocks.
def _case(**kw):
    kw["out_sizes"] = tuple(
        (L + b + e - (k - 1) * d - 1) // s + 1 for L, k, s, d, b, e in zip(
            kw["in_sizes"], kw["kernel"], kw["strides"], kw["dilations"], kw["pads_begin"],
            kw["pads_end"]))
    return kw


# (more than shifted.FOLD_MAX_CHANNELS channels per group: one GEMM per tap; fewer: folded)
MEDIUM = [_case(n=2, c=40, o=24, groups=2, in_sizes=(19, 23), kernel=(3, 3), strides=(1, 2),
                dilations=(2, 1), pads_begin=(2, 1), pads_end=(1, 1)),
          _case(n=3, c=6, o=4, groups=1, in_sizes=(37, 41), kernel=(3, 3),
               strides=(1, 1), dilations=(1, 1), pads_begin=(1, 1), pads_end=(1, 1)),
          _case(n=2, c=8, o=6, groups=2, in_sizes=(50, 45), kernel=(3, 2),
               strides=(2, 2), dilations=(2, 1), pads_begin=(2, 0), pads_end=(1, 1)),
          _case(n=4, c=3, o=5, groups=1, in_sizes=(3000,), kernel=(3,),
               strides=(1,), dilations=(8,), pads_begin=(7,), pads_end=(7,)),
          _case(n=2, c=4, o=4, groups=1, in_sizes=(12, 13, 11), kernel=(3, 3, 3),
               strides=(2, 2, 2), dilations=(1, 1, 1), pads_begin=(1, 1, 1),
               pads_end=(1, 2, 2))]


@pytest.mark.parametrize("algo", FAST)
@pytest.mark.parametrize("case", MEDIUM, ids=case_id)
@pytest.mark.parametrize("workspace", [None, 150_000])
def test_fast_kernels_on_larger_problems(algo, case, workspace, rng):
    if _check_kernel_against_reference(algo, case, workspace, rng) == 0:
        assert algo != "shifted", "the shifted kernel supports every float problem here"
        pytest.skip(f"{algo} supports none of this problem's ops")


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, bfloat16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES[30:40], ids=case_id)
def test_dtypes_keep_input_dtype_and_accuracy(dtype, case, rng):
    x, w, dy = arrays(case, rng)
    x, w, dy = (a.astype(dtype) for a in (x, w, dy))
    kw = attrs(case)
    a = dict(strides=case["strides"], dilations=case["dilations"],
             pads_begin=case["pads_begin"], groups=case["groups"])
    got = convgrad.conv_weight_grad(x, dy, w.shape, **kw)
    assert got.dtype == np.dtype(dtype)
    # half types accumulate in float32: compare with the exact result on the
    # rounded inputs, allowing one final rounding to the dtype
    assert_close(got, naive.wgrad(x.astype(np.float64), dy.astype(np.float64),
                                  case["kernel"], **a), dtype)
    got = convgrad.conv_data_grad(w, dy, x.shape, **kw)
    assert got.dtype == np.dtype(dtype)
    assert_close(got, naive.dgrad(w.astype(np.float64), dy.astype(np.float64),
                                  case["in_sizes"], **a), dtype)


def test_half_types_accumulate_in_float32():
    # 4096 products of 1.0 * 1.0: a float16 accumulator would stop at 2048
    x = np.ones((1, 1, 4096), np.float16)
    dy = np.ones((1, 1, 4096), np.float16)
    dw = convgrad.conv_weight_grad(x, dy, (1, 1, 1))
    assert dw.dtype == np.float16 and float(dw[0, 0, 0]) == 4096.0


@pytest.mark.parametrize("algo", [k.name for k, why in kernels.candidates(
    "dgrad", geometry(random_case(3)), np.int64) if why is None])
def test_integers_are_exact(algo):
    rng = np.random.default_rng(7)
    case = random_case(3)
    x, w, dy = (rng.integers(-50, 50, a.shape) for a in arrays(case, rng))
    geom = geometry(case)
    a = dict(strides=case["strides"], dilations=case["dilations"],
             pads_begin=case["pads_begin"], groups=case["groups"])
    got = ops.run_kernel(kernels.select("dgrad", geom, np.int64, algo), w, dy, geom, np.int64)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, naive.dgrad(w, dy, case["in_sizes"], **a).astype(np.int64))


def test_empty_batch_gives_zero_weight_gradient():
    x = np.zeros((0, 4, 5, 5), np.float32)
    dy = np.zeros((0, 6, 3, 3), np.float32)
    dw = convgrad.conv_weight_grad(x, dy, (6, 2, 3, 3), groups=2)
    assert dw.shape == (6, 2, 3, 3) and not dw.any()
    dx = convgrad.conv_data_grad(np.ones((6, 2, 3, 3), np.float32), dy, x.shape, groups=2)
    assert dx.shape == x.shape


def test_forced_unknown_algo_lists_valid_ones():
    x = np.zeros((1, 1, 4), np.float32)
    with convgrad.config(algo="no-such-algo"):
        with pytest.raises(convgrad.ConvGradError, match="'reference'"):
            convgrad.conv_forward(x, np.zeros((1, 1, 3), np.float32))


def test_workspace_chunking_bounds_the_column_buffer(monkeypatch):
    # with a tiny budget the column buffer holds one sample and one tap at a time
    from convgrad.kernels import im2col
    seen = []
    real = im2col._im2col

    def spy(x, geom, taps):
        col = real(x, geom, taps)
        seen.append(col.nbytes)
        return col

    monkeypatch.setattr(im2col, "_im2col", spy)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 10, 10)).astype(np.float32)
    dy = rng.standard_normal((3, 5, 8, 8)).astype(np.float32)
    want = convgrad.conv_weight_grad(x, dy, (5, 4, 3, 3))
    seen.clear()
    with convgrad.config(algo="im2col", workspace_bytes=4 * 8 * 8 * 4):
        got = convgrad.conv_weight_grad(x, dy, (5, 4, 3, 3))
    assert max(seen) <= 4 * 8 * 8 * 4 and len(seen) == 3 * 9
    assert_close(got, want, np.float32)


@pytest.mark.parametrize("out_sizes", [(224, 224), (56, 56, 56)], ids=["2-D", "3-D"])
def test_few_small_groups_go_to_the_grouped_kernel(out_sizes):
    """The GroupConvolutionBackpropData spec op's convolution (4 groups of 2 -> 5
    channels, stride 2): ``auto`` takes the native grouped kernel for all three
    ops (without the native engine, the direct kernel: measured 1.2-3.6x faster
    than the shifted kernel's per-group GEMMs, kernels/chooser.py); GEMM-shaped
    groups go to the native engine (or, without it, to the GEMM kernels)."""
    r = len(out_sizes)
    in_sizes = tuple(2 * s - 1 for s in out_sizes)
    common = dict(n=1, kernel=(3,) * r, strides=(2,) * r, dilations=(1,) * r,
                  pads_begin=(1,) * r, pads_end=(1,) * r, in_sizes=in_sizes,
                  out_sizes=out_sizes)
    small = make_geometry("test", c=8, o=20, groups=4, **common)
    wide = make_geometry("test", c=128, o=128, groups=2, **common)
    for op in ("fwd", "wgrad", "dgrad"):
        small_want = "grouped" if native.available() is None else "direct"
        assert kernels.select(op, small, np.float32).name == small_want, op
        want = ("native",) if native.available() is None else ("shifted", "im2col")
        assert kernels.select(op, wide, np.float32).name in want, op
