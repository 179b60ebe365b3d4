"""One planned call as a Dask graph: blocks, their windows, one task per block.

The flow is the library's own: the front-end's plan (validated geometry and
layout adapters) -> blocks along the batch and spatial axes, each a problem
of the same kind (:func:`convgrad.geometry.sub_geometry`) -> one task per
block that assembles the block's window from the chunks it overlaps, views it
in the canonical layout, calls :func:`convgrad.ops.compute` and views its
result in the spec layout.  Data layouts are axis permutations
(:class:`Source`, :class:`Result`), applied inside the block tasks as views,
so a channels-last call has no more tasks than an NCX one; the small weights
go through their adapters as one chunk.

Blocks follow the chunks of the op's large input, matched through the centres
of the outputs' windows (``p*s + (Ke-1)//2 - pb``):

- ``fwd`` and ``wgrad`` follow ``x``: input chunk ``[q0, q1)`` maps to the
  outputs whose window centres lie in it; the block reads ``x`` over those
  outputs' windows -- its chunk plus a halo of about ``(Ke-1)/2`` on each side,
  reaching into further chunks where they are smaller than that -- and
  ``dy``/the result over the outputs.
- ``dgrad`` follows ``dy``: output chunk ``[p0, p1)`` maps to the input block
  between the centres of outputs ``p0`` and ``p1``, so ``dx``'s chunks follow
  ``dy``'s; each block reads every ``dy`` output that reaches it.

The two maps are inverse inside the arrays (identity for 'same' padding at
stride 1), so ``dy`` chunked as a convgrad ``fwd`` result chunks it, and the
weight gradient of such a pair moves halos only.  Weight gradients are
per-block partial sums, added in a fixed-order tree of
:data:`SPLIT_EVERY`-way sums in the compute dtype (float32 for 16-bit inputs,
int64 for integers) and cast once at the root.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import dask.array as da
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from .. import memory, ops, settings
from ..dtypes import common_dtype, compute_dtype
from ..frontends._plan import Plan, cast_result
from ..geometry import (ConvGeometry, input_boundary, input_window, output_boundary,
                        output_window, sub_geometry)
from ..layouts import DataLayout

SPLIT_EVERY = 8
"""Partial weight gradients added per task of the reduction tree."""


# ----------------------------------------------------------------------------
# Windows: which chunks a block reads, and where each piece goes
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """A region of a chunked array: its shape and, per chunk it overlaps (in
    the order of the task's chunk keys), ``(destination, source)`` slices, all
    in the array's own axis order; ``perm`` (None: the identity) is the axis
    permutation that makes the assembled window canonical."""

    shape: tuple[int, ...]
    pieces: tuple[tuple[tuple[slice, ...], tuple[slice, ...]], ...]
    perm: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Source:
    """A tensor input as the graph reads it: the caller's Dask array and the
    axis permutation to the canonical layout (``canonical axis i`` is ``arr``'s
    axis ``perm[i]``; None: ``arr`` is canonical).  A data layout is a pure
    permutation, applied to each block's window inside its task (a view), so
    the graph has no per-chunk transpose tasks."""

    arr: da.Array
    perm: tuple[int, ...] | None = None

    @property
    def chunks(self) -> tuple[tuple[int, ...], ...]:
        """The chunks in canonical axis order."""
        if self.perm is None:
            return self.arr.chunks
        return tuple(self.arr.chunks[p] for p in self.perm)


def layout_permutation(adapter, ndim: int) -> tuple[int, ...] | None:
    """The axis permutation (``result.transpose(perm)``) that ``adapter`` applies
    to an ``ndim``-array, when it is a :class:`DataLayout`'s conversion to or
    from the canonical layout; None for any other adapter."""
    owner = getattr(adapter, "__self__", None)
    func = getattr(adapter, "__func__", None)
    if not isinstance(owner, DataLayout):
        return None
    perm = owner.perm_to_canonical(ndim)
    if func is DataLayout.from_canonical:
        return tuple(int(i) for i in np.argsort(perm))
    return perm if func is DataLayout.to_canonical else None


def _non_identity(perm):
    return None if perm is None or perm == tuple(range(len(perm))) else perm


def source(arr: da.Array, adapter) -> Source:
    """``arr`` (a tensor input) as the graph reads it: a data layout becomes the
    blocks' permutation; any other adapter is applied to the Dask array."""
    perm = layout_permutation(adapter, arr.ndim)
    if perm is None:
        return Source(adapter(arr))
    return Source(arr, _non_identity(perm))


def _axis_pieces(sizes, lo: int, hi: int):
    out, c0 = [], 0
    for j, size in enumerate(sizes):
        c1 = c0 + size
        s0, s1 = max(lo, c0), min(hi, c1)
        if s0 < s1:
            out.append((j, slice(s0 - c0, s1 - c0), slice(s0 - lo, s1 - lo)))
        c0 = c1
    return out


class Halos:
    """Where a graph's halo tasks go: ``dsk`` and a key prefix (one per graph)."""

    def __init__(self, dsk: dict, name: str):
        self.dsk, self.name, self.count = dsk, f"{name}-halo", 0

    def slice(self, key, src) -> tuple:
        """A task cutting ``src`` out of chunk ``key``: Dask runs it where the chunk
        is, so only the piece travels to the block's worker."""
        hkey = (self.name, self.count)
        self.count += 1
        self.dsk[hkey] = (cut, key, src)
        return hkey


def cut(chunk: np.ndarray, src) -> np.ndarray:
    """A piece of a chunk, copied so that the chunk can be released before the
    piece is used (and only the piece is sent)."""
    return chunk[src].copy()


def window(src: Source, region, halos: Halos | None = None) -> tuple[Window, list]:
    """The :class:`Window` of ``src`` over ``region`` (one ``(start, stop)`` per
    canonical axis) and the keys of what it reads: a chunk itself when the
    window needs at least half of it, else (with ``halos``) a task cutting out
    the piece."""
    arr, perm = src.arr, src.perm
    if perm is not None:                 # the region in the array's own axis order
        own = [None] * len(region)
        for i, p in enumerate(perm):
            own[p] = region[i]
        region = own
    per_axis = [_axis_pieces(sizes, lo, hi) for sizes, (lo, hi) in zip(arr.chunks, region)]
    keys, pieces = [], []
    for combo in itertools.product(*per_axis):
        key = (arr.name, *(j for j, _, _ in combo))
        src = tuple(s for _, s, _ in combo)
        dst = tuple(d for _, _, d in combo)
        piece = math.prod(s.stop - s.start for s in src)
        chunk = math.prod(arr.chunks[axis][j] for axis, (j, _, _) in enumerate(combo))
        if halos is not None and 2 * piece < chunk:
            keys.append(halos.slice(key, src))
            src = tuple(slice(None) for _ in src)
        else:
            keys.append(key)
        pieces.append((dst, src))
    return Window(tuple(hi - lo for lo, hi in region), tuple(pieces), perm), keys


def assemble(win: Window | None, chunks: list) -> np.ndarray:
    """The window's canonical array from its chunks: a view when one chunk
    holds all of it, else a new array in the first chunk's memory order, seen
    through the window's permutation (a channels-last chunk stays
    channels-last for the kernels)."""
    if win is None:                      # an operand passed whole (weights)
        return chunks[0]
    out = None
    if len(chunks) == 1:
        view = chunks[0][win.pieces[0][1]]
        if view.shape == win.shape:
            out = view
    if out is None:
        out = np.empty_like(chunks[0], shape=win.shape)
        for (dst, src), chunk in zip(win.pieces, chunks):
            out[dst] = chunk[src]
    return out if win.perm is None else out.transpose(win.perm)


# ----------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """Everything one block's task needs besides its chunks (small, picklable).

    ``geom`` is the block's own problem (None: the block gets no contribution);
    ``shape`` the block's canonical result shape and ``place`` where the
    problem's result goes in it (None: all of it); ``cast``: round to the
    call's dtype (False for partial weight gradients, which are summed first);
    ``out_perm``: the axis permutation from canonical to the result's layout
    (None: canonical).
    """

    op: str
    kind: str
    dtype: np.dtype
    geom: ConvGeometry | None
    a: Window | None
    b: Window | None
    shape: tuple[int, ...]
    place: tuple[slice, ...] | None
    cast: bool
    settings: dict
    out_perm: tuple[int, ...] | None = None


def run_block(block: Block, a_chunks: list, b_chunks: list, bias=None) -> np.ndarray:
    cdt = compute_dtype(block.dtype)
    if block.geom is None:
        out = np.zeros(block.shape, cdt)
    else:
        a, b = assemble(block.a, a_chunks), assemble(block.b, b_chunks)
        with settings.applied(block.settings):
            memory.admit(block.op, block.kind, a, b, block.geom, block.dtype)
            res = ops.compute(block.kind, a, b, block.geom, block.dtype)
        if block.place is None:
            out = res
        else:
            out = np.zeros_like(res, shape=block.shape)
            out[block.place] = res
    if bias is not None:                 # out is this task's own new array
        out += bias.astype(cdt).reshape((1, -1) + (1,) * (out.ndim - 2))
    if block.cast:
        out = cast_result(out, block.dtype)
    return out if block.out_perm is None else out.transpose(block.out_perm)


def sum_partials(parts: list) -> np.ndarray:
    out = parts[0] + parts[1] if len(parts) > 1 else parts[0].copy()
    for p in parts[2:]:
        out += p
    return out


def finish_weights(total: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return cast_result(total, dtype)


def zeros(shape, dtype) -> np.ndarray:
    return np.zeros(shape, dtype)


# ----------------------------------------------------------------------------
# Partitions
# ----------------------------------------------------------------------------


def _bounds(sizes) -> list[int]:
    return [0, *itertools.accumulate(sizes)]


def _ranges(bounds) -> list[tuple[int, int]]:
    return list(zip(bounds[:-1], bounds[1:]))


def _mapped(bounds, to_other, end: int) -> list[int]:
    """Boundaries mapped onto the other grid: first 0, last ``end``, repeats dropped."""
    out = [0]
    for q in bounds[1:-1]:
        p = to_other(q)
        if out[-1] < p < end:
            out.append(p)
    return out + [end]                   # [0, 0] for an empty axis: one empty block


def _sizes(ranges) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in ranges)


def output_partition(geom: ConvGeometry, chunks) -> list[list[tuple[int, int]]]:
    """Per spatial axis, the output blocks of the input (``x``) ``chunks``."""
    return [_ranges(_mapped(_bounds(chunks[2 + i]),
                            lambda q, i=i: output_boundary(geom, i, q), geom.out_sizes[i]))
            for i in range(geom.spatial_rank)]


def input_partition(geom: ConvGeometry, chunks) -> list[list[tuple[int, int]]]:
    """Per spatial axis, the input blocks of the output (``dy``) ``chunks``."""
    return [_ranges(_mapped(_bounds(chunks[2 + i]),
                            lambda p, i=i: input_boundary(geom, i, p), geom.in_sizes[i]))
            for i in range(geom.spatial_rank)]


# ----------------------------------------------------------------------------
# Graphs
# ----------------------------------------------------------------------------


def _whole(arr: da.Array) -> da.Array:
    """A small operand (weights, bias) as one chunk."""
    return arr.rechunk({i: -1 for i in range(arr.ndim)})


def _single_key(arr: da.Array):
    return (arr.name, *(0,) * arr.ndim)


@dataclass(frozen=True)
class Result:
    """The keys and chunks of a data result: canonical block indices and chunks
    reordered by ``perm`` (result axis j is canonical axis ``perm[j]``; None:
    canonical), the permutation each block task applies to its result."""

    name: str
    perm: tuple[int, ...] | None = None

    def key(self, index) -> tuple:
        if self.perm is None:
            return (self.name, *index)
        return (self.name, *(index[p] for p in self.perm))

    def chunks(self, chunks) -> tuple:
        return chunks if self.perm is None else tuple(chunks[p] for p in self.perm)


def run(plan: Plan, arrays: dict[str, da.Array], *, split_every: int = SPLIT_EVERY) -> da.Array:
    """The Dask array of ``plan``'s result for Dask ``arrays`` (by input name)."""
    dtype = common_dtype(plan.op, arrays, allow_int=plan.allow_int)
    canon = {}
    for name, (role, to_c) in plan.roles.items():
        if name in arrays:
            arr = arrays[name]
            canon[role] = source(arr, to_c) if role in ("x", "dy") else _whole(to_c(arr))
    snap = settings.snapshot()
    if snap["threads"] is None:
        snap["threads"] = 1              # Dask runs blocks in parallel
    deps = [c.arr if isinstance(c, Source) else c for c in canon.values()]
    back = None if plan.kind == "wgrad" else layout_permutation(plan.from_canonical,
                                                                2 + plan.geom.spatial_rank)
    name = f"convgrad-{plan.op}-" + tokenize(
        plan.op, plan.kind, plan.geom, str(dtype),
        sorted((r, c.arr.name, c.perm) if isinstance(c, Source) else (r, c.name, None)
               for r, c in canon.items()), back, snap, split_every)
    result = Result(name, _non_identity(back))
    build = {"fwd": _fwd_graph, "wgrad": _wgrad_graph, "dgrad": _dgrad_graph}[plan.kind]
    dsk, chunks, out_dtype = build(plan, canon, dtype, snap, result, split_every)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=deps)
    out = da.Array(graph, name, chunks=chunks, dtype=out_dtype)
    if back is None:                     # weights, or a layout that is not a permutation
        out = plan.from_canonical(out)
    assert out.shape == plan.out_shape, (out.shape, plan.out_shape)
    return out


