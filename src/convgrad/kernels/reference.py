"""The reference kernels: written straight from the definitions, in float64
(int64 for integer inputs), one kernel tap at a time.  Slow and obviously
correct; every fast kernel is tested against them.

Definitions (canonical layout, ``q = p*s + t*d - pb`` per spatial axis, zero
outside ``[0, L)``; ``g`` is the group, ``o``/``c`` per-group channels)::

    y [n, g, o, p] = sum_{c, t}    x [n, g, c, q] * w[g, o, c, t]
    dw[g, o, c, t] = sum_{n, p}    dy[n, g, o, p] * x[n, g, c, q]
    dx[n, g, c, q] = sum_{o, t, p} dy[n, g, o, p] * w[g, o, c, t]
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..geometry import ConvGeometry


def _acc(dtype) -> np.dtype:
    return np.dtype(np.int64) if np.dtype(dtype).kind in "iu" else np.dtype(np.float64)


def _views(geom: ConvGeometry):
    """Yield (tap, output slices, input slices) for every tap that touches the input."""
    for tap in itertools.product(*(range(k) for k in geom.kernel)):
        sl = geom.tap_slices(tap)
        if sl is not None:
            yield (tap, *sl)


def _grouped(a: np.ndarray, groups: int) -> np.ndarray:
    """(N, C, *S) -> (N, G, C/G, *S)."""
    return a.reshape(a.shape[0], groups, a.shape[1] // groups, *a.shape[2:])


def _grouped_w(w: np.ndarray, groups: int) -> np.ndarray:
    """(O, C/G, *K) -> (G, O/G, C/G, *K)."""
    return w.reshape(groups, w.shape[0] // groups, *w.shape[1:])


def _flat(a: np.ndarray) -> np.ndarray:
    """(N, G, C, *S) -> (N, G, C, prod(S))."""
    return a.reshape(*a.shape[:3], math.prod(a.shape[3:]))


def fwd(x, w, geom: ConvGeometry):
    acc = _acc(x.dtype)
    xg, wg = _grouped(x.astype(acc), geom.groups), _grouped_w(w.astype(acc), geom.groups)
    y = np.zeros(geom.y_shape, acc)
    yg = _grouped(y, geom.groups)
    for tap, ps, qs in _views(geom):
        yg[(...,) + ps] += np.einsum("goc,ngc...->ngo...", wg[(...,) + tap],
                                     xg[(...,) + qs])
    return y


def wgrad(x, dy, geom: ConvGeometry):
    acc = _acc(x.dtype)
    xg, dyg = _grouped(x.astype(acc), geom.groups), _grouped(dy.astype(acc), geom.groups)
    dw = np.zeros(geom.w_shape, acc)
    dwg = _grouped_w(dw, geom.groups)
    for tap, ps, qs in _views(geom):
        dys, xs = dyg[(...,) + ps], xg[(...,) + qs]
        # (G, O/G, C/G) = sum over n and positions of (N, G, O/G, P) x (N, G, C/G, P)
        dwg[(...,) + tap] = np.einsum("ngop,ngcp->goc", _flat(dys), _flat(xs))
    return dw


def dgrad(w, dy, geom: ConvGeometry):
    acc = _acc(w.dtype)
    wg, dyg = _grouped_w(w.astype(acc), geom.groups), _grouped(dy.astype(acc), geom.groups)
    dx = np.zeros(geom.x_shape, acc)
    dxg = _grouped(dx, geom.groups)
    for tap, ps, qs in _views(geom):
        dxg[(...,) + qs] += np.einsum("goc,ngo...->ngc...", wg[(...,) + tap],
                                      dyg[(...,) + ps])
    return dx
