/* Fused attention (see attention.h for the contract).
 *
 * Written with GCC vector extensions of LANES floats, one register of the target (16 with AVX-512, else 8: an AVX2
 * register; gcc splits wider vectors into pieces it keeps in memory, and compares them lane by lane, which made the
 * kernel 3-4x slower there), so one source is both the fast and the portable kernel.
 *
 * Every tile is packed into zero-padded scratch (BQ or BK rows, head dims rounded up to LANES floats), so the tile
 * products always run on whole registers; padded keys score -inf, padded query rows are never stored, and
 * their zero dout rows add nothing to the gradients.
 *
 * The scale multiplies the product q k^T, not q: a product that overflows is infinite, as torch's.
 *
 * Forward: parallel over (batch*head, query tile); per key tile, S^T = scale * K Q^T (+ mask) with the queries
 * in vector lanes, each query's running max m and sum l (online softmax), O = O * exp(m_old - m_new) + P V;
 * lse = m + log(l).
 * Backward: parallel over batch*head (and chunks of its key tiles when there are few heads per thread), the
 * head's q and dout packed once; per key tile j (outer) and query tile i: P = exp(S - lse), dP = dO V^T,
 * dS = P * (dP - D) with D = rowsum(dO * O), dV_j += P^T dO, dK_j += scale dS^T Q, and dQ_i += scale dS K_j into
 * a per-item accumulator, stored once per head (added under a lock when a head is split into key chunks).
 *
 * The bfloat16 variants run every tile product on pairs of bfloat16 values (VDPBF16PS where the CPU has it: two
 * exact products added per lane): each operand is rounded to bfloat16 as it is paired (pair_rows, pair_columns),
 * the sums stay float32, and so do the softmax, its running max and sum, lse and D. */
#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512BF16__
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#define BQ 64 /* queries per tile */
#define BK 64 /* keys per tile */
/* Floats per vector, and vectors per row of a tile product's register tile: 6 x 4 x 16 fill AVX-512's 32 registers,
 * 6 x 2 x 8 twelve of AVX2's 16. */
#ifdef __AVX512F__
#define LANES 16
#define TILE_NV 4
#define EVEN_LANES {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}
#define IOTA {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
#define ZIP_LOW {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23}
#else
#define LANES 8
#define TILE_NV 2
#define EVEN_LANES {0, 2, 4, 6, 8, 10, 12, 14}
#define IOTA {0, 1, 2, 3, 4, 5, 6, 7}
#define ZIP_LOW {0, 8, 1, 9, 2, 10, 3, 11}
#endif

typedef float vfloat __attribute__((vector_size(4 * LANES)));
typedef int32_t vint __attribute__((vector_size(4 * LANES)));
typedef float vfloat_unaligned __attribute__((vector_size(4 * LANES), aligned(4)));

static inline vfloat load(const float *p) { return *(const vfloat_unaligned *)p; }
static inline void store(float *p, vfloat x) { *(vfloat_unaligned *)p = x; }
/* x - 0, not 0 + x: the same value for every x (-0 included), so gcc broadcasts x itself, from memory where x is
 * loaded; 0 + x (which turns -0 into +0) costs a scalar add before every broadcast of the tile products. */
static inline vfloat splat(float x) { return x - (vfloat){0}; }
static inline vfloat pick(vint mask, vfloat a, vfloat b) { return (vfloat)((mask & (vint)a) | (~mask & (vint)b)); }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* ---------------------------------------------------------------- bfloat16 pairs */

typedef uint32_t vword __attribute__((vector_size(4 * LANES)));

/* x rounded to the nearest bfloat16 (ties to even), as float bits with a zero low half; a NaN stays a NaN
 * (quieted), as gemm's tg_bf16_bits. */
static inline vword bf16_bits(vfloat x) {
    vword bits = (vword)x, rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
    vword nan = (vword)(x != x);
    return ((nan & (bits | 0x00400000u)) | (~nan & rounded)) & 0xFFFF0000u;
}

/* A pair of bfloat16 values in one 32-bit word: element 2p in the low half, 2p + 1 in the high half (VDPBF16PS's
 * operand layout). Pairs are kept in float arrays, as the float whose bits they are. */
static inline vfloat pair_of(vword low, vword high) { return (vfloat)(high | (low >> 16)); }

/* In place: rows 2p and 2p + 1 (of n floats, rows ld apart) become row p of n pairs (rows ld apart), for
 * rows 0..rows (an odd last row pairs with zeros). Row p is written after rows 2p and 2p + 1 are read. */
static void pair_rows(float *x, int64_t ld, int64_t rows, int64_t n) {
    for (int64_t p = 0; p < (rows + 1) / 2; p++)
        for (int64_t j = 0; j < n; j += LANES) {
            vword low = bf16_bits(load(x + 2 * p * ld + j));
            vword high = 2 * p + 1 < rows ? bf16_bits(load(x + (2 * p + 1) * ld + j)) : (vword){0};
            store(x + p * ld + j, pair_of(low, high));
        }
}

/* In place: columns 2p and 2p + 1 of each row (cols floats, a multiple of LANES, rows ld apart) become pair p of
 * the row (cols / 2 pairs, rows ld apart). Each pair lands at or before the floats still to be read. */
