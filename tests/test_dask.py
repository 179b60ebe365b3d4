"""convgrad.dask: the spec ops on Dask arrays.

- Any chunking (chunks of one element, smaller than the kernel's reach,
  strides that do not divide them, random cuts) gives the local result:
  hypothesis over canonical problems on the synchronous scheduler, compared
  with the independent float64 reference (tests/naive.py) and the local call.
- Every spec op, every corner of ``convgrad vectors``, on a
  ``dask.distributed.LocalCluster`` of several worker processes.
- Dtypes, layouts, errors, adjointness, and the structure of the graphs:
  no task reads more than its chunk and halo, weight gradients are a tree of
  at most SPLIT_EVERY-way sums, data results are chunked like their input.
"""

import os

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
import dask  # noqa: E402
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import convgrad  # noqa: E402
import convgrad.dask as cgd  # noqa: E402
from convgrad import ConvGradError, ConvGradTypeError  # noqa: E402
from convgrad.cli import vectors  # noqa: E402
from convgrad.dask import _graph  # noqa: E402
from convgrad.dtypes import bfloat16  # noqa: E402
from convgrad.geometry import effective_kernel  # noqa: E402

import naive  # noqa: E402
from conftest import assert_close  # noqa: E402
from test_properties import problems  # noqa: E402

# one cluster for the whole module: keep its tests on one xdist worker
pytestmark = pytest.mark.xdist_group("dask-cluster")

