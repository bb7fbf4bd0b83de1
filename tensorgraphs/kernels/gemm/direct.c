/* conv2d by direct convolution, for convs with few input channels (3-channel stems): the GEMM's TG_MR x TG_NR
 * register tile (output channels x consecutive output positions of one row) multiplies the weights by vectors
 * loaded straight from a zero-padded copy of the image, one per tap, so no im2col column is ever written or
 * packed. Strided convs copy each padded input row as `stride_w` phase rows (columns x, x + stride, ...), so that
 * under every tap the output row's consecutive positions read consecutive floats. With K = 27 (3 channels, 3x3)
 * filling and packing the columns cost 40% of the implicit GEMM's time (bench/NOTES.md). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "columns.h"
#include "direct.h"
#include "gemm_internal.h"

static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The zero-padded copy of the input rows a task reads (a band of output rows of one image): `rows` padded rows per
 * channel, each as `stride_w` phase rows of `phase_width` floats, so that padded row Y (input row Y - pad_h),
 * column X (input column X - pad_w) lies at ((channel * rows + Y - Y0) * stride_w + X % stride_w) * phase_width +
 * X / stride_w, for the band's first padded row Y0. */
typedef struct {
    int64_t rows, phase_width, row_floats, floats;
} padded_band;

static padded_band band_of(const conv_geometry *g, int64_t output_rows) {
    int64_t rows = (output_rows - 1) * g->stride_h + (g->kh - 1) * g->dilation_h + 1;
    int64_t phase_width = g->ow + (g->kw - 1) * g->dilation_w / g->stride_w;
    return (padded_band){rows, phase_width, g->stride_w * phase_width, g->cin * rows * g->stride_w * phase_width};
}

/* dst = the band of `image` that starts at padded row y0 (zero where it reads the padding). */
static void pad_band(const conv_geometry *g, const padded_band *p, const float *image, int64_t y0,
                     float *restrict dst) {
    for (int64_t channel = 0; channel < g->cin; channel++)
        for (int64_t y = 0; y < p->rows; y++) {
            int64_t iy = y0 + y - g->pad_h;
            float *d = dst + (channel * p->rows + y) * p->row_floats;
            if (iy < 0 || iy >= g->h) {
                memset(d, 0, sizeof(float) * (size_t)p->row_floats);
                continue;
            }
            for (int64_t phase = 0; phase < g->stride_w; phase++) /* column q: input q * stride_w + phase - pad_w */
                copy_row(image + (channel * g->h + iy) * g->w, columns_inside(phase - g->pad_w, g->stride_w, g->w,
                         p->phase_width), g->stride_w, p->phase_width, d + phase * p->phase_width);
        }
}

/* TG_MR output channels from `a` (packed: a[k * TG_MR + i]) by `nv` vectors of output positions that tap k reads
 * from b + offset[k] on; with `half`, the first 8 positions of one vector only (AVX2). */
static inline __attribute__((always_inline)) void direct_tile(const int nv, const int half, int64_t taps,
                                                               const float *restrict a, const float *b,
                                                               const int64_t *restrict offset, float *c, int64_t c_rs,
                                                               int64_t m_valid, int64_t n_valid,
                                                               const tg_epilogue *ep, int64_t row0, int64_t col0) {
    __m512 acc[TG_MR][TG_NV];
    _Pragma("GCC unroll 64") for (int i = 0; i < TG_MR; i++) {
        _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) acc[i][v] = _mm512_setzero_ps();
        /* The tile of C is written only after the reduction: fetched now, its misses overlap it (as the GEMM's
         * micro-kernel does). Without it, a stem's stores stalled on them: 1.7-2.2x slower (bench/NOTES.md). */
        if (i < m_valid) {
            _mm_prefetch((const char *)(c + i * c_rs), _MM_HINT_T0);
            _mm_prefetch((const char *)(c + i * c_rs + 16 * nv - 1), _MM_HINT_T0);
        }
    }
    _Pragma("GCC unroll 4") for (int64_t k = 0; k < taps; k++) {
        const float *bk = b + offset[k];
        __m512 bv[TG_NV];
        _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) bv[v] = _mm512_loadu_ps(bk + v * 16);
        _Pragma("GCC unroll 64") for (int i = 0; i < TG_MR; i++) {
            __m512 ai = _mm512_set1_ps(a[k * TG_MR + i]);
            _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++)
                acc[i][v] = half ? tg_fmadd_low_ps(ai, bv[v], acc[i][v]) : _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
        }
    }
    __mmask16 masks[TG_NV];
    _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) masks[v] = tg_tail_mask(n_valid - v * 16);
    _Pragma("GCC unroll 64") for (int i = 0; i < TG_MR; i++) {
        if (i >= m_valid) break;
        _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++)
            _mm512_mask_storeu_ps(c + i * c_rs + v * 16, masks[v],
                                  tg_epilogue_apply(acc[i][v], ep, row0 + i, col0 + v * 16, masks[v]));
    }
}

