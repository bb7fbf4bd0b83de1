"""The kernels on OpenBLAS's sgemm from the `scipy-openblas32` wheel: the BLAS kernel (tg_gemm_f32's contract,
gemm.h) and conv2d by an explicit im2col (tg_conv2d_f32's contract, im2col.h).

The wheel ships a shared library and its headers (symbols prefixed `scipy_`); blas.c and im2col.c call
`scipy_cblas_sgemm` from C, so generated programs call `tg_blas_gemm_f32` and `tg_conv2d_im2col_f32` with no
Python in the loop. The wheel is optional: `available()` and `conv_available()` say whether each kernel can be
offered to the planner. The conv kernel is portable C (no AVX-512), so it runs wherever OpenBLAS and a C
compiler do.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tensorgraphs.errors import UnsupportedError
from tensorgraphs.kernels import gemm
from tensorgraphs.kernels.gemm import CONV_ARGTYPES, GEMM_ARGTYPES, bind_gemm, call_conv, call_gemm
from tensorgraphs.kernels.gemm.build import SOURCE_DIR, build_library, compiler_works, load_library

LIBRARY = "tg_blas"
SOURCES = ("blas.c", "describe.c")
C_FUNCTION = "tg_blas_gemm_f32"
CONV_LIBRARY = "tg_conv_im2col"
CONV_SOURCES = ("im2col.c", "columns.c")
CONV_FUNCTION = "tg_conv2d_im2col_f32"
CONV_HEADER = SOURCE_DIR / "im2col.h"


@functools.cache
def _openblas_installed() -> bool:
    return importlib.util.find_spec("scipy_openblas32") is not None


def available() -> bool:
    """Whether scipy-openblas32 is installed and the epilogue it shares with the GEMM library (AVX-512, or its AVX2
    stand-in) can build here (then it builds on first use)."""
    return _openblas_installed() and gemm.available()


def conv_available() -> bool:
    """Whether scipy-openblas32 and a C compiler are installed (the im2col conv kernel builds on first use)."""
    return _openblas_installed() and compiler_works()


def build_flags() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(compile flags, link flags) for a library calling OpenBLAS: its headers, and the library with an rpath."""
    if not _openblas_installed():
        raise UnsupportedError("the BLAS kernels need the scipy-openblas32 wheel: pip install scipy-openblas32")
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


def conv_library_path() -> Path:
    """The compiled im2col conv library (built on first call) for generated programs to link against."""
    flags, link = build_flags()
    return build_library(CONV_LIBRARY, CONV_SOURCES, flags, (*link, "-lm"))


@functools.cache
def _conv_function() -> Callable[..., int]:
    flags, link = build_flags()
    function = getattr(load_library(CONV_LIBRARY, CONV_SOURCES, flags, (*link, "-lm")), CONV_FUNCTION)
    function.argtypes, function.restype = CONV_ARGTYPES, ctypes.c_int
    return function


def conv2d(x: np.ndarray, weight: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
    """torch.nn.functional.conv2d (NCHW, groups=1) by im2col and OpenBLAS's sgemm, with the GEMM's epilogue
    (arguments as `gemm.call_conv`)."""
    return call_conv(_conv_function(), x, weight, *args, **kwargs)
