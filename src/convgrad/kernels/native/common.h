// What every kernel of the engine shares: strided tensors, line conversion, ranges.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "simd.h"

namespace cg {

// A strided view in the kernel's axis order: n, d, h, w, c (elements).
struct Tensor {
    const void* ptr;
    int64_t dtype;
    int64_t stride[5];
};

inline int64_t itemsize(int64_t dtype) { return dtype == F32 ? 4 : 2; }

inline const char* at(const Tensor& t, int64_t n, int64_t d, int64_t h, int64_t w,
                      int64_t c) {
    return (const char*)t.ptr + itemsize(t.dtype) * (n * t.stride[0] + d * t.stride[1] +
                                                     h * t.stride[2] + w * t.stride[3] +
                                                     c * t.stride[4]);
}

inline bool direct_f32(const Tensor& t) { return t.dtype == F32 && t.stride[4] == 1; }

// One block of a GEMM's vector-operand panel from channels-first float32 rows: the
// channel rows src + j * cs (positions contiguous) -> o[p * nb + j] for p < np, j < nb,
// zero for the channels j >= nch (past the operand's last), by 8 x 8 transposes where
// 8 channels are there (a block of 4 or 12 channels on the portable build: scalar).
inline void channel_rows_to_panel(float* o, const float* src, int64_t cs, int64_t np,
                                  int64_t nb, int64_t nch) {
    const int64_t p8 = np / 8 * 8;
    for (int64_t j0 = 0; j0 < nb; j0 += 8) {
        const int64_t jn = std::min<int64_t>(8, nb - j0);
        const float* s = src + j0 * cs;
        if (jn == 8 && j0 + 8 <= nch) {
            for (int64_t p = 0; p < p8; p += 8) transpose8(s + p, cs, o + p * nb + j0, nb);
            for (int64_t p = p8; p < np; p++)
                for (int64_t i = 0; i < 8; i++) o[p * nb + j0 + i] = s[i * cs + p];
        } else {
            for (int64_t p = 0; p < np; p++)
                for (int64_t i = 0; i < jn; i++)
                    o[p * nb + j0 + i] = j0 + i < nch ? s[i * cs + p] : 0.0f;
        }
    }
}

// Copy the lines (d, h) for d in ds, h in hs of sample n (all W pixels, all C
// channels) to dst as float32 [d][h][w][c].
// Convert W pixels of line (n, d, h) -- or, when the lines are contiguous, W pixels
// running on into the next lines -- (all C channels) to dst as float32 [w][c].
inline void convert_line(float* o, const Tensor& t, int64_t n, int64_t d, int64_t h, int64_t W,
                         int64_t C) {
    const int64_t sw = t.stride[3], sc = t.stride[4];
    if (sc == 1 && sw == C) {
        // the pixels' channels follow each other: one run (few channels: long vectors)
        convert_run(o, at(t, n, d, h, 0, 0), t.dtype, 1, W * C);
        return;
    }
    if (sc == 1 || sw > sc) {
        for (int64_t w = 0; w < W; w++) convert_run(o + w * C, at(t, n, d, h, w, 0), t.dtype, sc, C);
        return;
    }
    // channels outermost in memory (NCX), float32 with unit w stride: 8 x 8 blocks
    // transposed from the channel rows as they are into channels-last rows (through a
    // staging copy of 64 pixels a channel, 30% of an NCX TCN data gradient went to
    // the copy's memmove calls and the conversion)
    if (t.dtype == F32 && sw == 1 && !(cg_engine_dbg & 1024)) {
        const float* base = (const float*)at(t, n, d, h, 0, 0);
        const int64_t w8 = W / 8 * 8, c8 = C / 8 * 8;
        for (int64_t c0 = 0; c0 < c8; c0 += 8) {
            const float* s = base + c0 * sc;
            for (int64_t w = 0; w < w8; w += 8) transpose8(s + w, sc, o + w * C + c0, C);
            for (int64_t w = w8; w < W; w++)
                for (int64_t c = 0; c < 8; c++) o[w * C + c0 + c] = s[c * sc + w];
        }
        for (int64_t c = c8; c < C; c++) {
            const float* s = base + c * sc;
            for (int64_t w = 0; w < W; w++) o[w * C + c] = s[w];
        }
        return;
    }
    // other dtypes or strides: blocks of 8 channels x 64 pixels, read along w
    // (converted), transposed 8 x 8 into channels-last rows
    float tmp[8][64];
    for (int64_t c0 = 0; c0 < C; c0 += 8) {
        const int64_t cn = std::min<int64_t>(8, C - c0);
        for (int64_t w0 = 0; w0 < W; w0 += 64) {
            const int64_t wn = std::min<int64_t>(64, W - w0);
            for (int64_t c = 0; c < cn; c++)
                convert_run(tmp[c], at(t, n, d, h, w0, c0 + c), t.dtype, sw, wn);
            int64_t k = 0;
            if (cn == 8)
                for (; k + 8 <= wn; k += 8) transpose8(&tmp[0][k], 64, o + (w0 + k) * C + c0, C);
            for (; k < wn; k++) {
                float* row = o + (w0 + k) * C + c0;
                for (int64_t c = 0; c < cn; c++) row[c] = tmp[c][k];
            }
        }
    }
}

// Copy the lines (d, h) for d in ds, h in hs of sample n (all W pixels, all C
// channels) to dst as float32 [d][h][w][c].
inline void pack_lines(float* dst, const Tensor& t, int64_t n, const std::vector<int64_t>& ds,
                       const std::vector<int64_t>& hs, int64_t W, int64_t C) {
    for (size_t i = 0; i < ds.size(); i++)
        for (size_t j = 0; j < hs.size(); j++)
            convert_line(dst + (i * hs.size() + j) * W * C, t, n, ds[i], hs[j], W, C);
}

inline int64_t index_of(const std::vector<int64_t>& v, int64_t x) {
    return std::lower_bound(v.begin(), v.end(), x) - v.begin();
}

// Range of u in [0, U) with 0 <= u*step + off < L.
inline void valid_range(int64_t U, int64_t step, int64_t off, int64_t L, int64_t& u0,
                        int64_t& u1) {
    // u*step + off >= 0  <=>  u >= ceil(-off / step)
    int64_t lo = off >= 0 ? 0 : (-off + step - 1) / step;
    // u*step + off <= L - 1  <=>  u <= floor((L - 1 - off) / step)
    int64_t num = L - 1 - off;
    int64_t hi = num < 0 ? 0 : num / step + 1;
    u0 = std::max<int64_t>(0, lo);
    u1 = std::min<int64_t>(U, hi);
    if (u1 < u0) u1 = u0;
}

// Prefetch (into L2) the line keyed (n * L0 + d) * L1 + h of a channels-first view: its
// channels' pixel runs lie a channel stride apart, short runs in many places that the
// hardware prefetchers do not follow (a 3-D NCX data gradient's line conversions ran at
// a third of the speed of the channels-last ones).  Other layouts: nothing to do.
inline void prefetch_line(const Tensor& t, int64_t key, int64_t L0, int64_t L1, int64_t W,
                          int64_t C) {
    if (t.stride[4] <= t.stride[3] || t.stride[3] != 1) return;
    const int64_t n = key / (L0 * L1), d = (key / L1) % L0, h = key % L1;
    const int64_t bytes = W * itemsize(t.dtype);
    for (int64_t c = 0; c < C; c++) {
        const char* r = at(t, n, d, h, 0, c);
        for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(r + b, 0, 2);
        __builtin_prefetch(r + bytes - 1, 0, 2);
    }
}

// Convert the keyed lines (all W pixels, all C channels) to dst, float32 [key][w][c].
inline void pack_keyed_lines(float* dst, const Tensor& t, const std::vector<int64_t>& keys,
                             int64_t L0, int64_t L1, int64_t W, int64_t C) {
    // runs of consecutive lines of one (n, d) that follow each other in memory
    // convert as one long line (short lines of NCX tensors: far fewer, longer reads)
    const bool chained = t.stride[2] == W * t.stride[3];
    for (size_t i = 0; i < keys.size();) {
        const int64_t k = keys[i], n = k / (L0 * L1), d = (k / L1) % L0, h = k % L1;
        size_t j = i + 1;
        while (chained && j < keys.size() && keys[j] == keys[j - 1] + 1 && keys[j] % L1 != 0) j++;
        if (j < keys.size()) prefetch_line(t, keys[j], L0, L1, W, C);
        convert_line(dst + i * W * C, t, n, d, h, (int64_t)(j - i) * W, C);
        i = j;
    }
}

// First channel of tile k when n channels are cut into ``tiles`` near-equal tiles
// (a tile of 5 beats a lone tile of 4 after ten of 6: more accumulators busy).
inline int64_t tile_start(int64_t k, int64_t n, int64_t tiles) { return k * n / tiles; }

// Zero the part of a weight gradient (or of a partial of it) that a task adds into, just
// before it does (by the thread that runs it: in parallel, and the lines are then in its
// caches): ``rows`` rows of ``O`` floats (taps x input channels of a group), the columns
// of output blocks [b0, b1) numbered over the groups (block b: group b / nob, columns
// from (b % nob) * NB within the group's og); with ``ld``, rows ld floats apart and
// column j at row[j - col0] (a task's part in scratch).
inline void zero_blocks(float* dw, int64_t rows, int64_t O, int64_t og, int64_t NB,
                        int64_t b0, int64_t b1, int64_t ld = -1, int64_t col0 = 0) {
    const int64_t nob = (og + NB - 1) / NB, G = O / og;
    if (ld < 0) ld = O;
    if (b0 <= 0 && b1 >= G * nob && ld == O && col0 == 0) {
        std::memset(dw, 0, sizeof(float) * rows * O);
        return;
    }
    for (int64_t b = b0; b < b1;) {
        const int64_t g = b / nob, e = std::min(b1, (g + 1) * nob);
        const int64_t c0 = g * og + (b % nob) * NB, c1 = g * og + std::min(og, (e - g * nob) * NB);
        for (int64_t r = 0; r < rows; r++)
            std::memset(dw + r * ld + (c0 - col0), 0, sizeof(float) * (c1 - c0));
        b = e;
    }
}

}  // namespace cg
