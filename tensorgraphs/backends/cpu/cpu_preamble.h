/* In-place transpose of a 16 x 16 tile (`TransposeLocal`) of 1-, 2-, 4- or 8-byte elements: the rows as 16 vectors,
 * four rounds of two-source shuffles (round d swaps the off-diagonal d x d blocks of every 2d x 2d block), 64
 * register shuffles in all for 4-byte elements with AVX-512, and no strided memory access. */
#if defined(__clang__)
#define tg_transpose_tile16(tile) do {                                                   \
        for (int tg_i = 0; tg_i < 16; tg_i++)                                            \
            for (int tg_j = 0; tg_j < tg_i; tg_j++) {                                    \
                __typeof__((tile)[0]) tg_kept = (tile)[tg_i * 16 + tg_j];                \
                (tile)[tg_i * 16 + tg_j] = (tile)[tg_j * 16 + tg_i];                     \
                (tile)[tg_j * 16 + tg_i] = tg_kept;                                      \
            }                                                                            \
    } while (0)
#else
#define TG_TRANSPOSE_ROUND(row, d, low, high)                                              \
    for (int i = 0; i < 16; i++)                                                           \
        if (!(i & (d))) {                                                                  \
            __typeof__(row[0]) upper = row[i], lower = row[i + (d)];                       \
            row[i] = __builtin_shuffle(upper, lower, (__typeof__(row[0]))low);             \
            row[i + (d)] = __builtin_shuffle(upper, lower, (__typeof__(row[0]))high);      \
        }
#define TG_TRANSPOSE16(bits)                                                                                      \
    typedef uint##bits##_t tg_row16_u##bits __attribute__((vector_size(2 * (bits))));                          \
    TG_INLINE void tg_transpose16_u##bits(void *tile) {                                                        \
        tg_row16_u##bits row[16];                                                                              \
        memcpy(row, tile, sizeof row);                                                                         \
        TG_TRANSPOSE_ROUND(row, 8, TG_LANES(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),            \
                           TG_LANES(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31))               \
        TG_TRANSPOSE_ROUND(row, 4, TG_LANES(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27),          \
                           TG_LANES(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31))                 \
        TG_TRANSPOSE_ROUND(row, 2, TG_LANES(0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29),          \
                           TG_LANES(2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31))                 \
        TG_TRANSPOSE_ROUND(row, 1, TG_LANES(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30),         \
                           TG_LANES(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31))                  \
        memcpy(tile, row, sizeof row);                                                                         \
    }
#define TG_LANES(...) {__VA_ARGS__}
TG_TRANSPOSE16(8)
TG_TRANSPOSE16(16)
TG_TRANSPOSE16(32)
TG_TRANSPOSE16(64)
#define tg_transpose_tile16(tile)                                                                 \
    (sizeof((tile)[0]) == 1 ? tg_transpose16_u8(tile) : sizeof((tile)[0]) == 2 ? tg_transpose16_u16(tile) \
     : sizeof((tile)[0]) == 4 ? tg_transpose16_u32(tile) : tg_transpose16_u64(tile))
#endif

/* Streaming (non-temporal) stores for large outputs written once: a whole 64-byte line goes to memory without
 * being read first (no read-for-ownership) and without evicting data a kernel still uses. The line is staged in
 * an aligned local array; tg_stream_head counts the elements before dst's first line boundary (written with
 * plain stores, like the tail). Every thread that streamed calls tg_stream_fence before the kernel ends. */
#if defined(__AVX512F__) && !defined(__clang__)
typedef long long tg_line __attribute__((vector_size(64)));
TG_INLINE void tg_stream_line(void *dst, const void *line) {
    tg_line value;
    memcpy(&value, line, 64);
    __builtin_ia32_movntdq512((tg_line *)dst, value);
}
TG_INLINE void tg_stream_fence(void) { __builtin_ia32_sfence(); }
#elif defined(__SSE2__) && !defined(__clang__)
typedef long long tg_quarter_line __attribute__((vector_size(16)));
TG_INLINE void tg_stream_line(void *dst, const void *line) {
    for (int part = 0; part < 4; part++) {
        tg_quarter_line value;
        memcpy(&value, (const char *)line + 16 * part, 16);
        __builtin_ia32_movntdq((tg_quarter_line *)dst + part, value);
    }
}
TG_INLINE void tg_stream_fence(void) { __builtin_ia32_sfence(); }
#else
TG_INLINE void tg_stream_line(void *dst, const void *line) { memcpy(dst, line, 64); }
TG_INLINE void tg_stream_fence(void) {}
#endif
TG_INLINE int64_t tg_stream_head(const void *dst, int64_t n, int64_t size) {
    int64_t head = (int64_t)((64 - ((uintptr_t)dst & 63)) & 63) / size;
    return head < n && (uintptr_t)dst % (uintptr_t)size == 0 ? head : n; /* elements never straddle a line */
}
