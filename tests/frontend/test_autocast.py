"""tg.autocast against torch.autocast("cpu"): which ops run in bfloat16, which in float32, which follow their
inputs; values, gradients and their dtypes; nesting, decorators and the compiled trace key."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn.functional as F

RNG = np.random.default_rng(0)


def _array(*shape: int, positive: bool = False) -> np.ndarray:
    values = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(values) / (1 + np.abs(values)) if positive else values


X, W, B = _array(4, 8), _array(6, 8), _array(6)
IMG, K2, SEQ, K1 = _array(2, 3, 8, 8), _array(4, 3, 3, 3), _array(2, 3, 8), _array(4, 3, 3)
Q, Y, P, BIL = _array(2, 2, 5, 8), _array(4, 6), _array(4, 6, positive=True), _array(3, 8, 8)
T = np.array([1, 0, 5, 3])

# name: (function of (the library, its functional module, arrays as its tensors), the arrays)
OPS = {
    "matmul": (lambda lib, F, x, w: lib.matmul(x, w.T), (X, W)),
    "mm": (lambda lib, F, x, w: lib.mm(x, w.T), (X, W)),
    "bmm": (lambda lib, F, q: lib.bmm(q[0], q[0].mT), (Q,)),
    "matmul_vector": (lambda lib, F, x: lib.matmul(x[0], x[1]), (X,)),
    "operator_matmul": (lambda lib, F, x, w: x @ w.T, (X, W)),
    "linear": (lambda lib, F, x, w, b: F.linear(x, w, b), (X, W, B)),
    "conv1d": (lambda lib, F, x, k: F.conv1d(x, k), (SEQ, K1)),
    "conv2d": (lambda lib, F, x, k: F.conv2d(x, k, padding=1), (IMG, K2)),
    "conv_transpose2d": (lambda lib, F, x, k: F.conv_transpose2d(x, k.transpose(0, 1)), (IMG, K2)),
    "prelu": (lambda lib, F, x: F.prelu(x, x[0, :1] * 0 + 0.25), (X,)),
    "attention": (lambda lib, F, q: F.scaled_dot_product_attention(q, q, q), (Q,)),
    "einsum": (lambda lib, F, x, w: lib.einsum("ij,kj->ik", x, w), (X, W)),
    "bilinear": (lambda lib, F, x, w: F.bilinear(x, x, w), (X, BIL)),
    "dot": (lambda lib, F, x: lib.dot(x[0], x[1]), (X,)),
    "softmax": (lambda lib, F, x: F.softmax(x, -1), (X,)),
    "layer_norm": (lambda lib, F, x: F.layer_norm(x, (8,)), (X,)),
    "gelu": (lambda lib, F, x: F.gelu(x), (X,)),
    "sum": (lambda lib, F, x: x.sum(), (X,)),
    "prod": (lambda lib, F, x: x.prod(), (X,)),
    "add": (lambda lib, F, x: x + 1, (X,)),
    "cross_entropy": (lambda lib, F, y, t: F.cross_entropy(y, t), (Y, T)),
    "nll_loss": (lambda lib, F, y, t: F.nll_loss(y, t), (Y, T)),
    "mse_loss": (lambda lib, F, y, p: F.mse_loss(y, p), (Y, P)),
    "l1_loss": (lambda lib, F, y, p: F.l1_loss(y, p), (Y, P)),
    "kl_div": (lambda lib, F, y, p: F.kl_div(y, p, reduction="batchmean"), (Y, P)),
    "binary_cross_entropy": (lambda lib, F, p: F.binary_cross_entropy(p, p), (P,)),
    "binary_cross_entropy_with_logits": (lambda lib, F, y, p: F.binary_cross_entropy_with_logits(y, p), (Y, P)),
    "smooth_l1_loss": (lambda lib, F, y, p: F.smooth_l1_loss(y, p), (Y, P)),
    "huber_loss": (lambda lib, F, y, p: F.huber_loss(y, p), (Y, P)),
    "gaussian_nll_loss": (lambda lib, F, y, p: F.gaussian_nll_loss(y, p, p + 1), (Y, P)),
    "pad_reflect": (lambda lib, F, x: F.pad(x, (1, 1, 1, 1), mode="reflect"), (IMG,)),
    "pad_constant": (lambda lib, F, x: F.pad(x, (1, 1)), (IMG,)),
    "local_response_norm": (lambda lib, F, x: F.local_response_norm(x, 2), (IMG,)),
    "max_pool2d": (lambda lib, F, x: F.max_pool2d(x, 2), (IMG,)),
}

INNER_BFLOAT16 = {"bilinear"}  # float32 results of products autocast to bfloat16 inside the op

INPUT_DTYPES = {"float32": (tg.float32, torch.float32), "bfloat16": (tg.bfloat16, torch.bfloat16),
                "float64": (tg.float64, torch.float64)}


def _run(name: str, library: str, input_dtype: str) -> tuple[str, np.ndarray]:
    """The op's result dtype and value (as float64) under autocast, inputs of `input_dtype` (integers kept)."""
    build, arrays = OPS[name]
    if library == "torch":
        dtype = INPUT_DTYPES[input_dtype][1]
        tensors = [torch.from_numpy(a).to(dtype) if a.dtype.kind == "f" else torch.from_numpy(a) for a in arrays]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = build(torch, torch.nn.functional, *tensors)
        return str(out.dtype).removeprefix("torch."), out.double().numpy()
    dtype = INPUT_DTYPES[input_dtype][0]
    tensors = [tg.tensor(a, dtype=dtype) if a.dtype.kind == "f" else tg.tensor(a) for a in arrays]
    with tg.autocast("cpu", dtype=tg.bfloat16):
        out = build(tg, F, *tensors)
    return out.dtype.name, out.double().numpy()


