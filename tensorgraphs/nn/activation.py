"""Activation modules: each is a function of torch.nn.functional plus its constructor arguments."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.nn import functional as F
from tensorgraphs.nn.module import Module, bind_arguments


class Activation(Module):
    """Stores `arguments` (torch's names, order and defaults) and calls `function(input, **arguments)`."""

    function: ClassVar[Callable[..., Tensor]]
    arguments: ClassVar[dict[str, Any]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        for key, value in bind_arguments(type(self).__name__, self.arguments, args, kwargs).items():
            setattr(self, key, value)

    def forward(self, input: Tensor) -> Tensor:
        return type(self).function(input, **{key: getattr(self, key) for key in self.arguments})

    def extra_repr(self) -> str:
        shown = [f"{key}={getattr(self, key)!r}" for key in self.arguments if key != "inplace"]
        return ", ".join(shown + (["inplace=True"] if getattr(self, "inplace", False) else []))


class ReLU(Activation):
    function, arguments = F.relu, {"inplace": False}


class ReLU6(Activation):
    function, arguments = F.relu6, {"inplace": False}


class LeakyReLU(Activation):
    function, arguments = F.leaky_relu, {"negative_slope": 0.01, "inplace": False}


class ELU(Activation):
    function, arguments = F.elu, {"alpha": 1.0, "inplace": False}


class SELU(Activation):
    function, arguments = F.selu, {"inplace": False}


class GELU(Activation):
    function, arguments = F.gelu, {"approximate": "none"}


class SiLU(Activation):
    function, arguments = F.silu, {"inplace": False}


class Mish(Activation):
    function, arguments = F.mish, {"inplace": False}


class Hardtanh(Activation):
    function, arguments = F.hardtanh, {"min_val": -1.0, "max_val": 1.0, "inplace": False}


class Hardsigmoid(Activation):
    function, arguments = F.hardsigmoid, {"inplace": False}


class Hardswish(Activation):
    function, arguments = F.hardswish, {"inplace": False}


class Softplus(Activation):
    function, arguments = F.softplus, {"beta": 1.0, "threshold": 20.0}


class Sigmoid(Activation):
    function = F.sigmoid


class Tanh(Activation):
    function = F.tanh


class LogSigmoid(Activation):
    function = F.logsigmoid


class Softsign(Activation):
    function = F.softsign


class Softmax(Activation):
    function, arguments = F.softmax, {"dim": None}


class LogSoftmax(Activation):
    function, arguments = F.log_softmax, {"dim": None}
