"""Preparations kept across calls (`schedule.prepared`): the Winograd transform of conv weights, and the batch norm
folded into them, run once while the weights and statistics stay, and again whenever they change, however they
change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs import memory
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.codegen.loop_ir import ConvCall, NativeCall, walk
from tensorgraphs.graph.composite import is_composite, make_node
from tensorgraphs.graph.node import toposort
from tensorgraphs.kernels import gemm
from tensorgraphs.plan.choices import forced
from tensorgraphs.plan.signature import signature_of
from tensorgraphs.runtime import tracing
from tensorgraphs.schedule import convolution as conv
from tensorgraphs.schedule.extern import gemm_enabled

pytestmark = pytest.mark.skipif(not gemm_enabled(), reason="the conv kernels need AVX-512F and a C compiler")


def _floats(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


class _Net(tg.nn.Module):
    """A 3x3 conv with bias, a batch norm (folded into the conv's weights: the transform reads a computed value)
    and a relu."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = tg.nn.Conv2d(6, 20, 3, padding=1)
        self.norm = tg.nn.BatchNorm2d(20)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return tg.nn.functional.relu(self.norm(self.conv(x)))


def _torch_net(net: _Net) -> torch.nn.Module:
    reference = torch.nn.Sequential(torch.nn.Conv2d(6, 20, 3, padding=1), torch.nn.BatchNorm2d(20), torch.nn.ReLU())
    reference.load_state_dict({k.replace("conv.", "0.").replace("norm.", "1."): torch.from_numpy(v.numpy())
                               for k, v in net.state_dict().items()})
    return reference.double().eval()


def _expected(net: _Net, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return _torch_net(net)(torch.from_numpy(x).double()).numpy()


def _close(got: np.ndarray, expected: np.ndarray) -> None:
    assert np.abs(got - expected).max() < 3e-5 * np.abs(expected).max()


X_SHAPE = (2, 6, 9, 10)


def _winograd(out: tg.Tensor) -> dict:
    """Routes running every conv that computes `out` by the Winograd kernel."""
    return {signature_of(n): conv.WINOGRAD for n in toposort([out.node])
            if is_composite(n) and n.op.name == conv.CONV2D}


@pytest.fixture
def net() -> _Net:
    tg.manual_seed(0)
    net = _Net().eval()
    with tg.no_grad():
        net.norm.running_mean.copy_(tg.tensor(_floats((20,), 1)))
        net.norm.running_var.copy_(tg.tensor(np.abs(_floats((20,), 2)) + 0.5))
    return net


def _compiled(net: _Net):
    return tg.compile(lambda x: net(x))


def test_the_transform_is_a_kept_preparation(net: _Net) -> None:
    with forced(_winograd(net(tg.tensor(_floats(X_SHAPE, 0))))):
        f = _compiled(net)
        x = _floats(X_SHAPE, 3)
        program = f.traced(tg.tensor(x)).program
        (prepared,) = [i for i in program.preparations.kernels if program.kernels[i].prepares]
        kernel = program.kernels[prepared]
        assert [type(s) for s in walk(kernel.body)] == [NativeCall]
        convs = [s for k in program.kernels for s in walk(k.body) if isinstance(s, ConvCall)]
        assert [c.function for c in convs] == ["tg_conv2d_winograd_prepared_f32"]
        (kept,) = [b.name for b in kernel.buffers if b.writes]
        assert convs[0].prepared == kept and kept in program.preparations.kept
        # it keeps bytes of its own in the arena: live over every kernel
        lifetimes = {life.name: life for life in program.memory.lifetimes}
        assert (lifetimes[kept].start, lifetimes[kept].end) == (0, len(program.kernels) - 1)


def _folds(program) -> list:
    """The kernels of `program` that fold the batch norm into the conv's weights and bias (they read parameters only,
    and the conv reads what they write)."""
    (conv_kernel,) = [k for k in program.kernels if any(isinstance(s, ConvCall) for s in walk(k.body))]
    read_by_conv = {b.name for b in conv_kernel.buffers if not b.writes}
    return [i for i, k in enumerate(program.kernels)
            if not k.prepares and any(b.writes and b.name in read_by_conv for b in k.buffers)]


@pytest.mark.parametrize("route", [conv.WINOGRAD, conv.IMPLICIT_GEMM])
def test_the_batch_norm_folded_into_the_weights_is_kept(net: _Net, route: str) -> None:
    """The folds of a batch norm into the conv's weights and bias read only parameters and write no more than they
    read: kept like the transform, so a second call skips them (the weights' array written behind every
    tensorgraphs call leaves the output as it was), and their arena bytes are live over the whole program."""
    routes = {signature: route for signature in _winograd(net(tg.tensor(_floats(X_SHAPE, 0))))}
    with forced(routes):
        f = _compiled(net)
        x = _floats(X_SHAPE, 3)
        program = f.traced(tg.tensor(x)).program
        folds = _folds(program)
        assert len(folds) == 2 and set(folds) <= program.preparations.kernels
        lifetimes = {life.name: life for life in program.memory.lifetimes}
        for index in folds:
            (written,) = [b.name for b in program.kernels[index].buffers if b.writes]
            assert written in program.preparations.kept
            assert (lifetimes[written].start, lifetimes[written].end) == (0, len(program.kernels) - 1)
        expected = _expected(net, x)
        _close(f(tg.tensor(x)).numpy(), expected)
        net.conv.weight.node.arg.data[...] = 0.0
        net.norm.weight.node.arg.data[...] = 0.0
        _close(f(tg.tensor(x)).numpy(), expected)


def test_a_run_with_the_same_weights_skips_the_transform(net: _Net) -> None:
    """Writing the weights' array behind every tensorgraphs call (no tensor, no program sees it) leaves the kept
    transform as it was: the second call did not make it again. (Only a test may do this: the arrays tensors hold
    are theirs.)"""
    with forced(_winograd(net(tg.tensor(_floats(X_SHAPE, 0))))):
        f = _compiled(net)
        x = _floats(X_SHAPE, 3)
        expected = _expected(net, x)
        _close(f(tg.tensor(x)).numpy(), expected)
        net.conv.weight.node.arg.data[...] = 0.0  # the array the program reads, written in place
        _close(f(tg.tensor(x)).numpy(), expected)


@pytest.mark.parametrize("change", ["assign", "copy_", "load_state_dict", "optimizer"])
def test_new_weights_are_transformed_again(net: _Net, change: str) -> None:
    with forced(_winograd(net(tg.tensor(_floats(X_SHAPE, 0))))):
        f = _compiled(net)
        x = _floats(X_SHAPE, 3)
        _close(f(tg.tensor(x)).numpy(), _expected(net, x))
        new = _floats((20, 6, 3, 3), 4)
        if change == "assign":
            net.conv.weight.data = tg.tensor(new)
        elif change == "copy_":
            with tg.no_grad():
                net.conv.weight.copy_(tg.tensor(new))
        elif change == "load_state_dict":
            net.load_state_dict({**net.state_dict(), "conv.weight": tg.tensor(new)})
        else:
            net.conv.weight.grad = tg.tensor(new)
            tg.optim.SGD([net.conv.weight], lr=0.5).step()
        for _ in range(2):
            _close(f(tg.tensor(x)).numpy(), _expected(net, x))


@pytest.mark.parametrize("route", [conv.WINOGRAD, conv.IMPLICIT_GEMM])
@pytest.mark.parametrize("change", ["assign", "copy_", "load_state_dict"])
def test_new_batch_norm_statistics_are_folded_again(net: _Net, route: str, change: str) -> None:
    """The kept folds of the batch norm read its statistics and affine parameters: new values of any of them, however
    given, are folded into the weights and bias again."""
    routes = {signature: route for signature in _winograd(net(tg.tensor(_floats(X_SHAPE, 0))))}
    with forced(routes):
        f = _compiled(net)
        x = _floats(X_SHAPE, 3)
        _close(f(tg.tensor(x)).numpy(), _expected(net, x))
        for seed, name in enumerate(["running_var", "running_mean", "weight", "bias"], 10):
            new = np.abs(_floats((20,), seed)) + 0.5
            if change == "assign":
                getattr(net.norm, name).data = tg.tensor(new)
            elif change == "copy_":
                with tg.no_grad():
                    getattr(net.norm, name).copy_(tg.tensor(new))
            else:
                net.load_state_dict({**net.state_dict(), f"norm.{name}": tg.tensor(new)})
            for _ in range(2):
                _close(f(tg.tensor(x)).numpy(), _expected(net, x))


def test_weights_a_compiled_step_updates_in_place_are_transformed_again() -> None:
    """A compiled training step updates the weights (in place where nothing else holds their arrays); an inference
    function compiled beside it sees every update."""
    tg.manual_seed(0)
    layer = tg.nn.Conv2d(6, 20, 3, padding=1)
    x = _floats(X_SHAPE, 3)
    with forced(_winograd(layer(tg.tensor(x)))):
        infer = tg.compile(lambda x: layer(x).relu())
        optimizer = tg.optim.SGD(layer.parameters(), lr=0.1)

        @tg.compile
        def step(x: tg.Tensor) -> tg.Tensor:
            optimizer.zero_grad()
            out = layer(x)
            loss = (out * out).mean()
            loss.backward()
            optimizer.step()
            return loss

        for _ in range(4):
            step(tg.tensor(x))
            weight, bias = (torch.from_numpy(p.node.arg.data.astype(np.float64)) for p in (layer.weight, layer.bias))
            expected = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x).double(), weight, bias,
                                                             padding=1)).numpy()
            _close(infer(tg.tensor(x)).numpy(), expected)


