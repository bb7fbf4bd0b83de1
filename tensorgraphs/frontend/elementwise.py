"""Elementwise math, each op a short composition of primitives (see docs/ops.md).

Transcendental functions without a primitive use the documented approximations
below; their accuracy is tested against PyTorch in float32.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.dtypes import DType
from tensorgraphs.errors import DTypeError, fail
from tensorgraphs.frontend.tensor import (
    Scalar,
    Tensor,
    apply,
    apply_composite,
    broadcast_shapes,
    cast,
    expand_to,
    full_like_node,
    is_scalar,
    operands,
)
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.graph.ops import Op

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2

# ---------------------------------------------------------------------------
# dtype helpers
# ---------------------------------------------------------------------------


def to_float(x: Tensor) -> Tensor:
    """Integer and bool inputs of float functions become the default float, as in PyTorch."""
    return x if x.dtype.is_floating_point else cast(x, dtypes.default_float)


_HALF = (dtypes.float16, dtypes.bfloat16)


def in_float32_for_halves(fn: Callable[..., Tensor], *tensors: Tensor) -> Tensor:
    """fn(*tensors), computed in float32 when they are float16/bfloat16 (all share one dtype) and rounded
    once at the end, as PyTorch does on CPU: rounding after every primitive compounds the error."""
    dtype = tensors[0].dtype
    if dtype not in _HALF:
        return fn(*tensors)
    return cast(fn(*(cast(t, dtypes.float32) for t in tensors)), dtype)


def piecewise_constant(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """A float function whose gradient is zero almost everywhere (floor, sign, ...): computed from the
    detached input, its result still requires grad when the input does, as in PyTorch."""

    @functools.wraps(fn)
    def wrapper(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if not x.dtype.is_floating_point:
            return fn(x, *args, **kwargs)
        return Tensor.result(fn(x.detach(), *args, **kwargs).node, x)

    return wrapper


def float_function(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """A float function of one tensor: integer inputs become the default float, and float16/bfloat16
    inputs are computed in float32 (see `in_float32_for_halves`)."""

    @functools.wraps(fn)
    def wrapper(x: Tensor) -> Tensor:
        return in_float32_for_halves(fn, to_float(x))

    return wrapper


def _same_as_input(x: Tensor) -> tuple[DType, tuple[int, ...]]:
    return x.dtype, x.shape


def smooth_function(derivative: Callable[[Tensor, Tensor], Tensor]) -> Callable[..., Callable[[Tensor], Tensor]]:
    """Make a float function's decomposition a composite with the exact gradient `derivative(x, out)`.

    Differentiating a decomposition that switches between formulas (Kahan's log1p, range-reduced atan,
    asinh's overflow guard) sends 0 * inf = NaN through the branch not taken; the exact derivative also
    keeps backward graphs small. The composite is named after the function.
    """

    def register_function(decomposition: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
        def gradient(out: Tensor, grad: Tensor, x: Tensor) -> tuple[Tensor]:
            return (mul(grad, derivative(x, out)),)

        composite = register(Composite(decomposition.__name__, infer=_same_as_input, decompose=decomposition,
                                       grad=gradient))

        @functools.wraps(decomposition)
        def function(x: Tensor) -> Tensor:
            return in_float32_for_halves(lambda t: apply_composite(composite, t), to_float(x))

        function.composite = composite  # type: ignore[attr-defined]
        return function

    return register_function


def _require(op: str, x: Tensor, allowed: str) -> None:
    if x.dtype.kind not in allowed:
        kinds = {"b": "bool", "i": "signed integer", "u": "unsigned integer", "f": "floating point"}
        wanted = " or ".join(sorted({kinds[k] for k in allowed}))
        fail(op, f"expected {wanted} input, got {x.dtype.name}", kind=DTypeError)


# ---------------------------------------------------------------------------
# arithmetic
# ---------------------------------------------------------------------------


def add(a: Any, b: Any, *, alpha: Scalar = 1) -> Tensor:
    if alpha != 1:
        b = mul(b, alpha)
    (x, y), dtype = operands("add", a, b)
    return apply(Op.ADD, x, y)


def sub(a: Any, b: Any, *, alpha: Scalar = 1) -> Tensor:
    if any(isinstance(v, bool) or isinstance(v, Tensor) and v.dtype.is_bool for v in (a, b)):
        fail("sub", "subtraction with a bool operand is not supported; use logical_xor or ~", kind=DTypeError)
    (x, y), _ = operands("sub", a, b)
    return apply(Op.ADD, x, neg(y) if alpha == 1 else mul(y, -alpha))


def rsub(a: Any, b: Any) -> Tensor:
    return sub(b, a)


def mul(a: Any, b: Any) -> Tensor:
    (x, y), _ = operands("mul", a, b)
    return apply(Op.MUL, x, y)


def neg(x: Tensor) -> Tensor:
    if x.dtype.is_bool:
        fail("neg", "negation of a bool tensor is not supported; use ~ or logical_not", kind=DTypeError)
    return apply(Op.MUL, x, full_like_node(-1, x))


def div(a: Any, b: Any, *, rounding_mode: str | None = None) -> Tensor:
    """True division, or with rounding_mode "floor"/"trunc" as torch.div."""
    if rounding_mode is None:
        (x, y), _ = operands("div", a, b, floating=True)
        return apply(Op.DIV, x, y)
    if rounding_mode not in ("floor", "trunc"):
        fail("div", f"rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")
    (x, y), dtype = operands("div", a, b)
    if dtype.is_bool:
        x, y = cast(x, dtypes.int64), cast(y, dtypes.int64)
    if dtype.is_floating_point:
        if rounding_mode == "floor":
            return in_float32_for_halves(_floor_divide_float, x, y)
        return trunc(apply(Op.DIV, x, y))
    floored = apply(Op.DIV, x, y)
    if rounding_mode == "floor":
        return floored
    inexact = ne(mul(floored, y), x)
    return where(logical_and(lt(floored, 0), inexact), add(floored, 1), floored)


def _floor_divide_float(x: Tensor, y: Tensor) -> Tensor:
    """PyTorch's (and Python's) float floor division: from fmod, so that x // y * y + x % y == x holds as
    closely as it can, an infinite dividend gives NaN and a zero divisor gives x / y."""
    mod = fmod(x, y)
    quotient = apply(Op.DIV, sub(x, mod), y)
    quotient = where(logical_and(ne(mod, 0), ne(lt(y, 0), lt(mod, 0))), sub(quotient, 1.0), quotient)
    floored = floor(quotient)
    floored = where(gt(sub(quotient, floored), 0.5), add(floored, 1.0), floored)
    floored = where(eq(quotient, 0), mul(apply(Op.DIV, x, y), 0.0), floored)  # zero with the sign of x / y
    return where(eq(y, 0), apply(Op.DIV, x, y), floored)


def floor_divide(a: Any, b: Any) -> Tensor:
    return div(a, b, rounding_mode="floor")


def remainder(a: Any, b: Any) -> Tensor:
    """Python's modulo: the result has the divisor's sign."""
    (x, y), dtype = operands("remainder", a, b)
    if dtype.is_integer:
        return apply(Op.MOD, x, y)
    _require("remainder", x, "f")
    return in_float32_for_halves(_remainder_float, x, y)


def _remainder_float(x: Tensor, y: Tensor) -> Tensor:
    """PyTorch's: fmod, moved by one divisor when the signs differ (so infinities behave as in Python)."""
    mod = _fmod_float(x, y)
    return where(logical_and(ne(mod, 0), ne(lt(y, 0), lt(mod, 0))), add(mod, y), mod)


