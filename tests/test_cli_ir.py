"""`convgrad infer` and `convgrad run` on OpenVINO IR files.

infer: the three examples of the GroupConvolutionBackpropData-1 spec page (bare
<layer> fragments, transcribed below), a wrong <output> port, hostile XML.
run: models built and serialized by the `openvino` package (save_model), run by
convgrad and by the OpenVINO CPU runtime on the same inputs.
"""

import numpy as np
import pytest

from convgrad.cli import ir
from clitools import cli, run_main
from conftest import import_peer


def spec_example(spatial: int, out: int = 447) -> str:
    """The spec page's <layer> example for 1, 2 or 3 spatial dims."""
    ones = ",".join(["1"] * spatial)
    twos = ",".join(["2"] * spatial)
    dims = lambda values: "".join(f"<dim>{v}</dim>" for v in values)  # noqa: E731
    return f"""<layer id="5" name="upsampling_node" type="GroupConvolutionBackpropData">
    <data dilations="{ones}" pads_begin="{ones}" pads_end="{ones}" strides="{twos}"/>
    <input>
        <port id="0">{dims([1, 20] + [224] * spatial)}</port>
        <port id="1">{dims([4, 5, 2] + [3] * spatial)}</port>
    </input>
    <output>
        <port id="0" precision="FP32">{dims([1, 8] + [out] * spatial)}</port>
    </output>
</layer>
"""


@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_infer_spec_examples(tmp_path, spatial):
    f = tmp_path / f"example_{spatial}d.xml"
    f.write_text(spec_example(spatial))
    r = cli("infer", f)
    assert r.returncode == 0, r.stdout + r.stderr
    shape = "x".join(["1", "8"] + ["447"] * spatial)
    assert r.stdout.count(shape) == 2 and "ok" in r.stdout      # inferred and <output>


def test_infer_all_three_in_one_file_and_a_mismatch(tmp_path):
    f = tmp_path / "three.xml"
    f.write_text('<?xml version="1.0"?>\n' + "".join(spec_example(s) for s in (1, 2, 3)))
    rows = ir.infer(ir.load(f))
    assert [r.inferred for r in rows] == [(1, 8, 447), (1, 8, 447, 447), (1, 8, 447, 447, 447)]
    assert [r.status for r in rows] == ["ok"] * 3
    f.write_text(spec_example(1) + spec_example(2, out=448))
    r = cli("infer", f)
    assert r.returncode == 1
    assert "MISMATCH" in r.stdout and "1x8x448x448" in r.stdout
    assert "FAILED: 1 of 2 layers do not match their <output> port" in r.stderr.replace("\n", " ")


def test_infer_bad_attribute_is_an_error_row(tmp_path, capsys):
    f = tmp_path / "bad.xml"
    f.write_text(spec_example(2).replace('strides="2,2"', 'strides="2,0"'))
    code, out, _ = run_main(capsys, "infer", f)
    assert code == 1
    assert "ERROR GroupConvolutionBackpropData: strides = [2, 0]" in out


@pytest.mark.parametrize("text, message", [
    ('<!DOCTYPE x [<!ENTITY a "aaaa">]><layer type="Convolution">&a;</layer>', "refused"),
    ('<?xml version="1.0"?><!DOCTYPE net [<!ENTITY a "a">]><net>&a;</net>', "refused"),
    ("<layer><data strides='1'/>", "not well-formed XML"),
    ("<net><layers/></net>", "no <layer> element"),
    ('<layer type="Convolution"><data strides="x"/><input><port id="0"><dim>1</dim></port>'
     '<port id="1"><dim>1</dim></port></input></layer>', "must be comma-separated integers"),
])
def test_infer_hostile_or_malformed_files(tmp_path, capsys, text, message):
    f = tmp_path / "h.xml"
    f.write_text(text)
    code, out, err = run_main(capsys, "infer", f)
    assert code in (1, 2) and message in out + err


def test_markup_in_names_is_shown_as_text(tmp_path, capsys):
    f = tmp_path / "m.xml"
    f.write_text(spec_example(1).replace('name="upsampling_node"', 'name="[/bold][red]x"')
                 .replace("<dim>447</dim>", "<dim>446</dim>"))
    code, out, _ = run_main(capsys, "infer", f)
    assert code == 1 and "[/bold][red]x" in out and "MISMATCH" in out


