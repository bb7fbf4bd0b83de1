"""Autograd behaviour compared with PyTorch: backward, .grad, detach, grad modes, tg.grad."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
import torch

import tensorgraphs as tg

Program = Callable[[Any, list[Any]], Any]  # (library module, leaves) -> output


def _leaves(library: Any, arrays: list[np.ndarray]) -> list[Any]:
    return [library.tensor(a.tolist(), dtype=library.float64, requires_grad=True) for a in arrays]


def _grads_after_backward(library: Any, program: Program, arrays: list[np.ndarray], calls: int = 1,
                          gradient: np.ndarray | None = None) -> list[np.ndarray | None]:
    """Run `program` and call backward `calls` times on its output; the leaves' .grad as numpy."""
    leaves = _leaves(library, arrays)
    out = program(library, leaves)
    seed = None if gradient is None else library.tensor(gradient.tolist(), dtype=library.float64)
    for _ in range(calls):
        out.backward(gradient=seed, retain_graph=True)
    return [None if t.grad is None else np.asarray(t.grad.numpy(), np.float64) for t in leaves]


def _assert_same_grads(program: Program, arrays: list[np.ndarray], **kwargs: Any) -> None:
    got = _grads_after_backward(tg, program, arrays, **kwargs)
    want = _grads_after_backward(torch, program, arrays, **kwargs)
    for position, (g, w) in enumerate(zip(got, want)):
        assert (g is None) == (w is None), f"leaf {position}: tg grad {g}, torch grad {w}"
        if w is not None:
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=f"leaf {position}")


RNG = np.random.default_rng(0)
A = RNG.standard_normal((3, 4))
B = RNG.standard_normal((4,))
C = RNG.standard_normal((3, 1))

PROGRAMS: dict[str, tuple[Program, list[np.ndarray]]] = {
    "square_sum": (lambda lib, t: (t[0] * t[0]).sum(), [A]),
    "broadcast_three_leaves": (lambda lib, t: ((t[0] * t[1] + t[2]).exp() / (1 + t[1] * t[1])).sum(), [A, B, C]),
    "diamond": (lambda lib, t: (lambda h: (h.sin() * h.exp() + h * h).sum())(t[0] * 2 + 1), [A]),
    "shared_subgraph_many_leaves": (
        lambda lib, t: (lambda s: (s * t[0]).sum() + (s * t[1]).sum() + s.sum() * t[2].sum())((t[0] @ t[1]).sum()),
        [A, B, C]),
    "maximum_and_amax": (lambda lib, t: lib.maximum(t[0], t[1]).amax(dim=1).sum(), [A, B]),
    "unused_leaf": (lambda lib, t: t[0].sum(), [A, B]),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_backward_matches_torch(name: str) -> None:
    program, arrays = PROGRAMS[name]
    _assert_same_grads(program, arrays)


def test_grad_accumulates_over_two_backward_calls() -> None:
    program, arrays = PROGRAMS["broadcast_three_leaves"]
    _assert_same_grads(program, arrays, calls=2)


def test_backward_with_explicit_gradient() -> None:
    gradient = np.random.default_rng(1).standard_normal((3, 4))
    _assert_same_grads(lambda lib, t: t[0].exp() * t[1], [A, B], gradient=gradient)


def test_backward_of_non_scalar_without_gradient_raises() -> None:
    x = tg.ones(3, requires_grad=True)
    with pytest.raises(tg.ArgumentError, match="scalar outputs"):
        (x * 2).backward()


def test_backward_gradient_of_wrong_shape_raises() -> None:
    x = tg.ones(3, requires_grad=True)
    with pytest.raises(tg.ShapeError, match=r"\(2,\).*\(3,\)"):
        (x * 2).backward(gradient=tg.ones(2))


def test_backward_of_tensor_without_grad_raises() -> None:
    with pytest.raises(tg.ArgumentError, match="does not require grad"):
        tg.ones(3).sum().backward()


def test_backward_with_create_graph_names_the_function_that_does_it() -> None:
    """The advice names tg.grad (torch.autograd.grad's name here; there is no tg.autograd.grad)."""
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(tg.UnsupportedError, match=r"use tg\.grad\(\.\.\., create_graph=True\)"):
        (x * x).sum().backward(create_graph=True)


def test_detach_stops_gradient_and_keeps_value() -> None:
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    frozen = x.detach()
    assert not frozen.requires_grad and frozen.is_leaf
    np.testing.assert_array_equal(frozen.numpy(), [1.0, 2.0, 3.0])
    (x * frozen).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0, 3.0])  # d/dx (x * c) = c, not 2x


