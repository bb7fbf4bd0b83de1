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
@pytest.mark.parametrize("reduce_range", [False, True])
def test_outputs_match_torch_or_are_within_its_quantization_error(compiled, reduce_range):
    """Activations in [0, 127] (torch's `reduce_range`): torch's results, up to float rounding (it picks the scale in
    double), far below one quantization step; in [0, 255]: at most torch's error against the float model."""
    model, reference = _models(1)
    quantized = tg.quantization.quantize_dynamic(model, reduce_range=reduce_range)
    assert all(layer.quant_max == (127 if reduce_range else 255) for layer in (quantized[0], quantized[2]))
    x = np.random.default_rng(2).standard_normal((3, 11, 37)).astype(np.float32)
    run = tg.compile(lambda x: quantized(x)) if compiled else quantized
    got = run(tg.tensor(x)).numpy()
    with torch.no_grad():
        expected = reference(torch.from_numpy(x)).numpy()
        torch_quantized = torch.ao.quantization.quantize_dynamic(
            reference, {torch.nn.Linear: per_channel_dynamic_qconfig})(torch.from_numpy(x)).numpy()
    assert got.shape == expected.shape
    if reduce_range:
        np.testing.assert_allclose(got, torch_quantized, rtol=1e-5, atol=1e-6)
    else:
        assert np.abs(got - expected).max() <= np.abs(torch_quantized - expected).max()


def test_activations_take_7_bits_by_default_without_vnni():
    """Where the int8 GEMM lacks VPDPBUSD, as torch's fbgemm does on every x86 machine; static layers keep the
    [0, 255] their observers' parameters cover."""
    model, _ = _models(5)
    quantized = tg.quantization.quantize_dynamic(model)
    assert quantized[0].quant_max == (255 if int8.vnni() else 127)
    assert f"reduce_range={not int8.vnni()}" in repr(quantized)
    static = tg.quantization.StaticQuantizedLinear(37, 70, model[0].weight, model[0].bias, (0.1, 3))
    assert static.quant_max == 255


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
    assert "test_dynamic_quantization.py" in str(raised.value)
