"""tg.fft against torch.fft: values, gradients and errors, on the reference interpreter and compiled."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.errors import ArgumentError, DTypeError


def _pairs(x: torch.Tensor) -> np.ndarray:
    return torch.view_as_real(x.resolve_conj()).detach().numpy()


@pytest.mark.parametrize("device", ["numpy", "cpu"])
@pytest.mark.parametrize("name", ["fft", "ifft", "rfft"])
@pytest.mark.parametrize(("shape", "kwargs"), [((3, 16), {}), ((2, 15), {"n": 20}), ((6, 4), {"dim": 0}),
                                               ((2, 12), {"n": 8, "norm": "ortho"}), ((97,), {"norm": "forward"})])
def test_one_dim_transforms_match_torch(device, name, shape, kwargs):
    x = np.random.default_rng(len(shape) + sum(shape)).standard_normal(shape).astype(np.float32)
    with tg.device(device):
        got = tg.view_as_real(getattr(tg.fft, name)(tg.tensor(x), **kwargs)).numpy()
    np.testing.assert_allclose(got, _pairs(getattr(torch.fft, name)(torch.from_numpy(x), **kwargs)), atol=2e-5)


def test_complex_input_and_round_trip():
    rng = np.random.default_rng(1)
    z = (rng.standard_normal((3, 10)) + 1j * rng.standard_normal((3, 10))).astype(np.complex64)
    np.testing.assert_allclose(tg.fft.fft(tg.tensor(z)).numpy(), torch.fft.fft(torch.from_numpy(z)).numpy(),
                               atol=2e-5)
    np.testing.assert_allclose(tg.fft.ifft(tg.fft.fft(tg.tensor(z))).numpy(), z, atol=2e-6)


@pytest.mark.parametrize("n", [None, 9, 10])
def test_irfft_matches_torch(n):
    spectrum = np.random.default_rng(2).standard_normal((2, 6, 2)).astype(np.float32)
    got = tg.fft.irfft(tg.view_as_complex(tg.tensor(spectrum)), n=n).numpy()
    want = torch.fft.irfft(torch.view_as_complex(torch.from_numpy(spectrum)), n=n).numpy()
    np.testing.assert_allclose(got, want, atol=2e-6)


@pytest.mark.parametrize(("name", "kwargs"), [("fftn", {}), ("fftn", {"s": (4, 6), "dim": (0, 2)}),
                                              ("rfftn", {}), ("rfftn", {"dim": (0, 1), "norm": "ortho"}),
                                              ("ifftn", {"dim": (1,)})])
def test_n_dim_transforms_match_torch(name, kwargs):
    x = np.random.default_rng(3).standard_normal((3, 5, 8)).astype(np.float32)
    got = tg.view_as_real(getattr(tg.fft, name)(tg.tensor(x), **kwargs)).numpy()
    np.testing.assert_allclose(got, _pairs(getattr(torch.fft, name)(torch.from_numpy(x), **kwargs)), atol=5e-5)


def test_irfftn_inverts_rfftn():
    x = np.random.default_rng(4).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_allclose(tg.fft.irfftn(tg.fft.rfftn(tg.tensor(x)), s=(4, 6)).numpy(), x, atol=1e-5)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("name", ["fft", "ifft", "rfft", "irfft"])
def test_gradients_match_torch(name, compiled):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 12) if name != "irfft" else (3, 7, 2)).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    given = torch.view_as_complex(tx) if name == "irfft" else tx
    out = getattr(torch.fft, name)(given, norm="ortho")
    weights = rng.standard_normal(tuple(out.shape) + (() if name == "irfft" else (2,))).astype(np.float32)
    real = out if name == "irfft" else torch.view_as_real(out.resolve_conj())
    (real * torch.from_numpy(weights)).sum().backward()

    def loss(a: tg.Tensor) -> tg.Tensor:
        out = getattr(tg.fft, name)(tg.view_as_complex(a) if name == "irfft" else a, norm="ortho")
        real = out if name == "irfft" else tg.view_as_real(out)
        return (real * tg.tensor(weights)).sum()

    a = tg.tensor(x, requires_grad=True)
    if compiled:
        (grad,) = tg.compile(lambda a: tg.grad(loss(a), [a]))(a)
    else:
        loss(a).backward()
        grad = a.grad
    np.testing.assert_allclose(grad.numpy(), tx.grad.numpy(), atol=1e-5)


def test_bad_arguments_fail_at_the_call():
    x = tg.ones(8)
    with pytest.raises(ArgumentError, match="norm must be one of"):
        tg.fft.fft(x, norm="unitary")
    with pytest.raises(ArgumentError, match="invalid number of data points"):
        tg.fft.rfft(x, n=0)
    with pytest.raises(ArgumentError, match="dim 1 is out of range"):
        tg.fft.fft(x, dim=1)
    with pytest.raises(DTypeError, match="rfft: expected a real floating tensor"):
        tg.fft.rfft(tg.ones(8, dtype=tg.int64))
