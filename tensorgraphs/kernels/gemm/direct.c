/* conv2d by direct convolution, for convs with few input channels (3-channel stems) or few output channels: a
 * register tile (output channels x consecutive output positions) multiplies the weights (packed per panel of output
 * channels) by vectors loaded straight from a zero-padded copy of the image, one per tap, so no im2col column is
 * ever written or packed. Strided convs copy the padded input as stride_h x stride_w phase planes (rows y, y +
 * stride_h, ... and columns x, x + stride_w, ...), so that under every tap consecutive output positions read
 * consecutive floats, also from one output row to the next, as the padded rows themselves do at stride 1: tiles run
 * across rows. At stride 1, 16 or 32 output channels on short rows are the vectors' lanes instead (lanes_tile).
 * With K = 27 (3 channels, 3x3) filling and packing the columns cost 40% of the implicit GEMM's time on AVX2
 * (bench/NOTES.md). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "columns.h"
#include "direct.h"
#include "gemm_internal.h"

static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The zero-padded copy of the input rows a task reads (a band of output rows of one image), `rows` padded rows per
 * channel split into stride_h x stride_w phase planes of `phase_rows` rows of `phase_width` floats: padded row y of
 * the band (input row Y0 + y - pad_h, for its first padded row Y0, a multiple of stride_h), column X (input column
 * X - pad_w) lies in plane (y % stride_h, X % stride_w) at row y / stride_h, column X / stride_w. Under every tap
 * the output positions of consecutive rows then read consecutive floats of one plane, phase_width a row, as at
 * stride 1 (one plane: the padded rows). */
typedef struct {
    int64_t rows, phase_rows, phase_width, floats;
} padded_band;

static padded_band band_of(const conv_geometry *g, int64_t output_rows) {
    int64_t rows = (output_rows - 1) * g->stride_h + (g->kh - 1) * g->dilation_h + 1;
    int64_t phase_rows = ceil_div(rows, g->stride_h), phase_width = g->ow + (g->kw - 1) * g->dilation_w / g->stride_w;
    return (padded_band){rows, phase_rows, phase_width,
                         g->cin * g->stride_h * g->stride_w * phase_rows * phase_width};
}

/* Where plane (phase_y, phase_x) of `channel` starts in the band. */
static int64_t plane_offset(const conv_geometry *g, const padded_band *p, int64_t channel, int64_t phase_y,
                            int64_t phase_x) {
    return ((channel * g->stride_h + phase_y) * g->stride_w + phase_x) * p->phase_rows * p->phase_width;
}

/* dst[t] = row[t - pad] where that lies in [0, width), else 0, for t < count, by 16-float vectors, the last one
 * stored whole (its lanes past count land where the caller writes later, or in the band's slack): small images
 * pad many short rows, for which memcpy's call weighed (14x14: a tenth of the conv). */
static void pad_row(const float *row, int64_t width, int64_t pad, int64_t count, float *restrict dst) {
    for (int64_t t = 0; t < count; t += 16) {
        __mmask16 inside = tg_tail_mask(width + pad - t) & (__mmask16)~tg_tail_mask(pad - t);
        _mm512_storeu_ps(dst + t, _mm512_maskz_loadu_ps(inside, row + t - pad));
    }
}

/* dst = the band of `image` that starts at padded row y0 (zero where it reads the padding), written in its order
 * (pad_row's last vector lands on rows written after it); a plane's row past the band (when stride_h does not divide
 * its rows) is zero too, read only by discarded lanes. */
static void pad_band(const conv_geometry *g, const padded_band *p, const float *image, int64_t y0,
                     float *restrict dst) {
    for (int64_t channel = 0; channel < g->cin; channel++)
        for (int64_t phase_y = 0; phase_y < g->stride_h; phase_y++)
            for (int64_t phase_x = 0; phase_x < g->stride_w; phase_x++)
                for (int64_t r = 0; r < p->phase_rows; r++) {
                    int64_t y = r * g->stride_h + phase_y, iy = y0 + y - g->pad_h;
                    float *d = dst + plane_offset(g, p, channel, phase_y, phase_x) + r * p->phase_width;
                    if (y >= p->rows || iy < 0 || iy >= g->h) {
                        memset(d, 0, sizeof(float) * (size_t)p->phase_width);
                        continue;
                    }
                    const float *row = image + (channel * g->h + iy) * g->w;
                    if (g->stride_w == 1)
                        pad_row(row, g->w, g->pad_w, p->phase_width, d);
                    else /* column q: input q * stride_w + phase_x - pad_w */
                        copy_row(row, columns_inside(phase_x - g->pad_w, g->stride_w, g->w, p->phase_width),
                                 g->stride_w, p->phase_width, d);
                }
}

