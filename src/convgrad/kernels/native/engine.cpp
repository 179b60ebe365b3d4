// convgrad's native compute engine: register-blocked direct convolution.
//
// Two kernels cover the three ops (see docs/kernels.md):
//
// * corr  -- out[u] = sum_t sum_c in[u*is + off_t, c] * W_t[c, :]: the forward
//   convolution (in = x, is = stride) and, one stride phase at a time, the data
//   gradient (in = dy, is = 1, the output interleaved with step = stride).  A
//   tile of R output pixels x NV vectors of output channels lives in registers
//   across all taps and input channels.
// * wgrad -- dw[t, c, o] = sum_p x[p*s + t*d - pb, c] * dy[p, o]: a tile of MR
//   input channels x NV vectors of output channels in registers, reducing over
//   the output positions.
//
// Padding is never an operand: output pixels are split into segments along the
// innermost axis on which the set of valid taps is constant, and a tap is only
// applied where it reads the input (docs/decisions.md D17).
//
// Every entry point is single-threaded and works on a range of work items that
// write disjoint outputs; the Python side (native.py) runs ranges on its
// threads.  Inputs are read through strided views of any of float32, float16
// and bfloat16; views that are not float32 with unit channel stride are
// converted into a caller-provided scratch buffer one block of lines at a time.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "simd.h"

using namespace cg;

namespace {

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

// Copy the lines (d, h) for d in ds, h in hs of sample n (all W pixels, all C
// channels) to dst as float32 [d][h][w][c].
void pack_lines(float* dst, const Tensor& t, int64_t n, const std::vector<int64_t>& ds,
                const std::vector<int64_t>& hs, int64_t W, int64_t C) {
    const int64_t sw = t.stride[3], sc = t.stride[4];
    for (size_t i = 0; i < ds.size(); i++) {
        for (size_t j = 0; j < hs.size(); j++) {
            const int64_t d = ds[i], h = hs[j];
            float* o = dst + (i * hs.size() + j) * W * C;
            if (sc == 1 || sw > sc) {
                for (int64_t w = 0; w < W; w++) convert_run(o + w * C, at(t, n, d, h, w, 0),
                                                            t.dtype, sc, C);
            } else {
                // channels outermost in memory (NCX): read runs along w
                float tmp[256];
                for (int64_t c = 0; c < C; c++) {
                    for (int64_t w0 = 0; w0 < W; w0 += 256) {
                        int64_t m = std::min<int64_t>(256, W - w0);
                        convert_run(tmp, at(t, n, d, h, w0, c), t.dtype, sw, m);
                        for (int64_t k = 0; k < m; k++) o[(w0 + k) * C + c] = tmp[k];
                    }
                }
            }
        }
    }
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

// ---------------------------------------------------------------------------------------
// corr: the register tile

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

// Output blocks a tile of R pixels takes at once: narrow tiles (the pixels at an
// image border, or a short line) still keep enough independent accumulators.
constexpr int corr_blocks(int r, int nv) {
    int b = ACC / (r * nv);
    return b < 1 ? 1 : (b > BMAX ? BMAX : b);
}

// out[i, b*NB + j] = sum_t sum_c x_t[i*xstep + c] * w_t[b][c*NB + j] for R
// pixels i, B blocks b: wp[t] is block 0's panel, the next blocks follow at
// wstride floats.
template <int R, int NV, int B>
void corr_tile(int ntap, const float* const* xp, const float* const* wp, int64_t wstride,
               int64_t cin, int64_t xstep, float* out, int64_t opix, int64_t ochan,
               int nvalid) {
    constexpr int NB = NV * VL;
    vf acc[R][B][NV];
#pragma GCC unroll 64
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int b = 0; b < B; b++)
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) acc[i][b][v] = zero();
    for (int t = 0; t < ntap; t++) {
        const float* x = xp[t];
        const float* w = wp[t];
        for (int64_t c = 0; c < cin; c++) {
            vf wv[B][NV];
#pragma GCC unroll 8
            for (int b = 0; b < B; b++)
#pragma GCC unroll 8
                for (int v = 0; v < NV; v++) wv[b][v] = load(w + b * wstride + c * NB + v * VL);
#pragma GCC unroll 64
            for (int i = 0; i < R; i++) {
                vf s = bcast(x[i * xstep + c]);
#pragma GCC unroll 8
                for (int b = 0; b < B; b++)
#pragma GCC unroll 8
                    for (int v = 0; v < NV; v++) acc[i][b][v] += s * wv[b][v];
            }
        }
    }
    // nvalid counts the valid channels of all B blocks (only the last may be partial)
    if (ochan == 1 && nvalid == B * NB) {
#pragma GCC unroll 64
        for (int i = 0; i < R; i++)
#pragma GCC unroll 8
            for (int b = 0; b < B; b++)
#pragma GCC unroll 8
                for (int v = 0; v < NV; v++) store(out + i * opix + b * NB + v * VL, acc[i][b][v]);
    } else if (ochan == 1) {
        for (int i = 0; i < R; i++)
            for (int b = 0; b < B; b++)
                for (int v = 0; v < NV; v++) {
                    int n = nvalid - b * NB - v * VL;
                    if (n >= VL) store(out + i * opix + b * NB + v * VL, acc[i][b][v]);
                    else if (n > 0) store_n(out + i * opix + b * NB + v * VL, acc[i][b][v], n);
                }
    } else {
        for (int i = 0; i < R; i++)
            for (int j = 0; j < nvalid; j++)
                out[i * opix + j * ochan] = acc[i][j / NB][(j % NB) / VL][j % VL];
    }
}

