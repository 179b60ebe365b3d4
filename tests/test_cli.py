"""The `convgrad` command as a whole: help, the demo, examples, python -m convgrad,
and that `import convgrad` does not load the command's dependencies."""

import json
import subprocess
import sys

import numpy as np
import pytest

from clitools import cli, run_main

SUBCOMMANDS = ["demo", "examples", "infer", "run", "run-problem", "check", "vectors"]


def test_help_lists_every_subcommand():
    r = cli("--help")
    assert r.returncode == 0
    for name in SUBCOMMANDS:
        assert f" {name} " in r.stdout


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_subcommand_help(name, capsys):
    code, out, _ = run_main(capsys, name, "--help")
    assert code == 0 and "Usage: convgrad " + name in out


def test_usage_errors_exit_2_without_traceback(capsys):
    r = cli("nope")
    assert r.returncode == 2 and "No such command" in r.stderr and "Traceback" not in r.stderr
    for args in (["run-problem"], ["vectors", "--op", "Convolution"],
                 ["check", "ic2ih5oc2kh3", "--dir", "SIDEWAYS"]):
        code, _, err = run_main(capsys, *args)
        assert code == 2 and err, args


def test_python_dash_m_is_the_command():
    r = subprocess.run([sys.executable, "-m", "convgrad", "--help"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "run-problem" in r.stdout


def test_import_convgrad_does_not_load_the_cli_dependencies():
    code = ("import sys, convgrad; import convgrad.cli; "
            "print(sorted(m for m in ('typer', 'rich', 'matplotlib', 'sklearn', 'defusedxml') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_examples_subcommand():
    r = cli("examples")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("checked:") >= 8 and r.stdout.rstrip().endswith("all examples checked")


def test_demo_trains(tmp_path):
    """A shortened demo through the real entry point: the loss falls and the
    held-out accuracy is far above chance (10 %)."""
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    metrics, png = tmp_path / "m.json", tmp_path / "curve.png"
    r = cli("demo", "--epochs", "3", "--train-size", "480", "--seed", "1", "--plot", png,
            "--json", metrics)
    assert r.returncode == 0, r.stdout + r.stderr
    m = json.loads(metrics.read_text())
    losses, steps = m["losses"], m["steps_per_epoch"]
    assert len(losses) == 3 * steps == 45
    first, last = sum(losses[:5]) / 5, sum(losses[-steps:]) / steps
    assert first > 1.5 and last < 0.5 * first
    assert m["test_accuracy"] >= 0.7
    assert m["finite_difference_max_rel"] < 1e-5
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"held-out accuracy {m['test_accuracy']:.1%}" in r.stdout
    assert "finite-difference check" in r.stdout and "epoch  3" in r.stdout


def test_demo_data_is_scikit_learns_digits():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    from convgrad.cli import demo

    d = demo.load_digits(3)
    ref = sklearn_datasets.load_digits()
    assert len(d.y_train) + len(d.y_test) == len(ref.target) == 1797
    x = np.concatenate([d.x_train, d.x_test]).reshape(1797, 64) * 16
    y = np.concatenate([d.y_train, d.y_test])
    order = np.lexsort(np.column_stack([x, y]).T)
    ref_order = np.lexsort(np.column_stack([ref.data, ref.target]).T)
    np.testing.assert_array_equal(x[order], ref.data[ref_order])
    np.testing.assert_array_equal(y[order], ref.target[ref_order])


def test_demo_is_reproducible():
    pytest.importorskip("sklearn")
    from convgrad.cli import demo

    data = demo.load_digits(5)
    runs = []
    for _ in range(2):
        net = demo.Net(5)
        runs.append(list(demo.train_epoch(net, data.x_train[:64], data.y_train[:64], 16, 5)))
    assert runs[0] == runs[1] and len(runs[0]) == 4
