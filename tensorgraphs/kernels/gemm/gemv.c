/* Products with at most TG_GEMV_ROWS rows (a decoding step's matrix-vector products): B is read once where it
 * lies, with no packing. Packing B costs as much memory traffic as the whole product when A has a single row,
 * so the blocked driver (gemm.c) would move B three times instead of once. Two loop orders, by B's layout:
 *  - B's columns contiguous (x @ W.T of a linear layer): dot products of A's rows with B's columns, several
 *    columns in flight, each from a long run of B of its own (`dot_blocks`: one stream at a time leaves the
 *    memory bandwidth unused);
 *  - B's rows contiguous: A's elements broadcast against B's rows (an axpy per element of A).
 * The inner loops use the target's own vectors (GCC vector extensions, LANES floats wide), not the 16-lane
 * emulation of AVX-512 on AVX2: a pair of AVX registers per vector would leave half the columns in flight.
 * The epilogue applies once per output, on 16-wide blocks of C, through epilogue.h. A prologue on A is applied
 * once, to a contiguous copy of A (small: a few rows), which also serves A's that are not row-major; products
 * with a prologue on B (B would be activated in every call, as the blocked driver does while packing) run there. */
#include <omp.h>

#include "gemm_internal.h"

#define TG_GEMV_ROWS 4
#define ACCUMULATORS 8 /* vectors summed at once: rows x (ACCUMULATORS / rows) columns or vectors in flight */
#define DOT_BLOCK 16   /* columns of C per stream of a task in the dot order (one epilogue vector) */

