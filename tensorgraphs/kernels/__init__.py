"""Hand-written native kernels (GEMM, int8 GEMM, convolution, Winograd convolution, BLAS, im2col convolution on
BLAS, fused attention, FFT) that generated programs call by their C names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tensorgraphs.kernels import attention, blas, fft, gemm
from tensorgraphs.kernels.gemm import int8


@dataclass(frozen=True)
class KernelSources:
    """A kernel library's C sources, which an exported program compiles into itself (`export.build`)."""

    name: str
    directory: Path
    files: tuple[str, ...]


@dataclass(frozen=True)
class NativeLibrary:
    """Where a generated program finds a native function: the header declaring it, the shared library (built on
    first call) it links against, and the sources an exported program builds it from (None: it cannot, as the
    BLAS kernels link OpenBLAS)."""

    header: Path
    path: Callable[[], Path]
    sources: KernelSources | None


_GEMM_SOURCES = KernelSources("gemm", gemm.SOURCE_DIR, gemm.SOURCES)
_GEMM = NativeLibrary(gemm.HEADER, gemm.library_path, _GEMM_SOURCES)
_WINOGRAD = NativeLibrary(gemm.WINOGRAD_HEADER, gemm.library_path, _GEMM_SOURCES)
_ATTENTION = NativeLibrary(attention.HEADER, attention.library_path,
                           KernelSources("attention", attention.SOURCE_DIR, attention.SOURCES))
LIBRARIES: dict[str, NativeLibrary] = {
    **dict.fromkeys(gemm.C_FUNCTIONS.values(), _GEMM),
    **dict.fromkeys((gemm.C_FUNCTIONS[name] for name in gemm.WINOGRAD_FUNCTIONS), _WINOGRAD),
    gemm.C_FUNCTIONS["conv2d_direct"]: NativeLibrary(gemm.DIRECT_HEADER, gemm.library_path, _GEMM_SOURCES),
    blas.C_FUNCTION: NativeLibrary(gemm.HEADER, blas.library_path, None),
    blas.CONV_FUNCTION: NativeLibrary(blas.CONV_HEADER, blas.conv_library_path, None),
    **dict.fromkeys(int8.C_FUNCTIONS.values(), NativeLibrary(
        int8.HEADER, int8.library_path, KernelSources("gemm_int8", gemm.SOURCE_DIR, int8.SOURCES))),
    **dict.fromkeys(attention.C_FUNCTIONS.values(), _ATTENTION),
    **dict.fromkeys(fft.C_FUNCTIONS.values(), NativeLibrary(
        fft.HEADER, fft.library_path, KernelSources("fft", fft.SOURCE_DIR, fft.SOURCES))),
}
"""C function -> the native library providing it."""

EXPORTABLE: dict[str, KernelSources] = {lib.sources.name: lib.sources for lib in LIBRARIES.values() if lib.sources}
"""The kernel libraries an exported program can contain, by name."""
