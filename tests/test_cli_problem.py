"""benchdnn problem strings (pure parser) and `convgrad run-problem` / `convgrad check`."""

import re

import numpy as np
import pytest

import convgrad
from convgrad import kernels
from convgrad.cli import main, runner
from convgrad.cli.problem import ProblemError, direction, parse
from clitools import cli, run_main
import naive

# string -> (x shape, w shape (OIX), y shape, strides, dilations, pads_begin, pads_end)
PARSED = {
    # square promotion: only h given; oh56 with ph1 and 3x3 gives an end pad of 1
    "g32mb8ic128ih56oc128oh56kh3ph1":
        ((8, 128, 56, 56), (128, 4, 3, 3), (8, 128, 56, 56), (1, 1), (1, 1), (1, 1), (1, 1)),
    # cubic promotion, 0-based dilation (dd1 = dilation 2), output deduced, end pad 0
    "mb2ic3id8oc4kd3sd2dd1pd1":
        ((2, 3, 8, 8, 8), (4, 3, 3, 3, 3), (2, 4, 3, 3, 3), (2, 2, 2), (2, 2, 2), (1, 1, 1),
         (0, 0, 0)),
    # defaults: mb2, g1, stride 1, pad 0
    "ic3ih5oc2kh3": ((2, 3, 5, 5), (2, 3, 3, 3), (2, 2, 3, 3), (1, 1), (1, 1), (0, 0), (0, 0)),
    # 1-D (w only); a missing pad with a given output: p = ((o-1)*s - i + Ke) / 2
    "ic4iw9oc4ow9kw3": ((2, 4, 9), (4, 4, 3), (2, 4, 9), (1,), (1,), (1,), (1,)),
    # non-square, delimiters, a name; benchdnn's negative end pad (-1) becomes 0
    "mb1_ic2ih8iw6_oc2_kh3kw2_sh2sw2_nfoo":
        ((1, 2, 8, 6), (2, 2, 3, 2), (1, 2, 3, 3), (2, 2), (1, 1), (0, 0), (0, 0)),
    # C division: (2 - 3) / 2 = 0 in benchdnn, so the output is 1 and the end pad 1
    "ic1ih2oc1kh3sh2": ((2, 1, 2, 2), (1, 1, 3, 3), (2, 1, 1, 1), (2, 2), (1, 1), (0, 0), (1, 1)),
}


@pytest.mark.parametrize("text", PARSED)
def test_parse(text):
    p = parse(text)
    x, w, y, s, d, pb, pe = PARSED[text]
    assert (p.x_shape, p.w_shape, p.y_shape) == (x, w, y)
    assert (p.strides, p.dilations, p.pads_begin, p.pads_end) == (s, d, pb, pe)
    # the geometry agrees with convgrad's own shape inference
    assert convgrad.op("onednn:Convolution", **p.attrs(), data_format="NCX",
                       weights_format="OIX").infer_shape(x, w) == y
    # the canonical string says the same problem
    assert parse(p.canonical()) == p
    assert p.name == ("foo" if text.endswith("nfoo") else "")


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("ic3", "ic and oc are required"),
    ("ic3ih5oc2", "ih and kh are required"),
    ("g3ic4ih5oc3kh3", "divisible by g = 3"),
    ("ic2ih5oc2kh3x1", "cannot parse at 'x1'"),
    ("ic2ih5oc2kh3ic4", "ic given twice"),
    ("ic2id5ih5oc2kd3kh3", "needs both h and w"),
    ("ic2ih3oc2kh5", "is not positive"),
    ("mb0ic2ih5oc2kh3", "minibatch must be positive"),
    ("g0ic2ih5oc2kh3", "groups must be positive"),
    ("ic2ih5oc2kh3sh0", "strides must be positive"),
    ("ic2ih9oc2oh2kh3", "negative pad"),
    ("ic2ih8oc2oh2kh3ph0sh2", "is not the output size"),
    ("ic2ih99999999999oc2kh3", "at most"),
])
def test_parse_rejects(text, message):
    with pytest.raises(ProblemError, match=re.escape(message)):
        parse(text)


def test_direction():
    assert [direction(d) for d in ("FWD_D", "fwd_b", "BWD_D", "BWD_W", "bwd_wb", "wgrad")] == \
        ["fwd", "fwd", "dgrad", "wgrad", "wgrad", "wgrad"]
    with pytest.raises(convgrad.ConvGradError, match="--dir"):
        direction("BWD")


