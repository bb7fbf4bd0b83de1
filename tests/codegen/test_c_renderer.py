"""The C renderer: documented error bounds of the vectorized math, special values, literals, identifiers."""

from __future__ import annotations

import ctypes
import re
import subprocess

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs import dtypes
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.backends.cpu import renderer as cpu_renderer
from tensorgraphs.backends.cpu.driver import GCC
from tensorgraphs.backends.cpu.renderer import CpuRenderer
from tensorgraphs.codegen import compiler
from tensorgraphs.codegen import index as ix
from tensorgraphs.codegen.c_renderer import CStyleRenderer, c_identifier, literal
from tensorgraphs.codegen.loop_ir import GemmCall, GemmEpilogue, Kernel, KernelParam, Lit, Loop, ParallelAxis, Store
from tensorgraphs.kernels import gemm
from tensorgraphs.schedule import schedule_kernels

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included

ULP_BOUNDS = {"exp2": 1.0, "log2": 2.0, "sin": 1.0}  # the bounds documented in c_preamble.h


def run_float32(fn, x: np.ndarray) -> np.ndarray:
    return CPU.evaluate([fn(tg.tensor(x)).node])[0]


def ulp_error(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    spacing = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / spacing


def test_math_error_bounds() -> None:
    rng = np.random.default_rng(0)
    cases = {
        "exp2": np.concatenate([rng.uniform(-149, 127.9, 50000), rng.uniform(-2, 2, 20000)]),
        "log2": np.concatenate([np.exp(rng.uniform(-100, 88, 50000)), rng.uniform(0.5, 2, 20000),
                                rng.uniform(0, 1e-38, 1000)]),
        "sin": np.concatenate([rng.uniform(-10, 10, 20000), rng.uniform(-1e6, 1e6, 20000),
                               np.exp(rng.uniform(0, 88, 20000)) * rng.choice([-1, 1], 20000)]),
    }
    for name, values in cases.items():
        x = values.astype(np.float32)
        got = run_float32(getattr(tg, name), x)
        exact = getattr(np, name)(x.astype(np.float64))
        worst = ulp_error(got, exact).max()
        assert worst <= ULP_BOUNDS[name], (name, worst)


def test_math_special_values() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1.0, 200.0, -200.0, 128.0, -149.0], np.float32)
    got = {name: run_float32(getattr(tg, name), x) for name in ("exp2", "log2", "sin", "sqrt")}
    with np.errstate(all="ignore"):
        for name, values in got.items():
            np.testing.assert_allclose(values, getattr(np, name)(x), rtol=4e-7, atol=0, err_msg=name)
    assert np.signbit(got["sin"][4]) and np.signbit(got["sqrt"][4])  # -0 stays -0


def test_literals_are_exact_and_spell_specials() -> None:
    assert literal(0.1, dtypes.float32) == f"{float(np.float32(0.1)).hex()}f"
    assert literal(0.1, dtypes.float64) == (0.1).hex()
    assert literal(float("nan"), dtypes.float32) == "NAN"
    assert literal(float("-inf"), dtypes.float64) == "(-INFINITY)"
    assert literal(-(2**63), dtypes.int64) == "(-INT64_C(9223372036854775807) - 1)"
    assert literal(2**40, dtypes.int64) == f"((int64_t){2**40})"  # a size template may put an expression there
    assert float.fromhex(literal(0.1, dtypes.bfloat16)[:-1]) == float(dtypes.round_to_storage(np.float32(0.1),
                                                                                           dtypes.bfloat16))


def test_identifiers_are_sanitized() -> None:
    assert c_identifier('k0_my"op;system("rm")') == "k0_my_op_system__rm__"
    assert c_identifier("0abc") == "_0abc"


@pytest.mark.skipif(GCC.command != "gcc", reason="the vectorization report is gcc's")
def test_fused_gelu_and_softmax_loops_vectorize(tmp_path) -> None:
    x, a = tg.tensor(np.ones((8, 64), np.float32)), tg.tensor(np.ones(64, np.float32))
    program, _ = CPU.program([F.gelu(x * a + a, approximate="tanh").node, F.softmax(x, -1).node])
    source = tmp_path / "program.c"
    source.write_text(program.source)
    report = subprocess.run([GCC.command, *GCC.flags, "-fopt-info-vec-optimized", "-o",
                             str(tmp_path / "p.so"), str(source)], capture_output=True, text=True).stderr
    assert report.count("loop vectorized") >= 4, report  # gelu's loop, softmax's max and sum lanes, its output


