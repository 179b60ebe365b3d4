"""Shape inference and padding tables, per spec and auto_pad mode."""

import pytest

from convgrad import ConvGradError
from convgrad.geometry import (conv_out_sizes, int_tuple, openvino_backprop_pads,
                               parse_auto_pad, resolve_pads, shape_input, transposed_sizes)


@pytest.mark.parametrize("spelling,mode", [
    ("None", "explicit"), ("none", "explicit"), ("NONE", "explicit"), ("NOTSET", "explicit"),
    ("explicit", "explicit"), ("EXPLICIT", "explicit"), (None, "explicit"),
    ("SAME_UPPER", "same_upper"), ("same_upper", "same_upper"), ("Same_Lower", "same_lower"),
    ("VALID", "valid"), ("valid", "valid")])
def test_auto_pad_spellings_are_case_insensitive(spelling, mode):
    assert parse_auto_pad("op", spelling) == mode


@pytest.mark.parametrize("bad", ["same", "SAME_MIDDLE", 3, "pad"])
def test_auto_pad_unknown_names_the_attribute(bad):
    with pytest.raises(ConvGradError, match="auto_pad"):
        parse_auto_pad("op", bad)


# (L, K, s, d, mode) -> (pads_begin, pads_end, M): forward rule (oneDNN Graph,
# OpenVINO Convolution, TensorFlow SAME): M = ceil(L/s), odd element at the END.
FORWARD = [
    ((5, 2, 1, 1, "same_upper"), (0, 1, 5)),      # OpenVINO type_prop: pads (0, 1)
    ((5, 2, 1, 1, "same_lower"), (1, 0, 5)),
    ((3, 2, 2, 1, "same_upper"), (0, 1, 2)),      # XLA 2x2 stride-2 SAME: extra pad at end
    ((4, 3, 2, 1, "same_upper"), (0, 1, 2)),
    ((4, 3, 2, 1, "same_lower"), (1, 0, 2)),
    ((7, 3, 1, 3, "same_upper"), (3, 3, 7)),      # dilation: effective kernel 7
    ((7, 2, 1, 4, "same_upper"), (2, 2, 7)),      # Ke = 5, total 4
    ((6, 2, 1, 2, "same_lower"), (1, 1, 6)),
    ((10, 1, 3, 1, "same_upper"), (0, 0, 4)),     # total clamps at 0
    ((8, 3, 3, 1, "valid"), (0, 0, 2)),
]


@pytest.mark.parametrize("args,want", FORWARD, ids=str)
def test_forward_same_padding_table(args, want):
    L, K, s, d, mode = args
    (pb,), (pe,) = resolve_pads("op", mode, (L,), (K,), (s,), (d,), (9,), (9,))
    (m,) = conv_out_sizes("op", (L,), (K,), (s,), (d,), (pb,), (pe,))
    assert (pb, pe, m) == want


# ConvTranspose rule: total = max(Ke - s, 0), independent of L; out = L*s.
@pytest.mark.parametrize("args,want", [
    ((3, 2, 1, "same_upper"), (0, 1)), ((3, 2, 1, "same_lower"), (1, 0)),
    ((4, 2, 1, "same_upper"), (1, 1)), ((2, 3, 1, "same_upper"), (0, 0)),
    ((3, 2, 2, "same_upper"), (1, 2)), ((3, 2, 2, "same_lower"), (2, 1))])
def test_conv_transpose_same_padding_table(args, want):
    K, s, d, mode = args
    pads = resolve_pads("op", mode, None, (K,), (s,), (d,), (0,), (0,), transposed=True)
    assert (pads[0][0], pads[1][0]) == want
    (out,) = transposed_sizes("op", (5,), (K,), (s,), (d,), pads[0], pads[1], (0,))
    assert out == (5 * s if (K - 1) * d + 1 >= s else (5 - 1) * s + (K - 1) * d + 1)


