"""The 3-D GroupConvolutionBackpropData spec example through convgrad.dask: each
worker's peak memory against its chunk size.

data 1x20x224^3 float32 (0.90 GB), filter 4x5x2x3x3x3, strides 2, pads 1:
result 1x8x447^3 (2.86 GB).  For each chunk size, on a fresh LocalCluster of 2
worker processes (1 thread each): the input is made on the workers, the result
is written block by block to ``.npy`` files by the workers that compute it
(``da.store``), and the script reports each worker's peak resident set above
its warm baseline, against one block's window and result; the bytes moved
between workers; the time.  Every block written is compared with the local
(NumPy) call, whose time and peak are reported too.

Run alone, under the shared benchmark lock (it needs about 7 GB of memory and
3 GB of disk at a time):

    flock /work/bench.lock .venv/bin/python benchmarks/dask_3d.py
        [--chunks 112 56 28] [--size 224] [--workers 2] [--out DIR] [--tmp DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import convgrad
from convgrad.bench.cluster import (BlockFiles, TransferMeter, graph_traffic, local_cluster,
                                    peaks, reset_peaks)
from convgrad.bench.harness import _loadavg, machine_info

ATTRS = dict(strides=[2, 2, 2], pads_begin=[1, 1, 1], pads_end=[1, 1, 1], dilations=[1, 1, 1])
MiB = 2**20


def coordinate_data(shape, chunks):
    """The input as a Dask array whose values are a function of their coordinates
    (sines of a quadratic in the indices, in [-1, 1]): the same tensor for any
    chunking, made block by block on the workers."""
    import dask.array as da

    def fill(block_info=None):
        info = block_info[None]
        out = np.zeros(info["chunk-shape"], np.float32)
        for axis, (lo, hi) in enumerate(info["array-location"]):
            v = np.arange(lo, hi, dtype=np.float64)
            term = (0.37 * (axis + 1) * v + 0.0013 * (axis + 2) * v * v) % (2 * np.pi)
            out += term.astype(np.float32).reshape([-1 if i == axis else 1
                                                    for i in range(len(shape))])
        return np.sin(out, out=out)

    chunks = da.core.normalize_chunks(chunks, shape, dtype=np.float32)
    return da.map_blocks(fill, dtype=np.float32, chunks=chunks,
                         meta=np.empty((0,) * len(shape), np.float32))


def filter_values() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((4, 5, 2, 3, 3, 3)).astype(np.float32)


def warm_up(client, filt) -> None:
    """Import convgrad and compile its kernels on every worker, outside the
    measured peak (a small problem of the same op, chunked so both workers run it)."""
    import convgrad.dask as cgd
    small = coordinate_data((1, 20, 32, 32, 32), (1, 20, 16, 16, 16))
    client.compute(cgd.openvino.group_convolution_backprop_data(small, filt, **ATTRS).sum(),
                   sync=True)


def run_chunked(size: int, chunk: int, workers: int, filt, tmp: Path, local: np.ndarray,
                log) -> dict:
    import dask.array as da
    import convgrad.dask as cgd

    shape = (1, 20, size, size, size)
    directory = tmp / f"chunks{chunk}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    target = BlockFiles(directory)
    with local_cluster(workers) as client:
        warm_up(client, filt)
        data = coordinate_data(shape, (1, 20, chunk, chunk, chunk))
        out = cgd.openvino.group_convolution_backprop_data(data, filt, **ATTRS)
        store = da.store(out, target, lock=False, compute=False)
        traffic = graph_traffic(out, {})
        meter = TransferMeter(client, {data.name: "data chunk"})
        base = reset_peaks(client)
        meter.start()
        t0 = time.perf_counter()
        client.compute(store, sync=True)
        seconds = time.perf_counter() - t0
        moved = meter.stop()
        worker_peaks = peaks(client)
    rises = {w: p["peak"] - base[w] for w, p in worker_peaks.items()}
    log(f"  chunks {chunk}^3: {seconds:.1f} s, peak rise per worker "
        + ", ".join(f"{r / MiB:.0f} MiB" for r in rises.values()))

    err, n_files, scale = 0.0, 0, float(np.abs(local).max())
    for starts, block in target.blocks():
        want = local[tuple(slice(s, s + n) for s, n in zip(starts, block.shape))]
        err = max(err, float(np.abs(block - want).max()) / scale)
        n_files += 1
    shutil.rmtree(directory, ignore_errors=True)
    window, result = traffic["max_block_window_bytes"], traffic["max_block_result_bytes"]
    return {"chunk": chunk, "blocks": traffic["blocks"], "files": n_files,
            "input_chunk_bytes": 20 * chunk**3 * 4, "block_window_bytes": window,
            "block_result_bytes": result, "seconds": seconds,
            "baseline_rss": base, "peaks": worker_peaks, "peak_rise": rises,
            "peak_rise_per_block": max(rises.values()) / (window + result),
            "moved": moved, "max_rel_err": err}


def run_local(size: int, filt) -> tuple[np.ndarray, dict]:
    """The local call (2 kernel threads) on the same input, with its peak rise."""
    from convgrad.bench.cluster import process_peak, reset_process_peak
    shape = (1, 20, size, size, size)
    data = coordinate_data(shape, (1, 20, 56, 56, 56)).compute(scheduler="threads")
    with convgrad.config(threads=2):                  # compile the kernels outside the peak
        small = coordinate_data((1, 20, 32, 32, 32), -1).compute(scheduler="threads")
        convgrad.openvino.group_convolution_backprop_data(small, filt, **ATTRS)
    base = reset_process_peak()
    t0 = time.perf_counter()
    with convgrad.config(threads=2):
        out = convgrad.openvino.group_convolution_backprop_data(data, filt, **ATTRS)
    seconds = time.perf_counter() - t0
    rise = process_peak()["peak"] - base
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:          # what writing the result costs alone
        target = BlockFiles(d)
        step = 112 if size >= 112 else size
        for starts in itertools.product(*(range(0, n, step) for n in out.shape[2:])):
            region = (slice(0, 1), slice(0, 8), *(slice(s, s + step) for s in starts))
            target[region] = out[region]
        write = time.perf_counter() - t0
    return out, {"seconds": seconds, "peak_rise": rise, "input_bytes": data.nbytes,
                 "output_bytes": out.nbytes, "write_seconds": write}


def report(record: dict) -> str:
    m, loc = record["machine"], record["local"]
    whole = loc["input_bytes"] + loc["output_bytes"]
    lines = [
        "# The 3-D GroupConvolutionBackpropData spec example on Dask: memory per worker",
        "",
        f"`benchmarks/dask_3d.py`, run {record['date']} under the shared benchmark lock on this "
        f"project's machine ({m['usable_cpus']} cores of an {m['cpu']}, "
        f"{record['total_gib']:.0f} GiB; load average {record['load_start'][0]:.1f} at the "
        f"start, {record['load_end'][0]:.1f} at the end), Dask {record['versions']['dask']}, "
        f"convgrad {m['convgrad_commit']}.",
        "",
        f"Problem: data 1x20x{record['size']}^3 float32 ({loc['input_bytes'] / 1e9:.2f} GB), "
        "filter 4x5x2x3x3x3, strides 2, pads 1 -> result "
        f"1x8x{2 * record['size'] - 1}^3 ({loc['output_bytes'] / 1e9:.2f} GB); input + result "
        f"= {whole / MiB:.0f} MiB.  A LocalCluster of {record['workers']} worker processes, "
        "1 thread each, new for each chunk size; the input is made on the workers "
        "(`map_blocks`), the result written block by block to `.npy` files by the workers "
        "(`da.store`), never gathered.  Peak rise = a worker's peak resident set (VmHWM) "
        "during the step minus its resident set before it, after a warm-up that imported "
        "and compiled the kernels (the warm baseline is "
        f"{min(min(r['baseline_rss'].values()) for r in record['runs']) / MiB:.0f}-"
        f"{max(max(r['baseline_rss'].values()) for r in record['runs']) / MiB:.0f} MiB).  "
        "Block = the largest block task's window (its chunk and halo) plus its result.",
        "",
        "| chunks | blocks | input chunk | block: window + result | peak rise per worker | "
        "peak rise / block | peak rise / (input + result) | moved between workers | seconds | "
        "max rel. error vs local |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in record["runs"]:
        block = r["block_window_bytes"] + r["block_result_bytes"]
        rise = max(r["peak_rise"].values())
        lines.append(
            f"| {r['chunk']}^3 | {r['blocks']} | {r['input_chunk_bytes'] / MiB:.1f} MiB | "
            f"{r['block_window_bytes'] / MiB:.1f} + {r['block_result_bytes'] / MiB:.1f} MiB | "
            + ", ".join(f"{v / MiB:.0f}" for v in r["peak_rise"].values()) + " MiB | "
            f"{rise / block:.2f} | {rise / whole:.3f} | {r['moved']['total'] / 1e6:.1f} MB | "
            f"{r['seconds']:.1f} | {r['max_rel_err']:.1e} |")
    lines += [
        f"| local call (NumPy, 2 threads) | 1 | - | - | {loc['peak_rise'] / MiB:.0f} MiB | - | "
        f"{loc['peak_rise'] / whole:.3f} | - | {loc['seconds']:.1f} | - |",
        "",
        "The Dask runs' seconds include writing their 2.86 GB: for scale, writing the local "
        f"result as 112^3 `.npy` blocks from one process took {loc['write_seconds']:.1f} s "
        "(page cache, no fsync).  Moved between workers, by kind (`data chunk`: whole input "
        "chunks, where Dask ran a block on another worker than its chunk's; `halo`: pieces "
        "cut where their chunk lives; `other`: the filter): "
        + "; ".join(f"{r['chunk']}^3: " + ", ".join(
            f"{k} {v / 1e6:.1f} MB" for k, v in sorted(r["moved"]["by_kind"].items()))
            for r in record["runs"]) + ".",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, nargs="+", default=[112, 56, 28])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tmp", default=None, help="where the result blocks are written")
    args = ap.parse_args()

    import dask
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    filt = filter_values()
    record = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": machine_info(), "load_start": _loadavg(), "size": args.size,
              "workers": args.workers, "versions": {"dask": dask.__version__},
              "total_gib": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30}
    log("local call")
    local, record["local"] = run_local(args.size, filt)
    log(f"  {record['local']['seconds']:.1f} s, peak rise "
        f"{record['local']['peak_rise'] / MiB:.0f} MiB")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        record["runs"] = [run_chunked(args.size, c, args.workers, filt, Path(tmp), local, log)
                          for c in args.chunks]
    record["load_end"] = _loadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.size == 224 else f"_{args.size}"
    (out / f"dask_3d{suffix}.json").write_text(json.dumps(record, indent=1, default=str))
    text = report(record)
    (out / f"dask_3d{suffix}.md").write_text(text)
    print(text)
    bad = [r["chunk"] for r in record["runs"] if r["max_rel_err"] > 1e-4]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
