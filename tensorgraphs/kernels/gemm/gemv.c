/* Products with at most TG_GEMV_ROWS rows (a decoding step's matrix-vector products): B is read once where it
 * lies, with no packing. Packing B costs as much memory traffic as the whole product when A has a single row,
 * so the blocked driver (gemm.c) would move B three times instead of once. Two loop orders, by B's layout:
 *  - B's columns contiguous (x @ W.T of a linear layer): dot products of A's rows with B's columns;
 *  - B's rows contiguous: A's elements broadcast against B's rows (an axpy per element of A).
 * Prologue activations apply to the vectors of an operand as they are loaded (in the row order, A's elements are
 * broadcast one by one: there its prologue is left to gemm.c); the epilogue to each 16-wide vector of C before
 * its only store. */
#include <omp.h>

#include "gemm_internal.h"

#define TG_GEMV_ROWS 4
#define ROW_BLOCK 64 /* columns of C per task in the row order: 4 vectors per row of A */

/* Whether B's columns are contiguous (and A's rows, which the dot products read as vectors too). */
static int dot_layout(const gemm_batch *g) {
    return (g->b_src.rs == 1 || g->k == 1) && (g->a_cs == 1 || g->k == 1);
}

static int row_layout(const gemm_batch *g) { return g->b_src.cs == 1 || g->n == 1; }

int tg_gemv_fits(const gemm_batch *g) {
    int plain = !g->bf16 && g->b_src.pack == tg_pack_b_strided;
    return g->m <= TG_GEMV_ROWS && plain && (dot_layout(g) || (row_layout(g) && !g->a_prologue));
}

/* Stores row `row` of a 16-column block of C from its raw sums, through the epilogue. */
static inline void store_block(const tg_epilogue *ep, float *c, int64_t row, int64_t col, __m512 sums,
                               __mmask16 mask) {
    _mm512_mask_storeu_ps(c + col, mask, tg_epilogue_apply(sums, ep, row, col, mask));
}

/* C[0:rows, j0:j0+16] (masked to n) by dot products: four columns of B at a time against every row of A. */
static inline __attribute__((always_inline)) void dot_block(int rows, int64_t k, const float *a, int64_t a_rs,
                                                            const float *b, int64_t b_cs, float *c, int64_t c_rs,
                                                            const tg_epilogue *ep, int32_t a_prologue,
                                                            int32_t b_prologue, int64_t j0, int64_t n) {
    float sums[TG_GEMV_ROWS][16] = {{0}};
    int64_t width = n - j0 < 16 ? n - j0 : 16;
    for (int64_t jj = 0; jj < width; jj += 4) {
        int columns = width - jj < 4 ? (int)(width - jj) : 4;
        __m512 acc[TG_GEMV_ROWS][4];
        for (int i = 0; i < rows; i++)
            for (int q = 0; q < 4; q++) acc[i][q] = _mm512_setzero_ps();
        for (int64_t kk = 0; kk < k; kk += 16) {
            __mmask16 mask = tg_tail_mask(k - kk);
            __m512 bv[4];
            for (int q = 0; q < 4; q++)
                bv[q] = tg_activate_ps(
                    q < columns ? _mm512_maskz_loadu_ps(mask, b + (j0 + jj + q) * b_cs + kk) : _mm512_setzero_ps(),
                    b_prologue);
            for (int i = 0; i < rows; i++) {
                __m512 av = tg_activate_ps(_mm512_maskz_loadu_ps(mask, a + i * a_rs + kk), a_prologue);
                for (int q = 0; q < 4; q++) acc[i][q] = _mm512_fmadd_ps(av, bv[q], acc[i][q]);
            }
        }
        for (int i = 0; i < rows; i++)
            for (int q = 0; q < columns; q++) sums[i][jj + q] = _mm512_reduce_add_ps(acc[i][q]);
    }
    __mmask16 mask = tg_tail_mask(width);
    for (int i = 0; i < rows; i++) store_block(ep, c + i * c_rs, i, j0, _mm512_loadu_ps(sums[i]), mask);
}

/* C[0:rows, j0:j0+ROW_BLOCK] (masked to n) by broadcasting each element of A against a row of B. */
static inline __attribute__((always_inline)) void row_block(int rows, int64_t k, const float *a, int64_t a_rs,
                                                            int64_t a_cs, const float *b, int64_t b_rs, float *c,
                                                            int64_t c_rs, const tg_epilogue *ep,
                                                            int32_t b_prologue, int64_t j0, int64_t n) {
    __mmask16 masks[4];
    for (int q = 0; q < 4; q++) masks[q] = tg_tail_mask(n - j0 - 16 * q);
    __m512 acc[TG_GEMV_ROWS][4];
    for (int i = 0; i < rows; i++)
        for (int q = 0; q < 4; q++) acc[i][q] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        const float *b_row = b + kk * b_rs + j0;
        __m512 bv[4];
        for (int q = 0; q < 4; q++) bv[q] = tg_activate_ps(_mm512_maskz_loadu_ps(masks[q], b_row + 16 * q), b_prologue);
        for (int i = 0; i < rows; i++) {
            __m512 av = _mm512_set1_ps(a[i * a_rs + kk * a_cs]);
            for (int q = 0; q < 4; q++) acc[i][q] = _mm512_fmadd_ps(av, bv[q], acc[i][q]);
        }
    }
    for (int i = 0; i < rows; i++)
        for (int q = 0; q < 4 && masks[q]; q++) store_block(ep, c + i * c_rs, i, j0 + 16 * q, acc[i][q], masks[q]);
}

/* One task: the columns j0.. of problem `index`, with its operands offset to that batch entry. */
static void run_task(const gemm_batch *g, int dots, int64_t index, int64_t j0) {
    const float *a = g->a + index * g->a_bs, *b = g->b + index * g->b_bs;
    float *c = g->c + index * g->c_bs;
    tg_epilogue ep = g->ep;
    if (ep.bias) ep.bias += index * g->bias_bs;
    if (ep.residual) ep.residual += index * g->residual_bs;
    /* A literal row count per call, so each variant's accumulators stay in registers. */
#define TG_GEMV_CASE(rows)                                                                                     \
    case rows:                                                                                                 \
        if (dots)                                                                                              \
            dot_block(rows, g->k, a, g->a_rs, b, g->b_src.cs, c, g->c_rs, &ep, g->a_prologue, g->b_prologue, j0,  \
                      g->n);                                                                                   \
        else                                                                                                   \
            row_block(rows, g->k, a, g->a_rs, g->a_cs, b, g->b_src.rs, c, g->c_rs, &ep, g->b_prologue, j0, g->n); \
        break;
    switch (g->m) {
        TG_GEMV_CASE(1)
        TG_GEMV_CASE(2)
        TG_GEMV_CASE(3)
        TG_GEMV_CASE(4)
    }
#undef TG_GEMV_CASE
}

int tg_run_gemv(const gemm_batch *g) {
    int dots = dot_layout(g);
    int64_t block = dots ? 16 : ROW_BLOCK, blocks = (g->n + block - 1) / block, tasks = g->batch * blocks;
    int nthreads = omp_get_max_threads();
    int team = nthreads > 1 && tasks > 1 && (double)g->batch * g->m * g->n * g->k >= 1 << 18 ? nthreads : 1;
#pragma omp parallel for schedule(static) num_threads(team)
    for (int64_t task = 0; task < tasks; task++) run_task(g, dots, task / blocks, task % blocks * block);
    return TG_GEMM_OK;
}
