"""torch.nn.utils's gradient clipping, written as Tensor ops (in-graph) and applied with `assign`."""

from __future__ import annotations

import math
from typing import Iterable

from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.frontend import creation
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.grad_mode import no_grad
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.runtime import tracing
from tensorgraphs.runtime.realize import realize
from tensorgraphs.serialization import load as load_safetensors
from tensorgraphs.serialization import save as save_safetensors

__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm", "load_safetensors", "save_safetensors"]


def _grads(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    parameters = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    return [p.grad for p in parameters if p.grad is not None]


def get_total_norm(tensors: Iterable[Tensor], norm_type: float = 2.0, error_if_nonfinite: bool = False) -> Tensor:
    """The norm of the per-tensor norms (= the norm of all elements together)."""
    tensors = list(tensors)
    if not tensors:
        return creation.zeros(())
    with no_grad():
        total = rd.norm(mv.stack([rd.norm(t, float(norm_type)) for t in tensors]), float(norm_type))
    if error_if_nonfinite and not math.isfinite(total.item()):
        fail("clip_grad_norm_", f"the total norm of order {norm_type} for gradients from `parameters` is non-finite, "
             "so it cannot be clipped; set error_if_nonfinite=False to skip this check", kind=ArgumentError)
    return total


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Scale all gradients by min(1, max_norm / (total_norm + 1e-6)); returns the total norm before clipping."""
    grads = _grads(parameters)
    total = get_total_norm(grads, norm_type, error_if_nonfinite)
    with no_grad():
        coefficient = ew.clamp(ew.div(float(max_norm), ew.add(total, 1e-6)), max=1.0)
        clipped = [ew.mul(grad, coefficient) for grad in grads]
        if tracing.active() is None:  # eager: computed now, as torch does, in one program; left lazy, every
            # gradient would be a graph over all of them, computed again wherever one is read (an in-place update
            # of its parameter realizes that parameter at once)
            values = realize([total.node, *(c.node for c in clipped)])[1:]
            clipped = [Tensor.from_numpy(value, grad.dtype) for value, grad in zip(values, grads)]
        for grad, value in zip(grads, clipped):
            grad.assign(value)
    return total


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None) -> None:
    with no_grad():
        for grad in _grads(parameters):
            grad.assign(ew.clamp(grad, -float(clip_value), float(clip_value)))
