"""The project's lint rules ([tool.ruff] in pyproject.toml) hold on src/ and tests/."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    exe = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(exe).exists():
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    done = subprocess.run([exe, "check", "--output-format", "concise", "src", "tests"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
