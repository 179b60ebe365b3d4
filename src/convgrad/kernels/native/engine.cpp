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

#include "common.h"
#include "simd.h"
#include "tiles.h"

using namespace cg;

CG_ISA_OF(engine)

namespace {

// ---------------------------------------------------------------------------------------
// corr: the register tile

// Output blocks a tile of R pixels takes at once: narrow tiles (the pixels at an
// image border, or a short line) still keep enough independent accumulators.
constexpr int corr_blocks(int r, int nv) {
    int b = ACC / (r * nv);
    return b < 1 ? 1 : (b > BMAX ? BMAX : b);
}

// A tile's accumulators stored: out[i] (elements of DT from outp[i], off further) gets
// pixel i's B blocks, channels ochan elements apart; nvalid valid channels (only the last
// block may be partial).  16-bit results (channels-last callers, ochan == 1) are rounded
// here, as store_as rounds a converted line; stream: whole aligned vectors with streaming
// stores (see CorrProblem::stream).
template <int64_t DT, int R, int B, int NV>
__attribute__((always_inline)) inline void corr_store(vf (&acc)[R][B][NV], void* const* outp,
                                                      int64_t off, int64_t ochan, int nvalid,
                                                      bool stream) {
    using T = typename Elem<DT>::T;
    constexpr int NB = NV * VL;
    T* out[R];
#pragma GCC unroll 64
    for (int i = 0; i < R; i++) out[i] = (T*)outp[i] + off;
    if (ochan == 1 && nvalid == B * NB && stream) {
#pragma GCC unroll 64
        for (int i = 0; i < R; i++)
#pragma GCC unroll 8
            for (int b = 0; b < B; b++)
#pragma GCC unroll 8
                for (int v = 0; v < NV; v++)
                    store_as<DT, true>(out[i] + b * NB + v * VL, acc[i][b][v]);
    } else if (ochan == 1 && nvalid == B * NB) {
#pragma GCC unroll 64
        for (int i = 0; i < R; i++)
#pragma GCC unroll 8
            for (int b = 0; b < B; b++)
#pragma GCC unroll 8
                for (int v = 0; v < NV; v++) store_as<DT>(out[i] + b * NB + v * VL, acc[i][b][v]);
    } else if (ochan == 1) {
        for (int i = 0; i < R; i++)
            for (int b = 0; b < B; b++)
                for (int v = 0; v < NV; v++) {
                    int n = nvalid - b * NB - v * VL;
                    if (n >= VL) store_as<DT>(out[i] + b * NB + v * VL, acc[i][b][v]);
                    else if (n > 0) store_as_n<DT>(out[i] + b * NB + v * VL, acc[i][b][v], n);
                }
    } else if constexpr (DT == F32) {
        for (int i = 0; i < R; i++)
            for (int j = 0; j < nvalid; j++)
                out[i][j * ochan] = acc[i][j / NB][(j % NB) / VL][j % VL];
    }
}

// out_i[b*NB + j] = sum_t sum_c x_{t,i}[c] * w_t[b][c*NB + j] for R pixels i and
// B blocks b: xp[t*R + i] is pixel i's input row for tap t (channel 0 of its
// group), wp[t] block 0's weights for tap t (input channel c at wp[t] + c*wc), the
// next blocks wstride floats apart.
// Pixels of one tile may come from different lines (they share their taps).
// Outputs of dtype odt (float16 / bfloat16 only channels-last: ochan == 1).
// reps > 1: the same for the next reps - 1 groups of B blocks (weights B * wstride
// floats further, outputs B * NB channels further), all whole (nvalid = B * NB): a
// short sum (a 1x1 data gradient's 64 channels) then pays the call and the loading of
// its pointers once for all of them.
template <int R, int NV, int B>
void corr_tile(int ntap, const float* const* xp, const float* const* wp, int64_t wstride,
               int64_t wc, int64_t cin, void* const* outp, int64_t ochan, int nvalid,
               bool stream, int64_t reps, const char* pf, int64_t pfl, int64_t odt) {
    constexpr int NB = NV * VL;
    // pfl cache lines from pf on (the next tile's input) prefetched, a few per channel of
    // the first tap
    const int64_t per = pfl > 0 ? (pfl + cin - 1) / cin : 0;
    for (int64_t rep = 0; rep < reps; rep++) {
        const int64_t wo = rep * B * wstride;
        vf acc[R][B][NV];
#pragma GCC unroll 64
        for (int i = 0; i < R; i++)
#pragma GCC unroll 8
            for (int b = 0; b < B; b++)
#pragma GCC unroll 8
                for (int v = 0; v < NV; v++) acc[i][b][v] = zero();
        for (int t = 0; t < ntap; t++) {
            const float* x[R];
#pragma GCC unroll 64
            for (int i = 0; i < R; i++) x[i] = xp[t * R + i];
            const float* w = wp[t] + wo;
            const bool fetch = per > 0 && rep == 0 && t == 0;
            for (int64_t c = 0; c < cin; c++) {
                if (fetch && c * per < pfl) {
                    for (int64_t k = 0; k < per; k++) __builtin_prefetch(pf + 64 * (c * per + k), 0, 3);
                }
                vf wv[B][NV];
#pragma GCC unroll 8
                for (int b = 0; b < B; b++)
#pragma GCC unroll 8
                    for (int v = 0; v < NV; v++) wv[b][v] = load(w + b * wstride + c * wc + v * VL);
#pragma GCC unroll 64
                for (int i = 0; i < R; i++) {
                    vf s = bcast(x[i][c]);
#pragma GCC unroll 8
                    for (int b = 0; b < B; b++)
#pragma GCC unroll 8
                        for (int v = 0; v < NV; v++) acc[i][b][v] += s * wv[b][v];
                }
            }
        }
        // nvalid counts the valid channels of all B blocks (only the last may be partial)
        const int64_t off = rep * B * NB * ochan;
        if (odt == F32) corr_store<F32>(acc, outp, off, ochan, nvalid, stream);
        else if (odt == F16) corr_store<F16>(acc, outp, off, ochan, nvalid, stream);
        else corr_store<BF16>(acc, outp, off, ochan, nvalid, stream);
    }
}

typedef void (*corr_fn)(int, const float* const*, const float* const*, int64_t, int64_t,
                        int64_t, void* const*, int64_t, int, bool, int64_t, const char*,
                        int64_t, int64_t);

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
    void* out;                 // the output, float32 (or float16/bfloat16: out_dtype)
    int64_t ostride[5];        // its strides, n, d, h, w, c (elements)
    int64_t out_dtype;
    int64_t N, Lin[3], Cin, Cout, groups;
    int64_t is[3];             // input step per output index
    int64_t os[3];             // output step per output index
    const int64_t* phases;     // per phase: or[3], U[3], tap_begin, tap_end
    const int64_t* taps;       // per tap entry: off[3], weight tap index
    const float* wpk;          // weights: block ob of group g, tap t, input channel c at
                               // wpk + g*wg + ob*wob + t*wt + c*wc (NB floats)
    int64_t wg, wob, wt, wc;
    int64_t ntap_w;            // weight taps
    int64_t nv;                // NB = nv * VL output channels per block
    int64_t r;                 // pixels per tile (<= CORR_RMAX[nv])
    int64_t ob_group;          // output blocks whose weight panels an item sweeps at once
    const int64_t* items;      // per item: phase, first line, end line (lines of the
                               // phase numbered (n * Ud + ud) * Uh + uh), first and end
                               // output block (of every group)
    int64_t stream;            // write channels-last output blocks of whole cache lines
                               // (float32, or 16-bit ones the tiles round) or converted
                               // lines with streaming stores (the caller checked their
                               // alignment; native.py: _results.streams)
    int64_t wphases;           // phases an item computes: 1, or (a buffered data gradient,
                               // see cg_corr_run) the os[2] consecutive phases of one
                               // (rd, rh), or the os[1] * os[2] of one rd -- its item's
                               // phase is the first of them
    int64_t hphases;           // of those, h phases (output rows per line): 1 or os[1]
};

const char* cg_isa(void) { return CG_ISA_NAME; }
int64_t cg_vector_floats(void) { return VL; }
// Debug switches for A/B measurements, 0 in use.  Bits: 0 no streaming corr tiles; 6 one
// corr call per output block; 7 winograd.cpp's lines convert every channel; 8 the weight
// gradient's w taps in kw order, one tap a tile (cfwgrad.cpp too); 9 no streaming
// channels-first corr runs; 10 channels-first
// float32 lines through a staging copy (common.h); 11 no streaming Winograd NCX results;
// 12 no x-row prefetch in the GEMM tile, 13 never its far prefetch (tiles.h); 14 16-bit
// result lines stored plainly; 15 no next-plane prefetch in the flat depthwise weight
// gradient (grouped.cpp); 17 the GEMM tile reads every row through a pointer of its
// own (tiles.h); 18 the engine's workers may run on the caller's CPU (pool.cpp); 29 no
// prefetch of the next corr tile's input rows; 1 (DBG_BUFFER_16BIT) 16-bit channels-last
// corr results through float32 line buffers (set it before a call is bound: the line
// buffers need scratch, sized then).
int64_t cg_engine_dbg = 0;
void cg_engine_set_dbg(int64_t v) { cg_engine_dbg = v; }
int64_t cg_corr_rmax(int64_t nv) { return nv >= 1 && nv <= 4 ? CORR_RMAX[nv] : 0; }

// Floats of scratch the items [lo, hi) need at most (packing the input).
int64_t cg_corr_scratch(const CorrProblem* P, int64_t lo, int64_t hi);

void cg_corr_run(const CorrProblem* P, int64_t lo, int64_t hi, float* scratch);

// Work items [0, n) shared by the threads calling this at once: each takes the next
// item (an atomic counter, *next starting at 0) until none is left, so no thread
// waits on another's last item (items write disjoint outputs: the result does not
// depend on who computes what).
void cg_corr_run_shared(const CorrProblem* P, int64_t* next, int64_t n, float* scratch);

}  // extern "C"

