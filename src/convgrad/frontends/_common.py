"""Helpers shared by the spec front-ends: attribute parsing and plan building."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import fail
from ..geometry import (ConvGeometry, check_output_padding, check_rank, int_tuple,
                        parse_auto_pad)
from ..layouts import DataLayout, WeightLayout
from ._plan import Plan, TensorSpec


@dataclass(frozen=True)
class ConvAttrs:
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    mode: str
    output_padding: tuple[int, ...]


def _zeros_if_empty(value):
    if value is None:
        return True
    try:
        return len(value) == 0
    except TypeError:
        return False


def conv_attrs(op: str, spatial_rank: int, *, strides, pads_begin=None, pads_end=None,
               dilations=None, auto_pad=None, output_padding=None,
               strict_output_padding: bool = True) -> ConvAttrs:
    """Parse the common convolution attributes for ``spatial_rank`` axes.

    Missing (None or empty) pads and output_padding mean zeros, missing
    dilations mean ones; strides are required.  Pads are read only for
    explicit padding (the specs say they are ignored otherwise).
    """
    if strides is None:
        raise fail(op, "strides", strides, "is required")
    n = spatial_rank
    strides = int_tuple(op, "strides", strides, n, minimum=1)
    dilations = (1,) * n if dilations is None else int_tuple(op, "dilations", dilations, n,
                                                              minimum=1)
    mode = parse_auto_pad(op, auto_pad)
    if mode == "explicit":
        pb = (0,) * n if _zeros_if_empty(pads_begin) else int_tuple(
            op, "pads_begin", pads_begin, n, minimum=0)
        pe = (0,) * n if _zeros_if_empty(pads_end) else int_tuple(
            op, "pads_end", pads_end, n, minimum=0)
    else:
        pb = pe = (0,) * n
    opad = (0,) * n if _zeros_if_empty(output_padding) else int_tuple(
        op, "output_padding", output_padding, n)
    check_output_padding(op, opad, strides, dilations, strict=strict_output_padding)
    return ConvAttrs(strides, dilations, pb, pe, mode, opad)


def data_shape(op: str, name: str, tensor: TensorSpec, layout: DataLayout,
               rank: int | None = None) -> tuple[int, int, tuple[int, ...]]:
    """(N, C, spatial) of a data tensor in ``layout``; checks rank 3..5 (or ``rank``)."""
    shape = tensor.shape
    check_rank(op, name, shape, (3, 4, 5) if rank is None else (rank,))
    canon = layout.canonical_shape(shape)
    return canon[0], canon[1], tuple(canon[2:])


def same_rank(op: str, names: tuple[str, str], tensors: tuple[TensorSpec, TensorSpec]) -> int:
    a, b = (len(t.shape) for t in tensors)
    if a != b:
        raise fail(op, f"rank of {names[1]}", b, f"must equal the rank of {names[0]} ({a})")
    return a


def check_equal(op: str, subject: str, got: int, expected: int, why: str) -> None:
    if got != expected:
        raise fail(op, subject, got, f"must equal {expected} ({why})")


def make_plan(op: str, kind: str, geom: ConvGeometry, *, names: dict[str, str],
              data_layout: DataLayout, weight_layout: WeightLayout,
              allow_int: bool = False) -> Plan:
    """Build the plan of a call: ``names`` maps canonical roles (x, w, dy,
    bias) to the op's input names."""
    sr = geom.spatial_rank
    adapters = {
        "x": data_layout.to_canonical,
        "dy": data_layout.to_canonical,
        "w": lambda a: weight_layout.to_canonical(a, sr),
        "bias": lambda a: a,
    }
    roles = {name: (role, adapters[role]) for role, name in names.items()}
    if kind == "wgrad":
        out_shape = weight_layout.spec_shape(geom.w_shape, geom.groups)
        back = lambda a: weight_layout.from_canonical(a, geom.groups)  # noqa: E731
        free = weight_layout.result_layouts(geom.w_shape)
    else:
        canon = geom.y_shape if kind == "fwd" else geom.x_shape
        out_shape = data_layout.spec_shape(canon)
        back = data_layout.from_canonical
        free = data_layout.result_layouts(canon)
    return Plan(op, kind, geom, roles, back, tuple(out_shape), allow_int=allow_int,
                result_layouts=free)


def check_bias(op: str, bias: TensorSpec | None, channels: int) -> None:
    if bias is not None and bias.shape != (channels,):
        raise fail(op, "shape of bias", list(bias.shape),
                   f"must be [{channels}] (one value per output channel)")


def weights_dims(op: str, w: TensorSpec, rank: int, wl: WeightLayout, groups: int, *,
                 o_role: str, name: str = "weights") -> tuple[int, int, tuple[int, ...]]:
    """Canonical (O, C/G, kernel) of a weights tensor in layout ``wl``; checks
    its rank against the data rank and O against groups."""
    want = wl.rank(rank - 2)
    if len(w.shape) != want:
        raise fail(op, f"rank of {name}", len(w.shape),
                   f"must be {want} for rank-{rank} data in {wl.name} (shape {list(w.shape)})")
    parts = wl.split(w.shape, rank - 2)
    o = parts["o"] * (parts["g"] if parts["g"] is not None else 1)
    cg = parts["c"] if parts["c"] is not None else 1
    if o % groups:
        raise fail(op, f"{name} {o_role}", o, f"must be divisible by groups = {groups}")
    check_kernel(op, f"spatial shape of {name}", parts["x"])
    return o, cg, parts["x"]


def check_kernel(op: str, subject: str, kernel) -> None:
    """Kernel spatial sizes must be positive (checked where the kernel is read, so the
    error names the weights tensor or shape input it came from)."""
    if any(k < 1 for k in kernel):
        raise fail(op, subject, list(kernel), "kernel sizes must be positive")
