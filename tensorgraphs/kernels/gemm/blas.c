/* The BLAS kernel: tg_gemm_f32's contract (gemm.h) on OpenBLAS's sgemm (scipy-openblas32, symbols prefixed
 * scipy_). Operands whose strides BLAS cannot express (neither unit row nor unit column stride) or that have a
 * prologue are copied (the copy activated); the epilogue is a separate vectorized pass, since sgemm only fuses
 * alpha. */
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

/* activation(operand) as a row-major rows x cols matrix, or NULL when out of memory. */
static float *contiguous_copy(int64_t rows, int64_t cols, const float *data, int64_t rs, int64_t cs,
                              int32_t activation) {
    float *copy = malloc(sizeof(float) * (size_t)(rows * cols > 0 ? rows * cols : 1));
    if (!copy) return NULL;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) copy[i * cols + j] = data[i * rs + j * cs];
    tg_activate_in_place(copy, rows * cols, activation);
    return copy;
}

/* The epilogue sgemm cannot fuse (alpha it can), as a pass over output `index`. */
static void epilogue_pass(const gemm_batch *g, int64_t index) {
    if (!g->ep.bias && !g->ep.residual && g->ep.activation == TG_ACT_NONE) return;
    tg_epilogue ep = g->ep;
    ep.alpha = 1.0f;
    if (ep.bias) ep.bias += index * g->bias_bs;
    if (ep.residual) ep.residual += index * g->residual_bs;
    tg_epilogue_rows(g->c + index * g->c_bs, g->c_rs, g->m, g->n, &ep);
}

static blasint output_ld(const gemm_batch *g) { return (blasint)(g->m > 1 ? g->c_rs : (g->n > 1 ? g->n : 1)); }

static int sgemm_one(const gemm_batch *g, int64_t index) {
    const float *a = g->a + index * g->a_bs, *b = g->b + index * g->b_bs;
    float *a_copy = NULL, *b_copy = NULL;
    enum CBLAS_TRANSPOSE ta, tb;
    blasint lda, ldb;
    if (g->a_prologue || !blas_layout(g->m, g->k, g->a_rs, g->a_cs, &ta, &lda)) {
        a = a_copy = contiguous_copy(g->m, g->k, a, g->a_rs, g->a_cs, g->a_prologue);
        ta = CblasNoTrans, lda = g->k > 1 ? (blasint)g->k : 1;
    }
    if (g->b_prologue || !blas_layout(g->k, g->n, g->b_src.rs, g->b_src.cs, &tb, &ldb)) {
        b = b_copy = contiguous_copy(g->k, g->n, b, g->b_src.rs, g->b_src.cs, g->b_prologue);
        tb = CblasNoTrans, ldb = g->n > 1 ? (blasint)g->n : 1;
    }
    int status = a && b ? TG_GEMM_OK : TG_GEMM_NO_MEMORY;
    if (status == TG_GEMM_OK) {
        scipy_cblas_sgemm(CblasRowMajor, ta, tb, (blasint)g->m, (blasint)g->n, (blasint)g->k, g->ep.alpha, a, lda, b,
                          ldb, 0.0f, g->c + index * g->c_bs, output_ld(g));
        epilogue_pass(g, index);
    }
    free(a_copy);
    free(b_copy);
    return status;
}

/* A batch BLAS can express (strides included, no prologue) is one sgemm_batch_strided call; 0 when it cannot. */
static int sgemm_strided_batch(const gemm_batch *g) {
    enum CBLAS_TRANSPOSE ta, tb;
    blasint lda, ldb;
    int64_t largest = g->batch * (g->a_bs > g->b_bs ? (g->a_bs > g->c_bs ? g->a_bs : g->c_bs)
                                                    : (g->b_bs > g->c_bs ? g->b_bs : g->c_bs));
    if (largest > INT32_MAX || g->a_prologue || g->b_prologue || g->a_bs < 0 || g->b_bs < 0 || g->c_bs < 0 ||
        !blas_layout(g->m, g->k, g->a_rs, g->a_cs, &ta, &lda) ||
        !blas_layout(g->k, g->n, g->b_src.rs, g->b_src.cs, &tb, &ldb))
        return 0;
    scipy_cblas_sgemm_batch_strided(CblasRowMajor, ta, tb, (blasint)g->m, (blasint)g->n, (blasint)g->k, g->ep.alpha,
                                    g->a, lda, (blasint)g->a_bs, g->b, ldb, (blasint)g->b_bs, 0.0f, g->c,
                                    output_ld(g), (blasint)g->c_bs, (blasint)g->batch);
    for (int64_t index = 0; index < g->batch; index++) epilogue_pass(g, index);
    return 1;
}

int tg_blas_gemm_f32(TG_GEMM_PARAMS) {
    gemm_batch g;
    int status = tg_describe_gemm(&g, NULL, TG_GEMM_ARGS); /* sgemm reads B itself */
    if (status != TG_GEMM_OK || g.m <= 0 || g.n <= 0 || g.batch <= 0) return status;
    if (g.batch > 1 && sgemm_strided_batch(&g)) return TG_GEMM_OK;
    for (int64_t index = 0; index < g.batch && status == TG_GEMM_OK; index++) status = sgemm_one(&g, index);
    return status;
}
