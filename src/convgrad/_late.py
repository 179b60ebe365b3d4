"""Modules imported on first use, then looked up without the import machinery.

A module that would make an import cycle at load time (the native engine's, which
imports the layouts and front-end helpers that call it), or one that is costly to load
(numba's, for float16), is imported where it is first needed.  An ``import`` statement
inside a function runs importlib's Python on every call, which after a pause of the
process costs a call microseconds, its code cold (docs/kernels.md, "Where a call's time
goes after the pause"); :func:`module` runs it once.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType


@functools.cache
def module(name: str) -> ModuleType:
    """The module ``name`` (absolute), imported on the first call."""
    return importlib.import_module(name)