static void pair_columns(float *x, int64_t ld, int64_t rows, int64_t cols) {
    const vword evens = EVEN_LANES;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c += 2 * LANES) {
            float *row = x + r * ld;
            vword a = bf16_bits(load(row + c));
            vword b = c + LANES < cols ? bf16_bits(load(row + c + LANES)) : (vword){0};
            vfloat pairs = pair_of(__builtin_shuffle(a, b, evens), __builtin_shuffle(a, b, evens + 1));
            if (c + LANES < cols)
                store(row + c / 2, pairs);
            else
                memcpy(row + c / 2, &pairs, sizeof(float) * LANES / 2);
        }
}

/* acc + the products of a's and b's pairs, lane by lane (the high halves' product first, as VDPBF16PS). */
static inline vfloat dot_pairs(vfloat acc, vfloat a, vfloat b) {
#ifdef __AVX512BF16__
    return (vfloat)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b);
#else
    const vword high = (vword){0} + 0xFFFF0000u;
    acc += (vfloat)((vword)a & high) * (vfloat)((vword)b & high);
    return acc + (vfloat)((vword)a << 16) * (vfloat)((vword)b << 16);
#endif
}

/* 2^x for x <= 127 (a score minus the max or the logsumexp: at most a rounding error above 0), as the generated
 * programs' tg_exp2f (c_preamble.h) in that range: <= 1 ulp; but 0 below -126, where the weight is below float's
 * normal range and so below any sum's ulp; NaN stays NaN. The exponent is added to the polynomial's bits
 * (exact for those x), not built and multiplied in twice as tg_exp2f's wider range needs: fewer operations in
 * the softmax's inner loops. */
static inline vfloat vexp2(vfloat x) {
    vfloat k = (x + 12582912.0f) - 12582912.0f;
    vfloat f = x - k;
    vfloat p = splat(1.53375804e-4f);
    p = p * f + 1.33998658e-3f;
    p = p * f + 9.61851981e-3f;
    p = p * f + 5.55032901e-2f;
    p = p * f + 2.40226462e-1f;
    p = p * f + 6.93147182e-1f;
    p = p * f + 1.0f;
    vint n = __builtin_convertvector(k, vint); /* a NaN's is INT_MIN: adds 0 to the NaN's bits */
    return pick(x < splat(-126.0f), splat(0.0f), (vfloat)((vint)p + (n << 23)));
}

#define LOG2E 1.44269504088896341f

/* x, which gcc must hold in a register: else it folds the loads of b's vectors into the multiply-adds of blocks
 * of fewer than 6 rows, loading each vector once per row, and the 4-row block of a 64-row tile ran no faster
 * than a 6-row one (loads, not multiply-adds, bound it). */
static inline vfloat in_register(vfloat x) {
#ifdef __AVX__
    __asm__("" : "+v"(x));
#endif
    return x;
}

/* c (mr x LANES nv) = scale a b when `zero`, else c += a b (scale 1), for a (mr x kk, element (r, x) at
 * a[r*ars + x*aks]) and b (kk x LANES nv, rows ldb apart); with `bf16` kk counts pairs, and a and b hold pairs (a
 * pair of a broadcast, times a vector of b's pairs). The scale multiplies the rounded product (not a, see the
 * top). */
static inline __attribute__((always_inline)) void tile_block(const int mr, const int nv, const int bf16, int64_t kk,
                                                             const float *a, int64_t ars, int64_t aks,
                                                             const float *b, int64_t ldb, float *c, int64_t ldc,
                                                             int zero, float scale) {
    vfloat acc[6][4];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = zero ? splat(0.0f) : load(c + r * ldc + LANES * v);
    for (int64_t x = 0; x < kk; x++) {
        vfloat bv[4];
        for (int v = 0; v < nv; v++) bv[v] = in_register(load(b + x * ldb + LANES * v));
        for (int r = 0; r < mr; r++) {
            vfloat av = splat(a[r * ars + x * aks]);
            for (int v = 0; v < nv; v++) acc[r][v] = bf16 ? dot_pairs(acc[r][v], av, bv[v]) : acc[r][v] + av * bv[v];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < nv; v++) store(c + r * ldc + LANES * v, zero ? acc[r][v] * scale : acc[r][v]);
}

#define BLOCK(MR, NV)                                                                      \
    case (MR) * 8 + (NV):                                                                  \
        if (bf16)                                                                          \
            tile_block(MR, NV, 1, kk, ai, ars, aks, bj, ldb, cij, ldc, zero, scale);       \
        else                                                                               \
            tile_block(MR, NV, 0, kk, ai, ars, aks, bj, ldb, cij, ldc, zero, scale);       \
        break;
#define BLOCKS(MR) BLOCK(MR, 1) BLOCK(MR, 2) BLOCK(MR, 3) BLOCK(MR, 4)

/* c (m x n) = scale a (m x kk) b (kk x n) when `zero`, else c += a b; n a multiple of LANES (padded tiles); with
 * `bf16`, of pairs (tile_block). */
static void tile_gemm(int bf16, int64_t m, int64_t n, int64_t kk, const float *a, int64_t ars, int64_t aks,
                      const float *b, int64_t ldb, float *c, int64_t ldc, int zero, float scale) {
    for (int64_t j = 0; j < n; j += TILE_NV * LANES) {
        int nv = (int)min64(TILE_NV, (n - j) / LANES);
        for (int64_t i = 0; i < m; i += 6) {
            int mr = (int)min64(6, m - i);
            const float *ai = a + i * ars, *bj = b + j;
            float *cij = c + i * ldc + j;
            switch (mr * 8 + nv) {
                BLOCKS(1) BLOCKS(2) BLOCKS(3) BLOCKS(4) BLOCKS(5) BLOCKS(6)
            }
        }
    }
}

typedef struct {
    int64_t heads, l, s, e, ev, dp, dv;
    const float *q, *k, *v;
    int64_t q_bs, q_hs, q_rs, k_bs, k_hs, k_rs, v_bs, v_hs, v_rs;
    tg_attention_mask mask;
    int32_t causal;
    float scale;
    int32_t bf16; /* tile products on bfloat16 pairs */
} problem;

/* The reduction length of a tile product over n floats: n, or its pairs for bfloat16 (an odd n's last pairs with
 * the zero padding). */
static inline int64_t reduced(const problem *p, int64_t n) { return p->bf16 ? (n + 1) / 2 : n; }

/* rows x cols of src (rows rs apart) into dst (BQ or BK rows of ld floats), zero elsewhere (only there: zeroing
 * the whole tile first wrote it twice, a tenth of the forward at T 128). */
static void pack_rows(float *dst, int64_t ld, int64_t tile_rows, const float *src, int64_t rs, int64_t rows,
                      int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        memcpy(dst + r * ld, src + r * rs, sizeof(float) * cols);
        memset(dst + r * ld + cols, 0, sizeof(float) * (ld - cols));
    }
    memset(dst + rows * ld, 0, sizeof(float) * (tile_rows - rows) * ld);
}

