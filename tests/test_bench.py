"""The benchmark harness (convgrad.bench): adapters, protocol and report.  Nothing here
is timed: the tests check what the harness computes and records, on tiny layers."""

import importlib.util
import itertools
import json
import math
import re

import numpy as np
import pytest

import convgrad
from conftest import import_peer
from convgrad.bench import Layer, Party, Prepared, Unsupported, load_suite, run_benchmark
from convgrad.bench import peers as P
from convgrad.bench.__main__ import main as bench_main
from convgrad.bench.harness import (TOLERANCE, make_inputs, reference, relative_error,
                                    run_problem, summarize, summarize_entry)
from convgrad.bench.report import markdown, write_report

TINY = [
    dict(name="g2_s2", N=2, C=4, O=6, S=[9, 9], K=[3, 3], strides=[2, 2], pads=[1, 1],
         dilations=[1, 1], groups=2),
    dict(name="dense_2d", N=2, C=4, O=6, S=[9, 8], K=[3, 2], strides=[2, 1], pads=[1, 0],
         dilations=[1, 1], groups=1),
    dict(name="dw_s2", N=2, C=4, O=4, S=[9, 9], K=[3, 3], strides=[2, 2], pads=[1, 1],
         dilations=[1, 1], groups=4),
    dict(name="dil_1d", N=2, C=4, O=6, S=[17], K=[3], strides=[1], pads=[2], dilations=[2],
         groups=1),
    dict(name="dense_3d", N=1, C=3, O=4, S=[6, 6, 5], K=[3, 3, 3], strides=[1, 1, 1],
         pads=[1, 1, 1], dilations=[1, 1, 1], groups=1),
]
LAYERS = [Layer.from_dict(d) for d in TINY]

MODULE = {"torch": "torch", "tensorflow": "tensorflow", "jax": "jax", "openvino": "openvino",
          "onnxruntime": "onnxruntime"}


def _all_parties():
    return P.default_parties([f for f in P.FAMILIES if f not in ("copy", "fma", "roof")],
                             dtypes=("float32", "float16", "bfloat16"),
                             low_precision_layouts=("NXC", "NCX"))


def _refuses(party, layer, op):
    """The problems a party is known to refuse (and is allowed to)."""
    if op not in party.ops:
        return True
    if party.family == "torch" and party.channels_last and layer.rank == 1:
        return True
    if party.family == "tensorflow":
        dilated = any(d > 1 for d in layer.dilations)
        grouped = layer.groups > 1 and not layer.depthwise
        return dilated or grouped
    return False


@pytest.mark.parametrize("op", P.OPS)
@pytest.mark.parametrize("layer", LAYERS, ids=lambda lay: lay.name)
@pytest.mark.parametrize("party", _all_parties(), ids=lambda p: p.name.replace(" ", "_"))
def test_party_matches_reference(party, layer, op):
    if party.is_peer:
        import_peer(MODULE[party.family])
        if party.family == "onnxruntime":
            import_peer("onnx")
    inputs = make_inputs(layer, seed=3)
    if party.dtype != "float32":  # the party computes on inputs rounded to its dtype
        from convgrad.bench.harness import _inputs_for
        inputs = _inputs_for(party, inputs)
    if _refuses(party, layer, op):
        with pytest.raises(Exception):  # noqa: B017 - refusals come as each framework's error
            if op not in party.ops:
                raise Unsupported("no such op")
            prepared = party.prepare(layer, op, inputs)
            prepared.run()
        return
    prepared = party.prepare(layer, op, inputs)
    got = prepared.to_canonical(prepared.run())
    want = reference(layer, op, inputs)
    assert want.shape == (layer.w_shape if op == "wgrad" else layer.x_shape)
    err = relative_error(got, want)
    assert err <= TOLERANCE[party.dtype], err