def test_an_array_written_in_place_is_transformed_again(net: _Net) -> None:
    """Whatever writes a tensor's array in place (a compiled step updating state only it holds, a collective) notes
    it (`tracing.note_value_written`): the next run makes the transform again, from the same array object."""
    with forced(_winograd(net(tg.tensor(_floats(X_SHAPE, 0))))):
        f = _compiled(net)
        x = _floats(X_SHAPE, 3)
        f(tg.tensor(x))
        net.conv.weight.node.arg.data[...] = _floats((20, 6, 3, 3), 4)
        tracing.note_value_written()
        _close(f(tg.tensor(x)).numpy(), _expected(net, x))


def test_a_weight_given_as_an_argument_is_transformed_at_every_call() -> None:
    """An argument may be the same array, written in place by the caller between calls: never kept."""
    x, weight = _floats(X_SHAPE, 3), _floats((20, 6, 3, 3), 4)
    with forced(_winograd(tg.nn.functional.conv2d(tg.tensor(x), tg.tensor(weight), padding=1))):
        f = tg.compile(lambda x, w: tg.nn.functional.conv2d(x, w, padding=1).relu())
        assert not f.traced(x, weight).program.preparations.kernels
        for seed in (5, 6):
            got = f(x, weight).numpy()
            expected = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x).double(),
                                                             torch.from_numpy(weight).double(), padding=1)).numpy()
            _close(got, expected)
            weight[...] = _floats(weight.shape, seed)


