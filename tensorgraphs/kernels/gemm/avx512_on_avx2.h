/* The AVX-512 intrinsics these kernels use, for a machine with AVX2 and FMA but without AVX-512F: a 16-lane vector
 * is a pair of 8-lane AVX registers (a struct, which gcc keeps in registers: an array of GCC 64-byte vector types
 * would live in memory) and a 16-bit mask selects lanes through AVX2's masked loads, stores and blends. The
 * kernels are written once, against AVX-512's names; included by epilogue.h after immintrin.h, so the macros
 * below take the place of the real intrinsics. Arithmetic is lane for lane the same IEEE operation, so results
 * match AVX-512's except for the order of _mm512_reduce_add_ps's sum. Operations that take an immediate are
 * macros (statement expressions), so they compile at -O0 too. The register tile is narrowed to fit 16 registers
 * (gemm_internal.h). Where a lane-for-lane stand-in would be slow, the native AVX2 way takes its place: masked
 * accesses by 8-lane half (a plain load or store where a half is whole, none where it is empty), and epilogue.h's
 * shuffles (the 16x16 transpose as four 8x8 ones, the even lanes of a stride-2 row) in place of AVX-512's. */
#ifndef TG_AVX512_ON_AVX2_H
#define TG_AVX512_ON_AVX2_H
#include <float.h>
#include <immintrin.h>
#include <stdint.h>

typedef struct {
    __m256 lo, hi;
} tg_f32x16;
typedef struct {
    __m256i lo, hi;
} tg_i32x16;
#define __m512 tg_f32x16
#define __m512i tg_i32x16
#define __m512bh tg_i32x16 /* bfloat16 pairs, kept as their bits */
#define TG_AS_BF16(x) (x)

#define TG_SIMD static inline __attribute__((always_inline))

TG_SIMD tg_f32x16 tg_f32x16_of(__m256 lo, __m256 hi) { return (tg_f32x16){lo, hi}; }
TG_SIMD tg_i32x16 tg_i32x16_of(__m256i lo, __m256i hi) { return (tg_i32x16){lo, hi}; }

/* Lanes whose bit of `bits` is set, as all-ones 32-bit lanes (8 of them). */
TG_SIMD __m256i tg_lanes8(unsigned bits) {
    const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), lane_bits), lane_bits);
}

TG_SIMD __m128i tg_lanes4(unsigned bits) {
    const __m128i lane_bits = _mm_setr_epi32(1, 2, 4, 8);
    return _mm_cmpeq_epi32(_mm_and_si128(_mm_set1_epi32((int)bits), lane_bits), lane_bits);
}

TG_SIMD __mmask16 tg_mask_of(__m256i lo, __m256i hi) {
    return (__mmask16)(_mm256_movemask_ps(_mm256_castsi256_ps(lo)) | _mm256_movemask_ps(_mm256_castsi256_ps(hi)) << 8);
}

/* ---------------------------------------------------------------- loads and stores */

TG_SIMD tg_f32x16 tg_loadu_ps(const void *p) {
    const float *f = (const float *)p;
    return tg_f32x16_of(_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8));
}

TG_SIMD tg_f32x16 tg_load_ps(const void *p) {
    const float *f = (const float *)p;
    return tg_f32x16_of(_mm256_load_ps(f), _mm256_load_ps(f + 8));
}

TG_SIMD void tg_store_ps(void *p, tg_f32x16 x) {
    float *f = (float *)p;
    _mm256_store_ps(f, x.lo);
    _mm256_store_ps(f + 8, x.hi);
}

/* 8 lanes of a masked load or store, by `bits`: a plain access for all 8 (AMD's VMASKMOVPS store is microcoded,
 * tens of cycles), none for no lane, AVX2's masked access otherwise. */
TG_SIMD __m256 tg_maskz_loadu8(unsigned bits, const float *f) {
    if (bits == 0xFF) return _mm256_loadu_ps(f);
    return bits ? _mm256_maskload_ps(f, tg_lanes8(bits)) : _mm256_setzero_ps();
}

