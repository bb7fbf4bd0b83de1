"""Sample inputs for the op-conformance table: the same data fed to tensorgraphs and to PyTorch.

A `Sample` holds plain data (numpy arrays, Python values); `build` turns it into
tensors of either library, applying the same view (permuted, strided, expanded)
on both sides, so non-contiguous inputs are tested without either library
knowing about the other. Nothing here imports torch at module level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
INT_DTYPES = ("int64", "int32", "int8", "uint8")
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
SPECIAL_FLOATS = (math.nan, math.inf, -math.inf, 0.0, -0.0)
_STORAGE = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bfloat16": np.float32,
    "int64": np.int64,
    "int32": np.int32,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
}
_INT_RANGE = {"int64": (-20, 20), "int32": (-20, 20), "int8": (-10, 10), "uint8": (0, 20)}


def _reversed_dims(t: Any) -> Any:
    return t.permute(*reversed(range(t.ndim))) if t.ndim > 1 else t


def _every_other(t: Any) -> Any:
    return t[..., ::2] if t.ndim else t


# view name -> (shape of the base tensor for a wanted view shape, the view applied to a tensor of either library)
VIEWS: dict[str, tuple[Callable[[tuple[int, ...]], tuple[int, ...]], Callable[[Any], Any]]] = {
    "contiguous": (lambda shape: shape, lambda t: t),
    "permuted": (lambda shape: tuple(reversed(shape)), _reversed_dims),
    "strided": (lambda shape: shape[:-1] + (2 * shape[-1],) if shape else shape, _every_other),
    "expanded": (lambda shape: (1,) + shape[1:] if shape else shape, None),  # view needs the target shape
}


@dataclass(frozen=True, eq=False)
class TensorArg:
    """A tensor input: `base` values in `dtype`, seen through `view` (which yields `shape`)."""

    base: np.ndarray
    dtype: str
    shape: tuple[int, ...]
    view: str = "contiguous"

    def describe(self) -> str:
        return f"{self.dtype}{list(self.shape)}" + ("" if self.view == "contiguous" else f"<{self.view}>")


@dataclass(frozen=True)
class DTypeArg:
    """A dtype argument, mapped to the library's own dtype object."""

    name: str


@dataclass(frozen=True, eq=False)
class Sample:
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [_describe(a) for a in self.args] + [f"{k}={_describe(v)}" for k, v in self.kwargs.items()]
        return f"({', '.join(parts)})"


def _describe(value: Any) -> str:
    if isinstance(value, TensorArg):
        return value.describe()
    if isinstance(value, DTypeArg):
        return value.name
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if value is Ellipsis:
        return "..."
    return repr(value)


# ---------------------------------------------------------------------------
# building library tensors from samples
# ---------------------------------------------------------------------------


@dataclass
class Library:
    """How to make a tensor in one library: tensorgraphs or torch."""

    module: Any
    from_numpy: Callable[[np.ndarray, str, bool], Any]

    def dtype(self, name: str) -> Any:
        return getattr(self.module, name)


def build(value: Any, lib: Library, requires_grad: bool, leaves: list[Any]) -> Any:
    """The library's version of a sample value; float leaves that require grad are appended to `leaves`."""
    if isinstance(value, TensorArg):
        grad = requires_grad and value.dtype in FLOAT_DTYPES
        leaf = lib.from_numpy(value.base, value.dtype, grad)
        if grad:
            leaves.append(leaf)
        if value.view == "expanded" and value.shape:
            return leaf.expand(*value.shape)
        return VIEWS[value.view][1](leaf)
    if isinstance(value, DTypeArg):
        return lib.dtype(value.name)
    if isinstance(value, list):
        return [build(v, lib, requires_grad, leaves) for v in value]
    if isinstance(value, tuple):
        return tuple(build(v, lib, requires_grad, leaves) for v in value)
    return value


# ---------------------------------------------------------------------------
# random data
# ---------------------------------------------------------------------------


