"""tg.compile: one trace per signature, replay on new data, captured tensors read at every call."""

from __future__ import annotations

import itertools
import weakref
from typing import Callable

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F


def data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_traces_once_per_signature_and_replays_new_data() -> None:
    calls = []

    @tg.compile
    def step(x: tg.Tensor, scale: float) -> tg.Tensor:
        calls.append(1)
        return F.softmax(x * scale, -1)

    for seed in range(3):
        x = data(4, 9, seed=seed)
        got = step(tg.tensor(x), 2.0).numpy()
        np.testing.assert_allclose(got, F.softmax(tg.tensor(x) * 2.0, -1).numpy(), rtol=1e-6, atol=1e-7)
    assert len(calls) == 1
    step(tg.tensor(data(5, 9)), 2.0)
    step(tg.tensor(data(5, 9)), 3.0)  # a number is a program input: same trace
    assert len(calls) == 2 and step.compiled_programs == 2


def test_numpy_inputs_tuple_outputs_and_captured_tensors() -> None:
    weight = tg.tensor(data(3, 4, seed=1), requires_grad=True)

    @tg.compile
    def forward(x: np.ndarray) -> tuple[tg.Tensor, tg.Tensor]:
        y = x @ weight.detach()
        return y, y.sum()

    x = data(2, 3, seed=2)
    y, total = forward(x)
    np.testing.assert_allclose(y.numpy(), x @ data(3, 4, seed=1), rtol=1e-5)
    np.testing.assert_allclose(total.item(), y.numpy().sum(), rtol=1e-5)
    weight.assign(tg.tensor(np.ones((3, 4), np.float32)))  # a new node: the program reads the weight per call
    y2, _ = forward(x)
    np.testing.assert_allclose(y2.numpy(), x @ np.ones((3, 4), np.float32), rtol=1e-5)
    assert len(forward.traces) == 1
    as_argument = tg.compile(lambda x, w: x @ w)
    np.testing.assert_allclose(as_argument(x, weight.detach()).numpy(), x @ np.ones((3, 4), np.float32), rtol=1e-5)


def test_non_tensor_results_are_rejected() -> None:
    with pytest.raises(tg.ArgumentError, match="must return a Tensor"):
        tg.compile(lambda x: 3)(tg.tensor(data(2)))


def test_stats_report_kernels_and_planned_memory() -> None:
    rng = np.random.default_rng(3)
    w, w2 = (tg.tensor(rng.normal(size=s).astype(np.float32)) for s in ((16, 16), (16, 4)))

    @tg.compile
    def step(x: tg.Tensor) -> tuple[tg.Tensor, tg.Tensor]:
        """x@w is read by two kernels, exp(x@w) feeds a matmul: two temporaries, the second may overwrite the first."""
        product = x @ w
        return ((product * 0.25).exp() @ w2), product.sum(0)

    with pytest.raises(tg.ArgumentError, match="call the compiled function once"):
        _ = step.stats
    step(tg.tensor(data(8, 16)))
    stats = step.stats
    assert stats.kernels == len(step.traces[next(iter(step.traces))][0].program.kernels) >= 2
    assert 0 < stats.arena_bytes < stats.naive_bytes and stats.compile_seconds > 0


# -- whole training steps -----------------------------------------------------------------------------------


def mlp_and_adam(lr: float = 1e-2) -> tuple[tg.nn.Module, tg.optim.Optimizer]:
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(8, 32), tg.nn.GELU(approximate="tanh"), tg.nn.Linear(32, 4))
    return model, tg.optim.Adam(model.parameters(), lr=lr)


def batches(steps: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.standard_normal((steps, 16, 8), dtype=np.float32), rng.integers(0, 4, (steps, 16))


def lazy_losses(model: tg.nn.Module, optimizer: tg.optim.Optimizer, xs: np.ndarray, ys: np.ndarray,
                scheduler: object = None) -> list[float]:
    losses = []
    for x, y in zip(xs, ys):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tg.tensor(x)), tg.tensor(y))
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    return losses


