"""The built-in kernels: numpy, and torch when it is installed. Each is one table entry.

They are registered unverified and checked against the reference the first
time the planner is about to choose one (so importing tensorgraphs runs nothing
and does not import torch).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tensorgraphs.dtypes import float32, float64, int32, int64
from tensorgraphs.plan.implementations import Implementation, Sample, register_implementation

FLOATS = (float32, float64)


def _np_softmax(x: np.ndarray, dim: int) -> np.ndarray:
    exps = np.exp(x - x.max(axis=dim, keepdims=True))
    return exps / exps.sum(axis=dim, keepdims=True)


def _np_log_softmax(x: np.ndarray, dim: int) -> np.ndarray:
    shifted = x - x.max(axis=dim, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=dim, keepdims=True))


# erfc(|x|) by the Chebyshev fit of Numerical Recipes (fractional error < 1.2e-7 everywhere).
_ERFC_COEFFICIENTS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
                      1.48851587, -0.82215223, 0.17087277)


def _np_erf(x: np.ndarray) -> np.ndarray:
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    exponent = np.zeros_like(z) + _ERFC_COEFFICIENTS[-1]
    for c in reversed(_ERFC_COEFFICIENTS[:-1]):
        exponent = exponent * t + c
    erfc = t * np.exp(-z * z + exponent)
    return np.where(x >= 0, 1.0 - erfc, erfc - 1.0).astype(x.dtype)


def _np_gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _np_erf(x / math.sqrt(2.0)))


def _np_layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, normalized_ndim: int, eps: float) -> np.ndarray:
    dims = tuple(range(x.ndim - normalized_ndim, x.ndim))
    centered = x - x.mean(axis=dims, keepdims=True)
    variance = (centered * centered).mean(axis=dims, keepdims=True)
    return centered / np.sqrt(variance + eps) * weight + bias


def _torch_softmax(x: Any, dim: int) -> Any:
    return x.softmax(dim)


def _torch_log_softmax(x: Any, dim: int) -> Any:
    return x.log_softmax(dim)


def _torch_gelu(x: Any, approximate: str) -> Any:
    import torch.nn.functional

    return torch.nn.functional.gelu(x, approximate=approximate)


def _torch_matmul(a: Any, b: Any) -> Any:
    return a @ b


def _torch_erf(x: Any) -> Any:
    return x.erf()


def _torch_layer_norm(x: Any, weight: Any, bias: Any, normalized_ndim: int, eps: float) -> Any:
    import torch.nn.functional

    return torch.nn.functional.layer_norm(x, x.shape[x.ndim - normalized_ndim:], weight, bias, eps)


def _torch_attention(q: Any, k: Any, v: Any, *mask: Any, is_causal: bool, scale: float) -> Any:
    import torch.nn.functional

    return torch.nn.functional.scaled_dot_product_attention(q, k, v, *mask, is_causal=is_causal, scale=scale)


_ATTENTION_SAMPLES = (
    Sample(((2, 3, 5, 8), (2, 3, 6, 8), (2, 3, 6, 4)), (("is_causal", False), ("scale", 0.35))),
    Sample(((2, 5, 8), (2, 5, 8), (2, 5, 8)), (("is_causal", True), ("scale", 0.5))),
)


BUILTIN_IMPLEMENTATIONS = (
    Implementation("numpy.matmul", "matmul", "numpy", np.matmul, (*FLOATS, int32, int64)),
    Implementation("numpy.softmax", "softmax", "numpy", _np_softmax, FLOATS),
    Implementation("numpy.log_softmax", "log_softmax", "numpy", _np_log_softmax, FLOATS),
    Implementation("numpy.erf", "erf", "numpy", _np_erf, (float32,)),  # ~1e-7 error: not float64-exact
    Implementation("numpy.gelu", "gelu", "numpy", _np_gelu, (float32,)),
    Implementation("numpy.layer_norm", "layer_norm", "numpy", _np_layer_norm, FLOATS),
    Implementation("torch.matmul", "matmul", "torch", _torch_matmul, FLOATS),
    Implementation("torch.softmax", "softmax", "torch", _torch_softmax, FLOATS),
    Implementation("torch.log_softmax", "log_softmax", "torch", _torch_log_softmax, FLOATS),
    Implementation("torch.erf", "erf", "torch", _torch_erf, FLOATS),
    Implementation("torch.gelu", "gelu", "torch", _torch_gelu, FLOATS),
    Implementation("torch.layer_norm", "layer_norm", "torch", _torch_layer_norm, FLOATS),
    Implementation("torch.scaled_dot_product_attention", "scaled_dot_product_attention", "torch", _torch_attention,
                   FLOATS, samples=_ATTENTION_SAMPLES),
)



def native_implementations() -> tuple[Implementation, ...]:
    """The AVX-512 GEMM and the OpenBLAS-backed one, where this machine can build them (on first use)."""
    from tensorgraphs.kernels import blas, gemm

    found = []
    if gemm.available():
        found.append(Implementation("cpu.gemm", "matmul", "numpy", gemm.matmul, (float32,)))
    if blas.available():
        found.append(Implementation("cpu.blas", "matmul", "numpy", blas.matmul, (float32,)))
    return tuple(found)


for _kernel in BUILTIN_IMPLEMENTATIONS + native_implementations():
    register_implementation(_kernel, verify=False)
