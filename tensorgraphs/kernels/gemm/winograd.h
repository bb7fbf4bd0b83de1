/* conv2d by Winograd's minimal filtering F(4x4, 3x3) (winograd.c): tg_conv2d_f32's contract (gemm.h). */
#ifndef TG_WINOGRAD_H
#define TG_WINOGRAD_H
#include <stdint.h>

/* tg_conv2d_f32's arguments and result. A 3x3 kernel at stride 1 and dilation 1 on finite inputs and weights runs
 * Winograd F(4x4, 3x3); anything else (another geometry, a NaN or infinity in x or weight, whose effect the
 * transforms would spread over whole 4x4 output tiles) is computed by tg_conv2d_f32 itself. */
int tg_conv2d_winograd_f32(int64_t n, int64_t cin, int64_t h, int64_t w,
                           int64_t cout, int64_t kh, int64_t kw,
                           int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                           int64_t dilation_h, int64_t dilation_w,
                           const float *x, const float *weight, const float *bias, float *out,
                           float alpha, const float *residual, int32_t activation);
#endif
