"""docs/torch-coverage.md's generator: names are sorted into exists / differs / missing against torch."""

from __future__ import annotations

import pytest

import tensorgraphs as tg
from tensorgraphs.testing import coverage


def statuses(torch_path: str, tg_path: str) -> dict[str, coverage.Entry]:
    return {e.name: e for e in coverage.compare(torch_path, tg_path)}


def test_names_are_sorted_by_what_tensorgraphs_has() -> None:
    nn = statuses("torch.nn", "tensorgraphs.nn")
    assert nn["torch.nn.Transformer"].status == "exists"
    assert nn["torch.nn.DataParallel"] == coverage.Entry("torch.nn.DataParallel", "missing",
                                                         "write the module itself (tensorgraphs runs on one device)")
    top = statuses("torch", "tensorgraphs")
    assert top["torch.topk"].status == "differs" and "first in the input wins" in top["torch.topk"].note
    assert statuses("torch.utils.data", "tensorgraphs.utils.data")["torch.utils.data.DataLoader"].status != "missing"
    assert statuses("torch.Tensor", "tensorgraphs.Tensor")["torch.Tensor.sort"].status == "exists"


def test_a_missing_parameter_is_a_difference() -> None:
    def theirs(x: object, dim: int = 0, keepdim: bool = False) -> None: ...
    def ours(x: object, dim: int = 0) -> None: ...
    def flexible(x: object, **kwargs: object) -> None: ...

    assert coverage._signature_gap(theirs, ours) == "no parameter keepdim"
    assert coverage._signature_gap(theirs, flexible) == "" == coverage._signature_gap(len, ours)


def test_markdown_has_every_namespace(tmp_path: object) -> None:
    output = tmp_path / "coverage.md"  # type: ignore[operator]
    coverage.main([str(output)])
    text = output.read_text()
    for torch_path, _ in coverage.NAMESPACES:
        assert f"\n## {torch_path}\n" in text
    assert "| `torch.nn.DataParallel` | the module itself" in text


@pytest.mark.parametrize(("get", "message"), [
    (lambda: tg.inference_mode, r"tg.inference_mode is not implemented in tensorgraphs yet; write tg.no_grad\(\)"),
    (lambda: tg.nn.DataParallel, "tg.nn.DataParallel is not implemented.*write the module itself"),
    (lambda: tg.nn.functional.not_a_function, "tg.nn.functional.not_a_function is not implemented.*coverage.md"),
    (lambda: tg.optim.NotAnOptimizer, "tg.optim.NotAnOptimizer is not implemented"),
    (lambda: tg.utils.data.NotADataset, "tg.data.NotADataset is not implemented"),
    (lambda: tg.cuda.NotAStream, "tg.cuda.NotAStream is not implemented"),
    (lambda: tg.ones(2).not_a_method, "Tensor.not_a_method is not implemented"),
], ids=["alias", "nn", "functional", "optim", "data", "cuda", "tensor"])
def test_missing_names_raise_attribute_errors_that_say_so(get: object, message: str) -> None:
    with pytest.raises(AttributeError, match=message):
        get()  # type: ignore[operator]


def test_in_place_names_point_at_the_out_of_place_op_and_protocols_stay_plain() -> None:
    error = tg.missing.not_implemented("Tensor", "frob_", lambda name: name == "frob")
    assert "the out-of-place frob exists: x = x.frob(...)" in str(error)
    assert not hasattr(tg, "__wrapped__") and not hasattr(tg.ones(1), "__array_interface__")
    with pytest.raises(AttributeError, match="has no attribute '__wrapped__'"):
        tg.nn.__wrapped__  # noqa: B018
