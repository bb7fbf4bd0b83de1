"""The kernel build cache: keyed by sources, flags and compiler, under TG_CACHE_DIR, never rebuilt when present."""

from __future__ import annotations

import subprocess

import pytest

from tensorgraphs.codegen import compiler
from tensorgraphs.kernels import gemm
from tensorgraphs.kernels.gemm import SOURCES, build

pytestmark = pytest.mark.skipif(not gemm.available(), reason="needs AVX-512F and a C compiler")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_key_follows_flags_and_lives_under_tg_cache_dir(cache):
    plain = build.library_path("tg_gemm", SOURCES, build.FLAGS, ())
    assert plain.is_relative_to(cache)
    assert plain == build.library_path("tg_gemm", SOURCES, build.FLAGS, ())
    assert plain != build.library_path("tg_gemm", SOURCES, (*build.FLAGS, "-DTG_KC=128"), ())
    assert plain != build.library_path("tg_gemm", SOURCES, build.FLAGS, ("-lm",))


def test_cached_library_is_not_rebuilt(cache, monkeypatch):
    target = build.library_path("tg_gemm", SOURCES, build.FLAGS, ())
    target.write_bytes(b"a library built earlier")
    compiler._record(target).write_text(compiler._fingerprint(target))  # its build's record

    def no_compiler(*args, **kwargs):
        raise AssertionError("the compiler ran although the library was cached")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert build.build_library("tg_gemm", SOURCES) == target


def test_compiler_failure_names_the_library_and_leaves_no_file(cache):
    with pytest.raises(build.KernelBuildError, match="tg_gemm_broken"):
        build.build_library("tg_gemm_broken", SOURCES, (*build.FLAGS, "-Werror=no-such-warning-option"))
    assert not list((cache / "kernels").glob("*.so"))


@pytest.mark.long
def test_a_damaged_kernel_library_is_rebuilt_with_a_warning(cache):
    target = build.build_library("tg_gemm", SOURCES)
    target.write_bytes(target.read_bytes()[:100])
    with pytest.warns(compiler.CacheWarning, match="rebuilding"):
        assert build.build_library("tg_gemm", SOURCES) == target
    assert target.stat().st_size > 100
