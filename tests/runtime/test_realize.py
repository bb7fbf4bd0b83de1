"""Realization reuses what it prepared for a graph structure: new data is only bound, never rewritten again."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.codegen.loop_ir import GemmCall, walk
from tensorgraphs.graph.ops import Op
from tensorgraphs.kernels import blas
from tensorgraphs.runtime import realize as realization
from tensorgraphs.schedule.extern import gemm_enabled


@pytest.fixture
def rewrites(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the graphs realization rewrites (one per structure it prepares)."""
    monkeypatch.setattr(realization, "_executables", type(realization._executables)())
    calls: list[int] = []
    optimize = realization.optimize

    def counting(*args, **kwargs):
        calls.append(1)
        return optimize(*args, **kwargs)

    monkeypatch.setattr(realization, "optimize", counting)
    return calls


def _expression(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return ((x * 3.0 + y).relu() - y.exp()).sum(0)


@pytest.mark.parametrize("device", ["numpy", "cpu"])
@pytest.mark.parametrize("interpret_below", [0, 1 << 30])
def test_a_structure_seen_before_is_only_rebound(device: str, interpret_below: int, rewrites: list[int],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CPU, "interpret_below", interpret_below)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((5, 7), dtype=np.float32) for _ in range(6)]
    with tg.device(device):
        results = [_expression(tg.tensor(a), tg.tensor(b)).numpy() for a, b in zip(arrays[::2], arrays[1::2])]
    assert len(rewrites) == 1
    with tg.device("numpy"):
        for got, a, b in zip(results, arrays[::2], arrays[1::2]):
            np.testing.assert_allclose(got, ((a * 3 + b).clip(0) - np.exp(b)).sum(0), rtol=1e-6, atol=1e-6)


def test_shared_inputs_make_another_structure(rewrites: list[int]) -> None:
    """x op x and x op y look alike to a per-node key; the program of one must not run the other."""
    a, b = np.float32([1, 2, 3]), np.float32([10, 20, 30])
    x, y = tg.tensor(a), tg.tensor(b)
    np.testing.assert_array_equal((x - y).numpy(), a - b)
    np.testing.assert_array_equal((x - x).numpy(), np.zeros(3, np.float32))
    assert len(rewrites) == 2


def test_a_new_rule_is_applied_to_a_structure_seen_before(rewrites: list[int]) -> None:
    x = tg.tensor(np.float32([1.0, -2.0]))
    expected = np.exp(np.float32([1.0, -2.0])) + np.float32(1)
    np.testing.assert_allclose((x.exp() + 1.0).numpy(), expected, rtol=1e-6)
    rule = tg.rewrite.rule("test_realize_exp_to_zero", lambda v: v.exp(), lambda v: v * 0.0)
    tg.rewrite.register(rule)
    try:
        np.testing.assert_array_equal((x.exp() + 1.0).numpy(), np.ones(2, np.float32))
    finally:
        tg.rewrite.unregister(rule.name)
    np.testing.assert_allclose((x.exp() + 1.0).numpy(), expected, rtol=1e-6)


def test_a_prepared_graph_keeps_no_input_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CPU, "interpret_below", 0)
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    alive = weakref.ref(array)
    value = (tg.tensor(array, dtype=tg.float32) * 2.0).numpy()
    np.testing.assert_array_equal(value, np.arange(12, dtype=np.float32).reshape(3, 4) * 2)
    del array, value
    gc.collect()
    assert alive() is None


def test_eager_training_steps_rewrite_nothing_after_the_first(rewrites: list[int]) -> None:
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(8, 16), tg.nn.ReLU(), tg.nn.Linear(16, 3))
    optimizer = tg.optim.Adam(model.parameters(), lr=1e-2)
    x, y = tg.randn(4, 8), tg.tensor([0, 2, 1, 1])
    counts = []
    for _ in range(4):
        optimizer.zero_grad()
        tg.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        counts.append(len(rewrites))
    assert counts[0] > 0 and counts[-1] == counts[0]


def test_owned_copies_results_that_share_memory_with_inputs_or_each_other() -> None:
    a, fresh = np.arange(6.0), np.ones(3)
    inputs = [a.reshape(2, 3), np.zeros(2)]
    values = realization.owned([a, a[1:], fresh, fresh[:2]], inputs)
    assert not any(np.shares_memory(v, a) for v in values[:2])
    assert values[2] is fresh and not np.shares_memory(values[3], fresh)
    np.testing.assert_array_equal(values[1], np.arange(1.0, 6.0))


def test_owned_keeps_disjoint_parts_of_one_allocation_and_copies_overlapping_ones() -> None:
    block = np.arange(12.0)
    parts = [block[0:4], block[4:8], block[8:12], block[6:10], block[8:12]]
    values = realization.owned(parts, [np.zeros(2)])
    assert all(values[i] is parts[i] for i in range(3))
    assert all(not np.shares_memory(values[i], block) for i in (3, 4))
    np.testing.assert_array_equal(np.concatenate(values), np.concatenate(parts))


