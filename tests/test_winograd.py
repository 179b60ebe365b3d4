"""Winograd kernels (kernels/winograd.py, native/winograd.cpp) on every instruction-set
build this CPU runs and on the AVX-512 build's logic, against the independent naive
float64 reference (tests/naive.py): 1-D, 2-D and 3-D 3-tap stride-1 problems with any
dilation, asymmetric and large pads, groups, channel tails, F(6, 3) to F(2, 3), both
work decompositions of each op, float32/float16/bfloat16, channels-first and -last
callers; NaN/Inf semantics equal to the direct engine's (D17); results independent of
the thread count (D19); the error bound the chooser keeps (D24) and the model behind
it; the chooser and ``config(precision=...)``."""

import dataclasses
import math
import os

import numpy as np
import pytest

import convgrad
from convgrad import kernels, ops
from convgrad.dtypes import bfloat16
from convgrad.geometry import make_geometry
from convgrad.kernels import native, winograd

from cases import caller_arrays, reference_results
from conftest import assert_close, engine_dbg, recycled_results_and_decisions

if native.available() is not None:
    if os.environ.get("CONVGRAD_REQUIRE_PEERS") == "1":     # CI: the engine must build
        raise RuntimeError(f"the native engine is not available: {native.available()}")
    pytest.skip(f"native engine unavailable: {native.available()}", allow_module_level=True)

ISAS = native.info()["loaded"]


def geometry(r, *, n=2, c=8, o=12, size=9, kd=3, d=1, pb=1, pe=1, groups=1):
    """A Winograd problem: 3 taps along the last (1-D) or last two axes, kd along depth."""
    sizes = (size,) * r if isinstance(size, int) else tuple(size)
    dil = (d,) * r if isinstance(d, int) else tuple(d)
    if r == 3:
        dil = (1,) + dil[1:]
    kernel = ((kd,) if r == 3 else ()) + (3,) * min(r, 2)
    pbs = (pb,) * r if isinstance(pb, int) else tuple(pb)
    pes = (pe,) * r if isinstance(pe, int) else tuple(pe)
    out = tuple(L + b + e - (k - 1) * dd for L, b, e, k, dd in zip(sizes, pbs, pes, kernel, dil))
    return dict(n=n, c=c, o=o, groups=groups, in_sizes=sizes, kernel=kernel, out_sizes=out,
                strides=(1,) * r, dilations=dil, pads_begin=pbs, pads_end=pes)


def random_case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    r = int(rng.integers(1, 4))
    groups = int(rng.choice([1, 1, 2, 3]))
    d = tuple(int(v) for v in rng.integers(1, 5, r))
    kd = int(rng.integers(1, 4))
    top = {1: 60, 2: 19, 3: 8}[r]
    pb = tuple(int(v) for v in rng.integers(0, 5, r))
    pe = tuple(int(v) for v in rng.integers(0, 5, r))
    sizes = []
    for i in range(r):
        k = kd if (r == 3 and i == 0) else 3
        ke = (k - 1) * (1 if (r == 3 and i == 0) else d[i]) + 1
        lo = max(1, ke - pb[i] - pe[i])
        sizes.append(int(rng.integers(lo, max(lo, top) + 1)))
    return geometry(r, n=int(rng.integers(1, 3)), c=int(rng.integers(1, 20)) * groups,
                    o=int(rng.integers(1, 36)) * groups, size=sizes, kd=kd, d=d, pb=pb, pe=pe,
                    groups=groups)


def make_arrays(case, rng, dtype=np.float32, channels_last=False):
    """Channels-last callers hold XIO weights, as oneDNN / TensorFlow callers do."""
    return caller_arrays(case, rng, dtype, channels_last, xio_weights=channels_last)


def attrs(case):
    return {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}


def three(case, x, w, dy):
    kw = attrs(case)
    return (convgrad.conv_forward(x, w, **kw), convgrad.conv_weight_grad(x, dy, w.shape, **kw),
            convgrad.conv_data_grad(w, dy, x.shape, **kw))


def check(case, rng, *, dtype=np.float32, channels_last=False, isa="auto", threads=None):
    x, w, dy = make_arrays(case, rng, dtype, channels_last)
    want = reference_results(case, x, w, dy)
    with convgrad.config(algo="winograd", isa=isa, threads=threads):
        got = three(case, x, w, dy)
    for g, e in zip(got, want):
        assert g.dtype == np.dtype(dtype)
        assert_close(g, e, dtype)
    return got


@pytest.fixture(params=list(winograd.TILE_SIZES), ids=[f"F{m}" for m in winograd.TILE_SIZES])
def tile(request, monkeypatch):
    """Every tile size, whatever the chooser would take."""
    monkeypatch.setattr(winograd, "tile_size", lambda geom, op: request.param)
    return request.param


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("seed", range(12))
def test_every_build_matches_the_naive_reference(isa, seed, tile, rng):
    check(random_case(seed), rng, isa=isa, channels_last=seed % 2 == 0)


@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("seed", range(3))
def test_half_inputs_and_results(dtype, seed, rng):
    check(random_case(40 + seed), rng, dtype=dtype, channels_last=seed % 2 == 1)


# Shapes at the edges of the tiling: tiles wider than the image, dilations wider than the
# image (every tile a single output), pads past the kernel's reach (tiles of padding
# only), channel counts that leave tails in every vector and block, depth taps larger
# than the depth.
STRUCTURAL = {
    "tiny-image": geometry(2, c=5, o=7, size=2),
    "dilation-past-the-image": geometry(2, c=9, o=17, size=(6, 7), d=8, pb=8, pe=8),
    "padding-only-tiles": geometry(1, c=3, o=5, size=4, d=2, pb=9, pe=7),
    "channel-tails": geometry(2, c=19, o=37, size=13, pb=(0, 2), pe=(3, 1)),
    "deep-3d": geometry(3, c=6, o=10, size=(3, 7, 6), kd=3, d=(1, 2, 1), pb=(2, 1, 0)),
    "grouped-1d": geometry(1, c=12, o=30, size=41, d=3, pb=3, pe=3, groups=3),
    "many-blocks": geometry(2, n=1, c=40, o=100, size=(10, 11)),
}


@pytest.mark.parametrize("name", STRUCTURAL)
def test_structural_cases(name, tile, rng):
    check(STRUCTURAL[name], rng, channels_last=True)
    check(STRUCTURAL[name], rng)


def test_every_work_decomposition_agrees(rng, monkeypatch):
    """Forward / data: weights transformed once and shared, or the input transformed once
    per group of tiles (one group, several) with each block transforming its weights;
    weight gradient: partial sums per chunk of tiles, or boxes of channels."""
    # 48 tiles a plane: more than the widest register tile of any build (24 on AVX-512),
    # so a small shared_v budget must split them into several groups
    case = geometry(2, n=4, c=20, o=36, size=(14, 11), d=(1, 2))
    x, w, dy = make_arrays(case, rng)
    with convgrad.config(algo="reference"):
        want = three(case, x, w, dy)
    eng = native.engine()
    # (weights_l2: items of the "weights" regime grow to whole groups of tiles where
    # what their GEMMs keep in L2 fits that share of it, as it does here with the
    # default; 0: items of weights_tiles)
    for shared_u, shared_v, partials, box, weights_tiles, weights_l2 in (
            (2**30, 2**30, 2**30, 2**30, 64, 0), (0, 2**30, 0, 2**30, 64, 0.92),
            (0, 2**12, 0, 2**12, 64, 0), (0, 2**12, 0, 2**12, 5, 0)):
        monkeypatch.setattr(winograd, "SHARED_U_BYTES", shared_u)
        monkeypatch.setattr(winograd, "SHARED_V_BYTES", shared_v)
        monkeypatch.setattr(winograd, "PARTIALS_BYTES", partials)
        monkeypatch.setattr(winograd, "WGRAD_BOX_BYTES", box)
        monkeypatch.setattr(winograd, "ITEM_TILES", 7)
        monkeypatch.setattr(winograd, "WEIGHTS_ITEM_TILES", weights_tiles)
        monkeypatch.setattr(winograd, "WEIGHTS_ITEM_L2", weights_l2)
        geom = make_geometry("t", **case)
        for op in ("fwd", "dgrad"):
            plan = winograd.corr_plan(geom, op, eng.vl, winograd._mr_of(eng), 4,
                                      winograd._budgets())
            assert plan.regime == ("tiles" if shared_u else "weights")
            if not shared_u:
                assert (len(plan.groups_of_tiles) > 1) == (shared_v < 2**20)
                # each group's items, in order, cover all items
                bounds = [b for g in plan.group_items for b in g]
                assert bounds[0] == 0 and bounds[-1] == len(plan.items)
                assert all(a == b for a, b in zip(bounds[1:-1:2], bounds[2::2]))
                if weights_l2:           # (one item a group and output block: all its tiles)
                    for (s0, s1, _, _), (i0, i1) in zip(plan.groups_of_tiles,
                                                        plan.group_items):
                        assert (plan.items[i0:i1, :2] == (s0, s1)).all(), plan.items
                # groups of near-equal tiles, each cut into items of weights_tiles at most
                spans = [s1 - s0 for s0, s1, _, _ in plan.groups_of_tiles]
                assert max(spans) - min(spans) <= 1
                if not weights_l2:
                    blocks = len(plan.items) // sum(-(-t // weights_tiles) for t in spans)
                    assert [i1 - i0 for i0, i1 in plan.group_items] == [
                        blocks * -(-t // weights_tiles) for t in spans]
        plan = winograd.wgrad_plan(geom, eng.vl, 4, winograd._wgrad_budgets())
        assert (plan.parts > 0) == (partials > 0)
        with convgrad.config(algo="winograd"):
            got = three(case, x, w, dy)
        for g, e in zip(got, want):
            assert_close(g, e, np.float32)


def test_data_gradient_of_groups_of_tiles_with_unequal_items(rng, monkeypatch):
    """A data gradient whose transformed weights outgrow SHARED_U_BYTES: with the default
    budgets its 144 F(6, 3) tiles a plane are one group and one item per output block
    (each block's weights transformed once); with 8 MiB of transformed input, two
    groups of 72 (not 128 + 16: a short last group transformed the weights again for a
    few tiles); with a group budget of 30 tiles and items of 28, groups of 28 and 29
    tiles -- one item and two per output block (it once ran the second group's items
    from the first's count: wrong sums or a crash, 2026-11-27).  All equal to the direct
    kernels (precision="highest"; checked against the reference elsewhere)."""
    case = geometry(2, n=4, c=256, o=256, size=(33, 33))
    geom = make_geometry("t", **case)
    eng = native.engine()
    assert winograd.tile_size(geom, "dgrad") == 6 and winograd.preferred(geom, "dgrad")
    x, w, dy = make_arrays(case, rng)
    with convgrad.config(precision="highest"):
        want = convgrad.conv_data_grad(w, dy, x.shape, **attrs(case))
    blocks = -(-256 // (eng.vl * winograd.corr_plan(
        geom, "dgrad", eng.vl, winograd._mr_of(eng), 6, winograd._budgets()).nv))
    for budget, item_tiles, groups, items in ((None, None, [144], [1]),
                                              (128, None, [72, 72], [1, 1]),
                                              (30, 28, [28, 29, 29, 29, 29], [1, 2, 2, 2, 2])):
        if budget:
            monkeypatch.setattr(winograd, "SHARED_V_BYTES", budget * 4 * 64 * 256)
        if item_tiles:
            monkeypatch.setattr(winograd, "WEIGHTS_ITEM_TILES", item_tiles)
            monkeypatch.setattr(winograd, "WEIGHTS_ITEM_L2", 0)
        kernels.clear_choices()
        plan = winograd.corr_plan(geom, "dgrad", eng.vl, winograd._mr_of(eng), 6,
                                  winograd._budgets())
        assert plan.regime == "weights"
        assert [s1 - s0 for s0, s1, _, _ in plan.groups_of_tiles] == groups
        counts = [i1 - i0 for i0, i1 in plan.group_items]
        if item_tiles or native.l2_bytes() >= 2**20:    # (144 tiles fit 1.8 MiB)
            assert counts == [blocks * i for i in items]
        else:
            assert len(set(counts)) == 1
        with convgrad.config(algo="winograd"):
            got = convgrad.conv_data_grad(w, dy, x.shape, **attrs(case))
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < winograd.ERROR_BOUND
    kernels.clear_choices()


