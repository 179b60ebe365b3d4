"""The timing protocol.

For each (layer, op): canonical float32 inputs are made once (seeded); every
party converts them to its own layout (outside the timed region) and is called
once, its result checked against convgrad's float64 reference kernel
(``convgrad.config(algo="reference")`` on the canonical API): a mismatch marks
the party ``failed`` and it is not timed; a refusal marks it ``unsupported``.
The parties that passed are then warmed up and timed round-robin: each
repetition calls every party once (the starting party rotating), and the
median over repetitions is reported.

Also measured in the same run: the GFLOP/s of one large float32 NumPy GEMM
(the "GEMM ceiling"), the GB/s of a large NumPy copy (bytes read + written /
time), and the peak extra memory of one convgrad call (tracemalloc, which
sees NumPy's allocations).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib.metadata
import json
import math
import os
import platform
import statistics
import time
import tracemalloc
from importlib import resources

import numpy as np

from .peers import FAMILIES, OPS, Layer, Party, Unsupported, configure_threads, default_parties

SCHEMA = 1

# Largest max|got - ref| / max|ref| accepted, by the dtype a party computes in.
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


def load_suite(path=None) -> list[Layer]:
    """The layers of a suite.json (default: the one shipped with convgrad)."""
    if path is None:
        text = resources.files("convgrad.bench").joinpath("suite.json").read_text()
    else:
        with open(path) as fh:
            text = fh.read()
    return [Layer.from_dict(d) for d in json.loads(text)["layers"]]


def _select_layers(layers, suite_path=None) -> list[Layer]:
    suite = load_suite(suite_path)
    if layers is None:
        return suite
    by_name = {lay.name: lay for lay in suite}
    out = []
    for item in layers:
        if isinstance(item, Layer):
            out.append(item)
        elif isinstance(item, dict):
            out.append(Layer.from_dict(item))
        elif item in by_name:
            out.append(by_name[item])
        else:
            raise ValueError(f"unknown layer {item!r}; the suite has {', '.join(by_name)}")
    return out


def make_inputs(layer: Layer, seed: int = 0) -> dict[str, np.ndarray]:
    """Canonical float32 inputs: x (N, C, *S), w (O, C/G, *K), dy (N, O, *M)."""
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(shape, dtype=np.float32)
            for k, shape in (("x", layer.x_shape), ("w", layer.w_shape), ("dy", layer.y_shape))}


def reference(layer: Layer, op: str, inputs) -> np.ndarray:
    """convgrad's float64 reference kernel on the canonical API."""
    import convgrad
    attrs = dict(strides=list(layer.strides), pads_begin=list(layer.pads_begin),
                 pads_end=list(layer.pads_end), dilations=list(layer.dilations),
                 groups=layer.groups)
    with convgrad.config(algo="reference"):
        if op == "wgrad":
            return convgrad.conv_weight_grad(inputs["x"].astype(np.float64),
                                             inputs["dy"].astype(np.float64),
                                             list(layer.w_shape), **attrs)
        return convgrad.conv_data_grad(inputs["w"].astype(np.float64),
                                       inputs["dy"].astype(np.float64),
                                       list(layer.x_shape), **attrs)


def relative_error(got, want) -> float:
    got = np.asarray(got, np.float64)
    if got.shape != want.shape:
        return math.inf
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    return float(np.abs(got - want).max(initial=0.0)) / scale


def _inputs_for(party: Party, inputs):
    """Inputs as the party computes them: 16-bit parties get the float32 inputs
    rounded to their dtype (and are checked against the reference of those)."""
    if party.dtype == "float32":
        return inputs
    from ..dtypes import bfloat16
    dt = bfloat16 if party.dtype == "bfloat16" else np.dtype(party.dtype)
    return {k: v.astype(dt).astype(np.float32) for k, v in inputs.items()}


# ---------------------------------------------------------------------------------------------
# Machine ceilings


