"""The cpu backend against the numpy reference: values (NaN/Inf included), dtypes, errors, fusion counts.

Each test evaluates several outputs in one program (one compile) and names the
output that differs. Inputs come from fixed seeds.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import signal
import subprocess
import sys
import threading
from typing import Callable

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU, CPU_TARGET
from tensorgraphs.backends.native import NativeBackend
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.runtime import host
from tensorgraphs.schedule import count_kernels

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included

SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 1e30, -1e30, 0.5, -2.5, 3.0], np.float32)


def floats(shape: tuple[int, ...], seed: int = 0, specials: bool = True) -> np.ndarray:
    values = np.random.default_rng(seed).normal(0, 3, shape).astype(np.float32)
    if specials:
        flat = values.reshape(-1)
        flat[: min(flat.size, SPECIALS.size)] = SPECIALS[: flat.size]
    return values


def ints(shape: tuple[int, ...], dtype: str, seed: int = 0, low: int = -50, high: int = 50) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, high, shape).astype(dtype)


def compare(build: Callable[..., dict[str, Tensor]], *arrays: np.ndarray, rtol: float = 2e-6,
            atol: float = 1e-6) -> None:
    """Build the outputs twice from fresh tensors, evaluate on the numpy device (the reference) and on cpu, compare
    each by name."""
    with tg.device("numpy"):
        expected = {k: v.numpy() for k, v in build(*[tg.tensor(a) for a in arrays]).items()}
    with tg.device("cpu"):
        outputs = build(*[tg.tensor(a) for a in arrays])
        got = dict(zip(outputs, tg_realize(list(outputs.values()))))
    for name, want in expected.items():
        have = got[name]
        assert have.dtype == want.dtype and have.shape == want.shape, (name, have.dtype, have.shape, want.dtype)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(have, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=name)
        else:
            np.testing.assert_array_equal(have, want, err_msg=name)


def tg_realize(tensors: list[Tensor]) -> list[np.ndarray]:
    """All outputs in one evaluation (one program), as the user's dtypes."""
    values = CPU.evaluate([t.node for t in tensors])
    return [v.astype(t.dtype.storage, copy=False) for v, t in zip(values, tensors)]


def test_float_unary_ops_with_specials() -> None:
    compare(lambda x: {
        "exp": x.exp(), "exp2": tg.exp2(x), "log": x.abs().log(), "log2": tg.log2(x), "sqrt": x.sqrt(),
        "sin": x.sin(), "cos": x.cos(), "tanh": x.tanh(), "sigmoid": x.sigmoid(), "neg": -x, "abs": x.abs(),
        "recip": x.reciprocal(), "floor": x.floor(), "ceil": x.ceil(), "trunc": x.trunc(), "round": x.round(),
        "relu": F.relu(x), "erf": tg.erf(x),
    }, floats((6, 37)), rtol=3e-6, atol=2e-6)


def test_float_binary_ops_broadcast() -> None:
    compare(lambda a, b: {
        "add": a + b, "sub": a - b, "mul": a * b, "div": a / b, "max": tg.maximum(a, b), "min": tg.minimum(a, b),
        "lt": a < b, "ne": a != b, "eq": a == b, "ge": a >= b, "where": tg.where(a > 0, a, b),
        "pow": tg.pow(a.abs(), b.clamp(-3, 3)), "floordiv": tg.floor_divide(a, b), "rem": tg.remainder(a, b),
    }, floats((5, 1, 7), 1), floats((4, 7), 2, specials=False))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64"])
def test_integer_ops_wrap_floor_divide_and_modulo(dtype: str) -> None:
    low = 0 if dtype == "uint8" else -100
    a, b = ints((9, 11), dtype, 3, low, 100), ints((9, 11), dtype, 4, low, 100)
    b[0, :3] = 0  # division by zero gives 0
    compare(lambda x, y: {
        "add": x + y, "mul": x * y * y, "sub": x - y, "floordiv": tg.floor_divide(x, y), "rem": tg.remainder(x, y),
        "and": x & y, "or": x | y, "xor": x ^ y, "max": tg.maximum(x, y), "lt": x < y, "sum": x.sum(1),
        "amax": x.amax(0), "float": x.to(tg.float32) / 3,
    }, a, b)


def test_int64_extremes() -> None:
    big = np.array([2**63 - 1, -(2**63), -1, 7, -7], np.int64)
    compare(lambda x: {"add": x + 1, "mul": x * 3, "div": tg.floor_divide(x, -1), "mod": tg.remainder(x, -3),
                       "neg": -x}, big)


