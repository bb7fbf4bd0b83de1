"""state_dict() aliases the module's parameters and buffers, as in torch: writing into it changes the model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tensorgraphs as tg


def _pair(seed: int = 0) -> tuple[tg.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    model = tg.nn.Sequential(tg.nn.Linear(4, 3), tg.nn.BatchNorm1d(3), tg.nn.Linear(3, 2))
    return model, reference


def test_copy_into_state_dict_loads_pretrained_weights() -> None:
    model, reference = _pair()
    reference.train()
    reference(torch.randn(5, 4))  # running statistics that differ from the fresh model's
    reference.eval()
    model.eval()
    sd = model.state_dict()
    with tg.no_grad():
        for key, value in reference.state_dict().items():
            sd[key].copy_(tg.tensor(value.numpy()))
    x = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    expected = reference(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(model(tg.tensor(x)).detach().numpy(), expected, rtol=1e-5, atol=1e-6)
    assert model[0].weight.requires_grad and model[0].weight.is_leaf


def test_state_dict_sees_later_changes_and_gradients_still_reach_parameters() -> None:
    model, _ = _pair()
    sd = model.state_dict()
    optimizer = tg.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    model(tg.randn(5, 4)).sum().backward()
    expected = model[0].weight.detach().numpy() - 0.5 * model[0].weight.grad.numpy()
    optimizer.step()
    np.testing.assert_allclose(sd["0.weight"].numpy(), expected, rtol=1e-6)
    assert not sd["0.weight"].requires_grad


def test_in_place_write_into_state_dict_without_no_grad_is_allowed() -> None:
    model, _ = _pair()
    sd = model.state_dict()
    sd["0.bias"].zero_()  # a detached alias: torch allows it outside no_grad too
    np.testing.assert_array_equal(model[0].bias.detach().numpy(), np.zeros(3, np.float32))


def test_load_state_dict_and_save_still_work(tmp_path) -> None:
    model, _ = _pair()
    other, _ = _pair(1)
    other.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(other[2].weight.detach().numpy(), model[2].weight.detach().numpy())
    path = tmp_path / "model.safetensors"
    tg.save(model.state_dict(), path)
    loaded = tg.load(path)
    np.testing.assert_array_equal(loaded["0.weight"].numpy(), model[0].weight.detach().numpy())


def _torch_style_gpt(names: Any) -> Any:
    """tests/nn/torch_style_gpt.py run with `torch`, `torch.nn` and `torch.nn.functional` being `names`'s."""
    path = Path(__file__).with_name("torch_style_gpt.py")
    spec = importlib.util.spec_from_file_location(f"torch_style_gpt_{names.__name__}", path)
    module = importlib.util.module_from_spec(spec)
    modules = {"torch": names, "torch.nn": names.nn, "torch.nn.functional": names.nn.functional,
               spec.name: module}
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        spec.loader.exec_module(module)
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name)
            else:
                sys.modules[name] = previous
    return module


@pytest.mark.long
def test_torch_model_file_loads_pretrained_weights_and_matches_torch() -> None:
    reference_module, tg_module = _torch_style_gpt(torch), _torch_style_gpt(tg)
    torch.manual_seed(0)
    source = reference_module.GPT(reference_module.GPTConfig())
    transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    pretrained = {k: v.t().contiguous() if k.endswith(transposed) else v.clone()  # a checkpoint in HF's layout
                  for k, v in source.state_dict().items()}
    reference = reference_module.GPT(reference_module.GPTConfig()).load_pretrained(pretrained)
    model = tg_module.GPT(tg_module.GPTConfig()).load_pretrained({k: tg.tensor(v.numpy())
                                                                  for k, v in pretrained.items()})
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 50, (3, 12)), rng.integers(0, 50, (3, 12))
    expected_logits, expected_loss = reference(torch.tensor(idx), torch.tensor(targets))
    logits, loss = model(tg.tensor(idx), tg.tensor(targets))
    np.testing.assert_allclose(logits.detach().numpy(), expected_logits.detach().numpy(), rtol=1e-5, atol=1e-6)
    expected_loss.backward()
    loss.backward()
    expected_grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        np.testing.assert_allclose(param.grad.numpy(), expected_grads[name].grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=name)
    np.testing.assert_allclose(model.last_logits_topk(tg.tensor(idx), 5).numpy(),
                               reference.last_logits_topk(torch.tensor(idx), 5).numpy(), rtol=1e-5, atol=1e-7)
