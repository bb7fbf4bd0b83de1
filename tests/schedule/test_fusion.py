"""The scheduler: which nodes get buffers, so fusion cannot silently regress (kernel counts)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU, CPU_TARGET
from tensorgraphs.backends.cpu.renderer import PREAMBLE, CpuRenderer
from tensorgraphs.backends.native import Program
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.codegen.loop_ir import Kernel, Let, Reduce, Store, walk
from tensorgraphs.examples.gpt import GPT, GPTConfig, language_model_loss
from tensorgraphs.graph.ops import Op
from tensorgraphs.rewrite import fuzz, optimize
from tensorgraphs.schedule import Schedule, count_kernels, fusion, schedule_kernels
from tensorgraphs.schedule.fusion import MAX_INLINE_DEPTH, MAX_SHARED_INLINE_NODES, SPLIT_MIN_SIZE, to_primitive
from tensorgraphs.schedule.lower import Lowering

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included


def tensor(*shape: int, seed: int = 0) -> tg.Tensor:
    return tg.tensor(np.random.default_rng(seed).normal(size=shape).astype(np.float32))


def test_elementwise_chain_and_gelu_are_one_kernel() -> None:
    x, a, b = tensor(64, 32), tensor(32, seed=1), tensor(32, seed=2)
    assert count_kernels([F.gelu(x * a + b, approximate="tanh").node]) == 1
    chain = x
    for step in range(10):
        chain = (chain * 1.01 + step).abs()
    assert count_kernels([chain.node]) == 1


def test_softmax_log_softmax_layer_norm_are_one_row_kernel_each() -> None:
    x, g, b = tensor(64, 32), tensor(32, seed=1), tensor(32, seed=2)
    assert count_kernels([F.softmax(x, -1).node]) == 1
    assert count_kernels([F.log_softmax(x, -1).node]) == 1
    assert count_kernels([F.layer_norm(x, (32,), g, b).node]) == 1


def test_reduction_consumed_across_rows_is_materialized() -> None:
    x = tensor(64, 32)
    schedule = schedule_kernels([F.softmax(x, 0).node])  # column softmax: a row loop would recompute it
    assert len(schedule.kernels) == 3
    assert [b.role for b in schedule.buffers].count("temp") == 2


def test_expensive_producer_of_a_matmul_is_materialized_cheap_one_is_not() -> None:
    a, b = tensor(8, 16), tensor(16, 4, seed=1)
    assert count_kernels([((a * 2 + 1) @ b).node]) == 1
    assert count_kernels([(a.exp() @ b).node]) == 2


def test_reduction_shared_by_two_kernels_is_materialized_once() -> None:
    x = tensor(16, 8)
    m = x.amax(0)
    schedule = schedule_kernels([(x - m).node, (x * m).node])
    assert len(schedule.kernels) == 3


def test_a_chain_read_by_a_window_is_computed_once() -> None:
    """A depthwise conv reads its input at nine taps: the affine map and relu feeding it (a batch norm's) get a
    buffer, computed once per element rather than at every tap."""
    x, scale, shift = tensor(1, 8, 16, 16), tensor(8, 1, 1, seed=1), tensor(8, 1, 1, seed=2)
    y = F.relu(x * scale + shift)
    kernels = schedule_kernels([F.conv2d(y, tensor(8, 1, 3, 3, seed=3), padding=1, groups=8).node]).kernels
    relu_compares = [s for k in kernels for s in walk(k.body) if isinstance(s, Let) and s.op is Op.CMPLT]
    assert len(kernels) == 2 and len(relu_compares) == 1


def test_large_full_reduction_is_split_into_parallel_parts() -> None:
    x = tensor(SPLIT_MIN_SIZE)
    (root,), forced = to_primitive([x.sum().node], lambda n: n.op is Op.BUFFER)
    (partial,) = forced
    assert partial.op is Op.REDUCE_SUM and partial.shape == (64, 1)
    assert len(schedule_kernels([x.sum().node]).kernels) == 2


def mlp_training_step() -> list[tg.Tensor]:
    """Forward, cross entropy, backward and SGD update of a 2-layer MLP: the loss and the new parameters."""
    rng = np.random.default_rng(0)
    x, y = tensor(32, 64), tg.tensor(rng.integers(0, 10, 32))
    params = [tg.tensor(rng.normal(size=s).astype(np.float32), requires_grad=True) for s in ((128, 64), (128,),
                                                                                          (10, 128), (10,))]
    w1, b1, w2, b2 = params
    loss = F.cross_entropy(F.linear(F.relu(F.linear(x, w1, b1)), w2, b2), y)
    grads = tg.grad(loss, params)
    return [loss] + [p.detach() - 0.1 * g for p, g in zip(params, grads)]


def program_lines(schedule: Schedule) -> int:
    """Lines of C the kernels of `schedule` render to (the shared preamble not counted)."""
    source = CpuRenderer.render_program(schedule.kernels, [b.name for b in schedule.buffers])
    return source.count("\n") - PREAMBLE.count("\n")


def test_mlp_training_step_kernel_count_and_code_size() -> None:
    schedule = schedule_kernels([t.node for t in mlp_training_step()])
    assert len(schedule.kernels) <= 16, [k.name for k in schedule.kernels]
    assert program_lines(schedule) <= 600  # 416 when written; a fused chain recomputed per column would double it


def test_mlp_training_step_compiles_and_matches_the_reference(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    with tg.device("numpy"):
        expected = [t.detach().numpy() for t in mlp_training_step()]
    with tg.device("cpu"):
        got = [t.detach().numpy() for t in mlp_training_step()]  # its size is bounded by the test above
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_transformer_loss_and_gradients_schedule_into_bounded_code_with_bounded_work(count_calls: Callable) -> None:
    """Nested reductions (layer norm, softmax, matmuls of the backward pass) once were lowered inside each other
    before being materialized: 42 s for this model. A kernel found to recompute one stops walking it, so the
    nodes lowered stay a small multiple of the graph's."""
    model = GPT(GPTConfig(vocab_size=16, block_size=16, n_layer=1, n_head=2, n_embd=32))
    ids = tg.tensor(np.random.default_rng(0).integers(0, 16, (2, 16)))
    loss = language_model_loss(model, ids, ids)
    grads = tg.grad(loss, list(model.parameters()))
    roots = optimize([loss.node] + [g.node for g in grads])  # rewritten, as every program is
    lowered = count_calls(Lowering, "define")
    schedule = schedule_kernels(roots)
    assert lowered["define"] <= 20_000  # 11,416 when written, for 368 nodes
    assert len(schedule.kernels) <= 90 and program_lines(schedule) <= 3000  # 74 and 2032 when written


def test_matmul_accumulates_output_rows_and_transposed_results_get_their_own_kernel() -> None:
    """C += a[i, k] * b[k, :] row by row (contiguous, vectorized) rather than a strided dot product per element;
    a transposed product (a weight gradient) or one a backward chain consumes is accumulated in its own buffer."""
    a, b, g = tensor(64, 48), tensor(48, 32, seed=1), tensor(64, 32, seed=2)
    (kernel,) = schedule_kernels([(a @ b).node]).kernels
    assert not any(isinstance(s, Reduce) for s in walk(kernel.body))  # accumulated in the output, no dot products
    assert len(schedule_kernels([(a.T @ g).T.node]).kernels) == 2  # both operands walked down their columns
    w, narrow, c = tensor(32, 48, seed=3), tensor(64, 8, seed=4), tensor(8, 48, seed=5)
    assert len(schedule_kernels([(a * (g @ w)).node]).kernels) == 2  # 32 products per element: worth a buffer
    assert len(schedule_kernels([(a * (narrow @ c)).node]).kernels) == 1  # 8 per element: fused


def test_cheap_chain_feeding_a_wide_matmul_is_materialized() -> None:
    a, b = tensor(8, 16), tensor(16, 64, seed=1)
    assert count_kernels([((a * 2 + 1) @ b).node]) == 2  # recomputed 64 times per element otherwise


def test_a_hundred_chained_softmaxes_compile_into_kernels_of_bounded_depth() -> None:
    """Row operations chained in one kernel were lowered recursively: 100 softmaxes exceeded Python's recursion
    limit. A chain longer than MAX_INLINE_DEPTH now gets a buffer partway."""
    x = tg.tensor(np.random.default_rng(0).standard_normal((16, 256)).astype(np.float32))

    def chain(x: tg.Tensor) -> tg.Tensor:
        for _ in range(100):
            x = F.softmax(x * 1.5, -1)
        return x

    got = tg.compile(chain)(x).numpy()
    with tg.device("numpy"):
        np.testing.assert_allclose(got, chain(x).numpy(), rtol=1e-5, atol=1e-7)


def stores_per_buffer(kernel: Kernel) -> dict[str, int]:
    """How many stores write each of the kernel's arrays (staging `Local`s not counted)."""
    arrays = {b.name for b in kernel.buffers}
    return dict(Counter(s.buffer for s in walk(kernel.body) if isinstance(s, Store) and s.buffer in arrays))


def assert_written_before_read(schedule: Schedule) -> None:
    """Every buffer a kernel reads is an input or written by an earlier kernel (the scheduler's order is valid)."""
    written = {b.name for b in schedule.buffers if b.role == "input"}
    for kernel in schedule.kernels:
        assert all(b.name in written for b in kernel.buffers if not b.writes), kernel.name
        written |= {b.name for b in kernel.buffers if b.writes}


OPTIMIZERS: dict[str, tuple[type[tg.optim.Optimizer], dict[str, Any], int]] = {  # and the arrays each update writes
    "Adam": (tg.optim.Adam, {"lr": 0.01}, 3),
    "AdamW_amsgrad": (tg.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}, 4),
    "SGD_momentum": (tg.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}, 2),
    "SGD_nesterov": (tg.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}, 2),
    "RMSprop_centered_momentum": (tg.optim.RMSprop, {"lr": 0.01, "momentum": 0.5, "centered": True}, 4),
    "Adagrad": (tg.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01}, 2),
}


