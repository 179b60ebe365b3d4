"""The spec pages' own examples, run through convgrad (``convgrad examples``).

Each example prints what convgrad computed and how it was checked:
against the float64 reference kernel, against the adjoint identity with the
forward op, or against the literal values the frameworks' tests expect.
"""

from __future__ import annotations

import time

import numpy as np

import convgrad
from convgrad import onednn, openvino, tf


def _vdot(a, b) -> float:
    return float(np.vdot(np.asarray(a, np.float64), np.asarray(b, np.float64)))


def _adjoint(fwd_out, dy, a, da) -> str:
    lhs, rhs = _vdot(fwd_out, dy), _vdot(a, da)
    rel = abs(lhs - rhs) / max(1.0, abs(lhs))
    assert rel < 1e-4, (lhs, rhs)
    return f"adjoint <fwd, dy> = {lhs:.4f} = {rhs:.4f} (rel. diff {rel:.1e})"


def _vs_reference(fn) -> str:
    got = fn()
    with convgrad.config(algo="reference"):
        want = fn()
    err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
    scale = max(1.0, float(np.abs(want.astype(np.float64)).max()))
    assert err <= 1e-4 * scale, err
    return f"matches the float64 reference kernel (max abs diff {err:.1e})"


def _show(title: str, shape, checks: list[str], seconds: float) -> None:
    print(f"\n{title}")
    print(f"  result shape {list(shape)}  ({seconds * 1e3:.1f} ms)")
    for c in checks:
        print(f"  checked: {c}")


def example_convolution_backward_weights(rng) -> None:
    # oneDNN's benchdnn graph case conv_bwd_w_2d: NCX/OIX, 1x1 kernel, stride 2.
    attrs = dict(strides=[2, 2], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
                 data_format="NCX", weights_format="OIX")
    src = rng.standard_normal((1, 32, 28, 28)).astype(np.float32)
    diff_dst = rng.standard_normal((1, 128, 14, 14)).astype(np.float32)
    t = time.perf_counter()
    dw = onednn.convolution_backward_weights(src, diff_dst, [128, 32, 1, 1], **attrs)
    t = time.perf_counter() - t
    w = rng.standard_normal(dw.shape).astype(np.float32)
    y = onednn.convolution(src, w, **attrs)
    _show("oneDNN Graph ConvolutionBackwardWeights (benchdnn conv_bwd_w_2d: src 1x32x28x28, "
          "diff_dst 1x128x14x14, stride 2, weights_shape [128,32,1,1])", dw.shape,
          [_adjoint(y, diff_dst, w, dw),
           _vs_reference(lambda: onednn.convolution_backward_weights(
               src, diff_dst, [128, 32, 1, 1], **attrs))], t)


def example_convolution_backprop_filters(rng) -> None:
    attrs = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
                 groups=2)
    x = rng.standard_normal((2, 9, 9, 8)).astype(np.float32)          # NXC
    dy = rng.standard_normal((2, 9, 9, 6)).astype(np.float32)
    t = time.perf_counter()
    dw = onednn.convolution_backprop_filters(x, [3, 3], dy, **attrs)   # spatial filters_shape
    t = time.perf_counter() - t
    w = rng.standard_normal(dw.shape).astype(np.float32)
    y = onednn.convolution(x, w, **attrs)
    _show("oneDNN Graph ConvolutionBackpropFilters-1 (NXC input 2x9x9x8, filters_shape [3,3] "
          "(spatial), groups 2, XIO filter_delta)", dw.shape, [_adjoint(y, dy, w, dw)], t)


def example_conv_transpose_backprop_filters(rng) -> None:
    attrs = dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
                 output_padding=[1, 1], groups=1, filter_format="OIX")
    u = rng.standard_normal((2, 7, 7, 16)).astype(np.float32)          # ConvTranspose input
    v = rng.standard_normal((2, 14, 14, 8)).astype(np.float32)         # grad of its output
    t = time.perf_counter()
    dw = onednn.conv_transpose_backprop_filters(u, v, [8, 16, 3, 3], **attrs)
    t = time.perf_counter() - t
    w = rng.standard_normal(dw.shape).astype(np.float32)
    fwd_attrs = {k: val for k, val in attrs.items() if k != "filter_format"}
    out = onednn.conv_transpose(u, w, weights_format="OIX", **fwd_attrs)
    _show("oneDNN Graph ConvTransposeBackpropFilters-1 (input 2x7x7x16 -> output 2x14x14x8, "
          "stride 2, pads 1, output_padding 1, filter OIX (O/G, I, H, W))", dw.shape,
          [_adjoint(out, v, w, dw)], t)