def test_buffered_results_keep_smaller_weights_items():
    """A result that goes through the items' buffers (channels-first or 16-bit: 36 x
    channels floats a tile) keeps the weights regime's items within
    WEIGHTS_ITEM_L2_BUFFERED of the L2: DeepLab's F(6, 3) data gradient in items of 72
    tiles (two a block), not 144, and a declared workspace that much smaller; a
    channels-last float32 result takes the 144."""
    geom = make_geometry("t", **geometry(2, n=4, c=256, o=256, size=33, d=6, pb=6, pe=6))
    eng = native.engine()
    plans = {b: winograd.corr_plan(geom, "dgrad", eng.vl, winograd._mr_of(eng), 6,
                                   winograd._budgets(), False, b) for b in (False, True)}
    assert [p.groups_of_tiles for p in plans.values()] == [((0, 144, 0, 1),)] * 2
    if native.l2_bytes() >= 2**20:                  # (144 tiles fit 1.8x, 72 1.2x the L2)
        assert len(plans[True].items) == 2 * len(plans[False].items)
        assert {int(b - a) for a, b in plans[True].items[:, :2]} == {72}
    plain = winograd.workspace(geom, "dgrad", packed_in=False, buffered_out=False)
    buffered = winograd.workspace(geom, "dgrad", packed_in=False, buffered_out=True)
    if native.l2_bytes() >= 2**20:
        # the buffers of 72 tiles (2.7 MB a thread), not 144 (5.3 MB)
        extra = buffered["per-thread scratch"] - plain["per-thread scratch"]
        assert extra <= native._threads(geom.flops) * 72 * 36 * 256 * 4 * 1.01
    c = np.zeros((2, 3), np.float32)
    assert winograd._buffered(c.astype(np.float16)) and not winograd._buffered(c)
    assert winograd._buffered(np.zeros((3, 2), np.float32).T)


@pytest.mark.parametrize("op", ["fwd", "dgrad"])
@pytest.mark.parametrize("dims", [dict(r=2, n=3, c=40, o=36, size=(30, 27)),
                                  dict(r=3, n=1, c=20, o=24, size=(10, 9, 11)),
                                  dict(r=1, n=5, c=24, o=40, size=300, d=3, pb=3, pe=3)],
                         ids=["2d", "3d", "1d-dilated"])
