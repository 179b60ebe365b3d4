"""`convgrad vectors`: written through the real entry point, reloaded, and
checked against PyTorch's autograd (an independent computation, with pads and
layouts worked out here from the specs' rules, not by convgrad)."""

import json
import math

import numpy as np
import pytest

import convgrad
from convgrad.cli.vectors import CORNERS, all_ops
from clitools import cli
from conftest import import_peer


@pytest.fixture(scope="module")
def vectors(tmp_path_factory):
    out = tmp_path_factory.mktemp("vectors")
    r = cli("vectors", "--op", "all", "--count", "9", "--out", out, "--seed", "7",
            "--dtype", "float64")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    return out, manifest


def load(out, case):
    with np.load(out / case["file"]) as f:
        return {k: f[k] for k in f.files}


def args_of(case, arrays):
    return [arrays[i["name"]] if i["kind"] == "tensor" else list(i["value"])
            for i in case["inputs"]]


def test_every_op_and_every_corner(vectors):
    out, manifest = vectors
    assert sorted(manifest["ops"]) == sorted(all_ops())
    assert set(convgrad.op_names()) <= set(all_ops()) | {
        f"{d}:{n}" for d in ("onednn", "openvino", "tf") for n in all_ops()}
    seen = {c["corner"] for e in manifest["ops"].values() for c in e["cases"]}
    assert seen == set(CORNERS)
    gcbd = manifest["ops"]["GroupConvolutionBackpropData"]["cases"]
    assert any("output_padding" in c["attributes"] for c in gcbd)
    assert any(any(i["name"] == "output_shape" for i in c["inputs"]) for c in gcbd)
    ct = manifest["ops"]["ConvTransposeBackpropFilters"]["cases"]
    assert any(c["attributes"]["auto_pad"] == "SAME_LOWER" for c in ct)
    assert any(c["attributes"]["groups"] > 1 for c in ct)


def test_reload_and_recompute(vectors):
    """Files and manifest are complete: every case recomputes (default kernel)."""
    out, manifest = vectors
    n = 0
    for name, entry in manifest["ops"].items():
        for case in entry["cases"]:
            arrays = load(out, case)
            assert set(arrays) == {i["name"] for i in case["inputs"]} | {"expected"}
            for i in case["inputs"]:
                if i["kind"] == "tensor":
                    assert list(arrays[i["name"]].shape) == i["shape"]
            got = convgrad.op(name, **case["attributes"])(*args_of(case, arrays))
            assert list(got.shape) == case["output_shape"]
            np.testing.assert_allclose(got, arrays["expected"], rtol=1e-9, atol=1e-9)
            n += 1
    assert n == 9 * len(manifest["ops"])


