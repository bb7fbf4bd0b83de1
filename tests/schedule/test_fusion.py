"""The scheduler: which nodes get buffers, so fusion cannot silently regress (kernel counts)."""

from __future__ import annotations

import numpy as np

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.graph.ops import Op
from tensorgraphs.schedule import count_kernels, schedule_kernels
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


def test_mlp_training_step_kernel_counts() -> None:
    """Forward, backward and SGD update of a 2-layer MLP with cross entropy: the counts per kind of kernel."""
    rng = np.random.default_rng(0)
    x, y = tensor(32, 64), tg.tensor(rng.integers(0, 10, 32))
    params = [tg.tensor(rng.normal(size=s).astype(np.float32), requires_grad=True) for s in ((128, 64), (128,),
                                                                                          (10, 128), (10,))]
    w1, b1, w2, b2 = params
    loss = F.cross_entropy(F.linear(F.relu(F.linear(x, w1, b1)), w2, b2), y)
    grads = tg.grad(loss, params)
    updated = [p.detach() - 0.1 * g for p, g in zip(params, grads)]
    kernels = schedule_kernels([loss.node] + [u.node for u in updated]).kernels
    assert len(kernels) <= 16, [k.name for k in kernels]
