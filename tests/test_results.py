"""Result memory recycled across calls (kernels/_results.py, docs/decisions.md D25): a
large result's buffer returns to a bounded pool when the caller's last reference to it
goes, and only then; the next result of that size reuses it."""

import gc

import numpy as np
import pytest

import convgrad
from convgrad.kernels import _results, native

if native.available() is not None:
    pytest.skip(f"native engine unavailable: {native.available()}", allow_module_level=True)

SHAPE = (2, 128, 32, 40)          # 1.3 MB of float32: above MIN_BYTES


@pytest.fixture(autouse=True)
def empty_pool():
    _results.clear()
    yield
    _results.clear()


def data_grad(rng, inputs=None):
    w, dy = inputs or (rng.standard_normal((128, 128, 3, 3), dtype=np.float32),
                       rng.standard_normal(SHAPE, dtype=np.float32))
    with convgrad.config(algo="native"):
        return convgrad.conv_data_grad(w, dy, list(SHAPE), pads_begin=[1, 1],
                                       pads_end=[1, 1]), (w, dy)


def address(a):
    return a.__array_interface__["data"][0]


def test_a_dropped_result_is_reused_and_a_live_one_never(rng):
    first, inputs = data_grad(rng)
    kept = first.copy()
    view = first[1:, ::2]                       # keeps the buffer alive
    a = address(first)
    del first
    gc.collect()
    second, _ = data_grad(rng)
    b = address(second)
    assert b != a
    np.testing.assert_array_equal(view, kept[1:, ::2])          # untouched
    del view, second
    gc.collect()
    assert _results.idle_bytes() >= 2 * np.prod(SHAPE) * 4
    third, _ = data_grad(rng, inputs)
    assert address(third) in (a, b)
    np.testing.assert_array_equal(third, kept)  # every value written again


def test_results_are_ordinary_aligned_writable_arrays(rng):
    dx, _ = data_grad(rng)
    assert dx.flags.writeable and dx.dtype == np.float32 and dx.shape == SHAPE
    assert dx.__array_interface__["data"][0] % _results.ALIGN == 0
    dx[...] = 1.0                               # the caller owns it
    assert float(dx.sum()) == dx.size


@pytest.mark.parametrize("layout", ["ncx", "nxc"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_results_from_the_pool_keep_their_dtype(dtype, layout, rng):
    """A large float16 or bfloat16 result is a pool buffer viewed as that dtype (the
    array interface has no name for bfloat16: it came back as raw 'V2' records, and
    the kernels refused it), fresh or recycled, and its values are right."""
    from convgrad.dtypes import bfloat16
    dt = bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    w = rng.standard_normal((64, 64, 3, 3), dtype=np.float32).astype(dt)
    dy = rng.standard_normal((2, 64, 64, 64), dtype=np.float32)
    if layout == "nxc":
        dy = np.moveaxis(np.ascontiguousarray(np.moveaxis(dy, 1, -1)), -1, 1)
    dy = dy.astype(dt)
    assert dy.size * dt.itemsize >= _results.MIN_BYTES
    want = None
    for _ in range(2):                             # a fresh buffer, then a recycled one
        with convgrad.config(algo="native"):
            dx = convgrad.conv_data_grad(w, dy, [2, 64, 64, 64], pads_begin=[1, 1],
                                         pads_end=[1, 1])
        assert dx.dtype == dt and dx.shape == (2, 64, 64, 64)
        assert _leased(dx)
        got = np.asarray(dx, np.float32)
        if want is None:
            want = got
        np.testing.assert_array_equal(got, want)
        del dx
    assert _results.recycled(_results.empty((2, 64, 64, 64), dt))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", ">f4", "bfloat16"])
def test_pool_arrays_have_the_shape_dtype_and_lifetime_asked(dtype):
    """Every float dtype comes out C-contiguous, aligned, of the shape asked, owned by
    its lease (native float dtypes straight from the lease, the others as its bytes
    viewed), and its buffer goes back to the pool only when a view of it is gone."""
    from convgrad.dtypes import bfloat16
    dt = bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    shape = (4, 5, 7, 4099)                           # (16-bit: over MIN_BYTES)
    a = _results.empty(shape, dt)
    assert a.dtype == dt and a.shape == shape and a.flags.c_contiguous and a.flags.writeable
    assert address(a) % _results.ALIGN == 0 and _leased(a) and not _results.recycled(a)
    a[...] = 3
    view = a[1, ::2]
    del a
    gc.collect()
    assert _results.idle_bytes() == 0                     # the view keeps it leased
    assert float(np.asarray(view, np.float64).sum()) == 3 * view.size
    del view
    gc.collect()
    b = _results.empty(shape, dt)
    assert _results.recycled(b) and b.shape == shape and b.dtype == dt


def _leased(a):
    while isinstance(a, np.ndarray):
        a = a.base
    return isinstance(a, _results.Lease)


def test_small_results_come_from_numpy():
    a = _results.empty((3, 5), np.float32)
    assert a.base is None or not isinstance(a.base, _results.Lease)


def test_idle_buffers_stay_within_the_workspace_budget(rng):
    limit = 3 * 2**20
    with convgrad.config(workspace_bytes=limit):
        arrays = [_results.empty((2**20 // 4 + 1000,), np.float32) for _ in range(6)]
        del arrays
        gc.collect()
        assert 0 < _results.idle_bytes() <= limit
    big = _results.empty((_results.POOL_BYTES // 4 + 1,), np.float32)
    before = _results.idle_bytes()
    del big
    gc.collect()
    assert _results.idle_bytes() == before       # larger than the pool: released
