"""Hand-written native kernels (GEMM, convolution, BLAS) that generated programs call by their C names."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tensorgraphs.kernels import blas, gemm

LIBRARIES: dict[str, Callable[[], Path]] = {
    gemm.C_FUNCTIONS["matmul"]: gemm.library_path,
    gemm.C_FUNCTIONS["conv2d"]: gemm.library_path,
    blas.C_FUNCTION: blas.library_path,
}
"""C function -> the shared library (built on first call) a program calling it links against."""
