"""Shape inference, padding resolution and validation: integers in, integers out.

This module is the single place where sizes and pads are computed.  It never
sees an array.  Notation per spatial axis (as in ``docs/decisions.md``): input
length ``L``, kernel ``K``, stride ``s``, dilation ``d`` (1 = dense), pads
``pb``/``pe``, output length ``M``, output_padding ``op`` and effective kernel
``Ke = (K - 1) * d + 1``.

Forward convolution:   ``M = floor((L + pb + pe - Ke) / s) + 1``
Transposed (backprop): ``L = s * (M - 1) + Ke - pb - pe + op``

auto_pad modes, per axis (``total`` is split as ``small = total // 2`` and
``big = total - small``):

============  ==========================================  ===================
mode          total padding                               (pads_begin, end)
============  ==========================================  ===================
explicit      as given                                    (pb, pe)
valid         0                                           (0, 0)
same_upper    forward: ``max(0, (ceil(L/s)-1)*s + Ke - L)``  (small, big)
              transposed (ConvTranspose): ``max(0, Ke - s)``
same_lower    as same_upper                               (big, small)
============  ==========================================  ===================

OpenVINO's (Group)ConvolutionBackpropData has rules of its own, implemented in
:func:`openvino_backprop_pads` (see its docstring).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .errors import fail

PAD_MODES = ("explicit", "valid", "same_upper", "same_lower")

_AUTO_PAD_ALIASES = {
    "none": "explicit",
    "notset": "explicit",
    "explicit": "explicit",
    "": "explicit",
    "valid": "valid",
    "same_upper": "same_upper",
    "same_lower": "same_lower",
}

# No dimension or attribute may exceed this: it keeps every product of sizes
# inside int64 and rejects absurd values before anything is allocated.
MAX_DIM = 2**40


# ----------------------------------------------------------------------------
# Parsing of attribute values
# ----------------------------------------------------------------------------


def _as_int(op: str, name: str, value, item) -> int:
    if isinstance(item, (bool, np.bool_)) or not isinstance(item, numbers.Integral):
        raise fail(op, name, value, "must contain integers only")
    return int(item)


def int_tuple(op: str, name: str, value, length: int | None = None, *,
              minimum: int | None = None, allow_scalar: bool = True) -> tuple[int, ...]:
    """Parse a list/tuple/1-D integer array (or a scalar broadcast to
    ``length``) into a tuple of Python ints, checking length and minimum."""
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            value = value.item()
        elif value.ndim != 1:
            raise fail(op, name, value.tolist(), "must be a 1-D list of integers")
        elif value.dtype.kind not in "iu":
            raise fail(op, name, value.tolist(), "must contain integers only")
        else:
            value = value.tolist()
    if isinstance(value, (numbers.Integral,)) and not isinstance(value, (bool, np.bool_)):
        if not allow_scalar or length is None:
            raise fail(op, name, value, "must be a list of integers")
        items = (int(value),) * length
    elif isinstance(value, (list, tuple)):
        items = tuple(_as_int(op, name, value, v) for v in value)
    else:
        raise fail(op, name, value, "must be a list, tuple or 1-D array of integers")
    if length is not None and len(items) != length:
        raise fail(op, name, items, f"must have {length} value(s), one per spatial axis, "
                                    f"got {len(items)}")
    if minimum is not None and any(v < minimum for v in items):
        rule = "must be positive" if minimum == 1 else f"must be >= {minimum}"
        raise fail(op, name, items, rule)
    if any(abs(v) > MAX_DIM for v in items):
        raise fail(op, name, items, f"values must not exceed {MAX_DIM}")
    return items


def positive_int(op: str, name: str, value) -> int:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise fail(op, name, value, "must be a positive integer")
    if value < 1 or value > MAX_DIM:
        raise fail(op, name, value, "must be a positive integer")
    return int(value)


def parse_auto_pad(op: str, value, name: str = "auto_pad") -> str:
    """Normalise an auto_pad spelling (case-insensitive) to one of PAD_MODES.

    "None", "none", "NOTSET", "explicit" and ``None`` all mean explicit pads.
    """
    if value is None:
        return "explicit"
    if not isinstance(value, str):
        raise fail(op, name, value, "must be a string")
    mode = _AUTO_PAD_ALIASES.get(value.strip().lower())
    if mode is None:
        raise fail(op, name, value, "must be one of 'none' (or 'explicit'/'notset'), "
                                    "'valid', 'same_upper', 'same_lower' (any case)")
    return mode


def parse_choice(op: str, name: str, value, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value.upper() not in choices:
        raise fail(op, name, value, f"must be one of {', '.join(choices)}")
    return value.upper()


def shape_input(op: str, name: str, value, rank: int) -> tuple[tuple[int, ...], bool]:
    """Parse a shape input: full (``rank`` values) or spatial (``rank - 2``).

    Returns ``(values, is_full)``.  Any other length is an error: a kernel or
    data size is never guessed from tensor shapes.
    """
    if value is None:
        raise fail(op, name, value, "is required (as input or attribute)")
    dims = int_tuple(op, name, value, None, allow_scalar=False)
    if len(dims) not in (rank, rank - 2):
        raise fail(op, name, dims, f"must have {rank} values (full shape) or {rank - 2} "
                                   f"(spatial shape) for rank-{rank} data, got {len(dims)}")
    if any(v < 0 for v in dims):
        raise fail(op, name, dims, "must not be negative")
    return dims, len(dims) == rank


def check_rank(op: str, name: str, shape: tuple[int, ...], ranks=(3, 4, 5)) -> int:
    if len(shape) not in ranks:
        raise fail(op, f"rank of {name}", len(shape),
                   f"must be one of {', '.join(map(str, ranks))} (shape {list(shape)})")
    return len(shape)


# ----------------------------------------------------------------------------
# Per-axis size and padding arithmetic
# ----------------------------------------------------------------------------


def effective_kernel(k: int, d: int) -> int:
    return (k - 1) * d + 1


def same_total(in_size: int, ke: int, stride: int, *, transposed: bool = False) -> int:
    """Total padding of a SAME mode: forward conv keeps ``M = ceil(L/s)``;
    a ConvTranspose keeps ``out = L * s`` (its total does not depend on L)."""
    if transposed:
        return max(ke - stride, 0)
    m = -(-in_size // stride)
    return max((m - 1) * stride + ke - in_size, 0)


def split_total(total: int, mode: str, *, odd_at_begin: bool = False) -> tuple[int, int]:
    """Split a SAME total: same_upper puts the odd element at the end,
    same_lower at the beginning; ``odd_at_begin`` swaps the two (OpenVINO
    backprop convention)."""
    small, big = total // 2, total - total // 2
    upper = mode == "same_upper"
    if odd_at_begin:
        upper = not upper
    return (small, big) if upper else (big, small)


def resolve_pads(op: str, mode: str, in_sizes, kernel, strides, dilations,
                 pads_begin, pads_end, *, transposed: bool = False
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Resolve (pads_begin, pads_end) for a forward-style auto_pad rule.

    ``in_sizes`` is the forward-conv input (ignored when ``transposed``)."""
    if mode == "explicit":
        return tuple(pads_begin), tuple(pads_end)
    if mode == "valid":
        zeros = (0,) * len(kernel)
        return zeros, zeros
    pb, pe = [], []
    for i, k in enumerate(kernel):
        ke = effective_kernel(k, dilations[i])
        size = 0 if transposed else in_sizes[i]
        b, e = split_total(same_total(size, ke, strides[i], transposed=transposed), mode)
        pb.append(b)
        pe.append(e)
    return tuple(pb), tuple(pe)


