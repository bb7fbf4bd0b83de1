/* conv2d by an explicit im2col and OpenBLAS's sgemm (im2col.c): tg_conv2d_fn's contract (gemm.h). */
#ifndef TG_IM2COL_H
#define TG_IM2COL_H
#include "gemm.h"

/* Any stride, padding and dilation. Portable C: it needs no AVX-512, only OpenBLAS (the scipy-openblas32 wheel) and
 * a C compiler. */
tg_conv2d_fn tg_conv2d_im2col_f32;
#endif