def test_no_grad_results_do_not_require_grad() -> None:
    x = tg.ones(2, requires_grad=True)
    with tg.no_grad():
        y = x * 2
    assert not y.requires_grad
    assert (x * 2).requires_grad


def test_no_grad_path_sends_no_gradient_when_joined_with_the_parameter() -> None:
    """c = 3w is computed under no_grad, so d(sum(c * w))/dw = c = 3w (torch agrees), not 6w."""

    def program(lib: Any, t: list[Any]) -> Any:
        with lib.no_grad():
            constant = t[0] * 3
        return (constant * t[0]).sum()

    _assert_same_grads(program, [A])


def test_no_grad_as_decorator_and_enable_grad_inside() -> None:
    x = tg.ones(2, requires_grad=True)

    @tg.no_grad()
    def scaled(t: tg.Tensor) -> tg.Tensor:
        return t * 2

    assert not scaled(x).requires_grad
    assert tg.is_grad_enabled()
    with tg.no_grad():
        with tg.enable_grad():
            assert (x * 2).requires_grad
        assert not (x * 2).requires_grad
    assert tg.is_grad_enabled()


def test_set_grad_enabled_as_call_context_and_decorator() -> None:
    x = tg.ones(2, requires_grad=True)
    try:
        tg.set_grad_enabled(False)
        assert not tg.is_grad_enabled() and not (x * 2).requires_grad
    finally:
        tg.set_grad_enabled(True)
    with tg.set_grad_enabled(False):
        assert not tg.is_grad_enabled()
    assert tg.is_grad_enabled()

    @tg.set_grad_enabled(False)
    def scaled(t: tg.Tensor) -> tg.Tensor:
        return t * 2

    assert tg.is_grad_enabled()  # decorating does not switch the mode
    assert not scaled(x).requires_grad


def test_functional_grad_allow_unused() -> None:
    a = tg.tensor([1.0, 2.0], requires_grad=True)
    b = tg.tensor([3.0, 4.0], requires_grad=True)
    grad_a, grad_b = tg.grad((a * a).sum(), [a, b], allow_unused=True)
    np.testing.assert_array_equal(grad_a.numpy(), [2.0, 4.0])
    assert grad_b is None
    with pytest.raises(tg.ArgumentError, match="allow_unused"):
        tg.grad((a * a).sum(), [a, b])


def test_functional_grad_does_not_touch_dot_grad() -> None:
    a = tg.tensor([1.0, 2.0], requires_grad=True)
    tg.grad((a * a).sum(), [a])
    assert a.grad is None