typedef void (*corr_fn)(int, const float* const*, const float* const*, int64_t, int64_t,
                        int64_t, float*, int64_t, int64_t, int);

// fns[(R - 1) * BMAX + (B - 1)] for B <= corr_blocks(R, NV), else null
template <int NV, int K>
constexpr corr_fn corr_pick() {
    constexpr int R = K / BMAX + 1, B = K % BMAX + 1;
    if constexpr (B <= corr_blocks(R, NV)) return &corr_tile<R, NV, B>;
    else return nullptr;
}

template <int NV, int... K>
constexpr auto corr_fns_impl(std::integer_sequence<int, K...>) {
    return std::array<corr_fn, sizeof...(K)>{corr_pick<NV, K>()...};
}

template <int NV>
const corr_fn* corr_fns() {
    static const auto table =
        corr_fns_impl<NV>(std::make_integer_sequence<int, CORR_RMAX[NV] * BMAX>{});
    return table.data();
}

inline const corr_fn* corr_table(int nv) {
    switch (nv) {
        case 1: return corr_fns<1>();
        case 2: return corr_fns<2>();
        case 3: return corr_fns<3>();
        default: return corr_fns<4>();
    }
}

}  // namespace

extern "C" {

// The correlation problem (see native.py: CorrProblem, same field order).
struct CorrProblem {
    Tensor in;                 // n, d, h, w, c: the input of the correlation
    float* out;                // float32 output
    int64_t ostride[5];        // its strides, n, d, h, w, c (elements)
    int64_t N, Lin[3], Cin, Cout, groups;
    int64_t is[3];             // input step per output index
    int64_t os[3];             // output step per output index
    const int64_t* phases;     // per phase: or[3], U[3], tap_begin, tap_end
    const int64_t* taps;       // per tap entry: off[3], weight tap index
    const float* wpk;          // packed weights [g][ob][tap][cin_g][NB]
    int64_t ntap_w;            // weight taps
    int64_t nv;                // NB = nv * VL output channels per block
    int64_t r;                 // pixels per tile (<= CORR_RMAX[nv])
    const int64_t* items;      // per item: n, phase, ud, uh0, uh1
};

const char* cg_isa(void) { return CG_ISA_NAME; }
int64_t cg_vector_floats(void) { return VL; }
int64_t cg_corr_rmax(int64_t nv) { return nv >= 1 && nv <= 4 ? CORR_RMAX[nv] : 0; }

// Floats of scratch the items [lo, hi) need at most (packing the input).
int64_t cg_corr_scratch(const CorrProblem* P, int64_t lo, int64_t hi);

void cg_corr_run(const CorrProblem* P, int64_t lo, int64_t hi, float* scratch);

}  // extern "C"

