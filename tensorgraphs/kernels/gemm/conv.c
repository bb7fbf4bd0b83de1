/* conv2d lowered to GEMM with an implicit im2col: out[img] (cout x oh*ow) = weight (cout x cin*kh*kw) @ cols,
 * where the columns are never materialized: packing a B panel reads them straight from the image (stride-1
 * rows become contiguous copies, and with "same" width whole images shift, as do stride 2's phase planes). Large
 * images are the batch of the GEMM driver; small ones are merged into one wider GEMM. For these convs implicit
 * im2col was chosen by measurement on AVX-512 (bench/NOTES.md): a GEMM on ready-made columns is barely faster than
 * the whole implicit conv, and building the columns costs more than that. Convs whose rows do not shift (strided
 * ones without phase planes, all of them on AVX2, and "valid" ones) multiply explicit columns (convolve_columns). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "columns.h"
#include "gemm_internal.h"

static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Stride 1 with as many output columns as input columns ("same" width): an image's run of consecutive output
 * positions reads a run of consecutive input positions at one offset per tap, with the lanes that fall off the
 * image masked off. Images of at least 16 positions put at most two images in a 16-column vector, so each
 * vector of a packed row is two masked loads. Stride 2 reads its image so once split into phase planes (below);
 * other convs multiply explicit columns (convolve_columns). */
enum { SHIFTED_MIN_POSITIONS = 16 };

static int shifted_im2col(const conv_geometry *g) {
    return g->stride_h == 1 && g->stride_w == 1 && g->ow == g->w && g->oh * g->ow >= SHIFTED_MIN_POSITIONS;
}

/* The image as its own planes (shifted_im2col): offsets[0:kh] the rows', [kh:kh+kw] the columns', then the taps'. */
static shifted_view image_view(const conv_geometry *g, int64_t *offsets) {
    int64_t *rows = offsets, *columns = rows + g->kh, *taps = columns + g->kw;
    for (int64_t ki = 0; ki < g->kh; ki++) rows[ki] = ki * g->dilation_h - g->pad_h;
    for (int64_t kj = 0; kj < g->kw; kj++) columns[kj] = kj * g->dilation_w - g->pad_w;
    for (int64_t t = 0; t < g->kh * g->kw; t++) taps[t] = rows[t / g->kw] * g->w + columns[t % g->kw];
    return (shifted_view){g->h, g->w, g->h * g->w, g->cin * g->h * g->w, rows, columns, taps};
}

/* A stride-2 conv as the shifted im2col of phase planes: plane (pi, pj) of a channel holds its input rows 2y + pi
 * and columns 2x + pj, as many as the output has (zero past the input), so that under tap (ki, kj), which reads
 * row 2 * oy + ki - pad_h, output row oy reads plane row oy + floor((ki - pad_h) / 2) of phase (ki - pad_h) mod 2,
 * and likewise the columns: every tap a run of consecutive floats, as at stride 1. Gathering every other column
 * of each short row segment instead took a fifth of a 3x3/2 conv to 28x28, and explicit columns are a pass over
 * nine times the input (bench/NOTES.md). Only the phases some tap reads are made: a 1x1/2 conv's one plane is its
 * image subsampled, multiplied as a pointwise conv's. */
typedef struct {
    int used[2], first[2]; /* per axis (rows, columns): how many phases the taps read, 1 or 2, from which */
} phase_set;

static int64_t floor_half(int64_t v) { return v >= 0 ? v / 2 : -((1 - v) / 2); }

/* The phases of one axis that a kernel of `taps` taps with `pad` reads, and whether the planes (`out` rows, of
 * an input of `extent`) hold every input row it reads: a tap reading past the planes' last row must read padding. */
static int axis_phases(int64_t taps, int64_t pad, int64_t extent, int64_t out, int *used, int *first) {
    int seen[2] = {0, 0};
    for (int64_t k = 0; k < taps; k++) {
        int64_t shift = floor_half(k - pad), phase = k - pad - 2 * shift;
        seen[phase] = 1;
        if (shift > 0 && 2 * out + phase < extent) return 0; /* the last output row reads past the planes */
    }
    *used = seen[0] + seen[1], *first = seen[0] ? 0 : 1;
    return 1;
}

static int phase_planes_fit(const conv_geometry *g, phase_set *phases) {
#ifdef __AVX512F__
    return g->stride_h == 2 && g->stride_w == 2 && g->dilation_h == 1 && g->dilation_w == 1 &&
           g->oh * g->ow >= SHIFTED_MIN_POSITIONS &&
           axis_phases(g->kh, g->pad_h, g->h, g->oh, &phases->used[0], &phases->first[0]) &&
           axis_phases(g->kw, g->pad_w, g->w, g->ow, &phases->used[1], &phases->first[1]);
#else
    (void)g, (void)phases; /* AVX2 multiplies explicit columns (not measured there) */
    return 0;
#endif
}