def _empty(geom: ConvGeometry, n0: int, n1: int, *ranges) -> bool:
    """A block with no samples, no channels or an empty range gets no contribution."""
    return (n1 <= n0 or geom.c == 0 or geom.o == 0
            or any(hi <= lo for rs in ranges for lo, hi in rs))


def _bias_args(canon) -> tuple:
    return (_single_key(canon["bias"]),) if "bias" in canon else ()


def _fwd_blocks(plan: Plan, canon, dtype, snap, halos: Halos, *, cast: bool, with_dy: bool,
                out_perm=None):
    """Blocks over ``x``'s chunks, for fwd (with_dy False) and wgrad: yields
    ``(block index, Block, a keys, b keys)`` and, first, the output partition."""
    geom, x = plan.geom, canon["x"]
    n_ranges = _ranges(_bounds(x.chunks[0]))
    p_parts = output_partition(geom, x.chunks)
    yield n_ranges, p_parts
    w_key = None if with_dy else [_single_key(canon["w"])]
    for index in itertools.product(range(len(n_ranges)), *(range(len(p)) for p in p_parts)):
        n0, n1 = n_ranges[index[0]]
        ps = [p_parts[i][j] for i, j in enumerate(index[1:])]
        qs = [input_window(geom, i, p0, p1) for i, (p0, p1) in enumerate(ps)]
        shape = (n1 - n0, geom.o, *_sizes(ps))
        if _empty(geom, n0, n1, ps, qs):
            yield index, Block(plan.op, plan.kind, dtype, None, None, None, shape, None, cast,
                               snap, out_perm), [], []
            continue
        a, a_keys = window(x, [(n0, n1), (0, geom.c), *qs], halos)
        if with_dy:
            b, b_keys = window(canon["dy"], [(n0, n1), (0, geom.o), *ps], halos)
        else:
            b, b_keys = None, w_key
        sub = sub_geometry(geom, n1 - n0, ps, qs)
        yield index, Block(plan.op, plan.kind, dtype, sub, a, b, shape, None, cast,
                           snap, out_perm), a_keys, b_keys


