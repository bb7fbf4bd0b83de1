"""Buffers: data that lives outside the graph (inputs, parameters, realized results)."""

from __future__ import annotations

import ctypes
import weakref
from typing import Any, Callable

import numpy as np
from numpy.lib.array_utils import byte_bounds

from tensorgraphs.dtypes import DType

HOST = "host"
"""The device of buffers in the Python process's memory."""


class _Gone:
    pass


DEAD_REFERENCE = weakref.ref(_Gone())
"""A weak reference whose object is gone: a slot in a table of weak references that matches no array (calling
it gives None, as a reference to a freed array does), so one loop in C can compare the whole table."""


def data_address(array: np.ndarray) -> int:
    """The address of a C-contiguous array's data, through the buffer protocol (a fraction of `.ctypes`'s cost,
    which matters for hundreds of arrays per call); read-only and empty arrays, which it refuses, take `.ctypes`."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError):
        return array.ctypes.data


def byte_span(array: np.ndarray) -> tuple[int, int]:
    """[first, last + 1) bytes `array` can touch."""
    if array.flags.c_contiguous:
        start = data_address(array)
        return start, start + array.nbytes
    return byte_bounds(array)


class Buffer:
    """Storage for one tensor on one device. Identity matters: a BUFFER node refers to it."""

    __slots__ = ("device", "dtype", "shape", "data", "grad_leaf", "live", "placeholder", "__weakref__")

    def __init__(self, device: str, dtype: DType, shape: tuple[int, ...], data: np.ndarray) -> None:
        self.device = device
        self.dtype = dtype
        self.shape = shape
        self.data = data
        self.grad_leaf: weakref.ref[Any] | None = None  # the leaf Tensor that owns it, if it requires grad
        # where a compiled program reads this buffer's value at every call (a hyperparameter such as lr),
        # instead of the data it held when traced
        self.live: Callable[[], Any] | None = None
        self.placeholder = False  # stands for a value only while a function is traced (`tracing.is_placeholder`)

    def __repr__(self) -> str:
        return f"Buffer({self.device}, {self.dtype.name}, {self.shape})"
