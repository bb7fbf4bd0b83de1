/* conv2d 3x3, stride 1 by Winograd's minimal filtering F(4x4, 3x3) (Lavin and Gray, 2015): each 4x4 output tile is
 * A^T [(G g G^T) . (B^T d B)] A for the tile's 6x6 input patch d and the 3x3 kernel g, so the products over input
 * channels become 36 independent GEMMs (one per point of the 6x6 transformed tile) with 2.25 multiplies per output
 * and channel instead of 9. In the transformed domain, with P tiles over all images:
 *   U[point][ci][co]  = G g G^T          (the weights)
 *   V[point][ci][p]   = B^T d B          (the input patches, zero outside the image)
 *   M[point][p][co]   = V[point]^T @ U[point]   (tg_gemm_f32, batch 36: rows are tiles, columns channels)
 *   out tile (p, co)  = epilogue(A^T M A)
 * The transforms are vectorized over 16 tiles (input: masked gathers from the image) or 16 output channels (weights,
 * output: the epilogue's bias is a vector load, the result scattered to NCHW). */
#include <omp.h>
#include <stdlib.h>

#include "gemm_internal.h"
#include "winograd.h"

enum { TILE = 4, PATCH = 6, POINTS = PATCH * PATCH };

typedef __m512 v16;

/* B^T d for a column d0..d5 of a patch (and, applied to rows, d B). */
static inline __attribute__((always_inline)) void input_transform(const v16 d[PATCH], v16 r[PATCH]) {
    const v16 two = _mm512_set1_ps(2.0f), four = _mm512_set1_ps(4.0f), five = _mm512_set1_ps(5.0f);
    r[0] = _mm512_add_ps(_mm512_fnmadd_ps(five, d[2], _mm512_mul_ps(four, d[0])), d[4]);
    r[1] = _mm512_fnmadd_ps(four, _mm512_add_ps(d[1], d[2]), _mm512_add_ps(d[3], d[4]));
    r[2] = _mm512_fmadd_ps(four, _mm512_sub_ps(d[1], d[2]), _mm512_sub_ps(d[4], d[3]));
    r[3] = _mm512_fmadd_ps(two, _mm512_sub_ps(d[3], d[1]), _mm512_sub_ps(d[4], d[2]));
    r[4] = _mm512_fnmadd_ps(two, _mm512_sub_ps(d[3], d[1]), _mm512_sub_ps(d[4], d[2]));
    r[5] = _mm512_add_ps(_mm512_fnmadd_ps(five, d[3], _mm512_mul_ps(four, d[1])), d[5]);
}

/* G g for a column g0..g2 of a kernel. */
static inline __attribute__((always_inline)) void weight_transform(const v16 g[3], v16 u[PATCH]) {
    const v16 sum_outer = _mm512_add_ps(g[0], g[2]);
    u[0] = _mm512_mul_ps(g[0], _mm512_set1_ps(1.0f / 4));
    u[1] = _mm512_mul_ps(_mm512_add_ps(sum_outer, g[1]), _mm512_set1_ps(-1.0f / 6));
    u[2] = _mm512_mul_ps(_mm512_sub_ps(sum_outer, g[1]), _mm512_set1_ps(-1.0f / 6));
    const v16 even = _mm512_fmadd_ps(g[0], _mm512_set1_ps(1.0f / 24), _mm512_mul_ps(g[2], _mm512_set1_ps(1.0f / 6)));
    u[3] = _mm512_fmadd_ps(g[1], _mm512_set1_ps(1.0f / 12), even);
    u[4] = _mm512_fnmadd_ps(g[1], _mm512_set1_ps(1.0f / 12), even);
    u[5] = g[2];
}

/* A^T m for a column m0..m5 of a transformed tile. */
static inline __attribute__((always_inline)) void output_transform(const v16 m[PATCH], v16 y[TILE]) {
    const v16 plus12 = _mm512_add_ps(m[1], m[2]), minus12 = _mm512_sub_ps(m[1], m[2]);
    const v16 plus34 = _mm512_add_ps(m[3], m[4]), minus34 = _mm512_sub_ps(m[3], m[4]);
    y[0] = _mm512_add_ps(_mm512_add_ps(m[0], plus12), plus34);
    y[1] = _mm512_fmadd_ps(_mm512_set1_ps(2.0f), minus34, minus12);
    y[2] = _mm512_fmadd_ps(_mm512_set1_ps(4.0f), plus34, plus12);
    y[3] = _mm512_add_ps(_mm512_fmadd_ps(_mm512_set1_ps(8.0f), minus34, minus12), m[5]);
}

/* Lanes holding a NaN or an infinity. */
static inline __mmask16 not_finite(v16 x) { return _mm512_fpclass_ps_mask(x, 0x99); }