def assert_same_parameters(a: tg.nn.Module, b: tg.nn.Module) -> None:
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def reference_losses(steps: int) -> tuple[np.ndarray, np.ndarray, tg.nn.Module, list[float]]:
    """`steps` batches, the MLP trained on them with lazy steps, and its losses."""
    xs, ys = batches(steps)
    reference, reference_optimizer = mlp_and_adam()
    return xs, ys, reference, lazy_losses(reference, reference_optimizer, xs, ys)


def test_training_step_compiles_to_one_program_equal_to_lazy_steps(compiled_step: Callable) -> None:
    xs, ys, reference, expected = reference_losses(5)
    model, optimizer = mlp_and_adam()
    step = compiled_step(model, optimizer)
    got = [step(tg.tensor(x), tg.tensor(y)).item() for x, y in zip(xs, ys)]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert step.compiled_programs == 1  # traced once: state and lr are read per call
    assert_same_parameters(model, reference)
    for p, q in zip(model.parameters(), reference.parameters()):  # the last step's gradients stay readable
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-7)
        assert p.is_leaf and p.requires_grad
    state = optimizer.state[next(iter(model.parameters()))]
    assert float(state["step"].item()) == 5.0


def test_compiled_step_reads_the_learning_rate_each_call(compiled_step: Callable) -> None:
    xs, ys = batches(4)
    reference, reference_optimizer = mlp_and_adam()
    expected = lazy_losses(reference, reference_optimizer, xs, ys,
                           tg.optim.lr_scheduler.StepLR(reference_optimizer, step_size=1, gamma=0.1))
    model, optimizer = mlp_and_adam()
    scheduler = tg.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    step = compiled_step(model, optimizer)
    got = []
    for x, y in zip(xs, ys):
        got.append(step(tg.tensor(x), tg.tensor(y)).item())
        scheduler.step()
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert_same_parameters(model, reference)


def test_k_steps_in_one_call_equal_k_calls_and_leave_old_values_alone(compiled_step: Callable) -> None:
    xs, ys, reference, expected = reference_losses(5)
    model, optimizer = mlp_and_adam()
    first_weight = model[0].weight
    before = first_weight.detach().clone()  # shares the buffer the step reads until realized: must keep its values
    with tg.device("cpu"):  # realized where tg.compile captures values from: the trace must not capture it
        before_values = before.numpy()
    step = compiled_step(model, optimizer)
    losses = np.concatenate([step.steps(tg.tensor(xs[:2]), tg.tensor(ys[:2])).numpy(),
                             step.steps(tg.tensor(xs[2:]), tg.tensor(ys[2:])).numpy()])
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    assert_same_parameters(model, reference)
    np.testing.assert_array_equal(before.numpy(), before_values)
    assert model[0].weight is first_weight
    with pytest.raises(tg.ArgumentError, match="at least one step"):
        step.steps(tg.tensor(xs[:0]), tg.tensor(ys[:0]))


