// Depthwise and grouped convolutions with few channels per group: lane-aligned kernels.
//
// With few channels per group a convolution is not GEMM-shaped: an output value sums
// a few dozen products, and the work is bound by memory traffic.  Here a vector holds
// VL consecutive *lanes* (output channels of the op: y channels for the forward
// convolution, dx channels for the data gradient, dy channels for the weight
// gradient), and every operand is brought into lane order:
//
//   corr  (fwd, dgrad):  out[u][l] = sum_t sum_j src[u*is + off_t][idx(l, j)] * W[t][j][l]
//   wgrad:               dw[t][j][l] = sum_p src[p*s + off_t][idx(l, j)] * dy[p][l]
//
// with idx(l, j) = (l / A) * B + j the source channel lane l meets as its j-th input
// (A lanes and B = J source channels per group).  Depthwise (A = B = 1) reads the
// source vector as it is; other small groups permute one loaded vector (its lanes
// all lie within VL source channels) or, when they do not, read lines expanded once
// into [w][j][lane] order.  No multiplication by zero padding lanes or padding
// pixels is ever stored (docs/decisions.md D17).
//
// Register tiles (see docs/kernels.md, "Grouped kernels"): R output pixels of one
// stride phase, P apart, x one vector of lanes.  The taps of one kernel row whose
// source offsets are P*is apart form a *sweep*: the source columns the tile reads
// for those taps are consecutive multiples of P*is, so each source vector is loaded
// once per tile and sweep, and multiplied into every accumulator it meets.  corr
// keeps the R output vectors in registers across all sweeps; wgrad keeps R dy
// vectors in registers and the sweep's tap accumulators while it runs.
//
// Every entry point is single-threaded and works on a range of work items (output
// lines, or pieces of them) that write disjoint outputs (corr) or add into the
// caller's partial sum (wgrad); grouped.py runs ranges on its threads.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "common.h"
#include "simd.h"

using namespace cg;

CG_ISA_OF(grouped)

namespace {

constexpr int GR_NKMAX = 7;          // taps per sweep
#if CG_VL == 16
constexpr int GR_REGS = 32;          // zmm registers
constexpr int GR_RMAX = 24;          // pixels per tile
#else
constexpr int GR_REGS = 16;          // ymm / xmm registers
constexpr int GR_RMAX = 12;
#endif

// Taps a sweep of an R-pixel tile may cover: R accumulators (or dy vectors), NK
// weights (or tap accumulators), the source vector and the permutation all in
// registers.  Tiles are only compiled for sweeps that fit (the plan chooses R).
constexpr int nk_fits(int r, bool perm) {
    int n = GR_REGS - 1 - r - (perm ? 1 : 0);
    return n < 1 ? 1 : (n > GR_NKMAX ? GR_NKMAX : n);
}

typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef int32_t viu __attribute__((vector_size(VL * 4), aligned(4), may_alias));

static inline vf permute(vf v, vi idx) {
#if defined(CG_EMULATE_VL16) || !(defined(CG_ISA_AVX2) || defined(CG_ISA_AVX512))
    vf r;
    for (int i = 0; i < VL; i++) r[i] = v[idx[i]];
    return r;
#elif defined(CG_ISA_AVX512)
    return (vf)_mm512_permutexvar_ps((__m512i)idx, (__m512)v);
#else
    return (vf)_mm256_permutevar8x32_ps((__m256)v, (__m256i)idx);
#endif
}

#define CG_INLINE inline __attribute__((always_inline))

// The source columns of a sweep are read through one pointer stepped by xs:
// indexing them from the start (x + c * xs) makes GCC keep R + NK - 1 offsets,
// more than the free registers (measured: 2.2 against 3.7 FMA/ns on a tile of 8).
CG_INLINE void bump(const float*& p) { __asm__("" : "+r"(p)); }

// acc[i] += sum_k X(x + (i + k) * xs) * w[k * ws] for i < R, k < NK: each source
// vector is loaded once (and permuted once) for every accumulator it meets.
template <int R, int NK, bool PERM>
CG_INLINE void csweep(vf (&acc)[R], const float* x, int64_t xs, const float* w, int64_t ws,
                      vi pv) {
    vf wv[NK];
#pragma GCC unroll 8
    for (int k = 0; k < NK; k++) wv[k] = load(w + k * ws);
#pragma GCC unroll 32
    for (int c = 0; c < R + NK - 1; c++) {
        vf xv = load(x);
        x += xs;
        bump(x);
        if (PERM) xv = permute(xv, pv);
#pragma GCC unroll 8
        for (int k = 0; k < NK; k++) {
            const int i = c - k;
            if (i >= 0 && i < R) acc[i] += xv * wv[k];
        }
    }
}

// a[k * as] += sum_i X(x + (i + k) * xs) * dyv[i] for k < NK, i < R (wgrad).
template <int R, int NK, bool PERM>
CG_INLINE void wsweep(const vf (&dyv)[R], const float* x, int64_t xs, float* a, int64_t as,
                      vi pv) {
    vf acc[NK];
#pragma GCC unroll 8
    for (int k = 0; k < NK; k++) acc[k] = load(a + k * as);
#pragma GCC unroll 32
    for (int c = 0; c < R + NK - 1; c++) {
        vf xv = load(x);
        x += xs;
        bump(x);
        if (PERM) xv = permute(xv, pv);
#pragma GCC unroll 8
        for (int k = 0; k < NK; k++) {
            const int i = c - k;
            if (i >= 0 && i < R) acc[k] += xv * dyv[i];
        }
    }
#pragma GCC unroll 8
    for (int k = 0; k < NK; k++) store(a + k * as, acc[k]);
}

// One sweep of a tile: the source at the tile's first pixel and the sweep's first
// tap (channel 0 of the pixel), the weights (corr) or accumulators (wgrad) of that
// tap (j = 0, lane 0), and the taps it covers.
struct Sweep {
    const float* x;
    float* w;
    int64_t nk;
};

// What every tile of a call shares.
struct Lanes {
    int64_t nlv;             // vectors of lanes
    int64_t J;               // source channels per lane
    int64_t LP;              // lanes padded to whole vectors (weight / accumulator rows)
    int64_t xj;              // plain operands: source floats per j (expanded lines: LP)
    int64_t xs;              // source floats from one tile pixel / tap to the next
    int64_t ws;              // weight / accumulator floats from one tap to the next
    const int32_t* wstart;   // permuted operands: [lv][j] window start channel
    const int32_t* perm;     // ... and [lv][j][VL] lane indices into that window
};

// Cache lines a tile prefetches (software prefetch into L2), per lane vector a few:
// the next line's source rows arrive while this line computes.  Bursts of
// prefetches between tiles measured no better than none (the miss buffers fill
// and stall the tile); spread over the lane vectors, the depthwise 3x3 data
// gradient ran at 1.7 ms against 3.2 ms (one thread, 14 MB in and out).
struct Prefetch {
    const char* const* q = nullptr;
    int64_t n = 0, per = 0;
    CG_INLINE void issue(int64_t lv) const {
        const int64_t a = lv * per, b = std::min(n, a + per);
        for (int64_t k = a; k < b; k++) __builtin_prefetch(q[k], 0, 1);
    }
};

// The source operand of lane vector lv and source channel j for a sweep.
template <bool PERM>
CG_INLINE const float* operand(const Sweep& s, int64_t xoff, const Lanes& L, int64_t lv,
                               int64_t j, vi& pv) {
    if (PERM) {
        pv = *reinterpret_cast<const viu*>(L.perm + (lv * L.J + j) * VL);
        return s.x + xoff + L.wstart[lv * L.J + j];
    }
    return s.x + xoff + j * L.xj + lv * VL;
}

// R output pixels (ostep floats apart) x every lane vector, summed over the ns
// sweeps (all of NK taps); added to what out holds when accumulate.
template <int R, int NK, bool PERM>
void corr_tile(const Sweep* sw, int ns, int64_t xoff, const Lanes& Lr, float* out,
               int64_t ostep, bool accumulate, const Prefetch& pf) {
    const Lanes L = Lr;
    for (int64_t lv = 0; lv < L.nlv; lv++) {
        pf.issue(lv);
        vf acc[R];
#pragma GCC unroll 32
        for (int i = 0; i < R; i++) acc[i] = accumulate ? load(out + i * ostep + lv * VL) : zero();
        for (int s = 0; s < ns; s++) {
            for (int64_t j = 0; j < L.J; j++) {
                vi pv = vi{};
                const float* xb = operand<PERM>(sw[s], xoff, L, lv, j, pv);
                csweep<R, NK, PERM>(acc, xb, L.xs, sw[s].w + j * L.LP + lv * VL, L.ws, pv);
            }
        }
#pragma GCC unroll 32
        for (int i = 0; i < R; i++) store(out + i * ostep + lv * VL, acc[i]);
    }
}

// The ns sweeps' (all of NK taps) accumulators += their source columns x the R dy
// pixels (dys floats apart), for every lane vector.
template <int R, int NK, bool PERM>
void wgrad_tile(const Sweep* sw, int ns, int64_t xoff, const Lanes& Lr, const float* dy,
                int64_t dys, bool, const Prefetch& pf) {
    const Lanes L = Lr;
    for (int64_t lv = 0; lv < L.nlv; lv++) {
        pf.issue(lv);
        vf dyv[R];
#pragma GCC unroll 32
        for (int i = 0; i < R; i++) dyv[i] = load(dy + i * dys + lv * VL);
        for (int s = 0; s < ns; s++) {
            for (int64_t j = 0; j < L.J; j++) {
                vi pv = vi{};
                const float* xb = operand<PERM>(sw[s], xoff, L, lv, j, pv);
                wsweep<R, NK, PERM>(dyv, xb, L.xs, sw[s].w + j * L.LP + lv * VL, L.ws, pv);
            }
        }
    }
}

typedef void (*corr_tile_fn)(const Sweep*, int, int64_t, const Lanes&, float*, int64_t, bool,
                             const Prefetch&);
typedef void (*wgrad_tile_fn)(const Sweep*, int, int64_t, const Lanes&, const float*, int64_t,
                              bool, const Prefetch&);

// Tables [r - 1][nk - 1] of the tiles that fit in registers (null elsewhere).
template <bool PERM, int K>
constexpr corr_tile_fn corr_pick() {
    constexpr int R = K / GR_NKMAX + 1, NK = K % GR_NKMAX + 1;
    if constexpr (NK <= nk_fits(R, PERM)) return &corr_tile<R, NK, PERM>;
    else return nullptr;
}

template <bool PERM, int K>
constexpr wgrad_tile_fn wgrad_pick() {
    constexpr int R = K / GR_NKMAX + 1, NK = K % GR_NKMAX + 1;
    if constexpr (NK <= nk_fits(R, PERM)) return &wgrad_tile<R, NK, PERM>;
    else return nullptr;
}

template <bool PERM, int... K>
constexpr std::array<corr_tile_fn, sizeof...(K)> corr_tiles(std::integer_sequence<int, K...>) {
    return {corr_pick<PERM, K>()...};
}

template <bool PERM, int... K>
constexpr std::array<wgrad_tile_fn, sizeof...(K)> wgrad_tiles(
    std::integer_sequence<int, K...>) {
    return {wgrad_pick<PERM, K>()...};
}

constexpr int GR_TILES = GR_RMAX * GR_NKMAX;

const corr_tile_fn* corr_tile_table(bool perm) {
    static const auto plain = corr_tiles<false>(std::make_integer_sequence<int, GR_TILES>{});
    static const auto permuted = corr_tiles<true>(std::make_integer_sequence<int, GR_TILES>{});
    return perm ? permuted.data() : plain.data();
}

const wgrad_tile_fn* wgrad_tile_table(bool perm) {
    static const auto plain = wgrad_tiles<false>(std::make_integer_sequence<int, GR_TILES>{});
    static const auto permuted = wgrad_tiles<true>(std::make_integer_sequence<int, GR_TILES>{});
    return perm ? permuted.data() : plain.data();
}

}  // namespace

extern "C" {

// One grouped problem (grouped.py: _Problem, same field order).  Lines of the output
// (corr: y or dx; wgrad: dy) are numbered (n * Lout[0] + od) * Lout[1] + oh.  A line
// belongs to the class (od % os[0]) * os[1] + oh % os[1] (the data gradient's stride
// phases in d and h; one class otherwise); a class has w-phases (output pixels
// u = q * os[2] + rw, q < Uq), each with sweep groups (taps of one kernel row whose
// source offsets are P * is[2] apart) and segments of q on which the same taps of
// every group read the source.
struct GroupedProblem {
    Tensor src;                // the operand read in lane order: x (fwd, wgrad), dy (dgrad)
    Tensor dy;                 // wgrad: dy (lanes = its channels)
    void* out;                 // corr: the result (float32, float16 or bfloat16)
    int64_t ostride[5];        // its strides, n, d, h, w, c (elements)
    int64_t out_dtype;
    int64_t N, Lin[3], Lout[3];
    int64_t Cin;               // source channels
    int64_t lanes, J;          // lanes (output channels of the op), source channels per lane
    int64_t nlv;               // vectors of lanes (LP = nlv * VL)
    int64_t perm;              // operands: 0 plain, 1 one permuted window per (lv, j)
    int64_t packed;            // source lines converted into scratch (else read in place)
    int64_t expand;            // packed lines expanded to [w][j][LP] (gidx)
    int64_t ps;                // floats per pixel of a packed source line
    int64_t dy_packed;         // wgrad: dy lines converted into scratch
    const int32_t* wstart;     // [nlv][J] (perm)
    const int32_t* perm_idx;   // [nlv][J][VL] (perm)
    const int32_t* gidx;       // [J][LP] source channel of (j, lane), -1: zero (expand)
    int64_t is[3], os[3];
    int64_t P, R;
    const int64_t* classes;    // per class: first and end w-phase
    const int64_t* wph;        // per w-phase: rw, Uq, first and end group, first and end segment
    const int64_t* grp;        // per group: off_d, off_h, off_w, nk, first entry
    const int64_t* seg;        // per segment: a, e, index into segk
    const int64_t* segk;       // per (segment, group of its w-phase): k0, k1
    const float* W;            // corr: weights [entry][J][LP]
    int64_t nchunks;           // pieces of the output w range
    const int64_t* chunks;     // per chunk: u0, u1 (output w), i0, i1 (source w window)
    int64_t cache_lines;       // packed source lines kept per thread
    int64_t stream;            // corr: a float32 channels-last result in recycled memory
                               // (_results.streams): line pieces go out whole at the end
                               // of their item, with streaming stores
};

int64_t cg_grouped_rmax(void) { return GR_RMAX; }
// Debug switches (cg_grouped_dbg) for A/B measurements, 0 in use.  Bits: 0 no tiles; 1 no
// result stores; 2 no tile prefetch; 3 no tile stores (line pieces at the end); 4 no
// prefetch of packed sources; 5 no streamed line pieces (and no write prefetch in the
// flat planes); 6 no prefetch of channels-last packed sources; 7 pixels of 8 lanes (less
// than a vector) stored by a copy call each; 8 pixels of 8 lanes never streamed; 9 16-bit
// results never streamed.
int64_t cg_dbg = 0, cg_pf_hint = 3, cg_pf_dist = 1;
void cg_grouped_pf(int64_t hint, int64_t dist) { cg_pf_hint = hint; cg_pf_dist = dist; }
void cg_grouped_dbg(int64_t v) { cg_dbg = v; }
int64_t cg_grouped_nkmax(void) { return GR_NKMAX; }
int64_t cg_grouped_regs(void) { return GR_REGS; }

// Floats of per-thread scratch a run needs.
int64_t cg_grouped_scratch(const GroupedProblem* P, int64_t wgrad);

// Items [lo, hi): item = chunk * lines + line.
void cg_grouped_corr_run(const GroupedProblem* P, int64_t lo, int64_t hi, float* scratch);
void cg_grouped_wgrad_run(const GroupedProblem* P, int64_t lo, int64_t hi, float* partial,
                          float* scratch);

}  // extern "C"