/* v[c] lane r = v[r] lane c before: log2(LANES) rounds of interleaving row i with row i + LANES / 2. */
static inline void transpose(vfloat v[LANES]) {
    const vint low = ZIP_LOW, high = low + LANES / 2;
    vfloat t[LANES];
    for (int round = 1; round < LANES; round *= 2) {
        for (int i = 0; i < LANES / 2; i++) {
            t[2 * i] = __builtin_shuffle(v[i], v[i + LANES / 2], low);
            t[2 * i + 1] = __builtin_shuffle(v[i], v[i + LANES / 2], high);
        }
        memcpy(v, t, sizeof t);
    }
}

/* The transpose of rows x cols of src into dst (ld rows of `width` floats, element (col, row)), zero elsewhere. */
static void pack_transposed(float *dst, int64_t ld, int64_t width, const float *src, int64_t rs, int64_t rows,
                            int64_t cols) {
    for (int64_t c = 0; c < cols; c++) memset(dst + c * width + rows, 0, sizeof(float) * (width - rows));
    memset(dst + cols * width, 0, sizeof(float) * (ld - cols) * width);
    int64_t whole_rows = rows / LANES * LANES, whole_cols = cols / LANES * LANES;
    for (int64_t r0 = 0; r0 < whole_rows; r0 += LANES)
        for (int64_t c0 = 0; c0 < whole_cols; c0 += LANES) {
            vfloat v[LANES];
            for (int i = 0; i < LANES; i++) v[i] = load(src + (r0 + i) * rs + c0);
            transpose(v);
            for (int c = 0; c < LANES; c++) store(dst + (c0 + c) * width + r0, v[c]);
        }
    for (int64_t r = 0; r < rows; r++) /* the edges */
        for (int64_t c = r < whole_rows ? whole_cols : 0; c < cols; c++) dst[c * width + r] = src[r * rs + c];
}

/* -1 (true) or 0 for each of LANES bytes of a bool mask. */
static inline vint keep_lanes(const uint8_t *d) {
    typedef uint8_t vbyte __attribute__((vector_size(LANES)));
    vbyte bytes;
    memcpy(&bytes, d, LANES);
    return __builtin_convertvector(bytes, vint) != 0;
}

/* x with the mask's values for LANES lanes, from element `at` of the mask on, `step` apart, applied (a bool mask's
 * false gives -inf, a float mask is added); lanes from `valid` on are not read (and get -inf, or 0 added). */
static inline vfloat apply_mask(const tg_attention_mask *m, int64_t at, int64_t step, int64_t valid, vfloat x) {
    if (m->kind == TG_MASK_BOOL) {
        const uint8_t *d = (const uint8_t *)m->data + at;
        vint keep;
        if (step == 0 && valid >= LANES) {
            keep = (vint){0} - (d[0] != 0);
        } else if (step == 1 && valid >= LANES) {
            keep = keep_lanes(d);
        } else {
            int32_t lanes[LANES] = {0};
            for (int64_t i = 0; i < min64(valid, LANES); i++) lanes[i] = -(d[i * step] != 0);
            memcpy(&keep, lanes, sizeof keep);
        }
        return pick(keep, x, splat(-INFINITY));
    }
    const float *d = (const float *)m->data + at;
    if (step == 0 && valid >= LANES) return x + d[0];
    if (step == 1 && valid >= LANES) return x + load(d);
    float lanes[LANES] = {0};
    for (int64_t i = 0; i < min64(valid, LANES); i++) lanes[i] = d[i * step];
    return x + load(lanes);
}

/* block[c] lane r = the mask's value (a bool mask's as -1 or 0 bits) at element at + r * rs + c, for r and c below
 * LANES: a block of a mask contiguous along the keys, read by rows and transposed for the forward's query lanes. */