@pytest.mark.skipif(GCC.command != "gcc", reason="the vectorization report is gcc's")
def test_a_batched_local_response_norm_loop_vectorizes(tmp_path) -> None:
    """Its window over channels reads 5 padded neighbours under conditions invariant in the inner loop, whose
    blocks gcc's jump threading duplicated and left scalar (driver.NO_JUMP_THREADING)."""
    x = tg.tensor(np.ones((2, 192, 5, 55), np.float32))  # Inception's first LRN, fewer rows (smaller ones vectorized)
    program, _ = CPU.program([F.local_response_norm(x, 5).node])
    source = tmp_path / "program.c"
    source.write_text(program.source)
    report = subprocess.run([GCC.command, *GCC.flags, "-fopt-info-vec-optimized", "-o",
                             str(tmp_path / "p.so"), str(source)], capture_output=True, text=True).stderr
    assert "loop vectorized" in report, report


def test_kernels_differing_only_in_their_buffers_render_as_one_function() -> None:
    x, y = (tg.tensor(np.full((8, 16), v, np.float32)) for v in (1.0, 2.0))
    schedule = schedule_kernels([(x * 2 + 1).exp().node, (y * 2 + 1).exp().node])
    source = CpuRenderer.render_program(schedule.kernels, [b.name for b in schedule.buffers])
    assert len(schedule.kernels) == 2
    assert len(re.findall(r"^TG_KERNEL void \w+\(.*\) \{$", source, re.MULTILINE)) == 1
    entry = source.split("int tg_program")[1]
    assert len(re.findall(r"^    k\w+\(", entry, re.MULTILINE)) == 2


STREAMING_CASES = {  # (function, input shape, dtype): outputs written once, rows not a whole number of lines
    "transpose": (lambda t: t.T.contiguous(), (64, 96), np.float32),
    "softmax rows": (lambda t: F.softmax(t, -1), (12, 1000), np.float32),
    "elementwise": (lambda t: t * 3 + 1, (1001,), np.float64),
    "half precision": (lambda t: (t * 3).exp(), (7, 203), np.float16),
    "bytes": (lambda t: (t * 3).to(tg.int8), (5, 300), np.float32),
    "column sums": (lambda t: t.sum(0), (40, 1000), np.float32),  # each thread's block of 500 columns
}


def compiled_program(node, stream_min_bytes: int, monkeypatch):
    """A freshly compiled program for `node` (not one cached by another test) streaming outputs that large, in
    runs of any length."""
    monkeypatch.setattr(cpu_renderer, "STREAM_MIN_BYTES", stream_min_bytes)
    monkeypatch.setattr(cpu_renderer, "STREAM_MAX_RUN_BYTES", 1 << 62)
    monkeypatch.setattr(CPU, "_programs", type(CPU._programs)())
    return CPU.program([node])[0]


@pytest.mark.parametrize("case", sorted(STREAMING_CASES))
def test_streaming_stores_give_the_same_results_at_every_output_alignment(case, monkeypatch) -> None:
    fn, shape, dtype = STREAMING_CASES[case]
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    plain = compiled_program(fn(tg.tensor(x)).node, 1 << 62, monkeypatch)
    assert "tg_stream" not in plain.source.split("#define TG_KERNEL")[1]
    (expected,) = plain.run([x])
    program = compiled_program(fn(tg.tensor(x)).node, 0, monkeypatch)
    assert "tg_stream_line(" in program.source and program.source.count("tg_stream_fence();") >= 1
    library = compiler.load(program.source, GCC)
    for offset in (0, expected.itemsize, 16, 64 - expected.itemsize):  # bytes past a cache line boundary
        raw = np.zeros(expected.nbytes + 128, np.uint8)
        start = -raw.ctypes.data % 64 + offset
        out = raw[start:start + expected.nbytes].view(expected.dtype)
        pointers = (ctypes.c_void_p * 2)(x.ctypes.data, out.ctypes.data)
        assert library.tg_program(pointers) == 0
        np.testing.assert_array_equal(out.reshape(expected.shape), expected, err_msg=f"{case}, offset {offset}")
        assert not raw[:start].any() and not raw[start + expected.nbytes:].any()  # nothing written outside


