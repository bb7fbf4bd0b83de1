/* What gemm.c and conv.c share: the problem description and the batched, blocked driver. */
#ifndef TG_GEMM_INTERNAL_H
#define TG_GEMM_INTERNAL_H
#include <stddef.h>

#include "conv_geometry.h"
#include "epilogue.h"
#include "gemm.h"

/* Register tile MR x NR (NR = 16 * NV) and cache blocks MC x KC (A block, L2) and KC x NC (B block),
 * chosen by measurement on the target CPU (see bench/gemm.py --sweep); overridable with -D at build time. */
#ifndef TG_MR
#define TG_MR 6
#endif
#ifndef TG_NV
#ifdef __AVX512F__
#define TG_NV 4 /* at most 4: TG_BY_TILE_WIDTH dispatches narrower tiles up to that */
#else
#define TG_NV 1 /* AVX2: 6 x 16 accumulators are 12 of its 16 registers */
#endif
#endif
#define TG_NR (TG_NV * 16)

#ifdef __AVX512F__
enum { HALF_TILES = 0 };
#define tg_load_low_ps _mm512_load_ps
#define tg_fmadd_low_ps _mm512_fmadd_ps
#else
/* A 16-lane vector is two AVX registers (avx512_on_avx2.h): a tile of at most 8 columns (the last panel of an
 * image of 7x7 output positions: 49 columns) multiplies its first one only. */
enum { HALF_TILES = 1 };
#endif

/* TILE(nv, half) for the narrowest tile covering `n_valid` columns: half a vector (HALF_TILES), 1 to TG_NV - 1
 * vectors, or TG_NV. Each width is a call with constant arguments, so each compiles to its own unrolled kernel;
 * widths of TG_NV and more never reach the narrower calls (clamped to TG_NV only to stay valid). */
#define TG_BY_TILE_WIDTH(n_valid, TILE)                                                                           \
    do {                                                                                                          \
        int64_t tg_vectors_ = ((n_valid) + 15) / 16;                                                               \
        if (HALF_TILES && (n_valid) <= 8) TILE(1, 1);                                                             \
        else if (tg_vectors_ >= TG_NV) TILE(TG_NV, 0);                                                            \
        else if (tg_vectors_ == 1) TILE(1, 0);                                                                    \
        else if (tg_vectors_ == 2) TILE(TG_NV > 2 ? 2 : TG_NV, 0);                                                \
        else TILE(TG_NV > 3 ? 3 : TG_NV, 0);                                                                      \
    } while (0)
#ifndef TG_MC
#define TG_MC 256 /* 256 rows (an MLP's batch, a 256-wide layer's weight gradient) in one block: bench/NOTES.md */
#endif
#ifndef TG_KC
#define TG_KC 384 /* a multiple of 8 */
#endif
#ifndef TG_NC
#define TG_NC 2048
#endif

typedef struct b_source b_source;

/* Writes columns j0..j0+nr (nr <= TG_NR) and rows k0..k0+kc of B as one packed panel: dst[k*TG_NR + jj],
 * zero-padded to TG_NR columns. `data` is already offset to the problem's batch entry. */
typedef void (*pack_b_fn)(const b_source *src, const float *data, int64_t k0, int64_t kc, int64_t j0, int64_t nr,
                          float *dst);

/* Where the shifted im2col (conv.c) finds what an output position reads: planes of h x w floats with as many
 * columns as the output (the image itself at stride 1, its phase planes at stride 2). Under tap (ki, kj) output
 * position p, in output row r and column c of an image, reads float p + tap_offset[ki * kw + kj] of the image's
 * planes (image_size floats an image, channel_size a channel, from channel 0's) if r + row_offset[ki] lies in
 * [0, h) and c + column_offset[kj] in [0, w), else the padding. */
typedef struct {
    int64_t h, w, channel_size, image_size;
    const int64_t *row_offset, *column_offset, *tap_offset;
} shifted_view;

