/* int8 GEMM (see gemm_int8.h for the contract): u8 x s8 products summed in int32.
 *
 * Activations are made a row-major u8 matrix with rows padded to whole groups of 4 bytes (quantized from float32,
 * or shifted from s8, by all threads together; u8 rows already so padded are read in place). The register tile is
 * QMR rows x QTV 16-lane vectors of int32 accumulators: per group of 4 k, a 32-bit broadcast of 4 activation bytes
 * per row and one inner-product step per vector adds 4 products to each lane (dot4, below: the one part that
 * depends on the target). Tiles are handed out panel by panel, so a thread reuses a panel of packed weights
 * (k x 64 bytes, in L2) for the next row blocks; one at a time, not split in advance, so a thread the OS deschedules
 * does not hold back the others (they take its tiles). The epilogue (zero-point compensation, dequantization, bias,
 * activation) runs on the accumulators before the one store. */
/* Quantizing and dequantizing round every step, as the reference decomposition does (and whatever the build flags:
 * an exported library compiles this file with its own): no multiply-add contracted into an fma. */
#pragma GCC optimize("fp-contract=off")

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "epilogue.h"
#include "gemm.h"
#include "gemm_int8.h"

#define QMR 6
#define QNV 4 /* 16-lane vectors per panel: 64 columns */
#define QNR (QNV * 16)
#ifdef __AVX512F__
#define QTV 4 /* vectors per register tile: 6 x 4 accumulators of AVX-512's 32 registers */
#else
#define QTV 1 /* AVX2: 6 x 1 pairs of AVX registers, 12 of its 16 */
#endif
#ifdef __AVX512VNNI__
#define QK_UNROLL 1
#else
#define QK_UNROLL 2 /* groups of k per loop turn: about 10% faster on AVX2 (bench/NOTES.md) */
#endif
#define TG_PRAGMA(text) _Pragma(#text)
#define TG_UNROLL(n) TG_PRAGMA(GCC unroll n)
#define TG_ALWAYS_INLINE static inline __attribute__((always_inline))

typedef int32_t unaligned_i32 __attribute__((aligned(1), may_alias));

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Grow-only scratch owned by the calling thread (the quantized activations), reused across calls. */
static _Thread_local struct {
    uint8_t *data;
    size_t capacity;
} activation_scratch;

static uint8_t *scratch_reserve(size_t bytes) {
    if (bytes <= activation_scratch.capacity) return activation_scratch.data;
    free(activation_scratch.data);
    bytes = (bytes + 4095) & ~(size_t)4095;
    activation_scratch.data = aligned_alloc(4096, bytes);
    activation_scratch.capacity = activation_scratch.data ? bytes : 0;
    return activation_scratch.data;
}

/* How the activations are given and what the epilogue makes of the sums. */
typedef struct {
    int64_t m, n, k;
    const void *a;
    int64_t a_rs;
    enum { A_U8, A_S8, A_F32 } a_kind;
    float inv_scale, zero_point_f, scale;
    int32_t zero_point, quant_max;
    const int8_t *w_packed;
    const int32_t *w_colsum;
    const float *w_scale, *bias;
    void *c;
    int64_t c_rs;
    int32_t activation;
} qgemm;

/* ---------------------------------------------------------------- activations */

/* Row i of the activations as u8, padded with zeros to `kp` bytes. Quantizing mirrors the reference decomposition:
 * x * inv_scale and + zero_point rounded separately (no contraction, see the top), then rounded half to even;
 * NaN compares false both ways and is sent to quant_max. */
