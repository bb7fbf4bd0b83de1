"""In-place ops, views and item assignment, against torch: values, gradients, aliasing and autograd's errors."""

from __future__ import annotations

import gc
from typing import Any, Callable

import numpy as np
import pytest
import torch

import tensorgraphs as tg


def _values(fn: Callable[[Any], Any]) -> None:
    """Run `fn` with `tg` and with `torch` as the library; every tensor it returns must match."""
    got, expected = fn(tg), fn(torch)
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for g, e in zip(got, expected, strict=True):
        e = e.detach().numpy() if isinstance(e, torch.Tensor) else np.asarray(e)
        np.testing.assert_allclose(np.asarray(g.detach().numpy() if isinstance(g, tg.Tensor) else g), e,
                                   rtol=1e-6, atol=1e-6)


def _grid(lib: Any, *shape: int) -> Any:
    return lib.arange(int(np.prod(shape)), dtype=lib.float32).reshape(shape)


# -- views share storage ------------------------------------------------------


@pytest.mark.parametrize("view", [
    lambda x: x[1], lambda x: x[:, 1:3], lambda x: x[..., ::2], lambda x: x[None, 1:, 0], lambda x: x[-1, -2:],
    lambda x: x.t(), lambda x: x.T, lambda x: x.reshape(-1), lambda x: x.view(2, 2, 3), lambda x: x.unsqueeze(0),
    lambda x: x.detach(), lambda x: x.data, lambda x: x.transpose(0, 1)[1:], lambda x: x.narrow(1, 1, 2),
    lambda x: x.chunk(2, dim=1)[1], lambda x: x.unbind(0)[2], lambda x: x.flatten()[3:9:2],
    lambda x: x.permute(1, 0)[::3],
], ids=lambda _: "")
def test_writes_through_a_view_reach_the_base_and_writes_to_the_base_reach_the_view(view: Callable) -> None:
    def run(lib: Any) -> tuple:
        x = _grid(lib, 3, 4)
        v = view(x)
        v.mul_(-2).add_(0.5)
        seen = v.clone()
        x.add_(100)
        return x, seen, v

    _values(run)


def test_sibling_views_see_each_others_writes() -> None:
    def run(lib: Any) -> tuple:
        x = lib.zeros(4, 6)
        left, right = x[:, :3], x.view(2, 12)
        left.fill_(1.0)
        right[1].sub_(3.0)
        return x, left, right

    _values(run)


def test_writing_an_expanded_view_is_refused_like_torch() -> None:
    x = tg.zeros(3, 1).expand(3, 4)
    with pytest.raises(tg.ShapeError, match="more than one element of the written-to tensor"):
        x.add_(1)


# -- in-place methods ----------------------------------------------------------


@pytest.mark.parametrize("name, args", [
    ("add_", (2.5,)), ("sub_", (1.5,)), ("mul_", (-3.0,)), ("div_", (4.0,)), ("pow_", (2,)), ("clamp_", (2.0, 7.0)),
    ("clamp_", (None, 3.0)), ("neg_", ()), ("abs_", ()), ("exp_", ()), ("sqrt_", ()), ("sigmoid_", ()),
    ("tanh_", ()), ("relu_", ()), ("floor_", ()), ("fill_", (7.0,)), ("zero_", ()), ("clip_", (1.0, 2.0)),
    ("lerp_", ("end", 0.25)), ("remainder_", (3.0,)), ("reciprocal_", ()), ("log_", ()), ("round_", ()),
    ("cumsum_", (1,)), ("tril_", ()),
], ids=str)
def test_in_place_method_matches_torch_and_returns_self(name: str, args: tuple) -> None:
    def run(lib: Any) -> tuple:
        x = _grid(lib, 2, 5) - 3.0 if name not in ("sqrt_", "log_") else _grid(lib, 2, 5) + 1.0
        out = getattr(x, name)(*(lib.full((2, 5), 10.0) if a == "end" else a for a in args))
        assert out is x
        return (x,)

    _values(run)


