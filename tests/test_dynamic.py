"""tg.compile(dynamic=...): one program for many sizes, each size's result as its own static program's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn as nn
from tensorgraphs.backends.cpu import renderer as cpu_renderer
from tensorgraphs.errors import ArgumentError, ShapeError

SIZES = (6, 3, 17, 40, 9, 128, 6)


def data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def mlp() -> nn.Module:
    tg.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def mlp_reference(model: nn.Module, x: np.ndarray) -> np.ndarray:
    """The MLP in numpy, from its weights."""
    w1, b1, w2, b2 = (p.detach().numpy().astype(np.float64) for p in model.parameters())
    return np.maximum(x @ w1.T + b1, 0) @ w2.T + b2


@pytest.mark.parametrize("dynamic", [{"x": {0: tg.Dim("batch", 1, 4096)}}, {"x": {0: "batch"}}, True])
def test_one_program_for_many_batch_sizes(dynamic: object) -> None:
    model = mlp()
    forward = tg.compile(lambda x: model(x), dynamic=dynamic)
    for seed, batch in enumerate(SIZES):
        x = data(batch, 16, seed=seed)
        np.testing.assert_allclose(forward(x).numpy(), mlp_reference(model, x), rtol=1e-4, atol=1e-5)
    assert forward.compiled_programs == 1 and forward.stats.programs == 1
    shared = [trace for traces in forward.traces.values() for trace in traces if not trace.own_library]
    assert len(shared) == len(set(SIZES))  # every size, the first one too, runs the template's library


def test_each_size_keeps_its_static_programs_verified_memory_plan() -> None:
    model = mlp()
    forward = tg.compile(lambda x: model(x), dynamic={"x": {0: "batch"}})
    static = tg.compile(lambda x: model(x))
    for batch in SIZES:
        x = data(batch, 16)
        sized, alone = forward.traced(x).program, static.traced(x).program
        assert sized.memory.arena_bytes == alone.memory.arena_bytes
        assert sized.memory.offsets == alone.memory.offsets
    assert forward.compiled_programs == 1 and static.compiled_programs == len(set(SIZES))


def test_a_size_outside_the_range_compiles_its_own_program() -> None:
    model = mlp()
    forward = tg.compile(lambda x: model(x), dynamic={"x": {0: tg.Dim("batch", 2, 64)}})
    for batch in (5, 9, 100, 1):
        x = data(batch, 16)
        np.testing.assert_allclose(forward(x).numpy(), mlp_reference(model, x), rtol=1e-4, atol=1e-5)
    assert forward.compiled_programs == 3  # the template, then 100 and 1 each on their own


def test_a_size_used_as_a_value_recompiles_instead_of_reusing() -> None:
    """The mean over the batch divides by its size: no template fits, so every size compiles, and is right."""
    forward = tg.compile(lambda x: (x - x.mean(0)) * x.shape[0], dynamic={"x": {0: "batch"}})
    for batch in (4, 7, 12):
        x = data(batch, 8)
        np.testing.assert_allclose(forward(x).numpy(), (x - x.mean(0)) * batch, rtol=1e-5, atol=1e-5)
    assert forward.compiled_programs == 3


def test_sizes_a_function_takes_on_a_lattice_share_a_program_and_others_raise_naming_the_symbol() -> None:
    """A reshape into pairs takes only even sizes: probed on even sizes, one template (its loop bound is half the
    size) serves them all; an odd size raises the reshape's error at the call, naming the dynamic size."""
    forward = tg.compile(lambda x: x.reshape(-1, 2).sum(1), dynamic={"x": {0: tg.Dim("n", 2, 64)}})
    for n in (4, 6, 12, 20, 64):
        x = data(n)
        np.testing.assert_allclose(forward(x).numpy(), x.reshape(-1, 2).sum(1), rtol=1e-6)
    assert forward.compiled_programs == 1
    with pytest.raises(ShapeError, match="invalid for input of size 7") as raised:
        forward(data(7))
    assert raised.value.__notes__ == ["dynamic sizes of this call: 'n' = 7 (x dimension 0)"]


