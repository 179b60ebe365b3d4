"""An independent float64 reference written straight from the definitions,
one output position and one tap at a time.  Shares no code with convgrad.

Canonical layout: x (N, C, *S), w (O, C/G, *K), y/dy (N, O, *M); input index
``q = p*s + t*d - pb`` per spatial axis, zero outside [0, S).
"""

import itertools

import numpy as np


def _pairs(out_sizes, kernel, in_sizes, strides, dilations, pads_begin):
    for p in itertools.product(*(range(m) for m in out_sizes)):
        for t in itertools.product(*(range(k) for k in kernel)):
            q = tuple(pi * s + ti * d - b for pi, ti, s, d, b in
                      zip(p, t, strides, dilations, pads_begin))
            if all(0 <= qi < L for qi, L in zip(q, in_sizes)):
                yield p, t, q


def forward(x, w, out_sizes, strides, dilations, pads_begin, groups):
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n, c = x.shape[:2]
    o = w.shape[0]
    cg, og = c // groups, o // groups
    y = np.zeros((n, o, *out_sizes))
    for p, t, q in _pairs(out_sizes, w.shape[2:], x.shape[2:], strides, dilations, pads_begin):
        for g in range(groups):
            xs = x[(slice(None), slice(g * cg, (g + 1) * cg)) + q]          # (N, Cg)
            ws = w[(slice(g * og, (g + 1) * og), slice(None)) + t]          # (Og, Cg)
            y[(slice(None), slice(g * og, (g + 1) * og)) + p] += xs @ ws.T
    return y


def wgrad(x, dy, kernel, strides, dilations, pads_begin, groups):
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    n, c = x.shape[:2]
    o = dy.shape[1]
    cg, og = c // groups, o // groups
    dw = np.zeros((o, cg, *kernel))
    for p, t, q in _pairs(dy.shape[2:], kernel, x.shape[2:], strides, dilations, pads_begin):
        for g in range(groups):
            xs = x[(slice(None), slice(g * cg, (g + 1) * cg)) + q]          # (N, Cg)
            ds = dy[(slice(None), slice(g * og, (g + 1) * og)) + p]         # (N, Og)
            dw[(slice(g * og, (g + 1) * og), slice(None)) + t] += ds.T @ xs
    return dw


def dgrad(w, dy, in_sizes, strides, dilations, pads_begin, groups):
    w, dy = np.asarray(w, np.float64), np.asarray(dy, np.float64)
    n, o = dy.shape[:2]
    cg = w.shape[1]
    og = o // groups
    dx = np.zeros((n, cg * groups, *in_sizes))
    for p, t, q in _pairs(dy.shape[2:], w.shape[2:], in_sizes, strides, dilations, pads_begin):
        for g in range(groups):
            ds = dy[(slice(None), slice(g * og, (g + 1) * og)) + p]         # (N, Og)
            ws = w[(slice(g * og, (g + 1) * og), slice(None)) + t]          # (Og, Cg)
            dx[(slice(None), slice(g * cg, (g + 1) * cg)) + q] += ds @ ws
    return dx


def three_ops(x, w, dy, case):
    """``(op, args, expected)`` for fwd, wgrad and dgrad of one tests/cases.py case."""
    a = dict(strides=case["strides"], dilations=case["dilations"],
             pads_begin=case["pads_begin"], groups=case["groups"])
    return (("fwd", (x, w), forward(x, w, case["out_sizes"], **a)),
            ("wgrad", (x, dy), wgrad(x, dy, case["kernel"], **a)),
            ("dgrad", (w, dy), dgrad(w, dy, case["in_sizes"], **a)))
