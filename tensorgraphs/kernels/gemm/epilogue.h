/* The GEMM's activations and epilogue, vectorized with AVX-512 (or its AVX2 stand-in, avx512_on_avx2.h):
 * c = activation(alpha * acc + bias) + residual, or activation(alpha * acc + bias + residual) (gemm.h). Shared by
 * the generated GEMM (the epilogue on registers before the store, a prologue activation on each packed block of an
 * operand), the conv kernels and the BLAS kernel (passes after sgemm, on copies of prologue operands). No libm: exp is a branch-free exp2 (degree-7 polynomial + scalef), accurate to
 * ~2 ulp, so the loops vectorize without -ffast-math and NaN/Inf propagate as in PyTorch. */
#ifndef TG_EPILOGUE_H
#define TG_EPILOGUE_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "gemm.h"
#ifdef __AVX512F__
#define TG_AS_BF16(x) ((__m512bh)(x))
/* Lanes 0, 2, ..., 30 of a's 16 then b's 16: a stride-2 row segment from two loads. */
static inline __attribute__((always_inline)) __m512 tg_even_lanes_ps(__m512 a, __m512 b) {
    return _mm512_permutex2var_ps(a, _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0), b);
}
/* The AVX-512 forms of names avx512_on_avx2.h gives AVX2: a vector of 16 from two halves; 8 lanes by `bits`. */
static inline __attribute__((always_inline)) __m512 tg_f32x16_of(__m256 lo, __m256 hi) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}
static inline __attribute__((always_inline)) __m256 tg_maskz_loadu8(unsigned bits, const float *f) {
    return _mm256_maskz_loadu_ps((__mmask8)bits, f);
}
/* r[c] = lane c of each of r[0..15]: a 16x16 transpose in registers (32-bit, 64-bit, then 128-bit interleaves). */
static inline __attribute__((always_inline)) void tg_transpose_16x16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2)
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    for (int i = 0; i < 16; i += 4)
        for (int half = 0; half < 2; half++) {
            __m512d a = _mm512_castps_pd(t[i + half]), b = _mm512_castps_pd(t[i + half + 2]);
            r[i + 2 * half] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[i + 2 * half + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88), t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xdd);
        t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
        t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88), r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
        r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
        r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xdd);
    }
}
#else
#include "avx512_on_avx2.h"
#endif

typedef struct {
    float alpha;
    int32_t activation;    /* enum tg_activation */
    const float *bias;     /* bias(i, j) = bias[i*bias_rs + j*bias_cs], bias_cs in {0, 1}; NULL for none */
    int64_t bias_rs, bias_cs;
    const float *residual; /* residual(i, j) = residual[i*residual_rs + j]; NULL for none */
    int64_t residual_rs;
    int32_t round_bf16;    /* 1: the result is rounded to bfloat16 last (a bfloat16 product, stored as float32) */
    int32_t activation_after_residual; /* 1: the activation applies to the sum with the residual */
} tg_epilogue;

/* The epilogue a kernel's arguments describe (gemm.h): `activation` is an enum tg_activation, maybe with the flag
 * TG_ACT_AFTER_RESIDUAL. */
static inline tg_epilogue tg_epilogue_of(float alpha, int32_t activation, const float *bias, int64_t bias_rs,
                                         int64_t bias_cs, const float *residual, int64_t residual_rs) {
    return (tg_epilogue){.alpha = alpha, .activation = activation & ~TG_ACT_AFTER_RESIDUAL, .bias = bias,
                         .bias_rs = bias_rs, .bias_cs = bias_cs, .residual = residual, .residual_rs = residual_rs,
                         .activation_after_residual = (activation & TG_ACT_AFTER_RESIDUAL) != 0};
}

/* x rounded to the nearest bfloat16 (ties to even) as float32 bits whose low half is zero; a NaN stays a NaN
 * (quieted: a payload in the low half alone would otherwise round to infinity). Integer arithmetic, so
 * subnormals round as the reference backend's `round_to_storage` does (VCVTNEPS2BF16 flushes them). */
static inline __attribute__((always_inline)) __m512i tg_bf16_bits(__m512 x) {
    __m512i bits = _mm512_castps_si512(x);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x00400000));
    return _mm512_and_si512(rounded, _mm512_set1_epi32((int32_t)0xFFFF0000));
}

