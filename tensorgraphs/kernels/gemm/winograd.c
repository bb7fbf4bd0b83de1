/* conv2d 3x3, stride 1 by Winograd's minimal filtering F(4x4, 3x3) (Lavin and Gray, 2015): each 4x4 output tile is
 * A^T [(G g G^T) . (B^T d B)] A for the tile's 6x6 input patch d and the 3x3 kernel g, so the products over input
 * channels become 36 independent GEMMs (one per point of the 6x6 transformed tile) with 2.25 multiplies per output
 * and channel instead of 9. In the transformed domain, with P tiles over all images:
 *   U[point][co][ci] = G g G^T          (the weights: tg_winograd_weights_f32, once per weights where kept)
 *   V[point][ci][p]  = B^T d B          (the input patches, zero outside the image)
 *   M[point][co][p]  = U[point] @ V[point]   (tg_gemm_f32: rows are output channels, columns tiles;
 *                                             or M[point]^T = V[point]^T @ U[point]^T: tiles_as_rows)
 *   out tile (p, co) = epilogue(A^T M A)
 * U is the GEMMs' A where the tiles are few against the channels: U is four times the size of the weights (9.4 MB
 * for 256 channels each side) and the tiles few (16 for a 14x14 image), and the GEMM reads a row-major A in place
 * where the tiles fit its panels (gemm.c, a_read_in_place) while it packs every B panel per call, a second pass
 * over U (bench/NOTES.md). Where the tiles are many, taking them as rows pads the register tiles less.
 * The transforms are vectorized over 16 tiles (input: plain loads along tile rows where they are long, else masked
 * gathers from the image, zero in the padding), 16 of M's columns (output: tiles or channels, then transposed
 * in registers and stored row by row) or 16 input channels (weights). V and M live in scratch the calling thread
 * keeps for its next call (`work_scratch`), and so does U where the call transforms the weights itself
 * (tg_conv2d_winograd_f32). */
#include <float.h>
#include <stdlib.h>

#include "gemm_internal.h"
#include "winograd.h"

enum { TILE = 4, PATCH = 6, POINTS = PATCH * PATCH };

typedef __m512 v16;

/* B^T d for a column d0..d5 of a patch (and, applied to rows, d B). */
static inline __attribute__((always_inline)) void input_transform(const v16 d[PATCH], v16 r[PATCH]) {
    const v16 two = _mm512_set1_ps(2.0f), four = _mm512_set1_ps(4.0f), five = _mm512_set1_ps(5.0f);
    r[0] = _mm512_add_ps(_mm512_fnmadd_ps(five, d[2], _mm512_mul_ps(four, d[0])), d[4]);
    r[1] = _mm512_fnmadd_ps(four, _mm512_add_ps(d[1], d[2]), _mm512_add_ps(d[3], d[4]));
    r[2] = _mm512_fmadd_ps(four, _mm512_sub_ps(d[1], d[2]), _mm512_sub_ps(d[4], d[3]));
    r[3] = _mm512_fmadd_ps(two, _mm512_sub_ps(d[3], d[1]), _mm512_sub_ps(d[4], d[2]));
    r[4] = _mm512_fnmadd_ps(two, _mm512_sub_ps(d[3], d[1]), _mm512_sub_ps(d[4], d[2]));
    r[5] = _mm512_add_ps(_mm512_fnmadd_ps(five, d[3], _mm512_mul_ps(four, d[1])), d[5]);
}

