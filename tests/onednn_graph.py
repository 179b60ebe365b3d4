"""Run one op of the real oneDNN Graph library through its C API (ctypes), in a
child process.

The library is ``libdnnl.so.3`` of the ``onednn-cpu-gomp`` 2023.2.0 wheel
(oneDNN v3.2, CPU only, no Python bindings), which pip puts in
``sys.prefix + "/lib"``.  Values of the C API (op kinds, attribute ids, enum
values, the logical-tensor struct) are those of v3.2's
``include/oneapi/dnnl/dnnl_graph_types.h`` and ``dnnl_common_types.h``.

Why a child process: oneDNN 3.2 lets C++ exceptions escape its C API on some
inputs, and the process aborts.  A :class:`Runner` keeps one worker process
(this file run as a script) that loads the library once and forks a child for
each op it is sent over a pipe, so an abort ends one child -- one case,
reported as :attr:`Outcome.status` ``"aborted"`` with the library's last
words -- and neither the worker nor the test run.  (A fork costs about 6 ms
here, starting a new worker about 0.2 s.)

One call builds a graph holding the single op, finalizes and partitions it,
compiles the partition twice -- once with an output of unknown shape and
layout ``any`` to learn the shape the library infers, once with that shape in
a dense row-major layout -- and executes it on the float32 inputs.  A refusal
at any step is reported with the step, the status name and whatever the
library printed with ``ONEDNN_VERBOSE=check`` / ``ONEDNN_GRAPH_VERBOSE=check``.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

LIBRARY_PATH = os.path.join(sys.prefix, "lib", "libdnnl.so.3")

# dnnl_graph_op_kind_t (v3.2): the position in the enum.
OP_KINDS = {"Convolution": 13, "ConvolutionBackwardData": 14,
            "ConvolutionBackwardWeights": 15, "ConvTranspose": 16,
            "ConvTransposeBackwardData": 17, "ConvTransposeBackwardWeights": 18}
# dnnl_graph_op_attr_t (v3.2): 0x30-0x3f s64 scalars, 0x40-0x5f s64 vectors,
# 0x80-0x9f strings.
ATTRS = {"groups": 0x32, "dilations": 0x41, "dst_shape": 0x42, "output_padding": 0x45,
         "pads_begin": 0x46, "pads_end": 0x47, "strides": 0x4B, "weights_shape": 0x4C,
         "auto_pad": 0x81, "data_format": 0x83, "weights_format": 0x87}
STATUS = {0: "success", 1: "out_of_memory", 2: "invalid_arguments", 3: "unimplemented",
          4: "last_impl_reached", 5: "runtime_error", 6: "not_required", 7: "invalid_graph",
          8: "invalid_graph_op", 9: "invalid_shape", 10: "invalid_data_type"}
F32, S32 = 3, 4                          # dnnl_data_type_t
LAYOUT_ANY, LAYOUT_STRIDED = 1, 2        # dnnl_graph_layout_type_t
VARIABLE = 1                             # dnnl_graph_tensor_property_t
POLICY_FUSION = 1                        # dnnl_graph_partition_policy_t
ENGINE_CPU = 1                           # dnnl_engine_kind_t
STREAM_DEFAULT = 1                       # dnnl_stream_default_flags (in order)
MAX_NDIMS = 12
UNKNOWN_DIM = -(2**63)                   # DNNL_GRAPH_UNKNOWN_DIM = INT64_MIN


@dataclass
class Request:
    """One op: ``inputs`` as arrays (float32; an int32 array is an s32 shape
    input), ``attrs`` by spec name (ints, int lists or strings), the output's
    rank."""

    op: str
    inputs: list
    attrs: dict
    out_ndims: int


@dataclass
class Outcome:
    """``status``: ``"ok"`` (``output`` holds the result), ``"refused"`` (a
    C API call returned an error: ``stage`` and ``code`` say which and how),
    ``"aborted"`` (the worker died: ``code`` is its exit status), or
    ``"timeout"``.  ``reason`` is what the library printed about it."""

    status: str
    output: np.ndarray | None = None
    stage: str = ""
    code: str = ""
    reason: str = ""
    log: list = field(default_factory=list)

    def describe(self) -> str:
        what = {"refused": f"refused at {self.stage}: {self.code}",
                "aborted": f"aborted the process ({self.code})",
                "timeout": "did not answer in time"}.get(self.status)
        if what is None:
            what = "computed" + (f" shape {list(self.output.shape)}"
                                 if self.output is not None else "")
        return what + (f" -- {self.reason}" if self.reason else "")


# ----------------------------------------------------------------------------
# The worker side: ctypes calls into the library
# ----------------------------------------------------------------------------


class LogicalTensor(ctypes.Structure):
    """dnnl_graph_logical_tensor_t; the last member is the union
    {int64 strides[12]; size_t layout_id}."""

    _fields_ = [("id", ctypes.c_size_t), ("ndims", ctypes.c_int),
                ("dims", ctypes.c_int64 * MAX_NDIMS), ("data_type", ctypes.c_int),
                ("property", ctypes.c_int), ("layout_type", ctypes.c_int),
                ("strides", ctypes.c_int64 * MAX_NDIMS)]


class Refused(Exception):
    def __init__(self, stage: str, code: int):
        super().__init__(stage, code)
        self.stage, self.code = stage, STATUS.get(code, str(code))


_P = ctypes.POINTER
_H = ctypes.c_void_p
_SIGNATURES = {
    "dnnl_engine_create": (_P(_H), ctypes.c_int, ctypes.c_size_t),
    "dnnl_stream_create": (_P(_H), _H, ctypes.c_uint),
    "dnnl_stream_wait": (_H,),
    "dnnl_graph_graph_create": (_P(_H), ctypes.c_int),
    "dnnl_graph_graph_destroy": (_H,),
    "dnnl_graph_op_create": (_P(_H), ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p),
    "dnnl_graph_op_destroy": (_H,),
    "dnnl_graph_op_add_input": (_H, _P(LogicalTensor)),
    "dnnl_graph_op_add_output": (_H, _P(LogicalTensor)),
    "dnnl_graph_op_set_attr_s64": (_H, ctypes.c_int, _P(ctypes.c_int64), ctypes.c_size_t),
    "dnnl_graph_op_set_attr_str": (_H, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t),
    "dnnl_graph_add_op": (_H, _H),
    "dnnl_graph_graph_finalize": (_H,),
    "dnnl_graph_graph_filter": (_H, ctypes.c_int),
    "dnnl_graph_graph_get_partition_num": (_H, _P(ctypes.c_size_t)),
    "dnnl_graph_graph_get_partitions": (_H, ctypes.c_size_t, _P(_H)),
    "dnnl_graph_partition_destroy": (_H,),
    "dnnl_graph_partition_is_supported": (_H, _P(ctypes.c_uint8)),
    "dnnl_graph_partition_compile": (_H, _H, ctypes.c_size_t, _P(_P(LogicalTensor)),
                                     ctypes.c_size_t, _P(_P(LogicalTensor)), _H),
    "dnnl_graph_compiled_partition_create": (_P(_H), _H),
    "dnnl_graph_compiled_partition_destroy": (_H,),
    "dnnl_graph_compiled_partition_query_logical_tensor": (_H, ctypes.c_size_t,
                                                           _P(LogicalTensor)),
    "dnnl_graph_compiled_partition_execute": (_H, _H, ctypes.c_size_t, _P(_H),
                                              ctypes.c_size_t, _P(_H)),
    "dnnl_graph_tensor_create": (_P(_H), _P(LogicalTensor), _H, _H),
    "dnnl_graph_tensor_destroy": (_H,),
}


class _Library:
    """The C API with every signature declared (handles are 64-bit pointers:
    the default int return and argument types would truncate them)."""

    def __init__(self, path: str):
        self.dll = ctypes.CDLL(path)
        for name, args in _SIGNATURES.items():
            fn = getattr(self.dll, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        self.libc = ctypes.CDLL(None)
        self.libc.fflush.argtypes = [ctypes.c_void_p]
        self.engine, self.stream = _H(), _H()

    def open(self) -> None:
        """Create the CPU engine and a stream (in the worker, once: the forked
        children inherit them)."""
        self.call("engine", "dnnl_engine_create", ctypes.byref(self.engine), ENGINE_CPU, 0)
        self.call("stream", "dnnl_stream_create", ctypes.byref(self.stream), self.engine,
                  STREAM_DEFAULT)

    def call(self, stage: str, name: str, *args) -> None:
        code = getattr(self.dll, name)(*args)
        if code != 0:
            raise Refused(stage, code)


def _lt(tid: int, shape, layout: int = LAYOUT_STRIDED, dtype: int = F32) -> LogicalTensor:
    lt = LogicalTensor(id=tid, ndims=len(shape), data_type=dtype, property=VARIABLE,
                       layout_type=layout)
    stride = 1
    for i in reversed(range(len(shape))):
        lt.dims[i] = shape[i]
        if layout == LAYOUT_STRIDED and shape[i] != UNKNOWN_DIM:
            lt.strides[i] = stride
            stride *= max(shape[i], 1)
    return lt


def _set_attrs(lib: _Library, op, attrs: dict) -> None:
    for name, value in attrs.items():
        stage = f"set attribute {name}"
        if isinstance(value, str):
            raw = value.encode()
            lib.call(stage, "dnnl_graph_op_set_attr_str", op, ATTRS[name], raw, len(raw))
        elif isinstance(value, int):
            v = ctypes.c_int64(value)
            lib.call(stage, "dnnl_graph_op_set_attr_s64", op, ATTRS[name], ctypes.byref(v), 0)
        else:
            vals = (ctypes.c_int64 * max(len(value), 1))(*value)
            lib.call(stage, "dnnl_graph_op_set_attr_s64", op, ATTRS[name], vals, len(value))


def _compile(lib: _Library, partition, ins: list, out: LogicalTensor):
    cp = _H()
    lib.call("compile", "dnnl_graph_compiled_partition_create", ctypes.byref(cp), partition)
    in_ptrs = (_P(LogicalTensor) * len(ins))(*(ctypes.pointer(lt) for lt in ins))
    out_ptrs = (_P(LogicalTensor) * 1)(ctypes.pointer(out))
    try:
        lib.call("compile", "dnnl_graph_partition_compile", partition, cp, len(ins), in_ptrs,
                 1, out_ptrs, lib.engine)
    except Refused:
        lib.dll.dnnl_graph_compiled_partition_destroy(cp)
        raise
    return cp


def run_in_process(lib: _Library, req: Request) -> np.ndarray:
    """Build, compile and execute ``req``'s op; raises :class:`Refused`."""
    arrays = [np.ascontiguousarray(a, dtype=np.int32 if a.dtype == np.int32 else np.float32)
              for a in req.inputs]            # int32: a shape given as an input tensor
    ins = [_lt(i, a.shape, dtype=S32 if a.dtype == np.int32 else F32)
           for i, a in enumerate(arrays)]
    out_id = len(ins)
    graph, op, parts = _H(), _H(), []
    lib.call("graph", "dnnl_graph_graph_create", ctypes.byref(graph), ENGINE_CPU)
    try:
        lib.call("op", "dnnl_graph_op_create", ctypes.byref(op), 0, OP_KINDS[req.op],
                 req.op.encode())
        for lt in ins:
            lib.call("op input", "dnnl_graph_op_add_input", op, ctypes.byref(lt))
        unknown = _lt(out_id, [UNKNOWN_DIM] * req.out_ndims, LAYOUT_ANY)
        lib.call("op output", "dnnl_graph_op_add_output", op, ctypes.byref(unknown))
        _set_attrs(lib, op, req.attrs)
        lib.call("add_op", "dnnl_graph_add_op", graph, op)
        lib.call("finalize", "dnnl_graph_graph_finalize", graph)
        lib.call("filter", "dnnl_graph_graph_filter", graph, POLICY_FUSION)
        num = ctypes.c_size_t()
        lib.call("partitions", "dnnl_graph_graph_get_partition_num", graph, ctypes.byref(num))
        if num.value != 1:
            raise Refused(f"partitions ({num.value}, want 1)", 3)
        handles = (_H * 1)()
        lib.call("partitions", "dnnl_graph_graph_get_partitions", graph, 1, handles)
        parts = [handles[0]]
        ok = ctypes.c_uint8()
        lib.call("is_supported", "dnnl_graph_partition_is_supported", parts[0],
                 ctypes.byref(ok))
        if not ok.value:
            raise Refused("is_supported (false)", 3)
        # 1) learn the output shape the library infers, 2) compile for a dense output
        cp = _compile(lib, parts[0], ins, unknown)
        inferred = LogicalTensor()
        try:
            lib.call("query output", "dnnl_graph_compiled_partition_query_logical_tensor", cp,
                     out_id, ctypes.byref(inferred))
        finally:
            lib.dll.dnnl_graph_compiled_partition_destroy(cp)
        shape = tuple(inferred.dims[i] for i in range(inferred.ndims))
        if inferred.ndims != req.out_ndims or any(v < 0 for v in shape):
            raise Refused(f"output shape {list(shape)}", 9)
        out_lt = _lt(out_id, shape)
        cp = _compile(lib, parts[0], ins, out_lt)
        try:
            result = np.zeros(shape, np.float32)
            tensors = []
            for lt, a in zip([*ins, out_lt], [*arrays, result]):
                t = _H()
                lib.call("tensor", "dnnl_graph_tensor_create", ctypes.byref(t), ctypes.byref(lt),
                         lib.engine, a.ctypes.data_as(_H))
                tensors.append(t)
            try:
                t_in = (_H * len(ins))(*tensors[:-1])
                t_out = (_H * 1)(tensors[-1])
                lib.call("execute", "dnnl_graph_compiled_partition_execute", cp, lib.stream,
                         len(ins), t_in, 1, t_out)
                lib.call("execute", "dnnl_stream_wait", lib.stream)
            finally:
                for t in tensors:
                    lib.dll.dnnl_graph_tensor_destroy(t)
        finally:
            lib.dll.dnnl_graph_compiled_partition_destroy(cp)
        return result
    finally:
        for p in parts:
            lib.dll.dnnl_graph_partition_destroy(p)
        if op:
            lib.dll.dnnl_graph_op_destroy(op)
        lib.dll.dnnl_graph_graph_destroy(graph)


