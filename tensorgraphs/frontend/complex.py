"""Complex tensors: a complex64/complex128 tensor is the real tensor of its (re, im) pairs.

A `ComplexTensor` holds `pair`, a float32/float64 Tensor of shape (*shape, 2), exactly what torch.view_as_real
shows. Every complex op is a few real ops on pairs, so every device, the compiler and autograd get complex numbers
from real ones with nothing of their own. Gradients follow PyTorch's convention (the conjugate Wirtinger
derivative, which for a real loss L is dL/dre + i dL/dim): that is the pair's own real gradient, read as complex.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.errors import DTypeError, ShapeError, fail
from tensorgraphs.frontend import creation
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.linalg import matmul
from tensorgraphs.frontend.tensor import Tensor

COMPLEX_OF = {dtypes.float32: dtypes.complex64, dtypes.float64: dtypes.complex128}
REAL_OF = {c: r for r, c in COMPLEX_OF.items()}


class ComplexTensor:
    """A lazily evaluated complex tensor with PyTorch's names; its values are the real tensor `pair`."""

    __slots__ = ("pair",)
    __array_priority__ = 1000
    tensor_operators_defer = True  # real_tensor * complex_tensor: Tensor's operators leave it to ours

    def __init__(self, pair: Tensor) -> None:
        if pair.ndim == 0 or pair.shape[-1] != 2 or pair.dtype not in COMPLEX_OF:
            fail("view_as_complex", f"expected a float32 or float64 tensor whose last dim has size 2, got "
                 f"{pair.dtype.name}{list(pair.shape)}", kind=ShapeError)
        self.pair = pair

    # -- properties and values ---------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.pair.shape[:-1]

    @property
    def dtype(self) -> dtypes.DType:
        return COMPLEX_OF[self.pair.dtype]

    @property
    def ndim(self) -> int:
        return self.pair.ndim - 1

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return int(np.prod(self.shape))

    def is_complex(self) -> bool:
        return True

    @property
    def real(self) -> Tensor:
        return self.pair[..., 0]

    @property
    def imag(self) -> Tensor:
        return self.pair[..., 1]

    def numpy(self) -> np.ndarray:
        values = self.pair.detach().numpy()
        return (values[..., 0] + 1j * values[..., 1]).astype(self.dtype.storage)

    def item(self) -> complex:
        return complex(self.numpy().item())

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def __repr__(self) -> str:
        return f"tensor({self.numpy()!r}, dtype={self.dtype!r})"

    # -- autograd ----------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self.pair.requires_grad

    def requires_grad_(self, requires_grad: bool = True) -> ComplexTensor:
        self.pair.requires_grad_(requires_grad)
        return self

    @property
    def grad(self) -> ComplexTensor | None:
        grad = self.pair.grad
        return None if grad is None else ComplexTensor(grad)

    def backward(self, gradient: ComplexTensor | None = None, **kwargs: Any) -> None:
        if gradient is None:
            fail("backward", "grad can be implicitly created only for real scalar outputs", kind=DTypeError)
        self.pair.backward(as_complex(gradient, self).pair, **kwargs)

    def detach(self) -> ComplexTensor:
        return ComplexTensor(self.pair.detach())

    # -- arithmetic --------------------------------------------------------
    def __add__(self, other: Any) -> ComplexTensor:
        return ComplexTensor(ew.add(self.pair, as_complex(other, self).pair))

    __radd__ = __add__

    def __sub__(self, other: Any) -> ComplexTensor:
        return ComplexTensor(ew.sub(self.pair, as_complex(other, self).pair))

    def __rsub__(self, other: Any) -> ComplexTensor:
        return ComplexTensor(ew.sub(as_complex(other, self).pair, self.pair))

    def __neg__(self) -> ComplexTensor:
        return ComplexTensor(ew.neg(self.pair))

    def __mul__(self, other: Any) -> ComplexTensor:
        other = as_complex(other, self)
        return ComplexTensor(pair_product(self.pair, other.real, other.imag))

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> ComplexTensor:
        other = as_complex(other, self)
        scale = ew.add(ew.mul(other.real, other.real), ew.mul(other.imag, other.imag))
        return ComplexTensor(ew.div(pair_product(self.pair, other.real, ew.neg(other.imag)), mv.unsqueeze(scale, -1)))

    def __rtruediv__(self, other: Any) -> ComplexTensor:
        return as_complex(other, self) / self

    def __matmul__(self, other: Any) -> ComplexTensor:
        other = as_complex(other, self)
        a, b, c, d = self.real, self.imag, other.real, other.imag  # of one dtype, as tg.matmul requires
        return complex_from(ew.sub(matmul(a, c), matmul(b, d)), ew.add(matmul(a, d), matmul(b, c)))

    def __rmatmul__(self, other: Any) -> ComplexTensor:
        return as_complex(other, self) @ self

    def conj(self) -> ComplexTensor:
        return complex_from(self.real, ew.neg(self.imag))

    def abs(self) -> Tensor:
        return ew.sqrt(ew.add(ew.mul(self.real, self.real), ew.mul(self.imag, self.imag)))

    __abs__ = abs

    def angle(self) -> Tensor:
        return ew.atan2(self.imag, self.real)

    def matmul(self, other: Any) -> ComplexTensor:
        return self @ other

    # -- reductions and movement ---------------------------------------------
    def _dims(self, dim: int | Sequence[int] | None) -> list[int]:
        dims = range(self.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
        return [d % self.ndim for d in dims]

    def sum(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> ComplexTensor:
        return ComplexTensor(rd.sum(self.pair, self._dims(dim), keepdim))

    def mean(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> ComplexTensor:
        return ComplexTensor(rd.mean(self.pair, self._dims(dim), keepdim))

    def reshape(self, *shape: Any) -> ComplexTensor:
        sizes = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        return ComplexTensor(self.pair.reshape(*sizes, 2))

    def __getitem__(self, index: Any) -> ComplexTensor:
        index = index if isinstance(index, tuple) else (index,)
        if any(i is Ellipsis for i in index):
            return ComplexTensor(self.pair[(*index, slice(None))])
        return ComplexTensor(self.pair[(*index, Ellipsis, slice(None))])


def pair_product(pair: Tensor, re: Tensor, im: Tensor) -> Tensor:
    """Pairs (..., 2) times the complex numbers re + i im (broadcast against the pairs' other dims)."""
    a, b = pair[..., 0], pair[..., 1]
    return mv.stack([ew.sub(ew.mul(a, re), ew.mul(b, im)), ew.add(ew.mul(a, im), ew.mul(b, re))], -1)


def complex_from(real: Tensor, imag: Tensor) -> ComplexTensor:
    """torch.complex: the complex tensor real + i imag (float32 or float64, broadcast)."""
    real, imag = mv.broadcast_tensors(real, imag)
    return ComplexTensor(mv.stack([real, imag], -1))


def as_complex(value: Any, like: ComplexTensor) -> ComplexTensor:
    """`value` (a complex or real tensor, a Python number) as a complex tensor of `like`'s real dtype."""
    if isinstance(value, ComplexTensor):
        return value
    if isinstance(value, Tensor):  # a float64 one widens the result to complex128, as in torch
        real = value if value.dtype == dtypes.float64 and value.ndim else value.to(like.pair.dtype)
        return complex_from(real, creation.zeros_like(real))
    if isinstance(value, numbers.Number):
        number = complex(value)
        return ComplexTensor(creation.tensor([number.real, number.imag], dtype=like.pair.dtype))
    return fail("complex", f"cannot combine a complex tensor with {type(value).__name__}", kind=DTypeError)


def complex_leaf(data: Any, dtype: dtypes.DType | None = None, requires_grad: bool = False) -> ComplexTensor:
    """tg.tensor of complex data (or with a complex dtype): a leaf holding a copy. As in torch, Python numbers
    give complex64, numpy arrays keep their precision (complex128 for complex128)."""
    array = np.asarray(data)
    if dtype is None:
        dtype = dtypes.complex128 if isinstance(data, np.ndarray) and data.dtype == np.complex128 else dtypes.complex64
    if dtype not in REAL_OF:
        fail("tensor", f"expected complex64 or complex128 for complex data, got {dtype!r}", kind=DTypeError)
    real = REAL_OF[dtype]
    pairs = np.stack([array.real, array.imag], -1).astype(real.storage)
    return ComplexTensor(creation.tensor(pairs, dtype=real, requires_grad=requires_grad))


def view_as_real(x: ComplexTensor) -> Tensor:
    return x.pair


def view_as_complex(x: Tensor) -> ComplexTensor:
    return ComplexTensor(x)


def polar(abs: Tensor, angle: Tensor) -> ComplexTensor:
    """torch.polar: abs * (cos(angle) + i sin(angle))."""
    return complex_from(ew.mul(abs, ew.cos(angle)), ew.mul(abs, ew.sin(angle)))


def real(x: ComplexTensor | Tensor) -> Tensor:
    return x.real if isinstance(x, ComplexTensor) else x


def imag(x: ComplexTensor) -> Tensor:
    return x.imag


def conj(x: ComplexTensor | Tensor) -> ComplexTensor | Tensor:
    return x.conj() if isinstance(x, ComplexTensor) else x


def angle(x: ComplexTensor | Tensor) -> Tensor:
    return x.angle() if isinstance(x, ComplexTensor) else ew.atan2(creation.zeros_like(x), x)


def is_complex(x: Any) -> bool:
    return isinstance(x, ComplexTensor)
