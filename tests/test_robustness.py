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


def mutate_and_check(name, attrs, inputs, data):
    """Replace 1-3 attributes or inputs of a valid call by junk drawn from ``data``;
    the call must then give a result of the inferred shape or raise ConvGradError /
    TypeError, and leave its inputs unmodified (also the fuzz target)."""
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
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_bad_attributes_and_inputs_raise_only_convgrad_or_type_errors(name, attrs, inputs,
                                                                      data):
    mutate_and_check(name, attrs, inputs, data)


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


# ---- every kind of invalid value, aimed at one attribute or input at a time -----------

LIST_ATTRS = ("strides", "pads_begin", "pads_end", "dilations", "output_padding",
              "explicit_paddings")
STRING_ATTRS = ("auto_pad", "data_format", "weights_format", "filter_format", "padding")
HUGE = 2**36


def _bad_lists(value):
    """Invalid (or suspicious) values for an integer-list attribute or shape input."""
    n = len(value) if isinstance(value, (list, tuple)) else 2
    return {
        "too long": [1] * (n + 1), "too short": [1] * max(0, n - 1), "negative": [-1] * n,
        "zero": [0] * n, "huge": [HUGE] * n, "beyond int64": [2**70] * n,
        "non-integer": [1.5] * n, "float array": np.full(n, 2.0),
        "NaN array": np.full(n, np.nan), "string": "2", "nested": [[1]] * n,
        "object array": np.array([1] * n, dtype=object), "bool": [True] * n,
        "dict": {"a": 1}, "2-D array": np.ones((n, 2), np.int64),
    }


def _bad_scalars():
    return {"zero": 0, "negative": -1, "huge": HUGE, "float": 2.5, "string": "2",
            "NaN": float("nan"), "list": [2], "bool": True, "None": None}


def _bad_strings():
    return {"unknown": "bogus", "int": 3, "empty list": [], "bytes": b"SAME",
            "layout of another op": "OIHW", "None": None}


def _bad_tensors(shape, channel_axis):
    rng = np.random.default_rng(3)
    a = rng.standard_normal(shape).astype(np.float32)
    grown = list(shape)
    grown[channel_axis] += 1
    spatial = list(shape)
    spatial[-1 if channel_axis == 1 else -2] += 1
    zero = list(shape)
    zero[-1 if channel_axis == 1 else -2] = 0
    return {
        "rank + 1": a[..., None], "rank - 1": a[0], "scalar": np.float32(1.0),
        "channels + 1": rng.standard_normal(grown).astype(np.float32),
        "spatial + 1": rng.standard_normal(spatial).astype(np.float32),
        "zero spatial": np.zeros(zero, np.float32), "zero batch": np.zeros(
            (0, *shape[1:]), np.float32),
        "object array": a.astype(object), "complex": a.astype(np.complex64),
        "bool": a > 0, "string array": np.full(shape, "a"), "ragged list": [[1.0], [1.0, 2.0]],
        "nested list": a.tolist(), "int8": a.astype(np.int8), "None": None,
        "string": "abc", "dict": {"a": 1}, "float64 (mixed dtypes)": a.astype(np.float64),
    }


def _mutations(name, attrs, inputs):
    """(slot, kind, attrs, inputs) with one attribute or input replaced by a bad value."""
    entry = convgrad.op(name, strides=[1]).entry
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(v).astype(np.float32) if n in entry.tensors else v
              for n, v in zip(entry.inputs, inputs)]
    for key in entry.attributes:
        if key in ("name", "use_cudnn_on_gpu"):
            continue
        if key in STRING_ATTRS:
            bad = _bad_strings()
        elif key == "groups":
            bad = _bad_scalars()
        else:
            bad = _bad_lists(attrs.get(key, [1]))
        for kind, value in bad.items():
            yield key, kind, {**attrs, key: value}, arrays
    for i, n in enumerate(entry.inputs[:len(arrays)]):
        if n in entry.tensors:
            tensor_shape = arrays[i].shape
            layout = attrs.get("data_format") or (
                "NCX" if entry.dialect in ("openvino", "canonical") else "NXC")
            axis = 1 if str(layout).upper().startswith("NC") else len(tensor_shape) - 1
            bad = _bad_tensors(tensor_shape, axis)
        else:
            bad = _bad_lists(arrays[i])
        for kind, value in bad.items():
            yield n, kind, attrs, arrays[:i] + [value] + arrays[i + 1:]


# Values that are fine on their own but may clash with the rest of the call (a None
# auto_pad, zero pads, one more channel, another size): the error may then name the
# other party of the clash (or refuse the memory).  Every other kind is invalid in
# itself and the error must name the attribute or input it was given to.
RELATIONAL = {"zero", "huge", "None", "empty list", "too short", "channels + 1", "spatial + 1",
              "zero spatial", "zero batch", "int8", "float64 (mixed dtypes)", "nested list",
              "rank + 1", "rank - 1"}


def _names_problem(message, slot, kind):
    """The message names the offending attribute or input (dilations as 'dilation',
    pads_begin/pads_end as 'pads')."""
    if kind in RELATIONAL:
        return True
    aliases = {slot, slot.replace("_", " "), slot.rstrip("s")}
    if slot.startswith("pads_"):
        aliases.add("pads")
    if slot == "explicit_paddings":
        aliases.add("padding")
    return any(a in message for a in aliases)


INVALID = [(name, slot, kind, attrs, inputs)
           for name, a0, i0 in CALLS for slot, kind, attrs, inputs in _mutations(name, a0, i0)]


def test_invalid_value_kinds_are_many():
    assert len(INVALID) > 2000 and len({c[2] for c in INVALID}) > 35


@pytest.mark.parametrize("name", sorted({c[0] for c in CALLS}))
def test_every_invalid_value_is_named_or_gives_a_correct_result(name):
    failures = []
    for _, slot, kind, attrs, inputs in (c for c in INVALID if c[0] == name):
        before = [np.array(v, copy=True) if isinstance(v, np.ndarray) else None
                  for v in inputs]
        try:
            out = convgrad.op(name, **attrs)(*inputs)
        except (ConvGradError, TypeError) as e:
            if isinstance(e, ConvGradError) and not _names_problem(str(e), slot, kind):
                failures.append(f"{slot} {kind}: message does not name it: {e}")
        except Exception as e:             # noqa: BLE001 - the property under test
            failures.append(f"{slot} {kind}: {type(e).__name__}: {e}")
        else:
            # accepted: it must be a real result, as the reference kernel computes it
            entry = convgrad.op(name, strides=[1]).entry
            shapes = [np.shape(v) if n in entry.tensors and v is not None else v
                      for n, v in zip(entry.inputs, inputs)]
            if out.shape != convgrad.op(name, **attrs).infer_shape(*shapes):
                failures.append(f"{slot} {kind}: shape {out.shape} != inferred")
            with convgrad.config(algo="reference"):
                want = convgrad.op(name, **attrs)(*inputs)
            if not np.allclose(out, want, rtol=1e-4, atol=1e-4, equal_nan=True):
                failures.append(f"{slot} {kind}: result differs from the reference kernel")
        for v, b in zip(inputs, before):
            if b is not None and b.dtype != object:
                np.testing.assert_array_equal(v, b)
    assert not failures, "\n".join(failures)
