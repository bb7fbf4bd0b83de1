"""Elementwise ops: arithmetic with ONNX's integer semantics (Div truncates, Mod follows `fmod`), comparisons,
logic, math functions and activations with their attributes."""

from __future__ import annotations

from typing import Callable

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.onnx.lowering import OnnxNode, Value, lowers, tensor

UNARY: dict[str, Callable[[Tensor], Tensor]] = {
    "Abs": tg.abs, "Neg": tg.neg, "Exp": tg.exp, "Log": tg.log, "Sqrt": tg.sqrt, "Reciprocal": tg.reciprocal,
    "Floor": tg.floor, "Ceil": tg.ceil, "Round": tg.round, "Sign": tg.sign, "Sin": tg.sin, "Cos": tg.cos,
    "Tan": tg.tan, "Asin": tg.asin, "Acos": tg.acos, "Atan": tg.atan, "Sinh": tg.sinh, "Cosh": tg.cosh,
    "Asinh": tg.asinh, "Acosh": tg.acosh, "Atanh": tg.atanh, "Erf": tg.erf, "Sigmoid": tg.sigmoid, "Tanh": tg.tanh,
    "Relu": F.relu, "IsNaN": tg.isnan, "Not": tg.logical_not, "BitwiseNot": tg.bitwise_not,
    "Softsign": F.softsign, "Identity": lambda x: x,
}
BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "Add": tg.add, "Sub": tg.sub, "Mul": tg.mul, "Equal": tg.eq, "Less": tg.lt, "LessOrEqual": tg.le,
    "Greater": tg.gt, "GreaterOrEqual": tg.ge, "And": tg.logical_and, "Or": tg.logical_or, "Xor": tg.logical_xor,
    "BitwiseAnd": tg.bitwise_and, "BitwiseOr": tg.bitwise_or, "BitwiseXor": tg.bitwise_xor,
}
VARIADIC: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"Sum": tg.add, "Max": tg.maximum, "Min": tg.minimum}


@lowers(*UNARY)
def unary(node: OnnxNode, x: Value) -> Tensor:
    return UNARY[node.op_type](tensor(x))


@lowers(*BINARY)
def binary(node: OnnxNode, a: Value, b: Value) -> Tensor:
    return BINARY[node.op_type](tensor(a), tensor(b))


@lowers(*VARIADIC, "Mean")
def variadic(node: OnnxNode, *inputs: Value) -> Tensor:
    combine = VARIADIC.get(node.op_type, tg.add)
    out = tensor(inputs[0])
    for value in inputs[1:]:
        out = combine(out, tensor(value))
    return tg.div(out, len(inputs)) if node.op_type == "Mean" else out


@lowers("Div")
def div(node: OnnxNode, a: Value, b: Value) -> Tensor:
    a, b = tensor(a), tensor(b)
    return tg.div(a, b, rounding_mode="trunc") if a.dtype.is_integer else tg.div(a, b)


@lowers("Mod")
def mod(node: OnnxNode, a: Value, b: Value) -> Tensor:
    """fmod=1: the sign of the dividend (C's fmod); fmod=0 (integers only): the sign of the divisor (Python's %)."""
    a, b = tensor(a), tensor(b)
    return tg.fmod(a, b) if node.attr("fmod", 0) else tg.remainder(a, b)


@lowers("Pow")
def pow(node: OnnxNode, base: Value, exponent: Value) -> Tensor:
    base, exponent = tensor(base), tensor(exponent)
    return tg.pow(base, exponent).to(base.dtype)


@lowers("BitShift")
def bit_shift(node: OnnxNode, x: Value, shift: Value) -> Tensor:
    """Shifts outside [0, width) give 0 (or -1 for a negative value shifted right); left shifts wrap,
    computed in int64 for narrower types."""
    x, shift = tensor(x), tensor(shift)
    width = x.dtype.bits
    inside = tg.logical_and(shift >= 0, shift < width)
    bounded = tg.where(inside, shift, tg.zeros_like(shift))
    if node.attr("direction") == "LEFT":
        wide = x if width == 64 else x.to(tg.int64)
        moved = tg.bitwise_left_shift(wide, bounded.to(wide.dtype)).to(x.dtype)
        return tg.where(inside, moved, tg.zeros_like(moved))
    moved = tg.bitwise_right_shift(x, bounded)
    beyond = tg.where(x < 0, tg.full_like(x, -1), tg.zeros_like(x))
    return tg.where(inside, moved, beyond)


