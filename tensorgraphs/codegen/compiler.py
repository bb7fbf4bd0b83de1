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
import shutil
import subprocess
import tempfile
from pathlib import Path

from tensorgraphs.errors import TGError

COMPILER = os.environ.get("TG_CC", "gcc")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
         "-fno-tree-slp-vectorize", "-std=gnu11", "-shared", "-fPIC")
"""Never -ffast-math: it changes NaN/Inf results. The two -fno flags are enough to vectorize our math;
-ffp-contract=off keeps a*b+c rounded twice, as every other backend computes it. The straight-line (SLP)
vectorizer of gcc 12 miscompiles short unrolled reductions of comparisons (`(x == 2).all(1)` over rows of 4
uint8 stored 254); our loops are vectorized by the loop vectorizer and explicit vector types, not by SLP."""


UNIT_BREAK = "/* tg: unit break */"
"""A line between two functions of a program, where `compile_shared` may cut it into units."""
SPLIT_MIN_FUNCTIONS = 24
"""Programs with fewer functions compile as one unit (a split costs a link step, ~0.1 s)."""


def compiler_available() -> bool:
    """Whether the C compiler (`TG_CC`, default gcc) is installed."""
    return shutil.which(COMPILER) is not None


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


def program_key(source: str, link: tuple[str, ...] = ()) -> str:
    text = "\n".join([source, compiler_version(), " ".join(FLAGS), " ".join(link)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _write_atomically(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    with os.fdopen(handle, "wb") as f:
        f.write(data)
    os.replace(temporary, path)


def compile_shared(source: str, link: tuple[str, ...] = ()) -> Path:
    """Path of the compiled library for `source` (linked with the extra arguments `link`: libraries it
    calls), compiling it unless the cache has it."""
    key = program_key(source, link)
    directory = cache_dir()
    library = directory / f"{key}.so"
    if library.exists():
        return library
    source_path = directory / f"{key}.c"
    _write_atomically(source_path, source.encode())
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f"{key}.", suffix=".so.tmp")
    os.close(handle)
    units = _units(source, os.cpu_count() or 1)
    if len(units) == 1 or not _compile_in_parallel(units, temporary, link):
        result = subprocess.run([COMPILER, *FLAGS, "-o", temporary, str(source_path), *link, "-lm"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            os.unlink(temporary)
            raise CompileError(_failure_message(source, source_path, result.stderr))
    os.replace(temporary, library)
    return library


def _units(source: str, jobs: int) -> list[str]:
    """`source` cut at UNIT_BREAK lines into at most `jobs` units of similar size, each with the leading part
    (includes, helpers) the functions need."""
    header, *functions = source.split(f"\n{UNIT_BREAK}\n")
    jobs = min(jobs, len(functions) // SPLIT_MIN_FUNCTIONS)
    if jobs < 2:
        return [source]
    target = sum(map(len, functions)) / jobs
    groups: list[list[str]] = [[]]
    filled = 0
    for function in functions:
        if filled >= target * len(groups) and len(groups) < jobs:
            groups.append([])
        groups[-1].append(function)
        filled += len(function)
    return ["\n".join([header, *group]) + "\n" for group in groups]


def _compile_in_parallel(units: list[str], library: str, link: tuple[str, ...] = ()) -> bool:
    """Compile each unit in its own process and link them into `library`; False on any failure (the caller
    then compiles the whole program at once, for an error message about the source the user can see)."""
    with tempfile.TemporaryDirectory(dir=Path(library).parent, prefix="units.") as directory:
        objects = []
        processes = []
        for number, unit in enumerate(units):
            path = Path(directory) / f"unit{number}.c"
            path.write_text(unit)
            objects.append(str(path.with_suffix(".o")))
            processes.append(subprocess.Popen([COMPILER, *FLAGS, "-c", "-o", objects[-1], str(path)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if any([p.wait() != 0 for p in processes]):
            return False
        linked = subprocess.run([COMPILER, *FLAGS, "-o", library, *objects, *link, "-lm"], capture_output=True)
        return linked.returncode == 0


def _failure_message(source: str, path: Path, stderr: str) -> str:
    lines = source.splitlines()
    match = re.search(rf"{re.escape(path.name)}:(\d+):", stderr)
    kernel = "the entry point"
    if match:
        for line in reversed(lines[: int(match.group(1))]):
            found = re.match(r"(?:static|TG_KERNEL) void (\w+)\(", line)
            if found:
                kernel = f"kernel {found.group(1)}"
                break
    first_errors = "\n".join(stderr.strip().splitlines()[:12])
    return (f"the C compiler failed on {kernel}; the generated source is kept at {path}.\n{first_errors}\n"
            "This is a bug in tensorgraphs: please report it with that file. "
            "To keep working, run on the reference backend with `with tg.device('numpy'):`.")


OPENMP_ENVIRONMENT = {"GOMP_SPINCOUNT": "3000"}
"""Read by the OpenMP runtime when the first program loads (a user's own setting wins). Idle threads spin a few
tens of microseconds before sleeping instead of libgomp's default of several ms: enough to catch the next kernel
of a program, short enough that a thread waiting for a descheduled peer soon leaves its core to the others.
Measured on the 2-core development machine, compiled training steps (enc1 / MLP of bench/train.py): quiet, 3000
and 10000 spins ran alike (31.7 / 14.6 ms vs 30.9 / 14.0); beside one busy process, 3000 ran 68 / 28.5 ms,
10000 90 / 34 ms, 1000 63-71 / 27-29 ms but ~5% slower quiet (torch eager there: 81 / 50 ms)."""


@functools.cache
def load(source: str, link: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The loaded library for `source` (compiled or taken from the cache); once per process."""
    for name, value in OPENMP_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    return ctypes.CDLL(str(compile_shared(source, link)))


def link_library(path: Path) -> tuple[str, ...]:
    """Link arguments for a shared library `path` a program calls, found again at load time by its directory."""
    return (str(path), f"-Wl,-rpath,{path.parent}")