/* Grow-only scratch of the calling thread (the transformed operands), so page faults are paid once. */
static _Thread_local struct {
    float *data;
    size_t capacity;
} scratch;

static float *reserve(size_t count) {
    if (count > scratch.capacity) {
        free(scratch.data);
        size_t bytes = (count * sizeof(float) + 4095) & ~(size_t)4095;
        scratch.data = aligned_alloc(4096, bytes);
        scratch.capacity = scratch.data ? bytes / sizeof(float) : 0;
    }
    return scratch.data;
}

typedef struct {
    int64_t n, cin, h, w, cout, pad_h, pad_w, oh, ow, tiles_h, tiles_w, tiles;
} geometry;

/* U[point][ci][co] = G g G^T; whether every weight is finite. */
static int transform_weights(const geometry *g, const float *weight, float *u) {
    int bad = 0;
    const __m512i lanes = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32((int32_t)(g->cin * 9)));
#pragma omp parallel for collapse(2) schedule(static) reduction(| : bad)
    for (int64_t ci = 0; ci < g->cin; ci++)
        for (int64_t co = 0; co < g->cout; co += 16) {
            __mmask16 valid = tg_tail_mask(g->cout - co);
            const float *kernel = weight + (co * g->cin + ci) * 9;
            v16 rows[3][PATCH], column[3], transformed[PATCH];
            for (int l = 0; l < 3; l++) { /* G applied to each kernel column */
                for (int k = 0; k < 3; k++) {
                    column[k] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, lanes, kernel + 3 * k + l, 4);
                    bad |= not_finite(column[k]) != 0;
                }
                weight_transform(column, transformed);
                for (int xi = 0; xi < PATCH; xi++) rows[l][xi] = transformed[xi];
            }
            for (int xi = 0; xi < PATCH; xi++) { /* then G^T to each row */
                v16 row[3] = {rows[0][xi], rows[1][xi], rows[2][xi]};
                weight_transform(row, transformed);
                for (int nu = 0; nu < PATCH; nu++)
                    _mm512_mask_storeu_ps(u + ((xi * PATCH + nu) * g->cin + ci) * g->cout + co, valid, transformed[nu]);
            }
        }
    return !bad;
}

/* V[point][ci][p] = B^T d B for tiles p (images, tile rows, tile columns in order); whether every input read is
 * finite (every input element lies in some patch). */
static int transform_input(const geometry *g, const float *x, float *v) {
    int bad = 0;
    int64_t plane = g->h * g->w, per_image = g->tiles_h * g->tiles_w;
#pragma omp parallel for collapse(2) schedule(static) reduction(| : bad)
    for (int64_t p0 = 0; p0 < g->tiles; p0 += 16)
        for (int64_t ci = 0; ci < g->cin; ci++) {
            int32_t base[16], top[16], left[16];
            for (int l = 0; l < 16; l++) {
                int64_t p = p0 + l < g->tiles ? p0 + l : p0, image = p / per_image, tile = p % per_image;
                top[l] = (int32_t)(tile / g->tiles_w * TILE - g->pad_h);
                left[l] = (int32_t)(tile % g->tiles_w * TILE - g->pad_w);
                base[l] = (int32_t)(image * g->cin * plane + (int64_t)top[l] * g->w + left[l]);
            }
            __mmask16 valid = tg_tail_mask(g->tiles - p0), row_in[PATCH], column_in[PATCH];
            __m512i first = _mm512_loadu_si512(base), row0 = _mm512_loadu_si512(top), col0 = _mm512_loadu_si512(left);
            for (int k = 0; k < PATCH; k++) { /* unsigned compares: negative rows and columns are out too */
                row_in[k] = _mm512_cmplt_epu32_mask(_mm512_add_epi32(row0, _mm512_set1_epi32(k)),
                                                    _mm512_set1_epi32((int32_t)g->h));
                column_in[k] = _mm512_cmplt_epu32_mask(_mm512_add_epi32(col0, _mm512_set1_epi32(k)),
                                                       _mm512_set1_epi32((int32_t)g->w));
            }
            const float *channel = x + ci * plane;
            v16 columns[PATCH][PATCH], d[PATCH], transformed[PATCH];
            for (int c = 0; c < PATCH; c++) { /* B^T applied to each patch column */
                for (int r = 0; r < PATCH; r++) {
                    __m512i index = _mm512_add_epi32(first, _mm512_set1_epi32((int32_t)(r * g->w + c)));
                    d[r] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid & row_in[r] & column_in[c], index,
                                                    channel, 4);
                    bad |= not_finite(d[r]) != 0;
                }
                input_transform(d, transformed);
                for (int xi = 0; xi < PATCH; xi++) columns[xi][c] = transformed[xi];
            }
            for (int xi = 0; xi < PATCH; xi++) { /* then B to each row */
                input_transform(columns[xi], transformed);
                for (int nu = 0; nu < PATCH; nu++)
                    _mm512_mask_storeu_ps(v + ((xi * PATCH + nu) * g->cin + ci) * g->tiles + p0, valid,
                                          transformed[nu]);
            }
        }
    return !bad;
}

