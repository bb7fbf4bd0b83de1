"""tg.compile's binding of captured tensors: arrays read at one call are bound again at the next while no tensor was
given another node (`_Trace.read_inputs`), and every way a weight can change after that is seen at the next call."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs import compiled
from tensorgraphs.runtime import host, tracing


def data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def torch_conv(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    conv = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(weight), torch.tensor(bias), padding=1)
    return torch.relu(conv).numpy()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the captured tensors read one by one (the binding's slow path), call by call."""
    counts: list[int] = []
    read = compiled._CurrentValue.__call__

    def counted(self: compiled._CurrentValue, arrays: list[np.ndarray]) -> np.ndarray:
        counts[-1] += 1
        return read(self, arrays)

    monkeypatch.setattr(compiled._CurrentValue, "__call__", counted)
    return counts


def calls(fn: Callable[[], np.ndarray], counts: list[int], times: int) -> list[np.ndarray]:
    results = []
    for _ in range(times):
        counts.append(0)
        results.append(fn())
    return results


def test_captured_weights_are_bound_without_reading_each_tensor_while_nothing_is_replaced(reads: list[int]) -> None:
    conv = tg.nn.Conv2d(3, 8, 3, padding=1).requires_grad_(False)
    forward = tg.compile(lambda x: F.relu(conv(x)))
    x = data(2, 3, 9, 9)
    results = calls(lambda: forward(tg.tensor(x)).numpy(), reads, 4)
    expected = torch_conv(x, conv.weight.numpy(), conv.bias.numpy())
    for got in results:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # the trace's call reads both tensors, the next one reads them and remembers, later ones read none
    assert reads[1:] == [2, 0, 0]


@pytest.mark.parametrize("change", ["data", "assign", "in-place op", "load_state_dict"])
def test_weights_changed_after_compile_are_read_at_the_next_call(reads: list[int], change: str) -> None:
    conv = tg.nn.Conv2d(3, 8, 3, padding=1).requires_grad_(False)
    forward = tg.compile(lambda x: F.relu(conv(x)))
    x = data(1, 3, 7, 7)
    calls(lambda: forward(tg.tensor(x)).numpy(), reads, 3)
    new_weight = data(8, 3, 3, 3, seed=5)
    if change == "data":
        conv.weight.data = tg.tensor(new_weight)
    elif change == "assign":
        conv.weight.assign(tg.tensor(new_weight))
    elif change == "in-place op":
        new_weight = conv.weight.numpy() * 2 + 1
        conv.weight.mul_(2).add_(1)
    else:
        conv.load_state_dict({"weight": tg.tensor(new_weight), "bias": tg.tensor(conv.bias.numpy())})
    (got,) = calls(lambda: forward(tg.tensor(x)).numpy(), reads, 1)
    np.testing.assert_allclose(got, torch_conv(x, new_weight, conv.bias.numpy()), rtol=1e-5, atol=1e-5)
    assert reads[-1] > 0


