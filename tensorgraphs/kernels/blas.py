"""The BLAS kernel: tg_gemm_f32's contract (gemm.h) on OpenBLAS's sgemm from the `scipy-openblas32` wheel.

The wheel ships a shared library and its headers (symbols prefixed `scipy_`); blas.c calls `scipy_cblas_sgemm`
from C, so generated programs call `tg_blas_gemm_f32` with no Python in the loop. The wheel is optional:
`available()` says whether this kernel can be offered to the planner. Its C is plain (no AVX-512: epilogue.h's
portable passes), so it runs where the AVX-512 GEMM library does not, with OpenBLAS choosing its own kernels.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tensorgraphs.errors import UnsupportedError
from tensorgraphs.kernels.gemm import GEMM_ARGTYPES, bind_gemm, call_gemm
from tensorgraphs.kernels.gemm.build import build_library, compiler_works, load_library

LIBRARY = "tg_blas"
SOURCES = ("blas.c", "describe.c")
C_FUNCTION = "tg_blas_gemm_f32"


def available() -> bool:
    """Whether scipy-openblas32 is installed and a C compiler can build this kernel (then it builds on first use)."""
    return importlib.util.find_spec("scipy_openblas32") is not None and compiler_works()


def build_flags() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(compile flags, link flags) for a library calling OpenBLAS: its headers, and the library with an rpath."""
    if not available():
        raise UnsupportedError("the BLAS kernel needs the scipy-openblas32 wheel: pip install scipy-openblas32")
    import scipy_openblas32

    from tensorgraphs.kernels.gemm.build import FLAGS

    lib_dir = scipy_openblas32.get_lib_dir()
    link = (f"-L{lib_dir}", f"-l{scipy_openblas32.get_library()}", f"-Wl,-rpath,{lib_dir}")
    return (*FLAGS, f"-I{scipy_openblas32.get_include_dir()}"), link


def library_path() -> Path:
    """The compiled library (built on first call) for generated programs to link against."""
    flags, link = build_flags()
    return build_library(LIBRARY, SOURCES, flags, link)


@functools.cache
def _function() -> Callable[..., int]:
    flags, link = build_flags()
    function = getattr(load_library(LIBRARY, SOURCES, flags, link), C_FUNCTION)
    function.argtypes, function.restype = GEMM_ARGTYPES, ctypes.c_int
    return function


def matmul(a: np.ndarray, b: np.ndarray, **epilogue: object) -> np.ndarray:
    """OpenBLAS sgemm plus the fused-epilogue pass, on numpy float32 arrays (arguments as gemm.call_gemm)."""
    return call_gemm(_function(), a, b, **epilogue)


def bind_matmul(a: np.ndarray, b: np.ndarray, **epilogue: object) -> Callable[[], np.ndarray]:
    """`matmul` with its arguments converted once (see `gemm.bind_gemm`)."""
    return bind_gemm(_function(), a, b, **epilogue)
