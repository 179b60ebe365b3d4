// Winograd convolution for 3-tap stride-1 axes: F(6, 3), F(4, 3), F(3, 3) and F(2, 3) per axis.
//
// A correlation kernel serves the forward convolution and the data gradient (a stride-1
// data gradient is a correlation of dy with the flipped taps, channels swapped), in 1-D
// (Winograd along w), 2-D (along h and w) and 3-D (along h and w; the depth taps are
// extra terms of the products' reduction).  Per work item -- a block of output tiles, a
// range of output planes, a range of output-channel blocks:
//
//   1. input transform: V[a][tile][plane][c] = (B^T d B)[a] of every input tile the
//      item reads (zeros where a tile reaches past the input);
//   2. per output block and transform point a: M[a][tile] = V[a][tile][planes][:] .
//      U[a][taps in depth][:][block] on a register-blocked micro-kernel (the depth taps
//      and input channels are one reduction);
//   3. output transform: out[tile] = (A^T M A), written straight into the result.
//
// The weight gradient runs the transposed algorithm: per tile, V = B^T x B and
// Y = A dy A^T; per point a, M[a] += V[a]^T . Y[a] (a GEMM reducing over the tiles, on
// the engine's accumulating GEMM tile); at the end dw = G^T M G.
//
// Transformed data never exceeds an item's scratch (no whole-tensor copies).  Tiles
// along an axis of dilation d are the interleaved sub-grids' tiles: outputs r + d*(m*b
// + i) read inputs r + d*(m*b + j) + off, so a dilated layer needs no split copies.
//
// Padding is a zero operand here (the transforms mix a tile's inputs): docs/decisions.md
// (D17, D24) says how the library keeps its NaN/Inf semantics anyway (outputs that come
// out non-finite are recomputed by the direct kernels).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.h"
#include "simd.h"
#include "tiles.h"

using namespace cg;

// engine.cpp's debug switches (bit 7: Winograd lines convert all their channels)
extern "C" int64_t cg_engine_dbg;

CG_ISA_OF(winograd)

#ifdef WINO_PROFILE
#include <x86intrin.h>
static thread_local uint64_t prof_t0;
uint64_t wino_prof[4];
#define PROF_START() prof_t0 = __rdtsc()
#define PROF_ADD(k) do { uint64_t t_ = __rdtsc(); __atomic_fetch_add(&wino_prof[k], t_ - prof_t0, __ATOMIC_RELAXED); prof_t0 = t_; } while (0)
extern "C" uint64_t* cg_wino_prof(void) { return wino_prof; }
#else
#define PROF_START()
#define PROF_ADD(k)
#endif

