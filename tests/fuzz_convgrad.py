"""Fuzzing entry point for long runs: the property tests' own checks, driven by
random bytes through Hypothesis' ``fuzz_one_input``.

Two targets (``--target``):

- ``junk``: a valid call of any public op (tests/test_registry.py CALLS) with
  1-3 attributes or inputs replaced by junk; the call must give a result of the
  inferred shape or raise ConvGradError / TypeError, never anything else, and
  must not modify its inputs (tests/test_robustness.py ``mutate_and_check``);
- ``valid``: a random valid geometry mapped onto every public op; every kernel
  must equal the independent reference (tests/test_properties.py ``check_problem``).

Usage (from the repository root; ``make fuzz-long`` runs both for FUZZ_SECONDS)::

    .venv/bin/python tests/fuzz_convgrad.py --target junk --seconds 3600
    .venv/bin/python tests/fuzz_convgrad.py --target valid --iterations 20000

Each input runs under a watchdog (``--hang-seconds``, default 120): an input that
runs longer dumps every thread's stack and exits with status 70, so a hang is a
failure, not a stuck job.  A failing input is reported with Hypothesis' minimal
reproduction and the run exits with status 1.  With atheris installed,
``--atheris`` hands the same target to libFuzzer instead of the random-bytes loop.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from test_properties import check_problem, problems  # noqa: E402
from test_registry import CALLS  # noqa: E402
from test_robustness import mutate_and_check  # noqa: E402

OUTCOMES: collections.Counter = collections.Counter()
FUZZ = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(call=st.sampled_from(CALLS), data=st.data())
def junk(call, data):
    name, attrs, inputs = call
    mutate_and_check(name, attrs, inputs, data)
    OUTCOMES["junk calls checked"] += 1


@FUZZ
@given(p=problems(), variant=st.integers(0, 3), seed=st.integers(0, 2**16))
def valid(p, variant, seed):
    check_problem(p, variant, seed)
    OUTCOMES["valid problems checked"] += 1


TARGETS = {"junk": junk, "valid": valid}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", choices=sorted(TARGETS) + ["both"], default="both")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--hang-seconds", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=None, help="seed of the random bytes")
    ap.add_argument("--atheris", action="store_true", help="drive the target with atheris")
    args, rest = ap.parse_known_args()
    warnings.simplefilter("ignore", RuntimeWarning)       # NaN/overflow in junk values
    names = sorted(TARGETS) if args.target == "both" else [args.target]

    if args.atheris:
        import atheris                                     # optional, not a dependency
        fn = TARGETS[names[0]].hypothesis.fuzz_one_input
        atheris.Setup([sys.argv[0], *rest], fn)
        atheris.Fuzz()
        return 0

    import random
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.seconds
    runs = collections.Counter()
    i = 0
    while (args.iterations is None or i < args.iterations) and (
            args.iterations is not None or time.monotonic() < deadline):
        name = names[i % len(names)]
        buffer = rng.randbytes(rng.choice([64, 256, 1024, 4096]))
        faulthandler.dump_traceback_later(args.hang_seconds, exit=True)
        try:
            TARGETS[name].hypothesis.fuzz_one_input(buffer)
        except Exception as e:                              # noqa: BLE001
            faulthandler.cancel_dump_traceback_later()
            print(f"FAILURE in target {name!r} after {i} inputs: {type(e).__name__}: {e}",
                  file=sys.stderr)
            print(f"reproduce: buffer (hex) {buffer.hex()}", file=sys.stderr)
            return 1
        finally:
            faulthandler.cancel_dump_traceback_later()
        runs[name] += 1
        i += 1
    print(f"inputs run: {dict(runs)}; completed: {dict(OUTCOMES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