def fmod(a: Any, b: Any) -> Tensor:
    """C's fmod: the result has the dividend's sign."""
    (x, y), dtype = operands("fmod", a, b)
    if dtype.is_integer:
        return sub(x, mul(div(x, y, rounding_mode="trunc"), y))
    return in_float32_for_halves(_fmod_float, x, y)


def _fmod_float(x: Tensor, y: Tensor) -> Tensor:
    result = sub(x, mul(y, trunc(apply(Op.DIV, x, y))))
    return where(logical_and(isinf(y), isfinite(x)), x, result)  # x - inf * 0 would be NaN


def reciprocal(x: Tensor) -> Tensor:
    x = to_float(x)
    return apply(Op.DIV, full_like_node(1.0, x), x)


def pow(base: Any, exponent: Any) -> Tensor:
    """torch.pow: exact repeated multiplication for small integer exponents, exp2/log2 otherwise; integers
    exactly, wrapping as torch."""
    if isinstance(base, Tensor) and is_scalar(exponent):
        return _pow_scalar_exponent(base, exponent)
    (x, y), dtype = operands("pow", base, exponent)
    if dtype.is_bool:
        x, y, dtype = cast(x, dtypes.int64), cast(y, dtypes.int64), dtypes.int64
    if dtype.is_integer:
        return _pow_integer(x, y)
    return in_float32_for_halves(_pow_float, x, y)


