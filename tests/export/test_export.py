"""tg.export end to end: libraries built, called from C programs compiled with plain gcc, compared bit for bit
with the same program called from Python (tg.compile)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
from c_harness import compile_c, run_c

import tensorgraphs as tg
import tensorgraphs.nn as nn
from tensorgraphs.examples.cnn import digits_cnn


def mlp() -> nn.Module:
    tg.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def test_mlp_outputs_equal_the_compiled_program_bit_for_bit(tmp_path: Path) -> None:
    model = mlp()
    xs = [tg.randn(8, 16) for _ in range(3)]
    compiled = tg.compile(model)
    exported = tg.export(compiled, (xs[0],), tmp_path, name="mlp")  # the module tg.compile compiles
    (got,) = run_c(exported, [[x.numpy()] for x in xs])
    for x, have in zip(xs, got):
        np.testing.assert_array_equal(have[0], compiled(x).detach().numpy())
    assert not np.array_equal(got[0][0], got[1][0])  # the inputs reach the library


def test_dynamically_quantized_mlp_outputs_equal_the_compiled_program_bit_for_bit(tmp_path: Path) -> None:
    tg.manual_seed(0)
    model = tg.quantization.quantize_dynamic(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    xs = [tg.randn(8, 16) for _ in range(2)]
    compiled = tg.compile(model)
    exported = tg.export(compiled, (xs[0],), tmp_path, name="qmlp")  # calls the int8 GEMM, built in
    (got,) = run_c(exported, [[x.numpy()] for x in xs])
    for x, have in zip(xs, got):
        np.testing.assert_array_equal(have[0], compiled(x).detach().numpy())


def test_cnn_outputs_equal_the_compiled_program_bit_for_bit(tmp_path: Path) -> None:
    tg.manual_seed(1)
    model = digits_cnn(channels=4).eval()
    x = tg.randn(5, 1, 8, 8)
    exported = tg.export(model, (x,), tmp_path, name="cnn")
    got = run_c(exported, [[x.numpy()]])[0][0][0]
    np.testing.assert_array_equal(got, tg.compile(model)(x).detach().numpy())


def test_a_training_step_trains_in_c_as_in_python(tmp_path: Path, compiled_step: Callable) -> None:
    model = mlp()
    optimizer = tg.optim.AdamW(model.parameters(), lr=1e-2)
    train_step = compiled_step(model, optimizer)
    tg.manual_seed(2)
    batches = [(tg.randn(8, 16), tg.randint(0, 4, (8,))) for _ in range(5)]
    exported = tg.export(train_step, batches[0], tmp_path, name="step")
    assert [s.name for s in exported.program.inputs] == ["x", "y", "lr"]
    lr = np.float32(optimizer.param_groups[0]["lr"])
    saved = tmp_path / "trained.safetensors"
    (got,) = run_c(exported, [[x.numpy(), y.numpy(), lr] for x, y in batches], saved=saved)
    expected = [train_step(x, y).numpy() for x, y in batches]
    np.testing.assert_array_equal([step[0] for step in got], expected)
    assert expected[-1] < expected[0]
    trained = tg.load(saved)
    for name, parameter in model.state_dict().items():
        np.testing.assert_array_equal(trained[f"model.{name}"].numpy(), parameter.numpy())
    for name, value in optimizer.state[model[0].weight].items():
        np.testing.assert_array_equal(trained[f"optimizer.model.0.weight.{name}"].numpy(), value.numpy())


def test_contexts_on_two_threads_train_apart(tmp_path: Path, compiled_step: Callable) -> None:
    model = mlp()
    exported = tg.export(compiled_step(model, tg.optim.SGD(model.parameters(), lr=0.1)),
                         (tg.randn(8, 16), tg.randint(0, 4, (8,))), tmp_path, name="sgd")
    tg.manual_seed(3)
    runs = [[[np.random.default_rng(seed + step).standard_normal((8, 16), np.float32),
              np.random.default_rng(seed).integers(0, 4, 8), np.float32(0.1)] for step in range(20)]
            for seed in (0, 100)]
    alone = [run_c(exported, run)[0] for run in runs]
    together = run_c(exported, *runs)
    np.testing.assert_array_equal(together, alone)
    assert not np.array_equal(alone[0], alone[1])


def test_two_models_link_into_one_executable(tmp_path: Path) -> None:
    small, cnn = mlp(), digits_cnn(channels=4).eval()
    x, image = tg.randn(8, 16), tg.randn(5, 1, 8, 8)
    tg.export(small, (x,), tmp_path, name="first")
    tg.export(cnn, (image,), tmp_path, name="second")
    program = compile_c(TWO_MODELS, tmp_path, "both", ["first", "second"])
    (tmp_path / "x.bin").write_bytes(x.numpy().tobytes() + image.numpy().tobytes())
    result = subprocess.run([str(program)], cwd=tmp_path, capture_output=True)
    assert result.returncode == 0, result.stderr
    out = np.frombuffer(result.stdout, np.float32)
    np.testing.assert_array_equal(out[:32], tg.compile(small)(x).detach().numpy().ravel())
    np.testing.assert_array_equal(out[32:], tg.compile(cnn)(image).detach().numpy().ravel())


TWO_MODELS = r"""
#include <stdio.h>
#include "first.h"
#include "second.h"