def test_correlation_items_run_a_task_each(op, dims, rng, monkeypatch):
    """Each work item of a Winograd correlation is a task of its own (ITEM_TASKS, taken
    from the pool's counter), on 1 to 3 threads: the same bits as ranges of consecutive
    items (the layout before)."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    dims = dict(dims)
    case = geometry(dims.pop("r"), **dims)
    x, w, dy = make_arrays(case, rng)
    tables = []
    real = winograd._item_ranges
    monkeypatch.setattr(winograd, "_item_ranges",
                        lambda *a: tables.append(real(*a)) or tables[-1])
    got = []
    for tasks, threads in ((True, 2), (True, 3), (True, 1), (False, 2)):
        monkeypatch.setattr(winograd, "ITEM_TASKS", tasks)
        tables.clear()
        with convgrad.config(algo="winograd", threads=threads):
            got.append(convgrad.conv_forward(x, w, **attrs(case)) if op == "fwd"
                       else convgrad.conv_data_grad(w, dy, x.shape, **attrs(case)))
        assert tables, "no Winograd items ran"
        sizes = {hi - lo for t in tables for lo, hi in t}
        assert sizes == {1} if tasks else max(sizes) >= 1
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])
    with convgrad.config(precision="highest"):
        want = (convgrad.conv_forward(x, w, **attrs(case)) if op == "fwd"
                else convgrad.conv_data_grad(w, dy, x.shape, **attrs(case)))
    assert np.linalg.norm(got[0] - want) / np.linalg.norm(want) < winograd.ERROR_BOUND


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype,channels_last", [(np.float32, False), (np.float16, False)])
def test_weight_gradient_items_convert_only_their_channels(isa, dtype, channels_last, rng,
                                                           monkeypatch):
    """Weight-gradient items of boxes that split the channels and the output blocks
    convert only their own channels of x and dy lines (NCX callers, float32 or 16-bit;
    engine debug bit 128: every channel): bit for bit the same, equal to the reference."""
    monkeypatch.setattr(winograd, "PARTIALS_BYTES", 0)
    monkeypatch.setattr(winograd, "WGRAD_BOX_BYTES", 2**13)
    case = geometry(2, n=2, c=40, o=72, size=(13, 10), d=(1, 2), pb=(1, 0), pe=(2, 1))
    x, w, dy = make_arrays(case, rng, dtype, channels_last)
    geom = make_geometry("t", **case)
    with convgrad.config(isa=isa):
        eng = native.engine()
        plan = winograd.wgrad_plan(geom, eng.vl, 4, winograd._wgrad_budgets())
        items = plan.items
        assert (items[:, 6] - items[:, 5] < 40).any() and (items[:, 8] - items[:, 7]
                                                          < plan.nob).any()
        want = reference_results(case, x, w, dy)[1]
        got = {}
        for bit in (0, 128):
            with convgrad.config(algo="winograd"), engine_dbg(bit):
                got[bit] = convgrad.conv_weight_grad(x, dy, w.shape, **attrs(case))
    assert_close(got[0], want, dtype)
    np.testing.assert_array_equal(got[0], got[128])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("r,c,size,d", [(1, 40, 37, 2), (2, 19, (11, 9), 1), (3, 24, (4, 6, 5), 2)],
                         ids=["1d", "2d-tails", "3d"])
@pytest.mark.parametrize("channels_last,regime", [(True, "tiles"), (False, "tiles"),
                                                  (True, "weights")])
def test_16bit_lines_and_weights_converted_in_the_loads(isa, dtype, r, c, size, d,
                                                        channels_last, regime, rng,
                                                        monkeypatch):
    """Channels-last float16 / bfloat16 lines are read in place, converted inside the
    transforms' loads (AVX-512 / AVX2 builds), and 16-bit weights -- XIO (rows
    contiguous) or OIX (taps contiguous), transformed once per call or by each item --
    are gathered 8 x 8 blocks at a time, widened and transposed; engine debug bit
    4194304 converts the lines into scratch first (as the portable build does) and the
    weights element by element: every op, both tile sizes, channel counts with tails and
    tiles past the edges -- the same bits both ways, equal to the reference."""
    if regime == "weights":
        monkeypatch.setattr(winograd, "SHARED_U_BYTES", 0)
    case = geometry(r, n=2, c=c, o=21, size=size, d=d, pb=2, pe=1)
    x, w, dy = make_arrays(case, rng, dtype, channels_last)
    assert winograd.corr_plan(make_geometry("t", **case), "dgrad", native.engine().vl,
                              winograd._mr_of(native.engine()), 4,
                              winograd._budgets()).regime == regime
    _same_bits_with_debug_bit(isa, 4194304, case, x, w, dy)


def test_items_take_more_tiles_when_the_transformed_weights_outgrow_l2(rng, monkeypatch):
    """Regime "tiles": while the transformed weights fit in half a core's L2 an item's
    transformed input stays within ITEM_V_BYTES; past it (every item streams all the
    weights) items take up to half the L2 of transformed input and LARGE_U_ITEM_TILES
    tiles -- with the same results, equal to the reference."""
    case = geometry(2, n=2, c=96, o=96, size=(30, 30))     # 1.3 MB of transformed weights
    x, w, dy = make_arrays(case, rng, np.float32, True)
    want = reference_results(case, x, w, dy)
    geom = make_geometry("t", **case)
    eng = native.engine()
    row_bytes = 4 * 36 * 96                        # one tile's transformed input (F(4, 3))
    got, tiles = {}, {}
    for l2 in (2**30, 2**21):
        monkeypatch.setattr(native, "l2_bytes", lambda l2=l2: l2)
        plan = winograd.corr_plan(geom, "dgrad", eng.vl, winograd._mr_of(eng), 4,
                                  winograd._budgets())
        assert plan.regime == "tiles"
        big_u = plan.u_floats * 4 > l2 // 2
        assert big_u == (l2 == 2**21)
        tiles[l2] = int((plan.items[:, 1] - plan.items[:, 0]).max())
        limit = max(winograd.ITEM_V_BYTES, l2 // 2) if big_u else winograd.ITEM_V_BYTES
        mr = winograd._mr_of(eng)[plan.nv - 1]
        assert tiles[l2] <= max(mr, limit // row_bytes)
        got[l2] = _winograd_with_tiles(4, case, x, w, dy)
    assert tiles[2**21] > 2 * tiles[2**30]
    for k in range(3):
        if k != 1:              # (the weight gradient's items grow too: see below)
            np.testing.assert_array_equal(got[2**21][k], got[2**30][k])
        assert_close(got[2**21][k], want[k], np.float32)


def test_weight_gradient_items_grow_when_the_partial_sums_outgrow_l2(rng, monkeypatch):
    """Partial sums (one set per part) larger than half a core's L2: items take about
    WGRAD_LARGE_SUMS_ITEMS times their bytes of transformed tiles, so each reads and
    writes them for many more tiles; the results stay equal to the reference and the
    same for every thread count (the parts and their items are fixed by the plan)."""
    case = geometry(2, n=2, c=96, o=96, size=(30, 30))     # F(4, 3): 1.3 MB of sums
    x, w, dy = make_arrays(case, rng, np.float32, True)
    want = reference_results(case, x, w, dy)[1]
    geom = make_geometry("t", **case)
    eng = native.engine()
    tiles = {}
    for l2 in (2**30, 2**21):
        monkeypatch.setattr(native, "l2_bytes", lambda l2=l2: l2)
        plan = winograd.wgrad_plan(geom, eng.vl, 4, winograd._wgrad_budgets())
        assert plan.parts == 2
        tiles[l2] = int((plan.items[:, 1] - plan.items[:, 0]).max())
        got = []
        for threads in (1, 2, 3):
            with convgrad.config(algo="winograd", threads=threads):
                winograd.tile_size, original = (lambda g, op: 4), winograd.tile_size
                try:
                    got.append(convgrad.conv_weight_grad(x, dy, w.shape, **attrs(case)))
                finally:
                    winograd.tile_size = original
        for g in got[1:]:
            np.testing.assert_array_equal(g, got[0])
        assert_close(got[0], want, np.float32)
    assert tiles[2**21] > 2 * tiles[2**30]


def test_l2_size_is_read_from_the_system():
    """A core's L2 from sysfs (cpu0's level-2 cache), else the documented default."""
    import glob
    sizes = []
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            if open(os.path.join(d, "level")).read().strip() == "2":
                text = open(os.path.join(d, "size")).read().strip().upper()
                sizes.append(int(text.rstrip("KM")) * {"K": 1024, "M": 2**20}.get(text[-1], 1))
        except OSError:
            pass
    assert native.l2_bytes() == (sizes[0] if sizes else native.L2_DEFAULT_BYTES)


def test_results_do_not_depend_on_the_thread_count(rng, monkeypatch):
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    cases = [geometry(2, n=3, c=24, o=40, size=23), geometry(3, n=1, c=8, o=16, size=(6, 9, 9)),
             geometry(1, n=4, c=16, o=24, size=200, d=4, pb=4, pe=4)]
    for partials in (2**30, 0):           # weight gradient: chunks of tiles, or boxes
        monkeypatch.setattr(winograd, "PARTIALS_BYTES", partials)
        for case in cases:
            x, w, dy = make_arrays(case, rng, channels_last=True)
            runs = []
            for threads in (1, 2, 3, 1):
                with convgrad.config(algo="winograd", threads=threads):
                    runs.append(three(case, x, w, dy))
            for other in runs[1:]:
                for a, b in zip(runs[0], other):
                    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("where", ["interior", "border", "weights", "inf"])
def test_nan_and_inf_reach_exactly_the_outputs_the_direct_kernels_give(where, rng):
    """The transforms mix a tile's inputs and a filter's taps; the lines where a non-finite
    value came out are computed again by the direct engine, so NaN and Inf reach exactly
    the outputs D17 says (and finite outputs stay Winograd's)."""
    case = geometry(2, n=2, c=6, o=9, size=(10, 13), pb=(1, 2), pe=(2, 1))
    x, w, dy = make_arrays(case, rng)
    if where == "interior":
        x[0, 2, 5, 6] = np.nan
        dy[1, 3, 4, 4] = np.nan
    elif where == "border":
        x[1, 0, 0, 12] = np.nan
        dy[0, 8, 10, 0] = np.nan
    elif where == "weights":
        w[3, 2, 0, 2] = np.nan                # a tap that reads padding at some borders
    else:
        x[0, 1, 7, 3] = np.inf
        x[1, 4, 2, 2] = -np.inf
        dy[0, 5, 6, 7] = np.inf
    with convgrad.config(algo="native"):
        want = three(case, x, w, dy)
    with convgrad.config(algo="winograd"):
        got = three(case, x, w, dy)
    for g, e in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(e))
        np.testing.assert_array_equal(np.isinf(g), np.isinf(e))
        np.testing.assert_array_equal(np.signbit(g[np.isinf(g)]), np.signbit(e[np.isinf(e)]))
        fin = np.isfinite(e)
        assert fin.any()
        assert_close(g[fin], e[fin], np.float32)


def test_a_bound_weight_gradient_flags_non_finite_sums_per_call(rng):
    """The finish step flags a weight gradient with a value not finite (recomputed by the
    direct engine, D17), in the kernel instead of a pass over dw; the flag is cleared
    for the bound runner's next call, whose finite result is Winograd's again."""
    case = geometry(2, n=2, c=20, o=36, size=(10, 13))
    x, _, dy = make_arrays(case, rng, channels_last=True)
    geom = make_geometry("t", **case)
    xv, dyv = np.moveaxis(x, 1, -1), np.moveaxis(dy, 1, -1)
    finite = winograd.wgrad(xv, dyv, geom).copy()
    assert not np.array_equal(finite, native.wgrad(xv, dyv, geom))   # (other sums)
    bad = x.copy()
    bad[1, 3, 4, 5] = np.nan
    badv = np.moveaxis(bad, 1, -1)
    run = winograd._bind_wgrad(xv, dyv, geom)
    got = run(badv, dyv)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(native.wgrad(badv, dyv, geom)))
    assert np.isfinite(got).any()
    np.testing.assert_array_equal(run(xv, dyv), finite)


def test_recompute_lines_touches_only_those_lines(rng):
    case = geometry(2, n=2, c=5, o=7, size=9)
    x, w, _ = make_arrays(case, rng, channels_last=True)
    geom = make_geometry("t", **case)
    xv, wv = np.moveaxis(x, 1, -1), np.moveaxis(np.moveaxis(w, 0, -1), 0, -2)
    out = np.full((2, 9, 9, 7), 7.0, np.float32)
    native.recompute_lines("fwd", xv, wv, out, geom, np.array([1, 2, 9 + 4]))
    want = native.fwd(xv, wv, geom)
    flat, wflat = out.reshape(18, 9, 7), want.reshape(18, 9, 7)
    for line in range(18):
        if line in (1, 2, 13):
            np.testing.assert_array_equal(flat[line], wflat[line])
        else:
            assert (flat[line] == 7.0).all()


# -- accuracy: the bound the chooser keeps (docs/decisions.md D24) -----------------------------

def suite_rows():
    """The suite's 3-tap stride-1 layers with their channels, dilations and pads; batch 1
    and 3-D size 24 (float64 references of the full sizes take minutes)."""
    from convgrad.bench.harness import load_suite
    for layer in load_suite():
        if layer.groups != 1 or any(s != 1 for s in layer.strides):
            continue
        sizes = tuple(min(s, 24) for s in layer.s) if len(layer.s) == 3 else layer.s
        case = geometry(len(sizes), n=1, c=layer.c, o=layer.o, size=sizes, d=layer.dilations,
                        pb=layer.pads_begin, pe=layer.pads_end)
        if tuple(case["kernel"]) == tuple(layer.k):
            yield layer.name, case


def _rel_l2(got, want) -> float:
    return float(np.linalg.norm((np.asarray(got, np.float64) - want).ravel())
                 / np.linalg.norm(want.ravel()))


