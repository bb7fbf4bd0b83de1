/* Fast Fourier transforms (fft.h): Stockham autosort passes, Bluestein for large prime factors, the real
 * transforms as a complex one of half the length.
 *
 * Rows are transformed LANES at a time in planar form: real and imaginary parts in separate arrays, element j
 * of lane l at [j * lanes + l]. A Stockham pass's innermost loop then runs over contiguous floats (lanes times
 * the pass's stride), which the compiler vectorizes. A single row (lanes = 1, whose first passes would not
 * vectorize) of FOUR_STEP_MIN points or more runs as a four-step transform (`four_step`): transforms of blocks of
 * its columns, then of its rows, as lanes in cache, so a row too long for the caches crosses them twice instead
 * of once a pass, and threads share whole blocks in one region instead of splitting every pass. */
#include "fft.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LANES 8
#define MAX_STAGES 64
#define PARALLEL_MIN 16384 /* butterflies of one pass worth splitting across threads */
#define TILE_FRAMES 32 /* STFT frames transformed together before their rows are copied out */
#define PREFETCH_ROWS 4 /* a tile's output rows prefetched for writing this far ahead of the copy */
#define FOUR_STEP_MIN 1024 /* a single row's length from which the four-step transform runs */
#define FOUR_STEP_PARALLEL_MIN 8192 /* a four-step transform's length worth sharing between threads */
#define COLUMN_BLOCK 16 /* four-step columns transformed together: a whole 64-byte line of each planar row */
#define ROW_BLOCK (2 * LANES) /* four-step rows transformed together (LANES at a time): they write whole lines */

typedef struct {
    float *re, *im;
} planar;

typedef struct plan {
    int64_t n;
    int sign;
    int stages;
    int radix[MAX_STAGES];
    planar twiddle[MAX_STAGES]; /* pass i: W_len^(j k) at [j (p - 1) + k - 1], len the pass's sub-length */
    planar roots[MAX_STAGES];   /* pass i: W_p^k, k < p, for the generic butterfly */
    /* Bluestein (stages == 0, n > 1): chirp w_j = exp(sign pi i j^2 / n), the filter's transform / m. */
    int64_t m;
    struct plan *forward, *inverse;
    planar chirp, filter;
    planar half; /* W_n^k, k <= n/2: the real transforms' split (built on first use) */
    /* Four-step (for a single row, n >= FOUR_STEP_MIN; else NULL): x[j1 n2 + j2] as an n1 x n2 matrix,
     * transforms of length n1 and n2; the twiddle W_n^(k1 (b COLUMN_BLOCK + l)) as fine[k1 COLUMN_BLOCK + l]
     * times coarse[b n1 + k1]. */
    struct plan *columns, *rows;
    planar fine, coarse;
    struct plan *next;
} plan;

static pthread_mutex_t plans_lock = PTHREAD_MUTEX_INITIALIZER;
static plan *plans;

static int allocate(planar *a, int64_t count) {
    a->re = malloc(sizeof(float) * (size_t)(count + 1));
    a->im = malloc(sizeof(float) * (size_t)(count + 1));
    return a->re && a->im;
}

static void set_root(planar a, int64_t at, double angle) {
    a.re[at] = (float)cos(angle), a.im[at] = (float)sin(angle);
}

static double angle_of(int sign, int64_t k, int64_t n) { return sign * 2.0 * M_PI * (double)(k % n) / (double)n; }

static plan *build_plan(int64_t n, int sign);
static void transform(const plan *pl, planar x, planar y, float *scratch, int64_t lanes, int parallel);
static int64_t scratch_floats(const plan *pl, int64_t lanes);

/* Radix 8 while it divides (with AVX-512's 32 vector registers only: in 16 its butterfly spills, and radix 4 ran
 * faster, bench/NOTES.md), then 4, 2 and odd primes up to TG_FFT_MAX_RADIX; 0 when a larger prime remains. */
static int factorize(int64_t n, int *radix) {
    int count = 0;
#if defined(__AVX512F__)
    while (n % 8 == 0) radix[count++] = 8, n /= 8;
#endif
    while (n % 4 == 0) radix[count++] = 4, n /= 4;
    while (n % 2 == 0) radix[count++] = 2, n /= 2;
    for (int p = 3; p <= TG_FFT_MAX_RADIX && n > 1; p += 2)
        while (n % p == 0) radix[count++] = p, n /= p;
    return n == 1 ? count : 0;
}

static int build_stockham(plan *pl) {
    int64_t len = pl->n;
    for (int i = 0; i < pl->stages; i++) {
        const int p = pl->radix[i];
        const int64_t m = len / p;
        if (!allocate(&pl->twiddle[i], m * (p - 1)) || !allocate(&pl->roots[i], p)) return 0;
        for (int64_t j = 0; j < m; j++)
            for (int k = 1; k < p; k++) set_root(pl->twiddle[i], j * (p - 1) + k - 1, angle_of(pl->sign, j * k, len));
        for (int k = 0; k < p; k++) set_root(pl->roots[i], k, angle_of(pl->sign, k, p));
        len = m;
    }
    return 1;
}

static int build_bluestein(plan *pl) {
    const int64_t n = pl->n;
    int64_t m = 1;
    while (m < 2 * n - 1) m *= 2;
    pl->m = m;
    pl->forward = build_plan(m, -1);
    pl->inverse = build_plan(m, 1);
    planar b;
    float *work = malloc(sizeof(float) * (size_t)scratch_floats(pl->forward, 1));
    if (!pl->forward || !pl->inverse || !work || !allocate(&pl->chirp, n) || !allocate(&pl->filter, m) ||
        !allocate(&b, m)) {
        free(work);
        return 0;
    }
    memset(b.re, 0, sizeof(float) * (size_t)m), memset(b.im, 0, sizeof(float) * (size_t)m);
    for (int64_t j = 0; j < n; j++) {
        const int64_t square = (int64_t)((unsigned __int128)j * j % (unsigned __int128)(2 * n));
        const double angle = pl->sign * M_PI * (double)square / (double)n;
        set_root(pl->chirp, j, angle);
        b.re[j] = (float)(cos(angle) / m), b.im[j] = (float)(-sin(angle) / m);
        if (j) b.re[m - j] = b.re[j], b.im[m - j] = b.im[j];
    }
    transform(pl->forward, b, pl->filter, work, 1, 0);
    free(b.re), free(b.im), free(work);
    return 1;
}

/* The four-step row length n2 for n: the smallest divisor from sqrt(n) on with n2 a multiple of COLUMN_BLOCK and
 * n / n2 of ROW_BLOCK; 0 if none. */
static int64_t four_step_split(int64_t n) {
    int64_t n2 = COLUMN_BLOCK;
    while (n2 * n2 < n) n2 += COLUMN_BLOCK;
    for (; n2 * ROW_BLOCK <= n; n2 += COLUMN_BLOCK)
        if (n % n2 == 0 && n / n2 % ROW_BLOCK == 0) return n2;
    return 0;
}

