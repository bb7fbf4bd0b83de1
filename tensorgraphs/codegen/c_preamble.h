/* tensorgraphs C runtime: included at the top of every generated program.
 *
 * Everything here is branch-free where it sits in inner loops, so gcc vectorizes it with
 * -O3 -march=native -fno-math-errno -fno-trapping-math (never -ffast-math: NaN and infinities
 * keep IEEE behaviour). Programs are compiled with -ffp-contract=off so a*b+c rounds twice, as in
 * the reference backend; the polynomials below ask for fma explicitly.
 *
 * Float32 transcendental functions (float64 uses libm's exp2, log2 and sin):
 *   tg_exp2f: range reduction to [-1/2, 1/2] + degree-6 polynomial; error <= 1 ulp
 *             (subnormal results included), 0 and inf on under/overflow.
 *   tg_log2f: exponent + f * p(f) with f = m - 1, m in [1/sqrt2, sqrt2] (no division); error <= 2 ulp, subnormal
 *             inputs included; log2(0) = -inf, log2(x < 0) = NaN.
 *   tg_sinf:  computed in double: exact reduction modulo 2pi for every finite float (a table of
 *             2^E mod 2pi), then by pi (Cody-Waite, 3 parts of 26 bits) and a degree-13 polynomial;
 *             error <= 1 ulp for every finite float.
 * tests/codegen/test_c_renderer.py measures these bounds.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Every helper below is forced inline: in a program of hundreds of kernels gcc's unit-growth limit stops inlining
 * them, and a call left in a loop keeps the loop from being vectorized. */
#if defined(__GNUC__)
#define TG_INLINE static inline __attribute__((always_inline))
#else
#define TG_INLINE static inline
#endif

typedef union { float f; uint32_t u; int32_t i; } tg_f32bits;

TG_INLINE float tg_exp2f(float x) {
    float c = x > -151.0f ? x : -151.0f;                          /* NaN -> -151: returned as x below */
    c = c < 129.0f ? c : 129.0f;
    float k = (c + 12582912.0f) - 12582912.0f;                    /* round to nearest integer */
    float f = c - k;                                              /* [-1/2, 1/2] */
    float p = 1.53375804e-4f;
    p = fmaf(p, f, 1.33998658e-3f);
    p = fmaf(p, f, 9.61851981e-3f);
    p = fmaf(p, f, 5.55032901e-2f);
    p = fmaf(p, f, 2.40226462e-1f);
    p = fmaf(p, f, 6.93147182e-1f);
    p = fmaf(p, f, 1.0f);
    int32_t n = (int32_t)k;
    int32_t half = n >> 1;                                        /* p * 2^half is exact: one rounding */
    tg_f32bits s1, s2;
    s1.i = (half + 127) << 23;
    s2.i = (n - half + 127) << 23;
    float r = p * s1.f * s2.f;
    return x == x ? r : x;
}

TG_INLINE float tg_log2f(float x) {
    int small = x < 1.17549435e-38f;
    float y = small ? x * 8388608.0f : x;
    tg_f32bits b;
    b.f = y;
    int32_t e = (int32_t)((b.u >> 23) & 0xff) - 127 - (small ? 23 : 0);
    b.u = (b.u & 0x7fffffu) | 0x3f800000u;
    float m = b.f;
    int big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    e = big ? e + 1 : e;
    float f = m - 1.0f;                       /* exact: m is in [1/sqrt2, sqrt2] */
    float p = -0.1102018728852272f;
    p = fmaf(p, f, 0.18631255626678467f);
    p = fmaf(p, f, -0.19102509319782257f);
    p = fmaf(p, f, 0.20457522571086884f);
    p = fmaf(p, f, -0.23961903154850006f);
    p = fmaf(p, f, 0.2885688841342926f);
    p = fmaf(p, f, -0.3606966435909271f);
    p = fmaf(p, f, 0.4808982014656067f);
    p = fmaf(p, f, -0.7213473320007324f);
    p = fmaf(p, f, 1.4426950216293335f);
    float r = (float)e + f * p;               /* log2(1 + f) = f * p(f), least squares, degree 9 */
    r = x == 0.0f ? -INFINITY : r;
    r = x < 0.0f ? NAN : r;
    r = x == INFINITY ? INFINITY : r;
    return x == x ? r : x;
}

/* x = M * 2^E exactly (M a 24-bit integer); with t = 2^E mod 2pi from the table (as hi + lo),
 * x = M*t (mod 2pi) and M*t < 2^27, so the reduction by pi below is exact for every finite float. */
