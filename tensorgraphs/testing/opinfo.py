"""The op-conformance table: one `OpInfo` per Tensor-API op, checked against PyTorch by `check_op`.

Generic tests loop over `OP_INFOS` (values, dtypes and shapes; gradients of
differentiable ops) on every backend, and `tg ops` prints the same table. A new
op gets its conformance tests by adding one entry here. Sample generators are
grouped by op family; each draws random shapes from a seeded generator and
covers broadcasting, size-0 and size-1 dims, non-contiguous views, NaN/Inf for
float inputs and mixed dtypes (type promotion).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterator

import numpy as np

import tensorgraphs as tg
from tensorgraphs.frontend import movement as tg_movement
from tensorgraphs.testing.conformance import OpInfo, Skip, check_op, skipped, torch
from tensorgraphs.testing.samples import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    DTypeArg,
    Sample,
    TensorArg,
    make_tensor,
    python_scalar,
    random_shape,
    random_view,
    shapes_for,
    tied_tensor,
    wide_floats,
)

__all__ = ["OP_INFOS", "OpInfo", "Skip", "check_op", "skipped", "find"]

Rng = np.random.Generator
NO_BOOL = FLOAT_DTYPES + INT_DTYPES
INTEGRAL = INT_DTYPES + ("bool",)


def torch_attr(path: str) -> Callable[..., Any]:
    """torch.<path>, looked up when called (torch is imported lazily)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        fn: Any = torch
        for part in path.split("."):
            fn = getattr(fn, part)
        return fn(*args, **kwargs)

    return call


def S(*args: Any, **kwargs: Any) -> Sample:
    return Sample(args, kwargs)


# ---------------------------------------------------------------------------
# sample generators, one per op family
# ---------------------------------------------------------------------------


def _value_range(
    low: float, high: float, grad_low: float | None, grad_high: float | None, for_grad: bool
) -> tuple[float, float]:
    """Values come from [low, high]; inputs of gradient checks from [grad_low, grad_high] where given (a
    domain away from poles and NaN)."""
    if not for_grad:
        return low, high
    return low if grad_low is None else grad_low, high if grad_high is None else grad_high


def unary_samples(
    low: float = -3.0, high: float = 3.0, grad_low: float | None = None, grad_high: float | None = None
) -> Callable[[str, Rng, bool], Iterator[Sample]]:
    """Edge shapes and random shapes under every view; NaN/Inf mixed in unless for gradients."""

    def samples(dtype: str, rng: Rng, for_grad: bool) -> Iterator[Sample]:
        lo, hi = _value_range(low, high, grad_low, grad_high, for_grad)
        for shape, view in shapes_for(rng, for_grad):
            yield S(make_tensor(rng, shape, dtype, view=view, low=lo, high=hi, special=not for_grad))
        if dtype in FLOAT_DTYPES and not for_grad:
            yield S(wide_floats(rng, (16,), dtype))

    return samples


_BROADCAST_PAIRS = (((3, 1, 4), (2, 1)), ((4,), ()), ((), (2, 3)), ((0, 3), (1, 3)), ((1,), (0,)), ((2, 1), (1, 5)))


def binary_samples(
    low: float = -3.0,
    high: float = 3.0,
    grad_low: float | None = None,
    grad_high: float | None = None,
    nonzero_divisor: bool = False,
    partners: tuple[str, ...] = ALL_DTYPES,
    scalars: tuple[str, ...] = ("int", "float", "bool"),
    scalar_left: bool = False,
    wide: bool = True,
) -> Callable[[str, Rng, bool], Iterator[Sample]]:
    """Same shapes, broadcasting pairs (incl. size 0), tensor-scalar pairs and mixed dtypes (promotion).

    `nonzero_divisor` keeps integer divisors away from zero (torch raises there); `partners` are the dtypes
    the second operand may take; `scalar_left` also puts the Python scalar first (operators); `wide` adds
    operands with magnitudes from 1e-20 to 1e20.
    """

    def tensor(rng: Rng, shape: tuple[int, ...], dtype: str, for_grad: bool, divisor: bool = False) -> TensorArg:
        lo, hi = _value_range(low, high, grad_low, grad_high, for_grad)
        nonzero = divisor and nonzero_divisor and dtype not in FLOAT_DTYPES
        return make_tensor(
            rng, shape, dtype, view=random_view(rng), low=lo, high=hi, special=not for_grad, nonzero=nonzero
        )

    def samples(dtype: str, rng: Rng, for_grad: bool) -> Iterator[Sample]:
        shape = random_shape(rng)
        yield S(tensor(rng, shape, dtype, for_grad), tensor(rng, shape, dtype, for_grad, True))
        if wide and dtype in FLOAT_DTYPES and not for_grad:
            yield S(wide_floats(rng, (16,), dtype), wide_floats(rng, (16,), dtype))
        for a, b in _BROADCAST_PAIRS[:3] if for_grad else _BROADCAST_PAIRS:
            yield S(tensor(rng, a, dtype, for_grad), tensor(rng, b, dtype, for_grad, True))
        for kind in scalars:
            scalar = python_scalar(rng, kind)
            if nonzero_divisor and kind == "bool":
                scalar = True
            yield S(tensor(rng, random_shape(rng), dtype, for_grad), scalar)
            if scalar_left:
                yield S(scalar, tensor(rng, random_shape(rng), dtype, for_grad, True))
        for other in [str(d) for d in rng.choice(partners, size=min(2, len(partners)), replace=False)]:
            yield S(tensor(rng, shape, dtype, for_grad), tensor(rng, shape, other, for_grad, True))
            yield S(tensor(rng, shape, dtype, for_grad), tensor(rng, (), other, for_grad, True))
            yield S(tensor(rng, (), other, for_grad), tensor(rng, shape, dtype, for_grad, True))

    return samples


def reduction_samples(
    keepdim: bool = True, tuple_dims: bool = True, empty: bool = True, **kwargs: Any
) -> Callable[[str, Rng, bool], Iterator[Sample]]:
    """Whole-tensor and per-dim reductions (negative dims, tuples of dims, keepdim) incl. size-0 dims and
    magnitudes from 1e-20 to 1e20; `kwargs` go to every call."""

    def samples(dtype: str, rng: Rng, for_grad: bool) -> Iterator[Sample]:
        def x(shape: tuple[int, ...], view: str = "contiguous") -> TensorArg:
            return make_tensor(rng, shape, dtype, view=view, special=not for_grad)

        shape = random_shape(rng, 2, 3)
        yield Sample((x(shape, random_view(rng)),), kwargs)
        yield Sample((x(()),), kwargs)
        if dtype in FLOAT_DTYPES and not for_grad:
            yield Sample((wide_floats(rng, (3, 4), dtype),), {**kwargs, "dim": -1})
        yield Sample((x(shape, random_view(rng)),), {**kwargs, "dim": -1})
        yield Sample((x(shape, random_view(rng)),), {**kwargs, "dim": 0, **({"keepdim": True} if keepdim else {})})
        yield Sample((x((1, 3)),), {**kwargs, "dim": 0})
        if tuple_dims:
            yield Sample((x((2, 3, 4), random_view(rng)),), {**kwargs, "dim": (0, -1)})
        if empty and not for_grad:
            yield Sample((x((0, 3)),), {**kwargs, "dim": 1})
            yield Sample((x((3, 0)),), {**kwargs, "dim": 0})

    return samples


