"""`tg build`: a compiler-like command line over tg.export (one-line errors; exit status 2 for bad usage)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from c_harness import run_c

import tensorgraphs as tg
from tensorgraphs.cli import main
from tensorgraphs.export.program import ArraySpec

MODEL = """
import tensorgraphs as tg
tg.manual_seed(0)
model = tg.nn.Sequential(tg.nn.Linear(16, 8), tg.nn.ReLU())
example_args = (tg.randn(4, 16),)
"""


def status_of(arguments: list[str]) -> int:
    try:
        return main(arguments)
    except SystemExit as exit:
        return int(exit.code or 0)


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    return path


@pytest.mark.long
def test_build_writes_the_library(model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert status_of(["build", str(model_file), "--name", "net", "-o", str(out), "-O2", "-v", "--embed-weights"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("built net in ")
    assert " -O2 " in captured.err and "objcopy" in captured.err
    for name in ("net.h", "net.c", "libnet.a", "libnet.so", "net.safetensors", "example.c"):
        assert (out / name).is_file(), name
    assert "net_embedded_weights" in (out / "net.c").read_text()


@pytest.mark.parametrize("arguments, message", [
    (["--name", "net", "-o", "OUT", "--bogus"], "unrecognized arguments: --bogus"),
    (["--name", "net", "-o", "OUT", "-O7"], "argument -O: invalid choice: '7'"),
    (["--name", "net", "-o", "OUT", "--target", "i386"], "argument --target: invalid choice"),
    (["-o", "OUT"], "the following arguments are required: --name"),
    (["--name", "9net", "-o", "OUT"], "name '9net' cannot prefix C symbols"),
    (["--name", "net", "-o", "OUT", "--shape", "x=2xq"], "is not NAME=DIMS"),
])
def test_bad_usage_is_one_line_and_status_2(model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                             arguments: list[str], message: str) -> None:
    arguments = [a.replace("OUT", str(tmp_path / "out")) for a in arguments]
    assert status_of(["build", str(model_file), *arguments]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("tg build: error: ") and message in error, error


def test_a_missing_model_file_is_one_line_and_status_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert status_of(["build", str(tmp_path / "absent.onnx"), "--name", "net", "-o", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"tg build: error: {tmp_path / 'absent.onnx'}: no such file\n"


def onnx_model(path: Path, kind: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """An ONNX model ONNX Runtime runs as the reference, with a symbolic batch dim; returns its input and output
    shapes at batch 8. "mlp": relu(x @ w + b) @ v; "cnn": conv 3x3, relu, max pool 2x2, flatten, gemm."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if kind == "mlp":
        shapes = (("batch", 16), ("batch", 4))
        weights = {"w": (16, 32), "b": (32,), "v": (32, 4)}
        nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
                 helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "v"], ["y"])]
    else:
        shapes = (("batch", 1, 8, 8), ("batch", 10))
        weights = {"k": (4, 1, 3, 3), "kb": (4,), "w": (10, 64), "b": (10,)}
        nodes = [helper.make_node("Conv", ["x", "k", "kb"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c"], ["r"]),
                 helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                 helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "w", "b"], ["y"], transB=1)]
    initializers = [numpy_helper.from_array(rng.standard_normal(shape, np.float32), name)
                    for name, shape in weights.items()]
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shapes[0])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shapes[1])], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return tuple(8 if d == "batch" else d for d in shapes[0]), tuple(8 if d == "batch" else d for d in shapes[1])


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.long
def test_an_onnx_model_called_from_c_gives_onnx_runtimes_outputs(tmp_path: Path, kind: str) -> None:
    pytest.importorskip("tensorgraphs.onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    model = tmp_path / f"{kind}.onnx"
    x_shape, y_shape = onnx_model(model, kind)
    out = tmp_path / "out"
    shape = "x=" + "x".join(map(str, x_shape))
    assert status_of(["build", str(model), "--name", kind, "-o", str(out), "--shape", shape]) == 0
    x = np.random.default_rng(1).standard_normal(x_shape, np.float32)
    built = SimpleNamespace(files={"header": out / f"{kind}.h", "weights": out / f"{kind}.safetensors"},
                            program=SimpleNamespace(inputs=[ArraySpec("x", tg.float32, x_shape)],
                                                    outputs=[ArraySpec("y", tg.float32, y_shape)]))
    header = built.files["header"].read_text()
    assert f'0 "x" float32 {list(x_shape)}' in header and f'0 "y" float32 {list(y_shape)}' in header
    got = run_c(built, [[x]])[0][0][0]
    (expected,) = onnxruntime.InferenceSession(str(model)).run(None, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.long
def test_an_x86_64_v3_build_calls_the_gemm_library(model_file: Path, tmp_path: Path) -> None:
    """AVX2 machines run the GEMM library (its AVX-512 intrinsics on pairs of AVX registers): a `--target
    x86-64-v3` build calls it as a native build does, and no longer leaves the process without it."""
    out = tmp_path / "out"
    assert status_of(["build", str(model_file), "--name", "net", "-o", str(out), "--target", "x86-64-v3"]) == 0
    assert "tg_gemm_f32(" in (out / "net.c").read_text()
    assert os.environ.get("TG_GEMM") != "0"