def test_gradient_accumulation_retraces_when_gradients_appear() -> None:
    xs, ys = batches(3)
    reference, reference_optimizer = mlp_and_adam()
    model, optimizer = mlp_and_adam()

    @tg.compile
    def accumulate(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for x, y in zip(xs, ys):
        accumulate(tg.tensor(x), tg.tensor(y))
        F.cross_entropy(reference(tg.tensor(x)), tg.tensor(y)).backward()
    assert accumulate.compiled_programs == 2  # without gradients, then adding to them
    for p, q in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_compiled_random_numbers_continue_the_eager_stream_per_call_and_per_step() -> None:
    x = tg.ones(64)
    tg.manual_seed(5)
    eager = [F.dropout(x, 0.5).numpy() for _ in range(4)]
    tg.manual_seed(5)
    dropout = tg.compile(lambda x: F.dropout(x, 0.5))
    got = [dropout(x).numpy(), *dropout.steps(tg.ones(3, 64)).numpy()]
    np.testing.assert_array_equal(np.stack(got), np.stack(eager))
    assert len({m.tobytes() for m in got}) == 4


def test_compiled_random_numbers_are_drawn_in_the_order_eager_code_draws_them() -> None:
    """Several random calls whose results the program computes in another order than they were made (here
    returned in reverse): each call and each step draws the keys as eager code does."""
    def draws(x: tg.Tensor) -> tuple[tg.Tensor, ...]:
        first = F.dropout(x, 0.5)
        second = tg.rand(8, 8).T.reshape(64) + x
        return second, first * 2

    x = tg.ones(64)
    tg.manual_seed(5)
    eager = [np.stack([t.numpy() for t in draws(x)]) for _ in range(4)]
    tg.manual_seed(5)
    compiled = tg.compile(draws)
    got = [np.stack([t.numpy() for t in compiled(x)])]
    got += list(np.stack([t.numpy() for t in compiled.steps(tg.ones(3, 64))], axis=1))
    np.testing.assert_array_equal(np.stack(got), np.stack(eager))


def test_reading_values_while_traced_fails_clearly_and_changes_nothing() -> None:
    with pytest.raises(tg.ArgumentError, match=r"inside a function being traced by tg.compile.*test_compiled.py"):
        tg.compile(lambda x: x * x.sum().item())(tg.tensor(data(3)))
    model, _ = mlp_and_adam()
    weights = [p.detach().numpy() for p in model.parameters()]
    with pytest.raises(tg.ArgumentError):
        tg.compile(lambda x: (model(x).sum().backward(), x.sum().item()))(tg.tensor(data(2, 8)))
    for p, w in zip(model.parameters(), weights):  # a failed trace leaves the model as it was
        np.testing.assert_array_equal(p.detach().numpy(), w)
        assert p.grad is None


def test_held_out_transformer_step_matches_torch_for_20_steps() -> None:
    """A pre-LN encoder layer, MSE loss and AdamW, compiled whole: torch's losses, and stats in range."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    config = dict(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True, norm_first=True)
    reference = torch.nn.TransformerEncoderLayer(**config)
    model = tg.nn.TransformerEncoderLayer(**config)
    model.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=3e-3, weight_decay=0.1)
    optimizer = tg.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    rng = np.random.default_rng(11)
    xs, ys = (rng.standard_normal((20, 2, 8, 32), dtype=np.float32) for _ in range(2))

    @tg.compile
    def step(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    expected = []
    for x, y in zip(xs, ys):
        loss = torch.nn.functional.mse_loss(reference(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        expected.append(loss.item())
    got = [step(tg.tensor(x), tg.tensor(y)).item() for x, y in zip(xs, ys)]
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    assert expected[-1] < expected[0]
    stats = step.stats
    assert stats.kernels >= 20 and 0 < stats.arena_bytes <= stats.naive_bytes
    assert all(p.grad is None for p in model.parameters())  # zero_grad() last: no gradient kept


@pytest.mark.long
def test_module_buffers_dropout_and_momentum_carry_through_calls_and_steps(compiled_step: Callable) -> None:
    """BatchNorm's running statistics (assigned in forward), dropout's keys and SGD's momentum buffers."""
    rng = np.random.default_rng(0)
    xs, ys = rng.standard_normal((4, 6, 8), dtype=np.float32), rng.integers(0, 3, (4, 6))

    def make() -> tuple[tg.nn.Module, tg.optim.Optimizer]:
        tg.manual_seed(0)
        model = tg.nn.Sequential(tg.nn.Linear(8, 16), tg.nn.BatchNorm1d(16), tg.nn.ReLU(), tg.nn.Dropout(0.2),
                                 tg.nn.Linear(16, 3))
        return model, tg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    reference, reference_optimizer = make()
    tg.manual_seed(1)
    expected = lazy_losses(reference, reference_optimizer, xs, ys)
    model, optimizer = make()
    tg.manual_seed(1)
    step = compiled_step(model, optimizer)
    got = [step(tg.tensor(xs[0]), tg.tensor(ys[0])).item(), *step.steps(tg.tensor(xs[1:]), tg.tensor(ys[1:])).numpy()]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert_same_parameters(model, reference)
    np.testing.assert_allclose(model[1].running_var.numpy(), reference[1].running_var.numpy(), rtol=1e-5)
    assert model[1].num_batches_tracked.item() == reference[1].num_batches_tracked.item() == 4


def test_switching_train_and_eval_mode_gives_its_own_trace() -> None:
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(4, 4), tg.nn.Dropout(0.5))
    forward = tg.compile(lambda x: model(x))
    x = tg.ones(2, 4)
    trained = forward(x).numpy()
    model.eval()
    evaluated = forward(x).numpy()
    with tg.no_grad():
        np.testing.assert_allclose(evaluated, model(x).numpy(), rtol=1e-6)  # no dropout in eval mode
    assert (trained == 0).any() and not np.array_equal(trained, evaluated)
    assert forward.compiled_programs == 2
    model.train()
    forward(x)
    assert forward.compiled_programs == 2  # the training trace again