def _pow_integer(x: Tensor, y: Tensor) -> Tensor:
    """x ** y by squaring over every bit an exponent of this dtype can have (products wrap, as torch's). A
    negative exponent gives 1 / x truncated, as torch: 1 for x == 1, -1 or 1 for x == -1, else 0."""
    result, square, bits = full_like_node(1, x), x, where(lt(y, 0), 0, y)
    for _ in range(x.dtype.bits - (x.dtype.kind == "i")):
        result = where(eq(remainder(bits, 2), 1), mul(result, square), result)
        square, bits = mul(square, square), div(bits, 2, rounding_mode="floor")
    if x.dtype.kind == "u":
        return result
    one = full_like_node(1, x)
    reciprocal_ = where(eq(x, -1), where(eq(remainder(y, 2), 1), neg(one), one), mul(one, 0))
    negative = where(eq(x, 1), one, reciprocal_)
    return where(lt(y, 0), negative, result)


def _pow_by_squaring(x: Tensor, exponent: int) -> Tensor:
    """x ** exponent (>= 0, a Python int) by squaring: exact for integer dtypes, products wrapping."""
    result, square = full_like_node(1, x), x
    while exponent:
        if exponent & 1:
            result = mul(result, square)
        exponent >>= 1
        if exponent:
            square = mul(square, square)
    return result


def _pow_scalar_exponent(x: Tensor, exponent: Scalar) -> Tensor:
    dims, zero_dim = ([x.dtype], []) if x.ndim else ([], [x.dtype])
    (x,), dtype = operands("pow", x, dtype=dtypes.result_type(dims, zero_dim, [exponent]))
    if float(exponent).is_integer() and 0 <= exponent <= 8:
        result = full_like_node(1, x)
        for _ in range(int(exponent)):
            result = mul(result, x)
        return Tensor.result(result.node, x)  # x ** 0 still requires grad (with gradient 0)
    if exponent == 0.5:
        return sqrt(x)
    if exponent == -0.5:
        return rsqrt(x)
    if float(exponent).is_integer() and -8 <= exponent < 0 and dtype.is_floating_point:
        return reciprocal(_pow_scalar_exponent(x, -exponent))
    if dtype.is_integer and exponent < 0:
        fail("pow", "integers to negative integer powers are not allowed", kind=DTypeError)
    if dtype.is_integer:
        return _pow_by_squaring(x, int(exponent))
    x = to_float(x)
    return in_float32_for_halves(_pow_float, x, full_like_node(float(exponent), x))


def _pow_float(x: Tensor, y: Tensor) -> Tensor:
    """C's pow: |x|^y with the sign of x for odd integer y; NaN for finite negative x and non-integer y."""
    magnitude = exp2(mul(y, log2(abs(x))))
    y_is_integer = eq(floor(y), y)
    y_is_odd = eq(abs(fmod(y, 2.0)), 1.0)
    signed = where(logical_and(lt(x, 0), y_is_odd), neg(magnitude), magnitude)
    invalid = logical_and(logical_and(lt(x, 0), isfinite(x)), logical_not(y_is_integer))
    result = mul(signed, where(invalid, full_like_node(math.nan, x), full_like_node(1.0, x)))  # NaN gradient too
    exactly_one = logical_or(logical_or(eq(y, 0), eq(x, 1.0)), logical_and(eq(x, -1.0), isinf(y)))
    return where(exactly_one, full_like_node(1.0, x), result)


def rpow(a: Any, b: Any) -> Tensor:
    return pow(b, a)


# ---------------------------------------------------------------------------
# comparisons and logic
# ---------------------------------------------------------------------------


def lt(a: Any, b: Any) -> Tensor:
    (x, y), _ = operands("lt", a, b)
    return apply(Op.CMPLT, x, y)


