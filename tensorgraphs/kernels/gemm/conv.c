/* conv2d lowered to GEMM with an implicit im2col: out[img] (cout x oh*ow) = weight (cout x cin*kh*kw) @ cols,
 * where the columns are never materialized: packing a B panel reads them straight from the image (stride-1
 * rows become contiguous copies, and with "same" width whole images shift). Large images are the batch of the
 * GEMM driver; small ones are merged into one wider GEMM. Implicit im2col was chosen by measurement on AVX-512
 * (bench/NOTES.md): a GEMM on ready-made columns is barely faster than the whole implicit conv, and building the
 * columns costs more than that. On AVX2 only the shifted images are packed implicitly: strided convs multiply
 * explicit columns (convolve_columns). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "columns.h"
#include "gemm_internal.h"

static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The columns j0..j0+nr of a panel (output positions, images one after another), cut where they wrap to the
 * next output row. */
typedef struct {
    int64_t count, image[TG_NR], oh[TG_NR], ow[TG_NR], start[TG_NR], length[TG_NR];
} panel_rows;

static void split_panel(const conv_geometry *g, int64_t j0, int64_t nr, panel_rows *rows) {
    int64_t row = j0 / g->ow, ow = j0 % g->ow, image = row / g->oh, oh = row % g->oh;
    rows->count = 0;
    for (int64_t jj = 0; jj < nr; ow = 0) {
        int64_t length = min_i64(nr - jj, g->ow - ow), r = rows->count++;
        rows->image[r] = image, rows->oh[r] = oh, rows->ow[r] = ow, rows->start[r] = jj, rows->length[r] = length;
        jj += length;
        if (++oh == g->oh) oh = 0, image++;
    }
}

/* Lanes of `column` (from `first` up to `last`) inside [0, width): all of them, without a compare, for a segment
 * that lies inside (most do). */
static inline __mmask16 inside(__m512i column, int64_t first, int64_t last, int64_t width) {
    if (first >= 0 && last < width) return 0xFFFF;
    return _mm512_cmpge_epi32_mask(column, _mm512_setzero_si512()) &
           _mm512_cmplt_epi32_mask(column, _mm512_set1_epi32((int32_t)width));
}

/* dst[t] = row[iw0 + t*stride] where that column lies in [0, width), else 0, for t < length; the `room` floats
 * from dst may take junk past length (stores after this one overwrite it). Masked loads never touch out-of-image
 * lanes, so padding costs no branches: stride 1 is one load, stride 2 two loads and a permute, larger strides a
 * gather. */
static void copy_row_segment(const float *row, int64_t iw0, int64_t stride, int64_t width, int64_t length,
                             float *dst, int64_t room) {
    const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int64_t t = 0; t < length; t += 16) {
        int64_t first = iw0 + t * stride;
        __mmask16 store = tg_tail_mask(length - t);
        __m512i contiguous = _mm512_add_epi32(_mm512_set1_epi32((int32_t)first), lanes);
        __m512 values;
        if (stride == 1) {
            values = tg_load_lanes_ps(store & inside(contiguous, first, first + 15, width), row + first);
        } else if (stride == 2) {
            __m512i upper = _mm512_add_epi32(contiguous, _mm512_set1_epi32(16));
            values = tg_even_lanes_ps(
                tg_load_lanes_ps(inside(contiguous, first, first + 15, width), row + first),
                tg_load_lanes_ps(inside(upper, first + 16, first + 31, width), row + first + 16));
        } else {
            __m512i column = _mm512_add_epi32(_mm512_set1_epi32((int32_t)first),
                                              _mm512_mullo_epi32(lanes, _mm512_set1_epi32((int32_t)stride)));
            __mmask16 read = store & inside(column, first, first + 15 * stride, width);
            values = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), read, column, row, 4);
        }
        tg_store_prefix(dst + t, length - t, room - t, values);
    }
}

