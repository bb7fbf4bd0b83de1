"""The library build: only the API is exported, only libc, libm and OpenMP are linked (or no OpenMP at all), and
options are checked before anything runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from c_harness import run_c

import tensorgraphs as tg
from tensorgraphs.backends.cpu.renderer import library_functions
from tensorgraphs.export import BuildOptions, c_api
from tensorgraphs.graph.node import toposort
from tensorgraphs.kernels import blas
from tensorgraphs.plan import choices
from tensorgraphs.plan.signature import signature_of
from tensorgraphs.schedule import convolution, extern
from tensorgraphs.schedule.extern import gemm_enabled


def mlp() -> tg.nn.Module:
    tg.manual_seed(0)
    return tg.nn.Sequential(tg.nn.Linear(16, 32), tg.nn.GELU(), tg.nn.Linear(32, 4))


def defined_globals(library: Path) -> set[str]:
    listed = subprocess.run(["nm", "-g", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in listed.stdout.splitlines() if len(line.split()) == 3}


def needed(library: Path) -> set[str]:
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return {line.split("[")[1].split("]")[0] for line in dynamic.splitlines() if "(NEEDED)" in line}


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("readelf") is None, reason="needs binutils")
@pytest.mark.parametrize("openmp", [True, False])
@pytest.mark.long
def test_only_the_api_is_exported_and_only_libc_libm_openmp_linked(tmp_path: Path, openmp: bool) -> None:
    model, x = mlp(), tg.randn(8, 16)
    exported = tg.export(model, (x,), tmp_path, name="net", options=BuildOptions(openmp=openmp))
    assert exported.program.libraries == (("gemm",) if gemm_enabled() else ())  # inside, its symbols local
    api = set(c_api.exported_symbols("net"))
    assert defined_globals(exported.files["static"]) == api
    assert defined_globals(exported.files["shared"]) == api
    allowed = {"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2"} | ({"libgomp.so.1"} if openmp else set())
    assert needed(exported.files["shared"]) <= allowed
    assert ("libgomp.so.1" in needed(exported.files["shared"])) == openmp
    got = run_c(exported, [[x.numpy()]], openmp=openmp)[0][0][0]
    np.testing.assert_array_equal(got, tg.compile(model)(x).detach().numpy())


@pytest.mark.skipif(not blas.available(), reason="needs scipy-openblas32")
def test_products_the_blas_kernel_runs_in_python_are_planned_again_without_it(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the planner runs compiled products on the BLAS kernel (here: the GEMM library turned off): the library
    cannot link OpenBLAS, so the export plans them without it, and computes what tg.compile computes."""
    monkeypatch.setattr(extern, "gemm_enabled", lambda: False)
    monkeypatch.setattr(choices, "_PLANNERS", {})  # choices made with the GEMM library are not this machine's
    model, x = mlp(), tg.randn(8, 16)
    compiled = tg.compile(lambda x: model(x))
    with choices.targeting(choices.ALL_FEATURES):  # as the Python process runs it
        expected = compiled(x).detach().numpy()
        assert blas.C_FUNCTION in library_functions(compiled.traced(x).program.kernels)
    exported = tg.export(model, (x,), tmp_path, name="net")
    assert exported.program.libraries == ()
    got = run_c(exported, [[x.numpy()]])[0][0][0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
def test_the_header_compiles_as_cpp_too(tmp_path: Path) -> None:
    exported = tg.export(mlp(), (tg.randn(8, 16),), tmp_path, name="net")
    source = tmp_path / "use.cpp"
    source.write_text('#include "net.h"\nint main() { return net_num_inputs() == 1 ? 0 : 1; }\n')
    subprocess.run(["g++", "-Wall", "-Werror", f"-I{tmp_path}", "-o", str(tmp_path / "use"), str(source),
                    str(exported.files["static"]), "-fopenmp", "-lm"], check=True)
    assert subprocess.run([str(tmp_path / "use")]).returncode == 0


def test_verbose_prints_every_command(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    tg.export(mlp(), (tg.randn(8, 16),), tmp_path, name="loud", options=BuildOptions(optimization="-O2",
                                                                                        verbose=True))
    commands = capfd.readouterr().err.splitlines()
    assert any(c.startswith("gcc ") and " -O2 " in c and "-c loud.c" in c for c in commands)
    assert any(c.startswith("objcopy --keep-global-symbol=loud_create") for c in commands)
    assert not any(" -O3 " in c for c in commands)


@pytest.mark.parametrize("options, message", [
    (BuildOptions(optimization="-O9"), "optimization must be one of"),
    (BuildOptions(target="pentium"), "target must be one of"),
    (BuildOptions(cc="no-such-compiler-here"), "needs 'no-such-compiler-here'"),
])
def test_bad_options_are_refused_before_building(tmp_path: Path, options: BuildOptions, message: str) -> None:
    with pytest.raises(tg.ArgumentError, match=message):
        tg.export(mlp(), (tg.randn(8, 16),), tmp_path, name="mlp", options=options)
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(not gemm_enabled(), reason="the GEMM library does not run here")
def test_a_target_without_avx512_runs_the_gemm_library_on_avx2(tmp_path: Path) -> None:
    model, x = mlp(), tg.randn(8, 16)
    exported = tg.export(model, (x,), tmp_path, name="mlp", options=BuildOptions(target="x86-64-v3"))
    assert exported.program.libraries == ("gemm",)
    got = run_c(exported, [[x.numpy()]])[0][0][0]
    np.testing.assert_allclose(got, tg.compile(model)(x).detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not gemm_enabled(), reason="the GEMM library does not run here")
def test_a_target_without_avx512_runs_the_int8_gemm_on_avx2(tmp_path: Path) -> None:
    """x86-64-v3 builds the int8 GEMM with VPMADDUBSW in place of VNNI's VPDPBUSD: integer sums exact either way,
    the same float epilogue, so the same bits as the program compiled for this machine."""
    tg.manual_seed(3)
    model = tg.quantization.quantize_dynamic(tg.nn.Sequential(tg.nn.Linear(16, 32), tg.nn.ReLU(),
                                                              tg.nn.Linear(32, 4)))
    x = tg.randn(8, 16)
    exported = tg.export(model, (x,), tmp_path, name="qmlp", options=BuildOptions(target="x86-64-v3"))
    assert "gemm_int8" in exported.program.libraries
    got = run_c(exported, [[x.numpy()]])[0][0][0]
    np.testing.assert_array_equal(got, tg.compile(model)(x).detach().numpy())


def test_a_spectrogram_calls_the_fft_library_from_c(tmp_path: Path) -> None:
    window = tg.tensor(np.hanning(64).astype(np.float32))

    def spectrogram(signal: tg.Tensor) -> tg.Tensor:
        return tg.view_as_real(tg.stft(signal, 64, 16, window=window, return_complex=True)).abs().sum(-1)

    signals = [np.random.default_rng(seed).standard_normal(1000).astype(np.float32) for seed in range(2)]
    exported = tg.export(spectrogram, (tg.tensor(signals[0]),), tmp_path, name="spectrogram")
    assert "fft" in exported.program.libraries
    (got,) = run_c(exported, [[s] for s in signals])
    compiled = tg.compile(spectrogram)
    for signal, step in zip(signals, got):
        np.testing.assert_allclose(step[0], compiled(tg.tensor(signal)).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not gemm_enabled(), reason="the GEMM library does not run here")
@pytest.mark.parametrize("algorithm", ["winograd", "direct"])
def test_a_conv_kernel_with_a_header_of_its_own_exports_without_paths_of_this_machine(tmp_path: Path,
                                                                                     algorithm: str) -> None:
    """A conv `tg tune` measured fastest by Winograd or the direct conv: its header (which includes gemm.h beside it)
    is pasted into the program, so the exported C includes nothing from this machine's files."""
    tg.manual_seed(0)
    model, x = tg.nn.Conv2d(4, 8, 3, padding=1).requires_grad_(False), tg.randn(2, 4, 9, 9)
    (conv,) = [node for node in toposort([model(x).node]) if node.op.name == "conv2d"]
    with choices.forced({signature_of(conv): algorithm}):
        exported = tg.export(model, (x,), tmp_path, name="net")
    source = (tmp_path / "net.c").read_text()
    assert f"{convolution.C_FUNCTIONS[algorithm]}(" in source and '#include "/' not in source
    got = run_c(exported, [[x.numpy()]])[0][0][0]
    expected = torch.nn.functional.conv2d(*(torch.from_numpy(t.detach().numpy()) for t in (x, model.weight,
                                                                                          model.bias)), padding=1)
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-4)