/* A tile is DIRECT_MR output channels by DIRECT_NV vectors of output positions: on AVX-512, 24 of the 32 registers
 * accumulate and a panel of 8 divides the 32 output channels of DenseNet's 3x3 layers (a GEMM tile of 6 computed
 * 36); on AVX2 the GEMM's 6 x 1 (12 of its 16 registers). */
#ifdef __AVX512F__
enum { DIRECT_MR = 8, DIRECT_NV = 3 };
#else
enum { DIRECT_MR = TG_MR, DIRECT_NV = TG_NV };
#endif
enum { DIRECT_NR = 16 * DIRECT_NV };

/* A tile also prefetches the C lines of the tile after the next one of its panel (the output positions that far on:
 * a panel's tiles walk its channels' rows in order), so their misses have two tiles' reductions to complete. */
enum { C_PREFETCH_AHEAD = 2 * DIRECT_NR };

/* Where a tile's output positions go: positions q, q + 1, ... of a run of rows `pitch` apart, whose first `ow` are
 * output columns of rows oy0, oy0 + 1, ... (the others are discarded: the padded rows' edges, which a run along
 * whole padded rows computes), into an image's output channels `c_rs` floats apart. */
typedef struct {
    float *c;
    int64_t c_rs, pitch, ow, oy0;
} tile_output;

/* The output index (oy * ow + ox) that lane 0 of a vector at position q would have if it lay in row r of the run. */
static inline int64_t output_index(const tile_output *out, int64_t r, int64_t q) {
    return (out->oy0 + r) * out->ow + q - r * out->pitch;
}

/* Vector v of the accumulators' rows (the first m_valid), at position q of which `valid` lanes are real: stored
 * with the epilogue, row segment by row segment. */
static inline __attribute__((always_inline)) void store_vectors(__m512 acc[][DIRECT_NV], int v, int64_t m_valid,
                                                                 const tile_output *out, int64_t q, int64_t valid,
                                                                 const tg_epilogue *ep, int64_t row0) {
    int64_t last = q + (valid < 16 ? valid : 16);
    for (int64_t r = q / out->pitch; r * out->pitch < last; r++) {
        int64_t from = r * out->pitch, to = from + out->ow < last ? from + out->ow : last;
        __mmask16 mask = tg_tail_mask(to - q) & (__mmask16)~tg_tail_mask(from - q);
        int64_t col = output_index(out, r, q);
        _Pragma("GCC unroll 64") for (int i = 0; i < DIRECT_MR; i++) {
            if (i >= m_valid) break;
            _mm512_mask_storeu_ps(out->c + i * out->c_rs + col, mask,
                                  tg_epilogue_apply(acc[i][v], ep, row0 + i, col, mask));
        }
    }
}

/* Output channels row0.. (DIRECT_MR, the first m_valid real) by `nv` vectors of positions q.. (n_valid real) that
 * tap k reads from b + offset[k] on; weights packed (pack_weights: w[k * DIRECT_MR + i]); with `half`, the first 8
 * positions of one vector only (AVX2). */
