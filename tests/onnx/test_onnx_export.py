"""tg.onnx.export: the written model passes onnx.checker and ONNX Runtime gives tensorgraphs' outputs, also for
other sizes of a dynamic axis."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import tensorgraphs as tg  # noqa: E402
import tensorgraphs.nn as nn  # noqa: E402
import tensorgraphs.nn.functional as F  # noqa: E402


def ort_run(model: onnx.ModelProto, *inputs: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: x for i, x in zip(session.get_inputs(), inputs)})


class SmallCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        h = F.max_pool2d(F.relu(self.conv(x)), 2)
        return F.log_softmax(self.fc(h.flatten(1)), dim=-1)


def test_a_module_exports_with_its_parameter_names(tmp_path) -> None:
    tg.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4), nn.Softmax(dim=-1))
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    path = tmp_path / "mlp.onnx"
    tg.onnx.export(model, (x,), path, input_names=["x"], output_names=["probs"])
    written = onnx.load(str(path))
    onnx.checker.check_model(written, full_check=True)
    assert {"0.weight", "0.bias", "2.weight", "2.bias"} <= {i.name for i in written.graph.initializer}
    with tg.no_grad():
        expected = model(tg.tensor(x)).numpy()
    np.testing.assert_allclose(ort_run(written, x)[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch", [1, 5])
def test_a_dynamic_batch_runs_at_other_sizes(batch: int) -> None:
    tg.manual_seed(0)
    model = SmallCnn()
    example = np.zeros((2, 1, 8, 8), np.float32)
    written = tg.onnx.export(model, (example,), input_names=["x"], output_names=["y"],
                             dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    x = np.random.default_rng(batch).standard_normal((batch, 1, 8, 8)).astype(np.float32)
    with tg.no_grad():
        expected = model(tg.tensor(x)).numpy()
    np.testing.assert_allclose(ort_run(written, x)[0], expected, rtol=1e-5, atol=1e-5)


def test_integer_floor_division_and_comparisons_export_exactly() -> None:
    def f(a: tg.Tensor, b: tg.Tensor) -> tuple[tg.Tensor, tg.Tensor]:
        return a // b, (a % b != 0) & (a < b)

    a = np.array([7, -7, 6, -6, 0], np.int64)
    b = np.array([2, 2, -4, -4, 3], np.int64)
    written = tg.onnx.export(f, (a, b))
    quotient, mask = ort_run(written, a, b)
    np.testing.assert_array_equal(quotient, a // b)
    np.testing.assert_array_equal(mask, (a % b != 0) & (a < b))


def test_an_export_round_trips_through_load() -> None:
    tg.manual_seed(1)
    model = SmallCnn()
    x = np.random.default_rng(2).standard_normal((3, 1, 8, 8)).astype(np.float32)
    loaded = tg.onnx.load(tg.onnx.export(model, (x,)))
    with tg.no_grad():
        np.testing.assert_allclose(loaded(x).numpy(), model(tg.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