def gt(a: Any, b: Any) -> Tensor:
    (x, y), _ = operands("gt", a, b)
    return apply(Op.CMPLT, y, x)


def ne(a: Any, b: Any) -> Tensor:
    (x, y), _ = operands("ne", a, b)
    return apply(Op.CMPNE, x, y)


def eq(a: Any, b: Any) -> Tensor:
    return logical_not(ne(a, b))


def le(a: Any, b: Any) -> Tensor:
    return logical_or(lt(a, b), eq(a, b))


def ge(a: Any, b: Any) -> Tensor:
    return logical_or(gt(a, b), eq(a, b))


def _as_bool(x: Any) -> Any:
    return cast(x, dtypes.bool_) if isinstance(x, Tensor) else bool(x)


def logical_not(x: Tensor) -> Tensor:
    x = _as_bool(x)
    return apply(Op.XOR, x, full_like_node(True, x))


def logical_and(a: Any, b: Any) -> Tensor:
    (x, y), _ = operands("logical_and", _as_bool(a), _as_bool(b))
    return apply(Op.AND, x, y)


def logical_or(a: Any, b: Any) -> Tensor:
    (x, y), _ = operands("logical_or", _as_bool(a), _as_bool(b))
    return apply(Op.OR, x, y)


def logical_xor(a: Any, b: Any) -> Tensor:
    (x, y), _ = operands("logical_xor", _as_bool(a), _as_bool(b))
    return apply(Op.XOR, x, y)


def _bitwise(op_name: str, op: Op, a: Any, b: Any) -> Tensor:
    (x, y), dtype = operands(op_name, a, b)
    _require(op_name, x, "biu")
    return apply(op, x, y)


def bitwise_and(a: Any, b: Any) -> Tensor:
    return _bitwise("bitwise_and", Op.AND, a, b)


def bitwise_or(a: Any, b: Any) -> Tensor:
    return _bitwise("bitwise_or", Op.OR, a, b)


def bitwise_xor(a: Any, b: Any) -> Tensor:
    return _bitwise("bitwise_xor", Op.XOR, a, b)


def bitwise_not(x: Tensor) -> Tensor:
    _require("bitwise_not", x, "biu")
    return apply(Op.XOR, x, full_like_node(True if x.dtype.is_bool else -1, x))


def _shift_factor(op: str, a: Any, b: Any) -> tuple[Tensor, Tensor]:
    (x, y), dtype = operands(op, a, b)
    _require(op, x, "iu")
    factor = cast(exp2(cast(y, dtypes.float64)), dtype)
    return x, factor


def bitwise_left_shift(a: Any, b: Any) -> Tensor:
    x, factor = _shift_factor("bitwise_left_shift", a, b)
    return apply(Op.MUL, x, factor)


def bitwise_right_shift(a: Any, b: Any) -> Tensor:
    """Arithmetic shift: floor division by a power of two."""
    x, factor = _shift_factor("bitwise_right_shift", a, b)
    return apply(Op.DIV, x, factor)


def where(condition: Any, a: Any, b: Any) -> Tensor:
    if not isinstance(condition, Tensor):
        fail("where", f"condition must be a Tensor, got {type(condition).__name__}", kind=DTypeError)
    (x, y), dtype = operands("where", a, b)
    (c, x, y), _ = _broadcast3(_as_bool(condition), x, y)
    return apply(Op.WHERE, c, x, y)


def _broadcast3(c: Tensor, x: Tensor, y: Tensor) -> tuple[list[Tensor], DType]:
    shape = broadcast_shapes("where", c.shape, x.shape, y.shape)
    return [expand_to(t, shape) for t in (c, x, y)], x.dtype


def maximum(a: Any, b: Any) -> Tensor:
    (x, y), _ = operands("maximum", a, b)
    return apply(Op.MAX, x, y)


def minimum(a: Any, b: Any) -> Tensor:
    """NaN propagates; ties pick the first operand."""
    (x, y), dtype = operands("minimum", a, b)
    if dtype.is_bool:
        return logical_and(x, y)
    if dtype.is_floating_point:
        return neg(apply(Op.MAX, neg(x), neg(y)))
    return where(lt(y, x), y, x)


