"""Compare a tg.nn.functional op with torch.nn.functional on the same inputs: values and gradients.

Float inputs listed in `grad` are differentiated in both libraries with the
same random cotangent; failures name the op, the input shapes and the seed.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

import tensorgraphs as tg


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def normal(seed: int, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng(seed).standard_normal(shape) * scale).astype(np.float32)


def uniform(seed: int, *shape: int, low: float = 0.0, high: float = 1.0) -> np.ndarray:
    return rng(seed).uniform(low, high, shape).astype(np.float32)


def _pair(value: Any, differentiate: bool) -> tuple[Any, Any]:
    if not isinstance(value, np.ndarray):
        return value, value
    ours = tg.tensor(value, requires_grad=differentiate)
    theirs = torch.tensor(value, requires_grad=differentiate)
    return ours, theirs


def _as_list(out: Any) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check(ours_fn: Callable[..., Any], theirs_fn: Callable[..., Any], inputs: Sequence[Any], grad: Sequence[int] = (),
          rtol: float = 1e-5, atol: float = 1e-5, grad_rtol: float | None = None, grad_atol: float | None = None,
          name: str = "", seed: int = 0) -> list[tg.Tensor]:
    """Run both functions on `inputs` (numpy arrays become tensors, anything else is passed as is) and compare
    every output, then the gradients of the float outputs with respect to the inputs at positions `grad`."""
    pairs = [_pair(v, i in grad) for i, v in enumerate(inputs)]
    ours_out = _as_list(ours_fn(*[p[0] for p in pairs]))
    theirs_out = _as_list(theirs_fn(*[p[1] for p in pairs]))
    shapes = [getattr(v, "shape", v) for v in inputs]
    label = f"{name or getattr(theirs_fn, '__name__', 'op')} on {shapes} (seed {seed})"
    assert len(ours_out) == len(theirs_out), label
    for o, t in zip(ours_out, theirs_out):
        assert tuple(o.shape) == tuple(t.shape), f"{label}: shape {o.shape} vs torch {tuple(t.shape)}"
        np.testing.assert_allclose(o.detach().numpy(), t.detach().numpy(), rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=f"{label}: values")
    if not grad:
        return ours_out
    differentiable = [(o, t) for o, t in zip(ours_out, theirs_out) if t.dtype.is_floating_point and t.requires_grad]
    cotangents = [normal(seed + 1000 + k, *t.shape) for k, (_, t) in enumerate(differentiable)]
    ours_grads = tg.grad([o for o, _ in differentiable], [pairs[i][0] for i in grad],
                         grad_outputs=[tg.tensor(c) for c in cotangents], allow_unused=True)
    theirs_grads = torch.autograd.grad([t for _, t in differentiable], [pairs[i][1] for i in grad],
                                       grad_outputs=[torch.tensor(c) for c in cotangents], allow_unused=True)
    for i, o, t in zip(grad, ours_grads, theirs_grads):
        o_value = np.zeros(inputs[i].shape, np.float32) if o is None else o.numpy()
        t_value = np.zeros(inputs[i].shape, np.float32) if t is None else t.numpy()
        np.testing.assert_allclose(o_value, t_value, rtol=grad_rtol or rtol * 10, atol=grad_atol or atol * 10,
                                   equal_nan=True, err_msg=f"{label}: gradient of input {i}")
    return ours_out
