"""Bad input of every kind gets ConvGradError (a ValueError) or TypeError, never
another exception; results that are returned have the inferred shape; inputs
are never modified.  Bounded here; `make fuzz` runs the same properties long."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import convgrad
from convgrad import ConvGradError
from test_registry import CALLS

EXAMPLES = int(os.environ.get("CONVGRAD_FUZZ_EXAMPLES", "60"))

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 6), st.integers(-2**62, 2**62),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
    st.sampled_from(["SAME", "same_upper", "VALID", "NCX", "NXC", "OIX", "XIO", "IOX", "XOI",
                     "EXPLICIT", "None", "NHWC", "NCHW"]),
    st.lists(st.integers(-3, 9), max_size=6), st.lists(st.floats(), max_size=3),
    st.lists(st.lists(st.integers(-2, 3), max_size=3), max_size=5),
    st.just(np.array([np.nan, 1.0])), st.just(np.array([2, 2], np.int64)),
    st.just(np.zeros((2, 2), np.int32)), st.just(np.int64(2)), st.just({"a": 1}),
)

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.bool_, np.complex64, object]


@st.composite
def junk_tensor(draw):
    kind = draw(st.sampled_from(["array", "list", "fortran", "reversed", "readonly", "junk"]))
    if kind == "junk":
        return draw(JUNK)
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=6)))
    dtype = draw(st.sampled_from(DTYPES))
    a = np.ones(shape, dtype)
    if kind == "list":
        return a.tolist()
    if kind == "fortran":
        return np.asfortranarray(a)
    if kind == "reversed" and a.ndim:
        return a[::-1]
    if kind == "readonly":
        a.flags.writeable = False
    return a


def _check(name, attrs, inputs):
    op = convgrad.op(name, **attrs) if all(isinstance(k, str) for k in attrs) else None
    entry = convgrad.op(name, strides=[1]).entry
    before = [np.array(v, copy=True) if isinstance(v, np.ndarray) else None for v in inputs]
    try:
        if op is None:
            raise ConvGradError("skip")
        out = op(*inputs)
    except ConvGradError as e:
        assert str(e)
    except TypeError:
        pass
    else:
        shapes = [np.shape(v) if n in entry.tensors else v for n, v in zip(entry.inputs, inputs)]
        assert isinstance(out, np.ndarray)
        assert out.shape == op.infer_shape(*shapes)
    for v, b in zip(inputs, before):
        if b is not None and b.dtype != object:
            np.testing.assert_array_equal(v, b)


@pytest.mark.parametrize("name,attrs,inputs", CALLS, ids=[c[0] for c in CALLS])
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_bad_attributes_and_inputs_raise_only_convgrad_or_type_errors(name, attrs, inputs,
                                                                      data):
    entry = convgrad.op(name, strides=[1]).entry
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(v).astype(np.float32) if n in entry.tensors else v
              for n, v in zip(entry.inputs, inputs)]
    attrs = dict(attrs)
    for _ in range(data.draw(st.integers(1, 3))):
        target = data.draw(st.sampled_from(["attr", "input", "newattr"]))
        if target == "attr":
            key = data.draw(st.sampled_from(list(entry.attributes)))
            attrs[key] = data.draw(JUNK)
        elif target == "input":
            i = data.draw(st.integers(0, len(arrays) - 1))
            if entry.inputs[i] in entry.tensors:
                arrays[i] = data.draw(junk_tensor())
            else:
                arrays[i] = data.draw(JUNK)
        else:
            attrs[data.draw(st.sampled_from(["group", "padding_mode", "weights_shape"]))] = 1
    try:
        convgrad.op(name, **attrs)
    except ConvGradError as e:
        assert "attribute" in str(e)
        return
    _check(name, attrs, arrays)


@pytest.mark.parametrize("name,attrs,inputs", CALLS, ids=[c[0] for c in CALLS])
def test_layout_variants_of_inputs_give_the_same_result(name, attrs, inputs):
    # non-contiguous, negative-stride, read-only and Fortran-order inputs and plain lists
    entry = convgrad.op(name, strides=[1]).entry
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(v) if n in entry.tensors else v
              for n, v in zip(entry.inputs, inputs)]
    op = convgrad.op(name, **attrs)
    want = op(*arrays)

    def variants(a):
        yield np.asfortranarray(a)
        r = np.flip(np.flip(a).copy())              # negative strides, same values
        yield r
        ro = a.copy()
        ro.flags.writeable = False
        yield ro
        big = np.zeros(tuple(2 * s for s in a.shape))
        big[tuple(slice(None, None, 2) for _ in a.shape)] = a
        yield big[tuple(slice(None, None, 2) for _ in a.shape)]      # non-contiguous
        yield a.tolist()

    for i, n in enumerate(entry.inputs[:len(arrays)]):
        if n not in entry.tensors:
            continue
        for v in variants(arrays[i]):
            args = list(arrays)
            args[i] = v
            np.testing.assert_array_equal(op(*args), want)


def test_nan_and_inf_propagate():
    x = np.ones((1, 1, 5))
    x[0, 0, 2] = np.nan
    dy = np.ones((1, 1, 3))
    dw = convgrad.conv_weight_grad(x, dy, (1, 1, 3))
    assert np.isnan(dw).all()
    x[0, 0, 2] = np.inf
    dw = convgrad.conv_weight_grad(x, dy, (1, 1, 3))
    assert np.isposinf(dw).all()
