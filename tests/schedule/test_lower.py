"""Lowering to loop IR: movement ops become simplified indices, reductions nest inside their consumers."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.codegen import index as ix
from tensorgraphs.codegen.loop_ir import Let, Load, Local, Loop, ParallelAxis, Store, TransposeLocal, walk
from tensorgraphs.frontend import movement as mv
from tensorgraphs.graph.ops import Op
from tensorgraphs.schedule import schedule_kernels
from tensorgraphs.schedule.lower import ROW_STAGE_BYTES

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included


def only_kernel(tensor: tg.Tensor):
    (kernel,) = schedule_kernels([tensor.node]).kernels
    return kernel


def x(*shape: int) -> tg.Tensor:
    return tg.tensor(np.zeros(shape, np.float32))


def test_transpose_copy_reads_with_swapped_strides() -> None:
    kernel = only_kernel(x(4, 6).T.contiguous() + 0)
    loads = [s for s in walk(kernel.body) if isinstance(s, Load)]
    store = next(s for s in walk(kernel.body) if isinstance(s, Store))
    assert [repr(s.index) for s in loads] == ["(i1 + i2*6)"] and repr(store.index) == "(i1*4 + i2)"


def test_reshape_round_trip_leaves_no_division() -> None:
    kernel = only_kernel(x(4, 6).reshape(24).reshape(2, 12).reshape(4, 6) * 2)
    (load,) = [s for s in walk(kernel.body) if isinstance(s, Load)]
    assert repr(load.index) == "i1"  # and its rows and columns one loop (loop_merge)
    assert [s.var.extent for s in walk(kernel.body) if isinstance(s, Loop)] == [24]


def test_pad_clamps_the_load_and_selects_zero_outside() -> None:
    kernel = only_kernel(mv.pad(x(5, 3, 4), (0, 0, 0, 0, 2, 1)) + 1)  # an outer axis: checked once per plane
    ops = [s.op for s in walk(kernel.body) if isinstance(s, Let)]
    (load,) = [s for s in walk(kernel.body) if isinstance(s, Load)]
    assert "in_range" in ops and "zero_unless" in ops
    assert repr(load.index) == "(clamp((i1 + -2), 0, 4)*12 + i2)"  # each 3x4 plane one loop (loop_merge)


def test_padded_innermost_axis_is_cut_where_the_checks_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = only_kernel(mv.pad(x(5), (2, 1)) + 1)
    loops = [s for s in kernel.body if isinstance(s, Loop)]
    assert [loop.var.extent for loop in loops] == [2, 5, 1]  # the left border, the interior, the right border
    interior = [s for s in walk(loops[1].body) if isinstance(s, (Let, Load))]
    assert [repr(s.index) for s in interior if isinstance(s, Load)] == [f"{loops[1].var.name}"]
    assert not any(isinstance(s, Let) and s.op in ("in_range", "zero_unless") for s in interior)
    assert not any(isinstance(s, Load) for s in walk(loops[2].body))  # padding only: nothing to read
    monkeypatch.setattr(CPU, "interpret_below", 0)
    with tg.device("cpu"):
        padded = (mv.pad(tg.arange(5.0), (2, 1)) + 1).numpy()
    np.testing.assert_array_equal(padded, [1, 1, 1, 2, 3, 4, 5, 1])


def test_softmax_row_loop_holds_both_reductions_before_the_output_loop() -> None:
    kernel = only_kernel(F.softmax(x(64, 1024), -1))
    (rows,) = [s for s in kernel.body if isinstance(s, Loop)]
    assert rows.parallel == ParallelAxis(0, 64 * 1024) and rows.var.extent == 64
    kinds = [type(s).__name__ for s in rows.body if not isinstance(s, Let)]
    assert kinds == ["Local", "Reduce", "Reduce", "Loop"]  # the local row carries exp from the sum to the output


def test_loop_invariant_values_are_hoisted() -> None:
    bias = tg.tensor(np.ones(8, np.float32))
    kernel = only_kernel((x(16, 8).T * bias.reshape(8, 1).exp()) + 1)
    outer = next(s for s in kernel.body if isinstance(s, Loop))
    hoisted = [s.op.name for s in outer.body if isinstance(s, Let)]
    assert "EXP2" in hoisted  # exp(bias[i]) is computed once per row, not per element


def test_the_outer_loop_carries_the_kernels_work_for_the_target_to_decide_on_threads() -> None:
    kernel = only_kernel(x(4, 4).T + 1)  # transposed: two loops (a plain copy is one, loop_merge)
    assert [s.parallel for s in walk(kernel.body) if isinstance(s, Loop)] == [ParallelAxis(0, 16), None]


def test_large_transpose_is_staged_through_a_tile_transposed_in_registers() -> None:
    kernel = only_kernel(x(64, 96).T.contiguous())
    loads = [repr(s.index) for s in walk(kernel.body) if isinstance(s, Load)]
    stores = [repr(s.index) for s in walk(kernel.body) if isinstance(s, Store)]
    assert loads == ["(blk1*1536 + blk2*16 + t3*96 + t4)", "(t6*16 + t7)"]  # both contiguous innermost
    assert stores == ["(t3*16 + t4)", "(blk1*16 + blk2*1024 + t6*64 + t7)"]  # tiles walk the source's rows
    (block,) = [s for s in walk(kernel.body) if isinstance(s, Loop) and s.var.name == "blk2"]
    fill, transpose, drain = block.body[1:]
    assert isinstance(fill, Loop) and isinstance(drain, Loop) and transpose == TransposeLocal("tile", 16)


def test_transpose_past_the_last_whole_tile_ends_in_plain_loops() -> None:
    kernel = only_kernel(x(37, 50).T.contiguous())
    tiles, rows, columns = [s for s in kernel.body if isinstance(s, Loop)]
    assert (tiles.var.extent, tiles.body[0].var.extent) == (2, 3)  # 32 of 37 rows x 48 of 50 columns in tiles
    assert (rows.var.extent, rows.body[0].var.extent) == (37, 2)  # output rows 48-49, all columns
    assert (columns.var.extent, columns.body[0].var.extent) == (5, 48)  # output columns 32-36 of the tiled rows


def test_softmax_computes_exp_once_through_a_row_array() -> None:
    kernel = only_kernel(F.softmax(x(16, 100), -1))
    lets = [s for s in walk(kernel.body) if isinstance(s, Let)]
    (row,) = [s for s in walk(kernel.body) if isinstance(s, Local)]
    stores = [(s.buffer, repr(s.index)) for s in walk(kernel.body) if isinstance(s, Store)]
    assert [s.op.name for s in lets if not isinstance(s.op, str)].count("EXP2") == 1
    assert row.size == 100 and stores == [(row.name, "r11"), (kernel.buffers[-1].name, "(i1*100 + i2)")]
    loads = [s.buffer for s in walk(kernel.body) if isinstance(s, Load)]
    assert kernel.buffers[-1].name not in loads  # the output is only written: it may be streamed


def test_softmax_over_long_rows_computes_exp_once_through_the_output_buffer() -> None:
    columns = ROW_STAGE_BYTES // 4 + 16
    kernel = only_kernel(F.softmax(x(2, columns), -1))
    stores = [repr(s.index) for s in walk(kernel.body) if isinstance(s, Store)]
    assert not any(isinstance(s, Local) for s in walk(kernel.body))
    assert stores == [f"(i1*{columns} + r11)", f"(i1*{columns} + i2)"]


def test_chained_row_operations_do_not_recompute_the_first_ones_exp_in_later_reductions() -> None:
    y = x(16, 256)
    for _ in range(4):
        y = F.softmax(y * 1.5, -1)
    kernels = schedule_kernels([y.node]).kernels
    exps = [s for k in kernels for s in walk(k.body) if isinstance(s, Let) and s.op is Op.EXP2]
    assert len(exps) == 4  # one exp per softmax (reused through a row array), not one per later reduction


def test_several_softmaxes_in_one_kernel_keep_their_own_values() -> None:
    """Three softmaxes summed fuse into one kernel; each caches exp(x - max) between its passes, and no cache
    may overwrite another's (short rows, and rows too long for a private row array)."""
    rng = np.random.default_rng(0)
    for shape in ((12, 300), (4, 50_000)):
        a, b, c = (tg.tensor(rng.standard_normal(shape).astype(np.float32)) for _ in range(3))

        def softmaxes(a: tg.Tensor, b: tg.Tensor, c: tg.Tensor) -> tg.Tensor:
            return F.softmax(a, -1) + F.softmax(b * 2, -1) + F.softmax(a + c, -1)

        compiled = tg.compile(softmaxes)
        got = compiled(a, b, c).numpy()
        with tg.device("numpy"):
            expected = softmaxes(a, b, c).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
        assert compiled.stats.kernels == 1