/* Segment r's input row under tap (channel, ki, kj), NULL where it lies in the padding; *iw0 its first column. */
static inline const float *segment_row(const conv_geometry *g, const float *image, const panel_rows *rows, int64_t r,
                                       int64_t channel, int64_t ki, int64_t kj, int64_t *iw0) {
    int64_t ih = rows->oh[r] * g->stride_h - g->pad_h + ki * g->dilation_h;
    *iw0 = rows->ow[r] * g->stride_w - g->pad_w + kj * g->dilation_w;
    return ih >= 0 && ih < g->h ? image + ((rows->image[r] * g->cin + channel) * g->h + ih) * g->w : NULL;
}

/* A panel reads one row per channel in turn, more streams than the hardware prefetcher follows, and stalls on each:
 * so while it packs a row, what the next panel reads under the same tap is fetched into cache (a prefetch never
 * faults, past the last image included). */
static void pack_b_im2col(const b_source *src, const float *image, int64_t k0, int64_t kc, int64_t j0, int64_t nr,
                          float *restrict dst) {
    const conv_geometry *g = src->conv;
    panel_rows rows, next;
    split_panel(g, j0, nr, &rows);
    split_panel(g, j0 + nr, TG_NR, &next);
    int64_t taps = g->kh * g->kw, channel = k0 / taps, ki = k0 % taps / g->kw, kj = k0 % g->kw, iw0;
    for (int64_t k = 0; k < kc; k++) {
        float *restrict d = dst + k * TG_NR;
        for (int64_t r = 0; r < next.count; r++) {
            const float *row = segment_row(g, image, &next, r, channel, ki, kj, &iw0);
            for (int64_t at = 0; row && at < next.length[r] * g->stride_w; at += 16)
                _mm_prefetch((const char *)(row + iw0 + at), _MM_HINT_T0);
        }
        for (int64_t r = 0; r < rows.count; r++) {
            const float *row = segment_row(g, image, &rows, r, channel, ki, kj, &iw0);
            if (row)
                copy_row_segment(row, iw0, g->stride_w, g->w, rows.length[r], d + rows.start[r],
                                 TG_NR - rows.start[r]); /* later segments, then the padding, overwrite */
            else
                for (int64_t t = 0; t < rows.length[r]; t++) d[rows.start[r] + t] = 0.0f;
        }
        for (int64_t jj = nr; jj < TG_NR; jj++) d[jj] = 0.0f;
        if (++kj == g->kw) { /* next tap, then next channel, without dividing */
            kj = 0;
            if (++ki == g->kh) ki = 0, channel++;
        }
    }
}

/* Stride 1 with as many output columns as input columns ("same" width): an image's run of consecutive output
 * positions reads a run of consecutive input positions at one offset per tap, with the lanes that fall off the
 * image masked off. Images of at least 16 positions put at most two images in a 16-column vector, so each
 * vector of a packed row is two masked loads, against a masked copy per output row segment in pack_b_im2col
 * (about 10 per panel row for 7x7 images). */
static int shifted_im2col(const conv_geometry *g) {
    return g->stride_h == 1 && g->stride_w == 1 && g->ow == g->w && g->oh * g->ow >= 16;
}