def clamp(x: Tensor, min: Any = None, max: Any = None) -> Tensor:
    if min is None and max is None:
        fail("clamp", "at least one of 'min' or 'max' must not be None")
    result = x
    if min is not None:  # where, not maximum: the gradient is 1 at the bound itself, as in PyTorch
        result = _clamp_at(result, min, lt)
    if max is not None:
        result = _clamp_at(result, max, gt)
    return result


def _clamp_at(x: Tensor, bound: Any, beyond: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """x replaced by `bound` where `beyond(x, bound)` holds, or where the bound is NaN (as torch)."""
    (x, limit), _ = operands("clamp", x, bound)
    replaced = beyond(x, limit)
    if limit.dtype.is_floating_point and not (is_scalar(bound) and not math.isnan(bound)):
        replaced = logical_or(replaced, isnan(limit))
    return where(replaced, limit, x)


# ---------------------------------------------------------------------------
# float functions
# ---------------------------------------------------------------------------


def exp2(x: Tensor) -> Tensor:
    return apply(Op.EXP2, to_float(x))


def log2(x: Tensor) -> Tensor:
    return apply(Op.LOG2, to_float(x))


@float_function
def exp(x: Tensor) -> Tensor:
    return apply(Op.EXP2, mul(x, LOG2E))


@float_function
def log(x: Tensor) -> Tensor:
    return mul(log2(x), LN2)


@float_function
def log10(x: Tensor) -> Tensor:
    return mul(log2(x), math.log10(2.0))


def sqrt(x: Tensor) -> Tensor:
    return apply(Op.SQRT, to_float(x))


@float_function
def rsqrt(x: Tensor) -> Tensor:
    return reciprocal(sqrt(x))


def sin(x: Tensor) -> Tensor:
    return apply(Op.SIN, to_float(x))


@float_function
def cos(x: Tensor) -> Tensor:
    """1 - 2 sin(x/2)^2: halving is exact, so the error stays near one ulp of 1 for every x (sin(x + pi/2)
    would lose the low bits of x in the addition)."""
    half_sine = sin(mul(x, 0.5))
    return sub(1.0, mul(mul(half_sine, half_sine), 2.0))


@float_function
def tan(x: Tensor) -> Tensor:
    return div(sin(x), cos(x))


@smooth_function(lambda x, out: reciprocal(add(x, 1.0)))
def log1p(x: Tensor) -> Tensor:
    """Kahan's formula: log(u) * x / (u - 1) with u = 1 + x keeps small x accurate."""
    u = add(x, 1.0)
    small = eq(u, 1.0)
    scaled = div(mul(log(u), x), sub(u, 1.0))
    return where(small, x, where(eq(u, math.inf), u, scaled))


@smooth_function(lambda x, out: add(out, 1.0))
def expm1(x: Tensor) -> Tensor:
    """Kahan's formula: (u - 1) * x / log(u) with u = exp(x)."""
    u = exp(x)
    u_minus_1 = sub(u, 1.0)
    scaled = div(mul(u_minus_1, x), log(u))
    exact = logical_or(isinf(u), eq(u_minus_1, -1.0))
    return where(eq(u, 1.0), x, where(exact, u_minus_1, scaled))


@smooth_function(lambda x, out: mul(out, sub(1.0, out)))
def sigmoid(x: Tensor) -> Tensor:
    return reciprocal(add(exp(neg(x)), 1.0))


@smooth_function(lambda x, out: sub(1.0, mul(out, out)))
def tanh(x: Tensor) -> Tensor:
    """-t / (t + 2) with t = expm1(-2|x|), sign restored: accurate near 0, exact +-1 far out."""
    t = expm1(mul(smooth_abs(x), -2.0))
    magnitude = div(neg(t), add(t, 2.0))
    return copysign_of(magnitude, x)


@smooth_function(lambda x, out: cosh(x))
def sinh(x: Tensor) -> Tensor:
    return mul(sub(expm1(x), expm1(neg(x))), 0.5)


@smooth_function(lambda x, out: sinh(x))
def cosh(x: Tensor) -> Tensor:
    return mul(add(exp(x), exp(neg(x))), 0.5)


@smooth_function(lambda x, out: rsqrt(add(mul(x, x), 1.0)))
def asinh(x: Tensor) -> Tensor:
    """log1p(a + a^2 / (sqrt(a^2 + 1) + 1)), written with 1/a so that a^2 never overflows."""
    a = smooth_abs(x)
    inverse = reciprocal(a)
    near = log1p(add(a, div(a, add(sqrt(add(mul(inverse, inverse), 1.0)), inverse))))
    far = add(log(a), LN2)
    magnitude = where(gt(a, 1e8), far, near)
    return copysign_of(magnitude, x)


@smooth_function(lambda x, out: rsqrt(mul(sub(x, 1.0), add(x, 1.0))))
def acosh(x: Tensor) -> Tensor:
    """log(x + sqrt((x - 1)(x + 1))), log(2x) far out; NaN below 1 (large negative x would give log(0))."""
    near = log(add(x, sqrt(mul(sub(x, 1.0), add(x, 1.0)))))
    result = where(gt(x, 1e8), add(log(x), LN2), near)
    return where(lt(x, 1.0), full_like_node(math.nan, x), result)


@smooth_function(lambda x, out: reciprocal(mul(sub(1.0, x), add(x, 1.0))))
def atanh(x: Tensor) -> Tensor:
    return mul(log1p(div(mul(x, 2.0), sub(1.0, x))), 0.5)


_ATAN_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
           -1.228866684490136173410e2, -6.485021904942025371773e1)
