"""Per-context settings: the algorithm to force, the workspace budget and the
number of threads.

Settings live in context variables, so a ``with convgrad.config(...)`` block
affects only the thread (or asyncio task) that entered it -- except the BLAS
thread limit, which is process-wide (see :func:`convgrad.config`).

The default workspace budget is a fraction (:data:`WORKSPACE_FRACTION`) of the
memory available when the call is made (``MemAvailable`` in /proc/meminfo,
see :mod:`convgrad.memory`), at least :data:`MIN_WORKSPACE_BYTES`; where the
available memory is unknown it is :data:`FALLBACK_WORKSPACE_BYTES`.
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
import warnings

# (at module level: a relative import inside a function runs importlib's Python on
# every call, which after a pause of the process costs a call microseconds)
from . import memory

WORKSPACE_FRACTION = 1 / 32
MIN_WORKSPACE_BYTES = 64 * 2**20
FALLBACK_WORKSPACE_BYTES = 512 * 2**20

_algo = contextvars.ContextVar("convgrad_algo", default="auto")
_workspace = contextvars.ContextVar("convgrad_workspace", default=None)
_threads = contextvars.ContextVar("convgrad_threads", default=None)
_isa = contextvars.ContextVar("convgrad_isa", default="auto")
_precision = contextvars.ContextVar("convgrad_precision", default="default")

ISAS = ("auto", "avx512", "avx2", "generic")
PRECISIONS = ("default", "highest")


def algo() -> str:
    """The kernel forced with ``config(algo=...)`` in this context, ``"auto"``
    (the chooser) by default."""
    return _algo.get()


def default_workspace_bytes() -> int:
    """The workspace budget when none is set: a fraction of the available memory."""
    avail = memory.available_bytes()
    if avail is None:
        return FALLBACK_WORKSPACE_BYTES
    return max(MIN_WORKSPACE_BYTES, int(avail * WORKSPACE_FRACTION))


def workspace_bytes() -> int:
    """The workspace budget of the current context, in bytes."""
    value = _workspace.get()
    return default_workspace_bytes() if value is None else value


def precision() -> str:
    """``"default"``: ``algo="auto"`` may choose a fast algorithm whose rounding error
    stays within a documented bound (Winograd, docs/decisions.md D24); ``"highest"``:
    only the direct kernels, the smallest error."""
    return _precision.get()


def isa() -> str:
    """The build of the native engine to use: ``"auto"`` (the best this CPU runs),
    ``"avx512"``, ``"avx2"`` or ``"generic"``."""
    return _isa.get()


@contextlib.contextmanager
def workspace_fixed():
    """Within the block, a default budget is read once (one ``MemAvailable``
    reading), so that the kernel chosen for a call and the kernel running it
    see the same budget; a budget set with :func:`config` stays as it is."""
    if _workspace.get() is not None:
        yield
        return
    token = _workspace.set(default_workspace_bytes())
    try:
        yield
    finally:
        _workspace.reset(token)


def key() -> tuple:
    """Every setting of the current context, as a key (the workspace budget as it is
    now: set, or the default from the memory reading at hand)."""
    value = _workspace.get()
    return (_algo.get(), default_workspace_bytes() if value is None else value,
            _threads.get(), _isa.get(), _precision.get())


def threads() -> int | None:
    """The thread count set with ``config(threads=...)``, None for the default.
    Kernels that run thread pools of their own use at most this many threads."""
    return _threads.get()


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return int(value)


def config(*, algo: str | None = None, workspace_bytes: int | None = None,
           threads: int | None = None, isa: str | None = None,
           precision: str | None = None):
    """Settings for the calls made inside the block (a context manager).

    The settings apply only inside ``with convgrad.config(...):``; a call whose
    result is never entered changes nothing and warns (``RuntimeWarning``) when
    the result is discarded.  The arguments are checked at once.

    Parameters
    ----------
    algo : str, optional
        Force a kernel (``"reference"``, ``"im2col"``, ...) or ``"auto"``.
    workspace_bytes : int, optional
        Budget in bytes for the kernels' temporary buffers (default: a
        fraction of the available memory, see :mod:`convgrad.settings`).
    threads : int, optional
        Number of threads: the BLAS thread pools (OpenBLAS, MKL, BLIS, set
        with threadpoolctl) are limited to it, and
        :func:`convgrad.settings.threads` returns it so kernels with thread
        pools of their own honour it.  The BLAS limit is
        **process-wide**: while the block runs it also applies to calls from
        other threads, and it is restored when the block exits (do not enter
        ``threads=`` blocks from several threads at once).
    isa : str, optional
        The build of the native engine (``"avx512"``, ``"avx2"``, ``"generic"``)
        or ``"auto"`` (default: the best one this CPU runs); forcing a build
        the CPU cannot run makes native-kernel calls raise ``ConvGradError``.
        ``convgrad.kernels.native.info()`` lists what is loaded.
    precision : {'default', 'highest'}, optional
        ``"default"``: ``algo="auto"`` may choose Winograd for 3-tap stride-1 layers
        when it is faster and its estimated relative L2 error stays within
        ``convgrad.kernels.winograd.ERROR_BOUND`` (1e-5; measured up to about 4x
        that of direct convolution); ``"highest"``: ``algo="auto"`` keeps the direct
        kernels, for the smallest error.  A kernel forced with ``algo`` runs
        either way.

    Returns
    -------
    convgrad.settings.Config
        The context manager (enter it with ``with``).

    Raises
    ------
    TypeError
        ``algo`` is not a string, or ``threads`` not an integer.
    ValueError
        ``workspace_bytes`` or ``threads`` is not positive, or ``isa`` or
        ``precision`` is not a known value.

    Examples
    --------
    >>> import convgrad
    >>> with convgrad.config(algo="reference", threads=1):
    ...     (convgrad.settings.algo(), convgrad.settings.threads())
    ('reference', 1)
    >>> convgrad.settings.algo(), convgrad.settings.threads()
    ('auto', None)
    """
    if algo is not None and not isinstance(algo, str):
        raise TypeError(f"algo must be a string, got {algo!r}")
    if workspace_bytes is not None:
        if int(workspace_bytes) < 1:
            raise ValueError(f"workspace_bytes must be positive, got {workspace_bytes!r}")
        workspace_bytes = int(workspace_bytes)
    if threads is not None:
        threads = _positive_int("threads", threads)
    if isa is not None and isa not in ISAS:
        raise ValueError(f"isa must be one of {', '.join(map(repr, ISAS))}, got {isa!r}")
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, "
                         f"got {precision!r}")
    return Config({"algo": algo, "workspace_bytes": workspace_bytes, "threads": threads,
                   "isa": isa, "precision": precision})


# the entries of Config blocks open in this context, innermost last
_ENTRIES = contextvars.ContextVar("convgrad_config_entries", default=())
_VARS = {"algo": _algo, "workspace_bytes": _workspace, "threads": _threads, "isa": _isa,
         "precision": _precision}


class Config:
    """What :func:`convgrad.config` returns: a context manager that sets its (checked)
    values on entry and restores the previous ones on exit.  It may be entered again,
    nested, and from several threads or asyncio tasks at once (each entry belongs to the
    context that made it).  Discarded without ever being entered, it warns: a bare
    ``convgrad.config(threads=1)`` statement looks like a global setting and is none."""

    __slots__ = ("_values", "_entered")

    def __init__(self, values: dict):
        self._values = {k: v for k, v in values.items() if v is not None}
        self._entered = False

    def __enter__(self) -> "Config":
        self._entered = True
        stack = contextlib.ExitStack()
        if "threads" in self._values:
            stack.enter_context(_blas_controller().limit(limits=self._values["threads"],
                                                         user_api="blas"))
        tokens = [(_VARS[k], _VARS[k].set(v)) for k, v in self._values.items()]
        _ENTRIES.set(_ENTRIES.get() + ((stack, tokens),))
        return self

    def __exit__(self, *exc) -> None:
        entries = _ENTRIES.get()               # (with blocks nest: ours is the last)
        _ENTRIES.set(entries[:-1])
        stack, tokens = entries[-1]
        try:
            for var, token in reversed(tokens):
                var.reset(token)
        finally:
            stack.close()

    def __del__(self):
        if not self._entered:
            args = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
            warnings.warn(f"convgrad.config({args}) was never entered: its settings apply "
                          f"only inside 'with convgrad.config(...):'", RuntimeWarning,
                          stacklevel=2)


_CONTROLLER: list = [None, -1]


def _blas_controller():
    """threadpoolctl's view of the loaded BLAS libraries, made again only when modules
    have been imported since (a new one may load a BLAS): ``threadpool_limits`` looks
    for them on every call, 1.7 ms per ``config(threads=...)`` block, against 0.06 ms
    with the controller kept."""
    import sys
    if _CONTROLLER[0] is None or _CONTROLLER[1] != len(sys.modules):
        from threadpoolctl import ThreadpoolController
        _CONTROLLER[0] = ThreadpoolController()
        _CONTROLLER[1] = len(sys.modules)
    return _CONTROLLER[0]


def snapshot() -> dict:
    """The settings of the current context, to re-apply elsewhere with
    :func:`applied` (e.g. in the tasks of a Dask graph built here)."""
    return {name: var.get() for name, var in _VARS.items()}


@contextlib.contextmanager
def applied(settings: dict):
    """Re-apply a :func:`snapshot` in this context: the context variables
    only, not :func:`config`'s process-wide BLAS limit, so tasks running
    concurrently in one process may each enter it."""
    tokens = [(var, var.set(settings[name])) for name, var in _VARS.items()
              if settings.get(name) is not None]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)