def test_parameters_and_optimizer_state_are_updated_in_place_unless_something_else_sees_them(
        compiled_step: Callable) -> None:
    xs, ys, reference, expected = reference_losses(4)
    model, optimizer = mlp_and_adam()
    step = compiled_step(model, optimizer)
    losses = [step(tg.tensor(xs[0]), tg.tensor(ys[0])).item(), step(tg.tensor(xs[1]), tg.tensor(ys[1])).item()]
    (trace,) = next(iter(step.traces.values()))
    assert len(trace.program.updated_in_place) >= len(list(model.parameters()))
    weight = model[0].weight
    address = lambda t: t.node.arg.data.ctypes.data  # noqa: E731  (holding the array itself would count as a user)
    before = address(weight), address(optimizer.state[weight]["exp_avg"])
    node = weakref.ref(weight.node)  # a weak reference: a strong one would count as a user
    losses.append(step(tg.tensor(xs[2]), tg.tensor(ys[2])).item())
    assert (address(weight), address(optimizer.state[weight]["exp_avg"])) == before
    assert node() is weight.node  # nothing to rebind: the array its node holds was updated
    view = weight.detach().clone()  # shares the array lazily: the next call must leave it alone (it works on a copy)
    kept = view.numpy()
    losses.append(step(tg.tensor(xs[3]), tg.tensor(ys[3])).item())
    np.testing.assert_array_equal(view.numpy(), kept)
    assert address(weight) != before[0]
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    assert_same_parameters(model, reference)


def test_two_optimizer_steps_in_one_traced_call_equal_two_lazy_steps() -> None:
    """The second step reads the parameters the first one assigned (stand-ins resolved through each other)."""
    xs, ys = batches(2)

    def two_steps(model: tg.nn.Module, optimizer: tg.optim.Optimizer, x: tg.Tensor, y: tg.Tensor) -> tuple:
        losses = []
        for _ in range(2):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss)
        return tuple(losses)

    reference, reference_optimizer = mlp_and_adam()
    expected = [t.item() for t in two_steps(reference, reference_optimizer, tg.tensor(xs[0]), tg.tensor(ys[0]))]
    model, optimizer = mlp_and_adam()
    step = tg.compile(lambda x, y: two_steps(model, optimizer, x, y))
    got = [t.item() for t in step(tg.tensor(xs[0]), tg.tensor(ys[0]))]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert_same_parameters(model, reference)


# -- gradients with respect to arguments (a leaf made from an argument reads it at every call) ---------------------

def make_leaf(kind: str, t: tg.Tensor) -> tg.Tensor:
    """The ways code turns an argument into a leaf to differentiate (tg and torch spell them alike)."""
    if kind == "detach":
        return t.detach().requires_grad_()
    if kind == "clone":
        return t.clone().requires_grad_()
    return t.requires_grad_()


def attention_grads(F: object, grad: Callable, kind: str, q: tg.Tensor, k: tg.Tensor, v: tg.Tensor) -> tuple:
    q, k, v = (make_leaf(kind, t) for t in (q, k, v))
    out = F.softmax(q @ k.transpose(-2, -1) / 8**0.5, -1) @ v
    loss = (out * out).sum()
    return (loss.detach(), *grad(loss, [q, k, v]))


def conv_grads(F: object, grad: Callable, kind: str, x: tg.Tensor, w: tg.Tensor) -> tuple:
    x, w = make_leaf(kind, x), make_leaf(kind, w)
    loss = (F.conv2d(x, w, padding=1).relu() ** 2).sum()
    return (loss.detach(), *grad(loss, [x, w]))


def torch_results(function: Callable, *arrays: np.ndarray) -> list[np.ndarray]:
    torch = pytest.importorskip("torch")
    results = function(torch.nn.functional, torch.autograd.grad, *(torch.from_numpy(a) for a in arrays))
    return [r.detach().numpy() for r in results]