static void activation_row(const qgemm *g, int64_t i, uint8_t *dst, int64_t kp) {
    if (g->a_kind == A_F32) {
        const float *x = (const float *)g->a + i * g->a_rs;
        __m512 inv = _mm512_set1_ps(g->inv_scale), zp = _mm512_set1_ps(g->zero_point_f);
        __m512 top = _mm512_set1_ps((float)g->quant_max);
        for (int64_t k = 0; k < kp; k += 16) {
            __mmask16 mask = tg_tail_mask(g->k - k);
            __m512 v = _mm512_maskz_loadu_ps(mask, x + k);
            __m512 t = _mm512_add_ps(_mm512_mul_ps(v, inv), zp);
            __m512 r = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __mmask16 below_top = _mm512_cmp_ps_mask(r, top, _CMP_LE_OQ); /* false for NaN */
            r = _mm512_mask_blend_ps(below_top, top, _mm512_max_ps(r, _mm512_setzero_ps()));
            __m128i bytes = _mm512_cvtusepi32_epi8(_mm512_cvttps_epi32(r)); /* r in [0, quant_max] */
            _mm_mask_storeu_epi8(dst + k, (__mmask16)tg_tail_mask(kp - k), _mm_maskz_mov_epi8(mask, bytes));
        }
        return;
    }
    const uint8_t *src = (const uint8_t *)g->a + i * g->a_rs;
    uint8_t flip = g->a_kind == A_S8 ? 0x80 : 0;
    for (int64_t k = 0; k < kp; k++) dst[k] = k < g->k ? (uint8_t)(src[k] ^ flip) : 0;
}

/* ---------------------------------------------------------------- micro-kernel */

/* acc + the sum of the 4 products a(r) * w(r) (a u8, w s8) of each 32-bit lane, exactly. VPDPBUSD (AVX-512 VNNI)
 * does it in one instruction. Without VNNI, VPMADDUBSW multiplies the byte pairs and sums adjacent products into
 * int16 with saturation, and VPMADDWD by ones widens those sums into int32 (FBGEMM's and oneDNN's way): two
 * multiply instructions where VNNI takes one, still twice an fma's multiply-adds per instruction. A pair is exact
 * only while it fits int16: always when a <= 127 (|127 * -128 * 2| < 2^15; `seven_bit`, as torch's `reduce_range`
 * activations are). Otherwise a is split into a & 127 and a & 128, each pair of which fits (128 * (w0 + w1) is in
 * [-2^15, 2^15)), at twice the multiplies. */
TG_ALWAYS_INLINE __m512i dot4(const int seven_bit, __m512i acc, __m512i a, __m512i w) {
#ifdef __AVX512VNNI__
    (void)seven_bit;
    return _mm512_dpbusd_epi32(acc, a, w);
#else
    const __m512i ones = _mm512_set1_epi16(1);
    if (seven_bit) return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(a, w), ones));
    __m512i low = _mm512_and_si512(a, _mm512_set1_epi8(0x7F)), high = _mm512_and_si512(a, _mm512_set1_epi8(-128));
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(low, w), ones));
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(high, w), ones));
#endif
}

/* Rows row0.. (m_valid of them) times vectors v0..v0+nv of one panel; nv, the epilogue kind and seven_bit (dot4)
 * are constants after inlining. */
TG_ALWAYS_INLINE void tile(const int nv, const int float_out, const int seven_bit, const qgemm *g, const uint8_t *a,
                           int64_t a_rs, int64_t kq, int64_t row0, int64_t m_valid, int64_t panel, int64_t v0) {
    const int32_t *b = (const int32_t *)g->w_packed + panel * kq * QNR + v0 * 16;
    const uint8_t *rows[QMR];
    for (int i = 0; i < QMR; i++) rows[i] = a + (row0 + (i < m_valid ? i : m_valid - 1)) * a_rs;
    __m512i acc[QMR][QTV];
    _Pragma("GCC unroll 8") for (int i = 0; i < QMR; i++)
        _Pragma("GCC unroll 4") for (int v = 0; v < nv; v++) acc[i][v] = _mm512_setzero_si512();
    TG_UNROLL(QK_UNROLL) for (int64_t p = 0; p < kq; p++) {
        __m512i bv[QTV];
        _Pragma("GCC unroll 4") for (int v = 0; v < nv; v++) bv[v] = _mm512_loadu_si512(b + p * QNR + v * 16);
        _Pragma("GCC unroll 8") for (int i = 0; i < QMR; i++) {
            __m512i ai = _mm512_set1_epi32(*(const unaligned_i32 *)(rows[i] + 4 * p));
            _Pragma("GCC unroll 4") for (int v = 0; v < nv; v++) acc[i][v] = dot4(seven_bit, acc[i][v], ai, bv[v]);
        }
    }
    int64_t col0 = panel * QNR + v0 * 16;
    __m512i zp = _mm512_set1_epi32(g->zero_point);
    _Pragma("GCC unroll 8") for (int i = 0; i < QMR; i++) {
        if (i >= m_valid) break;
        _Pragma("GCC unroll 4") for (int v = 0; v < nv; v++) {
            int64_t col = col0 + v * 16;
            __mmask16 mask = tg_tail_mask(g->n - col);
            __m512i sums = _mm512_sub_epi32(acc[i][v], _mm512_mullo_epi32(zp, _mm512_maskz_loadu_epi32(mask, g->w_colsum + col)));
            if (!float_out) {
                _mm512_mask_storeu_epi32((int32_t *)g->c + (row0 + i) * g->c_rs + col, mask, sums);
                continue;
            }
            __m512 scale = _mm512_mul_ps(_mm512_set1_ps(g->scale), _mm512_maskz_loadu_ps(mask, g->w_scale + col));
            __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), scale);
            if (g->bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mask, g->bias + col));
            _mm512_mask_storeu_ps((float *)g->c + (row0 + i) * g->c_rs + col, mask, tg_activate_ps(y, g->activation));
        }
    }
}

