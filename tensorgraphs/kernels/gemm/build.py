"""Compile the C sources shipped in this package into a shared library cached on disk by content hash.

A small driver of its own because codegen.compiler builds one generated source string, while these kernels are
several files with headers and the BLAS one links a library. The key covers every source and header of this
folder, the flags and the compiler's version line, so an edited kernel or another gcc rebuilds; the library is
written under a temporary name and renamed, so concurrent processes never load a half-written file.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
from pathlib import Path

from tensorgraphs.codegen.compiler import cache_dir, cached_library
from tensorgraphs.errors import TGError

SOURCE_DIR = Path(__file__).resolve().parent
COMPILER = os.environ.get("TG_CC", "gcc")  # the same variable as the cpu backend's compiler driver
# Never -ffast-math: it changes NaN/Inf results. These two only let float->int and libm-free loops vectorize.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared")


class KernelBuildError(TGError, RuntimeError):
    """The C compiler rejected a kernel library; the message holds its command and output."""


@functools.cache
def compiler_version(compiler: str = COMPILER) -> str:
    """The compiler's first `--version` line (part of the cache key)."""
    try:
        result = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise KernelBuildError(f"no usable C compiler {compiler!r}: {error}") from error
    return result.stdout.splitlines()[0]


@functools.cache
def compiler_works(compiler: str = COMPILER) -> bool:
    """Whether `compiler` runs (kernels in plain C can then be built here)."""
    try:
        return bool(compiler_version(compiler))
    except KernelBuildError:
        return False


def library_path(name: str, sources: tuple[str, ...], flags: tuple[str, ...], link: tuple[str, ...],
                 source_dir: Path = SOURCE_DIR) -> Path:
    """Where the library built from `sources` (in `source_dir`) with `flags` lives in the cache (whether built or
    not)."""
    digest = hashlib.sha256(compiler_version().encode())
    for part in (*flags, *sources, *link):
        digest.update(part.encode() + b"\0")
    for file in sorted(source_dir.glob("*.[ch]")):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return cache_dir("kernels") / f"{name}-{digest.hexdigest()[:20]}.so"


def build_library(
    name: str, sources: tuple[str, ...], flags: tuple[str, ...] = FLAGS, link: tuple[str, ...] = (),
    source_dir: Path = SOURCE_DIR,
) -> Path:
    """Compile `sources` (file names in `source_dir`, this folder by default) unless the cache already holds the
    result; `link` comes after the sources (libraries to link against)."""
    def build(scratch: str) -> None:
        command = [COMPILER, *flags, *(str(source_dir / source) for source in sources), *link, "-o", scratch]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise KernelBuildError(f"{name}: {' '.join(command)} failed:\n{result.stderr}")

    return cached_library(library_path(name, sources, flags, link, source_dir), build)


@functools.cache
def load_library(
    name: str, sources: tuple[str, ...], flags: tuple[str, ...] = FLAGS, link: tuple[str, ...] = (),
    source_dir: Path = SOURCE_DIR,
) -> ctypes.CDLL:
    """Build (first use only) and load the library; one handle per process."""
    return ctypes.CDLL(str(build_library(name, sources, flags, link, source_dir)))
