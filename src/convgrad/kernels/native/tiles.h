// The register tiles' shapes, and the GEMM tile the weight gradient (and any
// kernel that multiplies packed panels) runs on.
#pragma once

#include <array>
#include <cstdint>
#include <utility>

#include "simd.h"

namespace cg {
namespace {

// Tile shapes per ISA: R pixels x B blocks of NV vectors, R*NV*B accumulators
// (ACC of the 16 ymm / 32 zmm registers; the rest hold weights and a broadcast).
#if CG_VL == 16
constexpr int ACC = 28;
constexpr int CORR_RMAX[5] = {0, 24, 14, 9, 6};
#else
constexpr int ACC = 12;
constexpr int CORR_RMAX[5] = {0, 12, 6, 4, 3};
#endif
constexpr int BMAX = 4;
constexpr int64_t GEMM_PF = 8;
constexpr int64_t GEMM_PF_FAR = 32, GEMM_PF_FAR_FROM = 128;

// One position of gemm_tile: acc[i][k] += row(i) * (block k of B's row at Bp, blocks
// bstride floats apart) for the MR rows; row(i) reads row i's float (inlined, i a
// constant once the loop is unrolled, so each way of addressing the rows keeps its
// pointers in registers).
template <int MR, int NV, int BK, class Row>
__attribute__((always_inline)) inline void gemm_position(vf (&acc)[MR][BK][NV], const float* Bp,
                                                         int64_t bstride, Row row) {
    vf b[BK][NV];
#pragma GCC unroll 8
    for (int k = 0; k < BK; k++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) b[k][v] = load(Bp + k * bstride + v * VL);
#pragma GCC unroll 64
    for (int i = 0; i < MR; i++) {
        const vf s = bcast(row(i));
#pragma GCC unroll 8
        for (int k = 0; k < BK; k++)
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) acc[i][k][v] += s * b[k][v];
    }
}

// C_i[k*NB + j] += sum_l sum_p A_i[l*aline + p*lda] * B_k[l*bline + p*NB + j] for MR
// rows i and BK blocks k of B (B_k = B + k*bstride), over nl lines of np positions;
// nvalid counts the valid columns of all blocks.  Row i reads A_i = a[i] (one input
// channel of one tap: rows of a tile may come from different taps) and adds into
// C_i = c[i] (set: stores into C_i instead, the first sum of a weight gradient's part).
// Lines let one call sum the positions of several short output lines (x rows a fixed
// distance apart) while its accumulators stay in registers.
template <int MR, int NV, int BK>
void gemm_tile(int64_t np, int64_t nl, const float* const* a, int64_t lda, int64_t aline,
               const float* B, int64_t bstride, int64_t bline, float* const* c, int nvalid,
               bool set) {
    constexpr int NB = NV * VL;
    vf acc[MR][BK][NV];
    const float* A[MR];
    // The sums this tile adds into are fetched (for writing) before the loop: loaded
    // after it, they came from L2 or L3 with nothing left to overlap them (the weight
    // gradients' in-place dw rows and Winograd sums).  2 threads, alternating, after the
    // pause: DeepLab d6 and U-Net 3-D Winograd weight gradients 1.04x, res4 1.05x, the
    // TCN 1.04x, res5 and res2 1x1 1.02x, DCGAN level (engine debug bit 33554432: off).
    if (!set && !(cg_engine_dbg & 33554432)) {
#pragma GCC unroll 64
        for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
            for (int k = 0; k < BK; k++)
#pragma GCC unroll 8
                for (int v = 0; v < NV; v += VL_PER_LINE)
                    __builtin_prefetch(c[i] + k * NB + v * VL, 1, 3);
    }
#pragma GCC unroll 64
    for (int i = 0; i < MR; i++) {
        A[i] = a[i];
#pragma GCC unroll 8
        for (int k = 0; k < BK; k++)
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) acc[i][k][v] = zero();
    }
    // Rows read in place (lda floats apart: a new cache line each position, the
    // weight gradient's x rows) are prefetched GEMM_PF positions ahead: their lines,
    // a power-of-two stride apart, share a few L1 sets, and the tile stalled on its
    // broadcasts.  AVX-512, hot, 2 threads: ResNet-50 res2 1x1 weight gradient 1.13x,
    // res4 1.04x, DCGAN 1.03x, DeepLab 1.02x, res5 level (4 and 16 ahead: no better).
    // Runs of at least GEMM_PF_FAR_FROM positions (one long line: a 1x1 layer's rows,
    // read once from memory) prefetch GEMM_PF_FAR ahead: res2 1x1 1.10-1.70x after the
    // benchmark's pause, 0.96-0.98x hot; 32 ahead on the short lines of res3-res5 and
    // DCGAN was 0.76-0.97x (lines of 7-32 positions: it fetched rows of other lines).
    // Engine debug bits: 4096 no prefetch, 8192 never the far one.
    const int64_t pfo = (lda > NB && !(cg_engine_dbg & 4096))
        ? ((np >= GEMM_PF_FAR_FROM && !(cg_engine_dbg & 8192)) ? GEMM_PF_FAR : GEMM_PF) * lda : 0;
    // Rows of consecutive channels (a[i] = a[0] + i: every caller but the folded taps
    // of wgrad_gemm_rows) are read through one pointer, the broadcasts at fixed
    // displacements: 14 row pointers do not fit in the general registers beside the
    // loop's own, and the general loop reloaded most of them from the stack at every
    // position (2 + 14 + 12 loads a position for 28 FMAs; L1-resident res4-shaped
    // tile 79% -> see docs/kernels.md).
    bool contig = !(cg_engine_dbg & 131072);
#pragma GCC unroll 64
    for (int i = 1; i < MR; i++) contig = contig && A[i] == A[0] + i;
    // Rows a fixed distance apart (channels-first channel rows, cfwgrad.cpp): groups of
    // four rows, each through one base pointer and the distance (1, 2, 3 times) as an
    // index register.
    const int64_t rs = MR > 1 ? A[1] - A[0] : 0;
    bool strided = !contig && MR >= 4 && rs != 0 && !(cg_engine_dbg & 131072);
#pragma GCC unroll 64
    for (int i = 2; i < MR; i++) strided = strided && A[i] == A[0] + i * rs;
    if (strided) {
        constexpr int NG = (MR + 3) / 4;
        const float* gb[NG];
#pragma GCC unroll 8
        for (int q = 0; q < NG; q++) gb[q] = A[0] + 4 * q * rs;
        const int64_t rs2 = 2 * rs, rs3 = 3 * rs;
        for (int64_t l = 0; l < nl; l++, B += bline) {
            for (int64_t p = 0; p < np; p++) {
                gemm_position<MR, NV, BK>(acc, B + p * NB, bstride, [&](int i) {
                    const float* q = gb[i / 4];
                    return i % 4 == 0 ? q[0] : i % 4 == 1 ? q[rs] : i % 4 == 2 ? q[rs2] : q[rs3];
                });
#pragma GCC unroll 8
                for (int q = 0; q < NG; q++) gb[q] += lda;
            }
#pragma GCC unroll 8
            for (int q = 0; q < NG; q++) gb[q] += aline - np * lda;
        }
    } else if (contig) {
        const float* A0 = A[0];
        for (int64_t l = 0; l < nl; l++, B += bline, A0 += aline) {
            for (int64_t p = 0; p < np; p++) {
                const float* ap = A0 + p * lda;
                if (pfo) {
                    __builtin_prefetch(ap + pfo);
                    __builtin_prefetch(ap + pfo + MR - 1);
                }
                gemm_position<MR, NV, BK>(acc, B + p * NB, bstride, [&](int i) { return ap[i]; });
            }
        }
    } else {
        for (int64_t l = 0; l < nl; l++, B += bline) {
            for (int64_t p = 0; p < np; p++) {
                if (pfo) {
                    __builtin_prefetch(A[0] + p * lda + pfo);
                    __builtin_prefetch(A[MR - 1] + p * lda + pfo);
                }
                const int64_t ap = p * lda;
                gemm_position<MR, NV, BK>(acc, B + p * NB, bstride,
                                          [&](int i) { return A[i][ap]; });
            }
#pragma GCC unroll 64
            for (int i = 0; i < MR; i++) A[i] += aline;
        }
    }
    if (nvalid == BK * NB) {
#pragma GCC unroll 64
        for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
            for (int k = 0; k < BK; k++)
#pragma GCC unroll 8
                for (int v = 0; v < NV; v++) {
                    float* d = c[i] + k * NB + v * VL;
                    store(d, set ? acc[i][k][v] : load(d) + acc[i][k][v]);
                }
        return;
    }
    for (int i = 0; i < MR; i++)
        for (int k = 0; k < BK; k++)
            for (int v = 0; v < NV; v++) {
                const int n = nvalid - k * NB - v * VL;
                float* d = c[i] + k * NB + v * VL;
                if (n >= VL) store(d, set ? acc[i][k][v] : load(d) + acc[i][k][v]);
                else if (n > 0) store_n(d, set ? acc[i][k][v] : load_n(d, n) + acc[i][k][v], n);
            }
}