def case_samples(cases: Callable[..., list[Sample]], special: bool = False) -> Callable[[str, Rng, bool], list[Sample]]:
    """Hand-written cases; `cases(x, idx, dtype)` gets makers of a random tensor of the checked dtype (random
    view) and of an int64 index tensor with values in [low, high)."""

    def samples(dtype: str, rng: Rng, for_grad: bool) -> list[Sample]:
        def x(*shape: int, view: str | None = None) -> TensorArg:
            chosen = random_view(rng) if view is None else view
            return make_tensor(rng, shape, dtype, view=chosen, special=special and not for_grad)

        def idx(shape: tuple[int, ...], low: int, high: int) -> TensorArg:
            return TensorArg(rng.integers(low, high, shape).astype(np.int64), "int64", tuple(shape))

        return cases(x, idx, dtype)

    return samples


# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------


def _same_name(name: str, **fields: Any) -> OpInfo:
    """An op with the same name in tg and torch (`tg.<name>` vs `torch.<name>`)."""
    return OpInfo(name, getattr(tg, name), torch_attr(name), **fields)


def _unary_infos() -> list[OpInfo]:
    floats_out = {"low": -3.0, "high": 3.0}
    positive = {"grad_low": 0.2, "grad_high": 3.0}
    unit = {"low": -1.5, "high": 1.5, "grad_low": -0.9, "grad_high": 0.9}
    table: dict[str, dict[str, Any]] = {
        "neg": {"dtypes": NO_BOOL},
        "abs": {"dtypes": NO_BOOL},
        "sign": {},
        "exp": floats_out,
        "exp2": floats_out,
        "expm1": floats_out,
        "log": positive,
        "log2": positive,
        "log10": positive,
        "log1p": {"grad_low": -0.8, "grad_high": 3.0},
        "sqrt": positive,
        "rsqrt": positive,
        "reciprocal": positive,
        "sin": {},
        "cos": {},
        "tan": {"grad_low": -1.2, "grad_high": 1.2},
        "asin": unit,
        "acos": unit,
        "atan": {},
        "atanh": unit,
        "sinh": {},
        "cosh": {},
        "tanh": {},
        "asinh": {},
        "acosh": {"low": 0.0, "high": 4.0, "grad_low": 1.2},
        "erf": {},
        "erfc": {},
        "sigmoid": {},
        "floor": {"dtypes": NO_BOOL},
        "ceil": {"dtypes": NO_BOOL},
        "round": {"dtypes": NO_BOOL},
        "trunc": {"dtypes": NO_BOOL},
        "frac": {"dtypes": FLOAT_DTYPES},
        "nan_to_num": {},
        "isnan": {"differentiable": False},
        "isinf": {"differentiable": False},
        "isfinite": {"differentiable": False},
        "signbit": {"differentiable": False, "dtypes": NO_BOOL},
        "logical_not": {"differentiable": False},
        "bitwise_not": {"differentiable": False, "dtypes": INTEGRAL},
    }
    infos = []
    for name, options in table.items():
        sample_options = {k: options[k] for k in ("low", "high", "grad_low", "grad_high") if k in options}
        fields = {k: v for k, v in options.items() if k not in sample_options}
        infos.append(_same_name(name, sample_inputs=unary_samples(**sample_options), **fields))
    infos.append(
        OpInfo("relu", lambda x: tg.nn.functional.relu(x), torch_attr("relu"), unary_samples(), dtypes=NO_BOOL)
    )
    activations = {
        "leaky_relu": {},
        "leaky_relu(0.2)": {"negative_slope": 0.2},
        "elu": {},
        "selu": {},
        "gelu": {},
        "gelu(tanh)": {"approximate": "tanh"},
        "silu": {},
        "softplus": {},
        "mish": {},
        "hardtanh": {},
        "hardtanh(-2, 0.5)": {"min_val": -2.0, "max_val": 0.5},
    }
    for name, kwargs in activations.items():
        function = name.split("(")[0]
        infos.append(
            OpInfo(
                name,
                lambda x, f=function, k=kwargs: getattr(tg.nn.functional, f)(x, **k),
                lambda x, f=function, k=kwargs: getattr(torch.nn.functional, f)(x, **k),
                unary_samples(),
                dtypes=FLOAT_DTYPES,
            )
        )
    infos.append(
        OpInfo(
            "round(decimals=2)",
            lambda x: tg.round(x, decimals=2),
            lambda x: torch.round(x, decimals=2),
            unary_samples(),
            dtypes=FLOAT_DTYPES,
        )
    )
    infos.append(
        OpInfo(
            "nan_to_num(nan, posinf, neginf)",
            lambda x: tg.nan_to_num(x, 1.5, 100.0, -100.0),
            lambda x: torch.nan_to_num(x, 1.5, 100.0, -100.0),
            unary_samples(),
        )
    )
    for qdtype in ("qint8", "quint8", "qint32"):  # integers bit for bit (rounding ties, saturation), then values
        # (not qint32's values: torch computes q - zero_point in int32, which wraps at the ends of the range)
        for part in ("int_repr", "dequantize") if qdtype != "qint32" else ("int_repr",):
            infos.append(
                OpInfo(
                    f"quantize_per_tensor(0.25, 3, {qdtype}).{part}",
                    lambda x, d=qdtype, p=part: getattr(tg.quantize_per_tensor(x, 0.25, 3, getattr(tg, d)), p)(),
                    lambda x, d=qdtype, p=part: getattr(torch.quantize_per_tensor(x, 0.25, 3, getattr(torch, d)), p)(),
                    unary_samples(-80.0, 80.0),
                    dtypes=("float32",),
                    differentiable=False,
                )
            )
    return infos


# Option groups shared by the functional and the operator forms: OpInfo fields, "samples" for binary_samples.
# Float fmod and remainder are x - y * trunc(x / y): exact only while |x / y| < 2**mantissa (docs/ops.md),
# so they are not checked with quotients up to 1e40.
DIVISION = {"dtypes": NO_BOOL, "samples": {"nonzero_divisor": True, "wide": False}}
COMPARISON = {"differentiable": False}
LOGICAL = {"differentiable": False, "samples": {"scalars": ()}}  # torch takes no Python scalars here
BITWISE = {"dtypes": INTEGRAL, "differentiable": False, "samples": {"partners": INTEGRAL, "scalars": ("int", "bool")}}
SHIFT = {
    "dtypes": INT_DTYPES,
    "differentiable": False,
    "samples": {"low": 0, "high": 3, "partners": INT_DTYPES, "scalars": ()},
}