static int build_four_step(plan *pl, int64_t n2) {
    const int64_t n = pl->n, n1 = n / n2, blocks = n2 / COLUMN_BLOCK;
    pl->columns = build_plan(n1, pl->sign), pl->rows = build_plan(n2, pl->sign);
    if (!pl->columns || !pl->rows || !allocate(&pl->fine, n1 * COLUMN_BLOCK) || !allocate(&pl->coarse, n1 * blocks))
        return 0;
    for (int64_t k = 0; k < n1; k++) {
        for (int l = 0; l < COLUMN_BLOCK; l++) set_root(pl->fine, k * COLUMN_BLOCK + l, angle_of(pl->sign, k * l, n));
        for (int64_t b = 0; b < blocks; b++)
            set_root(pl->coarse, b * n1 + k, angle_of(pl->sign, k * b * COLUMN_BLOCK, n));
    }
    return 1;
}

static plan *build_plan(int64_t n, int sign) {
    pthread_mutex_lock(&plans_lock);
    plan *pl = plans;
    while (pl && (pl->n != n || pl->sign != sign)) pl = pl->next;
    pthread_mutex_unlock(&plans_lock);
    if (pl) return pl;
    pl = calloc(1, sizeof(plan));
    if (!pl) return NULL;
    pl->n = n, pl->sign = sign;
    pl->stages = n > 1 ? factorize(n, pl->radix) : 0;
    const int ok = pl->stages || n == 1 ? build_stockham(pl) : build_bluestein(pl);
    const int64_t n2 = pl->stages && n >= FOUR_STEP_MIN ? four_step_split(n) : 0;
    if (!ok || (n2 && !build_four_step(pl, n2)))
        return NULL; /* out of memory: what was allocated stays (rare, and the process is in trouble) */
    pthread_mutex_lock(&plans_lock);
    pl->next = plans, plans = pl;
    pthread_mutex_unlock(&plans_lock);
    return pl;
}

static planar half_twiddles(plan *pl, int64_t n) {
    pthread_mutex_lock(&plans_lock);
    if (!pl->half.re) {
        planar half;
        if (allocate(&half, n / 2 + 1)) {
            for (int64_t k = 0; k <= n / 2; k++) set_root(half, k, angle_of(pl->sign, k, n));
            pl->half = half;
        }
    }
    pthread_mutex_unlock(&plans_lock);
    return pl->half;
}

#define CMUL_RE(ar, ai, br, bi) ((ar) * (br) - (ai) * (bi))
#define CMUL_IM(ar, ai, br, bi) ((ar) * (bi) + (ai) * (br))

#if defined(__AVX2__) && LANES == 8
/* column[c] = (rows[0][at + c], ..., rows[7][at + c]): an 8 x 8 block transposed in registers. */
static inline void transpose8(const float *const *rows, int64_t at, __m256 column[8]) {
    __m256 r[8], t[8], u[8];
    for (int l = 0; l < 8; l++) r[l] = _mm256_loadu_ps(rows[l] + at);
    for (int l = 0; l < 8; l += 2) t[l] = _mm256_unpacklo_ps(r[l], r[l + 1]), t[l + 1] = _mm256_unpackhi_ps(r[l], r[l + 1]);
    for (int l = 0; l < 8; l += 4) {
        u[l] = _mm256_shuffle_ps(t[l], t[l + 2], 0x44), u[l + 1] = _mm256_shuffle_ps(t[l], t[l + 2], 0xEE);
        u[l + 2] = _mm256_shuffle_ps(t[l + 1], t[l + 3], 0x44), u[l + 3] = _mm256_shuffle_ps(t[l + 1], t[l + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++)
        column[c] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x20), column[c + 4] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x31);
}
#endif

#if defined(__AVX2__)
/* The pairs (re[l], im[l]), l < 8, to `to`. */
static inline void store_pairs(__m256 re, __m256 im, float *to) {
    const __m256 low = _mm256_unpacklo_ps(re, im), high = _mm256_unpackhi_ps(re, im); /* pairs 0145 2367 */
    _mm256_storeu_ps(to, _mm256_permute2f128_ps(low, high, 0x20));
    _mm256_storeu_ps(to + 8, _mm256_permute2f128_ps(low, high, 0x31));
}
#endif

#if defined(__AVX2__)
/* The real and imaginary parts of the 8 pairs at `from`. */
static inline void load_pairs(const float *from, __m256 *re, __m256 *im) {
    const __m256 a = _mm256_loadu_ps(from), b = _mm256_loadu_ps(from + 8);
    const __m256d evens = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88));
    const __m256d odds = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD));
    *re = _mm256_castpd_ps(_mm256_permute4x64_pd(evens, 0xD8)); /* shuffled: elements 0145 2367 */
    *im = _mm256_castpd_ps(_mm256_permute4x64_pd(odds, 0xD8));
}
#endif

/* re[l], im[l] = the pair l of `from`, l < 8. */
static inline void pairs_to_planar8(const float *from, float *re, float *im) {
#if defined(__AVX2__)
    __m256 r, i;
    load_pairs(from, &r, &i);
    _mm256_storeu_ps(re, r), _mm256_storeu_ps(im, i);
#else
    for (int l = 0; l < 8; l++) re[l] = from[2 * l], im[l] = from[2 * l + 1];
#endif
}

/* The pairs (re[l], im[l]), l < 8, to `to`. */
static inline void planar_to_pairs8(const float *re, const float *im, float *to) {
#if defined(__AVX2__)
    store_pairs(_mm256_loadu_ps(re), _mm256_loadu_ps(im), to);
#else
    for (int l = 0; l < 8; l++) to[2 * l] = re[l], to[2 * l + 1] = im[l];
#endif
}

/* One Stockham pass over butterflies j in [jlo, jhi), q in [qlo, qhi): a_r = x[q + s (j + r m)], the p-point
 * transform b, y[q + s (p j + k)] = b_k W_len^(j k). */