static inline __attribute__((always_inline)) void direct_tile(const int nv, const int half, int64_t taps,
                                                               const float *w, const float *b,
                                                               const int64_t *restrict offset,
                                                               const tile_output *out, int64_t m_valid, int64_t q,
                                                               int64_t n_valid, const tg_epilogue *ep, int64_t row0) {
    __m512 acc[DIRECT_MR][DIRECT_NV];
    _Pragma("GCC unroll 64") for (int i = 0; i < DIRECT_MR; i++)
        _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) acc[i][v] = _mm512_setzero_ps();
    /* The tile of C is written only after the reduction: fetched before it, its misses overlap it (as the GEMM's
     * micro-kernel does). Without it, a stem's stores stalled on them: 1.7-2.2x slower (bench/NOTES.md). A reduction
     * of K = 27 is too short to hide a miss from memory, so each tile fetches the lines C_PREFETCH_AHEAD positions on
     * (the tile after the next), and only a run's first tiles their own (a prefetch never faults: rows past m_valid,
     * past the output, included). */
    const float *c = out->c + output_index(out, q / out->pitch, q);
    int own = q < C_PREFETCH_AHEAD;
    _Pragma("GCC unroll 64") for (int i = 0; i < DIRECT_MR; i++, c += out->c_rs) {
        _Pragma("GCC unroll 8") for (int v = 0; own && v <= nv; v++) _mm_prefetch((const char *)(c + 16 * v),
                                                                                 _MM_HINT_T0);
        _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++)
            _mm_prefetch((const char *)(c + C_PREFETCH_AHEAD + 16 * v), _MM_HINT_T0);
    }
    _Pragma("GCC unroll 4") for (int64_t k = 0; k < taps; k++) {
        const float *bk = b + offset[k];
        __m512 bv[DIRECT_NV];
        _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) bv[v] = _mm512_loadu_ps(bk + v * 16);
        _Pragma("GCC unroll 64") for (int i = 0; i < DIRECT_MR; i++) {
            __m512 ai = _mm512_set1_ps(w[k * DIRECT_MR + i]);
            _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++)
                acc[i][v] = half ? tg_fmadd_low_ps(ai, bv[v], acc[i][v]) : _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
        }
    }
    _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++)
        store_vectors(acc, v, m_valid, out, q + v * 16, n_valid - v * 16, ep, row0);
}

static void tile(int64_t taps, const float *w, const float *b, const int64_t *offset, const tile_output *out,
                 int64_t m_valid, int64_t q, int64_t n_valid, const tg_epilogue *ep, int64_t row0) {
#define TG_DIRECT_TILE(nv, half) direct_tile(nv, half, taps, w, b, offset, out, m_valid, q, n_valid, ep, row0)
    int64_t vectors = (n_valid + 15) / 16;
    if (HALF_TILES && n_valid <= 8) TG_DIRECT_TILE(1, 1);
    else if (vectors >= DIRECT_NV) TG_DIRECT_TILE(DIRECT_NV, 0);
    else if (vectors == 2) TG_DIRECT_TILE(DIRECT_NV > 2 ? 2 : DIRECT_NV, 0);
    else TG_DIRECT_TILE(1, 0);
#undef TG_DIRECT_TILE
}

/* packed[row0 * taps + k * DIRECT_MR + i] = weight[row0 + i][k], panel by panel of DIRECT_MR output channels (rows
 * past the last one repeat it: their results are discarded), so that a tile reads its weights from one pointer (the
 * rows' own pointers took 8 registers, spilled around the tile). */
static void pack_weights(const float *weight, int64_t taps, int64_t cout, float *restrict packed) {
    for (int64_t row0 = 0; row0 < cout; row0 += DIRECT_MR)
        for (int64_t k = 0; k < taps; k++)
            for (int64_t i = 0; i < DIRECT_MR; i++)
                packed[row0 * taps + k * DIRECT_MR + i] = weight[min_i64(row0 + i, cout - 1) * taps + k];
}

/* Tiles at positions q < span of a run of rows (tile_output) that tap k reads from b + offset[k] + q on, for the
 * panel of output channels from row0. */
static void run_panel(int64_t taps, int64_t cout, int64_t row0, const float *packed, const float *b,
                      const int64_t *offset, tile_output out, int64_t span, const tg_epilogue *ep) {
    out.c += row0 * out.c_rs;
    for (int64_t q = 0; q < span; q += DIRECT_NR)
        tile(taps, packed + row0 * taps, b + q, offset, &out, cout - row0, q, min_i64(DIRECT_NR, span - q), ep, row0);
}

/* 16 or 32 output channels on rows of at most LANES_MAX_WIDTH (at stride 1, AVX-512): the output channels are the
 * vectors' lanes and each tap's input under one output row is broadcast, position by position, so no lane computes
 * a padded row's edge (2 of 9 lanes at 7x7, 2 of 16 at 14x14). The weights are transposed once a call (wt[k * cout
 * + o]), the tile transposed back in registers before its epilogue. */