def assert_compiled_equals_eager_and_torch(function: Callable, shapes: list[tuple[int, ...]],
                                           rtol: float = 1e-4) -> None:
    compiled = tg.compile(lambda *args: function(tg.nn.functional, tg.grad, *args))
    for seed in range(3):  # new values at every call: the program must read them
        arrays = [data(*shape, seed=10 * seed + i) * (seed + 1) for i, shape in enumerate(shapes)]
        got = [r.numpy() for r in compiled(*(tg.tensor(a) for a in arrays))]
        eager = [r.numpy() for r in function(tg.nn.functional, tg.grad, *(tg.tensor(a) for a in arrays))]
        expected = torch_results(function, *arrays)
        for index, (g, e, t) in enumerate(zip(got, eager, expected)):
            np.testing.assert_allclose(e, t, rtol=rtol, atol=1e-4 * np.abs(t).max(), err_msg=f"eager {index}")
            np.testing.assert_allclose(g, t, rtol=rtol, atol=1e-4 * np.abs(t).max(), err_msg=f"compiled {index}")
    assert sum(len(t) for t in compiled.traces.values()) == 1


@pytest.mark.parametrize("kind", ["detach", "clone", "argument"])
def test_attention_gradients_with_respect_to_arguments_match_torch(kind: str) -> None:
    assert_compiled_equals_eager_and_torch(lambda F, grad, *qkv: attention_grads(F, grad, kind, *qkv),
                                           [(1, 2, 16, 8)] * 3)


@pytest.mark.parametrize("kind", ["detach", "clone", "argument"])
def test_conv_gradients_with_respect_to_arguments_match_torch(kind: str) -> None:
    assert_compiled_equals_eager_and_torch(lambda F, grad, x, w: conv_grads(F, grad, kind, x, w),
                                           [(2, 3, 6, 6), (4, 3, 3, 3)])


def sdpa_grads(F: object, grad: Callable, kind: str, q: tg.Tensor, k: tg.Tensor, v: tg.Tensor,
               mask: tg.Tensor) -> tuple:
    q, k, v = (make_leaf(kind, t) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    loss = (out * causal).sum()
    return (loss.detach(), *grad(loss, [q, k, v]))


@pytest.mark.parametrize("kind", ["detach", "clone", "argument"])
def test_scaled_dot_product_attention_gradients_with_respect_to_arguments_match_torch(kind: str) -> None:
    assert_compiled_equals_eager_and_torch(lambda F, grad, *args: sdpa_grads(F, grad, kind, *args),
                                           [(2, 2, 6, 8), (2, 2, 5, 8), (2, 2, 5, 4), (6, 5)])


def mlp_loss(F: object, x: tg.Tensor, w1: tg.Tensor, b1: tg.Tensor, w2: tg.Tensor, b2: tg.Tensor) -> tg.Tensor:
    return (F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2) ** 2).mean()


def grad_and_value(grad: Callable, loss: Callable) -> Callable:
    """torch.func.grad_and_value written with tg.grad / torch.autograd.grad: gradients of `loss` with respect to
    every argument, and its value."""

    def gradient_function(*args: tg.Tensor) -> tuple:
        leaves = [a.detach().requires_grad_() for a in args]
        value = loss(*leaves)
        return (*grad(value, leaves), value.detach())

    return gradient_function


def test_a_compiled_gradient_function_matches_torch_func() -> None:
    """The torch.func style: the model's parameters are arguments of a pure loss, differentiated by a wrapper."""
    torch = pytest.importorskip("torch")
    compiled = tg.compile(grad_and_value(tg.grad, lambda *args: mlp_loss(tg.nn.functional, *args)))
    expected_function = torch.func.grad_and_value(lambda *args: mlp_loss(torch.nn.functional, *args),
                                                  argnums=(0, 1, 2, 3, 4))
    for seed in range(3):
        arrays = [data(*shape, seed=10 * seed + i) for i, shape in enumerate([(4, 6), (8, 6), (8,), (3, 8), (3,)])]
        got = [r.numpy() for r in compiled(*(tg.tensor(a) for a in arrays))]
        grads, value = expected_function(*(torch.from_numpy(a) for a in arrays))
        for index, (g, t) in enumerate(zip(got, [*grads, value])):
            np.testing.assert_allclose(g, t.numpy(), rtol=1e-4, atol=1e-6, err_msg=f"result {index}")
    assert sum(len(t) for t in compiled.traces.values()) == 1