static void pass(const float *restrict xr, const float *restrict xi, float *restrict yr, float *restrict yi,
                 int64_t len, int64_t s, int p, planar tw, planar roots, int sign, int64_t jlo, int64_t jhi,
                 int64_t qlo, int64_t qhi) {
    const int64_t m = len / p, sm = s * m;
    for (int64_t j = jlo; j < jhi; j++) {
        const int64_t at = j * s, to = p * j * s; /* indexing the restrict arguments themselves vectorizes */
        if (p == 2) {
            const float wr = tw.re[j], wi = tw.im[j];
#pragma GCC ivdep /* q < s: the p output runs of length s never overlap */
            for (int64_t q = qlo; q < qhi; q++) {
                const float dr = xr[at + q] - xr[at + q + sm], di = xi[at + q] - xi[at + q + sm];
                yr[to + q] = xr[at + q] + xr[at + q + sm], yi[to + q] = xi[at + q] + xi[at + q + sm];
                yr[to + q + s] = CMUL_RE(dr, di, wr, wi), yi[to + q + s] = CMUL_IM(dr, di, wr, wi);
            }
        } else if (p == 4) {
            const float w1r = tw.re[3 * j], w1i = tw.im[3 * j], w2r = tw.re[3 * j + 1], w2i = tw.im[3 * j + 1];
            const float w3r = tw.re[3 * j + 2], w3i = tw.im[3 * j + 2], turn = (float)sign;
#pragma GCC ivdep /* q < s: the p output runs of length s never overlap */
            for (int64_t q = qlo; q < qhi; q++) {
                const int64_t i0 = at + q, i1 = i0 + sm, i2 = i1 + sm, i3 = i2 + sm;
                const float t0r = xr[i0] + xr[i2], t0i = xi[i0] + xi[i2], t1r = xr[i0] - xr[i2], t1i = xi[i0] - xi[i2];
                const float t2r = xr[i1] + xr[i3], t2i = xi[i1] + xi[i3], dr = xr[i1] - xr[i3], di = xi[i1] - xi[i3];
                const float t3r = -turn * di, t3i = turn * dr; /* (a1 - a3) * sign i */
                const float u1r = t1r + t3r, u1i = t1i + t3i, u2r = t0r - t2r, u2i = t0i - t2i;
                const float u3r = t1r - t3r, u3i = t1i - t3i;
                yr[to + q] = t0r + t2r, yi[to + q] = t0i + t2i;
                yr[to + q + s] = CMUL_RE(u1r, u1i, w1r, w1i), yi[to + q + s] = CMUL_IM(u1r, u1i, w1r, w1i);
                yr[to + q + 2 * s] = CMUL_RE(u2r, u2i, w2r, w2i), yi[to + q + 2 * s] = CMUL_IM(u2r, u2i, w2r, w2i);
                yr[to + q + 3 * s] = CMUL_RE(u3r, u3i, w3r, w3i), yi[to + q + 3 * s] = CMUL_IM(u3r, u3i, w3r, w3i);
            }
        } else if (p == 8) {
            const float *w = tw.re + 7 * j, *v = tw.im + 7 * j, turn = (float)sign, root = (float)M_SQRT1_2;
#pragma GCC ivdep
            for (int64_t q = qlo; q < qhi; q++) {
                float er[4], ei[4], or_[4], oi[4], br[8], bi[8];
                for (int r = 0; r < 4; r++) { /* radix 2 across r and r + 4, odd halves turned by W8^r */
                    const int64_t i0 = at + q + r * sm, i1 = i0 + 4 * sm;
                    er[r] = xr[i0] + xr[i1], ei[r] = xi[i0] + xi[i1];
                    or_[r] = xr[i0] - xr[i1], oi[r] = xi[i0] - xi[i1];
                }
                const float o1r = root * (or_[1] - turn * oi[1]), o1i = root * (oi[1] + turn * or_[1]);
                const float o2r = -turn * oi[2], o2i = turn * or_[2];
                const float o3r = root * (-or_[3] - turn * oi[3]), o3i = root * (-oi[3] + turn * or_[3]);
                or_[1] = o1r, oi[1] = o1i, or_[2] = o2r, oi[2] = o2i, or_[3] = o3r, oi[3] = o3i;
                for (int odd = 0; odd < 2; odd++) { /* 4-point transforms: even outputs from e, odd from o */
                    const float *ar = odd ? or_ : er, *ai = odd ? oi : ei;
                    const float t0r = ar[0] + ar[2], t0i = ai[0] + ai[2], t1r = ar[0] - ar[2], t1i = ai[0] - ai[2];
                    const float t2r = ar[1] + ar[3], t2i = ai[1] + ai[3], dr = ar[1] - ar[3], di = ai[1] - ai[3];
                    const float t3r = -turn * di, t3i = turn * dr;
                    br[odd] = t0r + t2r, bi[odd] = t0i + t2i, br[odd + 2] = t1r + t3r, bi[odd + 2] = t1i + t3i;
                    br[odd + 4] = t0r - t2r, bi[odd + 4] = t0i - t2i, br[odd + 6] = t1r - t3r, bi[odd + 6] = t1i - t3i;
                }
                yr[to + q] = br[0], yi[to + q] = bi[0];
                for (int k = 1; k < 8; k++)
                    yr[to + q + k * s] = CMUL_RE(br[k], bi[k], w[k - 1], v[k - 1]),
                    yi[to + q + k * s] = CMUL_IM(br[k], bi[k], w[k - 1], v[k - 1]);
            }
        } else {
            for (int k = 0; k < p; k++) {
                const float wr = k ? tw.re[j * (p - 1) + k - 1] : 1.0f, wi = k ? tw.im[j * (p - 1) + k - 1] : 0.0f;
    #pragma GCC ivdep /* q < s: the p output runs of length s never overlap */
            for (int64_t q = qlo; q < qhi; q++) {
                    float sr = xr[at + q], si = xi[at + q];
                    for (int r = 1; r < p; r++) {
                        const int64_t root = (int64_t)r * k % p;
                        const float vr = xr[at + q + r * sm], vi = xi[at + q + r * sm];
                        sr += CMUL_RE(vr, vi, roots.re[root], roots.im[root]);
                        si += CMUL_IM(vr, vi, roots.re[root], roots.im[root]);
                    }
                    yr[to + q + k * s] = CMUL_RE(sr, si, wr, wi), yi[to + q + k * s] = CMUL_IM(sr, si, wr, wi);
                }
            }
        }
    }
}

/* Chunk c of `chunks` of pass i (sub-length len, stride s): the longer of its two loops split. */
static void pass_chunk(const plan *pl, int i, planar from, planar to, int64_t len, int64_t s, int c, int chunks) {
    const int p = pl->radix[i];
    const int64_t m = len / p;
    const int by_j = m >= chunks;
    const int64_t extent = by_j ? m : s, lo = extent * c / chunks, hi = extent * (c + 1) / chunks;
    pass(from.re, from.im, to.re, to.im, len, s, p, pl->twiddle[i], pl->roots[i], pl->sign, by_j ? lo : 0,
         by_j ? hi : m, by_j ? 0 : lo, by_j ? s : hi);
}

static void four_step(const plan *pl, planar x, planar y, float *scratch, int parallel);

