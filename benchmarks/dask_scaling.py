"""convgrad.dask on LocalClusters of 1, 2 and 4 worker processes, against the
local (NumPy) call: time per step, and the bytes moved between workers per step.

Run alone, under the shared benchmark lock:

    flock /work/bench.lock .venv/bin/python benchmarks/dask_scaling.py
        [--workers 1 2 4] [--repeat 5] [--problems NAME ...] [--out DIR]

Problems (float32, spec front-ends with their default layouts):

- weight gradients of a large batch (oneDNN ConvolutionBackwardWeights, NXC/XIO):
  ResNet-50's res2 3x3 layer at batch 128, chunked along the batch only, along
  batch and space, and in small chunks (per-task overhead); the 3-D U-Net layer
  of the suite chunked in space;
- the OpenVINO GroupConvolutionBackpropData 3-D spec op at 1/8 of the spec
  page's volume (data 1x20x112^3 -> 1x8x223^3), chunked in space.

Protocol: inputs are made once (seeded) and persisted on each cluster before
timing, so a step moves only what the step itself needs.  All clusters stay up
together; every repetition times each party once (local call with 1 and 2
kernel threads, each cluster), the first party rotating, after a 0.15 s pause;
figures are medians.  A step is ``client.compute`` of the weight gradient (a
small array to the client), or ``persist`` + ``wait`` of the data gradient (the
result stays on the workers, like the inputs).  Each party's result is checked
against the local call before timing.  Bytes moved are the workers' incoming
transfer logs over the step, by kind of key (convgrad.bench.cluster), next to
what the graph moves if every dependency of every task is sent once from
another worker (Dask may send a value to two workers, e.g. after stealing a
task, so a measurement can exceed it).

Each worker is one process with one thread; this machine has 2 cores, so 4
workers oversubscribe it (they show the traffic of a wider cluster, not speed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import convgrad
from convgrad.bench.cluster import TransferMeter, graph_traffic, key_name, local_cluster
from convgrad.bench.harness import _loadavg, gemm_ceiling, machine_info

PAUSE_S = 0.15


@dataclass(frozen=True)
class Problem:
    name: str
    about: str
    dialect: str                 # "onednn" or "openvino"
    function: str
    kind: str                    # "wgrad" or "dgrad"
    shapes: dict                 # input name -> shape (tensor inputs, spec layout)
    chunks: dict                 # input name -> chunks (the large inputs)
    args: tuple                  # input names and literal shape inputs, in call order
    attrs: dict
    gflop: float

    def lazy_inputs(self, seed: int = 0) -> dict:
        """Seeded inputs as Dask arrays (the large ones in their chunks), made on
        whichever machine computes them: the same values everywhere."""
        import dask.array as da
        rng = da.random.default_rng(seed)
        return {k: rng.standard_normal(s, dtype=np.float32, chunks=self.chunks.get(k, -1))
                for k, s in self.shapes.items()}

    def call(self, module, arrays):
        args = [arrays[a] if isinstance(a, str) else a for a in self.args]
        return getattr(module, self.function)(*args, **self.attrs)


def _r50(n: int, chunks, name: str, about: str) -> Problem:
    attrs = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
    shape = (n, 56, 56, 64)
    return Problem(name, about, "onednn", "convolution_backward_weights", "wgrad",
                   {"src": shape, "diff_dst": shape}, {"src": chunks, "diff_dst": chunks},
                   ("src", "diff_dst", [3, 3, 64, 64]), attrs,
                   2 * n * 64 * 64 * 9 * 56 * 56 / 1e9)


PROBLEMS = [
    _r50(128, (16, 56, 56, 64), "r50_res2_3x3 batch 128, batch chunks",
         "chunks 16x56x56x64 (12.8 MB): no halos, 8 partial gradients"),
    _r50(128, (32, 28, 28, 64), "r50_res2_3x3 batch 128, batch+space chunks",
         "chunks 32x28x28x64 (6.4 MB): halos of 1 row/column"),
    _r50(128, (8, 28, 28, 64), "r50_res2_3x3 batch 128, small chunks",
         "chunks 8x28x28x64 (1.6 MB): 64 blocks of ~20 ms, Dask's per-task cost shows"),
    Problem("unet3d_3x3x3, space chunks", "x 1x64^3x32 NXC in 32^3 chunks (4.2 MB): halos "
            "on 3 axes", "onednn", "convolution_backward_weights", "wgrad",
            {"src": (1, 64, 64, 64, 32), "diff_dst": (1, 64, 64, 64, 32)},
            {"src": (1, 32, 32, 32, 32), "diff_dst": (1, 32, 32, 32, 32)},
            ("src", "diff_dst", [3, 3, 3, 32, 32]),
            dict(strides=[1, 1, 1], pads_begin=[1, 1, 1], pads_end=[1, 1, 1],
                 dilations=[1, 1, 1]),
            2 * 32 * 32 * 27 * 64**3 / 1e9),
    Problem("gcbd_3d spec op, 112^3", "data 1x20x112^3 in 56^3 chunks (14 MB) -> 1x8x223^3 "
            "(356 MB)", "openvino", "group_convolution_backprop_data", "dgrad",
            {"data": (1, 20, 112, 112, 112), "filter": (4, 5, 2, 3, 3, 3)},
            {"data": (1, 20, 56, 56, 56)}, ("data", "filter"),
            dict(strides=[2, 2, 2], pads_begin=[1, 1, 1], pads_end=[1, 1, 1],
                 dilations=[1, 1, 1]),
            2 * 20 * 2 * 27 * 112**3 / 1e9),
]


def _median(values):
    return statistics.median(values) if values else None


class DaskParty:
    """One cluster, with the problem's inputs persisted on it."""

    def __init__(self, client, problem: Problem, lazy_inputs: dict, arrays: dict):
        import dask.array as da
        import distributed
        import convgrad.dask as cgd

        self.client, self.problem = client, problem
        persisted = {}
        for k, v in lazy_inputs.items():      # large inputs made on the workers
            persisted[k] = client.persist(v) if k in problem.chunks else arrays[k]
        distributed.wait([v for v in persisted.values() if isinstance(v, da.Array)])
        self.inputs = persisted
        self.lazy = problem.call(getattr(cgd, problem.dialect), persisted)
        labels = {v.name: f"{k} chunk" for k, v in persisted.items() if isinstance(v, da.Array)}
        self.meter = TransferMeter(client, labels)
        self.traffic = graph_traffic(self.lazy, {f"{k} chunk": v for k, v in persisted.items()
                                                 if isinstance(v, da.Array)})
        self.tasks = sum(1 for k in dict(self.lazy.__dask_graph__())
                         if key_name(k) not in labels)

    def step(self):
        import distributed
        if self.problem.kind == "wgrad":
            return self.client.compute(self.lazy, sync=True)
        fut = self.client.persist(self.lazy)
        distributed.wait(fut)
        return fut

    def release(self, result) -> None:
        if self.problem.kind != "wgrad":
            self.client.cancel(result)

    def fetch(self, result) -> np.ndarray:
        if self.problem.kind == "wgrad":
            return result
        return self.client.compute(result, sync=True)


