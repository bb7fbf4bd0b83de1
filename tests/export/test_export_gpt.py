"""The shipped GPT exported: inference and a training step, called from C, equal to the compiled program in
Python bit for bit (the fused attention library included)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from c_harness import run_c

import tensorgraphs as tg
from tensorgraphs.examples.gpt import GPT, GPTConfig, make_train_step
from tensorgraphs.schedule.attention import attention_enabled

CONFIG = GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=32)


def gpt() -> GPT:
    tg.manual_seed(0)
    return GPT(CONFIG)


def tokens(seed: int, batch: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, CONFIG.vocab_size, (batch, CONFIG.block_size))


def test_gpt_inference(tmp_path: Path) -> None:
    model = gpt().eval()
    idx = [tg.tensor(tokens(seed)) for seed in range(2)]
    exported = tg.export(model, (idx[0],), tmp_path, name="gpt")
    assert ("attention" in exported.program.libraries) == attention_enabled()  # the fused kernel, linked in
    (got,) = run_c(exported, [[i.numpy()] for i in idx])
    compiled = tg.compile(model)
    for i, step in zip(idx, got):
        np.testing.assert_array_equal(step[0], compiled(i).detach().numpy())


@pytest.mark.slow  # about 15 s with the program cached: the MLP's training step covers the path by default
def test_gpt_training_step(tmp_path: Path) -> None:
    model = gpt()
    train_step = make_train_step(model, tg.optim.AdamW(model.parameters(), lr=3e-3), compiled=False)

    batches = [(tg.tensor(tokens(seed)), tg.tensor(tokens(seed + 50))) for seed in range(4)]
    exported = tg.export(train_step, batches[0], tmp_path, name="gpt_step")
    lr = np.float32(3e-3)
    (got,) = run_c(exported, [[x.numpy(), y.numpy(), lr] for x, y in batches])
    compiled = tg.compile(train_step)
    expected = [compiled(x, y).numpy() for x, y in batches]
    np.testing.assert_array_equal([step[0] for step in got], expected)
    assert expected[-1] < expected[0]

