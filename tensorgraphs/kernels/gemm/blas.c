/* The BLAS kernel: tg_gemm_f32's contract (gemm.h) on OpenBLAS's sgemm (scipy-openblas32, symbols prefixed
 * scipy_). Operands whose strides BLAS cannot express (neither unit row nor unit column stride) are copied;
 * the epilogue is a separate vectorized pass, since sgemm only fuses alpha. */
#include <cblas.h>
#include <stdlib.h>

#include "gemm_internal.h"

/* A rows x cols operand as a row-major BLAS matrix, transposed or not; 0 when its strides do not fit. */
static int blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, enum CBLAS_TRANSPOSE *trans,
                       blasint *ld) {
    int64_t row_ld = rows <= 1 ? (cols > 1 ? cols : 1) : rs, col_ld = cols <= 1 ? (rows > 1 ? rows : 1) : cs;
    if ((cs == 1 || cols <= 1) && row_ld >= (cols > 1 ? cols : 1)) {
        *trans = CblasNoTrans;
        *ld = (blasint)row_ld;
        return 1;
    }
    if ((rs == 1 || rows <= 1) && col_ld >= (rows > 1 ? rows : 1)) {
        *trans = CblasTrans;
        *ld = (blasint)col_ld;
        return 1;
    }
    return 0;
}

static float *contiguous_copy(int64_t rows, int64_t cols, const float *data, int64_t rs, int64_t cs) {
    float *copy = malloc(sizeof(float) * (size_t)(rows * cols > 0 ? rows * cols : 1));
    if (copy)
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) copy[i * cols + j] = data[i * rs + j * cs];
    return copy;
}

static int sgemm_one(const gemm_batch *g, int64_t index) {
    const float *a = g->a + index * g->a_bs, *b = g->b + index * g->b_bs;
    float *c = g->c + index * g->c_bs, *a_copy = NULL, *b_copy = NULL;
    enum CBLAS_TRANSPOSE ta, tb;
    blasint lda, ldb;
    if (!blas_layout(g->m, g->k, g->a_rs, g->a_cs, &ta, &lda)) {
        a = a_copy = contiguous_copy(g->m, g->k, a, g->a_rs, g->a_cs);
        ta = CblasNoTrans, lda = g->k > 1 ? (blasint)g->k : 1;
    }
    if (!blas_layout(g->k, g->n, g->b_src.rs, g->b_src.cs, &tb, &ldb)) {
        b = b_copy = contiguous_copy(g->k, g->n, b, g->b_src.rs, g->b_src.cs);
        tb = CblasNoTrans, ldb = g->n > 1 ? (blasint)g->n : 1;
    }
    int status = a && b ? TG_GEMM_OK : TG_GEMM_NO_MEMORY;
    blasint ldc = (blasint)(g->m > 1 ? g->c_rs : (g->n > 1 ? g->n : 1));
    if (status == TG_GEMM_OK)
        scipy_cblas_sgemm(CblasRowMajor, ta, tb, (blasint)g->m, (blasint)g->n, (blasint)g->k, g->ep.alpha, a, lda, b,
                          ldb, 0.0f, c, ldc);
    free(a_copy);
    free(b_copy);
    if (status != TG_GEMM_OK || (!g->ep.bias && !g->ep.residual && g->ep.activation == TG_ACT_NONE)) return status;
    tg_epilogue ep = g->ep; /* alpha is already applied by sgemm */
    ep.alpha = 1.0f;
    if (ep.bias) ep.bias += index * g->bias_bs;
    if (ep.residual) ep.residual += index * g->residual_bs;
    tg_epilogue_rows(c, g->c_rs, g->m, g->n, &ep);
    return status;
}

int tg_blas_gemm_f32(TG_GEMM_PARAMS) {
    gemm_batch g;
    int status = tg_describe_gemm(&g, TG_GEMM_ARGS);
    if (g.m <= 0 || g.n <= 0) return status;
    for (int64_t index = 0; index < g.batch && status == TG_GEMM_OK; index++) status = sgemm_one(&g, index);
    return status;
}