namespace {

struct TapSpan {
    int64_t u0, u1;
    const float* line;   // input line (pixel 0, channel 0)
    int64_t off_w;
    int64_t widx;
};

// The input lines an item reads along d and h (inside the input), sorted.
void item_lines(const CorrProblem* P, const int64_t* item, std::vector<int64_t>& ds,
                std::vector<int64_t>& hs) {
    const int64_t* ph = P->phases + 8 * item[1];
    ds.clear();
    hs.clear();
    for (int64_t k = ph[6]; k < ph[7]; k++) {
        const int64_t* tp = P->taps + 4 * k;
        const int64_t d = item[2] * P->is[0] + tp[0];
        if (d >= 0 && d < P->Lin[0]) ds.push_back(d);
        for (int64_t uh = item[3]; uh < item[4]; uh++) {
            const int64_t h = uh * P->is[1] + tp[1];
            if (h >= 0 && h < P->Lin[1]) hs.push_back(h);
        }
    }
    std::sort(ds.begin(), ds.end());
    ds.erase(std::unique(ds.begin(), ds.end()), ds.end());
    std::sort(hs.begin(), hs.end());
    hs.erase(std::unique(hs.begin(), hs.end()), hs.end());
}

}  // namespace

int64_t cg_corr_scratch(const CorrProblem* P, int64_t lo, int64_t hi) {
    if (direct_f32(P->in)) return 0;
    int64_t most = 0;
    std::vector<int64_t> ds, hs;
    for (int64_t it = lo; it < hi; it++) {
        item_lines(P, P->items + 5 * it, ds, hs);
        most = std::max(most, (int64_t)(ds.size() * hs.size()) * P->Lin[2] * P->Cin);
    }
    return most;
}

