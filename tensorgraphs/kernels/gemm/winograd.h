/* conv2d by Winograd's minimal filtering F(4x4, 3x3) (winograd.c): tg_conv2d_fn's contract (gemm.h), with the
 * weights' transform made per call or once (tg_winograd_weights_f32) and passed in. */
#ifndef TG_WINOGRAD_H
#define TG_WINOGRAD_H
#include "gemm.h"

/* U[36][cout][cin] (point-major, each point a cout x cin row-major matrix: the GEMMs' A) of F(4x4, 3x3) for
 * `weight` (cout, cin, 3, 3), then one float: 1 where every weight is finite, else 0. 36 * cin * cout + 1 floats. */
int tg_winograd_weights_f32(int64_t cout, int64_t cin, const float *weight, float *u);

/* A 3x3 kernel at stride 1 and dilation 1 on finite inputs and weights runs Winograd F(4x4, 3x3); anything else
 * (another geometry, a NaN or infinity in x or weight, whose effect the transforms would spread over whole 4x4
 * output tiles) is computed by tg_conv2d_f32 itself. The weights are transformed in each call. */
tg_conv2d_fn tg_conv2d_winograd_f32;

/* tg_conv2d_winograd_f32 given the weights' transform `u` (tg_winograd_weights_f32 of `weight`): same contract and
 * results; `weight` is still read where it falls back to the implicit GEMM (u's flag 0, a non-finite input). */
int tg_conv2d_winograd_prepared_f32(int64_t n, int64_t cin, int64_t h, int64_t w, int64_t cout, int64_t kh,
                                    int64_t kw, int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                    int64_t dilation_h, int64_t dilation_w, const float *x, const float *weight,
                                    const float *bias, float *out, int64_t out_bs, float alpha, const float *residual,
                                    int32_t activation, const float *u);
#endif