static void transposed_mask(const tg_attention_mask *m, int64_t at, int64_t rs, vfloat block[LANES]) {
    for (int r = 0; r < LANES; r++)
        block[r] = m->kind == TG_MASK_BOOL ? (vfloat)keep_lanes((const uint8_t *)m->data + at + r * rs)
                                           : load((const float *)m->data + at + r * rs);
    transpose(block);
}

/* The scaled scores of query tile i0 and key tile j0, element (query r, key c) at sc[r*rs + c*cs] (the tile
 * S = Q_i K_j^T, or its transpose, with rs or cs 1), plus the mask; -inf for keys beyond s, masked out or after
 * the query (causal). One pass of whole vectors along the unit stride (the forward's lanes are queries, the
 * backward's keys), none for a whole tile without mask or causal cut. */
static void mask_scores(const problem *p, int64_t b, int64_t h, int64_t i0, int64_t j0, float *sc, int64_t rs,
                        int64_t cs) {
    int64_t cols = min64(BK, p->s - j0), rows = min64(BQ, p->l - i0);
    int queries_in_lanes = rs == 1, diagonal = p->causal && j0 + BK - 1 > i0;
    int64_t outer = queries_in_lanes ? BK : BQ, inner = queries_in_lanes ? BQ : BK, ld = queries_in_lanes ? cs : rs;
    const tg_attention_mask *m = &p->mask;
    int64_t lane_step = queries_in_lanes ? m->rs : m->cs;
    int64_t lane_end = queries_in_lanes ? rows : cols, outer_end = queries_in_lanes ? cols : rows;
    const vint iota = IOTA;
    if (cols == BK && !diagonal && m->kind == TG_MASK_NONE) return;
    /* queries in lanes and a mask strided along them: whole LANES x LANES blocks read along the keys, transposed */
    int gathered = queries_in_lanes && m->kind != TG_MASK_NONE && lane_step != 0 && lane_step != 1 && m->cs == 1;
    for (int64_t o0 = 0; o0 < outer; o0 += LANES)
        for (int64_t x = 0; x < inner; x += LANES) {
            vfloat block[LANES];
            int whole = gathered && o0 + LANES <= outer_end && x + LANES <= lane_end;
            if (whole) transposed_mask(m, b * m->bs + h * m->hs + (i0 + x) * m->rs + j0 + o0, m->rs, block);
            for (int64_t o = o0; o < o0 + LANES; o++) {
                float *at = sc + o * ld + x;
                vfloat scores = load(at);
                if (cols < BK || diagonal) {
                    vint lane = iota + (int32_t)x, other = (vint){0} + (int32_t)o;
                    vint query = queries_in_lanes ? lane : other, key = queries_in_lanes ? other : lane;
                    vint cut = key >= (int32_t)cols;
                    if (diagonal) cut |= key + (int32_t)(j0 - i0) > query;
                    scores = pick(cut, splat(-INFINITY), scores);
                }
                if (whole && m->kind == TG_MASK_BOOL) {
                    scores = pick((vint)block[o - o0], scores, splat(-INFINITY));
                } else if (whole) {
                    scores += block[o - o0];
                } else if (m->kind != TG_MASK_NONE && o < outer_end && x < lane_end) {
                    int64_t r = queries_in_lanes ? x : o, c = queries_in_lanes ? o : x;
                    int64_t from = b * m->bs + h * m->hs + (i0 + r) * m->rs + (j0 + c) * m->cs;
                    scores = apply_mask(m, from, lane_step, lane_end - x, scores);
                }
                store(at, scores);
            }
        }
}

/* row = exp(row - shift) (zeros when shift is -inf: nothing attended). */
static void row_exp(float *row, float shift) {
    if (shift == -INFINITY) {
        memset(row, 0, sizeof(float) * BK);
        return;
    }
    for (int64_t c = 0; c < BK; c += LANES) {
        /* (x - shift) * log2(e), not x * log2(e) - shift * log2(e): contracted into an fma, the latter leaves
         * shift's rounding error, which is huge for huge scores */
        store(row + c, vexp2((load(row + c) - shift) * LOG2E));
    }
}

/* The sum of a[c] * b[c] for c < n, in LANES partial sums (a scalar loop's one sum is a chain of dependent adds
 * gcc may not reorder). */
static float dot(const float *a, const float *b, int64_t n) {
    vfloat sums = splat(0.0f);
    int64_t c = 0;
    for (; c + LANES <= n; c += LANES) sums += load(a + c) * load(b + c);
    float total = 0.0f;
    for (int i = 0; i < LANES; i++) total += sums[i];
    for (; c < n; c++) total += a[c] * b[c];
    return total;
}

typedef struct {
    float *qt, *st, *o, *m, *sum, *kept;
} forward_scratch;

/* The keys and values the forward reads, per key tile: in place (float32) where the tile products can read them
 * as they are, else packed once into zero-padded BK x dp and BK x dv blocks, each read by every query tile of its
 * head (packing every head first cost a pass over them and the copy's cache misses, most at short lengths). K, the
 * broadcast operand of K Q^T, is read in place at any head dim (the product runs over e); V, read by whole
 * vectors, where its rows are whole aligned vectors (a row split across cache lines made T 1024 3-4% slower). */