namespace {

// ---------------------------------------------------------------------------------------
// The transforms, F(m, 3) for m = 4 (points 0, +-1, +-2, inf) and m = 2 (0, +-1, inf).
// y = A^T [(G g) . (B^T d)] is the correlation y_i = sum_t d_{i+t} g_t; by symmetry of the
// trilinear form sum_a (A y')_a (G g)_a (B^T d)_a, the weight gradient of that
// correlation is dg = G^T [(A dy) . (B^T d)].

template <int M>
struct F3;

template <>
struct F3<4> {
    static constexpr int A = 6;
    // r = B^T d (6 -> 6)
    template <class V>
    static inline void in(const V* d, int ds, V* r, int rs) {
        const V d0 = d[0], d1 = d[ds], d2 = d[2 * ds], d3 = d[3 * ds], d4 = d[4 * ds],
                d5 = d[5 * ds];
        const V t0 = d4 - 4.0f * d2, t1 = d3 - 4.0f * d1, t2 = d4 - d2, t3 = d3 - d1;
        r[0] = 4.0f * d0 - 5.0f * d2 + d4;
        r[rs] = t0 + t1;
        r[2 * rs] = t0 - t1;
        r[3 * rs] = t2 + 2.0f * t3;
        r[4 * rs] = t2 - 2.0f * t3;
        r[5 * rs] = 4.0f * d1 - 5.0f * d3 + d5;
    }
    // y = A^T m (6 -> 4)
    template <class V>
    static inline void out(const V* m, int ms, V* y, int ys) {
        const V s1 = m[ms] + m[2 * ms], d1 = m[ms] - m[2 * ms];
        const V s2 = m[3 * ms] + m[4 * ms], d2 = m[3 * ms] - m[4 * ms];
        y[0] = m[0] + s1 + s2;
        y[ys] = d1 + 2.0f * d2;
        y[2 * ys] = s1 + 4.0f * s2;
        y[3 * ys] = d1 + 8.0f * d2 + m[5 * ms];
    }
    // u = G g (3 -> 6)
    template <class V>
    static inline void wt(const V* g, int gs, V* u, int us) {
        const V g0 = g[0], g1 = g[gs], g2 = g[2 * gs];
        const V e = g0 + g2, f = (1.0f / 4.0f) * g0 + g2;
        u[0] = (1.0f / 4.0f) * g0;
        u[us] = (-1.0f / 6.0f) * (e + g1);
        u[2 * us] = (-1.0f / 6.0f) * (e - g1);
        u[3 * us] = (1.0f / 6.0f) * (f + 0.5f * g1);
        u[4 * us] = (1.0f / 6.0f) * (f - 0.5f * g1);
        u[5 * us] = g2;
    }
    // r = A y (4 -> 6): the weight gradient's dy transform
    template <class V>
    static inline void dy(const V* y, int ys, V* r, int rs) {
        const V y0 = y[0], y1 = y[ys], y2 = y[2 * ys], y3 = y[3 * ys];
        const V e = y0 + y2, f = y1 + y3, g = y0 + 4.0f * y2, h = 2.0f * y1 + 8.0f * y3;
        r[0] = y0;
        r[rs] = e + f;
        r[2 * rs] = e - f;
        r[3 * rs] = g + h;
        r[4 * rs] = g - h;
        r[5 * rs] = y3;
    }
    // g = G^T m (6 -> 3): the weight gradient's final transform
    template <class V>
    static inline void dw(const V* m, int ms, V* g, int gs) {
        const V s12 = m[ms] + m[2 * ms], d12 = m[ms] - m[2 * ms];
        const V s34 = m[3 * ms] + m[4 * ms], d34 = m[3 * ms] - m[4 * ms];
        g[0] = (1.0f / 4.0f) * m[0] - (1.0f / 6.0f) * s12 + (1.0f / 24.0f) * s34;
        g[gs] = (1.0f / 12.0f) * d34 - (1.0f / 6.0f) * d12;
        g[2 * gs] = (1.0f / 6.0f) * (s34 - s12) + m[5 * ms];
    }
};

template <>
struct F3<2> {
    static constexpr int A = 4;
    template <class V>
    static inline void in(const V* d, int ds, V* r, int rs) {
        const V d0 = d[0], d1 = d[ds], d2 = d[2 * ds], d3 = d[3 * ds];
        r[0] = d0 - d2;
        r[rs] = d1 + d2;
        r[2 * rs] = d2 - d1;
        r[3 * rs] = d1 - d3;
    }
    template <class V>
    static inline void out(const V* m, int ms, V* y, int ys) {
        y[0] = m[0] + m[ms] + m[2 * ms];
        y[ys] = m[ms] - m[2 * ms] - m[3 * ms];
    }
    template <class V>
    static inline void wt(const V* g, int gs, V* u, int us) {
        const V g0 = g[0], g1 = g[gs], g2 = g[2 * gs];
        const V e = g0 + g2;
        u[0] = g0;
        u[us] = 0.5f * (e + g1);
        u[2 * us] = 0.5f * (e - g1);
        u[3 * us] = g2;
    }
    template <class V>
    static inline void dy(const V* y, int ys, V* r, int rs) {
        const V y0 = y[0], y1 = y[ys];
        r[0] = y0;
        r[rs] = y0 + y1;
        r[2 * rs] = y0 - y1;
        r[3 * rs] = -y1;
    }
    template <class V>
    static inline void dw(const V* m, int ms, V* g, int gs) {
        const V s = m[ms] + m[2 * ms];
        g[0] = m[0] + 0.5f * s;
        g[gs] = 0.5f * (m[ms] - m[2 * ms]);
        g[2 * gs] = 0.5f * s + m[3 * ms];
    }
};

// F(3, 3): points 0, 1, -1, 2, inf (the integer transform of the input; of the four
// point sets with 0, +-1, inf and +-2 or +-1/2, the one with the smallest float32 error on
// standard normal data, with +1/2 within 5%).  Five points for three outputs: on the 6-
// and 5-wide sub-grids of a dilated layer (DeepLab d6 on 33 x 33) a tile of 3 wastes
// nothing where F(4, 3) and F(2, 3) both multiply 1.44x as much.
template <>
struct F3<3> {
    static constexpr int A = 5;
    template <class V>
    static inline void in(const V* d, int ds, V* r, int rs) {
        const V d0 = d[0], d1 = d[ds], d2 = d[2 * ds], d3 = d[3 * ds], d4 = d[4 * ds];
        const V t = d3 - d2;
        r[0] = 2.0f * (d0 - d2) + (d3 - d1);
        r[rs] = t - 2.0f * d1;
        r[2 * rs] = t + 2.0f * (d1 - d2);
        r[3 * rs] = d3 - d1;
        r[4 * rs] = 2.0f * (d1 - d3) + (d4 - d2);
    }
    template <class V>
    static inline void out(const V* m, int ms, V* y, int ys) {
        const V s = m[ms] + m[2 * ms];
        y[0] = m[0] + s + m[3 * ms];
        y[ys] = m[ms] - m[2 * ms] + 2.0f * m[3 * ms];
        y[2 * ys] = s + 4.0f * m[3 * ms] + m[4 * ms];
    }
    template <class V>
    static inline void wt(const V* g, int gs, V* u, int us) {
        const V g0 = g[0], g1 = g[gs], g2 = g[2 * gs];
        const V e = g0 + g2;
        u[0] = 0.5f * g0;
        u[us] = -0.5f * (e + g1);
        u[2 * us] = (1.0f / 6.0f) * (g1 - e);
        u[3 * us] = (1.0f / 6.0f) * (g0 + 2.0f * g1 + 4.0f * g2);
        u[4 * us] = g2;
    }
    template <class V>
    static inline void dy(const V* y, int ys, V* r, int rs) {
        const V y0 = y[0], y1 = y[ys], y2 = y[2 * ys];
        const V e = y0 + y2;
        r[0] = y0;
        r[rs] = e + y1;
        r[2 * rs] = e - y1;
        r[3 * rs] = y0 + 2.0f * y1 + 4.0f * y2;
        r[4 * rs] = y2;
    }
    template <class V>
    static inline void dw(const V* m, int ms, V* g, int gs) {
        const V m1 = m[ms], m2 = m[2 * ms], m3 = m[3 * ms];
        g[0] = 0.5f * (m[0] - m1) + (1.0f / 6.0f) * (m3 - m2);
        g[gs] = (1.0f / 6.0f) * m2 + (1.0f / 3.0f) * m3 - 0.5f * m1;
        g[2 * gs] = (2.0f / 3.0f) * m3 - 0.5f * m1 - (1.0f / 6.0f) * m2 + m[4 * ms];
    }
};

// F(6, 3): points 0, +-1, +-2, +-1/2, inf.  Eight points for six outputs: on DeepLab
// d6's 6- and 5-wide sub-grids one tile an axis, 8 x 8 products where F(3, 3) takes two
// tiles of 5 x 5 (36% fewer); about twice F(4, 3)'s float32 error (docs/kernels.md).
template <>
struct F3<6> {
    static constexpr int A = 8;
    template <class V>
    static inline void in(const V* d, int ds, V* r, int rs) {
        const V d0 = d[0], d1 = d[ds], d2 = d[2 * ds], d3 = d[3 * ds], d4 = d[4 * ds],
                d5 = d[5 * ds], d6 = d[6 * ds], d7 = d[7 * ds];
        r[0] = (d0 - d6) + 5.25f * (d4 - d2);
        r[7 * rs] = (d7 - d1) + 5.25f * (d3 - d5);
        const V t1 = (d2 + d6) - 4.25f * d4, t2 = (d1 + d5) - 4.25f * d3;
        r[rs] = t1 + t2;
        r[2 * rs] = t1 - t2;
        const V t3 = (0.25f * d2 + d6) - 1.25f * d4, t4 = (0.5f * d1 + 2.0f * d5) - 2.5f * d3;
        r[3 * rs] = t3 + t4;
        r[4 * rs] = t3 - t4;
        const V t5 = (4.0f * d2 + d6) - 5.0f * d4, t6 = (2.0f * d1 + 0.5f * d5) - 2.5f * d3;
        r[5 * rs] = t5 + t6;
        r[6 * rs] = t5 - t6;
    }
    template <class V>
    static inline void out(const V* m, int ms, V* y, int ys) {
        const V a = m[ms] + m[2 * ms], b = m[ms] - m[2 * ms];
        const V c = m[3 * ms] + m[4 * ms], e = m[3 * ms] - m[4 * ms];
        const V f = m[5 * ms] + m[6 * ms], h = m[5 * ms] - m[6 * ms];
        y[0] = m[0] + a + c + f;
        y[ys] = b + 2.0f * e + 0.5f * h;
        y[2 * ys] = a + 4.0f * c + 0.25f * f;
        y[3 * ys] = b + 8.0f * e + 0.125f * h;
        y[4 * ys] = a + 16.0f * c + 0.0625f * f;
        y[5 * ys] = (b + 32.0f * e + 0.03125f * h) + m[7 * ms];
    }
    template <class V>
    static inline void wt(const V* g, int gs, V* u, int us) {
        const V g0 = g[0], g1 = g[gs], g2 = g[2 * gs];
        const V e = g0 + g2;
        const V f = (1.0f / 90.0f) * g0 + (2.0f / 45.0f) * g2;
        const V h = (32.0f / 45.0f) * g0 + (8.0f / 45.0f) * g2;
        u[0] = g0;
        u[us] = (-2.0f / 9.0f) * (e + g1);
        u[2 * us] = (-2.0f / 9.0f) * (e - g1);
        u[3 * us] = f + (1.0f / 45.0f) * g1;
        u[4 * us] = f - (1.0f / 45.0f) * g1;
        u[5 * us] = h + (16.0f / 45.0f) * g1;
        u[6 * us] = h - (16.0f / 45.0f) * g1;
        u[7 * us] = g2;
    }
    template <class V>
    static inline void dy(const V* y, int ys, V* r, int rs) {
        const V y0 = y[0], y1 = y[ys], y2 = y[2 * ys], y3 = y[3 * ys], y4 = y[4 * ys],
                y5 = y[5 * ys];
        const V e1 = y0 + y2 + y4, o1 = y1 + y3 + y5;
        const V e2 = y0 + 4.0f * y2 + 16.0f * y4, o2 = 2.0f * y1 + 8.0f * y3 + 32.0f * y5;
        const V e3 = y0 + 0.25f * y2 + 0.0625f * y4,
                o3 = 0.5f * y1 + 0.125f * y3 + 0.03125f * y5;
        r[0] = y0;
        r[rs] = e1 + o1;
        r[2 * rs] = e1 - o1;
        r[3 * rs] = e2 + o2;
        r[4 * rs] = e2 - o2;
        r[5 * rs] = e3 + o3;
        r[6 * rs] = e3 - o3;
        r[7 * rs] = y5;
    }
    template <class V>
    static inline void dw(const V* m, int ms, V* g, int gs) {
        const V s12 = m[ms] + m[2 * ms], d12 = m[ms] - m[2 * ms];
        const V s34 = m[3 * ms] + m[4 * ms], d34 = m[3 * ms] - m[4 * ms];
        const V s56 = m[5 * ms] + m[6 * ms], d56 = m[5 * ms] - m[6 * ms];
        g[0] = m[0] - (2.0f / 9.0f) * s12 + (1.0f / 90.0f) * s34 + (32.0f / 45.0f) * s56;
        g[gs] = (1.0f / 45.0f) * d34 - (2.0f / 9.0f) * d12 + (16.0f / 45.0f) * d56;
        g[2 * gs] = ((2.0f / 45.0f) * s34 - (2.0f / 9.0f) * s12 + (8.0f / 45.0f) * s56) +
                    m[7 * ms];
    }
};

// ---------------------------------------------------------------------------------------
// The micro-kernel: C_i[j] = sum_p A_i[p] * B[p*NB + j] for MR rows (A_i = a + i*astride,
// C_i = c + i*NB), NB = NV*VL columns; C is overwritten (ACC: added to).

template <int MR, int NV, bool ACC>
void wgemm(int64_t np, const float* a, int64_t astride, const float* B, float* c,
           const float* pf, int64_t pfstride) {
    constexpr int NB = NV * VL;
    vf acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[i][v] = zero();
    // the next call's operand fetched into L2 as this one runs: its B (pfstride 0: a
    // row of NB floats an iteration) or its MR rows of A (pfstride apart: a cache line
    // an iteration)
    const float* pr = pf;
    int64_t pcol = 0, prow = 0;
    for (int64_t p = 0; p < np; p++) {
        if (pf && !pfstride) {
#pragma GCC unroll 4
            for (int v = 0; v < NV; v += VL_PER_LINE) __builtin_prefetch(pf + p * NB + v * VL, 0, 2);
        } else if (pf && prow < MR) {
            __builtin_prefetch(pr + pcol, 0, 2);
            pcol += 16;                                   // (floats of a cache line)
            if (pcol >= np) pcol = 0, prow++, pr += pfstride;
        }
        vf b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = load(B + p * NB + v * VL);
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            const vf s = bcast(a[i * astride + p]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[i][v] += s * b[v];
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            float* d = c + i * NB + v * VL;
            store(d, ACC ? load(d) + acc[i][v] : acc[i][v]);
        }
}

typedef void (*wgemm_fn)(int64_t, const float*, int64_t, const float*, float*, const float*,
                         int64_t);

#if CG_VL == 16
constexpr int WMR[5] = {0, 24, 14, 9, 6};
#else
constexpr int WMR[5] = {0, 12, 6, 4, 3};
#endif
constexpr int WMR_MAX = WMR[1];

template <int NV, bool ACC, int... R>
constexpr std::array<wgemm_fn, sizeof...(R)> wgemm_fns_impl(std::integer_sequence<int, R...>) {
    return {&wgemm<R + 1, NV, ACC>...};
}

template <bool ACC>
const wgemm_fn* wgemm_fns(int nv) {
    static const auto t1 = wgemm_fns_impl<1, ACC>(std::make_integer_sequence<int, WMR[1]>{});
    static const auto t2 = wgemm_fns_impl<2, ACC>(std::make_integer_sequence<int, WMR[2]>{});
    static const auto t3 = wgemm_fns_impl<3, ACC>(std::make_integer_sequence<int, WMR[3]>{});
    static const auto t4 = wgemm_fns_impl<4, ACC>(std::make_integer_sequence<int, WMR[4]>{});
    switch (nv) {
        case 1: return t1.data();
        case 2: return t2.data();
        case 3: return t3.data();
        default: return t4.data();
    }
}

// fns[r - 1]: the micro-kernel of r rows, r <= WMR[nv], overwriting (acc: adding to) C
inline const wgemm_fn* wgemm_table(int nv, bool acc = false) {
    return acc ? wgemm_fns<true>(nv) : wgemm_fns<false>(nv);
}

}  // namespace

extern "C" {

// How outputs are cut into tiles (winograd.py: _TileGeom, same field order).
struct TileGeom {
    int64_t axes;              // Winograd axes: 1 (w) or 2 (h, w)
    int64_t m;                 // outputs per tile and Winograd axis: 2 or 4
    int64_t dil[3];            // input step per tap (depth: 1)
    int64_t off[3];            // input index of tap 0 at output 0
    int64_t kd;                // taps along depth (the leading axis; 1 in 1-D / 2-D)
    const int64_t* tiles_h;    // per tile row: first output index, valid outputs
    int64_t nth;
    const int64_t* tiles_w;    // per tile column: the same
    int64_t ntw;
};

// A data tensor and its sizes.
struct Source {
    Tensor t;                  // n, d, h, w, c; any of float32, float16, bfloat16
    int64_t L[3], C;
};

// The Winograd correlation problem (winograd.py: _Wino, same field order).
struct WinoProblem {
    Source in;                 // the correlation's input
    void* out;                 // the output (out_dtype: float32, float16 or bfloat16)
    int64_t ostride[5];        // n, d, h, w, c (elements)
    int64_t out_dtype;
    int64_t Lout[3], Cout, groups;
    TileGeom tg;
    // the weights' blocks (k = g*nob + ob; NB = nv*VL columns): transformed, block k at
    // U + k*ublock, point a, depth tap t, input channel c at a*ustride + (t*cpad + c)*NB --
    // or, when U is null, transformed by each item from the source view: tap t (flipped
    // when wflip), row a (input channel), column b of group g at element
    // t*wst + a*wsa + b*wsb + g*wgs of w (dtype wdtype)
    const float* U;
    const void* w;
    int64_t wdtype, wst, wsa, wsb, wgs, wflip;
    int64_t cpad;              // input channels per group rounded up to VL
    int64_t nv;
    // a transformed input shared by the items (null: each item transforms its own):
    // tiles [vs0, vs1), output planes [vd0, vd1)
    const float* V;
    int64_t vs0, vs1, vd0, vd1;
    const int64_t* items;      // per item: first and end tile (over n, tile row, tile
                               // column), first and end output plane, first and end block k
    uint8_t* bad;              // per output line (n, d, h): set when one of its outputs is
                               // not finite (recomputed by the direct kernels: D17)
    int64_t stream;            // a float32 result in recycled memory, 64-byte aligned
                               // channel rows (channels-first: whole cache lines of a
                               // channel's run go out with streaming stores) or pixels
                               // (channels-last: whole vectors of the output transform)
                               // (_results.streams_channels, _results.streams)
    int64_t wchunk;            // regime "weights": the input channels whose weights an item
                               // transforms at a time (and the shared V's chunks of them)
};

// The Winograd weight gradient (winograd.py: _WinoWgrad): dw[t][c][o] = sum over output
// positions p of x[p + t*dil + off][c] * dy[p][o].
struct WinoWgrad {
    Source x;
    Source dy;                 // dy.L: the output sizes the tiles cut
    int64_t groups;
    TileGeom tg;
    int64_t cpad;              // input channels per group rounded up to VL
    int64_t nv;                // NB = nv*VL output channels per block
    const int64_t* items;      // per item: first and end tile, first and end output plane,
                               // group, first and end input channel (of the group), first
                               // and end output block (of the group)
    int64_t* bad;              // set when a value of dw comes out not finite (winograd.py
                               // then recomputes dw by the direct engine: D17)
    int64_t oix;               // fused tasks store dw as (O, C/G, *K) (the OIX memory of
                               // a channels-first caller), not (*K, C/G, O)
    int64_t out_dtype;         // dw's dtype: float32, or (not oix) float16 / bfloat16,
                               // each finished float32 value rounded once as it is stored
    int64_t stream;            // dw may take streaming stores (large, in
                               // recycled memory, aligned: _results.streams for
                               // (*K, C/G, O) rows, streams_runs for OIX)
};

int64_t cg_wino_points(int64_t axes, int64_t m) { return axes == 2 ? (m + 2) * (m + 2) : m + 2; }
int64_t cg_wino_mr(int64_t nv) { return nv >= 1 && nv <= 4 ? WMR[nv] : 0; }
int64_t cg_wino_scratch(const WinoProblem* P, int64_t lo, int64_t hi);
void cg_wino_run(const WinoProblem* P, int64_t lo, int64_t hi, float* scratch);
int64_t cg_wino_input_scratch(const WinoProblem* P, int64_t s0, int64_t s1);
void cg_wino_input(const WinoProblem* P, int64_t s0, int64_t s1, float* V, float* scratch);
void cg_wino_weights(const WinoProblem* P, int64_t lo, int64_t hi, float* out);
// The products' sums M of a weight gradient cover a box: groups [g0, g0 + ng), input
// channels [c0, c0 + nc) and output blocks [ob0, ob0 + nob) of each; point a, depth tap k,
// channel c, column j of block ob at
// ((((g - g0)*NA + a)*kd + k)*nc + c - c0)*nob*NB + (ob - ob0)*NB + j.
struct MBox {
    int64_t g0, ng, c0, nc, ob0, nob;
};
int64_t cg_wino_wgrad_scratch(const WinoWgrad* P, int64_t lo, int64_t hi);
// The sums a fused task (one item: every tile of its box) keeps at once: one register
// tile's, every point and depth tap (in place of the box's, cg_wino_wgrad_task).
int64_t cg_wino_wgrad_fused_floats(const WinoWgrad* P);
void cg_wino_wgrad_run(const WinoWgrad* P, int64_t lo, int64_t hi, const MBox* box, float* M,
                       float* scratch);
void cg_wino_wgrad_finish(const WinoWgrad* P, const MBox* box, const float* M, int64_t parts,
                          int64_t part_stride, float* dw, int64_t lo, int64_t hi);
// One task of a weight gradient on the engine's workers (pool.cpp): task k of the table
// t (WINO_TASK fields each: first and end item, the box, its sums M -- 0: the thread's
// scratch, then finished into dw at once --, the sums' floats, dw, fused) zeroes its
// sums, adds its items into them and, without partials, stores its box of dw; fused
// (one item, the sums the thread's), it finishes each register tile's sums as they are
// made instead, its sums' floats those of one tile (cg_wino_wgrad_fused_floats).  The
// scratch holds the sums (when they are the thread's) ahead of cg_wino_wgrad_run's own.
void cg_wino_wgrad_task(const WinoWgrad* P, const int64_t* t, int64_t k, float* scratch);
// Rows [lo, hi) of cg_wino_wgrad_finish over the partial sums f (box, M, parts,
// part_stride, dw: 10 fields).
void cg_wino_wgrad_finish_rows(const WinoWgrad* P, const int64_t* f, int64_t lo, int64_t hi);

}  // extern "C"

constexpr int WINO_TASK = 12;

namespace {

// A stride (floats) between the transform points' rows that spreads them over the cache
// sets: a whole number of lines, odd.
inline int64_t spread(int64_t floats) {
    const int64_t lines = (floats + 15) / 16;
    return (lines | 1) * 16;
}

inline int64_t num_points(const TileGeom& T) { return cg_wino_points(T.axes, T.m); }
inline int64_t nblocks(int64_t cout_g, int64_t nv) {
    const int64_t NB = nv * VL;
    return (cout_g + NB - 1) / NB;
}
// The transformed weights of a block: point a at a*ustride (spread over the cache sets:
// cpad*NB is a power of two for most layers), depth tap k, channel c at (k*cpad + c)*NB.
inline int64_t ustride(const WinoProblem* P) { return spread(P->tg.kd * P->cpad * P->nv * VL); }
inline int64_t ublock(const WinoProblem* P) { return num_points(P->tg) * ustride(P); }
inline bool direct_out(const WinoProblem* P) { return P->out_dtype == F32 && P->ostride[4] == 1; }

}  // namespace


namespace {

// Tile s (over n, tile row, tile column) of one plane of tiles.
struct TileAt {
    int64_t n, th, tw;
    TileAt(const TileGeom& T, int64_t s)
        : n(s / (T.nth * T.ntw)), th((s / T.ntw) % T.nth), tw(s % T.ntw) {}
};

// 16-bit lines read in place, converted inside the transforms' loads (F16C / AVX2 shifts);
// the portable build converts element by element, once, into scratch instead (a tile's
// points would convert each pixel 2.25 times).  engine debug bit 4194304: convert into
// scratch on every build.
#if (defined(CG_ISA_AVX512) || defined(CG_ISA_AVX2)) && !defined(CG_EMULATE_VL16)
constexpr bool IN_PLACE_16 = true;
#else
constexpr bool IN_PLACE_16 = false;
#endif

inline bool in_place(const Tensor& t) {
    if (t.stride[4] != 1) return false;
    return t.dtype == F32 || (IN_PLACE_16 && !(cg_engine_dbg & 4194304));
}

// The lines of a source a block of tiles reads: in place (unit channel stride: float32,
// or 16-bit converted in the loads, dt), or converted into scratch (sorted keys
// (n*L0 + d)*L1 + h; of each line, the pixels [w0, w1) the tiles read, all channels).
struct Lines {
    const Source* S = nullptr;
    bool packed = false;
    int64_t dt = F32;            // the element type of row()
    std::vector<int64_t> keys;
    int64_t w0 = 0, w1 = 0;
    int64_t c0 = 0, cn = 0;      // packed: the channels [c0, c0 + cn) only
    const float* buf = nullptr;