#ifdef __AVX512F__
enum { LANES = 1 };
#else
enum { LANES = 0 }; /* its 28 accumulators would be 56 of AVX2's 16 registers */
#endif
enum { LANES_MAX_WIDTH = 14 };

static int lanes_fit(int64_t cout, int64_t ow, int flat) {
    return LANES && flat && (cout == 16 || cout == 32) && ow <= LANES_MAX_WIDTH;
}

static void transpose_weights(const float *weight, int64_t taps, int64_t cout, float *restrict wt) {
    for (int64_t o0 = 0; o0 < cout; o0 += 16)
        for (int64_t k0 = 0; k0 < taps; k0 += 16)
            tg_transpose_block(weight + o0 * taps + k0, taps, 16, min_i64(16, taps - k0), wt + k0 * cout + o0, cout,
                               16);
}

/* Output row at index col0 (its `valid` positions; `width` computed, the others discarded) of all `vectors` * 16
 * output channels, tap k reading the row's inputs from b + offset[k] on. */
static inline __attribute__((always_inline)) void lanes_tile(const int width, const int vectors, int64_t taps,
                                                              const float *wt, const float *b,
                                                              const int64_t *restrict offset, float *c, int64_t c_rs,
                                                              int64_t col0, int64_t valid, const tg_epilogue *ep) {
    __m512 acc[LANES_MAX_WIDTH][2];
    _Pragma("GCC unroll 16") for (int j = 0; j < width; j++)
        _Pragma("GCC unroll 2") for (int v = 0; v < vectors; v++) acc[j][v] = _mm512_setzero_ps();
    _Pragma("GCC unroll 2") for (int64_t k = 0; k < taps; k++) {
        const float *bk = b + offset[k];
        __m512 wv[2];
        _Pragma("GCC unroll 2") for (int v = 0; v < vectors; v++) wv[v] = _mm512_load_ps(wt + (k * vectors + v) * 16);
        _Pragma("GCC unroll 16") for (int j = 0; j < width; j++) {
            __m512 xj = _mm512_set1_ps(bk[j]);
            _Pragma("GCC unroll 2") for (int v = 0; v < vectors; v++)
                acc[j][v] = _mm512_fmadd_ps(wv[v], xj, acc[j][v]);
        }
    }
    __mmask16 mask = tg_tail_mask(valid);
    _Pragma("GCC unroll 2") for (int v = 0; v < vectors; v++) {
        __m512 r[16];
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) r[i] = i < width ? acc[i][v] : _mm512_setzero_ps();
        tg_transpose_16x16(r);
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
            int64_t row = v * 16 + i;
            _mm512_mask_storeu_ps(c + row * c_rs + col0, mask, tg_epilogue_apply(r[i], ep, row, col0, mask));
        }
    }
}

static void lanes_row(int64_t taps, int64_t cout, const float *wt, const float *b, const int64_t *offset, float *c,
                      int64_t c_rs, int64_t col0, int64_t ow, const tg_epilogue *ep) {
#define TG_LANES_TILE(width, vectors) lanes_tile(width, vectors, taps, wt, b, offset, c, c_rs, col0, ow, ep)
    if (cout == 16) {
        if (ow <= 7) TG_LANES_TILE(7, 1);
        else TG_LANES_TILE(LANES_MAX_WIDTH, 1);
    } else {
        if (ow <= 7) TG_LANES_TILE(7, 2);
        else TG_LANES_TILE(LANES_MAX_WIDTH, 2);
    }
#undef TG_LANES_TILE
}

static _Thread_local tg_scratch offset_scratch, band_scratch, weight_scratch;

/* A task's band of padded rows is about this many floats (or one output row's, if more; L2). Its tiles run along all
 * its output rows at once (the phase planes' edges computed, then discarded), so that rows end in no partial tile,
 * and each panel of output channels runs over the whole band before the next, so it writes its channels' rows in
 * order, a few streams that the prefetcher follows. With several threads strided convs take smaller bands, at least
 * TASKS_PER_THREAD a thread, to even out the work. */
enum { BAND_FLOATS = 1 << 16, TASKS_PER_THREAD = 4 };