typedef struct {
    float *k, *v; /* NULL: read in place */
    int64_t tiles;
} key_tiles;

static int keys_in_place(const problem *p) { return !p->bf16; }

static int values_in_place(const problem *p) {
    const int64_t vector = LANES, strides = p->ev % vector | p->v_bs % vector | p->v_hs % vector | p->v_rs % vector;
    return !p->bf16 && strides == 0 && (uintptr_t)p->v % sizeof(vfloat) == 0;
}

/* Row 0 of key tile j0 of head bh, of the keys or (`values`) the values, and the distance of its rows. */
static const float *key_tile(const problem *p, const key_tiles *keys, int64_t bh, int64_t j0, int values,
                             int64_t *rs) {
    int64_t b = bh / p->heads, h = bh % p->heads, at = bh * keys->tiles + j0 / BK;
    if (values) {
        *rs = keys->v ? p->dv : p->v_rs;
        return keys->v ? keys->v + at * BK * p->dv : p->v + b * p->v_bs + h * p->v_hs + j0 * p->v_rs;
    }
    *rs = keys->k ? p->dp : p->k_rs;
    return keys->k ? keys->k + at * BK * p->dp : p->k + b * p->k_bs + h * p->k_hs + j0 * p->k_rs;
}

/* Packs key tile `tile` of head bh of the keys and of the values that are not read in place. */
static void pack_key_tile(const problem *p, const key_tiles *keys, int64_t bh, int64_t tile) {
    int64_t b = bh / p->heads, h = bh % p->heads, j0 = tile * BK, cols = min64(BK, p->s - j0);
    int64_t at = bh * keys->tiles + tile;
    /* K is the first operand of K Q^T (pairs along a row), V the second of P V (pairs of rows) */
    if (keys->k) {
        pack_rows(keys->k + at * BK * p->dp, p->dp, BK, p->k + b * p->k_bs + h * p->k_hs + j0 * p->k_rs, p->k_rs,
                  cols, p->e);
        if (p->bf16) pair_columns(keys->k + at * BK * p->dp, p->dp, BK, p->dp);
    }
    if (keys->v) {
        pack_rows(keys->v + at * BK * p->dv, p->dv, BK, p->v + b * p->v_bs + h * p->v_hs + j0 * p->v_rs, p->v_rs,
                  cols, p->ev);
        if (p->bf16) pair_rows(keys->v + at * BK * p->dv, p->dv, BK, p->dv);
    }
}

#define QV (BQ / LANES) /* vectors of queries */

/* One step of the online softmax on the transposed scores st (key c, query r at st[c*BQ + r]), with the
 * queries in vector lanes: the running max m and sum of each query, st = exp(st - m) in place, and kept, the
 * factor exp(m_old - m_new) the query's output so far is scaled by. A query with no key attended so far keeps
 * m = -inf and weights 0; a NaN score makes the query's max, and so its weights, NaN. */
static void online_softmax(const forward_scratch *w) {
    vfloat top[QV], now[QV], shift[QV], sums[QV];
    for (int v = 0; v < QV; v++) top[v] = splat(-INFINITY), sums[v] = splat(0.0f);
    for (int64_t c = 0; c < BK; c++)
        for (int v = 0; v < QV; v++) {
            vfloat x = load(w->st + c * BQ + LANES * v);
            top[v] = pick((x > top[v]) | (x != x), x, top[v]);
        }
    for (int v = 0; v < QV; v++) {
        vfloat old = load(w->m + LANES * v);
        now[v] = pick((top[v] > old) | (top[v] != top[v]), top[v], old);
        vint dead = now[v] == splat(-INFINITY);
        store(w->kept + LANES * v, pick(dead, splat(1.0f), vexp2((old - now[v]) * LOG2E)));
        store(w->m + LANES * v, now[v]);
        shift[v] = pick(dead, splat(0.0f), now[v]); /* all of a dead query's scores are -inf: weights 0 */
    }
    for (int64_t c = 0; c < BK; c++)
        for (int v = 0; v < QV; v++) {
            /* (x - m) * log2(e), not x * log2(e) - m * log2(e): contracted into an fma, the latter keeps m's
             * rounding error, which is huge for huge scores */
            vfloat x = vexp2((load(w->st + c * BQ + LANES * v) - shift[v]) * LOG2E);
            store(w->st + c * BQ + LANES * v, x);
            sums[v] += x;
        }
    for (int v = 0; v < QV; v++)
        store(w->sum + LANES * v, load(w->sum + LANES * v) * load(w->kept + LANES * v) + sums[v]);
}

