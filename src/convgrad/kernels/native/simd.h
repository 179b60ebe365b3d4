// One vector type for every instruction set the engine is built for.
//
// engine.cpp is compiled once per ISA (see setup.py): with CG_ISA_AVX512
// (-mavx512f ...), CG_ISA_AVX2 (-mavx2 -mfma -mf16c) or neither (the portable
// build: the compiler's baseline, SSE2 on x86-64).  The kernels are written on
// GCC vector extensions of VL floats, so one source gives zmm, ymm or xmm
// code; only partial loads/stores and half-precision conversion need
// ISA-specific instructions.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#if defined(CG_EMULATE_VL16)
// Tests only: the AVX-512 build's 16-float vectors and tile shapes with portable
// helpers, so the logic of that build is exercised on a CPU without AVX-512.
#define CG_VL 16
#define CG_ISA_NAME "vl16"
#elif defined(CG_ISA_AVX512)
#define CG_VL 16
#define CG_ISA_NAME "avx512"
#elif defined(CG_ISA_AVX2)
#define CG_VL 8
#define CG_ISA_NAME "avx2"
#else
#define CG_VL 4
#define CG_ISA_NAME "generic"
#endif

// Every source file of the engine says which build it was compiled for: the loader
// (native.py) refuses a library whose files disagree -- one linked from objects of
// different builds (setuptools shares object file names between the extensions)
// could run instructions the CPU does not have.
#define CG_ISA_OF(unit) \
    extern "C" const char* cg_isa_##unit(void) { return CG_ISA_NAME; }

// engine.cpp's debug switches, for A/B measurements (bit 10: channels-first float32
// lines converted through a staging copy, as before 2026-11-26: common.h convert_line)
extern "C" int64_t cg_engine_dbg;

namespace cg {

constexpr int VL = CG_VL;
// vectors of VL floats a 64-byte cache line holds (at least 1): one prefetch each line
constexpr int VL_PER_LINE = 64 / (VL * 4) > 0 ? 64 / (VL * 4) : 1;
typedef float vf __attribute__((vector_size(VL * 4)));
typedef float vfu __attribute__((vector_size(VL * 4), aligned(4), may_alias));

static inline vf load(const float* p) { return *reinterpret_cast<const vfu*>(p); }
static inline void store(float* p, vf v) { *reinterpret_cast<vfu*>(p) = v; }
static inline vf bcast(float s) {
#if defined(CG_EMULATE_VL16)
    vf v;
    for (int i = 0; i < VL; i++) v[i] = s;
    return v;
#elif defined(CG_ISA_AVX512)
    return (vf)_mm512_set1_ps(s);
#elif defined(CG_ISA_AVX2)
    return (vf)_mm256_set1_ps(s);
#else
    return (vf)_mm_set1_ps(s);
#endif
}
static inline vf zero() { return vf{}; }

// A store that bypasses the caches (p aligned to the vector); stream_fence() orders
// such stores before the thread reports its work done.
static inline void stream_store(float* p, vf v) {
#if defined(CG_EMULATE_VL16)
    store(p, v);
#elif defined(CG_ISA_AVX512)
    _mm512_stream_ps(p, (__m512)v);
#elif defined(CG_ISA_AVX2)
    _mm256_stream_ps(p, (__m256)v);
#else
    _mm_stream_ps(p, (__m128)v);
#endif
}
static inline void stream_fence() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_sfence();
#endif
}

// n floats from src to dst: the whole vector-aligned middle with streaming stores
// (cache lines written whole, never read first), the ends with plain ones.
static inline void stream_run(float* dst, const float* src, int64_t n) {
    int64_t i = 0;
    while (i < n && ((uintptr_t)(dst + i) & (VL * 4 - 1))) dst[i] = src[i], i++;
    for (; i + VL <= n; i += VL) stream_store(dst + i, load(src + i));
    for (; i < n; i++) dst[i] = src[i];
}