TG_INLINE float tg_sinf(float xf) {
    tg_f32bits b;
    b.f = xf;
    int32_t field = (int32_t)((b.u >> 23) & 0xff);
    int32_t mantissa = (int32_t)(b.u & 0x7fffff) | (field ? 0x800000 : 0);
    int32_t entry = field ? field - 1 : 0;                    /* E = entry - 149 */
    double m = (double)((b.u >> 31) ? -mantissa : mantissa);
    double hi = tg_pow2_mod_2pi[entry][0], lo = tg_pow2_mod_2pi[entry][1];
    double p = m * hi;
    double e = fma(m, hi, -p) + m * lo;
    double k = rint(p * 0.31830988618379067);
    double r = p - k * 0x1.921fb50000000p+1;
    r = r - k * 0x1.110b460000000p-25;
    r = (r - k * 0x1.1a62633145c07p-53) + e;
    double r2 = r * r;
    double q = 1.6059043836821613e-10;
    q = fma(q, r2, -2.5052108385441720e-8);
    q = fma(q, r2, 2.7557319223985893e-6);
    q = fma(q, r2, -1.9841269841269841e-4);
    q = fma(q, r2, 8.3333333333333333e-3);
    q = fma(q, r2, -1.6666666666666667e-1);
    q = r + r * r2 * q;
    double half = k * 0.5;
    float result = (float)(half != floor(half) ? -q : q);
    result = xf == 0.0f ? xf : result; /* sin(-0) = -0 */
    return xf - xf == 0.0f ? result : NAN;
}

/* max(a, b): NaN when either is (a's first), b on a tie (-0, +0). Written as a compare-select followed by the NaN
 * test, which gcc maps to vmaxps + blend: a short dependency chain through a max accumulator. */
TG_INLINE float tg_maxf(float a, float b) {
    float m = a > b ? a : b;
    return a != a ? a : m;
}
TG_INLINE double tg_max(double a, double b) {
    double m = a > b ? a : b;
    return a != a ? a : m;
}

TG_INLINE float tg_round_f16(float x) { return (float)(_Float16)x; }

TG_INLINE float tg_round_bf16(float x) { /* round to nearest even, NaN kept */
    tg_f32bits b;
    b.f = x;
    b.u = (b.u + 0x7fffu + ((b.u >> 16) & 1u)) & 0xffff0000u;
    return x == x ? b.f : x;
}

/* Zero, but not to the compiler (a weak symbol another definition could replace): added to a float's conversion
 * to integer, it keeps -fno-trapping-math's fold of (float)(integer)x into trunc(x), which gives -0.0 where the
 * integer 0 converts to +0.0 (x in (-1, 0]: then 1 / x is -inf instead of inf), off the round trip. */
#if defined(__GNUC__)
__attribute__((weak, visibility("hidden"))) int64_t tg_opaque_zero = 0;
#else
static int64_t tg_opaque_zero = 0;
#endif

/* float -> integer: trunc; NaN/inf give 0; signed saturates, unsigned wraps (the reference's rule). */
TG_INLINE int64_t tg_to_signed(double x, double lo, double hi) {
    if (x - x != 0.0) return 0;
    return (x <= lo ? (int64_t)lo : (x >= hi ? (int64_t)hi : (int64_t)x)) + tg_opaque_zero;
}

TG_INLINE uint64_t tg_to_unsigned(double x, double modulus) {
    if (x - x != 0.0) return 0;
    double t = trunc(x);
    if (t >= 0.0 && t < modulus) return (uint64_t)t + (uint64_t)tg_opaque_zero;
    double m = fmod(t, modulus);
    return (uint64_t)(m < 0.0 ? m + modulus : m);
}

/* Integer division rounds toward -inf, modulo has the divisor's sign; division by zero gives 0. */
#define TG_INT_DIVISION(T, U)                                                             \
    TG_INLINE T tg_floordiv_##T(T a, T b) {                                               \
        if (b == 0) return 0;                                                             \
        if (b == (T)-1) return (T)((U)0 - (U)a);                                          \
        T q = (T)(a / b);                                                                 \
        return (T)((q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q);                     \
    }                                                                                     \
    TG_INLINE T tg_mod_##T(T a, T b) {                                                    \
        if (b == 0 || b == (T)-1) return 0;                                               \
        T r = (T)(a % b);                                                                 \
        return (T)((r != 0 && ((r < 0) != (b < 0))) ? r + b : r);                         \
    }
TG_INT_DIVISION(int8_t, uint8_t)
TG_INT_DIVISION(int16_t, uint16_t)
TG_INT_DIVISION(int32_t, uint32_t)
TG_INT_DIVISION(int64_t, uint64_t)

#define TG_UINT_DIVISION(T)                                                               \
    TG_INLINE T tg_floordiv_##T(T a, T b) { return b == 0 ? 0 : (T)(a / b); }              \
    TG_INLINE T tg_mod_##T(T a, T b) { return b == 0 ? 0 : (T)(a % b); }
TG_UINT_DIVISION(uint8_t)
TG_UINT_DIVISION(uint32_t)

TG_INLINE int64_t tg_floordiv_index(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
TG_INLINE int64_t tg_mod_index(int64_t a, int64_t b) { int64_t r = a % b; return r < 0 ? r + b : r; }
TG_INLINE int64_t tg_clamp_index(int64_t a, int64_t lo, int64_t hi) { return a < lo ? lo : (a > hi ? hi : a); }

/* A gathered/scattered position outside [0, n) flags the call (IndexError in Python) and reads element 0. */
TG_INLINE int64_t tg_checked_index(int64_t i, int64_t n, int *status) {
    if (i >= 0 && i < n) return i;
    __atomic_store_n(status, 1, __ATOMIC_RELAXED);
    return 0;
}