@pytest.mark.parametrize("input_dtype", list(INPUT_DTYPES))
@pytest.mark.parametrize("name", list(OPS))
def test_result_dtype_and_value_match_torch(name: str, input_dtype: str) -> None:
    """bfloat16 results agree to a few bfloat16 roundings (2^-8 each) of the result's scale: a sum of rounded terms
    that nearly cancel is off by the terms' rounding, not its own (torch's bfloat16 kernels round differently on
    different CPUs, AVX-512 BF16 or not)."""
    expected_dtype, expected = _run(name, "torch", input_dtype)
    dtype, value = _run(name, "tg", input_dtype)
    assert dtype == expected_dtype, f"{name} on {input_dtype}: {dtype}, torch gives {expected_dtype}"
    tolerance = {"bfloat16": 3e-2, "float32": 1e-4, "float64": 1e-9}[dtype]
    in_bfloat16 = input_dtype == "bfloat16" or dtype == "bfloat16" or name in INNER_BFLOAT16
    tolerance = max(tolerance, 3e-2 if in_bfloat16 else 0)
    finite = expected[np.isfinite(expected)]
    scale = max(1.0, float(np.abs(finite).max())) if in_bfloat16 and finite.size else 1.0
    np.testing.assert_allclose(value, expected, rtol=tolerance, atol=tolerance * scale,
                               err_msg=f"{name} on {input_dtype}")


def test_gradients_reach_float32_parameters_in_float32_and_match_torch() -> None:
    """A linear layer and a loss under autocast: the weight gradient is float32 (the cast's gradient casts back),
    the input's too, and both match torch's to bfloat16 precision."""
    x, w, b, t = _array(16, 8), _array(6, 8), _array(6), np.arange(16) % 6
    grads = {}
    for library in ("torch", "tg"):
        lib, functional = (torch, torch.nn.functional) if library == "torch" else (tg, F)
        xs, ws, bs = (lib.tensor(a, requires_grad=True) for a in (x, w, b))
        with lib.autocast("cpu", dtype=lib.bfloat16):
            hidden = functional.linear(xs, ws, bs)
            loss = functional.cross_entropy(functional.gelu(hidden), lib.tensor(t))
        assert str(hidden.dtype).endswith("bfloat16") and str(loss.dtype).endswith("float32")
        loss.backward()
        grads[library] = [(str(v.grad.dtype).rsplit(".", 1)[-1], v.grad.double().numpy()) for v in (xs, ws, bs)]
    for (dtype, value), (expected_dtype, expected) in zip(grads["tg"], grads["torch"], strict=True):
        assert dtype == expected_dtype == "float32"
        np.testing.assert_allclose(value, expected, rtol=3e-2, atol=3e-3)