_ATAN_Q = (1.0, 2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
           4.853903996359136964868e2, 1.945506571482613964425e2)
_PI_2_LOW_BITS = 6.123233995736765886130e-17  # pi/2 - float64(pi/2)


def _polynomial(z: Tensor, coefficients: tuple[float, ...]) -> Tensor:
    """Horner's rule, highest power first."""
    result = full_like_node(coefficients[0], z)
    for c in coefficients[1:]:
        result = add(mul(result, z), c)
    return result


@smooth_function(lambda x, out: reciprocal(add(mul(x, x), 1.0)))
def atan(x: Tensor) -> Tensor:
    """Cephes atan (double): reduce |x| to [0, 0.66] via pi/2 - atan(1/x) or pi/4 + atan((x-1)/(x+1)),
    then x + x z P(z)/Q(z) with z = x^2; relative error ~1e-16, so float64 is exact too."""
    a = smooth_abs(x)
    big = gt(a, 2.414213562373095)
    mid = logical_and(gt(a, 0.66), logical_not(big))
    reduced = where(big, div(-1.0, a), where(mid, div(sub(a, 1.0), add(a, 1.0)), a))
    offset = where(big, full_like_node(math.pi / 2, a),
                   where(mid, full_like_node(math.pi / 4, a), full_like_node(0.0, a)))
    low_bits = where(big, full_like_node(_PI_2_LOW_BITS, a),
                     where(mid, full_like_node(_PI_2_LOW_BITS / 2, a), full_like_node(0.0, a)))
    z = mul(reduced, reduced)
    ratio = div(mul(z, _polynomial(z, _ATAN_P)), _polynomial(z, _ATAN_Q))
    magnitude = add(offset, add(add(mul(reduced, ratio), reduced), low_bits))
    return copysign_of(magnitude, x)


def atan2(y: Any, x: Any) -> Tensor:
    """atan(y / x) moved to the right quadrant; signed zeros and infinities as in C's atan2."""
    (y, x), _ = operands("atan2", y, x, floating=True)
    return in_float32_for_halves(_atan2_float, y, x)


def _atan2_float(y: Tensor, x: Tensor) -> Tensor:
    both_infinite = logical_and(isinf(y), isinf(x))  # the angle of (±1, ±1)
    y = where(both_infinite, where(signbit(y), full_like_node(-1.0, y), full_like_node(1.0, y)), y)
    x = where(both_infinite, where(signbit(x), full_like_node(-1.0, x), full_like_node(1.0, x)), x)
    base = atan(div(y, x))
    pi = full_like_node(math.pi, base)
    negative_y = logical_or(lt(y, 0), logical_and(eq(y, 0), signbit(y)))
    shifted = where(lt(x, 0), where(negative_y, sub(base, pi), add(base, pi)), base)
    on_axis = where(negative_y, full_like_node(-math.pi / 2, base), full_like_node(math.pi / 2, base))
    zero_x = where(eq(y, 0), where(signbit(x), where(negative_y, neg(pi), pi), mul(y, 1.0)), on_axis)
    return where(eq(x, 0), zero_x, shifted)


