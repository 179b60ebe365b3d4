"""Scaling of one dense layer: GFLOP/s as the batch grows and with 1 or 2 threads.

convgrad (NXC caller) and, when installed, PyTorch in its channels_last layout
are timed on the same inputs, alternating, medians of ``repeat`` calls; the
record goes into ``benchmark.json`` (``"scaling"``) and ``scaling.png``.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from .peers import ConvgradParty, TorchParty, Unsupported, configure_threads

BATCHES = (1, 2, 4, 8, 16, 32, 64)


def run_scaling(layer, op: str = "dgrad", batches=BATCHES, threads=(1, 2), repeat: int = 5,
                with_torch: bool = True) -> dict:
    """GFLOP/s of ``op`` on ``layer`` (a suite Layer) for every batch size and
    thread count: ``{"layer", "op", "points": [{batch, threads, party, ms, gflops}]}``."""
    from .. import settings
    points = []
    configure_threads(max(threads), ["convgrad", "torch"] if with_torch else ["convgrad"])
    for t in threads:
        parties = [ConvgradParty("NXC")]
        if with_torch and TorchParty(channels_last=True).available() is None:
            parties.append(TorchParty(channels_last=True))
        _torch_threads(t)
        with settings.config(threads=t):
            points += _points(layer, op, batches, t, parties, repeat)
    _torch_threads(max(threads))
    return {"layer": layer.name, "op": op, "repeat": repeat, "points": points}


def _points(layer, op, batches, t, parties, repeat) -> list:
    from .harness import make_inputs
    points = []
    for n in batches:
        lay = dataclasses.replace(layer, n=n)
        inputs = make_inputs(lay, seed=n)
        prepared = []
        for p in parties:
            try:
                prepared.append((p, p.prepare(lay, op, inputs)))
            except Unsupported:
                continue
        times = {p.name: [] for p, _ in prepared}
        for _, pr in prepared:
            pr.run()                                   # warm-up
        for rep in range(repeat):
            for p, pr in prepared[rep % len(prepared):] + prepared[:rep % len(prepared)]:
                t0 = time.perf_counter()
                pr.run()
                times[p.name].append(time.perf_counter() - t0)
        for p, _ in prepared:
            med = statistics.median(times[p.name])
            points.append({"batch": n, "threads": t, "party": p.name, "ms": med * 1e3,
                           "gflops": lay.flops / med / 1e9})
    return points


def _torch_threads(n: int) -> None:
    try:
        import torch
        torch.set_num_threads(n)
    except ImportError:
        pass


def plot_scaling(record: dict, path: str, peak: float | None = None) -> bool:
    """PNG: GFLOP/s against batch size, one line per (party, threads)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    keys = sorted({(p["party"], p["threads"]) for p in record["points"]})
    for party, t in keys:
        pts = sorted((p["batch"], p["gflops"]) for p in record["points"]
                     if p["party"] == party and p["threads"] == t)
        ax.plot([b for b, _ in pts], [g for _, g in pts], marker="o",
                ls="-" if "convgrad" in party else "--",
                label=f"{party}, {t} thread{'s' if t > 1 else ''}")
    if peak:
        ax.axhline(peak, color="black", ls=":", lw=1, label=f"FMA peak (2 threads) {peak:.0f}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"{record['layer']} {record['op']}: scaling with batch and threads", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