def _fwd_graph(plan, canon, dtype, snap, result: Result, split_every):
    dsk = {}
    blocks = _fwd_blocks(plan, canon, dtype, snap, Halos(dsk, result.name), cast=True,
                         with_dy=False, out_perm=result.perm)
    n_ranges, p_parts = next(blocks)
    bias = _bias_args(canon)
    for index, block, a_keys, b_keys in blocks:
        dsk[result.key((index[0], 0, *index[1:]))] = (run_block, block, a_keys, b_keys, *bias)
    chunks = (_sizes(n_ranges), (plan.geom.o,), *(_sizes(p) for p in p_parts))
    return dsk, result.chunks(chunks), dtype


def _wgrad_graph(plan, canon, dtype, snap, result: Result, split_every):
    geom, name = plan.geom, result.name
    dsk, partials = {}, []
    blocks = _fwd_blocks(plan, canon, dtype, snap, Halos(dsk, name), cast=False, with_dy=True)
    next(blocks)
    for index, block, a_keys, b_keys in blocks:
        if block.geom is None:           # reads only padding: contributes nothing
            continue
        key = (f"{name}-part", *index)
        dsk[key] = (run_block, block, a_keys, b_keys)
        partials.append(key)
    root = (name, *(0,) * (2 + geom.spatial_rank))
    if not partials:
        dsk[root] = (zeros, geom.w_shape, dtype)
    else:
        level = 0
        while len(partials) > 1:
            partials = [_put(dsk, (f"{name}-sum{level}", j // split_every),
                             (sum_partials, partials[j:j + split_every]))
                        for j in range(0, len(partials), split_every)]
            level += 1
        dsk[root] = (finish_weights, partials[0], dtype)
    return dsk, tuple((v,) for v in geom.w_shape), dtype


def _put(dsk: dict, key, task):
    dsk[key] = task
    return key


def _dgrad_graph(plan, canon, dtype, snap, result: Result, split_every):
    geom, dy, name = plan.geom, canon["dy"], result.name
    n_ranges = _ranges(_bounds(dy.chunks[0]))
    q_parts = input_partition(geom, dy.chunks)
    w_key = [_single_key(canon["w"])]
    bias = _bias_args(canon)
    dsk = {}
    halos = Halos(dsk, name)
    for index in itertools.product(range(len(n_ranges)), *(range(len(q)) for q in q_parts)):
        n0, n1 = n_ranges[index[0]]
        qs = [q_parts[i][j] for i, j in enumerate(index[1:])]
        shape = (n1 - n0, geom.c, *_sizes(qs))
        wins = [output_window(geom, i, q0, q1) for i, (q0, q1) in enumerate(qs)]
        key = result.key((index[0], 0, *index[1:]))
        if _empty(geom, n0, n1, qs, [w[:2] for w in wins]):
            block = Block(plan.op, plan.kind, dtype, None, None, None, shape, None, True, snap,
                          result.perm)
            dsk[key] = (run_block, block, [], [], *bias)
            continue
        ps = [(p0, p1) for p0, p1, _, _ in wins]
        covered = [(a, b) for _, _, a, b in wins]
        b, b_keys = window(dy, [(n0, n1), (0, geom.o), *ps], halos)
        place = (slice(None), slice(None),
                 *(slice(a - q0, b_ - q0) for (a, b_), (q0, _) in zip(covered, qs)))
        if covered == qs:
            place = None
        sub = sub_geometry(geom, n1 - n0, ps, covered)
        block = Block(plan.op, plan.kind, dtype, sub, None, b, shape, place, True, snap,
                      result.perm)
        dsk[key] = (run_block, block, w_key, b_keys, *bias)
    chunks = (_sizes(n_ranges), (geom.c,), *(_sizes(q) for q in q_parts))
    return dsk, result.chunks(chunks), dtype
