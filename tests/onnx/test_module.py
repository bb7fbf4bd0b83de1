"""tg.onnx.load: a model as a Module, checked against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx_models import cnn, mlp  # noqa: E402

import tensorgraphs as tg  # noqa: E402


def ort_outputs(model: onnx.ModelProto, *inputs: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: x for i, x in zip(session.get_inputs(), inputs)})


@pytest.mark.parametrize("batch", [1, 5])
def test_mlp_matches_onnxruntime_for_any_batch(batch: int) -> None:
    model = mlp()
    x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
    out = tg.onnx.load(model)(tg.tensor(x))
    np.testing.assert_allclose(out.detach().numpy(), ort_outputs(model, x)[0], rtol=1e-5, atol=1e-6)


def test_cnn_matches_onnxruntime() -> None:
    model = cnn()
    x = np.random.default_rng(1).standard_normal((2, 1, 8, 8)).astype(np.float32)
    out = tg.onnx.load(model)(x)
    np.testing.assert_allclose(out.detach().numpy(), ort_outputs(model, x)[0], rtol=1e-5, atol=1e-6)


def test_float_initializers_are_parameters_named_after_onnx(tmp_path) -> None:
    module = tg.onnx.load(mlp())
    names = dict(module.named_parameters())
    assert sorted(names) == ["fc1_bias", "fc1_weight", "fc2_bias", "fc2_weight"]
    assert module.initializer_names["fc1.weight"] == "fc1_weight"
    np.testing.assert_array_equal(names["fc1_weight"].detach().numpy(),
                                  onnx.numpy_helper.to_array(mlp().graph.initializer[0]))


def test_load_reads_a_path_with_external_data(tmp_path) -> None:
    model = mlp()
    path = tmp_path / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    x = np.ones((3, 8), np.float32)
    out = tg.onnx.load(str(path))(x)
    np.testing.assert_allclose(out.detach().numpy(), ort_outputs(mlp(), x)[0], rtol=1e-5, atol=1e-6)


def test_an_input_of_the_wrong_shape_names_the_input() -> None:
    with pytest.raises(tg.ShapeError, match=r"input 'x' must have shape \('\?', 8\), got \(2, 7\)"):
        tg.onnx.load(mlp())(np.ones((2, 7), np.float32))
