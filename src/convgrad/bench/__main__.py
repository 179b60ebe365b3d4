"""``python -m convgrad.bench``: run the benchmark and write its report.

``add_arguments`` and ``run_args`` let another command line (``convgrad bench``)
offer the same options with its own progress display."""

from __future__ import annotations

import argparse
import sys

from .harness import load_suite, run_benchmark
from .peers import FAMILIES, OPS

DESCRIPTION = ("Time convgrad against the installed peer frameworks on the layer suite "
               "(same run, round-robin, medians) and write benchmark.json/.md/.png.")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--layers", nargs="+", metavar="NAME",
                   help="suite layers to run (default: all); --list shows them")
    p.add_argument("--ops", nargs="+", choices=OPS, help="ops to run (default: each layer's)")
    p.add_argument("--parties", nargs="+", choices=FAMILIES,
                   help="parties to time (default: all; missing peers are recorded as such)")
    p.add_argument("--dtypes", nargs="+", default=["float32"],
                   choices=["float32", "float16", "bfloat16"],
                   help="convgrad's dtypes (peers always run float32)")
    p.add_argument("--repeat", type=int, default=7, help="timed repetitions (median reported)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed calls before timing, after the checked first call")
    p.add_argument("--threads", type=int, default=2, help="threads for every party")
    p.add_argument("--out", default="benchmarks/results",
                   help="output directory (default: benchmarks/results)")
    p.add_argument("--suite", help="another suite.json (default: the one shipped)")
    p.add_argument("--pause", type=float, default=0.15,
                   help="seconds of untimed sleep before each timed call (default 0.15), so "
                        "one party's spinning threads do not slow the next")
    p.add_argument("--no-memory", action="store_true",
                   help="skip the tracemalloc peak-memory call")
    p.add_argument("--no-ceilings", action="store_true",
                   help="skip the GEMM and copy-bandwidth measurements")
    p.add_argument("--scaling", default="auto", metavar="LAYER:OP",
                   help="the layer whose GFLOP/s is also measured for batch 1-64 and "
                        "1..threads threads (default: r50_res2_3x3:dgrad when the suite has "
                        "it); 'none' skips it")
    p.add_argument("--precision", default="default", choices=["default", "highest"],
                   help="convgrad's config(precision=...): 'highest' keeps the direct "
                        "kernels (no Winograd)")
    p.add_argument("--order", default="interleaved", choices=["interleaved", "grouped"],
                   help="the parties' order in the rotation: convgrad's and the peers' in "
                        "turn (default), or each library's together (the runs before "
                        "2026-11-26)")
    p.add_argument("--list", action="store_true", help="list the suite's layers and exit")
    return p


def build_parser() -> argparse.ArgumentParser:
    return add_arguments(argparse.ArgumentParser(prog="python -m convgrad.bench",
                                                 description=DESCRIPTION))


def _print_progress(done, total, label):
    print(f"[{done}/{total}] {label}", file=sys.stderr, flush=True)


def run_args(args: argparse.Namespace, progress=_print_progress) -> int:
    """Carry out parsed options: list the suite, or run and report."""
    if args.list:
        for lay in load_suite(args.suite):
            print(f"{lay.name:18s} {'/'.join(lay.ops):12s} N={lay.n} C={lay.c} O={lay.o} "
                  f"S={list(lay.s)} K={list(lay.k)} s={list(lay.strides)} "
                  f"d={list(lay.dilations)} g={lay.groups}  {lay.flops / 1e9:.2f} GFLOP")
        return 0
    record = run_benchmark(layers=args.layers, ops=args.ops, parties=args.parties,
                           dtypes=tuple(args.dtypes), repeat=args.repeat, warmup=args.warmup,
                           threads=args.threads, out_dir=args.out, progress=progress,
                           suite=args.suite, memory=not args.no_memory,
                           ceilings=not args.no_ceilings, pause=args.pause,
                           scaling=_scaling(args), precision=args.precision,
                           order=args.order)
    s = record["summary"]
    if "geomean_ratio" in s:
        print(f"geometric mean of fastest peer / convgrad: {s['geomean_ratio']:.3f} "
              f"over {s['compared']} problems")
    print(f"written to {args.out}/benchmark.{{json,md,png}}")
    return 0


def _scaling(args) -> str | None:
    if args.scaling == "none":
        return None
    if args.scaling == "auto":
        names = {lay.name for lay in load_suite(args.suite)}
        if args.layers:
            names &= set(args.layers)
        return "r50_res2_3x3:dgrad" if "r50_res2_3x3" in names else None
    return args.scaling


def main(argv=None) -> int:
    return run_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