    // line (n, d, h) at pixel 0, channel 0, as elements of type E (Elem<dt>::T; packed:
    // the pixels before w0 and the channels outside [c0, c0 + cn) are not there)
    template <class E = float>
    const E* row(int64_t n, int64_t d, int64_t h) const {
        if (!packed) return (const E*)at(S->t, n, d, h, 0, 0);
        const int64_t key = (n * S->L[0] + d) * S->L[1] + h;
        const auto it = std::lower_bound(keys.begin(), keys.end(), key);
        return (const E*)(buf + ((it - keys.begin()) * (w1 - w0) - w0) * cn - c0);
    }
    int64_t pixel() const { return packed ? cn : S->t.stride[3]; }
};

// f(std::integral_constant<int64_t, DT>) for the element type of L's rows.
template <class F>
inline void with_elem(const Lines& L, F&& f) {
    if (L.dt == F16) f(std::integral_constant<int64_t, F16>());
    else if (L.dt == BF16) f(std::integral_constant<int64_t, BF16>());
    else f(std::integral_constant<int64_t, F32>());
}

// The lines of S that tiles [s0, s1) x output planes [d0, d1) read: rows j*dil[1] + off[1]
// (j < rows) from each tile row's first output, planes d + off[0] + k (k < depth taps);
// columns [w0, w1): cols*dil[2] from each tile's first output + off[2].
void tile_keys(const Source& S, const TileGeom& T, int64_t rows, int64_t cols, int64_t depth,
               int64_t s0, int64_t s1, int64_t d0, int64_t d1, const int64_t* off,
               std::vector<int64_t>& keys, int64_t& w0, int64_t& w1) {
    keys.clear();
    int64_t last = -1;
    w0 = S.L[2];
    w1 = 0;
    for (int64_t s = s0; s < s1; s++) {
        const TileAt at_(T, s);
        const int64_t a = T.tiles_w[2 * at_.tw] + off[2];
        w0 = std::min(w0, std::max<int64_t>(0, a));
        w1 = std::max(w1, std::min<int64_t>(S.L[2], a + (cols - 1) * T.dil[2] + 1));
        const int64_t tr = s / T.ntw;            // n * nth + tile row
        if (tr == last) continue;
        last = tr;
        for (int64_t pd = d0 + off[0]; pd < d1 - 1 + off[0] + depth; pd++) {
            if (pd < 0 || pd >= S.L[0]) continue;
            for (int64_t j = 0; j < rows; j++) {
                const int64_t h = T.axes == 2 ? T.tiles_h[2 * at_.th] + off[1] + j * T.dil[1] : 0;
                if (h >= 0 && h < S.L[1]) keys.push_back((at_.n * S.L[0] + pd) * S.L[1] + h);
            }
        }
    }
    w1 = std::max(w1, w0);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
}

// Prepare the lines (converted into buf unless S is float32 with unit channel stride);
// returns the floats used.  Only the channels [c0, c1) are converted (c1 < 0: all): a
// weight gradient's items split the channels and output blocks, and each converted the
// whole lines (ResNet-50 res4 NCX: the conversions 40% of the call).
int64_t prepare_lines(const Source& S, const TileGeom& T, int64_t rows, int64_t cols,
                      int64_t depth, int64_t s0, int64_t s1, int64_t d0, int64_t d1,
                      const int64_t* off, Lines& L, float* buf, int64_t c0 = 0,
                      int64_t c1 = -1) {
    L.S = &S;
    L.packed = !in_place(S.t);
    L.dt = L.packed ? F32 : S.t.dtype;
    if (!L.packed) return 0;
    if (c1 < 0 || (cg_engine_dbg & 128)) c0 = 0, c1 = S.C;
    tile_keys(S, T, rows, cols, depth, s0, s1, d0, d1, off, L.keys, L.w0, L.w1);
    Tensor window = S.t;                  // the pixels [w0, w1), channels [c0, c1)
    window.ptr = (const char*)S.t.ptr +
                 itemsize(S.t.dtype) * (L.w0 * S.t.stride[3] + c0 * S.t.stride[4]);
    L.c0 = c0;
    L.cn = c1 - c0;
    pack_keyed_lines(buf, window, L.keys, S.L[0], S.L[1], L.w1 - L.w0, L.cn);
    L.buf = buf;
    return (int64_t)L.keys.size() * (L.w1 - L.w0) * L.cn;
}

int64_t lines_floats(const Source& S, const TileGeom& T, int64_t rows, int64_t cols,
                     int64_t depth, int64_t s0, int64_t s1, int64_t d0, int64_t d1,
                     const int64_t* off) {
    if (in_place(S.t)) return 0;
    std::vector<int64_t> keys;
    int64_t w0, w1;
    tile_keys(S, T, rows, cols, depth, s0, s1, d0, d1, off, keys, w0, w1);
    return (int64_t)keys.size() * (w1 - w0) * S.C;
}

// The second axis of a transform and its store: tmp holds R rows of A values (the first
// axis done, row by row); a 2-D transform takes the columns through tr (R values -> A),
// a 1-D one has its A values already.  Point a = k*A + j (k along w, j along h) goes to
// o + a*astride.
template <int R, int A, int AX, class Tr>
inline __attribute__((always_inline)) void columns_store(const vf (*tmp)[A], float* o,
                                                         int64_t astride, Tr tr) {
    if (AX == 2) {
        // along h, column by column
#pragma GCC unroll 8
        for (int k = 0; k < A; k++) {
            vf col[R], r[A];
#pragma GCC unroll 8
            for (int j = 0; j < R; j++) col[j] = tmp[j][k];
            tr(col, r);
#pragma GCC unroll 8
            for (int j = 0; j < A; j++) {
                store(o, r[j]);
                o += astride;
            }
        }
    } else {
#pragma GCC unroll 8
        for (int k = 0; k < A; k++) {
            store(o, tmp[0][k]);
            o += astride;
        }
    }
}

// One channel vector of an input tile: row j of the tile at rows[j] (null: a row of
// padding), its columns xw floats apart, the columns outside [wlo, whi) zeros and only
// nc lanes loaded (nc < VL: the lanes past a group's channels are zeros).  Point
// a = k*A + j (k along w, j along h) goes to o + a*astride.
template <int M, int AX, bool FULL, int64_t DT>
inline void input_vector(const typename Elem<DT>::T* const* rows, int64_t ch, int64_t xw,
                         int wlo, int whi, int nc, float* o, int64_t astride) {
    constexpr int A = F3<M>::A;
    constexpr int AH = AX == 2 ? A : 1;
    alignas(64) vf tmp[AH][A];
    // along w, row by row
#pragma GCC unroll 8
    for (int j = 0; j < AH; j++) {
        vf d[A];
        const typename Elem<DT>::T* r = rows[j] + ch;
        if (FULL) {
#pragma GCC unroll 8
            for (int k = 0; k < A; k++) d[k] = load_as<DT>(r + k * xw);
        } else {
            for (int k = 0; k < A; k++)
                d[k] = (!rows[j] || k < wlo || k >= whi) ? zero()
                       : nc == VL ? load_as<DT>(r + k * xw) : load_as_n<DT>(r + k * xw, nc);
        }
        F3<M>::in(d, 1, &tmp[j][0], 1);
    }
    columns_store<A, A, AX>(tmp, o, astride, [](const vf* c, vf* r) { F3<M>::in(c, 1, r, 1); });
}

// Input transform of one tile (n, input plane pd, tile row th, tile column tw) of S,
// channels [c0, c1) of one group (c0 - the group's first channel a multiple of VL):
// point a of channel c at o + a*astride + (c - c0).  Rows and columns past the input
// are zeros; so are the lanes past c1 in the last vector.
template <int M, int AX>
void input_tile(const Source& S, const TileGeom& T, const Lines& L, int64_t n, int64_t pd,
                int64_t th, int64_t tw, int64_t c0, int64_t c1, float* o, int64_t astride) {
    constexpr int A = F3<M>::A;
    constexpr int AH = AX == 2 ? A : 1;
    const int64_t w0 = T.tiles_w[2 * tw] + T.off[2];
    const int64_t dw = T.dil[2];
    const bool inside = pd >= 0 && pd < S.L[0];
    int wlo = 0, whi = A;                 // the columns inside the input
    while (wlo < A && w0 + wlo * dw < 0) wlo++;
    while (whi > wlo && w0 + (whi - 1) * dw >= S.L[2]) whi--;
    const int64_t xw = L.pixel() * dw;           // elements between a tile's columns
    with_elem(L, [&](auto dt) {
        constexpr int64_t DT = decltype(dt)::value;
        typedef typename Elem<DT>::T E;
        const E* rows[AH];
        bool full = wlo == 0 && whi == A && inside;
        for (int j = 0; j < AH; j++) {
            const int64_t h = AX == 2 ? T.tiles_h[2 * th] + T.off[1] + j * T.dil[1] : 0;
            const bool ok = inside && h >= 0 && h < S.L[1] && wlo < whi;
            rows[j] = ok ? L.row<E>(n, pd, h) + w0 * L.pixel() : nullptr;
            full = full && ok;
        }
        const int64_t cfull = full ? c0 + (c1 - c0) / VL * VL : c0;
        int64_t c = c0;
        for (; c < cfull; c += VL)
            input_vector<M, AX, true, DT>(rows, c, xw, 0, A, VL, o + (c - c0), astride);
        for (; c < c1; c += VL)
            input_vector<M, AX, false, DT>(rows, c, xw, wlo, whi,
                                           (int)std::min<int64_t>(VL, c1 - c), o + (c - c0),
                                           astride);
    });
}

// Output transform of one tile: M + a*mstride (NB columns) -> the tile's pixel (i, j) at
// o + i*sh + j*sw (channels contiguous), columns [0, nvalid), outputs [0, nh) x [0, nw)
// of the tile.  Returns the sum of every output (not finite if one of them is not).
// NT: whole vectors at vector-aligned addresses go out with streaming stores (each
// fills a cache line, or half of one on AVX2, and skips reading it first).
template <int M, int AX, bool NT = false>
vf output_tile(const float* Mt, int64_t mstride, float* o, int64_t sh, int64_t sw, int nh,
               int nw, int nvalid) {
    constexpr int A = F3<M>::A;
    constexpr int MH = AX == 2 ? M : 1;
    const bool full = nh == MH && nw == M;
    alignas(64) vf tmp[MH][A];
    vf sum = zero();
    for (int v = 0; v * VL < nvalid; v++) {
        const int nc = std::min(VL, nvalid - v * VL);
        const float* m = Mt + v * VL;
        if (AX == 2) {
            // along h, column by column (point a = k*A + j)
#pragma GCC unroll 8
            for (int k = 0; k < A; k++) {
                vf col[A], t[M];
#pragma GCC unroll 8
                for (int j = 0; j < A; j++) {
                    col[j] = load(m);
                    m += mstride;
                }
                F3<M>::out(col, 1, t, 1);
#pragma GCC unroll 4
                for (int i = 0; i < M; i++) tmp[i][k] = t[i];
            }
        } else {
#pragma GCC unroll 8
            for (int k = 0; k < A; k++) {
                tmp[0][k] = load(m);
                m += mstride;
            }
        }
        // along w, row by row
        float* ov = o + v * VL;
#pragma GCC unroll 4
        for (int i = 0; i < MH; i++) {
            vf y[M];
            F3<M>::out(&tmp[i][0], 1, y, 1);
            if (full && nc == VL) {
                // (every pixel's vector aligned: the base and both strides)
                const bool nt = NT && (((uintptr_t)ov | (uintptr_t)((sh | sw) * sizeof(float))) &
                                       (VL * sizeof(float) - 1)) == 0;
#pragma GCC unroll 4
                for (int j = 0; j < M; j++) {
                    if (nt) stream_store(ov + i * sh + j * sw, y[j]);
                    else store(ov + i * sh + j * sw, y[j]);
                    sum += y[j];
                }
            } else if (i < nh) {
                for (int j = 0; j < nw; j++) {
                    if (nc == VL) store(ov + i * sh + j * sw, y[j]);
                    else store_n(ov + i * sh + j * sw, y[j], nc);
                    sum += y[j];      // (lanes past nc: zero columns of U, zero sums)
                }
            }
        }
    }
    return sum;
}

inline bool finite_all(vf s) {
    const vf z = s - s;                   // 0 where finite, NaN elsewhere
    for (int i = 0; i < VL; i++)
        if (z[i] != 0.0f) return false;
    return true;
}

// Layout of a transformed input holding tiles [s0, s1) of the input planes of output
// planes [d0, d1): channel j of chunk c (kc channels each) of group g, plane p, tile s,
// point a at a*astride + p*pstride + g*gstride + c*cstride + (s - s0)*tstride + j.
// An item's own input: channels of a tile contiguous across chunks, groups and planes
// (tstride = G*planes*cpad, pstride = cpad: a tile's depth taps and channels are one
// reduction).  The input shared by the items of the weights regime: a chunk's tiles
// contiguous (tstride = kc), so that each (point, chunk) of a GEMM is one block.
struct VLayout {
    int64_t planes, kc, tstride, cstride, gstride, pstride, astride;
    VLayout(const TileGeom& T, int64_t G, int64_t cpad, int64_t s0, int64_t s1, int64_t d0,
            int64_t d1, int64_t chunk = 0) {
        planes = d1 - d0 + T.kd - 1;
        const int64_t nt = s1 - s0;
        if (chunk <= 0) {
            kc = cpad;
            cstride = kc;
            pstride = cpad;
            gstride = planes * cpad;
            tstride = G * gstride;
        } else {
            kc = std::min(chunk, cpad);
            tstride = kc;
            cstride = nt * kc;
            gstride = (cpad + kc - 1) / kc * cstride;
            pstride = G * gstride;
        }
        astride = spread(nt * G * planes * ((cpad + kc - 1) / kc * kc));
    }
    int64_t floats(const TileGeom& T) const { return num_points(T) * astride; }
};

// Transform tiles [s0, s1) x the input planes of output planes [d0, d1), every group,
// into V laid out as lay (tile s at (s - sbase)).
template <int M, int AX>
void transform_tiles(const Source& S, const TileGeom& T, int64_t G, int64_t cpad,
                     const Lines& L, int64_t s0, int64_t s1, int64_t sbase, int64_t d0,
                     const VLayout& lay, float* V) {
    const int64_t cg_ = S.C / G;
    for (int64_t s = s0; s < s1; s++) {
        const TileAt t(T, s);
        for (int64_t p = 0; p < lay.planes; p++)
            for (int64_t g = 0; g < G; g++)
                for (int64_t c = 0; c < cpad; c += lay.kc)
                    input_tile<M, AX>(S, T, L, t.n, d0 + T.off[0] + p, t.th, t.tw,
                                      g * cg_ + std::min(c, cg_),
                                      g * cg_ + std::min(c + lay.kc, cg_),
                                      V + p * lay.pstride + g * lay.gstride + c / lay.kc * lay.cstride +
                                          (s - sbase) * lay.tstride,
                                      lay.astride);
    }
}

inline int64_t out_buffer_floats(const WinoProblem* P, int64_t nt) {
    if (direct_out(P)) return 0;
    const int64_t mh = P->tg.axes == 2 ? P->tg.m : 1;
    return nt * mh * P->tg.m * P->Cout;
}

// Rows a in [a0, a0 + na) x taps [0, T) x columns [0, nvalid) of one block of the
// weights (element (t, a, b) at src + t*st + a*sa + b*sb, dtype) into buf[a - a0][t][NB]
// as float32, zeros past nvalid.  Weights are read along whichever axis is contiguous:
// columns as vectors; rows or taps (forwards or backwards) in 8 x 8 blocks, transposed
// (16-bit ones widened first; engine debug bit 4194304: 16-bit weights element by element
// at their stride; bit 67108864: taps never read as runs).
void gather_weights(const char* src, int64_t dtype, int64_t st, int64_t sa, int64_t sb,
                    int64_t a0, int na, int T, int nvalid, int NB, float* buf) {
    const int64_t es = itemsize(dtype);
    auto elem = [&](int64_t t, int64_t a, int64_t b) {
        return src + es * (t * st + a * sa + b * sb);
    };
    auto value = [&](int64_t t, int64_t a, int64_t b) {
        float v;
        convert_run(&v, elem(t, a, b), dtype, 1, 1);
        return v;
    };
    // 8 runs of 8 contiguous elements, rs elements apart from p, transposed into dst
    // (rows dstride floats apart); 16-bit runs are widened first (F16C / shifts)
    auto block8 = [&](const char* p, int64_t rs, float* dst, int64_t dstride) {
        if (dtype == F32) {
            transpose8((const float*)p, rs, dst, dstride);
            return;
        }
        alignas(32) float tmp[8][8];
        for (int r = 0; r < 8; r++) convert_run(tmp[r], p + es * r * rs, dtype, 1, 8);
        transpose8(&tmp[0][0], 8, dst, dstride);
    };
    for (int i = 0; i < na; i++)
        for (int t = 0; t < T; t++)
            for (int b = nvalid; b < NB; b++) buf[(i * T + t) * NB + b] = 0.0f;
    const bool taps_run = (st == 1 || st == -1) && !(cg_engine_dbg & 67108864);
    if (sb == 1 || (!taps_run && sa != 1) || (dtype != F32 && (cg_engine_dbg & 4194304))) {
        for (int i = 0; i < na; i++)
            for (int t = 0; t < T; t++)
                convert_run(buf + (i * T + t) * NB, elem(t, a0 + i, 0), dtype, sb, nvalid);
        return;
    }
    const int b8 = nvalid / 8 * 8;
    if (taps_run) {
        // taps contiguous (OIX weights): 8 columns x 8 taps per transpose; a data
        // gradient's flipped taps run backwards (st = -1), so each block is read from
        // its last tap and its rows stored last first.  The taps past the last 8 (a 3x3
        // kernel's ninth) as strided runs of the columns.
        const int t8 = T / 8 * 8;
        for (int i = 0; i < na; i++) {
            float* o = buf + i * T * NB;
            for (int b = 0; b < b8; b += 8)
                for (int t = 0; t < t8; t += 8) {
                    if (st == 1)
                        block8(elem(t, a0 + i, b), sb, o + t * NB + b, NB);
                    else
                        block8(elem(t + 7, a0 + i, b), sb, o + (t + 7) * NB + b, -(int64_t)NB);
                }
            for (int t = t8; t < T; t++) convert_run(o + t * NB, elem(t, a0 + i, 0), dtype, sb, nvalid);
            for (int t = 0; t < t8; t++)
                for (int b = b8; b < nvalid; b++) o[t * NB + b] = value(t, a0 + i, b);
        }
        return;
    }
    // rows contiguous (a data gradient's XIO weights): 8 columns x 8 rows per transpose,
    // 8 columns' runs read to their end before the next 8 columns' (8 streams at a time
    // rather than all the block's columns: ResNet-50 res5's data gradient 1.03-1.04x
    // back to back, level after the pause, in-process A/B)
    const int i8 = na / 8 * 8;
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < b8; b += 8)
            for (int i = 0; i < i8; i += 8)
                block8(elem(t, a0 + i, b), sb, buf + (i * T + t) * NB + b, (int64_t)T * NB);
        for (int i = 0; i < na; i++)
            for (int b = (i < i8 ? b8 : 0); b < nvalid; b++)
                buf[(i * T + t) * NB + b] = value(t, a0 + i, b);
    }
}