def test_layer_geometry_matches_convgrad():
    """Output sizes, output_padding and FLOPs of every suite layer, from convgrad's own
    shape inference: the transposed-conv peers get exactly S back."""
    import convgrad
    for lay in load_suite():
        op = convgrad.op("onednn:ConvolutionBackwardData", strides=list(lay.strides),
                         pads_begin=list(lay.pads_begin), pads_end=list(lay.pads_end),
                         dilations=list(lay.dilations), groups=lay.groups,
                         output_padding=list(lay.output_padding()), data_format="NCX",
                         weights_format="OIX")
        assert op.infer_shape(lay.y_shape, lay.w_shape) == lay.x_shape, lay.name
        assert all(0 <= p < s for p, s in zip(lay.output_padding(), lay.strides)), lay.name
        assert lay.flops == (2 * lay.n * lay.o * (lay.c // lay.groups) * math.prod(lay.k)
                             * math.prod(lay.m))
    names = [lay.name for lay in load_suite()]
    assert "r50_res2_3x3" in names and len(names) == len(set(names))


class _Counting(Party):
    """A party that counts its calls; ``wrong`` makes its result off by 1%."""

    family = "test"

    def __init__(self, name, wrong):
        self.name, self.wrong, self.calls = name, wrong, 0

    def prepare(self, layer, op, inputs):
        want = reference(layer, op, inputs)

        def run():
            self.calls += 1
            return want * (1.01 if self.wrong else 1.0)

        return Prepared(run=run, to_canonical=lambda r: r)


class _Refusing(Party):
    name = family = "refuser"

    def prepare(self, layer, op, inputs):
        return Prepared(run=lambda: 1 / 0, to_canonical=lambda r: r)


def test_wrong_party_is_failed_and_not_timed():
    wrong, right = _Counting("wrong", True), _Counting("right", False)
    entry = run_problem(LAYERS[0], "dgrad", [wrong, right, _Refusing()], repeat=3, warmup=2,
                        memory=False)
    w, r, z = (entry["parties"][n] for n in ("wrong", "right", "refuser"))
    assert w["status"] == "failed" and "ms" not in w and "times_ms" not in w
    assert 0.009 < w["max_rel_err"] < 0.011
    assert wrong.calls == 1  # the checking call only
    assert r["status"] == "ok" and len(r["times_ms"]) == 3 and r["max_rel_err"] == 0
    assert right.calls == 1 + 2 + 3
    assert z["status"] == "unsupported" and "ZeroDivisionError" in z["error"]


def test_best_repetition_ratio_sets_fastest_repetitions_against_each_other():
    """Beside the ratio of medians, each row's ratio of the parties' fastest repetitions
    (convgrad's best party against the fastest peer), and their geometric mean."""
    def party(peer, times, family=None):
        return {"peer": peer, "dtype": "float32", "family": family or
                ("torch" if peer else "convgrad"), "status": "ok",
                "ms": sorted(times)[len(times) // 2], "times_ms": times}
    entries = []
    for k, (a, b, c) in enumerate(((4, 9, 9), (5, 5, 8), (3, 12, 12))):
        entries.append({"layer": f"l{k}", "op": "dgrad", "flops": 1, "io_bytes": 1,
                        "parties": {"cg A": party(False, [a, 10, 10]),
                                    "cg B": party(False, [b, 11, 11]),
                                    "peer": party(True, [c, 6, 7]),
                                    "copy": party(False, [1, 1, 1], "copy")}})
    for e in entries:
        summarize_entry(e, {})
    assert [e["ratio_best_rep"] for e in entries] == [6 / 4, 6 / 5, 6 / 3]
    assert [e["ratio"] for e in entries] == [7 / 10, 7 / 10, 7 / 10]
    geo = math.exp((math.log(1.5) + math.log(1.2) + math.log(2.0)) / 3)
    assert summarize({"results": entries})["geomean_ratio_best_rep"] == pytest.approx(geo)


def test_no_party_follows_one_of_its_own_library():
    """In the rotation's order (cyclic) convgrad's parties and the peers alternate: a party
    right after its sibling found their shared buffers warm."""
    for fams, dtypes, low in ((None, ("float32", "float16", "bfloat16"), ("NXC", "NCX")),
                              (["convgrad", "torch"], ("float32",), ("NXC", "NCX")),
                              (["convgrad", "torch", "jax"], ("float32", "float16"), ("NXC",))):
        names = [p.family for p in P.default_parties(fams, dtypes=dtypes,
                                                     low_precision_layouts=low)
                 if p.family not in ("copy", "fma", "roof")]
        pairs = list(zip(names, names[1:] + names[:1]))
        assert not [a for a, b in pairs if a == b == "convgrad"], names
        assert ("torch", "torch") not in pairs, names


def test_copy_party_moves_a_depthwise_rows_bytes(tmp_path):
    """The copy pseudo-party is timed on depthwise rows only, in the same rotation, moves
    the row's bytes (half read, half written), is never convgrad's best nor a peer, and
    the report sets convgrad's time against it."""
    from convgrad.kernels import native
    if native.available() is not None:
        pytest.skip("the copy party runs on the native engine")
    src = np.arange(1000, dtype=np.float32)
    dst = np.zeros_like(src)
    np.testing.assert_array_equal(native.parallel_copy(dst, src, 3), src)
    record = run_benchmark(layers=[TINY[2], TINY[1]], parties=["convgrad", "copy"], repeat=3,
                           warmup=0, out_dir=tmp_path, ceilings=False, pause=0.0,
                           memory=False, scaling=None)
    md = (tmp_path / "benchmark.md").read_text()
    assert len(record["results"]) == 4
    for e in record["results"]:
        assert "copy" not in _table(md)[(e["layer"], e["op"])]
        assert "copy (unsupported)" not in md
        if not e["depthwise"]:
            assert e["parties"]["copy"]["status"] == "unsupported" and "copy_ms" not in e
            continue
        copy = e["parties"]["copy"]
        assert copy["status"] == "ok" and len(copy["times_ms"]) == 3
        assert e["convgrad_best"].startswith("convgrad") and e["fastest_peer"] is None
        assert e["copy_ms"] == copy["ms"]
        assert e["copy_fraction"] == copy["ms"] / e["convgrad_ms"]
        row = [ln for ln in md.split("## Depthwise")[1].splitlines()
               if ln.startswith(f"| {e['layer']} | {e['op']} |")][0]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[6] == f"{copy['ms']:.2f}" and cells[7] == f"{100 * e['copy_fraction']:.0f}"


def _table(md):
    """The main table of the markdown report: {(layer, op): {column: cell}}."""
    lines = md.split("## Time per call")[1].split("\n## ")[0].splitlines()
    rows = [ln for ln in lines if ln.startswith("| ")]
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    out = {}
    for ln in rows[1:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        out[(cells[0], cells[1])] = dict(zip(head, cells))
    return out


def test_report_numbers_come_from_the_record(tmp_path):
    import_peer("torch")
    record = run_benchmark(layers=TINY[:2], parties=["convgrad", "torch"], repeat=3, warmup=0,
                           out_dir=None, ceilings=False, pause=0.0, memory=False)
    # Replace every timing by a distinctive number: the report must show these.
    rng = np.random.default_rng(0)
    for e in record["results"]:
        for res in e["parties"].values():
            if res.get("status") == "ok":
                res["ms"] = float(rng.uniform(1, 99))
        summarize_entry(e, {"gemm": {"gflops": 50.0}, "copy": {"gbps": 10.0},
                            "fma": {"gflops": 80.0}})
    record["ceilings"] = {"gemm": {"n": 8, "ms": 1.0, "gflops": 50.0},
                          "copy": {"bytes": 2**20, "ms": 1.0, "gbps": 10.0},
                          "fma": {"gflops": 80.0, "threads": 2, "isa": "avx2",
                                  "runs": [80.0]},
                          "wake": {"threads": 2, "pause_s": 0.15, "hot_ms": 5.03,
                                   "after_pause_ms": 7.61},
                          "idle_memory": {"bytes": 16 * 2**20, "hot_ms": 2.04,
                                          "after_idle_ms": {"1.0": 36.12, "0.15": 8.39}}}
    record["summary"] = summarize(record)
    paths = write_report(record, tmp_path)
    md = open(paths["markdown"]).read()
    table = _table(md)
    assert len(table) == len(record["results"]) == 4
    ratios = []
    for e in record["results"]:
        row = table[(e["layer"], e["op"])]
        ms = {n: r["ms"] for n, r in e["parties"].items() if r.get("status") == "ok"}
        for col, name in (("cg NXC", "convgrad NXC/XIO"), ("cg NCX", "convgrad NCX/OIX"),
                          ("torch", "torch"), ("torch CL", "torch channels_last")):
            assert row[col] == f"{ms[name]:.2f}"
        best = min(ms["convgrad NXC/XIO"], ms["convgrad NCX/OIX"])
        assert row["cg best"] == ("cg NXC" if ms["convgrad NXC/XIO"] == best else "cg NCX")
        peer = min(ms["torch"], ms["torch channels_last"])
        ratios.append(peer / best)
        assert row["ratio"] == f"{peer / best:.2f}"
        assert row["GFLOP/s"] == f"{e['flops'] / best / 1e6:.1f}"
        assert row["% peak"] == f"{100 * e['flops'] / best / 1e6 / 80.0:.0f}"
        assert row["NXC"] == f"{peer / ms['convgrad NXC/XIO']:.2f}"
        assert row["NCX"] == f"{peer / ms['convgrad NCX/OIX']:.2f}"
        assert row["peer % peak"] == f"{100 * e['flops'] / peer / 1e6 / 80.0:.0f}"
        assert "TF" not in row and row["fastest peer"] in ("torch", "torch CL")
    assert "After the 0.15 s pause: a burst of FMAs on 2 threads takes 7.61 ms against " \
        "5.03 ms back to back" in md
    assert "reading 16 MiB takes 2.0 ms back to back, 8.4 ms after 0.15 s, 36.1 ms after " \
        "1.0 s untouched" in md
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    assert re.search(rf"Geometric mean of \(fastest peer time / convgrad time\): {geo:.3f}\*\*",
                     md)
    assert json.load(open(paths["json"]))["results"][0]["parties"]["torch"]["ms"] == \
        record["results"][0]["parties"]["torch"]["ms"]
    if "png" in paths:
        assert open(paths["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_idle_memory_read_times_one_array_hot_and_after_each_idle():
    """The header's idle-memory figure: one median back to back and one per idle time,
    of reading the same array."""
    from convgrad.bench.harness import idle_memory_read
    r = idle_memory_read(idles=(0.0, 0.01), nbytes=2**20, repeat=3)
    assert r["bytes"] == 2**20 and set(r["after_idle_ms"]) == {0.0, 0.01}
    assert 0 < r["hot_ms"] < 1000 and all(0 < v < 1000 for v in r["after_idle_ms"].values())


def test_wake_penalty_times_the_same_burst_hot_and_after_the_pause():
    """The header's wake-up figure: both medians are of one burst (about burst_ms on
    every thread), none without a pause."""
    from convgrad.bench.harness import wake_penalty
    from convgrad.kernels import native
    if native.available() is not None:
        pytest.skip("needs the native engine")
    assert wake_penalty(2, 0.0) is None
    w = wake_penalty(2, 0.01, burst_ms=2.0, repeat=3)
    assert w["threads"] == 2 and w["pause_s"] == 0.01
    assert 0.5 < w["hot_ms"] < 200 and 0.5 < w["after_pause_ms"] < 200


def test_refusals_are_listed_in_the_report():
    record = {"date": "d", "threads": 2, "repeat": 1, "warmup": 0, "dtypes": ["float32"],
              "parties": ["convgrad NXC/XIO", "tensorflow"],
              "machine": {"cpu": "c", "usable_cpus": 2, "logical_cpus": 2, "versions": {}},
              "results": [{"layer": "L", "op": "wgrad", "flops": 2e9, "io_bytes": 1,
                           "depthwise": False, "parties": {
                               "convgrad NXC/XIO": {"status": "ok", "ms": 4.0, "peer": False,
                                                    "dtype": "float32"},
                               "tensorflow": {"status": "unsupported", "peer": True,
                                              "dtype": "float32", "error": "no dilation"}}}]}
    summarize_entry(record["results"][0], {})
    md = markdown(record)
    row = _table(md)[("L", "wgrad")]
    assert row["cg NXC"] == "4.00" and row["TF"] == "n/s" and row["ratio"] == ""
    assert row["GFLOP/s"] == "500.0"
    assert "- L wgrad, tensorflow (unsupported): no dilation" in md


def test_command_line_runs_a_suite(tmp_path, capsys):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"layers": TINY[2:3]}))
    out = tmp_path / "out"
    assert bench_main(["--suite", str(suite), "--parties", "convgrad", "--dtypes", "float32",
                       "bfloat16", "--repeat", "2", "--warmup", "0", "--pause", "0",
                       "--no-ceilings", "--out", str(out)]) == 0
    rec = json.load(open(out / "benchmark.json"))
    assert [(e["layer"], e["op"]) for e in rec["results"]] == [("dw_s2", "wgrad"),
                                                               ("dw_s2", "dgrad")]
    for e in rec["results"]:
        assert set(e["parties"]) == {"convgrad NXC/XIO", "convgrad NCX/OIX",
                                     "convgrad NXC/XIO bfloat16", "convgrad NCX/OIX bfloat16"}
        assert all(len(r["times_ms"]) == 2 for r in e["parties"].values())
        assert e["dtype_ratio"]["bfloat16"] > 0 and e["memory_extra_ratio"] >= 0
    assert rec["ceilings"] == {} and rec["summary"]["problems"] == 2
    assert (out / "benchmark.md").exists() and not (out / "benchmark.partial.json").exists()
    assert bench_main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(lay.name in listed for lay in load_suite())


def test_scaling_record_and_plot(tmp_path):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"layers": TINY[1:2]}))
    out = tmp_path / "out"
    assert bench_main(["--suite", str(suite), "--parties", "convgrad", "--repeat", "1",
                       "--warmup", "0", "--pause", "0", "--no-ceilings", "--no-memory",
                       "--scaling", "dense_2d:wgrad", "--threads", "2", "--out", str(out)]) == 0
    rec = json.load(open(out / "benchmark.json"))
    sc = rec["scaling"]
    assert sc["layer"] == "dense_2d" and sc["op"] == "wgrad"
    got = {(p["batch"], p["threads"]) for p in sc["points"] if p["party"] == "convgrad NXC/XIO"}
    assert got == {(b, t) for b in (1, 2, 4, 8, 16, 32, 64) for t in (1, 2)}
    lay = Layer.from_dict(TINY[1])
    for p in sc["points"]:
        assert p["gflops"] == pytest.approx(lay.flops * p["batch"] / lay.n / p["ms"] / 1e6)
    md = open(out / "benchmark.md").read()
    assert "## Scaling: dense_2d wgrad" in md
    if importlib.util.find_spec("matplotlib"):
        assert open(out / "scaling.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_convgrad_bench_entry_point(tmp_path):
    # `convgrad bench` is the same harness behind the installed command: a one-layer run
    # against torch writes a record whose ratio is the peer's median over convgrad's.
    from clitools import cli

    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"layers": TINY[1:2]}))
    out = tmp_path / "out"
    parties = ["convgrad"] + (["torch"] if importlib.util.find_spec("torch") else [])
    r = cli("bench", "--suite", suite, "--parties", *parties, "--repeat", "2", "--warmup", "0",
            "--pause", "0", "--no-ceilings", "--no-memory", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "geometric mean" in r.stdout or len(parties) == 1
    rec = json.load(open(out / "benchmark.json"))
    for e in rec["results"]:
        best = min(p["ms"] for k, p in e["parties"].items() if k.startswith("convgrad"))
        assert e["convgrad_ms"] == pytest.approx(best, rel=1e-2)
        if len(parties) > 1:
            assert e["ratio"] == pytest.approx(e["fastest_peer_ms"] / best, rel=2e-2)
    assert cli("bench", "--bogus").returncode == 2


def test_precision_highest_keeps_the_direct_kernels(tmp_path, monkeypatch):
    """--precision highest times convgrad with config(precision='highest'): a 3-tap
    stride-1 layer the chooser would give to Winograd runs on the direct kernels,
    and the report says which precision ran."""
    from convgrad import kernels, settings
    layer = dict(name="dense_s1", N=2, C=64, O=64, S=[28, 28], K=[3, 3], strides=[1, 1],
                 pads=[1, 1], dilations=[1, 1], groups=1)
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"layers": [layer]}))
    seen = []
    real = kernels.select

    def spy(op, geom, dtype, algo="auto", **kw):
        k = real(op, geom, dtype, algo, **kw)
        seen.append((settings.precision(), k.name))
        return k
    monkeypatch.setattr(kernels, "select", spy)
    for precision in ("default", "highest"):
        seen.clear()
        out = tmp_path / precision
        assert bench_main(["--suite", str(suite), "--parties", "convgrad", "--repeat", "1",
                           "--warmup", "0", "--pause", "0", "--no-ceilings", "--no-memory",
                           "--scaling", "none", "--precision", precision,
                           "--out", str(out)]) == 0
        rec = json.load(open(out / "benchmark.json"))
        assert rec["precision"] == precision
        assert f"convgrad's precision: `{precision}`" in (out / "benchmark.md").read_text()
        assert seen and all(p == precision for p, _ in seen)
        names = {name for _, name in seen}
        assert ("winograd" in names) == (precision == "default"), names


