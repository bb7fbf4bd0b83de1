/* conv2d by direct convolution for few input or output channels (direct.c): tg_conv2d_fn's contract (gemm.h). */
#ifndef TG_DIRECT_H
#define TG_DIRECT_H
#include "gemm.h"

tg_conv2d_fn tg_conv2d_direct_f32;
#endif
