/* Blocked GEMM with packing and an AVX-512 FMA register tile (BLIS loop order: jc, pc, ic, jr, ir).
 * A blocks (MC x KC) are packed by the thread that computes them, B panels (KC x NC) by each thread (as the first
 * row block needs them, see gemm_blocks) or by the team together (see tg_run_gemm_batch), each then activated in place by its operand's prologue (while it is
 * still in cache); the TG_MR x TG_NR micro-kernel keeps its accumulators in zmm registers and applies the fused
 * epilogue before the last store. A bfloat16 product (tg_gemm_bf16) runs the same driver: each packed block, once
 * activated, is rewritten in place as bfloat16 pairs, and the micro-kernel sums them by VDPBF16PS. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_internal.h"

#define TG_ALWAYS_INLINE static inline __attribute__((always_inline))

static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

float *tg_scratch_reserve(tg_scratch *s, size_t count) {
    if (count <= s->capacity) return s->data;
    free(s->data);
    size_t bytes = (count * sizeof(float) + 4095) & ~(size_t)4095;
    s->data = aligned_alloc(4096, bytes);
    s->capacity = s->data ? bytes / sizeof(float) : 0;
    return s->data;
}

void tg_scratch_trim(tg_scratch *s, size_t kept) {
    if (s->capacity <= kept) return;
    free(s->data);
    *s = (tg_scratch){0};
}

static _Thread_local tg_scratch pack_scratch;

/* ---------------------------------------------------------------- packing */

/* The fast way to pack an operand whose contiguous dimension is the reduction (row-major A, column-major B). */
void tg_transpose_block(const float *src, int64_t src_ld, int64_t rows, int64_t cols, float *dst, int64_t dst_ld,
                        int64_t width) {
    __m512 r[16];
    __mmask16 col_mask = tg_tail_mask(cols);
    for (int i = 0; i < 16; i++) {
        r[i] = i < rows ? _mm512_maskz_loadu_ps(col_mask, src + i * src_ld) : _mm512_setzero_ps();
        if (i < rows) _mm_prefetch((const char *)(src + i * src_ld + 64), _MM_HINT_T0); /* 4 calls ahead */
    }
    tg_transpose_16x16(r);
    for (int c = 0; c < cols; c++) /* ascending: a column's overrun lands where the next ones store */
        tg_store_prefix(dst + c * dst_ld, width, width == dst_ld ? (cols - c) * dst_ld : width, r[c]);
}

/* A (mc x kc) as micro-panels dst[ir*kc + k*TG_MR + ii], rows past mc zero-padded. Row-major A goes through
 * the 16x16 transpose; a transposed A (unit row stride) is walked one contiguous column at a time across all
 * panels, since a panel-by-panel walk reads only TG_MR floats per cache line at a large stride (4 KiB for 1024
 * rows, where the L1's sets alias; bench/NOTES.md). */
void tg_pack_a(const float *a, int64_t rs, int64_t cs, int64_t mc, int64_t kc, float *restrict dst) {
    if (rs == 1 && TG_MR <= 16) {
        for (int64_t k = 0; k < kc; k++) {
            const float *column = a + k * cs;
            /* each column is a run of its own (cs apart): the prefetcher starts on none of them in time */
            for (int64_t i = 0; i < mc; i += 16) _mm_prefetch((const char *)(column + 8 * cs + i), _MM_HINT_T0);
            for (int64_t ir = 0; ir < mc; ir += TG_MR) /* the overrun lands on later k, stored after this one */
                tg_store_prefix(dst + ir * kc + k * TG_MR, TG_MR, (kc - k) * TG_MR,
                                _mm512_maskz_loadu_ps(tg_tail_mask(mc - ir), column + ir));
        }
        return;
    }
    for (int64_t ir = 0; ir < mc; ir += TG_MR) {
        int64_t mr = min_i64(TG_MR, mc - ir);
        float *restrict d = dst + ir * kc;
        const float *s = a + ir * rs;
        if (cs == 1 && TG_MR <= 16) {
            for (int64_t k = 0; k < kc; k += 16)
                tg_transpose_block(s + k, rs, mr, min_i64(16, kc - k), d + k * TG_MR, TG_MR, TG_MR);
            continue;
        }
        for (int64_t k = 0; k < kc; k++)
            for (int64_t ii = 0; ii < TG_MR; ii++) d[k * TG_MR + ii] = ii < mr ? s[ii * rs + k * cs] : 0.0f;
    }
}

void tg_pack_b_strided(const b_source *src, const float *data, int64_t k0, int64_t kc, int64_t j0, int64_t nr,
                       float *restrict dst) {
    int64_t rs = src->rs, cs = src->cs;
    const float *s = data + k0 * rs + j0 * cs;
    if (cs == 1 || nr == 1) {
        for (int64_t k = 0; k < kc; k++) {
            const float *row = s + k * rs;
            float *restrict d = dst + k * TG_NR;
            /* the part of the row two panels on, every line of it, into L2: kc rows far apart are more streams than
             * the prefetcher follows, and one panel ahead (its first line) left few-row products waiting on the
             * rest (a prefetch never faults, past the matrix included) */
            for (int v = 0; v < TG_NV; v++) _mm_prefetch((const char *)(row + 2 * TG_NR + 16 * v), _MM_HINT_T1);
            for (int v = 0; v < TG_NV; v++) {
                __mmask16 mask = tg_tail_mask(nr - v * 16);
                _mm512_store_ps(d + v * 16, tg_load_lanes_ps(mask, row + v * 16));
            }
        }
        return;
    }
    if (rs == 1) {
        /* the next panel's TG_NR rows start into L2 now (the transposes prefetch each row ahead once under way) */
        for (int64_t jj = 0; jj < TG_NR; jj++)
            for (int64_t k = 0; k < 64 && k < kc; k += 16)
                _mm_prefetch((const char *)(s + (TG_NR + jj) * cs + k), _MM_HINT_T1);
        for (int v = 0; v < TG_NV; v++)
            for (int64_t k = 0; k < kc; k += 16)
                tg_transpose_block(s + v * 16 * cs + k, cs, min_i64(16, nr - v * 16), min_i64(16, kc - k),
                                dst + k * TG_NR + v * 16, TG_NR, 16);
        return;
    }
    for (int64_t k = 0; k < kc; k++)
        for (int64_t jj = 0; jj < TG_NR; jj++) dst[k * TG_NR + jj] = jj < nr ? s[k * rs + jj * cs] : 0.0f;
}

/* ---------------------------------------------------------------- bfloat16 pairs */

