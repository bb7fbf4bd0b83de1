"""C compiler drivers: source -> shared library, cached on disk.

A `CompilerDriver` says how a target turns a translation unit into a loadable
library (the compiler, its flags, the libraries every program links, the
environment its runtime reads; the cpu target's is `backends.cpu.driver.GCC`).
All drivers share the one cache below and its checks.

The cache key is a hash of the source, the compiler's version and the flags, so
a program is compiled once per machine. Files are written under a unique
temporary name and moved into place with `os.replace`, which is atomic: any
number of processes may compile the same program at once and readers only ever
see complete files. The cache lives in `$TG_CACHE_DIR` (when set and not empty)
or the user cache directory (`$XDG_CACHE_HOME/tensorgraphs`, default
`~/.cache/tensorgraphs`).

A cache is only trusted as far as it can be checked: its directory is private to
the user (created 0700; one owned by someone else is not used), each library is
loaded only if its size and SHA-256 match the record written after it was built
(a truncated file would otherwise crash the process when mapped; a planted one
would run its constructors), and anything that fails a check, or fails to load,
is rebuilt with a `CacheWarning`. An unusable directory falls back to a private
temporary one, with a warning. Libraries beyond `$TG_CACHE_MAX_MB` (default
1024) are removed, least recently used first.
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
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tensorgraphs.errors import TGError
from tensorgraphs.kerneldb.db import cache_dir as user_cache_dir

UNIT_BREAK = "/* tg: unit break */"
"""A line between two functions of a program, where `compile_shared` may cut it into units."""
SPLIT_MIN_FUNCTIONS = 24
"""Programs with fewer functions compile as one unit (a split costs a link step, ~0.1 s)."""


class CompileError(TGError, RuntimeError):
    """The C compiler rejected a generated program (a bug in tensorgraphs; the message says what to do)."""


class CacheWarning(UserWarning):
    """The compile cache was unusable or held a damaged file; tensorgraphs rebuilt it or used another directory."""


@dataclass(frozen=True)
class CompilerDriver:
    """How one target's C becomes a loadable library: `command` with `flags`, every program linked with
    `libraries`; `environment` is set (unless the user set it) before the first program loads."""

    command: str
    flags: tuple[str, ...]
    libraries: tuple[str, ...] = ("-lm",)
    environment: tuple[tuple[str, str], ...] = ()

    def available(self) -> bool:
        """Whether the compiler is installed."""
        return shutil.which(self.command) is not None

    def version(self) -> str:
        return _compiler_version(self.command)


def _cache_warning(message: str) -> None:
    warnings.warn(f"compile cache: {message}", CacheWarning, stacklevel=3)


@functools.cache
def _private_temporary_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="tensorgraphs-cache-"))


def cache_dir(kind: str = "c") -> Path:
    """The directory of compiled libraries of `kind` ("c": generated programs, "kernels": hand-written kernel
    libraries) under the user's tensorgraphs cache (module docstring), created if missing (also while running)."""
    path = user_cache_dir() / kind
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = path.stat()
        if status.st_uid != os.getuid():
            reason = "is owned by another user"
        elif not os.access(path, os.W_OK | os.X_OK):
            reason = "is not writable"
        else:
            if status.st_mode & 0o077:
                path.chmod(0o700)  # ours, but open to others: made private
            return path
    except OSError as error:
        reason = f"cannot be used ({error.strerror or error})"
    fallback = _private_temporary_dir()
    if path not in _refused:
        _refused.add(path)
        _cache_warning(f"{path} {reason}; compiling into the private temporary directory {fallback} instead")
    return fallback


_refused: set[Path] = set()  # cache directories already warned about