def test_tensor_arguments_broadcast_into_self_and_cast_to_its_dtype() -> None:
    def run(lib: Any) -> tuple:
        x = _grid(lib, 3, 4)
        x.add_(lib.tensor([1.0, 2.0, 3.0, 4.0]), alpha=2)
        x.mul_(lib.tensor([[2.0], [3.0], [4.0]]))
        n = lib.arange(4)
        n += 3
        n *= 2
        n.copy_(lib.tensor([1.7, -2.2, 3.9, 0.1]))  # copy_ casts anything
        return x, n

    _values(run)


def test_in_place_keeps_dtype_and_shape_like_torch() -> None:
    with pytest.raises(tg.DTypeError, match="result type float32 can't be cast to the desired output type int64"):
        tg.arange(3).add_(0.5)
    with pytest.raises(RuntimeError):
        torch.arange(3).add_(0.5)
    with pytest.raises(tg.ShapeError, match="doesn't match the broadcast shape"):
        tg.zeros(3).add_(tg.ones(2, 3))
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        torch.zeros(3).add_(torch.ones(2, 3))


def test_masked_fill_index_put_scatter_and_index_add_in_place() -> None:
    def run(lib: Any) -> tuple:
        x = _grid(lib, 3, 4)
        x.masked_fill_(x > 6, -1.0)
        y = _grid(lib, 3, 4)
        y.index_put_((lib.tensor([0, 2]), lib.tensor([1, 3])), lib.tensor([50.0, 60.0]))
        y.index_put_((lib.tensor([1, 1]),), lib.tensor(2.0), accumulate=True)
        z = lib.zeros(3, 4)
        z.scatter_(1, lib.tensor([[3, 0], [1, 2], [0, 0]]), _grid(lib, 3, 2) + 1)
        w = lib.ones(3, 4)
        w.scatter_(0, lib.tensor([[2, 1, 0, 2]]), 5.0)
        v = lib.zeros(4, 2)
        v.index_add_(0, lib.tensor([3, 0, 3]), _grid(lib, 3, 2), alpha=2)
        return x, y, z[:, 1:], w, v  # z[2] gets two writes to column 0: torch leaves the winner undefined

    _values(run)


def test_random_fills_replace_the_values_and_keep_the_leaf() -> None:
    w = tg.nn.Parameter(tg.zeros(200, 50))
    with tg.no_grad():
        w.normal_(1.0, 2.0)
    values = w.detach().numpy()
    assert abs(values.mean() - 1.0) < 0.1 and abs(values.std() - 2.0) < 0.1
    with tg.no_grad():
        w[:100].uniform_(-1.0, -0.5)
    values = w.detach().numpy()
    assert values[:100].min() >= -1.0 and values[:100].max() <= -0.5
    assert abs(values[100:].mean() - 1.0) < 0.15
    assert w.is_leaf and w.requires_grad


def test_nn_init_fills_a_view_of_a_parameter() -> None:
    layer = tg.nn.Linear(3, 4)
    tg.nn.init.zeros_(layer.weight[1:3])
    tg.nn.init.constant_(layer.bias[0], 7.0)
    weight = layer.weight.detach().numpy()
    assert (weight[1:3] == 0).all() and (weight[0] != 0).any() and layer.bias.detach().numpy()[0] == 7.0


# -- item assignment -------------------------------------------------------------