def example_group_convolution_backprop_data(rng) -> None:
    attrs = dict(strides=[2], pads_begin=[1], pads_end=[1], dilations=[1])
    for spatial in (1, 2):
        data = rng.standard_normal((1, 20) + (224,) * spatial).astype(np.float32)
        filt = rng.standard_normal((4, 5, 2) + (3,) * spatial).astype(np.float32)
        a = {k: v * spatial for k, v in attrs.items()}
        t = time.perf_counter()
        out = openvino.group_convolution_backprop_data(data, filt, **a)
        t = time.perf_counter() - t
        assert out.shape == (1, 8) + (447,) * spatial
        x = rng.standard_normal(out.shape).astype(np.float32)
        y = openvino.group_convolution(x, filt, **a)   # the same kernel tensor
        _show(f"OpenVINO GroupConvolutionBackpropData-1, spec example {spatial}D "
              f"(data {list(data.shape)}, kernel {list(filt.shape)})", out.shape,
              ["output shape equals the spec's <output> port "
               f"{[1, 8] + [447] * spatial}", _adjoint(y, data, x, out)], t)
    op3 = convgrad.op("GroupConvolutionBackpropData", strides=[2] * 3, pads_begin=[1] * 3,
                      pads_end=[1] * 3, dilations=[1] * 3)
    shape = op3.infer_shape((1, 20, 224, 224, 224), (4, 5, 2, 3, 3, 3))
    assert shape == (1, 8, 447, 447, 447)
    _show("OpenVINO GroupConvolutionBackpropData-1, spec example 3D (shape inference only: "
          "the result would hold 714 M values)", shape,
          ["inferred shape equals the spec's <output> port [1, 8, 447, 447, 447]"], 0.0)


def example_conv2d_backprop_filter() -> None:
    # TensorFlow conv_ops_test / XLA conv2d_test literal expectations.
    cases = [
        ("2x2 filter, VALID", np.arange(1, 7).reshape(1, 2, 3, 1), [2, 2, 1, 1],
         np.array([1, 2]).reshape(1, 1, 2, 1), [1, 1, 1, 1], "VALID", [5, 8, 14, 17]),
        ("1x1 filter, stride 2, SAME", np.arange(1, 17).reshape(1, 4, 4, 1), [1, 1, 1, 1],
         np.arange(1, 5).reshape(1, 2, 2, 1), [1, 2, 2, 1], "SAME", [78]),
        ("2x2 filter, stride 2, SAME (odd pad at the end)", np.arange(1, 7).reshape(1, 2, 3, 1),
         [2, 2, 1, 1], np.arange(1, 3).reshape(1, 1, 2, 1), [1, 2, 2, 1], "SAME",
         [7, 2, 16, 5]),
    ]
    for title, x, sizes, dy, strides, padding, want in cases:
        t = time.perf_counter()
        dw = tf.conv2d_backprop_filter(x.astype(np.float32), sizes, dy.astype(np.float32),
                                       strides, padding)
        t = time.perf_counter() - t
        np.testing.assert_array_equal(dw.ravel(), want)
        _show(f"TensorFlow conv2d_backprop_filter: {title}", dw.shape,
              [f"equals TensorFlow's test literal {want}"], t)


def main() -> None:
    rng = np.random.default_rng(0)
    print("convgrad", convgrad.__version__, "-- the spec pages' examples")
    example_convolution_backward_weights(rng)
    example_convolution_backprop_filters(rng)
    example_conv_transpose_backprop_filters(rng)
    example_group_convolution_backprop_data(rng)
    example_conv2d_backprop_filter()
    print("\nall examples checked")


if __name__ == "__main__":
    main()