/* Floats of one channel's planes. */
static int64_t channel_planes_floats(const conv_geometry *g, const phase_set *phases) {
    return phases->used[0] * phases->used[1] * g->oh * g->ow;
}

static shifted_view phase_view(const conv_geometry *g, const phase_set *phases, int64_t *offsets) {
    int64_t *rows = offsets, *columns = rows + g->kh, *taps = columns + g->kw, plane = g->oh * g->ow;
    for (int64_t ki = 0; ki < g->kh; ki++) rows[ki] = floor_half(ki - g->pad_h);
    for (int64_t kj = 0; kj < g->kw; kj++) columns[kj] = floor_half(kj - g->pad_w);
    for (int64_t t = 0; t < g->kh * g->kw; t++) {
        int64_t ki = t / g->kw, kj = t % g->kw;
        int64_t pi = ki - g->pad_h - 2 * rows[ki] - phases->first[0]; /* the plane's phase, from the first read */
        int64_t pj = kj - g->pad_w - 2 * columns[kj] - phases->first[1];
        taps[t] = (pi * phases->used[1] + pj) * plane + rows[ki] * g->ow + columns[kj];
    }
    int64_t channel_size = channel_planes_floats(g, phases);
    return (shifted_view){g->oh, g->ow, channel_size, g->cin * channel_size, rows, columns, taps};
}

/* The phase planes of n images (phase_view's layout). */
static void split_phases(const conv_geometry *g, const phase_set *phases, const float *x, int64_t n,
                         float *planes) {
    int64_t channel_size = channel_planes_floats(g, phases);
#pragma omp parallel for collapse(2) schedule(static) if (n * g->cin * g->h * g->w > 1 << 16)
    for (int64_t image = 0; image < n; image++)
        for (int64_t channel = 0; channel < g->cin; channel++) {
            const float *from = x + (image * g->cin + channel) * g->h * g->w;
            float *to = planes + (image * g->cin + channel) * channel_size;
            for (int pi = 0; pi < phases->used[0]; pi++)
                for (int pj = 0; pj < phases->used[1]; pj++) {
                    column_range columns = columns_inside(pj + phases->first[1], 2, g->w, g->ow);
                    for (int64_t y = 0; y < g->oh; y++) {
                        int64_t iy = 2 * y + pi + phases->first[0];
                        float *row = to + ((pi * phases->used[1] + pj) * g->oh + y) * g->ow;
                        if (iy < g->h)
                            copy_row(from + iy * g->w, columns, 2, g->ow, row);
                        else
                            memset(row, 0, sizeof(float) * (size_t)g->ow);
                    }
                }
        }
}

