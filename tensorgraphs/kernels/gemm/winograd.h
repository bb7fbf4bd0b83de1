/* conv2d by Winograd's minimal filtering F(4x4, 3x3) (winograd.c): tg_conv2d_fn's contract (gemm.h). */
#ifndef TG_WINOGRAD_H
#define TG_WINOGRAD_H
#include "gemm.h"

/* A 3x3 kernel at stride 1 and dilation 1 on finite inputs and weights runs Winograd F(4x4, 3x3); anything else
 * (another geometry, a NaN or infinity in x or weight, whose effect the transforms would spread over whole 4x4
 * output tiles) is computed by tg_conv2d_f32 itself. */
tg_conv2d_fn tg_conv2d_winograd_f32;
#endif