int main(void) {
    float x[8 * 16], image[5 * 64], y[8 * 4], logits[5 * 10];
    FILE *f = fopen("x.bin", "rb");
    if (fread(x, sizeof x, 1, f) != 1 || fread(image, sizeof image, 1, f) != 1) return 3;
    fclose(f);
    first_ctx *a = first_create("first.safetensors");
    second_ctx *b = second_create("second.safetensors");
    const void *in_a[] = {x}, *in_b[] = {image};
    void *out_a[] = {y}, *out_b[] = {logits};
    if (!a || !b || first_run(a, in_a, out_a) || second_run(b, in_b, out_b)) return 1;
    fwrite(y, sizeof y, 1, stdout);
    fwrite(logits, sizeof logits, 1, stdout);
    first_destroy(a);
    second_destroy(b);
    return 0;
}
"""


def test_example_builds_with_its_command_and_runs(tmp_path: Path) -> None:
    exported = tg.export(mlp(), (tg.randn(8, 16),), tmp_path, name="mlp")
    source = exported.files["example"].read_text()
    command = source.splitlines()[1].removeprefix(" *").strip()
    result = subprocess.run(command.replace("cc ", "gcc ", 1), shell=True, cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "output: float32 [8, 4]\n"


def test_embedded_weights_need_no_file(tmp_path: Path) -> None:
    model = mlp()
    x = tg.randn(8, 16)
    exported = tg.export(model, (x,), tmp_path, name="inside", embed_weights=True)
    exported.files["weights"].unlink()
    got = run_c(exported, [[x.numpy()]], weights=None)[0][0][0]
    np.testing.assert_array_equal(got, tg.compile(model)(x).detach().numpy())


REBUILD = """
import sys
import tensorgraphs as tg
tg.manual_seed(0)
model = tg.nn.Sequential(tg.nn.Linear(16, 32), tg.nn.GELU(), tg.nn.Linear(32, 4))
tg.export(model, (tg.randn(8, 16),), sys.argv[1], name="mlp")
"""


def test_building_twice_gives_the_same_source_and_header(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    tg.export(mlp(), (tg.randn(8, 16),), first, name="mlp")
    subprocess.run([sys.executable, "-c", REBUILD, str(second)], check=True)  # another process
    for name in ("mlp.c", "mlp.h", "example.c", "mlp.safetensors"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_a_step_traced_for_export_then_compiled_anew_still_trains(tmp_path: Path) -> None:
    """Tracing writes the parameters only in the trace: a later trace's backward must not see them as written (a
    layer norm's gradient reads its weight: it raised "modified by an inplace operation")."""
    tg.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 4))
    optimizer = tg.optim.SGD(model.parameters(), lr=0.1)

    def train_step(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        loss = tg.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    x, y = tg.randn(8, 16), tg.randint(0, 4, (8,))
    exported = tg.export(train_step, (x, y), tmp_path, name="sgd")
    expected = tg.compile(train_step)(x, y).numpy()
    np.testing.assert_array_equal(run_c(exported, [[x.numpy(), y.numpy(), np.float32(0.1)]])[0][0][0], expected)
