"""Writing a benchmark record: JSON, a markdown table, a PNG bar chart.

Every number in the table is read from the record (``results[*].parties[*].ms``
and the derived fields ``summarize_entry`` adds); nothing is re-measured here.
"""

from __future__ import annotations

import json
import os

# Column order of the peers in the table (names as the parties record them).
PEER_COLUMNS = ("torch", "torch channels_last", "tensorflow", "jax", "openvino", "onnxruntime")
SHORT = {"convgrad NXC/XIO": "cg NXC", "convgrad NCX/OIX": "cg NCX", "torch": "torch",
         "torch channels_last": "torch CL", "tensorflow": "TF", "jax": "JAX",
         "openvino": "OV", "onnxruntime": "ORT"}


def fmt_ms(res: dict | None) -> str:
    """A party's cell: median ms, or why there is none."""
    if res is None:
        return ""
    status = res.get("status")
    if status == "ok" and "ms" in res:
        return f"{res['ms']:.2f}"
    return {"unsupported": "n/s", "unavailable": "n/i", "failed": "FAIL",
            "error": "ERR"}.get(status, "")


def _f(value, spec: str, none: str = "") -> str:
    return none if value is None else format(value, spec)


def _pct(fraction) -> str:
    return _f(None if fraction is None else 100 * fraction, ".0f")


def _dense_row(e: dict, *cells: str) -> str:
    """A row of the dense-row tables: layer, op, GFLOP, convgrad's time after the pause
    and its % peak (as in the main table), then ``cells``."""
    return "| " + " | ".join([e["layer"], e["op"], f"{e['flops'] / 1e9:.2f}",
                              _f(e.get("convgrad_ms"), ".2f"), _pct(e.get("peak_fraction")),
                              *cells]) + " |"


def _dense_table(title: str, about: str, columns: list[str], rows) -> list[str]:
    """A section of dense-row tables: its title, what it shows, the header (layer, op,
    GFLOP, then ``columns``, numbers right-aligned) and a :func:`_dense_row` for each
    ``(entry, *cells)`` of ``rows``."""
    return (["", f"## {title}", "", about, "",
             "| " + " | ".join(["layer", "op", "GFLOP", *columns]) + " |",
             "|---|---|" + "--:|" * (1 + len(columns))]
            + [_dense_row(e, *cells) for e, *cells in rows])


def _columns(record: dict) -> list[str]:
    names = record["parties"]
    cg = [n for n in names if n.startswith("convgrad") and n.count(" ") == 1]
    peers = [n for n in PEER_COLUMNS if n in names]
    others = [n for n in names if n not in cg and n not in peers
              and n not in ("copy", "fma", "roof")
              and not (n.startswith("convgrad") and n.count(" ") > 1)]
    return cg + peers + others