// Rows a in [a0, a1) (rows past the group's input channels: zeros) of depth tap k of
// weight block blk (k = g*nob + ob), transformed: point p at out + p*ostride +
// (a - a0)*NB.
template <int M, int AX>
void transform_weights(const WinoProblem* P, int64_t blk, int64_t k, int64_t a0, int64_t a1,
                       float* out, int64_t ostride) {
    constexpr int A = F3<M>::A;
    constexpr int NA = AX == 2 ? A * A : A;
    constexpr int KW = AX == 2 ? 9 : 3;
    const int nv = (int)P->nv, NB = nv * VL;
    const int64_t G = P->groups, Ach = P->in.C / G, B = P->Cout / G;
    const int64_t nob = nblocks(B, nv), es = itemsize(P->wdtype);
    const int64_t T = P->tg.kd * KW;
    const int64_t g = blk / nob, ob = blk % nob;
    const int nvalid = (int)std::min<int64_t>(NB, B - ob * NB);
    // taps in order (flipped: reversed); those of depth tap k
    const int64_t st = P->wflip ? -P->wst : P->wst;
    const char* src = (const char*)P->w +
                      es * (g * P->wgs + ob * NB * P->wsb + (P->wflip ? (T - 1) * P->wst : 0) +
                            k * KW * st);
    // the rows gathered once (each source row read in order), then transformed
    static thread_local std::vector<float> buf;
    const int64_t ng = std::max<int64_t>(0, std::min(a1, Ach) - a0);
    buf.resize((size_t)std::max<int64_t>(1, ng) * KW * NB);
    if (ng > 0)
        gather_weights(src, P->wdtype, st, P->wsa, P->wsb, a0, (int)ng, KW, nvalid, NB,
                       buf.data());
    for (int64_t a = a0; a < a1; a++) {
        float* o = out + (a - a0) * NB;
        if (a >= Ach) {
            for (int p = 0; p < NA; p++) std::memset(o + p * ostride, 0, NB * 4);
            continue;
        }
        const float* gb = buf.data() + (a - a0) * KW * NB;
        for (int v = 0; v < nv; v++) {
            vf gg[KW], t1[3 * A], u[NA];
#pragma GCC unroll 9
            for (int t = 0; t < KW; t++) gg[t] = load(gb + t * NB + v * VL);
            if (AX == 2) {
                // along w: 3 rows of 3 taps -> 3 rows of A points; then along h, point
                // (w point q)*A + (h point), as the data transforms number them
#pragma GCC unroll 3
                for (int j = 0; j < 3; j++) F3<M>::wt(&gg[j * 3], 1, &t1[j * A], 1);
#pragma GCC unroll 6
                for (int q = 0; q < A; q++) F3<M>::wt(&t1[q], A, &u[q * A], 1);
            } else {
                F3<M>::wt(gg, 1, u, 1);
            }
            float* ov = o + v * VL;
#pragma GCC unroll 36
            for (int p = 0; p < NA; p++) store(ov + p * ostride, u[p]);
        }
    }
}