static inline __attribute__((always_inline)) __m512 tg_exp2_ps(__m512 t) {
    /* Clamping keeps the polynomial finite and n within one power of two's exponent field: 2^t is 0 below
     * 2^-126.5 and inf from 2^127.5 (exactly so on AVX2, about so by VSCALEFPS), all that 1 + exp(-2u) in gelu
     * needs. */
    t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(128.0f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n); /* f in [-0.5, 0.5] */
    __m512 p = _mm512_set1_ps(1.5252734e-05f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530e-04f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* exp(-2u) for gelu's u = sqrt(2/pi) (x + 0.044715 x^3), given x and x^2: exp2 of x (c0 + c1 x^2), the constants
 * carrying the factor -2 log2(e). */
static inline __attribute__((always_inline)) __m512 tg_gelu_tanh_exp_ps(__m512 x, __m512 x2) {
    const float c0 = -2.8853900817779268f * 0.7978845608028654f, c1 = c0 * 0.044715f;
    return tg_exp2_ps(_mm512_mul_ps(x, _mm512_fmadd_ps(x2, _mm512_set1_ps(c1), _mm512_set1_ps(c0))));
}

/* gelu, tanh form: 0.5 x (1 + tanh(u)) == x / (1 + exp(-2u)). */
static inline __attribute__((always_inline)) __m512 tg_gelu_tanh_ps(__m512 x) {
    __m512 e = tg_gelu_tanh_exp_ps(x, _mm512_mul_ps(x, x));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* gelu'(h), tanh form: s + 2 h s (1 - s) u'(h), s = sigmoid(2u) = 1 / (1 + exp(-2u)), 2 u' = 2 sqrt(2/pi) (1 + 3 *
 * 0.044715 h^2) (0.5 (1 + tanh u) = s and 0.5 (1 - tanh^2 u) = 2 s (1 - s)). */
static inline __attribute__((always_inline)) __m512 tg_gelu_tanh_grad_ps(__m512 h) {
    const float twice_sqrt_2_over_pi = 2.0f * 0.7978845608028654f;
    __m512 h2 = _mm512_mul_ps(h, h);
    __m512 s = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), tg_gelu_tanh_exp_ps(h, h2)));
    __m512 twice_slope = _mm512_fmadd_ps(h2, _mm512_set1_ps(3.0f * 0.044715f * twice_sqrt_2_over_pi),
                                         _mm512_set1_ps(twice_sqrt_2_over_pi));
    __m512 h_twice_slope = _mm512_mul_ps(h, twice_slope);
    return _mm512_fmadd_ps(_mm512_mul_ps(h_twice_slope, s), _mm512_sub_ps(_mm512_set1_ps(1.0f), s), s);
}

/* One of enum tg_activation (gemm.h) on a vector. */
static inline __attribute__((always_inline)) __m512 tg_activate_ps(__m512 x, int32_t activation) {
    if (activation == 1) return _mm512_max_ps(_mm512_setzero_ps(), x); /* max(0, NaN) is NaN: NaN is operand 2 */
    return activation == 2 ? tg_gelu_tanh_ps(x) : x;
}

/* One 16-wide vector of row `row`, columns col..col+15 (lanes outside `mask` are ignored by the caller). */
static inline __attribute__((always_inline)) __m512 tg_epilogue_apply(__m512 x, const tg_epilogue *ep, int64_t row,
                                                                       int64_t col, __mmask16 mask) {
    if (ep->bias) { /* one rounding, as tg_affine_apply's */
        const float *bias_row = ep->bias + row * ep->bias_rs;
        x = _mm512_fmadd_ps(x, _mm512_set1_ps(ep->alpha),
                            ep->bias_cs ? _mm512_maskz_loadu_ps(mask, bias_row + col) : _mm512_set1_ps(*bias_row));
    } else {
        x = _mm512_mul_ps(x, _mm512_set1_ps(ep->alpha));
    }
    if (ep->activation == 3) /* TG_ACT_GELU_TANH_GRAD: the residual is the gelu's input */
        x = _mm512_mul_ps(x, tg_gelu_tanh_grad_ps(_mm512_maskz_loadu_ps(mask, ep->residual + row * ep->residual_rs + col)));
    else {
        if (!ep->activation_after_residual) x = tg_activate_ps(x, ep->activation);
        if (ep->residual) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mask, ep->residual + row * ep->residual_rs + col));
        if (ep->activation_after_residual) x = tg_activate_ps(x, ep->activation);
    }
    return ep->round_bf16 ? _mm512_castsi512_ps(tg_bf16_bits(x)) : x;
}

/* The common epilogues, alpha, a bias per row (or none), relu (or none) and maybe a residual, as values that a
 * register tile applies with no branch per vector: activation(alpha * x + bias) is max(floor, fma(x, alpha, bias)),
 * with floor 0 for relu (what tg_activate_ps computes, a NaN included: max returns its second operand) and -inf for
 * none, and no bias a bias of -0.0 (x * alpha + -0.0 is x * alpha, a -0.0 included). The same values, bit for bit,
 * as tg_epilogue_apply's. */