def test_gradients_with_respect_to_captured_parameters_follow_the_weights_loaded_since() -> None:
    torch = pytest.importorskip("torch")
    reference = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                    torch.nn.Linear(4 * 5 * 5, 3))
    model = tg.nn.Sequential(tg.nn.Conv2d(2, 4, 3, padding=1), tg.nn.ReLU(), tg.nn.Flatten(),
                             tg.nn.Linear(4 * 5 * 5, 3))
    compiled = tg.compile(lambda x, y: tg.grad(F.cross_entropy(model(x), y), list(model.parameters())))
    x, y = data(2, 2, 5, 5), np.array([0, 2])
    for seed in range(3):
        torch.manual_seed(seed)
        for p in reference.parameters():
            torch.nn.init.normal_(p)
        model.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})
        got = compiled(tg.tensor(x), tg.tensor(y))
        loss = torch.nn.functional.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(y))
        expected = torch.autograd.grad(loss, list(reference.parameters()))
        for index, (g, t) in enumerate(zip(got, expected)):
            np.testing.assert_allclose(g.numpy(), t.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"parameter {index}")
    assert sum(len(t) for t in compiled.traces.values()) == 1


def test_tensor_copies_of_arguments_and_numbers_are_made_at_every_call() -> None:
    compiled = tg.compile(lambda x, n: tg.maximum(tg.tensor(x) * 2, tg.tensor(n)))
    for n in (1.0, 5.0):
        x = data(3, 4, seed=int(n)) * n
        np.testing.assert_allclose(compiled(tg.tensor(x), n).numpy(), np.maximum(x * 2, n), rtol=1e-6)
    assert sum(len(t) for t in compiled.traces.values()) == 1


def test_arguments_that_require_grad_are_traced_as_such() -> None:
    """As in eager code, the function sees whether an argument requires grad (a trace for each), can differentiate
    with respect to it directly, and may not set its .grad (the argument outside would not get it)."""
    def gradient_or_triple(x: tg.Tensor) -> tg.Tensor:
        return tg.grad((x ** 3).sum(), [x])[0] if x.requires_grad else x * 3

    compiled = tg.compile(gradient_or_triple)
    x = data(4)
    np.testing.assert_allclose(compiled(tg.tensor(x, requires_grad=True)).numpy(), 3 * x**2, rtol=1e-6)
    np.testing.assert_allclose(compiled(tg.tensor(x)).numpy(), 3 * x, rtol=1e-6)
    assert sum(len(t) for t in compiled.traces.values()) == 2

    def sets_the_argument_gradient(x: tg.Tensor) -> tg.Tensor:
        loss = (x * x).sum()
        loss.backward()
        return loss.detach()

    with pytest.raises(tg.UnsupportedError, match=r"cannot set the .grad of its own arguments.*test_compiled.py"):
        tg.compile(sets_the_argument_gradient)(tg.tensor(x, requires_grad=True))


def test_mlp_gradients_with_respect_to_input_and_captured_parameters_match_torch() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    model = tg.nn.Sequential(tg.nn.Linear(8, 16), tg.nn.Tanh(), tg.nn.Linear(16, 3))
    model.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})

    def mlp_grads(F: object, grad: Callable, x: tg.Tensor) -> tuple:
        net = reference if F is torch.nn.functional else model
        x = x.detach().requires_grad_()
        loss = (net(x) ** 2).mean()
        return (loss.detach(), *grad(loss, [x, *net.parameters()]))

    assert_compiled_equals_eager_and_torch(mlp_grads, [(5, 8)])


def test_detached_argument_is_read_at_every_call() -> None:
    compiled = tg.compile(lambda x, w: (x.detach() * w).sum(-1))
    for scale in (1.0, 2.0):
        x, w = data(3, 4) * scale, data(4, seed=1)
        np.testing.assert_allclose(compiled(tg.tensor(x), tg.tensor(w)).numpy(), (x * w).sum(-1), rtol=1e-5)