namespace {

inline int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

int64_t window_max(const GroupedProblem* P) {
    int64_t m = 0;
    for (int64_t c = 0; c < P->nchunks; c++)
        m = std::max(m, P->chunks[4 * c + 3] - P->chunks[4 * c + 2]);
    return m;
}

int64_t out_max(const GroupedProblem* P) {
    int64_t m = 0;
    for (int64_t c = 0; c < P->nchunks; c++)
        m = std::max(m, P->chunks[4 * c + 1] - P->chunks[4 * c]);
    return m;
}

// Packed source lines, least recently used replaced; keys (n * Lin0 + d) * Lin1 + h.
struct LineCache {
    float* base = nullptr;
    int64_t slot = 0;
    int cap = 0;
    int64_t chunk = -1;
    int64_t clock = 0;
    std::vector<int64_t> keys, used;

    void reset(float* b, int64_t floats_per_line, int lines) {
        base = b, slot = floats_per_line, cap = lines;
        keys.assign(cap, -1);
        used.assign(cap, 0);
        chunk = -1;
    }
    // The slot of key, and whether it must be filled.
    float* get(int64_t key, bool& fill) {
        int victim = 0;
        for (int i = 0; i < cap; i++) {
            if (keys[i] == key) {
                used[i] = ++clock;
                fill = false;
                return base + i * slot;
            }
            if (used[i] < used[victim]) victim = i;
        }
        keys[victim] = key;
        used[victim] = ++clock;
        fill = true;
        return base + victim * slot;
    }
};

#if CG_VL >= 8
// W pixels of C <= 4 vectors of channels (pixels rstride elements apart, unit channel
// stride, element type DT) expanded to [j][LP] rows through gidx (n_ floats a pixel,
// ps apart in dst): every expanded vector is two two-source shuffles of the pixel's
// vectors (vpermps / vpermt2ps), one select and a mask, against a scalar gather per
// float (the spec layer's 5 -> 2 groups: 40 floats a pixel, 1.4 ms of its 7).  16-bit
// pixels are widened as they are loaded (no converted copy of the line first).
template <int64_t DT>
void expand_pixels(const typename Elem<DT>::T* rows, int64_t rstride, int64_t W, int64_t C,
                   const int32_t* g, int64_t n_, float* dst, int64_t ps) {
    typedef int32_t vi __attribute__((vector_size(VL * 4)));
    const int64_t nsv = (C + VL - 1) / VL, nov = n_ / VL;
    vi m[64], upper[64], keep[64];
    for (int64_t v = 0; v < nov; v++)
        for (int l = 0; l < VL; l++) {
            const int32_t gk = g[v * VL + l];
            m[v][l] = gk >= 0 ? gk % (2 * VL) : 0;
            upper[v][l] = gk >= 2 * VL ? -1 : 0;
            keep[v][l] = gk >= 0 ? -1 : 0;
        }
    for (int64_t w = 0; w < W; w++) {
        const typename Elem<DT>::T* r = rows + w * rstride;
        float* o = dst + w * ps;
        vf src[4] = {zero(), zero(), zero(), zero()};
        for (int64_t i = 0; i < nsv; i++)
            src[i] = (i + 1) * VL <= C ? load_as<DT>(r + i * VL)
                                       : load_as_n<DT>(r + i * VL, (int)(C - i * VL));
        for (int64_t v = 0; v < nov; v++) {
            vf a = __builtin_shuffle(src[0], src[1], m[v]);
            if (nsv > 2) a = upper[v] ? __builtin_shuffle(src[2], src[3], m[v]) : a;
            store(o + v * VL, (vf)((vi)a & keep[v]));
        }
    }
}
#endif

// Copy the window [i0, i1) of source line (n, d, h) into dst as float32 lane-ready
// rows of ps floats: converted (dtype, channels-first layouts), zero-padded to ps
// channels, or expanded to [j][LP] through gidx.
void pack_source(const GroupedProblem* P, float* dst, float* tmp, int64_t n, int64_t d,
                 int64_t h, int64_t i0, int64_t i1) {
    const int64_t W = i1 - i0, C = P->Cin, ps = P->ps;
    Tensor t = P->src;
    t.ptr = at(P->src, 0, 0, 0, i0, 0);
    static thread_local std::vector<int64_t> d1(1), h1(1);
    d1[0] = d, h1[0] = h;
    if (!P->expand && ps == C) {
        pack_lines(dst, t, n, d1, h1, W, C);
        return;
    }
    const int64_t n_ = P->J * P->nlv * VL;
    const int32_t* g = P->gidx;
#if CG_VL >= 8
    const bool shuffles = P->expand && (C + VL - 1) / VL <= 4 && n_ / VL <= 64;
    if (shuffles && t.stride[4] == 1) {
        // channels last, any dtype: expanded straight from the caller's pixels
        const void* r = at(t, n, d, h, 0, 0);
        if (t.dtype == F16)
            expand_pixels<F16>((const uint16_t*)r, t.stride[3], W, C, g, n_, dst, ps);
        else if (t.dtype == BF16)
            expand_pixels<BF16>((const uint16_t*)r, t.stride[3], W, C, g, n_, dst, ps);
        else
            expand_pixels<F32>((const float*)r, t.stride[3], W, C, g, n_, dst, ps);
        return;
    }
#endif
    const float* rows;
    int64_t rstride;
    if (direct_f32(P->src)) {
        rows = (const float*)at(t, n, d, h, 0, 0);
        rstride = t.stride[3];
    } else {
        pack_lines(tmp, t, n, d1, h1, W, C);
        rows = tmp;
        rstride = C;
    }
    if (!P->expand) {
        for (int64_t w = 0; w < W; w++) {
            float* o = dst + w * ps;
            std::memcpy(o, rows + w * rstride, C * sizeof(float));
            std::memset(o + C, 0, (ps - C) * sizeof(float));
        }
        return;
    }
#if CG_VL >= 8
    if (shuffles) {
        expand_pixels<F32>(rows, rstride, W, C, g, n_, dst, ps);
        return;
    }
#endif
    for (int64_t w = 0; w < W; w++) {
        const float* r = rows + w * rstride;
        float* o = dst + w * ps;
        for (int64_t k = 0; k < n_; k++) o[k] = g[k] >= 0 ? r[g[k]] : 0.0f;
    }
}

// Store buf ([u][LP] floats, lanes valid) as npix output pixels starting at dst:
// pixels pstride elements apart, channels cstride apart, in dtype.
void store_pixels(char* dst, int64_t dtype, int64_t pstride, int64_t cstride, const float* buf,
                  int64_t npix, int64_t lanes, int64_t LP) {
    const int64_t es = dtype == F32 ? 4 : 2;
    if (cstride == 1) {
        if (pstride == lanes && LP == lanes) {
            store_run(dst, dtype, 1, buf, npix * lanes);
            return;
        }
        for (int64_t u = 0; u < npix; u++)
            store_run(dst + es * u * pstride, dtype, 1, buf + u * LP, lanes);
        return;
    }
    // channels first: blocks of 8 lanes x 64 pixels transposed 8 x 8
    for (int64_t c0 = 0; c0 < lanes; c0 += 8) {
        for (int64_t u0 = 0; u0 < npix; u0 += 64) {
            const float* s = buf + u0 * LP + c0;
            store_channel_runs(dst + es * (c0 * cstride + u0 * pstride), dtype, pstride,
                                 cstride, [&](int64_t u) { return s + u * LP; },
                                 std::min<int64_t>(64, npix - u0),
                                 std::min<int64_t>(8, lanes - c0));
        }
    }
}

#if CG_VL == 16
// stream_run for pixels of 8 lanes in buffer rows of VL = 16 floats: the 8 floats of n
// pixels to dst, back to back; pairs of pixels as one vector with streaming stores (the
// first pixel plainly where dst starts half a cache line in).
void stream_half_pixels(float* dst, const float* src, int64_t n) {
    int64_t u = 0;
    if (n > 0 && ((uintptr_t)dst & 63)) {
        *reinterpret_cast<v8u*>(dst) = *reinterpret_cast<const v8u*>(src);
        u = 1;
    }
    for (; u + 2 <= n; u += 2) {
        const v8 a = *reinterpret_cast<const v8u*>(src + u * VL);
        const v8 b = *reinterpret_cast<const v8u*>(src + (u + 1) * VL);
        stream_store(dst + u * 8, __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                                                          10, 11, 12, 13, 14, 15));
    }
    if (u < n) *reinterpret_cast<v8u*>(dst + u * 8) = *reinterpret_cast<const v8u*>(src + u * VL);
}
#endif

// The state of one run over a range of items.
struct Runner {
    const GroupedProblem* P;
    bool wgrad;
    Lanes L;
    LineCache cache;
    float* tmp;       // one converted source window (pack_source)
    float* obuf;      // corr: one output line piece [u][LP]; wgrad: one packed dy piece
    float* dytmp;     // wgrad: one converted dy piece before its lanes are padded
    int64_t LP, pix;  // source floats per pixel (packed or in place)
    std::vector<Sweep> sweeps;
    std::vector<size_t> runs;
    std::vector<const float*> rowptr;
    // Software prefetch: the cache lines of the source rows (and dy row) the next
    // item reads and this one does not, issued a few after every tile, so that the
    // next line's data streams in while this line computes (the hardware
    // prefetchers see one short strided stream per pixel and fall behind).
    std::vector<const char*> rows_now, rows_next, pf;
    const char* dy_next = nullptr;
    bool tile_store = false;
    // packed (converted) sources are prefetched too: channels-first lines, and
    // channels-last 16-bit or expanded ones (their conversion read them cold: ResNeXt's
    // bfloat16 weight gradient 2.88 -> 2.71 ms after the pause; grouped dbg bit 64:
    // channels-last ones not prefetched)
    bool pf_packed = false;
    size_t pf_pos = 0, pf_per_tile = 8;
    int64_t tiles_last = 1, tiles_now = 0;
    const Prefetch none_{};

    Runner(const GroupedProblem* P_, bool wg, float* scratch) : P(P_), wgrad(wg) {
        LP = P->nlv * VL;
        const int64_t win = window_max(P), outw = out_max(P);
        float* s = scratch;
        if (P->packed) {
            cache.reset(s, win * P->ps, (int)P->cache_lines);
            s += P->cache_lines * win * P->ps;
            tmp = s;
            s += win * P->Cin + VL;
        } else {
            tmp = nullptr;
        }
        obuf = s;
        s += outw * LP;
        dytmp = s;
        pix = P->packed ? P->ps : P->src.stride[3];
        tile_store = !wgrad && P->ostride[4] == 1 && !(cg_dbg & 8) && !streams();
        pf_packed = P->packed && !(cg_dbg & 16) &&
                    ((P->src.stride[3] == 1 && P->src.stride[4] > 1) ||
                     (P->src.stride[4] == 1 && !(cg_dbg & 64)));
        L.nlv = P->nlv;
        L.J = P->J;
        L.LP = LP;
        L.xj = P->expand ? LP : 0;
        L.xs = P->P * P->is[2] * pix;
        L.ws = P->J * LP;
        L.wstart = P->wstart;
        L.perm = P->perm_idx;
    }

    // Whether results go out a line piece at a time with streaming stores: channels
    // last, pixels of whole lane vectors (or of 8 lanes, half an AVX-512 vector) back to
    // back (one run per piece), float32 or 16-bit (converted).
    bool streams() const {
        return !wgrad && P->stream && (P->out_dtype == F32 || !(cg_dbg & 512)) &&
               P->ostride[4] == 1 && P->ostride[3] == P->lanes &&
               (P->nlv * VL == P->lanes || half_pixels()) && !(cg_dbg & 32);
    }

    // A line piece of n pixels from the buffer to line_dst with streaming stores (the
    // ends plainly): float32 as it is (pairs of 8-lane pixels joined), 16-bit converted
    // (8-lane pixels first packed together in the buffer).
    void stream_piece(char* line_dst, int64_t n) {
        if (P->out_dtype == F32) {
#if CG_VL == 16
            if (LP != P->lanes) return stream_half_pixels((float*)line_dst, obuf, n);
#endif
            stream_run((float*)line_dst, obuf, n * LP);
            return;
        }
        if (LP != P->lanes)
            for (int64_t u = 1; u < n; u++)   // (moving down: no pixel overwrites a later one)
                *reinterpret_cast<v8u*>(obuf + u * 8) = *reinterpret_cast<const v8u*>(obuf + u * LP);
        store_run_streamed_lines(line_dst, P->out_dtype, obuf, n * P->lanes);
    }

    // Pixels of 8 lanes in buffer rows of one AVX-512 vector (the spec layer's data
    // gradient), streamed in pairs (stream_half_pixels).
    bool half_pixels() const {
        return VL == 16 && P->nlv == 1 && P->lanes == 8 && !(cg_dbg & 256);
    }

    // The source row (n, d, h) at source w index i0 of the chunk's window.
    const float* source_row(int64_t n, int64_t d, int64_t h, int64_t chunk, int64_t i0,
                            int64_t i1) {
        if (!P->packed) return (const float*)at(P->src, n, d, h, i0, 0);
        if (cache.chunk != chunk) {
            cache.reset(cache.base, cache.slot, cache.cap);
            cache.chunk = chunk;
        }
        bool fill;
        float* row = cache.get((n * P->Lin[0] + d) * P->Lin[1] + h, fill);
        if (fill) pack_source(P, row, tmp, n, d, h, i0, i1);
        return row;
    }

