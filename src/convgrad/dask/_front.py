"""The Dask versions of the spec ops: the same plan functions (so the same
attribute names, validation and shape inference), Dask arrays in and out."""

from __future__ import annotations

import functools
import inspect
import math

import dask.array as da

from ..dtypes import as_array
from ..errors import fail
from ..frontends._plan import OPS, OpDef, TensorSpec
from ..registry import SpecOp, op as _spec_op
from . import _graph

_NOTE = """\
    On Dask arrays (``convgrad.dask``): tensor inputs may be Dask arrays
    chunked along any axes (NumPy arrays become one chunk); the result is a
    lazy Dask array.  Weight gradients are summed over blocks with a tree
    reduction; data results are chunked like the op's large input.  See
    ``docs/dask.md``."""


def _with_note(doc: str) -> str:
    """``doc`` with the Dask note as its second paragraph: before any numpydoc
    section, so that it is not read as part of the last one."""
    head, sep, rest = doc.partition("\n\n")
    return head.rstrip() + "\n\n" + _NOTE + ("\n\n" + rest if sep else "\n")


def as_dask(op: str, name: str, value) -> da.Array:
    """A tensor input as a Dask array with known chunk sizes (never copied)."""
    if isinstance(value, da.Array):
        if any(math.isnan(c) for sizes in value.chunks for c in sizes):
            raise fail(op, f"chunks of {name}", "unknown",
                       "chunk sizes must be known (call compute_chunk_sizes() first)")
        return value
    arr = as_array(op, name, value)
    return da.from_array(arr, chunks=-1)


def _entry_of(function) -> OpDef:
    for entry in OPS.values():
        if entry.function is function:
            return entry
    raise LookupError(function)


@functools.lru_cache(maxsize=None)
def dask_function(entry: OpDef):
    """``entry``'s public function, on Dask arrays."""
    sig = inspect.signature(entry.plan)

    @functools.wraps(entry.function)
    def function(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        arrays = {}
        for t in entry.tensors:
            value = bound.arguments.get(t)
            if value is not None:
                arrays[t] = as_dask(entry.name, t, value)
                bound.arguments[t] = TensorSpec(arrays[t].shape)
        return _graph.run(entry.plan(*bound.args, **bound.kwargs), arrays)

    function.__signature__ = sig
    function.__doc__ = _with_note(entry.function.__doc__ or "")
    return function


def dask_version(function):
    """The Dask version of a public spec-op function of :mod:`convgrad`."""
    return dask_function(_entry_of(function))


def dialect_functions(module) -> dict:
    """The Dask versions of a spec front-end module's public functions."""
    return {name: dask_version(getattr(module, name)) for name in module.__all__}


class DaskSpecOp(SpecOp):
    """:class:`convgrad.registry.SpecOp` whose call takes and returns Dask arrays."""

    def __call__(self, *inputs) -> da.Array:
        return dask_function(self.entry)(**self._bind(inputs))


def op(name: str, /, **attrs) -> DaskSpecOp:
    """``convgrad.op`` on Dask arrays: ``infer_shape`` is the same, calls are lazy."""
    spec = _spec_op(name, **attrs)
    return DaskSpecOp(spec.entry, spec.attrs)