def test_functional_grad_with_respect_to_non_leaf_tensors() -> None:
    def gradients(library: Any) -> list[np.ndarray]:
        (x,) = _leaves(library, [A])
        hidden = x.exp() * 2
        other = hidden.sin()
        out = (other * hidden).sum()
        return [np.asarray(g.numpy()) for g in (library.autograd.grad if library is torch else library.grad)(
            out, [hidden, other])]

    for got, want in zip(gradients(tg), gradients(torch)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_functional_grad_with_grad_outputs_and_two_outputs() -> None:
    cotangents = [np.arange(12.0).reshape(3, 4), np.array(2.0)]

    def gradients(library: Any) -> np.ndarray:
        (x,) = _leaves(library, [A])
        outputs = [x.sin(), (x * x).sum()]
        seeds = [library.tensor(c.tolist(), dtype=library.float64) for c in cotangents]
        grad_fn = torch.autograd.grad if library is torch else tg.grad
        return np.asarray(grad_fn(outputs, [x], grad_outputs=seeds)[0].numpy())

    np.testing.assert_allclose(gradients(tg), gradients(torch), rtol=1e-12)


def test_requires_grad_propagation_follows_torch() -> None:
    ops: dict[str, Callable[[Any], Any]] = {
        "mul": lambda x: x * 2,
        "floor": lambda x: x.floor(),
        "sign": lambda x: x.sign(),
        "to_float64": lambda x: x.to(torch.float64 if isinstance(x, torch.Tensor) else tg.float64),
        "to_int": lambda x: x.to(torch.int64 if isinstance(x, torch.Tensor) else tg.int64),
        "greater": lambda x: x > 0,
        "equal": lambda x: x == 1,
        "isnan": lambda x: x.isnan(),
        "argmax": lambda x: x.argmax(),
    }
    for name, op in ops.items():
        got = op(tg.tensor([1.0, -2.0], requires_grad=True)).requires_grad
        want = op(torch.tensor([1.0, -2.0], requires_grad=True)).requires_grad
        assert got == want, f"{name}: requires_grad {got}, torch {want}"


def test_comparison_of_a_grad_tensor_can_be_read() -> None:
    x = tg.tensor([1.0, -2.0], requires_grad=True)
    np.testing.assert_array_equal((x > 0).numpy(), [True, False])


@pytest.mark.parametrize("dtype", [tg.int64, tg.int32, tg.bool])
def test_integer_tensors_cannot_require_grad(dtype: Any) -> None:
    with pytest.raises(tg.DTypeError, match="floating point"):
        tg.zeros(2, dtype=dtype, requires_grad=True)
    with pytest.raises(tg.DTypeError, match="floating point"):
        tg.zeros(2, dtype=dtype).requires_grad_()


def test_non_leaf_cannot_change_requires_grad() -> None:
    x = tg.ones(2, requires_grad=True)
    with pytest.raises(tg.ArgumentError, match="leaf"):
        (x * 2).requires_grad_(False)


def test_assign_on_leaf_keeps_it_a_leaf_and_old_graphs_refuse_backward_like_torch() -> None:
    p = tg.tensor([1.0, 2.0], requires_grad=True)
    old = p * p
    p.assign(tg.tensor([5.0, 7.0]))  # as torch's `with no_grad(): p.copy_(...)`
    assert p.is_leaf and p.requires_grad
    np.testing.assert_array_equal(old.detach().numpy(), [1.0, 4.0])
    np.testing.assert_array_equal((p * p).detach().numpy(), [25.0, 49.0])
    with pytest.raises(tg.AutogradError, match="modified by an inplace operation"):
        old.sum().backward()
    (p * p).sum().backward()
    np.testing.assert_array_equal(p.grad.numpy(), [10.0, 14.0])


def test_writes_through_data_are_invisible_to_autograd_like_torch() -> None:
    """No error, as in torch; torch's old graph then reads the new values, tg's the values it was built from."""
    p = tg.tensor([1.0, 2.0], requires_grad=True)
    old = p * p
    p.data.mul_(10)
    old.sum().backward()
    np.testing.assert_array_equal(p.grad.numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(p.detach().numpy(), [10.0, 20.0])


def test_assign_after_the_value_was_read() -> None:
    p = tg.tensor([1.0, 2.0], requires_grad=True)
    old = p * 3
    np.testing.assert_array_equal(old.detach().numpy(), [3.0, 6.0])
    p.assign(tg.tensor([5.0, 7.0]))
    np.testing.assert_array_equal(p.detach().numpy(), [5.0, 7.0])
    np.testing.assert_array_equal(old.detach().numpy(), [3.0, 6.0])


def test_requires_grad_true_on_a_non_leaf_is_a_no_op() -> None:
    x = tg.ones(2, requires_grad=True)
    y = (x * 2).requires_grad_(True)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])


def test_zero_dim_leaf_gets_zero_dim_grad() -> None:
    x = tg.tensor(3.0, requires_grad=True)
    (x * x).backward()
    assert x.grad.shape == ()
    assert x.grad.item() == 6.0