// The first n (< VL) lanes from p; the others are zero.  Never reads past p + n.
static inline vf load_n(const float* p, int n) {
#if defined(CG_EMULATE_VL16)
    vf v = zero();
    for (int i = 0; i < n; i++) v[i] = p[i];
    return v;
#elif defined(CG_ISA_AVX512)
    return (vf)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
#elif defined(CG_ISA_AVX2)
    static const int32_t mask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return (vf)_mm256_maskload_ps(p, _mm256_loadu_si256((const __m256i*)(mask + 8 - n)));
#else
    vf v = zero();
    for (int i = 0; i < n; i++) v[i] = p[i];
    return v;
#endif
}

// Store the first n (< VL) lanes to p; never writes past p + n.
static inline void store_n(float* p, vf v, int n) {
#if defined(CG_EMULATE_VL16)
    for (int i = 0; i < n; i++) p[i] = v[i];
#elif defined(CG_ISA_AVX512)
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), (__m512)v);
#elif defined(CG_ISA_AVX2)
    static const int32_t mask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    _mm256_maskstore_ps(p, _mm256_loadu_si256((const __m256i*)(mask + 8 - n)), (__m256)v);
#else
    for (int i = 0; i < n; i++) p[i] = v[i];
#endif
}

// -- scalar conversions (exact: the same values as NumPy's / ml_dtypes' casts) ------------

static inline float bits_to_float(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

static inline uint32_t float_to_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    if (exp == 0) {
        if (mant == 0) return bits_to_float(sign);
        uint32_t e = 113;                     // subnormal: normalise
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        return bits_to_float(sign | (e << 23) | ((mant & 0x3FFu) << 13));
    }
    if (exp == 31) return bits_to_float(sign | 0x7F800000u | (mant << 13));
    return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline float bf16_to_float(uint16_t h) { return bits_to_float((uint32_t)h << 16); }

// float -> IEEE half, round to nearest even; overflow to infinity; NaN stays a
// (quiet) NaN with its sign and top payload bits: NumPy's float16 cast.
static inline uint16_t float_to_half(float f) {
    const uint32_t b = float_to_bits(f);
    const uint32_t sign = (b >> 16) & 0x8000u;
    const uint32_t abs = b & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u) {                                   // inf or NaN
        if (abs == 0x7F800000u) return (uint16_t)(sign | 0x7C00u);
        uint32_t m = (abs & 0x007FFFFFu) >> 13;
        return (uint16_t)(sign | 0x7C00u | 0x0200u | m);       // quiet NaN
    }
    if (abs >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // rounds past 65504
    if (abs < 0x38800000u) {                                    // half subnormal or 0
        if (abs < 0x33000000u) return (uint16_t)sign;           // below half the least
        const uint32_t e = abs >> 23;                           // 102 .. 112
        const uint32_t m = (abs & 0x007FFFFFu) | 0x00800000u;
        const uint32_t shift = 126 - e;                         // 14 .. 24
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((abs >> 13) - (112u << 10));                  // rebias exponent
    const uint32_t rem = abs & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

// float -> bfloat16, round to nearest even; NaN stays a quiet NaN (ml_dtypes).
static inline uint16_t float_to_bf16(float f) {
    const uint32_t b = float_to_bits(f);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((b >> 16) | 0x0040u);
    return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// Element types of the tensors the engine reads (codes shared with native.py).
enum DType : int64_t { F32 = 0, F16 = 1, BF16 = 2 };

// Convert n elements of src (element stride sstride) to contiguous floats.
static inline void convert_run(float* dst, const void* src, int64_t dtype, int64_t sstride,
                               int64_t n) {
    if (dtype == F32) {
        const float* s = (const float*)src;
        if (sstride == 1) {
            std::memcpy(dst, s, n * sizeof(float));
        } else {
            for (int64_t i = 0; i < n; i++) dst[i] = s[i * sstride];
        }
    } else if (dtype == BF16) {
        const uint16_t* s = (const uint16_t*)src;
        int64_t i = 0;
        if (sstride == 1) {
            typedef uint32_t vu __attribute__((vector_size(VL * 4)));
            typedef uint16_t vhu __attribute__((vector_size(VL * 2), aligned(2), may_alias));
            for (; i + VL <= n; i += VL) {
                const vu w = __builtin_convertvector(*reinterpret_cast<const vhu*>(s + i), vu);
                store(dst + i, (vf)(w << 16));
            }
        }
        for (; i < n; i++) dst[i] = bf16_to_float(s[i * sstride]);
    } else {
        const uint16_t* s = (const uint16_t*)src;
        int64_t i = 0;
#if defined(CG_ISA_AVX512) || defined(CG_ISA_AVX2)
        if (sstride == 1) {
#if defined(CG_ISA_AVX512)
            // 16 at a time (res2 1x1's float16 channels-first weight gradient, whose x
            // rows are widened here: 1.02x hot, 1.02-1.06x after the pause)
            for (; i + 16 <= n; i += 16)
                _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(s + i))));
#endif
            for (; i + 8 <= n; i += 8)
                _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + i))));
        }
