"""Supported dtypes, accumulation dtypes and the casting policy.

- float64 computes in float64; float32, float16 and bfloat16 compute (and
  accumulate) in float32 and are rounded once to the input dtype at the end.
- Integer dtypes (OpenVINO dialect only) compute exactly in int64; results
  outside the input dtype's range saturate to it (as the OpenVINO CPU runtime
  does), then are cast back.
- All tensors of one call must share one dtype: mixed dtypes are a TypeError.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import ConvGradTypeError

bfloat16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), bfloat16)
INT_DTYPES = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64,
                                         np.uint8, np.uint16, np.uint32, np.uint64))


def compute_dtype(dt: np.dtype) -> np.dtype:
    if dt == np.float64:
        return np.dtype(np.float64)
    if dt.kind in "iu":
        return np.dtype(np.int64)
    return np.dtype(np.float32)


def as_array(op: str, name: str, value) -> np.ndarray:
    """Accept a NumPy array (or anything np.asarray turns into a numeric one)
    without copying it; never modify it."""
    if isinstance(value, np.ndarray):
        return value
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise ConvGradTypeError(f"{op}: input {name!r} is not array-like: {exc}") from None
    return arr


def common_dtype(op: str, arrays: dict[str, np.ndarray], *, allow_int: bool = False) -> np.dtype:
    """The one dtype shared by all tensors of the call (TypeError otherwise)."""
    allowed = FLOAT_DTYPES + (INT_DTYPES if allow_int else ())
    dtypes = {name: a.dtype for name, a in arrays.items()}
    for name, dt in dtypes.items():
        if dt not in allowed:
            kinds = "float32, float64, float16, bfloat16" + (
                " or an integer type" if allow_int else "")
            raise ConvGradTypeError(f"{op}: input {name!r} has dtype {dt}; "
                                    f"supported dtypes are {kinds}")
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{n}={d}" for n, d in dtypes.items())
        raise ConvGradTypeError(f"{op}: all tensors must have the same dtype, got {listing}")
    return next(iter(dtypes.values()))
