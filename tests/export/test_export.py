"""tg.export end to end: libraries built, called from C programs compiled with plain gcc, compared bit for bit
with the same program called from Python (tg.compile)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
from c_harness import run_c

import tensorgraphs as tg
import tensorgraphs.nn as nn
from tensorgraphs.examples.cnn import digits_cnn


def mlp() -> nn.Module:
    tg.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def test_mlp_outputs_equal_the_compiled_program_bit_for_bit(tmp_path: Path) -> None:
    model = mlp()
    xs = [tg.randn(8, 16) for _ in range(3)]
    exported = tg.export(model, (xs[0],), tmp_path, name="mlp")
    compiled = tg.compile(model)
    expected = [[compiled(x).detach().numpy()] for x in xs]
    got = run_c(exported, [[x.numpy()] for x in xs])
    for want, have in zip(expected, got):
        np.testing.assert_array_equal(have[0], want[0])
    assert not np.array_equal(got[0][0], got[1][0])  # the inputs reach the library


def test_cnn_outputs_equal_the_compiled_program_bit_for_bit(tmp_path: Path) -> None:
    tg.manual_seed(1)
    model = digits_cnn(channels=4).eval()
    x = tg.randn(5, 1, 8, 8)
    exported = tg.export(model, (x,), tmp_path, name="cnn")
    (got,), = run_c(exported, [[x.numpy()]])
    np.testing.assert_array_equal(got, tg.compile(model)(x).detach().numpy())


def test_a_training_step_trains_in_c_as_in_python(tmp_path: Path, compiled_step: Callable) -> None:
    model = mlp()
    optimizer = tg.optim.AdamW(model.parameters(), lr=1e-2)
    train_step = compiled_step(model, optimizer)
    tg.manual_seed(2)
    batches = [(tg.randn(8, 16), tg.randint(0, 4, (8,))) for _ in range(5)]
    exported = tg.export(train_step, batches[0], tmp_path, name="step")
    assert [s.name for s in exported.program.inputs] == ["x", "y", "lr"]
    assert "model.0.weight" in {t.name for t in exported.program.tensors}
    lr = np.float32(optimizer.param_groups[0]["lr"])
    saved = tmp_path / "trained.safetensors"
    got = run_c(exported, [[x.numpy(), y.numpy(), lr] for x, y in batches], saved=saved)
    expected = [train_step(x, y).numpy() for x, y in batches]
    np.testing.assert_array_equal([step[0] for step in got], expected)
    assert expected[-1] < expected[0]
    trained = tg.load(saved)
    for name, parameter in model.state_dict().items():
        np.testing.assert_array_equal(trained[f"model.{name}"].numpy(), parameter.numpy())