static void tile(int64_t taps, const float *a, const float *b, const int64_t *offset, float *c, int64_t c_rs,
                 int64_t m_valid, int64_t n_valid, const tg_epilogue *ep, int64_t row0, int64_t col0) {
#define TG_DIRECT_TILE(nv, half) direct_tile(nv, half, taps, a, b, offset, c, c_rs, m_valid, n_valid, ep, row0, col0)
    TG_BY_TILE_WIDTH(n_valid, TG_DIRECT_TILE);
#undef TG_DIRECT_TILE
}

static _Thread_local tg_scratch weight_scratch, band_scratch;

/* A task's band of padded rows is about this many floats (or one output row's, if more): it stays in L1 while
 * every panel of weights multiplies it. */
enum { BAND_FLOATS = 4096 };

int tg_conv2d_direct_f32(int64_t n, int64_t cin, int64_t h, int64_t w, int64_t cout, int64_t kh, int64_t kw,
                         int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                         int64_t dilation_w, const float *x, const float *weight, const float *bias, float *out,
                         int64_t out_bs, float alpha, const float *residual, int32_t activation) {
    conv_geometry g;
    int described = tg_conv_geometry(n, cin, h, w, cout, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                     dilation_w, out_bs, activation, &g);
    if (described != TG_GEMM_OK) return described;
    if (g.oh <= 0 || g.ow <= 0 || n <= 0 || cout <= 0) return TG_GEMM_OK;
    padded_band one_row = band_of(&g, 1);
    int64_t rows = tg_clamp(1 + (BAND_FLOATS - one_row.floats) / (cin * stride_h * one_row.row_floats), 1, g.oh);
    padded_band band = band_of(&g, rows);
    int64_t taps = cin * kh * kw, panels = ceil_div(cout, TG_MR), positions = g.oh * g.ow;
    size_t packed = (size_t)(panels * TG_MR * taps + 1) / 2 * 2; /* the tap offsets after it: 8-byte aligned */
    float *a = tg_scratch_reserve(&weight_scratch, packed + 2 * (size_t)taps);
    if (!a) return TG_GEMM_NO_MEMORY;
    int64_t *offset = (int64_t *)(a + packed);
    tg_pack_a(weight, taps, 1, cout, taps, a);
    for (int64_t k = 0, channel = 0; channel < cin; channel++)
        for (int64_t ki = 0; ki < kh; ki++)
            for (int64_t kj = 0; kj < kw; kj++, k++)
                offset[k] = ((channel * band.rows + ki * dilation_h) * stride_w + kj * dilation_w % stride_w) *
                                band.phase_width + kj * dilation_w / stride_w;
    int64_t per_image = ceil_div(g.oh, rows), tasks = n * per_image;
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed) \
    if (omp_get_max_threads() > 1 && tasks > 1 && n * positions * cout * taps >= 1 << 18)
    for (int64_t task = 0; task < tasks; task++) {
        /* TG_NR floats past the band: a last tile's discarded lanes read them */
        float *padded = tg_scratch_reserve(&band_scratch, (size_t)(band.floats + TG_NR));
        if (!padded) {
            failed = 1;
            continue;
        }
        int64_t image = task / per_image, oy0 = task % per_image * rows, oy1 = min_i64(oy0 + rows, g.oh);
        pad_band(&g, &band, x + image * cin * h * w, oy0 * stride_h, padded);
        float *c = out + image * out_bs;
        tg_epilogue ep = tg_epilogue_of(alpha, activation, bias, 1, 0,
                                        residual ? residual + image * cout * positions : NULL, positions);
        for (int64_t panel = 0; panel < panels; panel++)
            for (int64_t oy = oy0; oy < oy1; oy++)
                for (int64_t ox = 0; ox < g.ow; ox += TG_NR)
                    tile(taps, a + panel * taps * TG_MR, padded + (oy - oy0) * stride_h * band.row_floats + ox,
                         offset, c + panel * TG_MR * positions + oy * g.ow + ox, positions, cout - panel * TG_MR,
                         min_i64(TG_NR, g.ow - ox), &ep, panel * TG_MR, oy * g.ow + ox);
    }
    return failed ? TG_GEMM_NO_MEMORY : TG_GEMM_OK;
}