static void forward_tile(const problem *p, const key_tiles *keys, int64_t bh, int64_t i0,
                         const forward_scratch *w, float *out, float *lse) {
    int64_t b = bh / p->heads, h = bh % p->heads, rows = min64(BQ, p->l - i0), dp = p->dp, dv = p->dv;
    pack_transposed(w->qt, dp, BQ, p->q + b * p->q_bs + h * p->q_hs + i0 * p->q_rs, p->q_rs, rows, p->e);
    if (p->bf16) pair_rows(w->qt, BQ, dp, BQ);
    for (int64_t r = 0; r < BQ; r++) w->m[r] = -INFINITY, w->sum[r] = 0.0f;
    int64_t end = p->causal ? min64(p->s, i0 + rows) : p->s;
    if (end <= 0) memset(w->o, 0, sizeof(float) * BQ * dv); /* else the first key tile's P V sets it */
    for (int64_t j0 = 0; j0 < end; j0 += BK) {
        /* only the tile's keys (cols) of K and V are read: mask_scores gives the rest of the scores -inf */
        int64_t cols = min64(BK, p->s - j0), k_rs, v_rs;
        const float *kj = key_tile(p, keys, bh, j0, 0, &k_rs), *vj = key_tile(p, keys, bh, j0, 1, &v_rs);
        tile_gemm(p->bf16, cols, BQ, reduced(p, p->e), kj, k_rs, 1, w->qt, BQ, w->st, BQ, 1, p->scale);
        mask_scores(p, b, h, i0, j0, w->st, 1, BQ);
        online_softmax(w);
        for (int64_t r = 0; r < BQ && j0 > 0; r++)
            if (w->kept[r] != 1.0f)
                for (int64_t c = 0; c < dv; c += LANES)
                    store(w->o + r * dv + c, load(w->o + r * dv + c) * w->kept[r]);
        if (p->bf16) pair_rows(w->st, BQ, BK, BQ); /* the weights, after their sums were taken in float32 */
        tile_gemm(p->bf16, BQ, dv, reduced(p, cols), w->st, 1, BQ, vj, v_rs, w->o, dv, j0 == 0, 1.0f);
    }
    float *o = out + (bh * p->l + i0) * p->ev;
    for (int64_t r = 0; r < rows; r++) {
        float total = w->sum[r], inverse = total == 0.0f ? 0.0f : 1.0f / total;
        for (int64_t c = 0; c < p->ev; c++) o[r * p->ev + c] = w->o[r * dv + c] * inverse;
        if (lse) lse[bh * p->l + i0 + r] = total == 0.0f ? -INFINITY : w->m[r] + logf(total);
    }
}

/* Scratch owned by one thread and kept across calls, grown only: allocating it afresh cost page faults on every
 * call (a few MiB of packed keys and values), about as long as the products themselves. */
typedef struct {
    float *data;
    int64_t floats;
} reusable;

static _Thread_local reusable packed_k, packed_v, unwanted_out, tile_scratch;

/* At least `floats` floats (64-byte aligned) of `s`; NULL when out of memory. */
static float *reserve(reusable *s, int64_t floats) {
    if (floats <= s->floats && s->data) return s->data;
    free(s->data);
    s->floats = round_up(floats > 0 ? floats : 1, LANES);
    s->data = aligned_alloc(64, (size_t)s->floats * sizeof(float));
    return s->data;
}

/* arrays[i] = `sizes[i]` floats each (whole vectors), one after another in the thread's tile scratch. */
static int carve(float **arrays, const int64_t *sizes, int count) {
    int64_t total = 0;
    for (int i = 0; i < count; i++) total += round_up(sizes[i], LANES);
    float *at = reserve(&tile_scratch, total);
    for (int i = 0; i < count; i++) arrays[i] = at, at = at ? at + round_up(sizes[i], LANES) : NULL;
    return at != NULL;
}

static problem make_problem(int64_t heads, int64_t l, int64_t s, int64_t e, int64_t ev, const float *q,
                            int64_t q_bs, int64_t q_hs, int64_t q_rs, const float *k, int64_t k_bs, int64_t k_hs,
                            int64_t k_rs, const float *v, int64_t v_bs, int64_t v_hs, int64_t v_rs,
                            tg_attention_mask mask, int32_t causal, float scale, int32_t bf16) {
    problem p = {heads, l, s, e, ev, round_up(e, LANES), round_up(ev, LANES), q, k, v, q_bs, q_hs, q_rs,
                 k_bs, k_hs, k_rs, v_bs, v_hs, v_rs, mask, causal, scale, bf16};
    return p;
}

#define OPERAND_ARGS \
    heads, l, s, e, ev, q, q_bs, q_hs, q_rs, k, k_bs, k_hs, k_rs, v, v_bs, v_hs, v_rs, mask, causal, scale

static int attention_forward(int32_t bf16, TG_ATTENTION_FORWARD_PARAMS) {
    problem p = make_problem(OPERAND_ARGS, bf16);
    int64_t tiles = (l + BQ - 1) / BQ, work = batch * heads * tiles;
    key_tiles keys = {NULL, NULL, (s + BK - 1) / BK};
    int pack_k = !keys_in_place(&p), pack_v = !values_in_place(&p);
    if (pack_k) keys.k = reserve(&packed_k, batch * heads * keys.tiles * BK * p.dp);
    if (pack_v) keys.v = reserve(&packed_v, batch * heads * keys.tiles * BK * p.dv);
    out = out ? out : reserve(&unwanted_out, batch * heads * l * ev); /* out not wanted: lse only */
    int reserved = out && (!pack_k || keys.k) && (!pack_v || keys.v), failed = !reserved;
#pragma omp parallel reduction(| : failed)
    {
        forward_scratch w;
        const int64_t sizes[] = {p.dp * BQ, BK * BQ, BQ * p.dv, BQ, BQ, BQ};
        _Static_assert(sizeof sizes / sizeof *sizes == sizeof w / sizeof(float *), "one size per scratch array");
        int ok = reserved && carve((float **)&w, sizes, sizeof sizes / sizeof *sizes);
        failed |= !ok;
#pragma omp for schedule(static)
        for (int64_t item = 0; item < (pack_k || pack_v ? batch * heads * keys.tiles : 0); item++)
            if (ok) pack_key_tile(&p, &keys, item / keys.tiles, item % keys.tiles);
#pragma omp for schedule(dynamic)
        for (int64_t item = 0; item < work; item++)
            if (ok) forward_tile(&p, &keys, item / tiles, item % tiles * BQ, &w, out, lse);
    }
    return failed ? TG_ATTENTION_NO_MEMORY : TG_ATTENTION_OK;
}

