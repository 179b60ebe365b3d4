"""The parties of the benchmark: convgrad and every peer framework, one adapter each.

A party turns one benchmark problem (a :class:`Layer`, an op ``"wgrad"`` or
``"dgrad"`` and the canonical float32 inputs) into a :class:`Prepared`: a
zero-argument ``run`` that computes the gradient in the party's own (fastest)
layout on inputs converted beforehand, and a ``to_canonical`` that turns its
result into a canonical NumPy array (OIX weights ``(O, C/G, *K)`` or NCX data
``(N, C, *S)``) for the check against the reference.  Only ``run`` is timed.

A party that cannot compute a problem raises :class:`Unsupported` (from
``prepare`` or from the first ``run``) with the reason, e.g. TensorFlow's CPU
kernels refusing dilations > 1.

Peers are imported lazily, with their thread counts configured before first
use: ``configure_threads`` must run before a peer is imported for the settings
that only apply at start-up (XLA flags, TensorFlow's thread pools).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

OPS = ("wgrad", "dgrad")
FAMILIES = ("convgrad", "torch", "tensorflow", "jax", "openvino", "onnxruntime", "copy", "fma",
            "roof")


class Unsupported(Exception):
    """The party cannot compute this problem (the message says why)."""


@dataclass(frozen=True)
class Layer:
    """One suite layer in canonical terms: ``x[N, C, *S]`` convolved with
    ``w[O, C/G, *K]`` gives ``y[N, O, *M]``."""

    name: str
    n: int
    c: int
    o: int
    s: tuple[int, ...]
    k: tuple[int, ...]
    strides: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    dilations: tuple[int, ...]
    groups: int
    ops: tuple[str, ...] = OPS
    note: str = ""

    @classmethod
    def from_dict(cls, d: dict) -> "Layer":
        r = len(d["S"])
        pads = d.get("pads", [0] * r)
        return cls(name=d["name"], n=d["N"], c=d["C"], o=d["O"], s=tuple(d["S"]),
                   k=tuple(d["K"]), strides=tuple(d.get("strides", [1] * r)),
                   pads_begin=tuple(d.get("pads_begin", pads)),
                   pads_end=tuple(d.get("pads_end", pads)),
                   dilations=tuple(d.get("dilations", [1] * r)), groups=d.get("groups", 1),
                   ops=tuple(d.get("ops", OPS)), note=d.get("note", ""))

    @property
    def rank(self) -> int:
        return len(self.s)

    @property
    def m(self) -> tuple[int, ...]:
        """Output spatial sizes."""
        return tuple((s + pb + pe - (k - 1) * d - 1) // st + 1 for s, k, st, pb, pe, d in
                     zip(self.s, self.k, self.strides, self.pads_begin, self.pads_end,
                         self.dilations))

    @property
    def x_shape(self):
        return (self.n, self.c, *self.s)

    @property
    def w_shape(self):
        return (self.o, self.c // self.groups, *self.k)

    @property
    def y_shape(self):
        return (self.n, self.o, *self.m)

    @property
    def depthwise(self) -> bool:
        return self.groups == self.c == self.o and self.groups > 1

    @property
    def symmetric_pads(self) -> bool:
        return self.pads_begin == self.pads_end

    @property
    def flops(self) -> int:
        """2*N*O*(C/G)*prod(K)*prod(M), the suite's formula (each op)."""
        return 2 * self.n * self.o * (self.c // self.groups) * math.prod(self.k) * math.prod(self.m)

    def output_padding(self) -> tuple[int, ...]:
        """What a transposed convolution of dy must add at the end to give exactly S."""
        return tuple(s - ((m - 1) * st + (k - 1) * d + 1 - pb - pe) for s, m, k, st, d, pb, pe in
                     zip(self.s, self.m, self.k, self.strides, self.dilations, self.pads_begin,
                         self.pads_end))

    def io_bytes(self, op: str, itemsize: int = 4) -> int:
        """Bytes an op must read and write: wgrad reads x, dy and writes dw;
        dgrad reads w, dy and writes dx."""
        sizes = (self.x_shape, self.y_shape, self.w_shape)
        return itemsize * sum(math.prod(s) for s in sizes)


@dataclass
class Prepared:
    run: Callable[[], object]
    to_canonical: Callable[[object], np.ndarray]
    info: dict = field(default_factory=dict)


def _xio_to_oix(a: np.ndarray) -> np.ndarray:
    """(*K, C/G, O) -> (O, C/G, *K)."""
    r = a.ndim - 2
    return np.transpose(a, (r + 1, r, *range(r)))


def _oix_to_xio(a: np.ndarray) -> np.ndarray:
    r = a.ndim - 2
    return np.transpose(a, (*range(2, r + 2), 1, 0))


def _ncx_to_nxc(a: np.ndarray) -> np.ndarray:
    return np.moveaxis(a, 1, -1)


def _nxc_to_ncx(a: np.ndarray) -> np.ndarray:
    return np.moveaxis(a, -1, 1)


def _c(a, dtype=None):
    return np.ascontiguousarray(a, dtype=dtype)


class Party:
    """Base class: ``name`` (unique in a run), ``family`` (what is selected by
    ``run_benchmark(parties=...)``), the ops it computes, and the dtype it runs in."""

    name = "party"
    family = "party"
    ops = OPS
    dtype = "float32"
    is_peer = True
    checked = True        # its result is compared with the float64 reference

    def available(self) -> str | None:
        """None when importable, else the reason."""
        return None

    def prepare(self, layer: Layer, op: str, inputs: dict[str, np.ndarray]) -> Prepared:
        raise NotImplementedError


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise Unsupported(f"{name} is not installed: {exc}") from None


def _missing(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return f"{module} is not installed ({exc})"
    return None


# ---------------------------------------------------------------------------------------------
# convgrad


class ConvgradParty(Party):
    """convgrad through its public oneDNN Graph dialect, in ``NXC``/``XIO`` or ``NCX``/``OIX``."""

    def memory_case(self, layer: "Layer", op: str):
        """The same call as a :class:`convgrad.bench.peak.Case`, for a resident-set
        measurement in a child process."""
        from .peak import Case
        nxc = self.layout == "NXC"

        def data(shape):
            return list((shape[0], *shape[2:], shape[1]) if nxc else shape)
        wshape = list(_oix_to_xio(np.empty(layer.w_shape, np.int8)).shape if nxc
                      else layer.w_shape)
        attrs = dict(strides=list(layer.strides), pads_begin=list(layer.pads_begin),
                     pads_end=list(layer.pads_end), dilations=list(layer.dilations),
                     groups=layer.groups, data_format=self.layout,
                     weights_format=self.weights_format)
        if op == "wgrad":
            return Case(f"{layer.name}-{op}-{self.layout}", "onednn.convolution_backward_weights",
                        {"src": (data(layer.x_shape), self.dtype),
                         "diff_dst": (data(layer.y_shape), self.dtype)},
                        dict(weights_shape=wshape, **attrs))
        return Case(f"{layer.name}-{op}-{self.layout}", "onednn.convolution_backward_data",
                    {"diff_dst": (data(layer.y_shape), self.dtype),
                     "weights": (wshape, self.dtype)},
                    dict(dst_shape=data(layer.x_shape), **attrs))

    family = "convgrad"
    is_peer = False

    def __init__(self, layout: str = "NXC", dtype: str = "float32"):
        if layout not in ("NXC", "NCX"):
            raise ValueError(f"layout must be NXC or NCX, got {layout!r}")
        self.layout = layout
        self.weights_format = "XIO" if layout == "NXC" else "OIX"
        self.dtype = dtype
        suffix = "" if dtype == "float32" else f" {dtype}"
        self.name = f"convgrad {layout}/{self.weights_format}{suffix}"

    def _np_dtype(self):
        from ..dtypes import bfloat16
        return bfloat16 if self.dtype == "bfloat16" else np.dtype(self.dtype)

    def prepare(self, layer, op, inputs):
        from .. import onednn
        dt = self._np_dtype()
        nxc = self.layout == "NXC"
        data = (lambda a: _c(_ncx_to_nxc(a), dt)) if nxc else (lambda a: _c(a, dt))
        attrs = dict(strides=list(layer.strides), pads_begin=list(layer.pads_begin),
                     pads_end=list(layer.pads_end), dilations=list(layer.dilations),
                     groups=layer.groups, data_format=self.layout,
                     weights_format=self.weights_format)
        if op == "wgrad":
            x, dy = data(inputs["x"]), data(inputs["dy"])
            wshape = list(_oix_to_xio(np.empty(layer.w_shape, np.int8)).shape if nxc
                          else layer.w_shape)
            return Prepared(
                run=lambda: onednn.convolution_backward_weights(x, dy, wshape, **attrs),
                to_canonical=(lambda r: _xio_to_oix(r)) if nxc else (lambda r: r),
                info={"inputs": (x, dy)})
        w = _c(_oix_to_xio(inputs["w"]), dt) if nxc else _c(inputs["w"], dt)
        dy = data(inputs["dy"])
        xshape = list((layer.n, *layer.s, layer.c) if nxc else layer.x_shape)
        return Prepared(
            run=lambda: onednn.convolution_backward_data(dy, w, xshape, **attrs),
            to_canonical=(lambda r: _nxc_to_ncx(r)) if nxc else (lambda r: r),
            info={"inputs": (w, dy)})


# ---------------------------------------------------------------------------------------------
# PyTorch


class TorchParty(Party):
    """PyTorch CPU: ``torch.ops.aten.convolution_backward`` (oneDNN inside), with
    output_mask = (input grad, weight grad, bias grad); contiguous or channels_last."""

    family = "torch"

    def __init__(self, channels_last: bool = False):
        self.channels_last = channels_last
        self.name = "torch channels_last" if channels_last else "torch"

    def available(self):
        return _missing("torch")

    def prepare(self, layer, op, inputs):
        torch = _import("torch")
        if not layer.symmetric_pads:
            raise Unsupported("aten.convolution_backward takes symmetric padding only")
        fmt = None
        if self.channels_last:
            fmt = {2: torch.channels_last, 3: torch.channels_last_3d}.get(layer.rank)
            if fmt is None:
                raise Unsupported(f"PyTorch has no channels_last format for {layer.rank}-D data")

        def t(a):
            ten = torch.from_numpy(_c(a))
            return ten.contiguous(memory_format=fmt) if fmt is not None else ten

        x, w, dy = t(inputs["x"]), t(inputs["w"]), t(inputs["dy"])
        mask = [op == "dgrad", op == "wgrad", False]
        idx = 0 if op == "dgrad" else 1
        args = (None, list(layer.strides), list(layer.pads_begin), list(layer.dilations), False,
                [0] * layer.rank, layer.groups, mask)
        conv_bwd = torch.ops.aten.convolution_backward

        def run():
            return conv_bwd(dy, x, w, *args)[idx]

        return Prepared(run=run, to_canonical=lambda r: r.contiguous().numpy())


# ---------------------------------------------------------------------------------------------
# TensorFlow


def _tf_same_pads(layer: Layer) -> bool:
    """Whether TF's SAME padding gives exactly the layer's pads and output size."""
    for s, k, st, d, pb, pe, m in zip(layer.s, layer.k, layer.strides, layer.dilations,
                                      layer.pads_begin, layer.pads_end, layer.m):
        ke = (k - 1) * d + 1
        out = -(-s // st)
        total = max((out - 1) * st + ke - s, 0)
        if out != m or (total // 2, total - total // 2) != (pb, pe):
            return False
    return True


class TensorFlowParty(Party):
    """TensorFlow raw ops, NHWC: Conv2DBackpropFilter/Input (1-D as 2-D with H=1,
    grouped through the grouped filter shape), Conv3DBackprop*V2 (SAME/VALID pads only),
    DepthwiseConv2dNativeBackprop* for depthwise layers."""

    name = "tensorflow"
    family = "tensorflow"

    def available(self):
        return _missing("tensorflow")

    def prepare(self, layer, op, inputs):
        tf = _import("tensorflow")
        raw = tf.raw_ops
        r = layer.rank
        x, w, dy = inputs["x"], inputs["w"], inputs["dy"]
        if r == 1:  # as 2-D with H = 1
            x, w, dy = x[:, :, None, :], w[:, :, None, :], dy[:, :, None, :]
        r2 = max(r, 2)
        strides = [1, *((1,) if r == 1 else ()), *layer.strides, 1]
        dil = [1, *((1,) if r == 1 else ()), *layer.dilations, 1]
        pads = [0, 0, *((0, 0) if r == 1 else ())]
        for b, e in zip(layer.pads_begin, layer.pads_end):
            pads += [b, e]
        pads += [0, 0]
        xt = tf.constant(_c(_ncx_to_nxc(x)))
        dyt = tf.constant(_c(_ncx_to_nxc(dy)))
        x_shape = tf.constant([layer.n, *x.shape[2:], layer.c], tf.int32)
        to_x = lambda res: _nxc_to_ncx(res.numpy()).reshape(layer.x_shape)  # noqa: E731

        if layer.depthwise and r <= 2:
            # depthwise filter (*K, C, 1): canonical (O=C, 1, *K) -> (*K, C, 1)
            wt = tf.constant(_c(np.transpose(w, (*range(2, r2 + 2), 0, 1))))
            kw = dict(strides=strides, padding="EXPLICIT", explicit_paddings=pads,
                      dilations=dil, data_format="NHWC")
            if op == "wgrad":
                fs = tf.constant(list(wt.shape), tf.int32)
                return Prepared(
                    run=lambda: raw.DepthwiseConv2dNativeBackpropFilter(
                        input=xt, filter_sizes=fs, out_backprop=dyt, **kw),
                    to_canonical=lambda res: np.transpose(res.numpy(), (r2, r2 + 1, *range(r2)))
                    .reshape(layer.w_shape))
            return Prepared(
                run=lambda: raw.DepthwiseConv2dNativeBackpropInput(
                    input_sizes=x_shape, filter=wt, out_backprop=dyt, **kw),
                to_canonical=to_x)

        if r == 3:
            if layer.groups != 1:
                raise Unsupported("TensorFlow has no grouped Conv3D backprop kernel on CPU")
            if _tf_same_pads(layer):
                padding = "SAME"
            elif not any(layer.pads_begin) and not any(layer.pads_end):
                padding = "VALID"
            else:
                raise Unsupported("Conv3DBackprop*V2 take SAME or VALID padding only, and "
                                  "neither gives these pads")
            kw = dict(strides=strides, padding=padding, dilations=dil, data_format="NDHWC")
            f_bwd, i_bwd = raw.Conv3DBackpropFilterV2, raw.Conv3DBackpropInputV2
        else:
            kw = dict(strides=strides, padding="EXPLICIT", explicit_paddings=pads,
                      dilations=dil, data_format="NHWC")
            f_bwd, i_bwd = raw.Conv2DBackpropFilter, raw.Conv2DBackpropInput
        wt = tf.constant(_c(_oix_to_xio(w)))  # (*K, C/G, O): the grouped filter shape
        if op == "wgrad":
            fs = tf.constant(list(wt.shape), tf.int32)
            return Prepared(
                run=lambda: f_bwd(input=xt, filter_sizes=fs, out_backprop=dyt, **kw),
                to_canonical=lambda res: _xio_to_oix(res.numpy()).reshape(layer.w_shape))
        return Prepared(
            run=lambda: i_bwd(input_sizes=x_shape, filter=wt, out_backprop=dyt, **kw),
            to_canonical=to_x)


# ---------------------------------------------------------------------------------------------
# JAX


_JAX_SPECS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"),
              3: ("NDHWC", "DHWIO", "NDHWC")}


class JaxParty(Party):
    """JAX: ``jax.vjp`` of ``lax.conv_general_dilated`` (feature_group_count) under
    ``jit``, channels-last (NHWC / HWIO)."""

    name = "jax"
    family = "jax"

    def available(self):
        return _missing("jax")

    def prepare(self, layer, op, inputs):
        jax = _import("jax")
        from jax import lax
        dn = _JAX_SPECS[layer.rank]
        pads = list(zip(layer.pads_begin, layer.pads_end))

        def conv(x, w):
            return lax.conv_general_dilated(x, w, layer.strides, pads,
                                            rhs_dilation=layer.dilations,
                                            dimension_numbers=dn,
                                            feature_group_count=layer.groups)

        x = jax.device_put(_c(_ncx_to_nxc(inputs["x"])))
        w = jax.device_put(_c(_oix_to_xio(inputs["w"])))
        dy = jax.device_put(_c(_ncx_to_nxc(inputs["dy"])))
        if op == "wgrad":
            fn = jax.jit(lambda x, w, dy: jax.vjp(lambda w_: conv(x, w_), w)[1](dy)[0])
            return Prepared(run=lambda: fn(x, w, dy).block_until_ready(),
                            to_canonical=lambda r: _xio_to_oix(np.asarray(r)))
        fn = jax.jit(lambda x, w, dy: jax.vjp(lambda x_: conv(x_, w), x)[1](dy)[0])
        return Prepared(run=lambda: fn(x, w, dy).block_until_ready(),
                        to_canonical=lambda r: _nxc_to_ncx(np.asarray(r)))


# ---------------------------------------------------------------------------------------------
# OpenVINO


class OpenVINOParty(Party):
    """OpenVINO CPU plugin, data gradients only: ConvolutionBackpropData (groups 1) or
    GroupConvolutionBackpropData, dy and weights as runtime inputs, f32 precision."""

    name = "openvino"
    family = "openvino"
    ops = ("dgrad",)

    def __init__(self, threads: int = 2):
        self.threads = threads

    def available(self):
        return _missing("openvino")

    def prepare(self, layer, op, inputs):
        if op != "dgrad":
            raise Unsupported("OpenVINO has no weight-gradient op")
        ov = _import("openvino")
        ops = importlib.import_module("openvino.opset13")
        w = inputs["w"]
        if layer.groups > 1:  # [G, C_IN/G, C_OUT/G, *K] with C_IN = O
            w = w.reshape(layer.groups, layer.o // layer.groups, *w.shape[1:])
        dy_p = ops.parameter(list(layer.y_shape), np.float32, name="dy")
        w_p = ops.parameter(list(w.shape), np.float32, name="w")
        attrs = dict(strides=list(layer.strides), pads_begin=list(layer.pads_begin),
                     pads_end=list(layer.pads_end), dilations=list(layer.dilations),
                     auto_pad="explicit", output_padding=list(layer.output_padding()))
        make = (ops.group_convolution_backprop_data if layer.groups > 1
                else ops.convolution_backprop_data)
        node = make(dy_p, w_p, **attrs)
        model = ov.Model([node], [dy_p, w_p], "dgrad")
        core = ov.Core()
        compiled = core.compile_model(model, "CPU", {
            "INFERENCE_NUM_THREADS": self.threads, "INFERENCE_PRECISION_HINT": "f32",
            "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1})
        req = compiled.create_infer_request()
        dy_a, w_a = _c(inputs["dy"]), _c(w)
        req.set_input_tensor(0, ov.Tensor(dy_a, shared_memory=True))
        req.set_input_tensor(1, ov.Tensor(w_a, shared_memory=True))

        def run():
            req.infer()
            return req.get_output_tensor(0)

        return Prepared(run=run, to_canonical=lambda t: np.array(t.data),
                        info={"keep": (dy_a, w_a, compiled)})


# ---------------------------------------------------------------------------------------------
# ONNX Runtime


class OnnxRuntimeParty(Party):
    """ONNX Runtime CPU, data gradients only: a ConvTranspose (opset 17) built with the
    ``onnx`` helper, dy and weights as graph inputs."""

    name = "onnxruntime"
    family = "onnxruntime"
    ops = ("dgrad",)

    def __init__(self, threads: int = 2):
        self.threads = threads

    def available(self):
        return _missing("onnxruntime") or _missing("onnx")

    def prepare(self, layer, op, inputs):
        if op != "dgrad":
            raise Unsupported("ONNX has no weight-gradient op")
        ort = _import("onnxruntime")
        onnx = _import("onnx")
        h = onnx.helper
        f32 = onnx.TensorProto.FLOAT
        node = h.make_node(
            "ConvTranspose", ["dy", "w"], ["dx"], kernel_shape=list(layer.k),
            strides=list(layer.strides), dilations=list(layer.dilations),
            pads=[*layer.pads_begin, *layer.pads_end], group=layer.groups,
            output_padding=list(layer.output_padding()))
        graph = h.make_graph(
            [node], "dgrad",
            [h.make_tensor_value_info("dy", f32, list(layer.y_shape)),
             h.make_tensor_value_info("w", f32, list(layer.w_shape))],
            [h.make_tensor_value_info("dx", f32, list(layer.x_shape))])
        # IR version 8 (opset 17's): onnx may default to a newer IR than this ORT reads.
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        try:
            sess = ort.InferenceSession(model.SerializeToString(), so,
                                        providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT refuses the model: that is its answer
            raise Unsupported(f"{type(exc).__name__}: {exc}") from None
        feeds = {"dy": _c(inputs["dy"]), "w": _c(inputs["w"])}
        return Prepared(run=lambda: sess.run(None, feeds)[0], to_canonical=lambda r: r)


# ---------------------------------------------------------------------------------------------
# Threads and the set of parties


class _EngineMeasure(Party):
    """A pseudo-party: not a convolution but a measure of the machine on the native
    engine's ``threads`` threads, timed in the same rotation as the parties; neither a
    peer nor convgrad, and its result is not checked."""

    is_peer = False
    checked = False

    def __init__(self, threads: int = 2):
        self.threads = threads

    def available(self) -> str | None:
        from ..kernels import native
        return native.available()


class CopyParty(_EngineMeasure):
    """A copy of as many bytes as a memory-bound (depthwise) row must read and write --
    half of them read, half written -- on the engine's threads: what moving those bytes
    takes in the run's state (after the same pause, its buffers idle as long as every
    party's arrays).  Depthwise rows only."""

    name = "copy"
    family = "copy"

    def prepare(self, layer, op, inputs):
        if not layer.depthwise:
            raise Unsupported("the copy is timed on depthwise (memory-bound) rows only")
        from ..kernels import native
        n = layer.io_bytes(op) // 8
        src, dst = np.ones(n, np.float32), np.zeros(n, np.float32)
        threads = self.threads
        return Prepared(run=lambda: native.parallel_copy(dst, src, threads),
                        to_canonical=lambda r: r, info={"inputs": (src,)})


class FmaParty(_EngineMeasure):
    """A dense row's FLOPs as nothing but the engine's FMA loop on the run's threads, in
    one engine section through the least Python a call takes, after the same pause:
    what the machine gives a call of that many FLOPs in the run's state -- the ceiling
    "% peak" (quoted against the back-to-back FMA loop) can reach there, before any data
    is moved.  Dense rows only (groups = 1)."""

    name = "fma"
    family = "fma"

    def prepare(self, layer, op, inputs):
        if layer.groups != 1:
            raise Unsupported("the FMA ceiling is timed on dense rows (groups = 1) only")
        from ..kernels import native
        go, flops = native.fma_runner(layer.flops, self.threads)
        return Prepared(run=go, to_canonical=lambda r: r, info={"flops": flops})


class RoofParty(_EngineMeasure):
    """A dense row's FLOPs as the FMA party's loop while the bytes the op must move
    stream through memory -- its inputs read (wgrad: x and dy; dgrad: dy and w), its
    result written with streaming stores (float32), both spread evenly over the loop --
    in one engine section after the same pause: the roofline ceiling of the row in the
    run's state, FLOPs and bytes at once with no other work.  Dense rows only."""

    name = "roof"
    family = "roof"

    def prepare(self, layer, op, inputs):
        if layer.groups != 1:
            raise Unsupported("the roofline ceiling is timed on dense rows (groups = 1) only")
        from ..kernels import native
        x, y, w = (4 * math.prod(s) for s in (layer.x_shape, layer.y_shape, layer.w_shape))
        read, written = (x + y, w) if op == "wgrad" else (y + w, x)
        go, flops, _ = native.roof_runner(layer.flops, read, written, self.threads)
        return Prepared(run=go, to_canonical=lambda r: r,
                        info={"flops": flops, "read_bytes": read, "written_bytes": written})


def configure_threads(threads: int, families=FAMILIES) -> dict:
    """Set the thread count of every framework of ``families`` to ``threads``;
    returns what was set.

    Start-up settings (XLA flags, TensorFlow's pools) only act before the
    framework is first used, so this is called before any peer is used."""
    done = {}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "jax" not in families:
        pass
    elif "jax" not in sys.modules:
        flags = os.environ.get("XLA_FLAGS", "")
        flags += (f" --xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={threads}")
        os.environ["XLA_FLAGS"] = flags.strip()
        done["XLA_FLAGS"] = os.environ["XLA_FLAGS"]
    else:
        done["XLA_FLAGS"] = "jax imported before configure_threads: default threads"
    try:
        if "torch" not in families:
            raise ImportError
        import torch
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        done["torch"] = torch.get_num_threads()
    except ImportError:
        pass
    try:
        if "tensorflow" not in families:
            raise ImportError
        import tensorflow as tf
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError as exc:  # the context was initialized already
            done["tensorflow_error"] = str(exc)
        done["tensorflow"] = {"intra": tf.config.threading.get_intra_op_parallelism_threads(),
                              "inter": tf.config.threading.get_inter_op_parallelism_threads()}
    except ImportError:
        pass
    if "openvino" in families:
        done["openvino"] = {"INFERENCE_NUM_THREADS": threads}
        # Importing openvino forks a telemetry process: do it before JAX starts its threads.
        with contextlib.suppress(ImportError):
            import openvino  # noqa: F401
    if "onnxruntime" in families:
        done["onnxruntime"] = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    return done


def default_parties(families=None, dtypes=("float32",), threads: int = 2,
                    low_precision_layouts=("NXC", "NCX"),
                    order: str = "interleaved") -> list[Party]:
    """Every party of ``families`` (default all): convgrad in both layouts in float32
    and in ``low_precision_layouts`` for the other ``dtypes``; the peers in float32.
    Both layouts by default: a 16-bit row's ratio is its best time over the best
    float32 time of both layouts, so its numerator is the best of both too (NXC alone
    until 2026-11-27 set an NXC 16-bit time against the NCX float32 kernel where that
    was the faster: ResNet-50 res2's 1x1 weight gradient, float16 NXC 3.72 ms, NCX 3.2,
    float32 NCX 3.1).

    In the order of the run's rotation, convgrad's parties and the peers alternate
    (:func:`interleaved`), so that no party follows one of its own library's: a party
    right after its sibling finds the memory and buffers that sibling has just used warm
    (its allocator's blocks, oneDNN's scratchpad, the engine's scratch), while the first
    of the two finds them idle for the whole rotation.  On a host that makes idle memory
    slow to touch again that decided the per-layout columns: in every repetition of a
    2026-11-26 run, ResNet-50 res2's data gradient took convgrad NXC 52 ms and NCX (right
    after it) 28, PyTorch contiguous 45 and channels-last (right after it) 19.
    ``order="grouped"``: each library's parties together (convgrad's, then the peers'),
    the order of the runs before 2026-11-27."""
    fams = FAMILIES if families is None else tuple(families)
    unknown = set(fams) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown parties {sorted(unknown)}; known: {', '.join(FAMILIES)}")
    ours: list[Party] = []
    if "convgrad" in fams:
        for dt in dtypes:
            layouts = ("NXC", "NCX") if dt == "float32" else low_precision_layouts
            ours += [ConvgradParty(lay, dt) for lay in layouts]
    out: list[Party] = []
    if "torch" in fams:
        out += [TorchParty(False), TorchParty(True)]
    if "tensorflow" in fams:
        out.append(TensorFlowParty())
    if "jax" in fams:
        out.append(JaxParty())
    if "openvino" in fams:
        out.append(OpenVINOParty(threads))
    if "onnxruntime" in fams:
        out.append(OnnxRuntimeParty(threads))
    if order not in ("interleaved", "grouped"):
        raise ValueError(f"order must be 'interleaved' or 'grouped', got {order!r}")
    out = interleaved(ours, out) if order == "interleaved" else ours + out
    if "copy" in fams:
        out.append(CopyParty(threads))
    if "fma" in fams:
        out.append(FmaParty(threads))
    if "roof" in fams:
        out.append(RoofParty(threads))
    return out


def interleaved(ours: list[Party], peers: list[Party]) -> list[Party]:
    """convgrad's parties and the peers in turn (ours[0], peers[0], ours[1], ...), the
    longer list's rest at the end."""
    out: list[Party] = []
    for k in range(max(len(ours), len(peers))):
        out += ours[k:k + 1] + peers[k:k + 1]
    return out