static void stockham(const plan *pl, planar x, planar y, float *scratch, int64_t lanes, int parallel) {
    if (lanes == 1 && pl->columns) {
        four_step(pl, x, y, scratch, parallel);
        return;
    }
    const int64_t size = pl->n * lanes;
    if (pl->stages == 0) {
        memcpy(y.re, x.re, sizeof(float) * (size_t)size), memcpy(y.im, x.im, sizeof(float) * (size_t)size);
        return;
    }
    const planar spare = {scratch, scratch + size};
    int64_t len = pl->n, s = lanes;
    planar from = x;
    for (int i = 0; i < pl->stages; i++) {
        const planar to = (pl->stages - i) % 2 ? y : spare;
        const int p = pl->radix[i];
        const int64_t m = len / p;
        if (parallel && m * s >= PARALLEL_MIN) { /* never an unsplit region: it costs futex calls all the same */
            const int chunks = 4 * omp_get_max_threads();
#pragma omp parallel for schedule(static)
            for (int c = 0; c < chunks; c++) pass_chunk(pl, i, from, to, len, s, c, chunks);
        } else {
            pass_chunk(pl, i, from, to, len, s, 0, 1);
        }
        from = to, len /= p, s *= p;
    }
}

/* y = the transform of x (`lanes` transforms, planar; x is kept); scratch: `scratch_floats`. */
static void transform(const plan *pl, planar x, planar y, float *scratch, int64_t lanes, int parallel) {
    if (pl->stages || pl->n == 1) {
        stockham(pl, x, y, scratch, lanes, parallel);
        return;
    }
    const int64_t n = pl->n, size = pl->m * lanes;
    const planar a = {scratch, scratch + size}, b = {scratch + 2 * size, scratch + 3 * size};
    for (int64_t j = 0; j < n; j++)
        for (int64_t l = 0; l < lanes; l++) {
            const float vr = x.re[j * lanes + l], vi = x.im[j * lanes + l], wr = pl->chirp.re[j], wi = pl->chirp.im[j];
            b.re[j * lanes + l] = CMUL_RE(vr, vi, wr, wi), b.im[j * lanes + l] = CMUL_IM(vr, vi, wr, wi);
        }
    memset(b.re + n * lanes, 0, sizeof(float) * (size_t)(size - n * lanes));
    memset(b.im + n * lanes, 0, sizeof(float) * (size_t)(size - n * lanes));
    stockham(pl->forward, b, a, scratch + 4 * size, lanes, parallel);
    for (int64_t k = 0; k < pl->m; k++)
        for (int64_t l = 0; l < lanes; l++) {
            const float vr = a.re[k * lanes + l], vi = a.im[k * lanes + l], fr = pl->filter.re[k], fi = pl->filter.im[k];
            a.re[k * lanes + l] = CMUL_RE(vr, vi, fr, fi), a.im[k * lanes + l] = CMUL_IM(vr, vi, fr, fi);
        }
    stockham(pl->inverse, a, b, scratch + 4 * size, lanes, parallel);
    for (int64_t k = 0; k < n; k++)
        for (int64_t l = 0; l < lanes; l++) {
            const float vr = b.re[k * lanes + l], vi = b.im[k * lanes + l], wr = pl->chirp.re[k], wi = pl->chirp.im[k];
            y.re[k * lanes + l] = CMUL_RE(vr, vi, wr, wi), y.im[k * lanes + l] = CMUL_IM(vr, vi, wr, wi);
        }
}

static int64_t four_step_floats(const plan *pl);

static int64_t scratch_floats(const plan *pl, int64_t lanes) {
    if (!pl->stages && pl->n > 1) return 4 * pl->m * lanes + scratch_floats(pl->forward, lanes); /* Bluestein */
    const int64_t passes = 2 * pl->n * lanes, four = lanes == 1 && pl->columns ? four_step_floats(pl) : 0;
    return passes > four ? passes : four;
}

/* lanes[j LANES + l] = rows[l][j], j < COLUMN_BLOCK: LANES rows of a four-step block as lanes. */
static void rows_to_lanes(const float *const *rows, float *lanes) {
#if defined(__AVX2__) && LANES == 8
    for (int j = 0; j < COLUMN_BLOCK; j += 8) {
        __m256 column[8];
        transpose8(rows, j, column);
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(lanes + (j + c) * 8, column[c]);
    }
#else
    for (int j = 0; j < COLUMN_BLOCK; j++)
        for (int l = 0; l < LANES; l++) lanes[j * LANES + l] = rows[l][j];
#endif
}

/* The four-step transform's intermediate t holds its rows k1 in groups of LANES as lanes: (k1, j2) at
 * [(k1 - k1 % LANES) n2 + j2 LANES + k1 % LANES], so that a group's row transforms read it in place. */

/* Columns [c, c + COLUMN_BLOCK) of the four-step transform, c = b COLUMN_BLOCK: t(k1, c + l) = W_n^(k1 (c + l))
 * times the n1-point transform of column c + l of x (planar, or pairs in x.re when x.im is NULL). */
static void four_step_columns(const plan *pl, planar x, planar t, int64_t b, float *work) {
    const int64_t n1 = pl->columns->n, n2 = pl->rows->n, size = n1 * COLUMN_BLOCK, c = b * COLUMN_BLOCK;
    const planar in = {work, work + size}, out = {work + 2 * size, work + 3 * size};
    for (int64_t j = 0; j < n1; j++) {
        float *re = in.re + j * COLUMN_BLOCK, *im = in.im + j * COLUMN_BLOCK;
        const int64_t at = j * n2 + c;
        if (x.im)
            memcpy(re, x.re + at, sizeof(float) * COLUMN_BLOCK), memcpy(im, x.im + at, sizeof(float) * COLUMN_BLOCK);
        else
            for (int l = 0; l < COLUMN_BLOCK; l += 8) pairs_to_planar8(x.re + 2 * (at + l), re + l, im + l);
    }
    transform(pl->columns, in, out, work + 4 * size, COLUMN_BLOCK, 0);
    for (int64_t k = 0; k < n1; k++) {
        const float cr = pl->coarse.re[b * n1 + k], ci = pl->coarse.im[b * n1 + k];
        const float *fr = pl->fine.re + k * COLUMN_BLOCK, *fi = pl->fine.im + k * COLUMN_BLOCK;
        float *re = out.re + k * COLUMN_BLOCK, *im = out.im + k * COLUMN_BLOCK;
        for (int l = 0; l < COLUMN_BLOCK; l++) {
            const float wr = CMUL_RE(cr, ci, fr[l], fi[l]), wi = CMUL_IM(cr, ci, fr[l], fi[l]), vr = re[l], vi = im[l];
            re[l] = CMUL_RE(vr, vi, wr, wi), im[l] = CMUL_IM(vr, vi, wr, wi);
        }
    }
    for (int64_t k = 0; k < n1; k += LANES) {
        const float *re[LANES], *im[LANES];
        for (int l = 0; l < LANES; l++)
            re[l] = out.re + (k + l) * COLUMN_BLOCK, im[l] = out.im + (k + l) * COLUMN_BLOCK;
        rows_to_lanes(re, t.re + k * n2 + c * LANES), rows_to_lanes(im, t.im + k * n2 + c * LANES);
    }
}

/* Rows [r, r + ROW_BLOCK) of the four-step transform, LANES at a time: y[r + l + n1 k2] = the n2-point transform of
 * row r + l of t (y planar, or pairs in y.re when y.im is NULL). */