def optimizer_after_one_step(name: str) -> tuple[tg.Tensor, tg.optim.Optimizer]:
    """A (64, 48) parameter and its optimizer after one step (its state exists), with a new gradient."""
    make, options, _ = OPTIMIZERS[name]
    param = tensor(64, 48, seed=7).requires_grad_()
    optimizer = make([param], **options)
    param.grad = tensor(64, 48, seed=8)
    optimizer.step()
    param.grad = tensor(64, 48, seed=9)
    return param, optimizer


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizer_update_is_one_kernel_storing_the_parameter_and_its_state(name: str) -> None:
    """The new moments are program outputs the parameter update reads at the same index: computed and stored by
    the update's kernel, one pass over the arrays (was one kernel per array, each read back)."""
    param, optimizer = optimizer_after_one_step(name)
    schedule = schedule_kernels([value.node for _, value in optimizer.step_updates()])
    assert_written_before_read(schedule)
    (update,) = [k for k in schedule.kernels if any(b.writes and b.size == param.numel() for b in k.buffers)]
    assert sorted(stores_per_buffer(update).values()) == [1] * OPTIMIZERS[name][2], str(update)
    assert len(schedule.kernels) <= 2  # and the step counter (a scalar the update reads at index 0)


@pytest.mark.parametrize("name", ["Adam", "SGD_momentum", "RMSprop_centered_momentum"])
def test_optimizer_update_kernel_equals_the_reference_in_place_or_not(name: str) -> None:
    """Three steps; each as one program with the parameter and state overwritten in place, and as one writing
    new arrays: the same bits, equal to the numpy reference."""
    param, optimizer = optimizer_after_one_step(name)
    for _ in range(3):
        updates = optimizer.step_updates()
        roots = [value.node for _, value in updates]
        _, inputs = CPU.program(roots)
        schedule = schedule_kernels(roots, set(inputs).__contains__)
        donated = [(inputs.index(target.node), i) for i, (target, _) in enumerate(updates) if target.node in inputs]
        in_place, fresh = Program(schedule, inputs, CPU_TARGET, donated=donated), Program(schedule, inputs, CPU_TARGET)
        assert {i for i, (target, _) in enumerate(updates) if target.shape == param.shape} <= set(
            in_place.updated_in_place)
        got = in_place.run([np.array(n.arg.data) for n in inputs])  # copies: overwritten in place
        want = REFERENCE.evaluate(roots)
        for position, (a, b, expected) in enumerate(zip(got, fresh.run([n.arg.data for n in inputs]), want)):
            assert fuzz.same_bits(a, b), f"{name}: output {position}"
            np.testing.assert_allclose(a, expected, rtol=1e-5, atol=1e-7, err_msg=f"{name}: output {position}")
        for (target, _), value in zip(updates, want):
            target.assign(tg.Tensor.from_numpy(np.asarray(value), target.dtype))


