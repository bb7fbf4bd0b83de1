"""The compiler driver: on-disk cache, concurrent compiles, and failures people can act on."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import subprocess
import sys
import textwrap
from contextlib import nullcontext
from pathlib import Path

import pytest

from tensorgraphs.backends.cpu.driver import GCC
from tensorgraphs.backends.cpu.renderer import PREAMBLE
from tensorgraphs.codegen import compiler

SOURCE = "int tg_program(void **buffers) { return %d; }\n"


def test_second_compile_is_a_cache_hit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count_calls) -> None:
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    source = SOURCE % 7
    first = compiler.compile_shared(source, GCC)
    inode = first.stat().st_ino
    compiles = count_calls(subprocess, "run", "Popen")
    second = compiler.compile_shared(source, GCC)
    assert second == first and second.stat().st_ino == inode  # the same file: not rebuilt
    assert compiles == {}  # no compiler started
    assert sorted(p.name.split(".", 1)[1] for p in tmp_path.joinpath("c").iterdir()) == ["c", "so", "so.sha256"]


def test_key_depends_on_source_compiler_and_flags() -> None:
    key = compiler.program_key(SOURCE % 1, GCC)
    assert key != compiler.program_key(SOURCE % 2, GCC)
    debug = dataclasses.replace(GCC, flags=GCC.flags + ("-g",))
    assert key != compiler.program_key(SOURCE % 1, debug)


def test_another_driver_builds_into_the_same_checked_cache() -> None:
    """A second target's driver (other flags, no OpenMP) gets libraries of its own from the one cache, with the
    same integrity record, and a damaged one is rebuilt with a warning as the cpu target's are."""
    plain = compiler.CompilerDriver(GCC.command, ("-O1", "-std=c11", "-shared", "-fPIC"))
    library = compiler.compile_shared(SOURCE % 21, driver=plain)
    assert library != compiler.compile_shared(SOURCE % 21, GCC) and library.parent == compiler.cache_dir()
    assert compiler._intact(library)
    library.write_bytes(library.read_bytes()[:100])
    with pytest.warns(compiler.CacheWarning, match="rebuilding"):
        rebuilt = compiler.compile_shared(SOURCE % 21, driver=plain)
    assert ctypes.CDLL(str(rebuilt)).tg_program(None) == 21