def test_a_value_kept_from_an_earlier_trace_is_refused_not_read_as_a_constant() -> None:
    kept: list[tg.Tensor] = []

    def remember(x: tg.Tensor) -> tg.Tensor:
        if not kept:
            kept.append(x * 2)
        return kept[0] + x

    compiled = tg.compile(remember)
    np.testing.assert_allclose(compiled(tg.ones(3)).numpy(), np.full(3, 3.0))
    with pytest.raises(tg.UnsupportedError, match=r"computed inside an earlier trace.*test_compiled.py"):
        compiled(tg.ones(3, dtype=tg.float64))


def test_a_value_kept_from_a_trace_is_refused_when_read_after_it() -> None:
    """Inside the trace the arguments are placeholders: a tensor made from one and kept past the call has no
    value, and reading it, or differentiating through it, says so instead of computing with zeros."""
    kept: list[tg.Tensor] = []

    def remember(x: tg.Tensor) -> tg.Tensor:
        kept.extend([x, x * 2, x.detach().requires_grad_()])
        return x + 1

    tg.compile(remember)(tg.ones(3))
    for device, tensor in itertools.product(["cpu", "numpy"], kept):
        with tg.device(device), pytest.raises(tg.UnsupportedError, match=r"kept past the call.*test_compiled.py"):
            tensor.detach().sum().item()
        with tg.device(device), pytest.raises(tg.UnsupportedError, match=r"kept past the call.*test_compiled.py"):
            tensor.detach().numpy()
    with pytest.raises(tg.UnsupportedError, match=r"backward: .*kept past the call.*test_compiled.py"):
        (kept[2] * kept[2]).sum().backward()


# -- captured tensors are read at every call -----------------------------------------------------------------------

def test_compiled_evaluation_reads_the_weights_trained_and_loaded_since() -> None:
    """An evaluation compiled once follows eager training (parameters, BatchNorm statistics) and load_state_dict."""
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(4, 8), tg.nn.BatchNorm1d(8), tg.nn.Linear(8, 2))
    optimizer = tg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = tg.tensor(data(6, 4)), tg.tensor(data(6, 2, seed=1))
    evaluate = tg.compile(lambda x, y: F.mse_loss(model(x), y))

    def expected() -> float:
        with tg.device("numpy"), tg.no_grad():
            return F.mse_loss(model(x), y).item()

    losses = []
    for _ in range(3):
        model.train()
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        model.eval()
        losses.append(evaluate(x, y).item())
        assert losses[-1] == pytest.approx(expected(), rel=1e-5)
    assert len(set(losses)) == 3
    model.load_state_dict({k: np.full(v.shape, 0.25, np.float32) for k, v in model.state_dict().items()})
    assert evaluate(x, y).item() == pytest.approx(expected(), rel=1e-5)
    assert sum(len(t) for t in evaluate.traces.values()) == 1


def test_compiled_optimizer_step_reads_gradients_set_outside() -> None:
    w = tg.tensor(data(3), requires_grad=True)
    optimizer = tg.optim.SGD([w], lr=0.5)
    step = tg.compile(lambda: (optimizer.step(), w.detach() * 1)[1])
    expected = data(3)
    for scale in (1.0, 2.0, 3.0):
        optimizer.zero_grad()
        (w * w * scale).sum().backward()
        expected = expected - 0.5 * 2 * scale * expected
        np.testing.assert_allclose(step().numpy(), expected, rtol=1e-6)
    optimizer.zero_grad()
    step()  # no gradient now: traced again, and the step leaves the parameter alone
    np.testing.assert_allclose(w.detach().numpy(), expected, rtol=1e-6)


def test_a_captured_tensor_that_changes_shape_is_refused() -> None:
    tg.manual_seed(0)
    model = tg.nn.Linear(3, 2)
    forward = tg.compile(lambda x: model(x))
    forward(tg.ones(1, 3))
    model.weight.node = tg.ones(2, 2).node
    with pytest.raises(tg.ArgumentError, match=r"float32\[2, 3\] when traced and is float32\[2, 2\].*test_compiled"):
        forward(tg.ones(1, 3))


# -- Python numbers are program inputs; other arguments are checked -------------------------------------------------