def test_fma_party_times_a_dense_rows_flops_as_fmas(tmp_path):
    """The FMA pseudo-party does a dense row's FLOPs (rounded up to whole loop iterations
    on every thread) as nothing but FMAs, in the same rotation; it is timed on dense rows
    only, is never convgrad's best nor a peer, and the report sets convgrad's time and
    the FMA peak against it."""
    from convgrad.kernels import native
    if native.available() is not None:
        pytest.skip("the FMA party runs on the native engine")
    per_iter = int(native.engine().lib.cg_fma_loop_flops())
    for flops, threads in ((1, 1), (10**6, 2), (123_456_789, 3)):
        _go, done = native.fma_runner(flops, threads)
        assert flops <= done < flops + per_iter * threads and done % (per_iter * threads) == 0
    record = run_benchmark(layers=[TINY[2], TINY[1], TINY[0]], parties=["convgrad", "fma"],
                           repeat=3, warmup=0, out_dir=tmp_path, ceilings=False, pause=0.0,
                           memory=False, scaling=None)
    md = (tmp_path / "benchmark.md").read_text()
    assert len(record["results"]) == 6
    for e in record["results"]:
        fma = e["parties"]["fma"]
        assert "fma" not in _table(md)[(e["layer"], e["op"])]
        assert "fma (unsupported)" not in md
        if e["groups"] != 1:
            assert fma["status"] == "unsupported" and "fma_ms" not in e
            continue
        assert fma["status"] == "ok" and len(fma["times_ms"]) == 3
        assert e["convgrad_best"].startswith("convgrad") and e["fastest_peer"] is None
        assert e["fma_ms"] == fma["ms"] and e["fma_fraction"] == fma["ms"] / e["convgrad_ms"]
        row = [ln for ln in md.split("## Dense rows: the FMA ceiling")[1].splitlines()
               if ln.startswith(f"| {e['layer']} | {e['op']} |")][0]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[5] == f"{fma['ms']:.2f}" and cells[7] == f"{100 * e['fma_fraction']:.0f}"
    # against a given peak: the FLOPs over the FMA-only time
    entry = {"layer": "l", "op": "dgrad", "flops": 6e9, "io_bytes": 1,
             "parties": {"cg": {"peer": False, "dtype": "float32", "family": "convgrad",
                                "status": "ok", "ms": 4.0, "times_ms": [4.0]},
                         "fma": {"peer": False, "dtype": "float32", "family": "fma",
                                 "status": "ok", "ms": 3.0, "times_ms": [3.0]}}}
    summarize_entry(entry, {"fma": {"gflops": 2500.0}})
    assert entry["fma_peak_fraction"] == pytest.approx(0.8)
    assert entry["peak_fraction"] == pytest.approx(0.6) and entry["fma_fraction"] == 0.75