#ifdef __AVX512F__
#define LANES 16
typedef __mmask16 lane_mask;
static inline lane_mask first_lanes(int64_t count) { return tg_tail_mask(count); }
#else
#define LANES 8
typedef __m256i lane_mask;
static inline lane_mask first_lanes(int64_t count) {
    int32_t clamped = count < 0 ? 0 : count > LANES ? LANES : (int32_t)count;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(clamped), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif
typedef float vec __attribute__((vector_size(4 * LANES), aligned(4), may_alias)); /* unaligned loads through it */

static inline __attribute__((always_inline)) vec load(const float *p) { return *(const vec *)p; }

/* The lanes of `mask` from p, zeros elsewhere (lanes outside it are not read). */
static inline __attribute__((always_inline)) vec load_lanes(const float *p, lane_mask mask) {
#ifdef __AVX512F__
    return (vec)_mm512_maskz_loadu_ps(mask, p);
#else
    return (vec)_mm256_maskload_ps(p, mask);
#endif
}

static inline float sum_lanes(vec v) {
    float sum = 0.0f;
    for (int lane = 0; lane < LANES; lane++) sum += v[lane];
    return sum;
}

/* Whether B's columns are contiguous: the dot products read them (and A's rows) as vectors. */
static int dot_layout(const gemm_batch *g) { return g->b_src.rs == 1 || g->k == 1; }

static int row_layout(const gemm_batch *g) { return g->b_src.cs == 1 || g->n == 1; }

int tg_gemv_fits(const gemm_batch *g) {
    int plain = !g->bf16 && g->b_src.pack == tg_pack_b_strided && !g->b_prologue;
    return g->m <= TG_GEMV_ROWS && plain && (dot_layout(g) || row_layout(g));
}

/* Stores row `row` of a 16-column block of C from its raw sums, through the epilogue. */
static inline void store_block(const tg_epilogue *ep, float *c, int64_t row, int64_t col, const float *sums,
                               int64_t width) {
    __mmask16 mask = tg_tail_mask(width);
    _mm512_mask_storeu_ps(c + col, mask, tg_epilogue_apply(_mm512_maskz_loadu_ps(mask, sums), ep, row, col, mask));
}

/* acc[i][q] += row i of A . column q of B for q < columns: the columns' streams interleaved. */
static inline __attribute__((always_inline)) void dot_pass(int rows, int columns, int64_t k, const float *a,
                                                           int64_t a_rs, const float *const *column,
                                                           vec acc[][ACCUMULATORS]) {
    int64_t whole = k / LANES * LANES;
    for (int64_t kk = 0; kk < whole; kk += LANES)
        for (int i = 0; i < rows; i++) {
            vec av = load(a + i * a_rs + kk);
            for (int q = 0; q < columns; q++) acc[i][q] += av * load(column[q] + kk);
        }
    if (whole < k) {
        lane_mask tail = first_lanes(k - whole);
        for (int i = 0; i < rows; i++) {
            vec av = load_lanes(a + i * a_rs + whole, tail);
            for (int q = 0; q < columns; q++) acc[i][q] += av * load_lanes(column[q] + whole, tail);
        }
    }
}

/* C[0:rows, block first + q * stride] (16 columns each, up to n) for q < streams, by dot products: stream q walks
 * its block's columns in order, so over a thread's consecutive tasks (first, first + 1, ...) each stream reads one
 * long run of B, `streams` runs in flight. Streams that long keep the prefetchers ahead, where columns read side by
 * side (neighbours in memory) or one after another start a new stream every few cache lines. Columns past n
 * repeat column n - 1 (read from cache, never stored). */
static inline __attribute__((always_inline)) void dot_blocks(int rows, int64_t k, const float *a, int64_t a_rs,
                                                             const float *b, int64_t b_cs, float *c, int64_t c_rs,
                                                             const tg_epilogue *ep, int64_t first, int64_t stride,
                                                             int64_t n) {
    const int streams = ACCUMULATORS / rows;
    float sums[ACCUMULATORS][TG_GEMV_ROWS][DOT_BLOCK];
    for (int jj = 0; jj < DOT_BLOCK; jj++) {
        const float *column[ACCUMULATORS];
        for (int q = 0; q < streams; q++) {
            int64_t j = (first + q * stride) * DOT_BLOCK + jj;
            column[q] = b + (j < n ? j : n - 1) * b_cs;
        }
        vec acc[TG_GEMV_ROWS][ACCUMULATORS] = {{{0}}};
        dot_pass(rows, streams, k, a, a_rs, column, acc);
        for (int q = 0; q < streams; q++)
            for (int i = 0; i < rows; i++) sums[q][i][jj] = sum_lanes(acc[i][q]);
    }
    for (int q = 0; q < streams && (first + q * stride) * DOT_BLOCK < n; q++) {
        int64_t j0 = (first + q * stride) * DOT_BLOCK, width = n - j0 < DOT_BLOCK ? n - j0 : DOT_BLOCK;
        for (int i = 0; i < rows; i++) store_block(ep, c + i * c_rs, i, j0, sums[q][i], width);
    }
}

/* C[0:rows, j0:j0+vectors*LANES] (up to n) by broadcasting each element of A against a row of B; `masked` when
 * the block reaches past n (its loads are then masked to the columns that exist). */
static inline __attribute__((always_inline)) void row_block(int rows, int masked, int64_t k, const float *a,
                                                            int64_t a_rs, const float *b, int64_t b_rs, float *c,
                                                            int64_t c_rs, const tg_epilogue *ep, int64_t j0,
                                                            int64_t n) {
    const int vectors = ACCUMULATORS / rows;
    lane_mask masks[ACCUMULATORS];
    for (int q = 0; q < vectors; q++) masks[q] = first_lanes(n - j0 - q * LANES);
    vec acc[TG_GEMV_ROWS][ACCUMULATORS];
    for (int i = 0; i < rows; i++)
        for (int q = 0; q < vectors; q++) acc[i][q] = (vec){0};
    for (int64_t kk = 0; kk < k; kk++) {
        const float *b_row = b + kk * b_rs + j0;
        vec bv[ACCUMULATORS];
        for (int q = 0; q < vectors; q++) bv[q] = masked ? load_lanes(b_row + q * LANES, masks[q]) : load(b_row + q * LANES);
        for (int i = 0; i < rows; i++) {
            float ai = a[i * a_rs + kk];
            for (int q = 0; q < vectors; q++) acc[i][q] += ai * bv[q];
        }
    }
    int64_t width = n - j0 < vectors * LANES ? n - j0 : vectors * LANES;
    for (int i = 0; i < rows; i++) {
        float sums[ACCUMULATORS * LANES];
        for (int q = 0; q < vectors; q++) *(vec *)(sums + q * LANES) = acc[i][q];
        for (int col = 0; col < width; col += 16) store_block(ep, c + i * c_rs, i, j0 + col, sums + col, width - col);
    }
}

static int64_t row_block_width(int64_t m) { return ACCUMULATORS / m * LANES; }

/* Tasks per batch entry: in the dot order also the blocks between a task's streams (`dot_blocks`). */
static int64_t task_slots(const gemm_batch *g, int dots) {
    int64_t block = dots ? DOT_BLOCK : row_block_width(g->m), blocks = (g->n + block - 1) / block;
    int64_t per_task = dots ? ACCUMULATORS / g->m : 1;
    return (blocks + per_task - 1) / per_task;
}

/* One task: slot `slot` of `slots` (`task_slots`) of problem `index`, with its operands offset to that batch entry.
 * A is read from `a` with row stride `a_rs` and unit column stride (the caller's copy where A's own is not). */
static void run_task(const gemm_batch *g, int dots, const float *a, int64_t a_bs, int64_t a_rs, int64_t index,
                     int64_t slot, int64_t slots) {
    const float *b = g->b + index * g->b_bs;
    float *c = g->c + index * g->c_bs;
    a += index * a_bs;
    tg_epilogue ep = g->ep;
    if (ep.bias) ep.bias += index * g->bias_bs;
    if (ep.residual) ep.residual += index * g->residual_bs;
    int64_t j0 = slot * row_block_width(g->m);
    int masked = j0 + row_block_width(g->m) > g->n;
    /* A literal row count per call, so each variant's accumulators stay in registers. */
#define TG_GEMV_CASE(rows)                                                                                       \
    case rows:                                                                                                   \
        if (dots)                                                                                                \
            dot_blocks(rows, g->k, a, a_rs, b, g->b_src.cs, c, g->c_rs, &ep, slot, slots, g->n);                 \
        else if (masked)                                                                                         \
            row_block(rows, 1, g->k, a, a_rs, b, g->b_src.rs, c, g->c_rs, &ep, j0, g->n);                        \
        else                                                                                                     \
            row_block(rows, 0, g->k, a, a_rs, b, g->b_src.rs, c, g->c_rs, &ep, j0, g->n);                        \
        break;
    switch (g->m) {
        TG_GEMV_CASE(1)
        TG_GEMV_CASE(2)
        TG_GEMV_CASE(3)
        TG_GEMV_CASE(4)
    }
#undef TG_GEMV_CASE
}

static _Thread_local tg_scratch a_scratch;

int tg_run_gemv(const gemm_batch *g) {
    int dots = dot_layout(g);
    /* A as the loops read it: in place when its rows are contiguous, else an activated or row-major copy. */
    const float *a = g->a;
    int64_t a_bs = g->a_bs, a_rs = g->a_rs;
    if (g->a_prologue || (g->a_cs != 1 && g->k > 1)) {
        int64_t entries = g->a_bs ? g->batch : 1;
        float *copy = tg_scratch_reserve(&a_scratch, (size_t)(entries * g->m * g->k));
        if (!copy) return TG_GEMM_NO_MEMORY;
        for (int64_t index = 0; index < entries; index++)
            for (int64_t i = 0; i < g->m; i++) {
                float *row = copy + (index * g->m + i) * g->k;
                for (int64_t kk = 0; kk < g->k; kk++) row[kk] = g->a[index * g->a_bs + i * g->a_rs + kk * g->a_cs];
                tg_activate_in_place(row, g->k, g->a_prologue);
            }
        a = copy, a_bs = g->a_bs ? g->m * g->k : 0, a_rs = g->k;
    }
    int64_t slots = task_slots(g, dots), tasks = g->batch * slots;
    int nthreads = omp_get_max_threads();
    int team = nthreads > 1 && tasks > 1 && (double)g->batch * g->m * g->n * g->k >= 1 << 18 ? nthreads : 1;
#pragma omp parallel for schedule(static) num_threads(team)
    for (int64_t task = 0; task < tasks; task++)
        run_task(g, dots, a, a_bs, a_rs, task / slots, task % slots, slots);
    return TG_GEMM_OK;
}
