import contextlib
import os
import zlib

import numpy as np
import pytest

from convgrad.dtypes import bfloat16

# Tolerances for results computed in a dtype, compared with a float64 reference,
# scaled by the reference's magnitude.
TOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 2e-5,
       np.dtype(np.float16): 4e-3, bfloat16: 3e-2}


def assert_close(got, want, dtype=None, *, tol=None):
    dtype = np.dtype(dtype if dtype is not None else got.dtype)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    err = float(np.abs(np.asarray(got, np.float64) - want).max(initial=0.0))
    assert err <= (tol if tol is not None else TOL[dtype]) * scale, (err, scale)


# `make conformance-long` (CONVGRAD_CONFORMANCE_SCALE=k): the PyTorch, TensorFlow and
# OpenVINO conformance modules draw k times as many random cases (at least 1).
CONFORMANCE_SCALE = max(1, int(os.environ.get("CONVGRAD_CONFORMANCE_SCALE", "1")))


@contextlib.contextmanager
def engine_dbg(bits: int, lib=None):
    """The native engine's debug switches (docs/kernels.md names each by its value) set
    to ``bits`` for the block, cleared after it even when it fails.  Each build keeps
    its own switches: enter it where ``convgrad.config(isa=...)`` already selects the
    build the calls run on (or pass that build's ``lib``)."""
    if lib is None:
        from convgrad.kernels import native
        lib = native.engine().lib
    lib.cg_engine_set_dbg(bits)
    try:
        yield
    finally:
        lib.cg_engine_set_dbg(0)


@pytest.fixture(autouse=True)
def _fresh_choices():
    """The chooser caches its decisions by call and settings (kernels.select); tests
    change kernel constants and engines, so each starts without cached decisions."""
    from convgrad import kernels
    kernels.clear_choices()
    yield
    kernels.clear_choices()


@pytest.fixture(autouse=True)
def _bound_calls(request):
    """Bound calls (kernels/_bound.py) keep a kernel's decisions from a runner's second
    call on; tests that change kernel constants or functions between calls of one shape
    would get the decisions of before, so tests run the full path, except those marked
    ``bound_calls`` (the tests of bound calls and of what repeated calls reuse)."""
    from convgrad.kernels import _bound
    was = _bound.ENABLED
    _bound.ENABLED = request.node.get_closest_marker("bound_calls") is not None
    yield
    _bound.ENABLED = was


def recycled_results_and_decisions(monkeypatch, module=None, name=None):
    """Every result from the pool (whatever its size, streaming allowed), and a list
    that records each decision ``module.name`` makes from now on (None without one)."""
    from convgrad.kernels import _results
    monkeypatch.setattr(_results, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(_results, "MIN_BYTES", 0)
    if module is None:
        return None
    decided = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: decided.append(real(*a)) or decided[-1])
    return decided


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def import_peer(name):
    """Import a peer framework; skip without it, unless CONVGRAD_REQUIRE_PEERS=1 (CI)."""
    if os.environ.get("CONVGRAD_REQUIRE_PEERS") == "1":
        return __import__(name)
    return pytest.importorskip(name)


def peer_library(path, what):
    """Check that a peer's shared library exists (a framework without Python
    bindings); skip the module without it, unless CONVGRAD_REQUIRE_PEERS=1 (CI)."""
    if os.path.exists(path):
        return path
    if os.environ.get("CONVGRAD_REQUIRE_PEERS") == "1":
        raise FileNotFoundError(f"{path}: {what} is missing (CONVGRAD_REQUIRE_PEERS=1)")
    pytest.skip(f"{path} not found: {what}", allow_module_level=True)


@pytest.fixture(scope="session")
def vl16_engine(tmp_path_factory):
    """The native engine's sources (engine.cpp, winograd.cpp) compiled with 16-float
    vectors and portable helpers (CG_EMULATE_VL16): the AVX-512 build's tile shapes,
    tails and register blocks on a CPU without AVX-512.

    Built once for all the run's test processes (pytest-xdist workers share the base
    temporary directory's parent; a lock file lets one build while the others wait) and
    its sources compiled side by side: one worker after another, each compiling them in
    turn, had taken 260 s of a worker on the Zen 4 (2026-11-28), twice."""
    import concurrent.futures
    import glob
    import hashlib
    import shutil
    import subprocess
    from convgrad.kernels import native
    sources = sorted(glob.glob(os.path.join(os.path.dirname(native.__file__), "native",
                                            "*.cpp")))
    gxx = shutil.which("g++") or shutil.which("c++")
    if gxx is None or not sources:
        if os.environ.get("CONVGRAD_REQUIRE_PEERS") == "1":
            raise RuntimeError("CI must test the 16-float build: no C++ compiler or source")
        pytest.skip("no C++ compiler or engine source")
    flags = ["-mavx2", "-mfma", "-mf16c"] if "avx2" in native.info()["cpu_features"] else []
    cflags = ["-std=gnu++17", "-O1", "-ffp-contract=fast", "-fPIC", "-pthread",
              "-DCG_EMULATE_VL16=1", *flags]
    digest = hashlib.sha256(repr(cflags).encode())
    for path in sorted(glob.glob(os.path.join(os.path.dirname(sources[0]), "*"))):
        with open(path, "rb") as fh:
            digest.update(fh.read())
    shared = tmp_path_factory.getbasetemp().parent
    out = shared / f"engine_vl16-{digest.hexdigest()[:16]}.so"
    with open(shared / "engine_vl16.lock", "w") as lock:
        try:
            import fcntl
            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:                    # (no fcntl: each process builds its own)
            out = tmp_path_factory.mktemp("vl16") / out.name
        if not out.exists():
            work = tmp_path_factory.mktemp("vl16-objects")
            objects = [work / (os.path.basename(src) + ".o") for src in sources]
            with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                list(pool.map(lambda src, obj: subprocess.run(
                    [gxx, *cflags, "-c", "-o", str(obj), src], check=True, timeout=900),
                    sources, objects))
            part = work / out.name
            subprocess.run([gxx, "-shared", "-pthread", "-o", str(part),
                            *map(str, objects)], check=True, timeout=300)
            os.replace(part, out)
    return native.Engine("avx512", str(out), built_as="vl16")