/* G g for a column g0..g2 of a kernel. */
static inline __attribute__((always_inline)) void weight_transform(const v16 g[3], v16 u[PATCH]) {
    const v16 sum_outer = _mm512_add_ps(g[0], g[2]);
    u[0] = _mm512_mul_ps(g[0], _mm512_set1_ps(1.0f / 4));
    u[1] = _mm512_mul_ps(_mm512_add_ps(sum_outer, g[1]), _mm512_set1_ps(-1.0f / 6));
    u[2] = _mm512_mul_ps(_mm512_sub_ps(sum_outer, g[1]), _mm512_set1_ps(-1.0f / 6));
    const v16 even = _mm512_fmadd_ps(g[0], _mm512_set1_ps(1.0f / 24), _mm512_mul_ps(g[2], _mm512_set1_ps(1.0f / 6)));
    u[3] = _mm512_fmadd_ps(g[1], _mm512_set1_ps(1.0f / 12), even);
    u[4] = _mm512_fnmadd_ps(g[1], _mm512_set1_ps(1.0f / 12), even);
    u[5] = g[2];
}

/* A^T m for a column m0..m5 of a transformed tile. */
static inline __attribute__((always_inline)) void output_transform(const v16 m[PATCH], v16 y[TILE]) {
    const v16 plus12 = _mm512_add_ps(m[1], m[2]), minus12 = _mm512_sub_ps(m[1], m[2]);
    const v16 plus34 = _mm512_add_ps(m[3], m[4]), minus34 = _mm512_sub_ps(m[3], m[4]);
    y[0] = _mm512_add_ps(_mm512_add_ps(m[0], plus12), plus34);
    y[1] = _mm512_fmadd_ps(_mm512_set1_ps(2.0f), minus34, minus12);
    y[2] = _mm512_fmadd_ps(_mm512_set1_ps(4.0f), plus34, plus12);
    y[3] = _mm512_add_ps(_mm512_fmadd_ps(_mm512_set1_ps(8.0f), minus34, minus12), m[5]);
}

/* Lanes holding a NaN or an infinity. */
static inline __mmask16 not_finite(v16 x) { return _mm512_fpclass_ps_mask(x, 0x99); }

int tg_winograd_weights_f32(int64_t cout, int64_t cin, const float *weight, float *u) {
    size_t matrix = (size_t)cout * cin;
    int bad = 0;
    const __m512i lanes = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32(9));
#pragma omp parallel for collapse(2) schedule(static) reduction(| : bad)
    for (int64_t co = 0; co < cout; co++)
        for (int64_t ci = 0; ci < cin; ci += 16) { /* 16 input channels' kernels, 9 floats apart */
            __mmask16 valid = tg_tail_mask(cin - ci);
            const float *kernels = weight + (co * cin + ci) * 9;
            v16 column[3], transformed[PATCH], rows[PATCH][3];
            for (int l = 0; l < 3; l++) { /* G applied to each kernel column */
                for (int k = 0; k < 3; k++) {
                    column[k] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, lanes, kernels + 3 * k + l, 4);
                    bad |= not_finite(column[k]) != 0;
                }
                weight_transform(column, transformed);
                for (int xi = 0; xi < PATCH; xi++) rows[xi][l] = transformed[xi];
            }
            for (int xi = 0; xi < PATCH; xi++) { /* then to each row */
                weight_transform(rows[xi], transformed);
                for (int nu = 0; nu < PATCH; nu++)
                    _mm512_mask_storeu_ps(u + (xi * PATCH + nu) * matrix + co * cin + ci, valid, transformed[nu]);
            }
        }
    u[POINTS * matrix] = bad ? 0.0f : 1.0f;
    return TG_GEMM_OK;
}

typedef struct {
    int64_t n, cin, h, w, cout, pad_h, pad_w, oh, ow, tiles_h, tiles_w, tiles;
} geometry;

/* Where a tile lies: its image and its tile row and column, stepped along without dividing. */
typedef struct {
    int64_t image, row, column;
} tile_place;

static tile_place tile_place_of(const geometry *g, int64_t p) {
    int64_t per_image = g->tiles_h * g->tiles_w;
    return (tile_place){p / per_image, p % per_image / g->tiles_w, p % g->tiles_w};
}

static void next_tile(const geometry *g, tile_place *t) {
    if (++t->column < g->tiles_w) return;
    t->column = 0;
    if (++t->row == g->tiles_h) t->row = 0, t->image++;
}