/* A packed block of `rows` rows of `width` floats (k-major: row k holds every column's element k) rewritten in
 * place as (rows + 1) / 2 rows of bfloat16 pairs: 32-bit word j of row p holds element 2p of column j in its low
 * half and element 2p + 1 in its high half (zero past an odd last row), the operand layout of VDPBF16PS. Row p is
 * written after rows 2p and 2p + 1 are read, so no row is overwritten before it is used. */
static void pair_rows_in_place(float *x, int64_t rows, int64_t width) {
    for (int64_t p = 0; p < (rows + 1) / 2; p++)
        for (int64_t j = 0; j < width; j += 16) {
            __mmask16 mask = tg_tail_mask(width - j);
            __m512i low = tg_bf16_bits(_mm512_maskz_loadu_ps(mask, x + 2 * p * width + j));
            __m512i high = 2 * p + 1 < rows ? tg_bf16_bits(_mm512_maskz_loadu_ps(mask, x + (2 * p + 1) * width + j))
                                            : _mm512_setzero_si512();
            __m512i pairs = _mm512_or_si512(high, _mm512_srli_epi32(low, 16));
            _mm512_mask_storeu_ps(x + p * width + j, mask, _mm512_castsi512_ps(pairs));
        }
}

/* ---------------------------------------------------------------- micro-kernel */

/* c[i, v] (+)= the epilogue of tile[i, v] for the tile's rows and 16-column vectors, one vector at a time. For gelu
 * and its gradient (an exp2 and a division per vector), which need more registers than the accumulators leave:
 * applied on them, gcc interleaved the rows' chains and spilled (bench/NOTES.md). Out of line, so the other tiles'
 * code is not compiled around a stack tile. */
static __attribute__((noinline)) void epilogue_by_vector(const float *tile, int nv, float *c, int64_t c_rs,
                                                         int64_t rows, const __mmask16 *masks, int accumulate,
                                                         const tg_epilogue *ep, int64_t row0, int64_t col0) {
    for (int64_t i = 0; i < rows; i++) {
        float *row = c + i * c_rs;
        for (int v = 0; v < nv; v++) {
            __m512 x = _mm512_loadu_ps(tile + i * TG_NR + v * 16);
            if (accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(masks[v], row + v * 16));
            _mm512_mask_storeu_ps(row + v * 16, masks[v], tg_epilogue_apply(x, ep, row0 + i, col0 + v * 16, masks[v]));
        }
    }
}

/* acc += a_panel (TG_MR x kc, element (i, k) at a[i*a_rs + k*a_ks]: a packed micro-panel or rows of A in place,
 * then with `relu` their relu) @ b_panel (kc rows of 16*nv columns, b_ks apart: TG_NR for a packed panel, B's row
 * stride for one read in place), float32 operands by FMA; with `half`, only the first 8 columns of one vector (of a
 * packed panel). */
TG_ALWAYS_INLINE void accumulate_f32(const int nv, const int half, const int relu, int64_t kc, const float *restrict a,
                                     int64_t a_rs, int64_t a_ks, const float *restrict b, int64_t b_ks,
                                     __m512 acc[TG_MR][TG_NV]) {
    /* unrolled: on AVX2 the rolled loop ran 5-10% slower in whole products (2 and 8 ran as 4; bench/NOTES.md) */
    _Pragma("GCC unroll 4") for (int64_t k = 0; k < kc; k++) {
        __m512 bv[TG_NV];
        _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++)
            bv[v] = half ? tg_load_low_ps(b + v * 16) : _mm512_loadu_ps(b + v * 16);
        _Pragma("GCC unroll 64") for (int i = 0; i < TG_MR; i++) {
            __m512 ai = _mm512_set1_ps(a[i * a_rs]);
            if (relu) ai = tg_activate_ps(ai, TG_ACT_RELU);
            _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++)
                acc[i][v] = half ? tg_fmadd_low_ps(ai, bv[v], acc[i][v]) : _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
        }
        a += a_ks;
        b += b_ks;
    }
}

/* The same on panels of bfloat16 pairs (pair_rows_in_place): one VDPBF16PS adds two products per lane. A pair is
 * broadcast as the float whose bits it is (a load, no arithmetic), so the panels stay float arrays. */
TG_ALWAYS_INLINE void accumulate_bf16(const int nv, int64_t kc, const float *restrict a, const float *restrict b,
                                      __m512 acc[TG_MR][TG_NV]) {
    for (int64_t p = 0; p < (kc + 1) / 2; p++) {
        __m512bh bv[TG_NV];
        _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) bv[v] = TG_AS_BF16(_mm512_load_si512(b + v * 16));
        _Pragma("GCC unroll 64") for (int i = 0; i < TG_MR; i++) {
            __m512bh ai = TG_AS_BF16(_mm512_castps_si512(_mm512_set1_ps(a[i])));
            _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], ai, bv[v]);
        }
        a += TG_MR;
        b += TG_NR;
    }
}

/* Which epilogue a block's tiles apply, the same for the whole block, so that each is a kernel of its own with no
 * branch per vector: an affine one (tg_affine_of; also none, before the last K block) with or without a residual,
 * or any other (tg_epilogue_apply). */
enum tile_epilogue { TILE_AFFINE, TILE_AFFINE_RESIDUAL, TILE_GENERAL };

typedef struct tile_job tile_job;

/* c[0:m_valid, 0:n_valid] (+)= a_panel @ b_panel and the job's epilogue, with (row0, col0) the tile's position in
 * the whole output (for bias and residual). */
typedef void tile_kernel(const tile_job *job, const float *restrict a, const float *restrict b, float *c,
                         int64_t m_valid, int64_t n_valid, int64_t row0, int64_t col0);

/* What the tiles of a block share, set once per block (tile_job_of): the reduction's length, A's row stride where
 * its rows are read in place, C's row stride, where the next tile in the walk lies from this one in C and in the
 * residual (a prefetch never faults, so past the last one too), whether the tiles add to partial sums in C, the
 * epilogue (`ep` for TILE_GENERAL, NULL for none; `affine` for the others) and the kernels for packed and in-place
 * micro-panels of A, and for a few last columns by dot products (in_place_dot, NULL where the job has none). */
struct tile_job {
    int64_t kc, a_rs, b_ks, c_rs, next_c, next_residual;
    int accumulate;
    const tg_epilogue *ep;
    tg_affine_epilogue affine;
    tile_kernel *packed, *in_place, *in_place_dot;
};

