"""tg.stft and tg.istft against torch: values, gradients and round trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.errors import ArgumentError

pytestmark = [pytest.mark.filterwarnings("ignore:A window was not provided"),  # torch's warnings
              pytest.mark.filterwarnings("ignore:The length of signal is shorter")]
CASES = [
    ({"n_fft": 16}, (2, 100)),
    ({"n_fft": 16, "hop_length": 5, "win_length": 12, "window": "hann"}, (90,)),
    ({"n_fft": 15, "hop_length": 4, "center": False}, (2, 64)),  # hann: 0 at the first sample, NOLA fails
    ({"n_fft": 16, "hop_length": 4, "pad_mode": "constant", "normalized": True, "window": "hann"}, (50,)),
    ({"n_fft": 8, "hop_length": 2, "onesided": False, "window": "hann"}, (2, 40)),
]


def _args(kwargs: dict, lib) -> dict:
    out = dict(kwargs)
    if out.get("window") == "hann":
        size = out.get("win_length", out["n_fft"])
        out["window"] = lib.tensor(np.hanning(size + 1)[:-1].astype(np.float32))
    return out


@pytest.mark.parametrize(("kwargs", "shape"), CASES)
def test_stft_matches_torch_with_gradients(kwargs, shape):
    rng = np.random.default_rng(len(shape) * 7 + kwargs["n_fft"])
    x = rng.standard_normal(shape).astype(np.float32)
    tx, gx = torch.tensor(x, requires_grad=True), tg.tensor(x, requires_grad=True)
    want = torch.stft(tx, **_args(kwargs, torch), return_complex=True)
    got = tg.stft(gx, **_args(kwargs, tg), return_complex=True)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), atol=2e-5)
    weights = rng.standard_normal((*want.shape, 2)).astype(np.float32)
    (torch.view_as_real(want) * torch.from_numpy(weights)).sum().backward()
    (tg.view_as_real(got) * tg.tensor(weights)).sum().backward()
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy(), atol=5e-5)


@pytest.mark.parametrize(("kwargs", "shape"), [c for c in CASES if "pad_mode" not in c[0]])
def test_istft_matches_torch_with_gradients(kwargs, shape):
    rng = np.random.default_rng(kwargs["n_fft"])
    x = rng.standard_normal(shape).astype(np.float32)
    spectrum = torch.stft(torch.from_numpy(x), **_args(kwargs, torch), return_complex=True)
    pairs = torch.view_as_real(spectrum).numpy()
    settings = {k: v for k, v in _args(kwargs, torch).items() if k != "pad_mode"}
    tp = torch.tensor(pairs, requires_grad=True)
    want = torch.istft(torch.view_as_complex(tp), **settings, length=shape[-1])
    gp = tg.tensor(pairs, requires_grad=True)
    got = tg.istft(tg.view_as_complex(gp), **{k: v for k, v in _args(kwargs, tg).items() if k != "pad_mode"},
                   length=shape[-1])
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), atol=2e-5)
    if kwargs.get("center", True):  # uncentered frames miss the tail
        np.testing.assert_allclose(got.detach().numpy(), x, atol=2e-5)  # a round trip
    weights = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.from_numpy(weights)).sum().backward()
    (got * tg.tensor(weights)).sum().backward()
    np.testing.assert_allclose(gp.grad.numpy(), tp.grad.numpy(), atol=5e-5)


def test_stft_compiles_to_one_library_call_per_transform():
    """The library writes torch's layout straight into the program's output: no copy, transpose or window kernel,
    no temporary; its magnitude adds one elementwise kernel."""
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    window = tg.tensor(np.hanning(256).astype(np.float32))
    spectrogram = tg.compile(lambda s: tg.view_as_real(tg.stft(s, 256, 64, window=window, return_complex=True)))
    magnitude = tg.compile(lambda s: tg.stft(s, 256, 64, window=window, return_complex=True).abs())
    want = torch.stft(torch.from_numpy(x), 256, 64, window=torch.from_numpy(np.hanning(256).astype(np.float32)),
                      return_complex=True)
    np.testing.assert_allclose(spectrogram(tg.tensor(x)).numpy(), torch.view_as_real(want).numpy(), atol=1e-4)
    np.testing.assert_allclose(magnitude(tg.tensor(x)).numpy(), want.abs().numpy(), atol=1e-4)
    assert (spectrogram.stats.kernels, spectrogram.stats.arena_bytes) == (1, 0)
    assert magnitude.stats.kernels == 2


def test_return_complex_is_required_and_bad_settings_fail_at_the_call():
    with pytest.raises(ArgumentError, match="return_complex"):
        tg.stft(tg.ones(64), 16)
    with pytest.raises(ArgumentError, match="win_length"):
        tg.stft(tg.ones(64), 16, win_length=32, return_complex=True)
    with pytest.raises(ArgumentError, match="NOLA"):
        tg.istft(tg.stft(tg.ones(64), 16, 16, window=tg.zeros(16), return_complex=True), 16, 16, window=tg.zeros(16))
