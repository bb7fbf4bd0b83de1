"""Activations: elementwise non-linearities, and the softmax, log_softmax and gelu composites.

softmax and log_softmax carry explicit gradient rules (y * (g - sum(g * y)) and
g - exp(y) * sum(g)), so a backward pass holds one small expression per
softmax instead of the derivative of its decomposition; gelu's gradient is the
gelu_backward composite (g * gelu'(x)), which a GEMM computing g applies as its
epilogue (schedule.extern).
"""

from __future__ import annotations

import math
from typing import Any

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, DTypeError, fail, warn
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.autocast import LOWER, autocast_op
from tensorgraphs.frontend.tensor import Tensor, apply_composite, cast, normalize_dim
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.nn.functional.arguments import finish_inplace, require_float

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
GELU_TANH_COEFF = 0.044715


def _same_as_input(x: Tensor, **params: Any) -> tuple:
    return x.dtype, x.shape


# ---------------------------------------------------------------------------
# softmax and log_softmax
# ---------------------------------------------------------------------------


def _shifted(x: Tensor, dim: int) -> Tensor:
    """x minus its maximum along `dim`: exp of it cannot overflow."""
    return ew.sub(x, rd.amax(x, dim, keepdim=True))


def _softmax_decomposition(x: Tensor, *, dim: int) -> Tensor:
    exps = ew.exp(_shifted(x, dim))
    return ew.div(exps, rd.sum(exps, dim, keepdim=True))


def _softmax_grad(y: Tensor, grad: Tensor, x: Tensor, *, dim: int) -> tuple[Tensor]:
    return (ew.mul(y, ew.sub(grad, rd.sum(ew.mul(grad, y), dim, keepdim=True))),)


def _log_softmax_decomposition(x: Tensor, *, dim: int) -> Tensor:
    shifted = _shifted(x, dim)
    return ew.sub(shifted, ew.log(rd.sum(ew.exp(shifted), dim, keepdim=True)))


def _log_softmax_grad(y: Tensor, grad: Tensor, x: Tensor, *, dim: int) -> tuple[Tensor]:
    return (ew.sub(grad, ew.mul(ew.exp(y), rd.sum(grad, dim, keepdim=True))),)


SOFTMAX = register(Composite("softmax", _same_as_input, _softmax_decomposition, _softmax_grad))
LOG_SOFTMAX = register(Composite("log_softmax", _same_as_input, _log_softmax_decomposition, _log_softmax_grad))


def _implicit_softmax_dim(op: str, ndim: int) -> int:
    warn(op, f"Implicit dimension choice for {op} has been deprecated. Change the call to include dim=X as an "
         "argument.")
    return 0 if ndim in (0, 1, 3) else 1


def _softmax_like(op: str, composite: Composite, x: Tensor, dim: int | None, dtype: Any) -> Tensor:
    if dtype is not None:
        x = cast(x, dtypes.to_dtype(dtype))
    if not x.dtype.is_floating_point:
        fail(op, f"expected a floating point input (or pass dtype=), got {x.dtype.name}", kind=DTypeError)
    d = normalize_dim(op, _implicit_softmax_dim(op, x.ndim) if dim is None else dim, x.ndim)
    if x.ndim == 0:
        return apply_composite(composite, x.reshape(1), dim=0).reshape(())
    if x.shape[d] == 0:
        return x
    return apply_composite(composite, x, dim=d)


def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    return _softmax_like("softmax", SOFTMAX, input, dim, dtype)


def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    return _softmax_like("log_softmax", LOG_SOFTMAX, input, dim, dtype)


# ---------------------------------------------------------------------------
# gelu
# ---------------------------------------------------------------------------


def _gelu_decomposition(x: Tensor, *, approximate: str) -> Tensor:
    """x * Phi(x) exactly (erf), or with the tanh approximation.

    The tanh form uses the identity 0.5 * (1 + tanh(u)) = sigmoid(2u): one exp2 and one division per
    element instead of tanh's expm1, and no cancellation in 1 + tanh(u) for negative u. float16/bfloat16 are
    computed in float32 and rounded once (so is the gradient), as torch does on the cpu.
    """

    def exact(x: Tensor) -> Tensor:
        if approximate == "tanh":
            inner = ew.mul(ew.add(x, ew.mul(ew.mul(ew.mul(x, x), x), GELU_TANH_COEFF)), math.sqrt(2.0 / math.pi))
            return ew.mul(x, ew.sigmoid(ew.mul(inner, 2.0)))
        return ew.mul(ew.mul(x, 0.5), ew.add(ew.erf(ew.mul(x, 1.0 / math.sqrt(2.0))), 1.0))

    return ew.in_float32_for_halves(exact, x)