typedef struct {
    float alpha, floor, floor_after; /* floor_after: the activation after the residual's add */
    const float *bias;               /* bias(i) = bias[i*bias_rs] */
    int64_t bias_rs;
    const float *residual; /* residual(i, j) = residual[i*residual_rs + j]; NULL for none */
    int64_t residual_rs;
} tg_affine_epilogue;

/* `ep` (NULL: none) as an affine epilogue in *out; 0 where it is not one (a bias per column, gelu, bfloat16
 * rounding). */
static inline int tg_affine_of(const tg_epilogue *ep, tg_affine_epilogue *out) {
    static const float negative_zero = -0.0f;
    *out = (tg_affine_epilogue){.alpha = 1.0f, .floor = -INFINITY, .floor_after = -INFINITY, .bias = &negative_zero};
    if (!ep) return 1;
    if (ep->activation > TG_ACT_RELU || ep->round_bf16 || (ep->bias && ep->bias_cs)) return 0;
    float relu = ep->activation == TG_ACT_RELU ? 0.0f : -INFINITY;
    out->alpha = ep->alpha, out->residual = ep->residual, out->residual_rs = ep->residual_rs;
    if (ep->bias) out->bias = ep->bias, out->bias_rs = ep->bias_rs;
    if (ep->residual && ep->activation_after_residual)
        out->floor_after = relu;
    else
        out->floor = relu;
    return 1;
}

/* An affine epilogue on one vector, given as vectors (bias: the row's) with the residual's values where `residual`
 * (a compile-time constant: whether there is one). */
static inline __attribute__((always_inline)) __m512 tg_affine_apply(__m512 x, __m512 alpha, __m512 bias,
                                                                     __m512 floor, __m512 floor_after,
                                                                     const int residual, __m512 residual_values) {
    x = _mm512_max_ps(floor, _mm512_fmadd_ps(x, alpha, bias));
    return residual ? _mm512_max_ps(floor_after, _mm512_add_ps(x, residual_values)) : x;
}

static inline __mmask16 tg_tail_mask(int64_t remaining) {
    return remaining >= 16 ? (__mmask16)0xFFFF : remaining <= 0 ? (__mmask16)0 : (__mmask16)((1u << remaining) - 1);
}

/* The lanes `mask` of p, zero elsewhere, touching no memory when the mask is empty. Masked-off lanes never fault,
 * but on Zen 4 a load with every lane off at an address outside any mapping (packing addresses lanes past the end
 * of an image or a matrix) took a slow path: an implicit im2col's packing ran 3x slower (bench/NOTES.md). */
static inline __attribute__((always_inline)) __m512 tg_load_lanes_ps(__mmask16 mask, const float *p) {
    return mask ? _mm512_maskz_loadu_ps(mask, p) : _mm512_setzero_ps();
}

/* dst[0:width] = lanes 0..width-1 of x, where the `room` floats from dst may also take junk that a later store
 * overwrites: then all 16 lanes are stored (a plain store; AVX2 emulates masked stores, slowly on AMD). */
static inline __attribute__((always_inline)) void tg_store_prefix(float *dst, int64_t width, int64_t room, __m512 x) {
    if (room >= 16)
        _mm512_storeu_ps(dst, x);
    else
        _mm512_mask_storeu_ps(dst, tg_tail_mask(width), x);
}

/* x[0:count] = activation(x[0:count]): a prologue on a packed operand block (zero padding stays zero). */
static inline void tg_activate_in_place(float *x, int64_t count, int32_t activation) {
    if (activation == 0) return;
    for (int64_t i = 0; i < count; i += 16) {
        __mmask16 mask = tg_tail_mask(count - i);
        _mm512_mask_storeu_ps(x + i, mask, tg_activate_ps(_mm512_maskz_loadu_ps(mask, x + i), activation));
    }
}

/* to[0:n] = the epilogue of from[0:n] as row `row` of the output (`from` may be `to`). */
static inline void tg_epilogue_row(const float *from, float *to, int64_t n, const tg_epilogue *ep, int64_t row) {
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 mask = tg_tail_mask(n - j);
        _mm512_mask_storeu_ps(to + j, mask, tg_epilogue_apply(_mm512_maskz_loadu_ps(mask, from + j), ep, row, j, mask));
    }
}

/* The epilogue as a separate pass over an m x n block of c (for kernels that cannot fuse it). */
static inline void tg_epilogue_rows(float *c, int64_t c_rs, int64_t m, int64_t n, const tg_epilogue *ep) {
#pragma omp parallel for schedule(static) if (m * n > 65536)
    for (int64_t i = 0; i < m; i++) tg_epilogue_row(c + i * c_rs, c + i * c_rs, n, ep, i);
}
#endif