/* A load or store of 16 lanes, all of them where `full` (a compile-time constant: no mask for AVX2 to test). */
TG_ALWAYS_INLINE __m512 load_lanes(const int full, __mmask16 mask, const float *p) {
    return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mask, p);
}

TG_ALWAYS_INLINE void store_lanes(const int full, __mmask16 mask, float *p, __m512 x) {
    if (full)
        _mm512_storeu_ps(p, x);
    else
        _mm512_mask_storeu_ps(p, mask, x);
}

/* c[0:m_valid, 0:n_valid] (+)= the epilogue `kind` of acc. `full` (a compile-time constant) says the tile's TG_MR
 * rows and 16 * nv columns all lie in C: the common whole tile stores with no mask and no row check. */
TG_ALWAYS_INLINE void store_tile(const int nv, const int full, const int kind, __m512 acc[TG_MR][TG_NV],
                                 const tile_job *t, float *c, int64_t m_valid, int64_t n_valid, int64_t row0,
                                 int64_t col0) {
    /* copied: C's stores could otherwise change them, as far as gcc knows, so it would load them again per row */
    const tg_affine_epilogue e = t->affine;
    const int64_t c_rs = t->c_rs;
    const int accumulate = t->accumulate;
    __mmask16 masks[TG_NV];
    _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) masks[v] = full ? 0xFFFF : tg_tail_mask(n_valid - v * 16);
    __m512 alpha = _mm512_set1_ps(e.alpha), floor = _mm512_set1_ps(e.floor);
    __m512 floor_after = _mm512_set1_ps(e.floor_after);
    _Pragma("GCC unroll 64") for (int i = 0; i < TG_MR; i++) {
        if (!full && i >= m_valid) break;
        float *row = c + i * c_rs;
        __m512 bias = kind == TILE_GENERAL ? alpha : _mm512_set1_ps(e.bias[(row0 + i) * e.bias_rs]);
        const float *residual = kind == TILE_AFFINE_RESIDUAL ? e.residual + (row0 + i) * e.residual_rs + col0 : NULL;
        _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) {
            __m512 x = acc[i][v];
            if (accumulate) x = _mm512_add_ps(x, load_lanes(full, masks[v], row + v * 16));
            if (kind != TILE_GENERAL)
                x = tg_affine_apply(x, alpha, bias, floor, floor_after, kind == TILE_AFFINE_RESIDUAL,
                                    kind == TILE_AFFINE_RESIDUAL ? load_lanes(full, masks[v], residual + v * 16) : x);
            else if (t->ep)
                x = tg_epilogue_apply(x, t->ep, row0 + i, col0 + v * 16, masks[v]);
            store_lanes(full, masks[v], row + v * 16, x);
        }
    }
}

/* A tile of 16 * nv columns (with `half`, the first 8 only) of float32 products (or bfloat16 pairs, `bf16`), A's
 * micro-panel packed (a_rs 1, a_ks TG_MR) or, `in_place`, rows of A (a_rs the job's, a_ks 1) with `relu` taken as
 * they are read. Every int parameter but m_valid and n_valid is a compile-time constant after inlining, so the
 * accumulators stay in registers. */
TG_ALWAYS_INLINE void tile(const int nv, const int half, const int bf16, const int relu, const int in_place,
                           const int kind, const tile_job *t, const float *restrict a, const float *restrict b,
                           float *c, int64_t m_valid, int64_t n_valid, int64_t row0, int64_t col0) {
    const tg_epilogue *ep = kind == TILE_GENERAL ? t->ep : NULL;
    const float *residual = kind == TILE_AFFINE_RESIDUAL ? t->affine.residual : ep ? ep->residual : NULL;
    int64_t residual_rs = kind == TILE_AFFINE_RESIDUAL ? t->affine.residual_rs : ep ? ep->residual_rs : 0;
    __m512 acc[TG_MR][TG_NV];
    _Pragma("GCC unroll 64") for (int i = 0; i < TG_MR; i++) {
        _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) acc[i][v] = _mm512_setzero_ps();
        /* The tile of C is read or written only after the whole reduction: fetched now, its misses overlap it; and
         * so is the next tile's, whose misses then have a whole tile's time (a short reduction's tile took little
         * more than one miss otherwise). So is the residual (read once: into L2, leaving L1 to the B panel;
         * bench/NOTES.md). */
        if (i < m_valid) {
            const float *row = c + i * t->c_rs;
            _mm_prefetch((const char *)row, _MM_HINT_T0);
            _mm_prefetch((const char *)(row + 16 * nv - 1), _MM_HINT_T0);
            _mm_prefetch((const char *)(row + t->next_c), _MM_HINT_T0);
            if (residual) {
                const float *residual_row = residual + (row0 + i) * residual_rs + col0;
                _mm_prefetch((const char *)residual_row, _MM_HINT_T1);
                _mm_prefetch((const char *)(residual_row + 16 * nv - 1), _MM_HINT_T1);
                _mm_prefetch((const char *)(residual_row + t->next_residual), _MM_HINT_T1);
            }
        }
    }
    if (bf16)
        accumulate_bf16(nv, t->kc, a, b, acc);
    else
        accumulate_f32(nv, half, relu, t->kc, a, in_place ? t->a_rs : 1, in_place ? 1 : TG_MR, b, t->b_ks, acc);
    if (ep && ep->activation >= TG_ACT_GELU_TANH) {
        float stack_tile[TG_MR * TG_NR];
        __mmask16 masks[TG_NV];
        _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) masks[v] = tg_tail_mask(n_valid - v * 16);
        _Pragma("GCC unroll 64") for (int i = 0; i < TG_MR; i++)
            _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++)
                _mm512_storeu_ps(stack_tile + i * TG_NR + v * 16, acc[i][v]);
        epilogue_by_vector(stack_tile, nv, c, t->c_rs, m_valid < TG_MR ? m_valid : TG_MR, masks, t->accumulate, ep,
                           row0, col0);
        return;
    }
    if (!half && m_valid >= TG_MR && n_valid >= 16 * nv)
        store_tile(nv, 1, kind, acc, t, c, m_valid, n_valid, row0, col0);
    else
        store_tile(nv, 0, kind, acc, t, c, m_valid, n_valid, row0, col0);
}

/* The tile computes only the 16-wide column vectors (or, on AVX2, the half of one) it needs: a narrow last panel
 * costs what it holds (bfloat16 products take whole vectors). */