def conv_out_sizes(op: str, in_sizes, kernel, strides, dilations, pads_begin, pads_end,
                   *, what: str = "input") -> tuple[int, ...]:
    """Forward output sizes ``floor((L + pb + pe - Ke) / s) + 1`` per axis."""
    out = []
    for i, (size, k, s, d, b, e) in enumerate(
            zip(in_sizes, kernel, strides, dilations, pads_begin, pads_end)):
        ke = effective_kernel(k, d)
        if size + b + e < ke:
            raise fail(op, f"spatial axis {i}", {"size": size, "pads": [b, e], "kernel": k,
                                                  "dilation": d},
                       f"padded {what} size {size + b + e} is smaller than the dilated "
                       f"kernel extent {ke}")
        out.append((size + b + e - ke) // s + 1)
    return tuple(out)


def transposed_sizes(op: str, in_sizes, kernel, strides, dilations, pads_begin, pads_end,
                     output_padding) -> tuple[int, ...]:
    """ConvTranspose output sizes ``s*(L-1) + Ke - pb - pe + op`` per axis."""
    out = []
    for i, (size, k, s, d, b, e, p) in enumerate(
            zip(in_sizes, kernel, strides, dilations, pads_begin, pads_end, output_padding)):
        n = s * (size - 1) + effective_kernel(k, d) - b - e + p
        if size < 1 or n < 1:
            raise fail(op, f"spatial axis {i}", {"size": size, "kernel": k, "stride": s,
                                                  "dilation": d, "pads": [b, e],
                                                  "output_padding": p},
                       f"transposed output size s*(L-1)+Ke-pb-pe+op = {n} must be positive")
        out.append(n)
    return tuple(out)


def check_output_padding(op: str, output_padding, strides, dilations, *, strict: bool) -> None:
    """output_padding >= 0 always; with ``strict`` also ``< max(stride, dilation)``
    (PyTorch's rule, which makes the padded size the unique inverse)."""
    for i, (p, s, d) in enumerate(zip(output_padding, strides, dilations)):
        if p < 0:
            raise fail(op, "output_padding", list(output_padding), "must not be negative")
        if strict and p >= max(s, d):
            raise fail(op, "output_padding", list(output_padding),
                       f"axis {i}: must be smaller than max(stride, dilation) = {max(s, d)}")


def check_conv_output(op: str, name: str, got, what: str, in_sizes, kernel, strides,
                      dilations, pads_begin, pads_end, note: str = "") -> None:
    """``name``'s spatial shape must be exactly the forward output size of ``what``
    (TensorFlow's check): ``floor((L + pb + pe - Ke) / s) + 1`` per axis."""
    expected = conv_out_sizes(op, in_sizes, kernel, strides, dilations, pads_begin, pads_end,
                              what=what)
    if tuple(got) != tuple(expected):
        raise fail(op, f"spatial shape of {name}", list(got),
                   f"must equal {list(expected)}, the convolution output size of {what} "
                   f"{list(in_sizes)} with kernel {list(kernel)}, strides {list(strides)}, "
                   f"dilations {list(dilations)}, pads {list(pads_begin)}/{list(pads_end)}"
                   + note)


def openvino_backprop_pads(op: str, mode: str, in_sizes, kernel, strides, dilations,
                           pads_begin, pads_end, output_padding, output_shape
                           ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Pads and output size of OpenVINO (Group)ConvolutionBackpropData.

    ``in_sizes`` are the op's input (the forward conv's output) sizes.  Rules
    (the OpenVINO runtime's, see docs/decisions.md D6):

    - no output_shape: explicit uses the pads; valid *and same_** use zero pads;
      ``out = s*(L-1) + Ke - pb - pe + op``.
    - with output_shape: out = output_shape; explicit uses pads_begin as given;
      valid uses zero pads; same_* derive
      ``total = max(0, s*(L-1) + Ke - out + op)`` and split it with the odd
      element at the BEGINNING for same_upper (end for same_lower).

    Returns ``(pads_begin, pads_end, out_sizes)``; pads_end is informational
    (values only depend on pads_begin and the output size).
    """
    pb, pe, out = [], [], []
    for i, k in enumerate(kernel):
        s, d, p = strides[i], dilations[i], output_padding[i]
        full = s * (in_sizes[i] - 1) + effective_kernel(k, d)
        if output_shape is None:
            b, e = (pads_begin[i], pads_end[i]) if mode == "explicit" else (0, 0)
            n = full - b - e + p
            if n < 0:
                raise fail(op, f"spatial axis {i}", {"input size": in_sizes[i], "kernel": k,
                                                      "pads": [b, e]},
                           f"output size s*(L-1)+Ke-pb-pe+op = {n} must not be negative")
        else:
            n = output_shape[i]
            if mode == "explicit":
                b = pads_begin[i]
                e = full - b + p - n
            elif mode == "valid":
                b, e = 0, full + p - n
            else:
                total = max(0, full - n + p)
                b, e = split_total(total, mode, odd_at_begin=True)
        pb.append(b)
        pe.append(e)
        out.append(n)
    return tuple(pb), tuple(pe), tuple(out)


# ----------------------------------------------------------------------------
# The canonical problem
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ConvGeometry:
    """A canonical convolution problem.

    ``x[N, C, *in_sizes]`` convolved with ``w[O, C/G, *kernel]`` gives
    ``y[N, O, *out_sizes]``; input position ``q = p*s + t*d - pb`` for output
    position ``p`` and kernel tap ``t``.  Only ``pads_begin`` and the three
    size tuples determine the values of every op; ``pads_end`` is recorded as
    the spec resolved it.
    """

    n: int
    c: int
    o: int
    groups: int
    in_sizes: tuple[int, ...]
    kernel: tuple[int, ...]
    out_sizes: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]

    @property
    def spatial_rank(self) -> int:
        return len(self.kernel)

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (self.n, self.c, *self.in_sizes)

    @property
    def w_shape(self) -> tuple[int, ...]:
        return (self.o, self.c // self.groups, *self.kernel)

    @property
    def y_shape(self) -> tuple[int, ...]:
        return (self.n, self.o, *self.out_sizes)

    @property
    def flops(self) -> int:
        return (2 * self.n * self.o * (self.c // self.groups)
                * math.prod(self.kernel) * math.prod(self.out_sizes))

    def tap_ranges(self, tap: tuple[int, ...]):
        """For one kernel tap, the output range ``[p0, p1)`` per axis whose
        input position ``q = p*s + t*d - pb`` lies inside ``[0, L)``, and the
        first such ``q``.  Returns None when the tap touches no input."""
        ranges = []
        for t, L, M, s, d, b in zip(tap, self.in_sizes, self.out_sizes, self.strides,
                                    self.dilations, self.pads_begin):
            off = t * d - b
            p0 = max(0, -(off // s))             # first p with q >= 0
            p1 = min(M, (L - 1 - off) // s + 1)  # one past the last p with q < L
            if p1 <= p0:
                return None
            ranges.append((p0, p1, off + p0 * s))
        return ranges

    def tap_slices(self, tap: tuple[int, ...]):
        """For one kernel tap, ``(output slices, input slices)`` of the positions
        it connects (the input slices are strided by ``s``), or None."""
        ranges = self.tap_ranges(tap)
        if ranges is None:
            return None
        ps = tuple(slice(p0, p1) for p0, p1, _ in ranges)
        qs = tuple(slice(q0, q0 + (p1 - p0 - 1) * s + 1, s)
                   for (p0, p1, q0), s in zip(ranges, self.strides))
        return ps, qs


def check_divisible(op: str, name: str, channels: int, groups: int) -> None:
    if groups < 1:
        raise fail(op, "groups", groups, "must be a positive integer")
    if channels % groups:
        raise fail(op, name, channels, f"must be divisible by groups = {groups}")


def make_geometry(op: str, *, n, c, o, groups, in_sizes, kernel, out_sizes, strides,
                  dilations, pads_begin, pads_end, channel_names=("input channels",
                                                                  "output channels")
                  ) -> ConvGeometry:
    """Validate group divisibility and sizes, and build a :class:`ConvGeometry`."""
    check_divisible(op, channel_names[0], c, groups)
    check_divisible(op, channel_names[1], o, groups)
    if any(k < 1 for k in kernel):
        raise fail(op, "kernel spatial shape", list(kernel), "must be positive")
    for name, vals in (("strides", strides), ("dilations", dilations)):
        if any(v < 1 for v in vals):
            raise fail(op, name, list(vals), "must be positive")
    geom = ConvGeometry(n, c, o, groups, tuple(in_sizes), tuple(kernel), tuple(out_sizes),
                        tuple(strides), tuple(dilations), tuple(pads_begin), tuple(pads_end))
    for name, shape in (("input", geom.x_shape), ("weights", geom.w_shape),
                        ("output", geom.y_shape)):
        if any(v < 0 for v in shape):
            raise fail(op, f"{name} shape", list(shape), "must not be negative")
        if math.prod(shape) > MAX_DIM * 64:
            raise fail(op, f"{name} shape", list(shape), "has too many elements")
    return geom


# ----------------------------------------------------------------------------
# Sub-problems: one block of a blocked (e.g. distributed) computation
# ----------------------------------------------------------------------------
#
# Along one spatial axis, output position p reads inputs [p*s - pb, p*s - pb + Ke).
# A block of outputs [p0, p1) and a block of inputs [q0, q1) that contains
# every input those outputs read inside [0, L) form a problem of the same kind:
# input size q1 - q0, output size p1 - p0, pads_begin q0 - (p0*s - pb) and
# pads_end (p1-1)*s - pb + Ke - q1 (both >= 0).  Its fwd is the block of the
# whole fwd, its wgrad the block's share of the whole wgrad, its dgrad the
# whole dgrad restricted to [q0, q1) when [p0, p1) are all the outputs that
# read it.


def input_window(geom: ConvGeometry, axis: int, p0: int, p1: int) -> tuple[int, int]:
    """The inputs ``[q0, q1)`` (inside ``[0, L)``) that outputs ``[p0, p1)`` read
    along ``axis``; empty (``q1 <= q0``) when they read only padding."""
    s, b = geom.strides[axis], geom.pads_begin[axis]
    ke = effective_kernel(geom.kernel[axis], geom.dilations[axis])
    return max(0, p0 * s - b), min(geom.in_sizes[axis], (p1 - 1) * s - b + ke)


def output_window(geom: ConvGeometry, axis: int, q0: int, q1: int
                  ) -> tuple[int, int, int, int]:
    """The outputs ``[p0, p1)`` that read any input in ``[q0, q1)`` along
    ``axis``, and the part ``[a, b)`` of ``[q0, q1)`` they read (the rest gets
    no contribution).  Empty (``p1 <= p0``) when no output reads the range."""
    s, pb = geom.strides[axis], geom.pads_begin[axis]
    ke = effective_kernel(geom.kernel[axis], geom.dilations[axis])
    p0 = max(0, (q0 + pb - ke) // s + 1)                 # first window ending after q0
    p1 = min(geom.out_sizes[axis], (q1 - 1 + pb) // s + 1)  # past the last starting before q1
    if p1 <= p0:
        return p0, p0, q0, q0
    return p0, p1, max(q0, p0 * s - pb), min(q1, (p1 - 1) * s - pb + ke)


def _center(geom: ConvGeometry, axis: int) -> int:
    """Offset of an output's window centre from ``p * s``: ``(Ke - 1) // 2 - pb``
    (0 for 'same' padding)."""
    ke = effective_kernel(geom.kernel[axis], geom.dilations[axis])
    return (ke - 1) // 2 - geom.pads_begin[axis]


def output_boundary(geom: ConvGeometry, axis: int, q: int) -> int:
    """The output block boundary matching input boundary ``q``: the first output
    whose window centre ``p*s + (Ke-1)//2 - pb`` is at or after ``q`` (clipped to
    ``[0, M]``).  With 'same' padding at stride 1 it is ``q`` itself."""
    s = geom.strides[axis]
    return min(geom.out_sizes[axis], max(0, -(-(q - _center(geom, axis)) // s)))


def input_boundary(geom: ConvGeometry, axis: int, p: int) -> int:
    """The input block boundary matching output boundary ``p``: output ``p``'s
    window centre (clipped to ``[0, L]``); the inverse of :func:`output_boundary`
    inside the arrays."""
    return min(geom.in_sizes[axis], max(0, p * geom.strides[axis] + _center(geom, axis)))


def sub_geometry(geom: ConvGeometry, n: int, out_ranges, in_ranges) -> ConvGeometry:
    """The problem of ``n`` samples, outputs ``out_ranges`` and inputs
    ``in_ranges`` (one ``(start, stop)`` per spatial axis).  The inputs must lie
    inside the outputs' reach (non-negative pads) and contain every input the
    outputs read (:func:`input_window`, :func:`output_window` give such pairs)."""
    pb, pe = [], []
    for i, ((p0, p1), (q0, q1)) in enumerate(zip(out_ranges, in_ranges)):
        s, b = geom.strides[i], geom.pads_begin[i]
        ke = effective_kernel(geom.kernel[i], geom.dilations[i])
        pb.append(q0 - (p0 * s - b))
        pe.append((p1 - 1) * s - b + ke - q1)
        if pb[-1] < 0 or pe[-1] < 0:
            raise ValueError(f"axis {i}: inputs {q0}:{q1} do not contain what outputs "
                             f"{p0}:{p1} read")
    return ConvGeometry(n, geom.c, geom.o, geom.groups,
                        tuple(q1 - q0 for q0, q1 in in_ranges), geom.kernel,
                        tuple(p1 - p0 for p0, p1 in out_ranges), geom.strides,
                        geom.dilations, tuple(pb), tuple(pe))
