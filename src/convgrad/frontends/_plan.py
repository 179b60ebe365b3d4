"""What every spec front-end shares: the plan of one call and the op registry.

A front-end op is written once, as a *plan function*: it receives its tensor
inputs as :class:`TensorSpec` (shape only) and its shape inputs and attributes
by value, validates them, and returns a :class:`Plan` -- the canonical
geometry, how each tensor maps to the canonical layout, and how the canonical
result maps back.  :func:`spec_op` turns a plan function into

- the public function (arrays in, array out), with the plan function's exact
  signature and docstring;
- an entry of :data:`OPS`, from which :func:`convgrad.op` builds objects with
  ``infer_shape`` (no data) and ``__call__``.
"""

from __future__ import annotations

import collections
import functools
import inspect
import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import kernels, layouts, memory, ops, settings
from .._late import module as _late
from ..dtypes import FLOAT_DTYPES, as_array, common_dtype
from ..errors import fail
from ..geometry import ConvGeometry, MAX_DIM


@dataclass(frozen=True)
class TensorSpec:
    """A tensor known by its shape only (for shape inference without data)."""

    shape: tuple[int, ...]

    @classmethod
    def of(cls, op: str, name: str, value) -> "TensorSpec":
        if isinstance(value, TensorSpec):
            return value
        try:
            shape = tuple(value)
        except TypeError:
            raise fail(op, f"shape of {name}", value, "must be a sequence of integers") from None
        for v in shape:
            if (isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer))
                    or v < 0 or v > MAX_DIM):
                raise fail(op, f"shape of {name}", list(shape),
                           "must contain non-negative integers")
        return cls(tuple(int(v) for v in shape))