static void four_step_rows(const plan *pl, planar t, planar y, int64_t r, float *work) {
    const int64_t n1 = pl->columns->n, n2 = pl->rows->n, size = n2 * LANES;
    planar out[ROW_BLOCK / LANES];
    for (int g = 0; g < ROW_BLOCK / LANES; g++) {
        const planar rows = {t.re + (r + g * LANES) * n2, t.im + (r + g * LANES) * n2};
        out[g] = (planar){work + 2 * g * size, work + (2 * g + 1) * size};
        transform(pl->rows, rows, out[g], work + ROW_BLOCK / LANES * 2 * size, LANES, 0);
    }
    for (int64_t k = 0; k < n2; k++)
        for (int g = 0; g < ROW_BLOCK / LANES; g++) {
            const int64_t at = r + g * LANES + n1 * k;
            const float *re = out[g].re + k * LANES, *im = out[g].im + k * LANES;
            if (y.im)
                memcpy(y.re + at, re, sizeof(float) * LANES), memcpy(y.im + at, im, sizeof(float) * LANES);
            else
                for (int l = 0; l < LANES; l += 8) planar_to_pairs8(re + l, im + l, y.re + 2 * (at + l));
        }
}

/* Floats one thread's block of four-step columns or rows works in. */
static int64_t four_step_block_floats(const plan *pl) {
    const int64_t columns = 4 * pl->columns->n * COLUMN_BLOCK + scratch_floats(pl->columns, COLUMN_BLOCK);
    const int64_t rows = 2 * ROW_BLOCK / LANES * pl->rows->n * LANES + scratch_floats(pl->rows, LANES);
    return columns > rows ? columns : rows;
}

/* Scratch of four_step: the intermediate, then a block's work per thread. */
static int64_t four_step_floats(const plan *pl) {
    return 2 * pl->n + omp_get_max_threads() * four_step_block_floats(pl);
}

/* Whether four_step shares its blocks between threads. */
static int four_step_shares(const plan *pl, int parallel) {
    return parallel && pl->n >= FOUR_STEP_PARALLEL_MIN && omp_get_max_threads() > 1;
}

/* y = the transform of one row x of n = n1 n2 (Cooley-Tukey's four steps: X[k1 + n1 k2] = sum_j2 W_n2^(j2 k2)
 * W_n^(j2 k1) sum_j1 x[j1 n2 + j2] W_n1^(j1 k1)): blocks of columns into the intermediate t, then (after the
 * loop's barrier) blocks of rows, shared by the team of the enclosing region: one of this file's own, which
 * callers may extend with their steps before and after. x and y are planar, or interleaved pairs in .re when .im
 * is NULL (x only read); scratch: four_step_floats. */
static void four_step_shared(const plan *pl, planar x, planar y, float *scratch) {
    const planar t = {scratch, scratch + pl->n};
    float *work = scratch + 2 * pl->n + four_step_block_floats(pl) * omp_get_thread_num();
#pragma omp for schedule(dynamic)
    for (int64_t b = 0; b < pl->rows->n / COLUMN_BLOCK; b++) four_step_columns(pl, x, t, b, work);
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < pl->columns->n; r += ROW_BLOCK) four_step_rows(pl, t, y, r, work);
}

/* four_step_shared in a region of its own when four_step_shares, else alone. */
static void four_step(const plan *pl, planar x, planar y, float *scratch, int parallel) {
    if (four_step_shares(pl, parallel)) {
#pragma omp parallel
        four_step_shared(pl, x, y, scratch);
        return;
    }
    /* Alone, the same loops outside any region: inside a caller's, a worksharing loop would be shared by its team,
     * and a region of one thread costs a team start (~1 us, a sixth of a 1024-point transform). */
    const planar t = {scratch, scratch + pl->n};
    for (int64_t b = 0; b < pl->rows->n / COLUMN_BLOCK; b++) four_step_columns(pl, x, t, b, scratch + 2 * pl->n);
    for (int64_t r = 0; r < pl->columns->n; r += ROW_BLOCK) four_step_rows(pl, t, y, r, scratch + 2 * pl->n);
}

/* What one kind of transform does to a group of `lanes` rows starting at `row`. */
typedef struct job job;
typedef void (*group_fn)(const job *jb, int64_t row, int64_t lanes, float *work, int parallel);
/* One unit of a transform's work (a group of rows, a tile of STFT frames), in `work` of the unit's size. */
typedef void (*unit_fn)(const job *jb, int64_t unit, float *work, int parallel);
struct job {
    plan *pl;
    int64_t n, rows;
    planar half;
    const float *x;
    float *y;
    group_fn run;
    /* r2c only: row r is frame r % frames of signal r / frames (`length` samples, frames `hop` apart), times
     * `window` when given, the signal reflected `pad` samples beyond each end (frames 1: plain rows). */
    int64_t frames, hop, length, pad;
    const float *window;
};

/* Every unit, across threads when there are several, else the one unit's passes; `floats`: a unit's work. */
static int for_units(const job *jb, int64_t units, size_t floats, unit_fn run) {
    int failed = 0;
    if (units > 1) {
#pragma omp parallel reduction(| : failed)
        {
            float *work = malloc(sizeof(float) * floats);
            if (!work) failed = 1;
#pragma omp for schedule(dynamic)
            for (int64_t u = 0; u < units; u++)
                if (work) run(jb, u, work, 0);
            free(work);
        }
    } else {
        float *work = malloc(sizeof(float) * floats);
        if (!work) return TG_FFT_NO_MEMORY;
        run(jb, 0, work, 1);
        free(work);
    }
    return failed ? TG_FFT_NO_MEMORY : TG_FFT_OK;
}

/* Floats a group of `lanes` rows works in: `work_per_lane` each besides the transform's scratch. */
static size_t group_floats(const job *jb, int64_t lanes, int64_t work_per_lane) {
    return (size_t)(scratch_floats(jb->pl, lanes) + work_per_lane * lanes);
}

static void row_group(const job *jb, int64_t unit, float *work, int parallel) {
    const int64_t row = unit * LANES, left = jb->rows - row;
    jb->run(jb, row, left < LANES ? left : LANES, work, parallel);
}

/* jb->run on every group of LANES of its `rows` rows (see `for_units`). */
static int for_groups(const job *jb, int64_t work_per_lane) {
    const int64_t lanes = jb->rows < LANES ? jb->rows : LANES;
    return for_units(jb, (jb->rows + LANES - 1) / LANES, group_floats(jb, lanes, work_per_lane), row_group);
}