// Weight blocks [lo, hi) of U, block k at out + (k - lo)*ublock.
template <int M, int AX>
struct WeightBlocks {
    static void run(const WinoProblem* P, int64_t lo, int64_t hi, float* out) {
        const int64_t us = ustride(P), NB = P->nv * VL;
        for (int64_t blk = lo; blk < hi; blk++)
            for (int64_t k = 0; k < P->tg.kd; k++)
                transform_weights<M, AX>(P, blk, k, 0, P->cpad,
                                         out + (blk - lo) * ublock(P) + k * P->cpad * NB, us);
    }
};

// The buffered outputs of tiles [s0, s1) (obuf: per tile, MH rows of M pixels of Cout
// floats; channels of blocks [k0, k1)) to a channels-first result: per output row, its
// pixels in w order, 8 channels x up to 64 pixels transposed at a time, every channel's
// run of consecutive pixels stored as one run (a value at a time at the channel stride
// measured 86% of the item loop on the TCN row's NCX data gradient).
template <int M, int AX>
void store_channels_first(const WinoProblem* P, const TileGeom& T, const float* obuf,
                          int64_t s0, int64_t s1, int64_t d, int64_t k0, int64_t k1,
                          int64_t nob, int64_t cout_g) {
    constexpr int MH = AX == 2 ? M : 1;
    const int64_t es = P->out_dtype == F32 ? 4 : 2, C = P->Cout;
    const bool stream = P->stream && !(cg_engine_dbg & 2048);
    static thread_local std::vector<std::pair<int64_t, const float*>> px;
    for (int64_t sa = s0; sa < s1;) {
        // a run of tiles of one tile row (same sample and tile row h0)
        const int64_t row = sa / T.ntw;
        int64_t sb = sa + 1;
        while (sb < s1 && sb / T.ntw == row) sb++;
        const TileAt ta(T, sa);
        const int64_t h0 = AX == 2 ? T.tiles_h[2 * ta.th] : 0;
        const int nh = AX == 2 ? (int)T.tiles_h[2 * ta.th + 1] : 1;
        for (int i = 0; i < nh; i++) {
            px.clear();
            for (int64_t s = sa; s < sb; s++) {
                const int64_t tw = s % T.ntw, w0 = T.tiles_w[2 * tw];
                const int nw = (int)T.tiles_w[2 * tw + 1];
                for (int j = 0; j < nw; j++)
                    px.emplace_back(w0 + j * T.dil[2], obuf + (((s - s0) * MH + i) * M + j) * C);
            }
            if (T.dil[2] > 1) std::sort(px.begin(), px.end());
            const int64_t h = h0 + i * T.dil[1];
            char* line = (char*)P->out + es * (ta.n * P->ostride[0] + d * P->ostride[1] +
                                               h * P->ostride[2]);
            for (size_t a = 0; a < px.size();) {
                // pixels of consecutive w, at most 64
                size_t e = a + 1;
                while (e < px.size() && e - a < 64 && px[e].first == px[e - 1].first + 1) e++;
                const int64_t un = (int64_t)(e - a);
                for (int64_t k = k0; k < k1;) {
                    const int64_t g = k / nob, kend = std::min(k1, (g + 1) * nob);
                    const int64_t c0 = g * cout_g + (k % nob) * P->nv * VL;
                    const int64_t c1 = g * cout_g + std::min(cout_g, (kend - g * nob) * P->nv * VL);
                    for (int64_t cb = c0; cb < c1; cb += 8)
                        store_channel_runs(
                            line + es * (px[a].first * P->ostride[3] + cb * P->ostride[4]),
                            P->out_dtype, P->ostride[3], P->ostride[4],
                            [&](int64_t u) { return px[a + u].second + cb; }, un,
                            std::min<int64_t>(8, c1 - cb), stream);
                    k = kend;
                }
                a = e;
            }
        }
        sa = sb;
    }
}

