"""Per-context settings: the algorithm to force and the workspace budget.

Settings live in context variables, so a ``with convgrad.config(...)`` block
affects only the thread (or asyncio task) that entered it.
"""

from __future__ import annotations

import contextlib
import contextvars

DEFAULT_WORKSPACE_BYTES = 512 * 2**20

_algo = contextvars.ContextVar("convgrad_algo", default="auto")
_workspace = contextvars.ContextVar("convgrad_workspace", default=DEFAULT_WORKSPACE_BYTES)


def algo() -> str:
    return _algo.get()


def workspace_bytes() -> int:
    return _workspace.get()


@contextlib.contextmanager
def config(*, algo: str | None = None, workspace_bytes: int | None = None):
    """Force a kernel (``algo="reference"``, ``"im2col"``, or ``"auto"``) and/or
    set the workspace budget in bytes for the calls made inside the block."""
    tokens = []
    if algo is not None:
        if not isinstance(algo, str):
            raise TypeError(f"algo must be a string, got {algo!r}")
        tokens.append((_algo, _algo.set(algo)))
    if workspace_bytes is not None:
        if int(workspace_bytes) < 1:
            raise ValueError(f"workspace_bytes must be positive, got {workspace_bytes!r}")
        tokens.append((_workspace, _workspace.set(int(workspace_bytes))))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)
