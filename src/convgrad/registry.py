"""``convgrad.op(name, **attrs)``: ops by their spec names.

Names are the specs' own (``"ConvolutionBackwardWeights"``,
``"GroupConvolutionBackpropData"``, ``"Conv2DBackpropFilter"``, ...).  A name
that two dialects share must be qualified: ``"onednn:Convolution"``,
``"openvino:Convolution"``.  Every name may be qualified.
"""

from __future__ import annotations

import numpy as np

from .errors import fail
from .frontends._plan import OPS, OpDef, TensorSpec


def _public_names() -> dict[str, OpDef]:
    table: dict[str, OpDef] = {}
    bare: dict[str, list[str]] = {}
    for key, entry in OPS.items():
        if entry.dialect == "canonical":
            continue
        table[key] = entry
        bare.setdefault(entry.name, []).append(key)
    for name, keys in bare.items():
        if len(keys) == 1:
            table[name] = OPS[keys[0]]
    return table


def op_names() -> list[str]:
    """Every accepted op name (bare names only where they are unambiguous)."""
    return sorted(_public_names())


class SpecOp:
    """An op with its attributes bound.

    ``infer_shape(*inputs)`` takes tensors by shape and shape inputs by value
    and returns the output shape without computing; ``__call__(*inputs)``
    computes.  Inputs are positional, in the spec's order; an optional shape
    input that is also an attribute may be left out (the input wins when both
    are given).
    """

    def __init__(self, entry: OpDef, attrs: dict):
        self.entry = entry
        self.name = entry.name
        self.attrs = dict(attrs)

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attrs.items())
        return f"convgrad.op({self.entry.dialect}:{self.name}, {attrs})"

    def _bind(self, inputs: tuple) -> dict:
        e = self.entry
        if len(inputs) > len(e.inputs):
            raise fail(self.name, "number of inputs", len(inputs),
                       f"must be at most {len(e.inputs)} ({', '.join(e.inputs)})")
        kwargs = dict(self.attrs)
        for name, value in zip(e.inputs, inputs):
            if value is not None or name not in kwargs:
                kwargs[name] = value
        return kwargs

    def infer_shape(self, *inputs) -> tuple[int, ...]:
        kwargs = self._bind(inputs)
        for t in self.entry.tensors:
            if kwargs.get(t) is not None:
                kwargs[t] = TensorSpec.of(self.name, t, kwargs[t])
        return self.entry.plan(**kwargs).out_shape

    def __call__(self, *inputs) -> np.ndarray:
        return self.entry.function(**self._bind(inputs))


def op(name: str, /, **attrs) -> SpecOp:
    """The op called ``name`` in its spec, with attributes ``attrs``.

    Parameters
    ----------
    name : str
        The spec's op name (see :func:`op_names`), qualified as
        ``"dialect:Name"`` where two dialects share it.
    **attrs
        The op's attributes, by their spec names.

    Returns
    -------
    SpecOp
        ``infer_shape(*inputs)`` gives the output shape without data;
        calling it computes.

    Raises
    ------
    ConvGradError
        An unknown op or attribute name (the message lists the valid ones).

    Examples
    --------
    >>> import convgrad
    >>> op = convgrad.op("GroupConvolutionBackpropData", strides=[2], pads_begin=[1],
    ...                  pads_end=[1], dilations=[1])
    >>> op.infer_shape((1, 20, 224), (4, 5, 2, 3))
    (1, 8, 447)
    """
    table = _public_names()
    entry = table.get(name) if isinstance(name, str) else None
    if entry is None:
        raise fail("convgrad.op", "name", name,
                   f"unknown op; valid names: {', '.join(sorted(table))}")
    valid = entry.attributes
    for key in attrs:
        if key not in valid:
            raise fail(entry.name, "attribute", key,
                       f"unknown attribute; valid attributes: {', '.join(valid)}")
    return SpecOp(entry, attrs)
