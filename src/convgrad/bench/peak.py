"""Peak memory of one convgrad call, measured in a fresh child process.

A call is described by a :class:`Case` (a public function of convgrad, its
tensor inputs by shape and dtype, its other arguments, and ``convgrad.config``
settings).  :func:`measure` runs it in a child Python process
(``python -m convgrad.bench.peak``) which

1. imports convgrad and builds the inputs (seeded normal values, in the
   caller's layout and dtype, C-contiguous);
2. calls the function once (warm-up: numba's compiled code, the kernels'
   thread pools, the shifted kernel's per-thread scratch buffers) and drops
   the result;
3. resets the resident-set high-water mark (``VmHWM``) to the current resident
   set by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0);
4. calls the function again and reads ``VmHWM``.

``extra = peak - baseline - result bytes`` is then what the call allocated
beyond its inputs (resident before the call) and the result it returns: the
layout and dtype copies, the kernel's workspace and any intermediate result.
The child also reports which kernel ran and that kernel's own estimate of the
extra (``kernels.estimate``), so a test can hold each kernel to it.

Noise: glibc's ``malloc`` adapts its mmap threshold to freed blocks (up to
32 MiB), after which freed memory can stay resident and hide a later
allocation of that size.  The child pins the threshold
(``MALLOC_MMAP_THRESHOLD_``): every allocation above it is a mapping of its
own, returned to the system when freed, so the resident set follows the live
arrays to within a few pages.  It also turns transparent huge pages off for
itself (``prctl(PR_SET_THP_DISABLE)``, ``NUMPY_MADVISE_HUGEPAGE=0``), which
would round a mapping's resident size up to 2 MiB steps.  What remains is
interpreter growth (a few hundred KiB) and page rounding; :data:`NOISE_BYTES`
is the allowance the tests add.

Several settings (e.g. ``algo="auto"`` and each kernel forced) can be measured
in one child, each with its own warm-up and reset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

MMAP_THRESHOLD = 64 * 2**10
"""Allocations above this many bytes are mappings of their own in the child."""

NOISE_BYTES = 2**20
"""What a measurement may show without any array behind it (tests' allowance)."""


@dataclass(frozen=True)
class Case:
    """One call: ``convgrad.<function>(**arrays, **kwargs)`` under
    ``convgrad.config(**settings)``.

    ``arrays`` maps each tensor argument to ``(shape, dtype name)`` in the
    caller's layout; ``function`` is a dotted path below ``convgrad``
    (``"openvino.group_convolution_backprop_data"``, ``"conv_weight_grad"``).
    """

    name: str
    function: str
    arrays: dict
    kwargs: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def input_bytes(self) -> int:
        import numpy as np

        from ..dtypes import bfloat16
        total = 0
        for shape, dt in self.arrays.values():
            dtype = bfloat16 if dt == "bfloat16" else np.dtype(dt)
            total += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return total


def measure(case: Case, algos=("auto",), *, timeout: float = 300) -> dict[str, dict]:
    """Measure ``case`` under each of ``algos`` in one child process.

    Returns, per algo: ``kernel`` (the kernel that ran), ``baseline``,
    ``peak`` and ``extra`` (bytes, see the module doc), ``input_bytes``,
    ``output_bytes``, ``estimate`` (the kernel's declared extra, by part),
    ``workspace_bytes`` (the budget in force), ``seconds`` (the measured
    call) and ``call`` (op, sizes and layouts as the kernel saw them); or
    ``{"unsupported": reason}`` for a forced kernel that cannot run the call.
    Raises RuntimeError, with the child's output, if the child fails.
    """
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD),
               MALLOC_TRIM_THRESHOLD_=str(MMAP_THRESHOLD), NUMPY_MADVISE_HUGEPAGE="0")
    proc = subprocess.run([sys.executable, "-m", "convgrad.bench.peak",
                           json.dumps({"case": asdict(case), "algos": list(algos)})],
                          capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"memory measurement of {case.name} failed "
                           f"(exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def can_measure() -> bool:
    """Whether this system has the ``/proc`` files the child needs."""
    from .cluster import can_measure_peaks
    return can_measure_peaks()


# ----------------------------------------------------------------------------
# The child
# ----------------------------------------------------------------------------


def _inputs(case: Case):
    import numpy as np

    from ..dtypes import bfloat16
    rng = np.random.default_rng(0)
    out = {}
    for name, (shape, dt) in case.arrays.items():
        dtype = bfloat16 if dt == "bfloat16" else np.dtype(dt)
        a = rng.standard_normal(tuple(shape), dtype=np.float32)
        out[name] = a if dtype == np.float32 else a.astype(dtype)
        del a
    return out


def _function(path: str):
    import convgrad
    fn = convgrad
    for part in path.split("."):
        fn = getattr(fn, part)
    return fn


class KernelSpy:
    """Within the block, records each kernel ``ops.compute`` selects, with its
    estimate and the call: ``seen`` is a list of (name, estimate, call).  Entering it
    forgets the decisions made before (``kernels.clear_choices``), so that a call
    repeated in the block selects its kernel again instead of running the one its
    plan kept."""

    def __init__(self):
        from .. import kernels
        self.kernels, self.real = kernels, kernels.select
        self.seen = []

    def __enter__(self):
        def select(*args, call=None, **kwargs):
            kernel = self.real(*args, call=call, **kwargs)
            est = self.kernels.estimate(kernel, call) if call is not None else {}
            self.seen.append((kernel.name, est, call))
            return kernel

        self.kernels.select = select
        self.kernels.clear_choices()
        return self

    def __exit__(self, *exc):
        self.kernels.select = self.real
        return False


def _geometry(call) -> dict:
    g = call.geom
    return {"op": call.op, "n": g.n, "c": g.c, "o": g.o, "groups": g.groups,
            "kernel": list(g.kernel), "in_sizes": list(g.in_sizes),
            "out_sizes": list(g.out_sizes), "strides": list(g.strides),
            "dilations": list(g.dilations), "pads_begin": list(g.pads_begin),
            "pads_end": list(g.pads_end), "cdt": str(call.cdt),
            "a_layouts": sorted(call.a.layouts), "b_layouts": sorted(call.b.layouts),
            "out_layouts": sorted(call.out.layouts), "dtype": str(call.out.dtype)}


def _measure_in_child(case: Case, algo: str) -> dict:
    import gc

    import convgrad
    from .. import settings
    from .cluster import proc_status, reset_process_peak

    fn = _function(case.function)
    arrays = _inputs(case)
    conf = {**case.settings, "algo": algo}
    with convgrad.config(**conf):
        budget = settings.workspace_bytes()
        try:
            out = fn(**arrays, **case.kwargs)                  # warm-up
        except convgrad.ConvGradError as exc:
            if algo == "auto":
                raise
            return {"unsupported": str(exc)}
        del out
        gc.collect()
        baseline = reset_process_peak()
        with KernelSpy() as spy:
            t0 = time.perf_counter()
            out = fn(**arrays, **case.kwargs)
            seconds = time.perf_counter() - t0
        peak = proc_status("VmHWM")
    names = sorted({name for name, _, _ in spy.seen})
    estimate = {}
    for _, parts, _ in spy.seen:
        for k, v in parts.items():
            estimate[k] = max(estimate.get(k, 0), v)
    return {"kernel": "+".join(names), "baseline": baseline, "peak": peak,
            "extra": peak - baseline - out.nbytes, "input_bytes": case.input_bytes(),
            "output_bytes": int(out.nbytes), "estimate": estimate,
            "workspace_bytes": budget, "seconds": round(seconds, 3),
            "call": _geometry(spy.seen[0][2]) if spy.seen and spy.seen[0][2] else None}


def _no_huge_pages() -> None:
    """Transparent huge pages off for this process (Linux; else nothing)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0)   # PR_SET_THP_DISABLE
    except (OSError, AttributeError):                            # pragma: no cover
        pass


def main(argv=None) -> int:
    _no_huge_pages()
    request = json.loads((argv or sys.argv[1:])[0])
    case = Case(**request["case"])
    results = {algo: _measure_in_child(case, algo) for algo in request["algos"]}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