def run_problem(problem: Problem, clients: dict, repeat: int, log) -> dict:
    lazy_inputs = problem.lazy_inputs()
    arrays = {k: v.compute(scheduler="threads") for k, v in lazy_inputs.items()}
    parties = {}
    for threads in (1, 2):
        def local(threads=threads):
            with convgrad.config(threads=threads):
                return problem.call(getattr(convgrad, problem.dialect), arrays)
        parties[f"local {threads} thread{'s' if threads > 1 else ''}"] = local
    clusters = {n: DaskParty(c, problem, lazy_inputs, arrays) for n, c in clients.items()}

    want = parties["local 2 threads"]()
    entry = {"problem": problem.name, "about": problem.about, "kind": problem.kind,
             "gflop": problem.gflop, "chunks": {k: list(v) for k, v in problem.chunks.items()},
             "input_mb": sum(a.nbytes for k, a in arrays.items() if k in problem.chunks) / 1e6,
             "result_mb": want.nbytes / 1e6, "parties": {}}
    scale = float(np.abs(want).max())
    for n, party in clusters.items():
        res = party.step()
        got = party.fetch(res)
        party.release(res)
        err = float(np.abs(got - want).max()) / scale
        assert err < 1e-4, (problem.name, n, err)
        entry["parties"][f"dask {n} workers"] = {"rel_err": err, "times": [], "moved": [],
                                                 "blocks": party.traffic["blocks"],
                                                 "tasks": party.tasks,
                                                 "graph_bound": party.traffic["by_kind"]}
    del want
    for name in parties:
        entry["parties"][name] = {"times": []}

    names = list(parties) + [f"dask {n} workers" for n in clusters]
    for rep in range(repeat + 1):                 # the first round is a warm-up
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            time.sleep(PAUSE_S)
            if name in parties:
                t0 = time.perf_counter()
                parties[name]()
                t = time.perf_counter() - t0
                moved = None
            else:
                party = clusters[int(name.split()[1])]
                party.meter.start()
                t0 = time.perf_counter()
                res = party.step()
                t = time.perf_counter() - t0
                moved = party.meter.stop()
                party.release(res)
            if rep:
                entry["parties"][name]["times"].append(t)
                if moved is not None:
                    entry["parties"][name]["moved"].append(moved)
        log(f"  round {rep}/{repeat}")
    for p in entry["parties"].values():
        p["median_s"] = _median(p["times"])
        if "moved" in p and p["moved"]:
            p["moved_median"] = _median([m["total"] for m in p["moved"]])
            kinds = sorted({k for m in p["moved"] for k in m["by_kind"]})
            p["moved_by_kind_median"] = {k: _median([m["by_kind"].get(k, 0) for m in p["moved"]])
                                         for k in kinds}
    return entry