@lowers("IsInf")
def is_inf(node: OnnxNode, x: Value) -> Tensor:
    x = tensor(x)
    positive, negative = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    return tg.logical_and(tg.isinf(x), (x > 0) if not negative else (x < 0) if not positive else tg.isinf(x))


@lowers("Where")
def where(node: OnnxNode, condition: Value, a: Value, b: Value) -> Tensor:
    return tg.where(tensor(condition), tensor(a), tensor(b))


@lowers("Clip")
def clip(node: OnnxNode, x: Value, low: Value | None = None, high: Value | None = None) -> Tensor:
    """Inputs since opset 11, attributes before; a low bound above the high one gives the high one."""
    x = tensor(x)
    if node.opset < 11:
        low, high = node.attr("min"), node.attr("max")
    bound = lambda b: tg.full((), b, dtype=x.dtype) if isinstance(b, float) else tensor(b)  # noqa: E731
    if low is not None:
        x = tg.maximum(x, bound(low))
    if high is not None:
        x = tg.minimum(x, bound(high))
    return x


def _elu(x: Tensor, alpha: float) -> Tensor:
    return tg.where(x > 0, x, tg.mul(tg.expm1(x), alpha))


ACTIVATIONS: dict[str, Callable[[OnnxNode, Tensor], Tensor]] = {
    "Elu": lambda n, x: _elu(x, n.attr("alpha", 1.0)),
    "Selu": lambda n, x: tg.mul(_elu(x, n.attr("alpha", 1.6732632423543772)), n.attr("gamma", 1.0507009873554805)),
    "Celu": lambda n, x: tg.mul(_elu(tg.div(x, n.attr("alpha", 1.0)), 1.0), n.attr("alpha", 1.0)),
    "LeakyRelu": lambda n, x: tg.where(x >= 0, x, tg.mul(x, n.attr("alpha", 0.01))),
    "ThresholdedRelu": lambda n, x: tg.where(x > n.attr("alpha", 1.0), x, tg.zeros_like(x)),
    "HardSigmoid": lambda n, x: tg.clamp(tg.add(tg.mul(x, n.attr("alpha", 0.2)), n.attr("beta", 0.5)), 0.0, 1.0),
    "HardSwish": lambda n, x: tg.mul(x, tg.clamp(tg.add(tg.mul(x, 1 / 6), 0.5), 0.0, 1.0)),
    "Softplus": lambda n, x: F.softplus(x),
    "Mish": lambda n, x: F.mish(x),
    "Gelu": lambda n, x: F.gelu(x, approximate=n.attr("approximate", "none")),
    "Swish": lambda n, x: tg.mul(x, tg.sigmoid(tg.mul(x, n.attr("alpha", 1.0)))),
    "Shrink": lambda n, x: _shrink(x, n.attr("lambd", 0.5), n.attr("bias", 0.0)),
}


def _shrink(x: Tensor, lambd: float, bias: float) -> Tensor:
    zero = tg.zeros_like(x)
    return tg.where(x < -lambd, tg.add(x, bias).to(x.dtype), tg.where(x > lambd, tg.sub(x, bias).to(x.dtype), zero))


@lowers(*ACTIVATIONS)
def activation(node: OnnxNode, x: Value) -> Tensor:
    return ACTIVATIONS[node.op_type](node, tensor(x))


@lowers("PRelu")
def prelu(node: OnnxNode, x: Value, slope: Value) -> Tensor:
    """A slope of one value per channel that does not broadcast from the right applies along axis 1 (as
    exporters write it for PyTorch's PReLU and ONNX Runtime reads it)."""
    x, slope = tensor(x), tensor(slope)
    if slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1] != x.shape[-1]:
        slope = tg.reshape(slope, (-1,) + (1,) * (x.ndim - 2))
    return tg.where(x >= 0, x, tg.mul(x, slope))