def _binary_infos() -> list[OpInfo]:
    divisor = {"nonzero_divisor": True}
    int_pow = {"low": -3.0, "high": 3.0, "grad_low": 0.5, "grad_high": 2.0}
    table: dict[str, dict[str, Any]] = {
        "add": {},
        "sub": {"dtypes": NO_BOOL},
        "mul": {},
        "div": {"samples": divisor},
        "floor_divide": {**DIVISION, "differentiable": False},
        "remainder": DIVISION,
        "fmod": DIVISION,
        "atan2": {"samples": {"grad_low": 0.2, "scalars": ()}},
        "maximum": {"samples": {"scalars": ()}},
        "minimum": {"samples": {"scalars": ()}},
        **dict.fromkeys(("lt", "gt", "le", "ge", "eq", "ne"), COMPARISON),
        **dict.fromkeys(("logical_and", "logical_or", "logical_xor"), LOGICAL),
        **dict.fromkeys(("bitwise_and", "bitwise_or", "bitwise_xor"), BITWISE),
        **dict.fromkeys(("bitwise_left_shift", "bitwise_right_shift"), SHIFT),
    }
    infos = [
        _same_name(
            name,
            sample_inputs=binary_samples(**options.get("samples", {})),
            **{k: v for k, v in options.items() if k != "samples"},
        )
        for name, options in table.items()
    ]
    for mode in ("floor", "trunc"):
        infos.append(
            OpInfo(
                f"div(rounding_mode={mode})",
                lambda a, b, m=mode: tg.div(a, b, rounding_mode=m),
                lambda a, b, m=mode: torch.div(a, b, rounding_mode=m),
                binary_samples(**divisor),
                dtypes=NO_BOOL,
                differentiable=False,
            )
        )
    infos.append(OpInfo("pow", tg.pow, torch_attr("pow"), _pow_samples(int_pow), dtypes=NO_BOOL))
    return infos


def _pow_samples(ranges: dict[str, float]) -> Callable[[str, Rng, bool], Iterator[Sample]]:
    """Bases of either sign with small integer or fractional exponents (integers: no negative exponents)."""
    floats = binary_samples(**ranges, partners=FLOAT_DTYPES)

    def samples(dtype: str, rng: Rng, for_grad: bool) -> Iterator[Sample]:
        if dtype in FLOAT_DTYPES:
            yield from floats(dtype, rng, for_grad)
            return
        shape = random_shape(rng)
        base = make_tensor(rng, shape, dtype, view=random_view(rng))
        yield S(base, make_tensor(rng, shape, dtype, low=0, high=3))
        yield S(base, int(rng.integers(0, 4)))
        yield S(base, 0.5)
        yield S(base, make_tensor(rng, (), "float32", low=0.5, high=2.0))

    return samples


_OPERATORS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
    "&": operator.and_,
    "|": operator.or_,
    "^": operator.xor,
    "<<": operator.lshift,
    ">>": operator.rshift,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


def _operator_infos() -> list[OpInfo]:
    """Python operators with tensors or Python scalars on either side (the same expression for both libraries)."""
    options: dict[str, dict[str, Any]] = {
        "-": {"dtypes": NO_BOOL},
        "//": {**DIVISION, "differentiable": False},
        "%": DIVISION,
        "/": {"samples": {"nonzero_divisor": True}},
        "**": {"dtypes": FLOAT_DTYPES, "samples": {"low": 0.1, "high": 2.0, "partners": FLOAT_DTYPES}},
        **dict.fromkeys(("&", "|", "^"), BITWISE),
        **dict.fromkeys(("<<", ">>"), SHIFT),
        **dict.fromkeys(("<", ">", "<=", ">=", "==", "!="), COMPARISON),
    }
    infos = []
    for symbol, fn in _OPERATORS.items():
        option = options.get(symbol, {})
        samples = binary_samples(scalar_left=True, **option.get("samples", {}))
        fields = {k: v for k, v in option.items() if k != "samples"}
        infos.append(OpInfo(f"a {symbol} b", fn, fn, samples, **fields))
    infos.append(OpInfo("-a", operator.neg, operator.neg, unary_samples(), dtypes=NO_BOOL))
    infos.append(OpInfo("~a", operator.invert, operator.invert, unary_samples(), dtypes=INTEGRAL, differentiable=False))
    infos.append(OpInfo("abs(a)", abs, abs, unary_samples(), dtypes=NO_BOOL))
    return infos


def _ternary_infos() -> list[OpInfo]:
    def where_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
        def cond(*shape: int) -> TensorArg:
            return TensorArg(np.arange(int(np.prod(shape))).reshape(shape) % 3 == 0, "bool", shape)

        return [
            S(cond(2, 3), x(2, 3), x(2, 3)),
            S(cond(3, 1), x(1, 4), x(3, 4)),
            S(cond(2, 3), x(2, 3), 1.5),
            S(cond(2, 3), 2, x(2, 3)),
            S(cond(0, 2), x(1, 2), x(0, 1)),
            S(cond(2, 3), x(2, 3), TensorArg(np.ones((2, 3), np.int32), "int32", (2, 3))),
        ]

    def lerp_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
        return [S(x(2, 3), x(2, 3), 0.3), S(x(2, 3), x(3), x(2, 1)), S(x(4), x(4), 1.0), S(x(0, 2), x(1, 2), 0.5)]

    def masked_fill_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
        mask = TensorArg(np.array([[True, False, True]]), "bool", (1, 3))
        return [
            S(x(2, 3), mask, 0),
            S(x(2, 3), mask, 1.5),
            S(x(4, 1, 3), mask, True),
            S(x(2, 3), mask, TensorArg(np.array(7, np.int64), "int64", ())),
        ]

    def clamp_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
        return [S(x(3, 4), -1, 2), S(x(3, 4), min=0.5), S(x(3, 4), max=1), S(x(2, 3), x(2, 3), x(3)), S(x(0, 3), -1, 1)]

    return [
        OpInfo("where", tg.where, torch_attr("where"), case_samples(where_cases, special=True)),
        OpInfo("lerp", tg.lerp, torch_attr("lerp"), case_samples(lerp_cases, special=True), dtypes=FLOAT_DTYPES),
        OpInfo(
            "masked_fill",
            lambda x, m, v: x.masked_fill(m, v),
            lambda x, m, v: x.masked_fill(m, v),
            case_samples(masked_fill_cases, special=True),
        ),
        OpInfo("clamp", tg.clamp, torch_attr("clamp"), case_samples(clamp_cases, special=True), dtypes=NO_BOOL),
    ]


