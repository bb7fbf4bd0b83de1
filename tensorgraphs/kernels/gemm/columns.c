/* An explicit im2col (columns.h): each row of columns is a tap's copy of the input, row by row of the output, so the
 * reads walk each input plane in order (a stream the hardware prefetcher follows). Plain C, no intrinsics: gcc
 * vectorizes the copies for whatever the target has. */
#include <omp.h>
#include <string.h>

#include "columns.h"

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