@pytest.mark.parametrize("name,case", list(suite_rows()), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_suite_rows_stay_within_the_error_bound(name, case, rng):
    """Every Winograd variant the chooser may take for a suite row (every tile size)
    stays within ERROR_BOUND and within its own estimate, on standard normal data."""
    x, w, dy = make_arrays(case, rng, channels_last=True)
    with convgrad.config(algo="reference"):
        want = three(case, x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
    geom = make_geometry("t", **case)
    for m in winograd.TILE_SIZES:
        for op, g, e in zip(("fwd", "wgrad", "dgrad"), _winograd_with_tiles(m, case, x, w, dy),
                            want):
            err = _rel_l2(g, e)
            assert err <= winograd.error_estimate(geom, op, m) <= winograd.ERROR_BOUND, (
                name, op, m, err)


def _winograd_with_tiles(m, case, x, w, dy):
    """The three ops on Winograd with tiles of m whatever tile_size would choose."""
    original = winograd.tile_size
    winograd.tile_size = lambda g, op: m
    kernels.clear_choices()          # (no runner a front-end kept from another tile size)
    try:
        with convgrad.config(algo="winograd"):
            return three(case, x, w, dy)
    finally:
        winograd.tile_size = original
        kernels.clear_choices()


def _same_bits_with_debug_bit(isa, bit, case, x, w, dy):
    """The three ops on Winograd, every tile size, on build ``isa``: in the inputs' dtype,
    equal to the reference, and bit for bit the same with engine debug bit ``bit`` set."""
    want = reference_results(case, x, w, dy)
    got = {}
    with convgrad.config(isa=isa):
        for b in (0, bit):
            with engine_dbg(b):
                got[b] = [_winograd_with_tiles(m, case, x, w, dy)
                          for m in winograd.TILE_SIZES]
    for m in range(len(winograd.TILE_SIZES)):
        for k in range(3):
            assert got[0][m][k].dtype == x.dtype
            np.testing.assert_array_equal(got[0][m][k], got[bit][m][k])
            assert_close(got[0][m][k], want[k], x.dtype)


@pytest.mark.parametrize("seed", range(6))
def test_the_error_model_bounds_measured_errors(seed):
    """Random channel counts up to 1024 (the error grows like the square root of the
    reduction length), every rank and tile size: measured <= estimated."""
    rng = np.random.default_rng(seed)
    r = 1 + seed % 3
    c = int(rng.choice([3, 40, 300, 1024]))
    case = geometry(r, n=1, c=c, o=int(rng.integers(4, 20)),
                    size={1: 70, 2: (9, 10), 3: (4, 5, 6)}[r], kd=int(rng.integers(1, 4)))
    x, w, dy = make_arrays(case, rng)
    with convgrad.config(algo="reference"):
        want = three(case, x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
    geom = make_geometry("t", **case)
    for m in winograd.TILE_SIZES:
        got = _winograd_with_tiles(m, case, x, w, dy)
        for op, g, e in zip(("fwd", "wgrad", "dgrad"), got, want):
            assert _rel_l2(g, e) <= winograd.error_estimate(geom, op, m), (case, op, m)


# -- the chooser and the accuracy switch ------------------------------------------------------

def test_the_chooser_takes_winograd_where_it_pays_and_stays_within_the_bound():
    res2 = make_geometry("t", **geometry(2, n=8, c=64, o=64, size=56))
    few = make_geometry("t", **geometry(2, n=8, c=4, o=4, size=56))
    deep = make_geometry("t", **geometry(3, n=1, c=2048, o=64, size=8))
    strided = dict(geometry(2, n=8, c=64, o=64, size=56), strides=(2, 2), out_sizes=(28, 28))
    for op in kernels.OPS:
        assert kernels.select(op, res2, np.float32).name == "winograd", op
        with convgrad.config(precision="highest"):
            assert kernels.select(op, res2, np.float32).name == "native", op
        # few channels: the transforms cost more than the products save
        assert winograd.speedup_estimate(few, op) < winograd.SPEEDUP_MARGIN
        assert kernels.select(op, few, np.float32).name != "winograd", op
        assert kernels.select(op, make_geometry("t", **strided), np.float32).name != "winograd"
        assert kernels.select(op, res2, np.float64).name != "winograd", op
    # a reduction so long that F(4x4)'s error could pass the bound
    assert winograd.error_estimate(deep, "fwd") > winograd.ERROR_BOUND
    assert kernels.select("fwd", deep, np.float32).name != "winograd"


def test_the_tile_size_multiplies_least(monkeypatch):
    """F(3, 3) on DeepLab's 5- and 6-wide dilated sub-grids (33 x 33, d = 6), where F(4, 3)
    and F(2, 3) multiply 1.44x as much, for its weight gradient; its correlations take
    F(6, 3) (one tile a sub-grid axis: 0.64x F(3, 3)'s products); F(4, 3) on ResNet-50's
    56, 14 and 7 (where F(3, 3) wastes more); equal products go to the smaller tile (the
    more accurate)."""
    deeplab = make_geometry("t", **geometry(2, n=4, c=256, o=256, size=33, d=6, pb=6, pe=6))
    p = {m: winograd.products(deeplab, m) for m in winograd.TILE_SIZES}
    assert p[4] == p[2] and p[4] * 100 == p[3] * 144 and p[6] * 100 == p[3] * 64
    assert winograd.tile_size(deeplab, "wgrad") == 3
    for op in ("fwd", "dgrad"):
        assert winograd.tile_size(deeplab, op) == 6, op
    for size in (56, 14, 7):
        g = make_geometry("t", **geometry(2, n=8, c=64, o=64, size=size))
        assert winograd.tile_size(g, "fwd") == 4, size
    # 1-D, 2 outputs: one F(2, 3) tile multiplies 4 times, F(3, 3) 5, F(4, 3) 6
    tiny = make_geometry("t", **geometry(1, n=1, c=8, o=8, size=4, pb=0, pe=0))
    assert winograd.tile_size(tiny, "fwd") == 2
    # 17 outputs: 5 tiles of 4 (30 products) against 6 of 3 (30): the smaller tile --
    # unless F(6, 3) is allowed (3 tiles, 24 products)
    g17 = make_geometry("t", **geometry(1, n=1, c=8, o=8, size=17))
    assert winograd.products(g17, 4) == winograd.products(g17, 3) == 30
    assert winograd.products(g17, 6) == 24 and winograd.tile_size(g17, "fwd") == 6
    monkeypatch.setattr(winograd, "F6_MAX_PRODUCTS", 0.0)
    winograd.tile_size.cache_clear()
    try:
        assert winograd.tile_size(g17, "fwd") == 3
    finally:
        winograd.tile_size.cache_clear()


def test_a_weight_gradient_takes_the_least_tile_whose_sums_it_would_keep(monkeypatch):
    """Where the sums of the tile that multiplies least are too large for the chooser
    (boxed, outgrowing the L2, not fast enough to win anyway), the weight gradient
    takes the next tile whose sums are not: DeepLab's F(3, 3) sums are 6.5 MB, F(2, 3)'s
    4.2 MB, two sets of which fit 8.4 MB of partials."""
    deeplab = make_geometry("t", **geometry(2, n=4, c=256, o=256, size=33, d=6, pb=6, pe=6))
    assert winograd.tile_size(deeplab, "wgrad") == 3
    monkeypatch.setattr(winograd, "WGRAD_LARGE_SUMS_SPEEDUP", 10.0)
    monkeypatch.setattr(winograd, "PARTIALS_BYTES", 2 * winograd.wgrad_sums_bytes(deeplab, 2))
    winograd.tile_size.cache_clear()
    try:
        assert winograd._sums_too_large(deeplab, 3) and not winograd._sums_too_large(deeplab, 2)
        assert winograd.tile_size(deeplab, "wgrad") == 2
        assert winograd.tile_size(deeplab, "dgrad") == 6
    finally:
        winograd.tile_size.cache_clear()


def test_weight_gradients_whose_boxed_sums_outgrow_l2_stay_direct_on_avx512():
    """On the AVX-512 build, a weight gradient whose set of per-point sums exceeds
    WGRAD_MAX_SUMS_BYTES and is cut into boxes (two sets of partial sums would not fit
    PARTIALS_BYTES: DeepLab d6 at 512 channels with F(2, 3), 16 MiB) is left to the direct
    kernels unless its estimated speedup reaches WGRAD_LARGE_SUMS_SPEEDUP (ResNet-50 res4:
    9 MiB, 2.58: Winograd); sums kept as two partial sets (DeepLab d6 with F(2, 3), 4 MiB:
    its items grow instead) and small sets (res2: 0.56 MiB) keep Winograd, the AVX2 build
    keeps it for all (measured faster there); data gradients are not affected.  DeepLab
    takes F(3, 3) now (1.44x fewer products: estimated 2.29x at 256 channels, 2.49x at 512),
    boxed, and Winograd (measured 2026-11-27 against the direct kernels, NCX, after the
    pause: 512 channels 48.3 against 58.2 ms, 256: 12.9 against 13.4)."""
    def deeplab_of(c):
        return make_geometry("t", **dict(geometry(2, n=4, c=c, o=c, size=33), dilations=(6, 6),
                                         pads_begin=(6, 6), pads_end=(6, 6)))
    deeplab, wide = deeplab_of(256), deeplab_of(512)
    res2 = make_geometry("t", **geometry(2, n=8, c=64, o=64, size=56))
    assert winograd.wgrad_sums_bytes(deeplab, 2) == 4 * 16 * 256 * 256
    assert 2 * winograd.wgrad_sums_bytes(deeplab, 2) <= winograd.PARTIALS_BYTES
    assert 2 * winograd.wgrad_sums_bytes(wide, 2) > winograd.PARTIALS_BYTES
    assert winograd.wgrad_sums_bytes(res2) == 4 * 36 * 64 * 64
    assert winograd.speedup_estimate(wide, "wgrad", 2) < winograd.WGRAD_LARGE_SUMS_SPEEDUP
    assert not winograd._preferred(wide, "wgrad", 2, 16)
    assert winograd._preferred(wide, "wgrad", 2, 8)
    assert winograd._preferred(deeplab, "wgrad", 2, 16)
    assert winograd._preferred(wide, "dgrad", winograd.tile_size(wide, "dgrad"), 16)
    assert winograd._preferred(res2, "wgrad", winograd.tile_size(res2, "wgrad"), 16)
    res4 = make_geometry("t", **geometry(2, n=8, c=256, o=256, size=14))
    assert 2 * winograd.wgrad_sums_bytes(res4) > winograd.PARTIALS_BYTES
    assert (winograd.speedup_estimate(res4, "wgrad") >= winograd.WGRAD_LARGE_SUMS_SPEEDUP
            > winograd.speedup_estimate(wide, "wgrad", 2))
    assert winograd._preferred(res4, "wgrad", winograd.tile_size(res4, "wgrad"), 16)
    for g in (deeplab, wide):
        assert winograd.tile_size(g, "wgrad") == 3
        assert 2 * winograd.wgrad_sums_bytes(g, 3) > winograd.PARTIALS_BYTES
        assert winograd.speedup_estimate(g, "wgrad", 3) >= winograd.WGRAD_LARGE_SUMS_SPEEDUP
        assert winograd._preferred(g, "wgrad", 3, 16)
        assert kernels.select("wgrad", g, np.float32).name == "winograd"


@pytest.mark.parametrize("isa", native.info()["loaded"])
@pytest.mark.parametrize("size,c", [((9, 13), 21), ((5, 8), 16), (70, 13)],
                         ids=["tails", "whole-blocks", "1d"])
def test_channels_first_lines_transposed_in_place(isa, size, c, rng):
    """Channels-first float32 lines reach the kernels' channels-last buffers by 8 x 8
    transposes straight from the channel rows (engine debug bit 1024: through a staging
    copy, as before): the same bits on every op, equal to the reference, with channel
    and pixel counts that leave tails of both."""
    r = 1 if isinstance(size, int) else 2
    case = geometry(r, n=2, c=c, o=11, size=size)
    x, w, dy = make_arrays(case, rng, np.float32, False)        # NCX memory
    _same_bits_with_debug_bit(isa, 1024, case, x, w, dy)


def _streamed_like_plain(isa, case, rng, channels_last, decided, stream):
    """Three data gradients of ``case`` on build ``isa`` into pool memory (the first
    fresh, the others recycled), streaming allowed, off (engine debug bit 2048), allowed:
    the result's decisions (``decided``, recorded by recycled_results_and_decisions) are
    [False, stream, stream], every result has the same bits, equal to the reference."""
    from convgrad.kernels import _results
    x, w, dy = make_arrays(case, rng, np.float32, channels_last)
    want = reference_results(case, x, w, dy)
    _results.clear()
    decided.clear()
    got = {}
    with convgrad.config(isa=isa, algo="winograd"):
        for bit in (0, 2048, 0):
            with engine_dbg(bit):
                out = convgrad.conv_data_grad(w, dy, x.shape, **attrs(case))
            got.setdefault(bit, []).append(out.copy())
            del out                         # (its memory back to the pool)
    assert decided == [False, stream, stream]
    for out in got[0] + got[2048]:
        np.testing.assert_array_equal(out, got[0][0])
    assert_close(got[0][1], want[2], np.float32)


@pytest.mark.parametrize("isa", native.info()["loaded"])
def test_channels_first_results_stream_into_recycled_memory(isa, rng, monkeypatch):
    """A float32 channels-first Winograd result in recycled memory (64-byte aligned channel
    rows) takes streaming stores for whole cache lines of a channel's runs: the same bits
    as plain stores (engine debug bit 2048), equal to the reference; fresh results and
    misaligned channel rows keep plain stores."""
    from convgrad.kernels import _results
    decided = recycled_results_and_decisions(monkeypatch, _results, "streams_channels")
    for size, stream in ((128, True), (100, False)):        # 100 floats: rows not aligned
        case = geometry(1, n=2, c=24, o=16, size=size)
        _streamed_like_plain(isa, case, rng, False, decided, stream)


@pytest.mark.parametrize("isa", native.info()["loaded"])
def test_channels_last_results_stream_into_recycled_memory(isa, rng, monkeypatch):
    """A float32 channels-last Winograd result in recycled memory (64-byte aligned pixels)
    takes streaming stores for its output transform's whole vectors: the same bits as
    plain stores (engine debug bit 2048), equal to the reference, with F(6, 3) and
    F(4, 3) tiles, edge tiles included; 24 channels (96-byte pixels) keep plain
    stores."""
    from convgrad.kernels import _results
    decided = recycled_results_and_decisions(monkeypatch, _results, "streams")
    for c, size, stream in ((32, (17, 23), True), (32, (14, 20), True), (24, (17, 23), False)):
        case = geometry(2, n=2, c=c, o=24, size=size)
        _streamed_like_plain(isa, case, rng, True, decided, stream)


def test_small_images_take_the_smaller_tile():
    """4x4 tiles on a 2x2 image compute 16 outputs for 4 (36 products against 16 for a
    2x2 tile); on 6x6, 4 tiles of 4x4 multiply as much as 9 of 2x2 (144 products), 4 of
    3x3 less (100) and one of 6x6 least (64): F(6, 3), as on 5x5; 7x7 (res5) and 56x56
    keep F(4, 3); the weight gradient never takes F(6, 3) (F(3, 3) on 6x6)."""
    def g(size):
        return make_geometry("t", **geometry(2, n=1, c=64, o=64, size=size))
    assert winograd.products(g(2), 2) < winograd.products(g(2), 4)
    assert winograd.products(g(6), 2) == winograd.products(g(6), 4) == 144
    assert winograd.products(g(6), 3) == 100 and winograd.products(g(6), 6) == 64
    assert [winograd.tile_size(g(s), "fwd") for s in (2, 5, 6, 7, 56)] == [2, 6, 6, 4, 4]
    assert winograd.tile_size(g(6), "wgrad") == 3


def test_f6_only_where_it_saves_enough_products():
    """A correlation takes F(6, 3) where it multiplies at most F6_MAX_PRODUCTS of the best
    other tile's products: the 3-D U-Net's 64-wide planes (11 tiles of 8 points an axis
    against 16 of 6: 0.84x), not the TCN's 512-long sub-grids (0.90x) or ResNet-50 res2
    (56: 0.91x)."""
    def ratio(geom):
        return winograd.products(geom, 6) / winograd.products(geom, 4)
    unet = make_geometry("t", **geometry(3, n=1, c=32, o=32, size=64))
    tcn = make_geometry("t", **geometry(1, n=16, c=128, o=128, size=4096, d=8, pb=8, pe=8))
    res2 = make_geometry("t", **geometry(2, n=8, c=64, o=64, size=56))
    assert ratio(unet) <= winograd.F6_MAX_PRODUCTS < min(ratio(tcn), ratio(res2))
    for op in ("fwd", "dgrad"):
        assert winograd.tile_size(unet, op) == 6
        assert winograd.tile_size(tcn, op) == winograd.tile_size(res2, op) == 4
    assert {winograd.tile_size(g, "wgrad") for g in (unet, tcn, res2)} == {4}
    assert winograd.preferred(unet, "dgrad")
    # a reduction long enough for F(6, 3)'s estimate to pass the bound (but not F(4, 3)'s)
    # takes the next tile instead of leaving the layer to the direct kernels
    wide = make_geometry("t", **geometry(2, n=1, c=1024, o=1024, size=33))
    assert winograd.error_estimate(wide, "fwd", 6) > winograd.ERROR_BOUND
    assert winograd.products(wide, 6) <= winograd.F6_MAX_PRODUCTS * winograd.products(wide, 4)
    assert winograd.tile_size(wide, "fwd") == 4 and winograd.preferred(wide, "fwd")


def test_precision_setting():
    assert convgrad.settings.precision() == "default"
    with convgrad.config(precision="highest"):
        assert convgrad.settings.precision() == "highest"
        assert convgrad.settings.snapshot()["precision"] == "highest"
    assert convgrad.settings.precision() == "default"
    with pytest.raises(ValueError, match="precision must be one of"):
        with convgrad.config(precision="fast"):
            pass


def test_a_forced_winograd_explains_what_it_cannot_run():
    with convgrad.config(algo="winograd"):
        with pytest.raises(convgrad.ConvGradError, match="stride 1 only"):
            convgrad.conv_forward(np.ones((1, 2, 8, 8), np.float32),
                                  np.ones((3, 2, 3, 3), np.float32), strides=[2, 2])
        with pytest.raises(convgrad.ConvGradError, match="3 taps"):
            convgrad.conv_forward(np.ones((1, 2, 8, 8), np.float32),
                                  np.ones((3, 2, 5, 5), np.float32))


def test_memory_stays_within_the_workspace_budget():
    """Shared parts (transformed weights or input, partial sums) are bounded by a
    quarter of the workspace budget; nothing is proportional to a data tensor."""
    geom = make_geometry("t", **geometry(2, n=64, c=64, o=64, size=64))
    data = 4 * 64 * 64 * 64 * 64
    for budget in (2**22, 2**26):
        with convgrad.config(workspace_bytes=budget):
            for op in kernels.OPS:
                parts = winograd.workspace(geom, op, False, False)
                shared = sum(v for k, v in parts.items() if k != "per-thread scratch")
                assert shared <= budget // 4 + geom.n * 64 * 64, (op, parts)
                assert sum(parts.values()) < data / 4, (op, parts)


# -- the AVX-512 build's logic on any CPU --------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_the_16_float_build_logic_matches_the_naive_reference(vl16_engine, seed, rng,
                                                              monkeypatch):
    assert vl16_engine.vl == 16
    monkeypatch.setattr(native, "engine", lambda: vl16_engine)
    monkeypatch.setattr(winograd, "tile_size", lambda geom, op: 4 if seed % 2 else 2)
    if seed >= 4:
        monkeypatch.setattr(winograd, "SHARED_U_BYTES", 0)
        monkeypatch.setattr(winograd, "PARTIALS_BYTES", 0)
    check(random_case(300 + seed), rng, channels_last=seed % 3 == 0,
          dtype=(np.float32, np.float32, np.float16, bfloat16)[seed % 4])
    check(list(STRUCTURAL.values())[seed], rng)


@pytest.mark.parametrize("op", ["fwd", "dgrad"])
def test_items_transform_all_their_weights_at_once_where_they_fit(op, rng, monkeypatch):
    """Regime "weights": an item transforms the weights of all its input channels at
    once where they fit WHOLE_CHUNK_L2 of the L2 (res4-like 256 channels: one GEMM call
    a point), else chunks of WEIGHT_CHUNK (res5's 512, and this layer with the share at
    0: 80 channels as 64 + 16, the second chunk adding into the first's products) --
    both equal to the reference, on every build."""
    eng = native.engine()
    for c, want_kc in ((256, 256), (512, 64)):
        geom = make_geometry("t", **geometry(2, n=8, c=c, o=c, size=(14, 14)))
        plan = winograd.corr_plan(geom, "dgrad", eng.vl, winograd._mr_of(eng), 4,
                                  winograd._budgets())
        if native.l2_bytes() >= 2 * 2**20 and eng.vl == 16:
            assert (plan.regime, plan.kc) == ("weights", want_kc)
    monkeypatch.setattr(winograd, "SHARED_U_BYTES", 0)
    case = geometry(2, n=2, c=80, o=40, size=(9, 10), d=(1, 2), pb=(1, 2), pe=(2, 0))
    if op == "dgrad":
        case = {**case, "c": 40, "o": 80}
    x, w, dy = make_arrays(case, rng)
    want = reference_results(case, x, w, dy)
    geom = make_geometry("t", **case)
    for share, chunked in ((1.0, False), (0.0, True)):
        monkeypatch.setattr(winograd, "WHOLE_CHUNK_L2", share)
        for isa in ISAS:
            with convgrad.config(isa=isa, algo="winograd"):
                e = native.engine()
                plan = winograd.corr_plan(geom, op, e.vl, winograd._mr_of(e), 4,
                                          winograd._budgets())
                assert plan.regime == "weights"
                assert plan.kc == (winograd.WEIGHT_CHUNK if chunked else plan.cpad)
                assert (plan.cpad > plan.kc) == chunked
                got = (convgrad.conv_forward(x, w, **attrs(case)) if op == "fwd" else
                       convgrad.conv_data_grad(w, dy, x.shape, **attrs(case)))
            assert_close(got, want[0 if op == "fwd" else 2], np.float32)


def test_weights_items_take_the_tiles_whose_products_fit_the_l2(monkeypatch):
    """Regime "weights": an item takes as many tiles as its products and chunk of
    transformed weights (4 * points * NB * (tiles + kc) bytes) and two points' input rows
    (2 * 4 * tiles * kc) fit in WEIGHTS_ITEM_L2 of a core's L2, at least
    WEIGHTS_ITEM_TILES: ResNet-50 res4's data gradient (128 tiles, 8 output blocks of 32
    on AVX-512) transforms each block's weights once, in 8 items, with a 1 MiB L2 (chunks
    of 64: 0.95 MB); with 2 MiB (whole chunks: 2.03 MB) and where the share is smaller,
    items of 64 tiles (16)."""
    eng = native.engine()
    if eng.vl != 16:
        pytest.skip("the figures are those of the AVX-512 build's 32-channel blocks")
    geom = make_geometry("t", **geometry(2, n=8, c=256, o=256, size=(14, 14)))

    def items(l2, share):
        monkeypatch.setattr(native, "l2_bytes", lambda: l2)
        monkeypatch.setattr(winograd, "WEIGHTS_ITEM_L2", share)
        plan = winograd.corr_plan(geom, "dgrad", eng.vl, winograd._mr_of(eng), 4,
                                  winograd._budgets())
        assert plan.regime == "weights" and plan.groups_of_tiles == ((0, 128, 0, 1),)
        assert sorted({(int(a), int(b)) for a, b in plan.items[:, 4:6]}) == [
            (k, k + 1) for k in range(8)]            # (every output block, one at a time)
        return plan.kc, sorted({int(b) - int(a) for a, b in plan.items[:, :2]})
    assert items(1 << 20, 0.92) == (64, [128])
    assert items(2 << 20, 0.92) == (256, [64])
    assert items(1 << 20, 0.85) == (64, [64])
    assert items(2 << 20, 0.99) == (256, [128])


def test_tiles_cover_every_output_once():
    for size in range(1, 40):
        for d in (1, 2, 3, 6, 8, 50):
            for m in winograd.TILE_SIZES:
                t = winograd._tiles(size, d, m)
                covered = sorted(int(u0) + d * i for u0, cnt in t for i in range(cnt))
                assert covered == list(range(size)), (size, d, m)
                assert len(t) == sum(math.ceil(len(range(r, size, d)) / m)
                                     for r in range(min(d, size)))


def test_channels_first_calls_take_winograd_like_channels_last_ones(rng):
    """1-D and 2-D calls on NCX memory take Winograd where NXC calls do (1-D NCX calls
    once stayed direct, when items converted d times the input they read and stored
    channels-first results a value at a time)."""
    from convgrad import ops
    tcn = make_geometry("t", **geometry(1, n=8, c=128, o=128, size=1024, d=8, pb=8, pe=8))
    res2 = make_geometry("t", **geometry(2, n=2, c=64, o=64, size=28))
    for geom in (tcn, res2):
        x = rng.standard_normal(geom.x_shape).astype(np.float32)
        dy = rng.standard_normal(geom.y_shape).astype(np.float32)
        w = rng.standard_normal(geom.w_shape).astype(np.float32)

        def nxc(a):
            return np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 1, -1)), -1, 1)
        assert all(winograd.preferred(geom, kind) for kind in kernels.OPS)
        for kind, a, b in (("fwd", x, w), ("wgrad", x, dy), ("dgrad", w, dy)):
            ncx_call = ops.describe(kind, a, b, geom, np.float32)
            na, nb = (nxc(t) if t.shape != w.shape else t for t in (a, b))
            nxc_call = ops.describe(kind, na, nb, geom, np.float32)
            assert kernels.select(kind, geom, np.float32, call=ncx_call).name == "winograd"
            assert kernels.select(kind, geom, np.float32, call=nxc_call).name == "winograd"


