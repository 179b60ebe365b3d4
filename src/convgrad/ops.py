"""The canonical ops, the one place where geometry, dtype and kernel meet.

Canonical layout: data ``(N, C, *S)``, weights ``(O, C/G, *K)`` (OIX).  With
``conv(x, w)`` the forward convolution and ``<a, b>`` the sum of products:

- ``wgrad(x, dy) = d<conv(x, w), dy>/dw``: correlation of ``x`` with ``dy``,
  stride and dilation exchanging roles;
- ``dgrad(w, dy) = d<conv(x, w), dy>/dx``: the transposed convolution
  (insert ``s-1`` zeros between samples of ``dy``, flip ``w``, swap O and C/G
  inside each group);
- so ``<conv(x, w), dy> = <x, dgrad(w, dy)> = <w, wgrad(x, dy)>``.

A ConvTranspose is ``dgrad`` of the forward conv whose input is the
ConvTranspose's output; its weight gradient is ``wgrad`` with ``x`` := the
gradient of the ConvTranspose output and ``dy`` := the ConvTranspose input.
Its data gradient is ``fwd``.  No other kernel exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import kernels, settings
from ._late import module as _late
from .dtypes import compute_dtype
from .geometry import ConvGeometry


def compute(kind: str, a: np.ndarray, b: np.ndarray, geom: ConvGeometry,
            dtype: np.dtype, result_layouts=kernels.ANY_LAYOUT,
            result_in_dtype: bool = False) -> np.ndarray:
    """Run one canonical op on canonical views ``a``, ``b`` of dtype ``dtype``.

    ``kind`` is ``"fwd"`` (a=x, b=w), ``"wgrad"`` (a=x, b=dy) or ``"dgrad"``
    (a=w, b=dy).  Inputs are brought into the selected kernel's layout and
    the compute dtype, copied only when they are not already so (never
    modified); the result is a canonical view of a new array in the compute
    dtype.  ``result_layouts``: the kernel layouts (``"ncx"``, ``"nxc"``)
    whose result the caller keeps without copying it (default: any), so
    that the chooser counts the copies a kernel causes (``kernels.select``).
    ``result_in_dtype``: a float16/bfloat16 result may come back in ``dtype``
    itself, rounded once by a kernel that writes it (the caller then casts
    nothing; a weight gradient only where its kernel streams it, else float32).
    """
    with settings.workspace_fixed():
        return prepare(kind, a, b, geom, dtype, result_layouts, result_in_dtype).run(a, b)


@dataclass(frozen=True)
class Prepared:
    """What :func:`compute` decides for a call -- the kernel, and what
    :func:`run_kernel` does around it -- made once: it holds for every call with
    inputs of the same shapes, strides and dtypes under the same settings and the
    same registry (the front-ends keep it for those: ``Plan.run``)."""

    kernel: kernels.Kernel
    geom: ConvGeometry
    cdt: np.dtype
    out_dtype: np.dtype | None
    whole: tuple[bool, bool]
    # the one kernel layout the caller keeps the result in without a copy, if only one
    # (told to kernels with ``result_layout``)
    result_layout: str | None = None

    def run(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return run_kernel(self.kernel, a, b, self.geom, self.cdt, self.out_dtype, self.whole,
                          self.result_layout)


def prepare(kind: str, a: np.ndarray, b: np.ndarray, geom: ConvGeometry, dtype: np.dtype,
            result_layouts=kernels.ANY_LAYOUT, result_in_dtype: bool = False) -> Prepared:
    """The decisions of :func:`compute` for this call (made within its workspace
    budget: call it inside ``settings.workspace_fixed()``)."""
    cdt = compute_dtype(np.dtype(dtype))
    call = describe(kind, a, b, geom, dtype, result_layouts, result_in_dtype)
    kernel = kernels.select(kind, geom, cdt, settings.algo(), call=call)
    out_dtype = (np.dtype(dtype) if result_in_dtype and kernel.half_io
                 and np.dtype(dtype) != cdt and np.dtype(cdt) == np.float32 else None)
    whole = (kernels.converted_whole(describe(kind, a, b, geom, cdt), "nxc")
             if kernel.layout == "nxc" and kernel.converts and not kernel.half_io
             else (False, False))
    return Prepared(kernel, geom, cdt, out_dtype, whole, _only_layout(call.out.layouts))


def told_layout(kernel: kernels.Kernel, result_layout: str | None) -> dict:
    """The keyword a kernel that takes ``result_layout`` (``Kernel.result_layout``) gets
    from its ``fn`` or ``bind`` call: none without one, or when the caller keeps more."""
    return {"result_layout": result_layout} if kernel.result_layout and result_layout else {}


def _only_layout(layouts: frozenset) -> str | None:
    """The layout of ``layouts`` when it holds one only."""
    return next(iter(layouts)) if len(layouts) == 1 else None


def describe(kind: str, a: np.ndarray, b: np.ndarray, geom: ConvGeometry, dtype,
             result_layouts=kernels.ANY_LAYOUT, result_in_dtype: bool = False
             ) -> kernels.Call:
    """The call as the kernels' memory estimates see it (``kernels.Call``); the
    descriptions of recent calls are kept (by shapes, strides and dtypes)."""
    key = (kind, geom, a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype,
           np.dtype(dtype), frozenset(result_layouts), result_in_dtype)
    found = _DESCRIBED.get(key)
    if found is None:
        found = _describe(kind, a, b, geom, dtype, result_layouts, result_in_dtype)
        if len(_DESCRIBED) >= 256:
            _DESCRIBED.clear()
        _DESCRIBED[key] = found
    return found


_DESCRIBED: dict[tuple, kernels.Call] = {}


def _describe(kind: str, a: np.ndarray, b: np.ndarray, geom: ConvGeometry, dtype,
              result_layouts, result_in_dtype: bool) -> kernels.Call:
    wa, wb = _WEIGHT_ARGS[kind]
    out_shape = kernels.canonical_shapes(kind, geom)[2]
    return kernels.Call(kind, geom, compute_dtype(np.dtype(dtype)), operand(a, wa),
                        operand(b, wb),
                        kernels.Operand(out_shape, np.dtype(dtype), frozenset(result_layouts)),
                        result_in_dtype)


def operand(t: np.ndarray, is_weights: bool) -> kernels.Operand:
    """A canonical view as an ``Operand``: the layouts that read it without a copy."""
    layouts = frozenset(name for name, view in (("ncx", t), ("nxc", to_nxc(t, is_weights)))
                        if view.flags.c_contiguous)
    return kernels.Operand(tuple(t.shape), t.dtype, layouts)


def run_kernel(kernel: kernels.Kernel, a: np.ndarray, b: np.ndarray, geom: ConvGeometry,
               cdt: np.dtype, out_dtype=None, whole: tuple[bool, bool] | None = None,
               result_layout: str | None = None) -> np.ndarray:
    """Run one kernel on canonical views, converting to and from its layout
    (``out_dtype``: a half_io kernel's result dtype, see :func:`compute`;
    ``whole``: :func:`kernels.converted_whole` of the call, when known;
    ``result_layout``: the layout the caller keeps, told to a kernel that takes it)."""
    kind = kernel.op
    told = told_layout(kernel, result_layout)
    if kernel.layout == "ncx":
        a, b = _in_compute_dtype(a, cdt), _in_compute_dtype(b, cdt)
        return kernel.fn(a, b, geom)
    # Channels last: a view of a channels-last caller array is contiguous
    # again here, so NXC/XIO callers pay no layout copy.
    if whole is None:
        whole = (kernels.converted_whole(describe(kind, a, b, geom, cdt), "nxc")
                 if kernel.converts and not kernel.half_io else (False, False))
    wa, wb = _WEIGHT_ARGS[kind]
    a, b = to_nxc(a, wa), to_nxc(b, wb)
    if not kernel.converts or np.dtype(cdt).kind != "f":
        a, b = _in_compute_dtype(a, cdt), _in_compute_dtype(b, cdt)
    elif kernel.half_io:
        # the kernel converts float16/bfloat16 blocks itself, and writes its
        # result in out_dtype when asked
        out = kernel.fn(a, b, geom, **told) if out_dtype is None else kernel.fn(
            a, b, geom, out_dtype=out_dtype, **told)
        return from_nxc(out, kind == "wgrad")
    else:
        # float16 views: NumPy's float16 cast is slow wherever it happens (also
        # in a kernel's own copies); contiguous ones take the compiled one,
        # when their float32 copies fit in the budget (kernels.converted_whole)
        a, b = (_f16_to_f32(t) if w else t for t, w in zip((a, b), whole))
    out = kernel.fn(a, b, geom, **told)
    return from_nxc(out, kind == "wgrad")


def _in_compute_dtype(t: np.ndarray, cdt) -> np.ndarray:
    """``t`` C-contiguous in ``cdt`` (no copy if it already is)."""
    if t.dtype == _F16 and np.dtype(cdt) == np.float32:
        return _f16_to_f32(t)
    return np.ascontiguousarray(t, dtype=cdt)


_F16 = np.dtype(np.float16)


def _f16_to_f32(t: np.ndarray) -> np.ndarray:
    return _late("convgrad._half").to_float32(t)         # (numba: on the first call)


_WEIGHT_ARGS = {"fwd": (False, True), "wgrad": (False, False), "dgrad": (True, False)}


def to_nxc(t: np.ndarray, is_weights: bool) -> np.ndarray:
    """Canonical view -> channels-last view: ``(N, C, *S) -> (N, *S, C)``,
    ``(O, C/G, *K) -> (*K, C/G, O)``."""
    return t.transpose(_TO_NXC[is_weights, t.ndim])


def from_nxc(t: np.ndarray, is_weights: bool) -> np.ndarray:
    """The inverse view of :func:`to_nxc`."""
    return t.transpose(_FROM_NXC[is_weights, t.ndim])


# the axis orders of to_nxc / from_nxc by (weights?, rank) (np.moveaxis, which the data
# views took, costs a dozen Python calls)
_TO_NXC = {(w, r): ((*range(2, r), 1, 0) if w else (0, *range(2, r), 1))
           for w in (False, True) for r in range(2, 9)}
_FROM_NXC = {(w, r): ((r - 1, r - 2, *range(r - 2)) if w else (0, r - 1, *range(1, r - 1)))
             for w in (False, True) for r in range(2, 9)}