def test_a_value_computed_at_many_indices_gets_a_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """x + roll(x) chained n times reads the first link at 2**n indices: inlined whole, the C grew
    exponentially (1.3 MB for 10 links). Work per element stays bounded; the values match the reference."""
    data = np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32)

    def chain(links: int) -> tg.Tensor:
        t = tg.tensor(data)
        for _ in range(links):
            t = t + t.roll(1, 0) * 0.5
        return t

    for links in (8, 10):
        schedule = schedule_kernels([chain(links).node])
        computed = sum(isinstance(s, Let) for kernel in schedule.kernels for s in walk(kernel.body))
        assert computed <= 4 * 16 * links
    with tg.device("numpy"):
        expected = chain(10).numpy()
    monkeypatch.setattr(CPU, "interpret_below", 0)
    with tg.device("cpu"):
        np.testing.assert_allclose(chain(10).numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,dim", [((2,), 0), ((1, 2, 1), 1), ((3, 2), 1), ((2, 3), 0), ((5,), 0)])
@pytest.mark.parametrize("scan", ["cumsum", "cumprod"])
def test_a_scan_along_an_axis_of_two_reads_its_first_element_not_unwritten_memory(
        shape: tuple[int, ...], dim: int, scan: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Along an axis of 2 with every other extent 1, both nests of the scan have no loops and store last: the
    second must not load the first's output before it is stored (it read garbage: cumsum([-1, -1]) was [-1, -1])."""
    data = (np.arange(np.prod(shape)).reshape(shape) % 3 - 1.5).astype(np.float32)
    with tg.device("numpy"):
        expected = getattr(tg.tensor(data), scan)(dim).mean().numpy()
    monkeypatch.setattr(CPU, "interpret_below", 0)
    np.testing.assert_allclose(getattr(tg.tensor(data), scan)(dim).mean().numpy(), expected, rtol=1e-6)


def test_a_gather_read_at_several_indices_is_materialized_once() -> None:
    """Window maxima picked by a gather (by each window's argmax) and read by a conv's nine taps get a buffer:
    inlined into the conv's operand they would be selected again at every tap."""
    from tensorgraphs.nn.functional.conv import sliding_windows

    x = tg.tensor(np.random.default_rng(0).standard_normal((4, 3, 8, 8)), dtype=tg.float32)
    windows = sliding_windows(x, (2, 2), (2, 2), (1, 1))
    picked = tg.squeeze(tg.gather(windows, 2, tg.argmax(windows, 2, keepdim=True)), 2)
    out = tg.nn.functional.conv2d(picked, tg.ones(5, 3, 3, 3), padding=1)
    kernels = schedule_kernels([out.node]).kernels
    assert sum(k.name.endswith("_gather") for k in kernels) == 1  # the maxima, computed once


def test_a_chain_of_concatenations_writes_each_input_into_its_slice_once() -> None:
    """Each level concatenates the previous concatenation with new features. Every `cat` is one kernel with one nest
    per input (its producer inlined there), so no level recomputes the levels before it; and as each concatenation
    is read only by the next, each writes into its slice of the last one's buffer (`write_slices_in_place`): every
    input is stored once, into the output."""
    rng = np.random.default_rng(0)
    start = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    start[0, 0, 0, 0] = np.nan
    features, expected = tg.tensor(start), start
    for level in range(4):
        grown = rng.standard_normal((2, 2, 4, 5)).astype(np.float32)
        features = tg.cat([features, tg.tensor(grown).relu() * (level + 1)], 1)
        expected = np.concatenate([expected, np.maximum(grown, 0) * (level + 1)], 1)
    out = features.exp()
    kernels = schedule_kernels([out.node]).kernels
    assert [k.name.split("_", 1)[1] for k in kernels] == ["cat"] * 4 + ["exp2"], [k.name for k in kernels]
    assert [sum(isinstance(s, Store) for s in walk(k.body)) for k in kernels] == [2, 1, 1, 1, 1]
    assert len({s.buffer for k in kernels[:4] for s in walk(k.body) if isinstance(s, Store)}) == 1
    np.testing.assert_allclose(out.numpy(), np.exp(expected), rtol=1e-6)


def test_concatenated_column_sums_are_reduced_row_after_row_not_inside_the_concatenation() -> None:
    """The stacked q, k, v bias's gradient: cat of three sums over (batch, rows) of (batch, rows, d) gradients. Each
    sum is a kernel of its own accumulating whole rows (contiguous along the innermost loop), stored into its slice;
    inlined into the cat's nests, each output would walk its column with a stride of d floats."""
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal((4, 64, 48)).astype(np.float32) for _ in range(3)]
    arrays[1][0, 0, 5] = np.nan
    out = tg.cat([(tg.tensor(a) * 2).sum((0, 1)) for a in arrays], 0)
    kernels = schedule_kernels([out.node]).kernels
    assert [k.name.split("_", 1)[1] for k in kernels] == ["reduce_sum"] * 3, [k.name for k in kernels]  # into the cat
    for kernel in kernels:
        accumulators = {s.name for s in walk(kernel.body) if isinstance(s, Local)}
        loads = [(loop.var, s) for loop in walk(kernel.body) if isinstance(loop, Loop) for s in loop.body
                 if isinstance(s, Load) and s.buffer not in accumulators]
        assert loads and all(ix.stride(load.index, var) == 1 for var, load in loads), kernel
    expected = np.concatenate([(2 * a).sum((0, 1)) for a in arrays])
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_concatenated_bools_and_empty_inputs_keep_their_places(dim: int) -> None:
    rng = np.random.default_rng(1)
    shapes = [[3, 4, 2] for _ in range(3)]
    for i, size in enumerate((2, 0, 1)):
        shapes[i][dim] = size
    arrays = [rng.standard_normal(s) > 0 for s in shapes]
    got = tg.cat([tg.tensor(a) for a in arrays], dim).logical_not()
    np.testing.assert_array_equal(got.numpy(), ~np.concatenate(arrays, dim))


def test_a_concatenation_with_one_nonempty_input_is_not_inlined_into_its_consumer() -> None:
    """One nest is a plain kernel, which `store_in_consumers` would have its reader compute at the same index: a
    concatenation has no lowering inside another kernel (the official suite's causal conv of kernel size one)."""
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    joined = tg.cat([tg.tensor(np.zeros((2, 0), np.float32)), tg.tensor(data)], 1)
    np.testing.assert_allclose((joined * 2).numpy(), data * 2)


def _pool_input(seed: int, *shape: int) -> np.ndarray:
    """Halves (ties), a NaN, infinities and a whole row of -inf."""
    values = np.round(np.random.default_rng(seed).standard_normal(shape) * 2) / 2
    flat = values.reshape(-1)
    flat[7], flat[-3], flat[shape[-1] * 3 + 5] = np.nan, np.inf, -np.inf
    values[..., 4, :] = -np.inf
    return values.astype(np.float32)


@pytest.mark.parametrize("shape,pool,kwargs,staged", [
    # (input shape, pool, arguments, sizes of the staged arrays: [] where the column results get a buffer; a row
    # each for the rows of output windows cut from the others: ceil_mode's last, partial one, a padded border)
    ((2, 3, 12, 13), "max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, [6 * 15]),  # a plane
    ((1, 2, 12, 9), "max_pool2d", {"kernel_size": 3, "stride": 2, "ceil_mode": True}, [6 * 9]),
    ((2, 3, 9, 8), "avg_pool2d", {"kernel_size": 3, "stride": 1, "padding": 1, "count_include_pad": False}, [9 * 10]),
    ((1, 2, 121, 111), "max_pool2d", {"kernel_size": 3, "stride": 2}, [111]),  # a row
    ((1, 2, 120, 111), "max_pool2d", {"kernel_size": 3, "stride": 2, "ceil_mode": True}, [111, 111]),  # partial
    ((1, 2, 120, 113), "max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, [115, 115]),  # padded top
    ((1, 2, 120, 40), "max_pool2d", {"kernel_size": 3, "stride": 2}, []),  # rows too short, the plane too large
])
def test_a_separable_windows_column_results_are_staged_a_plane_or_a_row_at_a_time(
        shape: tuple, pool: str, kwargs: dict, staged: list) -> None:
    """A separable window's stored column results (`STORED_WINDOWS`) are computed by the kernel combining them along
    the rows, into an array of its own per plane where the plane fits STAGED_PLANE_BYTES, else per row where the
    row fits STAGED_ROW_BYTES (the fill's padded borders in loops of their own: none of the busiest loop's reads
    checks), else they get a buffer; the values are torch's in each case."""
    import torch

    values = _pool_input(len(staged), *shape)
    out = getattr(F, pool)(tg.tensor(values), **kwargs)
    kernels = schedule_kernels([out.node]).kernels
    assert len(kernels) == (1 if staged else 2)
    assert [s.size for s in walk(kernels[-1].body) if isinstance(s, Local)] == staged
    busiest = max((s for s in walk(kernels[-1].body) if isinstance(s, Loop) and not any(
        isinstance(t, Loop) for t in walk(s.body))), key=lambda loop: loop.var.extent)
    assert not any(isinstance(s, Let) and s.op in ("in_range", "zero_unless") for s in walk(busiest.body))
    expected = getattr(torch.nn.functional, pool)(torch.tensor(values, dtype=torch.float64), **kwargs).numpy()
    np.testing.assert_allclose(out.numpy(), expected.astype(np.float32), rtol=1e-6, atol=0)


def test_a_concatenations_staged_windows_fill_their_interiors_without_padding_checks() -> None:
    """Windows computed by a concatenation's kernel (a ShuffleNet unit's average pool beside a branch) stage their
    column results too, the fill loops cut where the padding checks stop."""
    import torch
    import torch.nn.functional as TF

    values = _pool_input(3, 1, 3, 16, 16)
    t = tg.tensor(values)
    out = tg.cat([F.avg_pool2d(t, 3, 2, 1), F.max_pool2d(t, 3, 2, 1) * 2], 1)
    (kernel,) = [k for k in schedule_kernels([out.node]).kernels if any(isinstance(s, Local) for s in walk(k.body))]
    columns = 8 * 17  # 8 rows of windows down the padded 18 columns, cropped to the 17 that windows read
    assert [s.size for s in walk(kernel.body) if isinstance(s, Local)] == [columns, columns]
    busiest = max((s for s in walk(kernel.body) if isinstance(s, Loop) and not any(
        isinstance(t, Loop) for t in walk(s.body))), key=lambda loop: loop.var.extent)
    assert not any(isinstance(s, Let) and s.op in ("in_range", "zero_unless") for s in walk(busiest.body))
    v = torch.tensor(values, dtype=torch.float64)
    expected = torch.cat([TF.avg_pool2d(v, 3, 2, 1), TF.max_pool2d(v, 3, 2, 1) * 2], 1)
    np.testing.assert_allclose(out.numpy(), expected.numpy().astype(np.float32), rtol=1e-6, atol=0)


def test_column_results_read_at_several_channels_get_a_buffer_not_a_block_per_channel() -> None:
    """A local response norm after a max pool reads the pool at five channels per output: staged, each channel's
    column results would be computed five times, so they get a buffer (one kernel computes them once)."""
    import torch

    values = _pool_input(4, 1, 8, 41, 70)
    out = F.local_response_norm(F.max_pool2d(tg.tensor(values), 3, 2), 5)
    kernels = schedule_kernels([out.node]).kernels
    assert len(kernels) == 2 and not any(isinstance(s, Local) for k in kernels for s in walk(k.body))
    v = torch.tensor(values, dtype=torch.float64)
    expected = torch.nn.functional.local_response_norm(torch.nn.functional.max_pool2d(v, 3, 2), 5)
    np.testing.assert_allclose(out.numpy(), expected.numpy().astype(np.float32), rtol=1e-5, atol=0)
