"""Hand-written native kernels (GEMM, int8 GEMM, convolution, Winograd convolution, BLAS, im2col convolution on
BLAS, fused attention, FFT) that generated programs call by their C names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tensorgraphs.kernels import attention, blas, fft, gemm
from tensorgraphs.kernels.gemm import int8


@dataclass(frozen=True)
class NativeLibrary:
    """Where a generated program finds a native function: the header declaring it and the shared library
    (built on first call) it links against."""

    header: str
    path: Callable[[], Path]


_GEMM = NativeLibrary(gemm.HEADER, gemm.library_path)
_ATTENTION = NativeLibrary(attention.HEADER, attention.library_path)
LIBRARIES: dict[str, NativeLibrary] = {
    **dict.fromkeys(gemm.C_FUNCTIONS.values(), _GEMM),
    gemm.C_FUNCTIONS["conv2d_winograd"]: NativeLibrary(gemm.WINOGRAD_HEADER, gemm.library_path),
    blas.C_FUNCTION: NativeLibrary(gemm.HEADER, blas.library_path),
    blas.CONV_FUNCTION: NativeLibrary(blas.CONV_HEADER, blas.conv_library_path),
    **dict.fromkeys(int8.C_FUNCTIONS.values(), NativeLibrary(int8.HEADER, int8.library_path)),
    **dict.fromkeys(attention.C_FUNCTIONS.values(), _ATTENTION),
    **dict.fromkeys(fft.C_FUNCTIONS.values(), NativeLibrary(fft.HEADER, fft.library_path)),
}
"""C function -> the native library providing it."""