def make_tensor(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    dtype: str,
    *,
    view: str = "contiguous",
    low: float = -3.0,
    high: float = 3.0,
    special: bool = False,
    nonzero: bool = False,
) -> TensorArg:
    """Random values of `dtype` in [low, high] (clipped to a small range for integers, so products do not
    overflow); `special` mixes in NaN/Inf/±0 for floats, `nonzero` replaces zeros by ones."""
    base_shape = VIEWS[view][0](tuple(shape))
    if dtype in FLOAT_DTYPES:
        data = np.asarray(rng.uniform(low, high, base_shape))
        if special and data.size:
            mask = rng.random(base_shape) < 0.2
            data[mask] = rng.choice(SPECIAL_FLOATS, size=int(mask.sum()))
        if nonzero:
            data[data == 0] = 1.0
    elif dtype == "bool":
        data = np.asarray(rng.random(base_shape) < 0.5) | nonzero
    else:
        lo, hi = max(_INT_RANGE[dtype][0], math.ceil(low)), min(_INT_RANGE[dtype][1], math.floor(high))
        data = np.asarray(rng.integers(lo, hi + 1, base_shape))
        if nonzero:
            data[data == 0] = 1
    return TensorArg(np.ascontiguousarray(data.astype(_STORAGE[dtype])), dtype, tuple(shape), view)


def tied_tensor(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, view: str = "contiguous") -> TensorArg:
    """Values from a pool of a few (NaN, infinities and both zeros among the floats): many ties, for sorting."""
    base_shape = VIEWS[view][0](tuple(shape))
    if dtype in FLOAT_DTYPES:
        data = rng.choice(np.array(SPECIAL_FLOATS + (1.5, -2.0)), base_shape)
    else:
        data = rng.integers(0, 2 if dtype == "bool" else 3, base_shape)
    return TensorArg(np.ascontiguousarray(np.asarray(data).astype(_STORAGE[dtype])), dtype, tuple(shape), view)


def wide_floats(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> TensorArg:
    """Floats of either sign with magnitudes from 1e-20 to 1e20 (overflow, underflow, huge arguments)."""
    data = rng.choice([-1.0, 1.0], shape) * 10.0 ** rng.uniform(-20, 20, shape)
    with np.errstate(over="ignore"):  # float16 holds up to 65504: larger magnitudes become infinities
        return TensorArg(np.asarray(data).astype(_STORAGE[dtype]), dtype, tuple(shape))


def random_shape(rng: np.random.Generator, min_ndim: int = 1, max_ndim: int = 3, max_size: int = 4) -> tuple[int, ...]:
    return tuple(int(s) for s in rng.integers(1, max_size + 1, int(rng.integers(min_ndim, max_ndim + 1))))


def random_view(rng: np.random.Generator) -> str:
    return str(rng.choice(list(VIEWS)))


def random_dtype(rng: np.random.Generator) -> str:
    return str(rng.choice(ALL_DTYPES))


def python_scalar(rng: np.random.Generator, kind: str) -> bool | int | float:
    """A Python scalar of `kind` ("bool", "int" or "float"), never zero for int/float."""
    if kind == "bool":
        return bool(rng.random() < 0.5)
    if kind == "int":
        return int(rng.choice([-3, -2, -1, 1, 2, 3]))
    return float(rng.choice([-2.5, -0.5, 0.75, 1.5, 2.0]))


EDGE_SHAPES = ((), (0,), (1,), (3, 0), (1, 4), (2, 1, 3))


def shapes_for(rng: np.random.Generator, for_grad: bool) -> Iterator[tuple[tuple[int, ...], str]]:
    """(shape, view) pairs: the edge shapes, then random shapes under every view."""
    for shape in EDGE_SHAPES[:3] if for_grad else EDGE_SHAPES:
        yield shape, "contiguous"
    for view in VIEWS:
        yield random_shape(rng), view