/* For the 16 tiles from p0: the image offset of each patch's corner, and its row and column (negative in the
 * padding). */
static void tile_corners(const geometry *g, int64_t p0, int32_t first[16], int32_t top[16], int32_t left[16]) {
    tile_place place = tile_place_of(g, p0);
    for (int l = 0; l < 16; l++, next_tile(g, &place)) {
        top[l] = (int32_t)(place.row * TILE - g->pad_h), left[l] = (int32_t)(place.column * TILE - g->pad_w);
        first[l] = (int32_t)(place.image * g->cin * g->h * g->w + (int64_t)top[l] * g->w + left[l]);
    }
}

/* A gather costs about one cycle per element plus its latency, and the input transform spent most of its time in
 * them (AVX2; on AVX-512 the 55x55 and 56x56 layers ran 8-15% faster without them, 28x28 and 27x27 7-13%:
 * bench/NOTES.md). Where tile rows are long enough to fill most of a 16-tile vector (or of its halves, 8 tiles
 * each), it instead copies each image channel once into a buffer with zero borders and loads 16 tiles of a tile
 * row (8 of each of two) a patch row at a time as plain vectors, each 8 tiles' 32 floats split into patch columns
 * 0-3 by shuffles (stride 4), columns 4 and 5 being columns 0 and 1 of the next tile. */
enum { ROW_TILES = 16 };

/* Patch columns 0..5 of 8 tiles consecutive in a tile row, from their patch row at `p` (34 floats): lane t of
 * column c is p[4t + c]. */
static inline __attribute__((always_inline)) void patch_columns8(const float *p, __m256 c[PATCH]) {
    const __m256 a0 = _mm256_loadu_ps(p), a1 = _mm256_loadu_ps(p + 8);
    const __m256 a2 = _mm256_loadu_ps(p + 16), a3 = _mm256_loadu_ps(p + 24);
    const __m256 u0 = _mm256_unpacklo_ps(a0, a1), u1 = _mm256_unpackhi_ps(a0, a1);
    const __m256 u2 = _mm256_unpacklo_ps(a2, a3), u3 = _mm256_unpackhi_ps(a2, a3);
    const __m256i in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* the shuffles leave tiles 0 2 4 6 1 3 5 7 */
    const __m256i next_tile = _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 0);
    c[0] = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(u0, u2, 0x44), in_order);
    c[1] = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(u0, u2, 0xEE), in_order);
    c[2] = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(u1, u3, 0x44), in_order);
    c[3] = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(u1, u3, 0xEE), in_order);
    c[4] = _mm256_blend_ps(_mm256_permutevar8x32_ps(c[0], next_tile), _mm256_broadcast_ss(p + 32), 0x80);
    c[5] = _mm256_blend_ps(_mm256_permutevar8x32_ps(c[1], next_tile), _mm256_broadcast_ss(p + 33), 0x80);
}

/* How many tile rows a 16-tile vector loads as rows: one where tile rows fill at least half the vectors that cover
 * them, two (one a half) for rows of SHORT_ROW_TILES to 7 tiles, else none (the gathers: rows of 4 tiles, 13x13
 * and 14x14 images, ran as fast or 7% faster by them). */
enum { SHORT_ROW_TILES = 5 };

static int tile_rows_per_vector(const geometry *g) {
    if (2 * g->tiles_w >= ROW_TILES * ((g->tiles_w + ROW_TILES - 1) / ROW_TILES)) return 1;
    return g->tiles_w >= SHORT_ROW_TILES ? 2 : 0;
}

/* Copies one image channel (h x w) into `padded` at (pad_h, pad_w), rows `stride` apart, each row's last vector
 * filled with zeros past w (the border stays zero); whether every value is finite. */