def test_regions_nest_and_enabled_false_turns_autocast_off() -> None:
    x = tg.tensor(X)
    assert not tg.is_autocast_enabled("cpu")
    with tg.autocast("cpu", dtype=tg.bfloat16):
        assert tg.is_autocast_enabled("cpu") and not tg.is_autocast_enabled()  # no argument: CUDA, as in torch
        with tg.autocast("cpu", enabled=False):
            assert not tg.is_autocast_enabled("cpu") and (x @ x.T).dtype is tg.float32
        with tg.autocast("cpu", dtype=tg.float16):
            assert tg.get_autocast_dtype("cpu") is tg.float16 and (x @ x.T).dtype is tg.float16
        assert (x @ x.T).dtype is tg.bfloat16
    assert not tg.is_autocast_enabled("cpu") and (x @ x.T).dtype is tg.float32


def test_decorator_and_the_torch_aliases() -> None:
    x = tg.tensor(X)

    @tg.autocast("cpu")
    def product(a: tg.Tensor) -> tg.Tensor:
        return a @ a.T

    assert product(x).dtype is tg.bfloat16 and (x @ x.T).dtype is tg.float32
    for region in (tg.amp.autocast("cpu"), tg.cpu.amp.autocast()):
        with region:
            assert (x @ x.T).dtype is tg.bfloat16


def test_unsupported_settings_warn_and_disable_like_torch() -> None:
    for device, dtype in (("cuda", None), ("cpu", tg.float32)):
        with pytest.warns(UserWarning, match="Disabling autocast"), tg.autocast(device, dtype=dtype):
            assert not tg.is_autocast_enabled("cpu")
    with pytest.raises(tg.ArgumentError, match="device_type"):
        tg.autocast("tpu")


def test_a_composite_realized_inside_a_region_keeps_its_own_dtypes() -> None:
    """Decompositions and gradients are built with autocast suspended: reading a float32 convolution inside a
    region gives the value it has outside."""
    x, k = tg.tensor(IMG), tg.tensor(K2)
    out = F.conv2d(x, k, padding=1)
    expected = torch.nn.functional.conv2d(torch.from_numpy(IMG), torch.from_numpy(K2), padding=1).numpy()
    with tg.autocast("cpu"):
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_compiled_function_traces_again_when_autocast_changes() -> None:
    @tg.compile
    def product(a: tg.Tensor) -> tg.Tensor:
        return a @ a.T

    x = tg.tensor(X)
    assert product(x).dtype is tg.float32
    with tg.autocast("cpu"):
        assert product(x).dtype is tg.bfloat16
    assert product(x).dtype is tg.float32


def test_grad_scaler_is_a_no_op_that_takes_torchs_calls() -> None:
    w = tg.tensor(W, requires_grad=True)
    optimizer = tg.optim.SGD([w], lr=0.1)
    for scaler in (tg.amp.GradScaler("cpu"), tg.cpu.amp.GradScaler(), tg.GradScaler()):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with tg.autocast("cpu"):
                loss = (tg.tensor(X) @ w.T).float().pow(2).mean()
            scaled = scaler.scale(loss)
            assert scaled is loss
            scaled.backward()
            before = w.detach().numpy().copy()
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()
            np.testing.assert_allclose(w.detach().numpy(), before - 0.1 * w.grad.numpy(), rtol=1e-6)
            optimizer.zero_grad()
            assert scaler.get_scale() == 1.0 and scaler.state_dict() == {}
