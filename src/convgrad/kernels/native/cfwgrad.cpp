// The weight gradient of channels-first callers, on their memory as it is.
//
// dw[t][c][o] = sum over the output positions p where tap t reads the input of
// x[c][p*s + t*d - pb] * dy[o][p], for NCX memory (each line's positions contiguous),
// one group.  Per group of output lines (consecutive h of one (n, d)), dy's rows are
// transposed (8 x 8) into an [o block][line][w][NB] panel that the GEMM tile (tiles.h)
// streams from L2 as its vector operand; the broadcasts are x's channel rows read in
// place, MR channels x the group's lines x the tap's valid positions (stride s: every
// s-th float), in L1 while every block of o passes.  Taps never read padding: each sums
// only the lines and positions where it reads the input (D17).
//
// float16 / bfloat16 memory: dy's rows are widened into a staging row before their
// transposition, and the x rows a group of lines reads at one depth (all channels, the
// rows of its lines' taps) into a float32 slab that the broadcasts read instead; the
// sums are the float32 kernel's on the widened values.
//
// Channels-last pixels (few input channels: native.py, _cf_wgrad_takes) go the same way:
// a tile's rows are x's channels at a position step of C floats -- the folded taps' rows
// (kw, c) consecutive floats --, and each dy pixel's run of a block's channels is copied
// into the panel.
//
// The general kernel (engine.cpp: cg_wgrad_run) converts channels-first lines into
// channels-last scratch first and reads x's converted rows as its broadcasts; the 1x1
// case of this layout (engine.cpp: cg_pw_run) showed that x's rows in place, runs of
// consecutive floats, feed the tile at ~95% of one core's FMA peak.

#include <algorithm>
#include <cstdint>

#include "common.h"
#include "simd.h"
#include "tiles.h"

using namespace cg;

CG_ISA_OF(cfwgrad)

extern "C" int64_t cg_engine_dbg;   // bit 256: one tap a tile (A/B; engine.cpp: taps in kw order)

namespace {
constexpr int64_t CFW_SUM = 512;
}  // namespace