TG_SIMD void tg_mask_storeu8(float *f, unsigned bits, __m256 x) {
    if (bits == 0xFF)
        _mm256_storeu_ps(f, x);
    else if (bits)
        _mm256_maskstore_ps(f, tg_lanes8(bits), x);
}

TG_SIMD tg_f32x16 tg_maskz_loadu_ps(__mmask16 mask, const void *p) {
    const float *f = (const float *)p;
    return tg_f32x16_of(tg_maskz_loadu8(mask & 0xFF, f), tg_maskz_loadu8(mask >> 8, f + 8));
}

TG_SIMD __m256 tg_mask_loadu8(__m256 src, unsigned bits, const float *f) {
    if (bits == 0xFF) return _mm256_loadu_ps(f);
    if (bits == 0) return src;
    __m256i lanes = tg_lanes8(bits);
    return _mm256_blendv_ps(src, _mm256_maskload_ps(f, lanes), _mm256_castsi256_ps(lanes));
}

TG_SIMD tg_f32x16 tg_mask_loadu_ps(tg_f32x16 src, __mmask16 mask, const void *p) {
    const float *f = (const float *)p;
    return tg_f32x16_of(tg_mask_loadu8(src.lo, mask & 0xFF, f), tg_mask_loadu8(src.hi, mask >> 8, f + 8));
}

TG_SIMD void tg_mask_storeu_ps(void *p, __mmask16 mask, tg_f32x16 x) {
    float *f = (float *)p;
    tg_mask_storeu8(f, mask & 0xFF, x.lo);
    tg_mask_storeu8(f + 8, mask >> 8, x.hi);
}

TG_SIMD void tg_storeu_ps(void *p, tg_f32x16 x) { tg_mask_storeu_ps(p, 0xFFFF, x); }

TG_SIMD tg_i32x16 tg_loadu_si512(const void *p) {
    const __m256i *v = (const __m256i *)p;
    return tg_i32x16_of(_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1));
}

TG_SIMD __m128 tg_maskz_loadu_ps128(__mmask8 mask, const void *p) {
    if ((mask & 0xF) == 0xF) return _mm_loadu_ps((const float *)p);
    return _mm_maskload_ps((const float *)p, tg_lanes4(mask & 0xF));
}

TG_SIMD void tg_mask_storeu_ps128(void *p, __mmask8 mask, __m128 x) {
    if ((mask & 0xF) == 0xF)
        _mm_storeu_ps((float *)p, x);
    else
        _mm_maskstore_ps((float *)p, tg_lanes4(mask & 0xF), x);
}

#define TG_GATHER_PS(src, mask, index, base, scale)                                                                \
    ({                                                                                                             \
        tg_f32x16 s_ = (src);                                                                                      \
        tg_i32x16 i_ = (index);                                                                                    \
        __mmask16 m_ = (mask);                                                                                     \
        tg_f32x16_of(                                                                                              \
            _mm256_mask_i32gather_ps(s_.lo, (const float *)(base), i_.lo, _mm256_castsi256_ps(tg_lanes8(m_ & 0xFF)), \
                                     scale),                                                                       \
            _mm256_mask_i32gather_ps(s_.hi, (const float *)(base), i_.hi, _mm256_castsi256_ps(tg_lanes8(m_ >> 8)),   \
                                     scale));                                                                      \
    })

/* ---------------------------------------------------------------- float arithmetic */

/* name(a, b): `op` on each half; `type` is tg_f32x16 or tg_i32x16. */
#define TG_BINARY(name, type, op)                                                                                 \
    TG_SIMD type name(type a, type b) { return (type){op(a.lo, b.lo), op(a.hi, b.hi)}; }