namespace {

// One output line of an item: where it is, and per tap of its phase the input
// line (null when the tap reads only padding there) and the w range it reads.
struct LineTaps {
    int64_t n, ud, uh;
    char* out;                   // output pixel u = 0 of the line
};

inline void decode_line(const int64_t* ph, int64_t l, int64_t& n, int64_t& ud, int64_t& uh) {
    const int64_t Ud = ph[3], Uh = ph[4];
    n = l / (Ud * Uh);
    ud = (l / Uh) % Ud;
    uh = l % Uh;
}

// Keys (n * Lin0 + d) * Lin1 + h of the input lines the item reads (the phases it
// computes), sorted.
void item_line_keys(const CorrProblem* P, const int64_t* item, std::vector<int64_t>& keys) {
    keys.clear();
    for (int64_t f = 0; f < P->wphases; f++)
    for (int64_t l = item[1]; l < item[2]; l++) {
        const int64_t* ph = P->phases + 8 * (item[0] + f);
        int64_t n, ud, uh;
        decode_line(ph, l, n, ud, uh);
        for (int64_t k = ph[6]; k < ph[7]; k++) {
            const int64_t* tp = P->taps + 4 * k;
            const int64_t d = ud * P->is[0] + tp[0], h = uh * P->is[1] + tp[1];
            if (d >= 0 && d < P->Lin[0] && h >= 0 && h < P->Lin[1])
                keys.push_back((n * P->Lin[0] + d) * P->Lin[1] + h);
        }
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
}

// Output pixels per line of an item's buffer: its phase's, the whole output line when
// the item computes all the w phases of a data gradient, or os[1] whole output rows
// when it computes all the (h, w) phases.
inline int64_t item_width(const CorrProblem* P, const int64_t* item) {
    int64_t w = 0;
    for (int64_t f = 0; f < P->wphases; f++) w += P->phases[8 * (item[0] + f) + 5];
    return w;
}

// A set of output pixels sharing their valid taps, in item order.
struct PixelClass {
    std::vector<int64_t> taps;       // tap entries of the phase
    std::vector<int32_t> line;       // per pixel: index into the item's lines
    std::vector<int64_t> u;          // per pixel: position on its line
};

}  // namespace

// Whether the corr tiles store a channels-last float16 / bfloat16 result themselves
// (rounded in registers, as store_run rounds a line) rather than into a float32 line
// buffer converted afterwards: items of one phase (a merged data gradient's buffer
// interleaves its phases; native.py plans them only for buffered results).
// (2026-11-27, Zen 5, 2 threads, in one process, DBG_BUFFER_16BIT for A/B: ResNet-50 res2's
// 1x1 data gradient, float16 1.17x faster after the benchmark's pause and 1.14x hot,
// bfloat16 1.15x / 1.16x; the line buffers' narrowing pass had been ~10% of the call.)
constexpr int64_t DBG_BUFFER_16BIT = 2;
inline bool direct_16bit(const CorrProblem* P) {
    return P->out_dtype != F32 && P->ostride[4] == 1 && P->wphases <= 1 &&
           !(cg_engine_dbg & DBG_BUFFER_16BIT);
}

// Whether an item computes its result into a float32 channels-last line buffer:
// channels-first results, and 16-bit ones the tiles do not store themselves.
inline bool out_buffered(const CorrProblem* P) {
    return (P->ostride[4] != 1 || P->out_dtype != F32) && !direct_16bit(P);
}

int64_t cg_corr_scratch(const CorrProblem* P, int64_t lo, int64_t hi) {
    const bool packed = !direct_f32(P->in), obuf = out_buffered(P);
    int64_t most = 0;
    std::vector<int64_t> keys;
    for (int64_t it = lo; it < hi; it++) {
        const int64_t* item = P->items + 5 * it;
        int64_t need = 0;
        if (packed) {
            item_line_keys(P, item, keys);
            need += (int64_t)keys.size() * P->Lin[2] * P->Cin;
        }
        if (obuf) need += (item[2] - item[1]) * item_width(P, item) * P->Cout;
        most = std::max(most, need);
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
    const int64_t bg = std::max<int64_t>(1, P->ob_group);
    const int64_t* os = P->os;
    const int64_t xpix = packed ? P->Cin : P->in.stride[3];
    // outputs whose channels are not contiguous (NCX callers), and 16-bit ones of
    // merged phases, are computed into a float32 channels-last buffer per item and
    // transposed / converted into place line by line; others the tiles store (16-bit
    // ones rounded there)
    const bool obuf = out_buffered(P);
    const int64_t ochan = obuf ? 1 : P->ostride[4];
    const int64_t odt = obuf ? F32 : P->out_dtype, oes = itemsize(odt);
    // streaming stores only where a tile's stores fill whole cache lines; however few
    // products a tile sums (2026-11-26, Sapphire Rapids, 2 threads, alternating, debug
    // bit 0 for A/B: ResNet-50 res2's 1x1 data gradient, 64 products per output, 1.22x
    // faster with them after the benchmark's pause and hot, 1.24x / 1.48x on the AVX2
    // build; on a Zen 3 they had measured level to 1.1x slower there, and kept plain
    // stores below 128 products)
    const bool stream = P->stream && !obuf && NB * oes % 64 == 0 && !(cg_engine_dbg & 1);
    // channels-last 16-bit results through line buffers (DBG_BUFFER_16BIT): each converted
    // line streamed
    const bool stream_lines = P->stream && obuf && P->ostride[4] == 1 && !(cg_engine_dbg & 16384);
    // float32 channels-first results: the channel runs that fill whole cache lines
    // streamed (store_channel_runs checks each run)
    const bool stream_runs = P->stream && obuf && P->ostride[4] != 1 && P->ostride[3] == 1 &&
                             P->out_dtype == F32 && !(cg_engine_dbg & 512);

    std::vector<int64_t> keys;
    std::vector<LineTaps> lines;
    std::vector<const float*> lptr;              // [line][tap]: input line or null
    std::vector<int64_t> u0s, u1s;               // [line][tap]: w range
    std::vector<PixelClass> classes;
    std::vector<int64_t> bps, valid;
    std::vector<const float*> xt, wt;
    std::vector<int64_t> tap_e, tap_off;
    char* optr[64];

    for (int64_t it = lo; it < hi; it++) {
        const int64_t* item = P->items + 5 * it;
        if (packed) {
            item_line_keys(P, item, keys);
            pack_keyed_lines(scratch, P->in, keys, P->Lin[0], P->Lin[1], W, P->Cin);
        }
        float* const outbuf = scratch + (packed ? (int64_t)keys.size() * W * P->Cin : 0);
        const int64_t nl = item[2] - item[1];
        // an item of several w phases (a buffered data gradient) computes whole output
        // lines into its buffer, the phases' pixels interleaved there, and stores each
        // line once: stored phase by phase, every output line of an NCX caller was
        // written a few floats of every cache line at a time, once per phase.  An item
        // of every (h, w) phase of an rd computes os[1] consecutive output rows per
        // line: for an NCX caller each channel's rows of a line are then one run of
        // whole cache lines (56 x 56 images at stride 2: 2 x 56 floats, 7 lines), which
        // may be streamed, and the dy rows the h phases share are converted once
        const bool merged = P->wphases > 1;
        const int64_t hph = std::max<int64_t>(1, P->hphases), wph = P->wphases / hph;
        const int64_t bw = item_width(P, item) / hph;  // pixels of a buffered row
        const int64_t* ph0 = P->phases + 8 * item[0];
        for (int64_t f = 0; f < P->wphases; f++) {
            const int64_t* ph = ph0 + 8 * f;
            const int64_t hrow = f / wph;              // the phase's row in the buffer
            const int64_t ord = ph[0], orh = ph[1], orw = ph[2];
            const int64_t Uw = ph[5];
            const int64_t tb = ph[6], te = ph[7], nt = te - tb;
            // per line: the taps' input lines and w ranges; pixels grouped by valid taps
            const int64_t opix = obuf ? (merged ? os[2] : 1) * P->Cout : os[2] * P->ostride[3];
            lines.resize(nl);
            lptr.assign(nl * nt, nullptr);
            u0s.assign(nl * nt, 0);
            u1s.assign(nl * nt, 0);
            for (auto& c : classes) {
                c.line.clear();
                c.u.clear();
            }
            size_t ncls = 0;
            for (int64_t li = 0; li < nl; li++) {
                int64_t n, ud, uh;
                decode_line(ph, item[1] + li, n, ud, uh);
                LineTaps& L = lines[li];
                L.n = n, L.ud = ud, L.uh = uh;
                L.out = obuf ? (char*)(outbuf + ((li * hph + hrow) * bw + (merged ? orw : 0)) *
                                                     P->Cout)
                             : (char*)P->out + oes * (n * P->ostride[0] +
                                                      (ud * os[0] + ord) * P->ostride[1] +
                                                      (uh * os[1] + orh) * P->ostride[2] +
                                                      orw * P->ostride[3]);
                bps.assign({0, Uw});
                for (int64_t k = 0; k < nt; k++) {
                    const int64_t* tp = P->taps + 4 * (tb + k);
                    const int64_t dd = ud * P->is[0] + tp[0], hh = uh * P->is[1] + tp[1];
                    if (dd < 0 || dd >= P->Lin[0] || hh < 0 || hh >= P->Lin[1]) continue;
                    int64_t a, b;
                    valid_range(Uw, P->is[2], tp[2], W, a, b);
                    if (b <= a) continue;
                    const float* line;
                    if (packed) {
                        const int64_t key = (n * P->Lin[0] + dd) * P->Lin[1] + hh;
                        line = scratch + (std::lower_bound(keys.begin(), keys.end(), key) -
                                          keys.begin()) * W * P->Cin;
                    } else {
                        line = (const float*)at(P->in, n, dd, hh, 0, 0);
                    }
                    lptr[li * nt + k] = line;
                    u0s[li * nt + k] = a;
                    u1s[li * nt + k] = b;
                    bps.push_back(a);
                    bps.push_back(b);
                }
                std::sort(bps.begin(), bps.end());
                bps.erase(std::unique(bps.begin(), bps.end()), bps.end());
                for (size_t s = 0; s + 1 < bps.size(); s++) {
                    const int64_t a = bps[s], e = bps[s + 1];
                    valid.clear();
                    for (int64_t k = 0; k < nt; k++)
                        if (lptr[li * nt + k] && u0s[li * nt + k] <= a && u1s[li * nt + k] >= e)
                            valid.push_back(k);
                    size_t c = 0;
                    while (c < ncls && classes[c].taps != valid) c++;
                    if (c == ncls) {
                        if (ncls == classes.size()) classes.emplace_back();
                        classes[c].taps = valid;
                        classes[c].line.clear();
                        classes[c].u.clear();
                        ncls++;
                    }
                    for (int64_t u = a; u < e; u++) {
                        classes[c].line.push_back((int32_t)li);
                        classes[c].u.push_back(u);
                    }
                }
            }
            // every output block of every group, a few blocks' weights at a time
            for (int64_t g = 0; g < G; g++) {
                for (int64_t ob0 = item[3]; ob0 < std::min(nob, item[4]); ob0 += bg) {
                    const int64_t ob1 = std::min(std::min(nob, item[4]), ob0 + bg);
                    for (size_t ci = 0; ci < ncls; ci++) {
                        const PixelClass& C = classes[ci];
                        const int64_t npx = (int64_t)C.u.size();
                        const int ntp = (int)C.taps.size();
                        if (ntp == 0) {
                            for (int64_t p = 0; p < npx; p++) {
                                char* o = lines[C.line[p]].out +
                                          oes * (C.u[p] * opix + (g * cout_g + ob0 * NB) * ochan);
                                const int64_t m = std::min(cout_g, ob1 * NB) - ob0 * NB;
                                // (+0 is all zero bits in float16 and bfloat16 too)
                                if (ochan == 1) std::memset(o, 0, oes * m);
                                else for (int64_t j = 0; j < m; j++) ((float*)o)[j * ochan] = 0.0f;
                            }
                            continue;
                        }
                        xt.resize((size_t)ntp * rmax);
                        wt.resize(ntp);
                        // per tap of the class: its entry in a line's taps and its input
                        // offset (floats) beyond the pixel's own (u * is * xpix)
                        tap_e.resize(ntp);
                        tap_off.resize(ntp);
                        for (int k = 0; k < ntp; k++) {
                            tap_e[k] = C.taps[k];
                            tap_off[k] = P->taps[4 * (tb + C.taps[k]) + 2] * xpix + g * cin_g;
                        }
                        const int64_t* const te_ = tap_e.data();
                        const int64_t* const to_ = tap_off.data();
                        const int64_t ustep = P->is[2] * xpix;
                        // tiles of near-equal size (a class of 50 pixels: 6,6,6,6,6,5,5,5,5 --
                        // no narrow last tile starved of accumulators)
                        const int64_t ntiles = (npx + rmax - 1) / rmax;
                        for (int64_t tile = 0, p = 0; tile < ntiles; tile++) {
                            const int r = (int)(npx / ntiles + (tile < npx % ntiles ? 1 : 0));
                            const int64_t p0 = p;
                            p += r;
                            // (the taps' input rows of each pixel: one load and two adds a
                            // tap; it had re-read the tap table per pixel and tap, 5% of a
                            // stride-2 data gradient's engine time)
                            const float** const xq = xt.data();
                            for (int i = 0; i < r; i++) {
                                const int64_t li = C.line[p0 + i];
                                const int64_t u = C.u[p0 + i];
                                optr[i] = lines[li].out + oes * (u * opix + (g * cout_g) * ochan);
                                const float* const* const lp = lptr.data() + li * nt;
                                const int64_t ub = u * ustep;
                                for (int k = 0; k < ntp; k++) xq[k * r + i] = lp[te_[k]] + ub + to_[k];
                            }
                            // the next tile's input rows (its first tap), where they lie
                            // close together: prefetched into L1 during this tile's first
                            // call (2026-11-27, Zen 5, alternating in one process, debug
                            // bit 29 for A/B: ResNet-50 res2's 1x1 data gradient, whose dy
                            // pixels stream from memory, 1.11-1.17x after the pause and
                            // 1.11x hot; res3 stride 2 1.03-1.06x, DCGAN level; into L2
                            // instead: the same on res2, 0.96x on res3)
                            const char* pf = nullptr;
                            int64_t pfl = 0;
                            if (tile + 1 < ntiles && !(cg_engine_dbg & 536870912)) {
                                const int rn = (int)(npx / ntiles + (tile + 1 < npx % ntiles ? 1 : 0));
                                const int64_t* tp = P->taps + 4 * (tb + C.taps[0]);
                                auto row = [&](int64_t q) {
                                    return (const char*)(lptr[C.line[q] * nt + C.taps[0]] +
                                                         (C.u[q] * P->is[2] + tp[2]) * xpix +
                                                         g * cin_g);
                                };
                                const char* a = row(p);
                                const char* e = row(p + rn - 1) + 4 * cin_g;
                                if (e > a && e - a <= 65536) {
                                    pf = (const char*)((uintptr_t)a & ~(uintptr_t)63);
                                    pfl = (e - pf + 63) / 64;
                                }
                            }
                            const int bmax = corr_blocks(r, nv);
                            for (int64_t ob = ob0; ob < ob1;) {
                                const int b = (int)std::min<int64_t>(bmax, ob1 - ob);
                                const int nvalid = (int)std::min<int64_t>(b * NB, cout_g - ob * NB);
                                // groups of b whole blocks in one call (see corr_tile)
                                const int64_t reps = b == bmax && !(cg_engine_dbg & 64)
                                    ? std::max<int64_t>(1, (std::min(ob1, cout_g / NB) - ob) / b)
                                    : 1;
                                for (int k = 0; k < ntp; k++) {
                                    const int64_t* tp = P->taps + 4 * (tb + C.taps[k]);
                                    wt[k] = P->wpk + g * P->wg + ob * P->wob + tp[3] * P->wt;
                                }
                                void* oo[64];
                                for (int i = 0; i < r; i++) oo[i] = optr[i] + oes * ob * NB * ochan;
                                fns[(r - 1) * BMAX + (b - 1)](
                                    ntp, xt.data(), wt.data(), P->wob, P->wc, cin_g, oo, ochan,
                                    nvalid, stream, reps, pf, pfl, odt);
                                pf = nullptr, pfl = 0;
                                ob += b * reps;
                            }
                        }
                    }
                }
            }
        }
        if (obuf) {
            // [row][u][c] line buffers -> the output (its layout and dtype); a line's rows
            // that follow each other in the output (hph of them) go as one run
            const int64_t ord = ph0[0], orh = ph0[1], orw = merged ? 0 : ph0[2];
            const int64_t ropix = (merged ? 1 : os[2]) * P->ostride[3], rochan = P->ostride[4];
            const bool one_run = hph > 1 && P->ostride[2] == bw * P->ostride[3];
            const int64_t Uw = one_run ? hph * bw : bw, nrows = one_run ? 1 : hph;
            const int64_t es = P->out_dtype == F32 ? 4 : 2;
            for (int64_t lr = 0; lr < nl * nrows; lr++) {
                const int64_t li = lr / nrows, hr = lr % nrows;
                const LineTaps& L = lines[li];
                const float* const lb = outbuf + (li * hph + hr) * bw * P->Cout;   // its buffer
                char* dst = (char*)P->out +
                            es * (L.n * P->ostride[0] + (L.ud * os[0] + ord) * P->ostride[1] +
                                  (L.uh * os[1] + orh + hr) * P->ostride[2] +
                                  orw * P->ostride[3]);
                // the channels this item computed: blocks [item[3], item[4]) of each group
                const int64_t c0 = std::min(cout_g, item[3] * NB);
                const int64_t c1 = std::min(cout_g, item[4] * NB);
                if (rochan == 1) {
                    for (int64_t g = 0; g < G; g++)
                        for (int64_t u = 0; u < Uw; u++) {
                            char* d = dst + es * (u * ropix + g * cout_g + c0);
                            const float* s = lb + u * P->Cout + g * cout_g + c0;
                            if (stream_lines) store_run_streamed(d, P->out_dtype, s, c1 - c0);
                            else store_run(d, P->out_dtype, 1, s, c1 - c0);
                        }
                    continue;
                }
                // channels first: blocks of 8 channels x 64 pixels transposed 8 x 8
                for (int64_t g = 0; g < G; g++) {
                    for (int64_t cb = g * cout_g + c0; cb < g * cout_g + c1; cb += 8) {
                        const int64_t cn = std::min<int64_t>(8, g * cout_g + c1 - cb);
                        for (int64_t u0 = 0; u0 < Uw; u0 += 64) {
                            const float* s = lb + u0 * P->Cout + cb;
                            store_channel_runs(
                                dst + es * (cb * rochan + u0 * ropix), P->out_dtype, ropix,
                                rochan, [&](int64_t u) { return s + u * P->Cout; },
                                std::min<int64_t>(64, Uw - u0), cn, stream_runs);
                        }
                    }
                }
            }
        }
    }
    if (stream || stream_lines || stream_runs) stream_fence();
}

void cg_corr_run_shared(const CorrProblem* P, int64_t* next, int64_t n, float* scratch) {
    for (;;) {
        const int64_t it = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
        if (it >= n) return;
        cg_corr_run(P, it, it + 1, scratch);
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

// x rows a long-line chunk's panel holds beyond the chunk's positions (taps of
// one phase further apart get panels of their own).
constexpr int64_t XHALO = 64;

// Copy M floats (M a compile-time constant: vector moves; an element loop compiles
// to M scalar moves, d and s being allowed to overlap).
template <int M>
inline void copy_fixed(float* d, const float* s) {
    __builtin_memcpy(d, s, M * sizeof(float));
}

typedef void (*copy_fn)(float*, const float*);

inline copy_fn copy_of(int m) {
    switch (m) {
        case 3: return &copy_fixed<3>;
        case 4: return &copy_fixed<4>;
        case 6: return &copy_fixed<6>;
        case 8: return &copy_fixed<8>;
        case 9: return &copy_fixed<9>;
        case 12: return &copy_fixed<12>;
        case 14: return &copy_fixed<14>;
        case 16: return &copy_fixed<16>;
        case 24: return &copy_fixed<24>;
        case 32: return &copy_fixed<32>;
        case 48: return &copy_fixed<48>;
        case 64: return &copy_fixed<64>;
        default: return nullptr;
    }
}

// One run of consecutive positions: float32 rows with unit channel stride.
struct Run {
    const float* x;     // x row of the first position (channel 0), or null
    const float* dy;    // dy row of the first position (channel 0)
    int64_t n;          // positions
};

// panel[g][blk][p][width] = rows[run p][g*per + c0(blk) + i] for i < m(blk) (0 up to
// width), with blocks of exactly ``width`` channels, or (balanced) near-equal
// blocks of at most ``width`` (tile_start); rows ``step`` floats apart.  Only the
// blocks g*nblk + blk in [blo, bhi) (a task's output blocks) are written.
void pack_panel(float* out, const std::vector<Run>& runs, bool use_x, int64_t np,
                int64_t step, int64_t G, int64_t per, int width, bool balanced,
                int64_t blo = 0, int64_t bhi = INT64_MAX) {
    const int64_t nblk = (per + width - 1) / width;
    const copy_fn full = copy_of(width);
    // the blocks' first channels, found once a call: two divisions a block and
    // position (tile_start) were 12% of ResNet-50 res5's weight gradient, whose x
    // rows are packed per tap (engine debug bit 65536: per position, A/B)
    std::vector<int64_t> starts(nblk + 1);
    for (int64_t b = 0; b <= nblk; b++)
        starts[b] = balanced ? tile_start(b, per, nblk) : std::min<int64_t>(per, b * width);
    const bool per_position = cg_engine_dbg & 65536;
    int64_t p0 = 0;
    for (const Run& r : runs) {
        const float* src = use_x ? r.x : r.dy;
        for (int64_t p = 0; p < r.n; p++) {
            const float* row = src + p * step;
            for (int64_t g = 0; g < G; g++) {
                for (int64_t b = std::max<int64_t>(0, blo - g * nblk);
                     b < std::min<int64_t>(nblk, bhi - g * nblk); b++) {
                    float* o = out + ((g * nblk + b) * np + p0 + p) * width;
                    int64_t c0 = starts[b], c1 = starts[b + 1];
                    if (per_position) {
                        c0 = balanced ? tile_start(b, per, nblk) : b * width;
                        c1 = balanced ? tile_start(b + 1, per, nblk)
                                      : std::min<int64_t>(per, c0 + width);
                    }
                    const float* s = row + g * per + c0;
                    const int64_t m = c1 - c0;
                    if (m == width && full) {
                        full(o, s);
                    } else {
                        for (int64_t i = 0; i < m; i++) o[i] = s[i];
                        for (int64_t i = m; i < width; i++) o[i] = 0.0f;
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
    const int64_t* items;      // per item: first and end output line, lines numbered
                               // (n * Md + ud) * Mh + uh
    int64_t oix;               // one group: tasks sum into scratch and write their part
                               // of an OIX result (O, C, *K) (cg_wgrad_run_shared)
    int64_t part;              // floats of the largest task's part (oix; without oix, > 0:
                               // tasks sum into scratch and stream their dw rows)
    int64_t out_dtype;         // dw's dtype: float32, or (streamed dw rows only) float16 /
                               // bfloat16, each sum rounded once as it is stored
};

int64_t cg_wgrad_mr(int64_t nv) { return nv >= 1 && nv <= 4 ? WG_MR[nv] : 0; }

int64_t cg_wgrad_scratch(const WgradProblem* P, int64_t lo, int64_t hi);

void cg_wgrad_run(const WgradProblem* P, int64_t lo, int64_t hi, int64_t oblo, int64_t obhi,
                  int64_t tlo, int64_t thi, float* dw, float* scratch);

// Tasks [0, n), each (lo, hi, oblo, obhi, tlo, thi, address of its dw or partial): the
// items [lo, hi) for the output blocks [oblo, obhi) and the taps [tlo, thi), shared by
// the threads calling this at once through the atomic counter *next (see
// cg_corr_run_shared); every task writes its own output, so who runs it does not matter.
// A task first zeroes the part of its dw it adds into (taps x blocks), or, gathering short
// lines, stores each tap's first sums; with P->oix its address is the OIX result's, and
// it sums its part in scratch first.
void cg_wgrad_run_shared(const WgradProblem* P, int64_t* next, int64_t n, const int64_t* tasks,
                         float* scratch);

void cg_permute(const void* src, void* dst, int64_t es, const int64_t* shape,
                const int64_t* sstr, const int64_t* dstr, int64_t lo, int64_t hi);

// out[i] = parts[0][i] + parts[1][i] + ... + parts[n - 1][i] (in that order, as NumPy's
// add.reduce over the first axis sums) for i in [lo, hi): partial gradients (``stride``
// floats apart) summed by the pool's threads, a range each.
struct PartsSum {
    const float* parts;
    int64_t n, stride;
    float* out;
};
void cg_sum_parts(const PartsSum* P, int64_t lo, int64_t hi);

// The same sums of partial weight gradients (*K, C, O) -- T taps -- stored as the OIX
// result out (O, C, *K) of a channels-first caller, channels [lo, hi) of every tap a task:
// each row summed as cg_sum_parts sums it (the same bits) into the thread's buffer
// (whole rows of every tap of the range), then transposed into out's runs of T taps
// (cg_permute), instead of a permuted copy of the whole dw afterwards (ResNet-50 res3
// stride 2's 590 KB: 0.13 ms hot, 0.25-0.45 after the benchmark's pause).
struct PartsSumOix {
    PartsSum sum;
    int64_t T, C, O;
};
void cg_sum_parts_oix(const PartsSumOix* P, int64_t lo, int64_t hi);

}  // extern "C"

namespace {

// Positions per sweep when the x rows are read in place (see wgrad_gemm).
constexpr int64_t WG_INPLACE_SWEEP = 256;

// dw[t][g-block tiles] += A^T B over nl lines of np positions.  A: the x rows, lda
// floats apart (lines aline apart) -- channel tile ct of group g at channel
// g*cg + c0(ct) of the rows as they are (astripe == 0), or at stripe
// (g*nct + ct)*astripe of a packed panel (nl == 1); B panel [g][ob][.][NB] with
// bstride floats per (g, ob), lines bline apart.  Channel tiles are near-equal
// (tile_start).
// * x rows in place: a tile's rows are strided (one cache line or two per position
//   for a few floats), so they are swept about WG_INPLACE_SWEEP positions at a time
//   (whole lines when there are several), each channel tile meeting all its output
//   blocks while its lines are in L1 (the B rows of the sweep, og x 128 floats, stay
//   in L1/L2).  Against the packed order below: ResNet-50 res2 1x1 weight gradient
//   1.1-1.3x, res3 stride-2 1.15x (2 threads).  256 positions rather than 128:
//   1.00-1.05x on res2 1x1, res4, res5, DeepLab, DCGAN (AVX-512, hot, 2026-11-26;
//   32 and 64: 0.81-0.95x).  The tile prefetches these rows (gemm_tile).
// * packed panels: blocks of channel tiles whose A panels fit in L2 are swept by
//   every output block in turn (the B rows of one block stay in L1).
// The tap's dw rows are ldw floats apart, column j of the gradient at dwt[j - col0].
void wgrad_gemm(const WgradProblem* P, const float* A, int64_t lda, int64_t astripe,
                const float* B, int64_t bstride, int64_t np, float* dwt, int64_t ldw,
                int64_t col0, int64_t oblo, int64_t obhi, int64_t nl = 1, int64_t aline = 0,
                int64_t bline = 0, bool set = false) {
    const int64_t G = P->groups, cg = P->C / G, og = P->O / G;
    const int nv = (int)P->nv, NB = nv * VL, mr = WG_MR[nv];
    const int64_t nob = (og + NB - 1) / NB, nct = (cg + mr - 1) / mr;
    const gemm_fn* fns = gemm_table(nv);
    if (astripe == 0) {
        // a sweep: lines [l0, l0 + sl) x positions [p0, p0 + sp)
        const int64_t lstep = nl > 1 ? std::max<int64_t>(1, WG_INPLACE_SWEEP / np) : 1;
        const int64_t pstep = nl > 1 ? np : WG_INPLACE_SWEEP;
        for (int64_t l0 = 0; l0 < nl; l0 += lstep)
        for (int64_t p0 = 0; p0 < np; p0 += pstep) {
            const int64_t sp = std::min<int64_t>(pstep, np - p0);
            const int64_t sl = std::min<int64_t>(lstep, nl - l0);
            for (int64_t obg = oblo; obg < obhi;) {
                const int64_t g = obg / nob;
                const int64_t gend = std::min(obhi, (g + 1) * nob);
                for (int64_t ct = 0; ct < nct; ct++) {
                    const int64_t c0 = tile_start(ct, cg, nct);
                    const int m = (int)(tile_start(ct + 1, cg, nct) - c0);
                    const float* a = A + l0 * aline + p0 * lda + g * cg + c0;
                    const float* ar[64];
                    float* cr[64];
                    for (int64_t k = obg; k < gend;) {
                        const int64_t ob = k % nob;
                        const int bk = (int)std::min<int64_t>(gemm_blocks(m, nv), gend - k);
                        const int nvalid = (int)std::min<int64_t>(bk * NB, og - ob * NB);
                        for (int i = 0; i < m; i++) {
                            ar[i] = a + i;
                            cr[i] = dwt + ((c0 + i) * ldw + g * og + ob * NB - col0);
                        }
                        fns[(m - 1) * BMAX + (bk - 1)](
                            sp, sl, ar, lda, aline,
                            B + (g * nob + ob) * bstride + l0 * bline + p0 * NB, bstride, bline,
                            cr, nvalid, set);
                        k += bk;
                    }
                }
                obg = gend;
            }
        }
        return;
    }
    const int64_t block = std::max<int64_t>(1, (96 << 10) / std::max<int64_t>(1, np * mr * 4));
    for (int64_t obg = oblo; obg < obhi;) {
        const int64_t g = obg / nob;
        const int64_t gend = std::min(obhi, (g + 1) * nob);
        for (int64_t k0 = 0; k0 < nct; k0 += block) {
            const int64_t k1 = std::min(nct, k0 + block);
            for (int64_t k = obg; k < gend;) {
                const int64_t ob = k % nob;
                const int64_t mmax = (cg + nct - 1) / nct;            // widest tile
                const int bk = (int)std::min<int64_t>(gemm_blocks((int)mmax, nv), gend - k);
                const int nvalid = (int)std::min<int64_t>(bk * NB, og - ob * NB);
                const float* b = B + (g * nob + ob) * bstride;
                for (int64_t ct = k0; ct < k1; ct++) {
                    const int64_t c0 = tile_start(ct, cg, nct);
                    const int m = (int)(tile_start(ct + 1, cg, nct) - c0);
                    const int bm = std::min(bk, gemm_blocks(m, nv));
                    const float* a = astripe ? A + (g * nct + ct) * astripe : A + g * cg + c0;
                    for (int j = 0; j < bk; j += bm) {
                        const int bj = std::min(bm, bk - j);
                        const int nv_j = (int)std::min<int64_t>(bj * NB, nvalid - j * NB);
                        const float* ar[64];
                        float* cr[64];
                        for (int i = 0; i < m; i++) {
                            ar[i] = a + i;
                            cr[i] = dwt + ((c0 + i) * ldw + g * og + (ob + j) * NB - col0);
                        }
                        fns[(m - 1) * BMAX + (bj - 1)](np, 1, ar, lda, 0, b + j * bstride,
                                                       bstride, 0, cr, nv_j, set);
                    }
                }
                k += bk;
            }
        }
        obg = gend;
    }
    (void)G;
}

// Like wgrad_gemm, for explicit rows: row i reads x at arow[i] (channel offset of group
// 0) and adds into the dw row crow[i] (column j at crow[i][j - col0]).  Used to fold the
// taps of one stride phase into one tile when a group has few input channels (ResNet's
// conv1: 3 channels x 4 taps = 12 rows instead of 4 tiles of 3).
void wgrad_gemm_rows(const WgradProblem* P, const float* const* arow, float* const* crow,
                     int64_t nrows, int64_t lda, const float* B, int64_t bstride, int64_t np,
                     int64_t col0, int64_t oblo, int64_t obhi, int64_t nl, int64_t aline,
                     int64_t bline) {
    const int64_t G = P->groups, cg = P->C / G, og = P->O / G;
    const int nv = (int)P->nv, NB = nv * VL, mr = WG_MR[nv];
    const int64_t nob = (og + NB - 1) / NB, ntiles = (nrows + mr - 1) / mr;
    const gemm_fn* fns = gemm_table(nv);
    const float* ar[64];
    float* cr[64];
    for (int64_t obg = oblo; obg < obhi;) {
        const int64_t g = obg / nob;
        const int64_t gend = std::min(obhi, (g + 1) * nob);
        for (int64_t k = 0; k < ntiles; k++) {
            const int64_t r0 = tile_start(k, nrows, ntiles);
            const int m = (int)(tile_start(k + 1, nrows, ntiles) - r0);
            const int bmax = gemm_blocks(m, nv);
            for (int64_t ob = obg % nob; ob < gend - g * nob;) {
                const int bk = (int)std::min<int64_t>(bmax, gend - g * nob - ob);
                const int nvalid = (int)std::min<int64_t>(bk * NB, og - ob * NB);
                for (int i = 0; i < m; i++) {
                    ar[i] = arow[r0 + i] + g * cg;
                    cr[i] = crow[r0 + i] + (g * og + ob * NB - col0);
                }
                fns[(m - 1) * BMAX + (bk - 1)](np, nl, ar, lda, aline,
                                               B + (g * nob + ob) * bstride, bstride, bline,
                                               cr, nvalid, false);
                ob += bk;
            }
        }
        obg = gend;
    }
}

inline void wgrad_decode(const WgradProblem* P, int64_t l, int64_t& n, int64_t& ud,
                         int64_t& uh) {
    n = l / (P->M[0] * P->M[1]);
    ud = (l / P->M[1]) % P->M[0];
    uh = l % P->M[1];
}

// Keys (n * L0 + d) * L1 + h of the x lines the item [l0, l1) reads, sorted.
void wgrad_x_keys(const WgradProblem* P, int64_t l0, int64_t l1, std::vector<int64_t>& keys) {
    keys.clear();
    for (int64_t l = l0; l < l1; l++) {
        int64_t n, ud, uh;
        wgrad_decode(P, l, n, ud, uh);
        for (int64_t kd = 0; kd < P->K[0]; kd++) {
            const int64_t d = ud * P->s[0] + kd * P->d[0] - P->pb[0];
            if (d < 0 || d >= P->L[0]) continue;
            for (int64_t kh = 0; kh < P->K[1]; kh++) {
                const int64_t h = uh * P->s[1] + kh * P->d[1] - P->pb[1];
                if (h >= 0 && h < P->L[1]) keys.push_back((n * P->L[0] + d) * P->L[1] + h);
            }
        }
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
}

}  // namespace

int64_t cg_wgrad_scratch(const WgradProblem* P, int64_t lo, int64_t hi) {
    const int64_t G = P->groups, cg = P->C / G, og = P->O / G;
    const int nv = (int)P->nv, NB = nv * VL, mr = WG_MR[nv];
    const int64_t apad = G * ((cg + mr - 1) / mr) * mr, bpad = G * ((og + NB - 1) / NB) * NB;
    int64_t lines = 0;
    std::vector<int64_t> keys;
    for (int64_t it = lo; it < hi; it++) {
        const int64_t* item = P->items + 2 * it;
        int64_t need = 0;
        if (!direct_f32(P->x) || !P->direct_x) {
            wgrad_x_keys(P, item[0], item[1], keys);
            need += (int64_t)keys.size() * P->L[2] * P->C;
        }
        if (!direct_f32(P->dy)) need += (item[1] - item[0]) * P->M[2] * P->O;
        lines = std::max(lines, need);
    }
    return lines + (P->chunk + XHALO) * apad + 2 * P->chunk * bpad + 64 +
           (P->part ? (P->part + 15) / 16 * 16 : 0);
}

// Accumulate the items [lo, hi) into dw (*K, C/G, O) for the output-channel
// blocks [oblo, obhi) (numbered over all groups) and the taps [tlo, thi).
//
// Lines at least one chunk long are cut into chunks along w: the dy rows of a
// chunk are packed once; per (kd, kh) the x rows its taps read are read in
// place, and each tap is one GEMM over the range of positions where it reads
// the input (an offset into the x rows).  Shorter lines are gathered into
// chunks of several lines, x packed per tap (only the positions where the tap
// reads the input).  Rows that are not float32 with unit channel stride are
// first converted, one item's lines at a time.
namespace {

// Whether wgrad_run cuts lines into chunks (else it gathers lines into chunks, x packed per
// tap).
inline bool wgrad_long_lines(const WgradProblem* P) {
    const int64_t pc = std::max<int64_t>(1, P->chunk);
    return P->M[2] >= pc || P->M[2] >= P->line_min;
}

// cg_wgrad_run into dw rows ldw floats apart: tap t's channel c, column j at
// dw[((t - t0) * cg + c) * ldw + j - col0] (a task's part of the gradient: its taps
// [t0, ...) and columns [col0, ...)).
void wgrad_run(const WgradProblem* P, int64_t lo, int64_t hi, int64_t oblo, int64_t obhi,
               int64_t tlo, int64_t thi, float* dw, int64_t ldw, int64_t t0, int64_t col0,
               float* scratch, bool fresh = false) {
    const int64_t G = P->groups, cg = P->C / G, og = P->O / G;
    const int nv = (int)P->nv, NB = nv * VL, mr = WG_MR[nv];
    const int64_t nob = (og + NB - 1) / NB, nct = (cg + mr - 1) / mr;
    const int64_t pc = std::max<int64_t>(1, P->chunk);
    const int64_t Mw = P->M[2], Lw = P->L[2];
    const int64_t sw = P->s[2], dwl = P->d[2], pbw = P->pb[2], Kw = P->K[2];
    const int64_t apad = G * nct * mr, bpad = G * nob * NB;
    const int64_t ntap = P->K[0] * P->K[1] * Kw;
    const bool long_lines = wgrad_long_lines(P);
    const bool xconv = !direct_f32(P->x) || !P->direct_x, yconv = !direct_f32(P->dy);
    const int64_t xpix = xconv ? P->C : P->x.stride[3];
    // fresh (short lines only): dw's part is not zeroed; a tap's first sums are stored,
    // taps that read no input are zeroed at the end
    std::vector<char> written(fresh ? std::max<int64_t>(0, thi - tlo) : 0, 0);
    const int64_t ypix = yconv ? P->O : P->dy.stride[3];
    const int64_t xstep = xpix * sw;

    struct Piece {
        int64_t l, w0, w1;
    };
    struct GroupTap {
        int64_t kw, a, b, q;
    };
    std::vector<Piece> pieces;
    std::vector<Run> runs, full_runs;
    std::vector<GroupTap> gtaps(Kw);
    // the w taps by stride phase (kw ascending within one), so that the taps of a phase
    // meet in the loop below and share tiles (with w stride 2, taps in kw order
    // alternate phases: ResNet's conv1 ran one 3-channel tap a tile)
    auto phase = [&](int64_t kw) { return (((kw * dwl - pbw) % sw) + sw) % sw; };
    std::vector<int64_t> kword(Kw);
    for (int64_t kw = 0; kw < Kw; kw++) kword[kw] = kw;
    if (!(cg_engine_dbg & 256))
        std::stable_sort(kword.begin(), kword.end(),
                         [&](int64_t u, int64_t v) { return phase(u) < phase(v); });
    std::vector<int64_t> keys;
    const float* frow[64];
    float* fout[64];

    for (int64_t it = lo; it < hi; it++) {
        const int64_t l0 = P->items[2 * it], l1 = P->items[2 * it + 1];
        // this item's lines as float32 rows
        float* free_ = scratch;
        if (xconv) {
            wgrad_x_keys(P, l0, l1, keys);
            pack_keyed_lines(free_, P->x, keys, P->L[0], P->L[1], Lw, P->C);
        }
        const float* xbuf = free_;
        free_ += xconv ? (int64_t)keys.size() * Lw * P->C : 0;
        const float* ybuf = free_;
        if (yconv) {
            for (int64_t l = l0; l < l1; l++) {
                int64_t n, ud, uh;
                wgrad_decode(P, l, n, ud, uh);
                pack_keyed_lines(free_ + (l - l0) * Mw * P->O, P->dy,
                                 std::vector<int64_t>{(n * P->M[0] + ud) * P->M[1] + uh},
                                 P->M[0], P->M[1], Mw, P->O);
            }
            free_ += (l1 - l0) * Mw * P->O;
        }
        float* A = free_;
        float* Bfull = A + (pc + XHALO) * apad;
        float* Btap = Bfull + pc * bpad;
        auto xrow = [&](int64_t n, int64_t dd, int64_t hh, int64_t w) -> const float* {
            if (!xconv) return (const float*)at(P->x, n, dd, hh, w, 0);
            const int64_t key = (n * P->L[0] + dd) * P->L[1] + hh;
            return xbuf + ((std::lower_bound(keys.begin(), keys.end(), key) - keys.begin()) * Lw +
                           w) * P->C;
        };
        auto yrow = [&](int64_t l, int64_t w) -> const float* {
            if (!yconv) {
                int64_t n, ud, uh;
                wgrad_decode(P, l, n, ud, uh);
                return (const float*)at(P->dy, n, ud, uh, w, 0);
            }
            return ybuf + ((l - l0) * Mw + w) * P->O;
        };

        if (long_lines) {
            // Groups of lines: whole lines of one (n, d) whose positions fit in a chunk
            // (a tile then sums all their positions with its accumulators in registers:
            // ResNet-50 res3's 28-position lines paid a tile's loads and stores per
            // line), or one line cut into chunks along w.
            for (int64_t lg = l0; lg < l1;) {
                int64_t n, ud, uh0;
                wgrad_decode(P, lg, n, ud, uh0);
                const int64_t nl = Mw < pc ? std::min({pc / Mw, l1 - lg, P->M[1] - uh0})
                                           : 1;
                for (int64_t w0 = 0; w0 < Mw; w0 += pc) {
                    const int64_t w1 = std::min(Mw, w0 + pc), np = w1 - w0;
                    full_runs.clear();
                    for (int64_t j = 0; j < nl; j++)
                        full_runs.push_back(Run{nullptr, yrow(lg + j, w0), np});
                    const int64_t bline = np * NB, bstr = nl * np * NB;
                    bool packed_b = false;
                    for (int64_t kd = 0; kd < P->K[0]; kd++) {
                        const int64_t dd = ud * P->s[0] + kd * P->d[0] - P->pb[0];
                        if (dd < 0 || dd >= P->L[0]) continue;
                        for (int64_t kh = 0; kh < P->K[1]; kh++) {
                            // the group's lines j whose x row hh(j) is inside the input
                            const int64_t h0 = uh0 * P->s[1] + kh * P->d[1] - P->pb[1];
                            int64_t ja, jb;
                            valid_range(nl, P->s[1], h0, P->L[1], ja, jb);
                            if (jb <= ja) continue;
                            auto hh = [&](int64_t j) { return h0 + j * P->s[1]; };
                            // x rows of consecutive lines a fixed distance apart (always
                            // in place; converted rows when their lines are consecutive)
                            int64_t aline = 0;
                            bool uniform = true;
                            if (jb - ja > 1) {
                                const float* r0 = xrow(n, dd, hh(ja), 0);
                                aline = xrow(n, dd, hh(ja + 1), 0) - r0;
                                for (int64_t j = ja + 2; j < jb && uniform; j++)
                                    uniform = xrow(n, dd, hh(j), 0) - r0 == (j - ja) * aline;
                            }
                            // taps kw by phase; x index v*sw + r with v = p + q(kw), r the
                            // phase; taps of one phase whose x rows overlap share rows
                            int64_t gr = -1, vlo = 0, vhi = 0;
                            int ng = 0;
                            for (int64_t ki = 0; ki <= Kw; ki++) {
                                const int64_t kw = ki < Kw ? kword[ki] : Kw;
                                int64_t a = 0, b = 0, q = 0, r = -2;
                                if (kw < Kw) {
                                    const int64_t t = (kd * P->K[1] + kh) * Kw + kw;
                                    if (t < tlo || t >= thi) continue;
                                    const int64_t off = kw * dwl - pbw;
                                    r = phase(kw);
                                    q = (off - r) / sw;
                                    valid_range(Mw, sw, off, Lw, a, b);
                                    a = std::max(a, w0);
                                    b = std::min(b, w1);
                                    if (b <= a) continue;
                                }
                                const bool fits = r == gr &&
                                    std::max(vhi, b + q) - std::min(vlo, a + q) <= pc + XHALO;
                                if (ng > 0 && !fits) {
                                    if (!packed_b) {
                                        pack_panel(Bfull, full_runs, false, nl * np, ypix, G, og,
                                                   NB, false, oblo, obhi);
                                        packed_b = true;
                                    }
                                    // few channels per group: the taps' rows share tiles
                                    // over the positions every tap reads (the rest per tap)
                                    int64_t ca = 0, cb = 0;
                                    if (ng > 1 && cg < mr && ng * cg <= 64) {
                                        ca = gtaps[0].a, cb = gtaps[0].b;
                                        for (int j = 1; j < ng; j++) {
                                            ca = std::max(ca, gtaps[j].a);
                                            cb = std::min(cb, gtaps[j].b);
                                        }
                                    }
                                    // lines [jl, jh) in one call each
                                    auto emit = [&](int64_t jl, int64_t jh, int64_t al) {
                                        const float* xa = xrow(n, dd, hh(jl), vlo * sw + gr);
                                        const float* Bl = Bfull + jl * bline;
                                        if (cb > ca) {
                                            int nr = 0;
                                            for (int j = 0; j < ng; j++) {
                                                const GroupTap& gt = gtaps[j];
                                                const int64_t t =
                                                    (kd * P->K[1] + kh) * Kw + gt.kw;
                                                for (int64_t c = 0; c < cg; c++, nr++) {
                                                    frow[nr] =
                                                        xa + (ca + gt.q - vlo) * xstep + c;
                                                    fout[nr] = dw + ((t - t0) * cg + c) * ldw;
                                                }
                                            }
                                            wgrad_gemm_rows(P, frow, fout, nr, xstep,
                                                            Bl + (ca - w0) * NB, bstr, cb - ca,
                                                            col0, oblo, obhi, jh - jl, al,
                                                            bline);
                                        }
                                        for (int j = 0; j < ng; j++) {
                                            const GroupTap& gt = gtaps[j];
                                            const int64_t t = (kd * P->K[1] + kh) * Kw + gt.kw;
                                            const int64_t runs_[2][2] = {
                                                {gt.a, cb > ca ? ca : gt.b},
                                                {cb > ca ? cb : gt.b, gt.b}};
                                            for (const auto& run : runs_) {
                                                if (run[1] <= run[0]) continue;
                                                wgrad_gemm(P, xa + (run[0] + gt.q - vlo) * xstep,
                                                           xstep, 0, Bl + (run[0] - w0) * NB,
                                                           bstr, run[1] - run[0],
                                                           dw + (t - t0) * cg * ldw, ldw, col0,
                                                           oblo, obhi, jh - jl, al, bline);
                                            }
                                        }
                                    };
                                    if (uniform) {
                                        emit(ja, jb, aline);
                                    } else {
                                        for (int64_t j = ja; j < jb; j++) emit(j, j + 1, 0);
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
                lg += nl;
            }
            continue;
        }
        int64_t l = l0, w = 0;
        while (l < l1) {
            pieces.clear();
            int64_t got = 0;
            while (l < l1 && got < pc) {
                const int64_t take = std::min<int64_t>(Mw - w, pc - got);
                pieces.push_back(Piece{l, w, w + take});
                got += take;
                w += take;
                if (w == Mw) {
                    w = 0;
                    l++;
                }
            }
            full_runs.clear();
            for (const Piece& q : pieces)
                full_runs.push_back(Run{nullptr, yrow(q.l, q.w0), q.w1 - q.w0});
            bool full_packed = false;
            for (int64_t t = std::max<int64_t>(0, tlo); t < std::min(ntap, thi); t++) {
                const int64_t kd = t / (P->K[1] * Kw), kh = (t / Kw) % P->K[1], kw = t % Kw;
                const int64_t offw = kw * dwl - pbw;
                int64_t u0, u1;
                valid_range(Mw, sw, offw, Lw, u0, u1);
                runs.clear();
                int64_t np = 0;
                bool all = true;
                for (const Piece& q : pieces) {
                    int64_t n, ud, uh;
                    wgrad_decode(P, q.l, n, ud, uh);
                    const int64_t dd = ud * P->s[0] + kd * P->d[0] - P->pb[0];
                    const int64_t hh = uh * P->s[1] + kh * P->d[1] - P->pb[1];
                    const int64_t a = std::max(u0, q.w0), b = std::min(u1, q.w1);
                    if (dd < 0 || dd >= P->L[0] || hh < 0 || hh >= P->L[1] || b <= a) {
                        all = false;
                        continue;
                    }
                    if (a != q.w0 || b != q.w1) all = false;
                    runs.push_back(Run{xrow(n, dd, hh, a * sw + offw), yrow(q.l, a), b - a});
                    np += b - a;
                }
                if (np == 0) continue;
                pack_panel(A, runs, true, np, xstep, G, cg, mr, true);
                const float* B;
                if (all) {
                    if (!full_packed) {
                        pack_panel(Bfull, full_runs, false, np, ypix, G, og, NB, false, oblo, obhi);
                        full_packed = true;
                    }
                    B = Bfull;
                } else {
                    pack_panel(Btap, runs, false, np, ypix, G, og, NB, false, oblo, obhi);
                    B = Btap;
                }
                const bool set = fresh && !written[t - tlo];
                if (fresh) written[t - tlo] = 1;
                wgrad_gemm(P, A, mr, np * mr, B, np * NB, np, dw + (t - t0) * cg * ldw, ldw,
                           col0, oblo, obhi, 1, 0, 0, set);
            }
        }
    }
    for (int64_t t = tlo; t < thi && fresh; t++)
        if (!written[t - tlo])
            zero_blocks(dw + (t - t0) * cg * ldw, cg, P->O, og, NB, oblo, obhi, ldw, col0);
}

}  // namespace

void cg_wgrad_run(const WgradProblem* P, int64_t lo, int64_t hi, int64_t oblo, int64_t obhi,
                  int64_t tlo, int64_t thi, float* dw, float* scratch) {
    wgrad_run(P, lo, hi, oblo, obhi, tlo, thi, dw, P->O, 0, 0, scratch);
}

void cg_wgrad_run_shared(const WgradProblem* P, int64_t* next, int64_t n, const int64_t* tasks,
                         float* scratch) {
    const bool streamed = !P->oix && P->part > 0;
    for (;;) {
        const int64_t k = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
        if (k >= n) {
            if (streamed) stream_fence();
            return;
        }
        const int64_t* t = tasks + 7 * k;
        float* dw = (float*)(intptr_t)t[6];
        const int64_t og = P->O / P->groups, cg = P->C / P->groups, NB = P->nv * VL;
        // lines gathered into chunks: each tap's first sums are stored (zeroing the part
        // first was 5% of ResNet-50 res5's samples; engine debug bit 1048576: zero first)
        const bool fresh = !wgrad_long_lines(P) && !(cg_engine_dbg & 1048576);
        // P->oix (one group): the task's taps x channels x columns are summed in scratch
        // (in L2), then written into the OIX result as 16 x taps transposes (a whole
        // (*K, C, O) gradient permuted afterwards was 0.75 ms hot, 1.7 ms after the
        // benchmark's pause, of ResNet-50 res5's 7-10 ms channels-first call); streamed
        // (P->part without P->oix, one group): summed in scratch, then each dw row of the
        // part stored once, with streaming stores where it is whole cache lines (native.py:
        // WGRAD_STREAM); else into the task's rows of dw
        const int64_t o0 = t[2] * NB, nt = t[5] - t[4];
        const bool own = P->oix || streamed;
        const int64_t ld = own ? (t[3] - t[2]) * NB : P->O, col0 = own ? o0 : 0;
        float* sums = own ? scratch : dw + t[4] * cg * P->O;
        if (!fresh) zero_blocks(sums, nt * cg, P->O, og, NB, t[2], t[3], ld, col0);
        wgrad_run(P, t[0], t[1], t[2], t[3], t[4], t[5], sums, ld, t[4], col0,
                  own ? scratch + (P->part + 15) / 16 * 16 : scratch, fresh);
        if (streamed) {
            const int64_t o1 = std::min(P->O, t[3] * NB), w = o1 - o0;
            const int64_t es = P->out_dtype == F32 ? 4 : 2;
            for (int64_t r = 0; r < nt * cg; r++)
                store_run_streamed((char*)dw + es * ((t[4] * cg + r) * P->O + o0), P->out_dtype,
                                   sums + r * ld, w);
        }
        if (P->oix) {
            const int64_t T = P->K[0] * P->K[1] * P->K[2], o1 = std::min(P->O, t[3] * NB);
            const int64_t shape[5] = {1, 1, cg, o1 - o0, nt};
            const int64_t sstr[5] = {0, 0, ld, 1, cg * ld};
            const int64_t dstr[5] = {0, 0, T, cg * T, 1};
            cg_permute(sums, dw + o0 * cg * T + t[4], 4, shape, sstr, dstr, 0, cg);
        }
    }
}

namespace {
// out[i - lo] = parts[0][i] + ... + parts[n - 1][i] for i in [lo, hi), in that order.
void sum_range(const float* parts, int64_t n, int64_t stride, float* out, int64_t lo,
               int64_t hi) {
    int64_t i = lo;
    for (; i + VL <= hi; i += VL) {
        vf acc = load(parts + i);
        for (int64_t q = 1; q < n; q++) acc += load(parts + q * stride + i);
        store(out + i - lo, acc);
    }
    for (; i < hi; i++) {
        float acc = parts[i];
        for (int64_t q = 1; q < n; q++) acc += parts[q * stride + i];
        out[i - lo] = acc;
    }
}
}  // namespace

void cg_sum_parts(const PartsSum* P, int64_t lo, int64_t hi) {
    sum_range(P->parts, P->n, P->stride, P->out + lo, lo, hi);
}

void cg_sum_parts_oix(const PartsSumOix* P, int64_t lo, int64_t hi) {
    const int64_t T = P->T, C = P->C, O = P->O, nc = hi - lo;
    if (nc <= 0) return;
    static thread_local std::vector<float> buf;
    buf.resize((size_t)(T * nc * O));
    for (int64_t t = 0; t < T; t++)
        sum_range(P->sum.parts, P->sum.n, P->sum.stride, buf.data() + t * nc * O,
                  (t * C + lo) * O, (t * C + hi) * O);
    // buf [t][c - lo][o] -> out[o][c][t]: rows o (contiguous in buf), runs of taps
    const int64_t shape[5] = {1, 1, nc, O, T};
    const int64_t sstr[5] = {0, 0, O, 1, nc * O};
    const int64_t dstr[5] = {0, 0, T, C * T, 1};
    cg_permute(buf.data(), P->sum.out + lo * T, 4, shape, sstr, dstr, 0, nc);
}

// ---------------------------------------------------------------------------------------
// The pointwise weight gradient of channels-first callers
//
// out[i][j] = sum_p a[i][p] * b[j][p] over a range of one sample's positions: a 1x1,
// stride-1, unpadded, one-group float32 weight gradient on channels-first memory
// (positions contiguous), with (a, b) = (dy, x) (out = dw^T) or (x, dy) (out = dw): b
// is the operand with fewer channels.  b is the GEMM tile's vector operand: per chunk
// of positions its channel rows are transposed (8 x 8) into [j block][p][NB] panels that
// stream from L2.  a gives the broadcasts, read in place: a tile's MR channel rows,
// short runs in L1 after the tile's first block.  This replaced a correlation
// (positions as its channels, x^T as its weights) that swept a sample's dy rows (800 KB
// for ResNet-50 res2) from L3 once per block of 16 channels, its x^T panel (3.2 MB) past
// L2.  On channels-last memory the same kernel, with both operands packed, measured
// 0.90-0.96x the general weight gradient (which reads x in place): not used there.

namespace {
constexpr int PW_NV = 2;
constexpr int64_t PW_PANEL_FLOATS = 48 << 10;      // 192 KiB of b's panels per chunk (L2)
// 16-bit operands: at most this many positions a chunk, so that a tile's widened a rows
// (WG_MR x 384 floats, 21 KiB) stay in a 32 KiB L1 while b's panels stream past them
// (at 768 positions, 43 KiB, the widening's stores stalled on L1 misses).  Zen 4, 2
// threads, ResNet-50 res2 1x1 weight gradient, 64 MB read and a 0.15 s pause before each
// call, 60 alternating calls: float16 and bfloat16 1.10x (twice each); 512: 1.06-1.08x,
// 256: 1.02-1.05x.  float32 has no widened rows (its chunk stays at 768: 384 0.97x).
constexpr int64_t PW_WIDE_CHUNK = 384;
}  // namespace

extern "C" {

// a (N, A, P) and b (N, B, P) in dtype (float32, float16 or bfloat16), strides in
// elements (positions contiguous).  Task k (tasks[4k .. 4k + 3]) = (sample, first and
// end position, address of its out [A][bpad]), bpad = B rounded up to NB.  16-bit
// operands: each chunk's b rows, and a tile's MR a rows (its broadcasts, re-read for
// every block of b), are widened into the thread's scratch first, then read as float32.
struct PwProblem {
    const void* a;
    const void* b;
    int64_t an, ac;
    int64_t bn, bc;
    int64_t A, B, bpad;
    const int64_t* tasks;
    int64_t dtype;
};

int64_t cg_pw_nb(void) { return PW_NV * VL; }

// Positions per chunk (task ranges are best a multiple of it).
int64_t cg_pw_chunk(const PwProblem* P) {
    const int64_t kc = std::max<int64_t>(64, std::min<int64_t>(1024, PW_PANEL_FLOATS / P->bpad / 8 * 8));
    return P->dtype == F32 ? kc : std::min(kc, PW_WIDE_CHUNK);
}

// Floats of scratch per thread (16-bit: and the widened rows of a chunk).
int64_t cg_pw_scratch(const PwProblem* P) {
    const int64_t kc = cg_pw_chunk(P);
    return kc * P->bpad + 64 + (P->dtype == F32 ? 0 : (WG_MR[PW_NV] + P->B) * kc + 64);
}

// Fetch the cache lines of bytes at p (into L2).
static inline void prefetch_run(const char* p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 1);
    __builtin_prefetch(p + bytes - 1, 0, 1);
}

// Task k: its out (A x bpad floats) = the sum over its positions (zeroed first).
void cg_pw_run(const PwProblem* P, int64_t k, float* scratch) {
    constexpr int NB = PW_NV * VL, MR = WG_MR[PW_NV];
    const int64_t* task = P->tasks + 4 * k;
    float* out = (float*)(intptr_t)task[3];
    const int64_t A = P->A, B = P->B, bpad = P->bpad, nbb = bpad / NB, kc = cg_pw_chunk(P);
    const int64_t nt = (A + MR - 1) / MR;
    const int64_t es = itemsize(P->dtype);
    const char* a = (const char*)P->a + es * task[0] * P->an;
    const char* b = (const char*)P->b + es * task[0] * P->bn;
    const gemm_fn* fns = gemm_table(PW_NV);
    std::fill(out, out + A * bpad, 0.0f);
    float* bk = scratch;                                    // [j block][p][NB]
    const bool wide = P->dtype != F32;
    float* aw = scratch + kc * bpad + 64;                   // 16-bit: a tile's [MR][kc]
    float* bw = aw + MR * kc;                               //         and b's [B][kc]
    const int64_t brs = wide ? kc : P->bc;
    const float* ar[MR];
    float* cr[MR];
    for (int64_t p0 = task[1]; p0 < task[2]; p0 += kc) {
        const int64_t np = std::min(kc, task[2] - p0);
        const float *a0 = (const float*)(a + es * p0), *b0 = (const float*)(b + es * p0);
        if (wide) {
            for (int64_t j = 0; j < B; j++) {
                if (j + 4 < B) prefetch_run(b + es * ((j + 4) * P->bc + p0), es * np);
                convert_run(bw + j * kc, b + es * (j * P->bc + p0), P->dtype, 1, np);
            }
            b0 = bw;
        }
        for (int64_t jb = 0; jb < nbb; jb++)
            channel_rows_to_panel(bk + jb * kc * NB, b0 + jb * NB * brs, brs, np, NB,
                                  B - jb * NB);
        for (int64_t t = 0; t < nt; t++) {
            const int64_t i0 = tile_start(t, A, nt);
            const int m = (int)(tile_start(t + 1, A, nt) - i0);
            for (int i = 0; i < m; i++) {
                if (wide) {
                    // the tile's rows widened once for every block of b, the next
                    // tile's row fetched meanwhile (short runs in many places, which the
                    // hardware prefetchers do not follow: without it, res2 1x1's 16-bit
                    // weight gradient took 1.25x the float32 time, with it 1.14-1.19x)
                    if (i0 + i + m < A) prefetch_run(a + es * ((i0 + i + m) * P->ac + p0), es * np);
                    convert_run(aw + i * kc, a + es * ((i0 + i) * P->ac + p0), P->dtype, 1, np);
                    ar[i] = aw + i * kc;
                } else {
                    ar[i] = a0 + (i0 + i) * P->ac;
                }
            }
            for (int64_t jb = 0; jb < nbb; jb++) {
                for (int i = 0; i < m; i++) cr[i] = out + (i0 + i) * bpad + jb * NB;
                fns[(m - 1) * BMAX](np, 1, ar, 1, 0, bk + jb * kc * NB, 0, 0, cr, NB, false);
            }
        }
    }
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
        if (dtype == F32 && sa == 1 && sb != 1 && A % 8 == 0 && nvalid % 8 == 0) {
            // rows a contiguous in the source, columns b strided (the data gradient's
            // transposed weights): 8 x 8 transposes
            const float* b0 = (const float*)base;
            for (int64_t t = 0; t < T; t++) {
                for (int64_t a0 = 0; a0 < A; a0 += 8)
                    for (int64_t j0 = 0; j0 < nvalid; j0 += 8)
                        transpose8(b0 + t * st + j0 * sb + a0, sb, o + (t * A + a0) * NB + j0,
                                   NB);
                for (int64_t a = 0; a < A; a++)
                    for (int64_t j = nvalid; j < NB; j++) o[(t * A + a) * NB + j] = 0.0f;
            }
            continue;
        }
        if (sa == 1 && sb != 1 && NB % 8 == 0) {
            // rows a contiguous, any dtype or size: 8 columns x 64 rows converted to a
            // float buffer, then 8 x 8 transposes (a strided gather per element was
            // 2x slower for the 16-bit transposed 1x1 weight gradient)
            float tmp[8][64];
            for (int64_t t = 0; t < T; t++) {
                float* ot = o + t * A * NB;
                for (int64_t j0 = 0; j0 < nvalid; j0 += 8) {
                    const int64_t jn = std::min<int64_t>(8, nvalid - j0);
                    for (int64_t a0 = 0; a0 < A; a0 += 64) {
                        const int64_t an = std::min<int64_t>(64, A - a0);
                        for (int64_t jj = 0; jj < 8; jj++) {
                            if (jj < jn)
                                convert_run(tmp[jj], base + es * (t * st + (j0 + jj) * sb + a0),
                                            dtype, 1, an);
                            else
                                for (int64_t k = 0; k < an; k++) tmp[jj][k] = 0.0f;
                        }
                        int64_t k = 0;
                        for (; k + 8 <= an; k += 8)
                            transpose8(&tmp[0][k], 64, ot + (a0 + k) * NB + j0, NB);
                        for (; k < an; k++)
                            for (int64_t jj = 0; jj < 8; jj++)
                                ot[(a0 + k) * NB + j0 + jj] = tmp[jj][k];
                    }
                }
                const int64_t j8 = (nvalid + 7) / 8 * 8;
                for (int64_t a = 0; a < A; a++)
                    for (int64_t j = j8; j < NB; j++) ot[a * NB + j] = 0.0f;
            }
            continue;
        }
        int64_t t8 = 0;
        if (dtype == F32 && st == 1 && sb != 1 && T >= 8 && nvalid % 8 == 0) {
            // taps contiguous in the source (OIX weights): 8 taps x 8 columns b at a
            // time as 8 x 8 transposes, the taps past a multiple of 8 below
            t8 = T - T % 8;
            const float* b0 = (const float*)base;
            for (int64_t a = 0; a < A; a++)
                for (int64_t t0 = 0; t0 < t8; t0 += 8)
                    for (int64_t j0 = 0; j0 < nvalid; j0 += 8)
                        transpose8(b0 + a * sa + j0 * sb + t0, sb, o + (t0 * A + a) * NB + j0,
                                   A * NB);
            for (int64_t t = 0; t < t8; t++)
                for (int64_t a = 0; a < A; a++)
                    for (int64_t j = nvalid; j < NB; j++) o[(t * A + a) * NB + j] = 0.0f;
        }
        for (int64_t t = t8; t < T; t++) {
            for (int64_t a = 0; a < A; a++) {
                float* row = o + (t * A + a) * NB;
                convert_run(row, base + es * (t * st + a * sa), dtype, sb, nvalid);
                for (int64_t j = nvalid; j < NB; j++) row[j] = 0.0f;
            }
        }
    }
}

#if defined(CG_ISA_AVX512) && !defined(CG_EMULATE_VL16)
// r[0..16) transposed in registers: r[i] lane j <- r[j] lane i.
static inline void transpose16(__m512 (&r)[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int k = 0; k < 2; k++) {
            r[i + k] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + k]),
                                                           _mm512_castps_pd(t[i + 2 + k])));
            r[i + 2 + k] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + k]),
                                                               _mm512_castps_pd(t[i + 2 + k])));
        }
    for (int i = 0; i < 16; i += 8)
        for (int k = 0; k < 4; k++) {
            t[i + k] = _mm512_shuffle_f32x4(r[i + k], r[i + 4 + k], 0x88);
            t[i + 4 + k] = _mm512_shuffle_f32x4(r[i + k], r[i + 4 + k], 0xDD);
        }
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
        r[8 + k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xDD);
    }
    // (the pd stage leaves columns 1 and 2 of every four swapped)
    for (int i = 0; i < 16; i += 4) std::swap(r[i + 1], r[i + 2]);
}
#endif

// A permuted copy (the layout back of a result seen through a transposed view):
// element (b0, b1, b2, r, c) of shape[0..4] is read at src + sum(index * sstr) and
// written at dst + sum(index * dstr) (strides in elements of es bytes, 2 or 4).
// Floats with a source-contiguous row axis and a destination-contiguous column axis
// move as 8 x 8 transposes; everything else element by element.  Batches [lo, hi) of
// shape[0] * shape[1] * shape[2].
void cg_permute(const void* src, void* dst, int64_t es, const int64_t* shape,
                const int64_t* sstr, const int64_t* dstr, int64_t lo, int64_t hi) {
    const int64_t R = shape[3], C = shape[4];
    const bool blocked = es == 4 && sstr[3] == 1 && dstr[4] == 1;
    for (int64_t b = lo; b < hi; b++) {
        const int64_t i2 = b % shape[2], i1 = (b / shape[2]) % shape[1],
                      i0 = b / (shape[2] * shape[1]);
        const int64_t so = i0 * sstr[0] + i1 * sstr[1] + i2 * sstr[2];
        const int64_t doff = i0 * dstr[0] + i1 * dstr[1] + i2 * dstr[2];
        if (es == 2) {
            const uint16_t* s = (const uint16_t*)src + so;
            uint16_t* d = (uint16_t*)dst + doff;
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++) d[r * dstr[3] + c * dstr[4]] = s[r * sstr[3] + c * sstr[4]];
            continue;
        }
        const float* s = (const float*)src + so;
        float* d = (float*)dst + doff;
        int64_t r8 = 0, c8 = 0;
#if defined(CG_ISA_AVX512) && !defined(CG_EMULATE_VL16)
        if (blocked && C >= 2 && C <= 16 && R >= 16 && !(cg_engine_dbg & 2097152)) {
            // Few columns (a weight gradient's taps, (*K, C, O) back to OIX: 9 a row):
            // 16 rows at a time, the C column vectors loaded whole and transposed in
            // registers, each row stored as C lanes (where 8 x 8 blocks left the 9th
            // column to a scalar loop writing one cache line each: ResNet-50 res5's
            // 9.4 MB, 2 threads, 1.70 -> see docs/kernels.md; debug bit 2097152: 8 x 8)
            const __mmask16 cm = (__mmask16)((1u << C) - 1u);
            for (int64_t r0 = 0; r0 < R; r0 += 16) {
                const int64_t nr = std::min<int64_t>(16, R - r0);
                const __mmask16 rm = (__mmask16)(nr == 16 ? 0xFFFFu : (1u << nr) - 1u);
                __m512 v[16];
                for (int64_t c = 0; c < 16; c++)
                    v[c] = c < C ? _mm512_maskz_loadu_ps(rm, s + r0 + c * sstr[4])
                                 : _mm512_setzero_ps();
                transpose16(v);
                for (int64_t i = 0; i < nr; i++)
                    _mm512_mask_storeu_ps(d + (r0 + i) * dstr[3], cm, v[i]);
            }
            continue;
        }
#endif
        if (blocked) {
            r8 = R - R % 8, c8 = C - C % 8;
            for (int64_t r = 0; r < r8; r += 8)
                for (int64_t c = 0; c < c8; c += 8)
                    transpose8(s + r + c * sstr[4], sstr[4], d + r * dstr[3] + c, dstr[3]);
        }
        // the edges: rows past r8 (every column), columns past c8 (rows below r8)
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = r < r8 ? c8 : 0; c < C; c++)
                d[r * dstr[3] + c * dstr[4]] = s[r * sstr[3] + c * sstr[4]];
    }
}

// cg_permute and cg_pack_panels as tasks of the engine's workers (pool.cpp): d holds
// their other arguments (src, dst, es, shape, sstr, dstr / src, dtype, T, A, B, st, sa,
// sb, gstride, nv, out), [lo, hi) their range.
void cg_permute_task(const int64_t* d, int64_t lo, int64_t hi) {
    cg_permute((const void*)(intptr_t)d[0], (void*)(intptr_t)d[1], d[2],
               (const int64_t*)(intptr_t)d[3], (const int64_t*)(intptr_t)d[4],
               (const int64_t*)(intptr_t)d[5], lo, hi);
}

void cg_pack_panels_task(const int64_t* d, int64_t lo, int64_t hi) {
    cg_pack_panels((const void*)(intptr_t)d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8],
                   d[9], (float*)(intptr_t)d[10], lo, hi);
}

// The FMA peak: iters rounds of ACC independent vector multiply-adds (2 * VL
// flops each), nothing else; returns a value that depends on the result, so the
// loop cannot be dropped.  Timed from Python on every thread at once.
float cg_fma_loop(int64_t iters) {
    vf acc[ACC];
    for (int i = 0; i < ACC; i++) acc[i] = bcast(0.001f * (float)i);
    const vf a = bcast(0.999f), b = bcast(0.0001f);
    for (int64_t k = 0; k < iters; k++) {
#pragma GCC unroll 32
        for (int i = 0; i < ACC; i++) acc[i] = acc[i] * a + b;
    }
    float s = 0.0f;
    for (int i = 0; i < ACC; i++) s += acc[i][0];
    return s;
}

int64_t cg_fma_loop_flops(void) { return 2 * VL * ACC; }

// cg_fma_loop as a task of the engine's threads (pool.cpp calls void functions): the
// benchmark's FMA ceiling, a row's FLOPs as nothing but FMAs after the same pause.
void cg_fma_task(int64_t iters) {
    static volatile float sink;
    sink = cg_fma_loop(iters);
}

// The benchmark's FMA-and-bytes ceiling: cg_fma_loop's rounds while the lines of a
// source are read (each line's vectors the addends of a round's first multiply-adds:
// no extra operations) and the lines of a destination written with streaming stores,
// both spread evenly over the rounds -- a row's FLOPs and the bytes it must read and
// write, moved with the least work there is.  Task k of `tasks` takes its share of the
// rounds and lines and leaves its sums' total in sums[k] (so the loads stay).
struct StreamFma {
    const float* src;
    float* dst;
    int64_t rlines, wlines, rounds, tasks;
    float* sums;
};

void cg_stream_fma_task(const StreamFma* d, int64_t k) {
    constexpr int LV = 64 / (VL * 4) > 0 ? 64 / (VL * 4) : 1;     // vectors a line
    static_assert(LV <= ACC, "a line's vectors are addends of one round");
    const int64_t n = d->tasks;
    const int64_t r0 = k * d->rlines / n, R = (k + 1) * d->rlines / n - r0;
    const int64_t w0 = k * d->wlines / n, W = (k + 1) * d->wlines / n - w0;
    const int64_t it = std::max<int64_t>(1, (k + 1) * d->rounds / n - k * d->rounds / n);
    const float* src = d->src + r0 * 16;
    float* dst = d->dst + w0 * 16;
    vf acc[ACC];
#pragma GCC unroll 32
    for (int i = 0; i < ACC; i++) acc[i] = bcast(0.001f * (float)i);
    const vf a = bcast(0.999f), b = bcast(0.0001f);
    // round i ends with floor((i + 1) R / it) lines read and floor((i + 1) W / it)
    // written (error terms instead of divisions; a dense row moves at most one line of
    // each a round: >= 25 FLOP a byte)
    int64_t rd = 0, wr = 0, re = 0, we = 0;
    for (int64_t i = 0; i < it; i++) {
        vf add[LV];
#pragma GCC unroll 4
        for (int v = 0; v < LV; v++) add[v] = b;
        re += R;
        if (re >= it) {
            re -= it;
#pragma GCC unroll 4
            for (int v = 0; v < LV; v++) add[v] = load(src + rd * 16 + v * VL);
            rd++;
        }
#pragma GCC unroll 32
        for (int q = 0; q < ACC; q++) acc[q] = acc[q] * a + (q < LV ? add[q < LV ? q : 0] : b);
        we += W;
        if (we >= it) {
            we -= it;
#pragma GCC unroll 4
            for (int v = 0; v < LV; v++) stream_store(dst + wr * 16 + v * VL, acc[v]);
            wr++;
        }
    }
    for (; rd < R; rd++)                       // (lines left by rounding: none in practice)
#pragma GCC unroll 4
        for (int v = 0; v < LV; v++) acc[v] += load(src + rd * 16 + v * VL);
    for (; wr < W; wr++)
#pragma GCC unroll 4
        for (int v = 0; v < LV; v++) stream_store(dst + wr * 16 + v * VL, acc[v]);
    stream_fence();
    vf t = acc[0];
#pragma GCC unroll 32
    for (int i = 1; i < ACC; i++) t += acc[i];
    float s = 0.0f;
    for (int j = 0; j < VL; j++) s += t[j];
    d->sums[k] = s;
}

// n values of dtype (float32, float16, bfloat16) converted to floats.
void cg_load_floats(float* dst, const void* src, int64_t dtype, int64_t n) {
    convert_run(dst, src, dtype, 1, n);
}

// n floats converted to dtype (float32, float16, bfloat16) as results are stored.
void cg_store_floats(void* dst, int64_t dtype, const float* src, int64_t n) {
    store_run(dst, dtype, 1, src, n);
}

}  // extern "C"

// The same conversions a vector at a time, as the streaming depthwise kernels load and
// store their 16-bit operands (simd.h: load_as, store_as; the last partial vector
// through load_as_n, store_as_n).
template <int64_t DT>
static void vectors_load(float* dst, const void* src, int64_t n) {
    const auto* s = (const typename Elem<DT>::T*)src;
    int64_t i = 0;
    for (; i + VL <= n; i += VL) store(dst + i, load_as<DT>(s + i));
    if (i < n) store_n(dst + i, load_as_n<DT>(s + i, (int)(n - i)), (int)(n - i));
}

template <int64_t DT>
static void vectors_store(void* dst, const float* src, int64_t n) {
    auto* d = (typename Elem<DT>::T*)dst;
    int64_t i = 0;
    for (; i + VL <= n; i += VL) store_as<DT>(d + i, load(src + i));
    if (i < n) store_as_n<DT>(d + i, load_n(src + i, (int)(n - i)), (int)(n - i));
}

extern "C" {

void cg_load_vectors(float* dst, const void* src, int64_t dtype, int64_t n) {
    if (dtype == F16) vectors_load<F16>(dst, src, n);
    else if (dtype == BF16) vectors_load<BF16>(dst, src, n);
    else vectors_load<F32>(dst, src, n);
}

void cg_store_vectors(void* dst, int64_t dtype, const float* src, int64_t n) {
    if (dtype == F16) vectors_store<F16>(dst, src, n);
    else if (dtype == BF16) vectors_store<BF16>(dst, src, n);
    else vectors_store<F32>(dst, src, n);
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

// ---------------------------------------------------------------------------------------
// Channels-first pointwise problems a sample per task (native.py: _transposed_pointwise)

extern "C" {

// The correlation of every sample but its input, output and weight panels; per sample
// k the addresses ins[k], outs[k] and the weights' source srcs[k] (cg_pack_panels'
// other arguments below), packed into the running thread's scratch.
struct PwSamples {
    CorrProblem base;
    const int64_t* ins;
    const int64_t* outs;
    const int64_t* srcs;
    int64_t dtype, T, A, B, st, sa, sb, gstride, nv, nblk;
    int64_t panel_floats;      // the panels (scratch ahead of the correlation's own)
    int64_t nitems;
};

// Sample k on one thread: its weight panels, then every item of its correlation (the
// same calls, in the same order, as a one-thread section of that sample).
void cg_pw_sample_task(const PwSamples* S, int64_t k, float* scratch) {
    CorrProblem P = S->base;
    cg_pack_panels((const void*)(intptr_t)S->srcs[k], S->dtype, S->T, S->A, S->B, S->st, S->sa,
                   S->sb, S->gstride, S->nv, scratch, 0, S->nblk);
    P.in.ptr = (const void*)(intptr_t)S->ins[k];
    P.out = (void*)(intptr_t)S->outs[k];
    P.wpk = scratch;
    cg_corr_run(&P, 0, S->nitems, scratch + (S->panel_floats + 15) / 16 * 16);
}

}  // extern "C"