@functools.cache
def _compiler_version(command: str) -> str:
    try:
        result = subprocess.run([command, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise CompileError(f"no working C compiler {command!r} ({error}); compiled devices need one. "
                           "Use `with tg.device('numpy'):` to run on the reference backend instead.") from None
    return result.stdout.splitlines()[0]


def program_key(source: str, driver: CompilerDriver, link: tuple[str, ...] = ()) -> str:
    text = "\n".join([source, driver.version(), " ".join(driver.flags), " ".join(link)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _write_atomically(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    with os.fdopen(handle, "wb") as f:
        f.write(data)
    os.replace(temporary, path)


def _fingerprint(path: Path) -> str:
    data = path.read_bytes()
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def _record(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _intact(library: Path) -> bool:
    """Whether `library` matches the size and hash recorded when it was built (no record: not ours)."""
    try:
        record = _record(library).read_text()
        if int(record.split()[0]) != library.stat().st_size:  # a truncated file is never read, let alone mapped
            return False
        return _fingerprint(library) == record
    except (OSError, ValueError, IndexError):
        return False


def cached_library(library: Path, build: Callable[[str], None]) -> Path:
    """`library` as the cache holds it intact, else built by `build(temporary_path)` and moved into place with a
    record of its size and hash (a damaged or foreign file is rebuilt, with a warning)."""
    if library.exists():
        if _intact(library):
            os.utime(library)  # recently used: trimmed last
            return library
        if _record(library).exists():  # (without a record: built by an older version, or not by us; rebuilt quietly)
            _cache_warning(f"{library} does not match the record of its build (damaged); rebuilding it")
    handle, temporary = tempfile.mkstemp(dir=library.parent, prefix=f"{library.name}.", suffix=".tmp")
    os.close(handle)
    try:
        build(temporary)
    except BaseException:
        os.unlink(temporary)
        raise
    os.replace(temporary, library)
    _write_atomically(_record(library), _fingerprint(library).encode())
    _trim(library.parent, keep=library)
    return library


def compile_shared(source: str, driver: CompilerDriver, link: tuple[str, ...] = ()) -> Path:
    """Path of the library `driver` compiles from `source` (linked with the extra arguments `link`: libraries it
    calls), compiling it unless the cache has it intact."""
    key = program_key(source, driver, link)
    directory = cache_dir()
    source_path = directory / f"{key}.c"

    def build(temporary: str) -> None:
        _write_atomically(source_path, source.encode())
        units = _units(source, os.cpu_count() or 1)
        if len(units) == 1 or not _compile_in_parallel(units, temporary, driver, link):
            result = subprocess.run([driver.command, *driver.flags, "-o", temporary, str(source_path), *link,
                                     *driver.libraries], capture_output=True, text=True)
            if result.returncode != 0:
                raise CompileError(_failure_message(source, source_path, result.stderr))

    return cached_library(directory / f"{key}.so", build)


def _trim(directory: Path, keep: Path) -> None:
    """Remove least recently used libraries (with their source and record) while the cache is over its cap."""
    cap = float(os.environ.get("TG_CACHE_MAX_MB") or 1024) * (1 << 20)
    try:
        libraries = sorted(((p.stat().st_mtime, p.stat().st_size, p) for p in directory.glob("*.so")),
                           key=lambda entry: entry[0])
    except OSError:  # another process trimmed at the same time
        return
    total = sum(size for _, size, _ in libraries)
    for _, size, path in libraries:
        if total <= cap:
            break
        if path != keep:
            for stale in (path, path.with_suffix(".c"), _record(path)):
                stale.unlink(missing_ok=True)
            total -= size


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


def _compile_in_parallel(units: list[str], library: str, driver: CompilerDriver, link: tuple[str, ...] = ()) -> bool:
    """Compile each unit in its own process and link them into `library`; False on any failure (the caller
    then compiles the whole program at once, for an error message about the source the user can see)."""
    with tempfile.TemporaryDirectory(dir=Path(library).parent, prefix="units.") as directory:
        objects = []
        processes = []
        for number, unit in enumerate(units):
            path = Path(directory) / f"unit{number}.c"
            path.write_text(unit)
            objects.append(str(path.with_suffix(".o")))
            processes.append(subprocess.Popen([driver.command, *driver.flags, "-c", "-o", objects[-1], str(path)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if any([p.wait() != 0 for p in processes]):
            return False
        linked = subprocess.run([driver.command, *driver.flags, "-o", library, *objects, *link, *driver.libraries],
                                capture_output=True)
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


@functools.cache
def load(source: str, driver: CompilerDriver, link: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The loaded library `driver` builds from `source` (compiled or taken from the cache); once per process."""
    for name, value in driver.environment:
        os.environ.setdefault(name, value)
    library = compile_shared(source, driver, link)
    try:
        return ctypes.CDLL(str(library))
    except OSError as error:
        _cache_warning(f"{library} failed to load ({error}); rebuilding it")
        library.unlink(missing_ok=True)
        return ctypes.CDLL(str(compile_shared(source, driver, link)))


def link_library(path: Path) -> tuple[str, ...]:
    """Link arguments for a shared library `path` a program calls, found again at load time by its directory."""
    return (str(path), f"-Wl,-rpath,{path.parent}")