def test_an_eager_training_step_is_two_native_calls_after_the_first(monkeypatch: pytest.MonkeyPatch,
                                                                    count_calls) -> None:
    """Forward and backward run as one program, every parameter's update as another (README: Eager mode)."""
    from tensorgraphs.backends import native

    monkeypatch.setattr(CPU, "interpret_below", 0)
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(8, 16), tg.nn.ReLU(), tg.nn.Linear(16, 3))
    optimizer = tg.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = tg.randn(4, 8), tg.tensor([0, 2, 1, 1])

    def step() -> float:
        loss = tg.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    first = step()
    calls = count_calls(native.Program, "run")
    losses = [step() for _ in range(3)]
    assert calls["run"] == 2 * 3
    assert losses[-1] < first


@pytest.mark.skipif(not (gemm_enabled() or blas.available()), reason="no product library runs here")
def test_an_eager_step_runs_its_products_by_a_library(monkeypatch: pytest.MonkeyPatch, rewrites: list[int]) -> None:
    """Wherever a product library runs (the AVX-512 GEMM, else OpenBLAS through the BLAS kernel), an eager step's
    matrix products are its calls, not loops (decomposed, they made an eager nanoGPT step 4x torch's time)."""
    monkeypatch.setattr(CPU, "interpret_below", 0)
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(8, 16), tg.nn.ReLU(), tg.nn.Linear(16, 3))
    x, y = tg.randn(4, 8), tg.tensor([0, 2, 1, 1])
    tg.nn.functional.cross_entropy(model(x), y).backward()
    (backward,) = [run for key, (run, _) in realization._executables.items() if key[2][0] == "backward"]
    calls = [s for kernel in backward._program.kernels for s in walk(kernel.body) if isinstance(s, GemmCall)]
    assert len(calls) == 5  # two products forward; both weight gradients and the second layer's input gradient