def test_casts_of_nan_inf_and_out_of_range() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 300.7, -300.7, 1e20, -1e20, 2.9, -2.9, 0.0, 127.5, 255.5], np.float32)
    compare(lambda t: {name: t.to(getattr(tg, name)) for name in
                       ("int8", "uint8", "int16", "int32", "int64", "bool", "float16", "bfloat16", "float64")}, x)


def test_a_round_trip_through_integers_gives_positive_zero() -> None:
    """x in (-1, 0] converts to the integer 0 and back to +0.0; gcc's -fno-trapping-math folds the round trip into
    trunc(x), -0.0 there (`tg_opaque_zero` in c_preamble.h keeps it off), so 1 / it must be +inf."""
    x = np.array([-0.0, -0.5, -0.99, 0.5, -1.5, 2.5], np.float32)
    compare(lambda t: {name: 1 / t.to(getattr(tg, name)).float() for name in ("int64", "int32", "int8", "uint8")}, x)


def test_half_and_bfloat16_chains_round_like_the_reference() -> None:
    x = floats((3, 40), 5, specials=False)
    compare(lambda t: {
        "f16": ((t.half() * 1.7 + 0.3).exp() / 3).sum(1), "bf16": (t.bfloat16() * 1.7 + 0.1).sin() * 2,
        "f16max": t.half().amax(1), "bf16sum": t.bfloat16().sum(0),
    }, x, rtol=2e-2, atol=2e-2)


def test_reductions_long_short_and_full() -> None:
    x = floats((3, 70, 33), 6)
    x[1] = np.abs(x[1])  # a slice without NaN: sums and maxima are finite there
    big = np.random.default_rng(7).normal(size=(1 << 16) + 64 * 3).astype(np.float32)
    rows = floats((40, 64), 8)
    compare(lambda t, b, r: {
        "sum_last": t.sum(-1), "sum_mid": t.sum(1), "amax_first": t.amax(0), "mean_all": t[1].mean(),
        "amax_two": t.amax((0, 2)), "sum_keep": t.sum(1, keepdim=True), "big_sum": b.sum(), "big_max": b.amax(),
        "var": t[1].var(0), "any": (t > 2).any(1), "all": (t > -100).all(), "rows_sum": r.sum(0),
        "rows_max": r.amax(0, keepdim=True), "rows_int": r.to(tg.int64).sum(0), "rows_min": r[4:].amin(0),
    }, x, big, rows, rtol=1e-5, atol=1e-4)


def test_movement_ops_are_index_expressions() -> None:
    x = floats((4, 6, 5), 8, specials=False)
    compare(lambda t: {
        "permute": t.permute(2, 0, 1) + 1, "transpose_copy": t.transpose(0, 2).contiguous(),
        "reshape": t.reshape(6, 20) * 2, "expand": t[:, :1].expand(4, 6, 5) + t, "flip": t.flip((0, 2)),
        "pad": mv.pad(t, (1, 2, 0, 3)), "slice_step": t[1:, ::2, 3:], "cat": tg.cat([t, t * 2], 1),
        "stack": tg.stack([t, -t], 0), "roll": t.roll(2, 1), "tril": t[0].tril(), "flatten": t.flatten(1).sum(1),
        "reshape_transpose": t.reshape(24, 5).T.reshape(5, 4, 6) - 1,
    }, x)


@pytest.mark.parametrize("shape", [(3, 48, 80), (3, 37, 50)], ids=["whole tiles", "edge rows and columns"])
@pytest.mark.parametrize("dtype", ["bool", "int8", "float16", "int32", "float32", "float64", "int64"])
def test_tiled_transposes_of_every_element_width(dtype: str, shape: tuple[int, ...]) -> None:
    """Transposes in 16 x 16 tiles (transposed in registers for 1-, 2-, 4- and 8-byte elements), also batched, from a
    slice, and with an elementwise op fused into the tile's loads; sizes that are not multiples of 16 end in
    plain loops."""
    x = ints(shape, "int64", 14).astype(dtype)
    compare(lambda t: {
        "transpose": t[0].T.contiguous(), "batched": t.transpose(1, 2).contiguous(),
        "sliced": t[1, 16:, 16:].T.contiguous(), "fused": (t.transpose(1, 2) * 2).contiguous(),
    }, x)