#endif
        for (; i < n; i++) dst[i] = half_to_float(s[i * sstride]);
    }
}

// -- whole vectors in a tensor's element type -------------------------------------------
//
// VL elements of type Elem<DT>::T (float, or the 16 bits of a float16 / bfloat16)
// converted to and from a float vector inside a kernel's loads and stores, with the
// same values as convert_run / store_run (F16C where the build has it).

template <int64_t DT> struct Elem { typedef uint16_t T; };
template <> struct Elem<F32> { typedef float T; };

typedef uint32_t vu32 __attribute__((vector_size(VL * 4)));
typedef uint16_t vu16 __attribute__((vector_size(VL * 2)));
typedef uint16_t vu16u __attribute__((vector_size(VL * 2), aligned(2), may_alias));

template <int64_t DT>
static inline vf load_as(const typename Elem<DT>::T* p) {
    if constexpr (DT == F32) {
        return load(p);
    } else if constexpr (DT == BF16) {
        // (GCC widens the generic vector in 128-bit halves: 4 instructions more)
#if defined(CG_EMULATE_VL16) || !(defined(CG_ISA_AVX512) || defined(CG_ISA_AVX2))
        return (vf)(__builtin_convertvector(*reinterpret_cast<const vu16u*>(p), vu32) << 16);
#elif defined(CG_ISA_AVX512)
        return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16);
#else
        return (vf)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16);
#endif
    } else {
#if defined(CG_EMULATE_VL16) || !(defined(CG_ISA_AVX512) || defined(CG_ISA_AVX2))
        vf v;
        for (int i = 0; i < VL; i++) v[i] = half_to_float(p[i]);
        return v;
#elif defined(CG_ISA_AVX512)
        return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
#else
        return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
#endif
    }
}

// NT: a streaming store (p aligned to the stored bytes; builds without AVX store
// plainly), see stream_store.
#if defined(CG_ISA_AVX512) && !defined(CG_EMULATE_VL16)
template <bool NT>
static inline void put_bits(void* p, __m256i x) {
    if constexpr (NT) _mm256_stream_si256((__m256i*)p, x);
    else _mm256_storeu_si256((__m256i*)p, x);
}
#elif defined(CG_ISA_AVX2) && !defined(CG_EMULATE_VL16)
template <bool NT>
static inline void put_bits(void* p, __m128i x) {
    if constexpr (NT) _mm_stream_si128((__m128i*)p, x);
    else _mm_storeu_si128((__m128i*)p, x);
}
#endif