def gemm_ceiling(n: int = 2048, repeat: int = 5) -> dict:
    """Median GFLOP/s of one float32 n^3 GEMM through NumPy's BLAS."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), np.float32)
    np.matmul(a, b, out=c)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.matmul(a, b, out=c)
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    return {"n": n, "ms": t * 1e3, "gflops": 2 * n**3 / t / 1e9}


def fma_peak(threads: int) -> dict | None:
    """GFLOP/s of the native engine's loop of independent FMAs on ``threads``
    threads at once (the physical limit "% of peak" is quoted against); None
    when the engine is not available."""
    from ..kernels import native
    if native.available() is not None:
        return None
    from .. import settings
    with settings.config(threads=threads):
        return native.fma_peak(threads)


def wake_penalty(threads: int, pause: float, burst_ms: float = 5.0, repeat: int = 7
                 ) -> dict | None:
    """How long a short burst of compute takes right after the protocol's ``pause``
    against back to back: the engine's FMA loop on ``threads`` threads, sized to about
    ``burst_ms``; medians of ``repeat``.  Every timed call of the run starts after such
    a pause, so on a host whose cores slow down while idle (measured here: 1.5-3x for
    the first milliseconds) short calls are timed largely in that state, for every
    party.  None without the engine or without a pause."""
    from ..kernels import _pool, native
    if native.available() is not None or pause <= 0:
        return None
    lib = native.engine().lib
    iters = 1 << 14
    t0 = time.perf_counter()
    lib.cg_fma_loop(iters)
    iters = max(iters, int(iters * burst_ms * 1e-3 / max(time.perf_counter() - t0, 1e-7)))

    def burst() -> float:
        t = time.perf_counter()
        _pool.run_tasks([lambda: lib.cg_fma_loop(iters)] * threads, threads)
        return (time.perf_counter() - t) * 1e3
    burst()
    hot = statistics.median(burst() for _ in range(repeat))
    after = []
    for _ in range(repeat):
        time.sleep(pause)
        after.append(burst())
    return {"threads": threads, "pause_s": pause, "hot_ms": hot,
            "after_pause_ms": statistics.median(after)}


def idle_memory_read(idles=(0.15, 1.0), nbytes: int = 16 * 2**20, repeat: int = 5) -> dict:
    """How long reading ``nbytes`` of an array takes back to back and after it has sat
    untouched for each of ``idles`` seconds (medians of ``repeat``).  In a run every
    party's arrays sit idle while the other parties are timed (about the number of
    parties x (pause + call) between two of its calls); on a host that makes idle
    memory slow to touch again (measured 2026-11-26: 16 MiB read in 2.4 ms after 0.02 s
    idle, 8.4 ms after 0.15 s, 36 ms after 1 s), each call pays for the bytes it touches
    far more than its bandwidth figure says, for every party."""
    a = np.ones(nbytes // 4, np.float32)
    a.sum()

    def read() -> float:
        t = time.perf_counter()
        a.sum()
        return (time.perf_counter() - t) * 1e3
    hot = statistics.median(read() for _ in range(repeat))
    after = {}
    for idle in idles:
        ts = []
        for _ in range(repeat):
            time.sleep(idle)
            ts.append(read())
        after[idle] = statistics.median(ts)
    return {"bytes": nbytes, "hot_ms": hot, "after_idle_ms": after}


def copy_bandwidth(nbytes: int = 256 * 2**20, repeat: int = 5) -> dict:
    """Median GB/s of a NumPy copy of a large float32 array (read + written bytes)."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.zeros_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    return {"bytes": nbytes, "ms": t * 1e3, "gbps": 2 * nbytes / t / 1e9}


# ---------------------------------------------------------------------------------------------
# Machine description


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas_info() -> list:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("user_api", "internal_api", "version", "architecture", "num_threads", "prefix")
    return [{k: d.get(k) for k in keep} for d in threadpool_info()]