static int pad_channel(const geometry *g, const float *channel, int64_t stride, float *padded) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), largest = _mm256_set1_ps(FLT_MAX);
    __m256 not_finite_lanes = _mm256_setzero_ps();
    for (int64_t y = 0; y < g->h; y++)
        for (int64_t x0 = 0; x0 < g->w; x0 += 8) {
            unsigned lanes = g->w - x0 >= 8 ? 0xFF : (1u << (g->w - x0)) - 1;
            __m256 values = tg_maskz_loadu8(lanes, channel + y * g->w + x0);
            not_finite_lanes = _mm256_or_ps(
                not_finite_lanes, _mm256_cmp_ps(_mm256_and_ps(values, magnitude), largest, _CMP_NLE_UQ));
            _mm256_storeu_ps(padded + (y + g->pad_h) * stride + g->pad_w + x0, values);
        }
    return _mm256_movemask_ps(not_finite_lanes) == 0;
}

/* transform_input by tile rows (see above), `pair`: two rows a vector; whether every input is finite (0 also
 * where memory ran out). */
static int transform_input_by_rows(const geometry *g, int pair, const float *x, float *v) {
    int64_t per_image = g->tiles_h * g->tiles_w, rows = g->tiles_h * TILE + 2;
    int64_t stride = (g->tiles_w + ROW_TILES - 1) / ROW_TILES * ROW_TILES * TILE + 8; /* 34 floats past a corner */
    if (stride < g->pad_w + (g->w + 7) / 8 * 8) stride = g->pad_w + (g->w + 7) / 8 * 8;
    int bad = 0;
#pragma omp parallel reduction(| : bad)
    {
        float *padded = calloc((size_t)(rows * stride), sizeof(float)); /* its borders stay zero */
        bad = !padded;
#pragma omp for collapse(2) schedule(static)
        for (int64_t ci = 0; ci < g->cin; ci++)
            for (int64_t image = 0; image < g->n; image++) {
                if (!padded || !pad_channel(g, x + (image * g->cin + ci) * g->h * g->w, stride, padded)) {
                    bad = 1;
                    continue;
                }
                for (int64_t tr = 0; tr < g->tiles_h; tr += pair ? 2 : 1)
                    for (int64_t tc = 0; tc < g->tiles_w; tc += ROW_TILES) {
                        /* the vector's second half: the next 8 tiles of the row, or the next row (this one again
                         * past the last row, not stored) */
                        const float *corner = padded + tr * TILE * stride + tc * TILE;
                        const float *second = !pair ? corner + 8 * TILE : tr + 1 < g->tiles_h ? corner + TILE * stride
                                                                                              : corner;
                        v16 rows_t[PATCH][PATCH], column[PATCH], transformed[PATCH];
                        for (int r = 0; r < PATCH; r++) { /* B to each patch row */
                            __m256 lo[PATCH], hi[PATCH];
                            patch_columns8(corner + r * stride, lo);
                            patch_columns8(second + r * stride, hi);
                            for (int c = 0; c < PATCH; c++) column[c] = tg_f32x16_of(lo[c], hi[c]);
                            input_transform(column, rows_t[r]);
                        }
                        /* one row: lanes past it are the next row's tiles, written again in order, never past the
                         * image's, which another thread may write; two: each half's first tiles_w lanes, the second
                         * stored from 8 lanes before its place */
                        int64_t p = tr * g->tiles_w + tc, second_at = g->tiles_w - 8;
                        __mmask16 row = tg_tail_mask(g->tiles_w);
                        __mmask16 first = pair ? row : tg_tail_mask(per_image - p);
                        __mmask16 next = pair && tr + 1 < g->tiles_h ? (__mmask16)(row << 8) : 0;
                        float *at = v + ci * g->tiles + image * per_image + p;
                        for (int nu = 0; nu < PATCH; nu++) { /* then B^T to each column */
                            for (int r = 0; r < PATCH; r++) column[r] = rows_t[r][nu];
                            input_transform(column, transformed);
                            for (int xi = 0; xi < PATCH; xi++) {
                                float *point = at + (xi * PATCH + nu) * g->cin * g->tiles;
                                _mm512_mask_storeu_ps(point, first, transformed[xi]);
                                if (next) _mm512_mask_storeu_ps(point + second_at, next, transformed[xi]);
                            }
                        }
                    }
            }
        free(padded);
    }
    return !bad;
}