TG_ALWAYS_INLINE void tile_of_width(const int bf16, const int relu, const int in_place, const int kind,
                                    const tile_job *t, const float *restrict a, const float *restrict b, float *c,
                                    int64_t m_valid, int64_t n_valid, int64_t row0, int64_t col0) {
#define TG_TILE(nv, half) tile(nv, (half) && !bf16, bf16, relu, in_place, kind, t, a, b, c, m_valid, n_valid, row0, col0)
    TG_BY_TILE_WIDTH(n_valid, TG_TILE);
#undef TG_TILE
}

/* The tile kernels a job picks from (a tile_kernel each): A packed or in place, by epilogue; a bfloat16 product
 * packs A, and in-place rows with a relu (a prologue) take any epilogue. */
#define TG_TILE_KERNEL(name, bf16, relu, in_place, kind)                                                         \
    static void name(const tile_job *t, const float *restrict a, const float *restrict b, float *c,             \
                     int64_t m_valid, int64_t n_valid, int64_t row0, int64_t col0) {                            \
        tile_of_width(bf16, relu, in_place, kind, t, a, b, c, m_valid, n_valid, row0, col0);                     \
    }
TG_TILE_KERNEL(packed_affine, 0, 0, 0, TILE_AFFINE)
TG_TILE_KERNEL(packed_affine_residual, 0, 0, 0, TILE_AFFINE_RESIDUAL)
TG_TILE_KERNEL(packed_general, 0, 0, 0, TILE_GENERAL)
TG_TILE_KERNEL(packed_bf16, 1, 0, 0, TILE_GENERAL)
TG_TILE_KERNEL(in_place_affine, 0, 0, 1, TILE_AFFINE)
TG_TILE_KERNEL(in_place_affine_residual, 0, 0, 1, TILE_AFFINE_RESIDUAL)
TG_TILE_KERNEL(in_place_general, 0, 0, 1, TILE_GENERAL)
TG_TILE_KERNEL(in_place_relu, 0, 1, 1, TILE_GENERAL)
#undef TG_TILE_KERNEL

/* At most this many last columns (N % 16 of them) are computed by dot products along the reduction rather than by a
 * 16-column vector tile (dot_tail): with AVX-512's 64-column tiles an image of 7x7 output positions (49 = 3 * 16 + 1
 * columns) multiplied 64 columns for 49. On AVX2 a narrow last panel takes half a vector (HALF_TILES) instead. */
enum { DOT_TAIL_COLUMNS = HALF_TILES ? 0 : 4 };

/* c[0:TG_MR, 0:n] (+)= the epilogue `kind` of the rows of A read in place (a_rs apart, kc floats each) dotted with
 * each of the n (<= DOT_TAIL_COLUMNS) columns of `columns` (kc floats each, contiguous: dot_tail_columns). A tile
 * of TG_MR rows costs TG_MR * n vectors of products per 16 elements of the reduction, where a vector tile costs
 * TG_MR; the sums are put together as one vector per row, stored by store_tile with the vector tiles' epilogue. */
TG_ALWAYS_INLINE void dot_tail(const int n, const int kind, const tile_job *t, const float *restrict a,
                               const float *restrict columns, float *c, int64_t row0, int64_t col0) {
    const int64_t kc = t->kc, a_rs = t->a_rs;
    __m512 sums[TG_MR][DOT_TAIL_COLUMNS > 0 ? DOT_TAIL_COLUMNS : 1];
    _Pragma("GCC unroll 64") for (int i = 0; i < TG_MR; i++)
        _Pragma("GCC unroll 8") for (int j = 0; j < n; j++) sums[i][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k += 16) {
        __mmask16 mask = tg_tail_mask(kc - k);
        __m512 b[DOT_TAIL_COLUMNS > 0 ? DOT_TAIL_COLUMNS : 1];
        _Pragma("GCC unroll 8") for (int j = 0; j < n; j++) b[j] = _mm512_maskz_loadu_ps(mask, columns + j * kc + k);
        _Pragma("GCC unroll 64") for (int i = 0; i < TG_MR; i++) {
            __m512 ai = _mm512_maskz_loadu_ps(mask, a + i * a_rs + k);
            _Pragma("GCC unroll 8") for (int j = 0; j < n; j++) sums[i][j] = _mm512_fmadd_ps(ai, b[j], sums[i][j]);
        }
    }
    __m512 acc[TG_MR][TG_NV];
    _Pragma("GCC unroll 64") for (int i = 0; i < TG_MR; i++) {
        float row[16] = {0};
        _Pragma("GCC unroll 8") for (int j = 0; j < n; j++) row[j] = _mm512_reduce_add_ps(sums[i][j]);
        acc[i][0] = _mm512_loadu_ps(row);
    }
    store_tile(1, 0, kind, acc, t, c, TG_MR, n, row0, col0);
}

/* dot_tail for n_valid columns, each count its own kernel (constant loop bounds keep the sums in registers). */
TG_ALWAYS_INLINE void dot_tail_of_width(const int kind, const tile_job *t, const float *restrict a,
                                        const float *restrict columns, float *c, int64_t n_valid, int64_t row0,
                                        int64_t col0) {
    switch (n_valid) {
    case 1: dot_tail(1, kind, t, a, columns, c, row0, col0); break;
    case 2: dot_tail(2, kind, t, a, columns, c, row0, col0); break;
    case 3: dot_tail(3, kind, t, a, columns, c, row0, col0); break;
    default: dot_tail(4, kind, t, a, columns, c, row0, col0); break;
    }
}

/* The dot-product kernels a job picks from (tile_kernel's signature: m_valid is TG_MR, b the contiguous columns). */
#define TG_DOT_KERNEL(name, kind)                                                                                \
    static void name(const tile_job *t, const float *restrict a, const float *restrict b, float *c,             \
                     int64_t m_valid, int64_t n_valid, int64_t row0, int64_t col0) {                            \
        (void)m_valid;                                                                                          \
        dot_tail_of_width(kind, t, a, b, c, n_valid, row0, col0);                                               \
    }
TG_DOT_KERNEL(dot_affine, TILE_AFFINE)
TG_DOT_KERNEL(dot_affine_residual, TILE_AFFINE_RESIDUAL)
TG_DOT_KERNEL(dot_general, TILE_GENERAL)
#undef TG_DOT_KERNEL

/* ---------------------------------------------------------------- blocked driver */

typedef struct {
    int64_t m, n, k;
    const float *a;
    int64_t a_rs, a_cs;
    const float *b;
    const b_source *b_src;
    int64_t b_col0; /* B's column of this problem's column 0 (a band of columns packs from there) */
    float *c;
    int64_t c_rs;
    tg_epilogue ep;
    int32_t a_prologue, b_prologue, bf16;
    /* Columns tail_col..tail_col+tail_n (< one vector, relative to column 0), computed for rows tail_row_lo..
     * tail_row_hi only, with the A blocks packed for the band (see run_band). */
    int64_t tail_col, tail_n, tail_row_lo, tail_row_hi;
} gemm_problem;