def signbit(x: Tensor) -> Tensor:
    """True for negative numbers and -0.0 (1/-0.0 is -inf)."""
    if not x.dtype.is_floating_point:
        return lt(x, 0)
    return logical_or(lt(x, 0), logical_and(eq(x, 0), lt(reciprocal(x), 0)))


@smooth_function(lambda x, out: rsqrt(mul(sub(1.0, x), add(x, 1.0))))
def asin(x: Tensor) -> Tensor:
    return atan2(x, sqrt(sub(1.0, mul(x, x))))


@smooth_function(lambda x, out: neg(rsqrt(mul(sub(1.0, x), add(x, 1.0)))))
def acos(x: Tensor) -> Tensor:
    return atan2(sqrt(sub(1.0, mul(x, x))), x)


_ERF_SERIES = (1.0, -1.0 / 3, 1.0 / 10, -1.0 / 42, 1.0 / 216, -1.0 / 1320, 1.0 / 9360)
_ERF_AS = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


_ERF_TAYLOR = tuple((-1) ** k / (math.factorial(k) * (2 * k + 1)) for k in reversed(range(40)))
_ERFC_FRACTION_TERMS = 60


def _erf_float64(x: Tensor) -> Tensor:
    """Taylor series below |x| = 2.5, erfc's continued fraction beyond: error ~1e-14 in float64."""
    a = smooth_abs(x)
    z = mul(x, x)
    series = mul(mul(_polynomial(z, _ERF_TAYLOR), x), 2.0 / math.sqrt(math.pi))
    fraction = a
    for k in range(_ERFC_FRACTION_TERMS, 0, -1):
        fraction = add(div(k / 2, fraction), a)
    tail = sub(1.0, div(exp(neg(z)), mul(fraction, math.sqrt(math.pi))))
    return where(lt(a, 2.5), series, where(lt(x, 0), neg(tail), tail))


@smooth_function(lambda x, out: mul(exp(neg(mul(x, x))), 2.0 / math.sqrt(math.pi)))
def erf(x: Tensor) -> Tensor:
    """float64: `_erf_float64`. Otherwise a Taylor series for |x| < 0.5 and Abramowitz-Stegun 7.1.26 beyond
    (abs. error < 1.5e-7, float32-grade)."""
    if x.dtype is dtypes.float64:
        return _erf_float64(x)
    a = smooth_abs(x)
    z = mul(x, x)
    series = full_like_node(_ERF_SERIES[-1], x)
    for c in reversed(_ERF_SERIES[:-1]):
        series = add(mul(series, z), c)
    series = mul(mul(series, x), 2.0 / math.sqrt(math.pi))
    t = reciprocal(add(mul(a, 0.3275911), 1.0))
    poly = full_like_node(_ERF_AS[-1], x)
    for c in reversed(_ERF_AS[:-1]):
        poly = add(mul(poly, t), c)
    tail = sub(1.0, mul(mul(poly, t), exp(neg(z))))
    tail = where(lt(x, 0), neg(tail), tail)
    return where(lt(a, 0.5), series, tail)


@float_function
def erfc(x: Tensor) -> Tensor:
    return sub(1.0, erf(x))


# ---------------------------------------------------------------------------
# rounding and classification
# ---------------------------------------------------------------------------

_MANTISSA_BITS = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}


def _is_exact_integer_range(x: Tensor) -> Tensor:
    """|x| below 2**mantissa: larger floats are already integers (and NaN/Inf stay as they are)."""
    return lt(abs(x), float(2 ** _MANTISSA_BITS[x.dtype.name]))


@piecewise_constant
def round(x: Tensor, decimals: int = 0) -> Tensor:
    """Round half to even, exactly: adding and subtracting 2**mantissa rounds in the FPU."""
    if not x.dtype.is_floating_point:
        return x
    if decimals:
        scale = 10.0**decimals
        return div(round(mul(x, scale)), scale)
    magic = float(2 ** _MANTISSA_BITS[x.dtype.name])
    a = abs(x)
    rounded = sub(add(a, magic), magic)
    return where(_is_exact_integer_range(x), copysign_of(rounded, x), x)