extern "C" {

// x (N, C, D, H, W) and dy (N, O, Md, Mh, Mw) float32 with unit w strides, their other
// strides in floats; dw (*K, C, O) or a partial of it.  Task k (tasks[5k .. 5k + 4]):
// output lines [l0, l1) (numbered (n * Md + d) * Mh + h), output blocks [b0, b1),
// address of the dw it adds into (the task zeroes its blocks of that dw first).
struct CfwProblem {
    const void* x;             // float32, or float16 / bfloat16 (dtype)
    const void* dy;
    int64_t xs[4];             // n, c, d, h
    int64_t ys[4];             // n, o, d, h
    int64_t N, C, O;
    int64_t L[3], M[3], K[3], s[3], d[3], pb[3];
    int64_t nv;                // NB = nv * VL output channels per block
    int64_t lines;             // output lines of a panel, at most
    const int64_t* tasks;
    int64_t dtype;             // x's and dy's
    int64_t xw, yw;            // x's and dy's w strides (elements): 1 for channels-first
                               // memory; C and O for channels-last pixels (xs[1] and
                               // ys[1] then 1: every pixel's channels contiguous)
};

// The input rows a group of at most `lines` output lines reads at one depth.
static int64_t slab_rows(const CfwProblem* P) {
    return std::min(P->L[1], (P->lines - 1) * P->s[1] + (P->K[1] - 1) * P->d[1] + 1);
}

// Floats of scratch per thread: one group's dy panel (16-bit memory: and a staging
// row of dy's block, the x slab).
int64_t cg_cfw_scratch(const CfwProblem* P) {
    const int64_t NB = P->nv * VL, nob = (P->O + NB - 1) / NB;
    const int64_t panel = P->lines * P->M[2] * nob * NB + 64;
    if (P->dtype == F32) return panel;
    return panel + (NB * P->M[2] + 64) + (P->C * slab_rows(P) * P->L[2] + 64);
}

int64_t cg_cfw_mr(int64_t nv) { return nv >= 1 && nv <= 4 ? WG_MR[nv] : 0; }

void cg_cfw_run(const CfwProblem* P, int64_t k, float* scratch) {
    const int64_t* task = P->tasks + 5 * k;
    const int64_t b0 = task[2], b1 = task[3];
    float* dw = (float*)(intptr_t)task[4];
    zero_blocks(dw, P->K[0] * P->K[1] * P->K[2] * P->C, P->O, P->O, P->nv * VL, b0, b1);
    const int nv = (int)P->nv, NB = nv * VL, mr = WG_MR[nv];
    const int64_t C = P->C, O = P->O, Mw = P->M[2];
    const int64_t nct = (C + mr - 1) / mr;
    const int64_t bw = Mw * NB;                          // a line of the panel
    const gemm_fn* fns = gemm_table(nv);
    const bool wide = P->dtype != F32;
    const int64_t es = itemsize(P->dtype);
    // (16-bit) the staging row of a block of dy and the x slab [c][row][w] after the panel
    float* stage = scratch + P->lines * Mw * ((O + NB - 1) / NB) * NB + 64;
    float* slab = stage + NB * Mw + 64;
    const int64_t sr = wide ? slab_rows(P) : 0;
    // x's channel, row and position strides as the tile reads them: its memory, or the
    // slab ([c][row][w], or [row][w][c] for channels-last pixels)
    const bool cl = P->xw != 1;
    const int64_t xc = wide ? (cl ? 1 : sr * P->L[2]) : P->xs[1];
    const int64_t xrow = wide ? (cl ? P->L[2] * C : P->L[2]) : P->xs[3];
    const int64_t xw = wide ? (cl ? C : 1) : P->xw;
    const float* ar[64];
    float* cr[64];
    const float* xr[64];       // a tile's rows: x at the first position of the first line
    int64_t dr[64];            // and the dw row ((t * C) + c) each adds into
    // few channels (C < mr): the rows of several taps w (same kd, kh) share a tile
    const int taps = C < mr && !(cg_engine_dbg & 256) ? mr / (int)C : 1;   // (<= mr rows)
    for (int64_t l = task[0]; l < task[1];) {
        const int64_t n = l / (P->M[0] * P->M[1]);
        const int64_t od = (l / P->M[1]) % P->M[0];
        const int64_t oh0 = l % P->M[1];
        const int64_t nl = std::min({P->lines, task[1] - l, P->M[1] - oh0});
        const int64_t bst = nl * bw;                     // an output block of the panel
        // dy rows of the lines, blocks [b0, b1) -> panel[b - b0][j][w][NB]
        for (int64_t b = b0; b < b1; b++) {
            for (int64_t j = 0; j < nl; j++) {
                const int64_t at = n * P->ys[0] + od * P->ys[2] + (oh0 + j) * P->ys[3] +
                                   b * NB * P->ys[1];
                if (P->yw != 1) {
                    // channels-last dy: each position's run of the block's channels
                    float* o = scratch + (b - b0) * bst + j * bw;
                    const int64_t nch = std::min<int64_t>(NB, O - b * NB);
                    for (int64_t p = 0; p < Mw; p++) {
                        convert_run(o + p * NB, (const char*)P->dy + es * (at + p * P->yw),
                                    P->dtype, 1, nch);
                        for (int64_t i = nch; i < NB; i++) o[p * NB + i] = 0.0f;
                    }
                    continue;
                }
                if (!wide) {
                    channel_rows_to_panel(scratch + (b - b0) * bst + j * bw,
                                          (const float*)P->dy + at, P->ys[1], Mw, NB,
                                          O - b * NB);
                    continue;
                }
                const int64_t nch = std::min<int64_t>(NB, O - b * NB);
                for (int64_t i = 0; i < nch; i++)
                    convert_run(stage + i * Mw, (const char*)P->dy + es * (at + i * P->ys[1]),
                                P->dtype, 1, Mw);
                channel_rows_to_panel(scratch + (b - b0) * bst + j * bw, stage, Mw, Mw, NB,
                                      nch);
            }
        }
        // m rows over np positions of nj lines from the panel at Bt, every block of o
        auto sweep = [&](int m, int64_t np, int64_t nj, const float* Bt) {
            // calls of at most CFW_SUM positions (lines x positions): a sum's float32
            // rounding grows with its length (the general kernel's chunks are at most
            // 512 positions too)
            const int64_t lstep = np >= CFW_SUM ? 1 : std::max<int64_t>(1, CFW_SUM / np);
            const int64_t pstep = np >= CFW_SUM ? CFW_SUM : np;
            const int bmax = gemm_blocks(m, nv);
            for (int64_t b = b0; b < b1;) {
                const int bk = (int)std::min<int64_t>(bmax, b1 - b);
                const int nvalid = (int)std::min<int64_t>(bk * NB, O - b * NB);
                for (int i = 0; i < m; i++) cr[i] = dw + dr[i] * O + b * NB;
                for (int64_t j = 0; j < nj; j += lstep)
                    for (int64_t p = 0; p < np; p += pstep) {
                        for (int i = 0; i < m; i++)
                            ar[i] = xr[i] + j * P->s[1] * xrow + p * P->s[2] * xw;
                        fns[(m - 1) * BMAX + (bk - 1)](
                            std::min(pstep, np - p), std::min(lstep, nj - j), ar, P->s[2] * xw,
                            P->s[1] * xrow, Bt + (b - b0) * bst + j * bw + p * NB, bst, bw,
                            cr, nvalid, false);
                    }
                b += bk;
            }
        };
        for (int64_t kd = 0; kd < P->K[0]; kd++) {
            const int64_t dd = od * P->s[0] + kd * P->d[0] - P->pb[0];
            if (dd < 0 || dd >= P->L[0]) continue;
            // (16-bit) the group's x rows [hlo, hhi) at depth dd, every channel, widened
            int64_t hlo = 0;
            if (wide) {
                hlo = std::max<int64_t>(0, oh0 * P->s[1] - P->pb[1]);
                const int64_t hhi = std::min(
                    P->L[1], (oh0 + nl - 1) * P->s[1] + (P->K[1] - 1) * P->d[1] - P->pb[1] + 1);
                for (int64_t h = hlo; h < hhi && cl; h++)        // (whole rows of pixels)
                    convert_run(slab + (h - hlo) * xrow,
                                (const char*)P->x + es * (n * P->xs[0] + dd * P->xs[2] +
                                                          h * P->xs[3]),
                                P->dtype, 1, P->L[2] * C);
                for (int64_t c = 0; c < C && !cl; c++)
                    for (int64_t h = hlo; h < hhi; h++)
                        convert_run(slab + c * xc + (h - hlo) * xrow,
                                    (const char*)P->x + es * (n * P->xs[0] + c * P->xs[1] +
                                                              dd * P->xs[2] + h * P->xs[3]),
                                    P->dtype, 1, P->L[2]);
            }
            for (int64_t kh = 0; kh < P->K[1]; kh++) {
                // the group's lines j whose x row hh(j) is inside the input
                const int64_t h0 = oh0 * P->s[1] + kh * P->d[1] - P->pb[1];
                int64_t ja, jb;
                valid_range(nl, P->s[1], h0, P->L[1], ja, jb);
                if (jb <= ja) continue;
                const float* xh =
                    wide ? slab + (h0 + ja * P->s[1] - hlo) * xrow
                         : (const float*)P->x + n * P->xs[0] + dd * P->xs[2] +
                               (h0 + ja * P->s[1]) * P->xs[3];
                const float* Bh = scratch + ja * bw;
                const int64_t nj = jb - ja, t0 = (kd * P->K[1] + kh) * P->K[2];
                // the rows of tap kw, channels [c0, c0 + m), from output position q on
                auto tap_rows = [&](int64_t kw, int64_t c0, int m, int64_t q, int at) {
                    for (int i = 0; i < m; i++) {
                        xr[at + i] = xh + (q * P->s[2] + kw * P->d[2] - P->pb[2]) * xw +
                                     (c0 + i) * xc;
                        dr[at + i] = (t0 + kw) * C + c0 + i;
                    }
                };
                // one tap's positions [a, e), its channels in tiles of at most mr rows
                auto one_tap = [&](int64_t kw, int64_t a, int64_t e) {
                    if (e <= a) return;
                    for (int64_t ct = 0; ct < nct; ct++) {
                        const int64_t c0 = tile_start(ct, C, nct);
                        const int m = (int)(tile_start(ct + 1, C, nct) - c0);
                        tap_rows(kw, c0, m, a, 0);
                        sweep(m, e - a, nj, Bh + a * NB);
                    }
                };
                for (int64_t kw0 = 0; kw0 < P->K[2]; kw0 += taps) {
                    const int64_t kw1 = std::min<int64_t>(P->K[2], kw0 + taps);
                    int64_t a[64], e[64], A = 0, E = Mw;
                    int live = 0;
                    for (int64_t kw = kw0; kw < kw1; kw++) {
                        valid_range(Mw, P->s[2], kw * P->d[2] - P->pb[2], P->L[2],
                                    a[kw - kw0], e[kw - kw0]);
                        if (e[kw - kw0] <= a[kw - kw0]) continue;
                        live++;
                        A = std::max(A, a[kw - kw0]), E = std::min(E, e[kw - kw0]);
                    }
                    if (live < 2 || E <= A) {
                        for (int64_t kw = kw0; kw < kw1; kw++) one_tap(kw, a[kw - kw0], e[kw - kw0]);
                        continue;
                    }
                    // few channels: the taps' rows together over the positions where
                    // every one of them reads the input, each tap alone at the edges
                    int m = 0;
                    for (int64_t kw = kw0; kw < kw1; kw++)
                        if (e[kw - kw0] > a[kw - kw0]) tap_rows(kw, 0, (int)C, A, m), m += (int)C;
                    sweep(m, E - A, nj, Bh + A * NB);
                    for (int64_t kw = kw0; kw < kw1; kw++) {
                        if (e[kw - kw0] <= a[kw - kw0]) continue;
                        one_tap(kw, a[kw - kw0], A);
                        one_tap(kw, E, e[kw - kw0]);
                    }
                }
            }
        }
        l += nl;
    }
}

}  // extern "C"
