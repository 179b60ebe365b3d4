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


def run_main(capsys, *args) -> tuple[int, str, str]:
    """The same command in this process (faster; for error paths and unit checks)."""
    from convgrad.cli import main

    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err
