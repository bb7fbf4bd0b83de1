"""Build an exported library: NAME.c and the kernel libraries it calls -> libNAME.a and libNAME.so.

The compiler and its flags are the cpu backend's (`codegen.compiler`) for the program and the kernel libraries'
own (`kernels.gemm.build`) for their sources, with the optimization level, `-march` and OpenMP set as asked, so
a default build runs the code the Python process runs. The objects are linked into one relocatable object whose
symbols, all but the API's, are then made local (`objcopy --keep-global-symbol`): the archive and the shared
library export only NAME_*, and two libraries never clash over `tg_program` or the GEMM kernels.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tensorgraphs.backends.cpu.driver import GCC
from tensorgraphs.codegen import compiler
from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.kernels import EXPORTABLE
from tensorgraphs.kernels.gemm import build as kernel_build

OPTIMIZATIONS = ("-O0", "-O1", "-O2", "-O3")
TARGETS = ("native", "x86-64-v3", "x86-64-v4")


@dataclass(frozen=True)
class BuildOptions:
    optimization: str = "-O3"
    target: str = "native"  # the -march value
    cc: str = GCC.command
    openmp: bool = True
    verbose: bool = False  # print each command before running it

    def check(self) -> BuildOptions:
        if self.optimization not in OPTIMIZATIONS:
            fail("export", f"optimization must be one of {', '.join(OPTIMIZATIONS)}, got {self.optimization!r}",
                 kind=ArgumentError)
        if self.target not in TARGETS:
            fail("export", f"target must be one of {', '.join(TARGETS)}, got {self.target!r}", kind=ArgumentError)
        for tool in (self.cc, "objcopy", "ar"):
            if shutil.which(tool) is None:
                fail("export", f"building a library needs {tool!r}, which is not installed (or not on PATH)",
                     kind=ArgumentError)
        return self

    def flags(self, flags: tuple[str, ...]) -> list[str]:
        """`flags` (a compiler driver's) for one object of this build: no -shared, this -O and -march, OpenMP
        only if asked."""
        chosen = []
        for flag in flags:
            if flag.startswith("-O"):
                flag = self.optimization
            elif flag.startswith("-march="):
                flag = f"-march={self.target}"
            elif flag in ("-shared",) or (flag == "-fopenmp" and not self.openmp):
                continue
            chosen.append(flag)
        return chosen

    def link_flags(self) -> list[str]:
        return (["-fopenmp"] if self.openmp else []) + ["-lm"]


class BuildError(compiler.CompileError):
    """A command of the library build failed; the message holds the command and its output."""


def build_library(directory: Path, prefix: str, libraries: tuple[str, ...], symbols: list[str],
                  options: BuildOptions) -> None:
    """Compile `directory`/`prefix`.c (and the kernel `libraries` it calls) into lib`prefix`.a and
    lib`prefix`.so there, keeping only `symbols` global."""
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as scratch:
        work = Path(scratch)
        program = work / "program.o"
        _run_all([[options.cc, *options.flags(GCC.flags), "-c", f"{prefix}.c", "-o", str(program)]], directory,
                 options.verbose)
        objects = [str(program), *(str(kernel_object(library, source, options)) for library in libraries
                                   for source in EXPORTABLE[library].files)]
        combined = work / f"{prefix}.o"
        _run_all([[options.cc, "-r", "-nostdlib", "-o", str(combined), *objects]], directory, options.verbose)
        _run_all([["objcopy", *(f"--keep-global-symbol={s}" for s in symbols), str(combined)]], directory,
                 options.verbose)
        archive, shared = work / f"lib{prefix}.a", work / f"lib{prefix}.so"
        _run_all([["ar", "rcsD", str(archive), str(combined)],
                  [options.cc, "-shared", "-Wl,--no-undefined", "-o", str(shared), str(combined),
                   *options.link_flags()]],
                 directory, options.verbose)
        for built in (archive, shared):
            os.replace(built, directory / built.name)


def kernel_object(library: str, source: str, options: BuildOptions) -> Path:
    """The object file of one kernel library source for this build's flags, compiled once and cached beside the
    kernel libraries (keyed by compiler, flags and the library's sources)."""
    source_dir = EXPORTABLE[library].directory
    flags = tuple(options.flags(kernel_build.FLAGS))
    key = (options.cc, kernel_build.compiler_version(options.cc), *flags)
    cached = kernel_build.library_path(f"export-{library}-{Path(source).stem}", (source,), key, (), source_dir)

    def build(temporary: str) -> None:
        command = [options.cc, *flags, "-c", str(source_dir / source), "-o", temporary]
        _run_all([command], source_dir, options.verbose)

    return compiler.cached_library(cached.with_suffix(".o"), build)


def _run_all(commands: list[list[str]], cwd: Path, verbose: bool) -> None:
    """Run `commands` at once (in `cwd`); raise BuildError naming the first that failed."""
    for command in commands:
        if verbose:
            print(shlex.join(command), file=sys.stderr)
    processes = [subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for command in commands]
    results = [(command, process.communicate()[0], process.returncode) for command, process in zip(commands,
                                                                                                   processes)]
    for command, output, status in results:
        if status != 0:
            lines = "\n".join(output.strip().splitlines()[:20])
            raise BuildError(f"export: `{shlex.join(command)}` failed (exit status {status}):\n{lines}")