TG_BINARY(tg_add_ps, tg_f32x16, _mm256_add_ps)
TG_BINARY(tg_sub_ps, tg_f32x16, _mm256_sub_ps)
TG_BINARY(tg_mul_ps, tg_f32x16, _mm256_mul_ps)
TG_BINARY(tg_div_ps, tg_f32x16, _mm256_div_ps)
TG_BINARY(tg_max_ps, tg_f32x16, _mm256_max_ps)
TG_BINARY(tg_min_ps, tg_f32x16, _mm256_min_ps)
TG_BINARY(tg_add_epi32, tg_i32x16, _mm256_add_epi32)
TG_BINARY(tg_sub_epi32, tg_i32x16, _mm256_sub_epi32)
TG_BINARY(tg_maddubs_epi16, tg_i32x16, _mm256_maddubs_epi16)
TG_BINARY(tg_madd_epi16, tg_i32x16, _mm256_madd_epi16)
TG_BINARY(tg_mullo_epi32, tg_i32x16, _mm256_mullo_epi32)
TG_BINARY(tg_and_si512, tg_i32x16, _mm256_and_si256)
TG_BINARY(tg_or_si512, tg_i32x16, _mm256_or_si256)

TG_SIMD tg_f32x16 tg_set1_ps(float x) { return tg_f32x16_of(_mm256_set1_ps(x), _mm256_set1_ps(x)); }
TG_SIMD tg_f32x16 tg_setzero_ps(void) { return tg_f32x16_of(_mm256_setzero_ps(), _mm256_setzero_ps()); }

TG_SIMD tg_f32x16 tg_fmadd_ps(tg_f32x16 a, tg_f32x16 b, tg_f32x16 c) {
    return tg_f32x16_of(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}

/* a * b + c in the low 8 lanes, and no work for the high ones (left as c's: a tile of at most 8 columns). */
TG_SIMD tg_f32x16 tg_fmadd_low_ps(tg_f32x16 a, tg_f32x16 b, tg_f32x16 c) {
    return tg_f32x16_of(_mm256_fmadd_ps(a.lo, b.lo, c.lo), c.hi);
}

/* 8 floats from p (aligned) in the low lanes, zeros above. */
TG_SIMD tg_f32x16 tg_load_low_ps(const void *p) { return tg_f32x16_of(_mm256_load_ps((const float *)p), _mm256_setzero_ps()); }

TG_SIMD tg_f32x16 tg_fnmadd_ps(tg_f32x16 a, tg_f32x16 b, tg_f32x16 c) {
    return tg_f32x16_of(_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi));
}

/* x * 2^n for integral n in [-127, 128] (what tg_exp2_ps passes): one power of two built in the exponent field,
 * 2^-127 taken as 0 and 2^128 as inf (where VSCALEFPS gives a subnormal or a finite x * 2^128 for x < 1). */
TG_SIMD __m256 tg_scalef8(__m256 x, __m256 n) {
    __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_mul_ps(x, _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23)));
}

TG_SIMD tg_f32x16 tg_scalef_ps(tg_f32x16 x, tg_f32x16 n) {
    return tg_f32x16_of(tg_scalef8(x.lo, n.lo), tg_scalef8(x.hi, n.hi));
}

/* min / max of the 16 lanes, as a tree of MINPS / MAXPS (which of several NaN lanes wins depends on the order). */
TG_SIMD float tg_reduce_min_ps(tg_f32x16 x) {
    __m256 m = _mm256_min_ps(x.lo, x.hi);
    __m128 quarter = _mm_min_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    quarter = _mm_min_ps(quarter, _mm_movehl_ps(quarter, quarter));
    return _mm_cvtss_f32(_mm_min_ss(quarter, _mm_movehdup_ps(quarter)));
}

TG_SIMD float tg_reduce_max_ps(tg_f32x16 x) {
    __m256 m = _mm256_max_ps(x.lo, x.hi);
    __m128 quarter = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    quarter = _mm_max_ps(quarter, _mm_movehl_ps(quarter, quarter));
    return _mm_cvtss_f32(_mm_max_ss(quarter, _mm_movehdup_ps(quarter)));
}

TG_SIMD float tg_reduce_add_ps(tg_f32x16 x) {
    __m256 sum = _mm256_add_ps(x.lo, x.hi);
    __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    quarter = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));
    return _mm_cvtss_f32(_mm_add_ss(quarter, _mm_movehdup_ps(quarter)));
}

/* acc + the products of the bfloat16 pairs of a and b (high halves first, as VDPBF16PS): a bfloat16 product is
 * exact in float32, so each fma rounds once as its sum does. */