static void pack_b_im2col_shifted(const b_source *src, const float *image, int64_t k0, int64_t kc, int64_t j0,
                                  int64_t nr, float *restrict dst) {
    const conv_geometry *g = src->conv;
    int64_t positions = g->oh * g->ow, plane = g->h * g->w;
    int32_t out_row[TG_NR], out_col[TG_NR];
    const float *first[TG_NV], *second[TG_NV]; /* lane i of vector v reads first[v] + i or second[v] + i */
    __mmask16 in_first[TG_NV], valid[TG_NV];
    for (int v = 0; v < TG_NV; v++) {
        int64_t j = j0 + 16 * v, img = j / positions, p = j % positions, split = min_i64(16, positions - p);
        int32_t row = (int32_t)(p / g->ow), col = (int32_t)(p % g->ow); /* then stepped: no division per lane */
        for (int64_t i = 0; i < 16; i++) {
            if (i == split) row = col = 0;
            out_row[16 * v + i] = row, out_col[16 * v + i] = col;
            if (++col == g->ow) col = 0, row++;
        }
        first[v] = image + img * g->cin * plane + p, second[v] = image + (img + 1) * g->cin * plane - split;
        in_first[v] = tg_tail_mask(split), valid[v] = tg_tail_mask(nr - 16 * v);
    }
    /* Lanes whose input row under each kernel row, and column under each kernel column, lie in the image (unsigned
     * compares: negative rows and columns are out too): a tap's lanes are one of each, the same for every channel. */
    __mmask16 rows_in[g->kh][TG_NV], columns_in[g->kw][TG_NV];
    for (int v = 0; v < TG_NV; v++) {
        __m512i rows = _mm512_loadu_si512(out_row + 16 * v), columns = _mm512_loadu_si512(out_col + 16 * v);
        for (int64_t ki = 0; ki < g->kh; ki++)
            rows_in[ki][v] = valid[v] & _mm512_cmplt_epu32_mask(
                _mm512_add_epi32(rows, _mm512_set1_epi32((int32_t)(ki * g->dilation_h - g->pad_h))),
                _mm512_set1_epi32((int32_t)g->h));
        for (int64_t kj = 0; kj < g->kw; kj++)
            columns_in[kj][v] = _mm512_cmplt_epu32_mask(
                _mm512_add_epi32(columns, _mm512_set1_epi32((int32_t)(kj * g->dilation_w - g->pad_w))),
                _mm512_set1_epi32((int32_t)g->w));
    }
    int64_t taps = g->kh * g->kw, channel = k0 / taps, ki = k0 % taps / g->kw, kj = k0 % g->kw;
    for (int64_t k = 0; k < kc; k++) {
        int64_t shift = channel * plane + (ki * g->dilation_h - g->pad_h) * g->w + kj * g->dilation_w - g->pad_w;
        /* what the next panel reads under this tap: as in pack_b_im2col, one stream per channel row is more than
         * the prefetcher follows (a prefetch never faults, past the image included) */
        _mm_prefetch((const char *)(first[0] + shift + TG_NR), _MM_HINT_T1);
        _mm_prefetch((const char *)(first[0] + shift + 2 * TG_NR - 1), _MM_HINT_T1);
        for (int v = 0; v < TG_NV; v++) {
            __mmask16 inside_image = rows_in[ki][v] & columns_in[kj][v], from_second = inside_image & ~in_first[v];
            __m512 x = tg_load_lanes_ps(inside_image & in_first[v], first[v] + shift);
            if (from_second) /* the next image's lanes: none past the last image (tg_load_lanes_ps) */
                x = _mm512_mask_loadu_ps(x, from_second, second[v] + shift);
            _mm512_store_ps(dst + k * TG_NR + 16 * v, x);
        }
        if (++kj == g->kw) {
            kj = 0;
            if (++ki == g->kh) ki = 0, channel++;
        }
    }
}

/* out[img, co, p] = `rest` of the epilogue (the residual, and an activation after it) on temp[co, img*positions + p]:
 * the merged layout back to NCHW, the images of out `out_bs` floats apart (the residual's contiguous). */
static void scatter_images(const float *temp, int64_t images, int64_t cout, int64_t positions, const tg_epilogue *rest,
                           float *out, int64_t out_bs) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t image = 0; image < images; image++)
        for (int64_t co = 0; co < cout; co++) {
            const float *from = temp + (co * images + image) * positions;
            float *to = out + image * out_bs + co * positions;
            if (rest->residual || rest->activation != TG_ACT_NONE)
                tg_epilogue_row(from, to, positions, rest, image * cout + co);
            else
                memcpy(to, from, (size_t)positions * sizeof(float));
        }
}

/* Below this many output positions per image, the images are merged into one wider GEMM (columns image by image),
 * so a narrow image does not leave most of each register tile empty; the result is scattered back to NCHW. The
 * threads split its columns (gemm.c's column bands: each packs only its own images, and the last partial vector
 * is shared by rows), which beats one GEMM per thread over half the images each (bench/NOTES.md): ResNet-18's
 * layer4 has 4 images of 7x7, 196 columns: 13 vectors, where the column bands run 12.5. Wider images multiply
 * faster unmerged (no scatter, no scratch to fault in): batch 8 of 28x28 and 27x27 1x1 and 3x3 layers 2-19% on
 * AVX-512's 64-column tiles (bench/NOTES.md). A 1x1 kernel's image is a plain matrix only unmerged (below), so it
 * merges narrower images only: 14x14 1x1s ran 3-10% faster unmerged, 7x7 ones still merge. */