static void c2c_group(const job *jb, int64_t row, int64_t lanes, float *work, int parallel) {
    const int64_t n = jb->n, size = n * lanes;
    const planar in = {work, work + size}, out = {work + 2 * size, work + 3 * size};
    const float *x = jb->x + 2 * row * n;
    float *y = jb->y + 2 * row * n;
    if (lanes == 1 && jb->pl->columns) { /* the four-step transform reads and writes the pairs itself */
        four_step(jb->pl, (planar){(float *)x, NULL}, (planar){y, NULL}, work, parallel);
        return;
    }
    for (int64_t l = 0; l < lanes; l++)
        for (int64_t j = 0; j < n; j++)
            in.re[j * lanes + l] = x[2 * (l * n + j)], in.im[j * lanes + l] = x[2 * (l * n + j) + 1];
    transform(jb->pl, in, out, work + 4 * size, lanes, parallel);
    for (int64_t l = 0; l < lanes; l++)
        for (int64_t k = 0; k < n; k++)
            y[2 * (l * n + k)] = out.re[k * lanes + l], y[2 * (l * n + k) + 1] = out.im[k * lanes + l];
}

/* r2c of even n: Z, the n/2-point transform of z_j = x_2j + i x_2j+1, split into X_k for k <= n/2. */
/* in.re[j LANES + l] = source[l][2 j] w[2 j], in.im likewise from 2 j + 1: 8 x 8 blocks transposed in registers
 * (AVX2), a scalar loop elsewhere. */
static void gather_lanes(const float *const *source, const float *w, planar in, int64_t h) {
#if defined(__AVX2__) && LANES == 8
    for (int64_t j = 0; j < h; j += 4) {
        __m256 column[8];
        transpose8(source, 2 * j, column);
        for (int c = 0; c < 8; c++) /* float 2 j + c: the real or imaginary part of z_(j + c / 2) */
            _mm256_storeu_ps((c % 2 ? in.im : in.re) + (j + c / 2) * 8,
                             _mm256_mul_ps(column[c], _mm256_set1_ps(w ? w[2 * j + c] : 1.0f)));
    }
#else
    for (int64_t j = 0; j < h; j++)
        for (int64_t l = 0; l < LANES; l++) {
            in.re[j * LANES + l] = source[l][2 * j] * (w ? w[2 * j] : 1.0f);
            in.im[j * LANES + l] = source[l][2 * j + 1] * (w ? w[2 * j + 1] : 1.0f);
        }
#endif
}

#if defined(__AVX2__) && LANES == 8
/* Eight frequencies of r2c_split at once: Z_k (zr, zi), Z_(h - k) (mr, mi), W_n^k (wr, wi); their pairs to `to`. */
static inline void split8(__m256 zr, __m256 zi, __m256 mr, __m256 mi, __m256 wr, __m256 wi, float *to) {
    const __m256 half = _mm256_set1_ps(0.5f);
    const __m256 er = _mm256_mul_ps(half, _mm256_add_ps(zr, mr)), ei = _mm256_mul_ps(half, _mm256_sub_ps(zi, mi));
    const __m256 or_ = _mm256_mul_ps(half, _mm256_add_ps(zi, mi)), oi = _mm256_mul_ps(half, _mm256_sub_ps(mr, zr));
    const __m256 re = _mm256_add_ps(er, _mm256_sub_ps(_mm256_mul_ps(or_, wr), _mm256_mul_ps(oi, wi)));
    const __m256 im = _mm256_add_ps(ei, _mm256_add_ps(_mm256_mul_ps(or_, wi), _mm256_mul_ps(oi, wr)));
    store_pairs(re, im, to);
}
#endif

/* Frequencies [lo, hi) of r2c_lanes's `lanes` transforms, split from Z (their half-length transforms, planar): lane
 * l's frequency k at out[2 (l lane_step + k k_step)]. */
static void r2c_split(const job *jb, planar z, int64_t lanes, int64_t lo, int64_t hi, float *out, int64_t lane_step,
                      int64_t k_step) {
    const int64_t h = jb->n / 2;
    for (int64_t k = lo; k < hi; k++) {
        const int64_t at = k < h ? k * lanes : 0, mirror = k ? (h - k) * lanes : 0;
        const float wr = jb->half.re[k], wi = jb->half.im[k];
        float *at_k = out + 2 * k * k_step;
#if defined(__AVX2__) && LANES == 8
        if (lanes == 1 && k_step == 1 && k && k + 8 <= hi && k + 8 <= h) { /* one row: 8 frequencies, 8 mirrors */
            const __m256i reverse = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
            const __m256 mr = _mm256_permutevar8x32_ps(_mm256_loadu_ps(z.re + h - k - 7), reverse);
            const __m256 mi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(z.im + h - k - 7), reverse);
            split8(_mm256_loadu_ps(z.re + k), _mm256_loadu_ps(z.im + k), mr, mi, _mm256_loadu_ps(jb->half.re + k),
                   _mm256_loadu_ps(jb->half.im + k), at_k);
            k += 7;
            continue;
        }
        if (lane_step == 1 && lanes == LANES) { /* the lanes' outputs interleave: one run of LANES pairs */
            split8(_mm256_loadu_ps(z.re + at), _mm256_loadu_ps(z.im + at), _mm256_loadu_ps(z.re + mirror),
                   _mm256_loadu_ps(z.im + mirror), _mm256_set1_ps(wr), _mm256_set1_ps(wi), at_k);
            continue;
        }
#endif
        for (int64_t l = 0; l < lanes; l++) {
            const float zr = z.re[at + l], zi = z.im[at + l], cr = z.re[mirror + l], ci = -z.im[mirror + l];
            const float er = 0.5f * (zr + cr), ei = 0.5f * (zi + ci), or_ = 0.5f * (zi - ci), oi = -0.5f * (zr - cr);
            at_k[2 * l * lane_step] = er + CMUL_RE(or_, oi, wr, wi);
            at_k[2 * l * lane_step + 1] = ei + CMUL_IM(or_, oi, wr, wi);
        }
    }
}

/* This thread's share of r2c_split's frequencies (inside a region). */
static void r2c_split_share(const job *jb, planar z, int64_t lanes, float *out, int64_t lane_step, int64_t k_step) {
    const int64_t width = jb->n / 2 + 1, team = omp_get_num_threads(), t = omp_get_thread_num();
    r2c_split(jb, z, lanes, width * t / team, width * (t + 1) / team, out, lane_step, k_step);
}

