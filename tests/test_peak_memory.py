"""Peak memory as a tested property (docs/kernels.md, "Memory"; decision D18).

Each case is one representative public call, measured in a child process by
:func:`convgrad.bench.peak.measure`: inputs built, one warm-up call, the
resident-set high-water mark reset, the call again.  ``extra`` is the peak
above the resident set before the call, less the result: what the call
allocated beyond its inputs and its result.

The calls run with a workspace budget of :data:`WORKSPACE` (4 MiB), small
against their data tensors (8-64 MiB each in the compute dtype), as the
default budget (1/32 of the available memory) is small against a tensor that
fills a good part of the memory, like the 3-D spec example's.  Each case
checks that a whole copy of any of its data tensors would exceed the budget
of every kernel that can run it, so no such copy can hide in a budget.

Asserted for each case:

1. the default path (``algo="auto"``) adds at most the documented budget of
   the kernel that ran, for a caller in that kernel's layout and compute dtype
   (:func:`kernel_budget`, the table in docs/kernels.md), plus the whole-tensor
   copies the case documents (``allowed``: float16 calls keep a float32 result
   before the final cast), plus :data:`NOISE_BYTES`;
2. every kernel measured (the chosen one, and the kernels forced in ``also``,
   which may make layout copies) adds at most its own estimate
   (``kernels.estimate``), plus noise: the chooser can trust the estimates.

A kernel or chooser change that adds a whole-tensor copy fails (1) or (2).
To test a new kernel's memory: add its row to :func:`kernel_budget` and to the
table in docs/kernels.md, and cases (or ``also`` entries) that run it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

import convgrad
from convgrad import kernels
from convgrad.bench.peak import NOISE_BYTES, Case, can_measure, measure
from convgrad.geometry import make_geometry
from convgrad.kernels import native
from convgrad.kernels._blas import cpu_count

pytestmark = pytest.mark.skipif(not can_measure(),
                                reason="needs /proc/self/status and /proc/self/clear_refs")

MiB = 2**20
WORKSPACE = 4 * MiB
SETTINGS = {"workspace_bytes": WORKSPACE}
PAD1 = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
SPEC_ATTRS = dict(strides=[2] * 3, pads_begin=[1] * 3, pads_end=[1] * 3, dilations=[1] * 3)


@dataclass(frozen=True)
class MemoryCase:
    case: Case
    also: tuple[str, ...] = ()     # kernels forced as well (their estimates are checked)
    # documented whole-tensor extras on the default path: "float32 result" (of a
    # float16 call), "float32 inputs" (float16 data inputs copied to float32)
    allowed: tuple[str, ...] = ()

    def allowed_bytes(self, result: dict) -> int:
        total = 0
        for label in self.allowed:
            if label == "float32 result":
                # the native engine (and its grouped kernel) stores a float16/bfloat16
                # forward or data result in
                # its own dtype (rounded once): no float32 result to allow for
                if (result["kernel"] in ("native", "winograd", "grouped")
                        and result["call"]["op"] != "wgrad"):
                    continue
                total += result["output_bytes"] * 2
            elif label == "float32 inputs":
                total += 4 * sum(math.prod(shape) for shape, _ in self.case.arrays.values())
            else:
                raise AssertionError(f"unknown allowance {label!r}")
        return total


def _c(name, function, arrays, kwargs, **kw) -> MemoryCase:
    return MemoryCase(Case(name, function, arrays, kwargs, SETTINGS), **kw)


f32, f16 = "float32", "float16"
CASES = [
    _c("dense3x3-wgrad-NXC", "onednn.convolution_backward_weights",
       {"src": ((64, 32, 32, 64), f32), "diff_dst": ((64, 32, 32, 64), f32)},
       dict(weights_shape=[3, 3, 64, 64], **PAD1)),
    _c("dense3x3-fwd-NCX", "conv_forward",
       {"x": ((32, 64, 32, 32), f32), "w": ((64, 64, 3, 3), f32)},
       dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1]), also=("shifted",)),
    _c("dense1x1-dgrad-NXC", "onednn.convolution_backward_data",
       {"weights": ((1, 1, 64, 128), f32), "diff_dst": ((64, 32, 32, 128), f32)},
       dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
            dst_shape=[64, 32, 32, 64]), also=("im2col",)),
    _c("dense1x1-wgrad-NCX", "conv_weight_grad",
       {"x": ((64, 64, 32, 32), f32), "dy": ((64, 128, 32, 32), f32)},
       dict(kernel_shape=(128, 64, 1, 1)), also=("shifted",)),
    _c("strided3x3-dgrad-NXC", "tf.conv2d_backprop_input",
       {"filter": ((3, 3, 64, 64), f32), "out_backprop": ((64, 32, 32, 64), f32)},
       dict(input_sizes=[64, 64, 64, 64], strides=[1, 2, 2, 1], padding="SAME")),
    _c("depthwise3x3-dgrad-NXC", "tf.depthwise_conv2d_native_backprop_input",
       {"filter": ((3, 3, 128, 1), f32), "out_backprop": ((16, 48, 48, 128), f32)},
       dict(input_sizes=[16, 48, 48, 128], strides=[1, 1, 1, 1], padding="SAME"),
       also=("winograd",)),
    _c("depthwise3x3-wgrad-NCX", "conv_weight_grad",
       {"x": ((16, 128, 48, 48), f32), "dy": ((16, 128, 48, 48), f32)},
       dict(kernel_shape=(128, 1, 3, 3), groups=128, strides=[1, 1], pads_begin=[1, 1],
            pads_end=[1, 1]), also=("direct",)),
    _c("fewgroup3x3-fwd-NXC", "onednn.convolution",
       {"src": ((64, 64, 64, 16), f32), "weights": ((3, 3, 4, 16), f32)},
       dict(groups=4, **PAD1)),
    _c("dense3x3x3-wgrad-NXC", "onednn.convolution_backward_weights",
       {"src": ((32, 16, 16, 16, 32), f32), "diff_dst": ((32, 16, 16, 16, 32), f32)},
       dict(weights_shape=[3, 3, 3, 32, 32], strides=[1] * 3, pads_begin=[1] * 3,
            pads_end=[1] * 3, dilations=[1] * 3)),
    # the GroupConvolutionBackpropData spec page's 3-D example, 224^3 -> 48^3
    _c("spec-gcbd3d-NCX", "openvino.group_convolution_backprop_data",
       {"data": ((1, 20, 48, 48, 48), f32), "filter": ((4, 5, 2, 3, 3, 3), f32)},
       SPEC_ATTRS),
    _c("spec-gcbd3d-NXC", "onednn.convolution_backward_data",
       {"weights": ((3, 3, 3, 2, 20), f32), "diff_dst": ((1, 48, 48, 48, 20), f32)},
       dict(groups=4, dst_shape=[1, 95, 95, 95, 8], **SPEC_ATTRS)),
    _c("dense3x3-fwd-NXC-f16", "onednn.convolution",
       {"src": ((128, 32, 32, 64), f16), "weights": ((3, 3, 64, 64), f16)},
       dict(**PAD1), allowed=("float32 result",)),
    _c("spec-gcbd3d-NXC-f16", "onednn.convolution_backward_data",
       {"weights": ((3, 3, 3, 2, 20), f16), "diff_dst": ((1, 64, 64, 64, 20), f16)},
       dict(groups=4, dst_shape=[1, 127, 127, 127, 8], **SPEC_ATTRS),
       allowed=("float32 result", "float32 inputs")),
]


BUDGETED = ("native", "winograd", "grouped", "shifted", "direct", "im2col")


def kernel_budget(kernel: str, call: dict, workspace: int) -> int:
    """The documented extra of ``kernel`` for a caller in its layout and
    compute dtype (docs/kernels.md, "Memory"): its workspace, no copies."""
    isz = 8 if call["cdt"] == "float64" else 4
    cg, og = call["c"] // call["groups"], call["o"] // call["groups"]
    w = call["o"] * cg * math.prod(call["kernel"]) * isz          # the weights
    threads = cpu_count()
    if kernel == "native":
        # per-thread scratch (converted lines, channels-first output lines, weight
        # gradient panels), packed weights, partial weight gradients: no data tensor
        from convgrad.kernels import native
        return sum(native.workspace(_geometry(call), call["op"]).values())
    if kernel == "winograd":
        # per-thread scratch (an item's transformed tiles and products, converted input
        # lines, a buffered output block), the transformed weights or input shared by
        # the items (<= workspace / 4 each), bad-line flags (a byte per output line),
        # partial weight gradient sums: no data tensor
        from convgrad.kernels import winograd
        with convgrad.config(workspace_bytes=workspace):
            return sum(winograd.workspace(_geometry(call), call["op"]).values())
    if kernel == "grouped":
        # per-thread scratch (<= min(1 MiB, W/2T): packed source lines, one output
        # line), packed weights (fwd, dgrad) or partial weight gradients (<= min(8 MiB,
        # W/4)): no data tensor.  The estimate for a caller whose inputs are not read
        # in place (packed lines) bounds the in-place one.
        from convgrad.kernels import grouped
        return sum(grouped.workspace(_geometry(call), call["op"]).values())
    if kernel == "shifted":
        # grids of one batch block <= the budget; weights per tap and folded (2 w),
        # or partial weight gradients (<= 4 per thread, + 1); folding buffers
        pieces = (4 * threads + 1) * w if call["op"] == "wgrad" else 2 * w
        return workspace + pieces + (threads * MiB if cg <= 16 else 0)
    if kernel == "direct":
        # per thread, KD*KH cached rows; reordered weights (dgrad) or partial
        # weight gradients (wgrad)
        k = [1] * (3 - len(call["kernel"])) + call["kernel"]
        row = (call["out_sizes"][-1] * og * call["c"] if call["op"] == "dgrad"
               else call["in_sizes"][-1] * cg * call["o"])
        pieces = {"fwd": 0, "dgrad": w, "wgrad": min(64 * w, 32 * MiB)}[call["op"]]
        return threads * k[0] * k[1] * row * isz + pieces
    if kernel == "im2col":
        # column buffer + output (fwd) or gathered dy block <= the budget, or one
        # tap of one sample (+ its output) if that is more; weight pieces
        m = math.prod(call["out_sizes"])
        floor = (call["c"] + (call["o"] if call["op"] == "fwd" else 0)) * m * isz
        return max(workspace, floor) + 2 * w
    raise AssertionError(f"kernel {kernel!r} has no documented memory budget: add it to "
                         f"kernel_budget and to docs/kernels.md")


def _geometry(call: dict):
    fields = ("n", "c", "o", "groups", "in_sizes", "kernel", "out_sizes", "strides",
              "dilations", "pads_begin", "pads_end")
    return make_geometry("test", **{f: (tuple(call[f]) if isinstance(call[f], list)
                                        else call[f]) for f in fields})


def _runnable(call: dict) -> list[str]:
    """The documented kernels that support ``call`` within :data:`WORKSPACE`."""
    geom = _geometry(call)
    with convgrad.config(workspace_bytes=WORKSPACE):
        found = kernels.candidates(call["op"], geom, np.dtype(call["cdt"]))
    return [k.name for k, why in found if why is None and k.name in BUDGETED]


def _data_bytes(mc: MemoryCase, auto: dict) -> list[int]:
    """Bytes of each data tensor (not the weights) in the compute dtype."""
    call = auto["call"]
    w = call["o"] * call["c"] // call["groups"] * math.prod(call["kernel"])
    isz = 8 if call["cdt"] == "float64" else 4
    elems = [math.prod(shape) for shape, _ in mc.case.arrays.values()]
    out = auto["output_bytes"] // np.dtype(call["dtype"]).itemsize
    return [e * isz for e in elems + ([] if call["op"] == "wgrad" else [out]) if e != w]


def _describe(name: str, r: dict) -> str:
    parts = ", ".join(f"{k} {v / MiB:.2f}" for k, v in r["estimate"].items())
    return (f"{name}: kernel {r['kernel']}, extra {r['extra'] / MiB:.2f} MiB over inputs "
            f"{r['input_bytes'] / MiB:.1f} + result {r['output_bytes'] / MiB:.1f} MiB; "
            f"estimate (MiB): {parts or 'none'}")


@pytest.mark.parametrize("mc", CASES, ids=[mc.case.name for mc in CASES])
def test_peak_memory_stays_within_the_documented_budget(mc):
    results = measure(mc.case, ("auto",) + mc.also)
    auto = results["auto"]
    assert auto["workspace_bytes"] == WORKSPACE
    # a whole copy of any data tensor exceeds the budget of every kernel that can run
    worst = max(kernel_budget(k, auto["call"], WORKSPACE) for k in _runnable(auto["call"]))
    assert min(_data_bytes(mc, auto)) > worst + NOISE_BYTES, (_data_bytes(mc, auto), worst)

    budget = (kernel_budget(auto["kernel"], auto["call"], WORKSPACE)
              + mc.allowed_bytes(auto) + NOISE_BYTES)
    assert auto["extra"] <= budget, (
        f"the default path exceeds its budget, {budget / MiB:.2f} MiB -- "
        + _describe("auto", auto))

    for algo, r in results.items():
        assert "unsupported" not in r, (algo, r)
        assert r["extra"] <= sum(r["estimate"].values()) + NOISE_BYTES, (
            "the kernel allocates more than it declares -- " + _describe(algo, r))


def test_channels_first_weight_gradients_sum_into_the_oix_result():
    """ResNet-50 res3's stride-2 weight gradient for an OIX caller (NCX float32: the
    channels-first kernel, 8 partial gradients): their sum stores the OIX result
    (cg_sum_parts_oix), so the estimate declares no (*K, C, O) result before a copy, only
    each thread's rows of the sum, and the call's extra memory stays within it and
    under the 590 KB result.  (The default workspace: under the suite's 4 MiB the
    partials do not fit and the direct kernel runs.)"""
    case = Case("res3s2-wgrad-NCX", "conv_weight_grad",
                {"x": ((8, 128, 56, 56), f32), "dy": ((8, 128, 28, 28), f32)},
                dict(kernel_shape=(128, 128, 3, 3), strides=[2, 2], pads_begin=[1, 1],
                     pads_end=[1, 1]), {})
    r = measure(case, ("native",))["native"]
    assert r["kernel"] == "native", r
    assert "dw before the caller's copy" not in r["estimate"], r["estimate"]
    assert r["estimate"]["the OIX sum's rows, per thread"] > 0, r["estimate"]
    assert r["extra"] <= sum(r["estimate"].values()) + NOISE_BYTES, _describe("native", r)
    assert r["extra"] < r["output_bytes"], _describe("native", r)


def test_oix_weight_gradients_of_small_inputs_make_no_result_copy():
    """ResNet-50 res5's weight gradient for an OIX caller (NCX inputs converted once):
    the kernel's tasks write the OIX result, so no (*K, C, O) result waits for a
    permuted copy -- its extra memory is the inputs' channels-last copies and a task's
    part per thread, within the estimate, and well under the 9 MiB result.  Where a
    task's part would not fit 5/8 of a core's L2 (1 MiB: Zen 4, Zen 5; finer tasks
    measured slower there) the kernel declares the copy instead.  (The direct kernel,
    forced: the chooser gives this layer Winograd's fused tasks since 2026-11-27, which
    store the OIX result themselves on any L2: no copy either, within the estimate.)"""
    case = _c("res5-wgrad-NCX", "conv_weight_grad",
              {"x": ((8, 512, 7, 7), f32), "dy": ((8, 512, 7, 7), f32)},
              dict(kernel_shape=(512, 512, 3, 3), strides=[1, 1], pads_begin=[1, 1],
                   pads_end=[1, 1])).case
    both = measure(case, ("native", "auto"))
    r = both["native"]
    assert r["kernel"] == "native", r
    wino = both["auto"]
    assert wino["kernel"] == "winograd", wino
    assert "dw before the caller's copy" not in wino["estimate"], wino["estimate"]
    assert wino["extra"] <= sum(wino["estimate"].values()) + NOISE_BYTES, _describe("auto", wino)
    assert wino["extra"] < wino["output_bytes"] / 2, _describe("auto", wino)
    if native.l2_bytes() < 2 << 20:
        assert r["estimate"]["dw before the caller's copy"] == 4 * 9 * 512 * 512, r
        assert "a task's part of the OIX result, per thread" not in r["estimate"], r
        return
    assert "dw before the caller's copy" not in r["estimate"], r["estimate"]
    assert r["estimate"]["a task's part of the OIX result, per thread"] > 0
    assert r["extra"] <= sum(r["estimate"].values()) + NOISE_BYTES, _describe("auto", r)
    assert r["extra"] < r["output_bytes"] / 2, _describe("auto", r)
