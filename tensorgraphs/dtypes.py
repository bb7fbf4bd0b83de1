"""Data types and PyTorch's type-promotion rules.

A `DType` names a tensor element type and the numpy type the reference backend
stores it in. bfloat16 has no numpy type: it is stored as float32 whose values
are rounded to bfloat16 after every operation (see `round_to_storage`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from tensorgraphs.errors import ArgumentError, ArgumentTypeError, DTypeError, UnsupportedError, fail


@dataclass(frozen=True, eq=False)
class DType:
    name: str
    itemsize: int
    kind: str  # "b" bool, "u" unsigned int, "i" signed int, "f" float, "c" complex (frontend.complex: never a node's)
    storage: type  # numpy scalar type used by the reference backend
    # what every op asks of its operands' dtypes, as plain attributes (read for every node built)
    is_floating_point: bool = field(init=False)
    is_integer: bool = field(init=False)
    is_bool: bool = field(init=False)
    is_complex: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_floating_point", self.kind == "f")
        object.__setattr__(self, "is_integer", self.kind in "iu")
        object.__setattr__(self, "is_bool", self.kind == "b")
        object.__setattr__(self, "is_complex", self.kind == "c")

    def __repr__(self) -> str:
        return f"tg.{self.name}"

    @property
    def bits(self) -> int:
        return self.itemsize * 8


bool_ = DType("bool", 1, "b", np.bool_)
uint8 = DType("uint8", 1, "u", np.uint8)
uint32 = DType("uint32", 4, "u", np.uint32)  # internal: random bits
int8 = DType("int8", 1, "i", np.int8)
int16 = DType("int16", 2, "i", np.int16)
int32 = DType("int32", 4, "i", np.int32)
int64 = DType("int64", 8, "i", np.int64)
float16 = DType("float16", 2, "f", np.float16)
bfloat16 = DType("bfloat16", 2, "f", np.float32)
float32 = DType("float32", 4, "f", np.float32)
float64 = DType("float64", 8, "f", np.float64)
complex64 = DType("complex64", 8, "c", np.complex64)  # a tensor of float32 (re, im) pairs (frontend.complex)
complex128 = DType("complex128", 16, "c", np.complex128)

ALL_DTYPES = (bool_, uint8, uint32, int8, int16, int32, int64, float16, bfloat16, float32, float64)
FLOAT_DTYPES = (float16, bfloat16, float32, float64)
INT_DTYPES = (uint8, int8, int16, int32, int64)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NAME.update(half=float16, float=float32, double=float64, long=int64, int=int32, short=int16)

default_float: DType = float32
default_int: DType = int64


def to_dtype(value: object) -> DType:
    """Accept a tg dtype, a torch dtype, a numpy dtype or a name."""
    if isinstance(value, DType):
        return value
    if value is bool:
        return bool_
    if value is int:
        return default_int
    if value is float:
        return default_float
    name = str(value).replace("torch.", "").replace("tg.", "")
    if name in _BY_NAME:
        return _BY_NAME[name]
    try:
        np_name = np.dtype(value).name  # type: ignore[call-overload]
    except TypeError:
        np_name = name
    if np_name in _BY_NAME:
        return _BY_NAME[np_name]
    fail("dtype", f"unknown dtype {value!r}; expected one of {', '.join(d.name for d in ALL_DTYPES)}", kind=DTypeError)


def from_numpy_dtype(dt: np.dtype) -> DType:
    return _from_numpy_dtype(np.dtype(dt))


@functools.cache
def _from_numpy_dtype(dt: np.dtype) -> DType:
    """Cached: a numpy dtype's `name` is computed in Python (tens of microseconds), and every array made a tensor
    asks it."""
    return to_dtype(dt.name)


_PYTHON_DATA_DTYPES = {"f": default_float, "i": default_int, "u": default_int, "b": bool_}


def host_array(op: str, data: object) -> np.ndarray:
    """Numbers, nested lists of them or a numpy array as an array of bools, ints or floats (a clear error for
    strings, complex numbers, ragged lists and other objects)."""
    try:
        array = np.asarray(data)
    except ValueError as error:  # ragged nested lists
        fail(op, f"could not convert {type(data).__name__} to a tensor: {error}", kind=ArgumentError)
    if array.dtype.kind == "c":
        fail(op, "complex numbers are not supported", kind=UnsupportedError)
    if array.dtype.kind not in _PYTHON_DATA_DTYPES:
        held = {"U": "strings", "S": "bytes"}.get(array.dtype.kind, "objects")
        fail(op, f"could not convert {type(data).__name__} to a tensor: expected bool, int or float values, got {held}",
             kind=ArgumentTypeError)
    return array


def python_data_dtype(dt: np.dtype) -> DType:
    """The dtype PyTorch gives nested Python lists that numpy read as `dt` (ints are int64, floats the default)."""
    return _PYTHON_DATA_DTYPES[dt.kind]


_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}


def category(dtype: DType) -> int:
    """0 bool, 1 integer, 2 floating: the order PyTorch promotes along."""
    return _CATEGORY[dtype.kind]


def promote_types(a: DType, b: DType) -> DType:
    """torch.promote_types for the dtypes we support."""
    if a is b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_floating_point and b.is_floating_point:
        if {a, b} == {float16, bfloat16}:
            return float32
        return a if a.itemsize > b.itemsize else b
    if a.is_floating_point:
        return a
    if b.is_floating_point:
        return b
    if a.kind == b.kind:
        return a if a.itemsize > b.itemsize else b
    unsigned, signed = (a, b) if a.kind == "u" else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    return {1: int16, 2: int32, 4: int64}.get(unsigned.itemsize, int64)


def scalar_dtype(value: object) -> DType:
    """The dtype PyTorch gives a Python scalar when it stands alone."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return default_int
    if isinstance(value, (float, np.floating)):
        return default_float
    raise TypeError(f"expected a Python number, got {type(value).__name__}")


def result_type(dim_dtypes: list[DType], zero_dim_dtypes: list[DType], scalars: list[object]) -> DType:
    """PyTorch's three-tier promotion: dimensioned tensors, then 0-dim tensors, then scalars.

    A lower tier changes the result only when its category (bool < int < float) is
    higher than every tier above it; a Python float then gives the default float.
    """
    result: DType | None = None
    for tier in (dim_dtypes, zero_dim_dtypes):
        if not tier:
            continue
        tier_type = tier[0]
        for d in tier[1:]:
            tier_type = promote_types(tier_type, d)
        if result is None or category(tier_type) > category(result):
            result = tier_type
    for value in scalars:
        stype = scalar_dtype(value)
        if result is None:
            result = stype
        elif category(stype) > category(result):
            result = stype if stype is not default_int or not result.is_bool else default_int
    assert result is not None, "result_type needs at least one operand"
    return result


def round_to_storage(array: np.ndarray, dtype: DType) -> np.ndarray:
    """Round a float32 array to the nearest bfloat16 (ties to even), keep NaN."""
    if dtype is not bfloat16:
        return array
    bits = np.asarray(array, dtype=np.float32, order="C").view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    rounded = ((bits + rounding) & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(array), array, rounded).astype(np.float32)