def test_a_stride_two_pool_shares_one_program_per_parity_of_its_size() -> None:
    """floor(h / 2) output rows: a polynomial of h only over one parity, so even and odd heights fit one template
    each."""
    torch = pytest.importorskip("torch")
    forward = tg.compile(lambda x: tg.nn.functional.avg_pool2d(x, 2) * 3, dynamic={"x": {2: tg.Dim("h", 2, 64)}})
    for h in (8, 10, 16, 9, 13, 31, 30):
        x = data(2, 3, h, 6, seed=h)
        expected = torch.nn.functional.avg_pool2d(torch.from_numpy(x), 2).numpy() * 3
        np.testing.assert_allclose(forward(x).numpy(), expected, rtol=1e-5, atol=1e-6)
    assert forward.compiled_programs == 2


def test_dimensions_named_alike_share_a_symbol() -> None:
    forward = tg.compile(lambda x, y: (x * y).sum(1), dynamic={"x": {0: "batch"}, "y": {0: "batch"}})
    for batch in (5, 8, 11):
        x, y = data(batch, 8), data(batch, 8, seed=1)
        np.testing.assert_allclose(forward(x, y).numpy(), (x * y).sum(1), rtol=1e-5, atol=1e-5)
    assert forward.compiled_programs == 1
    with pytest.raises(ArgumentError, match="named 'batch' differ"):
        forward(data(5, 8), data(6, 8))


def test_bad_specifications_raise_naming_the_argument() -> None:
    with pytest.raises(ArgumentError, match="min <= max"):
        tg.Dim("batch", 8, 4)
    forward = tg.compile(lambda x: x * 2, dynamic={"z": {0: "batch"}})
    with pytest.raises(ArgumentError, match="'z'"):
        forward(data(4, 2))
    forward = tg.compile(lambda x: x * 2, dynamic={"x": {2: "batch"}})
    with pytest.raises(ArgumentError, match="dimension 2"):
        forward(data(4, 2))


def test_encoder_layer_with_dynamic_batch_and_sequence_matches_the_reference() -> None:
    tg.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True, norm_first=True)
    layer.eval()
    forward = tg.compile(lambda x: layer(x), dynamic={"x": {0: tg.Dim("batch", 1, 64), 1: tg.Dim("seq", 2, 512)}})
    sizes = [(2, 9), (3, 11), (1, 20), (4, 7), (2, 33)]
    with tg.no_grad():
        for seed, (batch, seq) in enumerate(sizes):
            x = data(batch, seq, 32, seed=seed)
            with tg.device("numpy"):
                expected = layer(tg.tensor(x)).numpy()
            np.testing.assert_allclose(forward(x).numpy(), expected, rtol=1e-4, atol=1e-4)
    assert forward.compiled_programs <= 2
    shared = [trace for traces in forward.traces.values() for trace in traces if not trace.own_library]
    assert len(shared) >= len(sizes) - 1


def two_layer_encoder(module: object, functional: object) -> object:
    """bench/dynamic.py's encoder, narrower, in torch.nn or tg.nn."""
    def gelu_tanh(x: object) -> object:
        return functional.gelu(x, approximate="tanh")

    return module.Sequential(*[module.TransformerEncoderLayer(32, 2, 64, dropout=0.0, activation=gelu_tanh,
                                                              batch_first=True, norm_first=True) for _ in range(2)])