/* V[point][ci][p] = B^T d B for tiles p (images, tile rows, tile columns in order); whether every input read is
 * finite (every input element lies in some patch). */
static int transform_input(const geometry *g, const float *x, float *v) {
    int rows_per_vector = tile_rows_per_vector(g);
    if (rows_per_vector) return transform_input_by_rows(g, rows_per_vector == 2, x, v);
    int bad = 0;
#pragma omp parallel for collapse(2) schedule(static) reduction(| : bad)
    for (int64_t ci = 0; ci < g->cin; ci++)
        for (int64_t p0 = 0; p0 < g->tiles; p0 += 16) { /* V's rows are written in order */
            int32_t first[16], top[16], left[16];
            tile_corners(g, p0, first, top, left);
            __mmask16 valid = tg_tail_mask(g->tiles - p0), row_in[PATCH], column_in[PATCH];
            __m512i corner = _mm512_loadu_si512(first), row0 = _mm512_loadu_si512(top);
            __m512i col0 = _mm512_loadu_si512(left);
            for (int k = 0; k < PATCH; k++) { /* unsigned compares: negative rows and columns are out too */
                row_in[k] = _mm512_cmplt_epu32_mask(_mm512_add_epi32(row0, _mm512_set1_epi32(k)),
                                                    _mm512_set1_epi32((int32_t)g->h));
                column_in[k] = _mm512_cmplt_epu32_mask(_mm512_add_epi32(col0, _mm512_set1_epi32(k)),
                                                       _mm512_set1_epi32((int32_t)g->w));
            }
            const float *channel = x + ci * g->h * g->w;
            v16 columns[PATCH][PATCH], d[PATCH], transformed[PATCH];
            for (int c = 0; c < PATCH; c++) { /* B^T applied to each patch column */
                for (int r = 0; r < PATCH; r++) {
                    __m512i index = _mm512_add_epi32(corner, _mm512_set1_epi32((int32_t)(r * g->w + c)));
                    d[r] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid & row_in[r] & column_in[c], index,
                                                    channel, 4);
                    bad |= not_finite(d[r]) != 0;
                }
                input_transform(d, transformed);
                for (int xi = 0; xi < PATCH; xi++) columns[xi][c] = transformed[xi];
            }
            for (int xi = 0; xi < PATCH; xi++) { /* then B to each row */
                input_transform(columns[xi], transformed);
                for (int nu = 0; nu < PATCH; nu++)
                    _mm512_mask_storeu_ps(v + ((xi * PATCH + nu) * g->cin + ci) * g->tiles + p0, valid,
                                          transformed[nu]);
            }
        }
    return !bad;
}

/* out = epilogue(A^T M A) (images of out `out_bs` floats apart), each 4x4 tile cut at the output's edge: 16 values
 * of M's rows at a time (16 tiles of an output channel, or 16 output channels of a tile where M's rows are tiles),
 * transposed in registers so each tile is four short row stores. Without a residual the epilogue applies before
 * the transpose, to the 16 points of the tiles (lanes: the tiles, of one bias, or the channels, a bias each); a
 * residual is read tile by tile after it. */