def _reduction_infos() -> list[OpInfo]:
    return [
        _same_name("sum", sample_inputs=reduction_samples()),
        OpInfo("sum(dtype=float64)", tg.sum, torch_attr("sum"), reduction_samples(dtype=DTypeArg("float64"))),
        _same_name("mean", sample_inputs=reduction_samples(), dtypes=FLOAT_DTYPES),
        _same_name("prod", sample_inputs=reduction_samples(tuple_dims=False)),
        _same_name("amax", sample_inputs=reduction_samples(empty=False)),
        _same_name("amin", sample_inputs=reduction_samples(empty=False)),
        OpInfo("max", tg.max, torch_attr("max"), reduction_samples(empty=False, tuple_dims=False)),
        OpInfo("min", tg.min, torch_attr("min"), reduction_samples(empty=False, tuple_dims=False)),
        _same_name(
            "argmax",
            sample_inputs=reduction_samples(empty=False, tuple_dims=False),
            dtypes=NO_BOOL,
            differentiable=False,
        ),
        _same_name(
            "argmin",
            sample_inputs=reduction_samples(empty=False, tuple_dims=False),
            dtypes=NO_BOOL,
            differentiable=False,
        ),
        _same_name("var", sample_inputs=reduction_samples(), dtypes=FLOAT_DTYPES),
        _same_name("std", sample_inputs=reduction_samples(), dtypes=FLOAT_DTYPES),
        OpInfo(
            "var(correction=0)",
            lambda x, *a, **k: tg.var(x, *a, correction=0, **k),
            lambda x, *a, **k: torch.var(x, *a, correction=0, **k),
            reduction_samples(),
            dtypes=FLOAT_DTYPES,
        ),
        _same_name("logsumexp", sample_inputs=reduction_samples(empty=False)),
        _same_name("all", sample_inputs=reduction_samples(tuple_dims=False), differentiable=False),
        _same_name("any", sample_inputs=reduction_samples(tuple_dims=False), differentiable=False),
        _same_name("count_nonzero", sample_inputs=reduction_samples(keepdim=False), differentiable=False),
        _same_name("norm", sample_inputs=reduction_samples(), dtypes=FLOAT_DTYPES),
        OpInfo(
            "norm(p=1)",
            lambda x, *a, **k: tg.norm(x, 1, *a, **k),
            lambda x, *a, **k: torch.norm(x, 1, *a, **k),
            reduction_samples(),
            dtypes=FLOAT_DTYPES,
        ),
        OpInfo(
            "norm(p=inf)",
            lambda x, *a, **k: tg.norm(x, float("inf"), *a, **k),
            lambda x, *a, **k: torch.norm(x, float("inf"), *a, **k),
            reduction_samples(empty=False),
            dtypes=FLOAT_DTYPES,
        ),
        _same_name("cumsum", sample_inputs=case_samples(_scan_cases, special=True)),
        _same_name("cumprod", sample_inputs=case_samples(_scan_cases, special=True)),
        OpInfo(
            "softmax",
            lambda x, d: x.softmax(d),
            lambda x, d: x.softmax(d),
            case_samples(_scan_cases, True),
            dtypes=FLOAT_DTYPES,
        ),
        OpInfo(
            "log_softmax",
            lambda x, d: x.log_softmax(d),
            lambda x, d: x.log_softmax(d),
            case_samples(_scan_cases, True),
            dtypes=FLOAT_DTYPES,
        ),
    ]


def _scan_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
    return [S(x(3, 4), 1), S(x(3, 4), -2), S(x(5), 0), S(x(), 0), S(x(0, 3), 1), S(x(2, 1, 3), 1)]


# -- movement ---------------------------------------------------------------


