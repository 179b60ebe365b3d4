"""The direct kernel (depthwise / small groups) against the independent naive
reference, on the geometries it is built for and their edges, and its
bitwise determinism across thread counts."""

import numpy as np
import pytest

import convgrad
from convgrad import kernels, ops, settings
from convgrad.geometry import make_geometry

import naive
from cases import arrays, case_id
from conftest import assert_close


def geometry(case):
    return make_geometry("test", **case)


def run(kernel, op, a, b, geom):
    return ops.run_kernel(kernel, a, b, geom, a.dtype)


# (n, c, o, groups, in_sizes, kernel, strides, dilations, pads_begin, pads_end)
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
    for op, args, want in naive.three_ops(x, w, dy, case):
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
    # and right: against the float64 reference kernel (many row chunks and blocks)
    a64 = tuple(t.astype(np.float64) for t in args)
    want = ops.run_kernel(kernels.select(op, geom, np.float64, "reference"), *a64, geom,
                          np.float64)
    assert_close(results[0], want, np.float32)


def test_direct_kernel_through_onednn_channels_last():
    # depthwise with multiplier 2, NXC data and XIO weights: no layout copy on the way
    rng = np.random.default_rng(5)
    src = rng.standard_normal((2, 15, 14, 6)).astype(np.float32)
    dd = rng.standard_normal((2, 8, 7, 12)).astype(np.float32)
    w = rng.standard_normal((3, 3, 1, 12)).astype(np.float32)
    kw = dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 0], groups=6)
    ncx = lambda t: np.moveaxis(t, -1, 1)                       # noqa: E731
    oix = w.transpose(3, 2, 0, 1)
    with convgrad.config(algo="direct"):
        dw = convgrad.onednn.convolution_backward_weights(src, dd, list(w.shape), **kw)
        dx = convgrad.onednn.convolution_backward_data(dd, w, list(src.shape), **kw)
    a = dict(strides=(2, 2), dilations=(1, 1), pads_begin=(1, 1), groups=6)
    assert_close(dw.transpose(3, 2, 0, 1), naive.wgrad(ncx(src), ncx(dd), (3, 3), **a),
                 np.float32)
    assert_close(ncx(dx),
                 naive.dgrad(oix, ncx(dd), (15, 14), **a), np.float32)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_direct_kernel_runs_in_a_forked_child():
    # the worker pool of the parent does not exist in a forked child: the child
    # must get its own instead of waiting for the parent's threads forever
    import multiprocessing
    case = direct_case((3, 24, 48, 12, (40, 33), (3, 3), (1, 2), (1, 1), (1, 1), (1, 1)))
    geom = geometry(case)
    x, w, dy = arrays(case, np.random.default_rng(2), np.float32)
    kernel = kernels.select("dgrad", geom, np.float32, "direct")
    want = run(kernel, "dgrad", w, dy, geom)              # starts the parent's pool
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_dgrad_in_child, (case, w, dy)).get(timeout=TIMEOUT)
    np.testing.assert_array_equal(got, want)


TIMEOUT = 120


def _dgrad_in_child(case, w, dy):
    geom = geometry(case)
    return run(kernels.select("dgrad", geom, np.float32, "direct"), "dgrad", w, dy, geom)