/* qi and doi: q and dout of the whole head (or chunk's head), packed once into query tiles of BQ rows (zero
 * padded) and read by every key tile; qa, da and sa: the bfloat16 variant's second pairing of q, dout and dS
 * (pairs along a row, as a first operand; qi, doi and dp are paired by rows within each tile, as a second
 * operand, or for their transposes). */
typedef struct {
    float *qi, *doi, *kj, *kt, *vt, *sc, *dp, *dk, *dv, *dq, *d, *qa, *da, *sa;
} backward_scratch;

typedef struct {
    const float *out, *lse, *dout;
    int64_t do_bs, do_hs, do_rs;
    float *dq, *dk, *dv;
} gradients;

/* One (key tile, query tile) step: P, dS in place of the scores and dP, and the three products. */
static void backward_step(const problem *p, int64_t b, int64_t h, int64_t i0, int64_t j0, const float *lse,
                          const backward_scratch *w, const gradients *g) {
    int64_t rows = min64(BQ, p->l - i0), dp = p->dp, dv = p->dv;
    const float *qi = w->qi + i0 * dp, *doi = w->doi + i0 * dv, *qa = qi, *da = doi, *sa = w->dp;
    if (p->bf16) qa = w->qa + i0 * dp, da = w->da + i0 * dv, sa = w->sa;
    tile_gemm(p->bf16, BQ, BK, reduced(p, dp), qa, dp, 1, w->kt, BK, w->sc, BK, 1, p->scale);
    mask_scores(p, b, h, i0, j0, w->sc, BK, 1);
    tile_gemm(p->bf16, BQ, BK, reduced(p, dv), da, dv, 1, w->vt, BK, w->dp, BK, 1, 1.0f);
    for (int64_t r = 0; r < BQ; r++) {
        float *prob = w->sc + r * BK, *grad = w->dp + r * BK;
        row_exp(prob, r < rows ? lse[i0 + r] : -INFINITY);
        vfloat d = splat(r < rows ? w->d[i0 + r] : 0.0f);
        for (int64_t c = 0; c < BK; c += LANES) store(grad + c, load(prob + c) * (load(grad + c) - d));
    }
    if (p->bf16) {
        memcpy(w->sa, w->dp, sizeof(float) * BQ * BK);
        pair_columns(w->sa, BK, BQ, BK), pair_rows(w->dp, BK, BQ, BK), pair_rows(w->sc, BK, BQ, BK);
    }
    if (g->dv) tile_gemm(p->bf16, BK, dv, reduced(p, BQ), w->sc, 1, BK, doi, dv, w->dv, dv, 0, 1.0f);
    if (g->dk) tile_gemm(p->bf16, BK, dp, reduced(p, BQ), w->dp, 1, BK, qi, dp, w->dk, dp, 0, 1.0f);
    if (g->dq) tile_gemm(p->bf16, BQ, dp, reduced(p, BK), sa, BK, 1, w->kj, dp, w->dq + i0 * dp, dp, 0, 1.0f);
}

/* rows x cols of src (rows ld apart) times factor into dst (contiguous rows of cols). */
static void store_rows(float *dst, const float *src, int64_t ld, int64_t rows, int64_t cols, float factor) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = src[r * ld + c] * factor;
}

/* dst (rows x cols, contiguous) += src (rows ld apart) times factor, one thread at a time: several key chunks of
 * one head add their parts of dq (one lock around a vectorized loop, not an atomic add per float). */
static void add_rows_exclusively(float *dst, const float *src, int64_t ld, int64_t rows, int64_t cols,
                                 float factor) {
#pragma omp critical(tg_attention_dq)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * cols + c] += src[r * ld + c] * factor;
}