def _gelu_derivative(x: Tensor, approximate: str) -> Tensor:
    """d gelu(x) / dx: with the tanh approximation s + 2 x s (1 - s) u' for s = sigmoid(2u), u as in the forward
    pass and u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2); exactly Phi(x) + x phi(x)."""
    if approximate == "tanh":
        x2 = ew.mul(x, x)
        inner = ew.mul(ew.add(x, ew.mul(ew.mul(x2, x), GELU_TANH_COEFF)), math.sqrt(2.0 / math.pi))
        s = ew.sigmoid(ew.mul(inner, 2.0))
        slope = ew.mul(ew.add(ew.mul(x2, 3.0 * GELU_TANH_COEFF), 1.0), math.sqrt(2.0 / math.pi))
        return ew.add(s, ew.mul(ew.mul(ew.mul(ew.mul(x, 2.0), slope), s), ew.sub(1.0, s)))
    cdf = ew.mul(ew.add(ew.erf(ew.mul(x, 1.0 / math.sqrt(2.0))), 1.0), 0.5)
    pdf = ew.mul(ew.exp(ew.mul(ew.mul(x, x), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
    return ew.add(cdf, ew.mul(x, pdf))


def _gelu_backward_decomposition(grad: Tensor, x: Tensor, *, approximate: str) -> Tensor:
    return ew.in_float32_for_halves(lambda g, h: ew.mul(g, _gelu_derivative(h, approximate)), grad, x)


GELU_BACKWARD = register(Composite("gelu_backward", lambda grad, x, **_: (x.dtype, x.shape),
                                   _gelu_backward_decomposition))
"""grad * gelu'(x): gelu's gradient as one composite, so a product computing `grad` can apply it as its epilogue
(`schedule.extern`: the GEMM multiplies by gelu'(x) before storing) instead of a pass of its own."""


def _gelu_grad(y: Tensor, grad: Tensor, x: Tensor, *, approximate: str) -> tuple[Tensor]:
    return (apply_composite(GELU_BACKWARD, grad, x, approximate=approximate),)


GELU = register(Composite("gelu", _same_as_input, _gelu_decomposition, _gelu_grad))


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    if approximate not in ("none", "tanh"):
        fail("gelu", f"approximate argument must be either none or tanh, got {approximate!r}", kind=ArgumentError)
    require_float("gelu", input=input)
    return apply_composite(GELU, input, approximate=approximate)


# ---------------------------------------------------------------------------
# elementwise activations
# ---------------------------------------------------------------------------


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """max(x, 0) with NaN kept and a zero gradient at 0, as torch."""
    return finish_inplace("relu", input, ew.where(ew.le(input, 0), 0, input), inplace)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    return hardtanh(input, 0.0, 6.0, inplace)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """Clamp to [min_val, max_val]; the gradient is 0 on the boundaries, NaN passes through."""
    if min_val > max_val:
        fail("hardtanh", f"min_val ({min_val}) cannot be greater than max_val ({max_val})", kind=ArgumentError)
    out = ew.where(ew.le(input, min_val), min_val, ew.where(ew.ge(input, max_val), max_val, input))
    return finish_inplace("hardtanh", input, cast(out, input.dtype), inplace)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    require_float("leaky_relu", input=input)
    out = ew.where(ew.gt(input, 0), input, ew.mul(input, negative_slope))
    return finish_inplace("leaky_relu", input, out, inplace)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    require_float("elu", input=input)
    out = ew.where(ew.gt(input, 0), input, ew.mul(ew.expm1(input), alpha))
    return finish_inplace("elu", input, out, inplace)


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    return finish_inplace("selu", input, ew.mul(elu(input, SELU_ALPHA), SELU_SCALE), inplace)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    require_float("silu", input=input)
    return finish_inplace("silu", input, ew.mul(input, ew.sigmoid(input)), inplace)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta * x)) / beta, reverting to x where beta * x > threshold."""
    require_float("softplus", input=input)
    scaled = ew.mul(input, beta)
    smooth = ew.div(ew.log1p(ew.exp(scaled)), beta)
    return ew.where(ew.gt(scaled, threshold), input, smooth)


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    return finish_inplace("mish", input, ew.mul(input, ew.tanh(softplus(input))), inplace)


def sigmoid(input: Tensor) -> Tensor:
    return ew.sigmoid(input)


def tanh(input: Tensor) -> Tensor:
    return ew.tanh(input)


def logsigmoid(input: Tensor) -> Tensor:
    """min(x, 0) - log1p(exp(-|x|)): no overflow for large |x|."""
    require_float("logsigmoid", input=input)
    return ew.sub(ew.minimum(input, 0.0), ew.log1p(ew.exp(ew.neg(ew.abs(input)))))


def softsign(input: Tensor) -> Tensor:
    return ew.div(input, ew.add(ew.abs(input), 1))


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    require_float("hardsigmoid", input=input)
    return finish_inplace("hardsigmoid", input, ew.div(relu6(ew.add(input, 3.0)), 6.0), inplace)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """x * relu6(x + 3) / 6 (so -inf gives NaN and the joints' gradients are torch's)."""
    require_float("hardswish", input=input)
    return finish_inplace("hardswish", input, ew.div(ew.mul(input, relu6(ew.add(input, 3.0))), 6.0), inplace)


def softmin(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """softmax(-x): the weights favour the smallest entries."""
    x = input if dtype is None else cast(input, dtypes.to_dtype(dtype))
    require_float("softmin", input=x)
    return _softmax_like("softmin", SOFTMAX, ew.neg(x), dim, None)


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """x where x > 0, alpha * (exp(x / alpha) - 1) elsewhere."""
    require_float("celu", input=input)
    if alpha == 0:
        fail("celu", "ZeroDivisionError: alpha cannot be 0 for CELU", kind=ArgumentError)
    out = ew.where(ew.gt(input, 0), input, ew.mul(ew.expm1(ew.div(input, alpha)), alpha))
    return finish_inplace("celu", input, out, inplace)


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """x where x > threshold, value elsewhere (NaN passes through)."""
    out = cast(ew.where(ew.le(input, threshold), value, input), input.dtype)
    return finish_inplace("threshold", input, out, inplace)


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """0 on [-lambd, lambd], x elsewhere (NaN passes through)."""
    return ew.where(ew.logical_and(ew.ge(input, -lambd), ew.le(input, lambd)), 0, input)


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """x moved lambd towards 0, and 0 on [-lambd, lambd]."""
    require_float("softshrink", input=input)
    if lambd < 0:
        fail("softshrink", f"lambda must be greater or equal to 0, but found to be {lambd}", kind=ArgumentError)
    shrunk = ew.sub(input, ew.mul(ew.sign(input), lambd))
    return ew.where(ew.logical_and(ew.ge(input, -lambd), ew.le(input, lambd)), 0, shrunk)


def tanhshrink(input: Tensor) -> Tensor:
    return ew.sub(input, ew.tanh(input))


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """First half of `dim` gated by the sigmoid of the second half."""
    d = normalize_dim("glu", dim, input.ndim)
    if input.ndim == 0 or input.shape[d] % 2:
        size = input.shape[d] if input.ndim else 1
        fail("glu", f"halving dimension must be even, but dimension {d} is size {size}", kind=ArgumentError)
    a, b = mv.chunk(input, 2, d)
    return ew.mul(a, ew.sigmoid(b))


@autocast_op(LOWER)
def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """leaky_relu with a learned slope: one for all channels, or one per channel (dim 1)."""
    if weight.numel() != 1 and (input.ndim < 2 or weight.shape != (input.shape[1],)):
        fail("prelu", f"weight of shape {weight.shape} must have 1 element or one per channel of input {input.shape}")
    if weight.numel() != 1:
        weight = weight.reshape((weight.numel(),) + (1,) * (input.ndim - 2))
    else:
        weight = weight.reshape(())
    return ew.where(ew.gt(input, 0), input, ew.mul(weight, input))


# torch's in-place spellings: the same op rebinding `input`
def relu_(input: Tensor) -> Tensor:
    return relu(input, inplace=True)


def elu_(input: Tensor, alpha: float = 1.0) -> Tensor:
    return elu(input, alpha, inplace=True)


def celu_(input: Tensor, alpha: float = 1.0) -> Tensor:
    return celu(input, alpha, inplace=True)


def selu_(input: Tensor) -> Tensor:
    return selu(input, inplace=True)


def leaky_relu_(input: Tensor, negative_slope: float = 0.01) -> Tensor:
    return leaky_relu(input, negative_slope, inplace=True)


def hardtanh_(input: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    return hardtanh(input, min_val, max_val, inplace=True)


def threshold_(input: Tensor, threshold_value: float, value: float) -> Tensor:
    return threshold(input, threshold_value, value, inplace=True)