TG_SIMD __m256 tg_dpbf16_8(__m256 acc, __m256i a, __m256i b) {
    const __m256i high = _mm256_set1_epi32((int32_t)0xFFFF0000);
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(a, high)),
                          _mm256_castsi256_ps(_mm256_and_si256(b, high)), acc);
    return _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)),
                           acc);
}

TG_SIMD tg_f32x16 tg_dpbf16_ps(tg_f32x16 acc, tg_i32x16 a, tg_i32x16 b) {
    return tg_f32x16_of(tg_dpbf16_8(acc.lo, a.lo, b.lo), tg_dpbf16_8(acc.hi, a.hi, b.hi));
}

/* ---------------------------------------------------------------- integers, casts, masks */

TG_SIMD tg_i32x16 tg_set1_epi32(int32_t x) { return tg_i32x16_of(_mm256_set1_epi32(x), _mm256_set1_epi32(x)); }
TG_SIMD tg_i32x16 tg_setzero_si512(void) { return tg_i32x16_of(_mm256_setzero_si256(), _mm256_setzero_si256()); }
TG_SIMD tg_i32x16 tg_set1_epi16(int16_t x) { return tg_i32x16_of(_mm256_set1_epi16(x), _mm256_set1_epi16(x)); }
TG_SIMD tg_i32x16 tg_set1_epi8(int8_t x) { return tg_i32x16_of(_mm256_set1_epi8(x), _mm256_set1_epi8(x)); }