template <int M, int AX>
void run_items(const WinoProblem* P, int64_t lo, int64_t hi, float* scratch) {
    constexpr int A = F3<M>::A;
    constexpr int NA = AX == 2 ? A * A : A;
    constexpr int MH = AX == 2 ? M : 1;
    const TileGeom& T = P->tg;
    const int64_t G = P->groups, cout_g = P->Cout / G;
    const int nv = (int)P->nv, NB = nv * VL, mr = WMR[nv];
    const int64_t nob = nblocks(cout_g, nv), ub = ublock(P);
    const wgemm_fn* fns = wgemm_table(nv);
    const wgemm_fn* fns_acc = wgemm_table(nv, true);
    const bool dout = direct_out(P);
    // a channels-last float32 result in recycled memory, 64-byte aligned pixels (the
    // caller checked: _results.streams): its tiles' whole vectors stream
    const bool stream_out = dout && P->stream && !(cg_engine_dbg & 2048);
    Lines L;
    for (int64_t it = lo; it < hi; it++) {
        const int64_t* item = P->items + 6 * it;
        const int64_t s0 = item[0], s1 = item[1], nt = s1 - s0;
        const int64_t d0 = item[2], d1 = item[3], k0 = item[4], k1 = item[5];
        float* free_ = scratch;
        // 1. the transformed input: shared, or this item's own
        const float* V;
        int64_t vtile0, vplane0;
        const VLayout lay = P->V ? VLayout(T, G, P->cpad, P->vs0, P->vs1, P->vd0, P->vd1,
                                           P->wchunk)
                                 : VLayout(T, G, P->cpad, s0, s1, d0, d1);
        PROF_START();
        if (P->V) {
            V = P->V;
            vtile0 = s0 - P->vs0;
            vplane0 = d0 - P->vd0;
        } else {
            free_ += prepare_lines(P->in, T, AX == 2 ? A : 1, A, T.kd, s0, s1, d0, d1, T.off, L,
                                   free_);
            float* Vi = free_;
            free_ += lay.floats(T);
            transform_tiles<M, AX>(P->in, T, G, P->cpad, L, s0, s1, s0, d0, lay, Vi);
            V = Vi;
            vtile0 = 0;
            vplane0 = 0;
        }
        PROF_ADD(0);
        // 2. the weights: transformed once for all items (U), or here, block by block, a
        // chunk of input channels at a time (kept in L2 while every point's GEMM uses it)
        const int64_t kc = std::min<int64_t>(P->cpad, P->wchunk);
        const int64_t ucs = spread(kc * NB);             // a chunk's floats per point
        float* Uc = free_;
        if (!P->U) free_ += NA * ucs;
        const int64_t mstride = spread(nt * NB);
        float* Mb = free_;
        free_ += NA * mstride;
        float* obuf = free_;                        // [tile][i][j][Cout], if not direct
        const int64_t red = T.kd * P->cpad;         // reduction: depth taps x channels
        const int64_t us = ustride(P);
        for (int64_t d = d0; d < d1; d++) {
            for (int64_t k = k0; k < k1; k++) {
                const int64_t g = k / nob, ob = k % nob;
                const int nvalid = (int)std::min<int64_t>(NB, cout_g - ob * NB);
                // products, point by point
                const float* Vg = V + vtile0 * lay.tstride + g * lay.gstride +
                                  (d - d0 + vplane0) * lay.pstride;
                if (P->U) {
                    const float* Uk = P->U + k * ub;
                    for (int a = 0; a < NA; a++) {
                        const float* Va = Vg + a * lay.astride;
                        const float* Ua = Uk + a * us;
                        float* Ma = Mb + a * mstride;
                        // the last row block fetches the next point's (block's) B into
                        // L2 as it goes
                        const float* next = (cg_engine_dbg & 8388608) ? nullptr
                                            : a + 1 < NA ? Ua + us
                                            : k + 1 < k1 ? P->U + (k + 1) * ub : nullptr;
                        for (int64_t t0 = 0; t0 < nt; t0 += mr) {
                            const int r = (int)std::min<int64_t>(mr, nt - t0);
                            fns[r - 1](red, Va + t0 * lay.tstride, lay.tstride, Ua, Ma + t0 * NB,
                                       t0 + mr >= nt ? next : nullptr, 0);
                        }
                    }
                } else {
                    for (int64_t kk = 0; kk < T.kd; kk++)
                        for (int64_t a0 = 0; a0 < P->cpad; a0 += kc) {
                            const int64_t a1 = std::min(P->cpad, a0 + kc);
                            PROF_ADD(1);
                            transform_weights<M, AX>(P, k, kk, a0, a1, Uc, ucs);
                            PROF_ADD(3);
                            const wgemm_fn* f = (kk == 0 && a0 == 0) ? fns : fns_acc;
                            for (int a = 0; a < NA; a++) {
                                const float* Va = Vg + a * lay.astride + kk * lay.pstride +
                                                  a0 / lay.kc * lay.cstride + a0 % lay.kc;
                                float* Ma = Mb + a * mstride;
                                // (each call fetches the next one's rows of the shared
                                // V: the next row block, else the next point's first)
                                const float* Vn = a + 1 < NA ? Va + lay.astride : nullptr;
                                for (int64_t t0 = 0; t0 < nt; t0 += mr) {
                                    const int r = (int)std::min<int64_t>(mr, nt - t0);
                                    const float* pf = (cg_engine_dbg & 16777216) ? nullptr
                                                      : t0 + mr < nt ? Va + (t0 + mr) * lay.tstride
                                                      : Vn;
                                    f[r - 1](a1 - a0, Va + t0 * lay.tstride, lay.tstride,
                                             Uc + a * ucs, Ma + t0 * NB, pf, lay.tstride);
                                }
                            }
                        }
                }
                PROF_ADD(1);
                // output transform, into the result or the item's buffer
                const int64_t ch0 = g * cout_g + ob * NB;
                for (int64_t s = s0; s < s1; s++) {
                    const TileAt t(T, s);
                    const int64_t h0 = AX == 2 ? T.tiles_h[2 * t.th] : 0;
                    const int nh = AX == 2 ? (int)T.tiles_h[2 * t.th + 1] : 1;
                    const int64_t w0 = T.tiles_w[2 * t.tw];
                    const int nw = (int)T.tiles_w[2 * t.tw + 1];
                    float* o;
                    int64_t sh, sw;
                    if (dout) {
                        o = (float*)P->out + t.n * P->ostride[0] + d * P->ostride[1] +
                            h0 * P->ostride[2] + w0 * P->ostride[3] + ch0;
                        sh = T.dil[1] * P->ostride[2];
                        sw = T.dil[2] * P->ostride[3];
                    } else {
                        sw = P->Cout;
                        sh = M * sw;
                        o = obuf + (s - s0) * MH * sh + ch0;
                    }
                    const float* Mt = Mb + (s - s0) * NB;
                    const vf sum =
                        stream_out
                            ? output_tile<M, AX, true>(Mt, mstride, o, sh, sw, nh, nw, nvalid)
                            : output_tile<M, AX>(Mt, mstride, o, sh, sw, nh, nw, nvalid);
                    if (!finite_all(sum)) {
                        for (int i = 0; i < nh; i++)
                            __atomic_store_n(P->bad + (t.n * P->Lout[0] + d) * P->Lout[1] +
                                             h0 + i * T.dil[1], (uint8_t)1, __ATOMIC_RELAXED);
                    }
                }
                PROF_ADD(2);
            }
            if (!dout && P->ostride[4] != 1) {
                store_channels_first<M, AX>(P, T, obuf, s0, s1, d, k0, k1, nob, cout_g);
            } else if (!dout) {
                // the buffered tiles' outputs (channels of blocks [k0, k1)) to the result
                const int64_t es = P->out_dtype == F32 ? 4 : 2;
                for (int64_t s = s0; s < s1; s++) {
                    const TileAt t(T, s);
                    const int64_t h0 = AX == 2 ? T.tiles_h[2 * t.th] : 0;
                    const int nh = AX == 2 ? (int)T.tiles_h[2 * t.th + 1] : 1;
                    const int64_t w0 = T.tiles_w[2 * t.tw];
                    const int nw = (int)T.tiles_w[2 * t.tw + 1];
                    for (int64_t k = k0; k < k1;) {
                        // a run of blocks of one group: contiguous channels
                        const int64_t g = k / nob, kend = std::min(k1, (g + 1) * nob);
                        const int64_t c0 = g * cout_g + (k % nob) * NB;
                        const int64_t c1 = g * cout_g + std::min(cout_g, (kend - g * nob) * NB);
                        for (int i = 0; i < nh; i++)
                            for (int j = 0; j < nw; j++) {
                                const int64_t h = h0 + i * T.dil[1], w = w0 + j * T.dil[2];
                                char* dst = (char*)P->out +
                                            es * (t.n * P->ostride[0] + d * P->ostride[1] +
                                                  h * P->ostride[2] + w * P->ostride[3] +
                                                  c0 * P->ostride[4]);
                                store_run(dst, P->out_dtype, P->ostride[4],
                                          obuf + (((s - s0) * MH + i) * M + j) * P->Cout + c0,
                                          c1 - c0);
                            }
                        k = kend;
                    }
                }
            }
        }
    }
    if (P->stream) stream_fence();
}

template <template <int, int> class F, class... Args>
void dispatch(const TileGeom& T, Args&&... args) {
    if (T.m == 6) {
        if (T.axes == 2) F<6, 2>::run(args...);
        else F<6, 1>::run(args...);
    } else if (T.m == 4) {
        if (T.axes == 2) F<4, 2>::run(args...);
        else F<4, 1>::run(args...);
    } else if (T.m == 3) {
        if (T.axes == 2) F<3, 2>::run(args...);
        else F<3, 1>::run(args...);
    } else {
        if (T.axes == 2) F<2, 2>::run(args...);
        else F<2, 1>::run(args...);
    }
}

template <int M, int AX>
struct RunItems {
    static void run(const WinoProblem* P, int64_t lo, int64_t hi, float* scratch) {
        run_items<M, AX>(P, lo, hi, scratch);
    }
};

template <int M, int AX>
struct InputTiles {
    static void run(const WinoProblem* P, int64_t s0, int64_t s1, float* V, float* scratch) {
        Lines L;
        const TileGeom& T = P->tg;
        prepare_lines(P->in, T, AX == 2 ? M + 2 : 1, M + 2, T.kd, s0, s1, P->vd0, P->vd1,
                      T.off, L, scratch);
        const VLayout lay(T, P->groups, P->cpad, P->vs0, P->vs1, P->vd0, P->vd1, P->wchunk);
        transform_tiles<M, AX>(P->in, T, P->groups, P->cpad, L, s0, s1, P->vs0, P->vd0, lay, V);
    }
};

}  // namespace

int64_t cg_wino_scratch(const WinoProblem* P, int64_t lo, int64_t hi) {
    int64_t most = 0;
    const TileGeom& T = P->tg;
    const int64_t NB = P->nv * VL, A = T.m + 2;
    for (int64_t it = lo; it < hi; it++) {
        const int64_t* item = P->items + 6 * it;
        const int64_t nt = item[1] - item[0];
        int64_t need = 0;
        if (!P->V) {
            need += lines_floats(P->in, T, T.axes == 2 ? A : 1, A, T.kd, item[0], item[1],
                                 item[2], item[3], T.off);
            need += VLayout(T, P->groups, P->cpad, item[0], item[1], item[2], item[3]).floats(T);
        }
        if (!P->U) need += num_points(T) * spread(std::min<int64_t>(P->cpad, P->wchunk) * NB);
        need += num_points(T) * spread(nt * NB) + out_buffer_floats(P, nt);
        most = std::max(most, need);
    }
    return most + 64;
}

void cg_wino_run(const WinoProblem* P, int64_t lo, int64_t hi, float* scratch) {
    dispatch<RunItems>(P->tg, P, lo, hi, scratch);
}

int64_t cg_wino_input_scratch(const WinoProblem* P, int64_t s0, int64_t s1) {
    const TileGeom& T = P->tg;
    return lines_floats(P->in, T, T.axes == 2 ? T.m + 2 : 1, T.m + 2, T.kd, s0, s1, P->vd0,
                        P->vd1, T.off) + 64;
}

// The shared transformed input: tiles [s0, s1) (within [vs0, vs1)) into V.
void cg_wino_input(const WinoProblem* P, int64_t s0, int64_t s1, float* V, float* scratch) {
    dispatch<InputTiles>(P->tg, P, s0, s1, V, scratch);
}

// ---------------------------------------------------------------------------------------
// The weight gradient