def test_missing_file():
    r = cli("infer", "/nonexistent/model.xml")
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------
# Models serialized by OpenVINO, run by convgrad and by the OpenVINO runtime
# ---------------------------------------------------------------------------


def _models():
    """name -> function(ov, factory, rng) returning (ov.Model, {param name: input})."""

    def conv_then_group_backprop(ov, factory, rng):
        x = ov.opset1.parameter([2, 4, 9, 9], ov.Type.f32, name="x")
        w1 = ov.opset1.constant(rng.standard_normal((6, 4, 3, 3)).astype(np.float32))
        c1 = factory.create("Convolution", [x.output(0), w1.output(0)], dict(
            strides=[2, 2], pads_begin=[1, 0], pads_end=[0, 1], dilations=[1, 1],
            auto_pad="explicit"))
        w2 = ov.opset1.constant(rng.standard_normal((2, 3, 2, 3, 3)).astype(np.float32))
        g = factory.create("GroupConvolutionBackpropData", [c1.output(0), w2.output(0)], dict(
            strides=[2, 2], pads_begin=[1, 1], pads_end=[0, 1], dilations=[1, 2],
            auto_pad="explicit", output_padding=[1, 0]))
        r = ov.opset1.result(g.output(0), name="out")
        return ov.Model([r], [x], "m1"), {"x": rng.standard_normal((2, 4, 9, 9))}

    def grouped_and_output_shape(ov, factory, rng):
        # GroupConvolution (same_upper), then ConvolutionBackpropData with an
        # output_shape input and same_upper (odd pad), two Results.
        x = ov.opset1.parameter([1, 6, 8], ov.Type.f32, name="data")
        k = ov.opset1.parameter([3, 4, 2, 3], ov.Type.f32, name="kernel")
        g = factory.create("GroupConvolution", [x.output(0), k.output(0)], dict(
            strides=[2], pads_begin=[0], pads_end=[0], dilations=[1], auto_pad="same_upper"))
        w = ov.opset1.constant(rng.standard_normal((12, 5, 3)).astype(np.float32))
        shape = ov.opset1.constant(np.array([9], np.int64))
        b = factory.create("ConvolutionBackpropData", [g.output(0), w.output(0),
                                                       shape.output(0)], dict(
            strides=[2], pads_begin=[0], pads_end=[0], dilations=[1], auto_pad="same_upper",
            output_padding=[0]))
        r1 = ov.opset1.result(g.output(0), name="grouped")
        r2 = ov.opset1.result(b.output(0), name="backprop")
        return ov.Model([r1, r2], [x, k], "m2"), {
            "data": rng.standard_normal((1, 6, 8)), "kernel": rng.standard_normal((3, 4, 2, 3))}

    def three_d_f64(ov, factory, rng):
        x = ov.opset1.parameter([1, 2, 5, 4, 6], ov.Type.f64, name="vol")
        w = ov.opset1.constant(rng.standard_normal((2, 3, 2, 2, 3)))
        b = factory.create("ConvolutionBackpropData", [x.output(0), w.output(0)], dict(
            strides=[1, 2, 3], pads_begin=[1, 0, 2], pads_end=[0, 1, 0], dilations=[2, 1, 1],
            auto_pad="explicit", output_padding=[0, 1, 2]))
        r = ov.opset1.result(b.output(0), name="y")
        return ov.Model([r], [x], "m3"), {"vol": rng.standard_normal((1, 2, 5, 4, 6))}

    return {"conv_then_group_backprop": conv_then_group_backprop,
            "grouped_and_output_shape": grouped_and_output_shape, "three_d_f64": three_d_f64}


MODELS = _models()


