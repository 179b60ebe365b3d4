"""Every registered kernel against the independent naive reference (tests/naive.py)
and against the package's float64 reference kernel, over a sweep of geometries."""

import numpy as np
import pytest

import convgrad
from convgrad import kernels, ops, settings
from convgrad.dtypes import bfloat16
from convgrad.geometry import make_geometry

import naive
from cases import arrays, attrs, case_id, random_case
from conftest import assert_close

CASES = [random_case(seed) for seed in range(60)]


def geometry(case):
    return make_geometry("test", **case)


_WEIGHTS = {"fwd": (False, True), "wgrad": (False, False), "dgrad": (True, False)}


def run(kernel, op, a, b, geom):
    """Call a kernel on canonical arrays, in its own layout; canonical result."""
    if kernel.layout == "ncx":
        return kernel.fn(a, b, geom)
    a, b = (np.ascontiguousarray(ops.to_nxc(t, is_w)) for t, is_w in zip((a, b), _WEIGHTS[op]))
    return ops.from_nxc(kernel.fn(a, b, geom), op == "wgrad")


@pytest.mark.parametrize("algo", kernels.names())
@pytest.mark.parametrize("case", CASES[:30], ids=case_id)
def test_kernel_matches_naive(algo, case, rng):
    x, w, dy = arrays(case, rng)
    geom = geometry(case)
    a = dict(strides=case["strides"], dilations=case["dilations"],
             pads_begin=case["pads_begin"], groups=case["groups"])
    for op, args, want in (
            ("fwd", (x, w), naive.forward(x, w, case["out_sizes"], **a)),
            ("wgrad", (x, dy), naive.wgrad(x, dy, case["kernel"], **a)),
            ("dgrad", (w, dy), naive.dgrad(w, dy, case["in_sizes"], **a))):
        kernel = kernels.select(op, geom, np.float64, algo)
        assert_close(run(kernel, op, *args, geom), want, np.float64)


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("workspace", [None, 1])
def test_im2col_matches_reference_canonical_api(case, workspace, rng):
    x, w, dy = arrays(case, rng, np.float32)
    kw = attrs(case)
    with convgrad.config(algo="reference"):
        want = (convgrad.conv_forward(x, w, **kw), convgrad.conv_weight_grad(x, dy, w.shape, **kw),
                convgrad.conv_data_grad(w, dy, x.shape, **kw))
    with convgrad.config(algo="im2col", workspace_bytes=workspace):
        got = (convgrad.conv_forward(x, w, **kw), convgrad.conv_weight_grad(x, dy, w.shape, **kw),
               convgrad.conv_data_grad(w, dy, x.shape, **kw))
    for g, r in zip(got, want):
        assert g.dtype == np.float32
        assert_close(g, r, np.float32)


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


@pytest.mark.parametrize("algo", kernels.names())
def test_integers_are_exact(algo):
    rng = np.random.default_rng(7)
    case = random_case(3)
    x, w, dy = (rng.integers(-50, 50, a.shape) for a in arrays(case, rng))
    geom = geometry(case)
    a = dict(strides=case["strides"], dilations=case["dilations"],
             pads_begin=case["pads_begin"], groups=case["groups"])
    reason = dict((k.name, r) for k, r in kernels.candidates("dgrad", geom, np.int64))[algo]
    if reason is not None:
        pytest.skip(f"{algo}: {reason}")
    got = run(kernels.select("dgrad", geom, np.int64, algo), "dgrad", w, dy, geom)
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
    with convgrad.config(algo="winograd"):
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
    with convgrad.config(workspace_bytes=4 * 8 * 8 * 4):
        got = convgrad.conv_weight_grad(x, dy, (5, 4, 3, 3))
    assert max(seen) <= 4 * 8 * 8 * 4 and len(seen) == 3 * 9
    assert_close(got, want, np.float32)


