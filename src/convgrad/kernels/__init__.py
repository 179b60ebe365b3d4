"""Compute kernels: an algorithm registry and a selector.

Every kernel declares one of two compute layouts and receives C-contiguous
arrays in it, already in the compute dtype, and is told the problem by a
:class:`~convgrad.geometry.ConvGeometry`.  Kernels never see layout strings,
spec names or auto_pad.

- ``"ncx"``: data ``(N, C, *S)``, weights ``(O, C/G, *K)`` (the canonical
  layout of :mod:`convgrad.ops`);
- ``"nxc"``: data ``(N, *S, C)``, weights ``(*K, C/G, O)`` (channels last:
  oneDNN's NXC/XIO and TensorFlow's NHWC/HWIO, reached without a copy).

A kernel registered with ``converts=True`` instead receives views of the
caller's arrays in that layout, in their own float dtype and strides, and
returns its result in the compute dtype: it folds the dtype conversion and
layout change into the copies it makes anyway.

Op keys and signatures (the three are adjoint to each other, see ``ops``):

- ``"fwd"``:   ``fn(x, w, geom) -> y``
- ``"wgrad"``: ``fn(x, dy, geom) -> dw``
- ``"dgrad"``: ``fn(w, dy, geom) -> dx``

``supports(geom, dtype)`` returns None when the kernel can run, else the
reason it cannot, so a forced algorithm explains itself.

Memory.  ``memory(call)`` estimates, by named part, the bytes a kernel adds
to a call beyond the caller's inputs and the result the caller keeps: the
layout and dtype copies of the inputs made for it (by :mod:`convgrad.ops`, or
by the kernel), its workspace, and its result when that is not the one the
caller keeps (another dtype, or a layout the caller copies it out of).  The
:class:`Call` it receives describes the caller's arrays (:class:`Operand`:
canonical shape, dtype, the layouts in which the memory is already
C-contiguous) and the layouts in which the caller takes the result as it is.
A kernel without its own ``memory`` is estimated by :func:`conversions` (the
copies :func:`convgrad.ops.run_kernel` makes for its layout, no workspace).

``algo="auto"`` (:func:`select`) takes the first kernel of the chooser's
preference whose estimate fits in the workspace budget
(``settings.workspace_bytes()``); when none does, the preferred kernel that
needs the least.  So a kernel whose copies alone exceed the budget is not
chosen while another can run within it (docs/kernels.md, "Memory").
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ConvGradError
from ..geometry import ConvGeometry

OPS = ("fwd", "wgrad", "dgrad")
LAYOUTS = ("ncx", "nxc")
ANY_LAYOUT = frozenset(LAYOUTS)
# the tensors of each op, by role: first input, second input, result
ROLES = {"fwd": ("x", "w", "y"), "wgrad": ("x", "dy", "dw"), "dgrad": ("w", "dy", "dx")}


@dataclass(frozen=True)
class Operand:
    """A tensor of a call as a memory estimate sees it: its canonical shape
    (``(N, C, *S)`` or ``(O, C/G, *K)``), the caller's dtype, and the kernel
    layouts (``"ncx"``, ``"nxc"``) that take its memory as it is (for an
    input: C-contiguous in that layout; for the result: the caller keeps a
    result of that layout without copying it)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    layouts: frozenset = ANY_LAYOUT

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Call:
    """One canonical call: op, geometry, compute dtype, inputs ``a`` and
    ``b`` (see the op keys above) and the result ``out``."""

    op: str
    geom: ConvGeometry
    cdt: np.dtype
    a: Operand
    b: Operand
    out: Operand
    # a kernel with half_io may return a forward or data result in the caller's
    # float16/bfloat16 dtype directly (no float32 result, no cast)
    direct_result: bool = False

    @classmethod
    def assumed(cls, op: str, geom: ConvGeometry, cdt) -> "Call":
        """A call whose arrays are in every layout and the compute dtype
        already: what :func:`select` assumes when it is not told the call."""
        cdt = np.dtype(cdt)
        a, b, out = (Operand(shape, cdt) for shape in canonical_shapes(op, geom))
        return cls(op, geom, cdt, a, b, out)