template <int64_t DT, bool NT = false>
static inline void store_as(typename Elem<DT>::T* p, vf v) {
    if constexpr (DT == F32) {
        if constexpr (NT) stream_store(p, v);
        else store(p, v);
    } else if constexpr (DT == BF16) {
        // round to nearest even; a NaN keeps its top bits, made quiet (float_to_bf16)
#if defined(CG_EMULATE_VL16) || !(defined(CG_ISA_AVX512) || defined(CG_ISA_AVX2))
        const vu32 b = (vu32)v;
        const vu32 rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
        const vu32 quiet = (b >> 16) | 0x0040u;
        const vu32 r = ((b & 0x7FFFFFFFu) > 0x7F800000u) ? quiet : rounded;
        *reinterpret_cast<vu16u*>(p) = __builtin_convertvector(r, vu16);
#elif defined(CG_ISA_AVX512)
        const __m512i b = _mm512_castps_si512((__m512)v), hi = _mm512_srli_epi32(b, 16);
        const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
        __m512i r = _mm512_srli_epi32(
            _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb), 16);
        r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask((__m512)v, (__m512)v, _CMP_UNORD_Q),
                                  _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
        put_bits<NT>(p, _mm512_cvtepi32_epi16(r));
#else
        const __m256i b = _mm256_castps_si256((__m256)v), hi = _mm256_srli_epi32(b, 16);
        const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
        __m256i r = _mm256_srli_epi32(
            _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), lsb), 16);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)),
                               _mm256_castps_si256(_mm256_cmp_ps((__m256)v, (__m256)v, _CMP_UNORD_Q)));
        // every lane holds 16 bits: the unsigned saturating pack is a plain narrowing
        put_bits<NT>(p, _mm_packus_epi32(_mm256_castsi256_si128(r),
                                         _mm256_extracti128_si256(r, 1)));
#endif
    } else {
#if defined(CG_EMULATE_VL16) || !(defined(CG_ISA_AVX512) || defined(CG_ISA_AVX2))
        for (int i = 0; i < VL; i++) p[i] = float_to_half(v[i]);
#elif defined(CG_ISA_AVX512)
        put_bits<NT>(p, _mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT));
#else
        put_bits<NT>(p, _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT));
#endif
    }
}

// The first n (< VL) elements from p, the other lanes zero; never reads past p + n.
template <int64_t DT>
static inline vf load_as_n(const typename Elem<DT>::T* p, int n) {
    if constexpr (DT == F32) {
        return load_n(p, n);
    } else {
        typename Elem<DT>::T t[VL] = {};
        std::memcpy(t, p, n * sizeof(t[0]));
        return load_as<DT>(t);
    }
}

// Store the first n (< VL) lanes to p; never writes past p + n.
template <int64_t DT>
static inline void store_as_n(typename Elem<DT>::T* p, vf v, int n) {
    if constexpr (DT == F32) {
        store_n(p, v, n);
    } else {
        typename Elem<DT>::T t[VL];
        store_as<DT>(t, v);
        std::memcpy(p, t, n * sizeof(t[0]));
    }
}

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t i8 __attribute__((vector_size(32)));

// dst[j * dstride + i] = rows[i][j] for 8 rows of 8 floats.
static inline void transpose8_rows(const float* const* rows, float* dst, int64_t dstride) {
    v8 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = *reinterpret_cast<const v8u*>(rows[i]);
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shuffle(r[i], r[i + 1], i8{0, 8, 1, 9, 4, 12, 5, 13});
        t[i + 1] = __builtin_shuffle(r[i], r[i + 1], i8{2, 10, 3, 11, 6, 14, 7, 15});
    }
    for (int i = 0; i < 8; i += 4) {
        for (int k = 0; k < 2; k++) {
            u[i + k] = __builtin_shuffle(t[i + k], t[i + k + 2], i8{0, 1, 8, 9, 4, 5, 12, 13});
            u[i + k + 2] = __builtin_shuffle(t[i + k], t[i + k + 2], i8{2, 3, 10, 11, 6, 7, 14, 15});
        }
    }
    // u[0]: rows 0-3 of columns 0 | 4, u[2]: columns 1 | 5, u[1]: 2 | 6, u[3]: 3 | 7
    static const int order[4] = {0, 2, 1, 3};
    for (int k = 0; k < 4; k++) {
        const v8 lo = __builtin_shuffle(u[order[k]], u[4 + order[k]], i8{0, 1, 2, 3, 8, 9, 10, 11});
        const v8 hi = __builtin_shuffle(u[order[k]], u[4 + order[k]], i8{4, 5, 6, 7, 12, 13, 14, 15});
        *reinterpret_cast<v8u*>(dst + k * dstride) = lo;
        *reinterpret_cast<v8u*>(dst + (k + 4) * dstride) = hi;
    }
}

