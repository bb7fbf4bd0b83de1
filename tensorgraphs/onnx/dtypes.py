"""ONNX element types and the tensorgraphs dtypes they are computed in."""

from __future__ import annotations

import numpy as np
import onnx

from tensorgraphs import dtypes
from tensorgraphs.dtypes import DType
from tensorgraphs.errors import UnsupportedError, fail

TensorType = onnx.TensorProto.DataType

_TG_DTYPES: dict[int, DType] = {
    TensorType.BOOL: dtypes.bool_,
    TensorType.UINT8: dtypes.uint8,
    TensorType.INT8: dtypes.int8,
    TensorType.INT16: dtypes.int16,
    TensorType.INT32: dtypes.int32,
    TensorType.INT64: dtypes.int64,
    TensorType.FLOAT16: dtypes.float16,
    TensorType.BFLOAT16: dtypes.bfloat16,
    TensorType.FLOAT: dtypes.float32,
    TensorType.DOUBLE: dtypes.float64,
}
_ELEMENT_TYPES = {dtype: element for element, dtype in _TG_DTYPES.items()}
_TG_DTYPES.update({TensorType.UINT16: dtypes.int32, TensorType.UINT32: dtypes.int64, TensorType.UINT64: dtypes.int64})
"""Unsigned types tensorgraphs lacks are computed in a wider signed one (uint64 in int64: its values must stay
below 2**63); the backend gives results in the declared type (the low bits: sums and products wrap as they
would in the unsigned type)."""


def type_name(element_type: int) -> str:
    return TensorType.Name(element_type) if element_type in TensorType.values() else str(element_type)


def tg_dtype(element_type: int, where: str) -> DType:
    """The dtype of an ONNX element type; one tensorgraphs does not compute in fails, naming `where` it is used."""
    dtype = _TG_DTYPES.get(element_type)
    if dtype is None:
        fail("onnx", f"{where}: element type {type_name(element_type)} is not supported (tensorgraphs computes in "
             f"{', '.join(sorted(type_name(t) for t in _TG_DTYPES))})", kind=UnsupportedError)
    return dtype


def element_type(dtype: DType) -> int:
    return _ELEMENT_TYPES[dtype]


def numpy_dtype(element_type: int) -> np.dtype:
    return onnx.helper.tensor_dtype_to_np_dtype(element_type)
