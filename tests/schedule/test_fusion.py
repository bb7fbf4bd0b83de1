"""The scheduler: which nodes get buffers, so fusion cannot silently regress (kernel counts)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.codegen.c_renderer import PREAMBLE, render_program
from tensorgraphs.codegen.loop_ir import Reduce, walk
from tensorgraphs.examples.gpt import GPT, GPTConfig, language_model_loss
from tensorgraphs.graph.ops import Op
from tensorgraphs.rewrite import optimize
from tensorgraphs.schedule import Schedule, count_kernels, schedule_kernels
from tensorgraphs.schedule.fusion import SPLIT_MIN_SIZE, to_primitive


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
    return render_program(schedule.kernels, [b.name for b in schedule.buffers]).count("\n") - PREAMBLE.count("\n")


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
        started = time.perf_counter()
        got = [t.detach().numpy() for t in mlp_training_step()]
        assert time.perf_counter() - started < 30  # 0.5 s when written (cold cache)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_transformer_loss_and_gradients_schedule_fast_into_bounded_code() -> None:
    """Nested reductions (layer norm, softmax, matmuls of the backward pass) once were lowered inside each other
    before being materialized: 42 s for this model. A kernel found to recompute one stops walking it."""
    model = GPT(GPTConfig(vocab_size=16, block_size=16, n_layer=1, n_head=2, n_embd=32))
    ids = tg.tensor(np.random.default_rng(0).integers(0, 16, (2, 16)))
    loss = language_model_loss(model, ids, ids)
    grads = tg.grad(loss, list(model.parameters()))
    started = time.perf_counter()
    schedule = schedule_kernels(optimize([loss.node] + [g.node for g in grads]))  # rewritten, as every program is
    assert time.perf_counter() - started < 10  # 0.3 s when written
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