def _send(stream, obj) -> None:
    """Length-prefixed pickle of plain data (dicts, lists, arrays): the two
    sides know this module under different names (``__main__`` in the worker)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _serve(path: str, timeout: float) -> None:
    """The worker's loop: requests from stdin, outcomes to stdout.  The worker
    only loads the library; each op runs in a child forked for it, whose
    standard output and error (the library's verbose lines, an uncaught
    exception's last words) go to a log that comes back with the outcome, so
    an abort ends that child and the worker answers the next request."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))    # an abort writes no core file
    proto = os.fdopen(os.dup(1), "wb")
    requests = os.fdopen(0, "rb")
    log = tempfile.TemporaryFile()
    os.dup2(log.fileno(), 1)                           # the library prints to stdout
    try:
        lib = _Library(path)
        lib.open()
        _warm_up(lib)
        lib.libc.fflush(None)
    except (OSError, Refused) as exc:
        _send(proto, vars(Outcome("refused", stage="load", reason=str(exc))))
        return
    _send(proto, vars(Outcome("ok")))
    while True:
        head = requests.read(8)
        if len(head) < 8:
            return
        req = Request(**pickle.loads(requests.read(struct.unpack("<Q", head)[0])))
        log.seek(0)
        log.truncate()
        _send(proto, vars(_run_forked(lib, req, log, timeout)))


def _warm_up(lib: _Library) -> None:
    """One small Convolution in the worker itself, so that the library's
    one-time initialisation is inherited by every forked child instead of
    repeated in each (a third of a call's time).  With one OpenMP thread the
    library starts no threads, so forking after it is safe."""
    x = np.zeros((1, 4, 4, 2), np.float32)
    w = np.zeros((3, 3, 2, 2), np.float32)
    run_in_process(lib, Request("Convolution", [x, w], dict(
        strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1]), 4))


