"""The dialects are modules of the package: every way users import them works and
gives the one module object whose functions the op registry holds.

Each import form runs first thing in a fresh interpreter (an import already
done in this process would hide a failing form)."""

import subprocess
import sys
import textwrap

import pytest

# After the import form under test: the module bound by it is the package
# attribute, the sys.modules entry and the module whose functions the registry
# (convgrad.op) calls, and it is the dialect's own module, not a re-export.
_SAME_OBJECT = """
import sys
import convgrad
from convgrad.frontends._plan import OPS
mod = sys.modules["convgrad.{name}"]
assert {bound} is mod is convgrad.{name}, ({bound}, mod, convgrad.{name})
assert mod.__name__ == "convgrad.{name}" and mod.__file__.endswith("convgrad/{name}.py")
registered = {{e.function for e in OPS.values() if e.dialect == "{name}"}}
assert registered == {{getattr(mod, f) for f in mod.__all__}}, mod.__all__
"""

FORMS = {
    "import convgrad.tf": ("import convgrad.tf", "tf", "convgrad.tf"),
    "from convgrad.onednn import name": (
        "from convgrad.onednn import convolution_backward_weights", "onednn",
        "sys.modules['convgrad.onednn']"),
    "import convgrad.openvino as ov": ("import convgrad.openvino as ov", "openvino", "ov"),
    "from convgrad import onednn": ("from convgrad import onednn", "onednn", "onednn"),
    "from convgrad import tf, then import convgrad.tf": (
        "from convgrad import tf\nimport convgrad.tf", "tf", "tf"),
}


@pytest.mark.parametrize("form", FORMS)
def test_import_form_gives_the_dialect_module(form):
    statement, name, bound = FORMS[form]
    script = statement + "\n" + _SAME_OBJECT.format(name=name, bound=bound)
    if "convolution_backward_weights" in statement:
        script += ("assert convolution_backward_weights is "
                   "convgrad.op('ConvolutionBackwardWeights').entry.function\n")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_every_public_function_is_reachable_both_ways():
    """``from convgrad.X import f`` and ``convgrad.X.f`` are the same function, for
    every name of every dialect's ``__all__``."""
    import importlib

    import convgrad
    for name in ("onednn", "openvino", "tf"):
        mod = importlib.import_module(f"convgrad.{name}")
        assert getattr(convgrad, name) is mod
        assert mod.__all__, name
        for fn in mod.__all__:
            got = getattr(__import__(f"convgrad.{name}", fromlist=[fn]), fn)
            assert got is getattr(convgrad, name).__dict__[fn]
            assert got.__module__ == f"convgrad.{name}"
