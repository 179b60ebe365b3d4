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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ConvGradError
from ..geometry import ConvGeometry

OPS = ("fwd", "wgrad", "dgrad")


@dataclass(frozen=True)
class Kernel:
    name: str
    op: str
    fn: Callable[[np.ndarray, np.ndarray, ConvGeometry], np.ndarray]
    supports: Callable[[ConvGeometry, np.dtype], "str | None"]
    priority: int
    layout: str = "ncx"
    converts: bool = False   # takes strided views in the caller's float dtype
    reads_half: bool = False  # ... float16/bfloat16 ones too, as they are


_REGISTRY: dict[str, list[Kernel]] = {op: [] for op in OPS}


def register(kernel: Kernel) -> Kernel:
    if kernel.op not in _REGISTRY:
        raise ValueError(f"unknown kernel op {kernel.op!r}")
    _REGISTRY[kernel.op] = sorted(
        [k for k in _REGISTRY[kernel.op] if k.name != kernel.name] + [kernel],
        key=lambda k: -k.priority)
    return kernel


def names(op: str | None = None) -> list[str]:
    """Registered kernel names (for one op, or for all)."""
    ops = OPS if op is None else (op,)
    return sorted({k.name for o in ops for k in _REGISTRY[o]})


def candidates(op: str, geom: ConvGeometry, dtype) -> list[tuple[Kernel, "str | None"]]:
    """Every kernel of ``op`` with the reason it cannot run (None if it can)."""
    return [(k, k.supports(geom, np.dtype(dtype))) for k in _REGISTRY[op]]


def select(op: str, geom: ConvGeometry, dtype, algo: str = "auto") -> Kernel:
    """The highest-priority kernel that supports the problem, or the named one."""
    found = candidates(op, geom, dtype)
    if algo == "auto":
        from .chooser import preference
        usable = {k.name: k for k, reason in found if reason is None}
        for name in preference(op, geom):
            if name in usable:
                return usable[name]
        for kernel, reason in found:
            if reason is None:
                return kernel
        raise ConvGradError(f"no kernel supports {op} on {geom}")
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


def _register_builtin() -> None:
    from . import direct, im2col, native, reference, shifted
    native.warn_if_unavailable()
    for op in OPS:
        register(Kernel("native", op, getattr(native, op), native.supports, priority=40,
                        layout="nxc", converts=True, reads_half=True))
        register(Kernel("reference", op, getattr(reference, op), _always, priority=0))
        register(Kernel("im2col", op, getattr(im2col, op), _always, priority=10))
        register(Kernel("direct", op, getattr(direct, op), direct.supports, 20, "nxc"))
        register(Kernel("shifted", op, getattr(shifted, op), _blas_float(op), priority=30,
                        layout="nxc", converts=True))


_register_builtin()