typedef void (*gemm_fn)(int64_t, int64_t, const float* const*, int64_t, int64_t,
                        const float*, int64_t, int64_t, float* const*, int, bool);

#if CG_VL == 16
constexpr int WG_MR[5] = {0, 24, 14, 9, 6};
#else
constexpr int WG_MR[5] = {0, 12, 6, 4, 3};
#endif

// Blocks of B a tile of m rows takes at once: few rows (few input channels per
// group) still keep enough independent accumulators.
constexpr int gemm_blocks(int m, int nv) {
    int b = ACC / (m * nv);
    return b < 1 ? 1 : (b > BMAX ? BMAX : b);
}

template <int NV, int K>
constexpr gemm_fn gemm_pick() {
    constexpr int M = K / BMAX + 1, B = K % BMAX + 1;
    if constexpr (B <= gemm_blocks(M, NV)) return &gemm_tile<M, NV, B>;
    else return nullptr;
}

template <int NV, int... K>
constexpr auto gemm_fns_impl(std::integer_sequence<int, K...>) {
    return std::array<gemm_fn, sizeof...(K)>{gemm_pick<NV, K>()...};
}

// fns[(m - 1) * BMAX + (bk - 1)]: the tile of m <= WG_MR[nv] input channels and bk
// blocks of output channels.
template <int NV>
const gemm_fn* gemm_fns() {
    static const auto table =
        gemm_fns_impl<NV>(std::make_integer_sequence<int, WG_MR[NV] * BMAX>{});
    return table.data();
}

inline const gemm_fn* gemm_table(int nv) {
    switch (nv) {
        case 1: return gemm_fns<1>();
        case 2: return gemm_fns<2>();
        case 3: return gemm_fns<3>();
        default: return gemm_fns<4>();
    }
}

}  // namespace
}  // namespace cg