static gemm_problem problem_at(const gemm_batch *g, int64_t index) {
    gemm_problem p = {g->m, g->n, g->k, g->a + index * g->a_bs, g->a_rs, g->a_cs, g->b + index * g->b_bs,
                      &g->b_src, 0, g->c + index * g->c_bs, g->c_rs, g->ep, g->a_prologue, g->b_prologue,
                      g->bf16, 0, 0, 0, 0};
    if (p.ep.bias) p.ep.bias += index * g->bias_bs;
    if (p.ep.residual) p.ep.residual += index * g->residual_bs;
    return p;
}

/* A packed B panel (kc x TG_NR) made ready for the micro-kernel: its prologue applied, then paired for bf16. */
static void finish_b_panel(const gemm_problem *p, float *panel, int64_t kc) {
    tg_activate_in_place(panel, TG_NR * kc, p->b_prologue);
    if (p->bf16) pair_rows_in_place(panel, kc, TG_NR);
}

/* The same for a packed block of A: ceil(mc / TG_MR) micro-panels of kc x TG_MR. */
static void finish_a_block(const gemm_problem *p, float *block, int64_t mc, int64_t kc) {
    tg_activate_in_place(block, ceil_div(mc, TG_MR) * TG_MR * kc, p->a_prologue);
    for (int64_t ir = 0; p->bf16 && ir < mc; ir += TG_MR) pair_rows_in_place(block + ir * kc, kc, TG_MR);
}

/* The job of a K block's tiles (tile_job), `ep` NULL before the last one; the tiles walk C along its rows or down
 * its columns. */
static tile_job tile_job_of(const gemm_problem *p, int64_t kc, int accumulate, const tg_epilogue *ep, int along_rows) {
    static tile_kernel *const packed[] = {packed_affine, packed_affine_residual, packed_general};
    static tile_kernel *const in_place[] = {in_place_affine, in_place_affine_residual, in_place_general};
    static tile_kernel *const in_place_dot[] = {dot_affine, dot_affine_residual, dot_general};
    int64_t rows = along_rows ? 0 : TG_MR, columns = along_rows ? TG_NR : 0;
    tile_job t = {.kc = kc, .a_rs = p->a_rs, .b_ks = TG_NR, .c_rs = p->c_rs, .next_c = rows * p->c_rs + columns,
                  .next_residual = ep ? rows * ep->residual_rs + columns : 0, .accumulate = accumulate, .ep = ep};
    enum tile_epilogue kind = p->bf16 || !tg_affine_of(ep, &t.affine) ? TILE_GENERAL
                              : t.affine.residual                     ? TILE_AFFINE_RESIDUAL
                                                                      : TILE_AFFINE;
    t.packed = p->bf16 ? packed_bf16 : packed[kind];
    t.in_place = p->a_prologue ? in_place_relu : in_place[kind];
    t.in_place_dot = DOT_TAIL_COLUMNS && !p->a_prologue && !p->bf16 ? in_place_dot[kind] : NULL;
    return t;
}

/* Whether the full micro-panels of A's row blocks are read in place rather than packed (the rows past the last
 * full one are packed still): for row-major A with no bfloat16 rounding and no prologue but a relu (taken as each
 * element is read: once for a single panel, such as a 10-class head's), when the B panels that read
 * each block hold at most A_IN_PLACE_COLUMNS columns. Packing is a pass over A (a transpose) that only its reuse by
 * many panels pays back: on AVX2 (16-column panels) reading a conv's weights in place against 13x13 and 14x14
 * images (11 and 13 panels) ran 5-8% faster than packing them, against 28x28 (49 panels) alike (bench/NOTES.md). */
enum { A_IN_PLACE_COLUMNS = 256 };

static int a_read_in_place(const gemm_problem *p, int64_t panels) {
    int prologue_once = p->a_prologue == TG_ACT_RELU && panels == 1;
    return p->a_cs == 1 && (!p->a_prologue || prologue_once) && !p->bf16 && panels * TG_NR <= A_IN_PLACE_COLUMNS;
}

/* Whether the whole panels of B are multiplied where B lies rather than packed (a last partial panel is packed
 * still): for plain rows of B that few enough row tiles read, or a pointwise conv's image (`rows_in_place`). Each
 * row tile reads the panel's kc rows again, from cache, where packing would have copied them once: with few rows
 * of A (a squeeze layer's 16 output channels) the copy is a large part of the work, and in a whole model, where
 * images lie in the arena's huge pages, ResNet-50's 1x1 convs (64 to 2048 output channels) ran 5-13% faster
 * reading them in place. A matrix in 4 KiB pages with rows far apart (96 x 64 x 50000) ran 17% slower: each of a
 * panel's rows is a page of its own (bench/NOTES.md). */
enum { B_IN_PLACE_ROWS = 32 };

static int b_read_in_place(const gemm_problem *p) {
    return p->b_src->pack == tg_pack_b_strided && p->b_src->cs == 1 && !p->b_prologue && !p->bf16 &&
           (p->m <= B_IN_PLACE_ROWS || p->b_src->rows_in_place);
}

/* Whether panel `panel` of a block of nc columns is multiplied in place: a whole one, of a B read in place. */
static int panel_in_place(int b_in_place, int64_t panel, int64_t nc) { return b_in_place && (panel + 1) * TG_NR <= nc; }

/* The kc floats of each of the TG_MR rows from `a` (a stride apart) into L2: the next row tile's rows of A read in
 * place, fetched while the current tile multiplies, when the first panel of a block is the first to read them. A
 * layer's weights in a whole model come from memory (ResNet-50's 100 MB pass through L3 between two calls), in
 * short runs (a block's kc floats per row) the hardware prefetcher starts on late: ResNet-50 at batch 1 ran 3%
 * faster, Inception v1 7% (bench/NOTES.md). Into L2, not L1: there they crowded the tile's own B panel (7x7 layers
 * 3-4% slower). */
static void prefetch_rows(const float *a, int64_t rs, int64_t kc) {
    for (int64_t i = 0; i < TG_MR; i++)
        for (int64_t k = 0; k < kc; k += 16) _mm_prefetch((const char *)(a + i * rs + k), _MM_HINT_T1);
}