def test_outputs_read_back_or_small_are_not_streamed(monkeypatch) -> None:
    x = tg.tensor(np.ones((64, 512), np.float32))
    monkeypatch.setattr(cpu_renderer, "STREAM_MIN_BYTES", 0)
    (running_sums,) = schedule_kernels([x.cumsum(1).node]).kernels  # each sum reads the one before it back
    assert not cpu_renderer.streamed_buffers(running_sums)
    monkeypatch.setattr(cpu_renderer, "STREAM_MIN_BYTES", 64 * 512 * 4 + 1)
    (copy,) = schedule_kernels([(x * 2).node]).kernels
    assert not cpu_renderer.streamed_buffers(copy)  # smaller than the cache: the next kernel may find it there
    monkeypatch.setattr(cpu_renderer, "STREAM_MIN_BYTES", 64 * 512 * 4)
    assert cpu_renderer.streamed_buffers(copy) == {copy.buffers[-1].name}


def test_only_short_runs_of_stores_are_streamed(monkeypatch) -> None:
    monkeypatch.setattr(cpu_renderer, "STREAM_MIN_BYTES", 0)
    x = tg.tensor(np.ones((64, 512), np.float32))
    for result, streams in ((x.T.contiguous(), True), (x * 2, False)):  # tile rows of 128 bytes; rows of 2 KiB
        schedule = schedule_kernels([result.node])
        source = CpuRenderer.render_program(schedule.kernels, [b.name for b in schedule.buffers])
        kernels = source.split("#define TG_KERNEL")[1]
        assert ("tg_stream_line(" in kernels) == streams, kernels


def test_gemm_call_passes_the_epilogue_activation_and_both_prologues_last() -> None:
    """tg_gemm_f32's last three arguments (gemm.h): activation, a_prologue, b_prologue, as gemm.ACTIVATIONS codes;
    a bias at an offset into its buffer is passed as a moved pointer."""
    epilogue = GemmEpilogue(bias="bias", bias_strides=(0, 0, 1), activation="relu", bias_offset=10)
    call = GemmCall(1, 4, 5, 6, "a", (0, 6, 1), "b", (0, 1, 6), "c", (0, 5), epilogue, a_prologue="gelu_tanh",
                    b_prologue="relu")
    codes = gemm.ACTIVATIONS
    rendered = cpu_renderer.gemm_call(call, {"a": "A", "b": "B", "c": "C", "bias": "BIAS"})
    assert rendered.endswith(f"{codes['relu']}, {codes['gelu_tanh']}, {codes['relu']});"), rendered
    assert "BIAS + 10, 0, 0, 1," in rendered
    assert "= gemm[1x4x5x6](gelu_tanh(a)[0, 6, 1], relu(b)[0, 1, 6])" in repr(call)


def test_grid_axis_0_runs_on_openmp_threads_inner_axes_in_order_and_the_base_renders_no_pragma() -> None:
    i, j = ix.Var("i", 4), ix.Var("j", 8)
    store = Store("out", i * 8 + j, Lit(1.0, dtypes.float32))
    kernel = Kernel("k", [KernelParam("out", dtypes.float32, 32, True)],
                    [Loop(i, [Loop(j, [store], ParallelAxis(1, 32))], ParallelAxis(0, cpu_renderer.PARALLEL_MIN_WORK))])
    cpu = CpuRenderer(kernel).render()
    assert cpu.count("#pragma omp parallel for") == 1 and cpu.index("#pragma") < cpu.index("for (int64_t i ")
    assert "#pragma" not in CStyleRenderer(kernel).render()


def test_threads_start_only_for_enough_work_and_with_sizes_at_run_time_the_work_is_compared_there() -> None:
    i, least = ix.Var("i", 4), cpu_renderer.PARALLEL_MIN_WORK

    def kernel(work: int) -> Kernel:
        return Kernel("k", [KernelParam("out", dtypes.float32, 4, True)],
                      [Loop(i, [Store("out", i, Lit(1.0, dtypes.float32))], ParallelAxis(0, work))])

    assert [CpuRenderer(kernel(w)).render().count("#pragma omp") for w in (least - 1, least)] == [0, 1]
    small, large = (CpuRenderer(kernel(w), sizes_at_run_time=True).render() for w in (least - 1, least))
    assert small.replace(f"if ({least - 1} ", "if (WORK ") == large.replace(f"if ({least} ", "if (WORK ")  # one text
    assert f"if ({least} >= {least}) {{" in large and large.count("#pragma omp parallel for") == 1
    assert large.count("for (int64_t i = 0; i < 4; i++)") == 2  # on threads, else on the calling thread alone
