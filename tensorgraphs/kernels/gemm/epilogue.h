/* The GEMM's activations and epilogue: c = activation(alpha * acc + bias) + residual. Shared by the generated
 * GEMM (the epilogue on registers before the store, a prologue activation on each packed block of an operand) and
 * the BLAS kernel (passes after sgemm, on copies of prologue operands). No libm: exp is a branch-free exp2
 * (degree-7 polynomial + scalef), accurate to ~2 ulp, so the loops vectorize without -ffast-math and NaN/Inf
 * propagate as in PyTorch.
 *
 * With AVX-512 these are intrinsics; without it (the BLAS kernel on other CPUs, the only kernel here built there)
 * the two passes the BLAS kernel calls are plain C loops doing the same operations in the same order, which the
 * compiler vectorizes for the target. */
#ifndef TG_EPILOGUE_H
#define TG_EPILOGUE_H
#include <stdint.h>

typedef struct {
    float alpha;
    int32_t activation;    /* enum tg_activation */
    const float *bias;     /* bias(i, j) = bias[i*bias_rs + j*bias_cs], bias_cs in {0, 1}; NULL for none */
    int64_t bias_rs, bias_cs;
    const float *residual; /* residual(i, j) = residual[i*residual_rs + j]; NULL for none */
    int64_t residual_rs;
    int32_t round_bf16;    /* 1: the result is rounded to bfloat16 last (a bfloat16 product, stored as float32) */
} tg_epilogue;

#ifdef __AVX512F__
#include <immintrin.h>

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
    /* Clamping keeps the polynomial finite; scalef turns |n| > 127 into 0 or inf exactly. */
    t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-150.0f)), _mm512_set1_ps(150.0f));
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

/* gelu, tanh form: 0.5 x (1 + tanh(u)) == x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3). */
static inline __attribute__((always_inline)) __m512 tg_gelu_tanh_ps(__m512 x) {
    const float sqrt_2_over_pi = 0.7978845608028654f, minus_two_log2e = -2.8853900817779268f;
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 inner = _mm512_fmadd_ps(x2, _mm512_set1_ps(sqrt_2_over_pi * 0.044715f), _mm512_set1_ps(sqrt_2_over_pi));
    __m512 u = _mm512_mul_ps(x, inner);
    __m512 e = tg_exp2_ps(_mm512_mul_ps(u, _mm512_set1_ps(minus_two_log2e)));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* One of enum tg_activation (gemm.h) on a vector. */
static inline __attribute__((always_inline)) __m512 tg_activate_ps(__m512 x, int32_t activation) {
    if (activation == 1) return _mm512_max_ps(_mm512_setzero_ps(), x); /* max(0, NaN) is NaN: NaN is operand 2 */
    return activation == 2 ? tg_gelu_tanh_ps(x) : x;
}

/* One 16-wide vector of row `row`, columns col..col+15 (lanes outside `mask` are ignored by the caller). */
static inline __attribute__((always_inline)) __m512 tg_epilogue_apply(__m512 x, const tg_epilogue *ep, int64_t row,
                                                                       int64_t col, __mmask16 mask) {
    x = _mm512_mul_ps(x, _mm512_set1_ps(ep->alpha));
    if (ep->bias) {
        const float *bias_row = ep->bias + row * ep->bias_rs;
        x = _mm512_add_ps(x, ep->bias_cs ? _mm512_maskz_loadu_ps(mask, bias_row + col) : _mm512_set1_ps(*bias_row));
    }
    x = tg_activate_ps(x, ep->activation);
    if (ep->residual) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mask, ep->residual + row * ep->residual_rs + col));
    return ep->round_bf16 ? _mm512_castsi512_ps(tg_bf16_bits(x)) : x;
}

static inline __mmask16 tg_tail_mask(int64_t remaining) {
    return remaining >= 16 ? (__mmask16)0xFFFF : remaining <= 0 ? (__mmask16)0 : (__mmask16)((1u << remaining) - 1);
}

/* x[0:count] = activation(x[0:count]): a prologue on a packed operand block (zero padding stays zero). */
static inline void tg_activate_in_place(float *x, int64_t count, int32_t activation) {
    if (activation == 0) return;
    for (int64_t i = 0; i < count; i += 16) {
        __mmask16 mask = tg_tail_mask(count - i);
        _mm512_mask_storeu_ps(x + i, mask, tg_activate_ps(_mm512_maskz_loadu_ps(mask, x + i), activation));
    }
}