@pytest.mark.parametrize("index, value", [
    (1, 5.0), ((slice(None), 0), -1.0), ((slice(None), slice(0, None, 2)), "sin"), ((Ellipsis, 1), "column"),
    ((slice(1, 3), slice(None)), "row"), ((None, 0), 2.0), (-1, "row"), ([0, 2], 9.0), ("tensor", "pair"),
    (("tensor", "tensor"), 3.0), ((slice(None), [1, 3]), "column2"), ((1, slice(None, None, 3)), 8.0), ((), 4.0),
], ids=str)
def test_setitem_with_every_index_form_matches_torch(index: Any, value: Any) -> None:
    def run(lib: Any) -> tuple:
        x = _grid(lib, 3, 4)
        idx = tuple(lib.tensor([2, 0]) if i == "tensor" else i for i in index) if isinstance(index, tuple) else (
            lib.tensor([2, 0]) if index == "tensor" else index)
        val = {"sin": lib.sin(_grid(lib, 3, 2)), "column": lib.tensor([7.0, 8.0, 9.0]),
               "row": lib.tensor([1.0, 2, 3, 4]), "pair": lib.ones(2, 4) * 3,
               "column2": lib.tensor([[1.0], [2.0], [3.0]])}.get(value, value)
        x[idx] = val
        return (x,)

    _values(run)


def test_boolean_mask_assignment_matches_torch() -> None:
    def run(lib: Any) -> tuple:
        x = _grid(lib, 2, 3, 4)
        x[x > 17] = float("-inf")
        y = _grid(lib, 2, 3, 4)
        y[..., lib.tensor([True, False, False, True])] = 0.5
        z = _grid(lib, 2, 3, 4)
        z[lib.tensor([[True, False, True], [False, False, True]])] = lib.tensor([1.0, 2.0, 3.0, 4.0])
        return x, y, z

    _values(run)


def test_positional_encoding_buffer_built_by_slice_assignment() -> None:
    def run(lib: Any) -> tuple:
        length, width = 7, 6
        pe = lib.zeros(length, width)
        position = lib.arange(0, length, dtype=lib.float32).unsqueeze(1)
        div_term = lib.exp(lib.arange(0, width, 2).float() * (-np.log(10000.0) / width))
        pe[:, 0::2] = lib.sin(position * div_term)
        pe[:, 1::2] = lib.cos(position * div_term)
        return pe.unsqueeze(0).transpose(0, 1)

    _values(run)


# -- autograd ------------------------------------------------------------------------


def test_gradients_flow_through_in_place_writes_like_torch() -> None:
    def run(lib: Any) -> tuple:
        a = lib.tensor([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], requires_grad=True)
        b = lib.tensor([2.0, 3.0, -4.0], requires_grad=True)
        h = a * 2
        h[:, 1] = b[:2] * 3  # a slice of h now comes from b
        h.mul_(b)
        h[h < 0] = 0.0
        h += a.exp()
        (h * lib.tensor([1.0, 2.0, 3.0])).sum().backward()
        return a.grad, b.grad

    _values(run)


def test_a_buffer_filled_from_values_that_require_grad_passes_gradients_on() -> None:
    def run(lib: Any) -> Any:
        w = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        buffer = lib.zeros(3)
        buffer[0] = (w * w).sum()
        buffer[1:] = w[:2]
        assert buffer.requires_grad
        (buffer * lib.tensor([1.0, 2.0, 3.0])).sum().backward()
        return w.grad

    _values(run)


def test_leaf_updates_under_no_grad_keep_it_a_leaf_and_its_gradient() -> None:
    def run(lib: Any) -> tuple:
        w = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        with lib.no_grad():
            w.mul_(2)
            w[0] = -1.0
            w.data.add_(0.5)
        (w * w).sum().backward()
        assert w.is_leaf and w.requires_grad
        return w, w.grad

    _values(run)