def test_float32_and_bfloat16_files(tmp_path):
    r = cli("vectors", "--op", "ConvolutionBackwardWeights", "--count", "3", "--out", tmp_path,
            "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "manifest.json").read_text())
    case = m["ops"]["ConvolutionBackwardWeights"]["cases"][0]
    arrays = load(tmp_path, case)
    assert arrays["expected"].dtype == np.uint16 and m["bfloat16"].startswith("stored as uint16")
    r = cli("vectors", "--op", "NoSuchOp", "--count", "1", "--out", tmp_path)
    assert r.returncode == 2 and "unknown op" in r.stderr
    r = cli("vectors", "--op", "ConvTranspose", "--count", "1", "--out", tmp_path,
            "--dtype", "int4")
    assert r.returncode == 2 and "--dtype = 'int4'" in r.stderr


# ---------------------------------------------------------------------------
# The torch oracle
# ---------------------------------------------------------------------------


def same_pads(mode, sizes, kernel, strides, dilations, transposed=False):
    """Per-axis (begin, end) for same_upper / same_lower (SAME = same_upper)."""
    pb, pe = [], []
    for L, k, s, d in zip(sizes, kernel, strides, dilations):
        ke = (k - 1) * d + 1
        total = max(ke - s, 0) if transposed else max((math.ceil(L / s) - 1) * s + ke - L, 0)
        small, big = total // 2, total - total // 2
        pb.append(small if mode == "same_upper" else big)
        pe.append(big if mode == "same_upper" else small)
    return pb, pe


def ncx(a, fmt):
    return a if fmt == "NCX" else np.moveaxis(a, -1, 1)


def from_ncx(a, fmt):
    return a if fmt == "NCX" else np.moveaxis(a, 1, -1)


def ncx_shape(shape, fmt):
    return tuple(shape) if fmt == "NCX" else (shape[0], shape[-1], *shape[1:-1])


def conv_fmt_to_oix(w, fmt, r):          # oneDNN conv weights -> (O, C/G, K...)
    return w if fmt == "OIX" else w.transpose(r + 1, r, *range(r))


def oix_to_conv_fmt(w, fmt, r):
    return w if fmt == "OIX" else w.transpose(*range(2, 2 + r), 1, 0)


# oneDNN ConvTranspose weights <-> (I, O/G, K...), the forward conv's OIX
CONVT_TO_IOX = {"IOX": lambda w, r: w, "OIX": lambda w, r: w.swapaxes(0, 1),
                "XIO": lambda w, r: w.transpose(r, r + 1, *range(r)),
                "XOI": lambda w, r: w.transpose(r + 1, r, *range(r))}


def iox_to_convt(w, fmt, r):
    perm = {"IOX": list(range(2 + r)), "OIX": [1, 0, *range(2, 2 + r)],
            "XIO": [*range(2, 2 + r), 0, 1], "XOI": [*range(2, 2 + r), 1, 0]}[fmt]
    return w.transpose(perm)


class Torch:
    def __init__(self, torch):
        self.torch = torch
        self.F = torch.nn.functional

    def t(self, a):
        return self.torch.tensor(np.ascontiguousarray(a, np.float64))

    def conv(self, x, w, s, d, pb, pe, g):
        pad = []
        for b, e in zip(reversed(pb), reversed(pe)):
            pad += [b, e]
        fn = (self.F.conv1d, self.F.conv2d, self.F.conv3d)[len(s) - 1]
        return fn(self.F.pad(x, pad), w, stride=list(s), dilation=list(d), groups=g)

    def grad(self, which, x_shape, w_shape, x, w, dy, *geo):
        """Gradient of <conv(x, w), dy> w.r.t. x or w (the other given)."""
        tx = self.t(x if x is not None else np.zeros(x_shape)).requires_grad_(which == "x")
        tw = self.t(w if w is not None else np.zeros(w_shape)).requires_grad_(which == "w")
        self.conv(tx, tw, *geo).backward(self.t(dy))
        return (tx if which == "x" else tw).grad.numpy()


def tf_attrs(a):
    """TF's full-rank strides/dilations (NHWC order) -> the spatial ones."""
    assert a["strides"][0] == a["strides"][-1] == 1 and a["dilations"][0] == 1
    return {**a, "strides": a["strides"][1:-1], "dilations": a["dilations"][1:-1]}


def tf_pads(a, x_shape, kernel):
    if a["padding"] == "SAME":
        return same_pads("same_upper", x_shape[2:], kernel, a["strides"], a["dilations"])
    if a["padding"] == "VALID":
        return [0] * len(kernel), [0] * len(kernel)
    p = a["explicit_paddings"]
    return p[2:-2:2], p[3:-2:2]


def oracle(T, name, case, arrays):
    a, ins = case["attributes"], {k: v for k, v in arrays.items() if k != "expected"}
    want_shape = arrays["expected"].shape
    if name == "ConvolutionBackpropFilters":     # ConvolutionBackwardWeights, other names
        a = {**a, "weights_format": a["filter_format"]}
        ins = {"src": ins["input"], "diff_dst": ins["output_delta"]}
        case = {**case, "inputs": [case["inputs"][0], case["inputs"][2], case["inputs"][1]]}
        name = "ConvolutionBackwardWeights"
    if name in ("openvino:Convolution", "GroupConvolution"):
        data, filt = ins["data"], ins["filter"]
        r = data.ndim - 2
        g = filt.shape[0] if name == "GroupConvolution" else 1
        w = filt.reshape(-1, *filt.shape[-1 - r:]) if name == "GroupConvolution" else filt
        mode = a["auto_pad"]
        if mode in ("same_upper", "same_lower"):
            pb, pe = same_pads(mode, data.shape[2:], w.shape[2:], a["strides"], a["dilations"])
        elif mode == "valid":
            pb = pe = [0] * r
        else:
            pb, pe = a["pads_begin"], a["pads_end"]
        return T.conv(T.t(data), T.t(w), a["strides"], a["dilations"], pb, pe, g).numpy()
    if name in ("Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter",
                "Conv2DBackpropInput"):
        a = tf_attrs(a)
    if name in ("Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter"):
        x = ncx(ins["input"], "NXC")
        dy = ncx(ins["out_backprop"], "NXC")
        h, w_, c_or_i, m_or_o = case["inputs"][1]["value"]
        if name == "Conv2DBackpropFilter":
            g, w_shape = x.shape[1] // c_or_i, (m_or_o, c_or_i, h, w_)
        else:
            g, w_shape = c_or_i, (c_or_i * m_or_o, 1, h, w_)
        pb, pe = tf_pads(a, x.shape, (h, w_))
        dw = T.grad("w", None, w_shape, x, None, dy, a["strides"], a["dilations"], pb, pe, g)
        if name == "Conv2DBackpropFilter":
            return dw.transpose(2, 3, 1, 0)                          # OIHW -> HWIO
        return dw.reshape(c_or_i, m_or_o, h, w_).transpose(2, 3, 0, 1)   # -> HWCM
    if name in ("ConvolutionBackwardWeights", "ConvolutionBackwardData"):
        fmt, wf = a["data_format"], a["weights_format"]
        if name == "ConvolutionBackwardWeights":
            x, dy = ncx(ins["src"], fmt), ncx(ins["diff_dst"], fmt)
        else:
            dy, x = ncx(ins["diff_dst"], fmt), None
        r = dy.ndim - 2
        x_shape = x.shape if x is not None else ncx_shape(case["inputs"][2]["value"], fmt)
        mode = a["auto_pad"].lower()
        if mode in ("same_upper", "same_lower"):
            k = (ins["weights"].shape if "weights" in ins
                 else case["inputs"][2]["value"])
            kernel = k[:r] if wf == "XIO" else k[2:]
            pb, pe = same_pads(mode, x_shape[2:], kernel, a["strides"], a["dilations"])
        elif mode == "valid":
            pb = pe = [0] * r
        else:
            pb, pe = a["pads_begin"], a["pads_end"]
        geo = (a["strides"], a["dilations"], pb, pe, a["groups"])
        if name == "ConvolutionBackwardWeights":
            w_oix = (dy.shape[1], x.shape[1] // a["groups"],
                     *(np.array(case["inputs"][2]["value"])[:r] if wf == "XIO"
                       else case["inputs"][2]["value"][2:]))
            return oix_to_conv_fmt(T.grad("w", None, w_oix, x, None, dy, *geo), wf, r)
        w = conv_fmt_to_oix(ins["weights"], wf, r)
        return from_ncx(T.grad("x", x_shape, None, None, w, dy, *geo), fmt)
    if name in ("ConvTranspose", "ConvTransposeBackpropFilters"):
        fmt = a["data_format"]
        wf = a.get("weights_format", a.get("filter_format"))
        src = ncx(ins["src" if name == "ConvTranspose" else "input"], fmt)
        r = src.ndim - 2
        op = a.get("output_padding", [0] * r)
        if name == "ConvTranspose":
            w = CONVT_TO_IOX[wf](ins["weights"], r)
            kernel = w.shape[2:]
        else:
            dst = ncx(ins["output_delta"], fmt)
            fs = case["inputs"][2]["value"]
            kernel = fs[:r] if wf.startswith("X") else fs[2:]
        mode = a["auto_pad"].lower()
        if mode in ("same_upper", "same_lower"):
            pb, pe = same_pads(mode, [0] * r, kernel, a["strides"], a["dilations"], True)
        elif mode == "valid":
            pb = pe = [0] * r
        else:
            pb, pe = a["pads_begin"], a["pads_end"]
        geo = (a["strides"], a["dilations"], pb, [e - p for e, p in zip(pe, op)], a["groups"])
        if name == "ConvTranspose":
            out = T.grad("x", ncx_shape(want_shape, fmt), None, None, w, src, *geo)
            return from_ncx(out, fmt)
        w_iox = (src.shape[1], dst.shape[1] // a["groups"], *kernel)
        return iox_to_convt(T.grad("w", None, w_iox, dst, None, src, *geo), wf, r)
    if name == "GroupConvolutionBackpropData":
        data, filt = ins["data"], ins["filter"]
        r = data.ndim - 2
        g = filt.shape[0]
        w = filt.reshape(g * filt.shape[1], *filt.shape[2:])
        mode = a["auto_pad"]
        pb, pe = (a["pads_begin"], a["pads_end"]) if mode == "explicit" else ([0] * r,) * 2
        op = a.get("output_padding", [0] * r)
        geo = (a["strides"], a["dilations"], pb, [e - p for e, p in zip(pe, op)], g)
        return T.grad("x", want_shape, None, None, w, data, *geo)
    if name == "Conv2DBackpropInput":
        x_shape = ncx_shape(case["inputs"][0]["value"], "NXC")
        w = ins["filter"].transpose(3, 2, 0, 1)                    # HWIO -> OIHW
        dy = ncx(ins["out_backprop"], "NXC")
        pb, pe = tf_pads(a, x_shape, w.shape[2:])
        geo = (a["strides"], a["dilations"], pb, pe, x_shape[1] // w.shape[1])
        return from_ncx(T.grad("x", x_shape, None, None, w, dy, *geo), "NXC")
    raise AssertionError(name)


ORACLE_OPS = ("ConvolutionBackwardWeights", "ConvolutionBackpropFilters",
              "ConvolutionBackwardData", "ConvTranspose", "ConvTransposeBackpropFilters",
              "GroupConvolutionBackpropData", "openvino:Convolution", "GroupConvolution",
              "Conv2DBackpropInput", "Conv2DBackpropFilter",
              "DepthwiseConv2dNativeBackpropFilter")


@pytest.mark.peers
@pytest.mark.parametrize("name", ORACLE_OPS)
def test_expected_outputs_match_torch(vectors, name):
    T = Torch(import_peer("torch"))
    out, manifest = vectors
    checked = 0
    for case in manifest["ops"][name]["cases"]:
        if any(i["name"] == "output_shape" for i in case["inputs"]):
            continue          # OpenVINO's output_shape rules: pinned by the OV conformance tests
        arrays = load(out, case)
        want = oracle(T, name, case, arrays)
        assert want.shape == arrays["expected"].shape, (case["file"], case["corner"])
        np.testing.assert_allclose(arrays["expected"], want, rtol=1e-10, atol=1e-10,
                                   err_msg=f"{case['file']} ({case['corner']})")
        checked += 1
    assert checked >= 7