def test_two_processes_compile_the_same_program_at_once(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import ctypes, sys
        from tensorgraphs.backends.cpu.driver import GCC
        from tensorgraphs.codegen import compiler
        library = ctypes.CDLL(str(compiler.compile_shared({SOURCE % 42!r}, GCC)))
        sys.exit(0 if library.tg_program(None) == 42 else 1)
    """)
    root = str(Path(__file__).resolve().parents[2])
    env = {"TG_CACHE_DIR": str(tmp_path), "PYTHONPATH": root, "PATH": "/usr/bin:/bin"}
    processes = [subprocess.Popen([sys.executable, "-c", script], env=env) for _ in range(2)]
    assert [p.wait(timeout=120) for p in processes] == [0, 0]
    assert len(list(tmp_path.joinpath("c").glob("*.so"))) == 1
    assert not list(tmp_path.joinpath("c").glob("*.tmp"))


def test_compile_error_names_the_kernel_keeps_the_source_and_says_how_to_fall_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    broken = "static void k3_exp2(float *restrict b0) {\n    b0[0] = undefined_name;\n}\n"
    with pytest.raises(compiler.CompileError) as error:
        compiler.compile_shared(broken, GCC)
    message = str(error.value)
    assert "kernel k3_exp2" in message and "tg.device('numpy')" in message
    kept = Path(message.split("kept at ")[1].split(".c")[0] + ".c")
    assert kept.read_text() == broken


def test_large_program_is_compiled_as_parallel_units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler.os, "cpu_count", lambda: 2)
    count = 2 * compiler.SPLIT_MIN_FUNCTIONS
    header = '#define TG_KERNEL __attribute__((visibility("hidden")))'
    functions = [f"TG_KERNEL int f{i}(void) {{ return {i}; }}" for i in range(count)]
    total = " + ".join(f"f{i}()" for i in range(count))
    entry = "\n".join([*(f"TG_KERNEL int f{i}(void);" for i in range(count)),
                       f"int tg_program(void **buffers) {{ return {total}; }}"])
    source = f"\n{compiler.UNIT_BREAK}\n".join([header, *functions, entry]) + "\n"
    units = compiler._units(source, 2)
    assert len(units) == 2 and all(unit.startswith(header) for unit in units)
    assert compiler._compile_in_parallel(units, str(tmp_path / "direct.so"), GCC)
    library = ctypes.CDLL(str(compiler.compile_shared(source, GCC)))
    assert library.tg_program(None) == sum(range(count))
    assert compiler._units(source, 1) == [source]


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils) to list the library's functions")
def test_the_preamble_helpers_are_inlined_past_gccs_inlining_limits(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """In a program of hundreds of kernels gcc's unit-growth limit stopped inlining tg_exp2f and its kin: loops
    calling them were left scalar (an eager LSTM's backward ran 2.5x longer). With the limits at zero, as such a
    program meets them, no helper may be left out of line."""
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    limits = ("inline-unit-growth=0", "large-unit-insns=0", "max-inline-insns-single=0")
    driver = dataclasses.replace(GCC, flags=GCC.flags + tuple(f"--param={limit}" for limit in limits))
    kernels = [f"void k{i}(const float *restrict a, float *restrict b, int64_t *restrict c) {{\n"
               f"    for (int64_t j = 0; j < 1024; j++) {{\n"
               f"        b[j] = tg_exp2f(a[j] * {i + 1}) + tg_log2f(a[j] + {i}) + tg_maxf(a[j], {i});\n"
               f"        c[j] = tg_floordiv_index(c[j], {i + 2}) + tg_mod_index(c[j], {i + 3});\n"
               "    }\n}"
               for i in range(3)]
    library = compiler.compile_shared("\n".join([PREAMBLE, *kernels, "int tg_program(void) { return 0; }"]), driver)
    symbols = [line.split()[-2:] for line in
               subprocess.run(["nm", str(library)], capture_output=True, text=True, check=True).stdout.splitlines()]
    functions = [name for kind, name in symbols if kind in "tT"]
    assert not [name for name in functions if name.startswith("tg_") and name != "tg_program"]


def _library_returning(value: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    source = SOURCE % value
    return source, compiler.compile_shared(source, GCC)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "record missing"])
def test_a_damaged_library_is_rebuilt_with_a_warning_never_loaded(
        damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, library = _library_returning(11, tmp_path, monkeypatch)
    data = library.read_bytes()
    if damage == "garbage":
        library.write_bytes(b"\x7fELF" + b"\0" * (len(data) - 4))
    elif damage == "truncated":  # mapped as it is, this killed the process with SIGBUS
        library.write_bytes(data[: len(data) // 2])
    else:  # an older version's library, or one not built here: rebuilt without a warning
        compiler._record(library).unlink()
    with pytest.warns(compiler.CacheWarning, match="rebuilding") if damage != "record missing" else nullcontext():
        rebuilt = compiler.compile_shared(source, GCC)
    assert rebuilt.read_bytes() == data
    assert ctypes.CDLL(str(rebuilt)).tg_program(None) == 11


def test_a_planted_library_is_not_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file placed under the predictable name, with no record of our build, never runs its constructor."""
    source, library = _library_returning(12, tmp_path, monkeypatch)
    marker = tmp_path / "constructor-ran"
    planted = tmp_path / "planted.c"
    planted.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                       f'{{ fclose(fopen("{marker}", "w")); }}\nint tg_program(void **b) {{ return 666; }}\n')
    subprocess.run([GCC.command, "-shared", "-fPIC", "-o", str(library), str(planted)], check=True)
    rebuilt = compiler.compile_shared(source, GCC)
    assert ctypes.CDLL(str(rebuilt)).tg_program(None) == 12 and not marker.exists()


def test_the_cache_directory_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "fresh"))
    monkeypatch.setattr("os.umask", lambda mask: 0)  # harmless: mkdir's mode is what is checked
    assert compiler.cache_dir().stat().st_mode & 0o777 == 0o700
    opened = tmp_path / "opened"
    (opened / "c").mkdir(parents=True)
    (opened / "c").chmod(0o777)
    monkeypatch.setenv("TG_CACHE_DIR", str(opened))
    assert compiler.cache_dir().stat().st_mode & 0o777 == 0o700


def test_an_unusable_cache_directory_falls_back_to_a_private_temporary_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("TG_CACHE_DIR", str(blocked))
    monkeypatch.setattr(compiler, "_refused", set())
    with pytest.warns(compiler.CacheWarning, match="private temporary directory"):
        fallback = compiler.cache_dir()
    assert fallback.is_dir() and not str(fallback).startswith(str(blocked))
    assert ctypes.CDLL(str(compiler.compile_shared(SOURCE % 13, GCC))).tg_program(None) == 13


def test_an_empty_cache_variable_means_the_default_directory_not_the_current_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    assert compiler.cache_dir() == tmp_path / "xdg" / "tensorgraphs" / "c"


def test_a_cache_directory_deleted_while_running_is_made_again(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    source, library = _library_returning(14, tmp_path, monkeypatch)
    shutil.rmtree(library.parent)
    assert ctypes.CDLL(str(compiler.compile_shared(source, GCC))).tg_program(None) == 14


def test_the_cache_is_trimmed_least_recently_used_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, oldest = _library_returning(15, tmp_path, monkeypatch)
    _, used = _library_returning(16, tmp_path, monkeypatch)
    os.utime(oldest, (1, 1))
    os.utime(used, (2, 2))
    compiler.compile_shared(SOURCE % 16, GCC)  # a cache hit marks it used now
    size = oldest.stat().st_size
    monkeypatch.setenv("TG_CACHE_MAX_MB", str(2.5 * size / (1 << 20)))
    newest = compiler.compile_shared(SOURCE % 17, GCC)
    assert not oldest.exists() and not compiler._record(oldest).exists()
    assert used.exists() and newest.exists()