@dataclass
class Plan:
    """One validated call: canonical geometry plus the layout adapters.

    ``roles`` maps each tensor input name to ``(role, to_canonical)``, role in
    ``x``, ``w``, ``dy``, ``bias``; ``from_canonical`` maps the canonical result
    (in the compute dtype) to the spec layout; ``result_layouts``: the kernel
    layouts whose result it maps to a C-contiguous array (no copy), which the
    kernel chooser weighs (``ops.compute``).
    """

    op: str
    kind: str
    geom: ConvGeometry
    roles: dict[str, tuple[str, Callable]]
    from_canonical: Callable
    out_shape: tuple[int, ...]
    allow_int: bool = False
    result_layouts: frozenset = frozenset({"ncx", "nxc"})
    # the runners of this plan's recent calls, by their arrays' names, strides and
    # dtypes and by the settings (see run)
    _runners: dict = field(default_factory=dict, repr=False, compare=False)

    def run(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """The result of the call with these arrays (shaped as the plan says).

        What the call decides from its arrays' strides and dtypes and from the
        settings -- its dtype, what admission needs, the kernel and what happens
        around it (``ops.prepare``) -- is kept in a :class:`_Runner` for the next
        calls that bring the same (a training loop; the same kernel registry, see
        ``kernels.generation``): after a pause of the process, the Python the
        decisions take cost a call milliseconds, each of its objects and lines of
        code cold again."""
        key = (tuple([(name, a.strides, a.dtype) for name, a in arrays.items()]),
               settings.key())
        runner = self._runners.get(key)
        if runner is None or runner.generation != kernels.generation():
            runner = self._runner(arrays)
            if len(self._runners) >= _RUNNERS_MAX:
                self._runners.clear()
            self._runners[key] = runner
        return runner(arrays)

    def _runner(self, arrays: dict[str, np.ndarray]) -> "_Runner":
        dtype = common_dtype(self.op, arrays, allow_int=self.allow_int)
        names = {role: name for name, (role, _) in self.roles.items() if name in arrays}
        canon = {role: self.roles[name][1](arrays[name]) for role, name in names.items()}
        a, b = _OPERANDS[self.kind]
        need = memory.admit(self.op, self.kind, canon[a], canon[b], self.geom, dtype)
        # a float16/bfloat16 result rounded once where it is stored, unless a bias
        # is still to be added in the compute dtype
        with settings.workspace_fixed():
            prepared = ops.prepare(self.kind, canon[a], canon[b], self.geom, dtype,
                                   result_layouts=self.result_layouts,
                                   result_in_dtype="bias" not in canon)
        return _Runner(self, dtype, names[a], names[b], names.get("bias"), need, prepared,
                       kernels.generation())

    def finish(self, out: np.ndarray, dtype: np.dtype, bias: np.ndarray | None) -> np.ndarray:
        """The canonical result of a kernel (compute dtype) as the caller gets it."""
        if bias is not None:
            out += bias.astype(out.dtype).reshape((1, -1) + (1,) * self.geom.spatial_rank)
        out = self.from_canonical(out)
        assert out.shape == self.out_shape, (out.shape, self.out_shape)
        if out.dtype != dtype and dtype in FLOAT_DTYPES and self.kind == "wgrad":
            # a weight gradient made contiguous first (a permuted copy on the engine's
            # threads where large): the fast casts, the engine's from 64 Ki values
            out = layouts.contiguous(out)
        out = cast_result(out, dtype, order="C")
        return _owner(layouts.contiguous(out))


_OPERANDS = {"fwd": ("x", "w"), "wgrad": ("x", "dy"), "dgrad": ("w", "dy")}
# runners kept per plan (a call's arrays come in a few stride patterns at most)
_RUNNERS_MAX = 8


@dataclass(frozen=True)
class _Runner:
    """One call of a plan, decided (``Plan.run``): its arrays in the canonical views,
    admission against the memory reading at hand (a fresh one for a call that needs a
    large share of it: ``memory.admit_again``), the prepared kernel in the workspace
    budget it was chosen for, the result back in the spec layout and dtype."""

    plan: Plan
    dtype: np.dtype
    a: str
    b: str
    bias: str | None
    need: int
    prepared: ops.Prepared
    generation: int
    # [calls so far, the bound call: None until the second call, False if none]
    _fast: list = field(default_factory=lambda: [0, None], repr=False, compare=False)

    def __call__(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        fast = self._fast
        if fast[1] is None:
            fast[0] += 1
            if fast[0] >= 2:
                fast[1] = _fast_call(self, arrays) or False
        if fast[1]:
            out = fast[1](arrays[self.a], arrays[self.b])
            if out is not None:
                return out
        plan, roles = self.plan, self.plan.roles
        a = roles[self.a][1](arrays[self.a])
        b = roles[self.b][1](arrays[self.b])
        memory.admit_again(self.need, plan.op, plan.kind, a, b, plan.geom, self.dtype)
        with settings.workspace_fixed():
            out = self.prepared.run(a, b)
        bias = None if self.bias is None else roles[self.bias][1](arrays[self.bias])
        return plan.finish(out, self.dtype, bias)


def _fast_call(runner: _Runner, arrays: dict[str, np.ndarray]):
    """The runner's call bound (``kernels._bound``), from its second call on: a function
    of the caller's two arrays that goes straight to the kernel's bound call (the views
    the kernel reads made by one transpose or reshape each) and returns the result as
    :meth:`Plan.finish` would, or None where the full path must run (a call that needs a
    fresh memory reading, the bound call busy on another thread).  None when the
    kernel does not bind this call, or the call has a bias or copies its inputs."""
    from ..kernels import _bound
    prepared, plan = runner.prepared, runner.plan
    kernel = prepared.kernel
    if (not _bound.ENABLED or kernel.bind is None or runner.bias is not None
            or kernel.layout != "nxc" or not kernel.converts or np.dtype(prepared.cdt).kind != "f"
            or not (kernel.half_io or prepared.whole == (False, False))):
        return None
    ra, rb = arrays[runner.a], arrays[runner.b]
    wa, wb = ops._WEIGHT_ARGS[plan.kind]
    ka = ops.to_nxc(plan.roles[runner.a][1](ra), wa)
    kb = ops.to_nxc(plan.roles[runner.b][1](rb), wb)
    va, vb = _view_maker(ra, ka), _view_maker(rb, kb)
    if va is None or vb is None:
        return None
    with settings.workspace_fixed():
        bound = kernel.bind(ka, kb, plan.geom, prepared.out_dtype,
                            **ops.told_layout(kernel, prepared.result_layout))
    if bound is None:
        return None
    need, dtype, weights = runner.need, runner.dtype, plan.kind == "wgrad"
    finished = []
    from ..kernels import native
    wake = native.waker(plan.geom.flops) or (lambda: None)

    def full_finish(out):
        return plan.finish(ops.from_nxc(out, weights), dtype, None)

    def run(a, b):
        wake()                             # (the engine's workers, for its first section)
        avail = memory.available_bytes()
        if avail is not None and need * memory.ADMIT_FRESH > avail:
            return None                  # (the full path admits it on a fresh reading)
        out = bound(va(a), vb(b))
        if out is None:
            return None
        if finished and out.dtype == finished[1]:
            return finished[0](out)
        result = full_finish(out)
        if not finished:
            # (how the first result was finished holds for results of its dtype: a
            # kernel may fall back to another one, e.g. Winograd's float32 recomputation)
            finished.extend((_finisher(out, result) or full_finish, out.dtype))
        return result
    run.bound = bound                  # (the kernel's bound call, for the tests)
    return run


def _view_maker(raw: np.ndarray, view: np.ndarray):
    """A function that makes, from an array of ``raw``'s shape, strides and dtype, the
    view ``view`` is of ``raw`` (one transpose, then a reshape where the ranks
    differ); None when ``view`` is not such a view."""
    if raw.dtype != view.dtype or raw.ctypes.data != view.ctypes.data or raw.ndim > 6:
        return None
    if raw.shape == view.shape and raw.strides == view.strides:
        return lambda a: a
    shape = view.shape
    for perm in itertools.permutations(range(raw.ndim)):
        t = raw.transpose(perm)
        if t.shape == shape and t.strides == view.strides:
            return lambda a: a.transpose(perm)
        if t.ndim != view.ndim and t.size == view.size:
            r = t.reshape(shape)
            if r.ctypes.data == view.ctypes.data and r.strides == view.strides:
                return lambda a: a.transpose(perm).reshape(shape)
    return None


def _finisher(out: np.ndarray, result: np.ndarray):
    """How :meth:`Plan.finish` turned the kernel result ``out`` into ``result``, when it
    only viewed it: a function doing that to the next result; else None."""
    if result is out:
        return lambda o: o
    if result.dtype != out.dtype or result.ctypes.data != out.ctypes.data:
        return None
    for perm in itertools.permutations(range(out.ndim)) if out.ndim <= 6 else ():
        t = out.transpose(perm)
        if t.shape == result.shape and t.strides == result.strides:
            return lambda o: o.transpose(perm)
    return None


def cast_result(out: np.ndarray, dtype: np.dtype, *, order: str = "K") -> np.ndarray:
    """A kernel's result (compute dtype, a fresh array or a view of one) in the
    call's ``dtype``: integers saturate, floats round once.  ``order`` is the
    memory order of a cast copy."""
    if dtype.kind in "iu":
        out = _saturate(out, dtype)
    if out.dtype == dtype:
        return out
    # (large float32 results to 16 bits: the engine's threads)
    fast = _late("convgrad.kernels.native").narrowed_copy(out, dtype)
    if fast is not None:
        return fast
    if dtype == np.float16:
        to_float16 = _late("convgrad._half").to_float16     # NumPy's float16 cast is slow
        if out.flags.c_contiguous:
            return to_float16(out)
        if order == "K" and out.ndim > 2:  # a channels-last result seen as NCX
            nxc = np.moveaxis(out, 1, -1)
            if nxc.flags.c_contiguous:
                return np.moveaxis(to_float16(nxc), -1, 1)
    return out.astype(dtype, order=order)


def _owner(out: np.ndarray) -> np.ndarray:
    """The array that owns ``out``'s memory, when ``out`` is a view of all of it
    in the same shape and order (a kernel's result seen through two inverse
    layout views): callers get an array that owns its data."""
    root = out
    while isinstance(root.base, np.ndarray):
        root = root.base
    if (root is not out and root.shape == out.shape and root.strides == out.strides
            and root.dtype == out.dtype and root.ctypes.data == out.ctypes.data):
        return root
    return out


def _saturate(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Clamp an exact int64 result to ``dtype``'s range (as OpenVINO's CPU runtime
    does on overflow) before the cast back."""
    info, wide = np.iinfo(dtype), np.iinfo(np.int64)
    # in place: ``a`` is (a view of) the kernel's fresh result, never an input
    return np.clip(a, max(info.min, wide.min), min(info.max, wide.max), out=a)


@dataclass(frozen=True)
class OpDef:
    name: str
    dialect: str
    plan: Callable
    function: Callable
    inputs: tuple[str, ...]          # positional inputs, in spec order
    tensors: tuple[str, ...]         # which inputs are tensors (the rest are shapes)
    shape_attrs: tuple[str, ...]     # shape inputs that may also be given as attributes

    @property
    def attributes(self) -> tuple[str, ...]:
        params = inspect.signature(self.plan).parameters
        return tuple(p for p in params if p not in self.inputs or p in self.shape_attrs)


OPS: dict[str, OpDef] = {}


# Plans of recent calls, by op and arguments (tensors by shape): a training loop or a
# benchmark calls one op with the same sizes and attributes again and again, and a
# plan depends on nothing else.  Only arguments that freeze into a key are cached.
_PLANS: "collections.OrderedDict[tuple, Plan]" = collections.OrderedDict()
_PLANS_MAX = 256
_PLANS_LOCK = threading.Lock()


_SCALARS = frozenset({int, float, bool, str, type(None)})


def _freeze(value):
    """A hashable key for an argument, with every type kept (1, 1.0 and True differ:
    validation tells them apart); TypeError for what it cannot freeze."""
    t = type(value)
    if t in _SCALARS:
        return (t.__name__, value)
    if t is list or t is tuple:
        return (t.__name__, tuple(map(_freeze, value)))
    if isinstance(value, TensorSpec):
        return ("T", value.shape)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf" or value.size > 64:
            raise TypeError("not cached")
        return ("nd", value.dtype.str, value.shape, tuple(value.ravel().tolist()))
    if value is None or isinstance(value, (bool, int, float, str, np.generic)):
        return (type(value).__name__, value)
    raise TypeError("not cached")


def _cached_plan(plan, bound) -> "Plan":
    try:
        key = (plan, tuple((k, _freeze(v)) for k, v in bound.arguments.items()))
        hash(key)
    except TypeError:
        return plan(*bound.args, **bound.kwargs)
    with _PLANS_LOCK:
        found = _PLANS.get(key)
        if found is not None:
            _PLANS.move_to_end(key)
            return found
    made = plan(*bound.args, **bound.kwargs)
    _remember(key, made)
    return made


def _remember(key, made: "Plan") -> None:
    with _PLANS_LOCK:
        _PLANS[key] = made
        while len(_PLANS) > _PLANS_MAX:
            _PLANS.popitem(last=False)


def spec_op(name: str, dialect: str, *, inputs: tuple[str, ...], tensors: tuple[str, ...],
            shape_attrs: tuple[str, ...] = (), aliases: tuple[str, ...] = ()):
    """Register a plan function as spec op ``name`` and return its public function."""

    def deco(plan_fn: Callable) -> Callable:
        sig = inspect.signature(plan_fn)
        required = [t for t in tensors if sig.parameters[t].default is inspect.Parameter.empty]

        @functools.wraps(plan_fn)
        def plan(*args, **kwargs) -> Plan:
            bound = sig.bind(*args, **kwargs)
            for t in required:
                if bound.arguments.get(t) is None:
                    raise fail(name, f"input {t!r}", None, "is required")
            return plan_fn(*bound.args, **bound.kwargs)

        params = tuple(sig.parameters)
        tensor_set = frozenset(tensors)

        def call_key(args, kwargs, arrays):
            """The plan cache key of a call as it is spelled (positional and keyword
            arguments, tensors by shape), filling ``arrays``; None if an argument
            does not freeze or does not exist (the full path then reports it)."""
            try:
                items = []
                for i, value in enumerate(args):
                    p = params[i]
                    if p in tensor_set and value is not None:
                        a = arrays[p] = as_array(name, p, value)
                        items.append(("T", a.shape))
                    else:
                        items.append(_freeze(value))
                for p, value in kwargs.items():
                    if p in tensor_set and value is not None:
                        a = arrays[p] = as_array(name, p, value)
                        items.append((p, ("T", a.shape)))
                    else:
                        items.append((p, _freeze(value)))
                key = ("as called", plan, tuple(items))
                hash(key)
                return key
            except (TypeError, IndexError):
                return None

        @functools.wraps(plan_fn)
        def public(*args, **kwargs):
            # a call spelled as an earlier one takes its plan without binding the
            # arguments (~25 us of a few-ms call)
            arrays = {}
            key = call_key(args, kwargs, arrays)
            if key is not None:
                with _PLANS_LOCK:
                    found = _PLANS.get(key)
                    if found is not None:
                        _PLANS.move_to_end(key)
                if found is not None:
                    return found.run(arrays)
            bound = sig.bind(*args, **kwargs)
            arrays = {}
            for t in tensors:
                value = bound.arguments.get(t)
                if value is not None:
                    arrays[t] = as_array(name, t, value)
                    bound.arguments[t] = TensorSpec(arrays[t].shape)
            made = _cached_plan(plan, bound)
            if key is not None:
                _remember(key, made)
            return made.run(arrays)

        public.__signature__ = plan.__signature__ = sig
        entry = OpDef(name, dialect, plan, public, inputs, tensors, shape_attrs)
        for key in (f"{dialect}:{name}", *aliases):
            OPS[key] = entry
        return public

    return deco