/* Bytes whose bit of `mask` is set, as all-ones bytes. */
TG_SIMD __m128i tg_byte_lanes(__mmask16 mask) {
    const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    __m128i spread = _mm_shuffle_epi8(_mm_cvtsi32_si128(mask), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    return _mm_cmpeq_epi8(_mm_and_si128(spread, bit), bit);
}

TG_SIMD __m128i tg_maskz_mov_epi8(__mmask16 mask, __m128i x) { return _mm_and_si128(x, tg_byte_lanes(mask)); }

TG_SIMD void tg_mask_storeu_epi8(void *p, __mmask16 mask, __m128i x) {
    if (mask == 0xFFFF) {
        _mm_storeu_si128((__m128i *)p, x);
        return;
    }
    uint8_t bytes[16];
    _mm_storeu_si128((__m128i *)bytes, x);
    for (int i = 0; i < 16; i++)
        if (mask >> i & 1) ((uint8_t *)p)[i] = bytes[i];
}

TG_SIMD tg_i32x16 tg_castps_si512(tg_f32x16 x) {
    return tg_i32x16_of(_mm256_castps_si256(x.lo), _mm256_castps_si256(x.hi));
}
TG_SIMD tg_f32x16 tg_castsi512_ps(tg_i32x16 x) {
    return tg_f32x16_of(_mm256_castsi256_ps(x.lo), _mm256_castsi256_ps(x.hi));
}
TG_SIMD tg_i32x16 tg_maskz_loadu_epi32(__mmask16 mask, const void *p) {
    return tg_castps_si512(tg_maskz_loadu_ps(mask, p));
}
TG_SIMD void tg_mask_storeu_epi32(void *p, __mmask16 mask, tg_i32x16 x) { tg_mask_storeu_ps(p, mask, tg_castsi512_ps(x)); }

TG_SIMD tg_f32x16 tg_cvtepi32_ps(tg_i32x16 x) { return tg_f32x16_of(_mm256_cvtepi32_ps(x.lo), _mm256_cvtepi32_ps(x.hi)); }
/* Truncation; a lane out of int32's range (or NaN) becomes INT32_MIN, as VCVTTPS2DQ's "integer indefinite". */
TG_SIMD tg_i32x16 tg_cvttps_epi32(tg_f32x16 x) {
    return tg_i32x16_of(_mm256_cvttps_epi32(x.lo), _mm256_cvttps_epi32(x.hi));
}

TG_SIMD tg_f32x16 tg_mask_blend_ps(__mmask16 mask, tg_f32x16 a, tg_f32x16 b) {
    return tg_f32x16_of(_mm256_blendv_ps(a.lo, b.lo, _mm256_castsi256_ps(tg_lanes8(mask & 0xFF))),
                        _mm256_blendv_ps(a.hi, b.hi, _mm256_castsi256_ps(tg_lanes8(mask >> 8))));
}

/* The 16 lanes as bytes, each unsigned 32-bit lane saturated to 255 (VPMOVUSDB). */
TG_SIMD __m128i tg_cvtusepi32_epi8(tg_i32x16 x) {
    const __m256i top = _mm256_set1_epi32(255);
    __m256i words = _mm256_packus_epi32(_mm256_min_epu32(x.lo, top), _mm256_min_epu32(x.hi, top));
    __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
    return _mm_shuffle_epi32(bytes, _MM_SHUFFLE(3, 1, 2, 0)); /* lanes 0-3 8-11 4-7 12-15 -> 0-3 4-7 8-11 12-15 */
}

TG_SIMD tg_i32x16 tg_mask_or_epi32(tg_i32x16 src, __mmask16 mask, tg_i32x16 a, tg_i32x16 b) {
    return tg_i32x16_of(_mm256_blendv_epi8(src.lo, _mm256_or_si256(a.lo, b.lo), tg_lanes8(mask & 0xFF)),
                        _mm256_blendv_epi8(src.hi, _mm256_or_si256(a.hi, b.hi), tg_lanes8(mask >> 8)));
}

TG_SIMD __mmask16 tg_cmplt_epi32_mask(tg_i32x16 a, tg_i32x16 b) {
    return tg_mask_of(_mm256_cmpgt_epi32(b.lo, a.lo), _mm256_cmpgt_epi32(b.hi, a.hi));
}
TG_SIMD __mmask16 tg_cmpge_epi32_mask(tg_i32x16 a, tg_i32x16 b) { return (__mmask16)~tg_cmplt_epi32_mask(a, b); }
TG_SIMD __mmask16 tg_cmplt_epu32_mask(tg_i32x16 a, tg_i32x16 b) {
    const tg_i32x16 sign = tg_set1_epi32(INT32_MIN);
    return tg_cmplt_epi32_mask(tg_i32x16_of(_mm256_xor_si256(a.lo, sign.lo), _mm256_xor_si256(a.hi, sign.hi)),
                               tg_i32x16_of(_mm256_xor_si256(b.lo, sign.lo), _mm256_xor_si256(b.hi, sign.hi)));
}

/* ---------------------------------------------------------------- lane movement */

/* Lanes 0, 2, ..., 30 of a's 16 then b's 16 (tg_even_lanes_ps, epilogue.h): per half, one shuffle takes the even
 * lanes of each 128-bit lane and one permute puts the four 64-bit pairs in order. */
TG_SIMD __m256 tg_even_lanes8(__m256 lo, __m256 hi) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
}

TG_SIMD tg_f32x16 tg_even_lanes_ps(tg_f32x16 a, tg_f32x16 b) {
    return tg_f32x16_of(tg_even_lanes8(a.lo, a.hi), tg_even_lanes8(b.lo, b.hi));
}

/* r[c] = lane c of each of r[0..7]: an 8x8 transpose in registers. */
TG_SIMD void tg_transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2)
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44), u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44), u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++)
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20), r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
}

/* r[c] = lane c of each of r[0..15] (epilogue.h's tg_transpose_16x16): four 8x8 blocks, each transposed in eight
 * registers, the off-diagonal two swapped. */
TG_SIMD void tg_transpose_16x16(tg_f32x16 r[16]) {
    __m256 block[4][8]; /* rows 0-7 or 8-15 (bit 1), columns 0-7 or 8-15 (bit 0) */
    for (int i = 0; i < 8; i++)
        block[0][i] = r[i].lo, block[1][i] = r[i].hi, block[2][i] = r[8 + i].lo, block[3][i] = r[8 + i].hi;
    for (int b = 0; b < 4; b++) tg_transpose8(block[b]);
    for (int c = 0; c < 8; c++)
        r[c] = tg_f32x16_of(block[0][c], block[2][c]), r[8 + c] = tg_f32x16_of(block[1][c], block[3][c]);
}