def canonical_shapes(op: str, geom: ConvGeometry) -> tuple[tuple[int, ...], ...]:
    """The canonical shapes of ``op``'s first input, second input and result."""
    x, w, y = tuple(geom.x_shape), tuple(geom.w_shape), tuple(geom.y_shape)
    return {"fwd": (x, w, y), "wgrad": (x, y, w), "dgrad": (w, y, x)}[op]


@dataclass(frozen=True)
class Kernel:
    name: str
    op: str
    fn: Callable[[np.ndarray, np.ndarray, ConvGeometry], np.ndarray]
    supports: Callable[[ConvGeometry, np.dtype], "str | None"]
    priority: int
    layout: str = "ncx"
    converts: bool = False   # takes strided views in the caller's float dtype
    # ... float16/bfloat16 ones too, as they are; and fwd/dgrad return their
    # result in the caller's float16/bfloat16 dtype when asked (fn(..., out_dtype=));
    # wgrad may (else float32: the caller casts)
    half_io: bool = False
    # extra bytes by part (see the module doc); None: conversions() only
    memory: "Callable[[Call], dict[str, int]] | None" = None
    # bind(a, b, geom, out_dtype) -> run(a, b) or None: the call's decisions kept for
    # new arrays of the same shapes, strides and dtypes (``_bound``); None: never binds
    bind: "Callable | None" = None
    # fn and bind take ``result_layout=``: the one layout ("ncx", "nxc") the caller
    # keeps the result in without a copy, when the result may come in its memory order
    # (still seen in the kernel's layout)
    result_layout: bool = False


_REGISTRY: dict[str, list[Kernel]] = {op: [] for op in OPS}


def register(kernel: Kernel) -> Kernel:
    if kernel.op not in _REGISTRY:
        raise ValueError(f"unknown kernel op {kernel.op!r}")
    _REGISTRY[kernel.op] = sorted(
        [k for k in _REGISTRY[kernel.op] if k.name != kernel.name] + [kernel],
        key=lambda k: -k.priority)
    clear_choices()
    return kernel


def names(op: str | None = None) -> list[str]:
    """Registered kernel names (for one op, or for all)."""
    ops = OPS if op is None else (op,)
    return sorted({k.name for o in ops for k in _REGISTRY[o]})


def candidates(op: str, geom: ConvGeometry, dtype) -> list[tuple[Kernel, "str | None"]]:
    """Every kernel of ``op`` with the reason it cannot run (None if it can)."""
    return [(k, k.supports(geom, np.dtype(dtype))) for k in _REGISTRY[op]]


def conversions(call: Call, layout: str, converts: bool = False) -> dict[str, int]:
    """The copies made around a kernel of ``layout`` (``converts``: see the
    module doc), in bytes by part: an input not C-contiguous in ``layout`` or
    not in the compute dtype is copied whole (a converting kernel gets views,
    except float16 inputs of :func:`converted_whole`); a result in another
    dtype than the caller's, or in a layout the caller does not take, is an
    extra result-sized array."""
    parts = {}
    cdt = np.dtype(call.cdt)
    first, second, result = ROLES[call.op]
    whole = converted_whole(call, layout) if converts else (False, False)
    for role, t, w in ((first, call.a, whole[0]), (second, call.b, whole[1])):
        if converts and cdt.kind == "f":
            if w:
                parts[f"float32 copy of {role}"] = t.size * 4
        elif t.dtype != cdt or layout not in t.layouts:
            parts[f"copy of {role}"] = t.size * cdt.itemsize
    if call.out.dtype != cdt or layout not in call.out.layouts:
        parts[f"{result} before the caller's copy"] = call.out.size * cdt.itemsize
    return parts