# The direct kernel (depthwise / small groups), on the geometries it is built
# for and their edges: (n, c, o, groups, in_sizes, kernel, strides, dilations,
# pads_begin, pads_end).
DIRECT_CASES = [
    (2, 6, 6, 6, (9, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),        # depthwise
    (2, 4, 12, 4, (9, 7), (3, 3), (2, 1), (1, 1), (1, 0), (1, 2)),       # multiplier 3
    (1, 8, 8, 2, (7, 9), (3, 3), (1, 2), (1, 1), (1, 1), (0, 1)),        # ResNeXt-like 4x4
    (1, 8, 20, 4, (11, 11), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),     # C/G 2, O/G 5
    (2, 5, 5, 5, (13,), (3,), (1,), (3,), (3,), (3,)),                   # 1-D dilated
    (1, 3, 6, 3, (5, 4, 6), (2, 3, 2), (1, 2, 1), (2, 1, 1), (1, 0, 2), (0, 1, 1)),  # 3-D
    (1, 4, 4, 4, (4, 5), (2, 2), (3, 1), (1, 1), (5, 6), (4, 5)),        # pads > kernel
    (2, 3, 3, 3, (6, 6), (3, 3), (3, 3), (2, 2), (0, 0), (0, 0)),        # stride > kernel
    (1, 17, 17, 17, (5, 19), (1, 5), (1, 1), (1, 1), (0, 2), (0, 2)),    # odd channel count
]


def direct_case(t):
    n, c, o, g, L, k, s, d, pb, pe = t
    out = tuple((li + b + e - (ki - 1) * di - 1) // si + 1
                for li, ki, si, di, b, e in zip(L, k, s, d, pb, pe))
    return dict(n=n, c=c, o=o, groups=g, in_sizes=L, kernel=k, out_sizes=out, strides=s,
                dilations=d, pads_begin=pb, pads_end=pe)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", [direct_case(t) for t in DIRECT_CASES], ids=case_id)
def test_direct_kernel_matches_naive(case, dtype, rng):
    x, w, dy = arrays(case, rng, dtype)
    geom = geometry(case)
    a = dict(strides=case["strides"], dilations=case["dilations"],
             pads_begin=case["pads_begin"], groups=case["groups"])
    for op, args, want in (
            ("fwd", (x, w), naive.forward(x, w, case["out_sizes"], **a)),
            ("wgrad", (x, dy), naive.wgrad(x, dy, case["kernel"], **a)),
            ("dgrad", (w, dy), naive.dgrad(w, dy, case["in_sizes"], **a))):
        got = run(kernels.select(op, geom, dtype, "direct"), op, *args, geom)
        assert got.dtype == dtype
        assert_close(got, want, dtype)


def test_direct_kernel_empty_sizes():
    case = direct_case((2, 4, 4, 4, (0, 5), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)))
    geom = geometry(case)
    x, w, dy = arrays(case, np.random.default_rng(0), np.float32)
    for op, args, shape in (("fwd", (x, w), dy.shape), ("wgrad", (x, dy), w.shape),
                            ("dgrad", (w, dy), x.shape)):
        got = run(kernels.select(op, geom, np.float32, "direct"), op, *args, geom)
        assert got.shape == shape and not got.any()


def test_direct_kernel_declines_large_groups_and_integers():
    dense = geometry(direct_case((1, 16, 16, 1, (5, 5), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))))
    with pytest.raises(convgrad.ConvGradError, match="C/G"):
        kernels.select("wgrad", dense, np.float32, "direct")
    small = geometry(direct_case((1, 4, 4, 4, (5, 5), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))))
    with pytest.raises(convgrad.ConvGradError, match="int64"):
        kernels.select("dgrad", small, np.int64, "direct")


@pytest.mark.parametrize("op", ["fwd", "wgrad", "dgrad"])
def test_direct_kernel_is_bitwise_deterministic_across_thread_counts(op, monkeypatch):
    # large enough for several threads and, in wgrad, many row chunks per thread
    case = direct_case((3, 24, 48, 12, (40, 33), (3, 3), (1, 2), (1, 1), (1, 1), (1, 1)))
    geom = geometry(case)
    x, w, dy = arrays(case, np.random.default_rng(1), np.float32)
    args = {"fwd": (x, w), "wgrad": (x, dy), "dgrad": (w, dy)}[op]
    kernel = kernels.select(op, geom, np.float32, "direct")
    results = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(settings, "threads", lambda t=threads: t, raising=False)
        results.append(run(kernel, op, *args, geom))
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