/* The most rows a row block holds: TG_MC in whole micro-panels (row_block rounds up to them). */
enum { A_BLOCK_ROWS = (TG_MC + TG_MR - 1) / TG_MR * TG_MR };

/* Row block size: at most A_BLOCK_ROWS, and a count of blocks that divides evenly among the threads. */
static int64_t row_block(int64_t m, int nthreads) {
    int64_t blocks = ceil_div(ceil_div(m, TG_MC), nthreads) * nthreads;
    return ceil_div(ceil_div(m, blocks), TG_MR) * TG_MR;
}

/* Work is handed out by counters, not by a fixed split, so a thread the OS deschedules does not hold back the
 * others: they take its share of panels and blocks. next[phase][step parity]: phase 0 packs B panels, phase 1
 * runs row blocks; a step's counters are reset during the next step, when no thread can still be using them. */
typedef struct {
    int64_t next[2][2];
} work_counters;

static int64_t claim(int64_t *counter, int nthreads) {
    return nthreads > 1 ? __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED) : (*counter)++;
}

/* Packs B panel `panel` (columns jc + panel * TG_NR on, of nc) of K block pc..pc+kc into dst, ready to multiply. */
static void pack_b_panel(const gemm_problem *p, int64_t pc, int64_t kc, int64_t jc, int64_t nc, int64_t panel,
                         float *dst) {
    p->b_src->pack(p->b_src, p->b, pc, kc, p->b_col0 + jc + panel * TG_NR, min_i64(TG_NR, nc - panel * TG_NR), dst);
    finish_b_panel(p, dst, kc);
}

/* `p` with its last N % 16 columns as the tail that dot_tail computes, where they are few (DOT_TAIL_COLUMNS) and
 * its full micro-panels of A would be read in place (a_read_in_place, counting the tail's panel); else `p`. */
static gemm_problem with_dot_tail(const gemm_problem *p) {
    gemm_problem split = *p;
    int64_t columns = p->n % 16, panels = ceil_div(min_i64(TG_NC, p->n), TG_NR);
    if (p->tail_n || p->n < 16 || columns == 0 || columns > DOT_TAIL_COLUMNS || p->a_prologue ||
        !a_read_in_place(p, panels))
        return split;
    split.n = p->n - columns, split.tail_col = split.n, split.tail_n = columns;
    split.tail_row_lo = 0, split.tail_row_hi = p->m;
    return split;
}

/* Below this K a tile stores C about as fast as it computes it, so the tiles walk C along its rows (each row's
 * lines in order, which the prefetcher follows) rather than down a column of panels (a new line of a new row for
 * every tile, waiting for it). */
enum { SHORT_REDUCTION = 32 };

/* One problem, run by all `nthreads` threads of the team together (nthreads == 1: by one thread alone); `step`
 * is the calling thread's count of steps so far, the same in every thread. A team packs the B panels of a block
 * first, then shares them; a thread alone packs each panel just before the first row block multiplies it, so the
 * micro-kernels find it in L1 instead of coming back for it after the whole block was written (to L3, for a
 * wide block), and with a single row block every panel takes the same place in one buffer; but along C's rows
 * (a short reduction) each row of tiles needs every panel, so it packs them first as a team does. */
static void gemm_blocks(const gemm_problem *problem, float *b_pack, float *a_pack, int tid, int nthreads,
                        work_counters *work, int64_t *step) {
    const gemm_problem split = with_dot_tail(problem), *p = &split;
    int64_t mc = row_block(p->m, nthreads), m_blocks = ceil_div(p->m, mc);
    int64_t k_blocks = p->k > 0 ? ceil_div(p->k, TG_KC) : 1, k_step = ceil_div(ceil_div(p->k, k_blocks), 8) * 8;
    int64_t n_split = m_blocks % nthreads == 0 ? 1 : nthreads, units = m_blocks * n_split;
    int along_rows = p->k < SHORT_REDUCTION, lazy = nthreads == 1 && !along_rows, one_slot = lazy && m_blocks == 1;
    int b_in_place = b_read_in_place(p);
    for (int64_t jc = 0; jc < p->n; jc += TG_NC) {
        int64_t nc = min_i64(TG_NC, p->n - jc), panels = ceil_div(nc, TG_NR);
        for (int64_t kb = 0; kb < k_blocks; kb++, (*step)++) {
            int64_t pc = kb * k_step, kc = min_i64(k_step, p->k - pc), parity = *step & 1;
            for (int64_t panel; !lazy && (panel = claim(&work->next[0][parity], nthreads)) < panels;)
                if (!panel_in_place(b_in_place, panel, nc))
                    pack_b_panel(p, pc, kc, jc, nc, panel, b_pack + panel * TG_NR * kc);
            tile_job job = tile_job_of(p, kc, kb > 0, kb == k_blocks - 1 ? &p->ep : NULL, along_rows);
            tile_job b_job = job; /* B's whole panels read in place */
            b_job.b_ks = p->b_src->rs;
            const float *b_rows = p->b + pc * p->b_src->rs + p->b_col0 + jc;
            float *tail_pack = b_pack + (one_slot ? 1 : panels) * TG_NR * kc, *tail_columns = tail_pack + TG_NR * kc;
            int tail = jc == 0 && p->tail_n > 0, dot = tail && p->tail_n <= DOT_TAIL_COLUMNS && job.in_place_dot;
            if (tail && tid == 0) { /* a team shares it: packed once, before the barrier */
                p->b_src->pack(p->b_src, p->b, pc, kc, p->b_col0 + p->tail_col, p->tail_n, tail_pack);
                finish_b_panel(p, tail_pack, kc);
                for (int64_t j = 0; dot && j < p->tail_n; j++)
                    for (int64_t k = 0; k < kc; k++) tail_columns[j * kc + k] = tail_pack[k * TG_NR + j];
            }
            if (nthreads > 1) {
#pragma omp barrier
            }
            if (tid == 0 || nthreads == 1) work->next[0][!parity] = work->next[1][!parity] = 0;
            int64_t packed_block = -1, in_place = a_read_in_place(p, panels / n_split + tail);
            for (int64_t unit; (unit = claim(&work->next[1][parity], nthreads)) < units;) {
                int64_t block = unit / n_split, part = unit % n_split;
                int64_t ic = block * mc, mcur = min_i64(mc, p->m - ic), packed = in_place ? mcur / TG_MR * TG_MR : 0;
                const float *a_block = p->a + ic * p->a_rs + pc * p->a_cs;
                if (block != packed_block) {
                    tg_pack_a(a_block + packed * p->a_rs, p->a_rs, p->a_cs, mcur - packed, kc, a_pack + packed * kc);
                    finish_a_block(p, a_pack + packed * kc, mcur - packed, kc);
                }
                packed_block = block;
#define TG_TILE_AT(j, ir, ...)                                                                                    \
    ((ir) < packed ? (j).in_place : (j).packed)(&(j), (ir) < packed ? a_block + (ir) * p->a_rs : a_pack + (ir) * kc, \
                                                __VA_ARGS__)
                int64_t first = part * panels / n_split, count = (part + 1) * panels / n_split - first;
                int64_t sweeps = ceil_div(mcur, TG_MR), tiles = count * sweeps;
                for (int64_t tile = 0; tile < tiles; tile++) {
                    int64_t panel = first + (along_rows ? tile % count : tile / sweeps);
                    int64_t ir = (along_rows ? tile / count : tile % sweeps) * TG_MR, jr = jc + panel * TG_NR;
                    int whole_in_place = panel_in_place(b_in_place, panel, nc);
                    float *b_panel = b_pack + (one_slot ? 0 : panel) * TG_NR * kc;
                    if (lazy && block == 0 && ir == 0 && !whole_in_place)
                        pack_b_panel(p, pc, kc, jc, nc, panel, b_panel);
                    if (panel == first && ir + 2 * TG_MR <= packed)
                        prefetch_rows(a_block + (ir + TG_MR) * p->a_rs, p->a_rs, kc);
                    if (whole_in_place)
                        TG_TILE_AT(b_job, ir, b_rows + panel * TG_NR, p->c + (ic + ir) * p->c_rs + jr, mcur - ir,
                                   p->n - jr, ic + ir, jr);
                    else
                        TG_TILE_AT(job, ir, b_panel, p->c + (ic + ir) * p->c_rs + jr, mcur - ir, p->n - jr, ic + ir,
                                   jr);
                }
                for (int64_t ir = 0; tail && part == 0 && ir < mcur; ir += TG_MR) { /* once per row block */
                    int64_t rows = min_i64(mcur - ir, p->tail_row_hi - ic - ir);
                    float *c_tail = p->c + (ic + ir) * p->c_rs + p->tail_col;
                    if (ic + ir < p->tail_row_lo || rows <= 0) continue;
                    if (dot && ir < packed && rows >= TG_MR)
                        job.in_place_dot(&job, a_block + ir * p->a_rs, tail_columns, c_tail, TG_MR, p->tail_n,
                                         ic + ir, p->tail_col);
                    else
                        TG_TILE_AT(job, ir, tail_pack, c_tail, rows, p->tail_n, ic + ir, p->tail_col);
                }
#undef TG_TILE_AT
            }
            if (nthreads > 1) {
#pragma omp barrier
            }
        }
    }
}

