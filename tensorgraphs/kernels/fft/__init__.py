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
C_FUNCTIONS = {"c2c": "tg_fft_c2c_f32", "r2c": "tg_fft_r2c_f32", "c2r": "tg_fft_c2r_f32", "stft": "tg_fft_stft_f32"}
"""Transform kind -> its C function (fft.h); c2c takes `inverse` after the length."""
_SIZES = {"c2c": 3, "r2c": 2, "c2r": 2, "stft": 6}


def library_path() -> Path:
    """The compiled library (built on first call) for generated programs to link against."""
    return build_library(LIBRARY, SOURCES, source_dir=SOURCE_DIR)


@functools.cache
def _function(kind: str) -> ctypes._CFuncPtr:
    function = getattr(load_library(LIBRARY, SOURCES, source_dir=SOURCE_DIR), C_FUNCTIONS[kind])
    sizes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int32] if kind == "c2c" else [ctypes.c_int64] * _SIZES[kind]
    arrays = [ctypes.c_void_p] * (3 if kind == "stft" else 2)
    function.argtypes, function.restype = [*sizes, *arrays], ctypes.c_int
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


def stft(x: np.ndarray, window: np.ndarray | None, hop: int, pad: int = 0, n: int = 0) -> np.ndarray:
    """The rfft of every frame (hop apart) of each signal x (batch, length), reflected `pad` samples beyond each
    end, times `window` (n,) or, when it is None, of `n` samples unweighted; unnormalized, as (batch, n // 2 + 1,
    frames, 2) pairs: torch.stft's layout."""
    x = np.ascontiguousarray(x, np.float32)
    if window is not None:
        window = np.ascontiguousarray(window, np.float32)
        n = window.size
    batch, length = x.shape
    frames = 1 + (length + 2 * pad - n) // hop
    y = np.empty((batch, n // 2 + 1, frames, 2), np.float32)
    weights = None if window is None else window.ctypes.data
    if _function("stft")(batch, length, frames, n, hop, pad, x.ctypes.data, weights, y.ctypes.data):
        raise ValueError(f"fft stft of length {n}: even lengths above 2 only (or out of memory)")
    return y