/* The r2c transforms of `lanes` rows from `row`: frequency k of lane l to out[2 (l lane_step + k k_step)]. */
static void r2c_lanes(const job *jb, int64_t row, int64_t lanes, float *work, int parallel, float *out,
                      int64_t lane_step, int64_t k_step) {
    const int64_t n = jb->n, h = n / 2, size = h * lanes, frames = jb->frames;
    const planar in = {work, work + size}, z = {work + 2 * size, work + 3 * size};
    const float *source[LANES];
    int64_t first[LANES], edge = 0; /* the frame's first sample (in the reflect-padded signal's terms) */
    for (int64_t l = 0; l < lanes; l++) {
        const int64_t signal = (row + l) / frames, frame = (row + l) % frames;
        first[l] = frame * jb->hop - jb->pad;
        source[l] = jb->x + signal * jb->length + first[l];
        edge |= first[l] < 0 || first[l] + n > jb->length;
    }
    const float *w = jb->window;
    if (lanes == 1 && jb->pl->columns && !edge && !w) { /* the four-step transform reads the pairs z_j itself */
        const planar pairs = {(float *)source[0], NULL};
        if (four_step_shares(jb->pl, parallel)) { /* the split in the same region: one fork and join fewer */
#pragma omp parallel
            {
                four_step_shared(jb->pl, pairs, z, work + 4 * size);
                r2c_split_share(jb, z, lanes, out, lane_step, k_step);
            }
            return;
        }
        four_step(jb->pl, pairs, z, work + 4 * size, parallel);
    } else {
        if (edge) /* a frame reaching into the padding reads the signal reflected at its ends */
            for (int64_t j = 0; j < n; j++)
                for (int64_t l = 0; l < lanes; l++) {
                    int64_t at = first[l] + j;
                    at = at < 0 ? -at : at >= jb->length ? 2 * (jb->length - 1) - at : at;
                    const float value = source[l][at - first[l]] * (w ? w[j] : 1.0f);
                    (j % 2 ? in.im : in.re)[j / 2 * lanes + l] = value;
                }
        else if (lanes == LANES && h % 4 == 0)
            gather_lanes(source, w, in, h);
        else
            for (int64_t j = 0; j < h; j++) {
                const float even = w ? w[2 * j] : 1.0f, odd = w ? w[2 * j + 1] : 1.0f;
                for (int64_t l = 0; l < lanes; l++)
                    in.re[j * lanes + l] = source[l][2 * j] * even, in.im[j * lanes + l] = source[l][2 * j + 1] * odd;
            }
        transform(jb->pl, in, z, work + 4 * size, lanes, parallel);
    }
    if (parallel && h >= PARALLEL_MIN) { /* never an unsplit region: it costs futex calls all the same */
#pragma omp parallel
        r2c_split_share(jb, z, lanes, out, lane_step, k_step);
    } else {
        r2c_split(jb, z, lanes, 0, h + 1, out, lane_step, k_step);
    }
}

static void r2c_group(const job *jb, int64_t row, int64_t lanes, float *work, int parallel) {
    const int64_t width = jb->n / 2 + 1;
    r2c_lanes(jb, row, lanes, work, parallel, jb->y + 2 * row * width, width, 1);
}

/* to[i] = from[i], i < count, prefetching ahead[i] for writing. One loop with the prefetches: gcc turns a plain
 * copy loop into a memmove call, which costs more than a tile row's few vectors. */
static void copy_ahead(float *restrict to, const float *restrict from, int64_t count, const float *ahead) {
    int64_t i = 0;
#if defined(__AVX2__)
    for (; i + 8 <= count; i += 8) {
        if (i % 16 == 0) __builtin_prefetch(ahead + i, 1, 3);
        _mm256_storeu_ps(to + i, _mm256_loadu_ps(from + i));
    }
#endif
    for (; i < count; i++) to[i] = from[i];
}

/* One tile of up to TILE_FRAMES consecutive frames of one signal: transformed into a (frequency, frame) tile, then
 * copied out a frequency's row at a time. Written straight into the output, each group's 8 frames would be a
 * short strided store per frequency, which cost as much as the transforms (bench/NOTES.md). */
static void stft_tile(const job *jb, int64_t unit, float *work, int parallel) {
    const int64_t tiles = (jb->frames + TILE_FRAMES - 1) / TILE_FRAMES, signal = unit / tiles;
    const int64_t first = unit % tiles * TILE_FRAMES, left = jb->frames - first;
    const int64_t count = left < TILE_FRAMES ? left : TILE_FRAMES, width = jb->n / 2 + 1;
    float *tile = work + group_floats(jb, LANES, 2 * jb->n);
    for (int64_t g = 0; g < count; g += LANES)
        r2c_lanes(jb, signal * jb->frames + first + g, count - g < LANES ? count - g : LANES, work, parallel,
                  tile + 2 * g, 1, TILE_FRAMES);
    float *y = jb->y + 2 * (signal * width * jb->frames + first);
    for (int64_t k = 0; k < width; k++) {
        float *to = y + 2 * k * jb->frames, *ahead = k + PREFETCH_ROWS < width ? to + 2 * PREFETCH_ROWS * jb->frames : to;
        copy_ahead(to, tile + 2 * k * TILE_FRAMES, 2 * count, ahead);
    }
}

/* Z_k, k in [lo, hi), of c2r_group for the `lanes` spectra x (rows of n/2 + 1 pairs), into `in` (planar). */
static void c2r_merge(const job *jb, const float *x, int64_t lanes, int64_t lo, int64_t hi, planar in) {
    const int64_t h = jb->n / 2, width = h + 1;
    for (int64_t k = lo; k < hi; k++) {
#if defined(__AVX2__)
        if (lanes == 1 && k && k + 8 <= hi) { /* one spectrum: 8 frequencies, and their mirrors read backwards */
            const __m256i reverse = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
            __m256 ar, ai, br, bi;
            load_pairs(x + 2 * k, &ar, &ai), load_pairs(x + 2 * (h - k - 7), &br, &bi);
            br = _mm256_permutevar8x32_ps(br, reverse);
            bi = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_permutevar8x32_ps(bi, reverse));
            const __m256 er = _mm256_add_ps(ar, br), ei = _mm256_add_ps(ai, bi);
            const __m256 dr = _mm256_sub_ps(ar, br), di = _mm256_sub_ps(ai, bi);
            const __m256 wr = _mm256_loadu_ps(jb->half.re + k), wi = _mm256_loadu_ps(jb->half.im + k);
            const __m256 or_ = _mm256_sub_ps(_mm256_mul_ps(dr, wr), _mm256_mul_ps(di, wi));
            const __m256 oi = _mm256_add_ps(_mm256_mul_ps(dr, wi), _mm256_mul_ps(di, wr));
            _mm256_storeu_ps(in.re + k, _mm256_sub_ps(er, oi)), _mm256_storeu_ps(in.im + k, _mm256_add_ps(ei, or_));
            k += 7;
            continue;
        }
#endif
        for (int64_t l = 0; l < lanes; l++) {
            const float *a = x + 2 * (l * width + k), *b = x + 2 * (l * width + h - k);
            const float ar = a[0], ai = k ? a[1] : 0.0f, br = b[0], bi = k ? -b[1] : 0.0f;
            const float er = ar + br, ei = ai + bi, dr = ar - br, di = ai - bi;
            const float wr = jb->half.re[k], wi = jb->half.im[k];
            const float or_ = CMUL_RE(dr, di, wr, wi), oi = CMUL_IM(dr, di, wr, wi);
            in.re[k * lanes + l] = er - oi, in.im[k * lanes + l] = ei + or_;
        }
    }
}