def _git_commit() -> str | None:
    """The commit of the convgrad checkout being measured (None outside a git checkout)."""
    import subprocess
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/convgrad
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine_info() -> dict:
    versions = {}
    for dist in ("convgrad", "numpy", "scipy", "ml_dtypes", "torch", "tensorflow-cpu",
                 "tensorflow", "jax", "jaxlib", "openvino", "onnxruntime", "onnx",
                 "threadpoolctl", "matplotlib"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        affinity = os.cpu_count()
    from ..kernels import native
    return {"cpu": _cpu_model(), "logical_cpus": os.cpu_count(), "usable_cpus": affinity,
            "convgrad_commit": _git_commit(), "native_engine": native.info(),
            "platform": platform.platform(), "python": platform.python_version(),
            "versions": versions, "blas": _blas_info()}


def _loadavg():
    """1, 5 and 15-minute load averages: other work on the machine skews timings."""
    try:
        return list(os.getloadavg())
    except OSError:  # pragma: no cover
        return None


@contextlib.contextmanager
def _blas_threads(threads: int):
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield "threadpoolctl not installed: BLAS threads left at their default"
        return
    with threadpool_limits(limits=threads):
        yield f"threadpoolctl limits={threads}"


# ---------------------------------------------------------------------------------------------
# One problem


def peak_memory(prepared, party=None, layer=None, op=None) -> dict:
    """What one call holds beyond its inputs and result, relative to inputs + output:
    the resident-set high-water mark of the same call in a child process
    (``convgrad.bench.peak``: everything the call touches, compiled code's buffers
    included) where the party can describe it and /proc allows; otherwise the peak
    of NumPy's allocations (tracemalloc)."""
    from .peak import can_measure, measure
    if party is not None and hasattr(party, "memory_case") and can_measure():
        try:
            r = measure(party.memory_case(layer, op))["auto"]
        except (RuntimeError, OSError, ValueError):
            r = None
        if r is not None and "extra" in r:
            extra = max(int(r["extra"]), 0)
            io = r["input_bytes"] + r["output_bytes"]
            return {"method": "rss", "peak_bytes": int(r["peak"] - r["baseline"]),
                    "output_bytes": int(r["output_bytes"]),
                    "input_bytes": int(r["input_bytes"]), "extra_bytes": extra,
                    "extra_ratio": extra / io, "kernel": r.get("kernel"),
                    # what the kernel declares, its reused scratch included (the
                    # measured call finds that scratch resident from the warm-up)
                    "estimate_bytes": int(sum(r.get("estimate", {}).values()))}
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = prepared.run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    in_bytes = sum(a.nbytes for a in prepared.info.get("inputs", ()))
    out_bytes = np.asarray(out).nbytes
    extra = max(peak - out_bytes, 0)
    return {"method": "tracemalloc", "peak_bytes": int(peak), "output_bytes": int(out_bytes),
            "input_bytes": int(in_bytes),
            "extra_bytes": int(extra), "extra_ratio": extra / (in_bytes + out_bytes)}


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= 400 else text[:397] + "..."


SLOW_CALL_S = 3.0     # a party whose checked call takes longer than this ...
SLOW_REPEAT = 3       # ... is timed this many times, without warm-up (JAX's grouped layers)


def _back_to_back(layer: Layer, party: Party) -> bool:
    """Whether a party's call is also timed back to back on this row: convgrad's float32
    parties, the FMA party and the roofline party, on dense rows (groups = 1)."""
    return (layer.groups == 1 and party.family in ("convgrad", "fma", "roof")
            and party.dtype == "float32")


def run_problem(layer: Layer, op: str, parties: list[Party], *, repeat: int, warmup: int,
                seed: int = 0, memory: bool = True, ref_cache: dict | None = None,
                pause: float = 0.0, back_to_back: bool = False) -> dict:
    """Check, warm up and time every party on one (layer, op); returns its result entry.

    ``pause`` seconds of sleep before each timed call let the previous party's
    worker threads stop spinning (OpenBLAS spins up to ~2^28 cycles after a call)
    so they do not steal the cores from the next party.  ``back_to_back``: on dense
    rows, convgrad's float32 parties and the FMA party call again at once after each
    timed call, that call timed apart (``b2b_ms``): what they sustain, the state the
    FMA peak is measured in."""
    inputs = make_inputs(layer, seed)
    refs = {} if ref_cache is None else ref_cache
    entry = {"layer": layer.name, "op": op, "rank": layer.rank, "groups": layer.groups,
             "depthwise": layer.depthwise, "flops": layer.flops,
             "io_bytes": layer.io_bytes(op), "parties": {}}
    ready = []
    got = None
    for party in parties:
        res = entry["parties"].setdefault(party.name, {"family": party.family,
                                                       "dtype": party.dtype,
                                                       "peer": party.is_peer})
        if op not in party.ops:
            res.update(status="unsupported", error=f"{party.family} has no {op} op")
            continue
        why = party.available()
        if why is not None:
            res.update(status="unavailable", error=why)
            continue
        pinputs = _inputs_for(party, inputs)
        key = (layer, op, party.dtype)
        try:
            prepared = party.prepare(layer, op, pinputs)
            t0 = time.perf_counter()
            raw = prepared.run()
            first = time.perf_counter() - t0
            got = prepared.to_canonical(raw)
            del raw
        except Unsupported as exc:
            res.update(status="unsupported", error=str(exc))
            continue
        except Exception as exc:  # the party refused the call: record it, go on
            status = "error" if not party.is_peer else "unsupported"
            res.update(status=status, error=_error_text(exc))
            continue
        if not party.checked:
            res["status"] = "ok"
            ready.append((party, prepared, res))
            continue
        if key not in refs:
            refs[key] = reference(layer, op, pinputs)
        err = relative_error(got, refs[key])
        res["max_rel_err"] = err
        if not err <= TOLERANCE[party.dtype]:
            res.update(status="failed",
                       error=f"result differs from the float64 reference: max |got - ref| / "
                             f"max |ref| = {err:.3g} > {TOLERANCE[party.dtype]:g}")
            continue
        res["status"] = "ok"
        if first > SLOW_CALL_S:
            res["slow_capped"] = SLOW_REPEAT      # a party taking seconds is timed fewer times
        if memory and not party.is_peer:
            res["memory"] = peak_memory(prepared, party, layer, op)
        ready.append((party, prepared, res))
    del got
    gc.collect()
    for _ in range(warmup):  # (the checked call above was the first warm-up)
        for _party, prepared, res in ready:
            if "slow_capped" not in res:
                prepared.run()
    times = {party.name: [] for party, _, _ in ready}
    b2b = {party.name: [] for party, _, _ in ready}
    for rep in range(repeat):
        k = rep % max(len(ready), 1)
        for party, prepared, res in ready[k:] + ready[:k]:
            if "slow_capped" in res and rep >= SLOW_REPEAT:
                continue
            if pause:
                time.sleep(pause)
            t0 = time.perf_counter()
            out = prepared.run()
            times[party.name].append(time.perf_counter() - t0)
            del out
            if back_to_back and _back_to_back(layer, party):
                t0 = time.perf_counter()
                out = prepared.run()
                b2b[party.name].append(time.perf_counter() - t0)
                del out
    for party, _, res in ready:
        ts = times[party.name]
        if not ts:
            continue
        if b2b[party.name]:
            res["b2b_times_ms"] = [t * 1e3 for t in b2b[party.name]]
            res["b2b_ms"] = statistics.median(b2b[party.name]) * 1e3
        med = statistics.median(ts)
        res["times_ms"] = [t * 1e3 for t in ts]
        res["ms"] = med * 1e3
        res["gflops"] = layer.flops / med / 1e9
        res["gbps"] = layer.io_bytes(op, 2 if party.dtype != "float32" else 4) / med / 1e9
    return entry


# ---------------------------------------------------------------------------------------------
# Derived figures


def _ms(entry, name):
    res = entry["parties"].get(name, {})
    return res.get("ms") if res.get("status") == "ok" else None


def _is_convgrad(res: dict) -> bool:
    """Whether a party's result entry is convgrad's (records before the copy party have
    no family: every party that was not a peer was convgrad)."""
    family = res.get("family")
    return family == "convgrad" if family is not None else not res["peer"]


def _of_peak(flops: float, ms: float, peak: float | None) -> float | None:
    """The fraction of the FMA peak (GFLOP/s) that ``flops`` in ``ms`` reach."""
    return flops / (ms / 1e3) / 1e9 / peak if peak else None


def summarize_entry(entry: dict, ceilings: dict) -> None:
    """Add convgrad best, fastest peer, ratio, fractions of the ceilings and 16-bit ratios."""
    parties = entry["parties"]
    timed = {n: r["ms"] for n, r in parties.items() if r.get("status") == "ok" and "ms" in r}
    cg = {n: t for n, t in timed.items() if _is_convgrad(parties[n])
          and parties[n]["dtype"] == "float32"}
    peers = {n: t for n, t in timed.items() if parties[n]["peer"]}
    best = min(cg, key=cg.get) if cg else None
    fastest = min(peers, key=peers.get) if peers else None
    entry["convgrad_best"] = best
    entry["convgrad_ms"] = cg.get(best)
    entry["fastest_peer"] = fastest
    entry["fastest_peer_ms"] = peers.get(fastest)
    entry["ratio"] = (peers[fastest] / cg[best]) if best and fastest else None
    # the same from each party's fastest repetition: on a host where a call after the
    # pause is at random either about as fast as back to back or 1.5-2x slower (seen
    # 2026-11-26, every party), which of the two a median of 7 lands in decides a row
    fastest_rep = {n: min(parties[n]["times_ms"]) for n in timed if parties[n].get("times_ms")}
    cg_min = [fastest_rep[n] for n in cg if n in fastest_rep]
    peer_min = [fastest_rep[n] for n in peers if n in fastest_rep]
    entry["ratio_best_rep"] = min(peer_min) / min(cg_min) if cg_min and peer_min else None
    gemm = ceilings.get("gemm", {}).get("gflops")
    bw = ceilings.get("copy", {}).get("gbps")
    peak = (ceilings.get("fma") or {}).get("gflops")
    # per caller layout: convgrad NXC and NCX each against the fastest peer
    for name, t in cg.items():
        key = "ncx" if "NCX" in name else "nxc"
        if fastest:
            entry[f"ratio_{key}"] = peers[fastest] / t
    if best:
        gf = entry["flops"] / (cg[best] / 1e3) / 1e9
        entry["convgrad_gflops"] = gf
        entry["gemm_fraction"] = gf / gemm if gemm else None
        entry["peak_fraction"] = gf / peak if peak else None
        gbps = entry["io_bytes"] / (cg[best] / 1e3) / 1e9
        entry["convgrad_gbps"] = gbps
        entry["bandwidth_fraction"] = gbps / bw if bw else None
        copy = [t for n, t in timed.items() if parties[n].get("family") == "copy"]
        if copy:
            # the same bytes moved by a plain copy in the same rotation, after the same pause
            entry["copy_ms"] = copy[0]
            entry["copy_fraction"] = copy[0] / cg[best]
        # back to back (run_problem): convgrad's fastest float32 party
        b2b = [parties[n]["b2b_ms"] for n in cg if "b2b_ms" in parties[n]]
        if b2b:
            entry["b2b_ms"] = min(b2b)
            entry["b2b_peak_fraction"] = _of_peak(entry["flops"], min(b2b), peak)
        # the row's FLOPs as nothing but FMAs (fma), and the same while the bytes the op
        # must read and write stream through memory (roof), in the same rotation after
        # the same pause, and back to back
        for fam in ("fma", "roof"):
            names = [n for n in timed if parties[n].get("family") == fam]
            if not names:
                continue
            t, r = timed[names[0]], parties[names[0]]
            entry[f"{fam}_ms"] = t
            entry[f"{fam}_fraction"] = t / cg[best]
            entry[f"{fam}_peak_fraction"] = _of_peak(entry["flops"], t, peak)
            if "b2b_ms" in r and peak:
                entry[f"{fam}_b2b_peak_fraction"] = _of_peak(entry["flops"], r["b2b_ms"], peak)
    if fastest:
        entry["fastest_peer_gflops"] = entry["flops"] / (peers[fastest] / 1e3) / 1e9
        entry["peer_peak_fraction"] = entry["fastest_peer_gflops"] / peak if peak else None
    entry["dtype_ratio"] = {}
    for dt in ("float16", "bfloat16"):
        names = {n: t for n, t in timed.items() if _is_convgrad(parties[n])
                 and parties[n]["dtype"] == dt}
        if names and best:
            entry["dtype_ratio"][dt] = min(names.values()) / cg[best]
    mems = [parties[n]["memory"]["extra_ratio"] for n in cg if "memory" in parties[n]]
    entry["memory_extra_ratio"] = max(mems) if mems else None


def summarize(record: dict) -> dict:
    ratios = [e["ratio"] for e in record["results"] if e.get("ratio")]
    out = {"problems": len(record["results"]), "compared": len(ratios)}
    if ratios:
        out["geomean_ratio"] = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        out["min_ratio"] = min(ratios)
        out["max_ratio"] = max(ratios)
        out["at_least_1"] = sum(r >= 1.0 for r in ratios)
        best = [e["ratio_best_rep"] for e in record["results"] if e.get("ratio_best_rep")]
        if best:
            out["geomean_ratio_best_rep"] = math.exp(sum(map(math.log, best)) / len(best))
    for key in ("nxc", "ncx"):
        rs = [e[f"ratio_{key}"] for e in record["results"] if e.get(f"ratio_{key}")]
        if rs:
            out[f"geomean_ratio_{key}"] = math.exp(sum(math.log(r) for r in rs) / len(rs))
            out[f"min_ratio_{key}"] = min(rs)
    for dt in ("float16", "bfloat16"):
        rs = [e["dtype_ratio"][dt] for e in record["results"] if dt in e.get("dtype_ratio", {})]
        if rs:
            out[f"{dt}_ratio_max"] = max(rs)
    mems = [e["memory_extra_ratio"] for e in record["results"]
            if e.get("memory_extra_ratio") is not None]
    if mems:
        out["memory_extra_ratio_max"] = max(mems)
    return out


# ---------------------------------------------------------------------------------------------
# The entry point


def _dump_partial(record: dict, out_dir) -> None:
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, "benchmark.partial.json")
    with open(tmp, "w") as fh:
        json.dump(record, fh, indent=1, default=float)