def converted_whole(call: Call, layout: str) -> tuple[bool, bool]:
    """For a converting kernel of ``layout``: which of ``a``, ``b`` are
    float16 arrays that ``ops.run_kernel`` converts to float32 whole, with
    its compiled cast (NumPy's float16 cast, which a kernel's own copies
    would use, is slow): the float16 inputs C-contiguous in ``layout``, when
    their float32 copies take at most half the workspace budget; otherwise
    none, and the kernel converts block by block as it copies."""
    from .. import settings
    f16 = [t.dtype == np.float16 and layout in t.layouts and np.dtype(call.cdt) == np.float32
           for t in (call.a, call.b)]
    need = sum(t.size * 4 for t, f in zip((call.a, call.b), f16) if f)
    if need > settings.workspace_bytes() // 2:
        return False, False
    return f16[0], f16[1]


def estimate(kernel: Kernel, call: Call) -> dict[str, int]:
    """The bytes ``kernel`` adds to ``call`` beyond its inputs and result, by part."""
    if kernel.memory is not None:
        return kernel.memory(call)
    return conversions(call, kernel.layout, kernel.converts)


def within_budget(ranked: list[Kernel], call: Call) -> Kernel:
    """The first kernel of ``ranked`` whose estimate fits in the workspace
    budget; if none does, the one that needs the least (the first of equals)."""
    from .. import settings
    budget = settings.workspace_bytes()
    need = []
    for kernel in ranked:
        n = sum(estimate(kernel, call).values())
        if n <= budget:
            return kernel
        need.append(n)
    return ranked[need.index(min(need))]


def clear_choices() -> None:
    """Forget the chooser's cached decisions (:func:`select`), and every decision made
    from them elsewhere (:func:`generation` changes)."""
    global _generation
    _decided.cache_clear()
    _generation += 1


_generation = 0


def generation() -> int:
    """A number that changes whenever the chooser's decisions are forgotten (a kernel
    registered, :func:`clear_choices`): decisions kept outside this module
    (``ops.Prepared`` in a front-end's plan) hold only while it stays the same."""
    return _generation


def select(op: str, geom: ConvGeometry, dtype, algo: str = "auto", *,
           call: Call | None = None) -> Kernel:
    """The named kernel, or for ``algo="auto"`` the chooser's: the first kernel
    of its preference that supports the problem and fits in the workspace
    budget with the copies ``call`` needs (:func:`within_budget`; without
    ``call``, inputs and result are assumed in every layout and the compute
    dtype).  A problem no preferred kernel supports goes to the highest
    priority kernel that does.  Decisions are cached (:func:`_decided`)."""
    from .. import settings
    return _decided(op, geom, np.dtype(dtype), algo, call, settings.workspace_bytes(),
                    settings.threads(), settings.isa(), settings.precision())


# The chooser's decisions of recent calls, by the call and every setting a decision
# reads (the workspace budget, threads, ISA, precision: arguments only for the key,
# _select reads the same values from the settings): a training loop or a benchmark
# makes the same call again and again, and asking every kernel's ``supports`` and
# memory estimate each time cost ~40 us of a ~2 ms depthwise call.  Registering a
# kernel clears it (so do the tests, which change the kernels' constants).
@functools.lru_cache(maxsize=256)
def _decided(op: str, geom: ConvGeometry, dtype: np.dtype, algo: str, call: Call | None,
             budget: int, threads: int | None, isa: str, precision: str) -> Kernel:
    return _select(op, geom, dtype, algo, call)


