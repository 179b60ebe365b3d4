"""The selector behind ``algo="auto"``: which kernel to try first for a problem.

Rules, from the measurements in ``benchmarks/`` (float32, 2 threads):

- Winograd (``winograd``) first for 3-tap stride-1 layers where its speed model
  says it is faster (enough channels per group, images not so small that tiles
  waste the saving) and its error model stays within the documented bound
  (``winograd.preferred``), unless ``config(precision="highest")``;

- the native engine (``native``, compiled register-blocked direct convolution)
  first, for every float32/float16/bfloat16 problem it supports, except the
  few-channel groups below; the NumPy/numba kernels are its fallbacks (float64,
  integers, or no loadable build);

- grouped problems with at most GROUPED_MAX_CHANNELS input and output channels
  per group (depthwise with a multiplier up to 8, ResNeXt's 4 -> 4, the
  GroupConvolutionBackpropData spec op's 2 -> 5): the native grouped kernel
  (``grouped``, lane-aligned vectors, no GEMM).  Measured (2 threads, 8x128x28x28,
  3x3, NCX caller, ms, fwd / wgrad / dgrad): 32 groups of 4: grouped 12.0 / 15.7 /
  12.6, direct 20.8 / 19.8 / 17.6, native 26.2 / 34.9 / 25.4; 16 groups of 8:
  grouped 8.7 / 8.8 / 8.5, native 10.5 / 15.2 / 15.4; 8 groups of 16: grouped
  19.3 / 18.6 / 40.1, native 14.6 / 18.7 / 8.4 (GEMM-shaped from there on).  On the
  suite's depthwise and grouped rows it is 1.1-7x faster than the direct kernel
  (float16 3-4.5x), see docs/kernels.md, "Grouped kernel";
- other grouped problems with few channels per group are not GEMM-shaped: the direct
  kernel, which itself declines groups large enough for GEMMs
  (``direct.supports``), whatever the number of groups.  The shifted kernel's
  one small GEMM per group and tap is 2-20x slower for 32 or 144 groups, and
  also for 2-8 groups of <= 16 channel pairs: 1.2-3.6x on forward, weight and
  data gradients of five such shapes, 2-D and 3-D (the spec op's data gradient:
  14 ms against 37 ms in 2-D, 146 against 305 ms in 3-D; 2 threads);
- otherwise the shifted-GEMM kernel, unless its grid wastes too much work in
  a forward or data gradient: its GEMMs run over every grid row, and at small
  spatial sizes with padding the grid is much larger than the output (14x14
  with pad 1: 16x16, +31%; 7x7: +65%); there im2col's one large GEMM wins.
  Weight gradients stay with the shifted kernel (im2col measured 1.4-3x
  slower on every dense layer of the suite).

The first kernel in the preference list that supports the problem runs; if
none does, the registry's priority order decides.
"""

from __future__ import annotations

import functools
import math

from ..geometry import ConvGeometry

WASTE_LIMIT = 1.3         # shifted grid rows / output positions above this: im2col
GROUPED_MAX_CHANNELS = 8  # C/G and O/G at most this: the grouped kernel first


@functools.lru_cache(maxsize=512)
def grid_waste(op: str, geom: ConvGeometry) -> float:
    """Rows the shifted kernel computes per useful output row."""
    from . import shifted
    if op == "dgrad":
        *_, extents, _, phases = shifted._dgrad_plan(geom)
        useful = math.prod(geom.in_sizes)
        rows = math.prod(extents) * len(phases)
    else:
        _, extents, _ = shifted._forward_grid(geom)
        useful = math.prod(geom.out_sizes)
        rows = math.prod(extents)
    return rows / max(1, useful)


def preference(op: str, geom: ConvGeometry) -> list[str]:
    from . import winograd
    first = ["winograd"] if winograd.preferred(geom, op) else []
    if geom.groups > 1:
        if max(geom.c, geom.o) // geom.groups <= GROUPED_MAX_CHANNELS:
            return first + ["grouped", "direct", "native", "shifted", "im2col"]
        return first + ["direct", "native", "shifted", "im2col"]
    if op != "wgrad" and grid_waste(op, geom) > WASTE_LIMIT:
        return first + ["native", "im2col", "shifted"]
    return first + ["native", "shifted", "im2col"]
