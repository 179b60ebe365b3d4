"""The fast float16 conversions are bit-identical to NumPy's casts."""

import numpy as np

from convgrad import _half


def test_every_half_value_widens_exactly_like_numpy():
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = np.tile(h, 2)                                    # above MIN_ELEMENTS: the fast path
    got = _half.to_float32(h)
    want = h.astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_float32_narrows_exactly_like_numpy():
    rng = np.random.default_rng(5)
    every_half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    widened = every_half.astype(np.float32).view(np.uint32).astype(np.int64)
    # every half value, the float32 values next to it (ties and near-ties of the rounding),
    # and random bit patterns over the whole float32 range (NaNs with payloads included)
    near = np.concatenate([widened + d for d in (-1, 0, 1, 0xFFF, 0x1000, 0x1001)]) % (1 << 32)
    bits = np.concatenate([near.astype(np.uint32), rng.integers(0, 1 << 32, 400_000,
                                                                dtype=np.uint64).astype(np.uint32),
                           np.array([0x33000000, 0x33000001, 0x477FEFFF,
                                                        0x477FF000, 0x7F800000, 0xFF800000],
                                                       np.uint32)])
    f = bits.astype(np.uint32).view(np.float32)
    got = _half.to_float16(f)
    want = f.astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_small_or_strided_arrays_take_numpys_path_with_the_same_result():
    a = np.linspace(-3, 3, 101, dtype=np.float32)
    np.testing.assert_array_equal(_half.to_float16(a), a.astype(np.float16))
    b = np.random.default_rng(1).standard_normal((300, 400)).astype(np.float16)[:, ::2]
    np.testing.assert_array_equal(_half.to_float32(b), b.astype(np.float32))
