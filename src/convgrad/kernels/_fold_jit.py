"""The compiled copy behind the shifted kernel's folded GEMMs.

:func:`gather_taps` writes, for a block of grid rows, the input rows of every
kernel tap side by side (a local im2col that stays in cache), so that one GEMM
with the taps in its inner dimension replaces one small GEMM per tap.  It
releases the GIL, so the kernel's threads copy and multiply in parallel.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def gather_taps(src, src_cols, col0, cin, offs, r0, nrows, dst):  # pragma: no cover - JIT
    """``dst[r, t*cin + c] = src[(r0 + r + offs[t]) * src_cols + col0 + c]`` for
    ``r < nrows``, ``t < len(offs)``, ``c < cin``; ``src`` flat, ``dst`` 2-D."""
    T = offs.shape[0]
    for r in range(nrows):
        for t in range(T):
            base = (r0 + r + offs[t]) * src_cols + col0
            o = t * cin
            for c in range(cin):
                dst[r, o + c] = src[base + c]