    // dy pixels [u0, u1) of line (n, od, oh) as float32 rows of LP lanes.
    const float* pack_dy(int64_t n, int64_t od, int64_t oh, int64_t u0, int64_t u1) {
        Tensor t = P->dy;
        t.ptr = at(P->dy, 0, 0, 0, u0, 0);
        static thread_local std::vector<int64_t> d1(1), h1(1);
        d1[0] = od, h1[0] = oh;
        const int64_t O = P->lanes, W = u1 - u0;
        if (LP == O) {
            pack_lines(obuf, t, n, d1, h1, W, O);
            return obuf;
        }
        pack_lines(dytmp, t, n, d1, h1, W, O);
        for (int64_t u = 0; u < W; u++) {
            std::memcpy(obuf + u * LP, dytmp + u * O, O * sizeof(float));
            std::memset(obuf + u * LP + O, 0, (LP - O) * sizeof(float));
        }
        return obuf;
    }

    // Start addresses of the in-place rows (source window, and dy for wgrad) item it reads.
    void item_rows(int64_t it, std::vector<const char*>& out) {
        out.clear();
        const int64_t nlines = P->N * P->Lout[0] * P->Lout[1];
        const int64_t chunk = it / nlines, l = it % nlines;
        const int64_t* ch = P->chunks + 4 * chunk;
        const int64_t n = l / (P->Lout[0] * P->Lout[1]);
        const int64_t od = (l / P->Lout[1]) % P->Lout[0], oh = l % P->Lout[1];
        const int64_t cls = (od % P->os[0]) * P->os[1] + oh % P->os[1];
        const int64_t qd = od / P->os[0], qh = oh / P->os[1];
        if (!P->packed || pf_packed)
            for (int64_t wp = P->classes[2 * cls]; wp < P->classes[2 * cls + 1]; wp++)
                for (int64_t g = P->wph[6 * wp + 2]; g < P->wph[6 * wp + 3]; g++) {
                    const int64_t* gr = P->grp + 5 * g;
                    const int64_t d = qd * P->is[0] + gr[0], h = qh * P->is[1] + gr[1];
                    if (d >= 0 && d < P->Lin[0] && h >= 0 && h < P->Lin[1])
                        out.push_back(at(P->src, n, d, h, ch[2], 0));
                }
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
        const bool dy_first = !(cg_dbg & 16) &&
                              ((P->dy.stride[3] == 1 && P->dy.stride[4] > 1) ||
                               (P->dy.stride[4] == 1 && !(cg_dbg & 64)));
        dy_next = wgrad && (!P->dy_packed || dy_first) ? at(P->dy, n, od, oh, ch[0], 0) : nullptr;
    }

    // Queue the cache lines of npx pixels of chans channels from r.
    void queue_row(const char* r, const Tensor& t, int64_t npx, int64_t chans) {
        const int64_t es = itemsize(t.dtype);
        const int64_t pst = t.stride[3] * es, cb = chans * es;
        if (t.stride[3] == 1 && t.stride[4] > 1) {
            // channels first: a run of npx pixels per channel, a channel stride apart
            // (runs in as many places as channels: no hardware prefetcher follows them)
            const int64_t run = npx * es, cst = t.stride[4] * es;
            for (int64_t c = 0; c < chans; c++) {
                const char* rc = r + c * cst;
                for (int64_t b = 0; b < run; b += 64) pf.push_back(rc + b);
                if (((uintptr_t)rc & 63) + run > ((run + 63) & ~(int64_t)63))
                    pf.push_back(rc + run - 1);
            }
        } else if (pst == cb) {
            for (int64_t b = 0; b < npx * cb; b += 64) pf.push_back(r + b);
        } else {
            for (int64_t w = 0; w < npx; w++)
                for (int64_t b = 0; b < cb; b += 64) pf.push_back(r + w * pst + b);
        }
    }

    // Queue the lines of item it's rows that the current item does not read.
    void plan_prefetch(int64_t it, int64_t lo, int64_t hi) {
        for (; pf_pos < pf.size(); pf_pos++) __builtin_prefetch(pf[pf_pos], 0, 1);
        pf.clear();
        pf_pos = 0;
        const int64_t nx = it + cg_pf_dist;
        if (nx >= hi || (P->packed && !pf_packed)) { item_rows(std::min(it + 1, hi - 1), rows_next); return; }
        (void)lo;
        item_rows(nx - 1, rows_now);
        item_rows(nx, rows_next);
        const int64_t nlines = P->N * P->Lout[0] * P->Lout[1];
        const int64_t* ch = P->chunks + 4 * (nx / nlines);
        for (const char* r : rows_next)
            if (std::find(rows_now.begin(), rows_now.end(), r) == rows_now.end())
                queue_row(r, P->src, ch[3] - ch[2], P->Cin);
        if (dy_next) queue_row(dy_next, P->dy, ch[1] - ch[0], P->lanes);
        pf_per_tile = (pf.size() + tiles_last - 1) / std::max<int64_t>(1, tiles_last);
    }

    // Channels-last results are stored a tile at a time, as soon as they are summed
    // (the stores then interleave with the tiles, instead of a burst per line): pixels
    // u, u + step, ... (r of them, relative to the line piece's first pixel).
    void put_pixels(char* line_dst, int64_t u, int64_t r, int64_t step) {
        if (!tile_store || (cg_dbg & 2)) return;
        const int64_t es = P->out_dtype == F32 ? 4 : 2, ps = P->ostride[3];
        if (step == 1 && ps == P->lanes && LP == P->lanes) {
            store_run(line_dst + es * u * ps, P->out_dtype, 1, obuf + u * LP, r * LP);
            return;
        }
        if (P->out_dtype == F32 && P->lanes % VL == 0) {
            // whole vectors a pixel (a library call per pixel of 8 floats cost the
            // spec layer's data gradient 15% of its time)
            for (int64_t i = 0; i < r; i++) {
                float* d = (float*)line_dst + (u + i * step) * ps;
                const float* s = obuf + (u + i * step) * LP;
                for (int64_t v = 0; v < P->lanes; v += VL) store(d + v, load(s + v));
            }
            return;
        }
        if (P->out_dtype == F32 && P->lanes % 8 == 0 && !(cg_dbg & 128)) {
            // whole 8-float vectors a pixel: the same where the lanes are not whole
            // vectors of the build (the spec layer's 8 channels on AVX-512)
            for (int64_t i = 0; i < r; i++) {
                float* d = (float*)line_dst + (u + i * step) * ps;
                const float* s = obuf + (u + i * step) * LP;
                for (int64_t v = 0; v < P->lanes; v += 8)
                    *reinterpret_cast<v8u*>(d + v) = *reinterpret_cast<const v8u*>(s + v);
            }
            return;
        }
        for (int64_t i = 0; i < r; i++)
            store_run(line_dst + es * (u + i * step) * ps, P->out_dtype, 1,
                      obuf + (u + i * step) * LP, P->lanes);
    }

    // The next slice of the queue for one tile call.
    Prefetch prefetch_slice() {
        tiles_now++;
        Prefetch p;
        if (cg_dbg & 4) return p;
        const size_t end = std::min(pf.size(), pf_pos + pf_per_tile);
        p.q = pf.data() + pf_pos;
        p.n = (int64_t)(end - pf_pos);
        p.per = (p.n + P->nlv - 1) / P->nlv;
        pf_pos = end;
        return p;
    }

    void run(int64_t lo, int64_t hi, float* partial) {
        const int64_t nlines = P->N * P->Lout[0] * P->Lout[1];
        const int64_t pdist = P->P, R = P->R;
        const corr_tile_fn* ctab = corr_tile_table(P->perm != 0);
        const wgrad_tile_fn* wtab = wgrad_tile_table(P->perm != 0);
        const int64_t ostep_px = P->os[2];    // output pixels per phase-local step
        for (int64_t it = lo; it < hi; it++) {
            const int64_t chunk = it / nlines, l = it % nlines;
            const int64_t* ch = P->chunks + 4 * chunk;
            const int64_t u0 = ch[0], u1 = ch[1], i0 = ch[2], i1 = ch[3];
            const int64_t n = l / (P->Lout[0] * P->Lout[1]);
            const int64_t od = (l / P->Lout[1]) % P->Lout[0], oh = l % P->Lout[1];
            const int64_t cls = (od % P->os[0]) * P->os[1] + oh % P->os[1];
            const int64_t qd = od / P->os[0], qh = oh / P->os[1];
            char* const line_dst = wgrad ? nullptr : (char*)P->out + (P->out_dtype == F32 ? 4 : 2) *
                (n * P->ostride[0] + od * P->ostride[1] + oh * P->ostride[2] + u0 * P->ostride[3]);
            if (it == lo) item_rows(it, rows_now);
            tiles_last = std::max<int64_t>(1, tiles_now);
            tiles_now = 0;
            plan_prefetch(it, lo, hi);
            // wgrad: this line's dy pixels [u0, u1)
            const float* dyrow = nullptr;
            int64_t dypix = 0;
            if (wgrad && P->dy_packed) {
                dyrow = pack_dy(n, od, oh, u0, u1);
                dypix = LP;
            } else if (wgrad) {
                dyrow = (const float*)at(P->dy, n, od, oh, u0, 0);
                dypix = P->dy.stride[3];
            }
            for (int64_t wp = P->classes[2 * cls]; wp < P->classes[2 * cls + 1]; wp++) {
                const int64_t* ph = P->wph + 6 * wp;
                const int64_t rw = ph[0], Uq = ph[1], g0 = ph[2], g1 = ph[3];
                // the phase's pixels q with u = q * os + rw in [u0, u1)
                const int64_t qa = std::max<int64_t>(0, ceil_div(u0 - rw, ostep_px));
                const int64_t qb = std::min<int64_t>(Uq, ceil_div(u1 - rw, ostep_px));
                if (qb <= qa) continue;
                rowptr.assign(g1 - g0, nullptr);
                for (int64_t g = g0; g < g1; g++) {
                    const int64_t* gr = P->grp + 5 * g;
                    const int64_t d = qd * P->is[0] + gr[0], h = qh * P->is[1] + gr[1];
                    if (d < 0 || d >= P->Lin[0] || h < 0 || h >= P->Lin[1]) continue;
                    rowptr[g - g0] = source_row(n, d, h, chunk, i0, i1);
                }
                for (int64_t sg = ph[4]; sg < ph[5]; sg++) {
                    const int64_t* se = P->seg + 3 * sg;
                    const int64_t a = std::max(se[0], qa), e = std::min(se[1], qb);
                    if (e <= a) continue;
                    const int64_t* sk = P->segk + se[2];
                    sweeps.clear();
                    for (int64_t g = g0; g < g1; g++) {
                        const int64_t k0 = sk[2 * (g - g0)], k1 = sk[2 * (g - g0) + 1];
                        if (k1 <= k0 || !rowptr[g - g0]) continue;
                        const int64_t* gr = P->grp + 5 * g;
                        // source w of (q = 0, tap k0), relative to the window
                        const int64_t w0 = gr[2] + k0 * pdist * P->is[2] - i0;
                        float* wt = wgrad ? partial : const_cast<float*>(P->W);
                        sweeps.push_back(Sweep{rowptr[g - g0] + w0 * pix,
                                               wt + (gr[4] + k0) * P->J * LP, k1 - k0});
                    }
                    if (sweeps.empty()) {
                        if (!wgrad)
                            for (int64_t q = a; q < e; q++) {
                                std::memset(obuf + (q * ostep_px + rw - u0) * LP, 0,
                                            LP * sizeof(float));
                                put_pixels(line_dst, q * ostep_px + rw - u0, 1, 1);
                            }
                        continue;
                    }
                    // sweeps of equal tap counts run in one tile call each
                    // (a stable insertion sort: a few sweeps, and std::stable_sort's
                    // temporary buffer cost an allocation per segment)
                    for (size_t i = 1; i < sweeps.size(); i++)
                        for (size_t j = i; j > 0 && sweeps[j].nk < sweeps[j - 1].nk; j--)
                            std::swap(sweeps[j], sweeps[j - 1]);
                    runs.clear();
                    for (size_t s = 0; s < sweeps.size(); s++)
                        if (s == 0 || sweeps[s].nk != sweeps[s - 1].nk) runs.push_back(s);
                    runs.push_back(sweeps.size());
                    // one pass per residue class of q mod pdist present in [a, e): its
                    // first pixel qs (at most e - a passes, however large pdist is -- a
                    // huge dilation must not cost a loop of pdist empty passes)
                    for (int64_t qs = a; qs < std::min(e, a + pdist); qs++) {
                        // pixels q = qs + i * pdist in [a, e)
                        const int64_t npx = (e - qs + pdist - 1) / pdist;
                        const int64_t ntiles = (npx + R - 1) / R;
                        int64_t q = qs;
                        for (int64_t tile = 0; tile < ntiles; tile++) {
                            const int r = (int)(npx / ntiles + (tile < npx % ntiles ? 1 : 0));
                            const int64_t xoff = q * P->is[2] * pix;
                            const Prefetch pft = prefetch_slice();
                            for (size_t k = 0; k + 1 < runs.size() && !(cg_dbg & 1); k++) {
                                const Sweep* sv = sweeps.data() + runs[k];
                                const int ns = (int)(runs[k + 1] - runs[k]);
                                const int idx = (r - 1) * GR_NKMAX + (int)sv->nk - 1;
                                // (by reference: a copy of the slice just stored, made
                                // for each call, waited on its stores -- the spec
                                // layer's data gradient 1.02-1.04x)
                                const Prefetch& pk = k == 0 ? pft : none_;
                                if (wgrad) {
                                    wtab[idx](sv, ns, xoff, L,
                                              dyrow + (q * ostep_px + rw - u0) * dypix,
                                              pdist * dypix, false, pk);
                                } else {
                                    ctab[idx](sv, ns, xoff, L,
                                              obuf + (q * ostep_px + rw - u0) * LP,
                                              pdist * ostep_px * LP, k > 0, pk);
                                }
                            }
                            if (!wgrad) put_pixels(line_dst, q * ostep_px + rw - u0, r, pdist * ostep_px);
                            q += r * pdist;
                        }
                    }
                }
            }
            if (!wgrad && streams() && !(cg_dbg & 2))
                stream_piece(line_dst, u1 - u0);
            else if (!wgrad && !tile_store && !(cg_dbg & 2))
                store_pixels(line_dst, P->out_dtype, P->ostride[3], P->ostride[4], obuf, u1 - u0,
                             P->lanes, LP);
        }
    }
};

}  // namespace

