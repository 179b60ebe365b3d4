"""Every layout conversion, named after the specs' own terms.

Canonical data layout is ``NCX`` (batch, channels, spatial...); canonical
weight layout is the forward convolution's ``OIX`` = ``(O, C/G, K...)`` with
output channel ``o`` in group ``o // (O/G)``.

A weight layout is written with role letters, in the order its axes appear:

- ``o``: the canonical output-channel axis (all groups), or its per-group part
  when ``g`` is present;
- ``c``: the canonical per-group input-channel axis (absent: size 1);
- ``g``: a separate group axis (OpenVINO grouped kernels, TF depthwise);
- ``x``: all spatial axes, in order.

So oneDNN ``OIX`` is ``ocx`` and ``XIO`` is ``xco``.  A ConvTranspose with
input channels I and output channels O is the data gradient of a forward conv
with C = O and O_conv = I, so its ``IOX`` weight ``(I, O/G, X)`` *is* that
conv's ``OIX`` (``ocx``); ``OIX`` ``(O/G, I, X)`` is ``cox``; ``XIO`` is ``xoc``
and ``XOI`` is ``xco``.  OpenVINO's ``[G, C_IN, C_OUT, X]`` backprop kernel and
``[G, C_OUT, C_IN, X]`` forward kernel are both ``gocx``; TensorFlow's HWIO is
``xco`` and its depthwise ``[H, W, C, M]`` is ``xgo``.

All conversions return views (no copies); the caller makes them contiguous in
the compute dtype in one pass.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ._late import module as _late


@dataclass(frozen=True)
class DataLayout:
    """``NCX`` or ``NXC`` (channels last)."""

    name: str

    @property
    def channels_last(self) -> bool:
        return self.name == "NXC"

    def perm_to_canonical(self, rank: int) -> tuple[int, ...]:
        if self.channels_last:
            return (0, rank - 1, *range(1, rank - 1))
        return tuple(range(rank))

    def canonical_shape(self, shape) -> tuple[int, ...]:
        return tuple(shape[i] for i in self.perm_to_canonical(len(shape)))

    def spec_shape(self, canonical) -> tuple[int, ...]:
        canonical = tuple(canonical)
        return (canonical[0], *canonical[2:], canonical[1]) if self.channels_last else canonical

    def to_canonical(self, a: np.ndarray) -> np.ndarray:
        return a.transpose(self.perm_to_canonical(a.ndim))

    def from_canonical(self, a: np.ndarray) -> np.ndarray:
        return a.transpose(_inverse(self.perm_to_canonical(a.ndim)))

    def channel_axis(self, rank: int) -> int:
        return rank - 1 if self.channels_last else 1

    def result_layouts(self, canonical) -> frozenset:
        """The kernel layouts (``"ncx"``, ``"nxc"``) whose result, a canonical
        ``(N, C, *S)`` array, is C-contiguous in this layout (no copy)."""
        # spec axis j is canonical axis inverse(perm)[j]: the memory order
        order = _inverse(self.perm_to_canonical(len(canonical)))
        return _same_order(order, canonical, weights=False)


def _inverse(perm) -> tuple[int, ...]:
    """The inverse permutation, as a tuple of ints (NumPy and Dask arrays
    both take it)."""
    return _inverse_of(tuple(perm))


@functools.lru_cache(maxsize=64)
def _inverse_of(perm: tuple) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


NCX = DataLayout("NCX")
NXC = DataLayout("NXC")


@dataclass(frozen=True)
class WeightLayout:
    """A weight layout: its spec name and its role letters (see module doc)."""

    name: str
    roles: str

    def _letters(self, spatial_rank: int) -> list[str]:
        out = []
        for r in self.roles:
            out.extend(["x"] * spatial_rank if r == "x" else [r])
        return out

    def rank(self, spatial_rank: int) -> int:
        return len(self._letters(spatial_rank))

    def _perm(self, spatial_rank: int) -> list[int]:
        letters = self._letters(spatial_rank)
        return [i for role in "gocx" for i, r in enumerate(letters) if r == role]

    def _grouped_shape(self, canonical, groups: int) -> list[int]:
        """Canonical (O, Cg, K...) split into the role axes g, o, c, x (in that order)."""
        o, cg, *k = canonical
        out = []
        if "g" in self.roles:
            out += [groups, o // groups]
        else:
            out.append(o)
        if "c" in self.roles:
            out.append(cg)
        return out + k

    def spec_shape(self, canonical, groups: int) -> tuple[int, ...]:
        """Shape in this layout of a canonical (O, Cg, K...) weight."""
        grouped = self._grouped_shape(canonical, groups)
        perm = self._perm(len(canonical) - 2)
        shape = [0] * len(perm)
        for dst, src in enumerate(perm):
            shape[src] = grouped[dst]
        return tuple(shape)

    def split(self, shape, spatial_rank: int) -> dict:
        """Name the axes of a spec-layout shape: returns g (or None), o, c (or
        None) and the kernel spatial sizes."""
        letters = self._letters(spatial_rank)
        out = {"g": None, "c": None, "x": []}
        for r, v in zip(letters, shape):
            if r == "x":
                out["x"].append(v)
            else:
                out[r] = v
        out["x"] = tuple(out["x"])
        return out

    def to_canonical(self, a: np.ndarray, spatial_rank: int) -> np.ndarray:
        """View a spec-layout weight as canonical (O, Cg, K...)."""
        t = a.transpose(self._perm(spatial_rank))
        k = t.shape[t.ndim - spatial_rank:]
        head = t.shape[:t.ndim - spatial_rank]
        o = int(math.prod(head[:2])) if "g" in self.roles else head[0]
        cg = head[-1] if "c" in self.roles else 1
        return t.reshape(o, cg, *k)

    def from_canonical(self, a: np.ndarray, groups: int) -> np.ndarray:
        """View a canonical (O, Cg, K...) weight in this layout."""
        grouped = a.reshape(self._grouped_shape(a.shape, groups))
        return grouped.transpose(_inverse(self._perm(a.ndim - 2)))

    def result_layouts(self, canonical) -> frozenset:
        """The kernel layouts (``"ncx"``, ``"nxc"``) whose result, a canonical
        ``(O, Cg, *K)`` weight, is C-contiguous in this layout (no copy)."""
        letters = self._letters(len(canonical) - 2)
        order, k = [], 2
        for i, r in enumerate(letters):
            if r == "g":
                if letters[i + 1:i + 2] != ["o"]:
                    return frozenset()             # the group axis apart from O's
            elif r == "o":
                order.append(0)
            elif r == "c":
                order.append(1)
            else:
                order.append(k)
                k += 1
        if "c" not in self.roles:
            order.insert(0, 1)                     # Cg = 1 then: anywhere will do
        return _same_order(tuple(order), canonical, weights=True)


def _same_order(order, canonical, *, weights: bool) -> frozenset:
    """The kernel layouts whose memory order of the canonical axes is
    ``order`` (outermost first), axes of size 1 aside."""
    r = len(canonical)
    kernel = {"ncx": tuple(range(r)),
              "nxc": (*range(2, r), 1, 0) if weights else (0, *range(2, r), 1)}

    def big(seq):
        return [i for i in seq if canonical[i] != 1]

    return frozenset(name for name, seq in kernel.items() if big(seq) == big(order))


# oneDNN Graph, forward-convolution family.
CONV_WEIGHTS = {"OIX": WeightLayout("OIX", "ocx"), "XIO": WeightLayout("XIO", "xco")}
# oneDNN Graph, ConvTranspose family: I and O are the ConvTranspose's own channels;
# the per-group axis is always the ConvTranspose output channels.
CONVT_WEIGHTS = {
    "IOX": WeightLayout("IOX", "ocx"),   # (I, O/G, X)    current oneDNN code
    "XOI": WeightLayout("XOI", "xco"),   # (X, O/G, I)    current oneDNN default
    "OIX": WeightLayout("OIX", "cox"),   # (O/G, I, X)    ConvTransposeBackpropFilters-1 page
    "XIO": WeightLayout("XIO", "xoc"),   # (X, I, O/G)    ConvTransposeBackpropFilters-1 default
}
# OpenVINO: [C_OUT, C_IN, X] (Convolution), [C_IN, C_OUT, X] (ConvolutionBackpropData),
# [G, ...] grouped versions.  Both are the forward conv's OIX.
OV_WEIGHTS = WeightLayout("OIX", "ocx")
OV_GROUP_WEIGHTS = WeightLayout("GOIX", "gocx")
# TensorFlow: HWIO / DHWIO, and depthwise [H, W, C, multiplier].
TF_WEIGHTS = WeightLayout("HWIO", "xco")
TF_DEPTHWISE_WEIGHTS = WeightLayout("HWCM", "xgo")
# Canonical.
OIX = CONV_WEIGHTS["OIX"]


def contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` C-contiguous: itself when it already is, else a copy in the spec
    layout (the last step of every call, from the kernel's memory order to the
    caller's).  Permuted float views go through the native engine's blocked
    transposes where that is faster than NumPy's element-wise copy
    (``kernels.native.permuted_copy``)."""
    if a.flags.c_contiguous:
        return a
    out = _late("convgrad.kernels.native").permuted_copy(a)
    return np.ascontiguousarray(a) if out is None else out
