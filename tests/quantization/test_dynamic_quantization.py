"""quantize_dynamic against torch's per-channel dynamic quantization: the same int8 weights and scales, outputs
within the quantization error of the float model, the module tree rewritten in place of its Linear layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.ao.quantization import per_channel_dynamic_qconfig

import tensorgraphs as tg
from tensorgraphs.kernels.gemm import int8

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning"),
              pytest.mark.skipif(not int8.available(), reason="needs AVX2 (or AVX-512) and a C compiler")]


def _models(seed: int) -> tuple[tg.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    reference = torch.nn.Sequential(torch.nn.Linear(37, 70), torch.nn.ReLU(), torch.nn.Linear(70, 5))
    model = tg.nn.Sequential(tg.nn.Linear(37, 70), tg.nn.ReLU(), tg.nn.Linear(70, 5))
    model.load_state_dict({key: value.numpy() for key, value in reference.state_dict().items()})
    return model, reference


def test_weights_match_torch_per_channel_dynamic_quantization():
    model, reference = _models(0)
    quantized = tg.quantization.quantize_dynamic(model, {tg.nn.Linear}, dtype=tg.qint8)
    expected = torch.ao.quantization.quantize_dynamic(reference, {torch.nn.Linear: per_channel_dynamic_qconfig},
                                                      dtype=torch.qint8)
    for index in (0, 2):
        got, want = quantized[index].weight(), expected[index].weight()
        np.testing.assert_array_equal(got.int_repr().numpy(), want.int_repr().numpy())
        np.testing.assert_array_equal(got.q_per_channel_scales().numpy(), want.q_per_channel_scales().numpy())
        np.testing.assert_array_equal(got.q_per_channel_zero_points().numpy(), want.q_per_channel_zero_points().numpy())


@pytest.mark.parametrize("compiled", [False, True])
def test_outputs_are_within_quantization_error_of_float(compiled):
    model, reference = _models(1)
    quantized = tg.quantization.quantize_dynamic(model)
    x = np.random.default_rng(2).standard_normal((3, 11, 37)).astype(np.float32)
    run = tg.compile(lambda x: quantized(x)) if compiled else quantized
    got = run(tg.tensor(x)).numpy()
    with torch.no_grad():
        expected = reference(torch.from_numpy(x)).numpy()
        torch_quantized = torch.ao.quantization.quantize_dynamic(
            reference, {torch.nn.Linear: per_channel_dynamic_qconfig})(torch.from_numpy(x)).numpy()
    torch_error = np.abs(torch_quantized - expected).max()
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= torch_error  # full u8 range: at most torch's error (it uses [0, 127])


def test_module_tree_is_rewritten_in_order_and_the_original_kept():
    model, _ = _models(3)
    wrapper = tg.nn.Sequential(model, tg.nn.Linear(5, 2))
    quantized = tg.quantization.quantize_dynamic(wrapper)
    names = [type(m).__name__ for m in quantized.modules()]
    assert names == ["Sequential", "Sequential", "DynamicQuantizedLinear", "ReLU", "DynamicQuantizedLinear",
                     "DynamicQuantizedLinear"]
    assert isinstance(wrapper[0][0], tg.nn.Linear)  # not in place
    assert not list(quantized.parameters()) and "0.0.packed_weight" in quantized.state_dict()
    same = tg.quantization.quantize_dynamic(wrapper, inplace=True)
    assert same is wrapper and isinstance(wrapper[1], tg.quantization.DynamicQuantizedLinear)


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: tg.quantization.quantize_dynamic(m, dtype=tg.quint8), "only tg.qint8"),
    (lambda m: tg.quantization.quantize_dynamic(m, {tg.nn.Conv2d}), "no quantized version of Conv2d"),
    (lambda m: tg.quantization.quantize_dynamic(m)(tg.randn(2, 36)), "does not end in in_features=37"),
])
def test_errors_name_the_call(call, message):
    model, _ = _models(4)
    with pytest.raises(tg.TGError, match=message) as raised:
        call(model)
    assert "test_dynamic.py" in str(raised.value)