int64_t cg_grouped_scratch(const GroupedProblem* P, int64_t wgrad) {
    const int64_t LP = P->nlv * VL, win = window_max(P), outw = out_max(P);
    int64_t need = 0;
    if (P->packed) need += P->cache_lines * win * P->ps + win * P->Cin + VL;
    if (!wgrad) need += outw * LP;
    else if (P->dy_packed) need += outw * LP + outw * P->lanes;
    return need + 16;
}

void cg_grouped_corr_run(const GroupedProblem* P, int64_t lo, int64_t hi, float* scratch) {
    Runner r(P, false, scratch);
    r.run(lo, hi, nullptr);
    if (r.streams()) stream_fence();
}

void cg_grouped_wgrad_run(const GroupedProblem* P, int64_t lo, int64_t hi, float* partial,
                          float* scratch) {
    Runner r(P, true, scratch);
    r.run(lo, hi, partial);
}

// ---------------------------------------------------------------------------------------
// Depthwise weight gradient, streaming.
//
// dw[t][c] = sum_p x[p*s + t*d - pb][c] * dy[p][c] for depthwise layers (one channel
// per group, multiplier 1) whose x and dy are float32 with unit channel stride, read
// in place.  The work is all memory traffic (9 multiply-adds per 8 bytes read for a
// 3x3 layer), so the loop order serves the memory: one dy line at a time, and for
// each of its (kd, kh) x rows, blocks of pixels x a cache line of channels with the
// taps' sums in registers (dw_blocks).  While a line computes, the lines of the next
// one are prefetched from memory in order (a few cache lines per block).  MobileNetV2's
// stride-2 layer (48 MB read): the first version (one pass along the line per lane
// vector) 7.2 -> 4.5 ms on one thread, 6.7 -> 5.1 ms (medians) on two from cold caches,
// against the tile kernel (Runner); the blocks 1.1-1.2x faster than those passes.

extern "C" {

// grouped.py: _DwWgrad, same field order.
struct DwWgradProblem {
    Tensor x, dy;              // n, d, h, w, c: float32, unit channel stride
    int64_t N, L[3], M[3], C;
    int64_t K[3], s[3], d[3], pb[3];
};

// dy lines [lo, hi) (numbered (n * M0 + od) * M1 + oh) added into partial [tap][LP]
// (LP: C rounded up to whole vectors).
void cg_dw_wgrad_run(const DwWgradProblem* P, int64_t lo, int64_t hi, float* partial);

}  // extern "C"

namespace {

// Byte ranges prefetched into the caches a few cache lines at a time.
struct Streamer {
    const char* at_[16];
    const char* end_[16];
    int n = 0, i = 0, per = 1;
    void clear() { n = i = 0; }
    void add(const char* p, int64_t bytes) {
        if (n < 16 && bytes > 0) at_[n] = p, end_[n++] = p + bytes;
    }
    int64_t lines() const {
        int64_t k = 0;
        for (int j = 0; j < n; j++) k += (end_[j] - at_[j] + 63) / 64;
        return k;
    }
    CG_INLINE void step() {
        for (int k = 0; k < per && i < n; k++) {
            __builtin_prefetch(at_[i], 0, 2);     // into L2
            at_[i] += 64;
            if (at_[i] >= end_[i]) i++;
        }
    }
};

template <bool TAIL, int64_t DT = F32>
CG_INLINE vf lane_load(const typename Elem<DT>::T* p, int nl) {
    return TAIL ? load_as_n<DT>(p, nl) : load_as<DT>(p);
}

// Pixel blocks: R output pixels u0.. x NV lane vectors (a whole cache line of
// channels when NV * VL * 4 = 64 bytes), the KW taps' sums kept in registers over the
// block and added into acc once; every x and dy pixel of the block is read whole
// within a few dozen cycles (the lane-vector passes above came back to each cache
// line of a row once per vector, from L2: 1.1-1.2x).
template <int R, int KW, int NV, bool TAIL, int64_t DT>
CG_INLINE void dw_block(const typename Elem<DT>::T* xp, int64_t xst, int64_t kst,
                        const typename Elem<DT>::T* yp, int64_t ypix, int64_t c, float* acc,
                        int64_t LP, int nl) {
    vf s[KW][NV];
#pragma GCC unroll 8
    for (int k = 0; k < KW; k++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) s[k][v] = zero();
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        vf dv[NV];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) dv[v] = lane_load<TAIL, DT>(yp + i * ypix + c + v * VL, nl);
#pragma GCC unroll 8
        for (int k = 0; k < KW; k++)
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++)
                s[k][v] += lane_load<TAIL, DT>(xp + i * xst + k * kst + c + v * VL, nl) * dv[v];
    }
#pragma GCC unroll 8
    for (int k = 0; k < KW; k++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            float* a = acc + k * LP + c + v * VL;
            store(a, load(a) + s[k][v]);
        }
}

// All lane vectors of one x row against one dy row, taps kw0 .. kw0 + KW - 1 (x index
// u*sw + off + k*dl), in pixel blocks (dw_block) where every tap reads the input, pixel
// by pixel elsewhere.
template <int KW, int64_t DT>
void dw_blocks(const void* xv, int64_t xpix, const void* yv, int64_t ypix, int64_t U,
               int64_t sw, int64_t dl, int64_t off, int64_t Lw, int64_t C, float* acc,
               int64_t LP, Streamer& pf) {
    typedef typename Elem<DT>::T T;
    const T* xr = (const T*)xv;
    const T* yr = (const T*)yv;
    constexpr int R = 4, NB = 2 * VL;
    const int64_t pairs = C / NB * NB, full = C / VL * VL;
    const int tail = (int)(C - full);
    int64_t ca, cb, a_last, b_last;
    valid_range(U, sw, off, Lw, ca, cb);
    valid_range(U, sw, off + (KW - 1) * dl, Lw, a_last, b_last);
    ca = std::max(ca, a_last);              // every tap reads the input on [ca, cb)
    cb = std::max(ca, std::min(cb, b_last));
    const int64_t xst = sw * xpix, kst = dl * xpix;
    auto span = [&](int64_t u0, auto rc) {
        constexpr int RR = decltype(rc)::value;
        const T* xp = xr + (u0 * sw + off) * xpix;
        const T* yp = yr + u0 * ypix;
        for (int64_t c = 0; c < pairs; c += NB) {
            pf.step();
            dw_block<RR, KW, 2, false, DT>(xp, xst, kst, yp, ypix, c, acc, LP, VL);
        }
        if (full > pairs)
            dw_block<RR, KW, 1, false, DT>(xp, xst, kst, yp, ypix, pairs, acc, LP, VL);
        if (tail) dw_block<RR, KW, 1, true, DT>(xp, xst, kst, yp, ypix, full, acc, LP, tail);
    };
    int64_t u = ca;
    for (; u + R <= cb; u += R) span(u, std::integral_constant<int, R>{});
    for (; u < cb; u++) span(u, std::integral_constant<int, 1>{});
    // the pixels where some tap reads padding
    for (int64_t uu = 0; uu < U; uu++) {
        if (uu == ca && cb > ca) uu = cb;
        if (uu >= U) break;
        for (int k = 0; k < KW; k++) {
            const int64_t i = uu * sw + off + k * dl;
            if (i < 0 || i >= Lw) continue;
            const T* xp = xr + i * xpix;
            const T* yp = yr + uu * ypix;
            float* a = acc + k * LP;
            for (int64_t c = 0; c < full; c += VL)
                store(a + c, load(a + c) + load_as<DT>(xp + c) * load_as<DT>(yp + c));
            if (tail)
                store_n(a + full, load_n(a + full, tail) + load_as_n<DT>(xp + full, tail) *
                                                               load_as_n<DT>(yp + full, tail),
                        tail);
        }
    }
}

typedef void (*dw_blocks_fn)(const void*, int64_t, const void*, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int64_t, int64_t, float*, int64_t, Streamer&);

constexpr int DW_KW = 8;    // taps per block call at most (wider rows take several)

template <int64_t DT, int... K>
constexpr std::array<dw_blocks_fn, sizeof...(K)> dw_blocks_of(std::integer_sequence<int, K...>) {
    return {&dw_blocks<K + 1, DT>...};
}

// [kw - 1] for x and dy of element type dt, kw <= DW_KW
const dw_blocks_fn* dw_blocks_table(int64_t dt) {
    static const std::array<dw_blocks_fn, DW_KW> t[3] = {
        dw_blocks_of<F32>(std::make_integer_sequence<int, DW_KW>{}),
        dw_blocks_of<F16>(std::make_integer_sequence<int, DW_KW>{}),
        dw_blocks_of<BF16>(std::make_integer_sequence<int, DW_KW>{})};
    return t[dt].data();
}

// The x rows (kd, kh) of dy line l that read the input: their (d, h), at most 64.
int dw_rows(const DwWgradProblem* P, int64_t l, int64_t& n, int64_t& od, int64_t& oh,
            int64_t (*rows)[4]) {
    n = l / (P->M[0] * P->M[1]);
    od = (l / P->M[1]) % P->M[0];
    oh = l % P->M[1];
    int k = 0;
    for (int64_t kd = 0; kd < P->K[0]; kd++) {
        const int64_t d = od * P->s[0] + kd * P->d[0] - P->pb[0];
        if (d < 0 || d >= P->L[0]) continue;
        for (int64_t kh = 0; kh < P->K[1]; kh++) {
            const int64_t h = oh * P->s[1] + kh * P->d[1] - P->pb[1];
            if (h < 0 || h >= P->L[1]) continue;
            rows[k][0] = kd, rows[k][1] = kh, rows[k][2] = d, rows[k][3] = h;
            k++;
        }
    }
    return k;
}

}  // namespace

