"""Tensor creation with PyTorch's names: tensor, zeros, ones, arange, rand, ..."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, ArgumentTypeError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import random as rng
from tensorgraphs.frontend.checks import int_arg, nonnegative_size
from tensorgraphs.frontend.placement import accepts_device as _accepts_device
from tensorgraphs.frontend.tensor import Tensor, as_tensor, cast, fresh_buffer, is_scalar
from tensorgraphs.graph import node as g


def _dtype(dtype: Any, default: dtypes.DType = dtypes.default_float) -> dtypes.DType:
    return default if dtype is None else dtypes.to_dtype(dtype)


def _leaf(t: Tensor, requires_grad: bool) -> Tensor:
    return t.requires_grad_() if requires_grad else t


@_accepts_device
def tensor(data: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new leaf holding a copy of `data` (inside a traced function, a copy made at every call); complex data
    or dtype gives a `frontend.complex.ComplexTensor`."""
    if _is_complex(data, dtype):
        from tensorgraphs.frontend.complex import complex_leaf  # it builds on this module

        return complex_leaf(data, dtype, requires_grad)
    if isinstance(data, Tensor):
        data = data.detach()
        t = data if dtype is None else cast(data, dtypes.to_dtype(dtype))
        return _leaf(Tensor(fresh_buffer(t.node)), requires_grad)
    t = as_tensor(data, None if dtype is None else dtypes.to_dtype(dtype))
    if t.node.op is not g.Op.BUFFER:
        t = Tensor(fresh_buffer(t.node))
    return _leaf(t, requires_grad)


def _is_complex(data: Any, dtype: Any) -> bool:
    if dtype is not None and not isinstance(dtype, (str, type)) and getattr(dtype, "is_complex", False):
        return True
    if isinstance(data, (complex, np.complexfloating)):
        return True
    if isinstance(data, np.ndarray):
        return data.dtype.kind == "c"
    try:
        return isinstance(data, (list, tuple)) and np.asarray(data).dtype.kind == "c"
    except ValueError:  # ragged: host_array names the problem
        return False


def from_numpy(array: np.ndarray) -> Tensor:
    return Tensor.from_numpy(array)


def _number(op: str, name: str, value: Any) -> Any:
    """A Python or numpy number, or the value of a one-element tensor (torch takes both where a Number stands)."""
    if isinstance(value, Tensor):
        value = value.item()
    if not is_scalar(value):
        fail(op, f"{name} must be a number, got {type(value).__name__} {value!r}", kind=ArgumentTypeError)
    return value


