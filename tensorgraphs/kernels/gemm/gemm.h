/* Public C entry points of the tensorgraphs GEMM kernels (float32, row/column strides, batch strides).
 *
 * Element (i, j) of batch b of an operand X lives at X[b*x_bs + i*x_rs + j*x_cs]; a batch stride of 0
 * broadcasts the operand over the batch, a transposed operand is just swapped row/column strides.
 * The output and the residual need a unit column stride (rows may be padded: c_rs >= n).
 *
 * Epilogue, applied once per output element after the full K reduction, in this order:
 *   c = activation(alpha * sum_k a(i,k) b(k,j) + bias(i,j)) + residual(i,j)
 * or, with TG_ACT_AFTER_RESIDUAL OR'd into the activation (a ResNet block's relu after its skip connection),
 *   c = activation(alpha * sum_k a(i,k) b(k,j) + bias(i,j) + residual(i,j)).
 * bias(i, j) = bias[b*bias_bs + i*bias_rs + j*bias_cs] with bias_cs in {0, 1}: a row vector (rs 0, cs 1)
 * or a per-row column vector (rs 1, cs 0). bias / residual may be NULL. c must not overlap any input, but the
 * library's own products (not the BLAS kernel's, which writes c before it adds the residual) take a residual that
 * is c itself, with c's strides: each element's residual is read before the element is written (the blocked
 * driver copies it first where it stores partial sums in c: gemm.c, residual_apart).
 *
 * The gradient activation TG_ACT_GELU_TANH_GRAD (epilogue only) reads the residual as the input h of a gelu
 * (tanh form) instead of adding it: c = (alpha * sum_k a(i,k) b(k,j) + bias(i,j)) * gelu'(h(i,j)), the gelu's
 * backward pass fused into the product that computes the gradient of its output.
 *
 * Prologue: a_prologue / b_prologue (enum tg_activation) apply an activation to every element of that operand
 * as it is packed, so a(i, k) above is activation(A[...]): the activated operand is never stored. (The BLAS
 * kernel, which cannot apply it inside sgemm, applies it on a copy of the operand.)
 *
 * Every function returns 0 on success and a negative tg_gemm_status on invalid arguments. */
#ifndef TG_GEMM_H
#define TG_GEMM_H
#include <stdint.h>

enum tg_activation { TG_ACT_NONE = 0, TG_ACT_RELU = 1, TG_ACT_GELU_TANH = 2, TG_ACT_GELU_TANH_GRAD = 3 };
/* A flag in an epilogue's activation argument (not a prologue's, nor with the gradient activation): the activation
 * comes after the residual add instead of before it. */
enum { TG_ACT_AFTER_RESIDUAL = 16 };
/* Whether `code` is a plain activation (none, relu or gelu): what a prologue applies and, the flag
 * TG_ACT_AFTER_RESIDUAL masked off, what an epilogue applies before or after the residual. */
static inline int tg_activation_known(int32_t code) { return code >= TG_ACT_NONE && code <= TG_ACT_GELU_TANH; }
enum tg_gemm_status { TG_GEMM_OK = 0, TG_GEMM_BAD_STRIDE = -1, TG_GEMM_BAD_ACTIVATION = -2, TG_GEMM_NO_MEMORY = -3 };

/* The signature every product kernel shares. */
typedef int tg_gemm_fn(int64_t batch, int64_t m, int64_t n, int64_t k,
                       const float *a, int64_t a_bs, int64_t a_rs, int64_t a_cs,
                       const float *b, int64_t b_bs, int64_t b_rs, int64_t b_cs,
                       float *c, int64_t c_bs, int64_t c_rs,
                       float alpha,
                       const float *bias, int64_t bias_bs, int64_t bias_rs, int64_t bias_cs,
                       const float *residual, int64_t residual_bs, int64_t residual_rs,
                       int32_t activation, int32_t a_prologue, int32_t b_prologue);

/* float32 operands and result. */
tg_gemm_fn tg_gemm_f32;

/* The same contract as a bfloat16 product: each operand element is rounded to bfloat16 (nearest, ties to even)
 * while it is packed, after its prologue, so float32 operands (master weights) need no bfloat16 copy; products
 * are summed in float32 by VDPBF16PS (AVX-512 BF16, which treats subnormal bfloat16 inputs as zero), and the
 * result is rounded to bfloat16 after the epilogue and stored as float32, as tensorgraphs stores bfloat16. */
tg_gemm_fn tg_gemm_bf16;

/* tg_gemm_bf16 with the result left in float32 (not rounded): a float32 product of bfloat16 values. */
tg_gemm_fn tg_gemm_bf16_f32;

/* The float32 contract on OpenBLAS's sgemm (blas.c, a separate library linked against scipy-openblas32). */
tg_gemm_fn tg_blas_gemm_f32;

/* The signature every conv2d kernel shares: conv2d in NCHW (PyTorch layout, groups = 1): x (n, cin, h, w), weight
 * (cout, cin, kh, kw), bias (cout) or NULL, out (n, cout, oh, ow) with its images `out_bs` floats apart (at least
 * cout*oh*ow: each image contiguous, as in a slice of a concatenation along the channels), with the same epilogue
 * (alpha, activation, residual shaped like out and contiguous). The residual may be `out` itself (contiguous
 * images), as for the products above, so a residual that dies in the conv lends it its bytes and the output's
 * lines are read once, not the residual's and then the output's. (The BLAS kernel, blas.c, writes the product
 * before it adds the residual: not it.) */
typedef int tg_conv2d_fn(int64_t n, int64_t cin, int64_t h, int64_t w,
                         int64_t cout, int64_t kh, int64_t kw,
                         int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                         int64_t dilation_h, int64_t dilation_w,
                         const float *x, const float *weight, const float *bias, float *out, int64_t out_bs,
                         float alpha, const float *residual, int32_t activation);

/* By the GEMM with an implicit im2col (conv.c). */
tg_conv2d_fn tg_conv2d_f32;

/* The compile-time blocking, so callers and benchmarks can report what they run. */
void tg_gemm_config(int64_t out[5]); /* MR, NR, MC, KC, NC */

/* How many products (float32 and bfloat16, convolutions included) this process has run by each path: out[0] by
 * the few-row kernel that reads B in place (gemv.c), out[1] by the blocked driver that packs it; so tests can
 * check which path a program's products take. */
void tg_gemm_path_counts(int64_t out[2]);
#endif
