"""The C compiler driver: source -> shared library, cached on disk.

The cache key is a hash of the source, the compiler's version and the flags, so
a program is compiled once per machine. Files are written under a unique
temporary name and moved into place with `os.replace`, which is atomic: any
number of processes may compile the same program at once and readers only ever
see complete files. The cache lives in `$TG_CACHE_DIR` or the user cache
directory (`$XDG_CACHE_HOME/tensorgraphs`, default `~/.cache/tensorgraphs`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

from tensorgraphs.errors import TGError

COMPILER = os.environ.get("TG_CC", "gcc")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
         "-std=gnu11", "-shared", "-fPIC")
"""Never -ffast-math: it changes NaN/Inf results. The two -fno flags are enough to vectorize our math;
-ffp-contract=off keeps a*b+c rounded twice, as every other backend computes it."""


class CompileError(TGError, RuntimeError):
    """The C compiler rejected a generated program (a bug in tensorgraphs; the message says what to do)."""


def cache_dir() -> Path:
    base = os.environ.get("TG_CACHE_DIR")
    if base is None:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tensorgraphs")
    path = Path(base) / "c"
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def compiler_version() -> str:
    try:
        result = subprocess.run([COMPILER, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise CompileError(f"no working C compiler {COMPILER!r} ({error}); the cpu backend needs gcc. "
                           "Use `with tg.device('numpy'):` to run on the reference backend instead.") from None
    return result.stdout.splitlines()[0]


def program_key(source: str) -> str:
    text = "\n".join([source, compiler_version(), " ".join(FLAGS)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _write_atomically(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    with os.fdopen(handle, "wb") as f:
        f.write(data)
    os.replace(temporary, path)


def compile_shared(source: str) -> Path:
    """Path of the compiled library for `source`, compiling it unless the cache has it."""
    key = program_key(source)
    directory = cache_dir()
    library = directory / f"{key}.so"
    if library.exists():
        return library
    source_path = directory / f"{key}.c"
    _write_atomically(source_path, source.encode())
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f"{key}.", suffix=".so.tmp")
    os.close(handle)
    result = subprocess.run([COMPILER, *FLAGS, "-o", temporary, str(source_path), "-lm"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(temporary)
        raise CompileError(_failure_message(source, source_path, result.stderr))
    os.replace(temporary, library)
    return library


def _failure_message(source: str, path: Path, stderr: str) -> str:
    lines = source.splitlines()
    match = re.search(rf"{re.escape(path.name)}:(\d+):", stderr)
    kernel = "the entry point"
    if match:
        for line in reversed(lines[: int(match.group(1))]):
            found = re.match(r"static void (\w+)\(", line)
            if found:
                kernel = f"kernel {found.group(1)}"
                break
    first_errors = "\n".join(stderr.strip().splitlines()[:12])
    return (f"the C compiler failed on {kernel}; the generated source is kept at {path}.\n{first_errors}\n"
            "This is a bug in tensorgraphs: please report it with that file. "
            "To keep working, run on the reference backend with `with tg.device('numpy'):`.")


@functools.cache
def load(source: str) -> ctypes.CDLL:
    """The loaded library for `source` (compiled or taken from the cache); once per process."""
    return ctypes.CDLL(str(compile_shared(source)))
