"""convgrad: convolution gradients exactly as oneDNN Graph, OpenVINO and
TensorFlow define them, on NumPy arrays.

Dialects: :mod:`convgrad.onednn`, :mod:`convgrad.openvino`, :mod:`convgrad.tf`;
ops by spec name: :func:`convgrad.op`; the plain canonical API (NCX data, OIX
weights): :func:`conv_weight_grad`, :func:`conv_data_grad`, :func:`conv_forward`.
"""

from __future__ import annotations

from .settings import config
from .errors import ConvGradError, ConvGradTypeError
from . import onednn, openvino, tf
from .frontends.canonical import conv_data_grad, conv_forward, conv_weight_grad
from .registry import op, op_names

__version__ = "0.1.0"

__all__ = ["ConvGradError", "ConvGradTypeError", "config", "conv_data_grad", "conv_forward",
           "conv_weight_grad", "onednn", "op", "op_names", "openvino", "tf"]