@pytest.mark.parametrize("write, message", [
    (lambda w: w.add_(1), "a leaf Variable that requires grad is being used in an in-place operation"),
    (lambda w: w.__setitem__(0, 1.0), "a leaf Variable that requires grad is being used in an in-place operation"),
    (lambda w: w[1:].mul_(2), "a view of a leaf Variable that requires grad is being used in an in-place operation"),
    (lambda w: w.view(3, 1).zero_(), "a view of a leaf Variable that requires grad"),
])
def test_writing_a_leaf_that_requires_grad_raises_torchs_error(write: Callable, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        write(torch.ones(3, requires_grad=True))
    with pytest.raises(tg.AutogradError, match=message) as error:
        write(tg.ones(3, requires_grad=True))
    assert __file__ in str(error.value)
    write(tg.ones(3, requires_grad=True).detach())  # a detached alias may be written
    with tg.no_grad():
        write(tg.ones(3, requires_grad=True))


@pytest.mark.parametrize("program", ["exp_then_add", "product_then_add", "weight_changed", "input_changed"])
def test_a_value_backward_needs_that_was_modified_since_raises_like_torch(program: str) -> None:
    def run(lib: Any) -> Any:
        x = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        w = lib.tensor([0.5, -1.0, 2.0], requires_grad=True)
        if program == "exp_then_add":
            y = x.exp()
            y.add_(1)
            out = y.sum()
        elif program == "product_then_add":
            a = x * 2
            out = (a * a).sum()
            a.add_(1)
        elif program == "weight_changed":
            out = (w * x).sum()
            with lib.no_grad():
                w.mul_(2)
        else:
            h = x * 2
            out = (h * w).sum()
            h.sub_(1)
        out.backward()
        return x.grad

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        run(torch)
    with pytest.raises(tg.AutogradError, match="modified by an inplace operation"):
        run(tg)


@pytest.mark.parametrize("program", ["add_then_mul", "relu_in_place", "residual", "clone_first"])
def test_in_place_ops_torch_allows_give_torchs_gradients(program: str) -> None:
    def run(lib: Any) -> Any:
        x = lib.tensor([-1.0, 2.0, 3.0], requires_grad=True)
        if program == "add_then_mul":
            y = x + 1
            y.mul_(2)
        elif program == "relu_in_place":
            y = x * 2
            y.relu_()
            y = y * 3
        elif program == "residual":
            y = lib.nn.functional.layer_norm(x * 2, (3,))
            y += x
            y = lib.nn.functional.relu(y)
        else:
            e = x.exp()
            y = e.clone()
            y.add_(1)
            y = y * e
        y.sum().backward()
        return x.grad

    _values(run)


def test_second_backward_needs_retain_graph_like_torch() -> None:
    def run(lib: Any) -> Any:
        w = lib.tensor([1.0, 2.0], requires_grad=True)
        loss = (w * w).sum()
        loss.backward(retain_graph=True)
        loss.backward()
        with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
            loss.backward()
        return w.grad

    _values(run)


# -- creation helpers and .data --------------------------------------------------------


def test_new_tensor_methods_take_self_dtype() -> None:
    def run(lib: Any) -> tuple:
        x = lib.arange(6).reshape(2, 3)
        return (x.new_zeros(2, 2), x.new_ones((3,)), x.new_full((2,), 7), x.new_empty(4).zero_(),
                x.new_tensor([1, 2]), x.new_zeros(2, dtype=lib.float64))

    _values(run)
    x = tg.arange(6)
    assert x.new_zeros(2).dtype is tg.int64 and x.new_ones(2, dtype=tg.float32).dtype is tg.float32


def test_detach_in_place_like_torch() -> None:
    def run(lib: Any) -> Any:
        w = lib.tensor([1.0, 2.0], requires_grad=True)
        h = w * 3
        h.detach_()
        assert not h.requires_grad and h.is_leaf
        with pytest.raises(RuntimeError, match="Can't detach views in-place"):
            (w * 2)[0].detach_()
        (w * h).sum().backward()
        return w.grad

    _values(run)


def test_setting_data_replaces_the_value_and_keeps_the_parameter() -> None:
    layer = tg.nn.Linear(2, 3)
    weight = layer.weight
    layer.weight.data = tg.ones(3, 2) * 4
    assert layer.weight is weight and weight.requires_grad and weight.is_leaf
    layer(tg.ones(1, 2)).sum().backward()
    np.testing.assert_array_equal(weight.detach().numpy(), np.full((3, 2), 4.0, np.float32))
    np.testing.assert_array_equal(weight.grad.numpy(), np.ones((3, 2), np.float32))


# -- tg.compile ----------------------------------------------------------------------------


def test_in_place_writes_inside_a_compiled_function_are_visible_after_the_call() -> None:
    counter = tg.zeros(3)
    scale = tg.nn.Parameter(tg.ones(3))

    @tg.compile
    def step(x: tg.Tensor) -> tg.Tensor:
        counter.add_(x)
        counter[0] = counter[0] * 2
        with tg.no_grad():
            scale.mul_(2)
        return counter * 1

    x = tg.tensor([1.0, 2.0, 3.0])
    first, second = step(x).numpy(), step(x).numpy()
    np.testing.assert_array_equal(first, [2.0, 2.0, 3.0])
    np.testing.assert_array_equal(second, [6.0, 4.0, 6.0])
    np.testing.assert_array_equal(counter.numpy(), [6.0, 4.0, 6.0])
    np.testing.assert_array_equal(scale.detach().numpy(), [4.0, 4.0, 4.0])


def test_in_place_write_to_an_argument_of_a_compiled_function_reaches_the_caller() -> None:
    @tg.compile
    def normalize(x: tg.Tensor) -> tg.Tensor:
        total = x.sum()
        x.div_(total)
        return total

    for values in ([1.0, 3.0], [2.0, 2.0, 4.0], [5.0, 15.0]):
        x = tg.tensor(values)
        total = normalize(x)
        np.testing.assert_allclose(x.numpy(), np.array(values) / sum(values), rtol=1e-6)
        assert total.item() == sum(values)


def test_functional_inplace_flag_writes_into_the_input_and_its_views() -> None:
    def run(lib: Any) -> tuple:
        x = _grid(lib, 2, 3) - 2.5
        row = x[1]
        out = lib.nn.functional.relu(x, inplace=True)
        lib.nn.functional.hardtanh(row, -0.5, 0.5, inplace=True)
        assert out is x
        return x, row

    _values(run)
    with pytest.raises(tg.AutogradError, match="leaf Variable"):
        tg.nn.functional.relu(tg.ones(2, requires_grad=True), inplace=True)


def test_graphs_written_in_place_are_freed() -> None:
    from tensorgraphs.frontend.inplace_ops import overwritten

    w = tg.ones(8, requires_grad=True)
    for _ in range(5):
        y = w * 2
        y.add_(1)
        y[2:4] = 0.0
        y.sum().backward()
    del y
    gc.collect()
    assert len(overwritten) == 0


def _train_editing_in_place(system: str) -> tuple[list[float], np.ndarray]:
    """Gradients scaled and partly zeroed in place, a state_dict alias written, in `system`'s training step."""
    lib = torch if system == "torch" else tg
    model = lib.nn.Linear(3, 2)
    with lib.no_grad():
        model.weight.copy_(lib.tensor(np.arange(6.0).reshape(2, 3) / 10, dtype=lib.float32))
        model.bias.zero_()
    optimizer = lib.optim.SGD(model.parameters(), lr=0.1)
    state = model.state_dict()

    def step(x: Any) -> Any:
        optimizer.zero_grad()
        loss = model(x).pow(2).sum()
        loss.backward()
        for param in model.parameters():
            param.grad.mul_(0.5)
            param.grad[0] = 0.0
        optimizer.step()
        with lib.no_grad():
            state["bias"].add_(1.0)
        return loss.detach()

    step = tg.compile(step) if system == "tg.compile" else step
    losses = [step(lib.ones(4, 3)).item() for _ in range(3)]
    return losses, model.bias.detach().numpy()


@pytest.mark.parametrize("system", ["tg", "tg.compile"])
def test_training_step_editing_gradients_and_state_dict_in_place(system: str) -> None:
    losses, bias = _train_editing_in_place(system)
    expected_losses, expected_bias = _train_editing_in_place("torch")
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    np.testing.assert_allclose(bias, expected_bias, rtol=1e-5)