@_accepts_device
def full(size: Any, fill_value: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    fill_value = _number("full", "fill_value", fill_value)
    if dtype is None:
        dtype = dtypes.scalar_dtype(fill_value)
    shape = nonnegative_size("full", (size,))
    return _leaf(Tensor(g.const(fill_value, dtypes.to_dtype(dtype), shape)), requires_grad)


@_accepts_device
def zeros(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full(nonnegative_size("zeros", size), 0, dtype=_dtype(dtype), requires_grad=requires_grad)


@_accepts_device
def ones(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full(nonnegative_size("ones", size), 1, dtype=_dtype(dtype), requires_grad=requires_grad)


@_accepts_device
def empty(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return zeros(*size, dtype=dtype, requires_grad=requires_grad)


def _like(x: Tensor, dtype: Any) -> tuple[tuple[int, ...], dtypes.DType]:
    return x.shape, x.dtype if dtype is None else dtypes.to_dtype(dtype)


@_accepts_device
def zeros_like(x: Tensor, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    shape, dt = _like(x, dtype)
    return full(shape, 0, dtype=dt, requires_grad=requires_grad)


@_accepts_device
def ones_like(x: Tensor, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    shape, dt = _like(x, dtype)
    return full(shape, 1, dtype=dt, requires_grad=requires_grad)


@_accepts_device
def empty_like(x: Tensor, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return zeros_like(x, dtype=dtype, requires_grad=requires_grad)


@_accepts_device
def full_like(x: Tensor, fill_value: Any, *, dtype: Any = None, device: Any = None,
              requires_grad: bool = False) -> Tensor:
    shape, dt = _like(x, dtype)
    return full(shape, fill_value, dtype=dt, requires_grad=requires_grad)


@_accepts_device
def arange(start: Any, end: Any = None, step: Any = 1, *, dtype: Any = None, device: Any = None,
           requires_grad: bool = False) -> Tensor:
    if end is None:
        start, end = 0, start
    start, end, step = (_number("arange", name, v) for name, v in (("start", start), ("end", end), ("step", step)))
    if step == 0:
        fail("arange", "step must be nonzero", kind=ArgumentError)
    length = max(0, math.ceil((end - start) / step))
    all_int = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (start, end, step))
    out_dtype = _dtype(dtype, dtypes.int64 if all_int else dtypes.default_float)
    index = Tensor(g.iota(length, dtypes.int64 if all_int else dtypes.float64))
    values = ew.add(ew.mul(index, step), start) if (start, step) != (0, 1) else index
    return _leaf(cast(values, out_dtype), requires_grad)


@_accepts_device
def linspace(start: float, end: float, steps: int, *, dtype: Any = None, device: Any = None,
             requires_grad: bool = False) -> Tensor:
    """PyTorch's symmetric formula: the first half counts up from start, the second down from end."""
    steps = int_arg("linspace", "steps", steps)
    if steps < 0:
        fail("linspace", f"number of steps must be non-negative, got {steps}", kind=ArgumentError)
    out_dtype = _dtype(dtype)
    if steps == 1:
        return full((1,), start, dtype=out_dtype, requires_grad=requires_grad)
    step = (end - start) / max(steps - 1, 1)
    index = Tensor(g.iota(steps, dtypes.float64))
    up = ew.add(ew.mul(index, step), float(start))
    down = ew.sub(float(end), ew.mul(ew.sub(float(steps - 1), index), step))
    values = ew.where(ew.lt(index, steps // 2), up, down)
    return _leaf(cast(values, out_dtype), requires_grad)


@_accepts_device
def eye(n: int, m: int | None = None, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    n = int_arg("eye", "n", n)
    m = n if m is None else int_arg("eye", "m", m)
    if n < 0 or m < 0:
        fail("eye", f"n and m must be non-negative, got {n} and {m}", kind=ArgumentError)
    rows = Tensor(g.iota(n, dtypes.int64)).reshape(n, 1)
    cols = Tensor(g.iota(m, dtypes.int64)).reshape(1, m)
    return _leaf(cast(ew.eq(rows, cols), _dtype(dtype)), requires_grad)


def manual_seed(seed: int) -> rng.Generator:
    """Seed the default random stream; returns its Generator (as torch.manual_seed)."""
    return rng.manual_seed(seed)


@_accepts_device
def rand(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False,
         generator: Any = None) -> Tensor:
    return _leaf(rng.rand(nonnegative_size("rand", size), _dtype(dtype), generator), requires_grad)


@_accepts_device
def randn(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False,
          generator: Any = None) -> Tensor:
    return _leaf(rng.randn(nonnegative_size("randn", size), _dtype(dtype), generator), requires_grad)


@_accepts_device
def randint(low: int, high: Any = None, size: Any = None, *, dtype: Any = None, device: Any = None,
            generator: rng.Generator | None = None) -> Tensor:
    if size is None:
        low, high, size = 0, low, high
    if size is None:
        fail("randint", "size is required", kind=ArgumentError)
    low, high = int_arg("randint", "low", low), int_arg("randint", "high", high)
    return rng.randint(low, high, nonnegative_size("randint", (size,)), _dtype(dtype, dtypes.int64), generator)


def rand_like(x: Tensor, *, dtype: Any = None) -> Tensor:
    return rand(x.shape, dtype=x.dtype if dtype is None else dtype)


def randn_like(x: Tensor, *, dtype: Any = None) -> Tensor:
    return randn(x.shape, dtype=x.dtype if dtype is None else dtype)


def randint_like(x: Tensor, low: int, high: Any = None, *, dtype: Any = None) -> Tensor:
    if high is None:
        low, high = 0, low
    return randint(low, high, x.shape, dtype=x.dtype if dtype is None else dtype)


def randperm(n: int, *, dtype: Any = None, generator: rng.Generator | None = None) -> Tensor:
    """Argsort of random keys, computed on the host: datasets of 10**5 rows are shuffled with it, and the
    graph's argsort compares every pair of keys."""
    keys = rand(int_arg("randperm", "n", n), dtype=dtypes.float64, generator=generator)
    return Tensor.from_numpy(np.argsort(keys.numpy(), kind="stable"), _dtype(dtype, dtypes.int64))


def is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def numel(x: Tensor) -> int:
    return x.numel()


def scalar_tensor(value: Any, *, dtype: Any = None) -> Tensor:
    if not is_scalar(value):
        fail("scalar_tensor", f"expected a number, got {type(value).__name__}", kind=ArgumentError)
    return full((), value, dtype=_dtype(dtype))