@pytest.mark.peers
@pytest.mark.parametrize("name", MODELS)
def test_run_matches_openvino_runtime(tmp_path, capsys, name):
    ov = import_peer("openvino")
    from openvino.utils.node_factory import NodeFactory

    rng = np.random.default_rng(len(name))
    model, feeds = MODELS[name](ov, NodeFactory("opset1"), rng)
    xml = tmp_path / f"{name}.xml"
    ov.save_model(model, str(xml), compress_to_fp16=False)
    feeds = {k: v.astype(np.float64 if "f64" in name else np.float32) for k, v in feeds.items()}
    np.savez(tmp_path / "in.npz", **feeds)
    r = cli("run", xml, "--inputs", tmp_path / "in.npz", "--out", tmp_path / "out.npz")
    assert r.returncode == 0, r.stdout + r.stderr
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    want = compiled([feeds[p.get_friendly_name()] for p in model.get_parameters()])
    got = np.load(tmp_path / "out.npz")
    assert list(got.files) == [res.get_friendly_name() for res in model.get_results()]
    for res, out in zip(model.get_results(), compiled.outputs):
        w = np.asarray(want[out])
        g = got[res.get_friendly_name()]
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(1.0, float(np.abs(w).max()))
        assert np.abs(g.astype(np.float64) - w).max() <= 2e-5 * scale
    # infer agrees with OpenVINO's own shape inference (the <output> ports it wrote),
    # reading an output_shape input from its Const in the .bin
    rows = ir.infer(ir.load(xml))
    assert rows and all(r.status == "ok" for r in rows), [(r.status, r.note) for r in rows]
    code, out, _ = run_main(capsys, "infer", xml)
    assert code == 0 and "skipped" not in out


@pytest.mark.peers
def test_run_rejects_unsupported_layers_and_huge_shapes(tmp_path):
    ov = import_peer("openvino")
    x = ov.opset1.parameter([1, 2, 4], ov.Type.f32, name="x")
    relu = ov.opset1.relu(x)
    relu.set_friendly_name("my_relu")
    xml = tmp_path / "relu.xml"
    ov.save_model(ov.Model([ov.opset1.result(relu)], [x], "r"), str(xml),
                  compress_to_fp16=False)
    r = cli("run", xml)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "'my_relu' (ReLU): layer type 'ReLU' is not supported" in r.stderr

    # A hostile edit: a Parameter of 10**12 elements is refused before allocating.
    model, _ = MODELS["conv_then_group_backprop"](
        ov, __import__("openvino.utils.node_factory", fromlist=["x"]).NodeFactory("opset1"),
        np.random.default_rng(0))
    xml = tmp_path / "m.xml"
    ov.save_model(model, str(xml), compress_to_fp16=False)
    text = xml.read_text()
    huge = text.replace('shape="2,4,9,9"', 'shape="2,4,500000,1000000"')
    assert huge != text
    (tmp_path / "huge.xml").write_text(huge)
    (tmp_path / "huge.bin").write_bytes((tmp_path / "m.bin").read_bytes())
    r = cli("run", tmp_path / "huge.xml")
    assert r.returncode == 2 and "elements; the limit is" in r.stderr

    # A Const that points past the end of the .bin.
    (tmp_path / "cut.xml").write_text(text)
    (tmp_path / "cut.bin").write_bytes((tmp_path / "m.bin").read_bytes()[:100])
    r = cli("run", tmp_path / "cut.xml")
    assert r.returncode == 2 and "past the end of" in r.stderr