EXAMPLES = int(os.environ.get("CONVGRAD_PROPERTY_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), database=None)


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                                  dashboard_address=":0", silence_logs=40) as cluster, \
            distributed.Client(cluster) as c:
        yield c


def chunking(rng, shape, max_chunks=24):
    """Random chunk sizes per axis -- whole, ones (short axes) or 1-3 random cuts --
    with at most ``max_chunks`` chunks in all (the cluster's per-task overhead)."""
    while True:
        out = []
        for size in shape:
            kind = rng.integers(3)
            if kind == 0 or size <= 1:
                out.append((size,))
            elif kind == 1 and size <= 3:
                out.append((1,) * size)
            else:
                cuts = sorted(rng.choice(np.arange(1, size), min(size - 1, rng.integers(1, 4)),
                                         replace=False))
                out.append(tuple(np.diff([0, *cuts, size]).tolist()))
        if np.prod([len(c) for c in out]) <= max_chunks:
            return tuple(out)


@st.composite
def chunkings(draw, shape):
    out = []
    for size in shape:
        kind = draw(st.integers(0, 3))
        if kind == 0 or size <= 1:
            out.append((size,))
        elif kind == 1:
            out.append((1,) * size)
        else:
            cuts = draw(st.sets(st.integers(1, size - 1), min_size=1))
            out.append(tuple(np.diff([0, *sorted(cuts), size]).tolist()))
    return tuple(out)


def attrs_of(p):
    return dict(strides=p.strides, pads_begin=p.pads_begin, pads_end=p.pads_end,
                dilations=p.dilations, groups=p.groups)


def ref_attrs(p):
    return dict(strides=p.strides, dilations=p.dilations, pads_begin=p.pads_begin,
                groups=p.groups)


# ----------------------------------------------------------------------------
# Any chunking: the three canonical ops, synchronous scheduler
# ----------------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_any_chunking_gives_the_reference(data):
    p = data.draw(problems())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((p.n, p.c, *p.in_sizes))
    w = rng.standard_normal((p.o, p.c // p.groups, *p.kernel))
    dy = rng.standard_normal((p.n, p.o, *p.out_sizes))
    X = da.from_array(x, chunks=data.draw(chunkings(x.shape)))
    DY = da.from_array(dy, chunks=data.draw(chunkings(dy.shape)))
    W = da.from_array(w, chunks=data.draw(chunkings(w.shape)))
    a = attrs_of(p)
    with dask.config.set(scheduler="synchronous"):
        y, dw, dx = dask.compute(cgd.conv_forward(X, W, **a),
                                 cgd.conv_weight_grad(X, DY, w.shape, **a),
                                 cgd.conv_data_grad(W, DY, x.shape, **a))
    r = ref_attrs(p)
    assert_close(y, naive.forward(x, w, p.out_sizes, **r))
    assert_close(dw, naive.wgrad(x, dy, p.kernel, **r))
    assert_close(dx, naive.dgrad(w, dy, p.in_sizes, **r))


@SETTINGS
@given(data=st.data())
def test_float32_blocks_match_the_local_call(data):
    """float32: the blocked result is the local one up to float32 summation order
    (bitwise for data results, whose blocks each sum the same terms)."""
    p = data.draw(problems(ranks=(1, 2)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((p.n, p.c, *p.in_sizes)).astype(np.float32)
    w = rng.standard_normal((p.o, p.c // p.groups, *p.kernel)).astype(np.float32)
    dy = rng.standard_normal((p.n, p.o, *p.out_sizes)).astype(np.float32)
    a = attrs_of(p)
    X = da.from_array(x, chunks=data.draw(chunkings(x.shape)))
    DY = da.from_array(dy, chunks=data.draw(chunkings(dy.shape)))
    with dask.config.set(scheduler="synchronous"), convgrad.config(algo="reference"):
        dw = cgd.conv_weight_grad(X, DY, w.shape, **a).compute()
        dx = cgd.conv_data_grad(w, DY, x.shape, **a).compute()
        y = cgd.conv_forward(X, w, **a).compute()
        assert dw.dtype == dx.dtype == y.dtype == np.float32
        assert_close(dw, convgrad.conv_weight_grad(x, dy, w.shape, **a), np.float32)
        np.testing.assert_array_equal(dx, convgrad.conv_data_grad(w, dy, x.shape, **a))
        np.testing.assert_array_equal(y, convgrad.conv_forward(x, w, **a))


# ----------------------------------------------------------------------------
# Every spec op, every corner, on a LocalCluster of worker processes
# ----------------------------------------------------------------------------


def _vector_cases(rng, every_corner: bool):
    """(label, lazy result, expected) for every spec op, on the corners of
    ``convgrad vectors`` (asymmetric pads, stride 2, dilation 2, groups,
    depthwise, odd same_upper/same_lower, valid, output_padding; NCX/NXC and
    every weight format), inputs randomly chunked; expected from the float64
    reference kernel."""
    out = []
    for k, name in enumerate(vectors.all_ops()):
        n = len(vectors.CORNERS)
        for i in (range(n) if every_corner else (k % n, (k + 4) % n)):
            case = vectors.build(name, i, rng, np.dtype(np.float32))
            inputs = [da.from_array(v, chunks=chunking(rng, v.shape))
                      if isinstance(v, np.ndarray) else v for _, v in case["inputs"]]
            lazy = cgd.op(name, **case["attrs"])(*inputs)
            assert lazy.shape == case["expected"].shape, (name, case["corner"])
            out.append((f"{name} {case['corner']}", lazy, case["expected"]))
    return out


def _check_cases(cases, got):
    for (label, _, want), g in zip(cases, got):
        assert g.dtype == np.float32, label
        assert_close(g, want, np.float32, tol=5e-5)


def test_every_op_and_corner_on_the_threaded_scheduler():
    """All 20 spec ops x all 9 corners, blocks running concurrently in threads
    (Dask's default scheduler)."""
    cases = _vector_cases(np.random.default_rng(6), every_corner=True)
    _check_cases(cases, dask.compute(*[c[1] for c in cases], scheduler="threads",
                                     num_workers=4))


def test_every_op_on_a_local_cluster(client):
    """All 20 spec ops, two corners each (rotating through the nine), on 3
    worker processes."""
    cases = _vector_cases(np.random.default_rng(16), every_corner=False)
    _check_cases(cases, client.compute([c[1] for c in cases], sync=True))


REQUIRED = [
    # the ops: oneDNN weight gradients (conv and ConvTranspose), OpenVINO
    # GroupConvolutionBackpropData; in both data layouts
    ("onednn:ConvolutionBackwardWeights", "NXC", "XIO"),
    ("onednn:ConvolutionBackwardWeights", "NCX", "OIX"),
    ("onednn:ConvolutionBackpropFilters", "NXC", "XIO"),
    ("onednn:ConvTransposeBackpropFilters", "NCX", "OIX"),
    ("onednn:ConvTransposeBackpropFilters", "NXC", "XIO"),
]


@pytest.mark.parametrize("name,data_format,fmt", REQUIRED)
def test_weight_gradients_over_batch_and_space_chunks(client, name, data_format, fmt):
    """A 3-D grouped, strided, dilated weight gradient with batch and spatial
    chunks smaller than the kernel's reach and not multiples of the stride."""
    rng = np.random.default_rng(len(name) + len(fmt))
    g, cg, og, k = 2, 3, 2, (3, 2, 3)
    strides, dil, pb, pe = (2, 1, 3), (1, 2, 1), (1, 0, 2), (0, 1, 1)
    n, sizes = 5, (9, 8, 10)
    transpose = "Transpose" in name
    w_canon = (g * og, cg, *k)
    attrs = dict(strides=list(strides), dilations=list(dil), pads_begin=list(pb),
                 pads_end=list(pe), groups=g, data_format=data_format)
    fmt_key = "filter_format" if "Filters" in name else "weights_format"
    attrs[fmt_key] = fmt
    fwd = {k_: v for k_, v in attrs.items() if k_ != fmt_key} | {"weights_format": fmt}
    layouts = convgrad.layouts
    wl = (layouts.CONVT_WEIGHTS if transpose else layouts.CONV_WEIGHTS)[fmt]
    w_shape = wl.spec_shape(w_canon, g)

    def nxc(shape):
        return (shape[0], *shape[2:], shape[1]) if data_format == "NXC" else tuple(shape)

    x_shape = nxc((n, g * cg, *sizes))
    if transpose:      # src is dy-like, diff_dst x-like
        y = convgrad.op("onednn:Convolution", **{**fwd, "weights_format": "OIX"}).infer_shape(
            nxc((n, g * cg, *sizes)), w_canon)
        src_shape, dst_shape = y, x_shape
    else:
        src_shape = x_shape
        dst_shape = convgrad.op("onednn:Convolution", **fwd).infer_shape(x_shape, w_shape)
    src = rng.standard_normal(src_shape).astype(np.float32)
    dst = rng.standard_normal(dst_shape).astype(np.float32)
    spec = convgrad.op(name, **attrs)
    inputs = {"onednn:ConvolutionBackwardWeights": (src, dst, list(w_shape)),
              "onednn:ConvolutionBackpropFilters": (src, list(w_shape), dst),
              "onednn:ConvTransposeBackpropFilters": (src, dst, list(w_shape))}[name]
    want = spec(*inputs)
    chunked = [da.from_array(v, chunks=(2, 4, 2, 3, 3))
               if isinstance(v, np.ndarray) else v for v in inputs]
    got = cgd.op(name, **attrs)(*chunked)
    assert got.chunks == tuple((s,) for s in want.shape)
    assert_close(client.compute(got, sync=True), want, np.float32)


@pytest.mark.parametrize("output_shape", [None, [17, 15, 16]])
def test_group_convolution_backprop_data_on_a_cluster(client, output_shape):
    """The spec example's op in 3-D: 4 groups of 5 -> 2 channels, stride 2, pads
    1 (and with an output_shape under same_upper)."""
    rng = np.random.default_rng(3)
    data = rng.standard_normal((2, 20, 8, 7, 8)).astype(np.float32)
    filt = rng.standard_normal((4, 5, 2, 3, 3, 3)).astype(np.float32)
    attrs = dict(strides=[2, 2, 2], pads_begin=[1, 1, 1], pads_end=[1, 1, 1],
                 dilations=[1, 1, 1])
    if output_shape is not None:
        attrs["auto_pad"] = "same_upper"
    args = (filt,) if output_shape is None else (filt, output_shape)
    want = convgrad.openvino.group_convolution_backprop_data(data, *args, **attrs)
    D = da.from_array(data, chunks=(1, 20, 3, 2, 5))
    got = cgd.openvino.group_convolution_backprop_data(D, *args, **attrs)
    assert got.shape == want.shape
    assert len(got.chunks[2]) == len(D.chunks[2])     # chunks follow the input's
    # each block may pick another kernel than the whole call: float32 summation order
    assert_close(client.compute(got, sync=True), want, np.float32)


@pytest.mark.parametrize("dtype", [np.float16, bfloat16, np.float64])
def test_dtypes_on_a_cluster(client, dtype):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 6, 11, 9)).astype(dtype)
    dy = rng.standard_normal((3, 9, 6, 9)).astype(dtype)
    w = rng.standard_normal((9, 2, 3, 3)).astype(dtype)
    a = dict(strides=[2, 1], pads_begin=[1, 1], pads_end=[1, 1], groups=3)
    X = da.from_array(x, chunks=(2, 6, 4, 3))
    DY = da.from_array(dy, chunks=(1, 9, 2, 4))
    dw, dx = client.compute([cgd.conv_weight_grad(X, DY, w.shape, **a),
                             cgd.conv_data_grad(w, DY, x.shape, **a)], sync=True)
    assert dw.dtype == dx.dtype == np.dtype(dtype)
    r = dict(strides=(2, 1), dilations=(1, 1), pads_begin=(1, 1), groups=3)
    assert_close(dw, naive.wgrad(x, dy, (3, 3), **r), dtype)
    assert_close(dx, naive.dgrad(w, dy, (11, 9), **r), dtype)


def test_integers_saturate_once_after_the_whole_sum(client):
    """OpenVINO integer convolutions: partial sums stay exact (int64) and the
    result saturates once, as the local call does."""
    rng = np.random.default_rng(8)
    data = rng.integers(60, 127, (2, 4, 12, 12)).astype(np.int8)
    filt = rng.integers(60, 127, (6, 4, 3, 3)).astype(np.int8)
    a = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
    want = convgrad.openvino.convolution(data, filt, **a)
    got = cgd.openvino.convolution(da.from_array(data, chunks=(1, 4, 5, 7)), filt, **a)
    np.testing.assert_array_equal(client.compute(got, sync=True), want)
    assert want.max() == 127       # the case does saturate


def test_adjoint_identities_on_a_cluster(client):
    """<conv(x,w),dy> = <x,dgrad(w,dy)> = <w,wgrad(x,dy)> in float64, 3-D,
    grouped, strided, dilated, asymmetric pads, odd chunks."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 4, 9, 7, 8))
    w = rng.standard_normal((6, 2, 2, 3, 3))
    a = dict(strides=[2, 1, 3], pads_begin=[0, 2, 1], pads_end=[1, 0, 2],
             dilations=[1, 2, 1], groups=2)
    X = da.from_array(x, chunks=(2, 3, 4, 2, 3))
    Y = cgd.conv_forward(X, w, **a)
    dy = rng.standard_normal(Y.shape)
    DY = da.from_array(dy, chunks=(1, 6, 2, 3, 1))
    y, dx, dw = client.compute([Y, cgd.conv_data_grad(w, DY, x.shape, **a),
                                cgd.conv_weight_grad(X, DY, w.shape, **a)], sync=True)
    lhs = float(np.vdot(y, dy))
    assert np.isclose(lhs, np.vdot(x, dx), rtol=1e-12)
    assert np.isclose(lhs, np.vdot(w, dw), rtol=1e-12)


def test_weight_gradient_is_reproducible_on_a_cluster(client):
    """The tree reduction adds partials in a fixed order: repeated runs give the
    same bits, wherever the blocks ran."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((8, 16, 20, 20)).astype(np.float32)
    dy = rng.standard_normal((8, 16, 20, 20)).astype(np.float32)
    X = client.persist(da.from_array(x, chunks=(2, 16, 7, 20)))
    DY = client.persist(da.from_array(dy, chunks=(2, 16, 7, 20)))
    dw = cgd.conv_weight_grad(X, DY, (16, 16, 3, 3), strides=[1, 1], pads_begin=[1, 1],
                              pads_end=[1, 1])
    first = client.compute(dw, sync=True)
    second = client.compute(dw, sync=True)
    np.testing.assert_array_equal(first, second)
    assert_close(first, convgrad.conv_weight_grad(x, dy, (16, 16, 3, 3), strides=[1, 1],
                                                  pads_begin=[1, 1], pads_end=[1, 1]),
                 np.float32)


# ----------------------------------------------------------------------------
# Graph structure: windows, the reduction tree, output chunks
# ----------------------------------------------------------------------------


def _tasks(arr):
    """``key -> (function, args)`` of the graph's tuple tasks (as convgrad.dask
    writes them)."""
    return {k: (t[0], t[1:]) for k, t in dict(arr.__dask_graph__()).items()
            if isinstance(t, tuple) and t and callable(t[0])}


def test_weight_gradient_blocks_read_their_chunk_and_halo_only():
    """No block task reads more of x than its chunk plus the kernel's halo,
    however small the chunks (here smaller than the reach), and the partial
    gradients are summed in a tree of at most SPLIT_EVERY-way sums."""
    k, s, d, pb = 3, 2, 2, 2
    ke = effective_kernel(k, d)
    X = da.zeros((4, 3, 40, 33), chunks=(1, 3, 3, 4), dtype=np.float32)
    out_h = (40 + 2 * pb - ke) // s + 1
    out_w = (33 + 2 * pb - ke) // s + 1
    DY = da.zeros((4, 5, out_h, out_w), chunks=(1, 5, 5, 3), dtype=np.float32)
    dw = cgd.conv_weight_grad(X, DY, (5, 3, k, k), strides=[s, s], pads_begin=[pb, pb],
                              pads_end=[pb, pb], dilations=[d, d])
    tasks = _tasks(dw)
    blocks = [args for f, args in tasks.values() if f is _graph.run_block]
    assert blocks, "no block tasks found in the graph"
    for block, a_keys, _ in blocks:
        n, c, *window = block.a.shape
        assert n == 1 and c == 3
        # the chunk (at most 3 x 4) and the halo Ke - 1, never more
        assert window[0] <= 3 + ke - 1 and window[1] <= 4 + ke - 1, window
        # ... which spans at most ceil((window - 1) / chunk) + 1 chunks per axis
        assert len(a_keys) <= (-(-(3 + ke - 2) // 3) + 1) * (-(-(4 + ke - 2) // 4) + 1)
    # pieces of other chunks are cut where the chunk lives: only they travel
    cuts = {k: args for k, (f, args) in tasks.items() if f is _graph.cut}
    assert cuts and all(k[0] in (X.name, DY.name) for k, _ in cuts.values())
    for _, a_keys, _ in blocks:
        for key in a_keys:
            if key in cuts:
                piece = np.prod([s_.stop - s_.start for s_ in cuts[key][1]])
                chunk = np.prod([X.chunks[i][j] for i, j in enumerate(cuts[key][0][1:])])
                assert 2 * piece < chunk
            else:
                assert key[0] == X.name
    n_blocks = len(blocks)
    assert n_blocks > _graph.SPLIT_EVERY ** 2
    sums = {k: args for k, (f, args) in tasks.items() if f is _graph.sum_partials}
    levels = {k[0] for k in sums}
    assert len(levels) == int(np.ceil(np.log(n_blocks) / np.log(_graph.SPLIT_EVERY)))
    assert all(1 <= len(args[0]) <= _graph.SPLIT_EVERY for args in sums.values())
    roots = [args for f, args in tasks.values() if f is _graph.finish_weights]
    assert len(roots) == 1 and roots[0][0] in sums
    x = np.random.default_rng(0).standard_normal(X.shape).astype(np.float32)
    dy = np.random.default_rng(1).standard_normal(DY.shape).astype(np.float32)
    got = cgd.conv_weight_grad(da.from_array(x, chunks=X.chunks),
                               da.from_array(dy, chunks=DY.chunks), (5, 3, k, k),
                               strides=[s, s], pads_begin=[pb, pb], pads_end=[pb, pb],
                               dilations=[d, d]).compute(scheduler="synchronous")
    assert_close(got, naive.wgrad(x, dy, (k, k), strides=(s, s), dilations=(d, d),
                                  pads_begin=(pb, pb), groups=1), np.float32)


def test_data_results_are_chunked_like_their_input():
    """y follows x's chunks and dx follows dy's, matched at the window centres
    (output p <-> input p*s + (Ke-1)//2 - pb): the identity for 'same' pads at
    stride 1, so a forward/backward round trip keeps the chunks."""
    X = da.zeros((2, 4, 30, 12), chunks=(1, 4, (7, 8, 9, 6), (5, 7)), dtype=np.float32)
    w = np.zeros((4, 4, 3, 3), np.float32)
    a = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1])
    Y = cgd.conv_forward(X, w, **a)
    assert Y.chunks == ((1, 1), (4,), (7, 8, 9, 6), (5, 7))
    DX = cgd.conv_data_grad(w, Y, X.shape, **a)
    assert DX.chunks == X.chunks
    # stride 2, pads 1, kernel 3: centres at 2p, so dy boundaries 4, 8 -> 8, 16
    DY = da.zeros((2, 4, 15, 6), chunks=(2, 4, (4, 4, 7), (6,)), dtype=np.float32)
    b = dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1])
    DX2 = cgd.conv_data_grad(w, DY, (2, 4, 30, 12), **b)
    assert DX2.chunks[2] == (8, 8, 14) and DX2.chunks[3] == (12,)
    Y2 = cgd.conv_forward(DX2, w, **b)
    assert Y2.chunks[2] == DY.chunks[2]
    # valid padding, kernel 5 (centre offset 2): x boundary 10 -> output 8
    V = cgd.conv_forward(da.zeros((1, 1, 20), chunks=10, dtype=np.float32),
                         np.zeros((1, 1, 5), np.float32), strides=[1])
    assert V.chunks[2] == (8, 8)


def _own_tasks(arr, *inputs) -> int:
    """Tasks of ``arr``'s graph that are not chunks of ``inputs``."""
    from convgrad.bench.cluster import key_name
    names = {a.name for a in inputs}
    return sum(1 for k in dict(arr.__dask_graph__()) if key_name(k) not in names)


def test_channels_last_needs_no_layout_tasks():
    """A data layout is an axis permutation applied inside each block's task: an
    NXC call builds exactly as many tasks as the same NCX call (no transpose
    task per chunk), its data results are chunked like its input in its own
    axis order, and the values are the local call's."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 10, 9, 4)).astype(np.float32)          # NXC
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)           # OIX
    dy = rng.standard_normal((3, 10, 9, 6)).astype(np.float32)
    a = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
             weights_format="OIX")
    nxc_chunks, dy_chunks = (2, (4, 6), (5, 4), 4), (2, (3, 7), 9, 6)

    def ncx(v):
        return np.ascontiguousarray(v.transpose(0, 3, 1, 2))

    def ncx_chunks(c):
        return (c[0], c[3], c[1], c[2])

    results = {}
    for fmt, xv, dyv, xc, dyc in (("NXC", x, dy, nxc_chunks, dy_chunks),
                                  ("NCX", ncx(x), ncx(dy), ncx_chunks(nxc_chunks),
                                   ncx_chunks(dy_chunks))):
        X, DY = da.from_array(xv, chunks=xc), da.from_array(dyv, chunks=dyc)
        f = dict(a, data_format=fmt)
        lazy = (cgd.onednn.convolution(X, w, **f),
                cgd.onednn.convolution_backward_weights(X, DY, list(w.shape), **f),
                cgd.onednn.convolution_backward_data(DY, w, list(xv.shape), **f))
        results[fmt] = [(_own_tasks(r, X, DY), r) for r in lazy]
        for r, want in zip(lazy, (convgrad.onednn.convolution(xv, w, **f),
                                  convgrad.onednn.convolution_backward_weights(
                                      xv, dyv, list(w.shape), **f),
                                  convgrad.onednn.convolution_backward_data(
                                      dyv, w, list(xv.shape), **f))):
            assert_close(r.compute(scheduler="synchronous"), want, np.float32)
    for (n_nxc, _), (n_ncx, _) in zip(results["NXC"], results["NCX"]):
        assert n_nxc == n_ncx
    y, _, dx = (r for _, r in results["NXC"])
    assert y.chunks == ((2, 1), (4, 6), (5, 4), (6,))          # like x, 'same' at stride 1
    assert dx.chunks == ((2, 1), (3, 7), (9,), (4,))           # like dy


# ----------------------------------------------------------------------------
# The front-end: validation at build time, inputs untouched, shape inference
# ----------------------------------------------------------------------------


def test_bad_attributes_fail_when_the_graph_is_built():
    X = da.zeros((1, 4, 8, 8), chunks=2, dtype=np.float32)
    DY = da.zeros((1, 4, 8, 8), chunks=2, dtype=np.float32)
    with pytest.raises(ConvGradError, match="strides"):
        cgd.onednn.convolution_backward_weights(X, DY, [4, 4, 3, 3], strides=[0, 1],
                                                pads_begin=[1, 1], pads_end=[1, 1],
                                                data_format="NCX", weights_format="OIX")
    with pytest.raises(ConvGradError, match="diff_dst"):
        cgd.onednn.convolution_backward_weights(X, DY[:, :, :7], [4, 4, 3, 3], strides=[1, 1],
                                                pads_begin=[1, 1], pads_end=[1, 1],
                                                data_format="NCX", weights_format="OIX")
    with pytest.raises(ConvGradTypeError, match="same dtype"):
        cgd.conv_weight_grad(X, DY.astype(np.float64), [4, 4, 3, 3], strides=[1, 1],
                             pads_begin=[1, 1], pads_end=[1, 1])
    unknown = X[X[:, 0, 0, 0] > 0]
    with pytest.raises(ConvGradError, match="chunks of x.*compute_chunk_sizes"):
        cgd.conv_weight_grad(unknown, DY, [4, 4, 3, 3], strides=[1, 1],
                             pads_begin=[1, 1], pads_end=[1, 1])


@pytest.mark.parametrize("name", ["convolution", "conv_transpose"])
def test_inputs_are_not_modified_and_bias_is_added_per_block(client, name):
    """Bias reaches every output position, also blocks that read only padding
    (forward) and positions no input reaches (ConvTranspose, stride 3 > kernel 2)."""
    rng = np.random.default_rng(11)
    src = rng.standard_normal((2, 9, 9, 3)).astype(np.float32)
    w = rng.standard_normal((2, 2, 3, 4)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    keep = [a.copy() for a in (src, w, bias)]
    a = dict(strides=[3, 2], pads_begin=[3, 0], pads_end=[3, 1], data_format="NXC",
             weights_format="XIO" if name == "convolution" else "XOI")
    if name == "conv_transpose":
        a.update(pads_begin=[0, 0], pads_end=[0, 1])
        w = w.transpose(0, 1, 3, 2).copy()      # XOI (KH, KW, O, I): O = 4, I = 3
        keep[1] = w.copy()
    local = getattr(convgrad.onednn, name)
    want = local(src, w, bias, **a)
    S = da.from_array(src, chunks=(1, 2, 4, 3))
    got = client.compute(getattr(cgd.onednn, name)(S, w, bias, **a), sync=True)
    assert_close(got, want, np.float32)
    for a_, k in zip((src, w, bias), keep):
        np.testing.assert_array_equal(a_, k)


def test_op_registry_and_shape_inference():
    op = cgd.op("GroupConvolutionBackpropData", strides=[2, 2, 2], pads_begin=[1, 1, 1],
                pads_end=[1, 1, 1], dilations=[1, 1, 1])
    assert op.infer_shape((1, 20, 224, 224, 224), (4, 5, 2, 3, 3, 3)) == (1, 8, 447, 447, 447)
    data = da.zeros((1, 20, 224, 224, 224), chunks=(1, 20, 56, 56, 56), dtype=np.float32)
    out = op(data, np.zeros((4, 5, 2, 3, 3, 3), np.float32))
    assert out.shape == (1, 8, 447, 447, 447)
    assert out.chunks[2] == (112, 112, 112, 111)
    assert cgd.openvino.group_convolution_backprop_data.__name__ == \
        "group_convolution_backprop_data"
    assert set(cgd.onednn.__all__) == set(convgrad.onednn.__all__)
    assert set(cgd.tf.__all__) == set(convgrad.tf.__all__)


@pytest.mark.parametrize("x_shape,w_shape", [((0, 4, 6, 6), (2, 4, 3, 3)),
                                             ((2, 0, 6, 6), (2, 0, 3, 3)),
                                             ((2, 4, 6, 6), (0, 4, 3, 3))],
                         ids=["no samples", "no input channels", "no output channels"])
def test_empty_sizes_compute_as_locally(x_shape, w_shape):
    """D14: zero batch or channels compute (empty or zero results), blocked too."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    a = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1])
    y = convgrad.conv_forward(x, w, **a)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    X = da.from_array(x, chunks=(1, 2, 4, 3))
    DY = da.from_array(dy, chunks=(1, 2, 4, 3))
    with dask.config.set(scheduler="synchronous"):
        got = dask.compute(cgd.conv_forward(X, w, **a),
                           cgd.conv_weight_grad(X, DY, w.shape, **a),
                           cgd.conv_data_grad(w, DY, x.shape, **a))
    want = (y, convgrad.conv_weight_grad(x, dy, w.shape, **a),
            convgrad.conv_data_grad(w, dy, x.shape, **a))
    for g, e in zip(got, want):
        assert g.shape == e.shape
        np.testing.assert_array_equal(g, e)


# ----------------------------------------------------------------------------
# What travels between workers, and what a worker holds
# ----------------------------------------------------------------------------


def test_graph_traffic_counts_halos_and_the_reduction_tree():
    """1-D, kernel 3, pad 1, stride 1, 5 chunks of 8: every block but the edge
    ones reads one position from each neighbour, cut out where it lives (one
    halo piece of C channels per side); the 5 partials meet in one sum, which
    the root reads once."""
    from convgrad.bench.cluster import graph_traffic
    c, o, chunks = 3, 4, 5
    X = da.zeros((2, c, 8 * chunks), chunks=(2, c, 8), dtype=np.float32)
    DY = da.zeros((2, o, 8 * chunks), chunks=(2, o, 8), dtype=np.float32)
    dw = cgd.conv_weight_grad(X, DY, (o, c, 3), strides=[1], pads_begin=[1], pads_end=[1])
    t = graph_traffic(dw, {"x chunk": X, "dy chunk": DY})
    assert t["blocks"] == chunks
    assert t["by_kind"]["halo"] == 2 * (chunks - 1) * 2 * c * 4        # 2 samples, float32
    assert t["by_kind"]["x chunk"] == X.nbytes and t["by_kind"]["dy chunk"] == DY.nbytes
    assert t["by_kind"]["partial"] == (chunks + 1) * o * c * 3 * 4


def test_no_worker_gathers_the_input(client):
    """A weight gradient whose x and dy chunks live together (dy made from x, where
    x is), on 3 workers: what travels is halo pieces cut where their chunk lives,
    partial gradients, and whole chunks only where Dask itself chose to run a
    block away from its chunks (it balances load); no worker receives more than
    a fraction of the input."""
    from convgrad.bench.cluster import TransferMeter, graph_traffic
    X = da.random.default_rng(14).standard_normal((6, 8, 48, 40), dtype=np.float32,
                                                   chunks=(2, 8, 16, 20))
    DY = da.map_blocks(np.sin, X)                 # 'same' pads, stride 1: dy chunks as x's
    X, DY = client.persist([X, DY])
    distributed.wait([X, DY])
    dw = cgd.conv_weight_grad(X, DY, (8, 8, 3, 3), strides=[1, 1], pads_begin=[1, 1],
                              pads_end=[1, 1])
    meter = TransferMeter(client, {X.name: "x chunk", DY.name: "dy chunk"})
    meter.start()
    got = client.compute(dw, sync=True)
    moved = meter.stop()
    bound = graph_traffic(dw, {"x chunk": X, "dy chunk": DY})["by_kind"]
    kinds = moved["by_kind"]
    assert set(kinds) <= {"halo", "partial", "x chunk", "dy chunk"}, kinds
    assert kinds.get("halo", 0) > 0               # 18 blocks on 3 workers share edges
    assert kinds.get("halo", 0) <= 2 * bound["halo"]
    assert kinds.get("partial", 0) <= 2 * bound["partial"]
    assert len(moved["by_worker"]) == 3
    assert max(moved["by_worker"].values()) < 0.5 * (X.nbytes + DY.nbytes), moved
    x, dy = X.compute(), DY.compute()
    assert_close(got, convgrad.conv_weight_grad(x, dy, (8, 8, 3, 3), strides=[1, 1],
                                                pads_begin=[1, 1], pads_end=[1, 1]),
                 np.float32)


def test_worker_peak_memory_follows_the_chunk_size(tmp_path):
    """The 3-D GroupConvolutionBackpropData spec op (4 groups of 5 -> 2 channels,
    stride 2), input made on the workers, result written block by block: with
    16^3 chunks no worker's peak rises by more than a small multiple of one
    block, far below the whole problem -- which one chunk needs."""
    from convgrad.bench.cluster import (BlockFiles, can_measure_peaks, local_cluster, peaks,
                                        reset_peaks)
    if not can_measure_peaks():
        pytest.skip("needs /proc/self/clear_refs (Linux)")
    filt = np.random.default_rng(15).standard_normal((4, 5, 2, 3, 3, 3)).astype(np.float32)
    attrs = dict(strides=[2, 2, 2], pads_begin=[1, 1, 1], pads_end=[1, 1, 1],
                 dilations=[1, 1, 1])
    shape = (1, 20, 64, 64, 64)
    whole = (4 * 20 * 64**3 + 4 * 8 * 127**3)          # input + output bytes
    rises = {}
    with local_cluster(2) as c:
        for chunk in (64, 16, 64, 16):                 # twice each: the last of each counts
            data = da.random.default_rng(16).standard_normal(
                shape, dtype=np.float32, chunks=(1, 20, chunk, chunk, chunk))
            out = cgd.openvino.group_convolution_backprop_data(data, filt, **attrs)
            target_dir = tmp_path / f"c{chunk}"
            target_dir.mkdir(exist_ok=True)
            target = BlockFiles(target_dir)
            base = reset_peaks(c)
            c.compute(da.store(out, target, lock=False, compute=False), sync=True)
            rises[chunk] = max(p["peak"] - base[w] for w, p in peaks(c).items())
            assert len(target.files()) == out.npartitions
    block = 4 * 20 * 18**3 + 4 * 8 * 32**3             # one window + one result block
    assert rises[64] > 0.9 * whole                     # one chunk: the whole problem
    assert rises[16] < 0.2 * whole, (rises, whole)
    assert rises[16] < 12 * block, (rises, block)
    full = np.zeros((1, 8, 127, 127, 127), np.float32)
    for starts, b in target.blocks():
        full[tuple(slice(s, s + n) for s, n in zip(starts, b.shape))] = b
    want = convgrad.openvino.group_convolution_backprop_data(
        data.compute(scheduler="threads"), filt, **attrs)
    assert_close(full, want, np.float32)