@piecewise_constant
def trunc(x: Tensor) -> Tensor:
    """With the sign of x (-0.5 and -0.0 give -0.0); floor and ceil inherit it."""
    if not x.dtype.is_floating_point:
        return x
    truncated = cast(cast(abs(x), dtypes.int64), x.dtype)
    return where(_is_exact_integer_range(x), copysign_of(truncated, x), x)


@piecewise_constant
def floor(x: Tensor) -> Tensor:
    if not x.dtype.is_floating_point:
        return x
    t = trunc(x)
    return where(gt(t, x), sub(t, 1.0), t)


@piecewise_constant
def ceil(x: Tensor) -> Tensor:
    if not x.dtype.is_floating_point:
        return x
    t = trunc(x)
    return where(lt(t, x), add(t, 1.0), t)


def frac(x: Tensor) -> Tensor:
    return sub(x, trunc(x))


def copysign_of(magnitude: Tensor, x: Tensor) -> Tensor:
    """`magnitude` (>= 0) with the sign of x, -0.0 included: odd functions map -0.0 to -0.0."""
    return where(signbit(x), neg(magnitude), magnitude)


def smooth_abs(x: Tensor) -> Tensor:
    """|x| whose gradient at 0 is 1, for decompositions of functions smooth at 0 (tanh, atan, erf, ...).

    `abs` follows PyTorch and has gradient 0 at 0; inside f(|x|) with f'(0) != 0 that would zero the
    derivative of a smooth function exactly at 0. Adding +0.0 turns -0.0 into +0.0 (IEEE: -0 + +0 = +0).
    """
    return add(where(lt(x, 0), neg(x), x), 0.0)


def abs(x: Tensor) -> Tensor:
    if x.dtype.is_bool or x.dtype.kind == "u":
        return x
    if not x.dtype.is_floating_point:
        return where(lt(x, 0), neg(x), x)
    # ±0 maps to the constant +0.0: the sign of zero is dropped and the gradient at 0 is 0, as in PyTorch
    return where(lt(x, 0), neg(x), where(eq(x, 0), 0.0, x))


@piecewise_constant
def sign(x: Tensor) -> Tensor:
    if x.dtype.is_bool:
        return x
    positive = cast(gt(x, 0), x.dtype)
    negative = cast(lt(x, 0), x.dtype)
    return sub(positive, negative)  # NaN gives 0, as in PyTorch


def isnan(x: Tensor) -> Tensor:
    return ne(x, x)


def isinf(x: Tensor) -> Tensor:
    if not x.dtype.is_floating_point:
        return ne(x, x)
    return logical_or(eq(x, math.inf), eq(x, -math.inf))


def isfinite(x: Tensor) -> Tensor:
    return logical_not(logical_or(isnan(x), isinf(x)))


def nan_to_num(x: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    if not x.dtype.is_floating_point:
        return x
    info = _finfo(x.dtype)
    x = where(isnan(x), nan, x)
    x = where(eq(x, math.inf), info[1] if posinf is None else posinf, x)
    return where(eq(x, -math.inf), info[0] if neginf is None else neginf, x)


def _finfo(dtype: DType) -> tuple[float, float]:
    if dtype is dtypes.bfloat16:
        return -3.3895313892515355e38, 3.3895313892515355e38
    info = np.finfo(dtype.storage)
    return float(info.min), float(info.max)


def lerp(start: Any, end: Any, weight: Any) -> Tensor:
    """PyTorch's two-sided formula: exact at weight 0 and 1."""
    (a, b, w), _ = operands("lerp", start, end, weight)
    diff = sub(b, a)
    return where(lt(abs(w), 0.5), add(a, mul(w, diff)), sub(b, mul(diff, sub(1.0, w))))


def masked_fill(x: Tensor, mask: Tensor, value: Any) -> Tensor:
    if not mask.dtype.is_bool:
        fail("masked_fill", f"mask must be a bool tensor, got {mask.dtype.name}", kind=DTypeError)
    if broadcast_shapes("masked_fill", x.shape, mask.shape) != x.shape:
        fail("masked_fill", f"mask of shape {mask.shape} does not broadcast to the tensor's shape {x.shape}")
    value = cast(value, x.dtype) if isinstance(value, Tensor) else value
    (fill, kept), _ = operands("masked_fill", value, x, dtype=x.dtype)
    return where(mask, fill, kept)