def _select(op: str, geom: ConvGeometry, dtype, algo: str, call: Call | None) -> Kernel:
    if algo == "auto":
        from .chooser import preference
        call = call or Call.assumed(op, geom, dtype)
        by_name = {k.name: k for k in _REGISTRY[op]}
        ranked = [by_name[name] for name in preference(op, geom) if name in by_name]
        # the usual case first, without asking the other kernels: the preferred
        # kernel supports the problem and fits in the budget
        if ranked and ranked[0].supports(geom, np.dtype(dtype)) is None:
            from .. import settings
            if sum(estimate(ranked[0], call).values()) <= settings.workspace_bytes():
                return ranked[0]
        found = candidates(op, geom, dtype)
        usable = {k.name for k, reason in found if reason is None}
        ranked = [k for k in ranked if k.name in usable]
        if ranked:
            return within_budget(ranked, call)
        for kernel, reason in found:
            if reason is None:
                return kernel
        raise ConvGradError(f"no kernel supports {op} on {geom}")
    found = candidates(op, geom, dtype)
    for kernel, reason in found:
        if kernel.name == algo:
            if reason is not None:
                raise ConvGradError(f"algo {algo!r} cannot run {op}: {reason}")
            return kernel
    raise ConvGradError(f"algo = {algo!r}: unknown algorithm for {op}; valid: "
                        f"'auto', {', '.join(repr(k.name) for k, _ in found)}")


def _always(geom, dtype):
    return None


def _blas_float(op):
    def supports(geom, dtype):
        from . import shifted
        if dtype not in (np.float32, np.float64):
            return f"computes float32/float64 only, not {dtype}"
        if not shifted.fits(geom, op, dtype.itemsize):
            return "one sample's grids exceed the workspace budget"
        return None
    return supports


def _plus_workspace(layout: str, converts: bool, workspace):
    """``memory`` of a kernel: :func:`conversions` plus ``workspace(geom, op, itemsize)``."""
    def memory(call: Call) -> dict[str, int]:
        parts = conversions(call, layout, converts)
        parts.update(workspace(call.geom, call.op, np.dtype(call.cdt).itemsize))
        return parts
    return memory


def _reference_memory(call: Call) -> dict[str, int]:
    """The reference kernel copies both inputs to float64 (int64), sums per tap
    into a float64 result and returns it, whatever the caller's dtype."""
    parts = conversions(call, "ncx")
    parts.pop(f"{ROLES[call.op][2]} before the caller's copy", None)
    acc = np.dtype(np.int64 if np.dtype(call.cdt).kind in "iu" else np.float64)
    parts["64-bit copies of the inputs"] = (call.a.size + call.b.size) * 8
    if call.op != "wgrad":
        parts["per-tap products"] = call.out.size * 8
    if call.out.dtype != acc or "ncx" not in call.out.layouts:
        parts["64-bit result"] = call.out.size * 8
    return parts


def _register_builtin() -> None:
    from . import direct, grouped, im2col, native, reference, shifted, winograd
    native.warn_if_unavailable()
    for op in OPS:
        register(Kernel("native", op, getattr(native, op), native.supports, priority=40,
                        layout="nxc", converts=True, half_io=True, memory=native.memory,
                        bind=native.bind(op), result_layout=op == "wgrad"))
        register(Kernel("winograd", op, getattr(winograd, op), winograd.supports,
                        priority=35, layout="nxc", converts=True, half_io=True,
                        memory=winograd.memory, bind=winograd.bind(op),
                        result_layout=op == "wgrad"))
        register(Kernel("grouped", op, getattr(grouped, op), grouped.supports_op(op),
                        priority=34, layout="nxc", converts=True, half_io=True,
                        memory=grouped.memory, bind=grouped.bind(op)))
        register(Kernel("reference", op, getattr(reference, op), _always, priority=0,
                        memory=_reference_memory))
        register(Kernel("im2col", op, getattr(im2col, op), _always, priority=10,
                        memory=_plus_workspace("ncx", False, im2col.workspace)))
        register(Kernel("direct", op, getattr(direct, op), direct.supports, 20, "nxc",
                        memory=_plus_workspace("nxc", False, direct.workspace)))
        register(Kernel("shifted", op, getattr(shifted, op), _blas_float(op), priority=30,
                        layout="nxc", converts=True,
                        memory=_plus_workspace("nxc", True, shifted.workspace)))


_register_builtin()