def test_number_arguments_are_read_per_call_without_new_traces() -> None:
    def scaled(x: tg.Tensor, scale: float, shift: int) -> tg.Tensor:
        return F.softmax(x * scale, -1) + shift

    compiled = tg.compile(scaled)
    x = data(4, 9)
    for scale, shift in ((1.0, 0), (2.5, 3), (-0.75, -2)):
        with tg.device("numpy"):
            expected = scaled(tg.tensor(x), scale, shift).numpy()
        np.testing.assert_allclose(compiled(tg.tensor(x), scale, shift).numpy(), expected, rtol=1e-6, atol=1e-7)
    assert sum(len(t) for t in compiled.traces.values()) == 1
    losses = compiled.steps(tg.tensor(np.stack([x, 2 * x])), 0.5, 1)
    with tg.device("numpy"):
        np.testing.assert_allclose(losses.numpy()[1], scaled(tg.tensor(2 * x), 0.5, 1).numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", [tg.float16, tg.float64, tg.int32])
def test_number_arguments_promote_like_python_numbers(dtype: tg.DType) -> None:
    x = tg.tensor(np.arange(1, 5)).to(dtype)
    for number in (0.1, 3):
        got = tg.compile(lambda x, s: x * s)(x, number)
        with tg.device("numpy"):
            expected = x * number
        assert got.dtype is expected.dtype
        np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_numbers_used_as_values_fix_the_trace_to_their_value() -> None:
    """A shape, a branch, math.sqrt: the trace holds for that value; other values are traced again."""
    import math

    def shaped(x: tg.Tensor, rows: int, scale: float) -> tg.Tensor:
        y = x.reshape(rows, -1)
        return y * math.sqrt(scale) if scale > 1 else y - scale

    compiled = tg.compile(shaped)
    x = tg.tensor(np.arange(12, dtype=np.float32))
    for rows, scale in ((3, 4.0), (4, 4.0), (3, 9.0), (3, 0.5), (3, 4.0)):
        np.testing.assert_allclose(compiled(x, rows, scale).numpy(), shaped(x, rows, scale).numpy(), rtol=1e-6)
    assert sum(len(t) for t in compiled.traces.values()) == 4


@pytest.mark.parametrize("argument", [[tg.ones(2)], {"x": tg.ones(2)}, {1, 2}])
def test_unsupported_arguments_name_the_argument_and_the_line(argument: object) -> None:
    with pytest.raises(tg.ArgumentError, match=rf"argument 1 is a {type(argument).__name__}.*test_compiled.py"):
        tg.compile(lambda x, a: x)(tg.ones(2), argument)


@pytest.mark.parametrize("name", ["index", "gather", "embedding", "cross_entropy"])
def test_out_of_range_indices_name_the_op_the_index_and_the_line(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    functions = {
        "index": lambda x, i: x[i],
        "gather": lambda x, i: x.gather(0, i.reshape(2, 1).expand(2, 3)),
        "embedding": lambda x, i: F.embedding(i, x),
        "cross_entropy": lambda x, i: F.cross_entropy(x[:2], i),
    }
    x, index = tg.tensor(data(4, 3)), tg.tensor([1, 7])
    pattern = r"gather: index 7 is out of bounds for axis \d with size [34] .*test_compiled.py"
    with pytest.raises(IndexError, match=pattern):
        tg.compile(functions[name])(x, index)
    monkeypatch.setattr(tg.backends.cpu.CPU, "interpret_below", 0)  # eager on the cpu device, compiled too
    with tg.device("cpu"), pytest.raises(IndexError, match=pattern):
        functions[name](x, index).numpy()


def test_state_tensors_made_equal_stay_separate_states() -> None:
    """Two `tg.zeros(3)` are one hash-consed node: a compiled function assigning both must still keep two states."""
    first, second = tg.zeros(3), tg.zeros(3)

    @tg.compile
    def accumulate(x: tg.Tensor) -> tg.Tensor:
        first.assign(first + x)
        second.assign(second + 2 * x)
        return first

    ones = np.ones(3, np.float32)
    for _ in range(3):
        accumulate(ones)
    np.testing.assert_array_equal(first.numpy(), 3 * ones)
    np.testing.assert_array_equal(second.numpy(), 6 * ones)