static void transform_output(const geometry *g, const float *m, int tiles_as_rows, const float *bias, float alpha,
                             const float *residual, int32_t activation, float *out, int64_t out_bs) {
    int64_t positions = g->oh * g->ow;
    int64_t rows = tiles_as_rows ? g->tiles : g->cout, columns = tiles_as_rows ? g->cout : g->tiles;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c0 = 0; c0 < columns; c0 += 16) {
            __mmask16 valid = tg_tail_mask(columns - c0);
            v16 rows_t[PATCH][TILE], column[PATCH], y[TILE], tile_values[16];
            for (int xi = 0; xi < PATCH; xi++) { /* A^T applied to each row of the transformed tiles */
                for (int nu = 0; nu < PATCH; nu++)
                    column[nu] = _mm512_maskz_loadu_ps(valid, m + ((xi * PATCH + nu) * rows + r) * columns + c0);
                output_transform(column, rows_t[xi]);
            }
            for (int j = 0; j < TILE; j++) { /* then A to each column */
                for (int xi = 0; xi < PATCH; xi++) column[xi] = rows_t[xi][j];
                output_transform(column, y);
                for (int i = 0; i < TILE; i++) tile_values[i * TILE + j] = y[i];
            }
            int64_t co = tiles_as_rows ? c0 : r;
            if (!residual) {
                tg_epilogue ep = tg_epilogue_of(alpha, activation, bias ? bias + co : NULL, 0, tiles_as_rows, NULL, 0);
                for (int k = 0; k < 16; k++) tile_values[k] = tg_epilogue_apply(tile_values[k], &ep, 0, 0, valid);
            }
            tg_transpose_16x16(tile_values); /* tile_values[lane], lane i * 4 + j of its tile */
            float values[16] __attribute__((aligned(64))), residual_tile[16] __attribute__((aligned(64)));
            tile_place place = tile_place_of(g, tiles_as_rows ? r : c0);
            for (int64_t l = 0; l < 16 && c0 + l < columns; l++) { /* lane l: the next tile, or the next channel */
                int64_t top = place.row * TILE, left = place.column * TILE;
                int64_t height = g->oh - top < TILE ? g->oh - top : TILE;
                __mmask8 width = (__mmask8)((1u << (g->ow - left < TILE ? g->ow - left : TILE)) - 1);
                int64_t at = co * positions + top * g->ow + left;
                v16 tile = tile_values[l];
                if (residual) {
                    const float *add = residual + place.image * g->cout * positions + at;
                    for (int64_t i = 0; i < TILE; i++) /* the tile's residual, laid out as tile_values[l] */
                        _mm_store_ps(residual_tile + TILE * i,
                                     i < height ? _mm_maskz_loadu_ps(width, add + i * g->ow) : _mm_setzero_ps());
                    tg_epilogue ep = tg_epilogue_of(alpha, activation, bias ? bias + co : NULL, 0, 0, residual_tile, 0);
                    tile = tg_epilogue_apply(tile, &ep, 0, 0, (__mmask16)0xFFFF);
                }
                _mm512_store_ps(values, tile);
                for (int64_t i = 0; i < height; i++)
                    _mm_mask_storeu_ps(out + place.image * out_bs + at + i * g->ow, width,
                                       _mm_load_ps(values + TILE * i));
                if (tiles_as_rows)
                    co++;
                else
                    next_tile(g, &place);
            }
        }
}

/* Scratch kept by the calling thread for its next call (tg_scratch_reserve: grown when too small): V and M, and U
 * where a call transforms the weights itself. Freed after each call, glibc handed the next call's block fresh pages
 * (faulted in again: 29 MB for ResNet-18's layer1 at batch 8) whenever other allocations had taken the freed one,
 * which made calls interleaved with other programs 2.5x slower (bench/NOTES.md). */
static _Thread_local tg_scratch work_scratch, weights_scratch;

/* At most about this many tiles (4x4 outputs) are transformed and multiplied at a time, in groups of whole images
 * (at least one): V and M grow with the tiles (36 x (cin + cout) floats each), and at batch 8 of 55x55 images
 * (1568 tiles, 14 MB of M for 64 output channels) the products and the output transform waited on memory, 1.9x
 * slower per image than at batch 1. Each group reads U again (36 x cin x cout floats), a small share of its
 * products at this many tiles, and the GEMM reads it in place up to 256 tiles (gemm.c, A_IN_PLACE_COLUMNS). */
enum { GROUP_TILES = 256 };

