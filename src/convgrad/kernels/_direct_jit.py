"""The numba loops of the direct kernel (see :mod:`convgrad.kernels.direct`).

Everything here is 3-D and channels last, on flat (1-D) views: data
``(N, D, H, W, C)``, weights ``(KD, KH, KW, C/G, O)`` (``O`` is ``CO`` in the
code); lower ranks arrive with leading axes of size 1.  Sizes come as int64 arrays of length 3.

Every output vector (one pixel's channels, or one tap's weight gradient) is
a sum of products of channel vectors, ``out += sum_k A[a_k:] * B[b_k:]``:
the offsets ``(a_k, b_k)`` that contribute come from tables built once per
call (fwd, dgrad: per position along the last axis) or per row (wgrad), then
:func:`_accum` adds them four at a time with the channel index innermost, so
the output vector is loaded and stored once per four products and LLVM
vectorizes the channel loop.  Where a group holds more than one input or
output channel, the rows that are read are first *expanded* (:func:`_cached_row`)
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
def _accum(out, ob, A, abase, ao, B, bbase, bo, cnt, L, npix, n):
    """For ``p < npix``: ``out[ob + p*n :][:n] += sum_{k < cnt[p]} A[a:][:n] * B[b:][:n]``
    with ``a = abase + ao[p*L + k]``, ``b = bbase + bo[p*L + k]`` (k in order,
    four products per pass).

    Indices are unsigned (numba then emits no negative-index wraparound, and
    LLVM vectorizes the channel loop); no array is sliced (a numba slice costs
    more than a short channel loop)."""
    nu = np.uint64(n)
    for p in range(npix):
        o = np.uint64(ob + p * n)
        m = cnt[p]
        e = p * L
        k = 0
        while k + 4 <= m:
            a0 = np.uint64(abase + ao[e + k])
            a1 = np.uint64(abase + ao[e + k + 1])
            a2 = np.uint64(abase + ao[e + k + 2])
            a3 = np.uint64(abase + ao[e + k + 3])
            b0 = np.uint64(bbase + bo[e + k])
            b1 = np.uint64(bbase + bo[e + k + 1])
            b2 = np.uint64(bbase + bo[e + k + 2])
            b3 = np.uint64(bbase + bo[e + k + 3])
            for c in range(nu):
                out[o + c] += ((A[a0 + c] * B[b0 + c] + A[a1 + c] * B[b1 + c])
                               + (A[a2 + c] * B[b2 + c] + A[a3 + c] * B[b3 + c]))
            k += 4
        r = m - k
        if r == 3:
            a0 = np.uint64(abase + ao[e + k])
            a1 = np.uint64(abase + ao[e + k + 1])
            a2 = np.uint64(abase + ao[e + k + 2])
            b0 = np.uint64(bbase + bo[e + k])
            b1 = np.uint64(bbase + bo[e + k + 1])
            b2 = np.uint64(bbase + bo[e + k + 2])
            for c in range(nu):
                out[o + c] += ((A[a0 + c] * B[b0 + c] + A[a1 + c] * B[b1 + c])
                               + A[a2 + c] * B[b2 + c])
        elif r == 2:
            a0 = np.uint64(abase + ao[e + k])
            a1 = np.uint64(abase + ao[e + k + 1])
            b0 = np.uint64(bbase + bo[e + k])
            b1 = np.uint64(bbase + bo[e + k + 1])
            for c in range(nu):
                out[o + c] += A[a0 + c] * B[b0 + c] + A[a1 + c] * B[b1 + c]
        elif r == 1:
            a0 = np.uint64(abase + ao[e + k])
            b0 = np.uint64(bbase + bo[e + k])
            for c in range(nu):
                out[o + c] += A[a0 + c] * B[b0 + c]


@njit(**_JIT)
def _index(k, cd, a, b):
    """Expansion index: ``idx[i*cd + o] = (o // a)*b + i`` for ``i < k``, ``o < cd``."""
    idx = np.empty(k * cd, np.uint64)
    for i in range(k):
        for o in range(cd):
            idx[i * cd + o] = (o // a) * b + i
    return idx


@njit(**_JIT)
def _cached_row(src, s0, rid, L, cs, cache, tags, idx):
    """Offset in ``cache`` of source row ``rid`` (``L`` positions of ``cs``
    channels from ``src[s0]``) expanded by ``idx``, expanding it on a miss.
    A direct-mapped cache: consecutive output rows share most source rows."""
    nslots = tags.shape[0]
    E = idx.shape[0]
    slot = rid % nslots
    base = slot * L * E
    if tags[slot] != rid:
        for pos in range(L):
            sb = np.uint64(s0 + pos * cs)
            db = np.uint64(base + pos * E)
            for e in range(np.uint64(E)):
                cache[db + e] = src[sb + idx[e]]
        tags[slot] = rid
    return base


@njit(**_JIT)
def _range(off, s, n_out, n_in):
    """Output positions ``[p0, p1)`` whose input ``p*s + off`` lies in ``[0, n_in)``."""
    p0 = max(0, -(off // s))
    p1 = min(n_out, (n_in - 1 - off) // s + 1)
    return p0, max(p0, p1)


@njit(**_JIT)
def fwd(x, w, y, xs, ks, ys, C, CO, s, d, pb, cg, og, r0, r1):
    """``y[n, p, o] = sum_{t, i} x[n, p*s + t*d - pb, g(o)*cg + i] * w[t, i, o]``."""
    D, H, W = xs[1], xs[2], xs[3]
    KD, KH, KW = ks[0], ks[1], ks[2]
    OD, OH, OW = ys[1], ys[2], ys[3]
    expand = cg > 1 or og > 1
    rowlen = W * cg * CO if expand else W * C      # one row of A
    # along the last axis, per output position p: the (A, w) offsets of its
    # taps inside one row (computed once, not per pixel)
    L = KW * cg
    ncol = np.zeros(OW, np.int64)
    cola = np.empty(OW * L, np.int64)
    colb = np.empty(OW * L, np.int64)
    for p in range(OW):
        for tw in range(KW):
            q = p * s[2] + tw * d[2] - pb[2]
            if q < 0 or q >= W:
                continue
            for i in range(cg):
                cola[p * L + ncol[p]] = (q * cg + i) * CO if expand else q * C
                colb[p * L + ncol[p]] = (tw * cg + i) * CO
                ncol[p] += 1
    idx = _index(cg, CO, og, cg)
    cache = np.empty(KD * KH * rowlen if expand else 0, x.dtype)
    tags = np.full(KD * KH, -1, np.int64)
    A = cache if expand else x
    for r in range(r0, r1):
        n = r // (OD * OH)
        pd = (r // OH) % OD
        ph = r % OH
        yb = r * OW * CO
        y[yb:yb + OW * CO] = 0
        for td in range(KD):
            qd = pd * s[0] + td * d[0] - pb[0]
            if qd < 0 or qd >= D:
                continue
            for th in range(KH):
                qh = ph * s[1] + th * d[1] - pb[1]
                if qh < 0 or qh >= H:
                    continue
                rid = (n * D + qd) * H + qh
                abase = rid * W * C
                if expand:
                    abase = _cached_row(x, abase, rid, W, C, cache, tags, idx)
                bbase = (td * KH + th) * L * CO
                _accum(y, yb, A, abase, cola, w, bbase, colb, ncol, L, OW, CO)
    return y


@njit(**_JIT)
def dgrad(we, dy, dx, xs, ks, ys, C, CO, s, d, pb, cg, og, r0, r1):
    """``dx[n, q, c] = sum_{t, j} dy[n, p, g(c)*og + j] * we[t, j, c]`` over the
    ``(p, t)`` with ``p*s + t*d - pb = q``; ``we[t, j, c] = w[t, c % cg, g(c)*og + j]``."""
    D, H, W = xs[1], xs[2], xs[3]
    KD, KH, KW = ks[0], ks[1], ks[2]
    OD, OH, OW = ys[1], ys[2], ys[3]
    expand = og > 1 or cg > 1
    rowlen = OW * og * C if expand else OW * CO
    # along the last axis, per input position q: the (A, we) offsets of the
    # (p, tw) that reach it inside one row (divisions out of the pixel loop)
    L = KW * og
    ncol = np.zeros(W, np.int64)
    cola = np.empty(W * L, np.int64)
    colb = np.empty(W * L, np.int64)
    for q in range(W):
        for tw in range(KW):
            nw = q + pb[2] - tw * d[2]
            if nw < 0 or nw % s[2] != 0 or nw // s[2] >= OW:
                continue
            p = nw // s[2]
            for j in range(og):
                cola[q * L + ncol[q]] = (p * og + j) * C if expand else p * CO
                colb[q * L + ncol[q]] = (tw * og + j) * C
                ncol[q] += 1
    idx = _index(og, C, cg, og)
    cache = np.empty(KD * KH * rowlen if expand else 0, dy.dtype)
    tags = np.full(KD * KH, -1, np.int64)
    A = cache if expand else dy
    for r in range(r0, r1):
        n = r // (D * H)
        qd = (r // H) % D
        qh = r % H
        xb = r * W * C
        dx[xb:xb + W * C] = 0
        for td in range(KD):
            nd = qd + pb[0] - td * d[0]
            if nd < 0 or nd % s[0] != 0 or nd // s[0] >= OD:
                continue
            for th in range(KH):
                nh = qh + pb[1] - th * d[1]
                if nh < 0 or nh % s[1] != 0 or nh // s[1] >= OH:
                    continue
                rid = (n * OD + nd // s[0]) * OH + nh // s[1]
                abase = rid * OW * CO
                if expand:
                    abase = _cached_row(dy, abase, rid, OW, CO, cache, tags, idx)
                bbase = (td * KH + th) * L * C
                _accum(dx, xb, A, abase, cola, we, bbase, colb, ncol, L, W, C)
    return dx


@njit(**_JIT)
def wgrad_partials(x, dy, part, xs, ks, ys, C, CO, s, d, pb, cg, og, k0, k1, nchunks):
    """``part[k, t, i, o]`` for ``k0 <= k < k1``: the sum over the rows of chunk ``k`` of
    ``x[n, p*s + t*d - pb, g(o)*cg + i] * dy[n, p, o]``."""
    D, H, W = xs[1], xs[2], xs[3]
    KD, KH, KW = ks[0], ks[1], ks[2]
    OD, OH, OW = ys[1], ys[2], ys[3]
    T = KD * KH * KW
    rows = xs[0] * OD * OH
    expand = cg > 1 or og > 1
    idx = _index(cg, CO, og, cg)
    for k in range(k0, k1):
        pb0 = k * T * cg * CO
        part[pb0:pb0 + T * cg * CO] = 0
        cache = np.empty(KD * KH * W * cg * CO if expand else 0, x.dtype)
        tags = np.full(KD * KH, -1, np.int64)
        A = cache if expand else x
        ao = np.empty(OW, np.int64)
        bo = np.empty(OW, np.int64)
        cnt = np.empty(1, np.int64)
        for r in range(k * rows // nchunks, (k + 1) * rows // nchunks):
            n = r // (OD * OH)
            pd = (r // OH) % OD
            ph = r % OH
            yb = r * OW * CO
            for td in range(KD):
                qd = pd * s[0] + td * d[0] - pb[0]
                if qd < 0 or qd >= D:
                    continue
                for th in range(KH):
                    qh = ph * s[1] + th * d[1] - pb[1]
                    if qh < 0 or qh >= H:
                        continue
                    rid = (n * D + qd) * H + qh
                    xb = rid * W * C
                    if expand:
                        xb = _cached_row(x, xb, rid, W, C, cache, tags, idx)
                    for tw in range(KW):
                        off = tw * d[2] - pb[2]
                        p0, p1 = _range(off, s[2], OW, W)
                        t = (td * KH + th) * KW + tw
                        for i in range(cg):
                            m = 0
                            for p in range(p0, p1):
                                q = p * s[2] + off
                                ao[m] = xb + (q * cg + i) * CO if expand else xb + q * C
                                bo[m] = yb + p * CO
                                m += 1
                            cnt[0] = m
                            _accum(part, pb0 + (t * cg + i) * CO, A, 0, ao, dy, 0, bo, cnt,
                                   0, 1, CO)
    return part
