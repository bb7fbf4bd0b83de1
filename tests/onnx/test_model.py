"""Bad input to tg.onnx.load: an unsupported op, a malformed model, hostile names. Each fails (or runs) clearly,
at the caller's line."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_models import mlp  # noqa: E402

import tensorgraphs as tg  # noqa: E402
from tensorgraphs.codegen import compiler  # noqa: E402


def single_node_model(node: onnx.NodeProto, opsets: list[tuple[str, int]]) -> onnx.ModelProto:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def test_an_op_of_another_domain_names_the_op_its_domain_opset_and_node() -> None:
    node = helper.make_node("FancyOp", ["x"], ["y"], domain="com.example", name="my_node")
    model = single_node_model(node, [("", 17), ("com.example", 3)])
    with pytest.raises(tg.UnsupportedError, match=r"node 'my_node' \(FancyOp, domain 'com.example', opset 3\): no "
                                                  r"lowering.*test_model.py:\d+"):
        tg.onnx.load(model)


def test_a_standard_op_without_lowering_names_its_opset() -> None:
    node = helper.make_node("StringNormalizer", ["x"], ["y"], name="strings")
    model = single_node_model(node, [("", 17)])
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.STRING
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.STRING
    with pytest.raises(tg.UnsupportedError, match=r"node 'strings' \(StringNormalizer, domain 'ai.onnx', opset 17\)"):
        tg.onnx.load(model)


def test_an_undefined_input_is_a_malformed_model() -> None:
    node = helper.make_node("Relu", ["nowhere"], ["y"])
    with pytest.raises(tg.ArgumentError, match=r"onnx.load: malformed model: .*nowhere"):
        tg.onnx.load(single_node_model(node, [("", 17)]))


def test_a_file_that_is_not_a_model(tmp_path) -> None:
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\xff\x00 not a protobuf \x13\x37" * 7)
    with pytest.raises(tg.ArgumentError, match=r"is not a readable ONNX model"):
        tg.onnx.load(str(path))
    with pytest.raises(tg.ArgumentError, match=r"no such model file"):
        tg.onnx.load(str(tmp_path / "missing.onnx"))
    with pytest.raises(tg.ArgumentTypeError, match=r"expected a path or an onnx.ModelProto, got int"):
        tg.onnx.load(3)


def test_an_opset_newer_than_onnx_knows() -> None:
    node = helper.make_node("Relu", ["x"], ["y"])
    model = single_node_model(node, [("", onnx.defs.onnx_opset_version() + 1)])
    model.ir_version = onnx.IR_VERSION
    with pytest.raises((tg.UnsupportedError, tg.ArgumentError), match=r"opset"):
        tg.onnx.load(model)


HOSTILE = ['x"; system("rm -rf /"); //', "../../../etc/passwd", "*/ int main(){} /*", "a\nb\\c\0d"]


def hostile_model() -> onnx.ModelProto:
    """mlp() with every input, initializer, value, node and graph name replaced by a hostile one."""
    model = mlp()
    names = {n: f"{HOSTILE[i % len(HOSTILE)]}{i}" for i, n in enumerate(
        ["x", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "h", "a", "m", "logits"])}
    for value in [*model.graph.input, *model.graph.output, *model.graph.initializer]:
        value.name = names[value.name]
    for i, node in enumerate(model.graph.node):
        node.input[:] = [names[n] for n in node.input]
        node.output[:] = [names[n] for n in node.output]
        node.name = HOSTILE[i % len(HOSTILE)]
    model.graph.name = HOSTILE[0]
    return model


@pytest.mark.device("cpu", compile=True)
def test_model_names_never_reach_generated_c(isolated_kernels, monkeypatch) -> None:
    sources: list[str] = []
    compile_shared = compiler.compile_shared
    monkeypatch.setattr(compiler, "compile_shared", lambda source, *a: sources.append(source) or compile_shared(
        source, *a))
    model = hostile_model()
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    module = tg.onnx.load(model)
    assert all(name.isidentifier() for name, _ in module.named_parameters())
    out = tg.onnx.backend.prepare(model).run([x])[0]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(out, session.run(None, {model.graph.input[0].name: x})[0], rtol=1e-5, atol=1e-6)
    assert sources, "the model was not compiled"
    for source in sources:
        assert not any(fragment in source for fragment in ("rm -rf", "passwd", "main(){}")), source


def test_initializer_names_that_collide_as_identifiers_stay_apart() -> None:
    model = mlp()
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), "fc1_weight"))
    module = tg.onnx.load(model)
    assert {"fc1_weight", "fc1_weight_2"} <= set(dict(module.named_parameters()))