/* out = epilogue(A^T M A), each 4x4 tile cut at the output's edge, 16 output channels at a time. */
static void transform_output(const geometry *g, const float *m, const float *bias, float alpha,
                             const float *residual, int32_t activation, float *out) {
    int64_t positions = g->oh * g->ow, per_image = g->tiles_h * g->tiles_w;
    const __m512i lanes = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32((int32_t)positions));
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t p = 0; p < g->tiles; p++)
        for (int64_t co = 0; co < g->cout; co += 16) {
            __mmask16 valid = tg_tail_mask(g->cout - co);
            int64_t image = p / per_image, tile = p % per_image;
            int64_t top = tile / g->tiles_w * TILE, left = tile % g->tiles_w * TILE;
            v16 rows[PATCH][TILE], column[PATCH], y[TILE];
            for (int xi = 0; xi < PATCH; xi++) { /* A^T applied to each row of the transformed tile */
                for (int nu = 0; nu < PATCH; nu++)
                    column[nu] = _mm512_maskz_loadu_ps(valid, m + ((xi * PATCH + nu) * g->tiles + p) * g->cout + co);
                output_transform(column, rows[xi]);
            }
            v16 shift = bias ? _mm512_maskz_loadu_ps(valid, bias + co) : _mm512_setzero_ps();
            float *corner = out + (image * g->cout + co) * positions + top * g->ow + left;
            for (int j = 0; j < TILE && left + j < g->ow; j++) { /* then A to each column */
                for (int xi = 0; xi < PATCH; xi++) column[xi] = rows[xi][j];
                output_transform(column, y);
                for (int i = 0; i < TILE && top + i < g->oh; i++) {
                    v16 value = tg_activate_ps(_mm512_fmadd_ps(y[i], _mm512_set1_ps(alpha), shift), activation);
                    int64_t at = (corner - out) + i * g->ow + j;
                    if (residual)
                        value = _mm512_add_ps(value, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, lanes,
                                                                              residual + at, 4));
                    _mm512_mask_i32scatter_ps(out + at, valid, lanes, value, 4);
                }
            }
        }
}

int tg_conv2d_winograd_f32(int64_t n, int64_t cin, int64_t h, int64_t w, int64_t cout, int64_t kh, int64_t kw,
                           int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                           int64_t dilation_w, const float *x, const float *weight, const float *bias, float *out,
                           float alpha, const float *residual, int32_t activation) {
    int winograd = kh == 3 && kw == 3 && stride_h == 1 && stride_w == 1 && dilation_h == 1 && dilation_w == 1 &&
                   pad_h >= 0 && pad_w >= 0 && activation >= TG_ACT_NONE && activation <= TG_ACT_GELU_TANH;
    geometry g = {n, cin, h, w, cout, pad_h, pad_w, h + 2 * pad_h - 2, w + 2 * pad_w - 2};
    g.tiles_h = (g.oh + TILE - 1) / TILE, g.tiles_w = (g.ow + TILE - 1) / TILE, g.tiles = n * g.tiles_h * g.tiles_w;
    winograd = winograd && g.oh > 0 && g.ow > 0 && n > 0 && cin > 0 && cout > 0 &&
               n * cin * h * w < INT32_MAX / 2 && 16 * g.oh * g.ow < INT32_MAX; /* gather offsets are int32 */
    float *u = winograd ? reserve((size_t)POINTS * cin * (cout + g.tiles) + (size_t)POINTS * g.tiles * cout) : NULL;
    if (!u || !transform_weights(&g, weight, u) || !transform_input(&g, x, u + POINTS * cin * cout))
        return tg_conv2d_f32(n, cin, h, w, cout, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, x,
                             weight, bias, out, alpha, residual, activation);
    float *v = u + POINTS * cin * cout, *m = v + POINTS * cin * g.tiles;
    int status = tg_gemm_f32(POINTS, g.tiles, cout, cin, v, cin * g.tiles, 1, g.tiles, u, cin * cout, cout, 1, m,
                             g.tiles * cout, cout, 1.0f, NULL, 0, 0, 0, NULL, 0, 0, TG_ACT_NONE, TG_ACT_NONE,
                             TG_ACT_NONE);
    if (status == TG_GEMM_OK) transform_output(&g, m, bias, alpha, residual, activation, out);
    return status;
}