enum { MERGE_IMAGES_BELOW = 256, MERGE_POINTWISE_BELOW = 128 };

/* `g` (a batch of `images` problems, one per image, whose B columns continue from one image to the next) as one
 * wider GEMM into scratch, then scattered to its C (NCHW, at its batch stride): its epilogue up to the residual in
 * the GEMM, the residual (contiguous images) and what comes after it in the scatter. */
static int run_merged(gemm_batch g, int64_t images) {
    int64_t positions = g.n, out_bs = g.c_bs;
    float *temp = malloc(sizeof(float) * (size_t)(g.m * images * positions)), *out = g.c;
    if (!temp) return TG_GEMM_NO_MEMORY;
    tg_epilogue rest = {.alpha = 1.0f, .residual = g.ep.residual, .residual_rs = positions,
                        .activation = g.ep.activation_after_residual ? g.ep.activation : TG_ACT_NONE,
                        .activation_after_residual = 1};
    if (g.ep.activation_after_residual) g.ep.activation = TG_ACT_NONE;
    g.batch = 1, g.n = images * positions, g.ep.residual = NULL, g.c = temp, g.c_rs = g.n;
    int status = tg_run_gemm_batch(&g);
    if (status == TG_GEMM_OK) scatter_images(temp, images, g.m, positions, &rest, out, out_bs);
    free(temp);
    return status;
}

/* A conv whose output rows are not its input rows shifted (strided, or "valid") multiplies explicit columns
 * (columns.h) where explicit_columns says: the implicit packing gathers each panel from one input row per channel in
 * turn, more streams than the prefetcher follows, and on AVX2 cost more than the product for a 1x1/2 downsample,
 * where writing the columns as their own pass and packing plain rows of them is cheap (bench/NOTES.md). The work is
 * tasks that each fill their columns and multiply them alone, handed to the threads one at a time with no barrier
 * (a descheduled thread holds back no one): an image's block of output rows, COLUMN_BYTES of columns (cached when
 * the GEMM packs them) and at least a few columns per output channel; or, for small images, a group of them merged
 * (COLUMNS_MERGED_BYTES of columns, at most a thread's share of the images). */
enum { COLUMN_BYTES = 512 << 10, COLUMNS_PER_CHANNEL = 4, COLUMNS_MERGE_BELOW = 256, COLUMNS_MERGED_BYTES = 4 << 20 };

static int convolve_columns(const gemm_batch *conv, const conv_geometry *geo, int64_t n, const float *x) {
    int64_t depth = conv->k, positions = conv->n, cout = conv->m, image_size = geo->cin * geo->h * geo->w;
    int64_t group = 1, rows = geo->oh, threads = omp_get_max_threads();
    if (n > 1 && positions < COLUMNS_MERGE_BELOW)
        group = tg_clamp(COLUMNS_MERGED_BYTES / (int64_t)sizeof(float) / (depth * positions), 1,
                         (n + threads - 1) / threads);
    else
        rows = tg_clamp(tg_clamp(COLUMN_BYTES / (int64_t)sizeof(float) / depth, COLUMNS_PER_CHANNEL * cout, positions) /
                            geo->ow, 1, geo->oh);
    int64_t per_group = (geo->oh + rows - 1) / rows, tasks = (n + group - 1) / group * per_group;
    int failed = 0;
#pragma omp parallel reduction(| : failed) if (tasks > 1)
    {
        float *columns = malloc(sizeof(float) * (size_t)(depth * group * rows * geo->ow));
        failed = !columns;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            int64_t first = task / per_group * group, images = min_i64(group, n - first);
            int64_t oy0 = task % per_group * rows, oy1 = min_i64(oy0 + rows, geo->oh), block = (oy1 - oy0) * geo->ow;
            if (!columns) continue;
            tg_conv_fill_columns(geo, x + first * image_size, images, oy0, oy1, columns);
            gemm_batch g = *conv;
            g.b = columns, g.b_src = (b_source){.pack = tg_pack_b_strided, .rs = images * block, .cs = 1};
            g.c += first * conv->c_bs + oy0 * geo->ow;
            if (g.ep.residual) g.ep.residual += first * conv->residual_bs + oy0 * geo->ow;
            if (images > 1) {
                failed |= run_merged(g, images) != TG_GEMM_OK;
                continue;
            }
            g.batch = 1, g.n = block;
            failed |= tg_run_gemm_batch(&g) != TG_GEMM_OK;
        }
        free(columns);
    }
    return failed ? TG_GEMM_NO_MEMORY : TG_GEMM_OK;
}

