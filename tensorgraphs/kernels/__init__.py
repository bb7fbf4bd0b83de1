"""Hand-written native kernels (GEMM, convolution, BLAS, fused attention) that generated programs call by their C
names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tensorgraphs.kernels import attention, blas, gemm


@dataclass(frozen=True)
class NativeLibrary:
    """Where a generated program finds a native function: the header declaring it and the shared library
    (built on first call) it links against."""

    header: str
    path: Callable[[], Path]


_GEMM = NativeLibrary(gemm.HEADER, gemm.library_path)
_ATTENTION = NativeLibrary(attention.HEADER, attention.library_path)
LIBRARIES: dict[str, NativeLibrary] = {
    gemm.C_FUNCTIONS["matmul"]: _GEMM,
    gemm.C_FUNCTIONS["conv2d"]: _GEMM,
    blas.C_FUNCTION: NativeLibrary(gemm.HEADER, blas.library_path),
    attention.C_FUNCTIONS["forward"]: _ATTENTION,
    attention.C_FUNCTIONS["backward"]: _ATTENTION,
}
"""C function -> the native library providing it."""