def test_second_derivatives_with_create_graph_match_torch() -> None:
    def second(library: Any) -> list[np.ndarray]:
        x, y = _leaves(library, [A, C])
        out = (x.sin() * y.exp() * x * x).sum()
        grad_fn = torch.autograd.grad if library is torch else tg.grad
        (dx,) = grad_fn(out, [x], create_graph=True)
        return [np.asarray(g.detach().numpy()) for g in grad_fn((dx * dx).sum(), [x, y])]

    for got, want in zip(second(tg), second(torch)):
        np.testing.assert_allclose(got, want, rtol=1e-10)


def test_gradients_without_create_graph_do_not_require_grad() -> None:
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (dx,) = tg.grad((x * x).sum(), [x])
    assert not dx.requires_grad


def test_detach_then_requires_grad_makes_an_independent_leaf() -> None:
    """The torch idiom `w = data.detach().requires_grad_()`: uses of `data` send no gradient to `w`."""
    data = tg.tensor([1.0, 2.0, 3.0])
    w = data.detach().requires_grad_()
    (w * data).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0, 3.0])
    assert data.grad is None and not data.requires_grad


@pytest.fixture
def gradient_graphs_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the gradient graphs eager backward builds (a fresh cache, so the count starts at zero)."""
    from tensorgraphs.frontend import backward as backward_module
    from tensorgraphs.runtime import realize

    monkeypatch.setattr(realize, "_executables", type(realize._executables)())
    calls: list[int] = []
    build = backward_module._backward_graph
    monkeypatch.setattr(backward_module, "_backward_graph", lambda *args: calls.append(1) or build(*args))
    return calls


def test_repeated_backward_builds_the_gradient_graph_once_and_follows_new_values(
        gradient_graphs_built: list[int]) -> None:
    """Each step's graph has the structure of the last; its gradients must still be those of its own values."""
    rng = np.random.default_rng(1)
    for _ in range(3):
        arrays = [rng.standard_normal((3, 4)), rng.standard_normal((4, 2))]
        _assert_same_grads(lambda lib, t: (lib.tanh(t[0] @ t[1]) * t[0].sum()).sum(), arrays)
    assert len(gradient_graphs_built) == 1


def test_backward_layout_counts_which_leaves_have_a_grad(gradient_graphs_built: list[int]) -> None:
    """Accumulating into an existing .grad, or a leaf that stops requiring grad, is another gradient graph."""
    a, b = tg.tensor([1.0, 2.0], requires_grad=True), tg.tensor([3.0, 4.0], requires_grad=True)
    (a * b).sum().backward()
    (a * b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [6.0, 8.0])
    b.requires_grad_(False)
    (a * b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [9.0, 12.0])
    assert b.grad is not None and np.array_equal(b.grad.numpy(), [2.0, 4.0])
    assert len(gradient_graphs_built) == 3


def test_one_leaf_read_through_two_buffers_sums_both(gradient_graphs_built: list[int]) -> None:
    """A graph built before an assign reads the leaf's old buffer, one built after its new one: both count."""
    for _ in range(2):
        w = tg.tensor([1.0, 2.0], requires_grad=True)
        before = w * 3.0
        with tg.no_grad():
            w.assign(tg.tensor([5.0, 7.0]))
        (before * w).sum().backward()
        np.testing.assert_array_equal(w.grad.numpy(), [3.0 * 5.0 + 3.0 * 1.0, 3.0 * 7.0 + 3.0 * 2.0])
    assert len(gradient_graphs_built) == 1


def test_composite_reading_one_node_twice_gets_its_gradient_once() -> None:
    """A composite without a gradient rule is differentiated through its decomposition; a node at two of its
    positions must receive d/dx (x * x) = 2x, not twice that."""
    from tensorgraphs.frontend.tensor import apply_composite
    from tensorgraphs.graph.composite import Composite

    square = Composite("test_product_of_two", lambda a, b: (a.dtype, a.shape), lambda a, b: a * b)
    x = tg.tensor(np.array([1.0, -2.0, 3.0], np.float32), requires_grad=True)
    apply_composite(square, x, x).sum().backward()
    expected = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    (expected * expected).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), expected.grad.numpy())