def test_weight_gradients_with_few_tiles_stay_direct():
    """ResNet-50 res5's weight gradient at batch 4 sums over 4 x 2 x 2 tiles only: not
    preferred (at batch 8, 32 tiles, its fused tasks are, see below; unfused they
    measured 1.2-1.5x slower than the direct engine); res4 (128 tiles: preferred where
    its sums do not rule it out, see the test above) and res5's data gradient are."""
    res5 = make_geometry("t", **geometry(2, n=4, c=512, o=512, size=7))
    res4 = make_geometry("t", **geometry(2, n=8, c=256, o=256, size=14))
    assert winograd.wgrad_tiles(res5) == 16 and winograd.wgrad_tiles(res4) == 128
    assert not winograd.preferred(res5, "wgrad")
    assert not winograd._preferred(res5, "wgrad", 4, 8)
    assert winograd.preferred(res5, "dgrad") and winograd._preferred(res4, "wgrad", 4, 8)
    assert kernels.select("wgrad", res5, np.float32).name == "native"
    u3 = make_geometry("t", **geometry(3, n=1, c=32, o=32, size=16))
    assert winograd.wgrad_tiles(u3) == 16 * 4 * 4


@pytest.mark.parametrize("isa", native.info()["loaded"])
@pytest.mark.parametrize("r,c,o,size", [(2, 96, 40, 8), (1, 96, 40, 40)], ids=["2d", "1d"])
def test_channels_first_dy_transposed_once_where_channel_blocks_split(isa, r, c, o, size, rng,
                                                                      monkeypatch):
    """A float32 channels-first weight gradient whose items split the input channels
    (each dy line converted once per channel block; small budgets force the split here)
    transposes dy once into channels-last scratch: the same bits as converting per item
    (``DY_ONCE``), equal to the reference, the copy counted by the memory estimate; a
    channels-last dy is read in place, and a plan of one channel block converts per item."""
    monkeypatch.setattr(winograd, "PARTIALS_BYTES", 0)         # no partial-sum mode
    monkeypatch.setattr(winograd, "WGRAD_BOX_BYTES", 2**16)    # boxes of few channels
    case = geometry(r, n=2, c=c, o=o, size=size)
    kw = attrs(case)
    decided = []
    real = winograd._dy_once
    monkeypatch.setattr(winograd, "_dy_once", lambda *a: decided.append(real(*a)) or decided[-1])
    x, w, dy = make_arrays(case, rng, np.float32, False)            # NCX memory
    want = reference_results(case, x, w, dy)[1]
    got = []
    for once in (True, False):
        monkeypatch.setattr(winograd, "DY_ONCE", once)
        with convgrad.config(isa=isa, algo="winograd", threads=2):
            got.append(convgrad.conv_weight_grad(x, dy, w.shape, **kw))
        assert_close(got[-1], want, np.float32)
    np.testing.assert_array_equal(got[0], got[1])
    assert decided[0] is True and decided[-1] is False
    # the estimate: the copy for a channels-first dy, none for a channels-last one
    geom = make_geometry("t", **case)
    monkeypatch.setattr(winograd, "DY_ONCE", True)
    parts = {}
    for layouts in (("ncx",), ("nxc",)):
        call = kernels.Call.assumed("wgrad", geom, np.float32)
        call = dataclasses.replace(call, b=dataclasses.replace(call.b,
                                                               layouts=frozenset(layouts)))
        parts[layouts] = winograd.memory(call)
    assert parts[("ncx",)]["dy transposed to channels last"] == dy.size * 4
    assert "dy transposed to channels last" not in parts[("nxc",)]
    # one channel block: dy converted per item, no copy
    monkeypatch.undo()
    monkeypatch.setattr(winograd, "_dy_once", lambda *a: decided.append(real(*a)) or decided[-1])
    decided.clear()
    with convgrad.config(isa=isa, algo="winograd", threads=2):
        assert_close(convgrad.conv_weight_grad(x, dy, w.shape, **kw), want, np.float32)
    assert decided == [False]


