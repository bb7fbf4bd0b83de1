"""copy.deepcopy and pickle of tensors and modules, against torch's behaviour."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn as nn


def test_a_deep_copied_model_keeps_its_weights_when_the_original_trains() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    best = copy.deepcopy(model)
    optimizer = tg.optim.SGD(model.parameters(), lr=0.5)
    model(tg.randn(5, 3)).pow(2).sum().backward()
    optimizer.step()
    assert any(not np.array_equal(v.numpy(), before[k]) for k, v in model.state_dict().items())
    for name, value in best.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), before[name], err_msg=name)
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in best.parameters())
    assert {id(p) for p in best.parameters()}.isdisjoint(id(p) for p in model.parameters())


def test_tied_weights_stay_tied_in_the_copy() -> None:
    embedding, head = nn.Embedding(5, 3), nn.Linear(3, 5, bias=False)
    head.weight = embedding.weight
    twin = copy.deepcopy(nn.ModuleList([embedding, head]))
    assert twin[0].weight is twin[1].weight and twin[0].weight is not embedding.weight


def test_gradients_are_copied_with_a_leaf_but_not_with_a_parameter_as_in_torch() -> None:
    mine, theirs = tg.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    (mine * 2).sum().backward()
    (theirs * 2).sum().backward()
    copied, reference = copy.deepcopy(mine), copy.deepcopy(theirs)
    assert copied.requires_grad and copied.is_leaf
    np.testing.assert_array_equal(copied.grad.numpy(), reference.grad.numpy())
    layer, torch_layer = nn.Linear(2, 2), torch.nn.Linear(2, 2)
    layer(tg.ones(1, 2)).sum().backward()
    torch_layer(torch.ones(1, 2)).sum().backward()
    assert copy.deepcopy(layer).weight.grad is None and copy.deepcopy(torch_layer).weight.grad is None


@pytest.mark.parametrize("dtype", [tg.float32, tg.int64, tg.bool, tg.bfloat16])
def test_tensors_round_trip_through_pickle(dtype: tg.DType) -> None:
    x = tg.tensor(np.arange(6).reshape(2, 3) % 3).to(dtype)
    y = pickle.loads(pickle.dumps(x))
    assert y.dtype is dtype and y.shape == x.shape and not y.requires_grad
    np.testing.assert_array_equal(y.float().numpy(), x.float().numpy())


def test_a_computed_tensor_that_requires_grad_cannot_be_copied_as_in_torch() -> None:
    with pytest.raises(RuntimeError):
        copy.deepcopy(torch.ones(2, requires_grad=True) * 2)
    with pytest.raises(tg.UnsupportedError, match="graph leaves.*test_copying.py"):
        copy.deepcopy(tg.ones(2, requires_grad=True) * 2)
    copy.deepcopy((tg.ones(2, requires_grad=True) * 2).detach())  # fine once detached
