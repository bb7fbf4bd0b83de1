/* An explicit im2col (columns.c), shared by the conv kernels that multiply ready-made columns: the OpenBLAS one
 * (im2col.c) and, on AVX2, the GEMM library's strided convs (conv.c). Portable C. */
#ifndef TG_COLUMNS_H
#define TG_COLUMNS_H
#include <stdint.h>

#include "conv_geometry.h"

/* columns[r][i * block + (oy - oy0) * ow + ox] = the input under tap r = (channel, ki, kj) at output (oy, ox) of
 * image i of `images` (x holds them one after another), for output rows oy0 <= oy < oy1 (block = (oy1 - oy0) * ow
 * columns per image): zero where the tap reads the padding. Large fills are split among the OpenMP threads unless
 * the caller already runs in a parallel region. */
static inline int64_t tg_clamp(int64_t value, int64_t low, int64_t high) {
    return value < low ? low : value > high ? high : value;
}

void tg_conv_fill_columns(const conv_geometry *g, const float *x, int64_t images, int64_t oy0, int64_t oy1,
                          float *columns);
#endif
