"""The native engine (kernels/native.py, native/engine.cpp) on every instruction-set
build this CPU can run, against the independent naive float64 reference
(tests/naive.py): every op, rank, stride, dilation, asymmetric pad and group count,
float32/float16/bfloat16 inputs, channels-first and channels-last callers, both
weight-gradient modes (long lines cut into chunks, short lines gathered), both
thread splits; exact padding (D17), determinism, the ISA switch and the fallback
when no build loads."""

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

import convgrad
from convgrad import kernels
from convgrad.dtypes import bfloat16
from convgrad.kernels import native

import naive
from cases import caller_arrays, reference_results
from conftest import assert_close, engine_dbg, recycled_results_and_decisions

if native.available() is not None:
    if os.environ.get("CONVGRAD_REQUIRE_PEERS") == "1":     # CI: the engine must build
        raise RuntimeError(f"the native engine is not available: {native.available()}")
    pytest.skip(f"native engine unavailable: {native.available()}", allow_module_level=True)

ISAS = native.info()["loaded"]



def random_case(seed: int, *, wide: bool = False) -> dict:
    """A valid problem with enough channels to fill several register blocks."""
    rng = np.random.default_rng(seed)
    r = int(rng.integers(1, 4))
    groups = int(rng.choice([1, 1, 1, 2, 3]))
    cg, og = int(rng.integers(1, 21)), int(rng.integers(1, 41))
    kernel = tuple(int(v) for v in rng.integers(1, 5 if r < 3 else 4, r))
    strides = tuple(int(v) for v in rng.integers(1, 4, r))
    dilations = tuple(int(v) for v in rng.integers(1, 4 if r < 3 else 3, r))
    pads_begin = tuple(int(v) for v in rng.integers(0, 4, r))
    pads_end = tuple(int(v) for v in rng.integers(0, 4, r))
    top = {1: 90, 2: 40 if wide else 14, 3: 9}[r]
    in_sizes = []
    for k, d, b, e in zip(kernel, dilations, pads_begin, pads_end):
        ke = (k - 1) * d + 1
        lo = max(1, ke - b - e)
        in_sizes.append(int(rng.integers(lo, max(lo, top) + 1)))
    out_sizes = tuple((L + b + e - ((k - 1) * d + 1)) // s + 1 for L, k, s, d, b, e in
                      zip(in_sizes, kernel, strides, dilations, pads_begin, pads_end))
    return dict(n=int(rng.integers(1, 3)), c=cg * groups, o=og * groups, groups=groups,
                in_sizes=tuple(in_sizes), kernel=kernel, out_sizes=out_sizes, strides=strides,
                dilations=dilations, pads_begin=pads_begin, pads_end=pads_end)


def make_arrays(case, rng, dtype, channels_last):
    """x, w, dy in NCX/OIX shapes; channels-last callers' arrays are NCX views of
    channels-last memory."""
    return caller_arrays(case, rng, dtype, channels_last)


