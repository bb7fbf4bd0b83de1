/* Fast Fourier transforms, float32, complex values as interleaved (re, im) pairs.
 *
 * Every transform is unnormalized, over the last axis of `batch` contiguous rows:
 *   tg_fft_c2c_f32: y[k] = sum_j x[j] exp(sign 2 pi i j k / n), sign -1 (forward) or +1 (inverse = 1);
 *                   x and y are (batch, n) complex.
 *   tg_fft_r2c_f32: x (batch, n) real -> y (batch, n/2 + 1) complex, the forward transform's first half.
 *   tg_fft_c2r_f32: x (batch, n/2 + 1) complex, read as the first half of a Hermitian spectrum (the imaginary
 *                   parts of the zero and, for even n, the n/2 frequency ignored) -> y (batch, n) real, the
 *                   inverse transform.
 *   tg_fft_stft_f32: the r2c transforms of the `frames` frames of each of `batch` signals x (batch, length)
 *                   reflected `pad` (< length) samples beyond each end (torch.stft's centering; 0: none): frame t
 *                   is x[b][t hop - pad + j] * window[j], j < n (window may be NULL: ones); y is
 *                   (batch, n/2 + 1, frames) complex (frequency before frame, as torch.stft). Even n > 2 only.
 * Any n >= 1: Stockham autosort passes of radix 8 (AVX-512), 4, 2, 3, 5 and other small primes (a single row of
 * 1024 points or more, divisible by 256, as a four-step transform: such passes on blocks of its columns, then of
 * its rows); a length with a prime factor above TG_FFT_MAX_RADIX runs Bluestein's algorithm on a power-of-two
 * transform. Plans (twiddle tables) are built
 * once per length and direction and kept for the process. x and y may not overlap. Each returns 0, or
 * TG_FFT_NO_MEMORY. */
#ifndef TG_FFT_H
#define TG_FFT_H
#include <stdint.h>

#define TG_FFT_MAX_RADIX 61
enum tg_fft_status { TG_FFT_OK = 0, TG_FFT_NO_MEMORY = -3, TG_FFT_BAD_LENGTH = -4 };

int tg_fft_c2c_f32(int64_t batch, int64_t n, int32_t inverse, const float *x, float *y);
int tg_fft_r2c_f32(int64_t batch, int64_t n, const float *x, float *y);
int tg_fft_c2r_f32(int64_t batch, int64_t n, const float *x, float *y);
int tg_fft_stft_f32(int64_t batch, int64_t length, int64_t frames, int64_t n, int64_t hop, int64_t pad,
                    const float *x, const float *window, float *y);

#endif