def _movement_cases() -> dict[str, tuple[Any, ...]]:
    """name -> (tg callable, torch callable, cases[, OpInfo fields]); most call the same-named method on both."""

    def method(name: str) -> Callable[..., Any]:
        return lambda x, *args, **kwargs: getattr(x, name)(*args, **kwargs)

    def same(name: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        return method(name), method(name)

    return {
        "reshape": (
            *same("reshape"),
            lambda x, idx, d: [
                S(x(2, 3, 4), 4, -1),
                S(x(2, 3, 4), (6, 4)),
                S(x(0, 3), 3, 0),
                S(x(), 1),
                S(x(1), ()),
                S(x(2, 3), -1),
            ],
        ),
        "view": (
            *same("view"),
            lambda x, idx, d: [S(x(2, 6, view="contiguous"), 3, 4), S(x(4, view="contiguous"), -1, 2)],
        ),
        "permute": (*same("permute"), lambda x, idx, d: [S(x(2, 3, 4), 2, 0, 1), S(x(2, 3, 4), (-1, 0, 1))]),
        "transpose": (
            *same("transpose"),
            lambda x, idx, d: [S(x(2, 3, 4), 0, 2), S(x(2, 3), -1, -2), S(x(0, 3), 0, 1)],
        ),
        "T": (lambda x: x.T, lambda x: x.permute(*reversed(range(x.ndim))), lambda x, idx, d: [S(x(2, 3)), S(x(4))]),
        "mT": (lambda x: x.mT, lambda x: x.mT, lambda x, idx, d: [S(x(2, 3, 4)), S(x(3, 1))]),
        "movedim": (*same("movedim"), lambda x, idx, d: [S(x(2, 3, 4), 0, -1), S(x(2, 3, 4), -1, 1)]),
        "expand": (
            *same("expand"),
            lambda x, idx, d: [S(x(3, 1), 3, 4), S(x(1, 1), 2, -1, 5), S(x(), 2, 3), S(x(1, 2), 0, 2)],
        ),
        "broadcast_to": (tg.broadcast_to, torch_attr("broadcast_to"), lambda x, idx, d: [S(x(3, 1), (2, 3, 4))]),
        "squeeze": (
            *same("squeeze"),
            lambda x, idx, d: [
                S(x(1, 3, 1)),
                S(x(1, 3, 1), 0),
                S(x(1, 3, 1), -1),
                S(x(2, 3), 1),
                S(x(1, 3, 1), (0, 2)),
                S(x()),
            ],
        ),
        "unsqueeze": (*same("unsqueeze"), lambda x, idx, d: [S(x(2, 3), 0), S(x(2, 3), -1), S(x(2, 3), 1), S(x(), 0)]),
        "flatten": (
            *same("flatten"),
            lambda x, idx, d: [S(x(2, 3, 4)), S(x(2, 3, 4), 1), S(x(2, 3, 4), 0, 1), S(x()), S(x(2, 0, 3), 1)],
        ),
        "unflatten": (*same("unflatten"), lambda x, idx, d: [S(x(2, 12), 1, (3, 4)), S(x(6), 0, (-1, 2))]),
        "flip": (*same("flip"), lambda x, idx, d: [S(x(2, 3, 4), 0), S(x(2, 3, 4), (0, -1)), S(x(0, 2), 1)]),
        "roll": (
            *same("roll"),
            lambda x, idx, d: [
                S(x(5), 2),
                S(x(2, 3), 1, 0),
                S(x(2, 3), (1, -4), (0, 1)),
                S(x(3, 2), -1),
                S(x(0, 2), 1, 0),
            ],
        ),
        "contiguous": (*same("contiguous"), lambda x, idx, d: [S(x(2, 3, view="permuted"))]),
        "narrow": (*same("narrow"), lambda x, idx, d: [S(x(4, 3), 0, 1, 2), S(x(4, 3), -1, -2, 2)]),
        "getitem": (operator.getitem, _torch_getitem, _index_cases),
        "pad(constant)": (
            _tg_pad,
            torch_attr("nn.functional.pad"),
            lambda x, idx, d: [
                S(x(2, 3), (1, 2)),
                S(x(2, 3, 4), (0, 1, 2, 0), value=1.5),
                S(x(2, 3), (-1, 1)),
                S(x(0, 2), (1, 1)),
            ],
        ),
        "pad(reflect)": (
            _tg_pad,
            torch_attr("nn.functional.pad"),
            lambda x, idx, d: [S(x(2, 4), (2, 1), mode="reflect"), S(x(1, 3, 4), (1, 1, 2, 0), mode="reflect")],
            {"dtypes": NO_BOOL},
        ),
        "pad(replicate)": (
            _tg_pad,
            torch_attr("nn.functional.pad"),
            lambda x, idx, d: [S(x(2, 4), (2, 1), mode="replicate"), S(x(1, 3, 4), (1, 3, 0, 2), mode="replicate")],
            {"dtypes": NO_BOOL},
        ),
        "cat": (
            tg.cat,
            torch_attr("cat"),
            lambda x, idx, d: [
                S([x(2, 3), x(1, 3)]),
                S([x(2, 3), x(2, 1), x(2, 2)], -1),
                S([x(0, 3), x(2, 3)]),
                S((x(2),), 0),
                S([x(2, 3), TensorArg(np.ones((1, 3), np.int32), "int32", (1, 3))]),
            ],
        ),
        "stack": (
            tg.stack,
            torch_attr("stack"),
            lambda x, idx, d: [S([x(2, 3), x(2, 3)]), S([x(2, 3), x(2, 3)], -1), S([x(), x()]), S([x(0, 2)], 1)],
        ),
        "split": (
            *same("split"),
            lambda x, idx, d: [S(x(5, 2), 2), S(x(5, 2), [1, 4]), S(x(2, 6), 3, -1), S(x(0, 2), 1)],
        ),
        "chunk": (*same("chunk"), lambda x, idx, d: [S(x(5, 2), 2), S(x(6, 2), 3, 0), S(x(2, 7), 3, -1)]),
        "unbind": (*same("unbind"), lambda x, idx, d: [S(x(3, 2)), S(x(3, 2), 1), S(x(0, 2), 1)]),
        "tile": (*same("tile"), lambda x, idx, d: [S(x(2, 3), (2, 1)), S(x(3), (2, 2)), S(x(2, 3), (2,))]),
        "repeat": (*same("repeat"), lambda x, idx, d: [S(x(2, 3), 2, 1), S(x(3), 2, 2), S(x(2, 1), 1, 0)]),
        "repeat_interleave": (
            *same("repeat_interleave"),
            lambda x, idx, d: [S(x(2, 3), 2), S(x(2, 3), 3, 1), S(x(2, 3), 2, dim=-2)],
        ),
        "tril": (*same("tril"), lambda x, idx, d: [S(x(3, 4)), S(x(2, 3, 3), 1), S(x(4, 3), -1)]),
        "triu": (*same("triu"), lambda x, idx, d: [S(x(3, 4)), S(x(2, 3, 3), 1), S(x(4, 3), -1)]),
        "gather": (
            *same("gather"),
            lambda x, idx, d: [
                S(x(3, 4), 1, idx((3, 2), 0, 4)),
                S(x(3, 4), 0, idx((2, 4), 0, 3)),
                S(x(3, 4), -1, idx((2, 3), 0, 4)),
                S(x(5), 0, idx((0,), 0, 5)),
            ],
        ),
        "scatter_add": (
            *same("scatter_add"),
            lambda x, idx, d: [
                S(x(3, 4), 1, idx((3, 2), 0, 4), x(3, 2)),
                S(x(3, 4), 0, idx((2, 4), 0, 3), x(2, 4)),
                S(x(3, 4), 0, idx((2, 2), 0, 3), x(3, 3)),
            ],
        ),
        "index_select": (
            *same("index_select"),
            lambda x, idx, d: [
                S(x(3, 4), 0, idx((5,), 0, 3)),
                S(x(3, 4), -1, idx((2,), 0, 4)),
                S(x(3, 4), 1, idx((), 0, 4)),
            ],
        ),
        "take_along_dim": (
            *same("take_along_dim"),
            lambda x, idx, d: [
                S(x(3, 4), idx((3, 2), 0, 4), 1),
                S(x(3, 4), idx((1, 4), 0, 3), 0),
                # torch fails on non-contiguous input here
                S(x(3, 4, view="contiguous"), idx((5,), 0, 12)),
            ],
        ),
    }


def _tg_pad(x: Any, pad: Any, mode: str = "constant", value: float | None = None) -> Any:
    return tg_movement.pad(x, pad, mode, value)


def _index_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
    """ints, negative ints, slices with positive and negative steps, None, Ellipsis, integer tensors."""
    t = x(4, 5, 3)
    return [
        S(t, 1),
        S(t, -1),
        S(t, (1, -2)),
        S(t, slice(1, 3)),
        S(t, slice(None, None, 2)),
        S(t, slice(None, None, -1)),
        S(t, (slice(-1, 0, -2), slice(None), slice(None, None, -2))),
        S(t, None),
        S(t, (Ellipsis, 1)),
        S(t, (1, Ellipsis, None)),
        S(t, (slice(None), None, slice(4, 0, -3))),
        S(t, (Ellipsis, None)),
        S(t, slice(5, 10)),
        S(t, (0, 0, 0)),
        S(x(), None),
        S(x(), Ellipsis),
        S(t, idx((3,), -4, 4)),
        S(t, (idx((2, 3), 0, 4), slice(None), idx((3,), -3, 3))),
        S(t, (slice(None), idx((2,), 0, 5), idx((2,), 0, 3))),
        S(t, (1, idx((2, 2), -5, 5))),
        S(t, (idx((2,), 0, 4), slice(1, None, 2))),
        S(t, [0, 2]),
        S(t, (Ellipsis, idx((4,), 0, 3))),
        S(t, (None, idx((2,), 0, 4), None, 1)),
    ]


def _torch_getitem(x: Any, index: Any) -> Any:
    """x[index] in torch, which rejects negative slice steps: those dims are index_select-ed first."""
    items = list(index) if isinstance(index, tuple) else [index]
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    dim, rewritten = 0, []
    for item in items:
        if item is Ellipsis:
            dim += x.ndim - consumed
        elif isinstance(item, slice) and item.step is not None and item.step < 0:
            positions = torch.arange(*item.indices(x.shape[dim]))
            x = x.index_select(dim, positions)
            item = slice(None)
        if item is not None and item is not Ellipsis:
            dim += 1
        rewritten.append(item)
    return x[tuple(rewritten)]


def _movement_infos() -> list[OpInfo]:
    return [
        OpInfo(name, op, ref, case_samples(cases), **(fields[0] if fields else {}))
        for name, (op, ref, cases, *fields) in _movement_cases().items()
    ] + [
        OpInfo(
            "one_hot",
            lambda x, n: tg_movement.one_hot(x, n),
            torch_attr("nn.functional.one_hot"),
            case_samples(lambda x, idx, d: [S(idx((2, 3), 0, 4), 4), S(idx((5,), 0, 3), 3), S(idx((0,), 0, 1), 2)]),
            dtypes=("int64",),
            differentiable=False,
        ),
    ]


# -- sorting and sampling --------------------------------------------------


def _sort_samples(k: bool = False) -> Callable[[str, Rng, bool], Iterator[Sample]]:
    """Rows along every dim under every view, with NaN/Inf/±0 and many ties unless for gradients; `k` adds
    topk's count (every count for short rows) and its `largest` flag."""

    def samples(dtype: str, rng: Rng, for_grad: bool) -> Iterator[Sample]:
        def x(*shape: int) -> TensorArg:
            return make_tensor(rng, shape, dtype, view=random_view(rng), special=not for_grad)

        tensors = [(x(3, 7), -1), (x(4, 3, 5), 1), (x(6, 2), 0), (x(1), 0), (x(9), 0), (x(), 0)]
        if not for_grad:
            tensors += [(tied_tensor(rng, (3, 17), dtype, random_view(rng)), -1),
                        (tied_tensor(rng, (12, 3), dtype), 0), (x(0, 3), 0), (x(2, 0), 1)]
        for tensor, dim in tensors:
            size = tensor.shape[dim] if tensor.shape else 1
            for flag in (False, True):
                if not k:
                    yield S(tensor, dim=dim, descending=flag)
                    continue
                for count in sorted({0, 1, size // 2, size}) if size < 10 else (1, size // 3, size):
                    yield S(tensor, count, dim, flag)

    return samples


def _torch_topk(x: Any, k: int, dim: int = -1, largest: bool = True) -> tuple[Any, Any]:
    """torch.topk's values; indices of ties as its stable sort orders them (torch.topk leaves that unspecified)."""
    values = torch.topk(x, k, dim, largest).values
    return values, torch.sort(x, dim=dim, descending=largest, stable=True).indices.narrow(dim if x.ndim else 0, 0, k)


def _multinomial_cases(dtype: str, rng: Rng, for_grad: bool) -> list[Sample]:
    def probs(*shape: int) -> TensorArg:
        return make_tensor(rng, shape, dtype, low=0.1, high=1.0)

    return [S(probs(5), 3), S(probs(2, 4), 4), S(probs(3, 6), 10, True), S(probs(1), 1), S(probs(4), 5),
            S(probs(2, 3, 4), 1), S(probs(4), 0)]


def _sorting_infos() -> list[OpInfo]:
    return [
        OpInfo("sort", tg.sort, lambda x, **k: torch.sort(x, stable=True, **k), _sort_samples()),
        OpInfo("argsort", tg.argsort, lambda x, **k: torch.argsort(x, stable=True, **k), _sort_samples(),
               differentiable=False),
        OpInfo("msort", tg.msort, torch_attr("msort"), case_samples(lambda x, idx, d: [S(x(4, 3)), S(x(5))], True)),
        OpInfo("topk", tg.topk, _torch_topk, _sort_samples(k=True), dtypes=NO_BOOL),
        OpInfo("multinomial", tg.multinomial, torch_attr("multinomial"), _multinomial_cases, dtypes=FLOAT_DTYPES,
               compare_values=False, differentiable=False),
    ]


# -- matmul and einsum ------------------------------------------------------


def _matmul_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
    return [
        S(x(3, 4), x(4, 2)),
        S(x(4), x(4, 3)),
        S(x(3, 4), x(4)),
        S(x(4), x(4)),
        S(x(2, 3, 4), x(4, 5)),
        S(x(2, 1, 3, 4), x(5, 4, 2)),
        S(x(3), x(2, 3, 4)),
        S(x(3, 0), x(0, 2)),
        S(x(0, 3), x(3, 2)),
    ]


def _einsum_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
    return [
        S("ij,jk->ik", x(3, 4), x(4, 2)),
        S("bij,bjk->bik", x(2, 3, 4), x(2, 4, 5)),
        S("ij->ji", x(2, 3)),
        S("i,j->ij", x(3), x(4)),
        S("ij->", x(2, 3)),
        S("ij,ij->i", x(2, 3), x(2, 3)),
        S("...ij,jk", x(2, 3, 4), x(4, 2)),
        S("bhqd,bhkd->bhqk", x(1, 2, 3, 4), x(1, 2, 5, 4)),
        S("i,i", x(3), x(3)),
    ]


# -- Fourier transforms: complex values compared as their (re, im) pairs ------------------------------------


def _fft_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
    return [S(x(3, 8)), S(x(2, 5), n=7), S(x(4, 6), dim=0, norm="ortho"), S(x(12), n=9, norm="forward"),
            S(x(2, 97))]


def _fftn_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
    return [S(x(3, 4, 6)), S(x(4, 6), s=(3, 8), norm="ortho"), S(x(2, 3, 5), dim=(0, 2))]


def _irfft_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
    def pairs(*shape: int) -> TensorArg:
        return x(*shape, 2, view="contiguous")

    return [S(pairs(3, 5)), S(pairs(2, 5), n=9), S(pairs(4, 3), n=4, dim=0, norm="ortho"), S(pairs(7), norm="forward")]


def _stft_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
    return [S(x(2, 64), n_fft=16, hop_length=4), S(x(50), n_fft=12, hop_length=5, center=False),
            S(x(40), n_fft=8, pad_mode="constant", normalized=True)]


def _as_pairs(transform: Callable[..., Any], view_as_real: Callable[[Any], Any]) -> Callable[..., Any]:
    def call(x: Any, **kwargs: Any) -> Any:
        out = transform(x, **kwargs)
        return view_as_real(out.resolve_conj() if hasattr(out, "resolve_conj") else out)

    return call


def _fft_infos() -> list[OpInfo]:
    tol = {"float32": (1e-4, 1e-4)}
    floats = ("float32", "float64")
    infos = [OpInfo(f"fft.{name}", _as_pairs(getattr(tg.fft, name), tg.view_as_real),
                    _as_pairs(torch_attr(f"fft.{name}"), torch_attr("view_as_real")), case_samples(cases),
                    dtypes=floats, tolerances=tol)
             for name, cases in (("fft", _fft_cases), ("ifft", _fft_cases), ("rfft", _fft_cases),
                                 ("fftn", _fftn_cases), ("rfftn", _fftn_cases))]
    stft = OpInfo("stft", lambda x, **kw: tg.view_as_real(tg.stft(x, return_complex=True, **kw)),
                  lambda x, **kw: torch.view_as_real(torch.stft(x, return_complex=True, **kw)),
                  case_samples(_stft_cases), dtypes=floats, tolerances=tol)
    irfft = OpInfo("fft.irfft", lambda x, **kw: tg.fft.irfft(tg.view_as_complex(x), **kw),
                   lambda x, **kw: torch.fft.irfft(torch.view_as_complex(x), **kw), case_samples(_irfft_cases),
                   dtypes=floats, tolerances=tol)
    return [*infos, irfft, stft]


def _linalg_infos() -> list[OpInfo]:
    floats_and_ints = ("float32", "float64", "float16", "bfloat16", "int64", "int32")
    tol = {"float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2), "float32": (1e-5, 1e-5)}
    return [
        OpInfo(
            "matmul",
            tg.matmul,
            torch_attr("matmul"),
            case_samples(_matmul_cases),
            dtypes=floats_and_ints,
            tolerances=tol,
        ),
        OpInfo(
            "a @ b",
            operator.matmul,
            operator.matmul,
            case_samples(lambda x, idx, d: [S(x(2, 3), x(3, 4))]),
            dtypes=floats_and_ints,
            tolerances=tol,
        ),
        OpInfo(
            "mm",
            tg.mm,
            torch_attr("mm"),
            case_samples(lambda x, idx, d: [S(x(2, 3), x(3, 4))]),
            dtypes=floats_and_ints,
            tolerances=tol,
        ),
        OpInfo(
            "bmm",
            tg.bmm,
            torch_attr("bmm"),
            case_samples(lambda x, idx, d: [S(x(2, 2, 3), x(2, 3, 4))]),
            dtypes=floats_and_ints,
            tolerances=tol,
        ),
        OpInfo(
            "dot",
            tg.dot,
            torch_attr("dot"),
            case_samples(lambda x, idx, d: [S(x(5), x(5))]),
            dtypes=floats_and_ints,
            tolerances=tol,
        ),
        OpInfo(
            "outer",
            tg.outer,
            torch_attr("outer"),
            case_samples(lambda x, idx, d: [S(x(3), x(4))]),
            dtypes=floats_and_ints,
            tolerances=tol,
        ),
        OpInfo(
            "einsum",
            tg.einsum,
            torch_attr("einsum"),
            case_samples(_einsum_cases),
            dtypes=floats_and_ints,
            tolerances=tol,
        ),
    ]


# -- creation ---------------------------------------------------------------


def _creation_infos() -> list[OpInfo]:
    def sized(dtype: str) -> list[Sample]:
        d = DTypeArg(dtype)
        return [S(2, 3, dtype=d), S((4,), dtype=d), S(0, 2, dtype=d), S((), dtype=d)]

    def like(x: Any, idx: Any, dtype: str) -> list[Sample]:
        return [S(x(2, 3)), S(x(0, 2)), S(x(3), dtype=DTypeArg("float64"))]

    def fixed(cases: Callable[[str], list[Sample]]) -> Callable[[str, Rng, bool], list[Sample]]:
        return lambda dtype, rng, for_grad: cases(dtype)

    def tensor_cases(dtype: str) -> list[Sample]:
        d = DTypeArg(dtype)
        return [
            S([[1, 2], [3, 4]], dtype=d),
            S([1.5, 2.0, 0.0], dtype=d),
            S([True, False], dtype=d),
            S(3, dtype=d),
            S([1, 2]),
            S([1.0, 2]),
            S([True, False]),
            S(2.5),
            S([[]]),
        ]

    def arange_cases(dtype: str) -> list[Sample]:
        return [S(5), S(1, 7, 2), S(0, 1, 0.25), S(5, 0, -1), S(2.5), S(-3, 3, dtype=DTypeArg(dtype)), S(0)]

    def linspace_cases(dtype: str) -> list[Sample]:
        d = DTypeArg(dtype)
        return [S(0, 1, 5), S(-2, 3, 7), S(1, 1, 1), S(0, 10, 0), S(3, -1, 4, dtype=d)]

    def full_cases(dtype: str) -> list[Sample]:
        return [S((2, 3), 1.5), S((2,), 7), S((1, 2), True), S((2, 2), 3, dtype=DTypeArg(dtype)), S((0,), 1.0)]

    def eye_cases(dtype: str) -> list[Sample]:
        d = DTypeArg(dtype)
        return [S(3), S(2, 4), S(3, 2, dtype=d), S(0)]

    def randint_cases(dtype: str) -> list[Sample]:
        return [S(0, 5, (3, 4)), S(3, (2,)), S(0, 2, (2, 2), dtype=DTypeArg(dtype))]

    meta = {"compare_values": False, "differentiable": False}
    same = ("zeros", "ones")
    infos = [OpInfo(name, getattr(tg, name), torch_attr(name), fixed(sized), differentiable=False) for name in same]
    infos += [
        OpInfo("empty", tg.empty, torch_attr("empty"), fixed(sized), **meta),
        OpInfo("tensor", tg.tensor, torch_attr("tensor"), fixed(tensor_cases), differentiable=False),
        OpInfo("full", tg.full, torch_attr("full"), fixed(full_cases), differentiable=False),
        OpInfo("arange", tg.arange, torch_attr("arange"), fixed(arange_cases), dtypes=NO_BOOL, differentiable=False),
        OpInfo(
            "linspace",
            tg.linspace,
            torch_attr("linspace"),
            fixed(linspace_cases),
            dtypes=FLOAT_DTYPES,
            differentiable=False,
        ),
        OpInfo("eye", tg.eye, torch_attr("eye"), fixed(eye_cases), differentiable=False),
        OpInfo("zeros_like", tg.zeros_like, torch_attr("zeros_like"), case_samples(like), differentiable=False),
        OpInfo("ones_like", tg.ones_like, torch_attr("ones_like"), case_samples(like), differentiable=False),
        OpInfo("empty_like", tg.empty_like, torch_attr("empty_like"), case_samples(like), **meta),
        OpInfo(
            "full_like",
            lambda x, **k: tg.full_like(x, 2, **k),
            lambda x, **k: torch.full_like(x, 2, **k),
            case_samples(like),
            differentiable=False,
        ),
        OpInfo("rand", tg.rand, torch_attr("rand"), fixed(sized), dtypes=FLOAT_DTYPES, **meta),
        OpInfo("randn", tg.randn, torch_attr("randn"), fixed(sized), dtypes=FLOAT_DTYPES, **meta),
        OpInfo("randint", tg.randint, torch_attr("randint"), fixed(randint_cases), dtypes=NO_BOOL, **meta),
        OpInfo("rand_like", tg.rand_like, torch_attr("rand_like"), case_samples(like), dtypes=FLOAT_DTYPES, **meta),
        OpInfo("randn_like", tg.randn_like, torch_attr("randn_like"), case_samples(like), dtypes=FLOAT_DTYPES, **meta),
        OpInfo(
            "randint_like",
            lambda x: tg.randint_like(x, 5),
            lambda x: torch.randint_like(x, 5),
            case_samples(lambda x, idx, d: [S(x(2, 3)), S(x(0, 2))]),
            dtypes=NO_BOOL,
            **meta,
        ),
    ]
    return infos


def _cast_samples(dtype: str, rng: Rng, for_grad: bool) -> Iterator[Sample]:
    """Every target dtype; NaN/Inf only where the target can hold them, no negatives for uint8 (undefined)."""
    for target in ALL_DTYPES:
        special = target in (*FLOAT_DTYPES, "bool") and not for_grad
        low = 0.0 if target == "uint8" else -3.0
        x = make_tensor(rng, random_shape(rng), dtype, view=random_view(rng), low=low, special=special)
        yield S(x, DTypeArg(target))


def _dtype_infos() -> list[OpInfo]:
    return [OpInfo("to(dtype)", lambda x, d: x.to(d), lambda x, d: x.to(d), _cast_samples)]


# -- in-place ops and item assignment ---------------------------------------


def _cloned(method: str) -> Callable[..., Any]:
    """`x.clone().<method>(...)`: an in-place method as an op of its input (which stays a leaf for gradients)."""
    return lambda x, *args, **kwargs: getattr(x.clone(), method)(*args, **kwargs)


def _set_item(x: Any, index: Any, value: Any = 1) -> Any:
    """`y = x.clone(); y[index] = value` as an op."""
    y = x.clone()
    y[index] = value
    return y


def _set_item_cases(x: Any, idx: Any, dtype: str) -> list[Sample]:
    """Every index form reading takes (torch cannot assign through negative slice steps), a boolean mask, and
    tensor values that broadcast."""
    items = lambda index: index if isinstance(index, tuple) else (index,)  # noqa: E731
    forward = [s for s in _index_cases(x, idx, dtype)
               if not any(isinstance(i, slice) and (i.step or 1) < 0 for i in items(s.args[1]))]
    mask = TensorArg(np.arange(20).reshape(4, 5) % 3 == 0, "bool", (4, 5))
    distinct = TensorArg(np.array([3, 0, 2]), "int64", (3,))
    return forward + [
        S(x(4, 5, 3), (slice(None), 1), x(4, 3)),
        S(x(4, 5, 3), (Ellipsis, slice(0, None, 2)), x(2)),
        S(x(4, 5, 3), mask, x(3)),
        S(x(4, 5, 3), mask, 0),
        S(x(4, 5, 3), (slice(None), distinct), x(3, 3)),
    ]


def _inplace_infos() -> list[OpInfo]:
    mask = TensorArg(np.arange(6).reshape(2, 3) % 2 == 0, "bool", (2, 3))
    distinct_rows = TensorArg(np.array([[3, 0], [1, 2], [0, 3]]), "int64", (3, 2))
    distinct = TensorArg(np.array([3, 0]), "int64", (2,))
    across = TensorArg(np.array([[2, 1, 0, 2]]), "int64", (1, 4))
    arithmetic = lambda x, idx, d: [S(x(2, 3), x(2, 3)), S(x(2, 3), x(1, 3)), S(x(2, 3), 2)]  # noqa: E731
    table: dict[str, tuple[Callable[..., list[Sample]], dict[str, Any]]] = {
        "copy_": (lambda x, idx, d: [S(x(2, 3), x(3)), S(x(2, 3), x(2, 3))], {}),
        "add_": (lambda x, idx, d: [*arithmetic(x, idx, d), S(x(2, 3), x(2, 3), alpha=2)], {"dtypes": NO_BOOL}),
        "sub_": (arithmetic, {"dtypes": NO_BOOL}),
        "mul_": (arithmetic, {"dtypes": NO_BOOL}),
        "clamp_": (lambda x, idx, d: [S(x(2, 3), -1, 1), S(x(2, 3), None, 0)], {"dtypes": NO_BOOL}),
        "fill_": (lambda x, idx, d: [S(x(2, 3), 1)], {}),
        "zero_": (lambda x, idx, d: [S(x(2, 3))], {}),
        "masked_fill_": (lambda x, idx, d: [S(x(2, 3), mask, 1), S(x(2, 3), mask, 0)], {}),
        "index_put_": (lambda x, idx, d: [S(x(4, 3), (distinct,), x(2, 3)),
                                          S(x(4, 3), (idx((5,), 0, 4), idx((5,), 0, 3)), x(5), accumulate=True)], {}),
        "scatter_": (lambda x, idx, d: [S(x(3, 4), 1, distinct_rows, x(3, 2)), S(x(3, 4), 0, across, 1)],
                     {}),
    }
    infos = [OpInfo(name, _cloned(name), _cloned(name), case_samples(cases), **fields)
             for name, (cases, fields) in table.items()]
    return infos + [OpInfo("setitem", _set_item, _set_item, case_samples(_set_item_cases))]


OP_INFOS: list[OpInfo] = (
    _creation_infos()
    + _dtype_infos()
    + _unary_infos()
    + _binary_infos()
    + _operator_infos()
    + _ternary_infos()
    + _reduction_infos()
    + _movement_infos()
    + _sorting_infos()
    + _linalg_infos()
    + _fft_infos()
    + _inplace_infos()
)
_BY_NAME = {info.name: info for info in OP_INFOS}
assert len(_BY_NAME) == len(OP_INFOS), "op names in the table must be unique"


def find(name: str) -> OpInfo:
    return _BY_NAME[name]
