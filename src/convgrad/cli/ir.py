"""OpenVINO IR (``.xml`` + ``.bin``): read, infer shapes, execute.

Reads whole models (``<net>`` with ``<layers>`` and ``<edges>``) and bare
``<layer>`` fragments (as on the spec pages).  XML is parsed with defusedxml:
IR files are untrusted input (no DTDs, no entity expansion).  Shapes are
inferred with convgrad's own shape inference (``convgrad.op(...).infer_shape``)
and every size is checked against limits *before* anything is allocated.

Executable layer types: Parameter, Const, Convolution, GroupConvolution,
ConvolutionBackpropData, GroupConvolutionBackpropData and Result.
"""

from __future__ import annotations

import math
import pathlib
import re
from dataclasses import dataclass, field

import numpy as np

import convgrad

from ..errors import ConvGradError

CONV_TYPES = ("Convolution", "GroupConvolution", "ConvolutionBackpropData",
              "GroupConvolutionBackpropData")
RUN_TYPES = ("Parameter", "Const", "Result") + CONV_TYPES
CONV_ATTRS = ("strides", "dilations", "pads_begin", "pads_end", "output_padding")

MAX_XML_BYTES = 64 * 2**20
MAX_LAYERS = 10_000
MAX_RANK = 8
# Default bound on the elements of any one tensor (2**28 float32 = 1 GiB).
MAX_ELEMENTS = 2**28

ELEMENT_TYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16",
                 "i8": "int8", "u8": "uint8", "i16": "int16", "u16": "uint16",
                 "i32": "int32", "u32": "uint32", "i64": "int64", "u64": "uint64"}


class IRError(ConvGradError):
    """A malformed, unsupported or too large IR file."""


@dataclass
class Port:
    id: int
    dims: tuple[int, ...] | None         # None: dynamic
    precision: str = ""


@dataclass
class Layer:
    id: str
    name: str
    type: str
    version: str
    data: dict[str, str]
    inputs: list[Port]
    outputs: list[Port]

    @property
    def label(self) -> str:
        return f"layer {self.id} {self.name!r} ({self.type})"


@dataclass
class Model:
    path: pathlib.Path
    layers: dict[str, Layer]
    edges: list[tuple[str, int, str, int]] = field(default_factory=list)
    is_net: bool = True
    _sources: dict | None = field(default=None, repr=False)

    def producer(self, layer: Layer, port: Port) -> tuple[Layer, int] | None:
        """The (layer, output port) feeding ``port`` of ``layer``, if connected."""
        if self._sources is None:
            self._sources = {(tl, tp): (fl, fp) for fl, fp, tl, tp in self.edges}
        src = self._sources.get((layer.id, port.id))
        return None if src is None else (self.layers[src[0]], src[1])


def element_dtype(where: str, name: str) -> np.dtype:
    key = name.strip().lower()
    if key not in ELEMENT_TYPES:
        raise IRError(f"{where}: element_type = {name!r}: unsupported; supported: "
                      f"{', '.join(ELEMENT_TYPES)}")
    if key == "bf16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(ELEMENT_TYPES[key])


def ints(where: str, attr: str, text: str) -> list[int]:
    """An IR integer list attribute ("2,2", "1", "")."""
    text = text.strip()
    if not text:
        return []
    out = []
    for item in text.split(","):
        item = item.strip()
        if not re.fullmatch(r"-?\d{1,19}", item):
            raise IRError(f"{where}: {attr} = {text!r}: must be comma-separated integers")
        out.append(int(item))
    return out


def _parse_xml(path: pathlib.Path):
    from defusedxml import ElementTree as ET
    from defusedxml import DefusedXmlException

    if not path.is_file():
        raise IRError(f"{path}: no such file")
    size = path.stat().st_size
    if size > MAX_XML_BYTES:
        raise IRError(f"{path}: {size} bytes; IR files above {MAX_XML_BYTES} bytes are refused")
    text = path.read_text(encoding="utf-8", errors="replace")
    if re.search(r"<!(DOCTYPE|ENTITY)", text, re.I):
        raise IRError(f"{path}: refused: a DTD or entity declaration (IR files have none)")
    body = re.sub(r"^\s*<\?xml[^>]*\?>", "", text)
    try:
        if re.match(r"\s*<net[\s>]", body):
            return ET.fromstring(body), True
        # Bare <layer> fragments (one or several): wrap them in a root element.
        return ET.fromstring(f"<fragment>{body}</fragment>"), False
    except DefusedXmlException as e:
        raise IRError(f"{path}: refused: {type(e).__name__} (DTDs and entities are not "
                      "allowed in IR files)") from None
    except ET.ParseError as e:
        raise IRError(f"{path}: not well-formed XML: {e}") from None


