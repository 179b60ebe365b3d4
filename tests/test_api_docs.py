"""The API reference (docs/api, Sphinx + numpydoc) builds from the docstrings with
warnings as errors -- a docstring that does not render, or a cross-reference that
leads nowhere, fails here -- and documents every public function of every dialect,
the canonical API, ``convgrad.op``, ``config``, ``convgrad.dask`` and every
subcommand of the ``convgrad`` command."""

import pathlib
import re
import subprocess
import sys

import convgrad
from conftest import import_peer

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api"


def test_api_reference_builds_without_warnings_and_documents_everything(tmp_path):
    import_peer("sphinx")
    import_peer("numpydoc")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "-n",
                           "--keep-going", "-q", str(DOCS), str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout

    def ids(page):
        return set(re.findall(r'id="([^"]+)"', (tmp_path / f"{page}.html").read_text()))

    for name in ("onednn", "openvino", "tf"):
        module = getattr(convgrad, name)
        assert {f"convgrad.{name}.{f}" for f in module.__all__} <= ids(name), name
        assert {f"convgrad.dask.{name}.{f}" for f in module.__all__} <= ids("dask"), name
    assert {"convgrad.conv_weight_grad", "convgrad.conv_data_grad", "convgrad.conv_forward",
            "convgrad.ConvGradError"} <= ids("canonical")
    assert {"convgrad.op", "convgrad.op_names", "convgrad.registry.SpecOp"} <= ids("op")
    assert {"convgrad.config", "convgrad.memory.MemoryLimitError"} <= ids("config")
    assert {"convgrad.dask.op", "convgrad.dask.conv_weight_grad"} <= ids("dask")
    import typer.main

    from convgrad.cli.app import app
    commands = typer.main.get_command(app).commands
    assert len(commands) >= 8
    for sub, command in commands.items():                    # a section and every option
        assert f"convgrad-{sub}" in ids("command"), sub
        for param in command.params:
            if param.opts[0].startswith("--"):
                assert f"cmdoption-convgrad-{sub}-{param.opts[0][2:]}" in ids("command"), (
                    sub, param.opts[0])
