"""The FFT kernels (kernels/fft) against numpy.fft: every path (radix 4/2, odd radices, Bluestein, the real
transforms' even split and odd fallback, rows as lanes, a single row's four-step transform, threaded or inside the
groups' threads, the STFT's frames in whole and partial tiles)."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgraphs.kernels import fft

LENGTHS = [1, 2, 3, 4, 5, 6, 8, 12, 15, 16, 30, 64, 97, 100, 210, 1000, 1024, 131, 1031, 4096]


def _complex(pairs: np.ndarray) -> np.ndarray:
    return pairs[..., 0] + 1j * pairs[..., 1]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, atol=2e-5 * max(1.0, float(np.abs(want).max())), rtol=0)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("batch", [1, 3, 17])
def test_complex_transforms(n, batch):
    rng = np.random.default_rng(n + batch)
    x = rng.standard_normal((batch, n, 2)).astype(np.float32)
    _close(_complex(fft.transform("c2c", x, n).reshape(batch, n, 2)), np.fft.fft(_complex(x)))
    _close(_complex(fft.transform("c2c", x, n, inverse=True).reshape(batch, n, 2)), np.fft.ifft(_complex(x)) * n)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("batch", [1, 3, 17])
def test_real_transforms(n, batch):
    rng = np.random.default_rng(n * batch)
    x = rng.standard_normal((batch, n)).astype(np.float32)
    _close(_complex(fft.transform("r2c", x, n).reshape(batch, -1, 2)), np.fft.rfft(x))
    spectrum = rng.standard_normal((batch, n // 2 + 1, 2)).astype(np.float32)  # DC/Nyquist imaginary parts dropped
    _close(fft.transform("c2r", spectrum, n).reshape(batch, n), np.fft.irfft(_complex(spectrum), n) * n)


# A single row of 1024 points or more, divisible by 256, runs as a four-step transform (blocks of columns, then of
# rows): lengths below and at the switch-over, with odd factors in either half, not divisible by 256, and Bluestein
# lengths whose power-of-two transform is one.
FOUR_STEP_LENGTHS = [768, 1000, 1024, 1280, 3 * 1024, 4352, 45 * 1024, 1031, 4099]


@pytest.mark.parametrize("n", FOUR_STEP_LENGTHS)
@pytest.mark.parametrize("batch", [1, 9])  # 9: a group of 8 rows, then one row inside the groups' threads
def test_four_step_rows(n, batch):
    rng = np.random.default_rng(n + batch)
    x = rng.standard_normal((batch, n, 2)).astype(np.float32)
    _close(_complex(fft.transform("c2c", x, n).reshape(batch, n, 2)), np.fft.fft(_complex(x)))
    _close(_complex(fft.transform("c2c", x, n, inverse=True).reshape(batch, n, 2)), np.fft.ifft(_complex(x)) * n)
    real = rng.standard_normal((batch, 2 * n)).astype(np.float32)  # its half-length complex transform has n points
    _close(_complex(fft.transform("r2c", real, 2 * n).reshape(batch, -1, 2)), np.fft.rfft(real))
    spectrum = rng.standard_normal((batch, n + 1, 2)).astype(np.float32)
    _close(fft.transform("c2r", spectrum, 2 * n).reshape(batch, 2 * n), np.fft.irfft(_complex(spectrum), 2 * n) * 2 * n)


@pytest.mark.parametrize("n", [2**17, 2**20])
def test_long_single_row(n):
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    _close(_complex(fft.transform("r2c", x, x.size).reshape(-1, 2)), np.fft.rfft(x))
    spectrum = np.random.default_rng(1).standard_normal((x.size // 2 + 1, 2)).astype(np.float32)
    _close(fft.transform("c2r", spectrum, x.size), np.fft.irfft(_complex(spectrum), x.size) * x.size)
    pairs = x.reshape(-1, 2)
    _close(
        _complex(fft.transform("c2c", pairs, n // 2, inverse=True).reshape(-1, 2)),
        np.fft.ifft(_complex(pairs)) * (n // 2),
    )


@pytest.mark.parametrize(
    ("batch", "length", "n", "hop", "pad"),
    [
        (1, 100, 16, 4, 0),
        (3, 4000, 256, 64, 128),
        (2, 50, 10, 7, 0),
        (9, 40, 32, 3, 16),
        (2, 1072, 64, 16, 0),
        (2, 25344, 1024, 256, 512),
    ],
)
def test_stft_reads_windowed_frames_and_writes_frequency_before_frame(batch, length, n, hop, pad):
    rng = np.random.default_rng(length)
    x, window = rng.standard_normal((batch, length)).astype(np.float32), rng.random(n).astype(np.float32)
    padded = np.pad(x, ((0, 0), (pad, pad)), mode="reflect")
    starts = np.arange(1 + (padded.shape[1] - n) // hop) * hop
    frames = padded[:, starts[:, None] + np.arange(n)] * window  # (batch, frames, n)
    want = np.fft.rfft(frames).transpose(0, 2, 1)
    _close(_complex(fft.stft(x, window, hop, pad)), want)


@pytest.mark.parametrize(
    ("batch", "length", "n", "hop", "pad"),
    [(2, 6144, 2048, 512, 0), (1, 16384, 16384, 1, 0), (2, 49152, 16384, 4096, 0), (1, 20000, 4096, 1000, 2048)],
)
def test_stft_without_window(batch, length, n, hop, pad):
    # Unwindowed frames of one lane (9 frames: a group of 8, then one; a lone frame) run the four-step transform
    # on the signal's pairs in place; frames reaching into the padding are gathered first.
    x = np.random.default_rng(length).standard_normal((batch, length)).astype(np.float32)
    padded = np.pad(x, ((0, 0), (pad, pad)), mode="reflect")
    starts = np.arange(1 + (padded.shape[1] - n) // hop) * hop
    want = np.fft.rfft(padded[:, starts[:, None] + np.arange(n)]).transpose(0, 2, 1)
    _close(_complex(fft.stft(x, None, hop, pad, n=n)), want)