def _port(where: str, el) -> Port:
    try:
        pid = int(el.get("id", ""))
    except ValueError:
        raise IRError(f"{where}: port id = {el.get('id')!r}: must be an integer") from None
    dims = []
    for d in el.findall("dim"):
        t = (d.text or "").strip()
        if not re.fullmatch(r"\d{1,19}", t):
            if re.fullmatch(r"-1|\?|-?\d+\.\.-?\d+", t):
                return Port(pid, None, el.get("precision", ""))
            raise IRError(f"{where}: port {pid} dim = {t!r}: must be a non-negative integer")
        dims.append(int(t))
    if len(dims) > MAX_RANK:
        raise IRError(f"{where}: port {pid} has rank {len(dims)}; at most {MAX_RANK}")
    return Port(pid, tuple(dims), el.get("precision", ""))


def load(path) -> Model:
    """Parse an IR file (whole ``<net>`` or bare ``<layer>`` elements)."""
    path = pathlib.Path(path)
    root, is_net = _parse_xml(path)
    layer_els = root.findall("./layers/layer") if is_net else root.findall("layer")
    if not layer_els:
        raise IRError(f"{path}: no <layer> element found")
    if len(layer_els) > MAX_LAYERS:
        raise IRError(f"{path}: {len(layer_els)} layers; at most {MAX_LAYERS}")
    layers: dict[str, Layer] = {}
    for i, el in enumerate(layer_els):
        lid = el.get("id", str(i))
        where = f"layer {lid} {el.get('name', '')!r}"
        data_el = el.find("data")
        data = dict(data_el.attrib) if data_el is not None else {}
        ins = [_port(where, p) for p in el.findall("./input/port")]
        outs = [_port(where, p) for p in el.findall("./output/port")]
        if is_net and lid in layers:
            raise IRError(f"{path}: duplicate layer id {lid}")
        layers[lid if is_net else str(i)] = Layer(lid, el.get("name", ""), el.get("type", ""),
                                                  el.get("version", ""), data, ins, outs)
    edges = []
    for e in (root.findall("./edges/edge") if is_net else []):
        try:
            edge = (e.get("from-layer"), int(e.get("from-port")), e.get("to-layer"),
                    int(e.get("to-port")))
        except (TypeError, ValueError):
            raise IRError(f"{path}: malformed edge {dict(e.attrib)}") from None
        if edge[0] not in layers or edge[2] not in layers:
            raise IRError(f"{path}: edge {dict(e.attrib)} names a layer that does not exist")
        edges.append(edge)
    return Model(path, layers, edges, is_net)


def conv_op(layer: Layer):
    """``convgrad.op`` for a convolution-family layer, IR attributes mapped."""
    where = layer.label
    attrs: dict = {}
    for key in CONV_ATTRS:
        if key in layer.data:
            attrs[key] = ints(where, key, layer.data[key])
    if "auto_pad" in layer.data:
        attrs["auto_pad"] = layer.data["auto_pad"]
    if "strides" not in attrs:
        raise IRError(f"{where}: the strides attribute is required")
    return convgrad.op(f"openvino:{layer.type}", **attrs)


# ---------------------------------------------------------------------------
# Weights file
# ---------------------------------------------------------------------------