void cg_corr_run(const CorrProblem* P, int64_t lo, int64_t hi, float* scratch) {
    const int64_t G = P->groups, cin_g = P->Cin / G, cout_g = P->Cout / G;
    const int nv = (int)P->nv, NB = nv * VL;
    const int64_t nob = (cout_g + NB - 1) / NB;
    const int rmax = (int)P->r;
    const corr_fn* fns = corr_table(nv);
    const bool packed = !direct_f32(P->in);
    const int64_t W = P->Lin[2];
    const int64_t panel = P->ntap_w * cin_g * NB;       // one (g, ob) weight panel
    const int64_t* os = P->os;

    const int64_t ntap = P->ntap_w;
    std::vector<TapSpan> spans(ntap);
    std::vector<const float*> xp(ntap), wp(ntap), xq(ntap), wq(ntap);
    std::vector<int64_t> bps(2 * ntap + 2);
    std::vector<int64_t> ds, hs;

    for (int64_t it = lo; it < hi; it++) {
        const int64_t* item = P->items + 5 * it;
        const int64_t n = item[0], ud = item[2];
        const int64_t* ph = P->phases + 8 * item[1];
        const int64_t ord = ph[0], orh = ph[1], orw = ph[2];
        const int64_t Uw = ph[5];
        const int64_t tb = ph[6], te = ph[7];
        if (packed) {
            item_lines(P, item, ds, hs);
            pack_lines(scratch, P->in, n, ds, hs, W, P->Cin);
        }
        const int64_t xpix = packed ? P->Cin : P->in.stride[3];
        const int64_t xstep = xpix * P->is[2];
        for (int64_t uh = item[3]; uh < item[4]; uh++) {
            float* oline = P->out + n * P->ostride[0] + (ud * os[0] + ord) * P->ostride[1] +
                           (uh * os[1] + orh) * P->ostride[2] + orw * P->ostride[3];
            const int64_t opix = os[2] * P->ostride[3];
            // taps valid on this line, with their w ranges
            int ns = 0;
            for (int64_t k = tb; k < te; k++) {
                const int64_t* tp = P->taps + 4 * k;
                int64_t dd = ud * P->is[0] + tp[0], hh = uh * P->is[1] + tp[1];
                if (dd < 0 || dd >= P->Lin[0] || hh < 0 || hh >= P->Lin[1]) continue;
                TapSpan s;
                valid_range(Uw, P->is[2], tp[2], W, s.u0, s.u1);
                if (s.u1 <= s.u0) continue;
                s.line = packed ? scratch + (index_of(ds, dd) * (int64_t)hs.size() +
                                             index_of(hs, hh)) * W * P->Cin
                                : (const float*)at(P->in, n, dd, hh, 0, 0);
                s.off_w = tp[2];
                s.widx = tp[3];
                spans[ns++] = s;
            }
            // segment breakpoints
            int nb = 0;
            bps[nb++] = 0;
            bps[nb++] = Uw;
            for (int s = 0; s < ns; s++) {
                bps[nb++] = spans[s].u0;
                bps[nb++] = spans[s].u1;
            }
            std::sort(bps.begin(), bps.begin() + nb);
            nb = (int)(std::unique(bps.begin(), bps.begin() + nb) - bps.begin());
            for (int b = 0; b + 1 < nb; b++) {
                const int64_t a = bps[b], e = bps[b + 1];
                if (e <= a) continue;
                for (int64_t g = 0; g < G; g++) {
                    int nt = 0;
                    for (int s = 0; s < ns; s++) {
                        if (spans[s].u0 <= a && spans[s].u1 >= e) {
                            xp[nt] = spans[s].line + (a * P->is[2] + spans[s].off_w) * xpix +
                                     g * cin_g;
                            wp[nt] = P->wpk + (g * nob * P->ntap_w + spans[s].widx) *
                                                  cin_g * NB;
                            nt++;
                        }
                    }
                    float* obase = oline + a * opix + g * cout_g * P->ostride[4];
                    if (nt == 0) {
                        for (int64_t u = a; u < e; u++)
                            for (int64_t j = 0; j < cout_g; j++)
                                obase[(u - a) * opix + j * P->ostride[4]] = 0.0f;
                        continue;
                    }
                    for (int64_t u = a; u < e; u += rmax) {
                        const int r = (int)std::min<int64_t>(rmax, e - u);
                        const int bmax = corr_blocks(r, nv);
                        for (int t = 0; t < nt; t++) xq[t] = xp[t] + (u - a) * xstep;
                        for (int64_t ob = 0; ob < nob; ob += bmax) {
                            const int b = (int)std::min<int64_t>(bmax, nob - ob);
                            const int nvalid = (int)std::min<int64_t>(b * NB, cout_g - ob * NB);
                            for (int t = 0; t < nt; t++) wq[t] = wp[t] + ob * panel;
                            fns[(r - 1) * BMAX + (b - 1)](
                                nt, xq.data(), wq.data(), panel, cin_g, xstep,
                                obase + (u - a) * opix + ob * NB * P->ostride[4], opix,
                                P->ostride[4], nvalid);
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// wgrad
//
// dw[t] (C/G x O/G per group) = X_t^T . DY summed over the output positions p
// where tap t reads the input.  Positions are taken in chunks; per chunk and
// tap, the valid positions' x rows (A, [ctile][p][MR]) and dy rows (B,
// [ob][p][NB]) are packed into contiguous panels -- converting dtype and layout
// on the way -- and every (ctile, ob) tile of dw sums its panels with MR x NV
// accumulators in registers.  Positions that read padding are never packed.

namespace {

template <int MR, int NV>
void gemm_tile(int64_t np, const float* A, int64_t lda, const float* B, float* C, int64_t ldc,
               int m, int nvalid) {
    constexpr int NB = NV * VL;
    vf acc[MR][NV];
#pragma GCC unroll 64
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) acc[i][v] = zero();
    for (int64_t p = 0; p < np; p++) {
        vf b[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) b[v] = load(B + p * NB + v * VL);
#pragma GCC unroll 64
        for (int i = 0; i < MR; i++) {
            vf s = bcast(A[p * lda + i]);
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) acc[i][v] += s * b[v];
        }
    }
    if (m == MR && nvalid == NB) {
#pragma GCC unroll 64
        for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++)
                store(C + i * ldc + v * VL, load(C + i * ldc + v * VL) + acc[i][v]);
        return;
    }
    for (int i = 0; i < m; i++)
        for (int v = 0; v < NV; v++) {
            const int n = nvalid - v * VL;
            float* c = C + i * ldc + v * VL;
            if (n >= VL) store(c, load(c) + acc[i][v]);
            else if (n > 0) store_n(c, load_n(c, n) + acc[i][v], n);
        }
}

typedef void (*gemm_fn)(int64_t, const float*, int64_t, const float*, float*, int64_t, int,
                        int);

#if CG_VL == 16
constexpr int WG_MR[5] = {0, 24, 14, 9, 6};
#else
constexpr int WG_MR[5] = {0, 12, 6, 4, 3};
#endif

template <int NV, int... I>
constexpr auto gemm_fns_impl(std::integer_sequence<int, I...>) {
    return std::array<gemm_fn, sizeof...(I)>{&gemm_tile<I + 1, NV>...};
}

// fns[m - 1]: the tile of m <= WG_MR[nv] input channels.
template <int NV>
const gemm_fn* gemm_fns() {
    static const auto table = gemm_fns_impl<NV>(std::make_integer_sequence<int, WG_MR[NV]>{});
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

// x rows a long-line chunk's panel holds beyond the chunk's positions (taps of
// one phase further apart get panels of their own).
constexpr int64_t XHALO = 64;

// One run of consecutive output positions along w of one line, valid for a tap.
struct Run {
    const char* x;      // x at the first position's input pixel, channel 0
    const char* dy;     // dy at the first position, channel 0
    int64_t n;          // positions
};

// A[g][ct][p][mr] = x[run p][g*cg + ct*mr + i] (0 past cg): the runs' x rows.
void pack_a(float* A, const std::vector<Run>& runs, int64_t np, const Tensor& x,
            int64_t xstep, int64_t G, int64_t cg, int mr) {
    const int64_t nct = (cg + mr - 1) / mr;
    const int64_t es = itemsize(x.dtype), sc = x.stride[4];
    float tmp[256];
    int64_t p0 = 0;
    for (const Run& r : runs) {
        for (int64_t g = 0; g < G; g++) {
            for (int64_t ct = 0; ct < nct; ct++) {
                float* a = A + ((g * nct + ct) * np + p0) * mr;
                const int m = (int)std::min<int64_t>(mr, cg - ct * mr);
                const char* src = r.x + es * (g * cg + ct * mr) * sc;
                if (sc == 1 || sc <= xstep) {
                    for (int64_t p = 0; p < r.n; p++) {
                        convert_run(a + p * mr, src + es * p * xstep, x.dtype, sc, m);
                        for (int i = m; i < mr; i++) a[p * mr + i] = 0.0f;
                    }
                } else {
                    // channels outermost in memory (NCX): runs along the positions
                    for (int i = 0; i < mr; i++) {
                        for (int64_t p0_ = 0; p0_ < r.n; p0_ += 256) {
                            const int64_t k = std::min<int64_t>(256, r.n - p0_);
                            if (i < m) {
                                convert_run(tmp, src + es * (i * sc + p0_ * xstep), x.dtype,
                                            xstep, k);
                            } else {
                                for (int64_t j = 0; j < k; j++) tmp[j] = 0.0f;
                            }
                            for (int64_t j = 0; j < k; j++) a[(p0_ + j) * mr + i] = tmp[j];
                        }
                    }
                }
            }
        }
        p0 += r.n;
    }
}

// B[g][ob][p][NB] = dy[run p][g*og + ob*NB + j] (0 past og).
void pack_b(float* B, const std::vector<Run>& runs, int64_t np, const Tensor& dy,
            int64_t ystep, int64_t G, int64_t og, int NB) {
    const int64_t nob = (og + NB - 1) / NB;
    const int64_t es = itemsize(dy.dtype), sc = dy.stride[4];
    float tmp[256];
    int64_t p0 = 0;
    for (const Run& r : runs) {
        for (int64_t g = 0; g < G; g++) {
            for (int64_t ob = 0; ob < nob; ob++) {
                float* b = B + ((g * nob + ob) * np + p0) * NB;
                const int m = (int)std::min<int64_t>(NB, og - ob * NB);
                const char* src = r.dy + es * (g * og + ob * NB) * sc;
                if (sc == 1 || sc <= ystep) {
                    for (int64_t p = 0; p < r.n; p++) {
                        convert_run(b + p * NB, src + es * p * ystep, dy.dtype, sc, m);
                        for (int j = m; j < NB; j++) b[p * NB + j] = 0.0f;
                    }
                } else {
                    for (int j = 0; j < NB; j++) {
                        for (int64_t q = 0; q < r.n; q += 256) {
                            const int64_t k = std::min<int64_t>(256, r.n - q);
                            if (j < m) {
                                convert_run(tmp, src + es * (j * sc + q * ystep), dy.dtype,
                                            ystep, k);
                            } else {
                                for (int64_t i = 0; i < k; i++) tmp[i] = 0.0f;
                            }
                            for (int64_t i = 0; i < k; i++) b[(q + i) * NB + j] = tmp[i];
                        }
                    }
                }
            }
        }
        p0 += r.n;
    }
}

}  // namespace

extern "C" {

struct WgradProblem {
    Tensor x;                  // n, d, h, w, c
    Tensor dy;                 // n, d, h, w, o
    int64_t N, L[3], C, M[3], O, groups;
    int64_t K[3], s[3], d[3], pb[3];
    int64_t nv;                // NB = nv * VL output channels per block
    int64_t chunk;             // positions per packed chunk
    int64_t line_min;          // lines this long are cut into chunks of their own
    int64_t direct_x;          // read float32 x rows in place (else always pack them)
    const int64_t* items;      // per item: n, ud, uh0, uh1
};

int64_t cg_wgrad_mr(int64_t nv) { return nv >= 1 && nv <= 4 ? WG_MR[nv] : 0; }

// Floats of per-thread scratch cg_wgrad_run needs.
int64_t cg_wgrad_scratch(const WgradProblem* P) {
    const int64_t G = P->groups, cg = P->C / G, og = P->O / G;
    const int nv = (int)P->nv, NB = nv * VL, mr = WG_MR[nv];
    const int64_t apad = G * ((cg + mr - 1) / mr) * mr, bpad = G * ((og + NB - 1) / NB) * NB;
    return (P->chunk + XHALO) * apad + 2 * P->chunk * bpad;
}

namespace {

// dw[t][g-block tiles] += A^T B over np positions.  A: the x rows, lda floats
// apart, tile ct of group g at A + g*ag + ct*act; B panel [g][ob][.][NB] with
// bstride floats per (g, ob).
void wgrad_gemm(const WgradProblem* P, const float* A, int64_t lda, int64_t ag, int64_t act,
                const float* B, int64_t bstride, int64_t np, float* dwt, int64_t oblo,
                int64_t obhi) {
    const int64_t G = P->groups, cg = P->C / G, og = P->O / G;
    const int nv = (int)P->nv, NB = nv * VL, mr = WG_MR[nv];
    const int64_t nob = (og + NB - 1) / NB, nct = (cg + mr - 1) / mr;
    const gemm_fn* fns = gemm_table(nv);
    for (int64_t obg = oblo; obg < obhi;) {
        const int64_t g = obg / nob;
        const int64_t gend = std::min(obhi, (g + 1) * nob);
        for (int64_t ct = 0; ct < nct; ct++) {
            const int m = (int)std::min<int64_t>(mr, cg - ct * mr);
            const float* a = A + g * ag + ct * act;
            for (int64_t k = obg; k < gend; k++) {
                const int64_t ob = k % nob;
                const int nvalid = (int)std::min<int64_t>(NB, og - ob * NB);
                fns[m - 1](np, a, lda, B + (g * nob + ob) * bstride,
                           dwt + ct * mr * P->O + g * og + ob * NB, P->O, m, nvalid);
            }
        }
        obg = gend;
    }
    (void)G;
}

}  // namespace

// Accumulate the items [lo, hi) into dw (*K, C/G, O) for the output-channel
// blocks [oblo, obhi) (numbered over all groups).
//
// Lines at least one chunk long are cut into chunks along w: the dy rows of a
// chunk are packed once; per (kd, kh) and phase of kw (kw*d - pb mod s) the x
// rows its taps read are packed once, and each tap is one GEMM over the range of
// positions where it reads the input (an offset into the x panel).  Shorter
// lines are gathered into chunks of several lines, packed per tap (only the
// positions where the tap reads the input).
void cg_wgrad_run(const WgradProblem* P, int64_t lo, int64_t hi, int64_t oblo, int64_t obhi,
                  float* dw, float* scratch) {
    const int64_t G = P->groups, cg = P->C / G, og = P->O / G;
    const int nv = (int)P->nv, NB = nv * VL, mr = WG_MR[nv];
    const int64_t nob = (og + NB - 1) / NB, nct = (cg + mr - 1) / mr;
    const int64_t pc = std::max<int64_t>(1, P->chunk);
    const int64_t Mw = P->M[2], Lw = P->L[2];
    const int64_t sw = P->s[2], dwl = P->d[2], pbw = P->pb[2], Kw = P->K[2];
    const int64_t apad = G * nct * mr, bpad = G * nob * NB;
    const int64_t xext = pc + XHALO;
    float* A = scratch;
    float* Bfull = A + xext * apad;
    float* Btap = Bfull + pc * bpad;
    const int64_t xstep = P->x.stride[3] * sw;
    const int64_t xpix = P->x.stride[3];
    const int64_t ystep = P->dy.stride[3];
    const int64_t ntap = P->K[0] * P->K[1] * Kw;
    const bool long_lines = Mw >= pc || Mw >= P->line_min;
    const bool xdirect = direct_f32(P->x) && P->direct_x;

    struct Piece {
        int64_t uh, w0, w1;
    };
    std::vector<Piece> pieces;
    std::vector<Run> runs, full_runs;
    struct GroupTap {
        int64_t kw, a, b, q;
    };
    std::vector<GroupTap> gtaps(Kw);

    for (int64_t it = lo; it < hi; it++) {
        const int64_t* item = P->items + 4 * it;
        const int64_t n = item[0], ud = item[1], uh0 = item[2], uh1 = item[3];
        if (long_lines) {
            for (int64_t uh = uh0; uh < uh1; uh++) {
                for (int64_t w0 = 0; w0 < Mw; w0 += pc) {
                    const int64_t w1 = std::min(Mw, w0 + pc), np = w1 - w0;
                    full_runs.assign(1, Run{nullptr, at(P->dy, n, ud, uh, w0, 0), np});
                    bool packed_b = false;
                    for (int64_t kd = 0; kd < P->K[0]; kd++) {
                        const int64_t dd = ud * P->s[0] + kd * P->d[0] - P->pb[0];
                        if (dd < 0 || dd >= P->L[0]) continue;
                        for (int64_t kh = 0; kh < P->K[1]; kh++) {
                            const int64_t hh = uh * P->s[1] + kh * P->d[1] - P->pb[1];
                            if (hh < 0 || hh >= P->L[1]) continue;
                            // taps kw in order; x index v*sw + r with v = p + q(kw), r the
                            // phase; taps of one phase whose x rows overlap share a panel
                            int64_t gr = -1, vlo = 0, vhi = 0;
                            int ng = 0;
                            for (int64_t kw = 0; kw <= Kw; kw++) {
                                int64_t a = 0, b = 0, q = 0, r = -2;
                                if (kw < Kw) {
                                    const int64_t off = kw * dwl - pbw;
                                    r = ((off % sw) + sw) % sw;
                                    q = (off - r) / sw;
                                    valid_range(Mw, sw, off, Lw, a, b);
                                    a = std::max(a, w0);
                                    b = std::min(b, w1);
                                    if (b <= a) continue;
                                }
                                const bool fits = r == gr &&
                                    std::max(vhi, b + q) - std::min(vlo, a + q) <= pc + XHALO;
                                if (ng > 0 && !fits) {
                                    // flush the group: one panel, one GEMM per tap
                                    if (!packed_b) {
                                        pack_b(Bfull, full_runs, np, P->dy, ystep, G, og, NB);
                                        packed_b = true;
                                    }
                                    const int64_t nx = vhi - vlo;
                                    const float* xa;
                                    int64_t lda, ag, act;
                                    if (xdirect) {
                                        xa = (const float*)at(P->x, n, dd, hh, vlo * sw + gr, 0);
                                        lda = xstep, ag = cg, act = mr;
                                    } else {
                                        runs.assign(1, Run{at(P->x, n, dd, hh, vlo * sw + gr, 0),
                                                           nullptr, nx});
                                        pack_a(A, runs, nx, P->x, xstep, G, cg, mr);
                                        xa = A, lda = mr, ag = nct * nx * mr, act = nx * mr;
                                    }
                                    for (int j = 0; j < ng; j++) {
                                        const GroupTap& gt = gtaps[j];
                                        const int64_t t = (kd * P->K[1] + kh) * Kw + gt.kw;
                                        wgrad_gemm(P, xa + (gt.a + gt.q - vlo) * lda, lda, ag,
                                                   act, Bfull + (gt.a - w0) * NB, np * NB,
                                                   gt.b - gt.a, dw + t * cg * P->O, oblo, obhi);
                                    }
                                    ng = 0;
                                }
                                if (kw == Kw) break;
                                if (ng == 0) {
                                    gr = r, vlo = a + q, vhi = b + q;
                                } else {
                                    vlo = std::min(vlo, a + q), vhi = std::max(vhi, b + q);
                                }
                                gtaps[ng++] = GroupTap{kw, a, b, q};
                            }
                        }
                    }
                }
            }
            continue;
        }
        int64_t uh = uh0, w = 0;
        while (uh < uh1) {
            pieces.clear();
            int64_t got = 0;
            while (uh < uh1 && got < pc) {
                const int64_t take = std::min<int64_t>(Mw - w, pc - got);
                pieces.push_back(Piece{uh, w, w + take});
                got += take;
                w += take;
                if (w == Mw) {
                    w = 0;
                    uh++;
                }
            }
            full_runs.clear();
            for (const Piece& q : pieces)
                full_runs.push_back(Run{nullptr, at(P->dy, n, ud, q.uh, q.w0, 0), q.w1 - q.w0});
            bool full_packed = false;
            for (int64_t t = 0; t < ntap; t++) {
                const int64_t kd = t / (P->K[1] * Kw), kh = (t / Kw) % P->K[1], kw = t % Kw;
                const int64_t dd = ud * P->s[0] + kd * P->d[0] - P->pb[0];
                if (dd < 0 || dd >= P->L[0]) continue;
                const int64_t offw = kw * dwl - pbw;
                int64_t u0, u1;
                valid_range(Mw, sw, offw, Lw, u0, u1);
                runs.clear();
                int64_t np = 0;
                bool all = true;
                for (const Piece& q : pieces) {
                    const int64_t hh = q.uh * P->s[1] + kh * P->d[1] - P->pb[1];
                    const int64_t a = std::max(u0, q.w0), b = std::min(u1, q.w1);
                    if (hh < 0 || hh >= P->L[1] || b <= a) {
                        all = false;
                        continue;
                    }
                    if (a != q.w0 || b != q.w1) all = false;
                    runs.push_back(Run{at(P->x, n, dd, hh, a * sw + offw, 0),
                                       at(P->dy, n, ud, q.uh, a, 0), b - a});
                    np += b - a;
                }
                if (np == 0) continue;
                pack_a(A, runs, np, P->x, xstep, G, cg, mr);
                const float* B;
                if (all) {
                    if (!full_packed) {
                        pack_b(Bfull, full_runs, np, P->dy, ystep, G, og, NB);
                        full_packed = true;
                    }
                    B = Bfull;
                } else {
                    pack_b(Btap, runs, np, P->dy, ystep, G, og, NB);
                    B = Btap;
                }
                wgrad_gemm(P, A, mr, nct * np * mr, np * mr, B, np * NB, np, dw + t * cg * P->O,
                           oblo, obhi);
            }
        }
    }
    (void)xpix;
}

}  // extern "C"

// ---------------------------------------------------------------------------------------
// Weight panels and CPU features

extern "C" {

// panel[g][blk][t][a][j] = src[t*st + a*sa + (blk*NB + j)*sb + g*gstride] for
// blk*NB + j < B, else 0 (NB = nv * VL); blocks (g, blk) numbered g*nblk + blk,
// the range [lo, hi) of them.  src is float32, float16 or bfloat16.
void cg_pack_panels(const void* src, int64_t dtype, int64_t T, int64_t A, int64_t B,
                    int64_t st, int64_t sa, int64_t sb, int64_t gstride, int64_t nv,
                    float* out, int64_t lo, int64_t hi) {
    const int64_t NB = nv * VL, nblk = (B + NB - 1) / NB;
    const int64_t es = itemsize(dtype);
    for (int64_t k = lo; k < hi; k++) {
        const int64_t g = k / nblk, blk = k % nblk;
        const int64_t nvalid = std::min<int64_t>(NB, B - blk * NB);
        float* o = out + k * T * A * NB;
        const char* base = (const char*)src + es * (g * gstride + blk * NB * sb);
        for (int64_t t = 0; t < T; t++) {
            for (int64_t a = 0; a < A; a++) {
                float* row = o + (t * A + a) * NB;
                convert_run(row, base + es * (t * st + a * sa), dtype, sb, nvalid);
                for (int64_t j = nvalid; j < NB; j++) row[j] = 0.0f;
            }
        }
    }
}

// Bit mask of what this CPU and OS support: 1 avx2, 2 fma, 4 f16c, 8 avx512f,
// 16 avx512bw, 32 avx512vl, 64 avx512dq.
int64_t cg_cpu_features(void) {
    int64_t m = 0;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) m |= 1;
    if (__builtin_cpu_supports("fma")) m |= 2;
    if (__builtin_cpu_supports("f16c")) m |= 4;
    if (__builtin_cpu_supports("avx512f")) m |= 8;
    if (__builtin_cpu_supports("avx512bw")) m |= 16;
    if (__builtin_cpu_supports("avx512vl")) m |= 32;
    if (__builtin_cpu_supports("avx512dq")) m |= 64;
#endif
    return m;
}

}  // extern "C"