def check(case, rng, *, dtype=np.float32, channels_last=False, isa="auto", threads=None):
    x, w, dy = make_arrays(case, rng, dtype, channels_last)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    want = reference_results(case, x, w, dy)
    with convgrad.config(algo="native", isa=isa, threads=threads):
        got = (convgrad.conv_forward(x, w, **kw),
               convgrad.conv_weight_grad(x, dy, w.shape, **kw),
               convgrad.conv_data_grad(w, dy, x.shape, **kw))
    for g, e in zip(got, want):
        assert g.dtype == np.dtype(dtype)
        assert_close(g, e, dtype)
    return got


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("seed", range(24))
def test_every_build_matches_the_naive_reference(isa, seed, rng):
    case = random_case(seed, wide=seed % 3 == 0)
    check(case, rng, isa=isa, channels_last=seed % 2 == 0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("seed", range(4))
def test_half_inputs_are_converted_inside_the_kernels(isa, dtype, seed, rng):
    check(random_case(100 + seed, wide=True), rng, dtype=dtype, isa=isa,
          channels_last=seed % 2 == 1)


def _geometry(r, *, c, o, size, k, s=1, d=1, pb=1, pe=1, groups=1, n=2):
    sizes = (size,) * r
    out = tuple((L + pb + pe - (k - 1) * d - 1) // s + 1 for L in sizes)
    return dict(n=n, c=c, o=o, groups=groups, in_sizes=sizes, kernel=(k,) * r,
                out_sizes=out, strides=(s,) * r, dilations=(d,) * r, pads_begin=(pb,) * r,
                pads_end=(pe,) * r)


# Shapes that reach each path of the engine (see engine.cpp): long lines cut into
# several chunks, taps of one phase too far apart to share an x panel, lines
# shorter than a chunk gathered, stride phases, tails of every register block.
STRUCTURAL = {
    "long-lines-2d": _geometry(2, c=19, o=37, size=41, k=3),
    "long-lines-strided": _geometry(2, c=8, o=24, size=57, k=4, s=2, pb=1, pe=2),
    "taps-far-apart": _geometry(1, c=6, o=10, size=230, k=3, d=60, pb=7, pe=3),
    "short-lines-3d": _geometry(3, c=12, o=20, size=6, k=3, s=2),
    "dilated-strided": _geometry(2, c=10, o=30, size=33, k=3, s=3, d=2, pb=2, pe=0),
    "1x1-wide": _geometry(2, c=40, o=17, size=30, k=1, pb=0, pe=0),
    "grouped-3d": _geometry(3, c=20, o=36, size=7, k=2, groups=2, pb=0, pe=1),
    "all-padding-taps": _geometry(1, c=5, o=9, size=4, k=5, d=3, pb=6, pe=6),
    "pointwise-2d": _geometry(2, c=20, o=36, size=9, k=1, pb=0, pe=0, n=4),
    "pointwise-3d-grouped": _geometry(3, c=24, o=16, size=5, k=1, pb=0, pe=0, n=5, groups=2),
    # lines shorter than a chunk: several of one sample (and depth) per chunk, their x
    # rows read in place a fixed distance apart
    "lines-grouped-strided": _geometry(2, c=14, o=24, size=53, k=3, s=2, pb=1, pe=2),
    "lines-grouped-3d": _geometry(3, c=9, o=20, size=17, k=3, d=2, pb=2, pe=1),
    "few-channels-folded": _geometry(2, c=3, o=40, size=61, k=7, s=2, pb=3, pe=3, n=1),
    "few-channels-folded-1d": _geometry(1, c=2, o=20, size=150, k=5, s=3, d=2, pb=4, pe=1),
    # weights (9 x 128 x 136 floats) far outweigh the data: weight-stationary items
    "weight-stationary": _geometry(2, c=128, o=136, size=4, k=3, s=1, n=1),
    "weight-stationary-strided": _geometry(2, c=136, o=128, size=5, k=3, s=2, n=2),
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", STRUCTURAL)
def test_structural_cases(isa, name, rng, monkeypatch):
    case = STRUCTURAL[name]
    # small chunks: several chunks per line, several lines per chunk
    monkeypatch.setattr(native, "WGRAD_MAX_CHUNK", 40)
    monkeypatch.setattr(native, "WGRAD_MIN_CHUNK", 8)
    monkeypatch.setattr(native, "WGRAD_PANEL_BYTES", 1)
    for channels_last in (False, True):
        check(case, rng, isa=isa, channels_last=channels_last)


@pytest.mark.parametrize("name", ["long-lines-2d", "short-lines-3d", "taps-far-apart",
                                  "few-channels-folded", "pointwise-2d",
                                  "lines-grouped-strided", "lines-grouped-3d"])
def test_weight_gradient_modes_agree(name, rng, monkeypatch):
    """Packed and in-place x rows, long-line and gathered chunks, split positions and
    split output channels: all equal to the reference."""
    case = STRUCTURAL[name]
    for direct, line_min, split in ((True, 12, False), (False, 12, False), (True, 10**9, False),
                                    (True, 1, True), (False, 1, True)):
        monkeypatch.setattr(native, "WGRAD_DIRECT_X", direct)
        monkeypatch.setattr(native, "WGRAD_LINE_MIN", line_min)
        monkeypatch.setattr(native, "PARTIALS_BYTES", 0 if split else 2**40)
        monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
        check(case, rng, threads=2)


def _strides_2x1(**kw):
    """A 2-D geometry strided along h only (2, 1)."""
    g = _geometry(2, **kw, s=2)
    g["strides"] = (2, 1)
    g["out_sizes"] = (g["out_sizes"][0], g["in_sizes"][1] + kw["pb"] + kw["pe"] - kw["k"] + 1)
    return g


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype,channels_last", [(np.float32, False), (np.float16, True),
                                                 (bfloat16, False)])
@pytest.mark.parametrize("geom,families", [
    (_geometry(2, c=20, o=24, size=15, k=3, s=2, pb=1, pe=1), (2, 1)),   # 8 and 7 rows
    (_geometry(2, c=20, o=24, size=16, k=3, s=2, pb=1, pe=1), (4, 2)),   # 8 rows each
    (_strides_2x1(c=12, o=20, size=12, k=3, pb=1, pe=0), (2, 2)),        # h phases only
    (_geometry(2, c=9, o=16, size=17, k=4, s=3, d=2, pb=3, pe=0, n=1), (3, 1)),
    (_geometry(2, c=9, o=16, size=18, k=4, s=3, d=2, pb=3, pe=0, n=1), (9, 3)),
    (_geometry(1, c=12, o=20, size=40, k=5, s=4, pb=2, pe=3), (4, 1)),   # 1-D, 1-tap phases
    (_geometry(3, c=8, o=12, size=7, k=3, s=2, pb=1, pe=2, n=1), (2, 1)),
    (_geometry(3, c=8, o=12, size=8, k=3, s=2, pb=1, pe=2, n=1), (4, 2)),
], ids=["2d-s2", "2d-s2-even", "2d-s2x1", "2d-s3-dilated", "2d-s3-dilated-even", "1d-s4",
        "3d-s2", "3d-s2-even"])
def test_buffered_data_gradients_take_the_phases_of_a_line_together(isa, dtype,
                                                                    channels_last, geom,
                                                                    families, rng,
                                                                    monkeypatch):
    """A data gradient computed into line buffers (channels-first results) with a
    stride along w computes all w phases of a line in one item and stores the line
    once; where the h phases have as many rows each, all (h, w) phases of a line (its
    consecutive output rows): the same values as fewer phases per item, bit for bit,
    and as the reference.  A channels-last 16-bit result, which the tiles store
    themselves, keeps one phase an item."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    x, w, dy = make_arrays(geom, rng, dtype, channels_last)
    kw = {k: geom[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    want = reference_results(geom, x, w, dy)[2]
    merged = []
    real = native.corr_plan.__wrapped__
    monkeypatch.setattr(native, "corr_plan",
                        lambda *a: merged.append((real(*a).wphases, real(*a).hphases))
                        or real(*a))
    got = []
    for merge_w, merge_h in ((True, True), (True, False), (False, True)):
        monkeypatch.setattr(native, "MERGE_W_PHASES", merge_w)
        monkeypatch.setattr(native, "MERGE_H_PHASES", merge_h)
        with convgrad.config(algo="native", isa=isa, threads=2):
            got.append(convgrad.conv_data_grad(w, dy, x.shape, **kw))
        assert_close(got[-1], want, dtype)
    w_only = (geom["strides"][-1], 1)
    assert merged == ([(1, 1)] * 3 if channels_last else [families, w_only, (1, 1)])
    np.testing.assert_array_equal(got[0], got[2])
    np.testing.assert_array_equal(got[1], got[2])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("r,size", [(2, 16), (2, 12), (3, 8)],
                         ids=["2d-runs-of-lines", "2d-runs-not-lines", "3d-runs-of-lines"])
def test_channels_first_data_gradients_stream_whole_lines(isa, r, size, rng, monkeypatch):
    """A float32 channels-first strided data gradient in recycled memory writes the
    channel runs of its buffered lines that fill whole cache lines with streaming
    stores (16 x 16 images at stride 2: each line's two rows, 32 floats a channel),
    the same bits as plain stores (engine debug bit 512), equal to the reference;
    runs of 24 floats (12 x 12) keep plain stores."""
    from convgrad.kernels import _results
    decided = recycled_results_and_decisions(monkeypatch, _results, "streams_channels")
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    case = _geometry(r, c=24, o=20, size=size, k=3, s=2, pb=1, pe=1)
    x, w, dy = make_arrays(case, rng, np.float32, False)         # NCX memory
    want = reference_results(case, x, w, dy)[2]
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    _results.clear()
    got = {}
    with convgrad.config(isa=isa, algo="native", threads=2):
        for bit in (0, 512, 0):
            with engine_dbg(bit):
                out = convgrad.conv_data_grad(w, dy, x.shape, **kw)
            got.setdefault(bit, []).append(out.copy())
            del out                             # (its memory back to the pool)
    # (the first result is fresh memory; the others recycled, aligned channel rows)
    assert decided[:3] == [False, True, True]
    for outs in got.values():
        for out in outs:
            assert_close(out, want, np.float32)
    np.testing.assert_array_equal(got[0][1], got[512][0])
    np.testing.assert_array_equal(got[0][0], got[512][0])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("geom", [
    _geometry(2, c=256, o=40, size=12, k=1, pb=0, pe=0, n=4),    # 1x1: a dgrad of 64+ blocks
    _geometry(2, c=72, o=36, size=11, k=3, s=2, pb=1, pe=0),     # a partial last block
    _geometry(1, c=48, o=100, size=30, k=2, d=3, pb=2, pe=1, n=1),
], ids=["1x1", "strided-partial", "1d-dilated"])
def test_register_tiles_take_runs_of_output_blocks(isa, geom, rng, monkeypatch):
    """corr_tile repeats over consecutive whole output blocks in one call (engine
    debug bit 64 calls it once per block): bit for bit the same forward and data
    gradient results, equal to the reference."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    x, w, dy = make_arrays(geom, rng, np.float32, True)
    kw = {k: geom[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    want = reference_results(geom, x, w, dy)
    got = {}
    with convgrad.config(algo="native", isa=isa, threads=2):
        assert native.engine().isa == isa
        for bit in (0, 64):
            with engine_dbg(bit):
                got[bit] = (convgrad.conv_forward(x, w, **kw),
                            convgrad.conv_data_grad(w, dy, x.shape, **kw))
    for k in (0, 2):
        assert_close(got[0][k // 2], want[k], np.float32)
        np.testing.assert_array_equal(got[0][k // 2], got[64][k // 2])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("geom", [
    _geometry(2, c=64, o=40, size=9, k=3, pb=1, pe=1, n=2),            # rows read in place
    _geometry(2, c=30, o=48, size=7, k=3, s=2, pb=0, pe=1, n=3),       # packed short lines
    _geometry(1, c=3, o=36, size=40, k=7, s=2, pb=3, pe=3, n=2),       # folded taps
    _geometry(2, c=40, o=24, size=6, k=1, pb=0, pe=0, n=5),            # pointwise
], ids=["in-place", "packed", "folded-taps", "pointwise"])
def test_weight_gradient_tiles_read_consecutive_rows_through_one_pointer(isa, geom, rng,
                                                                         monkeypatch):
    """The GEMM tile reads rows of consecutive channels (NXC) through one pointer, and
    rows a fixed distance apart (NCX channel rows) through a base a group of four
    (engine debug bit 131072 keeps a pointer a row): the same products in the same
    order, so bitwise the same weight gradients, equal to the reference; NaN and Inf in
    x reach the same places."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    kw = {k: geom[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    for channels_last in (True, False):
        x, w, dy = make_arrays(geom, rng, np.float32, channels_last)
        want = reference_results(geom, x, w, dy)[1]
        bad = x.copy()
        bad.flat[[3, x.size // 2]] = [np.nan, np.inf]
        got = {}
        with convgrad.config(algo="native", isa=isa, threads=2):
            for bit in (0, 131072):
                with engine_dbg(bit):
                    got[bit] = [convgrad.conv_weight_grad(a, dy, w.shape, **kw)
                                for a in (x, bad)]
        assert_close(got[0][0], want, np.float32)
        for k in range(2):
            np.testing.assert_array_equal(got[0][k], got[131072][k])
        assert np.isnan(got[0][1]).any()


def test_results_do_not_depend_on_the_thread_count(rng, monkeypatch):
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    case = _geometry(2, c=24, o=40, size=37, k=3, n=3)
    x, w, dy = make_arrays(case, rng, np.float32, True)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    runs = []
    for threads in (1, 2, 3, 1):
        with convgrad.config(algo="native", threads=threads):
            runs.append((convgrad.conv_forward(x, w, **kw),
                         convgrad.conv_weight_grad(x, dy, w.shape, **kw),
                         convgrad.conv_data_grad(w, dy, x.shape, **kw)))
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("isa", ISAS)
def test_streaming_stores_into_recycled_results(isa, rng, monkeypatch):
    """Forward and data gradient results whose memory comes back from the pool are
    written with streaming stores where a tile fills whole cache lines, however few
    products it sums (here the data gradient's stride phase with one tap: 64 products);
    the values are the same, and a fresh result is written with plain stores."""
    from convgrad.kernels import _results
    decided = recycled_results_and_decisions(monkeypatch, _results, "streams")
    case = _geometry(2, c=80, o=64, size=15, k=3, s=2, n=2)
    _forward_and_data_rounds(case, rng, True, 3, isa=isa)
    assert decided == [False, False, True, True, True, True]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("c", [64, 40], ids=["whole-lines", "part-lines"])
def test_16bit_results_stream_whole_lines(isa, dtype, c, rng, monkeypatch):
    """A channels-last 16-bit data gradient into recycled memory is written with
    streaming stores where its pixels are whole cache lines (64 channels: 128 bytes a
    pixel; 40 channels, 80 bytes: plain stores, the pool declines), rounded in the
    tiles or (engine debug bit 2) converted from float32 line buffers: bitwise the
    values of plain stores (debug bits 1, 16384), within the 16-bit error of the
    reference."""
    from convgrad.kernels import _results
    decided = recycled_results_and_decisions(monkeypatch, _results, "streams")
    case = _geometry(2, c=c, o=48, size=12, k=3, s=2, n=2)
    x, w, dy = make_arrays(case, rng, dtype, True)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    want = reference_results(case, x, w, dy)[2]
    got = {}
    _results.clear()
    with convgrad.config(algo="native", isa=isa):
        for bits in (0, 1, 2, 2 | 16384, 0, 1, 2, 2 | 16384):
            with engine_dbg(bits):
                dx = convgrad.conv_data_grad(w, dy, x.shape, **kw)
            got.setdefault(bits, []).append(np.array(dx, np.float32))
            del dx
    assert decided[-2:] == [c == 64] * 2
    for bits in got:
        np.testing.assert_array_equal(got[bits][-1], got[0][-1])
    assert_close(got[0][-1], want, dtype)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", [
    _geometry(2, c=40, o=24, size=13, k=1, s=3, pb=0, pe=0),            # dx pixels no tap reads
    _geometry(2, c=64, o=32, size=11, k=2, s=3, pb=0, pe=1, groups=2),  # groups, gaps
    _geometry(3, c=20, o=48, size=6, k=3, s=2),                        # partial blocks
    _geometry(1, c=33, o=17, size=29, k=3, s=1, d=2),                  # odd channels
], ids=["1x1-s3", "2x2-s3-groups", "3d-s2", "1d-odd"])
def test_16bit_channels_last_results_stored_by_the_tiles(isa, dtype, case, rng):
    """Channels-last float16 / bfloat16 forward and data gradient results are rounded
    and stored by the corr tiles (zeros where no tap reads, partial blocks, groups, odd
    channel counts): bitwise the values the float32 line buffers give (engine debug
    bit 2), within the 16-bit error of the reference."""
    x, w, dy = make_arrays(case, rng, dtype, True)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    want = reference_results(case, x, w, dy)
    got = {}
    with convgrad.config(algo="native", isa=isa):
        for bits in (0, 2):
            with engine_dbg(bits):
                got[bits] = (convgrad.conv_forward(x, w, **kw),
                             convgrad.conv_data_grad(w, dy, x.shape, **kw))
    for tiles, lines in zip(got[0], got[2]):
        assert tiles.dtype == dtype
        np.testing.assert_array_equal(tiles.view(np.uint16), lines.view(np.uint16))
    assert_close(got[0][0], want[0], dtype)
    assert_close(got[0][1], want[2], dtype)


def _forward_and_data_rounds(case, rng, channels_last, rounds, **settings):
    """The forward and data gradient of ``case`` ``rounds`` times on the native engine,
    each result checked against the reference and dropped (its memory back to the pool)
    before the next."""
    from convgrad.kernels import _results
    x, w, dy = make_arrays(case, rng, np.float32, channels_last)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    want = reference_results(case, x, w, dy)
    _results.clear()
    with convgrad.config(algo="native", **settings):
        for _ in range(rounds):
            y = convgrad.conv_forward(x, w, **kw)
            dx = convgrad.conv_data_grad(w, dy, x.shape, **kw)
            assert_close(y, want[0], np.float32)
            assert_close(dx, want[2], np.float32)
            del y, dx


@pytest.mark.parametrize("isa", ISAS)
def test_channels_first_pointwise_results_stream_into_recycled_memory(isa, rng, monkeypatch):
    """A channels-first 1x1 forward or data gradient (a correlation whose pixels are
    channels, rows of a sample's positions) streams into recycled result memory whose
    rows are whole cache lines, and writes a fresh result with plain stores; same
    values either way."""
    recycled_results_and_decisions(monkeypatch)
    seen = []
    real = native._corr
    monkeypatch.setattr(native, "_corr", lambda *a: seen.append(a[-1]) or real(*a))
    case = _geometry(2, c=48, o=40, size=16, k=1, pb=0, pe=0, n=2)
    _forward_and_data_rounds(case, rng, False, 2, isa=isa, threads=1)
    # one _corr call per sample: fresh results first, then the recycled ones
    assert seen == [False] * 4 + [True] * 4


@pytest.mark.parametrize("isa", ISAS)
def test_padding_is_never_an_operand(isa):
    # the NaN tap reads x[p - 1]: padding for p = 0, input for p = 1, 2 (D17)
    x = np.ones((1, 1, 3), np.float32)
    w = np.array([[[np.nan, 1.0, 1.0]]], np.float32)
    with convgrad.config(algo="native", isa=isa):
        y = convgrad.conv_forward(x, w, pads_begin=[1], pads_end=[1])
        dx = convgrad.conv_data_grad(w, np.ones((1, 1, 3), np.float32), x.shape,
                                     pads_begin=[1], pads_end=[1])
        dy = np.array([[[np.nan, 1.0, 1.0]]], np.float32)
        dw = convgrad.conv_weight_grad(x, dy, w.shape, pads_begin=[1], pads_end=[1])
    np.testing.assert_array_equal(np.isnan(y[0, 0]), [False, True, True])
    # dx[q] = sum_p dy[p] w[q - p + 1]: w[0] (NaN) reaches dx[q] for p = q + 1 <= 2
    np.testing.assert_array_equal(np.isnan(dx[0, 0]), [True, True, False])
    # dw[t] sums dy[p] x[p + t - 1]: dy[0] meets only taps t = 1, 2
    np.testing.assert_array_equal(np.isnan(dw[0, 0]), [False, True, True])


def test_channels_first_callers_get_channels_first_memory(rng):
    """No layout copy on the way back: an NCX caller's result is computed into NCX memory."""
    case = _geometry(2, c=16, o=24, size=20, k=3)
    x, w, dy = make_arrays(case, rng, np.float32, False)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    with convgrad.config(algo="native"):
        y = convgrad.conv_forward(x, w, **kw)
        dx = convgrad.conv_data_grad(w, dy, x.shape, **kw)
    assert y.flags.c_contiguous and y.base is None
    assert dx.flags.c_contiguous and dx.base is None


def test_empty_problems(rng):
    with convgrad.config(algo="native"):
        x = np.zeros((0, 4, 5, 5), np.float32)
        dy = np.zeros((0, 6, 3, 3), np.float32)
        dw = convgrad.conv_weight_grad(x, dy, (6, 2, 3, 3), groups=2)
        assert dw.shape == (6, 2, 3, 3) and not dw.any()
        dx = convgrad.conv_data_grad(np.ones((6, 2, 3, 3), np.float32), dy, x.shape, groups=2)
        assert dx.shape == x.shape
        y = convgrad.conv_forward(np.ones((2, 0, 5), np.float32), np.ones((3, 0, 2), np.float32))
        assert y.shape == (2, 3, 4) and not y.any()


def test_forcing_a_build_this_cpu_cannot_run_is_an_error():
    missing = [isa for isa in native.ISAS if isa not in ISAS]
    x = np.ones((1, 2, 5), np.float32)
    w = np.ones((3, 2, 2), np.float32)
    for isa in missing:
        with convgrad.config(algo="native", isa=isa):
            with pytest.raises(convgrad.ConvGradError, match=f"isa = '{isa}'"):
                convgrad.conv_forward(x, w)
    with pytest.raises(ValueError, match="isa must be one of"):
        with convgrad.config(isa="sse9"):
            pass


def test_the_default_build_is_the_widest_this_cpu_runs():
    info = native.info()
    assert info["default"] == ISAS[0]
    with convgrad.config(algo="native"):
        assert native.engine().isa == info["default"]
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " avx512f" in flags:
        assert info["default"] == "avx512"
    elif " avx2" in flags and " fma" in flags:
        assert info["default"] == "avx2"


def test_auto_chooses_the_engine_for_dense_float_problems():
    from convgrad.geometry import make_geometry
    geom = make_geometry("test", **_geometry(2, c=64, o=64, size=56, k=3))
    strided = make_geometry("test", **_geometry(2, c=64, o=64, size=56, k=3, s=2))
    for op in kernels.OPS:      # (float16 and bfloat16 calls compute in float32)
        # a 3x3 stride-1 layer: the engine's Winograd kernels; the direct ones for the
        # smallest error; a strided layer: the direct ones
        assert kernels.select(op, geom, np.float32).name == "winograd", op
        with convgrad.config(precision="highest"):
            assert kernels.select(op, geom, np.float32).name == "native", op
        assert kernels.select(op, strided, np.float32).name == "native", op
        assert kernels.select(op, geom, np.float64).name not in ("native", "winograd"), op


FALLBACK = r"""
import importlib.util, sys, warnings
real = importlib.util.find_spec
def hide(name, *a, **k):
    if name.startswith("convgrad.kernels._engine_"):
        return None
    return real(name, *a, **k)
importlib.util.find_spec = hide
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import convgrad
    from convgrad import kernels
    import numpy as np
msgs = [str(w.message) for w in caught if "native engine" in str(w.message)]
assert len(msgs) == 1, msgs
print(msgs[0])
from convgrad.geometry import make_geometry
g = make_geometry("t", n=1, c=8, o=8, groups=1, in_sizes=(9, 9), kernel=(3, 3),
                  out_sizes=(9, 9), strides=(1, 1), dilations=(1, 1), pads_begin=(1, 1),
                  pads_end=(1, 1))
print(kernels.select("fwd", g, np.float32).name)
y = convgrad.conv_forward(np.ones((1, 8, 9, 9), np.float32), np.ones((8, 8, 3, 3), np.float32),
                          pads_begin=[1, 1], pads_end=[1, 1])
print(float(y[0, 0, 4, 4]))
"""


def test_without_a_loadable_build_import_works_and_falls_back():
    out = subprocess.run([sys.executable, "-c", FALLBACK], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    warning, chosen, value = out.stdout.split("\n")[:3]
    assert "could not be loaded" in warning and "not built" in warning
    assert chosen in ("shifted", "im2col")
    assert float(value) == 72.0


# -- the AVX-512 build's logic on any CPU --------------------------------------------------
#
# This CPU may lack AVX-512, so the avx512 build cannot run here.  Its source is the
# same as every other build's except for a few helpers; compiled with 16-float
# vectors and portable helpers (CG_EMULATE_VL16) it runs anywhere, and checks the
# AVX-512 build's tile shapes, tails and register blocks.

# (the vl16_engine fixture, compiled once per test process: conftest.py)


@pytest.mark.parametrize("seed", range(10))
def test_the_16_float_build_logic_matches_the_naive_reference(vl16_engine, seed, rng,
                                                              monkeypatch):
    assert vl16_engine.vl == 16 and vl16_engine.corr_rmax[2] == 14
    monkeypatch.setattr(native, "engine", lambda: vl16_engine)
    case = random_case(200 + seed, wide=seed % 2 == 0)
    check(case, rng, channels_last=seed % 3 == 0,
          dtype=(np.float32, np.float32, np.float16, bfloat16)[seed % 4])
    if seed < 3:
        monkeypatch.setattr(native, "WGRAD_MAX_CHUNK", 40)
        monkeypatch.setattr(native, "WGRAD_MIN_CHUNK", 8)
        monkeypatch.setattr(native, "WGRAD_PANEL_BYTES", 1)
        check(list(STRUCTURAL.values())[seed], rng)


@pytest.mark.parametrize("name", ["dw-2d-k3-s2", "dw-mult3-1d", "spec-5to2-3d",
                                  "resnext-4to4x32", "g8-32to32", "g3-2to5-1d"])
def test_the_16_float_build_grouped_kernel_matches_the_reference(vl16_engine, name, rng,
                                                                  monkeypatch):
    """The grouped kernel (native/grouped.cpp) at 16 lanes: its lane tables, permutes
    and tails as the AVX-512 build runs them."""
    import test_grouped
    from convgrad.kernels import grouped
    monkeypatch.setattr(native, "engine", lambda: vl16_engine)
    grouped.plan.cache_clear()
    try:
        for channels_last, dtype in ((True, np.float32), (False, np.float16),
                                     (True, bfloat16)):
            test_grouped.check(test_grouped.CASES[name], rng, dtype=dtype,
                               channels_last=channels_last)
    finally:
        grouped.plan.cache_clear()


# -- results stored as float16 / bfloat16 ------------------------------------------------

def _rounding_inputs():
    """float32 values around every float16/bfloat16 rounding boundary: ties, the
    largest finite values, subnormals, zeros, infinities, NaNs, random bits."""
    rng = np.random.default_rng(7)
    bits = [rng.integers(0, 2**32, 2**20, dtype=np.uint64).astype(np.uint32)]
    for half_bits in (np.arange(2**16, dtype=np.uint32) << 16,                 # bf16 grid
                      np.arange(2**16, dtype=np.uint16).view(np.float16)
                      .astype(np.float32).view(np.uint32)):                      # f16 grid
        for delta in (-2, -1, 0, 1, 2, 0x1000, 0x0FFF, 0x1001, 0x8000, 0x7FFF, 0x8001):
            bits.append((half_bits.astype(np.int64) + delta).astype(np.uint32))
    x = np.concatenate(bits).view(np.float32)
    return np.concatenate([x, np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504,
                                        65519.996, 65520, 2.0**-24, 2.0**-25, 2.0**-26,
                                        3 * 2.0**-26], np.float32)])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("way", ["runs", "vectors"])
def test_results_stored_in_16_bits_round_like_numpy(isa, dtype, way):
    """store_run (runs) and the kernels' vector stores (simd.h store_as, vectors; a
    partial last vector) round every float32 like NumPy / ml_dtypes."""
    eng = native._ENGINES[isa]
    x = _rounding_inputs()[:-3]                           # (vectors: a partial last one)
    got = np.empty(x.size, dtype)
    fn = eng.lib.cg_store_floats if way == "runs" else eng.lib.cg_store_vectors
    fn(got.ctypes.data, native.DTYPE_CODES[np.dtype(dtype)], x.ctypes.data, x.size)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(dtype)
    same = got.view(np.uint16) == want.view(np.uint16)
    nan = np.isnan(x)
    assert same[~nan].all(), x[~nan][~same[~nan]][:10]
    assert np.isnan(got[nan].astype(np.float32)).all()       # NaN stays NaN, sign kept
    assert (np.signbit(got[nan].astype(np.float32)) == np.signbit(x[nan])).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["f16", "bf16"])
def test_large_float32_results_narrow_on_the_engines_threads_like_numpy(isa, dtype, rng,
                                                                       monkeypatch):
    """A large float32 result cast to 16 bits (a weight gradient's, computed in float32)
    goes through the engine in ranges on its threads (native.narrowed_copy): every value
    rounded as NumPy / ml_dtypes round it, NaN a NaN of its sign, on a size that does not
    split evenly; small arrays take NumPy's path.  Through the public call: a float16 /
    bfloat16 weight gradient of 73,728 values is bit for bit what NumPy's / ml_dtypes'
    cast of the same float32 sums gives."""
    x = _rounding_inputs()[: 3 * native.NARROW_MIN_ELEMENTS + 37]
    with convgrad.config(isa=isa, threads=2):
        got = native.narrowed_copy(x, dtype)
        assert native.narrowed_copy(x[:100], dtype) is None
        assert native.narrowed_copy(x[::2], dtype) is None
    assert got is not None and got.dtype == np.dtype(dtype) and got.shape == x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(dtype)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(got[nan].astype(np.float32)).all()
    assert (np.signbit(got[nan].astype(np.float32)) == np.signbit(x[nan])).all()
    xs = rng.standard_normal((2, 64, 9, 9)).astype(dtype)
    dys = rng.standard_normal((2, 128, 9, 9)).astype(dtype)
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1])
    casts = []
    real = native.narrowed_copy
    monkeypatch.setattr(native, "narrowed_copy", lambda a, dt: casts.append(a.size) or real(a, dt))
    with convgrad.config(algo="native", isa=isa, threads=2):
        dw16 = convgrad.conv_weight_grad(xs, dys, (128, 64, 3, 3), **kw)
        monkeypatch.setattr(native, "narrowed_copy", lambda a, dt: None)
        dw_numpy = convgrad.conv_weight_grad(xs, dys, (128, 64, 3, 3), **kw)
    assert casts == [dw16.size] and dw16.size >= native.NARROW_MIN_ELEMENTS
    assert dw16.dtype == dw_numpy.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(dw16.view(np.uint16), dw_numpy.view(np.uint16))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("way", ["runs", "vectors"])
def test_16_bit_inputs_widen_exactly(isa, dtype, way):
    """Every float16/bfloat16 bit pattern widens to NumPy's / ml_dtypes' float32
    (convert_run: runs; the kernels' vector loads, simd.h load_as: vectors, a partial
    last vector); a NaN stays a NaN of its sign."""
    eng = native._ENGINES[isa]
    h = np.concatenate([np.arange(2**16, dtype=np.uint32).astype(np.uint16),
                        np.arange(5, dtype=np.uint16)]).view(dtype)
    got = np.full(h.size, -7.0, np.float32)
    fn = eng.lib.cg_load_floats if way == "runs" else eng.lib.cg_load_vectors
    fn(got.ctypes.data, h.ctypes.data, native.DTYPE_CODES[np.dtype(dtype)], h.size)
    want = h.astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.isnan(got[nan]).all()
    assert (np.signbit(got[nan]) == np.signbit(want[nan])).all()


@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["NCX", "NXC"])
def test_16_bit_calls_round_their_result_once_where_it_is_stored(dtype, channels_last, rng):
    """A float16/bfloat16 forward or data gradient comes back from the engine in its
    own dtype: the float32 sums rounded once, bit for bit NumPy's cast of the
    float32 result (and no float32 result in between)."""
    case = _geometry(2, c=24, o=40, size=21, k=3, s=2)
    x, w, dy = make_arrays(case, rng, dtype, channels_last)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    geom = convgrad.geometry.make_geometry("t", **case)
    from convgrad import ops
    with convgrad.config(algo="native"):
        for kind, a, b in (("fwd", x, w), ("dgrad", w, dy)):
            direct = ops.compute(kind, a, b, geom, np.dtype(dtype), result_in_dtype=True)
            wide = ops.compute(kind, a, b, geom, np.dtype(dtype))
            assert direct.dtype == np.dtype(dtype) and wide.dtype == np.float32
            np.testing.assert_array_equal(direct.view(np.uint16),
                                          wide.astype(dtype).view(np.uint16))
        y = convgrad.conv_forward(x, w, **kw)
    assert y.dtype == np.dtype(dtype) and y.flags.c_contiguous


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layout", ["XIO", "OIX", "strided"])
@pytest.mark.parametrize("groups", [1, 2])
def test_weights_in_any_layout(isa, layout, groups, rng):
    """Weights packed from channels-last (XIO: the data gradient's panels are 8 x 8
    transposes of it), channels-first and non-contiguous views."""
    case = _geometry(2, c=16 * groups, o=24 * groups, size=11, k=3, groups=groups)
    x, _, dy = make_arrays(case, rng, np.float32, True)
    shape = (case["o"], 16, 3, 3)
    if layout == "XIO":
        w = np.transpose(rng.standard_normal((3, 3, 16, case["o"])).astype(np.float32),
                         (3, 2, 0, 1))
    elif layout == "OIX":
        w = rng.standard_normal(shape).astype(np.float32)
    else:
        w = rng.standard_normal((shape[0], 2 * shape[1], 3, 5)).astype(np.float32)[:, ::2, :, 1:4]
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    args = dict(strides=case["strides"], dilations=case["dilations"],
                pads_begin=case["pads_begin"], groups=groups)
    with convgrad.config(algo="native", isa=isa):
        y = convgrad.conv_forward(x, w, **kw)
        dx = convgrad.conv_data_grad(w, dy, x.shape, **kw)
    assert_close(y, naive.forward(x, w, case["out_sizes"], **args), np.float32)
    assert_close(dx, naive.dgrad(w, dy, case["in_sizes"], **args), np.float32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, bfloat16])
def test_permuted_copies_are_exact(isa, dtype, rng):
    """The engine's blocked transposes (results brought back to a caller's layout)
    copy every element of a permuted view, edges of odd sizes included; with AVX-512,
    2-16 destination-contiguous columns (a weight gradient's taps back to OIX) as 16 x 16
    register transposes, and as 8 x 8 blocks with engine debug bit 2097152."""
    cases = [((9, 130, 131), (2, 1, 0)), ((3, 3, 67, 129), (3, 2, 0, 1)),
             ((3, 3, 3, 40, 72), (4, 3, 0, 1, 2)),           # taps merge into 27
             ((4, 4, 50, 67), (3, 2, 0, 1)), ((2, 200, 170), (2, 1, 0)),  # 16 and 2 taps
             ((5, 7, 9, 11, 13), (4, 2, 0, 3, 1)), ((33, 40, 29), (1, 2, 0)),
             ((2, 3, 3, 3, 70, 90), None)]
    for (shape, perm), bit in itertools.product(cases, (0, 2097152)):
        a = rng.standard_normal(shape).astype(dtype)
        if perm is None:                    # rank 6: NumPy's copy
            assert native.permuted_copy(a.transpose(5, 4, 3, 2, 1, 0)) is None
            continue
        v = a.transpose(perm)
        with convgrad.config(isa=isa), engine_dbg(bit):
            got = native.permuted_copy(v)
        assert got is not None and got.flags.c_contiguous and got.dtype == v.dtype
        assert got.tobytes() == np.ascontiguousarray(v).tobytes()
    # last axis contiguous, or rows not unit-strided: NumPy's copy
    assert native.permuted_copy(np.zeros((300, 200), dtype)[:, ::2]) is None
    assert native.permuted_copy(np.zeros((300, 200), dtype)[::2].T) is None


def test_permuted_copies_are_planned_once_per_view(rng):
    """A view's copy is planned once per shape, strides, dtype, build and thread count
    and then only patches its addresses: new arrays of a planned layout, one thread and
    three, float16, and four Python threads copying arrays of one layout at once (one
    runs the kept plan, the others plan their own) all come back bitwise equal to
    NumPy's copy."""
    import threading
    native._PERMUTES.clear()
    arrays = [rng.standard_normal((4, 96, 9, 11)).astype(np.float32) for _ in range(6)]
    for threads in (1, 3, 1):
        for a in arrays[:3]:
            v = np.moveaxis(a, 1, -1)
            with convgrad.config(threads=threads):
                got = native.permuted_copy(v)
            assert got.tobytes() == np.ascontiguousarray(v).tobytes()
    assert len(native._PERMUTES) == 2
    h = np.moveaxis(arrays[3].astype(np.float16), 1, -1)
    assert native.permuted_copy(h).tobytes() == np.ascontiguousarray(h).tobytes()
    assert len(native._PERMUTES) == 3
    got, errors = {}, []

    def copy(k):
        try:
            for _ in range(20):
                got[k] = native.permuted_copy(np.moveaxis(arrays[k], 1, -1))
                assert got[k].tobytes() == np.ascontiguousarray(
                    np.moveaxis(arrays[k], 1, -1)).tobytes()
        except AssertionError as exc:       # pragma: no cover - reported below
            errors.append(exc)
    workers = [threading.Thread(target=copy, args=(k,)) for k in range(2, 6)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors and len(got) == 4


@pytest.mark.parametrize("isa", ISAS)
def test_weight_gradients_come_back_in_the_callers_layout(isa, rng):
    """A channels-first (OIX) weight gradient large enough for the blocked
    transposes equals the channels-last (XIO) one, and the reference."""
    from convgrad import onednn
    case = _geometry(2, c=48, o=72, size=9, k=3, groups=1)
    x, _, dy = make_arrays(case, rng, np.float32, False)
    attrs = dict(strides=list(case["strides"]), pads_begin=list(case["pads_begin"]),
                 pads_end=list(case["pads_end"]), dilations=list(case["dilations"]))
    with convgrad.config(algo="native", isa=isa):
        oix = onednn.convolution_backward_weights(x, dy, [72, 48, 3, 3], data_format="NCX",
                                                  weights_format="OIX", **attrs)
        xio = onednn.convolution_backward_weights(x, dy, [3, 3, 48, 72], data_format="NCX",
                                                  weights_format="XIO", **attrs)
    assert oix.flags.c_contiguous and oix.shape == (72, 48, 3, 3)
    assert np.array_equal(oix, xio.transpose(3, 2, 0, 1))
    want = naive.wgrad(x.astype(np.float64), dy.astype(np.float64), (3, 3),
                       strides=case["strides"], dilations=case["dilations"],
                       pads_begin=case["pads_begin"], groups=1)
    assert_close(oix, want, np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_weight_stationary_calls(dtype, channels_last, rng):
    """Weights that outweigh the data: the items split the output blocks; an NCX or
    16-bit input is converted once beforehand (the weight gradient's two inputs
    too), counted in the memory estimate."""
    case = STRUCTURAL["weight-stationary-strided"]
    from convgrad.geometry import make_geometry
    geom = make_geometry("test", **case)
    for kind in ("fwd", "dgrad"):
        assert native._weight_stationary(geom, kind, native.engine().vl)
    check(case, rng, dtype=dtype, channels_last=channels_last)
    x, w, dy = make_arrays(case, rng, dtype, channels_last)
    from convgrad import ops
    call = ops.describe("dgrad", w, dy, geom, np.dtype(dtype))
    parts = native.memory(call)
    converted = [v for k, v in parts.items() if "float32 channels last" in k]
    assert converted == ([] if channels_last and dtype == np.float32 else [dy.size * 4])
    # a weight gradient whose inputs are small beside it converts them once, too
    assert native._small_wgrad_inputs(geom)
    parts = native.memory(ops.describe("wgrad", x, dy, geom, np.dtype(dtype)))
    converted = sorted(v for k, v in parts.items() if "float32 channels last" in k)
    assert converted == ([] if channels_last and dtype == np.float32
                         else sorted([x.size * 4, dy.size * 4]))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, bfloat16])
@pytest.mark.parametrize("n", [1, 4, 5])
def test_channels_first_pointwise_calls(dtype, n, rng, monkeypatch):
    """1x1 calls on NCX memory run as correlations whose pixels are channels (no
    layout change): every op equals the reference, the path is taken, and the
    weight gradient's sums do not depend on the thread count (samples in order)."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    taken, pw = [], []
    real, real_pw = native._transposed_pointwise, native._pointwise_wgrad
    monkeypatch.setattr(native, "_transposed_pointwise",
                        lambda *a: taken.append(1) or real(*a))
    monkeypatch.setattr(native, "_pointwise_wgrad", lambda *a: pw.append(1) or real_pw(*a))
    case = _geometry(2, c=40, o=24, size=11, k=1, pb=0, pe=0, n=n)
    for t in (1, 2, 3):
        check(case, rng, dtype=dtype, channels_last=False, threads=t)
    # every op of every call (the weight gradient: cg_pw_run, any dtype)
    assert len(taken) >= 6
    assert len(pw) == 3
    x, _, dy = make_arrays(case, rng, dtype, False)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    dws = []
    for t in (1, 2, 3):
        with convgrad.config(algo="native", threads=t):
            dws.append(convgrad.conv_weight_grad(x, dy, (24, 40, 1, 1), **kw))
    assert all(d.tobytes() == dws[0].tobytes() for d in dws)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("c,o,size,n", [(37, 13, 41, 4), (8, 8, 8, 5), (64, 70, 9, 1),
                                        (130, 9, 50, 4), (11, 41, 47, 4)])
def test_channels_first_pointwise_weight_gradient_kernel(isa, c, o, size, n, rng,
                                                         monkeypatch):
    """cg_pw_run (float32 NCX 1x1 weight gradients; either operand as the vector side):
    channels that fill no whole block, broadcast tiles of any height, positions past the
    last 8, several chunks and position ranges a sample (one sample: still several
    ranges); against the reference and the correlation path it replaced, on every
    build, 1 and 3 threads bitwise equal."""
    case = _geometry(2, c=c, o=o, size=size, k=1, pb=0, pe=0, n=n)
    _check_channels_first_wgrad_kernel(case, isa, "_pointwise_wgrad", "POINTWISE_KERNEL", rng,
                                       monkeypatch)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("c,o,size,n", [(37, 13, 41, 4), (64, 70, 9, 1), (130, 9, 50, 4)])
def test_channels_first_pointwise_16bit_weight_gradient_kernel(isa, dtype, c, o, size, n, rng,
                                                               monkeypatch):
    """cg_pw_run on float16 / bfloat16 NCX 1x1 weight gradients (each chunk's rows widened
    into scratch, the broadcast tile's rows as it comes to them): against the reference
    and the per-sample correlation it replaced (POINTWISE_16BIT off), on every build, 1
    and 3 threads bitwise equal."""
    case = _geometry(2, c=c, o=o, size=size, k=1, pb=0, pe=0, n=n)
    _check_channels_first_wgrad_kernel(case, isa, "_pointwise_wgrad", "POINTWISE_16BIT", rng,
                                       monkeypatch, dtype)


def _check_channels_first_wgrad_kernel(case, isa, kernel, switch, rng, monkeypatch,
                                       dtype=np.float32, channels_last=False):
    """The NCX (or NXC) weight gradient of ``case`` with native.<switch> on (1 and 3
    threads: native.<kernel> runs, bitwise equal) and off (the path it replaced), each
    against the reference."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    x, w, dy = make_arrays(case, rng, dtype, channels_last)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    want = reference_results(case, x, w, dy)[1]
    ran, real = [], getattr(native, kernel)
    monkeypatch.setattr(native, kernel, lambda *a: ran.append(1) or real(*a))
    got = []
    for new, threads in ((True, 1), (True, 3), (False, 2)):
        monkeypatch.setattr(native, switch, new)
        with convgrad.config(algo="native", isa=isa, threads=threads):
            got.append(convgrad.conv_weight_grad(x, dy, w.shape, **kw))
        assert_close(got[-1], want, dtype)
    assert len(ran) == 2
    np.testing.assert_array_equal(got[0], got[1])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ["long-lines-2d", "long-lines-strided", "taps-far-apart",
                                  "short-lines-3d", "dilated-strided", "all-padding-taps",
                                  "few-channels-folded", "few-channels-folded-1d",
                                  "weight-stationary", "lines-grouped-3d", "long-1d"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("panel", [1, 1 << 15], ids=["line-panels", "panels"])
def test_channels_first_weight_gradient_kernel(isa, name, dtype, panel, rng, monkeypatch):
    """cg_cfw_run (channels-first weight gradients of one group: x read in place, or
    its rows widened into a slab for 16-bit memory; dy transposed into panels): every
    rank, stride, dilation and padding (taps that read only padding, at either end), few
    input channels, one line or several a panel (a 16-bit slab's rows shared by the
    taps of several lines, cut at the input's edges), lines past one call's sum
    (CFW_SUM); against the reference and the kernel it replaced, on every build, 1 and 3
    threads bitwise equal."""
    case = dict(STRUCTURAL_CF.get(name) or STRUCTURAL[name])
    monkeypatch.setattr(native, "PARTIALS_BYTES", 2**40)
    monkeypatch.setattr(native, "CFW_PANEL_FLOATS", panel)
    _check_channels_first_wgrad_kernel(case, isa, "_cf_wgrad", "CF_WGRAD", rng, monkeypatch,
                                       dtype)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("geom", [
    _geometry(2, c=3, o=64, size=37, k=7, s=2, pb=3, pe=2, n=2),   # ResNet's conv1, small
    _geometry(2, c=3, o=40, size=30, k=5, s=2, pb=2, pe=0, n=2),
    _geometry(1, c=2, o=20, size=90, k=5, s=3, d=2, pb=4, pe=1, n=2),
    _geometry(3, c=1, o=16, size=9, k=3, s=2, pb=1, pe=1, n=2),
], ids=["conv1-like", "2d-tails", "1d-s3-dilated", "3d-one-channel"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("panel", [1, 1 << 15], ids=["line-panels", "panels"])
def test_channels_last_few_channel_weight_gradients_take_the_channels_first_kernel(
        isa, geom, dtype, panel, rng, monkeypatch):
    """Channels-last weight gradients with fewer input channels than cg_cfw_run's tile
    has rows run it on their pixels (CF_WGRAD_FEW_CHANNELS: a tile's rows at a position
    step of C floats, the folded taps' rows consecutive floats; each dy pixel's run of a
    block's channels copied into the panel; 16-bit rows widened into the slab): against
    the reference and the kernel they took before, every build, 1 and 3 threads bitwise
    equal."""
    from convgrad.geometry import make_geometry
    with convgrad.config(isa=isa):
        assert native._cf_few_channels(make_geometry("t", **geom))
    monkeypatch.setattr(native, "PARTIALS_BYTES", 2**40)
    monkeypatch.setattr(native, "CFW_PANEL_FLOATS", panel)
    _check_channels_first_wgrad_kernel(geom, isa, "_cf_wgrad", "CF_WGRAD_FEW_CHANNELS", rng,
                                       monkeypatch, dtype, channels_last=True)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ["long-lines-2d", "dilated-strided", "short-lines-3d",
                                  "all-padding-taps", "long-1d", "weight-stationary"])
def test_channels_first_weight_gradient_writes_the_oix_result(isa, name, rng, monkeypatch):
    """With partial gradients, the channels-first weight gradient's sum stores an OIX
    caller's result itself (cg_sum_parts_oix, CF_WGRAD_OIX; channel ranges of a few
    rows, SUM_OIX_BYTES): bitwise what the (*K, C, O) sum and its permuted copy give,
    NaN and Inf included, on every build, 1 and 3 threads; the result is that OIX
    memory, no copy of it."""
    case = dict(STRUCTURAL_CF.get(name) or STRUCTURAL[name])
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    monkeypatch.setattr(native, "PARTIALS_BYTES", 2**40)
    monkeypatch.setattr(native, "SUM_OIX_BYTES", 1)            # one channel a range
    x, w, dy = make_arrays(case, rng, np.float32, False)
    x[0, 0, ...] = np.nan                                      # (one input channel's row)
    dy[-1, -1, ...] = np.inf
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    sums, real = [], native._bind_sum_parts
    monkeypatch.setattr(native, "_bind_sum_parts",
                        lambda *a: sums.append(a[4:]) or real(*a))
    copies, real_copy = [], native.permuted_copy
    monkeypatch.setattr(native, "permuted_copy", lambda a: copies.append(1) or real_copy(a))
    got = []
    for oix, threads in ((True, 1), (True, 3), (False, 2)):
        monkeypatch.setattr(native, "CF_WGRAD_OIX", oix)
        sums.clear(), copies.clear()
        with convgrad.config(algo="native", isa=isa, threads=threads):
            got.append(convgrad.conv_weight_grad(x, dy, w.shape, **kw))
        assert got[-1].shape == w.shape and got[-1].flags.c_contiguous
        assert len(sums) == int(oix), sums                     # (the OIX sum, or not)
        assert bool(copies) != oix or got[-1].size < native.PERMUTE_MIN_ELEMENTS
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], got[2])
    assert np.isnan(got[0]).any()
    finite = np.isfinite(got[0])
    assert_close(np.where(finite, got[0], 0),
                 np.where(finite, reference_results(case, np.nan_to_num(x, nan=0, posinf=0),
                                                    w, np.nan_to_num(dy, posinf=0))[1], 0),
                 np.float32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("channels_last", [True, False], ids=["nxc", "ncx"])
@pytest.mark.parametrize("geom", [
    _geometry(2, c=3, o=40, size=37, k=7, s=2, pb=3, pe=2, n=2),   # ResNet's conv1, small
    _geometry(1, c=2, o=20, size=90, k=5, s=3, d=2, pb=4, pe=1, n=2),
], ids=["conv1-like", "1d-s3-dilated"])
def test_few_channel_taps_share_tiles(isa, channels_last, geom, rng, monkeypatch):
    """Weight gradients with fewer input channels than a tile has rows put the rows of
    several w taps in one tile (channels-last: the taps of a stride phase, met in phase
    order; channels-first: cg_cfw_run's taps over their common positions; engine debug
    bit 256 keeps one tap a tile / kw order): both against the reference, and the
    regrouped sums are really another association (not bit for bit the same)."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    monkeypatch.setattr(native, "PARTIALS_BYTES", 2**40)
    x, w, dy = make_arrays(geom, rng, np.float32, channels_last)
    kw = {k: geom[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    want = reference_results(geom, x, w, dy)[1]
    got = {}
    with convgrad.config(algo="native", isa=isa, threads=2):
        for bit in (0, 256):
            with engine_dbg(bit):
                got[bit] = convgrad.conv_weight_grad(x, dy, w.shape, **kw)
    for bit in (0, 256):
        assert_close(got[bit], want, np.float32)
    assert not np.array_equal(got[0], got[256])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("geom", [
    _geometry(2, c=9, o=12, size=11, k=3, s=2, pb=2, pe=0, n=2),
    _geometry(2, c=16, o=10, size=8, k=1, pb=0, pe=0, n=2),       # pointwise: cg_pw_run
    _geometry(1, c=8, o=16, size=30, k=5, d=3, pb=7, pe=1, n=1),
], ids=["2d-s2", "1x1", "1d-dilated"])
def test_channels_first_weight_gradients_never_multiply_padding(isa, geom, rng):
    """NaN and Inf in x and dy reach exactly the weight-gradient entries the float64
    reference gives them (D17: taps that read padding are not applied), on the kernels of
    channels-first float32 calls (cg_cfw_run, cg_pw_run)."""
    x, w, dy = make_arrays(geom, rng, np.float32, False)
    x, dy = x.copy(), dy.copy()
    x.reshape(-1)[rng.choice(x.size, 3, replace=False)] = np.nan
    dy.reshape(-1)[rng.choice(dy.size, 2, replace=False)] = np.inf
    kw = {k: geom[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    with convgrad.config(algo="native", isa=isa, threads=2):
        got = convgrad.conv_weight_grad(x, dy, w.shape, **kw)
    with convgrad.config(algo="reference"):
        want = convgrad.conv_weight_grad(x.astype(np.float64), dy.astype(np.float64),
                                         w.shape, **kw)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    assert np.isnan(want).any() and np.isfinite(want).any()


@pytest.mark.parametrize("kw,ntap,nblocks,threads", [
    (3, 9, 8, 2), (3, 9, 16, 2), (4, 16, 8, 2), (3, 3, 8, 2), (1, 1, 4, 3), (3, 27, 2, 2),
    (2, 4, 7, 2)])
def test_weight_gradient_grid_tasks_cover_every_tap_and_block_once(kw, ntap, nblocks,
                                                                    threads):
    """Split by outputs, tasks are rows of Kw taps x equal ranges of output blocks: each
    (tap, block) in exactly one task, at least WGRAD_TASKS_PER_THREAD a thread where the
    blocks can be cut that finely, rows in order."""
    tasks = native._wgrad_grid(kw, ntap, nblocks, threads)
    seen = np.zeros((ntap, nblocks), int)
    for t0, t1, b0, b1 in tasks:
        assert t1 - t0 == kw and t0 % kw == 0 and b1 > b0
        seen[t0:t1, b0:b1] += 1
    assert (seen == 1).all()
    sizes = {b1 - b0 for *_, b0, b1 in tasks}
    assert len(sizes) == 1                                  # equal ranges
    target = native.WGRAD_TASKS_PER_THREAD * threads
    assert len(tasks) >= min(target, ntap // kw * nblocks)
    assert [t[0] for t in tasks] == sorted(t[0] for t in tasks)


def test_weight_gradients_split_by_outputs_are_the_same_on_any_grid(rng, monkeypatch):
    """Channels-last float32 weight gradients whose partials exceed the budget run as a
    grid of (tap row, output-block range) tasks; each weight is summed by one task in
    one order, so the result is bitwise that of the tap-only split and of any thread
    count, and equal to the reference."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    monkeypatch.setattr(native, "PARTIALS_BYTES", 0)
    case = _geometry(2, c=40, o=100, size=9, k=3, pb=1, pe=1, n=3)
    x, w, dy = make_arrays(case, rng, np.float32, True)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    got, grids, real = [], [], native._wgrad_grid
    monkeypatch.setattr(native, "_wgrad_grid", lambda *a: grids.append(a) or real(*a))
    monkeypatch.setattr(native, "WGRAD_OIX", False)     # (an OIX caller: see below)
    for grid, threads in ((True, 2), (False, 2), (True, 1), (True, 3)):
        monkeypatch.setattr(native, "WGRAD_GRID_TASKS", grid)
        grids.clear()
        with convgrad.config(algo="native", threads=threads):
            got.append(convgrad.conv_weight_grad(x, dy, w.shape, **kw))
        assert bool(grids) == grid
    assert_close(got[0], reference_results(case, x, w, dy)[1], np.float32)
    for other in got[1:]:
        np.testing.assert_array_equal(other, got[0])


def test_channels_first_weight_gradients_with_large_partials_convert(rng, monkeypatch):
    """Where the partial gradients of cg_cfw_run's line ranges exceed the budget, the
    conversion path runs (one output-block range per thread was slow after a pause)."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    monkeypatch.setattr(native, "PARTIALS_BYTES", 0)
    case = STRUCTURAL["long-lines-2d"]
    x, w, dy = make_arrays(case, rng, np.float32, False)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    ran, real = [], native._cf_wgrad
    monkeypatch.setattr(native, "_cf_wgrad", lambda *a: ran.append(1) or real(*a))
    with convgrad.config(algo="native", threads=2):
        got = convgrad.conv_weight_grad(x, dy, w.shape, **kw)
    assert_close(got, reference_results(case, x, w, dy)[1], np.float32)
    assert not ran


# channels-first weight gradients: one group, and a 1-D line longer than one call's sum
STRUCTURAL_CF = {
    "long-1d": _geometry(1, c=10, o=20, size=1500, k=3, d=4, pb=5, pe=2, n=2),
    "lines-grouped-3d": _geometry(3, c=9, o=20, size=17, k=3, d=2, pb=2, pe=1),
}


def test_a_library_whose_files_were_built_for_different_isas_is_refused():
    """Every source file reports its build (CG_ISA_OF); the loader refuses a library
    linked from objects of different builds (a parallel setuptools build once linked
    generic objects into the avx2 library) or missing one of the files."""
    class Fn:
        def __init__(self, value):
            self.value = value

        def __call__(self):
            return self.value.encode()

    class Lib:
        def __init__(self, **isas):
            for unit, isa in isas.items():
                setattr(self, f"cg_isa_{unit}", Fn(isa))

    native.check_units(Lib(**{u: "avx2" for u in native.UNITS}), "avx2", "x.so")
    with pytest.raises(ImportError, match="its grouped code was compiled for 'generic'"):
        mixed = {u: "generic" if u == "grouped" else "avx2" for u in native.UNITS}
        native.check_units(Lib(**mixed), "avx2", "x.so")
    with pytest.raises(ImportError, match="no winograd code"):
        native.check_units(Lib(engine="avx2", grouped="avx2"), "avx2", "x.so")
    eng = native.engine()
    for unit in native.UNITS:
        fn = getattr(eng.lib, f"cg_isa_{unit}")
        assert fn().decode() == eng.isa


# (rank, channels, outputs, size, kernel, groups, samples, channels first, partials budget):
# each reaches one way the engine's weight-gradient tasks own their part of the result
WGRAD_TASK_MODES = {
    "partials": (2, 16, 24, 12, 3, 1, 2, False, None),
    "one-chunk": (1, 16, 24, 40, 3, 1, 1, False, None),
    "split-taps": (2, 16, 80, 9, 3, 1, 2, False, 0),
    "split-blocks-groups": (1, 48, 192, 400, 1, 3, 2, False, 0),
    "channels-first-partials": (2, 16, 24, 12, 3, 1, 2, True, None),
    "channels-first-one-chunk": (1, 16, 24, 40, 3, 1, 1, True, None),
}


@pytest.mark.parametrize("mode", sorted(WGRAD_TASK_MODES))
def test_weight_gradient_tasks_zero_what_they_add_into(mode, rng, monkeypatch):
    """The engine's weight-gradient tasks zero the part of the result (or the partial
    gradient) they add into themselves: a result in recycled memory full of NaN, every
    way of cutting the work (partials summed by cg_sum_parts, one chunk, whole taps per
    task, output blocks per task across groups, the channels-first kernel) gives the
    reference, and the same bits as the first call."""
    from convgrad.geometry import make_geometry
    from convgrad.kernels import _results
    r, c, o, size, k, groups, n, cfirst, partials = WGRAD_TASK_MODES[mode]
    monkeypatch.setattr(_results, "MIN_BYTES", 0)
    if partials is not None:
        monkeypatch.setattr(native, "PARTIALS_BYTES", partials)
    case = _geometry(r, c=c, o=o, size=size, k=k, groups=groups, n=n)
    geom = make_geometry("test", **case)
    x64 = rng.standard_normal((n, c) + (size,) * r)
    dy64 = rng.standard_normal((n, o) + case["out_sizes"])
    if cfirst:          # channels-last views of channels-first memory
        x, dy = (np.moveaxis(a.astype(np.float32), 1, -1) for a in (x64, dy64))
    else:
        x, dy = (np.ascontiguousarray(np.moveaxis(a, 1, -1), np.float32) for a in (x64, dy64))
    ref = naive.wgrad(x64.astype(np.float32).astype(np.float64),
                      dy64.astype(np.float32).astype(np.float64), case["kernel"],
                      strides=case["strides"], dilations=case["dilations"],
                      pads_begin=case["pads_begin"], groups=groups)       # OIX
    want = np.moveaxis(ref, (0, 1), (-1, -2))                             # (*K, C/G, O)
    _results.clear()
    for threads in (1, 2, 3):         # (2: "split-blocks-groups" has a task across groups)
        with convgrad.config(threads=threads):
            first = native.wgrad(x, dy, geom)
            bits = first.copy()
            first[...] = np.nan
            del first
            again = native.wgrad(x, dy, geom)
        assert _results.recycled(again)
        np.testing.assert_array_equal(again, bits)
        assert_close(again, want, np.float32)


@pytest.mark.parametrize("isa", ISAS)
def test_partial_sums_add_in_numpy_order(isa, rng):
    """cg_sum_parts sums partial gradients in NumPy's add.reduce order (the same bits),
    NaN and Inf included, over ranges that split vectors anywhere."""
    parts = rng.standard_normal((5, 3 * 4096 + 37)).astype(np.float32)
    parts[1, 7], parts[2, 8], parts[3, 8], parts[4, 9000] = np.nan, np.inf, -np.inf, np.inf
    with np.errstate(invalid="ignore"):
        want = np.add.reduce(parts, axis=0)
    with convgrad.config(isa=isa):
        for threads in (1, 2, 3):
            out = np.full(parts.shape[1], 7.0, np.float32)
            native._sum_parts(native.engine(), parts, out, threads)
            np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("kernel", ["native", "winograd"])
def test_weight_gradients_are_computed_into_recycled_memory(kernel, rng):
    """A weight gradient of 1 MiB or more is zeroed and summed in memory from the result
    pool, taken back once the caller drops it: a fresh np.zeros faulted its pages in
    the kernels' threads whenever other code had made the heap give memory back
    (ResNet-50 res5: 12-14 ms alone, 26-36 ms alternating with PyTorch)."""
    from convgrad.geometry import make_geometry
    from convgrad.kernels import _results, winograd
    case = _geometry(2, c=128, o=256, size=10, k=3, n=2)
    geom = make_geometry("test", **case)
    x = rng.standard_normal((2, 10, 10, 128)).astype(np.float32)
    dy = rng.standard_normal((2, 10, 10, 256)).astype(np.float32)
    run = native.wgrad if kernel == "native" else winograd.wgrad
    first = run(x, dy, geom)
    want = first.copy()
    first[...] = np.nan                      # a recycled buffer keeps what was in it
    del first
    again = run(x, dy, geom)
    assert _results.recycled(again)
    np.testing.assert_array_equal(again, want)
    ref = naive.wgrad(np.moveaxis(x, -1, 1).astype(np.float64),
                      np.moveaxis(dy, -1, 1).astype(np.float64), (3, 3),
                      strides=case["strides"], dilations=case["dilations"],
                      pads_begin=case["pads_begin"], groups=1)          # OIX
    assert_close(again, ref.transpose(2, 3, 1, 0), np.float32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_channels_first_pointwise_samples_run_as_engine_tasks(isa, dtype, rng, monkeypatch):
    """Channels-first 1x1 forward and data gradients whose samples share out over the
    threads run a sample per engine task (cg_pw_sample_task: its panels, then its
    correlation, on one thread): bitwise the results of one Python pool thread per
    sample (PW_SAMPLE_TASKS off), equal to the reference."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    case = _geometry(2, c=24, o=40, size=9, k=1, pb=0, pe=0, n=4)
    x, w, dy = make_arrays(case, rng, dtype, False)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    want = reference_results(case, x, w, dy)
    ran, real = [], native._pw_samples
    monkeypatch.setattr(native, "_pw_samples", lambda *a: ran.append(real(*a)) or ran[-1])
    got = {}
    for on in (True, False):
        monkeypatch.setattr(native, "PW_SAMPLE_TASKS", on)
        ran.clear()
        with convgrad.config(algo="native", isa=isa, threads=2):
            got[on] = (convgrad.conv_forward(x, w, **kw),
                       convgrad.conv_data_grad(w, dy, x.shape, **kw))
        assert ran == ([True, True] if on else [])
    for k, i in ((0, 0), (1, 2)):
        np.testing.assert_array_equal(got[True][k], got[False][k])
        assert_close(got[True][k], want[i], dtype)


def _off_and_on(monkeypatch, switch, parts, isa, call):
    """call()'s results on the native kernel with ``native.<switch>`` off (2 threads) and
    on (2, 1 and 3 threads), twice each (the second call runs bound); ``parts`` (filled by
    the caller's spy) must show a part made exactly when the switch is on."""
    got = []
    for on, threads in ((False, 2), (True, 2), (True, 1), (True, 3)):
        monkeypatch.setattr(native, switch, on)
        parts.clear()
        with convgrad.config(algo="native", isa=isa, threads=threads):
            for _ in range(2):
                got.append(call())
        assert parts and all(bool(p) == on for p in parts), parts
    return got


# weight gradients split by outputs whose caller keeps OIX: tasks of every tap write
# their part of the OIX result themselves (native._oix_tasks, cg_wgrad_run_shared)
OIX_CASES = {
    "2d": _geometry(2, c=40, o=100, size=9, k=3, pb=1, pe=1, n=3),
    "1d-dilated": _geometry(1, c=24, o=70, size=40, k=3, d=4, pb=2, pe=5, n=2),
    "3d": _geometry(3, c=12, o=48, size=5, k=2, pb=0, pe=1, n=2),
    "strided": _geometry(2, c=30, o=70, size=11, k=4, s=2, pb=1, pe=2, n=2),
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", OIX_CASES)
def test_weight_gradients_written_as_oix_are_the_permuted_ones(isa, name, rng, monkeypatch):
    """The OIX result the tasks write themselves is bitwise the (*K, C, O) result
    permuted afterwards (the same sums in the same order), on 1, 2 and 3 threads, the
    bound and unbound calls, and equal to the reference; an XIO caller never gets it."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    monkeypatch.setattr(native, "PARTIALS_BYTES", 0)
    case = OIX_CASES[name]
    x, w, dy = make_arrays(case, rng, np.float32, True)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    parts, real = [], native._oix_tasks
    monkeypatch.setattr(native, "_oix_tasks", lambda *a: parts.append(real(*a)[1]) or real(*a))

    def call():
        dw = convgrad.conv_weight_grad(x, dy, w.shape, **kw)
        assert dw.flags.c_contiguous
        return dw
    got = _off_and_on(monkeypatch, "WGRAD_OIX", parts, isa, call)
    assert_close(got[0], reference_results(case, x, w, dy)[1], np.float32)
    for other in got[1:]:
        np.testing.assert_array_equal(other, got[0])
    # a caller keeping XIO (oneDNN Graph's default weights_format) gets the kernel's
    # (*K, C, O) memory as it is
    parts.clear()

    def nxc(a):
        return np.ascontiguousarray(np.moveaxis(a, 1, -1))
    with convgrad.config(algo="native", isa=isa):
        xio = convgrad.onednn.convolution_backward_weights(
            nxc(x), nxc(dy), list(w.shape[2:]), strides=kw["strides"],
            pads_begin=kw["pads_begin"], pads_end=kw["pads_end"], dilations=kw["dilations"])
    assert parts and not any(parts)
    np.testing.assert_array_equal(xio, np.moveaxis(np.moveaxis(got[0], 0, -1), 0, -2))


STREAM_CASES = {
    **OIX_CASES,
    "whole-lines": _geometry(2, c=20, o=64, size=8, k=3, pb=1, pe=1, n=2),
    "packed-whole-taps": _geometry(2, c=16, o=96, size=10, k=3, pb=1, pe=1, n=2),
}


def _stream_case(monkeypatch, rng, name, dtype):
    """STREAM_CASES[name] and its x, w, dy in ``dtype`` (channels-last but for the packed case),
    the list the spied ``native._stream_part`` fills, and the call of its weight gradient
    by an XIO caller (the kernel's (*K, C, O) result is the caller's); every weight
    gradient split by outputs may stream (no serial, partial-sum or channels-first path,
    no size floor)."""
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    monkeypatch.setattr(native, "PARTIALS_BYTES", 0)
    monkeypatch.setattr(native, "WGRAD_STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(native, "CF_WGRAD", False)
    case = STREAM_CASES[name]
    channels_last = name != "packed-whole-taps"
    x, w, dy = make_arrays(case, rng, dtype, channels_last)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations")}
    parts, real = [], native._stream_part
    monkeypatch.setattr(native, "_stream_part",
                        lambda *a: parts.append(real(*a)) or parts[-1])

    def nxc(a):
        return np.ascontiguousarray(np.moveaxis(a, 1, -1))

    def call():
        return convgrad.onednn.convolution_backward_weights(
            nxc(x) if channels_last else np.moveaxis(x, 1, -1),
            nxc(dy) if channels_last else np.moveaxis(dy, 1, -1), list(w.shape[2:]), **kw)
    return case, x, w, dy, parts, call


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", STREAM_CASES)
def test_streamed_weight_gradients_are_the_ones_summed_in_place(isa, name, rng, monkeypatch):
    """A (*K, C, O) result whose tasks sum their parts in scratch and stream the rows
    (whole cache lines with streaming stores, other rows -- partial last blocks, rows not
    64-byte aligned -- plainly) is bitwise the one summed in the result's rows, on 1, 2 and
    3 threads, bound and unbound, inputs read in place and converted (NCX: whole-tap
    tasks), and equal to the reference; without WGRAD_STREAM no part is made."""
    case, x, w, dy, parts, call = _stream_case(monkeypatch, rng, name, np.float32)
    got = _off_and_on(monkeypatch, "WGRAD_STREAM", parts, isa, call)
    want = reference_results(case, x, w, dy)[1]
    assert_close(np.moveaxis(np.moveaxis(got[0], -1, 0), -1, 1), want, np.float32)
    for other in got[1:]:
        np.testing.assert_array_equal(other, got[0])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("name", ["whole-lines", "1d-dilated", "strided", "packed-whole-taps"])
def test_16_bit_streamed_weight_gradients_round_their_float32_sums_once(isa, dtype, name, rng,
                                                                       monkeypatch):
    """A float16/bfloat16 weight gradient whose tasks stream their dw rows stores them in
    the caller's dtype (no float32 dw, no narrowing pass): bitwise the float32 sums
    rounded once, i.e. the result without streaming (float32 dw narrowed by the
    front-end), on 1, 2 and 3 threads, bound and unbound, inputs read in place and
    converted; the kernel's own result is 16-bit exactly when it streams."""
    case, x, w, dy, parts, xio_call = _stream_case(monkeypatch, rng, name, dtype)
    kernel_dtypes, streamed_dtype = [], native._streamed_dtype
    monkeypatch.setattr(native, "_streamed_dtype", lambda *a: kernel_dtypes.append(
        streamed_dtype(*a)) or kernel_dtypes[-1])

    def call():
        kernel_dtypes.clear()
        dw = xio_call()
        assert dw.dtype == np.dtype(dtype)
        return dw, kernel_dtypes[:]
    got = _off_and_on(monkeypatch, "WGRAD_STREAM", parts, isa, call)
    # (the kernel's result dtype: unbound call, then the call that binds)
    assert all(k == [np.float32] for _, k in got[:2]), [k for _, k in got]
    assert all(k == [np.dtype(dtype)] for _, k in got[2:]), [k for _, k in got]
    want = reference_results(case, x, w, dy)[1]
    assert_close(np.moveaxis(np.moveaxis(got[0][0], -1, 0), -1, 1), want, dtype)
    for other, _ in got[1:]:
        np.testing.assert_array_equal(other.view(np.uint16), got[0][0].view(np.uint16))


@pytest.mark.parametrize("dims", [
    dict(c=128, o=128, size=56, k=3, s=2, n=8),       # ResNet-50 res3 stride 2: 224 lines
    dict(c=256, o=64, size=56, k=1, pb=0, pe=0, n=8),   # res2 1x1: 448
    dict(c=3, o=64, size=224, k=7, s=2, pb=3, pe=3, n=8),   # conv1: 896
    dict(c=20, o=24, size=37, k=3, n=3),                # 111 lines, prime-ish
], ids=["res3s2", "res2-1x1", "conv1", "odd"])
def test_wgrad_chunks_hold_equal_work(dims):
    """Where the weight gradient sums partials of position chunks, every chunk (a task)
    holds the same number of work items and its lines differ from another's by at most
    one; the items cover the lines once, in order (the 8 partials: WGRAD_CHUNKS)."""
    from convgrad.geometry import make_geometry
    geom = make_geometry("test", **_geometry(2, **dims))
    eng = native.engine()
    plan = native._wgrad_plan_of(eng, geom, 2)
    assert not plan.split_outputs and plan.chunks == native.WGRAD_CHUNKS
    items = plan.items
    assert items[0, 0] == 0 and (items[1:, 0] == items[:-1, 1]).all()
    assert items[-1, 1] == geom.n * geom.out_sizes[0]
    tasks = native._wgrad_tasks(plan, geom, False, 2)
    assert len(tasks) == plan.chunks
    assert len({hi - lo for lo, hi, *_ in tasks}) == 1, tasks
    lines = [int(items[hi - 1, 1] - items[lo, 0]) for lo, hi, *_ in tasks]
    assert max(lines) - min(lines) <= 1, lines


def test_stream_parts_stay_within_the_part_limits(monkeypatch):
    """Parts for one group, tasks split by outputs, results of at least
    WGRAD_STREAM_MIN_BYTES, within WGRAD_OIX_PART_BYTES and 3/4 of the L2: ResNet-50
    res5's grid (3 taps x a range of output blocks x 512 input channels)."""
    from convgrad.geometry import make_geometry
    geom = make_geometry("test", **_geometry(2, c=512, o=512, size=7, k=3, n=8))
    eng = native.engine()
    monkeypatch.setattr(native, "l2_bytes", lambda: 2 << 20)     # (a Sapphire Rapids core)
    plan = native._wgrad_plan_of(eng, geom, 2)
    tasks = native._wgrad_tasks(plan, geom, False, 2)
    part = native._stream_part(plan, geom, tasks, eng.vl)
    assert part == 3 * 512 * max(t[3] - t[2] for t in tasks) * plan.nv * eng.vl
    assert 0 < 4 * part <= min(native.WGRAD_OIX_PART_BYTES, native.l2_bytes() * 3 // 4)
    monkeypatch.setattr(native, "WGRAD_OIX_PART_BYTES", 1024)
    assert native._stream_part(plan, geom, tasks, eng.vl) == 0
    monkeypatch.setattr(native, "WGRAD_OIX_PART_BYTES", 2**30)
    monkeypatch.setattr(native, "WGRAD_STREAM_MIN_BYTES", 4 * 9 * 512 * 512 + 1)
    assert native._stream_part(plan, geom, tasks, eng.vl) == 0
    monkeypatch.undo()
    # a core with a 1 MiB L2 (Zen 4, Zen 5): the 768 KiB parts take 3/4 of it
    monkeypatch.setattr(native, "l2_bytes", lambda: 1 << 20)
    assert native._stream_part(plan, geom, tasks, eng.vl) == part == 3 * 2**18 // 4
    monkeypatch.setattr(native, "WGRAD_STREAM_PART_L2", 5 / 8)
    assert native._stream_part(plan, geom, tasks, eng.vl) == 0


def test_oix_tasks_take_every_tap_of_equal_block_ranges(monkeypatch):
    """Each (tap, output block) in exactly one task, every task all taps, at least
    WGRAD_TASKS_PER_THREAD a thread, parts within WGRAD_OIX_PART_BYTES (else none);
    only for OIX callers, one group, inputs read in place."""
    from convgrad.geometry import make_geometry
    geom = make_geometry("test", **_geometry(2, c=512, o=512, size=7, k=3, n=8))
    eng = native.engine()
    monkeypatch.setattr(native, "l2_bytes", lambda: 2 << 20)     # (a Sapphire Rapids core)
    plan, _ = native._wgrad_problem(eng, np.zeros((8, 7, 7, 512), np.float32),
                                    np.zeros((8, 7, 7, 512), np.float32), geom, 2)
    assert plan.split_outputs
    tasks, part = native._oix_tasks(plan, geom, True, 2, eng.vl, "ncx")
    seen = np.zeros((9, plan.nblocks), int)
    for lo, hi, b0, b1, t0, t1 in tasks:
        assert (lo, hi, t0, t1) == (0, len(plan.items), 0, 9)
        seen[:, b0:b1] += 1
        assert 9 * 512 * (b1 - b0) * plan.nv * eng.vl <= part
    assert (seen == 1).all() and len(tasks) >= native.WGRAD_TASKS_PER_THREAD * 2
    assert 4 * part <= min(native.WGRAD_OIX_PART_BYTES, native.l2_bytes() * 5 // 8)
    # a core with a 1 MiB L2 (Zen 4): parts of at most 640 KiB, which this problem's
    # 8 tasks exceed (more tasks re-pack x more: not taken)
    monkeypatch.setattr(native, "l2_bytes", lambda: 1 << 20)
    assert native._oix_tasks(plan, geom, True, 2, eng.vl, "ncx") == ([], 0)
    assert native._oix_tasks(plan, geom, True, 2, eng.vl, "nxc") == ([], 0)
    assert native._oix_tasks(plan, geom, True, 2, eng.vl, None) == ([], 0)
    assert native._oix_tasks(plan, geom, False, 2, eng.vl, "ncx") == ([], 0)
    monkeypatch.setattr(native, "WGRAD_OIX_PART_BYTES", 1024)
    assert native._oix_tasks(plan, geom, True, 2, eng.vl, "ncx") == ([], 0)


@pytest.mark.parametrize("isa", ISAS)
def test_packed_x_panels_find_their_tiles_once_a_call(isa, rng, monkeypatch):
    """pack_panel's tile starts computed once a call (engine debug bit 65536: per
    position) give the same bits on the short-lines path with uneven channel tiles."""
    case = _geometry(2, c=40, o=50, size=7, k=3, pb=1, pe=1, n=3)
    x, w, dy = make_arrays(case, rng, np.float32, True)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    got = []
    for bit in (0, 65536):
        with convgrad.config(algo="native", isa=isa), engine_dbg(bit):
            got.append(convgrad.conv_weight_grad(x, dy, w.shape, **kw))
    np.testing.assert_array_equal(got[0], got[1])
    assert_close(got[0], reference_results(case, x, w, dy)[1], np.float32)


FRESH_CASES = {
    # lines shorter than WGRAD_LINE_MIN: x packed per tap, each tap's first sums stored
    "short-lines-2d": _geometry(2, c=40, o=70, size=7, k=3, pb=1, pe=1, n=3),
    # taps that read only padding: never stored, zeroed at the end of their task
    "all-padding-taps": _geometry(1, c=5, o=70, size=4, k=5, d=3, pb=6, pe=6),
    "short-lines-3d": _geometry(3, c=12, o=20, size=6, k=3, s=2),
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FRESH_CASES)
def test_weight_gradient_parts_stored_first_equal_zeroed_ones(isa, name, rng, monkeypatch):
    """Tasks of gathered short lines store each tap's first sums instead of zeroing
    their part first (engine debug bit 1048576: zero first): the same bits, whether the
    tasks split the outputs (XIO and OIX results) or sum partial gradients, and equal to
    the reference; taps that read no input come out zero."""
    from convgrad.kernels import _blas
    case = FRESH_CASES[name]
    x, w, dy = make_arrays(case, rng, np.float32, True)
    kw = {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}
    monkeypatch.setattr(native, "SERIAL_FLOPS", 0)
    want = reference_results(case, x, w, dy)[1]
    for partials in (0, native.PARTIALS_BYTES):
        monkeypatch.setattr(native, "PARTIALS_BYTES", partials)
        got = []
        for bit in (1048576, 0):
            kernels.clear_choices()
            with convgrad.config(algo="native", isa=isa), engine_dbg(bit):
                for _ in range(2):
                    # scratch and partials left dirty: parts stored first must not
                    # keep any of it (the OIX parts live in the thread scratch)
                    for key in ("native-pack", "native-partials"):
                        _blas.scratch(key, (1 << 20,), np.float32, zero=False).fill(np.nan)
                    got.append(convgrad.conv_weight_grad(x, dy, w.shape, **kw))
        for other in got[1:]:
            np.testing.assert_array_equal(other, got[0])
        assert_close(got[0], want, np.float32)
    if name == "all-padding-taps":
        assert (want[:, :, 0] == 0).all() and (got[-1][:, :, 0] == 0).all()
