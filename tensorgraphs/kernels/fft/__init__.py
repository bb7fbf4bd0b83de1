"""The FFT kernels (fft.c), built once per machine and cached like the GEMM library.

Generated C calls them by name (`C_FUNCTIONS`, declared in `HEADER`, linked from `library_path()`); Python calls
them on numpy arrays through `transform` below, which the tests use. The contract of every argument is in fft.h.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from tensorgraphs.kernels.gemm.build import build_library, load_library

SOURCE_DIR = Path(__file__).resolve().parent
LIBRARY = "tg_fft"
SOURCES = ("fft.c",)
HEADER = SOURCE_DIR / "fft.h"
C_FUNCTIONS = {"c2c": "tg_fft_c2c_f32", "r2c": "tg_fft_r2c_f32", "c2r": "tg_fft_c2r_f32"}
"""Transform kind -> its C function; c2c takes `inverse` after the length."""


def library_path() -> Path:
    """The compiled library (built on first call) for generated programs to link against."""
    return build_library(LIBRARY, SOURCES, source_dir=SOURCE_DIR)


@functools.cache
def _function(kind: str) -> ctypes._CFuncPtr:
    function = getattr(load_library(LIBRARY, SOURCES, source_dir=SOURCE_DIR), C_FUNCTIONS[kind])
    sizes = [ctypes.c_int64, ctypes.c_int64] + ([ctypes.c_int32] if kind == "c2c" else [])
    function.argtypes, function.restype = [*sizes, ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    return function


def output_width(kind: str, n: int) -> int:
    """Floats per row of the result of transform `kind` of length `n`."""
    return {"c2c": 2 * n, "r2c": 2 * (n // 2 + 1), "c2r": n}[kind]


def transform(kind: str, x: np.ndarray, n: int, inverse: bool = False) -> np.ndarray:
    """The unnormalized transform `kind` of length `n` of each row of `x` (float32; complex values as trailing
    (re, im) pairs: c2c rows are (n, 2), c2r rows (n // 2 + 1, 2), r2c rows n reals)."""
    x = np.ascontiguousarray(x, np.float32)
    per_row = {"c2c": 2 * n, "r2c": n, "c2r": 2 * (n // 2 + 1)}[kind]
    batch = x.size // per_row if per_row else 0
    y = np.empty(batch * output_width(kind, n), np.float32)
    flags = [int(inverse)] if kind == "c2c" else []
    if _function(kind)(batch, n, *flags, x.ctypes.data, y.ctypes.data):
        raise MemoryError(f"fft {kind} of length {n}: out of memory")
    return y