// dst[j * dstride + i] = src[i * sstride + j] for an 8 x 8 block of floats.
static inline void transpose8(const float* src, int64_t sstride, float* dst, int64_t dstride) {
    const float* rows[8];
    for (int i = 0; i < 8; i++) rows[i] = src + i * sstride;
    transpose8_rows(rows, dst, dstride);
}

// Store n contiguous floats to dst (element stride dstride) in dtype.  Whole vectors
// of a contiguous run convert with vector instructions (F16C's round-to-nearest-even
// conversion; the bfloat16 rounding on integer vectors), the rest with the scalar
// functions above: the same values either way.
static inline void store_run(void* dst, int64_t dtype, int64_t dstride, const float* src,
                             int64_t n) {
    int64_t i = 0;
    if (dtype == F32) {
        float* d = (float*)dst;
        if (dstride == 1) {
            std::memcpy(d, src, n * sizeof(float));
            return;
        }
        for (; i < n; i++) d[i * dstride] = src[i];
        return;
    }
    uint16_t* d = (uint16_t*)dst;
    if (dtype == F16) {
#if defined(CG_ISA_AVX512) || defined(CG_ISA_AVX2)
        if (dstride == 1)
            for (; i + 8 <= n; i += 8)
                _mm_storeu_si128((__m128i*)(d + i),
                                 _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
        for (; i < n; i++) d[i * dstride] = float_to_half(src[i]);
        return;
    }
    if (dstride == 1) {
        typedef uint32_t vu __attribute__((vector_size(VL * 4)));
        typedef uint16_t vh __attribute__((vector_size(VL * 2)));
        typedef uint16_t vhu __attribute__((vector_size(VL * 2), aligned(2), may_alias));
        for (; i + VL <= n; i += VL) {
            const vu b = (vu)load(src + i);
            const vu rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
            const vu quiet = (b >> 16) | 0x0040u;
            const vu r = ((b & 0x7FFFFFFFu) > 0x7F800000u) ? quiet : rounded;
            *reinterpret_cast<vhu*>(d + i) = __builtin_convertvector(r, vh);
        }
        // and 8 at a time (a pixel of 8 channels, shorter than the AVX-512 vector: the
        // spec layer's bfloat16 data gradient 1.67 -> 1.3 ms hot, as its float16)
        typedef uint32_t v8b __attribute__((vector_size(32)));
        typedef uint32_t v8bu __attribute__((vector_size(32), aligned(4), may_alias));
        typedef uint16_t v8h __attribute__((vector_size(16)));
        typedef uint16_t v8hu __attribute__((vector_size(16), aligned(2), may_alias));
        for (; i + 8 <= n; i += 8) {
            const v8b b = *reinterpret_cast<const v8bu*>(src + i);
            const v8b rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
            const v8b quiet = (b >> 16) | 0x0040u;
            const v8b r = ((b & 0x7FFFFFFFu) > 0x7F800000u) ? quiet : rounded;
            *reinterpret_cast<v8hu*>(d + i) = __builtin_convertvector(r, v8h);
        }
    }
    for (; i < n; i++) d[i * dstride] = float_to_bf16(src[i]);
}

// store_run(dst, dtype, 1, src, n) with streaming stores (store_as) where the run is
// whole cache lines starting on one (the caller fences them), plainly otherwise: a
// converted 16-bit result line then skips reading each destination line before writing
// it.  (Builds without AVX2 store the 16-bit vectors plainly, as store_as does.)
static inline void store_run_streamed(void* dst, int64_t dtype, const float* src, int64_t n) {
    const int64_t es = dtype == F32 ? 4 : 2;
    if ((uintptr_t)dst % 64 != 0 || (n * es) % 64 != 0) {
        store_run(dst, dtype, 1, src, n);
        return;
    }
    auto stream_all = [&](auto dt) {
        constexpr int64_t DT = decltype(dt)::value;
        auto* d = (typename Elem<DT>::T*)dst;
        for (int64_t i = 0; i < n; i += VL) store_as<DT, true>(d + i, load(src + i));
    };
    if (dtype == F32) stream_all(std::integral_constant<int64_t, F32>{});
    else if (dtype == F16) stream_all(std::integral_constant<int64_t, F16>{});
    else stream_all(std::integral_constant<int64_t, BF16>{});
}

// store_run(dst, dtype, 1, src, n) with streaming stores for the whole cache lines in
// the middle of the run (store_as), the ends plainly (the caller fences): a line piece
// of a channels-last result that need not start on a line.
static inline void store_run_streamed_lines(void* dst, int64_t dtype, const float* src,
                                            int64_t n) {
    const int64_t es = dtype == F32 ? 4 : 2, line = 64 / es;
    int64_t head = (int64_t)((64 - (uintptr_t)dst % 64) % 64) / es;
    if ((uintptr_t)dst % es != 0 || head + line > n) {
        store_run(dst, dtype, 1, src, n);
        return;
    }
    const int64_t body = (n - head) / line * line;    // whole lines, starting on one
    store_run(dst, dtype, 1, src, head);
    store_run_streamed((char*)dst + es * head, dtype, src + head, body);
    store_run((char*)dst + es * (head + body), dtype, 1, src + head + body, n - head - body);
}

// Store cn <= 8 channels of un <= 64 pixels into a channels-first destination: pixel
// u's cn floats are at row(u); channel c's run of un pixels goes to dst + c * cstride
// elements, pixels pstride elements apart, in dtype.  Whole groups of 8 pixels x 8
// channels move as 8 x 8 transposes, then each channel is one run.
// stream: float32 runs of whole cache lines that start on one go out with streaming
// stores (the caller fences them).
template <class RowOf>
inline void store_channel_runs(char* dst, int64_t dtype, int64_t pstride, int64_t cstride,
                                 RowOf row, int64_t un, int64_t cn, bool stream = false) {
    alignas(32) float blk[8][64];
    int64_t u = 0;
    if (cn == 8)
        for (; u + 8 <= un; u += 8) {
            const float* rows[8];
            for (int r = 0; r < 8; r++) rows[r] = row(u + r);
            transpose8_rows(rows, &blk[0][u], 64);
        }
    for (; u < un; u++) {
        const float* s = row(u);
        for (int64_t c = 0; c < cn; c++) blk[c][u] = s[c];
    }
    const int64_t es = dtype == F32 ? 4 : 2;
    if (stream && dtype == F32 && pstride == 1 && un % 16 == 0) {
        for (int64_t c = 0; c < cn; c++) {
            float* d = (float*)(dst + es * c * cstride);
            if ((uintptr_t)d % 64 != 0) {
                store_run(d, dtype, pstride, blk[c], un);
                continue;
            }
            for (int64_t i = 0; i < un; i += VL) stream_store(d + i, load(&blk[c][i]));
        }
        return;
    }
    for (int64_t c = 0; c < cn; c++) store_run(dst + es * c * cstride, dtype, pstride, blk[c], un);
}

}  // namespace cg
