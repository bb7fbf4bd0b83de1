"""Builds of the GEMM library from folders of its sources, for the A/B scripts (gemm_ab.py, conv_ab.py)."""

from __future__ import annotations

import ctypes
from pathlib import Path

from tensorgraphs.kernels import gemm
from tensorgraphs.kernels.gemm.build import load_library


def load_builds(spec: str, function: str, argtypes: list) -> dict[str, ctypes._CFuncPtr]:
    """`function` of each build in `spec` (comma-separated NAME=SOURCE_DIR, e.g. an older revision's
    tensorgraphs/kernels/gemm), compiled as the package compiles its own (cached by content) and dlopened."""
    builds = {}
    for entry in spec.split(","):
        name, folder = entry.split("=")
        loaded = getattr(load_library(gemm.LIBRARY, gemm.SOURCES, source_dir=Path(folder).resolve()), function)
        loaded.argtypes, loaded.restype = argtypes, ctypes.c_int
        builds[name] = loaded
    return builds
