"""Time the direct (depthwise / small-group) kernel against PyTorch, side by side.

Run under the shared benchmark lock, e.g.::

    flock /work/bench.lock .venv/bin/python benchmarks/direct_kernel.py
    flock /work/bench.lock .venv/bin/python benchmarks/direct_kernel.py --crossover

For each layer and op, convgrad is called through the oneDNN front-end with
channels-last data (NXC) and XIO weights, so no layout copy happens, and
PyTorch 2.13 through ``torch.ops.aten.convolution_backward`` with contiguous
and with channels_last tensors.  Every result is checked against PyTorch
before it is timed; the calls alternate; figures are medians.  Bandwidth is
the bytes that must be read and written (inputs once, output once) over the
time, against a large NumPy copy measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np

import convgrad
from convgrad import onednn
from convgrad.bench.harness import copy_bandwidth

SUITE = Path("/work/shared/suite.json")
LAYERS = ("mbv2_dw_3x3", "mbv2_dw_3x3s2", "resnext_g32_3x3", "seed_gcbd_2d")


def problem(layer, rng):
    n, c, o, g = layer["N"], layer["C"], layer["O"], layer["groups"]
    k, s, p, d = layer["K"], layer["strides"], layer["pads"], layer["dilations"]
    sizes = layer["S"]
    out = [(L + 2 * pp - (kk - 1) * dd - 1) // ss + 1
           for L, kk, ss, pp, dd in zip(sizes, k, s, p, d)]
    x = rng.standard_normal((n, *sizes, c), dtype=np.float32)         # NXC
    dy = rng.standard_normal((n, *out, o), dtype=np.float32)
    w = rng.standard_normal((*k, c // g, o), dtype=np.float32)        # XIO
    attrs = dict(strides=s, pads_begin=p, pads_end=[
        (oo - 1) * ss + (kk - 1) * dd + 1 - L - pp for oo, ss, kk, dd, L, pp in
        zip(out, s, k, d, sizes, p)], dilations=d, groups=g)
    return x, dy, w, attrs


def torch_calls(x, dy, w, attrs, op):
    import torch
    r = x.ndim - 2
    to_ncx = (0, r + 1, *range(1, r + 1))
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(to_ncx)))
    dyt = torch.from_numpy(np.ascontiguousarray(dy.transpose(to_ncx)))
    wt = torch.from_numpy(np.ascontiguousarray(w.transpose(r + 1, r, *range(r))))
    mask = [op == "dgrad", op == "wgrad", False]
    fmt = {1: torch.channels_last, 2: torch.channels_last, 3: torch.channels_last_3d}[r]
    calls = {}
    for name, conv in (("torch", lambda t: t.contiguous()),
                       ("torch_cl", lambda t: t.contiguous(memory_format=fmt))):
        if r == 1 and name == "torch_cl":
            continue
        a, b, c = conv(dyt), conv(xt), conv(wt)
        pads = [int(v) for v in attrs["pads_begin"]]

        def call(a=a, b=b, c=c, pads=pads):
            res = torch.ops.aten.convolution_backward(
                a, b, c, None, attrs["strides"], pads, attrs["dilations"], False,
                [0] * r, attrs["groups"], mask)
            return res[0] if op == "dgrad" else res[1]
        calls[name] = call
    return calls


def convgrad_call(x, dy, w, attrs, op, algo):
    if op == "wgrad":
        def call():
            with convgrad.config(algo=algo):
                return onednn.convolution_backward_weights(
                    x, dy, list(w.shape), data_format="NXC", weights_format="XIO", **attrs)
    else:
        def call():
            with convgrad.config(algo=algo):
                return onednn.convolution_backward_data(
                    dy, w, list(x.shape), data_format="NXC", weights_format="XIO", **attrs)
    return call


def as_torch_layout(res, op, r):
    if op == "wgrad":                       # XIO -> OIX
        return res.transpose(r + 1, r, *range(r))
    return res.transpose(0, r + 1, *range(1, r + 1))


def time_calls(calls, warmup=3, reps=15):
    for _ in range(warmup):
        for f in calls.values():
            f()
    ts = {k: [] for k in calls}
    for _ in range(reps):
        for k, f in calls.items():
            t = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in ts.items()}


def run_layer(layer, op, rng, algos=("direct",), with_torch=True):
    x, dy, w, attrs = problem(layer, rng)
    r = x.ndim - 2
    calls = {f"convgrad[{a}]": convgrad_call(x, dy, w, attrs, op, a) for a in algos}
    tcalls = torch_calls(x, dy, w, attrs, op) if with_torch else {}
    ref = None
    if tcalls:
        ref = next(iter(tcalls.values()))().numpy()
    for name, f in calls.items():
        got = as_torch_layout(f(), op, r)
        if ref is not None:
            err = np.abs(got - ref).max() / max(1.0, np.abs(ref).max())
            assert err < 1e-4, (layer["name"], op, name, err)
    calls.update(tcalls)
    med = time_calls(calls)
    out_bytes = (w.nbytes if op == "wgrad" else x.nbytes)
    in_bytes = (x.nbytes + dy.nbytes) if op == "wgrad" else (dy.nbytes + w.nbytes)
    flops = 2 * math.prod(dy.shape) * w.shape[-2] * math.prod(w.shape[:-2])
    return med, in_bytes + out_bytes, flops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--crossover", action="store_true",
                    help="sweep C/G = O/G at fixed channels: direct vs im2col vs torch")
    ap.add_argument("--algos", default=None,
                    help="comma-separated convgrad algorithms to time (first is the one rated)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--suite", type=Path, default=SUITE, help="suite.json-style layer list")
    args = ap.parse_args()
    import numba
    import torch
    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    bw = copy_bandwidth(repeat=15)["gbps"]
    print(f"numpy copy bandwidth: {bw:.1f} GB/s   threads={args.threads}")
    records = []
    if args.crossover:
        layers = []
        for size, ch in ((56, 128),):
            for cg, og in ((1, 1), (1, 4), (2, 2), (4, 4), (8, 8), (16, 16)):
                layers.append({"name": f"x{size}_c{ch}_cg{cg}_og{og}", "N": 8, "C": ch,
                               "O": ch // cg * og, "S": [size, size],
                               "K": [3, 3], "strides": [1, 1], "pads": [1, 1],
                               "dilations": [1, 1], "groups": ch // cg,
                               "ops": ["wgrad", "dgrad"]})
        algos = ("direct", "im2col")
        from convgrad.kernels import direct
        direct.MAX_GROUP_PRODUCT = 2**40        # measure beyond the registered range
    else:
        suite = {lay["name"]: lay for lay in json.loads(args.suite.read_text())["layers"]}
        layers = [suite[n] for n in LAYERS]
        algos = ("direct",)
    if args.algos:
        algos = tuple(args.algos.split(","))
    print(f"{'layer':28s} {'op':6s} " + " ".join(f"{a:>16s}" for a in algos)
          + f" {'torch':>8s} {'torch_cl':>8s} {'ratio':>6s} {'GB/s':>6s} {'%bw':>5s} {'GF/s':>6s}")
    for layer in layers:
        for op in layer["ops"]:
            med, nbytes, flops = run_layer(layer, op, rng, algos)
            peer = min(v for k, v in med.items() if k.startswith("torch"))
            mine = med[f"convgrad[{algos[0]}]"]
            gbs = nbytes / mine / 1e9
            print(f"{layer['name']:28s} {op:6s} "
                  + " ".join(f"{med[f'convgrad[{a}]'] * 1e3:13.2f} ms" for a in algos)
                  + f" {med['torch'] * 1e3:8.2f} {med.get('torch_cl', float('nan')) * 1e3:8.2f}"
                  f" {peer / mine:6.2f} {gbs:6.1f} {100 * gbs / bw:5.0f} {flops / mine / 1e9:6.1f}",
                  flush=True)
            records.append({"layer": layer["name"], "op": op, "ms": {k: v * 1e3 for k, v in
                                                                      med.items()},
                            "bytes": nbytes, "flops": flops, "copy_GBps": bw})
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
