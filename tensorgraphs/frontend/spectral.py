"""Discrete Fourier transforms as three composites on real pairs (complex values as a trailing (re, im) dim).

`fft_c2c` (complex -> complex), `fft_r2c` (real -> the first n // 2 + 1 frequencies) and `fft_c2r` (those -> real)
transform the last axis, unnormalized (`fft_stft`: r2c of a signal's windowed frames, for tg.stft); `tg.fft` builds
torch's functions on them (length, dim, norm). The cpu device runs them by the FFT library (`kernels.fft`,
`schedule.fft`); their reference decompositions are mixed-radix transforms in primitives (each level a reshape, a
twiddle product and a small DFT as a matrix product), so the numpy device and every other target run them too. All
three are linear, so each gradient is another transform (the adjoint).
"""

from __future__ import annotations

import math

from tensorgraphs import dtypes
from tensorgraphs.frontend import creation
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.complex import pair_product
from tensorgraphs.frontend.linalg import matmul
from tensorgraphs.frontend.tensor import Tensor, apply_composite
from tensorgraphs.graph.composite import Composite, register


def _smallest_factor(n: int) -> int:
    return next((p for p in range(2, math.isqrt(n) + 1) if n % p == 0), n)


def _roots(rows: int, cols: int, n: int, sign: int, dtype: dtypes.DType) -> tuple[Tensor, Tensor]:
    """cos and sin of sign 2 pi r c / n for r < rows, c < cols: the (rows, cols) real and imaginary parts of
    W_n^(r c); the product r c is reduced modulo n in integers, so the angle stays below 2 pi."""
    r = mv.unsqueeze(creation.arange(rows, dtype=dtypes.int64), 1)
    c = mv.unsqueeze(creation.arange(cols, dtype=dtypes.int64), 0)
    wide = dtypes.float64 if dtype == dtypes.float64 else dtypes.float32
    angle = ew.mul(ew.remainder(ew.mul(r, c), n).to(wide), sign * 2 * math.pi / n)
    return ew.cos(angle).to(dtype), ew.sin(angle).to(dtype)


def _direct(x: Tensor, sign: int) -> Tensor:
    """The DFT of pairs x (..., n, 2) along dim -2 as a product with the n x n matrix of roots."""
    n = x.shape[-2]
    cos, sin = _roots(n, n, n, sign, x.dtype)
    xr, xi = x[..., 0], x[..., 1]
    return mv.stack([ew.sub(matmul(xr, cos), matmul(xi, sin)), ew.add(matmul(xr, sin), matmul(xi, cos))], -1)


def _dft(x: Tensor, sign: int) -> Tensor:
    """The DFT of pairs x (..., n, 2) along dim -2, decimated in time by n's smallest prime factor p: the p
    interleaved subsequences' transforms, twiddled, combined by p-point DFTs."""
    *batch, n, _ = x.shape
    p = _smallest_factor(n)
    if n == 1 or p == n:
        return x if n == 1 else _direct(x, sign)
    m = n // p
    parts = _dft(mv.transpose(x.reshape(*batch, m, p, 2), -3, -2), sign)  # (..., p, m, 2): part r's transform
    cos, sin = _roots(p, m, n, sign, x.dtype)
    twiddled = mv.transpose(pair_product(parts, cos, sin), -3, -2)  # (..., m, p, 2)
    return mv.transpose(_direct(twiddled, sign), -3, -2).reshape(*batch, n, 2)


def _c2c_infer(x: Tensor, inverse: bool) -> tuple:
    return x.dtype, x.shape


def _c2c_decomposition(x: Tensor, inverse: bool) -> Tensor:
    return _dft(x, 1 if inverse else -1)


def _c2c_grad(out: Tensor, grad: Tensor, x: Tensor, inverse: bool) -> tuple[Tensor]:
    return (c2c(grad, not inverse),)