void cg_dw_wgrad_run(const DwWgradProblem* P, int64_t lo, int64_t hi, float* partial) {
    const int64_t C = P->C, LP = (C + VL - 1) / VL * VL;
    const int64_t Kw = P->K[2], U = P->M[2], Lw = P->L[2];
    const int64_t xpix = P->x.stride[3], ypix = P->dy.stride[3];
    const int64_t es = itemsize(P->x.dtype);   // x and dy: one element type
    const dw_blocks_fn* fns = dw_blocks_table(P->x.dtype);
    int64_t rows[64][4], next_rows[64][4];
    Streamer pf;
    for (int64_t l = lo; l < hi; l++) {
        int64_t n, od, oh;
        const int nr = dw_rows(P, l, n, od, oh, rows);
        // the next line's x rows this one does not read, and its dy row
        pf.clear();
        if (l + 1 < hi) {
            int64_t n2, od2, oh2;
            const int nr2 = dw_rows(P, l + 1, n2, od2, oh2, next_rows);
            for (int j = 0; j < nr2; j++) {
                bool have = n2 == n;
                if (have) {
                    have = false;
                    for (int k = 0; k < nr && !have; k++)
                        have = rows[k][2] == next_rows[j][2] && rows[k][3] == next_rows[j][3];
                }
                if (!have)
                    pf.add(at(P->x, n2, next_rows[j][2], next_rows[j][3], 0, 0), es * Lw * xpix);
            }
            pf.add(at(P->dy, n2, od2, oh2, 0, 0), es * U * ypix);
        }
        // prefetch steps: one per block of pixels and pair of lane vectors
        const int64_t passes = (int64_t)nr * ((Kw + DW_KW - 1) / DW_KW) *
                               std::max<int64_t>(1, U / 4 * (C / (2 * VL)));
        pf.per = (int)std::min<int64_t>(8, passes > 0 ? (pf.lines() + passes - 1) / passes : 1);
        const void* yr = at(P->dy, n, od, oh, 0, 0);
        for (int r = 0; r < nr; r++) {
            const void* xr = at(P->x, n, rows[r][2], rows[r][3], 0, 0);
            const int64_t t0 = (rows[r][0] * P->K[1] + rows[r][1]) * Kw;
            for (int64_t kw0 = 0; kw0 < Kw; kw0 += DW_KW) {
                const int kw = (int)std::min<int64_t>(DW_KW, Kw - kw0);
                const int64_t off = kw0 * P->d[2] - P->pb[2];
                fns[kw - 1](xr, xpix, yr, ypix, U, P->s[2], P->d[2], off, Lw, C,
                            partial + (t0 + kw0) * LP, LP, pf);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Depthwise data gradient, streaming.
//
// dx[q][c] = sum over the taps t with q = p*s + t*d - pb of dy[p][c] * w[t][c] for
// depthwise layers (multiplier 1) whose dy and dx are float32 with unit channel
// stride.  One dx line at a time and one stride phase r of its w axis at a time:
// blocks of the phase's pixels q = qq*s + r x a cache line of channels sum every term
// (dy row, tap) that meets them (dwd_blocks) and store each dx vector once, with
// streaming stores into recycled results (DwDgradProblem::stream).  The next line's
// dy rows are prefetched while this one computes.

extern "C" {

// grouped.py: _DwDgrad, same field order.
struct DwDgradProblem {
    Tensor dy;                 // n, d, h, w, c: unit channel stride
    void* dx;                  // dy's element type, unit channel stride
    int64_t ostride[4];        // dx strides n, d, h, w (elements)
    int64_t N, L[3], M[3], C;
    int64_t K[3], s[3], d[3], pb[3];
    const float* w;            // [tap][LP] float32 (LP: C rounded up to whole vectors)
    int64_t stream;            // write dx with streaming stores (see cg_dw_dgrad_run)
};

int64_t cg_dw_dgrad_terms(void);

// dx lines [lo, hi), numbered (n * L0 + d) * L1 + h.
void cg_dw_dgrad_run(const DwDgradProblem* P, int64_t lo, int64_t hi);

}  // extern "C"

namespace {

constexpr int DWD_TERMS = 12;   // (dy row, tap) terms of one phase a block sums at most
constexpr int PFW_AHEAD = 8;    // dx pixels ahead whose lines are fetched for writing

// A run of M terms on one dy row whose offsets fall by one from term to term (taps
// kw, kw + 1, ... at dilation 1 and stride 1): the R + M - 1 dy pixels they read are
// loaded once each and meet every tap there.
template <int R, int NV, int M, bool TAIL, int64_t DT>
CG_INLINE void dwd_run(vf (&acc)[R][NV], const typename Elem<DT>::T* p, const float* const* wk,
                       int64_t ypix, int64_t c, int nl) {
    vf wv[M][NV];
#pragma GCC unroll 8
    for (int t = 0; t < M; t++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) wv[t][v] = lane_load<TAIL>(wk[t] + c + v * VL, nl);
#pragma GCC unroll 16
    for (int j = 0; j < R + M - 1; j++) {
        vf x[NV];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) x[v] = lane_load<TAIL, DT>(p + j * ypix + v * VL, nl);
#pragma GCC unroll 8
        for (int t = 0; t < M; t++) {
            const int i = j - (M - 1 - t);
            if (i < 0 || i >= R) continue;
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) acc[i][v] += x[v] * wv[t][v];
        }
    }
}

// The terms of a phase grouped into runs of m terms each (dwd_run): run r starts at
// term first[r], its lowest dy offset lowest[r].  Runs of unequal lengths are cut
// into single terms: one length keeps the block's accumulators in registers.
struct DwdRuns {
    int n = 0, m = 1;
    int first[DWD_TERMS];
    int64_t lowest[DWD_TERMS];
};

constexpr int DWD_RUN_MAX = 4;

inline void dwd_runs(const void* const* b, const int64_t* off, int nt, DwdRuns& runs) {
    int len[DWD_TERMS], n = 0;
    bool same = true;
    for (int k = 0; k < nt;) {
        int m = 1;
        while (k + m < nt && m < DWD_RUN_MAX && b[k + m] == b[k] && off[k + m] == off[k] - m) m++;
        runs.first[n] = k, len[n] = m, runs.lowest[n] = off[k + m - 1];
        same = same && m == len[0];
        n++;
        k += m;
    }
    runs.n = n, runs.m = n > 0 ? len[0] : 1;
    if (!same) {
        for (int k = 0; k < nt; k++) runs.first[k] = k, runs.lowest[k] = off[k];
        runs.n = nt, runs.m = 1;
    }
}

// Pixel blocks: R dx pixels of one phase x NV vectors of channels (a whole cache line
// of them when NV * VL * 4 = 64 bytes), summed over the runs of M terms (dy row, tap),
// every term inside dy for all R pixels; the weights are loaded per run (they no
// longer fit in registers across the channels), the dy pixels from L1.  Every dx
// line is written whole, a pixel's channels at once: with streaming stores (STREAM)
// it goes to memory without being read first.
template <int R, int NV, int M, bool TAIL, bool STREAM, int64_t DT>
CG_INLINE void dwd_block(const typename Elem<DT>::T* const* b, const float* const* wk,
                         const DwdRuns& runs, int64_t ypix, int64_t q0, int64_t c,
                         typename Elem<DT>::T* out, int64_t ostep, int nl) {
    vf acc[R][NV];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) acc[i][v] = zero();
    for (int r = 0; r < runs.n; r++) {
        const int k = runs.first[r];
        dwd_run<R, NV, M, TAIL, DT>(acc, b[k] + (q0 + runs.lowest[r]) * ypix + c, wk + k, ypix,
                                    c, nl);
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            auto* o = out + i * ostep + c + v * VL;
            if constexpr (TAIL) store_as_n<DT>(o, acc[i][v], nl);
            else store_as<DT, STREAM>(o, acc[i][v]);
        }
}

// The dx pixels [q0, q1) of one phase (all channels), R at a time where every term
// reads inside dy, one at a time (skipping the terms outside) elsewhere.
template <int M, bool STREAM, int64_t DT>
void dwd_blocks(const void* const* bv, const int64_t* off, const float* const* wk, int nt,
                const DwdRuns& runs, int64_t ypix, int64_t Q, int64_t Mw, int64_t C,
                void* outv, int64_t ostep, Streamer& pf) {
    typedef typename Elem<DT>::T T;
    const T* const* b = (const T* const*)bv;
    T* out = (T*)outv;
    constexpr int R = 4, NB = 2 * VL;
    const int64_t pairs = C / NB * NB, full = C / VL * VL;
    const int tail = (int)(C - full);
    int64_t lo = 0, hi = Q;
    for (int k = 0; k < nt; k++) {
        lo = std::max(lo, -off[k]);
        hi = std::min(hi, Mw - off[k]);
    }
    hi = std::max(lo, hi);
    auto span = [&](int64_t q0, auto rc) {
        constexpr int RR = decltype(rc)::value;
        T* o = out + q0 * ostep;
        // (plain stores: the lines of the pixels PFW_AHEAD on, read for ownership early)
        const bool pfw = !STREAM && (cg_dbg & 32) == 0 && q0 + PFW_AHEAD + RR <= hi;
        const T* ahead = pfw ? o + PFW_AHEAD * ostep : o;
        for (int64_t c = 0; c < pairs; c += NB) {
            pf.step();
            if (pfw)
#pragma GCC unroll 4
                for (int i = 0; i < RR; i++) __builtin_prefetch(ahead + i * ostep + c, 1, 3);
            dwd_block<RR, 2, M, false, STREAM, DT>(b, wk, runs, ypix, q0, c, o, ostep, VL);
        }
        // (a lone vector is streamed where it is a whole cache line: float32 on AVX-512)
        if (full > pairs)
            dwd_block<RR, 1, M, false, STREAM && VL * sizeof(T) % 64 == 0, DT>(
                b, wk, runs, ypix, q0, pairs, o, ostep, VL);
        if (tail) dwd_block<RR, 1, M, true, false, DT>(b, wk, runs, ypix, q0, full, o, ostep, tail);
    };
    int64_t q = lo;
    for (; q + R <= hi; q += R) span(q, std::integral_constant<int, R>{});
    for (; q < hi; q++) span(q, std::integral_constant<int, 1>{});
    // the pixels where some term reads outside dy
    const T* bk[DWD_TERMS];
    const float* wkk[DWD_TERMS];
    int64_t offk[DWD_TERMS];
    for (int64_t qq = 0; qq < Q; qq++) {
        if (qq == lo && hi > lo) qq = hi;
        if (qq >= Q) break;
        int m = 0;
        for (int k = 0; k < nt; k++) {
            const int64_t pix = qq + off[k];
            if (pix >= 0 && pix < Mw) bk[m] = b[k], wkk[m] = wk[k], offk[m++] = off[k];
        }
        T* o = out + qq * ostep;
        for (int64_t c = 0; c < full; c += VL) {
            vf acc = zero();
            for (int k = 0; k < m; k++)
                acc += load_as<DT>(bk[k] + (qq + offk[k]) * ypix + c) * load(wkk[k] + c);
            store_as<DT>(o + c, acc);
        }
        if (tail) {
            vf acc = zero();
            for (int k = 0; k < m; k++)
                acc += load_as_n<DT>(bk[k] + (qq + offk[k]) * ypix + full, tail) *
                       load_n(wkk[k] + full, tail);
            store_as_n<DT>(o + full, acc, tail);
        }
    }
}

typedef void (*dwd_blocks_fn)(const void* const*, const int64_t*, const float* const*, int,
                              const DwdRuns&, int64_t, int64_t, int64_t, int64_t, void*,
                              int64_t, Streamer&);

template <int64_t DT, int... M>
constexpr std::array<dwd_blocks_fn, sizeof...(M)> dwd_blocks_of(
    std::integer_sequence<int, M...>) {
    return {&dwd_blocks<M / 2 + 1, M % 2 == 1, DT>...};
}

// [(m - 1) * 2 + stream] for dy and dx of element type dt
const dwd_blocks_fn* dwd_blocks_table(int64_t dt) {
    static const std::array<dwd_blocks_fn, 2 * DWD_RUN_MAX> t[3] = {
        dwd_blocks_of<F32>(std::make_integer_sequence<int, 2 * DWD_RUN_MAX>{}),
        dwd_blocks_of<F16>(std::make_integer_sequence<int, 2 * DWD_RUN_MAX>{}),
        dwd_blocks_of<BF16>(std::make_integer_sequence<int, 2 * DWD_RUN_MAX>{})};
    return t[dt].data();
}

// The dy rows (kd, kh) that dx line l meets: (kd, kh, od, oh), at most 64.
int dwd_rows(const DwDgradProblem* P, int64_t l, int64_t& n, int64_t& xd, int64_t& xh,
             int64_t (*rows)[4]) {
    n = l / (P->L[0] * P->L[1]);
    xd = (l / P->L[1]) % P->L[0];
    xh = l % P->L[1];
    int k = 0;
    for (int64_t kd = 0; kd < P->K[0]; kd++) {
        const int64_t a = xd + P->pb[0] - kd * P->d[0];
        if (a < 0 || a % P->s[0] || a / P->s[0] >= P->M[0]) continue;
        for (int64_t kh = 0; kh < P->K[1]; kh++) {
            const int64_t b = xh + P->pb[1] - kh * P->d[1];
            if (b < 0 || b % P->s[1] || b / P->s[1] >= P->M[1]) continue;
            if (k < 64) rows[k][0] = kd, rows[k][1] = kh, rows[k][2] = a / P->s[0],
                        rows[k][3] = b / P->s[1], k++;
        }
    }
    return k;
}

}  // namespace

int64_t cg_dw_dgrad_terms(void) { return DWD_TERMS; }

void cg_dw_dgrad_run(const DwDgradProblem* P, int64_t lo, int64_t hi) {
    const int64_t C = P->C, LP = (C + VL - 1) / VL * VL;
    const int64_t Kw = P->K[2], sw = P->s[2], Lw = P->L[2], Mw = P->M[2];
    const int64_t ypix = P->dy.stride[3], opix = P->ostride[3];
    const dwd_blocks_fn* fns = dwd_blocks_table(P->dy.dtype);
    const int64_t es = itemsize(P->dy.dtype);   // dy and dx: one element type
    int64_t rows[64][4], next_rows[64][4];
    const void* b[DWD_TERMS];
    const float* wk[DWD_TERMS];
    int64_t off[DWD_TERMS];
    Streamer pf;
    for (int64_t l = lo; l < hi; l++) {
        int64_t n, xd, xh;
        const int nr = dwd_rows(P, l, n, xd, xh, rows);
        pf.clear();
        if (l + 1 < hi) {
            int64_t n2, xd2, xh2;
            const int nr2 = dwd_rows(P, l + 1, n2, xd2, xh2, next_rows);
            for (int j = 0; j < nr2; j++) {
                bool have = false;
                for (int k = 0; k < nr && !have && n2 == n; k++)
                    have = rows[k][2] == next_rows[j][2] && rows[k][3] == next_rows[j][3];
                if (!have)
                    pf.add(at(P->dy, n2, next_rows[j][2], next_rows[j][3], 0, 0), es * Mw * ypix);
            }
        }
        // prefetch steps: one per block of pixels and pair of lane vectors
        const int64_t steps = std::max<int64_t>(1, (Lw / 4) * std::max<int64_t>(1, C / (2 * VL)));
        pf.per = (int)std::min<int64_t>(16, (pf.lines() + steps - 1) / steps);
        char* line = (char*)P->dx +
                     es * (n * P->ostride[0] + xd * P->ostride[1] + xh * P->ostride[2]);
        for (int64_t r = 0; r < sw && r < Lw; r++) {
            const int64_t Q = (Lw - r + sw - 1) / sw;
            int nt = 0;
            for (int j = 0; j < nr; j++) {
                const void* row = at(P->dy, n, rows[j][2], rows[j][3], 0, 0);
                for (int64_t kw = 0; kw < Kw; kw++) {
                    const int64_t a = r + P->pb[2] - kw * P->d[2];
                    if (((a % sw) + sw) % sw) continue;
                    // (grouped.py sends only problems whose phases have at most
                    // DWD_TERMS terms)
                    b[nt] = row;
                    off[nt] = a / sw;                               // exact
                    wk[nt] = P->w + ((rows[j][0] * P->K[1] + rows[j][1]) * Kw + kw) * LP;
                    nt++;
                }
            }
            char* out = line + es * r * opix;
            // (no terms: every block sums nothing and stores zeros)
            DwdRuns runs;
            dwd_runs(b, off, nt, runs);
            fns[(runs.m - 1) * 2 + (P->stream ? 1 : 0)](
                b, off, wk, nt, runs, ypix, Q, Mw, C, out, sw * opix, pf);
        }
    }
    if (P->stream) stream_fence();
}

// ---------------------------------------------------------------------------------------
// Planar depthwise gradients (channels-first callers)
//
// A depthwise layer (one channel per group, multiplier 1) whose tensors keep each
// channel's pixels together (NCX: unit stride along w, channels far apart) is one
// small 2-D (1-D, 3-D) problem per channel plane.  Each plane is read once, in
// memory order (one stream the hardware prefetchers follow), with vectors along w:
// no conversion into channels-last lines, which cost the line kernels most of their
// time here (96 channel runs per line, each in another place).  A stride along w is
// split into phases (x[j * s + r] for phase r), so every tap is a unit-stride sweep
// over the range of positions where it reads the input (padding never multiplied).

extern "C" {

struct PlanarProblem {
    Tensor src;                // wgrad: x (n, d, h, w, c); dgrad: dy
    Tensor dy;                 // wgrad: dy; dgrad: unused
    void* out;                 // dgrad: dx (out_dtype, ostride); wgrad: dw float32 (*K, C)
    int64_t out_dtype;
    int64_t ostride[5];        // dx strides (n, d, h, w, c), elements
    const float* W;            // dgrad: weights float32 (*K, C)
    int64_t N, C, L[3], M[3], K[3], s[3], d[3], pb[3];
};

int64_t cg_planar_scratch(const PlanarProblem* P);
void cg_planar_wgrad_run(const PlanarProblem* P, int64_t c0, int64_t c1, float* scratch);
void cg_planar_dgrad_run(const PlanarProblem* P, int64_t c0, int64_t c1, float* scratch);

}  // extern "C"

namespace {

inline float hsum(vf v) {
    float s = 0.0f;
    for (int i = 0; i < VL; i++) s += v[i];
    return s;
}

// sum over [a, b) of p[i] * q[i] into acc (two accumulators, then one).
inline vf dot_range(vf acc, const float* p, const float* q, int64_t a, int64_t b) {
    vf acc2 = zero();
    int64_t i = a;
    for (; i + 2 * VL <= b; i += 2 * VL) {
        acc += load(p + i) * load(q + i);
        acc2 += load(p + i + VL) * load(q + i + VL);
    }
    for (; i + VL <= b; i += VL) acc += load(p + i) * load(q + i);
    if (i < b) acc += load_n(p + i, (int)(b - i)) * load_n(q + i, (int)(b - i));
    return acc + acc2;
}

// acc[k] += sum over [lo, hi) of base[k][i] * dy[i] for the KW taps of one row pair,
// dy loaded once for all of them, two vectors at a time (independent accumulators).
template <int KW>
void taps_range(vf* acc, const float* const* base, const float* dy, int64_t lo, int64_t hi) {
    vf a[KW], b[KW];
#pragma GCC unroll 8
    for (int k = 0; k < KW; k++) a[k] = acc[k], b[k] = zero();
    int64_t j = lo;
    for (; j + 2 * VL <= hi; j += 2 * VL) {
        const vf d0 = load(dy + j), d1 = load(dy + j + VL);
#pragma GCC unroll 8
        for (int k = 0; k < KW; k++) {
            a[k] += load(base[k] + j) * d0;
            b[k] += load(base[k] + j + VL) * d1;
        }
    }
    for (; j + VL <= hi; j += VL) {
        const vf d0 = load(dy + j);
#pragma GCC unroll 8
        for (int k = 0; k < KW; k++) a[k] += load(base[k] + j) * d0;
    }
    if (j < hi) {
        const int m = (int)(hi - j);
        const vf d0 = load_n(dy + j, m);
#pragma GCC unroll 8
        for (int k = 0; k < KW; k++) a[k] += load_n(base[k] + j, m) * d0;
    }
#pragma GCC unroll 8
    for (int k = 0; k < KW; k++) acc[k] = a[k] + b[k];
}

typedef void (*taps_fn)(vf*, const float* const*, const float*, int64_t, int64_t);
constexpr int TAPS_MAX = 8;
constexpr taps_fn TAPS_FNS[TAPS_MAX + 1] = {nullptr,         &taps_range<1>, &taps_range<2>,
                                            &taps_range<3>, &taps_range<4>, &taps_range<5>,
                                            &taps_range<6>, &taps_range<7>, &taps_range<8>};

// o[i] += wv * q[i] for i in [a, b).
inline void axpy_range(float* o, vf wv, const float* q, int64_t a, int64_t b) {
    int64_t i = a;
    for (; i + VL <= b; i += VL) store(o + i, load(o + i) + wv * load(q + i));
    if (i < b) {
        const int n = (int)(b - i);
        store_n(o + i, load_n(o + i, n) + wv * load_n(q + i, n), n);
    }
}

// The row (n, d, h) of channel c of t as floats: in place when float32 with unit w
// stride, else converted into buf.
inline const float* plane_row(const Tensor& t, int64_t n, int64_t d, int64_t h, int64_t c,
                              int64_t W, float* buf) {
    const char* p = at(t, n, d, h, 0, c);
    if (t.dtype == F32 && t.stride[3] == 1) return (const float*)p;
    convert_run(buf, p, t.dtype, t.stride[3], W);
    return buf;
}

inline int64_t phase_len(int64_t L, int64_t s) { return (L + s - 1) / s + VL; }

typedef int32_t vi32 __attribute__((vector_size(VL * 4)));

template <int... I>
constexpr vi32 interleave_mask(std::integer_sequence<int, I...>, int half) {
    return vi32{((I % 2) ? (I / 2 + half + VL) : (I / 2 + half))...};
}

template <int... I>
constexpr vi32 deinterleave_mask(std::integer_sequence<int, I...>, int phase) {
    return vi32{(2 * I + phase)...};
}

// even[j] = row[2j], odd[j] = row[2j + 1] for 2j (+ 1) < L.
inline void deinterleave2(float* even, float* odd, const float* row, int64_t L) {
    constexpr vi32 e = deinterleave_mask(std::make_integer_sequence<int, VL>{}, 0);
    constexpr vi32 o = deinterleave_mask(std::make_integer_sequence<int, VL>{}, 1);
    int64_t j = 0;
    for (; 2 * (j + VL) <= L; j += VL) {
        const vf a = load(row + 2 * j), b = load(row + 2 * j + VL);
        store(even + j, __builtin_shuffle(a, b, e));
        store(odd + j, __builtin_shuffle(a, b, o));
    }
    for (int64_t i = 2 * j; i < L; i++) ((i & 1) ? odd : even)[i >> 1] = row[i];
}

// row[2j] = even[j], row[2j + 1] = odd[j] for 2j (+ 1) < L (both phases readable
// a vector beyond their ends).
inline void interleave2(float* row, const float* even, const float* odd, int64_t L) {
    constexpr vi32 lo = interleave_mask(std::make_integer_sequence<int, VL>{}, 0);
    constexpr vi32 hi = interleave_mask(std::make_integer_sequence<int, VL>{}, VL / 2);
    int64_t j = 0;
    for (; 2 * (j + VL) <= L; j += VL) {
        const vf a = load(even + j), b = load(odd + j);
        store(row + 2 * j, __builtin_shuffle(a, b, lo));
        store(row + 2 * j + VL, __builtin_shuffle(a, b, hi));
    }
    for (int64_t i = 2 * j; i < L; i++) row[i] = (i & 1) ? odd[i >> 1] : even[i >> 1];
}

// Phase r (< s) of a row of L floats, row[j*s + r] for j*s + r < L, to out + r * pstride
// (the planar and flat kernels' strided rows), and back (merge_phases).
inline void split_phases(float* out, int64_t pstride, const float* row, int64_t L, int64_t s) {
    if (s == 2) {
        deinterleave2(out, out + pstride, row, L);
        return;
    }
    for (int64_t r = 0; r < s; r++)
        for (int64_t j = 0; j * s + r < L; j++) out[r * pstride + j] = row[j * s + r];
}

inline void merge_phases(float* row, const float* in, int64_t pstride, int64_t L, int64_t s) {
    if (s == 2) {
        interleave2(row, in, in + pstride, L);
        return;
    }
    for (int64_t r = 0; r < s; r++)
        for (int64_t j = 0; j * s + r < L; j++) row[j * s + r] = in[r * pstride + j];
}

}  // namespace

int64_t cg_planar_scratch(const PlanarProblem* P) {
    const int64_t sw = P->s[2], W = std::max(P->L[2], P->M[2]);
    const int64_t ntap = P->K[0] * P->K[1] * P->K[2];
    return (3 + P->K[0] * P->K[1]) * (W + VL) + sw * phase_len(W, sw) + ntap * (VL + 1) + 3 * VL;
}

// dw[t, c] for the channels [c0, c1): per channel, every (x row, dy row, tap) term
// of every sample in order (a fixed order: the result does not depend on threads).
void cg_planar_wgrad_run(const PlanarProblem* P, int64_t c0, int64_t c1, float* scratch) {
    const int64_t Lw = P->L[2], Mw = P->M[2], sw = P->s[2], Kw = P->K[2];
    const int64_t ntap = P->K[0] * P->K[1] * Kw, plen = phase_len(Lw, sw);
    float* xbuf = scratch;
    float* ybuf = xbuf + Lw + VL;
    float* phases = ybuf + Mw + VL;
    // accumulators (aligned for vf)
    vf* acc = (vf*)(((uintptr_t)(phases + sw * plen) + 63) & ~(uintptr_t)63);
    // the pixels at the ends, summed apart (a lane store into acc would stall its
    // next vector load)
    float* edge = (float*)(acc + ntap);
    std::vector<int64_t> ka(Kw), kb(Kw), kr(Kw), kq(Kw);
    for (int64_t kw = 0; kw < Kw; kw++) {
        const int64_t off = kw * P->d[2] - P->pb[2];
        kr[kw] = ((off % sw) + sw) % sw;
        kq[kw] = (off - kr[kw]) / sw;
        valid_range(Mw, sw, off, Lw, ka[kw], kb[kw]);
    }
    // the positions where every tap reads the input (one sweep for all of them)
    int64_t inner_lo = 0, inner_hi = Mw;
    for (int64_t kw = 0; kw < Kw; kw++)
        inner_lo = std::max(inner_lo, ka[kw]), inner_hi = std::min(inner_hi, kb[kw]);
    const bool all_taps = Kw <= TAPS_MAX && inner_hi > inner_lo;
    float* dw = (float*)P->out;
    for (int64_t c = c0; c < c1; c++) {
        for (int64_t t = 0; t < ntap; t++) acc[t] = zero(), edge[t] = 0.0f;
        for (int64_t n = 0; n < P->N; n++)
            for (int64_t od = 0; od < P->M[0]; od++)
                for (int64_t oh = 0; oh < P->M[1]; oh++) {
                    const float* dyr = plane_row(P->dy, n, od, oh, c, Mw, ybuf);
                    for (int64_t kd = 0; kd < P->K[0]; kd++) {
                        const int64_t id = od * P->s[0] + kd * P->d[0] - P->pb[0];
                        if (id < 0 || id >= P->L[0]) continue;
                        for (int64_t kh = 0; kh < P->K[1]; kh++) {
                            const int64_t ih = oh * P->s[1] + kh * P->d[1] - P->pb[1];
                            if (ih < 0 || ih >= P->L[1]) continue;
                            const float* xr = plane_row(P->src, n, id, ih, c, Lw, xbuf);
                            if (sw > 1) split_phases(phases, plen, xr, Lw, sw);
                            const int64_t t0 = (kd * P->K[1] + kh) * Kw;
                            // x[(ow + q) * sw + r] = phase r at ow + q
                            const float* base[TAPS_MAX];
                            for (int64_t kw = 0; kw < std::min<int64_t>(Kw, TAPS_MAX); kw++)
                                base[kw] = sw > 1 ? phases + kr[kw] * plen + kq[kw] : xr + kq[kw];
                            int64_t lo = 0, hi = 0;
                            if (all_taps) {
                                // the positions every tap reads at once, the ends per tap
                                lo = inner_lo, hi = inner_hi;
                                TAPS_FNS[Kw](acc + t0, base, dyr, lo, hi);
                            }
                            for (int64_t kw = 0; kw < Kw; kw++) {
                                if (kb[kw] <= ka[kw]) continue;
                                const float* b = kw < TAPS_MAX ? base[kw]
                                    : (sw > 1 ? phases + kr[kw] * plen + kq[kw] : xr + kq[kw]);
                                if (hi > lo) {
                                    // a pixel or two at each end
                                    float e = 0.0f;
                                    for (int64_t j = ka[kw]; j < lo; j++) e += b[j] * dyr[j];
                                    for (int64_t j = hi; j < kb[kw]; j++) e += b[j] * dyr[j];
                                    edge[t0 + kw] += e;
                                } else {
                                    acc[t0 + kw] = dot_range(acc[t0 + kw], b, dyr, ka[kw], kb[kw]);
                                }
                            }
                        }
                    }
                }
        for (int64_t t = 0; t < ntap; t++) dw[t * P->C + c] = hsum(acc[t]) + edge[t];
    }
}

// dx rows of the channels [c0, c1): per dx row and w phase, every output vector sums
// all its (dy row, tap) terms in registers and is stored once (the few pixels at the
// ends, where some taps would read padding, one by one over their valid taps); the
// phases are interleaved into the row, written once in its dtype.
void cg_planar_dgrad_run(const PlanarProblem* P, int64_t c0, int64_t c1, float* scratch) {
    const int64_t Lw = P->L[2], Mw = P->M[2], sw = P->s[2], Kw = P->K[2];
    const int64_t plen = phase_len(Lw, sw);
    float* row = scratch;
    float* ybuf = row + Lw + VL;                        // converted dy rows (K[0]*K[1] of them)
    const int64_t nkh = P->K[0] * P->K[1];
    float* phases = ybuf + nkh * (Mw + VL);
    const int64_t es = P->out_dtype == F32 ? 4 : 2;
    // per phase r: its taps kw (dy offset e: iw = j*sw + r reads dy[j + e]), valid j
    // ranges, and the interior [lo, hi) where all of them are valid
    std::vector<int64_t> tk, te, ta, tb, tfirst(sw + 1), lo(sw), hi(sw), nj(sw);
    for (int64_t r = 0; r < sw; r++) {
        tfirst[r] = (int64_t)tk.size();
        nj[r] = (Lw - r + sw - 1) / sw;
        lo[r] = 0, hi[r] = nj[r];
        for (int64_t kw = 0; kw < Kw; kw++) {
            const int64_t num = r + P->pb[2] - kw * P->d[2];
            if (((num % sw) + sw) % sw) continue;
            const int64_t e = num / sw;
            const int64_t a = std::max<int64_t>(0, -e), b = std::min<int64_t>(nj[r], Mw - e);
            if (b <= a) continue;
            tk.push_back(kw), te.push_back(e), ta.push_back(a), tb.push_back(b);
            lo[r] = std::max(lo[r], a), hi[r] = std::min(hi[r], b);
        }
        hi[r] = std::max(hi[r], lo[r]);
    }
    tfirst[sw] = (int64_t)tk.size();
    std::vector<const float*> rows_(nkh);
    std::vector<int64_t> rt0(nkh);
    std::vector<float> wv(nkh * std::max<int64_t>(1, Kw));
    // per axis (d, h) and dx index i: the (tap, dy index) pairs that reach it
    // (tables: no divisions per row)
    std::vector<int64_t> first[2], tap[2], src[2];
    for (int ax = 0; ax < 2; ax++) {
        first[ax].assign(P->L[ax] + 1, 0);
        for (int64_t i = 0; i < P->L[ax]; i++) {
            first[ax][i] = (int64_t)tap[ax].size();
            for (int64_t k = 0; k < P->K[ax]; k++) {
                const int64_t num = i + P->pb[ax] - k * P->d[ax];
                if (num < 0 || num % P->s[ax] || num / P->s[ax] >= P->M[ax]) continue;
                tap[ax].push_back(k), src[ax].push_back(num / P->s[ax]);
            }
        }
        first[ax][P->L[ax]] = (int64_t)tap[ax].size();
    }
    for (int64_t c = c0; c < c1; c++)
        for (int64_t n = 0; n < P->N; n++)
            for (int64_t id = 0; id < P->L[0]; id++)
                for (int64_t ih = 0; ih < P->L[1]; ih++) {
                    // the dy rows reaching this dx row, and their taps' weights
                    int64_t nr = 0;
                    for (int64_t a = first[0][id]; a < first[0][id + 1]; a++)
                        for (int64_t b = first[1][ih]; b < first[1][ih + 1]; b++) {
                            rows_[nr] = plane_row(P->src, n, src[0][a], src[1][b], c, Mw,
                                                  ybuf + nr * (Mw + VL));
                            rt0[nr] = (tap[0][a] * P->K[1] + tap[1][b]) * Kw;
                            nr++;
                        }
                    for (int64_t r = 0; r < sw; r++) {
                        float* o = sw > 1 ? phases + r * plen : row;
                        const int64_t f0 = tfirst[r], f1 = tfirst[r + 1], nt = f1 - f0;
                        if (nr == 0 || nt == 0) {
                            std::memset(o, 0, nj[r] * sizeof(float));
                            continue;
                        }
                        for (int64_t q = 0; q < nr; q++)
                            for (int64_t i = 0; i < nt; i++)
                                wv[q * nt + i] = P->W[(rt0[q] + tk[f0 + i]) * P->C + c];
                        // the ends: each pixel over the taps valid for it
                        auto one = [&](int64_t j) {
                            float sum = 0.0f;
                            for (int64_t q = 0; q < nr; q++)
                                for (int64_t i = 0; i < nt; i++)
                                    if (j >= ta[f0 + i] && j < tb[f0 + i])
                                        sum += wv[q * nt + i] * rows_[q][j + te[f0 + i]];
                            o[j] = sum;
                        };
                        for (int64_t j = 0; j < std::min(lo[r], nj[r]); j++) one(j);
                        int64_t j = lo[r];
                        // four vectors at a time: independent accumulators (one would
                        // wait on each FMA's latency)
                        for (; j + 4 * VL <= hi[r]; j += 4 * VL) {
                            vf a0 = zero(), a1 = zero(), a2 = zero(), a3 = zero();
                            for (int64_t q = 0; q < nr; q++) {
                                const float* yr = rows_[q] + j;
                                for (int64_t i = 0; i < nt; i++) {
                                    const vf wb = bcast(wv[q * nt + i]);
                                    const float* y = yr + te[f0 + i];
                                    a0 += wb * load(y);
                                    a1 += wb * load(y + VL);
                                    a2 += wb * load(y + 2 * VL);
                                    a3 += wb * load(y + 3 * VL);
                                }
                            }
                            store(o + j, a0);
                            store(o + j + VL, a1);
                            store(o + j + 2 * VL, a2);
                            store(o + j + 3 * VL, a3);
                        }
                        if (j < hi[r]) {
                            // the last up to four vectors, the last ones partial or empty
                            int nk[4];
                            for (int k = 0; k < 4; k++)
                                nk[k] = (int)std::max<int64_t>(0, std::min<int64_t>(VL, hi[r] - j - k * VL));
                            vf a[4] = {zero(), zero(), zero(), zero()};
                            for (int64_t q = 0; q < nr; q++) {
                                const float* yr = rows_[q] + j;
                                for (int64_t i = 0; i < nt; i++) {
                                    const vf wb = bcast(wv[q * nt + i]);
                                    const float* y = yr + te[f0 + i];
#pragma GCC unroll 4
                                    for (int k = 0; k < 4; k++)
                                        if (nk[k] > 0) a[k] += wb * load_n(y + k * VL, nk[k]);
                                }
                            }
                            for (int k = 0; k < 4; k++)
                                if (nk[k] > 0) store_n(o + j + k * VL, a[k], nk[k]);
                        }
                        for (int64_t jj = std::max(hi[r], lo[r]); jj < nj[r]; jj++) one(jj);
                    }
                    if (sw > 1) merge_phases(row, phases, plen, Lw, sw);
                    char* dst = (char*)P->out + es * (n * P->ostride[0] + id * P->ostride[1] +
                                                      ih * P->ostride[2] + c * P->ostride[4]);
                    store_run(dst, P->out_dtype, P->ostride[3], row, Lw);
                }
}

// ---------------------------------------------------------------------------------------
// Flat planes: depthwise forward and data gradients on channels-first float32 memory
// (each channel's H x W plane contiguous) whose every stride phase of the result has the
// size of the source plane (stride 1 and "same" padding; a data gradient of stride s
// whose input is s times dy)
//
// A plane is then one flat array, and every tap one shift of it: out[i] = sum_t w_t *
// in[i + oh_t * W + ow_t] for flat i = h * W + w, wherever (h + oh_t, w + ow_t) lies in
// the plane.  Vectors run along the flat index across row ends; a tap whose column
// leaves the plane there (ow_t != 0) is cleared by a column mask (one per distinct ow,
// built once per call), and the rows where some tap would leave the plane vertically
// (the first and last few) are summed tap by tap along row pieces.  A masked lane's
// product came from the wrong pixel, so it is cleared by a bitwise AND, never
// multiplied by zero (a NaN or Inf there must not reach it: D17).  A data gradient of
// stride s computes each of its s x s phases so (its taps: those of the phase) and
// interleaves them into the result's rows.  The planar kernels above work a row at a
// time, their vectors cut at every row end: on MobileNetV2's 56-wide rows that was more
// tail than vector.

extern "C" {

struct FlatProblem {
    const float* src;          // fwd: x, dgrad: dy, wgrad: x -- planes (n, c) of H x W
    float* out;                // result planes; a weight gradient: dw [tap][channel]
    int64_t sn, sc;            // src strides (floats): sample, channel
    int64_t on, oc;            // result strides
    const float* w;            // weights float32 [tap][channel]; a weight gradient: dy
                               // planes (strides yn, yc)
    int64_t N, C, H, W, ntap;  // ntap: tap entries over all phases
    const int64_t* off;        // per tap entry: row and column offset of the source pixel
                               // a result pixel meets
    int64_t yn, yc;            // a weight gradient's dy strides (floats): sample, channel
    int64_t sh, sw;            // the result's stride phases (1, 1 but for data gradients)
    const int64_t* phases;     // per phase: rh, rw, first and end tap entry
    const int64_t* widx;       // per tap entry: its weight's tap
    int64_t dtype;             // a weight gradient's x and dy (F32, F16, BF16); else F32
};

int64_t cg_flat_scratch(const FlatProblem* P);
void cg_flat_corr_run(const FlatProblem* P, int64_t lo, int64_t hi, float* scratch);
void cg_flat_wgrad_run(const FlatProblem* P, int64_t c0, int64_t c1, float* scratch);

}  // extern "C"

namespace {

constexpr int FLAT_TAPS = 64;        // tap entries at most (an 8 x 8 kernel)

// Tap entries on an H x W source plane.
struct FlatTaps {
    const int64_t* off;
    int64_t ntap, H, W;
};

// Per call and phase: the taps grouped by column offset, each group's column mask, and
// the flat range where every tap of every lane stays in the plane.
struct FlatPlan {
    int64_t HW = 0, ilo = 0, ihi = 0;    // vectors start in [ilo, ihi - VL]
    int ngroups = 0;
    int gfirst[FLAT_TAPS + 1];       // a group's taps: order[gfirst[g] .. gfirst[g + 1])
    int order[FLAT_TAPS];
    int64_t shift[FLAT_TAPS];        // flat shift per tap
    const float* mask[FLAT_TAPS];    // per group: null (ow = 0) or its mask

    FlatPlan() = default;
    // (scratch: room for a mask of W + VL floats per distinct column offset; advanced)
    FlatPlan(const FlatTaps& T, float*& scratch) {
        const int64_t H = T.H, W = T.W;
        HW = H * W;
        int64_t hmin = 0, hmax = H, smin = 0, smax = 0;
        int n = 0;
        for (int64_t t = 0; t < T.ntap; t++) {
            const int64_t oh = T.off[2 * t], ow = T.off[2 * t + 1];
            shift[t] = oh * W + ow;
            hmin = std::max(hmin, -oh), hmax = std::min(hmax, H - oh);
            smin = std::min(smin, shift[t]), smax = std::max(smax, shift[t]);
        }
        // the taps by column offset
        std::vector<int64_t> ows;
        for (int64_t t = 0; t < T.ntap; t++) ows.push_back(T.off[2 * t + 1]);
        std::sort(ows.begin(), ows.end());
        ows.erase(std::unique(ows.begin(), ows.end()), ows.end());
        for (int64_t ow : ows) {
            gfirst[ngroups] = n;
            for (int64_t t = 0; t < T.ntap; t++)
                if (T.off[2 * t + 1] == ow) order[n++] = (int)t;
            if (ow == 0) {
                mask[ngroups] = nullptr;
            } else {
                // all ones where the column is in the plane, else zero (bit patterns),
                // for the columns j % W of j in [0, W + VL): a vector of pixels i.. reads
                // it from column i % W on
                uint32_t* m = (uint32_t*)scratch;
                scratch += W + VL;
                for (int64_t j = 0; j < W + VL; j++) {
                    const int64_t w = j % W + ow;
                    m[j] = w >= 0 && w < W ? 0xFFFFFFFFu : 0u;
                }
                mask[ngroups] = (const float*)m;
            }
            ngroups++;
        }
        gfirst[ngroups] = n;
        ilo = std::min(HW, std::max(hmin * W, -smin));
        ihi = std::max(ilo, std::min(hmax * W, HW - smax));
    }

    // The kernel's shape when its taps form a grid (every column group the same number
    // of taps, one per row): (rows, columns), else (0, 0).
    std::pair<int, int> grid() const {
        if (ngroups == 0) return {0, 0};
        const int kh = gfirst[1] - gfirst[0];
        for (int g = 0; g < ngroups; g++)
            if (gfirst[g + 1] - gfirst[g] != kh) return {0, 0};
        return {kh, ngroups};
    }
};

// a's lanes where m is all ones, +0 where it is zero
inline vf keep(vf a, vf m) {
    typedef uint32_t vu __attribute__((vector_size(VL * 4)));
    return (vf)((vu)a & (vu)m);
}

// A column mask (all ones / zero lanes) as the masked multiply-add below takes it, and
// acc + a * b on its lanes (acc elsewhere).  AVX-512: a mask register and one masked FMA,
// the masked lanes never computed; elsewhere the product cleared by keep (the wrong
// pixel's product never reaches acc either way: D17).  Against mul, and, add: the flat
// weight gradient's 3x3 body 1.5x (one thread, planes in L2).
#if defined(CG_ISA_AVX512) && !defined(CG_EMULATE_VL16)
#define CG_LANE_MASKS 1
typedef __mmask16 lane_mask;
inline lane_mask lanes_of(vf m) { return _mm512_movepi32_mask(_mm512_castps_si512((__m512)m)); }
inline vf fma_where(vf acc, vf a, vf b, lane_mask k) {
    return (vf)_mm512_mask3_fmadd_ps((__m512)a, (__m512)b, (__m512)acc, k);
}
// lanes [lo, hi) (clamped to the vector)
inline lane_mask lane_range(int64_t lo, int64_t hi) {
    lo = std::max<int64_t>(0, std::min<int64_t>(VL, lo));
    hi = std::max<int64_t>(0, std::min<int64_t>(VL, hi));
    return (lane_mask)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}
// The lanes m of p as float32 (the others zero and never read: no fault past an end).
template <int64_t DT>
inline vf maskz_load_as(lane_mask m, const typename Elem<DT>::T* p) {
    if constexpr (DT == F32) return (vf)_mm512_maskz_loadu_ps(m, p);
    else if constexpr (DT == F16) return (vf)_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    else return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16);
}
#else
typedef vf lane_mask;
inline lane_mask lanes_of(vf m) { return m; }
inline vf fma_where(vf acc, vf a, vf b, lane_mask m) { return acc + keep(a * b, m); }
#endif

template <int64_t DT>
inline float to_f32(typename Elem<DT>::T v) {
    if constexpr (DT == F32) return v;
    else if constexpr (DT == F16) return half_to_float(v);
    else return bf16_to_float(v);
}

// out[h][w0, w1) of one plane over the taps valid there, tap by tap along the row (the
// rows the vectors leave out: where some tap leaves the plane vertically)
inline void flat_row(const FlatTaps& T, const float* in, const float* wt, float* out,
                     int64_t h, int64_t w0, int64_t w1) {
    const int64_t W = T.W;
    float* o = out + h * W;
    for (int64_t w = w0; w < w1; w++) o[w] = 0.0f;
    for (int64_t t = 0; t < T.ntap; t++) {
        const int64_t hh = h + T.off[2 * t], ow = T.off[2 * t + 1];
        if (hh < 0 || hh >= T.H) continue;
        const float* r = in + hh * W + ow;
        const float wv = wt[t];
        const int64_t a = std::max(w0, -ow), b = std::min(w1, W - ow);
        for (int64_t w = a; w < b; w++) o[w] += wv * r[w];
    }
}

// The flat pixels [a, b) of one plane, row piece by row piece (flat_row).
inline void flat_rows(const FlatTaps& T, const float* in, const float* wt, float* out,
                      int64_t a, int64_t b) {
    const int64_t W = T.W;
    while (a < b) {
        const int64_t h = a / W, w0 = a % W, w1 = std::min(W, w0 + (b - a));
        flat_row(T, in, wt, out, h, w0, w1);
        a += w1 - w0;
    }
}

// The vectors of the flat range [F.ilo, F.ihi) of one plane: KH x KW taps (the taps
// of column kw: one per row, the same column offset and mask), 2 vectors at a time.
// KH = KW = 0: any taps (the groups' counts read at run time).
template <int KH, int KW>
int64_t flat_vectors(const FlatPlan& F, const float* in, const float* wt, float* out,
                     int64_t W) {
    constexpr bool fixed = KH > 0;
    constexpr int NT = fixed ? KH * KW : FLAT_TAPS;
    vf wv[NT];
    int64_t sh[NT];
    const int ng = fixed ? KW : F.ngroups;
    for (int k = 0; k < F.gfirst[F.ngroups]; k++) {
        wv[k] = bcast(wt[F.order[k]]);
        sh[k] = F.shift[F.order[k]];
    }
    int64_t i = F.ilo;
    int64_t col = i % W;
    auto advance = [&]() {
        col += VL;
        while (col >= W) col -= W;
    };
    for (; i + 2 * VL <= F.ihi; i += 2 * VL) {
        const int64_t col0 = col;
        advance();
        const int64_t col1 = col;
        advance();
        vf a0 = zero(), a1 = zero();
#pragma GCC unroll 8
        for (int g = 0; g < ng; g++) {
            vf p0 = zero(), p1 = zero();
            const int k0 = fixed ? g * KH : F.gfirst[g], k1 = fixed ? k0 + KH : F.gfirst[g + 1];
#pragma GCC unroll 8
            for (int k = k0; k < k1; k++) {
                const float* s = in + i + sh[k];
                p0 += wv[k] * load(s);
                p1 += wv[k] * load(s + VL);
            }
            if (F.mask[g]) {
                a0 += keep(p0, load(F.mask[g] + col0));
                a1 += keep(p1, load(F.mask[g] + col1));
            } else {
                a0 += p0;
                a1 += p1;
            }
        }
        store(out + i, a0);
        store(out + i + VL, a1);
    }
    for (; i + VL <= F.ihi; i += VL) {
        vf a0 = zero();
        for (int g = 0; g < ng; g++) {
            vf p0 = zero();
            const int k0 = fixed ? g * KH : F.gfirst[g], k1 = fixed ? k0 + KH : F.gfirst[g + 1];
            for (int k = k0; k < k1; k++) p0 += wv[k] * load(in + i + sh[k]);
            a0 += F.mask[g] ? keep(p0, load(F.mask[g] + col)) : p0;
        }
        store(out + i, a0);
        advance();
    }
    return i;
}

// One phase plane: its edges row piece by row piece, its interior in vectors (the
// unrolled loops for the usual kernel shapes).
void flat_plane(const FlatTaps& T, const FlatPlan& F, const float* in, const float* wt,
                float* out) {
    flat_rows(T, in, wt, out, 0, F.ilo);
    const auto g = F.grid();
    const int64_t W = T.W;
    int64_t i;
    if (g == std::make_pair(3, 3)) i = flat_vectors<3, 3>(F, in, wt, out, W);
    else if (g == std::make_pair(5, 5)) i = flat_vectors<5, 5>(F, in, wt, out, W);
    else if (g == std::make_pair(1, 3)) i = flat_vectors<1, 3>(F, in, wt, out, W);
    else if (g == std::make_pair(1, 5)) i = flat_vectors<1, 5>(F, in, wt, out, W);
    else if (g == std::make_pair(2, 2)) i = flat_vectors<2, 2>(F, in, wt, out, W);
    else if (g == std::make_pair(1, 2)) i = flat_vectors<1, 2>(F, in, wt, out, W);
    else if (g == std::make_pair(2, 1)) i = flat_vectors<2, 1>(F, in, wt, out, W);
    else if (g == std::make_pair(1, 1)) i = flat_vectors<1, 1>(F, in, wt, out, W);
    else i = flat_vectors<0, 0>(F, in, wt, out, W);
    flat_rows(T, in, wt, out, i, F.HW);
}

// dw of one channel: every sample's x and dy planes in order, each tap a sum over the
// flat positions (a fixed order: the result does not depend on the threads).  At
// stride sh x sw, x's plane (sh*H x sw*W) is first cut into its phase planes (H x W
// each, in ``planes``), and tap entry t reads phase eph[t] at its shift.
template <int KH, int KW, int64_t DT>
void flat_wgrad_channel(const FlatProblem* P, const FlatTaps& T, const FlatPlan& F,
                        int64_t c, const int* eph, float* planes) {
    typedef typename Elem<DT>::T E;
    constexpr bool fixed = KH > 0;
    constexpr int NT = fixed ? KH * KW : FLAT_TAPS;
    const int64_t W = T.W, nt = T.ntap;
    const int ng = fixed ? KW : F.ngroups;
    int64_t sh[NT];
    for (int k = 0; k < F.gfirst[F.ngroups]; k++) sh[k] = F.shift[F.order[k]];
    vf acc[NT];
    float edge[FLAT_TAPS];
    for (int k = 0; k < F.gfirst[F.ngroups]; k++) acc[k] = zero();
    for (int64_t t = 0; t < nt; t++) edge[t] = 0.0f;
    const int64_t HW = T.H * W, nph = P->sh * P->sw;
    const E* xb[NT];
    // (rowcol: a fixed grid on one plane whose tap shifts are row + column offsets, the
    // middle column group alone unmasked)
    int64_t rs[NT];
    bool rowcol = fixed && nph == 1 && KW % 2 == 1 && !(cg_engine_dbg & 524288);
    for (int g = 0; fixed && g < KW && rowcol; g++) {
        rowcol = (F.mask[g] == nullptr) == (g == KW / 2);
        for (int j = 0; j < KH; j++) {
            if (g == 0) rs[j] = sh[j];
            rowcol = rowcol && sh[g * KH + j] - sh[g * KH] == rs[j] - rs[0];
        }
    }
    for (int64_t n = 0; n < P->N; n++) {
        const E* x = (const E*)P->src + n * P->sn + c * P->sc;
        const E* dy = (const E*)P->w + n * P->yn + c * P->yc;
        if constexpr (DT == F32) if (nph > 1) {
            // phase (rh, rw)'s row a, column b: x[a*sh + rh][b*sw + rw]
            const int64_t XW = W * P->sw;
            for (int64_t hx = 0; hx < T.H * P->sh; hx++) {
                const float* xr = x + hx * XW;
                split_phases(planes + (hx % P->sh) * P->sw * HW + (hx / P->sh) * W, HW, xr, XW,
                             P->sw);
            }
        }
        // (strided: float32 only, its x planes split into phase planes)
        auto base = [&](int64_t t) { return nph > 1 ? (const E*)(planes + eph[t] * HW) : x; };
        for (int k = 0; k < F.gfirst[F.ngroups]; k++) xb[k] = base(F.order[k]);
        // the row pieces the vectors leave out, tap by tap
        auto rows = [&](int64_t a, int64_t b) {
            while (a < b) {
                const int64_t h = a / W, w0 = a % W, w1 = std::min(W, w0 + (b - a));
                for (int64_t t = 0; t < nt; t++) {
                    const int64_t hh = h + T.off[2 * t], ow = T.off[2 * t + 1];
                    if (hh < 0 || hh >= T.H) continue;
                    const E* r = base(t) + hh * W + ow;
                    const E* d = dy + h * W;
                    float e = 0.0f;
                    for (int64_t w = std::max(w0, -ow); w < std::min(w1, W - ow); w++)
                        e += to_f32<DT>(r[w]) * to_f32<DT>(d[w]);
                    edge[t] += e;
                }
                a += w1 - w0;
            }
        };
#if CG_LANE_MASKS
        // The pixels [a, b) vector by vector with masked loads and multiply-adds: a tap's
        // lanes are those whose column (its group's mask) and row (p + oh * W in the
        // plane) it reads inside the plane, and below b; the masked lanes are never
        // loaded (no fault past the plane's ends).  Against the scalar row pieces: the
        // 56 x 56 planes' first and last rows were a third of the time.
        auto edges = [&](int64_t a, int64_t b) {
            for (int64_t p = a; p < b; p += VL) {
                const lane_mask in = lane_range(0, b - p);
                const vf d = maskz_load_as<DT>(in, dy + p);
                const int64_t cp = p % W;
                for (int g = 0; g < F.ngroups; g++) {
                    const lane_mask mg = F.mask[g] ? in & lanes_of(load(F.mask[g] + cp)) : in;
                    for (int k = F.gfirst[g]; k < F.gfirst[g + 1]; k++) {
                        const int64_t oh = T.off[2 * F.order[k]];
                        const lane_mask m = mg & lane_range(-oh * W - p, HW - oh * W - p);
                        if (m == 0) continue;
                        const vf xv = maskz_load_as<DT>(m, xb[k] + p + sh[k]);
                        acc[k] = fma_where(acc[k], d, xv, m);
                    }
                }
            }
        };
        if (!(cg_engine_dbg & 524288)) edges(0, F.ilo);
        else
#endif
        rows(0, F.ilo);
        // the next planes (this channel's next sample, or the next channel's first)
        // are prefetched along, a cache line of dy and nph of x per 16 pixels
        const bool last = n + 1 == P->N;
        const E* xn = last ? (c + 1 < P->C ? (const E*)P->src + (c + 1) * P->sc : nullptr)
                           : x + P->sn;
        const E* yn = last ? (c + 1 < P->C ? (const E*)P->w + (c + 1) * P->yc : nullptr)
                           : dy + P->yn;
        if (cg_engine_dbg & 32768) xn = nullptr;
        int64_t i = F.ilo, col = i % W;
        if (rowcol) {
            // taps (row j, column group g) at shift rs[j] + cs[g] of one plane, the middle
            // column group unmasked: the KH row pointers and KW column indices stay in
            // registers (with a pointer a tap, GCC spilled them, reloaded every vector)
            constexpr int MID = KW / 2;
            const E* xr[fixed ? KH : 1];
            int64_t cs[fixed ? KW : 1];
            const float* mk[fixed ? KW : 1];
            for (int j = 0; j < KH; j++) xr[j] = x + rs[j];
            for (int g = 0; g < KW; g++) cs[g] = sh[g * KH] - rs[0], mk[g] = F.mask[g];
            for (; i + VL <= F.ihi; i += VL) {
                if (xn) {
                    __builtin_prefetch(yn + i);
                    __builtin_prefetch(xn + i);
                }
                const vf d = load_as<DT>(dy + i);
#pragma GCC unroll 8
                for (int g = 0; g < KW; g++) {
                    const int64_t ig = i + cs[g];
                    if (g == MID) {
#pragma GCC unroll 8
                        for (int j = 0; j < KH; j++) acc[g * KH + j] += d * load_as<DT>(xr[j] + ig);
                    } else {
                        const lane_mask m = lanes_of(load(mk[g] + col));
#pragma GCC unroll 8
                        for (int j = 0; j < KH; j++)
                            acc[g * KH + j] =
                                fma_where(acc[g * KH + j], d, load_as<DT>(xr[j] + ig), m);
                    }
                }
                col += VL;
                while (col >= W) col -= W;
            }
        }
        for (; i + VL <= F.ihi; i += VL) {
            if (xn && (i & 15) < VL) {
                __builtin_prefetch(yn + i);
                for (int64_t j = 0; j < nph; j++) __builtin_prefetch(xn + (i * nph + 16 * j));
            }
            const vf d = load_as<DT>(dy + i);
#pragma GCC unroll 8
            for (int g = 0; g < ng; g++) {
                const int k0 = fixed ? g * KH : F.gfirst[g];
                const int k1 = fixed ? k0 + KH : F.gfirst[g + 1];
                if (F.mask[g]) {
                    const lane_mask m = lanes_of(load(F.mask[g] + col));
#pragma GCC unroll 8
                    for (int k = k0; k < k1; k++)
                        acc[k] = fma_where(acc[k], d, load_as<DT>(xb[k] + i + sh[k]), m);
                } else {
#pragma GCC unroll 8
                    for (int k = k0; k < k1; k++) acc[k] += d * load_as<DT>(xb[k] + i + sh[k]);
                }
            }
            col += VL;
            while (col >= W) col -= W;
        }
#if CG_LANE_MASKS
        if (!(cg_engine_dbg & 524288)) edges(i, F.HW);
        else
#endif
        rows(i, F.HW);
    }
    for (int k = 0; k < F.gfirst[F.ngroups]; k++) {
        const int t = F.order[k];
        P->out[P->widx[t] * P->C + c] = hsum(acc[k]) + edge[t];
    }
}

}  // namespace

