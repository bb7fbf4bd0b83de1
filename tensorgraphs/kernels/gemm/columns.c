/* An explicit im2col (columns.h): each row of columns is a tap's copy of the input, row by row of the output, so the
 * reads walk each input plane in order (a stream the hardware prefetcher follows). Plain C, no intrinsics: gcc
 * vectorizes the copies for whatever the target has. */
#include <omp.h>
#include <string.h>

#include "columns.h"

/* The output columns [first, end) of a row whose input column t*stride + offset lies in [0, width): the others read
 * the padding. */
typedef struct {
    int64_t offset, first, end;
} column_range;

static column_range columns_inside(int64_t offset, int64_t stride, int64_t width, int64_t count) {
    int64_t first = tg_clamp(offset < 0 ? (stride - 1 - offset) / stride : 0, 0, count);
    return (column_range){offset, first, tg_clamp(offset < width ? (width - 1 - offset) / stride + 1 : 0, first, count)};
}

/* dst[t] = row[t*stride + offset] inside `range`, 0 outside, for t < count: no branch in the copy itself. */
static inline void copy_row(const float *row, column_range range, int64_t stride, int64_t count, float *restrict dst) {
    for (int64_t t = 0; t < range.first; t++) dst[t] = 0.0f;
    if (stride == 1)
        memcpy(dst + range.first, row + range.first + range.offset, sizeof(float) * (size_t)(range.end - range.first));
    else if (stride == 2) /* a constant stride gcc vectorizes with shuffles */
        for (int64_t t = range.first; t < range.end; t++) dst[t] = row[2 * t + range.offset];
    else
        for (int64_t t = range.first; t < range.end; t++) dst[t] = row[t * stride + range.offset];
    for (int64_t t = range.end; t < count; t++) dst[t] = 0.0f;
}

void tg_conv_fill_columns(const conv_geometry *g, const float *x, int64_t images, int64_t oy0, int64_t oy1, float *columns) {
    int64_t taps = g->kh * g->kw, block = (oy1 - oy0) * g->ow, width = images * block;
#pragma omp parallel for collapse(2) schedule(static) if (g->cin * taps * width > 65536 && !omp_in_parallel())
    for (int64_t r = 0; r < g->cin * taps; r++)
        for (int64_t image = 0; image < images; image++) {
            int64_t channel = r / taps, ki = r % taps / g->kw, kj = r % g->kw;
            column_range range = columns_inside(kj * g->dilation_w - g->pad_w, g->stride_w, g->w, g->ow);
            const float *plane = x + (image * g->cin + channel) * g->h * g->w;
            float *dst = columns + r * width + image * block - oy0 * g->ow;
            for (int64_t oy = oy0; oy < oy1; oy++) {
                int64_t iy = oy * g->stride_h - g->pad_h + ki * g->dilation_h;
                if (iy < 0 || iy >= g->h)
                    memset(dst + oy * g->ow, 0, sizeof(float) * (size_t)g->ow);
                else
                    copy_row(plane + iy * g->w, range, g->stride_w, g->ow, dst + oy * g->ow);
            }
        }
}