/* Below this many output positions per image AVX-512's implicit packing copies rows of a few columns each, 7 for a
 * 7x7 output (ResNet-50's last stride-2 convs ran 7-12% faster on explicit columns); above it, where it copies
 * long rows, it stays ahead (3x3/2 to 28x28 outputs: 6% faster than explicit columns; bench/NOTES.md). */
enum { EXPLICIT_COLUMNS_BELOW = 256 };

/* Whether a conv whose output rows are not shifted input rows multiplies explicit columns (convolve_columns): on
 * AVX2 all of them, on AVX-512 those with few output positions per image. */
static int explicit_columns(const conv_geometry *g) {
#ifdef __AVX512F__
    return g->oh * g->ow < EXPLICIT_COLUMNS_BELOW;
#else
    (void)g;
    return 1;
#endif
}

int tg_conv2d_f32(int64_t n, int64_t cin, int64_t h, int64_t w, int64_t cout, int64_t kh, int64_t kw,
                  int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                  int64_t dilation_w, const float *x, const float *weight, const float *bias, float *out,
                  int64_t out_bs, float alpha, const float *residual, int32_t activation) {
    conv_geometry geometry;
    int described = tg_conv_geometry(n, cin, h, w, cout, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                     dilation_w, out_bs, activation, &geometry);
    if (described != TG_GEMM_OK) return described;
    int64_t positions = geometry.oh * geometry.ow, depth = cin * kh * kw;
    if (geometry.oh <= 0 || geometry.ow <= 0 || n <= 0) return TG_GEMM_OK;
    gemm_batch g = {
        .batch = n, .m = cout, .n = positions, .k = depth,
        .a = weight, .a_bs = 0, .a_rs = depth, .a_cs = 1,
        .b = x, .b_bs = cin * h * w,
        .b_src = {.pack = shifted_im2col(&geometry) ? pack_b_im2col_shifted : pack_b_im2col, .conv = &geometry},
        .c = out, .c_bs = out_bs, .c_rs = positions,
        .bias_bs = 0, .residual_bs = cout * positions,
        .ep = tg_epilogue_of(alpha, activation, bias, 1, 0, residual, positions),
    };
    /* A 1x1 kernel with stride 1 and no padding multiplies each image itself (cin rows of h*w): packed as any
     * strided matrix, a load per vector, cheaper than the shifted im2col's pair of masked loads. Merged images
     * (run_merged) are columns of several images, which only the im2col's view spans. */
    int pointwise = kh == 1 && kw == 1 && stride_h == 1 && stride_w == 1 && pad_h == 0 && pad_w == 0;
    int merged = n > 1 && positions < (pointwise ? MERGE_POINTWISE_BELOW : MERGE_IMAGES_BELOW);
    if (pointwise && !merged) {
        g.b_src = (b_source){.pack = tg_pack_b_strided, .rs = positions, .cs = 1, .rows_in_place = 1};
        return tg_run_gemm_batch(&g);
    }
    /* (no input channels: no columns to size tasks by; the GEMM gives the epilogue of an empty sum) */
    if (depth > 0 && !shifted_im2col(&geometry) && explicit_columns(&geometry))
        return convolve_columns(&g, &geometry, n, x);
    return merged ? run_merged(g, n) : tg_run_gemm_batch(&g);
}
