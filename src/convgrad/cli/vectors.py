"""``convgrad vectors``: conformance test vectors for every spec op.

For people who test their own kernels against the specs.  Each case is one
``.npz`` (every input under its spec name -- tensors as arrays, shape inputs
as int64 arrays -- and ``expected``) and one entry of ``manifest.json`` (op,
attributes, inputs in spec order, output shape, corner).  Expected outputs are
computed by convgrad's float64 reference kernel (``config(algo="reference")``).

Cases cycle through the corners (:data:`CORNERS`): explicit asymmetric pads,
stride 2, dilation 2, groups, depthwise, odd same_upper / same_lower padding,
valid, output_padding -- as far as each op has them.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, replace

import numpy as np

import convgrad

from ..errors import ConvGradError
from ..layouts import CONV_WEIGHTS, CONVT_WEIGHTS, OV_GROUP_WEIGHTS, OV_WEIGHTS

CORNERS = ("explicit", "stride2_asymmetric", "dilation2", "groups", "depthwise",
           "same_upper_odd", "same_lower_odd", "valid", "output_padding")
DTYPES = ("float32", "float64", "float16", "bfloat16")


@dataclass(frozen=True)
class Case:
    """A forward-convolution geometry in canonical terms (NCX, OIX)."""

    corner: str
    n: int
    c: int
    o: int
    groups: int
    in_sizes: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    auto_pad: str                      # explicit, same_upper, same_lower, valid
    output_padding: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.in_sizes)

    @property
    def x_shape(self):
        return (self.n, self.c, *self.in_sizes)

    @property
    def w_shape(self):
        return (self.o, self.c // self.groups, *self.kernel)


def make_case(rng: np.random.Generator, corner: str, rank: int) -> Case:
    r = rank

    def tup(lo, hi):
        return tuple(int(v) for v in rng.integers(lo, hi + 1, size=r))

    groups = 1
    cg, og = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    if corner == "groups":
        groups = int(rng.integers(2, 4))
    if corner == "depthwise":
        groups, cg = int(rng.integers(2, 5)), 1
    sizes = tup(5, 9) if r < 3 else tup(4, 6)
    kernel, strides, dil = tup(1, 3), (1,) * r, (1,) * r
    pb, pe = tup(0, 1), tup(0, 1)
    auto_pad, op = "explicit", (0,) * r
    if corner == "stride2_asymmetric":
        strides, pb, pe = (2,) * r, tup(0, 2), tup(0, 2)
        pe = tuple(b + 1 if b == e else e for b, e in zip(pb, pe))      # asymmetric
    elif corner == "dilation2":
        dil, strides, kernel = (2,) * r, tup(1, 2), tup(2, 3)
    elif corner in ("same_upper_odd", "same_lower_odd"):
        # stride 2, kernel 3, even size: the total pad is 1, odd.
        auto_pad = corner[:-4]
        strides, kernel = (2,) * r, (3,) * r
        sizes = tuple(v + v % 2 for v in sizes)
        pb = pe = (0,) * r
    elif corner == "valid":
        auto_pad, pb, pe, strides = "valid", (0,) * r, (0,) * r, tup(1, 2)
    elif corner == "output_padding":
        strides, kernel = (2,) * r, tup(2, 3)
        op = tuple(int(v) for v in rng.integers(0, 2, size=r))
        op = op if any(op) else (1,) + op[1:]
    # Keep the forward output non-empty.
    sizes = tuple(max(v, (k - 1) * d + 1) for v, k, d in zip(sizes, kernel, dil))
    return Case(corner, int(rng.integers(1, 3)), cg * groups, og * groups, groups, sizes,
                kernel, strides, dil, pb, pe, auto_pad, op)


# ---------------------------------------------------------------------------
# Per-dialect builders: a Case -> (inputs in spec order, attributes)
# ---------------------------------------------------------------------------


def _nxc(shape):
    return (shape[0], *shape[2:], shape[1])


def _onednn_conv_attrs(case: Case, fmt_key: str, fmt: str, data_format: str) -> dict:
    a = dict(strides=list(case.strides), dilations=list(case.dilations),
             pads_begin=list(case.pads_begin), pads_end=list(case.pads_end),
             auto_pad={"explicit": "None", "valid": "VALID", "same_upper": "SAME_UPPER",
                       "same_lower": "SAME_LOWER"}[case.auto_pad],
             groups=case.groups, data_format=data_format)
    a[fmt_key] = fmt
    return a


def _onednn(name: str, case: Case, rng) -> tuple[list, dict]:
    data_format = "NXC" if rng.integers(2) else "NCX"
    dshape = _nxc if data_format == "NXC" else (lambda s: tuple(s))
    if name.startswith("ConvTranspose"):
        # The ConvTranspose maps a dy-like src (channels I = case.o) to an x-like
        # output (channels O = case.c); its canonical weights are the case's OIX.
        fmt_key = "filter_format" if name == "ConvTransposeBackpropFilters" else "weights_format"
        fmt = str(rng.choice(list(CONVT_WEIGHTS)))
        a = _onednn_conv_attrs(case, fmt_key, fmt, data_format)
        if case.auto_pad == "explicit" and case.corner == "output_padding":
            a["output_padding"] = [min(p, max(s, d) - 1) for p, s, d in
                                   zip(case.output_padding, case.strides, case.dilations)]
        src = dshape((case.n, case.o, *case.in_sizes))
        w = CONVT_WEIGHTS[fmt].spec_shape(case.w_shape, case.groups)
        fwd = {k: v for k, v in a.items() if k != fmt_key} | {"weights_format": fmt}
        dst = convgrad.op("ConvTranspose", **fwd).infer_shape(src, w)
        ins = {"ConvTranspose": [("src", src), ("weights", w)],
               "ConvTransposeBackwardData": [("diff_dst", dst), ("weights", w)],
               "ConvTransposeBackwardWeights": [("src", src), ("diff_dst", dst),
                                                ("weights_shape", list(w))],
               "ConvTransposeBackpropFilters": [("input", src), ("output_delta", dst),
                                                ("filter_shape", list(w))]}[name]
        return ins, a
    fmt_key = "filter_format" if name == "ConvolutionBackpropFilters" else "weights_format"
    fmt = str(rng.choice(list(CONV_WEIGHTS)))
    a = _onednn_conv_attrs(case, fmt_key, fmt, data_format)
    x = dshape(case.x_shape)
    w = CONV_WEIGHTS[fmt].spec_shape(case.w_shape, case.groups)
    fwd = {k: v for k, v in a.items() if k != fmt_key} | {"weights_format": fmt}
    y = convgrad.op("onednn:Convolution", **fwd).infer_shape(x, w)
    ins = {"Convolution": [("src", x), ("weights", w)],
           "ConvolutionBackwardWeights": [("src", x), ("diff_dst", y),
                                          ("weights_shape", list(w))],
           "ConvolutionBackpropFilters": [("input", x), ("filters_shape", list(w)),
                                          ("output_delta", y)],
           "ConvolutionBackwardData": [("diff_dst", y), ("weights", w),
                                       ("dst_shape", list(x))]}[name]
    return ins, a


def _openvino(name: str, case: Case, rng) -> tuple[list, dict]:
    grouped = name.startswith("Group")
    if not grouped and case.groups > 1:
        case = replace(case, c=case.c // case.groups, o=case.o // case.groups, groups=1)
    a = dict(strides=list(case.strides), dilations=list(case.dilations),
             pads_begin=list(case.pads_begin), pads_end=list(case.pads_end),
             auto_pad=case.auto_pad)
    wl = OV_GROUP_WEIGHTS if grouped else OV_WEIGHTS
    if name in ("Convolution", "GroupConvolution"):
        return [("data", case.x_shape), ("filter", wl.spec_shape(case.w_shape, case.groups))], a
    # Backprop: data is dy-like (channels = case.o), the result x-like.
    data = (case.n, case.o, *case.in_sizes)
    filt = wl.spec_shape(case.w_shape, case.groups)
    ins = [("data", data), ("filter", filt)]
    if case.corner == "output_padding":
        a["output_padding"] = list(case.output_padding)
    if case.auto_pad.startswith("same"):
        # With output_shape the runtime splits an odd total pad (here Ke - s = 1).
        ins.append(("output_shape", [s * v for s, v in zip(case.strides, case.in_sizes)]))
    return ins, a


_TF_RANK = {"Conv2DBackpropFilter": 2, "Conv2DBackpropInput": 2, "Conv3DBackpropFilterV2": 3,
            "Conv3DBackpropInputV2": 3, "DepthwiseConv2dNativeBackpropFilter": 2,
            "DepthwiseConv2dNativeBackpropInput": 2, "conv1d_transpose": 1,
            "conv2d_transpose": 2}


def _tf(name: str, case: Case, rng) -> tuple[list, dict]:
    depthwise = name.startswith("Depthwise")
    if depthwise and case.c // case.groups != 1:
        m = case.o // case.groups
        case = replace(case, groups=case.c, o=case.c * m)
    if not depthwise and name.endswith("transpose") and case.groups > 1:
        case = replace(case, c=case.c // case.groups, o=case.o // case.groups, groups=1)
    mode = {"same_lower": "same_upper"}.get(case.auto_pad, case.auto_pad)
    if name.endswith("transpose") and mode == "explicit":
        mode = "valid"
    padding = {"same_upper": "SAME", "valid": "VALID", "explicit": "EXPLICIT"}[mode]
    # strides and dilations as TensorFlow writes them: one per dim of NHWC-style data
    a = dict(strides=[1, *case.strides, 1], dilations=[1, *case.dilations, 1], padding=padding)
    if padding == "EXPLICIT":
        pairs = [0, 0]
        for b, e in zip(case.pads_begin, case.pads_end):
            pairs += [b, e]
        a["explicit_paddings"] = pairs + [0, 0]
    x = _nxc(case.x_shape)
    xio = CONV_WEIGHTS["XIO"].spec_shape(case.w_shape, case.groups)
    fwd = dict(strides=list(case.strides), dilations=list(case.dilations),
               pads_begin=list(case.pads_begin) if mode == "explicit" else None,
               pads_end=list(case.pads_end) if mode == "explicit" else None,
               auto_pad={"explicit": "None", "valid": "VALID", "same_upper": "SAME_UPPER"}[mode],
               groups=case.groups, data_format="NXC", weights_format="XIO")
    y = convgrad.op("onednn:Convolution", **fwd).infer_shape(x, xio)
    if depthwise:
        w = (*case.kernel, case.c, case.o // case.c)             # [H, W, C, M]
    else:
        w = xio                                                  # [H, W, C/G, O]
    if name.endswith("transpose"):
        return [("input", y), ("filters", w), ("output_shape", list(x))], a
    if "BackpropFilter" in name:
        return [("input", x), ("filter_sizes", list(w)), ("out_backprop", y)], a
    return [("input_sizes", list(x)), ("filter", w), ("out_backprop", y)], a


def _entry(name: str):
    from ..registry import _public_names
    table = _public_names()
    if name not in table:
        raise ConvGradError(f"--op = {name!r}: unknown op; valid names: "
                            f"{', '.join(sorted(table))}")
    return table[name]


def build(name: str, index: int, rng, dtype: np.dtype) -> dict:
    """One case: {"corner", "attrs", "inputs": [(name, array or list)], "expected"}."""
    entry = _entry(name)
    corners = list(CORNERS)
    if entry.dialect == "tf":
        rank = _TF_RANK[entry.name]
        if entry.name.startswith("Depthwise"):
            corners = [c for c in corners if c not in ("groups", "output_padding")]
        if entry.name.endswith("transpose"):
            corners = [c for c in corners if c not in ("groups", "depthwise", "output_padding")]
    else:
        rank = (2, 1, 3, 2)[index % 4]
        if entry.dialect == "openvino" and not entry.name.startswith("Group"):
            corners = [c for c in corners if c not in ("groups", "depthwise")]
    corner = corners[index % len(corners)]
    case = make_case(rng, corner, rank)
    builder = {"onednn": _onednn, "openvino": _openvino, "tf": _tf}[entry.dialect]
    ins, attrs = builder(entry.name, case, rng)
    values = []
    for iname, v in ins:
        if iname in entry.tensors:
            values.append((iname, rng.standard_normal(v).astype(dtype)))
        else:
            values.append((iname, [int(t) for t in v]))
    with convgrad.config(algo="reference"):
        expected = convgrad.op(name, **attrs)(*[v for _, v in values])
    return {"corner": corner, "attrs": attrs, "inputs": values, "expected": expected}


def all_ops() -> list[str]:
    """Every op once: bare names, qualified only where two dialects share one."""
    names = convgrad.op_names()
    bare = {n for n in names if ":" not in n}
    return [n for n in names if ":" not in n or n.split(":", 1)[1] not in bare]


def np_dtype(name: str) -> np.dtype:
    if name not in DTYPES:
        raise ConvGradError(f"--dtype = {name!r}: must be one of {', '.join(DTYPES)}")
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def write(name: str, count: int, out_dir, seed: int = 0, dtype: str = "float32") -> dict:
    """Write ``count`` cases of op ``name`` into ``out_dir`` and update
    ``out_dir/manifest.json``; returns this op's manifest entry."""
    _entry(name)
    dt = np_dtype(dtype)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, sum(map(ord, name))])
    cases = []
    stem = name.replace(":", "_")
    for i in range(count):
        c = build(name, i, rng, dt)
        fname = f"{stem}_{i:04d}.npz"
        arrays = {}
        for iname, v in c["inputs"]:
            arrays[iname] = v if isinstance(v, np.ndarray) else np.asarray(v, np.int64)
        arrays["expected"] = c["expected"]
        if dt.name == "bfloat16":      # .npz cannot name bfloat16: store the bits, say so
            arrays = {k: (a.view(np.uint16) if a.dtype == dt else a) for k, a in arrays.items()}
        np.savez(out_dir / fname, **arrays)
        cases.append({
            "file": fname, "corner": c["corner"], "attributes": c["attrs"],
            "inputs": [{"name": iname, "kind": "tensor", "shape": list(v.shape),
                        "dtype": str(v.dtype)} if isinstance(v, np.ndarray)
                       else {"name": iname, "kind": "shape", "value": v}
                       for iname, v in c["inputs"]],
            "output_shape": list(c["expected"].shape)})
    manifest_path = out_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    manifest.setdefault("generator", f"convgrad {convgrad.__version__} vectors")
    manifest.setdefault("expected", "convgrad's float64 reference kernel, cast to dtype")
    manifest.setdefault("bfloat16", "stored as uint16 bit patterns")
    manifest.setdefault("ops", {})
    entry = {"seed": seed, "dtype": dtype, "count": count, "cases": cases}
    manifest["ops"][name] = entry
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return entry