#define TG_ROUND_PS(x, imm)                                                        \
    ({                                                                             \
        tg_f32x16 x_ = (x);                                                        \
        tg_f32x16_of(_mm256_round_ps(x_.lo, (imm) & 15), _mm256_round_ps(x_.hi, (imm) & 15)); \
    })

#define TG_CMP_PS_MASK(a, b, imm)                                                  \
    ({                                                                             \
        tg_f32x16 a_ = (a), b_ = (b);                                              \
        tg_mask_of(_mm256_castps_si256(_mm256_cmp_ps(a_.lo, b_.lo, imm)),          \
                   _mm256_castps_si256(_mm256_cmp_ps(a_.hi, b_.hi, imm)));         \
    })

#define TG_SRLI_EPI32(x, count)                                                    \
    ({                                                                             \
        tg_i32x16 x_ = (x);                                                        \
        tg_i32x16_of(_mm256_srli_epi32(x_.lo, count), _mm256_srli_epi32(x_.hi, count)); \
    })

/* Only the class the kernels ask for, 0x99 (NaN or infinite): |x| > FLT_MAX, unordered included. */
#define TG_FPCLASS_PS_MASK(x, imm)                                                 \
    ({                                                                             \
        _Static_assert((imm) == 0x99, "only _mm512_fpclass_ps_mask(x, 0x99) is emulated"); \
        tg_f32x16 x_ = (x);                                                        \
        const __m256 magnitude_ = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), max_ = _mm256_set1_ps(FLT_MAX); \
        tg_mask_of(_mm256_castps_si256(_mm256_cmp_ps(_mm256_and_ps(x_.lo, magnitude_), max_, _CMP_NLE_UQ)),      \
                   _mm256_castps_si256(_mm256_cmp_ps(_mm256_and_ps(x_.hi, magnitude_), max_, _CMP_NLE_UQ)));     \
    })

