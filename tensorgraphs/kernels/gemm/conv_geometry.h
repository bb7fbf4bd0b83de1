/* The geometry of a conv2d call (tg_conv2d_fn's arguments, gemm.h), shared by the conv kernels; portable C. */
#ifndef TG_CONV_GEOMETRY_H
#define TG_CONV_GEOMETRY_H
#include <stdint.h>

#include "gemm.h"

typedef struct {
    int64_t cin, h, w, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, oh, ow;
} conv_geometry;

/* Whether a conv kernel takes `activation` (an epilogue's, gemm.h): none, relu or gelu, before or after the
 * residual. */
static inline int tg_conv_activation_known(int32_t activation) {
    return tg_activation_known(activation & ~TG_ACT_AFTER_RESIDUAL);
}

/* *g for one image of a call, with its output size; TG_GEMM_BAD_STRIDE or TG_GEMM_BAD_ACTIVATION for arguments no
 * conv kernel takes (output images `out_bs` floats apart that overlap, among them). An empty output (oh or ow <= 0)
 * is valid: there is nothing to compute. */
static inline int tg_conv_geometry(int64_t n, int64_t cin, int64_t h, int64_t w, int64_t cout, int64_t kh,
                                   int64_t kw, int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                   int64_t dilation_h, int64_t dilation_w, int64_t out_bs, int32_t activation,
                                   conv_geometry *g) {
    if (stride_h < 1 || stride_w < 1 || dilation_h < 1 || dilation_w < 1 || pad_h < 0 || pad_w < 0)
        return TG_GEMM_BAD_STRIDE;
    if (!tg_conv_activation_known(activation)) return TG_GEMM_BAD_ACTIVATION;
    *g = (conv_geometry){cin, h, w, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                         (h + 2 * pad_h - dilation_h * (kh - 1) - 1) / stride_h + 1,
                         (w + 2 * pad_w - dilation_w * (kw - 1) - 1) / stride_w + 1};
    int overlapping = n > 1 && g->oh > 0 && g->ow > 0 && out_bs < cout * g->oh * g->ow;
    return overlapping ? TG_GEMM_BAD_STRIDE : TG_GEMM_OK;
}
#endif
