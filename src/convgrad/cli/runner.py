"""``convgrad run-problem`` and ``convgrad check``: one problem, one direction.

The problem is in convgrad's canonical terms (``problem.Problem``): data
``(N, C, *S)``, OIX weights ``(O, C/G, *K)``.  ``fwd`` computes ``y`` from
``x, w``; ``dgrad`` computes ``dx`` from ``w, dy``; ``wgrad`` computes ``dw``
from ``x, dy`` -- through convgrad's public canonical API.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

import convgrad

from .. import kernels
from ..dtypes import compute_dtype
from ..errors import ConvGradError
from ..frontends._plan import OPS, TensorSpec
from .problem import Problem

DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16"}
# Max |got - want| allowed, relative to max(1, max |want|): rounding of the
# output dtype plus accumulation-order differences over long sums.
TOLERANCE = {"f64": 1e-10, "f32": 1e-4, "f16": 1e-2, "bf16": 5e-2}
# The check materialises each array a few times in float64: refuse bigger problems.
MAX_ELEMENTS = 2**26


def np_dtype(name: str) -> np.dtype:
    if name not in DTYPES:
        raise ConvGradError(f"--dtype = {name!r}: must be one of {', '.join(DTYPES)}")
    if name == "bf16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(DTYPES[name])


def _check_size(p: Problem) -> None:
    for what, shape in (("src", p.x_shape), ("weights", p.w_shape), ("dst", p.y_shape)):
        if math.prod(shape) > MAX_ELEMENTS:
            raise ConvGradError(f"problem {p.canonical()}: {what} {list(shape)} has "
                                f"{math.prod(shape)} elements; at most {MAX_ELEMENTS} here")


def inputs(p: Problem, kind: str, dtype: np.dtype, seed: int) -> tuple[np.ndarray, ...]:
    """Seeded inputs for ``kind``.  As in benchdnn, values are multiples of 1/8
    in [-1, 1]: every dtype holds them exactly, and float32 sums of their
    products are exact too, so a float32 difference is a bug, not rounding."""
    _check_size(p)
    rng = np.random.default_rng(seed)

    def make(shape):
        return (rng.integers(-8, 9, size=shape) / 8).astype(dtype)

    if kind == "fwd":
        return make(p.x_shape), make(p.w_shape)
    if kind == "dgrad":
        return make(p.w_shape), make(p.y_shape)
    return make(p.x_shape), make(p.y_shape)


def compute(p: Problem, kind: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One call of convgrad's canonical API."""
    if kind == "fwd":
        return convgrad.conv_forward(a, b, **p.attrs())
    if kind == "dgrad":
        return convgrad.conv_data_grad(a, b, p.x_shape, **p.attrs())
    return convgrad.conv_weight_grad(a, b, p.w_shape, **p.attrs())


def geometry(p: Problem, kind: str):
    """The canonical geometry convgrad builds for this problem (no data)."""
    name = {"fwd": "conv_forward", "dgrad": "conv_data_grad", "wgrad": "conv_weight_grad"}[kind]
    plan = OPS[f"canonical:{name}"].plan
    if kind == "fwd":
        return plan(TensorSpec(p.x_shape), TensorSpec(p.w_shape), **p.attrs()).geom
    if kind == "dgrad":
        return plan(TensorSpec(p.w_shape), TensorSpec(p.y_shape), p.x_shape, **p.attrs()).geom
    return plan(TensorSpec(p.x_shape), TensorSpec(p.y_shape), p.w_shape, **p.attrs()).geom


def timed(p: Problem, kind: str, a, b, algo: str = "auto", repeats: int = 1):
    """(result, seconds of the fastest of ``repeats`` runs)."""
    best, out = math.inf, None
    with convgrad.config(algo=algo):
        for _ in range(max(1, repeats)):
            t = time.perf_counter()
            out = compute(p, kind, a, b)
            best = min(best, time.perf_counter() - t)
    return out, best