def test_compiled_adam_step_updates_each_parameter_and_its_moments_in_one_kernel(compiled_step: Callable) -> None:
    """In a whole compiled step too (gradient kernels in between): one kernel stores p, m and v per parameter."""
    model = tg.nn.Sequential(tg.nn.Linear(64, 128), tg.nn.ReLU(), tg.nn.Linear(128, 10))
    step = compiled_step(model, tg.optim.Adam(model.parameters(), lr=0.01))
    step(tensor(32, 64), tg.tensor(np.arange(32) % 10))
    (trace,) = next(iter(step.traces.values()))
    updates = [k for k in trace.program.kernels if sum(b.writes for b in k.buffers) == 3]
    assert len(updates) == len(list(model.parameters())), [k.name for k in trace.program.kernels]


def test_a_value_read_at_another_index_keeps_its_own_kernel_and_readers_follow_its_writer() -> None:
    """An output rides in its first reader only where read at that kernel's own index, and every other reader
    of it (a transpose) still runs after the kernel storing it."""
    x, y, z = tensor(32, 32), tensor(32, 32, seed=1), tensor(32, 32, seed=2)
    a = x * 2 + 1
    h = a * y
    f = h + z
    cases = {  # roots -> kernels and how many buffers each stores
        "read at the same index": ([a, a * y], [2]),
        "read transposed": ([a, a.T * y], [1, 1]),
        "reduced": ([a, a.sum(1)], [1, 1]),
        "a chain, then a transposed reader": ([a, h, f, a.T * 3], [3, 1]),
        "a transposed reader between a value and its chain's end": ([h, a.T * 3, f, a], [1, 1, 2]),
    }
    for label, (roots, stores) in cases.items():
        schedule = schedule_kernels([t.node for t in roots])
        assert_written_before_read(schedule)
        assert [sum(stores_per_buffer(k).values()) for k in schedule.kernels] == stores, label
        program, inputs = CPU.program([t.node for t in roots])
        for got, want in zip(program.run([n.arg.data for n in inputs]), REFERENCE.evaluate([t.node for t in roots])):
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=label)