/* Whether Winograd takes this conv (a 3x3 kernel at stride 1 and dilation 1, a known activation, offsets within
 * int32), and its geometry for a group of images (g->n of them, g->tiles tiles). */
static int winograd_geometry(int64_t n, int64_t cin, int64_t h, int64_t w, int64_t cout, int64_t kh, int64_t kw,
                             int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                             int64_t dilation_w, int64_t out_bs, int32_t activation, geometry *g) {
    *g = (geometry){n, cin, h, w, cout, pad_h, pad_w, h + 2 * pad_h - 2, w + 2 * pad_w - 2};
    g->tiles_h = (g->oh + TILE - 1) / TILE, g->tiles_w = (g->ow + TILE - 1) / TILE;
    /* a conv Winograd does not take (a 1x1 kernel on an image under 3 rows) may have no 3x3 tiles: no group */
    int64_t per_image = g->tiles_h * g->tiles_w;
    int64_t group = per_image >= GROUP_TILES || per_image <= 0 ? 1 : GROUP_TILES / per_image;
    g->n = group < n ? group : n, g->tiles = g->n * per_image;
    return kh == 3 && kw == 3 && stride_h == 1 && stride_w == 1 && dilation_h == 1 && dilation_w == 1 && pad_h >= 0 &&
           pad_w >= 0 && tg_conv_activation_known(activation) && g->oh > 0 && g->ow > 0 && n > 0 && cin > 0 &&
           cout > 0 && g->n * cin * h * w < INT32_MAX / 2 && /* gather offsets are int32 */
           (n == 1 || out_bs >= cout * g->oh * g->ow);      /* else refused by tg_conv2d_f32 */
}

/* At most this many tiles (the GEMM's few-row kernel, gemv.c's TG_GEMV_ROWS) are the rows of M's GEMMs, which then
 * stream each point's U once where it lies, dot products along its rows: as a 16-column register tile for so few
 * columns the blocked GEMM took 2.3x as long (7x7 images at batch 1, 512 channels each side: bench/NOTES.md). */
enum { FEW_TILES = 4 };

/* Multiply-adds of the GEMM's register tiles (TG_MR rows by 16-column vectors) for M's rows by its columns. */
static int64_t padded_work(int64_t rows, int64_t columns) {
    return (rows + TG_MR - 1) / TG_MR * TG_MR * ((columns + 15) / 16 * 16);
}

/* Whether M's GEMMs take the group's tiles as rows (M[point]^T = V[point]^T @ U[point]^T, U packed as B down its
 * rows: tg_pack_b_strided's transposes) rather than output channels (U read in place as A): at most FEW_TILES
 * tiles, or where the register tiles would pad the tiles' columns at least 5% more than they pad the tiles' rows
 * (ResNet's 56x56 and 28x28 layers, 196 and 49 tiles an image: 3-7% faster as rows; 14x14 at batch 1, 16 tiles
 * of 256 channels, 17% slower), and the reduction is not short (16 input channels, SqueezeNet's 55x55 at batch 8:
 * 5% slower as rows). bench/NOTES.md, 2026-11-29. */
static int tiles_as_rows(const geometry *g) {
    if (g->tiles <= FEW_TILES) return 1;
    return g->cin >= 32 && 20 * padded_work(g->tiles, g->cout) <= 19 * padded_work(g->cout, g->tiles);
}

/* The conv of images first..first+g->n of the call (x, out and residual already offset to them) with the weights'
 * transform u: V and M in `scratch`. */
