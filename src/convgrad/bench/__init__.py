"""The benchmark harness: convgrad against PyTorch, TensorFlow, JAX, OpenVINO and
ONNX Runtime on the layers of ``suite.json``, in the same run, alternating.

    from convgrad.bench import run_benchmark
    record = run_benchmark(layers=["r50_res2_3x3"], repeat=7)   # also writes the report

Command line: ``python -m convgrad.bench --help``.  The peers are the optional
``peers`` extra, the thread control and the chart the ``bench`` extra.
"""

from .harness import load_suite, make_inputs, reference, run_benchmark, run_problem
from .peers import FAMILIES, Layer, Party, Prepared, Unsupported, default_parties
from .report import markdown, write_report

__all__ = ["FAMILIES", "Layer", "Party", "Prepared", "Unsupported", "default_parties",
           "load_suite", "make_inputs", "markdown", "reference", "run_benchmark", "run_problem",
           "write_report"]