namespace {

// One channel vector of a dy tile (rows[i]: row i of the tile, null past the output;
// columns xw floats apart, the first nw of them valid; nc lanes): Y = A dy A^T, point
// a = k*A + j to o + a*astride.
template <int M, int AX, int64_t DT>
inline void dy_vector(const typename Elem<DT>::T* const* rows, int64_t ch, int64_t xw, int nw,
                      int nc, float* o, int64_t astride) {
    constexpr int A = F3<M>::A;
    constexpr int MH = AX == 2 ? M : 1;
    alignas(64) vf tmp[MH][A];
#pragma GCC unroll 4
    for (int i = 0; i < MH; i++) {
        vf d[M];
        const typename Elem<DT>::T* r = rows[i] + ch;
        for (int k = 0; k < M; k++)
            d[k] = (!rows[i] || k >= nw) ? zero()
                   : nc == VL ? load_as<DT>(r + k * xw) : load_as_n<DT>(r + k * xw, nc);
        F3<M>::dy(d, 1, &tmp[i][0], 1);
    }
    columns_store<M, A, AX>(tmp, o, astride, [](const vf* c, vf* r) { F3<M>::dy(c, 1, r, 1); });
}

struct WgradItem {
    int64_t s0, s1, d0, d1, g, c0, c1, ob0, ob1;
    explicit WgradItem(const int64_t* it)
        : s0(it[0]), s1(it[1]), d0(it[2]), d1(it[3]), g(it[4]), c0(it[5]), c1(it[6]),
          ob0(it[7]), ob1(it[8]) {}
    int64_t nt() const { return s1 - s0; }
    int64_t cw() const { return (c1 - c0 + VL - 1) / VL * VL; }
};

// Scratch layout of an item: x's transform V[a][plane][tile][cw], dy's Y[a][ob][plane][tile][NB].
struct WgradLayout {
    int64_t xplanes, vstride, ystride, bstride;
    WgradLayout(const WinoWgrad* P, const WgradItem& I) {
        const int64_t NB = P->nv * VL, nd = I.d1 - I.d0;
        xplanes = nd + P->tg.kd - 1;
        vstride = spread(xplanes * I.nt() * I.cw());
        bstride = nd * I.nt() * NB;
        ystride = spread((I.ob1 - I.ob0) * bstride);
    }
};

template <int M, int AX>
struct WgradFinish;
template <int M, int AX>
void finish_tile_oix(const WinoWgrad* P, const float* Mbuf, int64_t g, int64_t c0, int rows,
                     int64_t o0, int64_t o1, int64_t lpad, float* dw);

// The items [lo, hi) of a task add their tiles' products into the box's sums Mbuf --
// or, with dw (fused: the task's one item holds every tile of its box, so no other item
// adds to these sums), each register tile's sums over every point are stored into Mbuf
// as a small box of their own (points x rows x columns, in L1/L2) and finished into dw
// at once: the box's full sums are never written, zeroed or read back.
template <int M, int AX>
void wgrad_items(const WinoWgrad* P, int64_t lo, int64_t hi, const MBox& box, float* Mbuf,
                 float* scratch, float* dw = nullptr) {
    constexpr int A = F3<M>::A;
    constexpr int NA = AX == 2 ? A * A : A;
    constexpr int MH = AX == 2 ? M : 1;
    const TileGeom& T = P->tg;
    const int64_t G = P->groups, og = P->dy.C / G, cg_ = P->x.C / G, kd = T.kd;
    const int nv = (int)P->nv, NB = nv * VL, mr = WG_MR[nv];
    const int64_t opad = box.nob * NB;               // M's row length
    const gemm_fn* fns = gemm_table(nv);
    const int64_t dyoff[3] = {0, 0, 0};
    Lines LX, LY;
    for (int64_t it = lo; it < hi; it++) {
        const WgradItem I(P->items + 9 * it);
        const WgradLayout lay(P, I);
        const int64_t nt = I.nt(), cw = I.cw(), nd = I.d1 - I.d0;
        float* free_ = scratch;
        PROF_START();
        free_ += prepare_lines(P->x, T, AX == 2 ? A : 1, A, kd, I.s0, I.s1, I.d0, I.d1, T.off,
                               LX, free_, I.g * cg_ + I.c0, I.g * cg_ + I.c1);
        free_ += prepare_lines(P->dy, T, MH, M, 1, I.s0, I.s1, I.d0, I.d1, dyoff, LY, free_,
                               I.g * og + std::min(og, I.ob0 * NB),
                               I.g * og + std::min(og, I.ob1 * NB));
        PROF_ADD(0);
        float* V = free_;
        free_ += NA * lay.vstride;
        float* Y = free_;
        // 1. transforms: x (channels [c0, c1) of the group) and dy (blocks [ob0, ob1))
        for (int64_t s = I.s0; s < I.s1; s++) {
            const TileAt t(T, s);
            for (int64_t p = 0; p < lay.xplanes; p++)
                input_tile<M, AX>(P->x, T, LX, t.n, I.d0 + T.off[0] + p, t.th, t.tw,
                                  I.g * cg_ + I.c0, I.g * cg_ + I.c1,
                                  V + (p * nt + (s - I.s0)) * cw, lay.vstride);
            const int64_t h0 = AX == 2 ? T.tiles_h[2 * t.th] : 0;
            const int nh = AX == 2 ? (int)T.tiles_h[2 * t.th + 1] : 1;
            const int64_t w0 = T.tiles_w[2 * t.tw];
            const int nw = (int)T.tiles_w[2 * t.tw + 1];
            const int64_t xw = LY.pixel() * T.dil[2];
            with_elem(LY, [&](auto dt) {
                constexpr int64_t DT = decltype(dt)::value;
                typedef typename Elem<DT>::T E;
                for (int64_t d = I.d0; d < I.d1; d++) {
                    const E* rows[MH];
                    for (int i = 0; i < MH; i++)
                        rows[i] = i < nh ? LY.row<E>(t.n, d, h0 + i * T.dil[1]) + w0 * LY.pixel()
                                         : nullptr;
                    for (int64_t ob = I.ob0; ob < I.ob1; ob++)
                        for (int v = 0; v < nv; v++) {
                            const int64_t c = ob * NB + v * VL;
                            const int nc = (int)std::max<int64_t>(0, std::min<int64_t>(VL, og - c));
                            float* o = Y + (ob - I.ob0) * lay.bstride +
                                       ((d - I.d0) * nt + (s - I.s0)) * NB + v * VL;
                            if (nc == 0) {
                                for (int a = 0; a < NA; a++) store(o + a * lay.ystride, zero());
                                continue;
                            }
                            dy_vector<M, AX, DT>(rows, I.g * og + c, xw, nw, nc, o, lay.ystride);
                        }
                }
            });
        }
        PROF_ADD(1);
        // 2. M[g][a][k][c][o] += sum over planes and tiles of V[a][plane + k][tile][c] *
        //    Y[a][ob][plane][tile][o], the reduction over (plane, tile) contiguous
        const int64_t ncx = I.c1 - I.c0, nct = (ncx + mr - 1) / mr;
        const float* ar[64];
        float* cr[64];
        if (dw) {
            // blocks of the widest tile's count, for every tile (fewer rows take more)
            int bks = BMAX;
            for (int64_t ct = 0; ct < nct; ct++)
                bks = std::min(bks, gemm_blocks((int)(tile_start(ct + 1, ncx, nct) -
                                                      tile_start(ct, ncx, nct)), nv));
            // output blocks outermost: their dy rows (points x tiles x bks blocks) stay
            // in L2 while every channel tile reads them
            for (int64_t ob = I.ob0; ob < I.ob1; ob += bks) {
                const int bk = (int)std::min<int64_t>(bks, I.ob1 - ob);
                const int nvalid = (int)std::min<int64_t>(bk * NB, og - ob * NB);
                const int64_t lpad = bk * NB;
                for (int64_t ct = 0; ct < nct; ct++) {
                    const int64_t r0 = tile_start(ct, ncx, nct);
                    const int rows = (int)(tile_start(ct + 1, ncx, nct) - r0);
                    for (int a = 0; a < NA; a++)
                        for (int64_t k = 0; k < kd; k++) {
                            const float* Va = V + a * lay.vstride + k * nt * cw;
                            for (int i = 0; i < rows; i++) {
                                ar[i] = Va + r0 + i;
                                cr[i] = Mbuf + ((a * kd + k) * rows + i) * lpad;
                            }
                            fns[(rows - 1) * BMAX + (bk - 1)](
                                nd * nt, 1, ar, cw, 0,
                                Y + a * lay.ystride + (ob - I.ob0) * lay.bstride, lay.bstride,
                                0, cr, nvalid, true);
                        }
                    PROF_ADD(2);
                    if (P->oix) {
                        finish_tile_oix<M, AX>(P, Mbuf, I.g, I.c0 + r0, rows, ob * NB,
                                               ob * NB + nvalid, lpad, dw);
                    } else {
                        const MBox tb{I.g, 1, I.c0 + r0, rows, ob, bk};
                        WgradFinish<M, AX>::run(P, &tb, Mbuf, 1, 0, dw, 0, rows);
                    }
                    PROF_ADD(3);
                }
            }
            continue;
        }
        for (int a = 0; a < NA; a++) {
            for (int64_t k = 0; k < kd; k++) {
                const float* Va = V + a * lay.vstride + k * nt * cw;
                float* Mk = Mbuf + ((((I.g - box.g0) * NA + a) * kd + k) * box.nc - box.c0) * opad -
                            box.ob0 * NB;
                for (int64_t ct = 0; ct < nct; ct++) {
                    const int64_t r0 = tile_start(ct, ncx, nct);
                    const int rows = (int)(tile_start(ct + 1, ncx, nct) - r0);
                    const int bmax = gemm_blocks(rows, nv);
                    for (int64_t ob = I.ob0; ob < I.ob1;) {
                        const int bk = (int)std::min<int64_t>(bmax, I.ob1 - ob);
                        const int nvalid = (int)std::min<int64_t>(bk * NB, og - ob * NB);
                        for (int i = 0; i < rows; i++) {
                            ar[i] = Va + r0 + i;
                            cr[i] = Mk + (I.c0 + r0 + i) * opad + ob * NB;
                        }
                        fns[(rows - 1) * BMAX + (bk - 1)](nd * nt, 1, ar, cw, 0,
                                                          Y + a * lay.ystride + (ob - I.ob0) * lay.bstride,
                                                          lay.bstride, 0, cr, nvalid, false);
                        ob += bk;
                    }
                }
            }
        }
        PROF_ADD(2);
    }
}

template <int M, int AX>
struct WgradItems {
    static void run(const WinoWgrad* P, int64_t lo, int64_t hi, const MBox* box, float* Mbuf,
                    float* scratch) {
        wgrad_items<M, AX>(P, lo, hi, *box, Mbuf, scratch);
    }
};

template <int M, int AX>
struct WgradFused {
    static void run(const WinoWgrad* P, int64_t lo, int64_t hi, const MBox* box, float* Mbuf,
                    float* scratch, float* dw) {
        wgrad_items<M, AX>(P, lo, hi, *box, Mbuf, scratch, dw);
    }
};

// The taps of one row and vector of output channels, G^T S G, from its points' sums S
// (point a at m + a*astride, parts part_stride apart, summed in order).
template <int M, int AX>
inline void finish_taps(const float* m, int64_t astride, int64_t parts, int64_t part_stride,
                        vf (&res)[AX == 2 ? 3 : 1][3]) {
    constexpr int A = F3<M>::A;
    constexpr int NA = AX == 2 ? A * A : A;
    vf sums[NA];
    for (int a = 0; a < NA; a++) {
        vf acc = load(m + a * astride);
        for (int64_t q = 1; q < parts; q++) acc += load(m + q * part_stride + a * astride);
        sums[a] = acc;
    }
    if constexpr (AX == 2) {
        vf tmp[3][A];
        for (int kw = 0; kw < A; kw++) {
            vf gg[3];
            F3<M>::dw(&sums[kw * A], 1, gg, 1);
            for (int th = 0; th < 3; th++) tmp[th][kw] = gg[th];
        }
        for (int th = 0; th < 3; th++) F3<M>::dw(&tmp[th][0], 1, &res[th][0], 1);
    } else {
        F3<M>::dw(sums, 1, &res[0][0], 1);
    }
}

// A fused task's register tile finished into OIX memory, dw[(g*og + o)*cg*T + c*T + tap]
// (T = kd x 9 or kd x 3 taps): rows c0 + [0, rows) of group g, output channels [o0, o1)
// (sums at Mbuf[(a*kd + k)*rows + row][o - o0], lpad floats a row).  Each row's taps
// per vector of channels are transposed (8 taps x 8 channels at a time) into
// tb[o][row][tap], whose runs of rows x T floats, consecutive in OIX, are then copied.
template <int M, int AX>
void finish_tile_oix(const WinoWgrad* P, const float* Mbuf, int64_t g, int64_t c0, int rows,
                     int64_t o0, int64_t o1, int64_t lpad, float* dw) {
    constexpr int KH = AX == 2 ? 3 : 1;
    constexpr int NT = KH * 3;
    const int64_t G = P->groups, og = P->dy.C / G, cg_ = P->x.C / G, kd = P->tg.kd;
    const int64_t T = kd * NT;
    const int vr = (int)std::min<int64_t>(rows, cg_ - c0);          // rows within the group
    if (vr <= 0) return;
    const int64_t rowsT = vr * T, astride = kd * rows * lpad;
    static thread_local std::vector<float> tbv;
    tbv.resize((size_t)((o1 - o0 + VL - 1) / VL * VL * rowsT));
    float* tb = tbv.data();
    alignas(64) float tmp[NT][VL];
    vf all = zero();                     // the sum of the values stored: not finite if one is
    for (int r = 0; r < vr; r++)
        for (int64_t k = 0; k < kd; k++) {
            const float* m = Mbuf + (k * rows + r) * lpad;
            for (int64_t o = o0; o < o1; o += VL) {
                const int nc = (int)std::min<int64_t>(VL, o1 - o);
                vf res[KH][3];
                finish_taps<M, AX>(m + (o - o0), astride, 1, 0, res);
                for (int t = 0; t < NT; t++) {
                    store(tmp[t], res[t / 3][t % 3]);
                    all += nc == VL ? res[t / 3][t % 3] : load_n(tmp[t], nc);
                }
                float* d = tb + (o - o0) * rowsT + r * T + k * NT;
                int j = 0;
                if (NT == 9 && VL >= 8 && !(cg_engine_dbg & 134217728)) {
                    for (; j + 8 <= nc; j += 8) {
                        transpose8(&tmp[0][j], VL, d + j * rowsT, rowsT);
                        for (int l = j; l < j + 8; l++) d[l * rowsT + 8] = tmp[8][l];
                    }
                }
                for (; j < nc; j++)
                    for (int t = 0; t < NT; t++) d[j * rowsT + t] = tmp[t][j];
            }
        }
    // (a large result streams the whole cache lines of each run: see WgradFinish)
    const bool nt = P->stream && !(cg_engine_dbg & 2048);
    for (int64_t o = o0; o < o1; o++) {
        float* dst = dw + ((g * og + o) * cg_ + c0) * T;
        if (nt) stream_run(dst, tb + (o - o0) * rowsT, rowsT);
        else std::memcpy(dst, tb + (o - o0) * rowsT, (size_t)rowsT * sizeof(float));
    }
    if (nt) stream_fence();
    if (!finite_all(all)) __atomic_store_n(P->bad, (int64_t)1, __ATOMIC_RELAXED);
}

// dw[k][th][tw][c][g*og + o] = G^T (sum of the parts of M) G for the box's rows (g, c),
// numbered over the box, in [lo, hi), and its columns.  Parts are part_stride floats
// apart, summed in order.
template <int M, int AX>
struct WgradFinish {
    static void run(const WinoWgrad* P, const MBox* box, const float* Mbuf, int64_t parts,
                    int64_t part_stride, float* dw, int64_t lo, int64_t hi) {
        constexpr int A = F3<M>::A;
        constexpr int NA = AX == 2 ? A * A : A;
        constexpr int KH = AX == 2 ? 3 : 1;
        const TileGeom& T = P->tg;
        const int64_t G = P->groups, og = P->dy.C / G, cg_ = P->x.C / G, kd = T.kd;
        const int64_t O = P->dy.C;
        const int nv = (int)P->nv, NB = nv * VL;
        const int64_t opad = box->nob * NB;
        const int64_t astride = kd * box->nc * opad;   // floats between points
        const int64_t o0 = box->ob0 * NB, o1 = std::min(og, (box->ob0 + box->nob) * NB);
        const int64_t taps = KH * 3;
        vf all = zero();                 // the sum of the values stored: not finite if one is
        const int64_t dt = P->out_dtype, es = dt == F32 ? 4 : 2;
        // A large dw is written with streaming stores, whole vectors at aligned
        // addresses (a 16-bit one's two halves of a cache line one after the other):
        // its lines are not read before they are written (9 rows a vector of channels,
        // a tap's rows C/G * O values apart), nor kept in the caches.  ResNet-50 res5
        // (9.4 MB of dw), after the benchmark's pause: see docs/kernels.md.  Engine
        // debug bit 2048 (Winograd streaming stores): off.
        const bool nt = P->stream && !(cg_engine_dbg & 2048);
        for (int64_t r = lo; r < hi; r++) {
            const int64_t gi = r / box->nc, c = box->c0 + r % box->nc, g = box->g0 + gi;
            if (c >= cg_) continue;
            for (int64_t k = 0; k < kd; k++) {
                const float* m = Mbuf + (((gi * NA) * kd + k) * box->nc + c - box->c0) * opad - o0;
                for (int64_t o = o0; o < o1; o += VL) {
                    const int nc = (int)std::min<int64_t>(VL, o1 - o);
                    vf res[KH][3];
                    finish_taps<M, AX>(m + o, astride, parts, part_stride, res);
                    for (int th = 0; th < KH; th++)
                        for (int tw = 0; tw < 3; tw++) {
                            const int64_t at = ((k * taps + th * 3 + tw) * cg_ + c) * O + g * og + o;
                            if (nc < VL) {
                                float part[VL];
                                store_n(part, res[th][tw], nc);
                                store_run((char*)dw + es * at, dt, 1, part, nc);
                                all += load_n(part, nc);
                                continue;
                            }
                            char* const d = (char*)dw + es * at;
                            if (nt && ((uintptr_t)d & (VL * es - 1)) == 0) {
                                if (dt == F32) stream_store((float*)d, res[th][tw]);
                                else if (dt == F16) store_as<F16, true>((uint16_t*)d, res[th][tw]);
                                else store_as<BF16, true>((uint16_t*)d, res[th][tw]);
                            } else if (dt == F32) {
                                store((float*)d, res[th][tw]);
                            } else if (dt == F16) {
                                store_as<F16>((uint16_t*)d, res[th][tw]);
                            } else {
                                store_as<BF16>((uint16_t*)d, res[th][tw]);
                            }
                            all += res[th][tw];
                        }
                }
            }
        }
        if (nt) stream_fence();
        // (a sum of finite values may overflow: a false alarm only costs the recomputation)
        if (!finite_all(all)) __atomic_store_n(P->bad, (int64_t)1, __ATOMIC_RELAXED);
    }
};

}  // namespace