def test_run_random_inputs_and_bad_inputs_file(tmp_path, capsys):
    # A hand-written IR (no peer needed): Parameter -> Convolution(Const) -> Result.
    w = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    (tmp_path / "c.bin").write_bytes(w.tobytes())
    dims = lambda values: "".join(f"<dim>{v}</dim>" for v in values)  # noqa: E731
    (tmp_path / "c.xml").write_text(f"""<?xml version="1.0"?>
<net name="c" version="11"><layers>
 <layer id="0" name="x" type="Parameter" version="opset1"><data shape="1,3,5" element_type="f32"/>
  <output><port id="0" precision="FP32">{dims([1, 3, 5])}</port></output></layer>
 <layer id="1" name="w" type="Const" version="opset1">
  <data element_type="f32" shape="2,3,2" offset="0" size="48"/>
  <output><port id="0" precision="FP32">{dims([2, 3, 2])}</port></output></layer>
 <layer id="2" name="conv" type="Convolution" version="opset1">
  <data strides="2" dilations="1" pads_begin="1" pads_end="0" auto_pad="explicit"/>
  <input><port id="0">{dims([1, 3, 5])}</port><port id="1">{dims([2, 3, 2])}</port></input>
  <output><port id="2" precision="FP32">{dims([1, 2, 3])}</port></output></layer>
 <layer id="3" name="y" type="Result" version="opset1">
  <input><port id="0">{dims([1, 2, 3])}</port></input></layer>
</layers><edges>
 <edge from-layer="0" from-port="0" to-layer="2" to-port="0"/>
 <edge from-layer="1" from-port="0" to-layer="2" to-port="1"/>
 <edge from-layer="2" from-port="2" to-layer="3" to-port="0"/>
</edges></net>""")
    x = np.random.default_rng(0).standard_normal((1, 3, 5)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    r = cli("run", tmp_path / "c.xml", "--inputs", tmp_path / "in.npz", "--out",
            tmp_path / "o.npz")
    assert r.returncode == 0, r.stderr
    # independent: pad 1 at the start, stride 2, kernel 2
    xp = np.pad(x[0].astype(np.float64), ((0, 0), (1, 0)))
    want = np.array([[np.sum(xp[:, 2 * p:2 * p + 2] * w[o]) for p in range(3)] for o in range(2)])
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["y"][0], want, rtol=1e-6)
    dynamic = tmp_path / "dyn.xml"
    dynamic.write_text((tmp_path / "c.xml").read_text().replace('shape="1,3,5"', 'shape="?,3,5"'))
    code, _, err = run_main(capsys, "run", dynamic)
    assert code == 2 and "shape = '?,3,5' is dynamic" in err
    code, out, _ = run_main(capsys, "run", tmp_path / "c.xml", "--seed", "1")
    assert code == 0 and "x 1x3x5 float32 (random)" in out
    np.savez(tmp_path / "bad.npz", x=np.zeros((1, 3, 4), np.float32))
    code, _, err = run_main(capsys, "run", tmp_path / "c.xml", "--inputs", tmp_path / "bad.npz")
    assert code == 2 and "'x' has shape [1, 3, 4]; the Parameter is [1, 3, 5]" in err
    np.savez(tmp_path / "bad.npz", z=x)
    code, _, err = run_main(capsys, "run", tmp_path / "c.xml", "--inputs", tmp_path / "bad.npz")
    assert code == 2 and "['z'] are not Parameters" in err
    np.save(tmp_path / "one.npy", x)
    code, _, err = run_main(capsys, "run", tmp_path / "c.xml", "--inputs", tmp_path / "one.npy")
    assert code == 2 and "a .npy holds one unnamed array" in err
    (tmp_path / "text.npz").write_text("not a zip file")
    code, _, err = run_main(capsys, "run", tmp_path / "c.xml", "--inputs", tmp_path / "text.npz")
    assert code == 2 and "cannot read it as .npz" in err
    # infer on the whole net
    code, out, _ = run_main(capsys, "infer", tmp_path / "c.xml")
    assert code == 0 and out.count("1x2x3") == 2


# ---------------------------------------------------------------------------
# The files shipped in examples/ir (used by the README)
# ---------------------------------------------------------------------------

EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "ir"


def test_shipped_spec_examples_pass():
    rows = ir.infer(ir.load(EXAMPLES / "group_convolution_backprop_data.xml"))
    assert [(r.status, r.inferred) for r in rows] == [
        ("ok", (1, 8, 447)), ("ok", (1, 8, 447, 447)), ("ok", (1, 8, 447, 447, 447))]


@pytest.mark.peers
def test_shipped_model_matches_openvino_runtime(tmp_path):
    ov = import_peer("openvino")
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "in.npz", image=x)
    r = cli("run", EXAMPLES / "down_up.xml", "--inputs", tmp_path / "in.npz", "--out",
            tmp_path / "out.npz")
    assert r.returncode == 0, r.stderr
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(EXAMPLES / "down_up.xml")), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32"})
    want = np.asarray(compiled([x])[compiled.output(0)])
    got = np.load(tmp_path / "out.npz")["restored"]
    assert got.shape == want.shape == (1, 8, 16, 16)
    assert np.abs(got - want).max() <= 2e-5 * max(1.0, float(np.abs(want).max()))
