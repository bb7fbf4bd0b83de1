"""Transforms run by the FFT library from generated C (schedule.fft), checked against the decomposition run by
the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.codegen.loop_ir import FftCall, walk
from tensorgraphs.schedule.fusion import schedule_kernels

pytestmark = pytest.mark.device("cpu", compile=True)


def _calls(result: tg.Tensor) -> list[FftCall]:
    kernels = schedule_kernels([result.node]).kernels
    return [stmt for kernel in kernels for stmt in walk(kernel.body) if isinstance(stmt, FftCall)]


def _on_both(transform, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The transform compiled for the cpu device and run by the reference interpreter (its decomposition)."""
    with tg.device("cpu"):
        compiled = tg.compile(transform)(tg.tensor(x)).numpy()
    with tg.device("numpy"):
        reference = transform(tg.tensor(x)).numpy()
    return compiled, reference


@pytest.mark.parametrize("n", [16, 12, 127, 1024])  # radix 4/2, radix 3, Bluestein, long
@pytest.mark.parametrize("name", ["fft", "ifft", "rfft"])
def test_library_matches_the_decomposition(name, n):
    x = np.random.default_rng(n).standard_normal((3, n)).astype(np.float32)
    transform = lambda t: tg.view_as_real(getattr(tg.fft, name)(t))  # noqa: E731
    assert len(_calls(transform(tg.tensor(x)))) == 1
    got, reference = _on_both(transform, x)
    np.testing.assert_allclose(got, reference, atol=2e-4 * np.abs(reference).max())


@pytest.mark.parametrize("n", [10, 9])
def test_irfft_library_matches_the_decomposition(n):
    spectrum = np.random.default_rng(n).standard_normal((2, n // 2 + 1, 2)).astype(np.float32)
    transform = lambda t: tg.fft.irfft(tg.view_as_complex(t), n=n)  # noqa: E731
    (call,) = _calls(transform(tg.tensor(spectrum)))
    assert (call.kind, call.batch, call.n) == ("c2r", 2, n)
    got, reference = _on_both(transform, spectrum)
    np.testing.assert_allclose(got, reference, atol=1e-5)


def test_a_transform_along_a_leading_dim_reads_materialized_rows():
    x = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
    transform = lambda t: tg.view_as_real(tg.fft.fft(t, dim=0))  # noqa: E731
    (call,) = _calls(transform(tg.tensor(x)))
    assert (call.batch, call.n) == (5, 8)
    got, reference = _on_both(transform, x)
    np.testing.assert_allclose(got, reference, atol=1e-5)


def test_float64_runs_the_decomposition():
    assert _calls(tg.view_as_real(tg.fft.rfft(tg.ones(16, dtype=tg.float64)))) == []


@pytest.mark.parametrize(("n", "hop", "center"), [(64, 16, False), (30, 7, False), (64, 16, True)])
def test_stft_frames_are_read_in_place_by_one_call(n, hop, center):
    signal = np.random.default_rng(n).standard_normal((2, 300)).astype(np.float32)
    window = tg.tensor(np.hanning(n).astype(np.float32))
    transform = lambda s: tg.view_as_real(tg.stft(s, n, hop, window=window, center=center, return_complex=True))  # noqa: E731
    (call,) = _calls(transform(tg.tensor(signal)))
    pad = n // 2 if center else 0  # reflected by the kernel
    assert (call.kind, call.batch, call.n, call.hop, call.pad) == ("stft", 2, n, hop, pad)
    assert call.frames == 1 + (300 + 2 * pad - n) // hop
    got, reference = _on_both(transform, signal)
    np.testing.assert_allclose(got, reference, atol=1e-4)


def test_odd_frames_run_the_decomposition():
    transform = tg.stft(tg.ones(100), 15, 5, center=False, return_complex=True)
    assert [call.kind for call in _calls(tg.view_as_real(transform))] == ["r2c"]