/* Rows row0.. times one panel, a register tile of QTV vectors at a time. */
static void run_tile(const qgemm *g, const uint8_t *a, int64_t a_rs, int64_t kq, int64_t row0, int64_t panel,
                     int seven_bit) {
    int64_t m_valid = g->m - row0 < QMR ? g->m - row0 : QMR;
    int64_t vectors = ceil_div(g->n - panel * QNR, 16);
    vectors = vectors < QNV ? vectors : QNV;
    int float_out = g->a_kind == A_F32;
#ifdef __AVX512VNNI__
    seven_bit = 0; /* one dot4 for every activation: one variant of the tile */
#endif
    for (int64_t v0 = 0; v0 < vectors; v0 += QTV) {
        int64_t nv = vectors - v0 < QTV ? vectors - v0 : QTV;
#define QTILE(nv, seven_bit) (float_out ? tile(nv, 1, seven_bit, g, a, a_rs, kq, row0, m_valid, panel, v0) \
                                        : tile(nv, 0, seven_bit, g, a, a_rs, kq, row0, m_valid, panel, v0))
#define QTILES(nv) (seven_bit ? QTILE(nv, 1) : QTILE(nv, 0))
#if QTV == 4
        if (nv == 4) QTILES(4);
        else if (nv == 3) QTILES(3);
        else if (nv == 2) QTILES(2);
        else QTILES(1);
#else
        (void)nv;
        QTILES(1);
#endif
#undef QTILES
#undef QTILE
    }
}

/* ---------------------------------------------------------------- dynamic quantization */

/* The activations' quantization parameters, as the reference decomposition computes them in float32: the range
 * [min(x, 0), max(x, 0)] (NaN if x holds one) over [0, quant_max], scale 0.1 for an all-zero range, and the zero
 * point where 0.0 lands, rounded half to even and clamped. */
static void choose_qparams(qgemm *g) {
    const float *x = g->a;
    float low = 0.0f, high = 0.0f;
    int nan = 0;
#pragma omp parallel for schedule(static) reduction(min : low) reduction(max : high) reduction(| : nan) \
    if (g->m * g->k >= 65536)
    for (int64_t i = 0; i < g->m; i++) {
        __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
        __mmask16 unordered = 0;
        for (int64_t k = 0; k < g->k; k += 16) {
            __mmask16 mask = tg_tail_mask(g->k - k);
            __m512 v = _mm512_maskz_loadu_ps(mask, x + i * g->a_rs + k);
            lo = _mm512_min_ps(lo, v), hi = _mm512_max_ps(hi, v);
            unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        }
        float row_low = _mm512_reduce_min_ps(lo), row_high = _mm512_reduce_max_ps(hi);
        low = row_low < low ? row_low : low, high = row_high > high ? row_high : high;
        nan |= unordered != 0;
    }
    if (nan) low = high = NAN;
    float top = (float)g->quant_max, scale = (high - low) / top;
    if (scale == 0.0f) scale = 0.1f;
    float zero_point = nearbyintf(-low / scale);
    zero_point = zero_point > top ? top : zero_point < 0.0f ? 0.0f : zero_point;
    g->scale = scale, g->inv_scale = 1.0f / scale, g->zero_point_f = zero_point;
    g->zero_point = nan ? 0 : (int32_t)zero_point;
}