int64_t cg_wino_wgrad_scratch(const WinoWgrad* P, int64_t lo, int64_t hi) {
    const TileGeom& T = P->tg;
    const int64_t A = T.m + 2, na = num_points(T);
    const int64_t zero3[3] = {0, 0, 0};
    int64_t most = 0;
    for (int64_t it = lo; it < hi; it++) {
        const WgradItem I(P->items + 9 * it);
        const WgradLayout lay(P, I);
        int64_t need = na * (lay.vstride + lay.ystride);
        need += lines_floats(P->x, T, T.axes == 2 ? A : 1, A, T.kd, I.s0, I.s1, I.d0, I.d1, T.off);
        need += lines_floats(P->dy, T, T.axes == 2 ? T.m : 1, T.m, 1, I.s0, I.s1, I.d0, I.d1,
                             zero3);
        most = std::max(most, need);
    }
    return most + 64;
}

int64_t cg_wino_wgrad_fused_floats(const WinoWgrad* P) {
    // rows x blocks x NV of a GEMM tile hold at most ACC vectors (gemm_blocks)
    return num_points(P->tg) * P->tg.kd * ACC * VL;
}

void cg_wino_wgrad_run(const WinoWgrad* P, int64_t lo, int64_t hi, const MBox* box, float* M,
                       float* scratch) {
    dispatch<WgradItems>(P->tg, P, lo, hi, box, M, scratch);
}

void cg_wino_wgrad_finish(const WinoWgrad* P, const MBox* box, const float* M, int64_t parts,
                          int64_t part_stride, float* dw, int64_t lo, int64_t hi) {
    dispatch<WgradFinish>(P->tg, P, box, M, parts, part_stride, dw, lo, hi);
}

void cg_wino_wgrad_task(const WinoWgrad* P, const int64_t* t, int64_t k, float* scratch) {
    const int64_t* d = t + WINO_TASK * k;
    const MBox b{d[2], d[3], d[4], d[5], d[6], d[7]};
    const int64_t nf = d[9];
    float* M = d[8] ? (float*)(intptr_t)d[8] : scratch;
    float* work = d[8] ? scratch : scratch + (nf + 15) / 16 * 16;
    // fused (d[11]; one item, every tile of the box, sums the thread's): each register
    // tile's sums finished as they are made (wgrad_items), M holding only those
    if (d[11]) {
        dispatch<WgradFused>(P->tg, P, d[0], d[1], &b, M, work, (float*)(intptr_t)d[10]);
        return;
    }
    std::memset(M, 0, nf * sizeof(float));
    cg_wino_wgrad_run(P, d[0], d[1], &b, M, work);
    if (!d[8]) cg_wino_wgrad_finish(P, &b, M, 1, 0, (float*)(intptr_t)d[10], 0, b.ng * b.nc);
}

void cg_wino_wgrad_finish_rows(const WinoWgrad* P, const int64_t* f, int64_t lo, int64_t hi) {
    const MBox b{f[0], f[1], f[2], f[3], f[4], f[5]};
    cg_wino_wgrad_finish(P, &b, (const float*)(intptr_t)f[6], f[7], f[8],
                         (float*)(intptr_t)f[9], lo, hi);
}

void cg_wino_weights(const WinoProblem* P, int64_t lo, int64_t hi, float* out) {
    dispatch<WeightBlocks>(P->tg, P, lo, hi, out);
}