struct b_source {
    pack_b_fn pack;
    int64_t rs, cs;             /* strided matrix B */
    const conv_geometry *conv;  /* implicit im2col of one image */
    const shifted_view *shifted; /* the shifted im2col's view of it */
    int rows_in_place;          /* a pointwise conv's image: its whole panels read in place at any M (gemm.c) */
};

/* A batch of problems that differ only by per-operand batch offsets (stride 0 broadcasts). */
typedef struct {
    int64_t batch, m, n, k;
    const float *a;
    int64_t a_bs, a_rs, a_cs;
    const float *b;
    int64_t b_bs;
    b_source b_src;
    float *c;
    int64_t c_bs, c_rs;
    int64_t bias_bs, residual_bs;
    tg_epilogue ep;
    int32_t a_prologue, b_prologue; /* enum tg_activation, applied to each packed block of A / B */
    int32_t bf16;                   /* 1: packed blocks become bfloat16 pairs, products by VDPBF16PS (gemm.c) */
} gemm_batch;

/* tg_gemm_f32's parameter list (gemm.h), shared by every kernel with its signature. */
#define TG_GEMM_PARAMS                                                                                          \
    int64_t batch, int64_t m, int64_t n, int64_t k, const float *a, int64_t a_bs, int64_t a_rs, int64_t a_cs,   \
        const float *b, int64_t b_bs, int64_t b_rs, int64_t b_cs, float *c, int64_t c_bs, int64_t c_rs,         \
        float alpha, const float *bias, int64_t bias_bs, int64_t bias_rs, int64_t bias_cs,                      \
        const float *residual, int64_t residual_bs, int64_t residual_rs, int32_t activation, int32_t a_prologue, \
        int32_t b_prologue
#define TG_GEMM_ARGS                                                                                            \
    batch, m, n, k, a, a_bs, a_rs, a_cs, b, b_bs, b_rs, b_cs, c, c_bs, c_rs, alpha, bias, bias_bs, bias_rs,     \
        bias_cs, residual, residual_bs, residual_rs, activation, a_prologue, b_prologue

/* Grow-only, page-aligned scratch owned by the calling thread (a _Thread_local): packing buffers are reused across
 * calls, so page faults are paid once. */
typedef struct {
    float *data;
    size_t capacity;
} tg_scratch;

/* Room for `count` floats in `s` (its old contents are lost when it grows); NULL when out of memory. */
float *tg_scratch_reserve(tg_scratch *s, size_t count);
/* Frees `s` when it holds more than `kept` floats: a large call's scratch is not kept for good. */
void tg_scratch_trim(tg_scratch *s, size_t kept);

/* Checks tg_gemm_f32's arguments and describes them as a batch (folded into one taller GEMM where possible) whose
 * B panels `pack` packs (NULL for a kernel that reads B itself) (describe.c). */
int tg_describe_gemm(gemm_batch *g, pack_b_fn pack, TG_GEMM_PARAMS);
/* A (mc x kc, element (i, k) at a[i*rs + k*cs]) as micro-panels dst[ir*kc + k*TG_MR + ii], rows past mc zero-padded
 * to a whole panel (gemm.c). */
void tg_pack_a(const float *a, int64_t rs, int64_t cs, int64_t mc, int64_t kc, float *restrict dst);
/* dst[c*dst_ld + r] = src[r*src_ld + c] for r < rows <= 16, c < cols <= 16, writing `width` <= 16 floats per
 * column (rows past `rows` as zeros): a 16x16 in-register transpose (gemm.c). */
void tg_transpose_block(const float *src, int64_t src_ld, int64_t rows, int64_t cols, float *dst, int64_t dst_ld,
                        int64_t width);
void tg_pack_b_strided(const b_source *src, const float *data, int64_t k0, int64_t kc, int64_t j0, int64_t nr,
                       float *dst);
int tg_run_gemm_batch(const gemm_batch *g);
/* Products of few rows without packing (gemv.c): whether `g` is one, and running it. */
int tg_gemv_fits(const gemm_batch *g);
int tg_run_gemv(const gemm_batch *g);
#endif
