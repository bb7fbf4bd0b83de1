"""An imported model fine-tunes: a torch model exported to ONNX, loaded with tg.onnx.load, trained with tg.optim;
its gradients and its losses match the torch model's on the same weights and data."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

import tensorgraphs as tg  # noqa: E402
import tensorgraphs.nn.functional as F  # noqa: E402


def torch_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3))


def exported(model: torch.nn.Module, example: torch.Tensor) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), buffer, dynamo=False, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}}, do_constant_folding=False, opset_version=17)
    return onnx.load_from_string(buffer.getvalue())


def batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((6, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 6)


def test_gradients_of_an_imported_model_match_torch() -> None:
    reference = torch_cnn()
    x, y = batch(0)
    module = tg.onnx.load(exported(reference, torch.from_numpy(x)))
    loss = F.cross_entropy(module(tg.tensor(x)), tg.tensor(y))
    loss.backward()
    expected = torch.nn.functional.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(y))
    expected.backward()
    torch_params = dict(reference.named_parameters())
    assert len(torch_params) == len(list(module.parameters())) == 4
    np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-5)
    for onnx_name, attribute in module.initializer_names.items():
        grad = getattr(module, attribute).grad.numpy()
        np.testing.assert_allclose(grad, torch_params[onnx_name].grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=onnx_name)


def test_an_imported_model_fine_tunes_as_torch_does() -> None:
    reference = torch_cnn()
    module = tg.onnx.load(exported(reference, torch.zeros(2, 1, 8, 8)))
    optimizer = tg.optim.Adam(module.parameters(), lr=1e-2)
    torch_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    x, y = batch(1)
    losses, torch_losses = [], []
    for _ in range(10):
        optimizer.zero_grad()
        loss = F.cross_entropy(module(tg.tensor(x)), tg.tensor(y))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        torch_optimizer.zero_grad()
        torch_loss = torch.nn.functional.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(y))
        torch_loss.backward()
        torch_optimizer.step()
        torch_losses.append(torch_loss.item())
    assert losses[-1] < 0.5 * losses[0]
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-3)


def test_a_fine_tuned_model_saves_and_loads(tmp_path) -> None:
    module = tg.onnx.load(exported(torch_cnn(), torch.zeros(1, 1, 8, 8)))
    path = tmp_path / "tuned.safetensors"
    tg.save(module.state_dict(), str(path))
    fresh = tg.onnx.load(exported(torch_cnn(), torch.zeros(1, 1, 8, 8)))
    for parameter in fresh.parameters():
        parameter.data = tg.zeros_like(parameter)
    fresh.load_state_dict(tg.load(str(path)))
    x, _ = batch(2)
    np.testing.assert_array_equal(fresh(x).detach().numpy(), module(x).detach().numpy())


def test_a_max_pool_gives_a_tied_windows_gradient_to_its_first_maximum_as_torch_does() -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[1, 1])], "pool",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])])
    module = tg.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    values = np.random.default_rng(3).integers(0, 3, (1, 2, 5, 5)).astype(np.float32)  # many tied windows
    weights = np.random.default_rng(4).standard_normal((1, 2, 4, 4)).astype(np.float32)
    x = tg.tensor(values, requires_grad=True)
    (module(x) * tg.tensor(weights)).sum().backward()
    expected = torch.from_numpy(values).requires_grad_()
    (torch.nn.functional.max_pool2d(expected, 2, 1) * torch.from_numpy(weights)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), expected.grad.numpy(), rtol=1e-6)