def test_a_rider_never_makes_a_chain_deeper_than_the_inline_limit() -> None:
    """Two output chains of 80 ops, the second reading the first: one kernel would inline 160 (`too_deep_to_inline`)."""
    x = tensor(16, 16)
    first = x
    for _ in range(MAX_INLINE_DEPTH // 2 - 8):
        first = first * 1.01 + 0.01
    second = first
    for _ in range(MAX_INLINE_DEPTH // 2 - 8):
        second = second * 0.99 - 0.01
    assert [sum(stores_per_buffer(k).values()) for k in schedule_kernels([first.node, second.node]).kernels] == [1, 1]


def lstm_cell_states(steps: int) -> list[tg.Tensor]:
    """An elementwise recurrence (an LSTM's cell state: c = sigmoid(f) * c + sigmoid(i) * tanh(g)), every step also
    read by an output kernel."""
    gates = [tensor(3, 8, seed=s) for s in range(3)]
    c = tensor(8, seed=9)
    outputs = []
    for t in range(steps):
        f, i, g = (gate[t % 3] * (1 + t / steps) for gate in gates)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        outputs.append(c * 2)
    return outputs


def test_a_recurrence_shared_by_kernels_is_cut_before_its_first_lowering(monkeypatch: pytest.MonkeyPatch) -> None:
    """No lowering walks the whole recurrence: its shared chain is cut before the first round, which would
    otherwise lower every reader with all the steps before it (time quadratic in the steps)."""
    lowered: list[int] = []
    lower_node = fusion.lower_node

    def counting(*args: Any, **kwargs: Any) -> Lowering:
        lowering = lower_node(*args, **kwargs)
        lowered.append(len(lowering.inlined))
        return lowering

    monkeypatch.setattr(fusion, "lower_node", counting)
    schedule_kernels([o.node for o in lstm_cell_states(48)])
    assert max(lowered) <= 3 * MAX_SHARED_INLINE_NODES, max(lowered)  # 2002 when cut after it


def test_a_recurrence_read_by_several_kernels_is_stored_not_recomputed_by_each() -> None:
    """An elementwise recurrence (an LSTM's cell state: c = sigmoid(f) * c + sigmoid(i) * tanh(g)) whose every
    step is also read by an output kernel: a step whose cone back to buffers exceeds MAX_SHARED_INLINE_NODES gets
    a buffer, so the program's code grows linearly in the steps rather than with steps times the inlined depth."""
    steps = 24
    roots = [o.node for o in lstm_cell_states(steps)]
    schedule = schedule_kernels(roots)
    lets = [sum(1 for s in walk(k.body) if isinstance(s, Let)) for k in schedule.kernels]
    assert max(lets) <= 3 * MAX_SHARED_INLINE_NODES and sum(lets) <= 80 * steps, lets  # 307 and 4308 when inlined
    for got, want in zip(CPU.evaluate(roots), REFERENCE.evaluate(roots)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
