"""torch.fft's transforms: fft, ifft, rfft, irfft, fftn, ifftn, rfftn, irfftn with its arguments (n or s, dim,
norm), on the three transform composites of `frontend.spectral`; complex results are `ComplexTensor`s."""

from __future__ import annotations

import math
from typing import Any, Sequence

from tensorgraphs.errors import ArgumentError, DTypeError, fail
from tensorgraphs.frontend import creation
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.complex import ComplexTensor
from tensorgraphs.frontend.spectral import c2c, c2r, r2c
from tensorgraphs.frontend.tensor import Tensor

__all__ = ["fft", "ifft", "rfft", "irfft", "fftn", "ifftn", "rfftn", "irfftn"]
NORMS = ("backward", "ortho", "forward")


def _scale(op: str, norm: str | None, n: int, inverse: bool) -> float:
    """The factor torch's `norm` puts on a transform of length n ("backward": 1/n on the inverse)."""
    norm = "backward" if norm is None else norm
    if norm not in NORMS:
        fail(op, f"norm must be one of {NORMS} or None, got {norm!r}", kind=ArgumentError)
    if norm == "ortho":
        return 1 / math.sqrt(n)
    return 1 / n if (norm == "forward") != inverse else 1.0


def _scaled(x: Tensor, factor: float) -> Tensor:
    return x if factor == 1.0 else ew.mul(x, factor)


def _resized(op: str, x: Tensor, dim: int, n: int) -> Tensor:
    """`x` cut or zero-padded to length n along dim (as torch's `n` argument)."""
    if n < 1:
        fail(op, f"invalid number of data points ({n}) specified", kind=ArgumentError)
    size = x.shape[dim]
    return mv.narrow(x, dim, 0, n) if n <= size else mv.pad_dim(x, dim, 0, n - size)


def _pairs(op: str, x: Any) -> Tensor:
    """The (re, im) pairs of a complex or real floating tensor."""
    if isinstance(x, ComplexTensor):
        return x.pair
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
        fail(op, f"expected a floating or complex tensor, got {getattr(x, 'dtype', type(x).__name__)}",
             kind=DTypeError)
    real = x if x.dtype.name in ("float32", "float64") else x.float()
    return mv.stack([real, creation.zeros_like(real)], -1)


def _dim(op: str, x: Any, dim: int) -> int:
    ndim = x.ndim
    if not -ndim <= dim < ndim:
        fail(op, f"dim {dim} is out of range for a tensor of {ndim} dims", kind=ArgumentError)
    return dim % ndim


def _complex_transform(op: str, x: Any, n: int | None, dim: int, norm: str | None, inverse: bool) -> ComplexTensor:
    d = _dim(op, x, dim)
    pair = _pairs(op, x)
    if n is not None:
        pair = _resized(op, pair, d, n)
    length = pair.shape[d]
    moved = mv.movedim(pair, d, -2)
    return ComplexTensor(mv.movedim(_scaled(c2c(moved, inverse), _scale(op, norm, length, inverse)), -2, d))


def fft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> ComplexTensor:
    """torch.fft.fft: the DFT along `dim`, of length `n` (the input cut or zero-padded)."""
    return _complex_transform("fft", input, n, dim, norm, False)


def ifft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> ComplexTensor:
    """torch.fft.ifft: the inverse DFT along `dim`."""
    return _complex_transform("ifft", input, n, dim, norm, True)


def rfft(input: Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> ComplexTensor:
    """torch.fft.rfft: frequencies 0 .. n // 2 of the DFT of a real input along `dim`."""
    if isinstance(input, ComplexTensor) or not isinstance(input, Tensor) or not input.dtype.is_floating_point:
        fail("rfft", f"expected a real floating tensor, got {getattr(input, 'dtype', type(input).__name__)}",
             kind=DTypeError)
    d = _dim("rfft", input, dim)
    x = input if input.dtype.name in ("float32", "float64") else input.float()
    x = x if n is None else _resized("rfft", x, d, n)
    length = x.shape[d]
    spectrum = _scaled(r2c(mv.movedim(x, d, -1)), _scale("rfft", norm, length, False))
    return ComplexTensor(mv.movedim(spectrum, -2, d))


def irfft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """torch.fft.irfft: the real signal of length n (default 2 (m - 1)) whose Hermitian spectrum's first
    frequencies are the input's m along `dim`."""
    d = _dim("irfft", input, dim)
    pair = _pairs("irfft", input)
    length = 2 * (pair.shape[d] - 1) if n is None else n
    if length < 1:
        fail("irfft", f"invalid number of data points ({length}) specified", kind=ArgumentError)
    half = _resized("irfft", pair, d, length // 2 + 1)
    signal = _scaled(c2r(mv.movedim(half, d, -2), length), _scale("irfft", norm, length, True))
    return mv.movedim(signal, -1, d)


def _dims_and_sizes(op: str, x: Any, s: Sequence[int] | None, dim: int | Sequence[int] | None
                    ) -> tuple[list[int], list[int | None]]:
    if dim is None:
        dims = list(range(x.ndim - len(s), x.ndim)) if s is not None else list(range(x.ndim))
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
    if s is not None and len(s) != len(dims):
        fail(op, f"s has {len(s)} sizes but {len(dims)} dims are transformed", kind=ArgumentError)
    return [_dim(op, x, d) for d in dims], list(s) if s is not None else [None] * len(dims)


def _along_dims(op: str, input: Any, s: Sequence[int] | None, dim: int | Sequence[int] | None, norm: str | None,
                inverse: bool) -> ComplexTensor:
    dims, sizes = _dims_and_sizes(op, input, s, dim)
    out = input
    for d, n in zip(dims, sizes):
        out = _complex_transform(op, out, n, d, norm, inverse)
    return out if isinstance(out, ComplexTensor) else ComplexTensor(_pairs(op, out))


def fftn(input: Any, s: Sequence[int] | None = None, dim: int | Sequence[int] | None = None,
         norm: str | None = None) -> ComplexTensor:
    """torch.fft.fftn: the DFT along each of `dim` (all by default)."""
    return _along_dims("fftn", input, s, dim, norm, False)


def ifftn(input: Any, s: Sequence[int] | None = None, dim: int | Sequence[int] | None = None,
          norm: str | None = None) -> ComplexTensor:
    """torch.fft.ifftn: the inverse DFT along each of `dim`."""
    return _along_dims("ifftn", input, s, dim, norm, True)


def rfftn(input: Tensor, s: Sequence[int] | None = None, dim: int | Sequence[int] | None = None,
          norm: str | None = None) -> ComplexTensor:
    """torch.fft.rfftn: rfft along the last of `dim`, then the DFT along the others."""
    dims, sizes = _dims_and_sizes("rfftn", input, s, dim)
    out = rfft(input, sizes[-1], dims[-1], norm)
    for d, n in zip(dims[:-1], sizes[:-1]):
        out = _complex_transform("rfftn", out, n, d, norm, False)
    return out


def irfftn(input: Any, s: Sequence[int] | None = None, dim: int | Sequence[int] | None = None,
           norm: str | None = None) -> Tensor:
    """torch.fft.irfftn: the inverse DFT along all of `dim` but the last, then irfft along the last."""
    dims, sizes = _dims_and_sizes("irfftn", input, s, dim)
    out = input
    for d, n in zip(dims[:-1], sizes[:-1]):
        out = _complex_transform("irfftn", out, n, d, norm, True)
    return irfft(out, sizes[-1], dims[-1], norm)