/* The epilogue as a separate pass over an m x n block of c (for kernels that cannot fuse it). */
static inline void tg_epilogue_rows(float *c, int64_t c_rs, int64_t m, int64_t n, const tg_epilogue *ep) {
#pragma omp parallel for schedule(static) if (m * n > 65536)
    for (int64_t i = 0; i < m; i++) {
        float *row = c + i * c_rs;
        for (int64_t j = 0; j < n; j += 16) {
            __mmask16 mask = tg_tail_mask(n - j);
            __m512 x = _mm512_maskz_loadu_ps(mask, row + j);
            _mm512_mask_storeu_ps(row + j, mask, tg_epilogue_apply(x, ep, i, j, mask));
        }
    }
}
#else
typedef union {
    float f;
    uint32_t u;
} tg_float_bits;

/* 2^k for k in [-75, 75] (a normal float), from its exponent bits. */
static inline float tg_pow2i(int32_t k) {
    tg_float_bits bits = {.u = (uint32_t)(k + 127) << 23};
    return bits.f;
}

/* tg_exp2_ps on one float: the clamps return the bound for NaN (as max/min_ps do), and p * 2^n is scalef's
 * exact scaling done as two exact-range steps (n in [-150, 150]), so subnormal results round once. */
static inline float tg_exp2(float t) {
    t = t > -150.0f ? t : -150.0f;
    t = t < 150.0f ? t : 150.0f;
    float n = __builtin_rintf(t);
    float f = t - n;
    float p = 1.5252734e-05f;
    p = p * f + 1.5403530e-04f;
    p = p * f + 1.3333558e-03f;
    p = p * f + 9.6181291e-03f;
    p = p * f + 5.5504109e-02f;
    p = p * f + 2.4022651e-01f;
    p = p * f + 6.9314718e-01f;
    p = p * f + 1.0f;
    int32_t whole = (int32_t)n, half = whole / 2;
    return p * tg_pow2i(half) * tg_pow2i(whole - half);
}

/* tg_gelu_tanh_ps on one float. */
static inline float tg_gelu_tanh(float x) {
    const float sqrt_2_over_pi = 0.7978845608028654f, minus_two_log2e = -2.8853900817779268f;
    float u = x * ((x * x) * (sqrt_2_over_pi * 0.044715f) + sqrt_2_over_pi);
    return x / (1.0f + tg_exp2(u * minus_two_log2e));
}

/* One loop per activation, so each vectorizes; relu is max_ps(0, x): `0 > x ? 0 : x` (x for NaN and -0.0). */
static inline void tg_activate_in_place(float *x, int64_t count, int32_t activation) {
    if (activation == 1)
        for (int64_t i = 0; i < count; i++) x[i] = 0.0f > x[i] ? 0.0f : x[i];
    if (activation == 2)
        for (int64_t i = 0; i < count; i++) x[i] = tg_gelu_tanh(x[i]);
}

/* The float32 epilogue pass, a step at a time over each row (round_bf16 belongs to the bfloat16 GEMM, which needs
 * AVX-512). */
static inline void tg_epilogue_rows(float *c, int64_t c_rs, int64_t m, int64_t n, const tg_epilogue *ep) {
#pragma omp parallel for schedule(static) if (m * n > 65536)
    for (int64_t i = 0; i < m; i++) {
        float *row = c + i * c_rs, alpha = ep->alpha;
        const float *bias = ep->bias ? ep->bias + i * ep->bias_rs : 0;
        if (bias && ep->bias_cs)
            for (int64_t j = 0; j < n; j++) row[j] = row[j] * alpha + bias[j];
        else if (bias)
            for (int64_t j = 0; j < n; j++) row[j] = row[j] * alpha + *bias;
        else if (alpha != 1.0f)
            for (int64_t j = 0; j < n; j++) row[j] *= alpha;
        tg_activate_in_place(row, n, ep->activation);
        if (ep->residual) {
            const float *residual = ep->residual + i * ep->residual_rs;
            for (int64_t j = 0; j < n; j++) row[j] += residual[j];
        }
    }
}
#endif
#endif
