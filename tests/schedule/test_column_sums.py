"""Reductions over leading rows (every bias gradient's `grad.sum(0)`): values against float64 numpy and torch on the
compiled cpu device, and the loop structure that makes them run at memory speed on every thread (rows read
contiguously, the innermost loop along the kept columns, column blocks shared by threads), so it cannot silently
regress to walking each column with a stride of a row."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs import dtypes
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.backends.cpu.driver import GCC
from tensorgraphs.codegen import index as ix
from tensorgraphs.codegen.loop_ir import Load, Local, Loop, walk
from tensorgraphs.schedule import schedule_kernels
from tensorgraphs.schedule.lower import ROW_CHUNK, ROW_CHUNK_MIN_ROWS

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included


def _ulps_off(ours: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """How many float32 ulps of the exact result `ours` is from it."""
    return np.abs(ours.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)


@pytest.mark.parametrize(
    "shape, dims",
    [
        ((700, 1000), 0),  # the LSTM LM decoder's bias gradient: 1000 columns, no power-of-two block
        ((1024, 768), 0),
        ((8 * 128, 1024), 0),
        ((4, 64, 48), (0, 1)),  # several leading dims
        ((8, 128, 256), (0, 1)),  # a layer norm's weight gradient: 256 columns, rows in whole chunks
        ((1001, 256), 0),  # rows past the last chunk of ROW_CHUNK
        ((300, 1009), 0),  # a prime column count: one block of all of them
        ((300, 1031), 0),  # a prime above ROW_BLOCK_MAX: no block, columns reduced one by one
        ((517, 33), 0),  # odd rows and columns
        ((13, 999), 0),
        ((7, 256), 0),  # fewer rows than a chunk
        ((8, 256), 0),  # one chunk
        ((96, 40), 0),
    ],
)
def test_column_sums_are_within_an_ulp_of_the_exact_sum_and_no_worse_than_torch(
    shape: tuple[int, ...], dims: int | tuple[int, ...]
) -> None:
    rng = np.random.default_rng(sum(shape))
    a = (1 + rng.standard_normal(shape)).astype(np.float32)  # an offset: float32 partial sums drift
    exact = a.astype(np.float64).sum(dims)
    ours = tg.tensor(a).sum(dims).numpy()
    theirs = torch.from_numpy(a).sum(dims).numpy()
    assert ours.dtype == np.float32 and ours.shape == exact.shape
    assert _ulps_off(ours, exact).max() <= 1  # summed in double, rounded once
    assert _ulps_off(ours, exact).max() <= max(_ulps_off(theirs, exact).max(), 0.5)


def test_mean_over_leading_dims_with_keepdim_matches_torch() -> None:
    a = np.random.default_rng(1).standard_normal((6, 50, 128)).astype(np.float32)
    ours = tg.tensor(a).mean((0, 1), keepdim=True).numpy()
    expected = torch.from_numpy(a).double().mean((0, 1), keepdim=True).numpy()
    assert ours.shape == (1, 1, 128)
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-7)


def test_a_middle_axis_sum_keeps_the_outer_axis_and_the_columns() -> None:
    a = np.random.default_rng(2).standard_normal((3, 200, 96)).astype(np.float32)
    ours = tg.tensor(a).sum(1, keepdim=True).numpy()
    np.testing.assert_allclose(ours, a.astype(np.float64).sum(1, keepdims=True), rtol=1e-6, atol=1e-5)


def test_nan_and_inf_propagate_column_by_column() -> None:
    a = np.random.default_rng(3).standard_normal((67, 256)).astype(np.float32)  # 8 chunks of 8 rows, 3 rows past
    a[0, 0], a[7, 1], a[65, 2] = np.nan, np.nan, np.nan  # a chunk's first row, its last, a row past the chunks
    a[3, 3], a[8, 4], a[9, 4], a[66, 5], a[64, 6] = np.inf, np.inf, -np.inf, -np.inf, np.inf
    a[1, 7], a[2, 7] = 3e38, 3e38  # overflows float32, as torch's sum does
    for reduce in ("sum", "amax"):
        ours = getattr(tg.tensor(a), reduce)(0).numpy()
        expected = getattr(torch.from_numpy(a), reduce)(0).numpy()
        np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("shape", [(0, 64), (0, 256), (1, 256), (1, 1000), (64, 1), (33, 0)])
def test_empty_and_unit_dims(shape: tuple[int, int]) -> None:
    a = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(tg.tensor(a).sum(0).numpy(), a.astype(np.float64).sum(0), rtol=1e-6, atol=1e-6)


def test_non_contiguous_and_fused_inputs() -> None:
    a = np.random.default_rng(5).standard_normal((256, 96)).astype(np.float32)
    t = tg.tensor(a)
    np.testing.assert_allclose(t.T.sum(0).numpy(), a.astype(np.float64).sum(1), rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(
        t[::2, 1::3].sum(0).numpy(), a[::2, 1::3].astype(np.float64).sum(0), rtol=1e-6, atol=1e-5
    )
    np.testing.assert_allclose((t * 2 + 1).sum(0).numpy(), (2 * a.astype(np.float64) + 1).sum(0), rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(t[:1].expand(600, 96).sum(0).numpy(), 600 * a[0].astype(np.float64), rtol=1e-6)


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a[::2, ::4],  # (300, 256): every other row, every 4th column
        lambda a: a[1::3, 5:261],  # (200, 256) from an offset
        lambda a: a.T[:256].T,  # (600, 256) through a transpose
    ],
)
def test_strided_views_of_256_columns(view) -> None:
    a = (1 + np.random.default_rng(7).standard_normal((600, 1024))).astype(np.float32)
    exact = np.asarray(view(a), np.float64).sum(0)
    ours = view(tg.tensor(a)).sum(0).numpy()
    assert ours.shape == exact.shape == (256,)
    assert _ulps_off(ours, exact).max() <= 1


def test_integer_column_sums_stay_exact() -> None:
    a = np.random.default_rng(6).integers(-1000, 1000, (300, 64)).astype(np.int64)
    np.testing.assert_array_equal(tg.tensor(a).sum(0).numpy(), a.sum(0))


@pytest.mark.parametrize(
    "shape, dims, threads, blocks",
    [
        ((700, 1000), 0, 1, 1),  # one thread: one block of the whole row, read row after row
        ((700, 1000), 0, 2, 2),  # one block of 500 columns per thread
        ((1024, 256), 0, 1, 1),
        ((1024, 256), 0, 2, 2),
        ((1024, 256), 0, 4, 4),
        ((64, 256), 0, 2, 1),  # too little work for a second thread
        ((1024, 2048), 0, 1, 2),  # blocks of ROW_BLOCK_MAX columns
        ((8, 128, 256), (0, 1), 2, 2),
        ((4, 64, 48), (0, 1), 2, 1),
    ],
)
def test_column_sums_read_rows_contiguously_in_a_column_block_per_thread(
    shape: tuple[int, ...], dims: int | tuple[int, ...], threads: int, blocks: int, monkeypatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))  # the OpenMP team the program would run on
    (kernel,) = schedule_kernels([tg.tensor(np.zeros(shape, np.float32)).sum(dims).node]).kernels
    (outer,) = [s for s in kernel.body if isinstance(s, Loop)]
    assert outer.var.name.startswith("blk") and outer.var.extent == blocks and outer.parallel is not None
    assert outer.parallel.work == np.prod(shape)  # the target splits it across threads from this work
    accumulators = {s.name: s.dtype for s in walk(outer.body) if isinstance(s, Local)}
    assert dtypes.float64 in accumulators.values()  # float32 sums end in double
    loops = [s for s in walk(outer.body) if isinstance(s, Loop)]
    reads = [(loop, s) for loop in loops for s in loop.body if isinstance(s, Load) and s.buffer not in accumulators]
    assert reads and len(reads) == len(
        [s for s in walk(outer.body) if isinstance(s, Load) and s.buffer not in accumulators]
    )
    for loop, load in reads:  # columns innermost and contiguous, every enclosing row loop a whole row apart
        assert loop.var.name.startswith("t") and ix.stride(load.index, loop.var) == 1
        rows = [r for r in loops if r.var.name.startswith("r") and load in walk(r.body)]
        assert rows and all(ix.stride(load.index, r.var) % shape[-1] == 0 for r in rows)


@pytest.mark.parametrize(
    "shape, dims, reading_loops",
    [
        ((1001, 256), 0, [0, 1, 0, 1, 0]),  # init, a chunk's rows, flush, the row past the chunks, store
        ((8, 128, 256), (0, 1), [0, 1, 0, 0]),  # a layer norm's weight gradient: 1024 rows, 128 in the inner axis
    ],
)
def test_float_rows_are_summed_in_chunks_by_one_loop_over_rows(
    shape: tuple[int, ...], dims: int | tuple[int, ...], reading_loops: list[int]
) -> None:
    """Every row of a chunk is added to part[j] by the same loop (one stream per input, which the prefetcher
    follows), and one pass adds part[j] to acc[j] in double and zeroes it: no pass that only zeroes part."""
    (kernel,) = schedule_kernels([tg.tensor(np.zeros(shape, np.float32)).sum(dims).node]).kernels
    locals_ = {s.name: s.dtype for s in walk(kernel.body) if isinstance(s, Local)}
    assert sorted(locals_.values(), key=str) == [dtypes.float32, dtypes.float64]
    column_loops = [s for s in walk(kernel.body) if isinstance(s, Loop) and s.var.name.startswith("t")]
    sources = [[s for s in loop.body if isinstance(s, Load) and s.buffer not in locals_] for loop in column_loops]
    assert [len(s) for s in sources] == reading_loops
    (chunk_rows,) = [r for r in walk(kernel.body) if isinstance(r, Loop) and column_loops[1] in r.body]
    assert chunk_rows.var.extent == ROW_CHUNK


def test_sums_of_few_rows_add_each_row_in_double() -> None:
    (kernel,) = schedule_kernels([tg.tensor(np.zeros((ROW_CHUNK_MIN_ROWS - 8, 256), np.float32)).sum(0).node]).kernels
    assert [s.dtype for s in walk(kernel.body) if isinstance(s, Local)] == [dtypes.float64]


@pytest.mark.skipif(GCC.command != "gcc", reason="the loop report is gcc's")
def test_gcc_reads_the_rows_of_a_column_sum_one_after_another(tmp_path) -> None:
    """gcc -O3 would jam two rows into one loop (each load reading every other row: the prefetcher loses the
    stream); the cpu target's flags keep the loops as written."""
    program, _ = CPU.program([tg.tensor(np.ones((1024, 256), np.float32)).sum(0).node])
    source = tmp_path / "program.c"
    source.write_text(program.source)
    report = subprocess.run(
        [GCC.command, *GCC.flags, "-fopt-info-loop-optimized", "-o", str(tmp_path / "p.so"), str(source)],
        capture_output=True,
        text=True,
    ).stderr
    assert "unroll and jam" not in report, report
