"""Buffers: data that lives outside the graph (inputs, parameters, realized results)."""

from __future__ import annotations

import weakref
from typing import Any, Callable

import numpy as np

from tensorgraphs.dtypes import DType

HOST = "host"
"""The device of buffers in the Python process's memory."""


class Buffer:
    """Storage for one tensor on one device. Identity matters: a BUFFER node refers to it."""

    __slots__ = ("device", "dtype", "shape", "data", "grad_leaf", "live", "__weakref__")

    def __init__(self, device: str, dtype: DType, shape: tuple[int, ...], data: np.ndarray) -> None:
        self.device = device
        self.dtype = dtype
        self.shape = shape
        self.data = data
        self.grad_leaf: weakref.ref[Any] | None = None  # the leaf Tensor that owns it, if it requires grad
        # where a compiled program reads this buffer's value at every call (a hyperparameter such as lr),
        # instead of the data it held when traced
        self.live: Callable[[], Any] | None = None

    def __repr__(self) -> str:
        return f"Buffer({self.device}, {self.dtype.name}, {self.shape})"