class Weights:
    """The ``.bin`` next to the ``.xml``, memory-mapped (read only)."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.size = path.stat().st_size if path.is_file() else None
        self._map = None

    def read(self, layer: Layer, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        where = layer.label
        if self.size is None:
            raise IRError(f"{where}: needs the weights file {self.path}, which does not exist")
        offset = ints(where, "offset", layer.data.get("offset", ""))
        size = ints(where, "size", layer.data.get("size", ""))
        if len(offset) != 1 or len(size) != 1 or offset[0] < 0 or size[0] < 0:
            raise IRError(f"{where}: Const needs non-negative offset and size attributes")
        offset, size = offset[0], size[0]
        want = math.prod(shape) * dtype.itemsize
        if size != want:
            raise IRError(f"{where}: size = {size} bytes, but shape {list(shape)} of "
                          f"{dtype.name} needs {want}")
        if offset + size > self.size:
            raise IRError(f"{where}: bytes [{offset}, {offset + size}) lie past the end of "
                          f"{self.path} ({self.size} bytes)")
        if size == 0:
            return np.zeros(shape, dtype)
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._map[offset:offset + size].view(dtype).reshape(shape)


# ---------------------------------------------------------------------------
# Shape inference of the convolution layers (``convgrad infer``)
# ---------------------------------------------------------------------------


@dataclass
class InferRow:
    layer: Layer
    inputs: list[tuple[int, ...] | None]
    declared: tuple[int, ...] | None
    inferred: tuple[int, ...] | None
    status: str           # "ok", "MISMATCH", "ERROR", "skipped"
    note: str = ""


def _const_values(model: Model, layer: Layer, port: Port, weights: Weights | None):
    """The value of a shape input fed by a Const, or None when unknown."""
    src = model.producer(layer, port) if model.is_net else None
    if src is None or src[0].type != "Const" or weights is None:
        return None
    const = src[0]
    dtype = element_dtype(const.label, const.data.get("element_type", ""))
    shape = tuple(ints(const.label, "shape", const.data.get("shape", "")))
    if len(shape) > 1 or math.prod(shape) > MAX_RANK:
        raise IRError(f"{const.label}: a shape input must be 1-D with at most {MAX_RANK} values")
    return [int(v) for v in weights.read(const, dtype, shape)]


def infer(model: Model) -> list[InferRow]:
    """Infer every convolution-family layer's output shape from its input
    ports and attributes, and compare with its ``<output>`` port."""
    weights = Weights(model.path.with_suffix(".bin")) if model.is_net else None
    rows = []
    for layer in model.layers.values():
        if layer.type not in CONV_TYPES:
            continue
        shapes = [p.dims for p in layer.inputs]
        declared = layer.outputs[0].dims if layer.outputs else None
        try:
            if len(shapes) < 2:
                raise IRError(f"{layer.label}: needs 2 or 3 input ports, has {len(shapes)}")
            if shapes[0] is None or shapes[1] is None:
                rows.append(InferRow(layer, shapes, declared, None, "skipped", "dynamic input"))
                continue
            args = [shapes[0], shapes[1]]
            if len(shapes) > 2:
                value = _const_values(model, layer, layer.inputs[2], weights)
                if value is None:
                    rows.append(InferRow(layer, shapes, declared, None, "skipped",
                                         "output_shape input has no known value"))
                    continue
                args.append(value)
            inferred = tuple(conv_op(layer).infer_shape(*args))
        except ConvGradError as e:
            rows.append(InferRow(layer, shapes, declared, None, "ERROR", str(e)))
            continue
        if declared is None:
            rows.append(InferRow(layer, shapes, declared, inferred, "skipped",
                                 "no static <output> port"))
        else:
            rows.append(InferRow(layer, shapes, declared, inferred,
                                 "ok" if inferred == declared else "MISMATCH"))
    return rows


# ---------------------------------------------------------------------------
# Execution (``convgrad run``)
# ---------------------------------------------------------------------------


def _order(model: Model) -> list[Layer]:
    """Layers in an order where producers come first (Kahn)."""
    deps = {lid: set() for lid in model.layers}
    for fl, _, tl, _ in model.edges:
        deps[tl].add(fl)
    done, order = set(), []
    ready = [lid for lid, d in deps.items() if not d]
    users: dict[str, list[str]] = {}
    for fl, _, tl, _ in model.edges:
        users.setdefault(fl, []).append(tl)
    while ready:
        lid = ready.pop(0)
        if lid in done:
            continue
        done.add(lid)
        order.append(model.layers[lid])
        for u in users.get(lid, []):
            if u not in done and deps[u] <= done:
                ready.append(u)
    if len(order) != len(model.layers):
        raise IRError(f"{model.path}: the graph has a cycle")
    return order


def _check_elements(where: str, shape, limit: int) -> None:
    n = math.prod(shape)
    if n > limit:
        raise IRError(f"{where}: shape {list(shape)} has {n} elements; the limit is {limit} "
                      "(--max-elements)")


def plan(model: Model, limit: int = MAX_ELEMENTS) -> tuple[list[Layer], dict]:
    """Check the whole model without allocating: supported layers, connected
    inputs, every shape inferred and within ``limit`` elements, and equal to
    the declared output ports.  Returns the execution order and the shapes."""
    if not model.is_net:
        raise IRError(f"{model.path}: a bare <layer> fragment cannot be run; `convgrad infer` "
                      "checks its shapes")
    for layer in model.layers.values():
        if layer.type not in RUN_TYPES:
            raise IRError(f"{layer.label}: layer type {layer.type!r} is not supported by "
                          f"`convgrad run` (supported: {', '.join(RUN_TYPES)})")
    order = _order(model)
    weights = Weights(model.path.with_suffix(".bin"))
    shapes: dict[tuple[str, int], tuple[int, ...]] = {}
    for layer in order:
        where = layer.label
        ins = []
        for port in layer.inputs:
            src = model.producer(layer, port)
            if src is None:
                raise IRError(f"{where}: input port {port.id} is not connected")
            ins.append(shapes[(src[0].id, src[1])])
        if layer.type in ("Parameter", "Const"):
            text = layer.data.get("shape", "")
            if re.search(r"\?|-1|\.\.", text):
                raise IRError(f"{where}: shape = {text!r} is dynamic; `convgrad run` needs "
                              "static shapes")
            shape = tuple(ints(where, "shape", text))
            if any(v < 0 for v in shape) or len(shape) > MAX_RANK:
                raise IRError(f"{where}: shape = {list(shape)}: must be static, non-negative, "
                              f"rank <= {MAX_RANK}")
            element_dtype(where, layer.data.get("element_type", ""))
        elif layer.type == "Result":
            if len(ins) != 1:
                raise IRError(f"{where}: a Result has exactly one input")
            continue
        else:
            if len(ins) not in (2, 3):
                raise IRError(f"{where}: needs 2 or 3 inputs, has {len(ins)}")
            args = list(ins[:2])
            if len(ins) == 3:
                value = _const_values(model, layer, layer.inputs[2], weights)
                if value is None:
                    raise IRError(f"{where}: the output_shape input must come from a Const")
                args.append(value)
            shape = tuple(conv_op(layer).infer_shape(*args))
        _check_elements(where, shape, limit)
        if not layer.outputs:
            raise IRError(f"{where}: has no <output> port")
        declared = layer.outputs[0].dims
        if declared is not None and declared != shape:
            raise IRError(f"{where}: output port says {list(declared)}, but the inputs and "
                          f"attributes give {list(shape)}")
        shapes[(layer.id, layer.outputs[0].id)] = shape
    return order, shapes


def run(model: Model, given: dict[str, np.ndarray] | None = None, seed: int = 0,
        limit: int = MAX_ELEMENTS) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Execute the model.  Returns ``(inputs used, outputs)`` keyed by the
    Parameter and Result layer names."""
    order, shapes = plan(model, limit)
    given = dict(given or {})
    params = {lay.name for lay in order if lay.type == "Parameter"}
    extra = set(given) - params
    if extra:
        raise IRError(f"--inputs: {sorted(extra)} are not Parameters of the model "
                      f"(Parameters: {sorted(params)})")
    weights = Weights(model.path.with_suffix(".bin"))
    rng = np.random.default_rng(seed)
    values: dict[tuple[str, int], np.ndarray] = {}
    used, results = {}, {}
    for layer in order:
        where = layer.label
        key = (layer.id, layer.outputs[0].id) if layer.outputs else None
        ins = [values[(src[0].id, src[1])]
               for src in (model.producer(layer, p) for p in layer.inputs)]
        if layer.type == "Parameter":
            dtype = element_dtype(where, layer.data["element_type"])
            shape = shapes[key]
            if layer.name in given:
                a = np.asarray(given[layer.name])
                if a.shape != shape:
                    raise IRError(f"--inputs: {layer.name!r} has shape {list(a.shape)}; the "
                                  f"Parameter is {list(shape)}")
                if a.dtype != dtype:
                    if not np.can_cast(a.dtype, dtype, "same_kind"):
                        raise IRError(f"--inputs: {layer.name!r} is {a.dtype}; the Parameter "
                                      f"is {dtype.name}")
                    a = a.astype(dtype)
            elif dtype.kind in "iu":
                a = rng.integers(-4 if dtype.kind == "i" else 0, 5, size=shape).astype(dtype)
            else:
                a = rng.standard_normal(shape).astype(dtype)
            used[layer.name] = a
            values[key] = a
        elif layer.type == "Const":
            dtype = element_dtype(where, layer.data["element_type"])
            values[key] = weights.read(layer, dtype, shapes[key])
        elif layer.type == "Result":
            results[layer.name] = ins[0]
        else:
            args = ins[:2]
            if len(ins) == 3:
                args.append([int(v) for v in ins[2]])
            values[key] = conv_op(layer)(*args)
    return used, results
