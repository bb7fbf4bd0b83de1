/* Public C entry points of the int8 GEMM: u8 x s8 products summed in int32, exactly, by VPDPBUSD (AVX-512 VNNI) or
 * by VPMADDUBSW and VPMADDWD (AVX-512BW, or AVX2 on avx512_on_avx2.h). Without VNNI, activations that are all at
 * most 127 (quant_max <= 127, torch's `reduce_range`) take about half the multiplies of other ones (gemm_int8.c).
 *
 * The weights are packed once (tensorgraphs.kernels.gemm.int8.pack_weights): a matrix W of n rows (output channels)
 * and k columns becomes ceil(n / 64) panels of ceil(k / 4) groups of 64 x 4 bytes, byte (p, j, r) of panel q being
 * W[64q + j][4p + r] (zero past n and k), with w_colsum[j] = sum_k W[j][k] for the zero-point compensation.
 *
 * Activations are unsigned 8-bit (a zero point of 128 makes signed ones unsigned: s8 + 128), so
 *   sum_k (a(i,k) - zero_point) * W[j][k] = sum_k a(i,k) * W[j][k] - zero_point * w_colsum[j]
 * exactly, in int32 (no intermediate saturates). Every function returns 0, or a negative tg_gemm_status. */
#ifndef TG_GEMM_INT8_H
#define TG_GEMM_INT8_H
#include <stdint.h>

/* c[i*c_rs + j] = sum_k (a[i*a_rs + k] - a_zero_point) * W[j][k] for i < m, j < n. */
int tg_qgemm_u8s8_s32(int64_t m, int64_t n, int64_t k, const uint8_t *a, int64_t a_rs, int32_t a_zero_point,
                      const int8_t *w_packed, const int32_t *w_colsum, int32_t *c, int64_t c_rs);

/* The same with signed activations (read as a + 128 with the zero point moved by 128). */
int tg_qgemm_s8s8_s32(int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t a_rs, int32_t a_zero_point,
                      const int8_t *w_packed, const int32_t *w_colsum, int32_t *c, int64_t c_rs);

/* A linear layer on float32 activations x (m x k) quantized with x_scale and x_zero_point (static quantization),
 * or, when x_scale is 0, with parameters chosen from x as torch's dynamic quantization does:
 *   low = min(x, 0), high = max(x, 0) (both NaN if x holds a NaN), scale = (high - low) / quant_max (0.1 if that
 *   is 0), zero_point = clamp(nearbyint(-low / scale), 0, quant_max);
 * then
 *   q(i,k) = clamp(nearbyint(x[i*x_rs + k] * (1 / scale) + zero_point), 0, quant_max)  (NaN: quant_max)
 *   out[i*out_rs + j] = activation(float(sum_k (q(i,k) - zero_point) * W[j][k]) * (scale * w_scale[j]) + bias[j])
 * each operation rounded once in float32, in this order (torch's quantize and dequantize arithmetic); bias may be
 * NULL; activation is enum tg_activation (gemm.h). */
int tg_qlinear_f32(int64_t m, int64_t n, int64_t k, const float *x, int64_t x_rs, float x_scale,
                   int32_t x_zero_point, int32_t quant_max, const int8_t *w_packed, const int32_t *w_colsum, const float *w_scale, const float *bias,
                   float *out, int64_t out_rs, int32_t activation);
#endif