@pytest.mark.long
def test_an_encoder_shares_two_programs_across_sizes_on_both_sides_of_the_threads_threshold() -> None:
    """Batch 1 (its dimension is dropped where it broadcasts: another program) and every other size share two
    programs, though some kernels' work crosses PARALLEL_MIN_WORK between sizes (threads are chosen at run time);
    each size's result is its own static program's, bit for bit, and torch's."""
    torch = pytest.importorskip("torch")
    tg.manual_seed(0)
    model = two_layer_encoder(nn, tg.nn.functional).eval()
    reference = two_layer_encoder(torch.nn, torch.nn.functional).eval()
    reference.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in model.state_dict().items()})
    forward = tg.compile(lambda x: model(x), dynamic={"x": {0: tg.Dim("batch", 1, 64), 1: tg.Dim("seq", 1, 512)}})
    static = tg.compile(lambda x: model(x))
    sizes = [(1, 6), (2, 9), (3, 40), (1, 70), (8, 64), (5, 17), (2, 9)]  # FFN work 2048 * batch * seq
    assert 2048 * 2 * 9 < cpu_renderer.PARALLEL_MIN_WORK <= 2048 * 3 * 40
    with tg.no_grad(), torch.no_grad():
        for seed, (batch, seq) in enumerate(sizes):
            x = data(batch, seq, 32, seed=seed)
            got = forward(x).numpy()
            np.testing.assert_allclose(got, reference(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-4)
            if (batch, seq) in [(2, 9), (3, 40)]:
                np.testing.assert_array_equal(got, static(x).numpy())
    assert forward.compiled_programs == 2


def test_a_compiled_module_names_its_forward_arguments() -> None:
    model = mlp()
    compiled = tg.compile(model, dynamic={"input": {0: "batch"}})
    for batch in (5, 9, 13):
        x = data(batch, 16, seed=batch)
        np.testing.assert_allclose(compiled(tg.tensor(x)).detach().numpy(), mlp_reference(model, x),
                                   rtol=1e-4, atol=1e-5)
    assert compiled.compiled_forward.compiled_programs == 1


def test_arguments_are_found_by_name_passed_either_way() -> None:
    def scaled(x: tg.Tensor, factor: float, y: tg.Tensor) -> tg.Tensor:
        return x * factor + y

    forward = tg.compile(scaled, dynamic={"y": {0: "batch"}, "x": {0: "batch"}})
    for batch in (5, 8, 11):
        x, y = data(batch, 3), data(batch, 3, seed=1)
        np.testing.assert_allclose(forward(x, 2.0, y=y).numpy(), x * 2.0 + y, rtol=1e-6)
        np.testing.assert_allclose(forward(x, 3.0, y).numpy(), x * 3.0 + y, rtol=1e-6)
        np.testing.assert_allclose(forward(x, y=y[:, :1], factor=4.0).numpy(), x * 4.0 + y[:, :1], rtol=1e-6)
    assert forward.compiled_programs == 3  # y by keyword, by position, then both keywords: three signatures


def training_step(dynamic: object) -> tuple[tg.CompiledFunction, nn.Module]:
    model = mlp()
    optimizer = tg.optim.AdamW(model.parameters(), lr=0.01)

    def step(x: np.ndarray, y: np.ndarray) -> tg.Tensor:
        optimizer.zero_grad()
        loss = tg.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return tg.compile(step, dynamic=dynamic), model


@pytest.mark.long
def test_a_training_step_with_a_dynamic_batch_equals_the_static_steps(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward, backward (the mean's 1/batch included) and the update: bit for bit the static programs' steps. On
    a kernel database of its own: measurements other tests stored could plan one batch's products differently
    (a program of its own, rightly)."""
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    dynamic, trained = training_step({"x": {0: "batch"}, "y": {0: "batch"}})
    static, reference = training_step(None)
    rng = np.random.default_rng(0)
    for batch in (5, 9, 7):
        x, y = data(batch, 16, seed=batch), rng.integers(0, 4, batch)
        assert dynamic(x, y).item() == static(x, y).item()
    for got, expected in zip(trained.parameters(), reference.parameters()):
        np.testing.assert_array_equal(got.detach().numpy(), expected.detach().numpy())
    assert dynamic.compiled_programs == 1 and static.compiled_programs == 3
