"""`Parameter`: a tensor a `Module` owns and an optimizer updates."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorgraphs.frontend.tensor import Tensor, as_tensor


class Parameter(Tensor):
    """A leaf tensor that requires grad (by default), always backed by its own BUFFER node.

    A fresh buffer is made even when `data` already is one, so two parameters never share
    a gradient leaf; `assign` keeps the object (and so optimizers' references) while
    replacing the contents.
    """

    __slots__ = ()

    def __init__(self, data: Tensor | np.ndarray | None = None, requires_grad: bool = True) -> None:
        source = as_tensor(np.zeros((0,), np.float32) if data is None else data)
        fresh = Tensor.from_numpy(np.asarray(source.detach()._value()), source.dtype)
        super().__init__(fresh.node, requires_grad=requires_grad)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo: dict[int, Any]) -> Parameter:
        clone = Parameter(self.detach(), self.requires_grad)
        memo[id(self)] = clone
        return clone
