// Winograd convolution for 3-tap stride-1 axes: F(4, 3) and F(2, 3) per axis.
//
// One correlation kernel serves the forward convolution and the data gradient (a
// stride-1 data gradient is a correlation of dy with the flipped taps, channels
// swapped), in 1-D (Winograd along w), 2-D (along h and w) and 3-D (along h and w; the
// depth taps are extra terms of the products' reduction).  Per work item -- a block of
// output tiles, a range of output planes, a range of output-channel blocks:
//
//   1. input transform: V[a][tile][plane][c] = (B^T d B)[a] of every input tile the
//      item reads (zeros where a tile reaches past the input);
//   2. per output block and transform point a: M[a][tile] = V[a][tile][planes][:] .
//      U[a][taps in depth][:][block] on a register-blocked micro-kernel (the depth taps
//      and input channels are one reduction);
//   3. output transform: out[tile] = (A^T M A), written straight into the result.
//
// Transformed data never exceeds the item's scratch (no whole-tensor copies).  Tiles
// along an axis of dilation d are the interleaved sub-grids' tiles: outputs r + d*(m*b
// + i) read inputs r + d*(m*b + j) + off, so a dilated layer needs no split copies.
//
// Padding is a zero operand here (the transforms mix a tile's inputs): docs/decisions.md
// (D17, D24) says how the library keeps its NaN/Inf semantics anyway (outputs that come
// out non-finite are recomputed by the direct kernels).
#include <algorithm>
#include <array>
#include <utility>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"
#include "simd.h"

using namespace cg;

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
// The transforms, F(m, 3) for m = 4 (points 0, +-1, +-2, inf) and m = 2 (0, +-1, inf):
// y = A^T [(G g) . (B^T d)] is the correlation y_i = sum_t d_{i+t} g_t; by symmetry of the
// trilinear form, dg = G^T [(A dy) . (B^T d)] is its weight gradient.

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
};

// ---------------------------------------------------------------------------------------
// The micro-kernel: C_i[j] = sum_p A_i[p] * B[p*NB + j] for MR rows (A_i = a + i*astride,
// C_i = c + i*NB), NB = NV*VL columns; C is overwritten.

template <int MR, int NV>
void wgemm(int64_t np, const float* a, int64_t astride, const float* B, float* c) {
    constexpr int NB = NV * VL;
    vf acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[i][v] = zero();
    for (int64_t p = 0; p < np; p++) {
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
        for (int v = 0; v < NV; v++) store(c + i * NB + v * VL, acc[i][v]);
}

typedef void (*wgemm_fn)(int64_t, const float*, int64_t, const float*, float*);

#if CG_VL == 16
constexpr int WMR[5] = {0, 24, 14, 9, 6};
#else
constexpr int WMR[5] = {0, 12, 6, 4, 3};
#endif
constexpr int WMR_MAX = WMR[1];

template <int NV, int... R>
constexpr std::array<wgemm_fn, sizeof...(R)> wgemm_fns_impl(std::integer_sequence<int, R...>) {
    return {&wgemm<R + 1, NV>...};
}

// fns[r - 1]: the micro-kernel of r rows, r <= WMR[nv]
inline const wgemm_fn* wgemm_table(int nv) {
    static const auto t1 = wgemm_fns_impl<1>(std::make_integer_sequence<int, WMR[1]>{});
    static const auto t2 = wgemm_fns_impl<2>(std::make_integer_sequence<int, WMR[2]>{});
    static const auto t3 = wgemm_fns_impl<3>(std::make_integer_sequence<int, WMR[3]>{});
    static const auto t4 = wgemm_fns_impl<4>(std::make_integer_sequence<int, WMR[4]>{});
    switch (nv) {
        case 1: return t1.data();
        case 2: return t2.data();
        case 3: return t3.data();
        default: return t4.data();
    }
}

}  // namespace

