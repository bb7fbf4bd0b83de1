/* conv2d as an explicit im2col into scratch and OpenBLAS sgemm:
 *   columns (cin*kh*kw x positions) = the patches, out (cout x positions) = weight @ columns,
 * a block of output rows at a time for large images (multiplied into the output in place, then the epilogue on
 * the block while it is cached), several whole images merged into one wider product for small ones (the epilogue
 * pass scatters it back to NCHW). Against conv.c's implicit im2col, a strided conv's gathers (every second input
 * column, rows of padding) are paid once per column element rather than at every repack of a B panel, and the
 * product is a plain sgemm, which OpenBLAS runs near peak with AVX2 as well as AVX-512. The OpenMP threads split
 * the work and each calls sgemm with OpenBLAS set to one thread for the call: handing every small product to
 * OpenBLAS's own thread pool instead cost a wake-up handshake per call, ruinous on a loaded machine, and OpenBLAS
 * (built with pthreads) serializes calls made from several OpenMP threads while it runs threaded. Plain C, no
 * intrinsics:
 * gcc vectorizes the copies for whatever the target has. The scratch is allocated per call and freed (glibc keeps
 * blocks of a size it saw freed on its heap, so repeated calls fault no new pages). */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "columns.h"
#include "conv_geometry.h"
#include "im2col.h"

/* Images of fewer output positions are merged, MERGE_BYTES of columns (one image at least) per product. A larger
 * image is multiplied block by block of output rows, BLOCK_BYTES of columns each (so they are still cached when
 * sgemm packs them), but at least BLOCK_PER_ROW columns per output channel (so the weights sgemm packs again for
 * every block cost little beside the block). Chosen by measurement (bench/NOTES.md). */
enum { MERGE_IMAGES_BELOW = 256, MERGE_BYTES = 8 << 20, BLOCK_BYTES = 512 << 10, BLOCK_PER_ROW = 8 };

/* gelu, tanh form, as the GEMM's epilogue computes it: x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3). */
static float gelu_tanh(float x) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
}

/* x activated (`activation` an enum tg_activation without its placement flag). */
static float activated(float x, int32_t activation) {
    if (activation == TG_ACT_RELU) return x < 0.0f ? 0.0f : x; /* NaN stays NaN and -0 stays -0, as in torch */
    return activation == TG_ACT_GELU_TANH ? gelu_tanh(x) : x;
}

/* to[co][p] = the epilogue (gemm.h) of from[co][p] for cout rows of `count` (alpha is already in the product; the
 * residual is laid out as `to`); `from` may be `to` itself. */
static void finish_rows(const float *from, int64_t from_rs, int64_t cout, int64_t count, const float *bias,
                        const float *residual, int32_t activation, float *to, int64_t to_rs) {
    if (from == to && !bias && !residual && activation == TG_ACT_NONE) return;
    int32_t before = activation & TG_ACT_AFTER_RESIDUAL ? TG_ACT_NONE : activation;
    int32_t after = activation & TG_ACT_AFTER_RESIDUAL ? activation & ~TG_ACT_AFTER_RESIDUAL : TG_ACT_NONE;
#pragma omp parallel for schedule(static) if (cout * count > 65536 && !omp_in_parallel())
    for (int64_t co = 0; co < cout; co++) {
        const float *row = from + co * from_rs;
        float *dst = to + co * to_rs, shift = bias ? bias[co] : 0.0f;
        for (int64_t p = 0; p < count; p++) {
            float v = activated(bias ? row[p] + shift : row[p], before); /* adding 0 would turn -0 into +0 */
            dst[p] = activated(residual ? v + residual[co * to_rs + p] : v, after);
        }
    }
}

/* product (m x n, rows ldc apart) = alpha * weight (m x k) @ columns (k x n, rows ldb apart) by OpenBLAS. */
static void multiply(const float *weight, const float *columns, int64_t m, int64_t n, int64_t k, int64_t ldb,
                     float alpha, float *product, int64_t ldc) {
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha, weight,
                      (blasint)k, columns, (blasint)ldb, 0.0f, product, (blasint)ldc);
}

/* Images of at least MERGE_IMAGES_BELOW positions, block by block of output rows, the blocks handed out to the
 * threads one at a time (a thread the OS deschedules holds back no one), each filling its own columns. */
