"""Gradient correctness without any framework: the adjoint (dot-product)
identities <conv(x,w),dy> = <x,dgrad(w,dy)> = <w,wgrad(x,dy)>, and central
finite differences of a scalar loss on tiny problems."""

import numpy as np
import pytest

import convgrad
from cases import arrays, attrs, case_id, random_case

CASES = [random_case(1000 + seed) for seed in range(80)]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_adjoint_identities(case, rng):
    x, w, dy = arrays(case, rng)
    kw = attrs(case)
    y = convgrad.conv_forward(x, w, **kw)
    dx = convgrad.conv_data_grad(w, dy, x.shape, **kw)
    dw = convgrad.conv_weight_grad(x, dy, w.shape, **kw)
    lhs = np.vdot(y, dy)
    scale = np.abs(y).sum() * np.abs(dy).max() + 1.0
    assert abs(lhs - np.vdot(x, dx)) <= 1e-12 * scale
    assert abs(lhs - np.vdot(w, dw)) <= 1e-12 * scale


@pytest.mark.parametrize("seed", range(6))
def test_finite_differences(seed):
    rng = np.random.default_rng(seed)
    case = random_case(2000 + seed, max_rank=2)
    x, w, dy = arrays(case, rng)
    kw = attrs(case)

    def loss(x, w):                       # L = <conv(x, w), dy>
        return np.vdot(convgrad.conv_forward(x, w, **kw), dy)

    dx = convgrad.conv_data_grad(w, dy, x.shape, **kw)
    dw = convgrad.conv_weight_grad(x, dy, w.shape, **kw)
    h = 1e-6
    for _ in range(5):
        i = tuple(int(rng.integers(s)) for s in x.shape)
        e = np.zeros_like(x)
        e[i] = h
        fd = (loss(x + e, w) - loss(x - e, w)) / (2 * h)
        assert fd == pytest.approx(dx[i], rel=1e-6, abs=1e-7)
        j = tuple(int(rng.integers(s)) for s in w.shape)
        e = np.zeros_like(w)
        e[j] = h
        fd = (loss(x, w + e) - loss(x, w - e)) / (2 * h)
        assert fd == pytest.approx(dw[j], rel=1e-6, abs=1e-7)