/* B panels for one block, one more for the last partial vector's columns (see run_band, with_dot_tail), and those
 * columns one after another (dot_tail). */
static size_t b_pack_count(const gemm_batch *g) {
    return (size_t)TG_KC * ((ceil_div(min_i64(TG_NC, g->n), TG_NR) + (g->n % 16 != 0)) * TG_NR + DOT_TAIL_COLUMNS);
}

static const size_t a_pack_count = (size_t)A_BLOCK_ROWS * TG_KC;

/* Whether a batch runs one problem per thread: enough problems to share out evenly, or small ones. */
static int batch_in_parallel(const gemm_batch *g, int nthreads) {
    if (g->batch < nthreads) return 0;
    if (g->batch % nthreads == 0 || g->batch >= 4 * nthreads) return 1;
    return (double)g->m * g->n * g->k < 1 << 22;
}

enum band_split { SHARED_TEAM, ROW_BANDS, COLUMN_BANDS };

/* How a problem's threads share it. Bands need no synchronization, but each thread packs all of the operand the
 * bands do not split: B for row bands, A for column bands. So wide problems (N > M, B the larger operand to
 * pack) split their columns: for 256 x 1024 x 1024 row bands packed all 4 MiB of B in each thread. An operand
 * with a prologue costs its activation each time it is packed, so the bands split it when they can, and so does
 * an implicit im2col B (its packing gathers the columns from the image). */
static enum band_split band_split(const gemm_batch *g, int team) {
    int rows = g->m >= 2 * TG_MR * team, columns = g->n >= 2 * TG_NR * team;
    int costly_b = g->b_prologue || g->b_src.conv;
    if (rows && g->a_prologue && !costly_b) return ROW_BANDS;
    if (columns && (g->n > g->m || !rows || (costly_b && !g->a_prologue))) return COLUMN_BANDS;
    return rows ? ROW_BANDS : SHARED_TEAM;
}

/* Columns lo..hi (or rows) of a problem as a problem of its own, with bias and residual following. */
static gemm_problem slice_of(gemm_problem p, enum band_split split, int64_t lo, int64_t hi) {
    if (split == COLUMN_BANDS) {
        p.n = hi - lo, p.b_col0 += lo, p.c += lo;
        if (p.ep.bias) p.ep.bias += lo * p.ep.bias_cs;
        if (p.ep.residual) p.ep.residual += lo;
    } else {
        p.m = hi - lo, p.a += lo * p.a_rs, p.c += lo * p.c_rs;
        if (p.ep.bias) p.ep.bias += lo * p.ep.bias_rs;
        if (p.ep.residual) p.ep.residual += lo * p.ep.residual_rs;
    }
    return p;
}

/* Part `part` of `parts` of 0..extent, cut at multiples of `unit`. */
static void band_bounds(int64_t extent, int64_t unit, int part, int parts, int64_t *lo, int64_t *hi) {
    *lo = extent * part / parts / unit * unit;
    *hi = part == parts - 1 ? extent : extent * (part + 1) / parts / unit * unit;
}

/* Band `part` of `parts` of a problem: rows in multiples of TG_MR, or whole 16-column vectors. */
static gemm_problem band_of(const gemm_problem *p, enum band_split split, int part, int parts) {
    int64_t lo, hi;
    if (split == COLUMN_BANDS)
        band_bounds(p->n / 16 * 16, 16, part, parts, &lo, &hi);
    else
        band_bounds(p->m, TG_MR, part, parts, &lo, &hi);
    return slice_of(*p, split, lo, hi);
}

/* Runs band `part` of a problem in the calling thread alone. Column bands hold whole vectors; the last partial
 * vector (N % 16 columns) is split by rows and computed by each thread with the A blocks of its band: given to
 * one band whole, it would run one more register-tile vector than the others (2 threads, N = 392: 13 vectors
 * against 12, 8% longer), and as a problem of its own it would pack A once more. */
