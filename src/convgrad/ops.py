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

import numpy as np

from . import kernels, settings
from .dtypes import compute_dtype
from .geometry import ConvGeometry


def compute(kind: str, a: np.ndarray, b: np.ndarray, geom: ConvGeometry,
            dtype: np.dtype) -> np.ndarray:
    """Run one canonical op on canonical views ``a``, ``b`` of dtype ``dtype``.

    ``kind`` is ``"fwd"`` (a=x, b=w), ``"wgrad"`` (a=x, b=dy) or ``"dgrad"``
    (a=w, b=dy).  Inputs are copied once, contiguous, into the compute dtype
    (never modified); the result is a new array in the compute dtype.
    """
    cdt = compute_dtype(np.dtype(dtype))
    a = np.ascontiguousarray(a, dtype=cdt)
    b = np.ascontiguousarray(b, dtype=cdt)
    kernel = kernels.select(kind, geom, cdt, settings.algo())
    return kernel.fn(a, b, geom)