@pytest.mark.parametrize("interpret_below", [0, 1 << 30])
def test_batches_sliced_at_new_offsets_reuse_one_graph(interpret_below: int, rewrites: list[int],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A slice of a data buffer (no leaf differentiates into it) is an input array of the eager graph, so a
    batch taken at another offset each step is not a new structure: nothing is rewritten after the first step."""
    monkeypatch.setattr(CPU, "interpret_below", interpret_below)
    rng = np.random.default_rng(4)
    data_np, w_np = rng.standard_normal((40, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    data = tg.tensor(np.ascontiguousarray(data_np.T)).t()  # a view of the buffer, as batchify's .t() makes
    w = tg.tensor(w_np, requires_grad=True)
    assert not realization.is_data_view(data.node)  # no slice: a transpose stays in the graph, read in place
    counts = []
    for offset in (0, 7, 19, 30):
        batch = data[offset:offset + 8].t()
        loss = (batch.t() * w).tanh().sum()
        w.grad = None
        loss.backward()
        expected = np.tanh(data_np[offset:offset + 8] * w_np)
        np.testing.assert_allclose(loss.item(), expected.sum(), rtol=1e-5)
        np.testing.assert_allclose(w.grad.numpy(), ((1 - expected**2) * data_np[offset:offset + 8]).sum(0), rtol=1e-5)
        np.testing.assert_allclose((batch * 2.0).numpy(), data_np[offset:offset + 8].T * 2, rtol=1e-6)
        counts.append(len(rewrites))
    assert counts[0] > 0 and counts[-1] == counts[0]


@pytest.mark.parametrize("device", ["numpy", "cpu"])
def test_a_loop_carrying_a_realized_value_keeps_no_earlier_step_alive(device: str) -> None:
    """`x = f(x); x.realize()` in a loop: each step's graph starts from the last value, so neither the graphs nor
    the values of earlier steps stay alive (they did: every step's array was kept by the chain of nodes)."""
    rng = np.random.default_rng(0)
    start = rng.standard_normal(1000).astype(np.float32)
    with tg.device(device):
        x, expected = tg.tensor(start), start.copy()
        first_values = []
        for _ in range(6):
            x = x * 0.5 + 1.0
            expected = expected * np.float32(0.5) + np.float32(1.0)
            x.realize()
            if not first_values:
                first_values.append(weakref.ref(realization.realized_values(device)[x.node]))
        y = x * 2.0
        assert {n.op for n in y.node.toposort()} <= {Op.BUFFER, Op.CONST, Op.MUL}
        np.testing.assert_allclose(y.numpy(), expected * 2, rtol=1e-6)
        gc.collect()
        assert first_values[0]() is None


def test_a_realized_value_read_as_data_keeps_views_and_writes() -> None:
    """A tensor whose value was realized is read as data by later ops, and stays what torch has: slices of it are
    views that in-place writes go through, and writing into it changes later reads."""
    start = np.arange(6, dtype=np.float32).reshape(2, 3)
    results = []
    for lib in (torch, tg):
        x = lib.tensor(start) * 2
        x.numpy()
        row = x[1]
        row.mul_(10)
        x[0, 0] = -1.0
        results.append((x.numpy().copy(), row.numpy().copy()))
    for ours, theirs in zip(results[1], results[0]):
        np.testing.assert_array_equal(ours, theirs)


def _recurrent_steps(lib, steps: int, on_step=None) -> list[float]:
    """A GRU language-model step repeated with its hidden state detached between steps (torch's
    `repackage_hidden`), in `lib` (torch or tg) from the same weights and data."""
    rng = np.random.default_rng(1)
    lib.manual_seed(0)
    tokens = rng.integers(0, 11, (steps, 5, 3))
    embed, rnn, head = lib.nn.Embedding(11, 4), lib.nn.GRU(4, 6), lib.nn.Linear(6, 11)
    for module in (embed, rnn, head):
        for name, p in module.named_parameters():
            with lib.no_grad():
                p.copy_(lib.tensor(np.random.default_rng(len(name)).standard_normal(tuple(p.shape)) * 0.3,
                                   dtype=lib.float32))
    params = [*embed.parameters(), *rnn.parameters(), *head.parameters()]
    optimizer = lib.optim.SGD(params, lr=0.5)
    hidden, losses = None, []
    for step in range(steps):
        x = lib.tensor(tokens[step])
        out, hidden = rnn(embed(x), hidden)
        hidden = hidden.detach()
        loss = lib.nn.functional.cross_entropy(head(out[:-1]).reshape(-1, 11), x[1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if on_step:
            on_step()
    losses.append(float(hidden.sum()))
    return losses


def test_a_detached_hidden_state_is_computed_by_the_backward_and_read_as_data(rewrites: list[int]) -> None:
    """An RNN's hidden state carried between steps: the backward computes it with the gradients, so the next
    step's graph reads its value (it recomputed every earlier step, and compiled a new program each step)."""
    counts: list[int] = []
    ours = _recurrent_steps(tg, 5, lambda: counts.append(len(rewrites)))
    np.testing.assert_allclose(ours, _recurrent_steps(torch, 5), rtol=1e-5, atol=1e-6)
    # the first step's zero state is data as every later step's state is: one program for all steps
    assert counts[0] == counts[-1], counts


def _greedy_tokens(lib, steps: int, on_step=None) -> list[int]:
    """Greedy sampling from a GRU language model under no_grad, one token per step (a char-RNN's sample loop):
    the hidden state is never read by the loop, only carried."""
    lib.manual_seed(0)
    embed, rnn, head = lib.nn.Embedding(7, 4), lib.nn.GRU(4, 5), lib.nn.Linear(5, 7)
    for module in (embed, rnn, head):
        for name, p in module.named_parameters():
            with lib.no_grad():
                p.copy_(lib.tensor(np.random.default_rng(len(name)).standard_normal(tuple(p.shape)), dtype=lib.float32))
    token, hidden, tokens = lib.tensor([[3]]), None, []
    with lib.no_grad():
        for _ in range(steps):
            out, hidden = rnn(embed(token), hidden)
            token = head(out).argmax(-1)
            tokens.append(int(token.item()))
            if on_step:
                on_step()
    return tokens


def test_a_recurrent_state_carried_under_no_grad_is_computed_with_what_the_loop_reads(rewrites: list[int]) -> None:
    """The hidden state a recurrent layer returns is computed along with the next value realized, so each step's
    graph starts from it (it grew by a step each time: a new program per step, recomputing every step before)."""
    counts: list[int] = []
    assert _greedy_tokens(tg, 8, lambda: counts.append(len(rewrites))) == _greedy_tokens(torch, 8)
    assert counts[0] == counts[-1], counts


def test_a_temporary_an_op_detaches_is_not_carried(monkeypatch: pytest.MonkeyPatch) -> None:
    """BatchNorm detaches its batch statistics and an Embedding with padding_idx its padding rows inside their own
    graphs: no state carried to a later step, so the backward computes nothing besides the loss and gradients."""
    marked: list[int] = []
    carry = tg.frontend.tensor.carry
    monkeypatch.setattr(tg.frontend.tensor, "carry", lambda node, owner: (marked.append(1), carry(node, owner)))
    carried: list[int] = []
    carried_with = realization.carried_with
    monkeypatch.setattr(tg.frontend.backward, "carried_with",
                        lambda roots: carried.append(len(state := carried_with(roots))) or state)
    embed, model = tg.nn.Embedding(5, 8, padding_idx=0), tg.nn.Sequential(tg.nn.Linear(8, 3), tg.nn.BatchNorm1d(3))
    tokens = tg.tensor([0, 2, 1, 1])
    for _ in range(2):
        tg.nn.functional.cross_entropy(model(embed(tokens)), tokens).backward()
    assert marked and carried == [0, 0]