def _run_forked(lib: _Library, req: Request, log, timeout: float) -> Outcome:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # the child: run, answer, exit
        try:
            os.close(r)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                outcome = Outcome("ok", output=run_in_process(lib, req))
            except Refused as exc:
                outcome = Outcome("refused", stage=exc.stage, code=exc.code)
            lib.libc.fflush(None)
            with os.fdopen(w, "wb") as out:
                _send(out, vars(outcome))
        finally:
            os._exit(0)
    os.close(w)
    data, deadline = b"", time.monotonic() + timeout
    with os.fdopen(r, "rb", buffering=0) as answer:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([answer], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return Outcome("timeout", reason=f"no answer in {timeout:.0f} s")
            chunk = answer.read(1 << 20)
            if not chunk:
                break
            data += chunk
    _, status = os.waitpid(pid, 0)
    log.seek(0)
    lines = log.read().decode(errors="replace").splitlines()
    if len(data) < 8:
        sig = -os.waitstatus_to_exitcode(status)
        name = signal.Signals(sig).name if sig > 0 else f"exit status {-sig}"
        last = [line for line in lines if line.strip() and not line.startswith("onednn_")]
        return Outcome("aborted", code=name, reason=" / ".join(last[-3:])[-600:], log=lines)
    outcome = Outcome(**pickle.loads(data[8:]))
    outcome.log = lines
    if outcome.status == "refused":
        outcome.reason = "; ".join(line.split(",", 3)[-1] for line in lines
                                   if ":check," in line or ",error," in line)[-600:]
    return outcome


# ----------------------------------------------------------------------------
# The test side: a worker process, restarted after a crash
# ----------------------------------------------------------------------------


class Runner:
    """The test side: one worker process, started on first use.  Each op runs in
    a child of the worker (see :func:`_serve`), so an abort costs a fork, not a
    new worker; a worker that dies or hangs anyway is replaced on the next call.
    ``timeout``: seconds one op may take."""

    def __init__(self, path: str = LIBRARY_PATH, *, timeout: float = 60.0):
        self.path, self.timeout = path, timeout
        self.proc = None
        self.restarts = 0

    def start(self) -> None:
        """Start the worker (done by the first :meth:`run`); RuntimeError if
        the library does not load."""
        # One OpenMP thread: the worker forks after running an op, which is only
        # safe while the OpenMP runtime has started no threads (and the test
        # workers already use both cores).
        env = dict(os.environ, ONEDNN_VERBOSE="check", ONEDNN_GRAPH_VERBOSE="check",
                   OMP_NUM_THREADS="1")
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), self.path, str(self.timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        hello = self._receive(self.timeout)
        if hello.status != "ok":
            raise RuntimeError(f"cannot load {self.path}: {hello.describe()}")

    def _receive(self, timeout: float) -> Outcome:
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            self.close()
            return Outcome("timeout", reason=f"the worker gave no answer in {timeout:.0f} s")
        head = self.proc.stdout.read(8)
        if len(head) < 8:                  # the worker itself died
            code = self.proc.wait()
            self.stderr.seek(0)
            last = [line for line in self.stderr.read().decode(errors="replace").splitlines()
                    if line.strip()]
            self.proc = None
            self.restarts += 1
            return Outcome("aborted", code=f"worker exit status {code}",
                           reason=" / ".join(last[-3:])[-600:])
        return Outcome(**pickle.loads(self.proc.stdout.read(struct.unpack("<Q", head)[0])))

    def run(self, req: Request) -> Outcome:
        """Run one op; never raises for anything the library does."""
        if self.proc is None:
            self.start()
        _send(self.proc.stdin, vars(req))
        return self._receive(self.timeout + 30)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


if __name__ == "__main__":
    _serve(sys.argv[1], float(sys.argv[2]))