def run_benchmark(layers=None, ops=None, parties=None, dtypes=("float32",), repeat: int = 7,
                  warmup: int = 1, threads: int = 2, out_dir="benchmarks/results",
                  progress=None, *, suite=None, seed: int = 0, memory: bool = True,
                  ceilings: bool = True, pause: float = 0.15,
                  scaling: str | None = None, precision: str = "default",
                  order: str = "interleaved", back_to_back: bool = True) -> dict:
    """Time convgrad and the installed peers on the suite; return the record.

    Parameters
    ----------
    layers : list, optional
        Layer names of the suite, or layer dicts (suite.json format) or
        :class:`Layer` objects; default every layer of the suite.
    ops : list of {"wgrad", "dgrad"}, optional
        Default: the ops each layer lists.
    parties : list, optional
        Family names (``"convgrad"``, ``"torch"``, ``"tensorflow"``, ``"jax"``,
        ``"openvino"``, ``"onnxruntime"``) and/or :class:`Party` objects;
        default every family (a peer that is not installed is recorded as
        unavailable).
    dtypes : tuple of str
        convgrad's dtypes ("float32", "float16", "bfloat16"); peers run float32.
    repeat, warmup : int
        Timed repetitions (median reported) and untimed warm-up calls per party
        after the first (checked) call.
    threads : int
        Threads for every party (and NumPy's BLAS).
    out_dir : path or None
        Where :func:`write_report` writes the record; None writes nothing.
    progress : callable, optional
        ``progress(done, total, label)`` after each (layer, op) and before the first.
    precision : {"default", "highest"}
        convgrad's ``config(precision=...)`` for its timed calls: ``"highest"``
        keeps the direct kernels (no Winograd).
    suite : path, optional
        Another suite.json.
    pause : float
        Seconds of sleep (untimed) before each timed call, so that one party's
        spinning worker threads do not slow the next one down.
    back_to_back : bool
        On dense rows, also time convgrad's float32 parties and the FMA party called
        again at once after each timed call (:func:`run_problem`).
    scaling : str or None
        ``"layer:op"`` of the suite whose GFLOP/s is also measured for batch
        sizes 1 to 64 and 1 to ``threads`` threads (``record["scaling"]``,
        ``scaling.png``); None skips it.
    """
    if "float32" not in dtypes:
        dtypes = ("float32", *dtypes)
    bad = set(dtypes) - set(TOLERANCE)
    if bad:
        raise ValueError(f"unknown dtypes {sorted(bad)}; known: {', '.join(TOLERANCE)}")
    lays = _select_layers(layers, suite)
    if ops is not None:
        bad = set(ops) - set(OPS)
        if bad:
            raise ValueError(f"unknown ops {sorted(bad)}; known: {', '.join(OPS)}")
    families = None
    objects: list[Party] = []
    if parties is not None:
        families = [p for p in parties if isinstance(p, str)]
        objects = [p for p in parties if isinstance(p, Party)]
    thread_settings = configure_threads(threads, FAMILIES if families is None else families)
    party_list = default_parties(families, dtypes, threads, order=order) + objects
    names = [p.name for p in party_list]
    if len(set(names)) != len(names):
        raise ValueError(f"party names must be unique, got {names}")
    problems = [(lay, op) for lay in lays for op in lay.ops if ops is None or op in ops]
    record = {"schema": SCHEMA,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine_info(), "threads": threads, "repeat": repeat, "warmup": warmup,
              "dtypes": list(dtypes), "parties": names, "thread_settings": thread_settings,
              "pause_s": pause, "order": order, "back_to_back": back_to_back,
              "tolerance": TOLERANCE,
              "load_average_start": _loadavg(),
              "precision": precision, "results": []}
    import convgrad
    with _blas_threads(threads) as blas, convgrad.config(precision=precision):
        record["thread_settings"]["numpy_blas"] = blas
        record["ceilings"] = ({"gemm": gemm_ceiling(), "copy": copy_bandwidth(),
                               "fma": fma_peak(threads),
                               "wake": wake_penalty(threads, pause),
                               "idle_memory": idle_memory_read()} if ceilings else {})
        if progress:
            progress(0, len(problems), "starting")
        for i, (lay, op) in enumerate(problems):
            entry = run_problem(lay, op, party_list, repeat=repeat, warmup=warmup, seed=seed,
                                memory=memory, pause=pause, back_to_back=back_to_back)
            summarize_entry(entry, record["ceilings"])
            record["results"].append(entry)
            if out_dir is not None:  # a partial record survives an interrupted run
                _dump_partial(record, out_dir)
            if progress:
                progress(i + 1, len(problems), f"{lay.name} {op}")
        if scaling:
            from .scaling import run_scaling
            name, _, sop = scaling.partition(":")
            lay = next((la for la in load_suite(suite) if la.name == name), None)
            if lay is None:
                raise ValueError(f"scaling: unknown layer {name!r}")
            if progress:
                progress(len(problems), len(problems), f"scaling {scaling}")
            record["scaling"] = run_scaling(lay, sop or "dgrad",
                                            threads=tuple(range(1, threads + 1)),
                                            with_torch=families is None or "torch" in families)
    record["machine"]["blas"] = _blas_info()
    record["load_average_end"] = _loadavg()
    record["summary"] = summarize(record)
    if out_dir is not None:
        from .report import write_report
        write_report(record, out_dir)
        with contextlib.suppress(OSError):
            os.remove(os.path.join(out_dir, "benchmark.partial.json"))
    return record