static int convolve_blocks(const conv_geometry *g, int64_t n, int64_t cout, const float *x, const float *weight,
                           const float *bias, float *out, int64_t out_bs, float alpha, const float *residual,
                           int32_t activation) {
    int64_t positions = g->oh * g->ow, depth = g->cin * g->kh * g->kw, image_size = g->cin * g->h * g->w;
    int64_t wide = tg_clamp(BLOCK_BYTES / (int64_t)sizeof(float) / depth, BLOCK_PER_ROW * cout, positions);
    int64_t rows = tg_clamp(wide / g->ow, 1, g->oh), per_image = (g->oh + rows - 1) / rows;
    /* a 1x1 kernel at stride 1 without padding reads each image as its own columns */
    int unit = g->kh == 1 && g->kw == 1 && g->stride_h == 1 && g->stride_w == 1 && g->pad_h == 0 && g->pad_w == 0;
    int failed = 0;
#pragma omp parallel reduction(| : failed) if (n * per_image > 1)
    {
        float *columns = unit ? NULL : malloc(sizeof(float) * (size_t)(depth * rows * g->ow));
        failed = !unit && !columns;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n * per_image; task++) {
            int64_t image = task / per_image, oy0 = task % per_image * rows;
            int64_t block = (oy0 + rows < g->oh ? rows : g->oh - oy0) * g->ow;
            float *to = out + image * out_bs + oy0 * g->ow;
            if (unit)
                multiply(weight, x + image * image_size + oy0 * g->ow, cout, block, depth, positions, alpha, to,
                         positions);
            else if (columns) {
                tg_conv_fill_columns(g, x + image * image_size, 1, oy0, oy0 + block / g->ow, columns);
                multiply(weight, columns, cout, block, depth, block, alpha, to, positions);
            }
            finish_rows(to, positions, cout, block, bias,
                        residual ? residual + image * cout * positions + oy0 * g->ow : NULL, activation, to,
                        positions);
        }
        free(columns);
    }
    return failed ? TG_GEMM_NO_MEMORY : TG_GEMM_OK;
}

/* Images of fewer positions, in chunks of whole images merged into one wider product, whose columns the threads
 * split (16 at a time). */
static int convolve_merged(const conv_geometry *g, int64_t n, int64_t cout, const float *x, const float *weight,
                           const float *bias, float *out, int64_t out_bs, float alpha, const float *residual,
                           int32_t activation) {
    int64_t positions = g->oh * g->ow, depth = g->cin * g->kh * g->kw, image_size = g->cin * g->h * g->w;
    int64_t chunk = tg_clamp(MERGE_BYTES / (int64_t)sizeof(float) / (depth * positions), 1, n);
    float *columns = malloc(sizeof(float) * (size_t)(depth * chunk * positions));
    float *merged = malloc(sizeof(float) * (size_t)(cout * chunk * positions));
    int status = columns && merged ? TG_GEMM_OK : TG_GEMM_NO_MEMORY;
    for (int64_t first = 0; first < n && status == TG_GEMM_OK; first += chunk) {
        int64_t images = chunk < n - first ? chunk : n - first, width = images * positions;
        tg_conv_fill_columns(g, x + first * image_size, images, 0, g->oh, columns);
#pragma omp parallel if (cout * width * depth > (1 << 20))
        {
            int64_t threads = omp_get_num_threads(), share = ((width + threads - 1) / threads + 15) / 16 * 16;
            int64_t j0 = omp_get_thread_num() * share, j1 = j0 + share < width ? j0 + share : width;
            if (j0 < j1) multiply(weight, columns + j0, cout, j1 - j0, depth, width, alpha, merged + j0, width);
        }
        for (int64_t image = 0; image < images; image++) {
            int64_t at = first + image;
            finish_rows(merged + image * positions, width, cout, positions, bias,
                        residual ? residual + at * cout * positions : NULL, activation, out + at * out_bs, positions);
        }
    }
    free(columns);
    free(merged);
    return status;
}

int tg_conv2d_im2col_f32(int64_t n, int64_t cin, int64_t h, int64_t w, int64_t cout, int64_t kh, int64_t kw,
                         int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                         int64_t dilation_w, const float *x, const float *weight, const float *bias, float *out,
                         int64_t out_bs, float alpha, const float *residual, int32_t activation) {
    conv_geometry g;
    int described = tg_conv_geometry(n, cin, h, w, cout, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                     dilation_w, out_bs, activation, &g);
    if (described != TG_GEMM_OK) return described;
    if (g.oh <= 0 || g.ow <= 0 || n <= 0 || cout <= 0) return TG_GEMM_OK;
    if (cin <= 0) { /* an empty sum, and no columns to size blocks and chunks by: the epilogue of zero */
        float *zeros = calloc((size_t)(g.oh * g.ow), sizeof(float));
        for (int64_t image = 0; zeros && image < n; image++)
            finish_rows(zeros, 0, cout, g.oh * g.ow, bias, residual ? residual + image * cout * g.oh * g.ow : NULL,
                        activation, out + image * out_bs, g.oh * g.ow);
        int status = zeros ? TG_GEMM_OK : TG_GEMM_NO_MEMORY;
        free(zeros);
        return status;
    }
    /* OpenBLAS's thread count is global: programs run their kernels one at a time, so it is restored before any
     * other BLAS call */
    int blas_threads = scipy_openblas_get_num_threads();
    scipy_openblas_set_num_threads(1);
    int status = (g.oh * g.ow >= MERGE_IMAGES_BELOW ? convolve_blocks : convolve_merged)(
        &g, n, cout, x, weight, bias, out, out_bs, alpha, residual, activation);
    scipy_openblas_set_num_threads(blas_threads);
    return status;
}