def _r2c_infer(x: Tensor) -> tuple:
    return x.dtype, (*x.shape[:-1], x.shape[-1] // 2 + 1, 2)


def _r2c_decomposition(x: Tensor) -> Tensor:
    full = c2c(mv.stack([x, creation.zeros_like(x)], -1), False)
    return mv.narrow(full, -2, 0, x.shape[-1] // 2 + 1)


def _r2c_grad(out: Tensor, grad: Tensor, x: Tensor) -> tuple[Tensor]:
    """The adjoint: the real part of the inverse transform of the gradient padded with zeros to n frequencies."""
    n = x.shape[-1]
    padded = mv.pad_dim(grad, -2, 0, n - grad.shape[-2])
    return (c2c(padded, True)[..., 0],)


def _c2r_infer(x: Tensor, n: int) -> tuple:
    return x.dtype, (*x.shape[:-2], n)


def _hermitian_weights(n: int, dtype: dtypes.DType) -> Tensor:
    """How many of the n frequencies each of the first n // 2 + 1 stands for: 1 for zero (and n / 2 for even n),
    2 for the others (their mirror images)."""
    k = creation.arange(n // 2 + 1, dtype=dtypes.int64)
    edge = ew.logical_or(ew.eq(k, 0), ew.eq(ew.mul(k, 2), n))
    return mv.unsqueeze(ew.where(edge, 1.0, 2.0).to(dtype), -1)


def _c2r_decomposition(x: Tensor, n: int) -> Tensor:
    """The inverse transform of the Hermitian spectrum x completes (the zero and n / 2 frequencies real)."""
    width = n // 2 + 1
    k = mv.unsqueeze(creation.arange(width, dtype=dtypes.int64), -1)
    real_only = ew.logical_or(ew.eq(k, 0), ew.eq(ew.mul(k, 2), n))
    half = mv.stack([x[..., 0], ew.where(real_only[..., 0], 0.0, x[..., 1])], -1)
    mirrored = mv.flip(mv.narrow(half, -2, 1, n - width), -2)  # frequencies n - k for k in (width, n)
    rest = mv.stack([mirrored[..., 0], ew.neg(mirrored[..., 1])], -1)
    return c2c(mv.cat([half, rest], -2), True)[..., 0]


def _c2r_grad(out: Tensor, grad: Tensor, x: Tensor, n: int) -> tuple[Tensor]:
    return (ew.mul(r2c(grad), _hermitian_weights(n, grad.dtype)),)


def _stft_infer(signal: Tensor, window: Tensor, hop: int, pad: int) -> tuple:
    *batch, length = signal.shape
    n = window.shape[0]
    return signal.dtype, (*batch, n // 2 + 1, 1 + (length + 2 * pad - n) // hop, 2)


def frame_positions(frames: int, n: int, hop: int) -> Tensor:
    """Signal index of each frame's samples: hop t + k, flattened (frames * n,)."""
    starts = mv.unsqueeze(ew.mul(creation.arange(frames, dtype=dtypes.int64), hop), 1)
    return ew.add(starts, mv.unsqueeze(creation.arange(n, dtype=dtypes.int64), 0)).reshape(-1)


def _stft_decomposition(signal: Tensor, window: Tensor, hop: int, pad: int) -> Tensor:
    """The signal reflect-padded, its frames gathered and windowed, transformed, frequency moved before frame
    (torch.stft's layout)."""
    padded = mv.pad(signal, [pad, pad], mode="reflect") if pad else signal
    *batch, length = padded.shape
    n = window.shape[0]
    count = 1 + (length - n) // hop
    frames = mv.index_select(padded, -1, frame_positions(count, n, hop)).reshape(*batch, count, n)
    return mv.transpose(r2c(ew.mul(frames, window)), -3, -2)


FFT_C2C = register(Composite("fft_c2c", _c2c_infer, _c2c_decomposition, _c2c_grad))
FFT_R2C = register(Composite("fft_r2c", _r2c_infer, _r2c_decomposition, _r2c_grad))
FFT_C2R = register(Composite("fft_c2r", _c2r_infer, _c2r_decomposition, _c2r_grad))
FFT_STFT = register(Composite("fft_stft", _stft_infer, _stft_decomposition))
"""Differentiated through its decomposition (a gather, a product and `fft_r2c`)."""


def c2c(x: Tensor, inverse: bool) -> Tensor:
    """The unnormalized DFT (inverse: exp(+2 pi i j k / n)) of pairs x (..., n, 2) along dim -2."""
    return apply_composite(FFT_C2C, x, inverse=bool(inverse))


def r2c(x: Tensor) -> Tensor:
    """Frequencies 0 .. n // 2 of the unnormalized DFT of real x (..., n), as pairs (..., n // 2 + 1, 2)."""
    return apply_composite(FFT_R2C, x)


def c2r(x: Tensor, n: int) -> Tensor:
    """The real inverse DFT, unnormalized, of length n of the Hermitian spectrum whose frequencies
    0 .. n // 2 are the pairs x (..., n // 2 + 1, 2)."""
    return apply_composite(FFT_C2R, x, n=int(n))


def framed_r2c(signal: Tensor, window: Tensor, hop: int, pad: int = 0) -> Tensor:
    """r2c of every frame (n = window's length samples, hop apart) of each signal (..., length), reflected `pad`
    samples beyond each end, times the window, as pairs (..., n // 2 + 1, frames, 2): the spectrogram in
    torch.stft's layout, unnormalized."""
    return apply_composite(FFT_STFT, signal, window, hop=int(hop), pad=int(pad))
