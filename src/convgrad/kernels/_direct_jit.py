"""The numba loops of the direct kernel (see :mod:`convgrad.kernels.direct`).

Everything here is 3-D and channels last, on flat (1-D) views: data
``(N, D, H, W, C)``, weights ``(KD, KH, KW, C/G, OC)``; lower ranks arrive
with leading axes of size 1.  Sizes come as int64 arrays of length 3.

Every output vector (one pixel's channels, or one tap's weight gradient) is
a sum of products of channel vectors, ``out += sum_k A[a_k:] * B[b_k:]``:
the loops first list the offsets ``(a_k, b_k)`` that contribute, then
:func:`_accum` adds them four at a time with the channel index innermost, so
the output vector is loaded and stored once per four products and LLVM
vectorizes the channel loop.  Where a group holds more than one input or
output channel, the rows that are read are first *expanded* (:func:`_expand`)
so that what meets output channel ``o`` sits at index ``o``.

Each function computes a range of output rows (fwd, dgrad) or of row chunks
(wgrad), so :mod:`~convgrad.kernels.direct` runs ranges on several threads
(the functions release the GIL).  Serial functions compile about four times
faster than numba's ``parallel=True`` ones.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_JIT = dict(cache=True, fastmath=False, nogil=True)


@njit(**_JIT)
def _accum(out, ob, A, ao, B, bo, m, n):
    """``out[ob:ob+n] += sum_{k<m} A[ao[k]:ao[k]+n] * B[bo[k]:bo[k]+n]`` (k in order,
    four products per pass)."""
    o = out[ob:ob + n]
    k = 0
    while k + 4 <= m:
        a0 = A[ao[k]:ao[k] + n]
        a1 = A[ao[k + 1]:ao[k + 1] + n]
        a2 = A[ao[k + 2]:ao[k + 2] + n]
        a3 = A[ao[k + 3]:ao[k + 3] + n]
        b0 = B[bo[k]:bo[k] + n]
        b1 = B[bo[k + 1]:bo[k + 1] + n]
        b2 = B[bo[k + 2]:bo[k + 2] + n]
        b3 = B[bo[k + 3]:bo[k + 3] + n]
        for c in range(n):
            o[c] += (a0[c] * b0[c] + a1[c] * b1[c]) + (a2[c] * b2[c] + a3[c] * b3[c])
        k += 4
    r = m - k
    if r == 3:
        a0 = A[ao[k]:ao[k] + n]
        a1 = A[ao[k + 1]:ao[k + 1] + n]
        a2 = A[ao[k + 2]:ao[k + 2] + n]
        b0 = B[bo[k]:bo[k] + n]
        b1 = B[bo[k + 1]:bo[k + 1] + n]
        b2 = B[bo[k + 2]:bo[k + 2] + n]
        for c in range(n):
            o[c] += (a0[c] * b0[c] + a1[c] * b1[c]) + a2[c] * b2[c]
    elif r == 2:
        a0 = A[ao[k]:ao[k] + n]
        a1 = A[ao[k + 1]:ao[k + 1] + n]
        b0 = B[bo[k]:bo[k] + n]
        b1 = B[bo[k + 1]:bo[k + 1] + n]
        for c in range(n):
            o[c] += a0[c] * b0[c] + a1[c] * b1[c]
    elif r == 1:
        a0 = A[ao[k]:ao[k] + n]
        b0 = B[bo[k]:bo[k] + n]
        for c in range(n):
            o[c] += a0[c] * b0[c]


@njit(**_JIT)
def _expand(src, s0, L, cs, dst, d0, k, cd, a, b):
    """For ``li < L``, ``i < k``, ``o < cd``:
    ``dst[d0 + (li*k + i)*cd + o] = src[s0 + li*cs + (o // a)*b + i]``."""
    for li in range(L):
        for i in range(k):
            base = d0 + (li * k + i) * cd
            sb = s0 + li * cs + i
            for g in range(cd // a):
                v = src[sb + g * b]
                for j in range(a):
                    dst[base + g * a + j] = v


@njit(**_JIT)
def _range(off, s, n_out, n_in):
    """Output positions ``[p0, p1)`` whose input ``p*s + off`` lies in ``[0, n_in)``."""
    p0 = max(0, -(off // s))
    p1 = min(n_out, (n_in - 1 - off) // s + 1)
    return p0, max(p0, p1)


@njit(**_JIT)
def fwd(x, w, y, xs, ks, ys, C, OC, s, d, pb, cg, og, r0, r1):
    """``y[n, p, o] = sum_{t, i} x[n, p*s + t*d - pb, g(o)*cg + i] * w[t, i, o]``."""
    D, H, W = xs[1], xs[2], xs[3]
    KD, KH, KW = ks[0], ks[1], ks[2]
    OD, OH, OW = ys[1], ys[2], ys[3]
    expand = cg > 1 or og > 1
    rowlen = W * cg * OC if expand else W * C      # one row of A
    for r in range(r0, r1):
        n = r // (OD * OH)
        pd = (r // OH) % OD
        ph = r % OH
        yb = r * OW * OC
        y[yb:yb + OW * OC] = 0
        buf = np.empty(KD * KH * rowlen if expand else 0, x.dtype)
        A = buf if expand else x
        rows = np.empty(KD * KH, np.int64)        # A offset of each valid (td, th), or -1
        for td in range(KD):
            qd = pd * s[0] + td * d[0] - pb[0]
            for th in range(KH):
                qh = ph * s[1] + th * d[1] - pb[1]
                k = td * KH + th
                rows[k] = -1
                if qd < 0 or qd >= D or qh < 0 or qh >= H:
                    continue
                xb = ((n * D + qd) * H + qh) * W * C
                if expand:
                    _expand(x, xb, W, C, buf, k * rowlen, cg, OC, og, cg)
                    rows[k] = k * rowlen
                else:
                    rows[k] = xb
        ao = np.empty(KD * KH * KW * cg, np.int64)
        bo = np.empty(KD * KH * KW * cg, np.int64)
        for p in range(OW):
            m = 0
            for k in range(KD * KH):
                if rows[k] < 0:
                    continue
                for tw in range(KW):
                    q = p * s[2] + tw * d[2] - pb[2]
                    if q < 0 or q >= W:
                        continue
                    for i in range(cg):
                        ao[m] = rows[k] + (q * cg + i) * OC if expand else rows[k] + q * C
                        bo[m] = ((k * KW + tw) * cg + i) * OC
                        m += 1
            _accum(y, yb + p * OC, A, ao, w, bo, m, OC)
    return y


@njit(**_JIT)
def dgrad(we, dy, dx, xs, ks, ys, C, OC, s, d, pb, cg, og, r0, r1):
    """``dx[n, q, c] = sum_{t, j} dy[n, p, g(c)*og + j] * we[t, j, c]`` over the
    ``(p, t)`` with ``p*s + t*d - pb = q``; ``we[t, j, c] = w[t, c % cg, g(c)*og + j]``."""
    D, H, W = xs[1], xs[2], xs[3]
    KD, KH, KW = ks[0], ks[1], ks[2]
    OD, OH, OW = ys[1], ys[2], ys[3]
    expand = cg > 1 or og > 1
    rowlen = OW * og * C if expand else OW * OC
    # along the last axis, the output position each (q, tw) reads, or -1
    # (divisions hoisted out of the per-pixel loop)
    pw = np.empty(W * KW, np.int64)
    for q in range(W):
        for tw in range(KW):
            nw = q + pb[2] - tw * d[2]
            ok = nw >= 0 and nw % s[2] == 0 and nw // s[2] < OW
            pw[q * KW + tw] = nw // s[2] if ok else -1
    for r in range(r0, r1):
        n = r // (D * H)
        qd = (r // H) % D
        qh = r % H
        xb = r * W * C
        dx[xb:xb + W * C] = 0
        buf = np.empty(KD * KH * rowlen if expand else 0, dy.dtype)
        A = buf if expand else dy
        rows = np.empty(KD * KH, np.int64)
        for td in range(KD):
            nd = qd + pb[0] - td * d[0]
            for th in range(KH):
                nh = qh + pb[1] - th * d[1]
                k = td * KH + th
                rows[k] = -1
                if (nd < 0 or nd % s[0] != 0 or nd // s[0] >= OD
                        or nh < 0 or nh % s[1] != 0 or nh // s[1] >= OH):
                    continue
                yb = ((n * OD + nd // s[0]) * OH + nh // s[1]) * OW * OC
                if expand:
                    _expand(dy, yb, OW, OC, buf, k * rowlen, og, C, cg, og)
                    rows[k] = k * rowlen
                else:
                    rows[k] = yb
        ao = np.empty(KD * KH * KW * og, np.int64)
        bo = np.empty(KD * KH * KW * og, np.int64)
        for q in range(W):
            m = 0
            for k in range(KD * KH):
                if rows[k] < 0:
                    continue
                for tw in range(KW):
                    p = pw[q * KW + tw]
                    if p < 0:
                        continue
                    for j in range(og):
                        ao[m] = rows[k] + (p * og + j) * C if expand else rows[k] + p * OC
                        bo[m] = ((k * KW + tw) * og + j) * C
                        m += 1
            _accum(dx, xb + q * C, A, ao, we, bo, m, C)
    return dx


@njit(**_JIT)
def wgrad_partials(x, dy, part, xs, ks, ys, C, OC, s, d, pb, cg, og, k0, k1, nchunks):
    """``part[k, t, i, o]`` for ``k0 <= k < k1``: the sum over the rows of chunk ``k`` of
    ``x[n, p*s + t*d - pb, g(o)*cg + i] * dy[n, p, o]``."""
    D, H, W = xs[1], xs[2], xs[3]
    KD, KH, KW = ks[0], ks[1], ks[2]
    OD, OH, OW = ys[1], ys[2], ys[3]
    T = KD * KH * KW
    rows = xs[0] * OD * OH
    expand = cg > 1 or og > 1
    for k in range(k0, k1):
        pb0 = k * T * cg * OC
        part[pb0:pb0 + T * cg * OC] = 0
        buf = np.empty(W * cg * OC if expand else 0, x.dtype)
        A = buf if expand else x
        ao = np.empty(OW, np.int64)
        bo = np.empty(OW, np.int64)
        for r in range(k * rows // nchunks, (k + 1) * rows // nchunks):
            n = r // (OD * OH)
            pd = (r // OH) % OD
            ph = r % OH
            yb = r * OW * OC
            for td in range(KD):
                qd = pd * s[0] + td * d[0] - pb[0]
                if qd < 0 or qd >= D:
                    continue
                for th in range(KH):
                    qh = ph * s[1] + th * d[1] - pb[1]
                    if qh < 0 or qh >= H:
                        continue
                    xb = ((n * D + qd) * H + qh) * W * C
                    if expand:
                        _expand(x, xb, W, C, buf, 0, cg, OC, og, cg)
                    for tw in range(KW):
                        off = tw * d[2] - pb[2]
                        p0, p1 = _range(off, s[2], OW, W)
                        t = (td * KH + th) * KW + tw
                        for i in range(cg):
                            m = 0
                            for p in range(p0, p1):
                                q = p * s[2] + off
                                ao[m] = (q * cg + i) * OC if expand else xb + q * C
                                bo[m] = yb + p * OC
                                m += 1
                            _accum(part, pb0 + (t * cg + i) * OC, A, ao, dy, bo, m, OC)
    return part
