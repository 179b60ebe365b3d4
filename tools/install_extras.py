"""Install the requirements of some of pyproject.toml's optional-dependency groups
(extras) into the running interpreter, without reinstalling convgrad itself.

``pip install -e '.[cli]'`` would rebuild the package, and with it the native
engine (three instruction sets, several minutes on 2 cores), once per extra; the
Makefile installs the package once and its extras with this script:

    python tools/install_extras.py cli peers
"""

import subprocess
import sys
import tomllib
from pathlib import Path


def requirements(extras: list[str]) -> list[str]:
    meta = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    groups = meta["project"]["optional-dependencies"]
    unknown = [e for e in extras if e not in groups]
    if unknown:
        raise SystemExit(f"unknown extras {unknown}; pyproject.toml has {sorted(groups)}")
    return [r for e in extras for r in groups[e]]


if __name__ == "__main__":
    reqs = requirements(sys.argv[1:])
    if reqs:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *reqs])