extern "C" {

// The Winograd correlation problem (winograd.py: _Wino, same field order).
struct WinoProblem {
    Tensor in;                 // n, d, h, w, c: the correlation's input, any dtype / strides
    void* out;                 // the output (out_dtype: float32, float16 or bfloat16)
    int64_t ostride[5];        // n, d, h, w, c (elements)
    int64_t out_dtype;
    int64_t N, Lin[3], Lout[3], Cin, Cout, groups;
    int64_t axes;              // Winograd axes: 1 (w) or 2 (h, w)
    int64_t m;                 // outputs per tile and Winograd axis: 2 or 4
    int64_t dil[3];            // input step per tap (depth: 1)
    int64_t off[3];            // input index of tap 0 at output 0
    int64_t kd;                // taps along depth (the leading axis; 1 in 1-D / 2-D)
    const int64_t* tiles_h;    // per tile row: first output index, valid outputs
    int64_t nth;
    const int64_t* tiles_w;    // per tile column: the same
    int64_t ntw;
    // the weights' blocks (k = g*nob + ob; NB = nv*VL columns): transformed, block k at
    // U + k*ublock, point a, depth tap t, input channel c at ((a*kd + t)*cpad + c)*NB --
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
};

int64_t cg_wino_points(int64_t axes, int64_t m) { return axes == 2 ? (m + 2) * (m + 2) : m + 2; }
int64_t cg_wino_mr(int64_t nv) { return nv >= 1 && nv <= 4 ? WMR[nv] : 0; }
int64_t cg_wino_scratch(const WinoProblem* P, int64_t lo, int64_t hi);
void cg_wino_run(const WinoProblem* P, int64_t lo, int64_t hi, float* scratch);
int64_t cg_wino_input_scratch(const WinoProblem* P, int64_t s0, int64_t s1);
void cg_wino_input(const WinoProblem* P, int64_t s0, int64_t s1, float* V, float* scratch);
void cg_wino_weights(const WinoProblem* P, int64_t lo, int64_t hi, float* out);

}  // extern "C"

namespace {

// A stride (floats) between the transform points' rows that spreads them over the cache
// sets: a whole number of lines, odd.
inline int64_t spread(int64_t floats) {
    const int64_t lines = (floats + 15) / 16;
    return (lines | 1) * 16;
}

inline int64_t num_points(const WinoProblem* P) { return cg_wino_points(P->axes, P->m); }
inline int64_t nblocks(const WinoProblem* P) {
    const int64_t NB = P->nv * VL;
    return (P->Cout / P->groups + NB - 1) / NB;
}
inline int64_t ublock(const WinoProblem* P) {
    return num_points(P) * P->kd * P->cpad * P->nv * VL;
}
inline bool direct_out(const WinoProblem* P) { return P->out_dtype == F32 && P->ostride[4] == 1; }

// The input lines an item reads: in place (float32, unit channel stride), or converted
// into scratch (sorted keys (n*L0 + d)*L1 + h, each line all W pixels, all channels).
struct Lines {
    const WinoProblem* P;
    bool packed = false;
    std::vector<int64_t> keys;
    const float* buf = nullptr;

