"""Identity, Linear and Bilinear, initialized as torch initializes them."""

from __future__ import annotations

import math
from typing import Any

from tensorgraphs.frontend import creation, linalg
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.nn import functional as F
from tensorgraphs.nn import init
from tensorgraphs.nn.module import Module
from tensorgraphs.nn.parameter import Parameter


def new_parameter(*shape: int, dtype: Any = None) -> Parameter:
    """An uninitialized (zero) parameter; each layer's reset_parameters fills it."""
    return Parameter(creation.zeros(*shape, dtype=dtype))


def reset_linear_like(weight: Tensor, bias: Tensor | None) -> None:
    """torch's default for Linear and Conv: kaiming_uniform(a=sqrt(5)) weight, uniform(+-1/sqrt(fan_in)) bias."""
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = init._calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        init.uniform_(bias, -bound, bound)


class Identity(Module):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, input: Tensor) -> Tensor:
        return input


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = new_parameter(out_features, in_features, dtype=dtype)
        self.bias = new_parameter(out_features, dtype=dtype) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_linear_like(self.weight, self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Bilinear(Module):
    """y = x1^T A x2 + b; F has no bilinear yet, so the einsum lives here."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        self.weight = new_parameter(out_features, in1_features, in2_features, dtype=dtype)
        self.bias = new_parameter(out_features, dtype=dtype) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.weight.shape[1])
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1: Tensor, input2: Tensor) -> Tensor:
        out = linalg.einsum("...i,oij,...j->...o", input1, self.weight, input2)
        return out if self.bias is None else ew.add(out, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")
