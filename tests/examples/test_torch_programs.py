"""PyTorch program files run unmodified on tensorgraphs (`torch` names pointed at it) and match torch."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.testing.torch_names import torch_names

PROGRAMS = Path(__file__).parent / "torch_programs"
_loaded = itertools.count()


def load(name: str) -> ModuleType:
    """A fresh copy of the program file `name`, imported with whatever `torch` is in sys.modules now."""
    spec = importlib.util.spec_from_file_location(f"torch_program_{name}_{next(_loaded)}", PROGRAMS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def characters() -> np.ndarray:
    text = "the quick brown fox jumps over the lazy dog; " * 8
    alphabet = sorted(set(text))
    return np.array([alphabet.index(c) for c in text], dtype=np.int64)


@pytest.mark.long
def test_gpt_style_file_loads_weights_trains_and_samples_like_torch() -> None:
    reference = load("gpt_style")
    with torch_names():
        mine = load("gpt_style")
    assert mine.torch is tg and reference.torch is torch

    torch.manual_seed(0)
    ref_model = reference.GPT(reference.GPTConfig())
    tg.manual_seed(0)
    my_model = mine.GPT(mine.GPTConfig())
    assert my_model.get_num_params() == ref_model.get_num_params()
    pretrained = {k: v.detach().numpy().copy() for k, v in ref_model.state_dict().items()}
    mine.load_weights(my_model, {k: tg.tensor(v) for k, v in pretrained.items()})
    for name, value in my_model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), pretrained[name], err_msg=name)

    data = characters()
    ref_losses = reference.train(ref_model, torch.tensor(data), steps=6, batch_size=4)
    my_losses = mine.train(my_model, tg.tensor(data), steps=6, batch_size=4)
    np.testing.assert_allclose(my_losses, ref_losses, rtol=2e-4)

    ref_model.eval()
    my_model.eval()
    prompt = data[:5].reshape(1, 5)
    ref_tokens = ref_model.generate(torch.tensor(prompt), 12, top_k=1).numpy()
    my_tokens = my_model.generate(tg.tensor(prompt), 12, top_k=1).numpy()
    np.testing.assert_array_equal(my_tokens, ref_tokens)

    ref_model.crop_block_size(8)
    my_model.crop_block_size(8)
    window = torch.tensor(data[:16].reshape(2, 8)), tg.tensor(data[:16].reshape(2, 8))
    with torch.no_grad(), tg.no_grad():
        np.testing.assert_allclose(my_model(window[1], window[1])[1].item(), ref_model(*window[:1] * 2)[1].item(),
                                   rtol=1e-5)
