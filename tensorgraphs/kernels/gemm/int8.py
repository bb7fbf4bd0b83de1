"""The int8 GEMM (gemm_int8.c): u8 x s8 products summed in int32 (AVX-512 VNNI, or AVX2's VPMADDUBSW where VNNI is
missing), with weights packed once.

Generated programs call `C_FUNCTIONS` (declared in `HEADER`, linked from `library_path()`); Python calls them on
numpy arrays through `qgemm` and `qlinear`, which the tests and the benchmark use. The contract is in gemm_int8.h.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tensorgraphs.errors import ArgumentError, ShapeError, fail
from tensorgraphs.kernels import gemm
from tensorgraphs.kernels.gemm import ACTIVATIONS, STATUS
from tensorgraphs.kernels.gemm.build import SOURCE_DIR, build_library, load_library

LIBRARY = "tg_gemm_int8"
SOURCES = ("gemm_int8.c",)
HEADER = SOURCE_DIR / "gemm_int8.h"
C_FUNCTIONS = {"u8": "tg_qgemm_u8s8_s32", "s8": "tg_qgemm_s8s8_s32", "linear": "tg_qlinear_f32"}
PANEL = 64
"""Output channels per packed panel; k is packed in groups of 4."""

_i64, _i32, _ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
_QGEMM_ARGTYPES = [_i64, _i64, _i64, _ptr, _i64, _i32, _ptr, _ptr, _ptr, _i64]
_QLINEAR_ARGTYPES = [_i64, _i64, _i64, _ptr, _i64, ctypes.c_float, _i32, _i32, _ptr, _ptr, _ptr, _ptr, _ptr, _i64,
                     _i32]


def available() -> bool:
    """Whether this machine runs the kernel: the float GEMM's prerequisites (AVX-512, or AVX2 and FMA, and a C
    compiler); without AVX-512 VNNI its inner product takes more instructions (`vnni`)."""
    return gemm.available()


@functools.cache
def vnni() -> bool:
    """Whether this machine has AVX-512 VNNI (VPDPBUSD): without it, activations of at most 7 bits (quant_max 127)
    run about twice as fast as others (gemm_int8.c)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return any(line.startswith("flags") and " avx512_vnni" in line for line in cpuinfo)
    except OSError:
        return False


def library_path() -> Path:
    """The compiled library (built on first call) for generated programs to link against."""
    return build_library(LIBRARY, SOURCES)


@functools.cache
def _functions() -> dict[str, Callable[..., int]]:
    library = load_library(LIBRARY, SOURCES)
    functions = {}
    for name, c_name in C_FUNCTIONS.items():
        function = getattr(library, c_name)
        function.argtypes = _QLINEAR_ARGTYPES if name == "linear" else _QGEMM_ARGTYPES
        function.restype = ctypes.c_int
        functions[name] = function
    return functions


def packed_shape(n: int, k: int) -> tuple[int, int, int, int]:
    """(panels, groups of 4 k, PANEL, 4): the packed weights of an n x k matrix."""
    return -(-n // PANEL), -(-k // 4), PANEL, 4


def pack_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An int8 (n, k) weight matrix (a row per output channel) as the kernel reads it, and its row sums (int32)."""
    w = np.asarray(w)
    if w.dtype != np.int8 or w.ndim != 2:
        fail("pack_weights", f"weights must be a 2-D int8 array, got {w.dtype} {w.shape}", ArgumentError)
    n, k = w.shape
    panels, groups, _, _ = packed_shape(n, k)
    padded = np.zeros((panels * PANEL, groups * 4), np.int8)
    padded[:n, :k] = w
    packed = padded.reshape(panels, PANEL, groups, 4).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(packed), w.sum(axis=1, dtype=np.int32)


def unpack_weights(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    """The (n, k) matrix `pack_weights` packed."""
    panels, groups, _, _ = packed.shape
    return packed.transpose(0, 2, 1, 3).reshape(panels * PANEL, groups * 4)[:n, :k]


def _check(op: str, status: int) -> None:
    if status != 0:
        fail(op, f"the kernel rejected its arguments: {STATUS.get(status, status)}", ArgumentError)


def _weights(op: str, packed: np.ndarray, colsum: np.ndarray, k: int) -> int:
    """n, after checking the packed weights fit activations of k columns."""
    n = colsum.shape[0]
    if packed.dtype != np.int8 or packed.shape != packed_shape(n, k) or colsum.dtype != np.int32:
        fail(op, f"packed weights {packed.dtype} {packed.shape} do not fit k = {k}, n = {n} (use pack_weights)",
             ShapeError)
    return n


def qgemm(a: np.ndarray, packed: np.ndarray, colsum: np.ndarray, zero_point: int = 0) -> np.ndarray:
    """(a - zero_point) @ w.T in int32, for u8 or s8 activations a (m, k) and weights packed by `pack_weights`."""
    a = np.ascontiguousarray(a)
    if a.dtype not in (np.uint8, np.int8) or a.ndim != 2:
        fail("qgemm", f"activations must be a 2-D uint8 or int8 array, got {a.dtype} {a.shape}", ArgumentError)
    (m, k), n = a.shape, _weights("qgemm", packed, colsum, a.shape[1])
    out = np.empty((m, n), np.int32)
    function = _functions()["u8" if a.dtype == np.uint8 else "s8"]
    _check("qgemm", function(m, n, k, a.ctypes.data, k, zero_point, packed.ctypes.data, colsum.ctypes.data,
                             out.ctypes.data, n))
    return out


def qlinear(x: np.ndarray, packed: np.ndarray, colsum: np.ndarray, w_scale: np.ndarray,
            bias: np.ndarray | None = None, *, quant_max: int = 255, activation: str = "none",
            qparams: tuple[float, int] | None = None) -> np.ndarray:
    """A linear layer on float32 x (m, k) quantized to [0, quant_max] with `qparams` (scale, zero point), or with
    parameters chosen from x when None (dynamic quantization; gemm_int8.h)."""
    x = np.ascontiguousarray(x, np.float32)
    (m, k), n = x.shape, _weights("qlinear", packed, colsum, x.shape[1])
    if activation not in ACTIVATIONS:
        fail("qlinear", f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}", ArgumentError)
    w_scale = np.ascontiguousarray(w_scale, np.float32)
    bias = None if bias is None else np.ascontiguousarray(bias, np.float32)
    out = np.empty((m, n), np.float32)
    _check("qlinear", _functions()["linear"](
        m, n, k, x.ctypes.data, k, *(qparams or (0.0, 0)), quant_max, packed.ctypes.data,
        colsum.ctypes.data, w_scale.ctypes.data, None if bias is None else bias.ctypes.data, out.ctypes.data, n,
        ACTIVATIONS[activation]))
    return out