static int winograd_group(const geometry *g, const float *x, const float *u, float *scratch, const float *bias,
                          float alpha, const float *residual, int32_t activation, float *out, int64_t out_bs) {
    float *v = scratch, *m = v + (size_t)POINTS * g->tiles * g->cin;
    if (!transform_input(g, x, v)) return 0;
    int by_tiles = tiles_as_rows(g);
    int64_t rows = by_tiles ? g->tiles : g->cout, columns = by_tiles ? g->cout : g->tiles;
    /* M[point]^T = V[point]^T @ U[point]^T (U's rows B's columns), or M[point] = U[point] @ V[point] */
    const float *a = by_tiles ? v : u, *b = by_tiles ? u : v;
    int64_t u_size = g->cout * g->cin, v_size = g->cin * g->tiles;
    int64_t a_size = by_tiles ? v_size : u_size, b_size = by_tiles ? u_size : v_size;
    int status = tg_gemm_f32(POINTS, rows, columns, g->cin, a, a_size, by_tiles ? 1 : g->cin, by_tiles ? g->tiles : 1,
                             b, b_size, by_tiles ? 1 : g->tiles, by_tiles ? g->cin : 1, m, rows * columns, columns,
                             1.0f, NULL, 0, 0, 0, NULL, 0, 0, TG_ACT_NONE, TG_ACT_NONE, TG_ACT_NONE);
    if (status == TG_GEMM_OK) transform_output(g, m, by_tiles, bias, alpha, residual, activation, out, out_bs);
    return status == TG_GEMM_OK;
}

int tg_conv2d_winograd_prepared_f32(int64_t n, int64_t cin, int64_t h, int64_t w, int64_t cout, int64_t kh,
                                    int64_t kw, int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                    int64_t dilation_h, int64_t dilation_w, const float *x, const float *weight,
                                    const float *bias, float *out, int64_t out_bs, float alpha, const float *residual,
                                    int32_t activation, const float *u) {
    geometry g;
    int winograd = winograd_geometry(n, cin, h, w, cout, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                     dilation_w, out_bs, activation, &g);
    int weights_finite = winograd && u[POINTS * (size_t)cin * cout] != 0.0f;
    float *scratch = weights_finite ? tg_scratch_reserve(&work_scratch, (size_t)POINTS * g.tiles * (cin + cout)) : NULL;
    int64_t image_size = cin * h * w, positions = g.oh * g.ow, per_image = g.tiles_h * g.tiles_w, first = 0;
    const float *residual_at = residual;
    for (; scratch && first < n; first += g.n) {
        geometry part = g;
        part.n = n - first < g.n ? n - first : g.n, part.tiles = part.n * per_image;
        residual_at = residual ? residual + first * cout * positions : NULL;
        if (!winograd_group(&part, x + first * image_size, u, scratch, bias, alpha, residual_at, activation,
                            out + first * out_bs, out_bs))
            break;
    }
    if (scratch && first >= n) return TG_GEMM_OK;
    /* the images from the first group it could not take (a non-finite weight or input: the direct sum's NaN and
     * infinities; or no memory) by the implicit GEMM; the groups before it are done */
    return tg_conv2d_f32(n - first, cin, h, w, cout, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h,
                         dilation_w, x + first * image_size, weight, bias, out + first * out_bs, out_bs, alpha,
                         residual_at, activation);
}

int tg_conv2d_winograd_f32(int64_t n, int64_t cin, int64_t h, int64_t w, int64_t cout, int64_t kh, int64_t kw,
                           int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                           int64_t dilation_w, const float *x, const float *weight, const float *bias, float *out,
                           int64_t out_bs, float alpha, const float *residual, int32_t activation) {
    geometry g;
    int winograd = winograd_geometry(n, cin, h, w, cout, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                     dilation_w, out_bs, activation, &g);
    float *u = winograd ? tg_scratch_reserve(&weights_scratch, (size_t)POINTS * cin * cout + 1) : NULL;
    if (!u)
        return tg_conv2d_f32(n, cin, h, w, cout, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, x,
                             weight, bias, out, out_bs, alpha, residual, activation);
    tg_winograd_weights_f32(cout, cin, weight, u);
    return tg_conv2d_winograd_prepared_f32(n, cin, h, w, cout, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                           dilation_w, x, weight, bias, out, out_bs, alpha, residual, activation, u);
}