static void pack_b_im2col_shifted(const b_source *src, const float *image, int64_t k0, int64_t kc, int64_t j0,
                                  int64_t nr, float *restrict dst) {
    const conv_geometry *g = src->conv;
    const shifted_view *view = src->shifted;
    int64_t positions = g->oh * g->ow;
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
        first[v] = image + img * view->image_size + p, second[v] = image + (img + 1) * view->image_size - split;
        in_first[v] = tg_tail_mask(split), valid[v] = tg_tail_mask(nr - 16 * v);
    }
    /* Lanes whose input row under each kernel row, and column under each kernel column, lie in the planes (unsigned
     * compares: negative rows and columns are out too): a tap's lanes are one of each, the same for every channel. */
    __mmask16 rows_in[g->kh][TG_NV], columns_in[g->kw][TG_NV];
    for (int v = 0; v < TG_NV; v++) {
        __m512i rows = _mm512_loadu_si512(out_row + 16 * v), columns = _mm512_loadu_si512(out_col + 16 * v);
        for (int64_t ki = 0; ki < g->kh; ki++)
            rows_in[ki][v] = valid[v] & _mm512_cmplt_epu32_mask(
                _mm512_add_epi32(rows, _mm512_set1_epi32((int32_t)view->row_offset[ki])),
                _mm512_set1_epi32((int32_t)view->h));
        for (int64_t kj = 0; kj < g->kw; kj++)
            columns_in[kj][v] = _mm512_cmplt_epu32_mask(
                _mm512_add_epi32(columns, _mm512_set1_epi32((int32_t)view->column_offset[kj])),
                _mm512_set1_epi32((int32_t)view->w));
    }
    int64_t taps = g->kh * g->kw, channel = k0 / taps, tap = k0 % taps, ki = tap / g->kw, kj = tap % g->kw;
    for (int64_t k = 0; k < kc; k++) {
        int64_t shift = channel * view->channel_size + view->tap_offset[tap];
        /* what the next panel reads under this tap: one stream per channel row is more than the prefetcher
         * follows (a prefetch never faults, past the image included) */
        _mm_prefetch((const char *)(first[0] + shift + TG_NR), _MM_HINT_T1);
        _mm_prefetch((const char *)(first[0] + shift + 2 * TG_NR - 1), _MM_HINT_T1);
        for (int v = 0; v < TG_NV; v++) {
            __mmask16 inside_image = rows_in[ki][v] & columns_in[kj][v], from_second = inside_image & ~in_first[v];
            __m512 x = tg_load_lanes_ps(inside_image & in_first[v], first[v] + shift);
            if (from_second) /* the next image's lanes: none past the last image (tg_load_lanes_ps) */
                x = _mm512_mask_loadu_ps(x, from_second, second[v] + shift);
            _mm512_store_ps(dst + k * TG_NR + 16 * v, x);
        }
        tap++;
        if (++kj == g->kw) {
            kj = 0;
            if (++ki == g->kh) ki = 0, tap = 0, channel++;
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

/* A conv whose output rows are not its input rows shifted (strided, or "valid") nor its phase planes' multiplies
 * explicit columns (columns.h): gathering each panel from one input row segment per channel in turn took more
 * streams than the prefetcher follows, and ran 0-12% slower on AVX-512 (a 3x3/2 stem without padding, a stride 3,
 * "valid" 3x3 and 5x5 convs) and more than the product itself on AVX2 for a 1x1/2 downsample, where writing the
 * columns as their own pass and packing plain rows of them is cheap (bench/NOTES.md). The work is
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

/* split_phases' planes, reused across calls up to PHASE_PLANES_KEPT floats (as large as the input: a large batch's
 * would otherwise stay allocated for good). */
static _Thread_local tg_scratch phase_scratch;
enum { PHASE_PLANES_KEPT = 4 << 20 };

/* The product of a described conv: its images one GEMM each, merged into one, or explicit columns (a conv that
 * neither shifts nor splits into phase planes); a 1x1 kernel with no padding and stride 1 (or stride 2 on its one
 * phase plane) multiplies each image itself (cin rows of h*w): packed as any strided matrix, a load per vector,
 * cheaper than the shifted im2col's pair of masked loads. Merged images (run_merged) are columns of several images,
 * which only the im2col's view spans. */
static int multiply(gemm_batch g, const conv_geometry *geometry, int64_t n, int pointwise, int shifted) {
    int64_t positions = g.n;
    int merged = n > 1 && positions < (pointwise ? MERGE_POINTWISE_BELOW : MERGE_IMAGES_BELOW);
    if (pointwise && !merged) {
        g.b_src = (b_source){.pack = tg_pack_b_strided, .rs = positions, .cs = 1, .rows_in_place = 1};
        return tg_run_gemm_batch(&g);
    }
    /* (no input channels: no columns to size tasks by; the GEMM gives the epilogue of an empty sum) */
    if (g.k > 0 && !shifted) return convolve_columns(&g, geometry, n, g.b);
    return merged ? run_merged(g, n) : tg_run_gemm_batch(&g);
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
    int64_t *offsets = malloc(sizeof(int64_t) * (size_t)(kh + kw + kh * kw)); /* a kernel's size: not the stack */
    phase_set phases;
    int phased = depth > 0 && phase_planes_fit(&geometry, &phases), shifted = phased || shifted_im2col(&geometry);
    size_t planes_floats = phased ? (size_t)(n * cin * channel_planes_floats(&geometry, &phases)) : 0;
    float *planes = phased ? tg_scratch_reserve(&phase_scratch, planes_floats) : NULL;
    if (!offsets || (phased && !planes)) {
        free(offsets);
        return TG_GEMM_NO_MEMORY;
    }
    shifted_view view = phased ? phase_view(&geometry, &phases, offsets) : image_view(&geometry, offsets);
    if (phased) {
        split_phases(&geometry, &phases, x, n, planes);
        x = planes;
    }
    gemm_batch g = {
        .batch = n, .m = cout, .n = positions, .k = depth,
        .a = weight, .a_bs = 0, .a_rs = depth, .a_cs = 1,
        .b = x, .b_bs = view.image_size,
        .b_src = {.pack = shifted ? pack_b_im2col_shifted : tg_pack_b_strided, .conv = &geometry, .shifted = &view},
        .c = out, .c_bs = out_bs, .c_rs = positions,
        .bias_bs = 0, .residual_bs = cout * positions,
        .ep = tg_epilogue_of(alpha, activation, bias, 1, 0, residual, positions),
    };
    int pointwise = kh == 1 && kw == 1 && pad_h == 0 && pad_w == 0 && (phased || (stride_h == 1 && stride_w == 1));
    int status = multiply(g, &geometry, n, pointwise, shifted);
    free(offsets);
    tg_scratch_trim(&phase_scratch, PHASE_PLANES_KEPT);
    return status;
}
