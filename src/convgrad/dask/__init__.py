"""convgrad on Dask arrays (``pip install 'convgrad[dask]'``).

The same ops as :mod:`convgrad` -- :mod:`convgrad.dask.onednn`,
:mod:`convgrad.dask.openvino`, :mod:`convgrad.dask.tf`, :func:`op` and the
canonical :func:`conv_weight_grad`, :func:`conv_data_grad`,
:func:`conv_forward` -- with the same attribute names, validation and shape
inference, taking Dask arrays chunked along the batch and spatial axes (any
chunk sizes) and returning lazy Dask arrays:

- data results (forward, data gradients, ConvTranspose) are computed block by
  block, each block reading its window of the input (its chunk and the halo
  the kernel reaches), and are chunked like the op's large input;
- weight gradients are per-block partial gradients summed by a tree
  reduction; no task ever holds more than a block's window.

Tasks run convgrad's own kernels with the settings of the
:func:`convgrad.config` block the graph was built in, and one kernel thread
per task unless ``threads`` was set there.  Design and limits:
``docs/dask.md``.
"""

from __future__ import annotations

try:
    import dask.array  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("convgrad.dask needs Dask: pip install 'convgrad[dask]'") from exc

from ..frontends import canonical as _canonical
from . import onednn, openvino, tf
from ._front import DaskSpecOp, dask_version, op
from ._graph import SPLIT_EVERY

conv_weight_grad = dask_version(_canonical.conv_weight_grad)
conv_data_grad = dask_version(_canonical.conv_data_grad)
conv_forward = dask_version(_canonical.conv_forward)

__all__ = ["DaskSpecOp", "SPLIT_EVERY", "conv_data_grad", "conv_forward", "conv_weight_grad",
           "onednn", "op", "openvino", "tf"]
