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

namespace cg {

constexpr int VL = CG_VL;
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
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_float(s[i * sstride]);
    } else {
        const uint16_t* s = (const uint16_t*)src;
        int64_t i = 0;
#if defined(CG_ISA_AVX512) || defined(CG_ISA_AVX2)
        if (sstride == 1) {
            for (; i + 8 <= n; i += 8)
                _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + i))));
        }
#endif
        for (; i < n; i++) dst[i] = half_to_float(s[i * sstride]);
    }
}

}  // namespace cg