    // line (n, d, h) at pixel 0, channel 0 (or null if it was not converted)
    const float* row(int64_t n, int64_t d, int64_t h) const {
        if (!packed) return (const float*)at(P->in, n, d, h, 0, 0);
        const int64_t key = (n * P->Lin[0] + d) * P->Lin[1] + h;
        const auto it = std::lower_bound(keys.begin(), keys.end(), key);
        return buf + (it - keys.begin()) * P->Lin[2] * P->Cin;
    }
    int64_t pixel() const { return packed ? P->Cin : P->in.stride[3]; }
};

// The tile rows (n, tile row) and input planes that tiles [s0, s1) x output planes
// [d0, d1) read, as line keys: every row of those tiles, every plane.
void tile_keys(const WinoProblem* P, int64_t s0, int64_t s1, int64_t d0, int64_t d1,
               std::vector<int64_t>& keys) {
    keys.clear();
    const int64_t per_n = P->nth * P->ntw, A = P->m + 2;
    int64_t last = -1;
    for (int64_t s = s0; s < s1; s++) {
        const int64_t tr = s / P->ntw;            // n * nth + tile row
        if (tr == last) continue;
        last = tr;
        const int64_t n = s / per_n, th = tr % P->nth;
        for (int64_t pd = d0 + P->off[0]; pd < d1 - 1 + P->off[0] + P->kd; pd++) {
            if (pd < 0 || pd >= P->Lin[0]) continue;
            for (int64_t j = 0; j < (P->axes == 2 ? A : 1); j++) {
                const int64_t h = P->axes == 2 ? P->tiles_h[2 * th] + P->off[1] + j * P->dil[1] : 0;
                if (h >= 0 && h < P->Lin[1]) keys.push_back((n * P->Lin[0] + pd) * P->Lin[1] + h);
            }
        }
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
}

// Prepare the lines of tiles [s0, s1) x planes [d0, d1): converted into buf when the
// input is not float32 with unit channel stride.  Returns the floats used.
int64_t prepare_lines(const WinoProblem* P, int64_t s0, int64_t s1, int64_t d0, int64_t d1,
                      Lines& L, float* buf) {
    L.P = P;
    L.packed = !direct_f32(P->in);
    if (!L.packed) return 0;
    tile_keys(P, s0, s1, d0, d1, L.keys);
    pack_keyed_lines(buf, P->in, L.keys, P->Lin[0], P->Lin[1], P->Lin[2], P->Cin);
    L.buf = buf;
    return (int64_t)L.keys.size() * P->Lin[2] * P->Cin;
}

int64_t lines_floats(const WinoProblem* P, int64_t s0, int64_t s1, int64_t d0, int64_t d1) {
    if (direct_f32(P->in)) return 0;
    std::vector<int64_t> keys;
    tile_keys(P, s0, s1, d0, d1, keys);
    return (int64_t)keys.size() * P->Lin[2] * P->Cin;
}

// One channel vector of an input tile: row j of the tile at rows[j] (null: a row of
// padding), its columns xw floats apart, the columns outside [wlo, whi) zeros and only
// nc lanes loaded (nc < VL: the lanes past a group's channels are zeros).  Point
// a = k*A + j (k along w, j along h) goes to o + a*astride.
template <int M, int AX, bool FULL>
inline void input_vector(const float* const* rows, int64_t ch, int64_t xw, int wlo, int whi,
                         int nc, float* o, int64_t astride) {
    constexpr int A = F3<M>::A;
    constexpr int AH = AX == 2 ? A : 1;
    alignas(64) vf tmp[AH][A];
    // along w, row by row
#pragma GCC unroll 8
    for (int j = 0; j < AH; j++) {
        vf d[A];
        const float* r = rows[j] + ch;
        if (FULL) {
#pragma GCC unroll 8
            for (int k = 0; k < A; k++) d[k] = load(r + k * xw);
        } else {
            for (int k = 0; k < A; k++)
                d[k] = (!rows[j] || k < wlo || k >= whi) ? zero()
                       : nc == VL ? load(r + k * xw) : load_n(r + k * xw, nc);
        }
        F3<M>::in(d, 1, &tmp[j][0], 1);
    }
    if (AX == 2) {
        // along h, column by column
#pragma GCC unroll 8
        for (int k = 0; k < A; k++) {
            vf col[A], r[A];
#pragma GCC unroll 8
            for (int j = 0; j < A; j++) col[j] = tmp[j][k];
            F3<M>::in(col, 1, r, 1);
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

// Input transform of one tile (n, input plane pd, tile row th, tile column tw), all
// channels: point a of group g's channels at V + a*astride + g*gstride.  Rows and
// columns past the input are zeros; so are the lanes past a group's channels, up to
// cpad (they meet zero weight rows).
template <int M, int AX>
void input_tile(const WinoProblem* P, const Lines& L, int64_t n, int64_t pd, int64_t th,
                int64_t tw, float* V, int64_t astride, int64_t gstride) {
    constexpr int A = F3<M>::A;
    constexpr int AH = AX == 2 ? A : 1;
    const int64_t G = P->groups, cg_ = P->Cin / G;
    const int64_t w0 = P->tiles_w[2 * tw] + P->off[2];
    const int64_t dw = P->dil[2];
    const float* rows[AH];
    const bool inside = pd >= 0 && pd < P->Lin[0];
    int wlo = 0, whi = A;                 // the columns inside the input
    while (wlo < A && w0 + wlo * dw < 0) wlo++;
    while (whi > wlo && w0 + (whi - 1) * dw >= P->Lin[2]) whi--;
    bool full = wlo == 0 && whi == A && inside;
    const int64_t xw = L.pixel() * dw;           // floats between a tile's columns
    for (int j = 0; j < AH; j++) {
        const int64_t h = AX == 2 ? P->tiles_h[2 * th] + P->off[1] + j * P->dil[1] : 0;
        const bool ok = inside && h >= 0 && h < P->Lin[1] && wlo < whi;
        rows[j] = ok ? L.row(n, pd, h) + w0 * L.pixel() : nullptr;
        full = full && ok;
    }
    const int64_t cfull = full ? cg_ / VL * VL : 0;
    for (int64_t g = 0; g < G; g++) {
        float* o = V + g * gstride;
        int64_t c = 0;
        for (; c < cfull; c += VL)
            input_vector<M, AX, true>(rows, g * cg_ + c, xw, 0, A, VL, o + c, astride);
        for (; c < cg_; c += VL)
            input_vector<M, AX, false>(rows, g * cg_ + c, xw, wlo, whi,
                                       (int)std::min<int64_t>(VL, cg_ - c), o + c, astride);
    }
}

// Output transform of one tile: M + a*mstride (NB columns) -> the tile's pixel (i, j) at
// o + i*sh + j*sw (channels contiguous), columns [0, nvalid), outputs [0, nh) x [0, nw)
// of the tile.  Returns the sum of every output (not finite if one of them is not).
template <int M, int AX>
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
#pragma GCC unroll 4
                for (int j = 0; j < M; j++) {
                    store(ov + i * sh + j * sw, y[j]);
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

// Transform tiles [s0, s1) x input planes of output planes [d0, d1) into V (point a of
// tile s, plane p, group g at V + a*astride + (s - sbase)*rowlen + g*gplanes + p*cpad).
template <int M, int AX>
void transform_tiles(const WinoProblem* P, const Lines& L, int64_t s0, int64_t s1,
                     int64_t sbase, int64_t d0, int64_t np_, float* V, int64_t astride,
                     int64_t rowlen, int64_t gplanes) {
    const int64_t tiles_plane = P->nth * P->ntw;
    for (int64_t s = s0; s < s1; s++) {
        const int64_t n = s / tiles_plane, th = (s / P->ntw) % P->nth, tw = s % P->ntw;
        for (int64_t p = 0; p < np_; p++)
            input_tile<M, AX>(P, L, n, d0 + P->off[0] + p, th, tw,
                              V + (s - sbase) * rowlen + p * P->cpad, astride, gplanes);
    }
}

// Layout of a transformed input holding tiles [s0, s1) of planes [d0, d1).
struct VLayout {
    int64_t planes, gplanes, rowlen, astride;
    VLayout(const WinoProblem* P, int64_t s0, int64_t s1, int64_t d0, int64_t d1) {
        planes = d1 - d0 + P->kd - 1;
        gplanes = planes * P->cpad;                        // floats per tile, point, group
        rowlen = P->groups * gplanes;                      // floats per tile and point
        astride = spread((s1 - s0) * rowlen);              // floats per point
    }
    int64_t floats(const WinoProblem* P) const { return num_points(P) * astride; }
};

// The output transform's destination for an item: the result itself, or a float32
// buffer [tile][i][j][Cout] written to the result (its layout and dtype) afterwards.
inline int64_t out_buffer_floats(const WinoProblem* P, int64_t nt) {
    if (direct_out(P)) return 0;
    const int64_t mh = P->axes == 2 ? P->m : 1;
    return nt * mh * P->m * P->Cout;
}

template <int M, int AX>
void run_items(const WinoProblem* P, int64_t lo, int64_t hi, float* scratch) {
    constexpr int A = F3<M>::A;
    constexpr int NA = AX == 2 ? A * A : A;
    constexpr int MH = AX == 2 ? M : 1;
    const int64_t G = P->groups, cout_g = P->Cout / G;
    const int nv = (int)P->nv, NB = nv * VL, mr = WMR[nv];
    const int64_t nob = nblocks(P), ub = ublock(P);
    const wgemm_fn* fns = wgemm_table(nv);
    const int64_t tiles_plane = P->nth * P->ntw;
    const bool dout = direct_out(P);
    Lines L;
    for (int64_t it = lo; it < hi; it++) {
        const int64_t* item = P->items + 6 * it;
        const int64_t s0 = item[0], s1 = item[1], nt = s1 - s0;
        const int64_t d0 = item[2], d1 = item[3], k0 = item[4], k1 = item[5];
        float* free_ = scratch;
        // 1. the transformed input: shared, or this item's own
        const float* V;
        int64_t vtile0, vplane0;
        VLayout lay = P->V ? VLayout(P, P->vs0, P->vs1, P->vd0, P->vd1) : VLayout(P, s0, s1, d0, d1);
        PROF_START();
        if (P->V) {
            V = P->V;
            vtile0 = s0 - P->vs0;
            vplane0 = d0 - P->vd0;
        } else {
            free_ += prepare_lines(P, s0, s1, d0, d1, L, free_);
            float* Vi = free_;
            free_ += lay.floats(P);
            transform_tiles<M, AX>(P, L, s0, s1, s0, d0, lay.planes, Vi, lay.astride,
                                   lay.rowlen, lay.gplanes);
            V = Vi;
            vtile0 = 0;
            vplane0 = 0;
        }
        PROF_ADD(0);
        // 2. the weights: transformed once for all items, or here for blocks [k0, k1)
        const float* Ub = P->U;
        if (!P->U) {
            cg_wino_weights(P, k0, k1, free_);
            Ub = free_ - k0 * ub;
            free_ += (k1 - k0) * ub;
        }
        PROF_ADD(3);
        const int64_t mstride = spread(nt * NB);
        float* Mb = free_;
        free_ += NA * mstride;
        float* obuf = free_;                        // [tile][i][j][Cout], if not direct
        const int64_t red = P->kd * P->cpad;        // reduction: depth taps x channels
        for (int64_t d = d0; d < d1; d++) {
            for (int64_t k = k0; k < k1; k++) {
                const int64_t g = k / nob, ob = k % nob;
                const int nvalid = (int)std::min<int64_t>(NB, cout_g - ob * NB);
                // products, point by point
                const float* Uk = Ub + k * ub;
                const float* Vg = V + vtile0 * lay.rowlen + g * lay.gplanes + (d - d0 + vplane0) * P->cpad;
                for (int a = 0; a < NA; a++) {
                    const float* Va = Vg + a * lay.astride;
                    const float* Ua = Uk + a * red * NB;
                    float* Ma = Mb + a * mstride;
                    for (int64_t t0 = 0; t0 < nt; t0 += mr) {
                        const int r = (int)std::min<int64_t>(mr, nt - t0);
                        fns[r - 1](red, Va + t0 * lay.rowlen, lay.rowlen, Ua, Ma + t0 * NB);
                    }
                }
                PROF_ADD(1);
                // output transform, into the result or the item's buffer
                const int64_t ch0 = g * cout_g + ob * NB;
                for (int64_t s = s0; s < s1; s++) {
                    const int64_t n = s / tiles_plane, th = (s / P->ntw) % P->nth, tw = s % P->ntw;
                    const int64_t h0 = AX == 2 ? P->tiles_h[2 * th] : 0;
                    const int nh = AX == 2 ? (int)P->tiles_h[2 * th + 1] : 1;
                    const int64_t w0 = P->tiles_w[2 * tw];
                    const int nw = (int)P->tiles_w[2 * tw + 1];
                    float* o;
                    int64_t sh, sw;
                    if (dout) {
                        o = (float*)P->out + n * P->ostride[0] + d * P->ostride[1] +
                            h0 * P->ostride[2] + w0 * P->ostride[3] + ch0;
                        sh = P->dil[1] * P->ostride[2];
                        sw = P->dil[2] * P->ostride[3];
                    } else {
                        sw = P->Cout;
                        sh = M * sw;
                        o = obuf + (s - s0) * MH * sh + ch0;
                    }
                    const vf sum = output_tile<M, AX>(Mb + (s - s0) * NB, mstride, o, sh, sw,
                                                      nh, nw, nvalid);
                    if (!finite_all(sum)) {
                        for (int i = 0; i < nh; i++)
                            __atomic_store_n(P->bad + (n * P->Lout[0] + d) * P->Lout[1] + h0 +
                                             i * P->dil[1], (uint8_t)1, __ATOMIC_RELAXED);
                    }
                }
                PROF_ADD(2);
            }
            if (!dout) {
                // the buffered tiles' outputs (channels of blocks [k0, k1)) to the result
                const int64_t es = P->out_dtype == F32 ? 4 : 2;
                for (int64_t s = s0; s < s1; s++) {
                    const int64_t n = s / tiles_plane, th = (s / P->ntw) % P->nth, tw = s % P->ntw;
                    const int64_t h0 = AX == 2 ? P->tiles_h[2 * th] : 0;
                    const int nh = AX == 2 ? (int)P->tiles_h[2 * th + 1] : 1;
                    const int64_t w0 = P->tiles_w[2 * tw];
                    const int nw = (int)P->tiles_w[2 * tw + 1];
                    for (int64_t k = k0; k < k1;) {
                        // a run of blocks of one group: contiguous channels
                        const int64_t g = k / nob, kend = std::min(k1, (g + 1) * nob);
                        const int64_t c0 = g * cout_g + (k % nob) * NB;
                        const int64_t c1 = g * cout_g + std::min(cout_g, (kend - g * nob) * NB);
                        for (int i = 0; i < nh; i++)
                            for (int j = 0; j < nw; j++) {
                                const int64_t h = h0 + i * P->dil[1], w = w0 + j * P->dil[2];
                                char* dst = (char*)P->out +
                                            es * (n * P->ostride[0] + d * P->ostride[1] +
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
}

}  // namespace

int64_t cg_wino_scratch(const WinoProblem* P, int64_t lo, int64_t hi) {
    int64_t most = 0;
    const int64_t NB = P->nv * VL;
    for (int64_t it = lo; it < hi; it++) {
        const int64_t* item = P->items + 6 * it;
        const int64_t nt = item[1] - item[0];
        int64_t need = 0;
        if (!P->V) {
            need += lines_floats(P, item[0], item[1], item[2], item[3]);
            need += VLayout(P, item[0], item[1], item[2], item[3]).floats(P);
        }
        if (!P->U) need += (item[5] - item[4]) * ublock(P);
        need += num_points(P) * spread(nt * NB) + out_buffer_floats(P, nt);
        most = std::max(most, need);
    }
    return most + 64;
}

void cg_wino_run(const WinoProblem* P, int64_t lo, int64_t hi, float* scratch) {
    if (P->m == 4) {
        if (P->axes == 2) run_items<4, 2>(P, lo, hi, scratch);
        else run_items<4, 1>(P, lo, hi, scratch);
    } else {
        if (P->axes == 2) run_items<2, 2>(P, lo, hi, scratch);
        else run_items<2, 1>(P, lo, hi, scratch);
    }
}

int64_t cg_wino_input_scratch(const WinoProblem* P, int64_t s0, int64_t s1) {
    return lines_floats(P, s0, s1, P->vd0, P->vd1) + 64;
}

// The shared transformed input: tiles [s0, s1) (within [vs0, vs1)) into V.
void cg_wino_input(const WinoProblem* P, int64_t s0, int64_t s1, float* V, float* scratch) {
    Lines L;
    prepare_lines(P, s0, s1, P->vd0, P->vd1, L, scratch);
    const VLayout lay(P, P->vs0, P->vs1, P->vd0, P->vd1);
    if (P->m == 4) {
        if (P->axes == 2) transform_tiles<4, 2>(P, L, s0, s1, P->vs0, P->vd0, lay.planes, V, lay.astride, lay.rowlen, lay.gplanes);
        else transform_tiles<4, 1>(P, L, s0, s1, P->vs0, P->vd0, lay.planes, V, lay.astride, lay.rowlen, lay.gplanes);
    } else {
        if (P->axes == 2) transform_tiles<2, 2>(P, L, s0, s1, P->vs0, P->vd0, lay.planes, V, lay.astride, lay.rowlen, lay.gplanes);
        else transform_tiles<2, 1>(P, L, s0, s1, P->vs0, P->vd0, lay.planes, V, lay.astride, lay.rowlen, lay.gplanes);
    }
}

namespace {

// Weight blocks [lo, hi) (k = g*nob + ob) of U, block k at out + (k - lo)*ublock.
template <int M, int AX>
void weights_blocks(const WinoProblem* P, int64_t lo, int64_t hi, float* out) {
    constexpr int A = F3<M>::A;
    constexpr int NA = AX == 2 ? A * A : A;
    constexpr int KW = AX == 2 ? 9 : 3;
    const int nv = (int)P->nv, NB = nv * VL;
    const int64_t nob = nblocks(P), es = itemsize(P->wdtype), kd = P->kd, cpad = P->cpad;
    const int64_t G = P->groups, Ach = P->Cin / G, B = P->Cout / G;
    const int64_t T = kd * KW;
    alignas(64) float buf[KW * 4 * 16];
    for (int64_t blk = lo; blk < hi; blk++) {
        const int64_t g = blk / nob, ob = blk % nob;
        const int64_t nvalid = std::min<int64_t>(NB, B - ob * NB);
        float* o = out + (blk - lo) * ublock(P);
        for (int64_t k = 0; k < kd; k++) {
            for (int64_t a = 0; a < cpad; a++) {
                if (a >= Ach) {
                    for (int p = 0; p < NA; p++)
                        std::memset(o + ((p * kd + k) * cpad + a) * NB, 0, NB * 4);
                    continue;
                }
                for (int t = 0; t < KW; t++) {
                    const int64_t tap = k * KW + t, src = P->wflip ? T - 1 - tap : tap;
                    float* row = buf + t * NB;
                    convert_run(row, (const char*)P->w + es * (g * P->wgs + src * P->wst +
                                                               a * P->wsa + ob * NB * P->wsb),
                                P->wdtype, P->wsb, nvalid);
                    for (int64_t j = nvalid; j < NB; j++) row[j] = 0.0f;
                }
                for (int v = 0; v < nv; v++) {
                    vf gg[KW], t1[3 * A], u[NA];
                    for (int t = 0; t < KW; t++) gg[t] = load(buf + t * NB + v * VL);
                    if (AX == 2) {
                        // along w: 3 rows of 3 taps -> 3 rows of A points; then along h
                        for (int j = 0; j < 3; j++) F3<M>::wt(&gg[j * 3], 1, &t1[j * A], 1);
                        for (int q = 0; q < A; q++) F3<M>::wt(&t1[q], A, &u[q], A);
                    } else {
                        F3<M>::wt(gg, 1, u, 1);
                    }
                    // point a = (w point)*A + (h point), as the data transforms number them
                    for (int p = 0; p < NA; p++) {
                        const int a_ = AX == 2 ? (p % A) * A + p / A : p;
                        store(o + ((a_ * kd + k) * cpad + a) * NB + v * VL, u[p]);
                    }
                }
            }
        }
    }
}

}  // namespace

void cg_wino_weights(const WinoProblem* P, int64_t lo, int64_t hi, float* out) {
    if (P->m == 4) {
        if (P->axes == 2) weights_blocks<4, 2>(P, lo, hi, out);
        else weights_blocks<4, 1>(P, lo, hi, out);
    } else {
        if (P->axes == 2) weights_blocks<2, 2>(P, lo, hi, out);
        else weights_blocks<2, 1>(P, lo, hi, out);
    }
}