@pytest.mark.parametrize("isa", native.info()["loaded"])
@pytest.mark.parametrize("op", ["fwd", "dgrad"])
def test_items_of_converted_inputs_stay_within_a_row_of_tiles(isa, op, rng, monkeypatch):
    """A forward or data gradient whose input lines are converted (channels-first here)
    cuts rows of tiles longer than an item into near-equal pieces, none crossing a row
    (``ROW_ITEMS``); an input read in place keeps items of t tiles.  The results are
    the same bits either way, equal to the reference."""
    case = geometry(2, n=2, c=16, o=24, size=(9, 130))         # rows of 33 tiles
    geom = make_geometry("t", **case)
    eng = native.engine()
    monkeypatch.setattr(winograd, "ITEM_TILES", 8)              # items of 8 tiles at most
    winograd.corr_plan.cache_clear()              # (plans are cached: made afresh here)
    plans = {c: winograd.corr_plan(geom, op, eng.vl, winograd._mr_of(eng), 4,
                                   winograd._budgets(), c) for c in (True, False)}
    row = len(plans[True].tiles_w) // 2
    assert row == 33
    for s0, s1 in plans[True].items[:, :2].tolist():
        assert s0 // row == (s1 - 1) // row                     # within one row
    assert any(s0 // row != (s1 - 1) // row for s0, s1 in plans[False].items[:, :2].tolist())
    x, w, dy = make_arrays(case, rng, np.float32, False)       # NCX memory
    want = reference_results(case, x, w, dy)
    i = {"fwd": 0, "dgrad": 2}[op]
    got = []
    for rows in (True, False):
        monkeypatch.setattr(winograd, "ROW_ITEMS", rows)
        winograd.corr_plan.cache_clear()                        # (plans are cached)
        with convgrad.config(isa=isa, algo="winograd", threads=2):
            got.append(three(case, x, w, dy)[i])
        assert_close(got[-1], want[i], np.float32)
    winograd.corr_plan.cache_clear()              # (none made with ROW_ITEMS off stays)
    np.testing.assert_array_equal(got[0], got[1])


@pytest.mark.parametrize("isa", native.info()["loaded"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["ncx", "nxc"])
def test_weight_gradient_items_of_less_than_two_rows_stay_within_one(isa, channels_last, rng,
                                                                     monkeypatch):
    """A weight gradient whose items hold less than two rows of tiles cuts them at row
    ends (``WGRAD_ROW_ITEMS``: one row an item, or near-equal pieces of a longer one),
    whatever the input's layout: equal to the reference, as items across rows are (the
    tiles' sums grouped otherwise: not the same bits), and the same bits on 1 and 3
    threads."""
    case = geometry(2, n=2, c=16, o=24, size=(9, 70))          # rows of 18 tiles
    geom = make_geometry("t", **case)
    eng = native.engine()
    x, w, dy = make_arrays(case, rng, np.float32, channels_last)
    want = reference_results(case, x, w, dy)[1]
    got, crossing = [], []
    for rows in (True, False):
        monkeypatch.setattr(winograd, "WGRAD_ROW_ITEMS", rows)
        monkeypatch.setattr(winograd, "WGRAD_ITEM_BYTES", 27 * 4 * 36 * 48)   # 27 tiles
        winograd.wgrad_plan.cache_clear()                       # (plans are cached)
        plan = winograd.wgrad_plan(geom, eng.vl, 4, winograd._wgrad_budgets())
        row = len(plan.tiles_w) // 2
        assert row == 18
        crossing.append(any(s0 // row != (s1 - 1) // row
                            for s0, s1 in plan.items[:, :2].tolist()))
        for threads in (1, 3):
            with convgrad.config(isa=isa, algo="winograd", threads=threads):
                got.append(convgrad.conv_weight_grad(x, dy, w.shape, **attrs(case)))
            assert_close(got[-1], want, np.float32)
        np.testing.assert_array_equal(got[-2], got[-1])
    winograd.wgrad_plan.cache_clear()             # (none made with the test's budgets stays)
    assert crossing == [False, True]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("r,c,o,size,dtype,channels_last,groups", [
    (1, 40, 70, 37, np.float32, True, 1), (1, 40, 70, 37, np.float32, False, 1),
    (2, 37, 45, (11, 9), np.float32, False, 1), (2, 48, 40, (9, 8), np.float32, False, 2),
    (2, 24, 33, (7, 7), np.float16, True, 1), (3, 19, 21, (3, 6, 5), bfloat16, False, 1),
    (3, 19, 21, (3, 6, 5), np.float32, False, 1)],
    ids=["1d", "1d-ncx", "2d-ncx-tails", "2d-ncx-groups", "2d-f16", "3d-bf16-ncx", "3d-ncx"])
def test_weight_gradient_tasks_of_one_item_are_fused(isa, r, c, o, size, dtype, channels_last,
                                                     groups, rng, monkeypatch):
    """Boxed sums whose every box is one item (all its tiles): each task finishes a
    register tile's sums over every point as soon as they are made (WgradPlan.fused),
    never keeping the box's -- the same bits as the box's sums zeroed, filled and
    finished (``WGRAD_FUSED`` False), on 1 and 3 threads, equal to the reference, a NaN
    reaching the outputs the direct kernels give it; per-thread scratch one register
    tile's sums instead of a box's.  A float32 OIX caller's result is stored in OIX
    memory by the tasks (``_writes_oix``: no result copy declared), its 9 taps a row
    transposed 8 x 8 (engine debug bit 134217728: element by element): the same bits."""
    monkeypatch.setattr(winograd, "PARTIALS_BYTES", 0)
    monkeypatch.setattr(winograd, "WGRAD_BOX_BYTES", 2**15)
    case = geometry(r, n=2, c=c, o=o, size=size, d=1 if r == 3 else 2, groups=groups)
    geom = make_geometry("t", **case)
    x, w, dy = make_arrays(case, rng, dtype, channels_last)
    want = reference_results(case, x, w, dy)[1]
    got, scratch = {}, {}
    with convgrad.config(isa=isa):
        eng = native.engine()
        winograd.wgrad_plan.cache_clear()
        plan = winograd.wgrad_plan(geom, eng.vl, 4, winograd._wgrad_budgets())
        assert plan.fused and len(plan.tasks) > 2, plan.tasks
        for fused in (True, False):
            monkeypatch.setattr(winograd, "WGRAD_FUSED", fused)
            winograd._workspace.cache_clear()
            scratch[fused] = winograd.workspace(geom, "wgrad")["per-thread scratch"]
            for threads in (1, 3):
                with convgrad.config(algo="winograd", threads=threads):
                    got[fused, threads] = convgrad.conv_weight_grad(x, dy, w.shape,
                                                                    **attrs(case))
        monkeypatch.setattr(winograd, "WGRAD_FUSED", True)
        winograd._workspace.cache_clear()
        assert winograd._writes_oix(plan, "ncx")
        xv, dyv = np.moveaxis(x, 1, -1), np.moveaxis(dy, 1, -1)
        call = ops.describe("wgrad", xv, dyv, geom, np.dtype(dtype),
                            result_layouts=frozenset({"ncx" if not channels_last else "nxc"}))
        copied = "dw before the caller's copy" in winograd.memory(call)
        with convgrad.config(algo="winograd"), engine_dbg(134217728, eng.lib):
            got["scalar"] = convgrad.conv_weight_grad(x, dy, w.shape, **attrs(case))
        bad = x.copy()
        bad[(1, 3) + (2,) * r] = np.nan
        with convgrad.config(algo="winograd"):
            nan = convgrad.conv_weight_grad(bad, dy, w.shape, **attrs(case))
        with convgrad.config(precision="highest"):
            nan_direct = convgrad.conv_weight_grad(bad, dy, w.shape, **attrs(case))
    winograd.wgrad_plan.cache_clear()
    winograd._workspace.cache_clear()
    for key in got:
        np.testing.assert_array_equal(got[key], got[True, 1])
    assert_close(got[True, 1], want, dtype)
    assert copied == (dtype != np.float32)      # (a float32 result: the caller's memory)
    assert np.isnan(nan).any()
    np.testing.assert_array_equal(np.isnan(nan), np.isnan(nan_direct))
    assert scratch[True] <= scratch[False]      # (smaller where a box outgrows a tile's)


def test_weight_gradients_of_few_tiles_take_winograd_only_when_fused():
    """A weight gradient of fewer than WGRAD_MIN_TILES tiles stays direct unless its
    tasks are fused and it has at least WGRAD_FUSED_MIN_TILES tiles: ResNet-50 res5 (32
    tiles of 4 x 4, 36 MiB of boxed sums) takes Winograd on every build, at batch 4 (16
    tiles) it does not, nor without fused tasks (``WGRAD_FUSED`` False).  Fused, its
    threads' scratch holds one register tile's sums (36 points x 448 floats on AVX-512),
    not a box's (1.1 MiB)."""
    res5 = make_geometry("t", **geometry(2, n=8, c=512, o=512, size=7))
    res5_n4 = make_geometry("t", **geometry(2, n=4, c=512, o=512, size=7))
    for vl in (8, 16):
        assert winograd.wgrad_plan(res5, vl, 4, winograd._wgrad_budgets()).fused
        assert winograd.wgrad_tiles(res5, 4) == 32
        assert winograd.WGRAD_FUSED_MIN_TILES <= 32 < winograd.WGRAD_MIN_TILES
        assert winograd._preferred(res5, "wgrad", 4, vl, True)
        assert not winograd._preferred(res5, "wgrad", 4, vl, False)
        assert winograd.wgrad_tiles(res5_n4, 4) == 16
        assert not winograd._preferred(res5_n4, "wgrad", 4, vl, True)
    assert winograd.preferred(res5, "wgrad")
    assert kernels.select("wgrad", res5, np.float32).name == "winograd"
    scratch = {}
    winograd._preferred.cache_clear()
    try:
        for fused in (True, False):
            winograd.WGRAD_FUSED = fused
            winograd._workspace.cache_clear()
            scratch[fused] = winograd.workspace(res5, "wgrad")["per-thread scratch"]
        assert not winograd.preferred(res5, "wgrad")
    finally:
        winograd.WGRAD_FUSED = True
        winograd._preferred.cache_clear()
        winograd._workspace.cache_clear()
    threads = native._threads(res5.flops)
    assert scratch[False] - scratch[True] > threads * 2**20


def test_boxed_weight_gradient_items_grow_when_a_box_outgrows_half_the_l2(rng, monkeypatch):
    """Sums cut into boxes (no partial sets), a box larger than half a core's L2: items
    take WGRAD_BOXED_ITEM_BYTES of transformed tiles instead of WGRAD_ITEM_BYTES, so each
    tile of the GEMMs adds into the box's sums once per longer reduction; results equal
    to the reference and the same on 1 and 3 threads."""
    monkeypatch.setattr(winograd, "PARTIALS_BYTES", 0)
    case = geometry(2, n=2, c=64, o=64, size=(30, 30))      # 2 x 64 tiles, 0.56 MiB boxes
    x, w, dy = make_arrays(case, rng, np.float32, True)
    want = reference_results(case, x, w, dy)[1]
    geom = make_geometry("t", **case)
    eng = native.engine()
    monkeypatch.setattr(winograd, "WGRAD_ITEM_BYTES", 2**18)
    monkeypatch.setattr(winograd, "WGRAD_BOXED_ITEM_BYTES", 2**20)
    tiles = {}
    try:
        for l2 in (2**30, 2**20):
            monkeypatch.setattr(native, "l2_bytes", lambda l2=l2: l2)
            winograd.wgrad_plan.cache_clear()
            plan = winograd.wgrad_plan(geom, eng.vl, 4, winograd._wgrad_budgets())
            assert plan.parts == 0 and (4 * plan.box_floats > l2 // 2) == (l2 == 2**20)
            tiles[l2] = int((plan.items[:, 1] - plan.items[:, 0]).max())
            got = []
            for threads in (1, 3):
                with convgrad.config(algo="winograd", threads=threads):
                    got.append(convgrad.conv_weight_grad(x, dy, w.shape, **attrs(case)))
            np.testing.assert_array_equal(got[0], got[1])
            assert_close(got[0], want, np.float32)
    finally:
        winograd.wgrad_plan.cache_clear()
    assert tiles[2**20] >= 2 * tiles[2**30]


def _force_wgrad_sums(monkeypatch, sums: str) -> None:
    """Budgets that make a weight gradient's tasks finish their register tiles
    ("fused"), their box of sums ("boxes") or the partial sums' rows ("parts")."""
    monkeypatch.setattr(winograd, "PARTIALS_BYTES", 0 if sums != "parts" else 2**30)
    if sums == "fused":
        monkeypatch.setattr(winograd, "WGRAD_BOX_BYTES", 2**15)
    if sums == "boxes":
        monkeypatch.setattr(winograd, "WGRAD_FUSED", False)


def _wgrad_plan_of(geom, sums: str):
    """The current build's weight gradient plan of ``geom`` (made afresh), checked to
    finish as ``sums`` says (:func:`_force_wgrad_sums`)."""
    eng = native.engine()
    winograd.wgrad_plan.cache_clear()
    plan = winograd.wgrad_plan(geom, eng.vl, winograd.tile_size(geom, "wgrad"),
                               winograd._wgrad_budgets())
    assert (winograd._fused(plan), bool(plan.parts)) == {
        "fused": (True, False), "parts": (False, True), "boxes": (False, False)}[sums]
    return plan


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("r,c,o,size,groups,sums", [
    (2, 24, 33, (7, 7), 1, "fused"), (1, 40, 70, 37, 1, "fused"),
    (2, 96, 96, (30, 30), 1, "parts"), (3, 19, 21, (3, 6, 5), 1, "boxes"),
    (2, 48, 40, (9, 8), 2, "fused")],
    ids=["2d-fused", "1d-tails", "2d-parts", "3d-boxes", "2d-groups"])
def test_16bit_weight_gradients_are_stored_in_their_dtype(isa, dtype, r, c, o, size, groups,
                                                          sums, rng, monkeypatch):
    """A float16 / bfloat16 caller's Winograd weight gradient ((*K, C/G, O)) is stored in
    its dtype by the finish step (``WGRAD_16BIT_RESULT``): bitwise the float32 result
    rounded once, whether each task finishes its register tiles (fused), its box of
    sums or the partial sums' rows, tails of output channels included; the same through
    the front-end (an NXC / XIO caller's result); a value not finite still gives the
    direct engine's float32 result (D17), which the front-end rounds, a bound call too
    (its finish made for the 16-bit results).  An OIX result stays float32."""
    _force_wgrad_sums(monkeypatch, sums)
    case = geometry(r, n=2, c=c, o=o, size=size, d=1 if r == 3 else 2, groups=groups)
    geom = make_geometry("t", **case)
    x, w, dy = make_arrays(case, rng, dtype, True)
    xv, dyv = np.moveaxis(x, 1, -1), np.moveaxis(dy, 1, -1)
    with convgrad.config(isa=isa):
        plan = _wgrad_plan_of(geom, sums)
        f32 = winograd.wgrad(xv, dyv, geom)
        got = winograd.wgrad(xv, dyv, geom, out_dtype=dtype)
        monkeypatch.setattr(winograd, "WGRAD_16BIT_RESULT", False)
        off = winograd.wgrad(xv, dyv, geom, out_dtype=dtype)
        monkeypatch.setattr(winograd, "WGRAD_16BIT_RESULT", True)
        oix = winograd.wgrad(xv, dyv, geom, out_dtype=dtype, result_layout="ncx")
        bad = xv.copy()
        bad[(1,) + (2,) * r + (3,)] = np.nan
        nan = winograd.wgrad(bad, dyv, geom, out_dtype=dtype)
        xio = np.moveaxis(np.moveaxis(w, 0, -1), 0, -2).shape      # (*K, C/G, O)
        with convgrad.config(algo="winograd"):
            front = [convgrad.onednn.convolution_backward_weights(
                xa, dyv, list(xio), strides=list(case["strides"]),
                pads_begin=list(case["pads_begin"]), pads_end=list(case["pads_end"]),
                dilations=list(case["dilations"]), groups=groups, data_format="NXC",
                weights_format="XIO") for xa in (xv, xv, xv, bad)]    # (the full path: bound calls
            # are off outside tests marked bound_calls, see test_bound.py)
    winograd.wgrad_plan.cache_clear()
    assert f32.dtype == np.float32 and off.dtype == np.float32 and got.dtype == dtype
    np.testing.assert_array_equal(got, f32.astype(dtype))
    if winograd._writes_oix(plan, "ncx"):
        assert oix.dtype == np.float32
    np.testing.assert_array_equal(oix.astype(dtype), got)
    assert nan.dtype == np.float32 and np.isnan(nan).any()
    np.testing.assert_array_equal(np.isnan(nan), np.isnan(native.wgrad(bad, dyv, geom)))
    for f in front[:3]:
        assert f.dtype == dtype
        np.testing.assert_array_equal(f, got)
    assert front[3].dtype == dtype                  # (a bound call's NaN: the direct engine)
    np.testing.assert_array_equal(np.isnan(front[3]), np.isnan(nan))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("r,c,o,size,sums,stream,layout,dtype", [
    (2, 24, 32, (7, 7), "fused", True, None, np.float32),
    (2, 96, 96, (30, 30), "parts", True, None, np.float32),
    (3, 19, 32, (3, 6, 5), "boxes", True, None, np.float32),
    (2, 24, 40, (7, 7), "fused", False, None, np.float32),
    (2, 24, 32, (7, 7), "fused", True, "ncx", np.float32),
    (2, 24, 40, (7, 7), "fused", True, "ncx", np.float32),
    (2, 24, 32, (7, 7), "fused", True, None, np.float16),
    (2, 96, 96, (30, 30), "parts", True, None, bfloat16),
    (2, 24, 40, (7, 7), "fused", False, None, np.float16)],
    ids=["2d-fused", "2d-parts", "3d-boxes", "unaligned-rows", "oix", "oix-odd-runs",
         "f16-fused", "bf16-parts", "f16-unaligned-rows"])
def test_weight_gradients_stream_into_recycled_memory(isa, r, c, o, size, sums, stream, layout,
                                                      dtype, rng, monkeypatch):
    """A large Winograd weight gradient in recycled memory takes streaming stores in the
    finish step (``WGRAD_STREAM``): a (*K, C/G, O) result with 64-byte aligned rows every
    whole vector (float16 / bfloat16: two streamed halves of a cache line), an OIX one (a
    channels-first caller's float32 memory) the whole cache lines of each channel run;
    the same bits as plain stores (engine debug bit 2048) whether each task finishes its
    register tiles (fused), its box of sums or the partial sums' rows, equal to the
    direct engine's result; a fresh result and a (*K, C/G, O) one of 40 output channels
    (160- or 80-byte rows) keep plain stores."""
    from convgrad.kernels import _results
    decided = recycled_results_and_decisions(monkeypatch, _results,
                                             "streams_runs" if layout else "streams")
    monkeypatch.setattr(winograd, "WGRAD_STREAM_MIN_BYTES", 0)
    _force_wgrad_sums(monkeypatch, sums)
    case = geometry(r, n=2, c=c, o=o, size=size, d=1 if r == 3 else 2)
    geom = make_geometry("t", **case)
    x, _w, dy = make_arrays(case, rng, dtype, True)
    xv, dyv = np.moveaxis(x, 1, -1), np.moveaxis(dy, 1, -1)
    half = None if dtype == np.float32 else dtype
    outs = []
    with convgrad.config(isa=isa):
        eng = native.engine()
        plan = _wgrad_plan_of(geom, sums)
        assert winograd._writes_oix(plan, layout) == (layout is not None)
        _results.clear()
        decided.clear()
        for bit in (0, 0, 2048, 0):
            with engine_dbg(bit, eng.lib):
                out = winograd.wgrad(xv, dyv, geom, result_layout=layout, out_dtype=half)
            outs.append(out.copy())
            del out                         # (its memory back to the pool)
        seen = list(decided)
        direct = native.wgrad(xv, dyv, geom)
    winograd.wgrad_plan.cache_clear()
    assert seen == [False, stream, stream, stream]
    for out in outs:
        assert out.dtype == dtype
        np.testing.assert_array_equal(out, outs[0])
    assert_close(outs[0].astype(np.float32), direct, dtype)