# ----------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------


def _mb(v) -> str:
    return "-" if v is None else f"{v / 1e6:.1f}"


def report(record: dict) -> str:
    m = record["machine"]
    workers = record["workers"]
    lines = [
        "# convgrad.dask: scaling with workers, and bytes moved per step",
        "",
        f"`benchmarks/dask_scaling.py`, run {record['date']} under the shared benchmark lock "
        f"on this project's machine: {m['usable_cpus']} cores of an {m['cpu']}, "
        f"{record['total_gib']:.0f} GiB; load average {record['load_start'][0]:.1f} at the "
        f"start, {record['load_end'][0]:.1f} at the end; NumPy's 2048^3 float32 GEMM "
        f"{record['gemm']['gflops']:.0f} GFLOP/s (2 threads) in the same run.  "
        f"Dask {record['versions']['dask']}, distributed {record['versions']['distributed']}, "
        f"convgrad {m['convgrad_commit']}.",
        "",
        "Each LocalCluster worker is one process with one thread; 4 workers oversubscribe "
        "the 2 cores (they show a wider cluster's traffic, not its speed).  Inputs are "
        "persisted on each cluster before timing; every repetition times every party once, "
        "round-robin; "
        f"{record['repeat']} repetitions after a warm-up round, medians.  Local = the same "
        "spec function on NumPy arrays in this process, with `convgrad.config(threads=n)`.",
        "",
        "## Time per step (ms, median)",
        "",
        "| problem | op | GFLOP | blocks | tasks | local 1 thread | local 2 threads | "
        + " | ".join(f"{n} worker{'s' if n > 1 else ''}" for n in workers)
        + " | 2 workers / 1 worker | local 2 threads / 2 workers |",
        "|---|---|--:|--:|--:|--:|--:|" + "--:|" * len(workers) + "--:|--:|",
    ]
    for e in record["problems"]:
        p = e["parties"]
        d = {n: p[f"dask {n} workers"] for n in workers}
        cells = [f"{d[n]['median_s'] * 1e3:.0f}" for n in workers]
        speedup = (d[1]["median_s"] / d[2]["median_s"]) if 1 in d and 2 in d else None
        vs_local = (p["local 2 threads"]["median_s"] / d[2]["median_s"]) if 2 in d else None
        any_d = next(iter(d.values()))
        lines.append(
            f"| {e['problem']} | {e['kind']} | {e['gflop']:.1f} | {any_d['blocks']} | "
            f"{any_d['tasks']} | {p['local 1 thread']['median_s'] * 1e3:.0f} | "
            f"{p['local 2 threads']['median_s'] * 1e3:.0f} | " + " | ".join(cells) + " | "
            + ("-" if speedup is None else f"{speedup:.2f}x") + " | "
            + ("-" if vs_local is None else f"{vs_local:.2f}") + " |")
    lines += [
        "",
        "## Bytes moved between workers per step (MB, median)",
        "",
        "Measured: the workers' incoming-transfer logs over one step, by kind of key: `halo` "
        "= pieces cut out of a neighbour's chunk (where that chunk lives), `... chunk` = "
        "whole input chunks (a block's own chunk when Dask ran the block elsewhere, e.g. "
        "because its `x` and `dy` chunks were on different workers), `partial` = partial "
        "weight gradients and partial sums.  Graph: what the step moves if every "
        "dependency of every task is sent once from another worker (Dask may send a value "
        "to two workers, e.g. after stealing a task, so a measurement can exceed it).",
        "",
        "| problem | inputs | workers | moved | halo | input chunks | partial | "
        "graph: halo | graph: input chunks | graph: partial |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for e in record["problems"]:
        for n in workers:
            p = e["parties"][f"dask {n} workers"]
            k = p.get("moved_by_kind_median", {})
            b = p["graph_bound"]
            chunk_moved = sum(v for kk, v in k.items() if kk.endswith("chunk"))
            chunk_bound = sum(v for kk, v in b.items() if kk.endswith("chunk"))
            lines.append(
                f"| {e['problem']} | {e['input_mb']:.0f} | {n} | {_mb(p.get('moved_median'))} | "
                f"{_mb(k.get('halo', 0))} | {_mb(chunk_moved)} | {_mb(k.get('partial', 0))} | "
                f"{_mb(b.get('halo', 0))} | {_mb(chunk_bound)} | {_mb(b.get('partial', 0))} |")
    lines += ["", "## Problems", ""]
    for e in record["problems"]:
        lines.append(f"- **{e['problem']}** ({e['kind']}): {e['about']}; result "
                     f"{e['result_mb']:.1f} MB; checked against the local call "
                     f"(max relative error "
                     + ", ".join(f"{p['rel_err']:.1e}" for k, p in e["parties"].items()
                                 if "rel_err" in p) + ").")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--problems", nargs="+", default=None,
                    help="substrings of problem names (default: all)")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()

    import dask
    import distributed
    problems = [p for p in PROBLEMS
                if args.problems is None or any(s in p.name for s in args.problems)]
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    record = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": machine_info(), "load_start": _loadavg(), "repeat": args.repeat,
              "workers": args.workers,
              "versions": {"dask": dask.__version__, "distributed": distributed.__version__},
              "total_gib": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30}
    with convgrad.config(threads=2):
        record["gemm"] = gemm_ceiling()
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        clients = {n: stack.enter_context(local_cluster(n)) for n in args.workers}
        record["problems"] = []
        for problem in problems:
            log(f"{problem.name}")
            record["problems"].append(run_problem(problem, clients, args.repeat, log))
    record["load_end"] = _loadavg()
    record["seconds"] = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dask_scaling.json").write_text(json.dumps(record, indent=1, default=str))
    text = report(record)
    (out / "dask_scaling.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
