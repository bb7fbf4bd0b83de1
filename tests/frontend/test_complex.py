"""Complex tensors (frontend.complex) against torch: values of every op, and gradients with torch's convention
(the conjugate Wirtinger derivative) for real losses of complex leaves."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
import torch

import tensorgraphs as tg

Op = Callable[[Any, Any, Any], Any]
OPS: dict[str, Op] = {
    "add": lambda lib, a, b: a + b,
    "sub": lambda lib, a, b: a - b,
    "mul": lambda lib, a, b: a * b,
    "div": lambda lib, a, b: a / b,
    "neg_conj": lambda lib, a, b: -lib.conj(a) + b.conj(),
    "scalar": lambda lib, a, b: (2 - 1j) * a + a / (0.5 + 2j) - 3,
    "real_tensor": lambda lib, a, b: lib.real(b) * a + a * lib.imag(b) - lib.imag(b),
    "matmul": lambda lib, a, b: a.reshape(2, 3) @ b.reshape(3, 2),
    "sum": lambda lib, a, b: (a * b).sum(0),
    "mean": lambda lib, a, b: (a * b).reshape(2, 3).mean(dim=-1, keepdim=True),
    "polar": lambda lib, a, b: lib.polar(a.abs(), lib.angle(b)),
    "complex": lambda lib, a, b: lib.complex(lib.real(a), lib.imag(b)),
    "round_trip": lambda lib, a, b: lib.view_as_complex(lib.view_as_real(a) * 2) + b,
}


def _values(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal((2, 6)) + 1j * rng.standard_normal((2, 6)) for _ in range(2))
    return a.reshape(6, 2)[:, 0].astype(np.complex64), b.reshape(6, 2)[:, 1].astype(np.complex64)


def _real_loss(lib: Any, out: Any, weights: np.ndarray) -> Any:
    """A real loss of a complex result: a weighted sum of its parts, plus its magnitudes."""
    w = lib.tensor(weights)
    pairs = lib.view_as_real(out.resolve_conj() if hasattr(out, "resolve_conj") else out)
    return (pairs * w).sum() + out.abs().sum()


@pytest.mark.parametrize("name", OPS)
def test_values_and_gradients_match_torch(name):
    a, b = _values(len(name))
    ta, tb = (torch.tensor(v, requires_grad=True) for v in (a, b))
    ga, gb = (tg.tensor(v, requires_grad=True) for v in (a, b))
    want, got = OPS[name](torch, ta, tb), OPS[name](tg, ga, gb)
    assert got.dtype == tg.complex64 and got.shape == tuple(want.shape)
    np.testing.assert_allclose(got.numpy(), want.resolve_conj().detach().numpy(), rtol=1e-5, atol=1e-5)
    weights = np.random.default_rng(0).standard_normal((*want.shape, 2)).astype(np.float32)
    _real_loss(torch, want, weights).backward()
    _real_loss(tg, got, weights).backward()
    for mine, theirs in ((ga, ta), (gb, tb)):
        if theirs.grad is not None:
            np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.resolve_conj().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("part", ["real", "imag", "abs", "angle"])
def test_real_valued_functions_match_torch(part):
    a, _ = _values(7)
    want = getattr(torch, part)(torch.from_numpy(a)).numpy()
    got = getattr(tg, part)(tg.tensor(a)) if part != "abs" else tg.tensor(a).abs()
    assert got.dtype == tg.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)


def test_dtypes_follow_torch():
    assert tg.tensor([1 + 2j]).dtype == tg.complex64  # Python numbers: the default complex dtype
    assert tg.tensor(np.ones(2, np.complex128)).dtype == tg.complex128
    assert tg.tensor([1.0, 2.0], dtype=tg.complex64).dtype == tg.complex64
    assert tg.view_as_real(tg.tensor(np.ones(2, np.complex128))).dtype == tg.float64
    assert tg.is_complex(tg.tensor([1j])) and not tg.is_complex(tg.ones(2))
    assert tg.tensor([1j]).is_complex() and not tg.ones(2).is_complex()


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_a_float64_operand_widens_to_complex128_as_in_torch(name):
    a, _ = _values(3)
    wide = np.random.default_rng(3).standard_normal(6)
    want = OPS[name](torch, torch.from_numpy(a), torch.from_numpy(wide))
    got = OPS[name](tg, tg.tensor(a), tg.tensor(wide))
    assert got.dtype == tg.complex128 and want.dtype == torch.complex128
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)


def test_view_as_complex_needs_pairs():
    with pytest.raises(tg.ShapeError, match="last dim has size 2"):
        tg.view_as_complex(tg.ones(3, 3))
