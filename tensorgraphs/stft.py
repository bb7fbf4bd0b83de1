"""torch.stft and torch.istft: short-time Fourier transforms on tg.fft's transforms.

The (centered, padded) signal's frames are windowed and transformed as one batch (`spectral.framed_r2c`: on the cpu
device one call of the FFT library reading the frames in place and writing torch's layout); the inverse transforms
the frames back, windows them and overlap-adds them (a scatter-add), dividing by the summed squared window as torch
does. Both are differentiable.
"""

from __future__ import annotations

from tensorgraphs import dtypes
from tensorgraphs import fft as tg_fft
from tensorgraphs.errors import ArgumentError, DTypeError, fail
from tensorgraphs.frontend import creation
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.complex import ComplexTensor
from tensorgraphs.frontend.spectral import frame_positions, framed_r2c
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.runtime import tracing

__all__ = ["stft", "istft"]


def _settings(op: str, n_fft: int, hop_length: int | None, win_length: int | None) -> tuple[int, int]:
    hop = n_fft // 4 if hop_length is None else hop_length
    win = n_fft if win_length is None else win_length
    if n_fft < 1 or hop < 1 or not 0 < win <= n_fft:
        fail(op, f"expected 0 < win_length <= n_fft and hop_length > 0, got n_fft={n_fft}, hop_length={hop}, "
             f"win_length={win}", kind=ArgumentError)
    return hop, win


def _full_window(op: str, window: Tensor | None, win: int, n_fft: int, dtype: dtypes.DType) -> Tensor:
    """The window (ones by default) of win_length, zero-padded on both sides to n_fft (centered)."""
    if window is None:
        window = creation.ones(win, dtype=dtype)
    if window.ndim != 1 or window.shape[0] != win:
        fail(op, f"expected a 1-D window of win_length {win}, got shape {tuple(window.shape)}", kind=ArgumentError)
    left = (n_fft - win) // 2
    return mv.pad_dim(window.to(dtype), 0, left, n_fft - win - left)


def stft(input: Tensor, n_fft: int, hop_length: int | None = None, win_length: int | None = None,
         window: Tensor | None = None, center: bool = True, pad_mode: str = "reflect", normalized: bool = False,
         onesided: bool | None = None, return_complex: bool | None = None) -> ComplexTensor | Tensor:
    """torch.stft of a real 1-D (length) or 2-D (batch, length) signal: (batch?, freq, frames) complex, or its
    (re, im) pairs when return_complex is False."""
    if return_complex is None:
        fail("stft", "stft requires the return_complex parameter be given for real inputs (as torch)",
             kind=ArgumentError)
    if not isinstance(input, Tensor) or not input.dtype.is_floating_point or input.ndim not in (1, 2):
        fail("stft", f"expected a real 1-D or 2-D floating signal, got {getattr(input, 'dtype', type(input))} "
             f"of shape {getattr(input, 'shape', None)}", kind=DTypeError)
    hop, win = _settings("stft", n_fft, hop_length, win_length)
    full_window = _full_window("stft", window, win, n_fft, input.dtype)
    onesided = True if onesided is None else onesided
    reflected = center and pad_mode == "reflect" and onesided and n_fft // 2 < input.shape[-1]  # read in place
    signal = mv.pad(input, [n_fft // 2] * 2, mode=pad_mode) if center and not reflected else input
    length = signal.shape[-1] + (2 * (n_fft // 2) if reflected else 0)
    if length < n_fft:
        fail("stft", f"the (padded) signal of length {length} is shorter than n_fft={n_fft}", kind=ArgumentError)
    if onesided:
        pairs = framed_r2c(signal, full_window, hop, n_fft // 2 if reflected else 0)  # (..., freq, frames, 2)
    else:
        count = 1 + (length - n_fft) // hop
        frames = mv.index_select(signal, -1, frame_positions(count, n_fft, hop)).reshape(*input.shape[:-1], count,
                                                                                          n_fft)
        pairs = mv.transpose(tg_fft.fft(ew.mul(frames, full_window)).pair, -3, -2)
    pairs = ew.mul(pairs, n_fft ** -0.5) if normalized else pairs
    return ComplexTensor(pairs) if return_complex else pairs


def istft(input: ComplexTensor, n_fft: int, hop_length: int | None = None, win_length: int | None = None,
          window: Tensor | None = None, center: bool = True, normalized: bool = False, onesided: bool | None = None,
          length: int | None = None, return_complex: bool = False) -> Tensor:
    """torch.istft: the real signal whose stft (same settings) is `input` (batch?, freq, frames), by windowed
    overlap-add divided by the summed squared window."""
    if not isinstance(input, ComplexTensor) or input.ndim not in (2, 3):
        fail("istft", f"expected a 2-D or 3-D complex spectrogram, got {type(input).__name__}", kind=DTypeError)
    if return_complex:
        fail("istft", "return_complex=True (a complex signal) is not supported", kind=ArgumentError)
    hop, win = _settings("istft", n_fft, hop_length, win_length)
    spectrum = input if input.ndim == 3 else ComplexTensor(mv.unsqueeze(input.pair, 0))
    batch, freqs, count = spectrum.shape
    onesided = freqs != n_fft if onesided is None else onesided
    if freqs != (n_fft // 2 + 1 if onesided else n_fft):
        fail("istft", f"expected {n_fft // 2 + 1 if onesided else n_fft} frequencies for n_fft={n_fft}, got {freqs}",
             kind=ArgumentError)
    half = spectrum.pair if onesided else mv.narrow(spectrum.pair, 1, 0, n_fft // 2 + 1)  # as torch: irfft of it
    frames = tg_fft.irfft(ComplexTensor(mv.transpose(half, 1, 2)), n=n_fft, norm="ortho" if normalized else "backward")
    full_window = _full_window("istft", window, win, n_fft, frames.dtype)
    expected = n_fft + hop * (count - 1)
    positions = frame_positions(count, n_fft, hop)
    signal = mv.scatter_add(creation.zeros(batch, expected, dtype=frames.dtype), 1,
                            mv.expand(mv.unsqueeze(positions, 0), batch, count * n_fft),
                            ew.mul(frames, full_window).reshape(batch, count * n_fft))
    envelope = mv.scatter_add(creation.zeros(expected, dtype=frames.dtype), 0, positions,
                              mv.expand(ew.mul(full_window, full_window), count, n_fft).reshape(-1))
    start = n_fft // 2 if center else 0
    end = start + length if length is not None else expected - n_fft // 2 if center else expected
    end = min(end, expected)
    signal, envelope = mv.narrow(signal, 1, start, end - start), mv.narrow(envelope, 0, start, end - start)
    if not tracing.traces_recording and ew.lt(envelope.abs(), 1e-11).any().item():  # a trace reads no values
        fail("istft", "window overlap add min: the window's squared sum is (near) zero somewhere (NOLA fails)",
             kind=ArgumentError)
    signal = ew.div(signal, envelope)
    if length is not None and signal.shape[1] < length:
        signal = mv.pad_dim(signal, 1, 0, length - signal.shape[1])
    return signal if input.ndim == 3 else signal[0]