/* This thread's share of c2r_merge's frequencies (inside a region). */
static void c2r_merge_share(const job *jb, const float *x, int64_t lanes, planar in) {
    const int64_t h = jb->n / 2, team = omp_get_num_threads(), t = omp_get_thread_num();
    c2r_merge(jb, x, lanes, h * t / team, h * (t + 1) / team, in);
}

/* c2r of even n: Z_k = E_k + i O_k for k < n/2, E = X_k + X_(k+n/2), O = (X_k - X_(k+n/2)) W_n^k (inverse
 * direction), the spectrum of z_j = x_2j + i x_2j+1; the zero and n/2 frequencies' imaginary parts read as 0. */
static void c2r_group(const job *jb, int64_t row, int64_t lanes, float *work, int parallel) {
    const int64_t n = jb->n, h = n / 2, size = h * lanes, width = h + 1;
    const planar in = {work, work + size}, z = {work + 2 * size, work + 3 * size};
    const float *x = jb->x + 2 * row * width;
    float *y = jb->y + row * n;
    const int four = lanes == 1 && jb->pl->columns;
    if (four && four_step_shares(jb->pl, parallel)) { /* the merge and the four-step transform in one region */
#pragma omp parallel
        {
            c2r_merge_share(jb, x, lanes, in);
#pragma omp barrier
            four_step_shared(jb->pl, in, (planar){y, NULL}, work + 4 * size);
        }
        return;
    }
    if (parallel && h >= PARALLEL_MIN) { /* never an unsplit region: it costs futex calls all the same */
#pragma omp parallel
        c2r_merge_share(jb, x, lanes, in);
    } else {
        c2r_merge(jb, x, lanes, 0, h, in);
    }
    if (four) { /* the four-step transform writes the pairs z_j itself */
        four_step(jb->pl, in, (planar){y, NULL}, work + 4 * size, parallel);
        return;
    }
    transform(jb->pl, in, z, work + 4 * size, lanes, parallel);
    for (int64_t l = 0; l < lanes; l++)
        for (int64_t j = 0; j < h; j++)
            y[l * n + 2 * j] = z.re[j * lanes + l], y[l * n + 2 * j + 1] = z.im[j * lanes + l];
}

/* The real transforms of odd n (and n <= 2) as a complex one of length n. */
static void r2c_odd_group(const job *jb, int64_t row, int64_t lanes, float *work, int parallel) {
    const int64_t n = jb->n, size = n * lanes, width = n / 2 + 1;
    const planar in = {work, work + size}, out = {work + 2 * size, work + 3 * size};
    for (int64_t l = 0; l < lanes; l++)
        for (int64_t j = 0; j < n; j++) in.re[j * lanes + l] = jb->x[(row + l) * n + j], in.im[j * lanes + l] = 0.0f;
    transform(jb->pl, in, out, work + 4 * size, lanes, parallel);
    for (int64_t l = 0; l < lanes; l++)
        for (int64_t k = 0; k < width; k++) {
            jb->y[2 * ((row + l) * width + k)] = out.re[k * lanes + l];
            jb->y[2 * ((row + l) * width + k) + 1] = out.im[k * lanes + l];
        }
}

static void c2r_odd_group(const job *jb, int64_t row, int64_t lanes, float *work, int parallel) {
    const int64_t n = jb->n, size = n * lanes, width = n / 2 + 1;
    const planar in = {work, work + size}, out = {work + 2 * size, work + 3 * size};
    for (int64_t l = 0; l < lanes; l++)
        for (int64_t k = 0; k < n; k++) {
            const int64_t from = k < width ? k : n - k;
            const float *a = jb->x + 2 * ((row + l) * width + from);
            const int real_only = k == 0 || 2 * k == n;
            in.re[k * lanes + l] = a[0], in.im[k * lanes + l] = real_only ? 0.0f : k < width ? a[1] : -a[1];
        }
    transform(jb->pl, in, out, work + 4 * size, lanes, parallel);
    for (int64_t l = 0; l < lanes; l++)
        for (int64_t j = 0; j < n; j++) jb->y[(row + l) * n + j] = out.re[j * lanes + l];
}

int tg_fft_c2c_f32(int64_t batch, int64_t n, int32_t inverse, const float *x, float *y) {
    if (n == 0 || batch == 0) return TG_FFT_OK;
    job jb = {.pl = build_plan(n, inverse ? 1 : -1), .n = n, .rows = batch, .x = x, .y = y, .run = c2c_group};
    return jb.pl ? for_groups(&jb, 4 * n) : TG_FFT_NO_MEMORY;
}

/* The plan of a real transform of jb->n (a complex one of half the length for even n > 2), and its group. */
static int plan_real(job *jb, int sign, group_fn even, group_fn odd) {
    const int64_t n = jb->n;
    const int halved = n % 2 == 0 && n > 2;
    jb->pl = build_plan(halved ? n / 2 : n, sign), jb->run = halved ? even : odd;
    if (!jb->pl) return TG_FFT_NO_MEMORY;
    if (halved && !(jb->half = half_twiddles(jb->pl, n)).re) return TG_FFT_NO_MEMORY;
    return TG_FFT_OK;
}

static int real_transform(job *jb, int sign, group_fn even, group_fn odd) {
    if (jb->n == 0 || jb->rows == 0) return TG_FFT_OK;
    const int status = plan_real(jb, sign, even, odd);
    return status ? status : for_groups(jb, 4 * jb->n);
}

int tg_fft_r2c_f32(int64_t batch, int64_t n, const float *x, float *y) {
    job jb = {.n = n, .rows = batch, .x = x, .y = y, .frames = 1, .hop = n, .length = n};
    return real_transform(&jb, -1, r2c_group, r2c_odd_group);
}

int tg_fft_c2r_f32(int64_t batch, int64_t n, const float *x, float *y) {
    job jb = {.n = n, .rows = batch, .x = x, .y = y};
    return real_transform(&jb, 1, c2r_group, c2r_odd_group);
}

int tg_fft_stft_f32(int64_t batch, int64_t length, int64_t frames, int64_t n, int64_t hop, int64_t pad,
                    const float *x, const float *window, float *y) {
    if (n % 2 || n <= 2 || pad >= length) return TG_FFT_BAD_LENGTH;
    if (batch == 0 || frames == 0) return TG_FFT_OK;
    job jb = {.n = n, .x = x, .y = y, .frames = frames, .hop = hop, .length = length, .pad = pad, .window = window};
    const int status = plan_real(&jb, -1, r2c_group, r2c_odd_group);
    if (status) return status;
    const size_t floats = group_floats(&jb, LANES, 2 * n) + (size_t)(2 * (n / 2 + 1) * TILE_FRAMES);
    return for_units(&jb, batch * ((frames + TILE_FRAMES - 1) / TILE_FRAMES), floats, stft_tile);
}