# OpenVINO (Group)ConvolutionBackpropData: (L, K, s, d, op, mode, pads, output_shape)
# -> (pads_begin, pads_end, out).  Odd element at the BEGIN for same_upper.
OV_BACKPROP = [
    ((224, 3, 2, 1, 0, "explicit", (1, 1), None), (1, 1, 447)),      # spec example
    ((4, 3, 1, 1, 1, "explicit", (1, 1), None), (1, 1, 5)),          # op_reference case
    ((2, 3, 2, 1, 0, "same_upper", (5, 5), None), (0, 0, 5)),        # pads forced to 0
    ((2, 3, 2, 1, 1, "same_lower", (5, 5), None), (0, 0, 6)),
    ((2, 3, 2, 1, 0, "valid", (5, 5), None), (0, 0, 5)),
    ((2, 3, 2, 1, 0, "same_upper", (0, 0), 4), (1, 0, 4)),           # odd total 1 at begin
    ((2, 3, 2, 1, 0, "same_lower", (0, 0), 4), (0, 1, 4)),
    ((2, 3, 2, 1, 1, "same_lower", (0, 0), 3), (1, 2, 3)),           # type_prop: op counts
    ((5, 3, 1, 1, 0, "same_upper", (0, 0), 3), (2, 2, 3)),           # type_prop
    ((37, 1, 2, 1, 0, "same_upper", (0, 0), 74), (0, 0, 74)),        # total -1 clamps to 0
    ((10, 5, 1, 1, 0, "same_upper", (0, 0), 14), (0, 0, 14)),        # op_reference
    ((3, 3, 2, 1, 0, "explicit", (1, 4), 9), (1, -3, 9)),            # pads_begin kept
]


@pytest.mark.parametrize("args,want", OV_BACKPROP, ids=str)
def test_openvino_backprop_padding_table(args, want):
    L, K, s, d, op, mode, pads, out = args
    pb, pe, n = openvino_backprop_pads("op", mode, (L,), (K,), (s,), (d,), (pads[0],),
                                       (pads[1],), (op,), None if out is None else (out,))
    assert (pb[0], pe[0], n[0]) == want


def test_output_size_formula_errors_name_the_axis():
    with pytest.raises(ConvGradError, match="spatial axis 1.*smaller than the dilated kernel"):
        conv_out_sizes("op", (5, 2), (3, 3), (1, 1), (1, 2), (0, 0), (0, 0))


def test_transposed_size_must_be_positive():
    with pytest.raises(ConvGradError, match="must be positive"):
        transposed_sizes("op", (1,), (1,), (1,), (1,), (1,), (1,), (0,))


@pytest.mark.parametrize("value,ok", [([3, 3], True), ((3, 3), True), (3, True),
                                      ([3.0, 3], False), (["3", 3], False), ([True, 1], False),
                                      ([3, 3, 3], False), ([[3, 3]], False), ("33", False)])
def test_int_lists(value, ok):
    if ok:
        assert int_tuple("op", "strides", value, 2) == (3, 3)
    else:
        with pytest.raises(ConvGradError, match="strides"):
            int_tuple("op", "strides", value, 2)


def test_int_lists_accept_integer_arrays_and_reject_float_arrays():
    import numpy as np
    assert int_tuple("op", "strides", np.array([2, 1], np.int32), 2) == (2, 1)
    with pytest.raises(ConvGradError, match="integers"):
        int_tuple("op", "strides", np.array([2.0, np.nan]), 2)


@pytest.mark.parametrize("value,want", [([8, 4, 3, 3], ((8, 4, 3, 3), True)),
                                        ([3, 3], ((3, 3), False))])
def test_shape_inputs_are_full_or_spatial(value, want):
    assert shape_input("op", "weights_shape", value, 4) == want


@pytest.mark.parametrize("value", [[3], [8, 4, 3], [1, 8, 4, 3, 3], [], None, [-1, 3]])
def test_shape_inputs_of_other_lengths_are_rejected(value):
    with pytest.raises(ConvGradError, match="weights_shape"):
        shape_input("op", "weights_shape", value, 4)
