"""The compiler driver: on-disk cache, concurrent compiles, and failures people can act on."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tensorgraphs.codegen import compiler

SOURCE = "int tg_program(void **buffers) { return %d; }\n"


def test_second_compile_is_a_cache_hit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count_calls) -> None:
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    source = SOURCE % 7
    first = compiler.compile_shared(source)
    stamp = first.stat().st_mtime_ns
    compiles = count_calls(subprocess, "run", "Popen")
    second = compiler.compile_shared(source)
    assert second == first and second.stat().st_mtime_ns == stamp
    assert compiles == {}  # no compiler started
    assert sorted(p.suffix for p in tmp_path.joinpath("c").iterdir()) == [".c", ".so"]  # no temporaries left


def test_key_depends_on_source_compiler_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    key = compiler.program_key(SOURCE % 1)
    assert key != compiler.program_key(SOURCE % 2)
    monkeypatch.setattr(compiler, "FLAGS", compiler.FLAGS + ("-g",))
    assert key != compiler.program_key(SOURCE % 1)


def test_two_processes_compile_the_same_program_at_once(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import ctypes, sys
        from tensorgraphs.codegen import compiler
        library = ctypes.CDLL(str(compiler.compile_shared({SOURCE % 42!r})))
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
        compiler.compile_shared(broken)
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
    assert compiler._compile_in_parallel(units, str(tmp_path / "direct.so"))
    library = ctypes.CDLL(str(compiler.compile_shared(source)))
    assert library.tg_program(None) == sum(range(count))
    assert compiler._units(source, 1) == [source]