extern "C" {

int64_t cg_flat_scratch(const FlatProblem* P) {
    // a mask per tap entry at most, the phase planes of a strided result, the weights
    return P->ntap * (P->W + VL) + (P->sh * P->sw > 1 ? P->sh * P->sw * P->H * P->W : 0) +
           P->ntap + 16;
}

// The result planes [lo, hi) (numbered n * C + c).
void cg_flat_corr_run(const FlatProblem* P, int64_t lo, int64_t hi, float* scratch) {
    const int64_t nph = P->sh * P->sw, HW = P->H * P->W;
    FlatTaps T[16];
    FlatPlan F[16];
    float* free_ = scratch;
    for (int64_t k = 0; k < nph; k++) {
        const int64_t* ph = P->phases + 4 * k;
        T[k] = FlatTaps{P->off + 2 * ph[2], ph[3] - ph[2], P->H, P->W};
        F[k] = FlatPlan(T[k], free_);
    }
    float* planes = nph > 1 ? free_ : nullptr;
    if (planes) free_ += nph * HW;
    float* wt = free_;
    const int64_t OW = P->W * P->sw;           // a result row
    for (int64_t pl = lo; pl < hi; pl++) {
        const int64_t n = pl / P->C, c = pl % P->C;
        const float* in = P->src + n * P->sn + c * P->sc;
        float* out = P->out + n * P->on + c * P->oc;
        for (int64_t e = 0; e < P->ntap; e++) wt[e] = P->w[P->widx[e] * P->C + c];
        for (int64_t k = 0; k < nph; k++) {
            const int64_t* ph = P->phases + 4 * k;
            float* o = planes ? planes + k * HW : out;
            if (T[k].ntap == 0) std::memset(o, 0, sizeof(float) * HW);
            else flat_plane(T[k], F[k], in, wt + ph[2], o);
        }
        if (!planes) continue;
        // the phases interleaved into the result's rows: row a * sh + rh, column
        // b * sw + rw of phase (rh, rw)'s pixel (a, b) (phases numbered rh * sw + rw)
        for (int64_t a = 0; a < P->H; a++)
            for (int64_t rh = 0; rh < P->sh; rh++) {
                const float* src = planes + rh * P->sw * HW + a * P->W;
                merge_phases(out + (a * P->sh + rh) * OW, src, HW, OW, P->sw);
            }
    }
}

// dw for the channels [c0, c1), each channel by one call (flat_wgrad_channel).
// At stride sh x sw the tap entries come phase by phase (P->phases: rh, rw, first and
// end entry), each a shift on its phase plane of x, and P->widx gives their taps.
void cg_flat_wgrad_run(const FlatProblem* P, int64_t c0, int64_t c1, float* scratch) {
    const FlatTaps T{P->off, P->ntap, P->H, P->W};
    float* free_ = scratch;
    const FlatPlan F(T, free_);
    const int64_t nph = P->sh * P->sw;
    float* planes = nph > 1 ? free_ : nullptr;
    int eph[FLAT_TAPS];                    // the phase plane each tap entry reads
    for (int64_t k = 0; k < nph; k++) {
        const int64_t* ph = P->phases + 4 * k;
        for (int64_t t = ph[2]; t < ph[3]; t++) eph[t] = (int)(ph[0] * P->sw + ph[1]);
    }
    const auto g = F.grid();
    auto channels = [&](auto dt) {
        constexpr int64_t DT = decltype(dt)::value;
        for (int64_t c = c0; c < c1; c++) {
            if (g == std::make_pair(3, 3)) flat_wgrad_channel<3, 3, DT>(P, T, F, c, eph, planes);
            else if (g == std::make_pair(5, 5)) flat_wgrad_channel<5, 5, DT>(P, T, F, c, eph, planes);
            else if (g == std::make_pair(1, 3)) flat_wgrad_channel<1, 3, DT>(P, T, F, c, eph, planes);
            else if (g == std::make_pair(1, 5)) flat_wgrad_channel<1, 5, DT>(P, T, F, c, eph, planes);
            else flat_wgrad_channel<0, 0, DT>(P, T, F, c, eph, planes);
        }
    };
    // (16-bit x and dy widened as they are loaded: stride 1 only, see grouped.py _flat)
    if (P->dtype == F16) channels(std::integral_constant<int64_t, F16>{});
    else if (P->dtype == BF16) channels(std::integral_constant<int64_t, BF16>{});
    else channels(std::integral_constant<int64_t, F32>{});
}

}  // extern "C"