def markdown(record: dict) -> str:
    """The report as markdown: machine, ceilings, the main table, depthwise,
    16-bit and memory tables, and the notes on refusals and failures."""
    m = record["machine"]
    ceil = record.get("ceilings", {})
    summ = record.get("summary", {})
    cols = _columns(record)
    lines = [
        "# convgrad benchmark", "",
        f"- Date: {record['date']}; CPU: {m['cpu']} ({m['usable_cpus']} usable of "
        f"{m['logical_cpus']} logical CPUs); {record['threads']} threads for every party.",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
        f"- Protocol: medians of {record['repeat']} repetitions after a checked first call and "
        f"{record['warmup']} more warm-up call(s) per party, parties alternating (round-robin) "
        "within each repetition ("
        + ("convgrad's parties and the peers in turn, so that no party follows its own "
           "library's" if record.get("order", "grouped") == "interleaved"
           else "each library's parties together") + "), "
        "inputs prepared outside the timed region, every result checked "
        "against convgrad's float64 "
        "reference before it is timed; "
        f"{record.get('pause_s', 0)} s untimed pause before each timed call.",
    ]
    la, lb = record.get("load_average_start"), record.get("load_average_end")
    if la and lb:
        lines.append(f"- Load average (1/5/15 min) at start {la[0]:.2f}/{la[1]:.2f}/{la[2]:.2f}, "
                     f"at end {lb[0]:.2f}/{lb[1]:.2f}/{lb[2]:.2f} (other work on the machine "
                     "skews timings).")
    prec = record.get("precision", "default")
    lines.append(f"- convgrad's precision: `{prec}` "
                 + ("(direct kernels only, no Winograd)." if prec == "highest" else
                    "(Winograd where its error model stays within 1e-5, D24; "
                    "`--precision highest` keeps the direct kernels)."))
    eng = m.get("native_engine")
    if eng:
        lines.append(f"- convgrad's native engine: the `{eng.get('default')}` build ran "
                     f"(loaded: {', '.join(eng.get('loaded', [])) or 'none'}; CPU features: "
                     f"{', '.join(eng.get('cpu_features', []))}).")
    if ceil:
        g, c = ceil["gemm"], ceil["copy"]
        fma = ceil.get("fma")
        if fma:
            lines.append(f"- FMA peak: {fma['gflops']:.1f} GFLOP/s ({fma['threads']} threads of "
                         f"independent {fma['isa']} FMAs, median of {len(fma['runs'])}); "
                         "\"% peak\" is quoted against it.")
        lines.append(f"- GEMM ceiling: NumPy float32 {g['n']}^3 GEMM, {g['gflops']:.1f} GFLOP/s "
                     f"({g['ms']:.1f} ms). Memory bandwidth: NumPy copy of "
                     f"{c['bytes'] / 2**20:.0f} MiB, {c['gbps']:.2f} GB/s (read + written).")
        wake = ceil.get("wake")
        if wake:
            lines.append(f"- After the {wake['pause_s']} s pause: a burst of FMAs on "
                         f"{wake['threads']} threads takes {wake['after_pause_ms']:.2f} ms "
                         f"against {wake['hot_ms']:.2f} ms back to back (medians); every timed "
                         "call starts in that state, so short calls are slowed for every party.")
        idle = ceil.get("idle_memory")
        if idle:
            after = ", ".join(f"{ms:.1f} ms after {float(s)} s" for s, ms in
                              sorted(idle["after_idle_ms"].items(), key=lambda kv: float(kv[0])))
            lines.append(f"- Memory left idle: reading {idle['bytes'] / 2**20:.0f} MiB takes "
                         f"{idle['hot_ms']:.1f} ms back to back, {after} untouched (medians); "
                         "a party's arrays sit idle while the others are timed, so every call "
                         "pays for the bytes it touches more than the bandwidth says.")
    if "geomean_ratio" in summ:
        lines.append(f"- **Geometric mean of (fastest peer time / convgrad time): "
                     f"{summ['geomean_ratio']:.3f}** over {summ['compared']} problems "
                     f"(min {summ['min_ratio']:.3f}, max {summ['max_ratio']:.3f}; convgrad "
                     f"at least as fast on {summ['at_least_1']}).")
        if "geomean_ratio_best_rep" in summ:
            lines.append(f"- The same from each party's fastest repetition instead of its "
                         f"median: {summ['geomean_ratio_best_rep']:.3f} (after the pause a "
                         "call is at times about as fast as back to back, at times much "
                         "slower, for every party; the medians of a row can land on either).")
        per = [f"{k.upper()} callers {summ[f'geomean_ratio_{k}']:.3f} (min "
               f"{summ[f'min_ratio_{k}']:.3f})" for k in ("nxc", "ncx")
               if f"geomean_ratio_{k}" in summ]
        if per:
            lines.append("- Per caller layout, geometric mean of fastest peer / convgrad: "
                         + "; ".join(per) + ".")
    lines += ["", "## Time per call (ms, median) and throughput", "",
              "cg = convgrad; ratio = fastest peer time / best convgrad time (> 1: convgrad "
              "faster), NXC / NCX = the same for convgrad's channels-last and channels-first "
              "callers; GFLOP/s and % peak (of the FMA peak) are convgrad's best and the "
              "fastest peer's; n/s = the party refuses the problem, n/i = not installed, "
              "FAIL = wrong result (not timed).", ""]
    head = (["layer", "op", "GFLOP"] + [SHORT.get(c, c) for c in cols]
            + ["cg best", "fastest peer", "ratio", "NXC", "NCX", "GFLOP/s", "% peak",
               "peer GFLOP/s", "peer % peak"])
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] * 2 + ["--:"] * (len(head) - 2)) + "|")
    for e in record["results"]:
        row = [e["layer"], e["op"], f"{e['flops'] / 1e9:.2f}"]
        row += [fmt_ms(e["parties"].get(c)) for c in cols]
        row += [SHORT.get(e.get("convgrad_best"), e.get("convgrad_best") or ""),
                SHORT.get(e.get("fastest_peer"), e.get("fastest_peer") or ""),
                _f(e.get("ratio"), ".2f"), _f(e.get("ratio_nxc"), ".2f"),
                _f(e.get("ratio_ncx"), ".2f"), _f(e.get("convgrad_gflops"), ".1f"),
                _pct(e.get("peak_fraction")), _f(e.get("fastest_peer_gflops"), ".1f"),
                _pct(e.get("peer_peak_fraction"))]
        lines.append("| " + " | ".join(row) + " |")

    ceiling = [e for e in record["results"] if "fma_ms" in e]
    if ceiling:
        lines += _dense_table(
            "Dense rows: the FMA ceiling after the pause",
            "FMA-only ms: the row's FLOPs as nothing but the engine's FMA loop on the "
            "run's threads (one engine section, the least Python a call takes), timed "
            "in the row's rotation after the same pause: what the machine gives a call "
            "of that many FLOPs in the run's state.  % peak as in the main table (of "
            "the back-to-back FMA peak); % of the ceiling: FMA-only ms / convgrad ms.  "
            "FMA + bytes: the same loop while the bytes the op must move stream "
            "through memory (its inputs read, its float32 result written with "
            "streaming stores, both spread over the loop): the row's roofline in the "
            "run's state.",
            ["convgrad ms", "% peak", "FMA-only ms", "FMA-only % peak", "% of the ceiling",
             "FMA + bytes ms", "FMA + bytes % peak"],
            [(e, f"{e['fma_ms']:.2f}", _pct(e.get("fma_peak_fraction")),
              _pct(e.get("fma_fraction")), _f(e.get("roof_ms"), ".2f"),
              _pct(e.get("roof_peak_fraction"))) for e in ceiling])

    sustained = [e for e in record["results"] if "b2b_ms" in e]
    if sustained:
        lines += _dense_table(
            "Dense rows back to back",
            "Back to back: convgrad's float32 call made again at once after each "
            "timed call (no pause; the fastest of its layouts, median), the state the "
            "FMA peak is measured in; after the pause: the main table's time.  % peak "
            "of the FMA peak; FMA-only, FMA + bytes: those parties' calls made again "
            "at once.",
            ["after the pause ms", "% peak", "back to back ms", "% peak",
             "FMA-only back to back % peak", "FMA + bytes back to back % peak"],
            [(e, f"{e['b2b_ms']:.2f}", _pct(e.get("b2b_peak_fraction")),
              _pct(e.get("fma_b2b_peak_fraction")), _pct(e.get("roof_b2b_peak_fraction")))
             for e in sustained])

    dw = [e for e in record["results"] if e["depthwise"]]
    if dw:
        lines += ["", "## Depthwise layers: memory-bound", "",
                  "GB/s = bytes that must be read and written (x or w, dy, and the result, "
                  "float32) / time; % of copy bandwidth: of the 256 MiB copy in the header "
                  "(back to back); copy ms: the same bytes moved by a plain copy on the "
                  "engine's threads, timed in the row's rotation after the same pause (half "
                  "read, half written), and % of it: copy ms / convgrad ms.", "",
                  "| layer | op | MB moved | convgrad ms | convgrad GB/s | % of copy bandwidth "
                  "| copy ms | % of the copy's speed | fastest peer ms |",
                  "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
        for e in dw:
            lines.append(f"| {e['layer']} | {e['op']} | {e['io_bytes'] / 1e6:.1f} | "
                         f"{_f(e.get('convgrad_ms'), '.2f')} | {_f(e.get('convgrad_gbps'), '.2f')}"
                         f" | {_pct(e.get('bandwidth_fraction'))}"
                         f" | {_f(e.get('copy_ms'), '.2f')} | {_pct(e.get('copy_fraction'))}"
                         f" | {_f(e.get('fastest_peer_ms'), '.2f')} |")

    dts = [d for d in record["dtypes"] if d != "float32"]
    if dts:
        lines += ["", "## 16-bit dtypes", "",
                  "Best convgrad time in the dtype / best convgrad float32 time, same run.", "",
                  "| layer | op | " + " | ".join(f"{d} ms | {d} / float32" for d in dts) + " |",
                  "|---|---|" + "--:|--:|" * len(dts)]
        for e in record["results"]:
            cells = []
            for d in dts:
                ts = [r["ms"] for r in e["parties"].values() if not r["peer"]
                      and r["dtype"] == d and r.get("status") == "ok" and "ms" in r]
                cells += [_f(min(ts) if ts else None, ".2f"),
                          _f(e.get("dtype_ratio", {}).get(d), ".2f")]
            lines.append(f"| {e['layer']} | {e['op']} | " + " | ".join(cells) + " |")

    mem = [e for e in record["results"]
           if any("memory" in r for r in e["parties"].values())]
    if mem:
        lines += ["", "## Peak extra memory of one convgrad call (float32)", "",
                  "Resident-set high-water mark of the call (a fresh child process, after a "
                  "warm-up call: convgrad.bench.peak) above the resident set before it, "
                  "minus the result, divided by inputs + output bytes (tracemalloc's NumPy "
                  "allocations where /proc cannot tell); the kernel's declared estimate "
                  "(its scratch reused across calls included) in brackets.", "",
                  "| layer | op | " + " | ".join(
                      f"{SHORT.get(n, n)} extra MB | {SHORT.get(n, n)} ratio"
                      for n in cols if n.startswith("convgrad")) + " |",
                  "|---|---|" + "--:|--:|" * sum(n.startswith("convgrad") for n in cols)]
        for e in mem:
            cells = []
            for n in cols:
                if not n.startswith("convgrad"):
                    continue
                mm = e["parties"].get(n, {}).get("memory")
                est = mm and mm.get("estimate_bytes")
                cells += [_f(mm and mm["extra_bytes"] / 1e6, ".1f")
                          + (f" ({est / 1e6:.1f})" if est is not None else ""),
                          _f(mm and mm["extra_ratio"], ".2f")]
            lines.append(f"| {e['layer']} | {e['op']} | " + " | ".join(cells) + " |")

    sc = record.get("scaling")
    if sc:
        lines += ["", f"## Scaling: {sc['layer']} {sc['op']} (GFLOP/s, median of "
                  f"{sc['repeat']})", "", "See `scaling.png`.", ""]
        keys = sorted({(p["party"], p["threads"]) for p in sc["points"]})
        batches = sorted({p["batch"] for p in sc["points"]})
        lines.append("| party | threads | " + " | ".join(f"N={b}" for b in batches) + " |")
        lines.append("|---|--:|" + "--:|" * len(batches))
        for party, t in keys:
            by = {p["batch"]: p["gflops"] for p in sc["points"]
                  if p["party"] == party and p["threads"] == t}
            lines.append(f"| {party} | {t} | " + " | ".join(_f(by.get(b), ".1f")
                                                             for b in batches) + " |")

    notes, no_op = [], set()
    for e in record["results"]:
        for n, r in e["parties"].items():
            if r.get("status") == "unsupported" and r.get("family") in ("copy", "fma", "roof"):
                continue  # the pseudo-parties are timed on some rows only: no refusal
            if r.get("status") == "unsupported" and r.get("error", "").endswith(" op"):
                no_op.add(r["error"])  # the party has no such op at all: said once below
            elif r.get("status") in ("unsupported", "failed", "error") and r.get("error"):
                notes.append(f"- {e['layer']} {e['op']}, {n} ({r['status']}): {r['error']}")
    if notes or no_op:
        lines += ["", "## Refusals and failures", ""] + notes
        if no_op:
            lines.append("- Not offered at all: " + "; ".join(sorted(no_op)) + ".")
    return "\n".join(lines) + "\n"


def bar_chart(record: dict, path: str) -> bool:
    """PNG: per (layer, op), GFLOP/s of the best convgrad and the fastest peer, and
    the ratio fastest peer / convgrad.  Returns False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    rows = [e for e in record["results"] if e.get("convgrad_gflops") or
            e.get("fastest_peer_gflops")]
    labels = [f"{e['layer']} {e['op']}" for e in rows]
    y = range(len(rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 0.38 * len(rows) + 2), sharey=True)
    h = 0.4
    ax1.barh([i - h / 2 for i in y], [e.get("convgrad_gflops") or 0 for e in rows], h,
             label="convgrad (best layout)", color="tab:blue")
    ax1.barh([i + h / 2 for i in y], [e.get("fastest_peer_gflops") or 0 for e in rows], h,
             label="fastest peer", color="tab:orange")
    gemm = record.get("ceilings", {}).get("gemm", {}).get("gflops")
    if gemm:
        ax1.axvline(gemm, color="gray", ls="--", lw=1, label=f"NumPy GEMM {gemm:.0f}")
    peak = (record.get("ceilings", {}).get("fma") or {}).get("gflops")
    if peak:
        ax1.axvline(peak, color="black", ls=":", lw=1, label=f"FMA peak {peak:.0f}")
    ax1.set_xlabel("GFLOP/s (higher is better)")
    ax1.set_yticks(list(y), labels, fontsize=8)
    ax1.invert_yaxis()
    ax1.legend(fontsize=8, loc="lower right")
    ratios = [e.get("ratio") for e in rows]
    shown = [(i, r) for i, r in zip(y, ratios) if r]
    # bars grow from 1 (equal speed) to the ratio, on a log scale
    ax2.barh([i for i, _ in shown], [r - 1 for _, r in shown], left=1,
             color=["tab:green" if r >= 1 else "tab:red" for _, r in shown])
    for i, r in shown:
        ax2.annotate(f"{r:.2f}", (r, i), xytext=(3 if r >= 1 else -3, 0),
                     textcoords="offset points", va="center", ha="left" if r >= 1 else "right",
                     fontsize=7)
    ax2.axvline(1.0, color="black", lw=1)
    ax2.set_xscale("log")
    lo = min([r for _, r in shown] + [1.0])
    hi = max([r for _, r in shown] + [1.0])
    ax2.set_xlim(lo / 1.6, hi * 1.6)
    ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50)
             if lo / 1.6 <= t <= hi * 1.6]
    ax2.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    ax2.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter([f"{t:g}" for t in ticks]))
    ax2.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax2.set_xlabel("fastest peer time / convgrad time (> 1: convgrad faster)")
    g = record.get("summary", {}).get("geomean_ratio")
    fig.suptitle(f"convgrad vs peers, float32, {record['threads']} threads, "
                 f"{record['machine']['cpu']}" + (f"; geomean ratio {g:.3f}" if g else ""),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(record: dict, out_dir) -> dict:
    """Write ``benchmark.json``, ``benchmark.md`` and ``benchmark.png`` into
    ``out_dir``; returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "benchmark.json"),
             "markdown": os.path.join(out_dir, "benchmark.md"),
             "png": os.path.join(out_dir, "benchmark.png")}
    with open(paths["json"], "w") as fh:
        json.dump(record, fh, indent=1, default=float)
        fh.write("\n")
    with open(paths["markdown"], "w") as fh:
        fh.write(markdown(record))
    if not bar_chart(record, paths["png"]):
        del paths["png"]
    if record.get("scaling"):
        from .scaling import plot_scaling
        path = os.path.join(out_dir, "scaling.png")
        peak = (record.get("ceilings", {}).get("fma") or {}).get("gflops")
        if plot_scaling(record["scaling"], path, peak):
            paths["scaling_png"] = path
    return paths