def test_poisoned_runs_make_the_transform_again(net: _Net, monkeypatch: pytest.MonkeyPatch) -> None:
    """TG_POISON=1 fills the arena with NaN before each run, kept bytes included: each run then prepares anew."""
    monkeypatch.setattr(memory.arena, "poison_enabled", lambda: True)
    monkeypatch.setattr(memory, "poison_enabled", lambda: True)
    with forced(_winograd(net(tg.tensor(_floats(X_SHAPE, 0))))):
        f = _compiled(net)
        x = _floats(X_SHAPE, 3)
        for _ in range(3):
            _close(f(tg.tensor(x)).numpy(), _expected(net, x))


@pytest.mark.parametrize("shape", [(1, 1, 3, 3), (5, 3, 3, 3), (17, 16, 3, 3), (3, 33, 3, 3)])
@pytest.mark.parametrize("special", [None, np.inf, np.nan])
def test_the_transform_kernel_matches_its_decomposition(shape: tuple[int, ...], special: float | None) -> None:
    weight = _floats(shape, 7)
    if special is not None:
        weight.flat[weight.size // 2] = special
    node = make_node(conv.WINOGRAD_WEIGHTS, (tg.tensor(weight).node,), {}, tg.float32,
                     (36 * shape[0] * shape[1] + 1,))
    (expected,) = REFERENCE.evaluate([node])
    got = gemm.winograd_weights(weight)
    assert got[-1] == expected[-1] == (special is None)
    if special is None:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6 * np.abs(expected).max())