/* ---------------------------------------------------------------- driver */

/* Whether dot4's seven-bit step is exact for the activations `a` (m rows of kp bytes): quantized ones are at most
 * quant_max; integer ones are looked at (m x k bytes, against m x n x k products). VNNI has one step for all. */
static int seven_bit_activations(const qgemm *g, const uint8_t *a, int64_t kp) {
#ifdef __AVX512VNNI__
    (void)g, (void)a, (void)kp;
    return 0;
#else
    if (g->a_kind == A_F32) return g->quant_max <= 127;
    uint8_t high = 0;
    for (int64_t i = 0; i < g->m * kp; i++) high |= a[i];
    return high < 128;
#endif
}

static int run_qgemm(const qgemm *g) {
    if (g->m <= 0 || g->n <= 0) return TG_GEMM_OK;
    if (g->activation < TG_ACT_NONE || g->activation > TG_ACT_GELU_TANH) return TG_GEMM_BAD_ACTIVATION;
    int64_t kq = ceil_div(g->k, 4), kp = 4 * kq, row_blocks = ceil_div(g->m, QMR), panels = ceil_div(g->n, QNR);
    int in_place = g->a_kind == A_U8 && g->a_rs == kp; /* u8 rows already whole groups of 4 */
    uint8_t *a = in_place ? (uint8_t *)g->a : scratch_reserve((size_t)(g->m * kp + 64));
    if (!a) return TG_GEMM_NO_MEMORY;
    double work = (double)g->m * g->n * (double)kp;
    int threads = work >= (1 << 20) ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(threads)
    {
        if (!in_place) {
#pragma omp for schedule(dynamic, 8)
            for (int64_t i = 0; i < g->m; i++) activation_row(g, i, a + i * kp, kp);
        }
        int seven_bit = seven_bit_activations(g, a, kp); /* each thread alike, after the barrier above */
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int64_t panel = 0; panel < panels; panel++)
            for (int64_t block = 0; block < row_blocks; block++)
                run_tile(g, a, kp, kq, block * QMR, panel, seven_bit);
    }
    return TG_GEMM_OK;
}

int tg_qgemm_u8s8_s32(int64_t m, int64_t n, int64_t k, const uint8_t *a, int64_t a_rs, int32_t a_zero_point,
                      const int8_t *w_packed, const int32_t *w_colsum, int32_t *c, int64_t c_rs) {
    qgemm g = {.m = m, .n = n, .k = k, .a = a, .a_rs = a_rs, .a_kind = A_U8, .zero_point = a_zero_point,
               .w_packed = w_packed, .w_colsum = w_colsum, .c = c, .c_rs = c_rs};
    return run_qgemm(&g);
}

int tg_qgemm_s8s8_s32(int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t a_rs, int32_t a_zero_point,
                      const int8_t *w_packed, const int32_t *w_colsum, int32_t *c, int64_t c_rs) {
    qgemm g = {.m = m, .n = n, .k = k, .a = a, .a_rs = a_rs, .a_kind = A_S8, .zero_point = a_zero_point + 128,
               .w_packed = w_packed, .w_colsum = w_colsum, .c = c, .c_rs = c_rs};
    return run_qgemm(&g);
}

int tg_qlinear_f32(int64_t m, int64_t n, int64_t k, const float *x, int64_t x_rs, float x_scale,
                   int32_t x_zero_point, int32_t quant_max, const int8_t *w_packed, const int32_t *w_colsum,
                   const float *w_scale, const float *bias, float *out, int64_t out_rs, int32_t activation) {
    qgemm g = {.m = m, .n = n, .k = k, .a = x, .a_rs = x_rs, .a_kind = A_F32, .scale = x_scale,
               .inv_scale = 1.0f / x_scale, .zero_point = x_zero_point, .zero_point_f = (float)x_zero_point,
               .quant_max = quant_max, .w_packed = w_packed, .w_colsum = w_colsum, .w_scale = w_scale,
               .bias = bias, .c = out, .c_rs = out_rs, .activation = activation};
    if (x_scale == 0.0f && m > 0 && n > 0) choose_qparams(&g);
    return run_qgemm(&g);
}