@pytest.mark.parametrize("dir_, kind", [("FWD_D", "fwd"), ("BWD_D", "dgrad"),
                                        ("BWD_W", "wgrad")])
def test_run_problem_checksum_matches_naive_reference(dir_, kind):
    text = "g2mb2ic4ih7iw6oc6kh3kw2sh2ph1dh1"
    r = cli("run-problem", text, "--dir", dir_, "--dtype", "f64", "--seed", "3")
    assert r.returncode == 0, r.stderr
    p = parse(text)
    a, b = runner.inputs(p, kind, np.dtype(np.float64), 3)
    pads = (p.strides, p.dilations, p.pads_begin, p.groups)
    want = {"fwd": lambda: naive.forward(a, b, p.out_sizes, *pads),
            "dgrad": lambda: naive.dgrad(a, b, p.in_sizes, *pads),
            "wgrad": lambda: naive.wgrad(a, b, p.kernel, *pads)}[kind]()
    printed = float(re.search(r"checksum sum (\S+)", r.stdout).group(1))
    assert printed == pytest.approx(want.sum(), rel=1e-5, abs=1e-9)
    assert "ms (fastest of 3)" in r.stdout and "GFLOP/s" in r.stdout


def test_run_problem_errors_are_one_line(capsys):
    r = cli("run-problem", "ic2ih5oc2kh3zz")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "error: problem 'ic2ih5oc2kh3zz': cannot parse at 'zz'" in r.stderr
    for args, message in ((["--dtype", "f8"], "--dtype = 'f8'"),
                          (["--algo", "nope"], "unknown algorithm")):
        code, _, err = run_main(capsys, "run-problem", "ic2ih5oc2kh3", *args)
        assert code == 2 and message in err
    code, _, err = run_main(capsys, "run-problem", "mb1000ic1000ih1000oc8kh3")
    assert code == 2 and "elements; at most" in err


def test_check_every_kernel_and_torch():
    r = cli("check", "g2mb2ic4ih7oc6kh3sh2ph1dh1", "mb1ic3id5oc2kd2pd1", "--dir", "ALL")
    assert r.returncode == 0, r.stdout + r.stderr
    for name in kernels.names():
        assert len(re.findall(rf"│ \S+ +│ {name} ", r.stdout)) == 6      # 2 problems x 3 dirs
    try:
        import torch  # noqa: F401
        assert r.stdout.count("│ torch ") == 6
    except ImportError:
        assert "not installed" in r.stdout


def test_check_half_types(capsys):
    # every kernel but winograd (stride 1 only) runs this strided problem, winograd the
    # stride-1 one
    for problem, runs in (("g2mb2ic4ih7oc6kh3sh2ph1dh1", len(kernels.names()) - 1),
                          ("g2mb2ic4ih7oc6kh3ph1", len(kernels.names()))):
        for dtype in ("bf16", "f16"):
            code, out, _ = run_main(capsys, "check", problem, "--dir", "ALL", "--dtype", dtype,
                                    "--no-peers")
            assert code == 0 and out.count(" ok ") == 3 * runs, out


@pytest.fixture
def broken_kernel():
    """A registered wgrad kernel that is wrong (in this process only)."""
    saved = {op: list(ks) for op, ks in kernels._REGISTRY.items()}

    def bad(x, dy, geom):
        good = kernels.select("wgrad", geom, x.dtype, "reference").fn(x, dy, geom)
        good.flat[0] += 1.0
        return good

    kernels.register(kernels.Kernel("broken", "wgrad", bad, lambda g, d: None, priority=-1))
    yield
    kernels._REGISTRY.clear()
    kernels._REGISTRY.update(saved)


def test_check_failure_prints_repro(broken_kernel, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["check", "ic2ih5oc3kh3", "--dir", "BWD_W", "--no-peers"])
    assert exc.value.code == 1
    out = capsys.readouterr()
    repro = [line for line in out.out.splitlines() if line.startswith("repro: ")]
    assert repro == ["repro: convgrad check g1mb2_ic2ih5iw5_oc3oh3ow3_kh3kw3_sh1sw1_ph0pw0_dh0dw0 "
                     "--dir BWD_W --dtype f32 --seed 0 --algo broken"]
    assert "FAILED: 1 comparison(s) out of tolerance" in out.err
    # the repro line reproduces the failure, and only that kernel runs
    with pytest.raises(SystemExit) as exc:
        main(repro[0].split()[2:])
    assert exc.value.code == 1
    assert "│ BWD_W │ broken " in capsys.readouterr().out
