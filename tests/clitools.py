"""Run the installed ``convgrad`` script (the real entry point) in a subprocess."""

import os
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(sys.executable).with_name("convgrad")


def cli(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    assert SCRIPT.is_file(), f"{SCRIPT} is not installed (pip install -e .)"
    env = dict(os.environ, COLUMNS="100", NO_COLOR="1")
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)