def test_gather_scatter_add_and_index_errors() -> None:
    x = floats((5, 8), 9, specials=False)
    index = np.random.default_rng(10).integers(0, 5, (3, 8)).astype(np.int64)
    compare(lambda t, i: {
        "gather": t.gather(0, i), "scatter_add": tg.zeros(5, 8).scatter_add(0, i, t[:3] * 2),
        "index_select": t.index_select(1, i[0, :4]), "embedding_like": t[i[0]],
    }, x, index)
    with tg.device("cpu"):
        bad = tg.tensor(np.array([[0, 9]], np.int64))
        with pytest.raises(IndexError):
            tg.tensor(x[:1, :2]).gather(1, bad).numpy()


def test_matmul_linear_relu_and_random_match() -> None:
    a, w, bias = floats((6, 9), 11, False), floats((7, 9), 12, False), floats((7,), 13, False)
    compare(lambda x, y, z: {
        "matmul": x @ y.T, "linear_relu": F.relu(F.linear(x, y, z)),
        "bmm": tg.bmm(x.reshape(2, 3, 9), y[:6].reshape(2, 9, 3)),
    }, a, w, bias, rtol=1e-5, atol=1e-5)
    tg.manual_seed(3)
    with tg.device("numpy"):
        expected = (tg.rand(5, 6) + tg.randn(5, 6)).numpy()
    tg.manual_seed(3)
    with tg.device("cpu"):
        got = (tg.rand(5, 6) + tg.randn(5, 6)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_scalars_zero_dim_and_empty() -> None:
    compare(lambda x, e: {"scalar": x.sum() * 2 + 1, "zero_dim": x[0, 0] + 3, "empty": e * 2, "empty_sum": e.sum(0),
                          "const": tg.full((2, 3), 1.5) + x[:2, :3], "arange": tg.arange(7) * 3,
                          "cat_empty": tg.cat([e, x[:2, :3]]), "inner_size_0": x[:, :0] @ e},
            floats((3, 4), 14, False), np.zeros((0, 3), np.float32))


def test_composites_softmax_layer_norm_gelu() -> None:
    x, w, b = floats((6, 50), 15, False), floats((50,), 16, False), floats((50,), 17, False)
    compare(lambda t, g, c: {
        "softmax": F.softmax(t, -1), "log_softmax": F.log_softmax(t, 1), "softmax0": F.softmax(t, 0),
        "layer_norm": F.layer_norm(t, (50,), g, c), "gelu_tanh": F.gelu(t * g + c, approximate="tanh"),
        "gelu": F.gelu(t),
    }, x, w, b, rtol=1e-5, atol=1e-5)


def fused(build: Callable[[Tensor], Tensor], *shapes: tuple[int, ...]) -> int:
    tensors = [tg.tensor(floats(s, i, False)) for i, s in enumerate(shapes)]
    return count_kernels([build(*tensors).node])


def test_kernel_counts() -> None:
    assert fused(lambda x, a, b: F.gelu(x * a + b, approximate="tanh"), (64, 32), (32,), (32,)) == 1
    assert fused(lambda x: F.softmax(x, -1), (64, 32)) <= 2
    assert fused(lambda x, g, b: F.layer_norm(x, (32,), g, b), (64, 32), (32,), (32,)) <= 2
    assert fused(lambda x: (x * 2 + 1).exp().sum(1), (64, 32)) == 1  # producer fused into the reduction
    assert fused(lambda x: x - x.mean(0), (64, 32)) == 2  # a column mean feeding rows: materialized


def test_same_structure_new_data_reuses_the_program() -> None:
    build = lambda a: (a * 3 - 1).exp().sum(0)  # noqa: E731
    with tg.device("cpu"):
        first = build(tg.tensor(floats((4, 5), 18))).numpy()
        programs = len(CPU._programs)
        second = build(tg.tensor(floats((4, 5), 19))).numpy()
        assert len(CPU._programs) == programs
    assert not np.array_equal(first, second, equal_nan=True)


@pytest.mark.parametrize("size", [1, 31, 33, 1000])
def test_reduction_lane_split_boundaries(size: int) -> None:
    compare(lambda t: {"sum": t.sum(-1), "max": t.amax(-1), "min": t.amin(-1)}, floats((2, size), size),
            rtol=1e-5, atol=1e-5)


def test_nan_propagates_through_max_in_every_lane() -> None:
    for position in (0, 5, 16, 40, 47):
        x = np.arange(48, dtype=np.float32)
        x[position] = np.nan
        with tg.device("cpu"):
            assert math.isnan(tg.tensor(x).amax().item()), position


@pytest.fixture
def own_output_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool of output blocks of the test's own: blocks of the same size that earlier tests' results still hold
    would fill the shared pool's places (it keeps two per size, more only for runs that take more at once)."""
    monkeypatch.setattr(host, "OUTPUT_BLOCKS", host.BlockPool())


@pytest.mark.usefixtures("own_output_pool")
def test_large_outputs_are_recycled_only_after_the_caller_drops_them() -> None:
    x = np.ones((512, 512), np.float32)
    program, _ = CPU.program([(tg.tensor(x) * 2).node])
    first = program.run([x])[0]
    address = first.ctypes.data
    kept = program.run([x])[0]  # `first` is still alive: a new array
    assert kept.ctypes.data != address
    del first
    again = program.run([x * 3])[0]
    assert again.ctypes.data == address and again[0, 0] == 6 and kept[0, 0] == 2


@pytest.mark.usefixtures("own_output_pool")
def test_every_large_output_of_a_run_is_recycled_though_more_than_the_pool_keeps_per_size() -> None:
    """Three outputs of one size (as an attention backward's dq, dk and dv): all three blocks come back at the next
    run once dropped, not two of them and a fresh one (page faults at every run)."""
    x = np.ones((512, 512), np.float32)
    t = tg.tensor(x)
    program, _ = CPU.program([(t * 2).node, (t + 1).node, (t - 1).node])
    addresses = {out.ctypes.data for out in program.run([x])}
    again = program.run([x * 3])
    assert {out.ctypes.data for out in again} == addresses and [out[0, 0] for out in again] == [6, 4, 2]


def test_realized_nodes_that_only_a_decomposition_builds_are_not_inputs() -> None:
    """A constant inside erf's decomposition that was realized earlier must not change the program's inputs."""
    from tensorgraphs.graph.composite import decompose
    from tensorgraphs.graph.node import toposort

    values = floats((4,), 20, False)
    node = tg.erf(tg.tensor(values)).node
    constants = [n for n in toposort([decompose(node)]) if n.op.name == "CONST"]
    known = {n: np.full(n.shape, n.arg, n.dtype.storage) for n in constants}
    assert constants
    with tg.device("numpy"):
        expected = tg.erf(tg.tensor(values)).numpy()
    np.testing.assert_allclose(CPU.evaluate([node], known)[0], expected, rtol=1e-6, atol=1e-7)


def test_small_graphs_are_interpreted_and_large_ones_compiled() -> None:
    backend = NativeBackend("cpu", CPU_TARGET, interpret_below=10_000)
    small, large = (tg.tensor(np.linspace(-3, 3, n, dtype=np.float32)) for n in (100, 20_000))
    for x, programs in ((small, 0), (large, 1)):
        (value,) = backend.evaluate([(x * 2 + 1).exp().node])
        np.testing.assert_allclose(value, np.exp(x.numpy() * 2 + 1), rtol=1e-5)
        assert len(backend._programs) == programs


def test_the_default_device_is_cpu_where_a_compiler_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorgraphs.backends.cpu import driver
    from tensorgraphs.runtime import realize

    assert realize._initial_device() == ("cpu" if driver.GCC.available() else "numpy")
    realize._initial_device.cache_clear()
    monkeypatch.setattr(driver, "GCC", dataclasses.replace(driver.GCC, command="no-such-compiler-tg"))
    try:
        assert realize._initial_device() == "numpy"
    finally:
        realize._initial_device.cache_clear()


@pytest.mark.usefixtures("own_output_pool")
def test_the_block_small_outputs_share_is_recycled_once_all_are_dropped() -> None:
    """Two 40 KiB outputs share one block (80 KiB: malloc may map such a block afresh, page faults and all), which
    the next run gets again once neither is referenced, and not while one is."""
    x = np.ones((100, 100), np.float32)
    t = tg.tensor(x)
    program, _ = CPU.program([(t * 2).node, (t + 1).node])
    doubled, plus_one = program.run([x])
    assert doubled.base is plus_one.base and doubled.base in host.OUTPUT_BLOCKS
    address = doubled.ctypes.data
    kept = program.run([x])[1]  # the first run's outputs still alive: another block
    assert address not in (kept.ctypes.data, program.run([x])[0].ctypes.data)
    del doubled, plus_one
    again = program.run([x * 3])
    assert again[0].ctypes.data == address and again[0][0, 0] == 6 and again[1][0, 0] == 4 and kept[0, 0] == 2


@pytest.mark.usefixtures("own_output_pool")
def test_a_new_program_reuses_the_memory_of_dropped_outputs() -> None:
    """A first call's outputs come from blocks earlier calls of any program let go: no fresh pages to fault in."""
    x = np.ones((512, 512), np.float32)
    doubled, = CPU.program([(tg.tensor(x) * 2).node])[0].run([x])
    address = doubled.ctypes.data
    del doubled
    (tripled,) = CPU.program([(tg.tensor(x) * 3).node])[0].run([x])
    assert tripled.ctypes.data == address and tripled[0, 0] == 3


@pytest.mark.usefixtures("own_output_pool")
def test_outputs_start_on_a_cache_line_and_a_kept_view_is_never_recycled() -> None:
    x = floats((512, 1024), specials=False)  # 2 MiB outputs: recycled by the program once dropped
    program, _ = CPU.program([(tg.tensor(x) * 2).node])
    (first,) = program.run([x])
    kept, expected = first[3], x[3] * 2
    del first
    for _ in range(3):
        (other,) = program.run([x + 1])
        assert other.ctypes.data % 64 == 0
        assert not other.ctypes.data <= kept.ctypes.data < other.ctypes.data + other.nbytes
        del other
    np.testing.assert_array_equal(kept, expected)


def test_one_program_runs_safely_from_several_threads() -> None:
    """Runs share the program's arena: concurrent calls take turns instead of overwriting each other's temporaries."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(0)
    step = tg.compile(lambda x: (F.softmax(x * 2.0, -1) @ x.T).exp().sum(-1))
    inputs = [rng.standard_normal((64, 256)).astype(np.float32) for _ in range(8)]
    with tg.device("numpy"):
        expected = [step.fn(tg.tensor(x)).numpy() for x in inputs]
    step(tg.tensor(inputs[0]))  # traced once, before the threads
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            got = list(pool.map(lambda x: step(tg.tensor(x)).numpy(), inputs))
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g, e, rtol=1e-4)


INTERRUPTED_RUN = """
import os, signal, sys
import numpy as np
import tensorgraphs as tg
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.runtime.realize import placeholder

x = placeholder(tg.float32, (4096,))
program, _ = CPU.program([(tg.Tensor(x) + 1).node], {x: None})
start = np.zeros(4096, np.float32)
print("running", flush=True)
try:
    program.run_steps([start], 1 << 62, set(), {0: 0})  # x += 1 for ever, in one native call
    print("finished")
except KeyboardInterrupt:
    print("interrupted")
print("after", program.run_steps([start], 1000, set(), {0: 0})[0][:2].tolist())
try:
    os.kill(os.getpid(), signal.SIGINT)  # outside a run: Python's own handler again
    signal.pause()
except KeyboardInterrupt:
    print("interrupted outside")
"""


def test_ctrl_c_stops_a_native_call_and_the_program_runs_again(tmp_path: pathlib.Path) -> None:
    """One SIGINT ends a native call that would run for ever with KeyboardInterrupt; the program runs correctly
    afterwards and later SIGINTs reach Python as before."""
    child = subprocess.Popen([sys.executable, "-c", INTERRUPTED_RUN], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert child.stdout is not None and child.stdout.readline() == "running\n"
        threading.Event().wait(1.0)  # let it enter the native call (a signal before it is handled by Python)
        child.send_signal(signal.SIGINT)
        output, _ = child.communicate(timeout=300)  # a guard only: without the fix it never ends
    finally:
        child.kill()
    assert output.splitlines() == ["interrupted", "after [1000.0, 1000.0]", "interrupted outside"]
    assert child.returncode == 0


def test_small_outputs_share_one_block_and_tiny_ones_are_kept_apart() -> None:
    """A run's small outputs are views of one allocation (one allocation per run, not per output); an output
    below `HostRuntime.OWN_ALLOCATION_BYTES` (a loss) has its own, so keeping it keeps no block of a step."""
    from tensorgraphs.backends.native import Program
    from tensorgraphs.runtime.realize import placeholder
    from tensorgraphs.schedule.fusion import schedule_kernels

    x, y = placeholder(tg.float32, (16, 8)), placeholder(tg.float32, (16, 8))
    tx, ty = Tensor(x), Tensor(y)
    roots = [(tx + ty).node, (tx * ty).node, (tx - ty).sum().node, (tx * 2.0).node]
    program = Program(schedule_kernels(roots, {x, y}.__contains__), [x, y], CPU_TARGET)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((16, 8)).astype(np.float32) for _ in range(2))
    total, product, difference, doubled = program.run([a, b])

    np.testing.assert_allclose(total, a + b)
    np.testing.assert_allclose(product, a * b)
    np.testing.assert_allclose(difference, (a - b).sum(), rtol=1e-5)
    np.testing.assert_allclose(doubled, a * 2)
    assert total.base is not None and total.base is product.base is doubled.base
    assert not np.shares_memory(difference, total.base)
    assert all(array.ctypes.data % 64 == 0 for array in (total, product, doubled))
