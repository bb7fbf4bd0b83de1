/* An explicit im2col (columns.c), shared by the conv kernels that multiply ready-made columns: the OpenBLAS one
 * (im2col.c) and the GEMM library's convs whose rows neither shift nor split into phase planes (conv.c); and the row
 * copy it is made of, which the direct conv (direct.c) pads its images with and the implicit GEMM splits stride 2's
 * phase planes with (conv.c). Portable C. */
#ifndef TG_COLUMNS_H
#define TG_COLUMNS_H
#include <stdint.h>
#include <string.h>

#include "conv_geometry.h"

static inline int64_t tg_clamp(int64_t value, int64_t low, int64_t high) {
    return value < low ? low : value > high ? high : value;
}

/* The output columns [first, end) of a row whose input column t*stride + offset lies in [0, width): the others read
 * the padding. */
typedef struct {
    int64_t offset, first, end;
} column_range;

static inline column_range columns_inside(int64_t offset, int64_t stride, int64_t width, int64_t count) {
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

/* columns[r][i * block + (oy - oy0) * ow + ox] = the input under tap r = (channel, ki, kj) at output (oy, ox) of
 * image i of `images` (x holds them one after another), for output rows oy0 <= oy < oy1 (block = (oy1 - oy0) * ow
 * columns per image): zero where the tap reads the padding. Large fills are split among the OpenMP threads unless
 * the caller already runs in a parallel region. */
void tg_conv_fill_columns(const conv_geometry *g, const float *x, int64_t images, int64_t oy0, int64_t oy1,
                          float *columns);
#endif
