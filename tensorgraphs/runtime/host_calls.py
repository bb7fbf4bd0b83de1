"""Functions of this process that compiled programs call back (`graph.host_call` nodes).

A program calling the host gets `tg_host` pointed at one dispatcher (`bind`), which finds the function by name
and hands it the source arrays and the output array as numpy views of the program's memory (no copy). An exception in
the function is kept and the program stops with TG_HOST_FAILED; `raise_failure` raises it where the program was
called, so a collective whose peer died fails that call with its own error.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

import numpy as np

HostFunction = Callable[[list[np.ndarray], np.ndarray], None]
"""Writes the output vector (of the sources' dtype and total size) from the source arrays (flat)."""

HOST_FUNCTIONS: dict[str, HostFunction] = {}
_failure = threading.local()


def register_host_function(name: str, function: HostFunction) -> None:
    HOST_FUNCTIONS[name] = function


def _view(address: int | None, dtype: np.dtype, size: int) -> np.ndarray:
    if size == 0 or address is None:
        return np.empty(0, dtype)
    return np.frombuffer((ctypes.c_char * (size * dtype.itemsize)).from_address(address), dtype)


def _dispatch(function: bytes, dtype: bytes, count: int, sources: Any, sizes: Any, output: int | None) -> int:
    try:
        kind = np.dtype(dtype.decode())
        arrays = [_view(sources[i], kind, sizes[i]) for i in range(count)]
        HOST_FUNCTIONS[function.decode()](arrays, _view(output, kind, sum(sizes[i] for i in range(count))))
        return 0
    except BaseException as error:  # noqa: B036 - kept and raised where the program was called
        _failure.error = error
        return 1


_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64,
                              ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p)
_ENTRY = _SIGNATURE(_dispatch)


def bind(library: ctypes.CDLL) -> None:
    """Point the program's `tg_host` at the dispatcher."""
    ctypes.c_void_p.in_dll(library, "tg_host").value = ctypes.cast(_ENTRY, ctypes.c_void_p).value


def raise_failure() -> None:
    """Raise the error of the host function that stopped the last program on this thread."""
    error = getattr(_failure, "error", None)
    _failure.error = None
    if error is None:
        raise RuntimeError("a host call failed without an error")
    raise error
