"""`tg run MODEL.onnx --input NAME=FILE.npy`: outputs printed or saved under names that stay in the folder."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx_models import mlp  # noqa: E402

import tensorgraphs as tg  # noqa: E402
from tensorgraphs.cli import main  # noqa: E402


def test_tg_run_saves_each_output_under_a_safe_name(tmp_path) -> None:
    model = mlp()
    model.graph.output[0].name = model.graph.node[-1].output[0] = "../../escape/logits"
    path, x = tmp_path / "m.onnx", np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    onnx.save(model, str(path))
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "out")]) == 0
    (saved,) = (tmp_path / "out").iterdir()
    assert saved.name == "0_______escape_logits.npy"
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(np.load(saved), expected, rtol=1e-5, atol=1e-6)


def test_tg_run_prints_the_outputs(tmp_path, capsys) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(mlp(), str(path))
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}"])
    assert capsys.readouterr().out.startswith("logits: float32 (2, 4)\n[[")


def test_tg_run_names_missing_inputs(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(mlp(), str(path))
    with pytest.raises(tg.ArgumentError, match=r"takes inputs \['x'\]; missing \['x'\], unknown \[\]"):
        main(["run", str(path)])