static void run_band(const gemm_problem *p, enum band_split split, int part, int parts, float *b_pack,
                     float *a_pack) {
    gemm_problem band = band_of(p, split, part, parts);
    if (split == COLUMN_BANDS && p->n % 16) {
        band.tail_col = p->n / 16 * 16 - (band.b_col0 - p->b_col0), band.tail_n = p->n % 16;
        band_bounds(p->m, TG_MR, part, parts, &band.tail_row_lo, &band.tail_row_hi);
    }
    work_counters alone = {{{0}}};
    int64_t step = 0;
    if (band.m > 0 && band.n > 0) gemm_blocks(&band, b_pack, a_pack, 0, 1, &alone, &step);
}

static _Atomic int64_t path_counts[2]; /* tg_gemm_path_counts */

/* A residual that is C itself (gemm.h), where the blocked driver would store partial sums over it (more than one
 * K block: gemm_blocks) before its last block reads it: copied first, into scratch the calling thread keeps up to
 * RESIDUAL_KEPT floats; whether there was memory for it. The few-row kernel (gemv.c) sums the whole reduction
 * before it stores: it reads the residual where it lies. */
static _Thread_local tg_scratch residual_scratch;
enum { RESIDUAL_KEPT = 4 << 20 };

static int residual_apart(gemm_batch *g) {
    if (!g->ep.residual || g->ep.residual != g->c || g->k <= TG_KC) return 1;
    float *copy = tg_scratch_reserve(&residual_scratch, (size_t)(g->batch * g->m * g->n));
    if (!copy) return 0;
    for (int64_t index = 0; index < g->batch; index++)
        for (int64_t i = 0; i < g->m; i++)
            memcpy(copy + (index * g->m + i) * g->n, g->ep.residual + index * g->residual_bs + i * g->ep.residual_rs,
                   sizeof(float) * (size_t)g->n);
    g->ep.residual = copy, g->ep.residual_rs = g->n, g->residual_bs = g->m * g->n;
    return 1;
}

/* A product of more rows than the few-row kernel takes (gemv.c, which reads B in place), by the blocked driver, in
 * one of three ways to use the threads, cheapest synchronization first:
 *  - a batch of small problems: one problem per thread at a time;
 *  - large problems: each thread takes a band of rows (or of columns, see band_split) and packs its own copy
 *    of B (of A), with no synchronization at all (that operand is packed once per thread instead of once, a few
 *    percent; measured on a shared machine, barriers cost far more whenever the OS deschedules one thread);
 *  - problems too small in both M and N for bands: the whole team shares the packed B (blocks handed out by
 *    counters, two barriers per K block). */
static int run_blocked(const gemm_batch *g) {
    int nthreads = omp_get_max_threads();
    int team = nthreads > 1 && (double)g->batch * g->m * g->n * g->k >= 1 << 18 ? nthreads : 1; /* ~5 us of work */
    enum band_split split = band_split(g, team);
    int one_per_thread = team > 1 && batch_in_parallel(g, team), bands = team > 1 && split != SHARED_TEAM;
    size_t per_thread = b_pack_count(g) + a_pack_count;
    float *packs = tg_scratch_reserve(&pack_scratch, one_per_thread || bands ? per_thread * team
                                                                          : b_pack_count(g) + a_pack_count * team);
    if (!packs) return TG_GEMM_NO_MEMORY;
    if (one_per_thread) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
        for (int64_t index = 0; index < g->batch; index++) {
            float *b_pack = packs + per_thread * omp_get_thread_num();
            gemm_problem p = problem_at(g, index);
            work_counters alone = {{{0}}};
            int64_t step = 0;
            gemm_blocks(&p, b_pack, b_pack + b_pack_count(g), 0, 1, &alone, &step);
        }
        return TG_GEMM_OK;
    }
    work_counters shared = {{{0}}};
#pragma omp parallel num_threads(team)
    {
        /* The team may be smaller than asked for (a call from inside another parallel region). */
        int tid = omp_get_thread_num(), size = omp_get_num_threads();
        int64_t step = 0;
        for (int64_t index = 0; index < g->batch; index++) {
            gemm_problem p = problem_at(g, index);
            if (bands) {
                float *b_pack = packs + per_thread * tid;
                run_band(&p, split, tid, size, b_pack, b_pack + b_pack_count(g));
            } else {
                gemm_blocks(&p, packs, packs + b_pack_count(g) + a_pack_count * tid, tid, size, &shared, &step);
            }
        }
    }
    return TG_GEMM_OK;
}

int tg_run_gemm_batch(const gemm_batch *batch) {
    if (batch->m <= 0 || batch->n <= 0 || batch->batch <= 0) return TG_GEMM_OK;
    int few_rows = tg_gemv_fits(batch);
    path_counts[!few_rows]++;
    if (few_rows) return tg_run_gemv(batch);
    gemm_batch apart = *batch;
    int status = residual_apart(&apart) ? run_blocked(&apart) : TG_GEMM_NO_MEMORY;
    tg_scratch_trim(&residual_scratch, RESIDUAL_KEPT);
    return status;
}

/* ---------------------------------------------------------------- public entry */

int tg_gemm_f32(TG_GEMM_PARAMS) {
    gemm_batch g;
    int status = tg_describe_gemm(&g, tg_pack_b_strided, TG_GEMM_ARGS);
    return status ? status : tg_run_gemm_batch(&g);
}

/* A bfloat16 product: operands rounded while packed, the result rounded after the epilogue (`rounded`) or not. */
static int gemm_bf16(int rounded, TG_GEMM_PARAMS) {
    gemm_batch g;
    int status = tg_describe_gemm(&g, tg_pack_b_strided, TG_GEMM_ARGS);
    g.bf16 = 1, g.ep.round_bf16 = rounded;
    return status ? status : tg_run_gemm_batch(&g);
}

int tg_gemm_bf16(TG_GEMM_PARAMS) { return gemm_bf16(1, TG_GEMM_ARGS); }

int tg_gemm_bf16_f32(TG_GEMM_PARAMS) { return gemm_bf16(0, TG_GEMM_ARGS); }

void tg_gemm_path_counts(int64_t out[2]) {
    out[0] = path_counts[0];
    out[1] = path_counts[1];
}

void tg_gemm_config(int64_t out[5]) {
    out[0] = TG_MR;
    out[1] = TG_NR;
    out[2] = TG_MC;
    out[3] = TG_KC;
    out[4] = TG_NC;
}
