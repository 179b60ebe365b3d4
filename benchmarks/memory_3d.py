"""Peak memory of the OpenVINO GroupConvolutionBackpropData-1 spec example in 3-D.

data 1x20x224x224x224 float32, kernel 4x5x2x3x3x3 (4 groups, C_IN 5, C_OUT 2),
strides 2, pads 1, no output_shape: output 1x8x447x447x447 (2.86 GB).
Reports the process's peak resident set (VmHWM; ru_maxrss agrees) against the
bytes of the input plus the output (target: <= 1.5x), and checks a sample of
output values against a direct float64 evaluation of the definition.

Run alone (it needs about 7 GB with ``--algo direct``, and both cores), under the
shared lock:

    flock /work/cpu.lock .venv/bin/python benchmarks/memory_3d.py [--algo NAME]
        [--workspace BYTES] [--size L]

``--size`` shrinks the spatial input (L = 224 is the spec example).  The JSON also
names the kernel that ran and its memory estimate (``kernels.estimate``).
The same call at 48^3, with a 4 MiB budget, is a case of tests/test_peak_memory.py.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

import convgrad
from convgrad import openvino, settings
from convgrad.bench.cluster import proc_status as status
from convgrad.bench.peak import KernelSpy


def direct(data, filt, point, strides, pads_begin):
    """One output value of GroupConvolutionBackpropData from the definition:
    out[n, g*C_OUT + co, q] = sum_{ci, t, p : q = p*s + t - pb} data[n, g*C_IN + ci, p]
    * filter[g, ci, co, t]   (dilation 1), in float64."""
    n, ch, *q = point
    groups, c_in, c_out = filt.shape[:3]
    g, co = divmod(ch, c_out)
    total = 0.0
    for t in np.ndindex(*filt.shape[3:]):
        p = []
        for qi, ti, s, b, L in zip(q, t, strides, pads_begin, data.shape[2:]):
            num = qi + b - ti
            if num % s or not 0 <= num // s < L:
                break
            p.append(num // s)
        else:
            for ci in range(c_in):
                total += (float(data[(n, g * c_in + ci, *p)])
                          * float(filt[(g, ci, co, *t)]))
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--algo", default="auto")
    ap.add_argument("--workspace", type=int, default=None)
    ap.add_argument("--points", type=int, default=300)
    args = ap.parse_args()

    L = args.size
    strides, pads = [2, 2, 2], [1, 1, 1]
    rng = np.random.default_rng(0)
    base_rss = status("VmRSS")
    data = rng.standard_normal((1, 20, L, L, L), dtype=np.float32)
    filt = rng.standard_normal((4, 5, 2, 3, 3, 3), dtype=np.float32)
    inputs = data.nbytes + filt.nbytes
    before_hwm = status("VmHWM")

    t0 = time.perf_counter()
    with convgrad.config(algo=args.algo, workspace_bytes=args.workspace), KernelSpy() as spy:
        workspace = settings.workspace_bytes()
        out = openvino.group_convolution_backprop_data(
            data, filt, strides=strides, pads_begin=pads, pads_end=pads)
    seconds = time.perf_counter() - t0
    M = 2 * (L - 1) + 3 - 2
    assert out.shape == (1, 8, M, M, M) and out.dtype == np.float32, (out.shape, out.dtype)

    hwm = status("VmHWM")
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    payload = inputs + out.nbytes

    # values: corners, faces and random points against the definition
    points = [(0, c, *z) for c in (0, 7) for z in ((0, 0, 0), (M - 1, M - 1, M - 1),
                                                   (0, M - 1, 1), (M // 2, 1, M - 2))]
    points += [(0, int(rng.integers(8)), *map(int, rng.integers(0, M, 3)))
               for _ in range(args.points)]
    worst = 0.0
    for pt in points:
        want = direct(data, filt, pt, strides, pads)
        worst = max(worst, abs(float(out[pt]) - want) / max(1.0, abs(want)))
    ok = worst <= 1e-5

    result = {
        "example": f"GroupConvolutionBackpropData data 1x20x{L}^3 f32, kernel 4x5x2x3x3x3, "
                   f"s2 p1 -> 1x8x{M}^3",
        "algo": args.algo, "kernel": spy.seen[0][0],
        "estimate_bytes": spy.seen[0][1], "workspace_bytes": workspace,
        "input_bytes": inputs, "output_bytes": out.nbytes,
        "input_plus_output_bytes": payload,
        "baseline_rss_bytes": base_rss, "hwm_before_call_bytes": before_hwm,
        "peak_rss_bytes": hwm, "ru_maxrss_bytes": maxrss,
        "peak_over_input_plus_output": round(hwm / payload, 3),
        "peak_minus_baseline_over_input_plus_output": round((hwm - base_rss) / payload, 3),
        "seconds": round(seconds, 1),
        "values_checked": len(points), "max_rel_error": worst, "values_ok": ok,
    }
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