/* The gradients from key tiles [first, end) of head bh; `shared` when other chunks of the head add to dq too. */
static void backward_chunk(const problem *p, int64_t bh, int64_t first, int64_t end, int shared,
                           const backward_scratch *w, const gradients *g) {
    int64_t b = bh / p->heads, h = bh % p->heads, dp = p->dp, dv = p->dv;
    const float *k = p->k + b * p->k_bs + h * p->k_hs, *v = p->v + b * p->v_bs + h * p->v_hs;
    const float *out = g->out + bh * p->l * p->ev, *dout = g->dout + b * g->do_bs + h * g->do_hs;
    for (int64_t i = 0; i < p->l; i++) w->d[i] = dot(dout + i * g->do_rs, out + i * p->ev, p->ev);
    for (int64_t i0 = 0; i0 < p->l; i0 += BQ) {
        int64_t rows = min64(BQ, p->l - i0);
        const float *qs = p->q + b * p->q_bs + h * p->q_hs + i0 * p->q_rs, *ds = dout + i0 * g->do_rs;
        float *qi = w->qi + i0 * dp, *doi = w->doi + i0 * dv;
        pack_rows(qi, dp, BQ, qs, p->q_rs, rows, p->e);
        pack_rows(doi, dv, BQ, ds, g->do_rs, rows, p->ev);
        if (p->bf16) {
            pack_rows(w->qa + i0 * dp, dp, BQ, qs, p->q_rs, rows, p->e);
            pack_rows(w->da + i0 * dv, dv, BQ, ds, g->do_rs, rows, p->ev);
            pair_columns(w->qa + i0 * dp, dp, BQ, dp), pair_columns(w->da + i0 * dv, dv, BQ, dv);
            pair_rows(qi, dp, BQ, dp), pair_rows(doi, dv, BQ, dv);
        }
    }
    if (g->dq) memset(w->dq, 0, sizeof(float) * round_up(p->l, BQ) * dp);
    for (int64_t j0 = first * BK; j0 < min64(p->s, end * BK); j0 += BK) {
        int64_t cols = min64(BK, p->s - j0);
        pack_rows(w->kj, dp, BK, k + j0 * p->k_rs, p->k_rs, cols, p->e);
        pack_transposed(w->kt, dp, BK, k + j0 * p->k_rs, p->k_rs, cols, p->e);
        pack_transposed(w->vt, dv, BK, v + j0 * p->v_rs, p->v_rs, cols, p->ev);
        if (p->bf16) pair_rows(w->kj, dp, BK, dp), pair_rows(w->kt, BK, dp, BK), pair_rows(w->vt, BK, dv, BK);
        memset(w->dk, 0, sizeof(float) * BK * dp);
        memset(w->dv, 0, sizeof(float) * BK * dv);
        for (int64_t i0 = p->causal ? j0 / BQ * BQ : 0; i0 < p->l; i0 += BQ)
            backward_step(p, b, h, i0, j0, g->lse + bh * p->l, w, g);
        if (g->dk) store_rows(g->dk + (bh * p->s + j0) * p->e, w->dk, dp, cols, p->e, p->scale);
        if (g->dv) store_rows(g->dv + (bh * p->s + j0) * p->ev, w->dv, dv, cols, p->ev, 1.0f);
    }
    if (g->dq && shared) add_rows_exclusively(g->dq + bh * p->l * p->e, w->dq, dp, p->l, p->e, p->scale);
    else if (g->dq) store_rows(g->dq + bh * p->l * p->e, w->dq, dp, p->l, p->e, p->scale);
}

static int64_t max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

#define ITEMS_PER_THREAD 8

static int attention_backward(int32_t bf16, TG_ATTENTION_BACKWARD_PARAMS) {
    problem p = make_problem(OPERAND_ARGS, bf16);
    gradients g = {out, lse, dout, do_bs, do_hs, do_rs, dq, dk, dv};
    /* Work items are heads; with fewer than ITEMS_PER_THREAD per thread, each head's key tiles are split into
     * chunks too: on a loaded machine a thread descheduled during one of few long items left the others waiting */
    int64_t problems = batch * heads, key_tiles = (s + BK - 1) / BK, threads = max_threads();
    int64_t wanted = threads > 1 ? ITEMS_PER_THREAD * threads : 1;
    int64_t chunks = problems >= wanted ? 1 : min64(key_tiles, (wanted + problems - 1) / problems);
    int64_t per_chunk = (key_tiles + chunks - 1) / chunks;
    if (chunks > 1 && dq) memset(dq, 0, sizeof(float) * problems * l * e);
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        backward_scratch w;
        int64_t padded = round_up(l, BQ);
        const int64_t sizes[] = {padded * p.dp, padded * p.dv, BK * p.dp, p.dp * BK, p.dv * BK, BQ * BK, BQ * BK,
                                 BK * p.dp, BK * p.dv, padded * p.dp, l, bf16 ? padded * p.dp : 0,
                                 bf16 ? padded * p.dv : 0, bf16 ? BQ * BK : 0};
        _Static_assert(sizeof sizes / sizeof *sizes == sizeof w / sizeof(float *), "one size per scratch array");
        int ok = carve((float **)&w, sizes, sizeof sizes / sizeof *sizes);
        failed |= !ok;
#pragma omp for schedule(dynamic)
        for (int64_t item = 0; item < problems * chunks; item++)
            if (ok) {
                int64_t first = item % chunks * per_chunk;
                backward_chunk(&p, item / chunks, first, first + per_chunk, chunks > 1, &w, &g);
            }
    }
    return failed ? TG_ATTENTION_NO_MEMORY : TG_ATTENTION_OK;
}

#define FORWARD_ARGS batch, OPERAND_ARGS, out, lse
#define BACKWARD_ARGS batch, OPERAND_ARGS, out, lse, dout, do_bs, do_hs, do_rs, dq, dk, dv

int tg_attention_forward_f32(TG_ATTENTION_FORWARD_PARAMS) { return attention_forward(0, FORWARD_ARGS); }

int tg_attention_forward_bf16(TG_ATTENTION_FORWARD_PARAMS) { return attention_forward(1, FORWARD_ARGS); }

int tg_attention_backward_f32(TG_ATTENTION_BACKWARD_PARAMS) { return attention_backward(0, BACKWARD_ARGS); }

int tg_attention_backward_bf16(TG_ATTENTION_BACKWARD_PARAMS) { return attention_backward(1, BACKWARD_ARGS); }