int tg_conv2d_direct_f32(int64_t n, int64_t cin, int64_t h, int64_t w, int64_t cout, int64_t kh, int64_t kw,
                         int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                         int64_t dilation_w, const float *x, const float *weight, const float *bias, float *out,
                         int64_t out_bs, float alpha, const float *residual, int32_t activation) {
    conv_geometry g;
    int described = tg_conv_geometry(n, cin, h, w, cout, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                     dilation_w, out_bs, activation, &g);
    if (described != TG_GEMM_OK) return described;
    if (g.oh <= 0 || g.ow <= 0 || n <= 0 || cout <= 0) return TG_GEMM_OK;
    if (cin <= 0) /* no taps to size bands by: the implicit GEMM's empty sum, the epilogue of zero */
        return tg_conv2d_f32(n, cin, h, w, cout, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, x,
                             weight, bias, out, out_bs, alpha, residual, activation);
    int flat = stride_h == 1 && stride_w == 1;
    padded_band one_row = band_of(&g, 1);
    int64_t row_floats = cin * stride_h * stride_w * one_row.phase_width; /* a band's floats per output row */
    int64_t rows = tg_clamp(1 + (BAND_FLOATS - one_row.floats) / row_floats, 1, g.oh);
    int64_t per_image = ceil_div(g.oh, rows), threads = omp_get_max_threads();
    if (!flat && threads > 1) per_image = tg_clamp(ceil_div(TASKS_PER_THREAD * threads, n), per_image, g.oh);
    rows = ceil_div(g.oh, per_image); /* bands of about even heights */
    padded_band band = band_of(&g, rows);
    int64_t taps = cin * kh * kw, positions = g.oh * g.ow, tasks = n * per_image;
    int64_t *offset = (int64_t *)tg_scratch_reserve(&offset_scratch, 2 * (size_t)taps);
    int lanes = lanes_fit(cout, g.ow, flat);
    float *wt = tg_scratch_reserve(&weight_scratch, (size_t)(taps * ceil_div(cout, DIRECT_MR) * DIRECT_MR));
    if (!offset || !wt) return TG_GEMM_NO_MEMORY;
    if (lanes)
        transpose_weights(weight, taps, cout, wt);
    else
        pack_weights(weight, taps, cout, wt);
    for (int64_t k = 0, channel = 0; channel < cin; channel++)
        for (int64_t ki = 0; ki < kh; ki++)
            for (int64_t kj = 0; kj < kw; kj++, k++)
                offset[k] = plane_offset(&g, &band, channel, ki * dilation_h % stride_h, kj * dilation_w % stride_w) +
                            ki * dilation_h / stride_h * band.phase_width + kj * dilation_w / stride_w;
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed) \
    if (omp_get_max_threads() > 1 && tasks > 1 && n * positions * cout * taps >= 1 << 18)
    for (int64_t task = 0; task < tasks; task++) {
        /* DIRECT_NR floats past the band: a last tile's discarded lanes read them */
        float *padded = tg_scratch_reserve(&band_scratch, (size_t)(band.floats + DIRECT_NR));
        if (!padded) {
            failed = 1;
            continue;
        }
        int64_t image = task / per_image, oy0 = task % per_image * rows, oy1 = min_i64(oy0 + rows, g.oh);
        pad_band(&g, &band, x + image * cin * h * w, oy0 * stride_h, padded);
        tg_epilogue ep = tg_epilogue_of(alpha, activation, bias, 1, 0,
                                        residual ? residual + image * cout * positions : NULL, positions);
        tile_output to = {out + image * out_bs, positions, band.phase_width, g.ow, oy0};
        for (int64_t oy = oy0; lanes && oy < oy1; oy++)
            lanes_row(taps, cout, wt, padded + (oy - oy0) * band.phase_width, offset, to.c, positions, oy * g.ow, g.ow,
                      &ep);
        for (int64_t row0 = 0; !lanes && row0 < cout; row0 += DIRECT_MR)
            run_panel(taps, cout, row0, wt, padded, offset, to, (oy1 - oy0 - 1) * band.phase_width + g.ow, &ep);
    }
    return failed ? TG_GEMM_NO_MEMORY : TG_GEMM_OK;
}
