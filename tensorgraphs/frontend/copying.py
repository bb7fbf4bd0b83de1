"""`copy.deepcopy` and pickling of tensors, and so of modules and optimizers holding them (PyTorch code keeps the
best model with `copy.deepcopy(model)` and saves whole modules with pickle).

As in torch, a leaf's value, `requires_grad` and `.grad` are copied, and its class (e.g. `nn.Parameter`) is kept;
tensors shared inside the copied object (tied weights) stay shared in the copy. A tensor computed from others
that requires grad cannot be copied, as in torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.errors import UnsupportedError, fail
from tensorgraphs.frontend.tensor import Tensor, host_buffer


def _rebuild(cls: type[Tensor], value: np.ndarray, dtype: str, requires_grad: bool,
             grad: np.ndarray | None) -> Tensor:
    tensor_dtype = dtypes.to_dtype(dtype)
    tensor = cls.__new__(cls)
    Tensor.__init__(tensor, host_buffer(value, tensor_dtype), requires_grad=requires_grad)
    if grad is not None:
        tensor.grad = Tensor(host_buffer(grad, tensor_dtype))
    return tensor


def _reduce_ex(self: Tensor, protocol: int) -> tuple[Any, tuple[Any, ...]]:
    if self.requires_grad and not self.is_leaf:
        fail("deepcopy", "only tensors created explicitly by the user (graph leaves) can be copied or pickled; "
             "use tensor.detach()", kind=UnsupportedError)
    value = np.array(self.detach()._value())  # a copy: the original may be updated in place later
    grad = None if self.grad is None else np.array(self.grad.detach()._value())
    return _rebuild, (type(self), value, self.dtype.name, self.requires_grad, grad)


Tensor.__reduce_ex__ = _reduce_ex