def checksum(a: np.ndarray) -> dict:
    v = np.asarray(a, dtype=np.float64)
    return {"sum": float(v.sum()), "abs_sum": float(np.abs(v).sum()),
            "min": float(v.min()) if v.size else 0.0, "max": float(v.max()) if v.size else 0.0}


@dataclass
class Comparison:
    name: str              # kernel name or peer name
    status: str            # "ok", "FAIL", "skipped"
    max_err: float = float("nan")
    bound: float = float("nan")
    seconds: float = float("nan")
    note: str = ""
    peer: str | None = None  # the peer framework, for peer rows


@dataclass
class CheckResult:
    rows: list[Comparison] = field(default_factory=list)

    @property
    def failed(self) -> list[Comparison]:
        return [r for r in self.rows if r.status == "FAIL"]


def _compare(name, got, want, dtype_name, seconds=float("nan"), peer=None) -> Comparison:
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        return Comparison(name, "FAIL", note=f"shape {list(got.shape)} != {list(want.shape)}",
                          peer=peer)
    err = float(np.abs(got - want).max()) if want.size else 0.0
    scale = max(1.0, float(np.abs(want).max()) if want.size else 0.0)
    bound = TOLERANCE[dtype_name] * scale
    ok = err <= bound and np.isfinite(got).all()
    return Comparison(name, "ok" if ok else "FAIL", err, bound, seconds, peer=peer)


def check(p: Problem, kind: str, dtype_name: str, seed: int, algo: str | None = None,
          peers: bool = True) -> CheckResult:
    """Every registered kernel (or only ``algo``) and every installed peer
    against the float64 reference kernel on the same inputs."""
    dtype = np_dtype(dtype_name)
    a, b = inputs(p, kind, dtype, seed)
    with convgrad.config(algo="reference"):
        want = np.asarray(compute(p, kind, a.astype(np.float64), b.astype(np.float64)))
    result = CheckResult()
    geom = geometry(p, kind)
    cdt = compute_dtype(dtype)
    for kernel, reason in kernels.candidates(kind, geom, cdt):
        if algo is not None and kernel.name != algo:
            continue
        if reason is not None:
            result.rows.append(Comparison(kernel.name, "skipped", note=reason))
            continue
        got, sec = timed(p, kind, a, b, algo=kernel.name)
        result.rows.append(_compare(kernel.name, got, want, dtype_name, sec))
    if algo is not None and not result.rows:
        raise ConvGradError(f"--algo = {algo!r}: no such kernel for {kind}; registered: "
                            f"{', '.join(kernels.names(kind))}")
    if peers and algo is None:
        result.rows.append(_torch(p, kind, a, b, want, dtype_name))
    return result


def _torch(p: Problem, kind, a, b, want, dtype_name) -> Comparison:
    """PyTorch's autograd of its own convolution, in float64 on the same inputs."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return Comparison("torch", "skipped", note="not installed", peer="torch")
    conv = (F.conv1d, F.conv2d, F.conv3d)[p.spatial_rank - 1]
    pad = []
    for pb, pe in zip(reversed(p.pads_begin), reversed(p.pads_end)):
        pad += [pb, pe]                                   # F.pad: last axis first
    x = torch.zeros(p.x_shape, dtype=torch.float64, requires_grad=True)
    w = torch.zeros(p.w_shape, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        if kind == "fwd":
            x.copy_(torch.from_numpy(a.astype(np.float64)))
            w.copy_(torch.from_numpy(b.astype(np.float64)))
        elif kind == "dgrad":
            w.copy_(torch.from_numpy(a.astype(np.float64)))
        else:
            x.copy_(torch.from_numpy(a.astype(np.float64)))
    y = conv(F.pad(x, pad), w, stride=p.strides, dilation=p.dilations, groups=p.groups)
    if kind == "fwd":
        got = y.detach().numpy()
    else:
        y.backward(torch.from_numpy(b.astype(np.float64)))
        got = (x.grad if kind == "dgrad" else w.grad).numpy()
    # No time for peers: a comparison of speed belongs to the benchmark, not here.
    return _compare(f"torch {torch.__version__.split('+')[0]}", got, want, dtype_name,
                    peer="torch")