def test_weights_a_compiled_training_step_updates_in_place_are_read_by_a_compiled_evaluation() -> None:
    model = tg.nn.Linear(6, 4)
    optimizer = tg.optim.SGD(model.parameters(), lr=0.5)

    @tg.compile
    def step(x: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        optimizer.step()
        return loss

    evaluate = tg.compile(lambda x: model(x))
    x = data(5, 6, seed=2)
    with tg.no_grad():
        evaluate(tg.tensor(x))  # traced before the first step, which gives the parameters arrays of their own
    step(tg.tensor(x))  # (the traces hold the nodes they read): later steps update those arrays in place
    for _ in range(3):
        with tg.no_grad():
            got = evaluate(tg.tensor(x)).numpy()
        weight, bias = model.weight.detach().numpy(), model.bias.detach().numpy()
        np.testing.assert_allclose(got, x @ weight.T + bias, rtol=1e-5, atol=1e-6)
        array = weakref.ref(model.weight._node.arg.data)  # weakly: a reference would make the step copy it
        step(tg.tensor(x))
        assert model.weight._node.arg.data is array()  # updated in place: the array evaluate bound, new values
        assert not np.allclose(model.weight.detach().numpy(), weight)


def test_a_weight_made_a_view_of_flat_optimizer_storage_is_read_through_its_base() -> None:
    model = tg.nn.Linear(4, 3)
    evaluate = tg.compile(lambda x: model(x))
    x = data(2, 4, seed=3)
    for _ in range(2):
        with tg.no_grad():
            evaluate(tg.tensor(x))
    optimizer = tg.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(2):  # eager steps: the flat storage makes each parameter a view of one array
        optimizer.zero_grad()
        (model(tg.tensor(x)) ** 2).sum().backward()
        optimizer.step()
    with tg.no_grad():
        got = evaluate(tg.tensor(x)).numpy()
    np.testing.assert_allclose(
        got, x @ model.weight.detach().numpy().T + model.bias.detach().numpy(), rtol=1e-5, atol=1e-6
    )


def test_a_numpy_argument_changed_in_place_between_calls_is_read_again() -> None:
    weight = tg.tensor(data(4, 4, seed=4))
    forward = tg.compile(lambda x: x @ weight)
    x = data(3, 4, seed=6)
    for _ in range(3):
        forward(x)
    x *= 3
    np.testing.assert_allclose(forward(x).numpy(), x @ weight.numpy(), rtol=1e-5, atol=1e-5)


def test_a_program_converts_only_the_inputs_it_was_not_given_as_they_were_last_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    weight = tg.tensor(data(4, 4, seed=10))
    forward = tg.compile(lambda x: x @ weight)
    x = data(4, 3, seed=11)
    view = x.T  # the same object at every call
    program = forward.traced(view).program
    converted: list[int] = []
    to_device = program.runtime.to_device
    monkeypatch.setattr(
        program.runtime, "to_device", lambda array, dtype: converted.append(1) or to_device(array, dtype)
    )
    for _ in range(3):
        converted.clear()
        np.testing.assert_allclose(forward(view).numpy(), x.T @ weight.numpy(), rtol=1e-5, atol=1e-5)
        x *= 2  # in place, behind a transposed view: copied to a contiguous array at every call
    assert converted == [1]  # the view; the weight's array is passed as it was at the call before


def test_giving_a_tensor_another_node_counts_as_a_replacement() -> None:
    tensor = tg.tensor(data(2))
    before = tracing.values_replaced
    tensor.data = tg.tensor(data(2, seed=1))
    assert tracing.values_replaced > before


def test_once_the_parameters_are_known_a_call_binds_only_its_argument_and_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layers = [tg.nn.Linear(8, 8).requires_grad_(False) for _ in range(3)]
    forward = tg.compile(lambda x: layers[2](F.relu(layers[1](F.relu(layers[0](x))))))
    bound: list[int] = []
    set_address = host.AddressTable.set
    monkeypatch.setattr(host.AddressTable, "set", lambda table, i, buffer: bound.append(i) or set_address(table, i,
                                                                                                          buffer))
    x = data(4, 8, seed=7)
    with tg.no_grad():
        for call in range(5):
            bound.clear()
            x = x + 1
            got = forward(tg.tensor(x)).numpy()
            expected = x
            for index, layer in enumerate(layers):
                expected = expected @ layer.weight.numpy().T + layer.bias.numpy()
                expected = np.maximum(expected, 0) if index < 2 else expected
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
            if call >= 2:  # the first call traces, the second reads the six parameters and remembers them
                assert len(bound) == 2  # the argument and the output, not the parameters


def test_compiled_functions_sharing_one_program_each_run_it_with_their_own_weights() -> None:
    first, second = (tg.nn.Conv2d(3, 4, 3, padding=1).requires_grad_(False) for _ in range(2))
    forwards = [tg.compile(lambda x, conv=conv: F.relu(conv(x))) for conv in (first, second)]
    x = data(1, 3, 6, 6, seed=8)
    assert forwards[0].traced(tg.tensor(x)).program is forwards[1].traced(tg.tensor(x)).program
    for call in range(4):
        for forward, conv in zip(forwards, (first, second)):
            y = x + call
            np.testing.assert_allclose(forward(tg.tensor(y)).numpy(), torch_conv(y, conv.weight.numpy(),
                                                                                 conv.bias.numpy()),
                                       rtol=1e-5, atol=1e-5)


def test_a_timed_run_between_calls_leaves_the_next_call_right() -> None:
    conv = tg.nn.Conv2d(3, 4, 3, padding=1).requires_grad_(False)
    forward = tg.compile(lambda x: F.relu(conv(x)))
    x = data(1, 3, 6, 6, seed=9)
    for call in range(3):
        forward(tg.tensor(x + call))
    forward.kernel_times(tg.tensor(x), repeat=1)
    with tg.profile():
        np.testing.assert_allclose(forward(tg.tensor(x + 5)).numpy(), torch_conv(x + 5, conv.weight.numpy(),
                                                                                  conv.bias.numpy()),
                                   rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(forward(tg.tensor(x + 6)).numpy(), torch_conv(x + 6, conv.weight.numpy(),
                                                                              conv.bias.numpy()),
                               rtol=1e-5, atol=1e-5)