def test_roof_party_moves_a_dense_rows_bytes_during_its_fmas(tmp_path):
    """The roofline pseudo-party does a dense row's FLOPs (as the FMA party rounds them)
    while it reads every line of the bytes the op reads (a NaN in any line reaches the
    sums of exactly the task that owns it) and writes every line of its result; wgrad
    reads x and dy and writes dw, dgrad reads dy and w and writes dx; it is timed on
    dense rows only (back to back too), and the report sets it against the peak."""
    from convgrad.kernels import native
    if native.available() is not None:
        pytest.skip("the roof party runs on the native engine")
    rng = np.random.default_rng(5)
    for isa, (flops, read, written, threads) in itertools.product(
            native.info()["loaded"], ((10**6, 4096, 1000, 1), (3 * 10**6, 50_000, 7_777, 2),
                                      (12_345_678, 200_003, 64, 3))):
        with convgrad.config(isa=isa):              # (every build: 1, 2 or 4 vectors a line)
            per_round = int(native.engine().lib.cg_fma_loop_flops())
            go, done, (src, dst, sums) = native.roof_runner(flops, read, written, threads)
        assert flops <= done < flops + per_round * threads and done % (per_round * threads) == 0
        rlines, wlines = -(-read // 64), -(-written // 64)
        assert src.size == 16 * rlines and dst.size == 16 * wlines
        assert src.ctypes.data % 64 == 0 and dst.ctypes.data % 64 == 0
        dst[:] = np.nan
        go()
        assert np.isfinite(dst).all() and np.isfinite(sums).all()
        for line in {0, rlines - 1, int(rng.integers(rlines))}:
            src[16 * line + 3] = np.nan
            go()
            owner = [k for k in range(threads)
                     if k * rlines // threads <= line < (k + 1) * rlines // threads]
            assert [k for k in range(threads) if np.isnan(sums[k])] == owner, line
            src[16 * line + 3] = 1.0
    layer = LAYERS[1]
    x, y, w = (4 * int(np.prod(s)) for s in (layer.x_shape, layer.y_shape, layer.w_shape))
    for op, read, written in (("wgrad", x + y, w), ("dgrad", y + w, x)):
        info = P.RoofParty(2).prepare(layer, op, None).info
        assert (info["read_bytes"], info["written_bytes"]) == (read, written)
    record = run_benchmark(layers=[TINY[0], TINY[1]], parties=["convgrad", "fma", "roof"],
                           repeat=3, warmup=0, out_dir=tmp_path, ceilings=False, pause=0.0,
                           memory=False, scaling=None)
    md = (tmp_path / "benchmark.md").read_text()
    assert "roof (unsupported)" not in md
    for e in record["results"]:
        roof = e["parties"]["roof"]
        assert "roof" not in _table(md)[(e["layer"], e["op"])]
        if e["groups"] != 1:
            assert roof["status"] == "unsupported" and "roof_ms" not in e
            continue
        assert roof["status"] == "ok" and len(roof["times_ms"]) == 3
        assert len(roof["b2b_times_ms"]) == 3
        assert e["roof_ms"] == roof["ms"] and e["roof_fraction"] == roof["ms"] / e["convgrad_ms"]
        row = [ln for ln in md.split("## Dense rows: the FMA ceiling")[1].splitlines()
               if ln.startswith(f"| {e['layer']} | {e['op']} |")][0]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[8] == f"{roof['ms']:.2f}"
    # against a given peak: the FLOPs over the roof party's times
    entry = {"layer": "l", "op": "wgrad", "flops": 6e9, "io_bytes": 1,
             "parties": {"cg": {"peer": False, "dtype": "float32", "family": "convgrad",
                                "status": "ok", "ms": 4.0, "times_ms": [4.0], "b2b_ms": 3.5},
                         "roof": {"peer": False, "dtype": "float32", "family": "roof",
                                  "status": "ok", "ms": 3.2, "times_ms": [3.2],
                                  "b2b_ms": 2.5}}}
    summarize_entry(entry, {"fma": {"gflops": 2500.0}})
    assert entry["roof_peak_fraction"] == pytest.approx(0.75)
    assert entry["roof_fraction"] == pytest.approx(0.8)
    assert entry["roof_b2b_peak_fraction"] == pytest.approx(0.96)
    assert entry["convgrad_ms"] == 4.0 and "fma_ms" not in entry


def test_dense_rows_are_also_timed_back_to_back(tmp_path):
    """On dense rows convgrad's float32 parties and the FMA party call again at once after
    each timed call, that call timed apart (b2b); grouped rows, 16-bit parties and peers
    are not; the entry and the report take convgrad's fastest back-to-back median and
    set it and the FMA party's against the peak."""
    from convgrad.kernels import native
    fma = ["fma"] if native.available() is None else []
    record = run_benchmark(layers=[TINY[0], TINY[1]], ops=["dgrad"],
                           parties=["convgrad", *fma], dtypes=("float32", "float16"),
                           repeat=3, warmup=0, out_dir=tmp_path, ceilings=False, pause=0.0,
                           memory=False, scaling=None)
    assert record["back_to_back"] is True
    md = (tmp_path / "benchmark.md").read_text()
    grouped, dense = record["results"]
    assert all("b2b_ms" not in r for r in grouped["parties"].values())
    assert "b2b_ms" not in grouped
    cg32 = {n: r for n, r in dense["parties"].items()
            if r["family"] == "convgrad" and r["dtype"] == "float32"}
    assert len(cg32) == 2
    for n, r in dense["parties"].items():
        timed = (r["family"] == "convgrad" and r["dtype"] == "float32") or r["family"] == "fma"
        assert ("b2b_ms" in r) == timed, n
        if timed:
            assert len(r["b2b_times_ms"]) == 3
            assert r["b2b_ms"] == pytest.approx(float(np.median(r["b2b_times_ms"])))
    assert dense["b2b_ms"] == min(r["b2b_ms"] for r in cg32.values())
    row = [ln for ln in md.split("## Dense rows back to back")[1].splitlines()
           if ln.startswith("| dense_2d | dgrad |")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] == f"{dense['b2b_ms']:.2f}"
    assert "| g2_s2 |" not in md.split("## Dense rows back to back")[1].split("##")[0]
    # against a given peak: the FLOPs over the back-to-back times
    entry = {"layer": "l", "op": "dgrad", "flops": 6e9, "io_bytes": 1,
             "parties": {"cg": {"peer": False, "dtype": "float32", "family": "convgrad",
                                "status": "ok", "ms": 5.0, "times_ms": [5.0], "b2b_ms": 4.0},
                         "cg2": {"peer": False, "dtype": "float32", "family": "convgrad",
                                 "status": "ok", "ms": 6.0, "times_ms": [6.0], "b2b_ms": 3.0},
                         "fma": {"peer": False, "dtype": "float32", "family": "fma",
                                 "status": "ok", "ms": 3.0, "times_ms": [3.0],
                                 "b2b_ms": 2.5}}}
    summarize_entry(entry, {"fma": {"gflops": 2500.0}})
    assert entry["b2b_ms"] == 3.0 and entry["b2b_peak_fraction"] == pytest.approx(0.8)
    assert entry["fma_b2b_peak_fraction"] == pytest.approx(0.96)
    assert entry["convgrad_ms"] == 5.0