/* Without optimization gcc's headers define some of these names as macros: they are replaced here. */
#undef _mm512_loadu_ps
#undef _mm512_load_ps
#undef _mm512_store_ps
#undef _mm512_maskz_loadu_ps
#undef _mm512_mask_loadu_ps
#undef _mm512_mask_storeu_ps
#undef _mm512_loadu_si512
#undef _mm512_load_si512
#undef _mm_maskz_loadu_ps
#undef _mm_mask_storeu_ps
#undef _mm512_mask_i32gather_ps
#undef _mm512_add_ps
#undef _mm512_sub_ps
#undef _mm512_mul_ps
#undef _mm512_div_ps
#undef _mm512_max_ps
#undef _mm512_min_ps
#undef _mm512_fmadd_ps
#undef _mm512_fnmadd_ps
#undef _mm512_set1_ps
#undef _mm512_setzero_ps
#undef _mm512_scalef_ps
#undef _mm512_roundscale_ps
#undef _mm512_reduce_add_ps
#undef _mm512_dpbf16_ps
#undef _mm512_cmp_ps_mask
#undef _mm512_fpclass_ps_mask
#undef _mm512_add_epi32
#undef _mm512_mullo_epi32
#undef _mm512_and_si512
#undef _mm512_or_si512
#undef _mm512_srli_epi32
#undef _mm512_set1_epi32
#undef _mm512_setzero_si512
#undef _mm512_set_epi32
#undef _mm512_castps_si512
#undef _mm512_castsi512_ps
#undef _mm512_mask_or_epi32
#undef _mm512_cmplt_epi32_mask
#undef _mm512_cmpge_epi32_mask
#undef _mm512_cmplt_epu32_mask
#undef _mm512_sub_epi32
#undef _mm512_maddubs_epi16
#undef _mm512_madd_epi16
#undef _mm512_set1_epi16
#undef _mm512_set1_epi8
#undef _mm512_maskz_loadu_epi32
#undef _mm512_mask_storeu_epi32
#undef _mm512_cvtepi32_ps
#undef _mm512_cvttps_epi32
#undef _mm512_mask_blend_ps
#undef _mm512_cvtusepi32_epi8
#undef _mm_maskz_mov_epi8
#undef _mm_mask_storeu_epi8
#undef _mm512_reduce_min_ps
#undef _mm512_reduce_max_ps
#undef _mm512_storeu_ps
#define _mm512_loadu_ps tg_loadu_ps
#define _mm512_load_ps tg_load_ps
#define _mm512_store_ps tg_store_ps
#define _mm512_maskz_loadu_ps tg_maskz_loadu_ps
#define _mm512_mask_loadu_ps tg_mask_loadu_ps
#define _mm512_mask_storeu_ps tg_mask_storeu_ps
#define _mm512_loadu_si512 tg_loadu_si512
#define _mm512_load_si512 tg_loadu_si512
#define _mm_maskz_loadu_ps tg_maskz_loadu_ps128
#define _mm_mask_storeu_ps tg_mask_storeu_ps128
#define _mm512_mask_i32gather_ps TG_GATHER_PS
#define _mm512_add_ps tg_add_ps
#define _mm512_sub_ps tg_sub_ps
#define _mm512_mul_ps tg_mul_ps
#define _mm512_div_ps tg_div_ps
#define _mm512_max_ps tg_max_ps
#define _mm512_min_ps tg_min_ps
#define _mm512_fmadd_ps tg_fmadd_ps
#define _mm512_fnmadd_ps tg_fnmadd_ps
#define _mm512_set1_ps tg_set1_ps
#define _mm512_setzero_ps tg_setzero_ps
#define _mm512_scalef_ps tg_scalef_ps
#define _mm512_roundscale_ps TG_ROUND_PS
#define _mm512_reduce_add_ps tg_reduce_add_ps
#define _mm512_dpbf16_ps tg_dpbf16_ps
#define _mm512_cmp_ps_mask TG_CMP_PS_MASK
#define _mm512_fpclass_ps_mask TG_FPCLASS_PS_MASK
#define _mm512_add_epi32 tg_add_epi32
#define _mm512_mullo_epi32 tg_mullo_epi32
#define _mm512_and_si512 tg_and_si512
#define _mm512_or_si512 tg_or_si512
#define _mm512_srli_epi32 TG_SRLI_EPI32
#define _mm512_set1_epi32 tg_set1_epi32
#define _mm512_setzero_si512 tg_setzero_si512
#define _mm512_set_epi32(e15, e14, e13, e12, e11, e10, e9, e8, e7, e6, e5, e4, e3, e2, e1, e0) \
    tg_i32x16_of(_mm256_set_epi32(e7, e6, e5, e4, e3, e2, e1, e0), _mm256_set_epi32(e15, e14, e13, e12, e11, e10, e9, e8))
#define _mm512_castps_si512 tg_castps_si512
#define _mm512_castsi512_ps tg_castsi512_ps
#define _mm512_mask_or_epi32 tg_mask_or_epi32
#define _mm512_cmplt_epi32_mask tg_cmplt_epi32_mask
#define _mm512_cmpge_epi32_mask tg_cmpge_epi32_mask
#define _mm512_cmplt_epu32_mask tg_cmplt_epu32_mask
#define _mm512_sub_epi32 tg_sub_epi32
#define _mm512_maddubs_epi16 tg_maddubs_epi16
#define _mm512_madd_epi16 tg_madd_epi16
#define _mm512_set1_epi16 tg_set1_epi16
#define _mm512_set1_epi8 tg_set1_epi8
#define _mm512_maskz_loadu_epi32 tg_maskz_loadu_epi32
#define _mm512_mask_storeu_epi32 tg_mask_storeu_epi32
#define _mm512_cvtepi32_ps tg_cvtepi32_ps
#define _mm512_cvttps_epi32 tg_cvttps_epi32
#define _mm512_mask_blend_ps tg_mask_blend_ps
#define _mm512_cvtusepi32_epi8 tg_cvtusepi32_epi8
#define _mm_maskz_mov_epi8 tg_maskz_mov_epi8
#define _mm_mask_storeu_epi8 tg_mask_storeu_epi8
#define _mm512_reduce_min_ps tg_reduce_min_ps
#define _mm512_reduce_max_ps tg_reduce_max_ps
#define _mm512_storeu_ps tg_storeu_ps
#endif
