"""Fuzzer of the compiled path: random Tensor-API programs must give the `numpy` device's results.

    python -m tensorgraphs.testing.fuzz_programs             # 300 programs and a few training runs
    python -m tensorgraphs.testing.fuzz_programs --long      # 10,000 programs, 200 training runs
    python -m tensorgraphs.testing.fuzz_programs --seed 17   # the program (and training run) a failure names

The default first seed comes from the date (so coverage moves from day to day) unless TG_FUZZ_SEED or
--start gives one; TG_FUZZ_PROGRAMS or --count sets the number of programs.

A program is data: arguments (dtype, values, and a layout: contiguous, permuted, strided or expanded) and a
few steps, each one line of Python over the public API (elementwise ops with division, pow, where, clamp;
reductions with softmax, logsumexp, argmax; views with strided slices, flip, pad, cat, expand, permute;
matmul; casts between all 9 dtypes; broadcasting, size-0 and size-1 dims, NaN/±Inf/±0 values). Its source
is both the function that runs and the reproducer that is printed, so the two cannot drift apart. A
quarter of the programs also return the gradients of their outputs with respect to their float arguments,
taken the way a function takes them (`x.detach().requires_grad_()`, then `tg.grad`).

Each program runs on the `numpy` device (the oracle) and three ways on the compiled path (`MODES`): on the
`cpu` device with every graph compiled to C, under `tg.compile` (forward only), and under `tg.compile`
with the gradients inside the compiled function. Programs run in batches, one graph per batch (one
compile); a batch that disagrees is split, and each failing program is shrunk while it fails the same way.
Results are compared as `fuzz_core` describes, each output at the level (`Step.exactness`) of the ops it
depends on. `fuzz_training` adds small training runs, one optimizer each. What known bugs trigger is left
out of the generators (`fuzz_known_bugs`).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import textwrap
import time
import traceback
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Iterator, Sequence

import numpy as np

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs import dtypes
from tensorgraphs.errors import TGError
from tensorgraphs.rewrite.fuzz import random_values
from tensorgraphs.runtime.realize import realize
from tensorgraphs.testing import fuzz_known_bugs, fuzz_training
from tensorgraphs.testing.fuzz_core import (
    CLOSE,
    EXACT,
    RTOL,
    UNSTABLE,
    Failure,
    Input,
    compiling_everything,
    differs,
    largest_finite,
    last_line,
    shrink,
)
from tensorgraphs.testing.samples import ALL_DTYPES, FLOAT_DTYPES

Rng = np.random.Generator
MODES = ("cpu", "compile", "compile-grad")
"""The ways a program runs besides the oracle: the cpu device compiling every graph, `tg.compile` of the
forward part, and `tg.compile` of programs that take gradients of their arguments."""
LAYOUTS = ("contiguous",) * 5 + ("permuted", "strided", "expanded")



# ---------------------------------------------------------------------------
# Programs as data.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """`name = text`, where `text` reads the variables `args`. `exactness` is EXACT, CLOSE or UNSTABLE
    given the exactness of its arguments; `signed_zero` is False when the sign of a zero result is
    unspecified (max-based ops)."""

    name: str
    text: str
    args: tuple[str, ...]
    exactness: int
    signed_zero: bool
    dtype: str  # of the result


@dataclass(frozen=True)
class Program:
    inputs: tuple[Input, ...]
    steps: tuple[Step, ...]
    outputs: tuple[str, ...]
    leaves: tuple[str, ...] = ()  # float inputs differentiated with respect to
    seeds: tuple[Input, ...] = ()  # grad_outputs, one per output that requires grad (in order)
    seed: int | None = None  # the generator seed, for the command line

    @property
    def arguments(self) -> tuple[Input, ...]:
        return self.inputs + self.seeds

    def source(self) -> str:
        """The program as a Python function `program(*arguments)` returning a list of tensors."""
        lines = [f"def program({', '.join(i.name for i in self.arguments)}):"]
        lines += [f"    {name} = {name}.detach().requires_grad_()" for name in self.leaves]
        lines += [f"    {s.name} = {s.text}" for s in self.steps]
        outputs = ", ".join(self.outputs)
        if self.seeds:
            differentiated = ", ".join(self.grad_outputs())
            leaves = ", ".join(self.leaves)
            lines += [f"    grads = tg.grad([{differentiated}], [{leaves}], "
                      f"grad_outputs=[{', '.join(s.name for s in self.seeds)}], allow_unused=True)",
                      f"    grads = [tg.zeros_like(x) if g is None else g for g, x in zip(grads, [{leaves}])]",
                      f"    return [t.detach() for t in [{outputs}]] + grads"]
        else:
            lines.append(f"    return [{outputs}]")
        return "\n".join(lines)

    def grad_outputs(self) -> list[str]:
        """The outputs gradients flow from: float outputs depending on a leaf through differentiable steps."""
        return [s.name[len("seed_"):] for s in self.seeds]

    def function(self) -> Callable[..., list[tg.Tensor]]:
        namespace: dict[str, Any] = {"tg": tg, "F": F, "np": np}
        exec(compile(self.source(), f"<fuzz program {self.seed}>", "exec"), namespace)  # noqa: S102
        return namespace["program"]

    def reproducer(self) -> str:
        """Runnable Python printing the oracle's results, then the compiled paths'."""
        inputs = "\n".join(i.source() for i in self.arguments)
        names = ", ".join(i.name for i in self.arguments)
        return "\n".join([
            "import numpy as np",
            "import tensorgraphs as tg",
            "import tensorgraphs.nn.functional as F",
            "from numpy import nan, inf",
            "from tensorgraphs.backends.cpu import CPU",
            "",
            self.source(),
            "",
            inputs,
            "with tg.device('numpy'):",
            f"    print('numpy   ', [t.numpy() for t in program({names})])",
            "CPU.interpret_below = 0  # compile every graph, however small",
            "with tg.device('cpu'):",
            f"    print('cpu     ', [t.numpy() for t in program({names})])",
            f"print('compile ', [t.numpy() for t in tg.compile(program)({names})])",
        ])

    def exactness(self) -> dict[str, tuple[int, bool]]:
        """Per variable: (EXACT/CLOSE/UNSTABLE, whether the sign of zero is specified)."""
        known = {i.name: (EXACT, True) for i in self.inputs}
        for step in self.steps:
            worst = max((known[a][0] for a in step.args), default=EXACT)
            signed = all(known[a][1] for a in step.args) and step.signed_zero
            if step.exactness == UNSTABLE:
                level = UNSTABLE if worst >= CLOSE else EXACT
            else:
                level = max(worst, step.exactness)
            known[step.name] = (level, signed)
        return known

    def ancestors(self, name: str) -> set[str]:
        steps = {s.name: s for s in self.steps}
        seen, todo = set(), [name]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo += list(steps[n].args) if n in steps else []
        return seen


# ---------------------------------------------------------------------------
# Generating programs.
# ---------------------------------------------------------------------------


@dataclass
class Var:
    """A variable of the program being generated: its lazy tensor (for shape and dtype) and, when a known
    bug's rule asks, its values on the oracle."""

    name: str
    tensor: tg.Tensor
    text: str = ""  # the step that made it ("" for an argument)

    @property
    def dtype(self) -> str:
        return self.tensor.dtype.name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    @cached_property
    def values(self) -> np.ndarray:
        with tg.device("numpy"):
            return realize([self.tensor.node])[0]


@dataclass(frozen=True)
class Proposal:
    """A step about to be added, as the rules of `fuzz_known_bugs` see it."""

    text: str
    args: tuple[Var, ...]
    dtype: str
    numel: int


@dataclass
class Builder:
    """The state of one program being generated: its variables and steps so far."""

    rng: Rng
    grad: bool
    inputs: list[Input] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    pool: list[Var] = field(default_factory=list)

    def new_input(self, dtype: str, shape: tuple[int, ...]) -> Var:
        dt = dtypes.to_dtype(dtype)

        def make(base_shape: tuple[int, ...]) -> np.ndarray:
            values = random_values(self.rng, dt, base_shape)
            if self.grad:  # gradients are compared away from NaN, infinities and overflow
                values = np.where(np.isfinite(values), np.clip(values, -4, 4), 1.0).astype(values.dtype)
            return np.array(values, order="C")

        layout = str(self.rng.choice(LAYOUTS))
        argument = Input.viewed(f"x{len(self.inputs)}", dtype, shape, layout, make)
        self.inputs.append(argument)
        tensor = argument.tensor()
        if self.grad and dt.is_floating_point:
            tensor = tensor.detach().requires_grad_()
        var = Var(argument.name, tensor)
        self.pool.append(var)
        return var

    def pick(self, where: Callable[[Var], bool] = lambda v: True) -> Var | None:
        """A variable, recent ones more often."""
        choices = [v for v in self.pool if where(v)]
        if not choices:
            return None
        return choices[len(choices) - 1 - min(int(self.rng.exponential(2.5)), len(choices) - 1)]

    def add(self, text: str, args: Sequence[Var], exactness: int, signed_zero: bool = True) -> Var | None:
        """Builds `text` lazily; a call the API rejects (a shape or dtype error), or one that a known bug
        makes wrong, adds nothing."""
        namespace = {"tg": tg, "F": F, **{v.name: v.tensor for v in self.pool}}
        try:
            tensor = eval(text, namespace)  # noqa: S307 - our own generated text
        except (TGError, ValueError, TypeError, IndexError):
            return None
        unique = tuple({id(v): v for v in args}.values())
        if fuzz_known_bugs.skipped_step(Proposal(text, unique, tensor.dtype.name, tensor.numel())):
            return None
        name = f"v{len(self.steps)}"
        self.steps.append(Step(name, text, tuple(v.name for v in unique), exactness, signed_zero,
                               tensor.dtype.name))
        var = Var(name, tensor, text)
        self.pool.append(var)
        return var

    def choice(self, options: Sequence[Any]) -> Any:
        return options[int(self.rng.integers(len(options)))]


def random_shape(rng: Rng) -> tuple[int, ...]:
    ndim = int(rng.choice([0, 1, 2, 2, 3, 3, 4]))
    sizes = [0] + [1] * 3 + [2, 3, 4, 5] * 2 + [7]
    return tuple(int(rng.choice(sizes)) if rng.random() > 0.03 else 0 for _ in range(ndim))


def broadcast_partner(b: Builder, shape: tuple[int, ...], dtype: str | None = None) -> Var:
    """An existing variable whose shape broadcasts with `shape`, else a new input that does (some dims
    1, some leading dims dropped)."""
    ok = lambda v: _broadcasts(v.shape, shape) and (dtype is None or v.dtype == dtype)  # noqa: E731
    found = b.pick(ok) if b.rng.random() < 0.6 else None
    if found is not None:
        return found
    partner = [1 if b.rng.random() < 0.25 else s for s in shape]
    partner = partner[int(b.rng.integers(len(partner) + 1)) if partner and b.rng.random() < 0.2 else 0:]
    return b.new_input(dtype or random_dtype(b), tuple(partner))


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b)))


def random_dtype(b: Builder) -> str:
    if b.grad:
        return b.choice(("float32", "float32", "float64"))
    return b.choice(ALL_DTYPES + ("float32", "float32", "int32"))


def _dim(b: Builder, v: Var) -> int:
    return int(b.rng.integers(-v.tensor.ndim, v.tensor.ndim)) if v.tensor.ndim else 0


def _scalar(b: Builder, v: Var) -> str:
    if v.dtype == "bool":
        return b.choice(("True", "False"))
    if v.is_float:
        return b.choice(("2.5", "-0.5", "0.0", "-0.0", "1.0", "3.0", "float('nan')", "float('inf')", "1e-3"))
    return b.choice(("0", "1", "-1", "2", "3", "7"))


# Op generators: each adds one step (or nothing) to the builder.


def op_binary(b: Builder) -> None:
    a = b.pick()
    if a is None:
        return
    other = broadcast_partner(b, a.shape, a.dtype if b.rng.random() < 0.5 else None)
    x, y = (a, other) if b.rng.random() < 0.5 else (other, a)
    templates = [("{x} + {y}", EXACT, True), ("{x} - {y}", EXACT, True), ("{x} * {y}", EXACT, True),
                 ("{x} / {y}", EXACT, True), ("tg.maximum({x}, {y})", EXACT, False),
                 ("tg.minimum({x}, {y})", EXACT, False), ("{x} ** {y}", CLOSE, True),
                 ("{x} < {y}", UNSTABLE, True), ("{x} == {y}", UNSTABLE, True), ("{x} >= {y}", UNSTABLE, True)]
    if not (x.is_float or y.is_float):
        templates += [("{x} // {y}", EXACT, True), ("{x} % {y}", EXACT, True), ("{x} & {y}", EXACT, True),
                      ("{x} | {y}", EXACT, True), ("{x} ^ {y}", EXACT, True)]
    else:
        templates += [("tg.atan2({x}, {y})", CLOSE, True)]
    text, exactness, signed = b.choice(templates)
    if b.rng.random() < 0.25:  # a Python scalar operand
        text = text.replace("{y}", _scalar(b, y)) if b.rng.random() < 0.5 else text.replace("{x}", _scalar(b, x))
    args = [v for v, key in ((x, "{x}"), (y, "{y}")) if key in text]
    b.add(text.format(x=x.name, y=y.name), args, exactness, signed)


def op_unary(b: Builder) -> None:
    x = b.pick()
    if x is None:
        return
    if x.is_float:
        templates = [("{x}.exp()", CLOSE, True), ("{x}.log()", CLOSE, True), ("{x}.sqrt()", EXACT, True),
                     ("{x}.sin()", CLOSE, True), ("{x}.cos()", CLOSE, True), ("{x}.tanh()", CLOSE, True),
                     ("{x}.sigmoid()", CLOSE, True), ("{x}.abs()", EXACT, True), ("-{x}", EXACT, True),
                     ("{x}.reciprocal()", EXACT, True), ("{x}.rsqrt()", EXACT, True),
                     ("F.relu({x})", EXACT, False), ("F.gelu({x})", CLOSE, True), ("{x}.erf()", CLOSE, True),
                     ("{x}.exp2()", CLOSE, True), ("{x}.log1p()", CLOSE, True), ("F.silu({x})", CLOSE, True),
                     ("{x} ** 2", CLOSE, True), ("{x} ** 0.5", CLOSE, True), ("{x} ** 3", CLOSE, True),
                     ("{x}.floor()", UNSTABLE, True), ("{x}.ceil()", UNSTABLE, True),
                     ("{x}.round()", UNSTABLE, True), ("{x}.trunc()", UNSTABLE, True),
                     ("{x}.sign()", UNSTABLE, True), ("{x}.isnan()", UNSTABLE, True),
                     ("{x}.isinf()", UNSTABLE, True), ("{x}.nan_to_num()", EXACT, True)]
    elif x.dtype == "bool":
        templates = [("~{x}", EXACT, True), ("{x}.logical_not()", EXACT, True)]
    else:
        templates = [("-{x}", EXACT, True), ("{x}.abs()", EXACT, True), ("~{x}", EXACT, True),
                     ("{x} ** 2", EXACT, True), ("{x}.sign()", EXACT, True)]
    text, exactness, signed = b.choice(templates)
    b.add(text.format(x=x.name), [x], exactness, signed)


def op_where(b: Builder) -> None:
    a = b.pick()
    if a is None:
        return
    c = b.pick(lambda v: v.dtype == "bool" and _broadcasts(v.shape, a.shape))
    other = broadcast_partner(b, a.shape, a.dtype)
    cond = c.name if c is not None else f"({a.name} > {_scalar(b, a)})"
    args = [v for v in (c, a, other) if v is not None]
    b.add(f"tg.where({cond}, {a.name}, {other.name})", args, EXACT if c is not None else UNSTABLE)


def op_clamp(b: Builder) -> None:
    x = b.pick(lambda v: v.dtype != "bool")
    if x is None:
        return
    if b.rng.random() < 0.5:
        lo, hi = sorted(b.rng.integers(-3, 4, 2).tolist())
        low, high = b.choice(((str(lo), str(hi)), (str(lo), "None"), ("None", str(hi))))
        if x.is_float and b.rng.random() < 0.3:
            low = b.choice(("float('nan')", "-0.0", "float('-inf')"))
        b.add(f"{x.name}.clamp({low}, {high})", [x], EXACT, False)
    else:
        bound = broadcast_partner(b, x.shape, x.dtype)
        b.add(f"{x.name}.clamp(min={bound.name})", [x, bound], EXACT, False)


def op_cast(b: Builder) -> None:
    x = b.pick()
    if x is None:
        return
    target = random_dtype(b)
    if x.is_float and target not in FLOAT_DTYPES:  # float -> int is unspecified for NaN, Inf, out of range
        low = 0 if target in ("uint8", "bool") else -100
        b.add(f"{x.name}.nan_to_num(0.0, 0.0, 0.0).clamp({low}, 100).to(tg.{target})", [x], UNSTABLE)
    else:
        b.add(f"{x.name}.to(tg.{target})", [x], EXACT)


def op_reduce(b: Builder) -> None:
    x = b.pick(lambda v: v.tensor.ndim > 0)
    if x is None:
        return
    dim, keep = _dim(b, x), b.choice(("", ", keepdim=True"))
    sum_kind = CLOSE if x.is_float else EXACT
    templates = [(f"{{x}}.sum({dim}{keep})", sum_kind, True), ("{x}.sum()", sum_kind, True),
                 (f"{{x}}.amax({dim}{keep})", EXACT, False), (f"{{x}}.amin({dim}{keep})", EXACT, False),
                 (f"{{x}}.argmax({dim}{keep})", UNSTABLE, True), (f"{{x}}.argmin({dim})", UNSTABLE, True),
                 (f"{{x}}.max({dim}{keep}).values", EXACT, False), (f"{{x}}.prod({dim})", sum_kind, True),
                 (f"{{x}}.cumsum({dim})", sum_kind, True), (f"{{x}}.any({dim})", UNSTABLE, True),
                 (f"{{x}}.all({dim})", UNSTABLE, True)]
    if x.is_float:
        templates += [(f"{{x}}.softmax({dim})", CLOSE, True), (f"{{x}}.log_softmax({dim})", CLOSE, True),
                      (f"{{x}}.logsumexp({dim}{keep})", CLOSE, True), (f"{{x}}.mean({dim}{keep})", CLOSE, True),
                      (f"{{x}}.var({dim})", CLOSE, True), (f"{{x}}.std({dim})", CLOSE, True)]
    text, exactness, signed = b.choice(templates)
    b.add(text.format(x=x.name), [x], exactness, signed)


def op_view(b: Builder) -> None:
    x = b.pick()
    if x is None:
        return
    n, shape = x.tensor.ndim, x.shape
    perm = ", ".join(str(int(i)) for i in b.rng.permutation(n))
    options = [f"{x.name}.permute({perm})" if n else None,
               f"{x.name}.mT" if n >= 2 else None,
               f"{x.name}.transpose(0, -1)" if n else None,
               f"{x.name}.reshape(-1)",
               f"{x.name}.reshape({_regroup(b, shape)})" if n else None,
               f"{x.name}.unsqueeze({int(b.rng.integers(-n - 1, n + 1))})",
               f"{x.name}.squeeze()",
               f"{x.name}.flip({_dim(b, x)})" if n else None,
               f"{x.name}.expand({_grown(b, shape)})",
               f"{x.name}[{_slices(b, shape)}]" if n else None,
               f"{x.name}.narrow({_dim(b, x)}, 0, 1)" if n and min(shape) > 0 else None,
               f"F.pad({x.name}, ({_pads(b, n)}), value={_scalar(b, x)})" if n else None,
               f"{x.name}.roll(1, {_dim(b, x)})" if n else None,
               f"{x.name}.tril()" if n >= 2 else None,
               f"{x.name}.contiguous()"]
    text = b.choice([o for o in options if o is not None])
    b.add(text, [x], EXACT)


def _regroup(b: Builder, shape: tuple[int, ...]) -> str:
    """A different shape with the same element count: merge two neighbours or split a dim."""
    dims = list(shape)
    i = int(b.rng.integers(len(dims)))
    if len(dims) > 1 and b.rng.random() < 0.5 and i + 1 < len(dims):
        dims[i:i + 2] = [dims[i] * dims[i + 1]]
    else:
        dims[i:i + 1] = [1, dims[i]] if dims[i] % 2 else [2, dims[i] // 2]
    return ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "")


def _grown(b: Builder, shape: tuple[int, ...]) -> str:
    grown = [int(b.choice((2, 3))) if s == 1 and b.rng.random() < 0.7 else s for s in shape]
    if b.rng.random() < 0.4:
        grown = [int(b.choice((1, 2)))] + grown
    return ", ".join(map(str, grown)) + ("," if len(grown) == 1 else "") if grown else "()"


def _slices(b: Builder, shape: tuple[int, ...]) -> str:
    parts = []
    for s in shape:
        start = int(b.rng.integers(0, s + 1)) if s and b.rng.random() < 0.5 else None
        stop = int(b.rng.integers(-s, s + 1)) if s and b.rng.random() < 0.3 else None
        step = int(b.choice((1, 2, 3))) if b.rng.random() < 0.5 else None
        part = f"{'' if start is None else start}:{'' if stop is None else stop}"
        parts.append(part + (f":{step}" if step else ""))
    return ", ".join(parts)


def _pads(b: Builder, ndim: int) -> str:
    pads = [int(b.rng.integers(0, 3)) for _ in range(2 * int(b.rng.integers(1, min(ndim, 2) + 1)))]
    return ", ".join(map(str, pads))


def op_join(b: Builder) -> None:
    x = b.pick(lambda v: v.tensor.ndim > 0)
    if x is None:
        return
    dim = _dim(b, x)
    other_shape = list(x.shape)
    other_shape[dim] = int(b.rng.integers(0, 4))
    y = b.pick(lambda v: v.shape == tuple(other_shape)) or b.new_input(x.dtype if b.rng.random() < 0.7
                                                                       else random_dtype(b), tuple(other_shape))
    same = b.pick(lambda v: v.shape == x.shape and v is not x) or x
    text = b.choice((f"tg.cat([{x.name}, {y.name}], {dim})", f"tg.cat([{y.name}, {x.name}, {y.name}], {dim})",
                     f"tg.stack([{x.name}, {same.name}], {dim})"))
    b.add(text, [x, y] if "stack" not in text else [x, same], EXACT)


def op_matmul(b: Builder) -> None:
    x = b.pick(lambda v: v.tensor.ndim >= 1 and v.dtype != "bool")
    if x is None:
        return
    k = x.shape[-1]
    shape = (k, int(b.rng.choice([1, 2, 3, 5]))) if b.rng.random() < 0.7 else (k,)
    if x.tensor.ndim >= 2 and b.rng.random() < 0.3:
        text, args = f"{x.name} @ {x.name}.mT", [x]
    else:
        y = b.pick(lambda v: v.shape == shape and v.dtype == x.dtype) or b.new_input(x.dtype, shape)
        text, args = f"{x.name} @ {y.name}", [x, y]
    b.add(text, args, CLOSE if x.is_float else EXACT)


GENERATORS: tuple[Callable[[Builder], None], ...] = (
    op_binary, op_binary, op_binary, op_unary, op_unary, op_where, op_clamp, op_cast, op_reduce, op_reduce,
    op_view, op_view, op_view, op_join, op_matmul)


def random_program(seed: int, steps: int | None = None) -> Program:
    """The program of `seed`: 1-2 inputs (more as ops need partners), a few steps, 1-3 outputs; a quarter
    take gradients."""
    rng = np.random.default_rng(seed)
    b = Builder(rng, grad=rng.random() < 0.25)
    for _ in range(int(rng.integers(1, 3))):
        b.new_input(random_dtype(b), random_shape(rng))
    for _ in range(steps or int(rng.integers(2, 9))):
        b.choice(GENERATORS)(b)
    if not b.steps:
        b.add(f"{b.inputs[0].name} + {b.inputs[0].name}", [b.pool[0]], EXACT, True)
    names = [s.name for s in b.steps]
    outputs = tuple(dict.fromkeys([names[-1]] + [n for n in names[:-1] if rng.random() < 0.25]))
    program = Program(tuple(b.inputs), tuple(b.steps), outputs, seed=seed)
    if not b.grad:
        return program
    tensors = {v.name: v.tensor for v in b.pool}
    reached = set().union(*(program.ancestors(o) for o in outputs))
    leaves = tuple(i.name for i in b.inputs if i.dtype in FLOAT_DTYPES and i.name in reached)
    seeds = tuple(Input(f"seed_{o}", tensors[o].dtype.name,
                        np.array(rng.standard_normal(tensors[o].shape), dtype=tensors[o].dtype.storage))
                  for o in outputs if tensors[o].requires_grad)
    return replace(program, leaves=leaves, seeds=seeds) if seeds and leaves else program


# ---------------------------------------------------------------------------
# Running and comparing.
# ---------------------------------------------------------------------------


def programs_for(mode: str, programs: Sequence[Program]) -> list[Program]:
    """What runs in `mode`: under plain "compile" the forward part only, under "compile-grad" the programs
    that take gradients (the gradient of arguments inside the compiled function), elsewhere everything."""
    if mode == "compile":
        return [replace(p, leaves=(), seeds=()) for p in programs]
    if mode == "compile-grad":
        return [p for p in programs if p.seeds]
    return list(programs)


def _batch_function(programs: Sequence[Program]) -> Callable[..., list[tg.Tensor]]:
    functions = [p.function() for p in programs]
    counts = [len(p.arguments) for p in programs]

    def batch(*args: tg.Tensor) -> list[tg.Tensor]:
        results, start = [], 0
        for function, count in zip(functions, counts):
            results += function(*args[start:start + count])
            start += count
        return results

    return batch


def run(programs: Sequence[Program], mode: str) -> list[list[np.ndarray]]:
    """Each program's results on the `numpy` device (the oracle), the compiling cpu device or `tg.compile`
    ("compile", "compile-grad": see `programs_for`), all programs in one graph."""
    programs = programs_for(mode, programs)
    if not programs:
        return []
    batch = _batch_function(programs)
    args = [i.tensor() for p in programs for i in p.arguments]
    if mode.startswith("compile"):
        results = tg.compile(batch)(*args)
        results = [results] if isinstance(results, tg.Tensor) else list(results)
        with tg.device("numpy"):
            flat = [t.numpy() for t in results]
    else:
        with compiling_everything(), tg.device(mode):
            results = batch(*args)
            flat = realize([t.node for t in results])
    counts = [len(result_kinds(p)) for p in programs]
    if len(flat) != sum(counts):
        raise AssertionError(f"{len(flat)} results, expected {sum(counts)}")
    starts = np.cumsum([0] + counts)
    return [flat[a:b] for a, b in zip(starts[:-1], starts[1:])]


def intermediate_values(program: Program) -> dict[str, np.ndarray]:
    """Every variable's value on the oracle (the scale of close comparisons)."""
    namespace = {"tg": tg, "F": F}
    with tg.device("numpy"), tg.no_grad():
        for i in program.inputs:
            namespace[i.name] = i.tensor()
        for s in program.steps:
            namespace[s.name] = eval(s.text, namespace)  # noqa: S307 - our own generated text
        names = [i.name for i in program.inputs] + [s.name for s in program.steps]
        values = realize([namespace[n].node for n in names])
    return dict(zip(names, values))


def result_kinds(program: Program) -> list[tuple[int, bool, set[str]]]:
    """Per result of the program (outputs, then gradients): exactness, whether the sign of zero is specified,
    and the variables it depends on."""
    known = program.exactness()
    kinds = [(*known[o], program.ancestors(o)) for o in program.outputs]
    if program.seeds:
        everything = {i.name for i in program.inputs} | {s.name for s in program.steps}
        grad_level = max((known[o][0] for o in program.grad_outputs()), default=EXACT)
        kinds += [(max(CLOSE, grad_level), False, everything) for _ in program.leaves]
    return kinds


def check(program: Program, modes: Sequence[str] = MODES) -> Failure | None:
    """None when the compiled paths agree with the oracle on `program`, else the first failure."""
    failures = check_batch([program], modes)
    return failures[0] if failures else None


def check_batch(programs: Sequence[Program], modes: Sequence[str] = MODES) -> list[Failure]:
    """The failures of running the programs together, one per mode at most (empty when all agree)."""
    try:
        expected = run(programs, "numpy")
    except Exception as error:  # noqa: BLE001 - the oracle's own failure is a finding too
        return [Failure("numpy", type(error).__name__, last_line(error))]
    failures = []
    for mode in modes:
        if fuzz_known_bugs.skipped_mode(mode):
            continue
        try:
            got = run(programs, mode)
        except Exception as error:  # noqa: BLE001 - any crash of a compiled path is a finding
            failures.append(Failure(mode, type(error).__name__, last_line(error)))
            continue
        ran = programs_for(mode, programs)
        oracle = [e for p, e in zip(programs, expected) if p.seeds or mode != "compile-grad"]
        reason = next(filter(None, (compare(p, e, g) for p, e, g in zip(ran, oracle, got))), None)
        if reason is not None:
            failures.append(Failure(mode, "mismatch", reason))
    return failures


def compare(program: Program, expected: list[np.ndarray], got: list[np.ndarray]) -> str | None:
    """Why `got` (a prefix of the oracle's results when gradients were left out) is wrong, or None."""
    values: dict[str, np.ndarray] | None = None
    dtype_of = {i.name: i.dtype for i in program.inputs} | {s.name: s.dtype for s in program.steps}
    for i, (e, g, (level, signed, names)) in enumerate(zip(expected, got, result_kinds(program))):
        scale, rtol = 0.0, 0.0
        if level == CLOSE:
            values = intermediate_values(program) if values is None else values
            scale = largest_finite(values[n] for n in names)
            rtol = max(RTOL.get(dtype_of[n], 0.0) for n in names)
        reason = differs(e, g, level, signed, scale, rtol)
        if reason is not None:
            return f"result {i}: {reason}"
    return None


# ---------------------------------------------------------------------------
# Shrinking.
# ---------------------------------------------------------------------------


def _pruned(program: Program) -> Program:
    """Without steps and inputs no output needs."""
    needed = set().union(*(program.ancestors(o) for o in program.outputs))
    inputs = tuple(i for i in program.inputs if i.name in needed)
    leaves = tuple(n for n in program.leaves if n in needed)
    seeds = tuple(s for s in program.seeds if s.name[len("seed_"):] in program.outputs)
    if not leaves or not seeds:
        leaves, seeds = (), ()
    return replace(program, inputs=inputs, steps=tuple(s for s in program.steps if s.name in needed),
                   leaves=leaves, seeds=seeds)


def _simpler_values(argument: Input) -> Input:
    """The argument with its finite floats rounded to integers (shorter to read; specials kept)."""
    values = argument.values
    if values.dtype.kind == "f":
        values = np.where(np.isfinite(values), np.round(values), values).astype(values.dtype)
    return replace(argument, values=values)


def _candidates(program: Program) -> Iterator[Program]:
    """Smaller programs: fewer outputs, no gradients, a step replaced by an input holding its value,
    contiguous or rounder arguments."""
    if len(program.outputs) > 1:
        for o in program.outputs:
            yield _pruned(replace(program, outputs=(o,)))
    if program.seeds:
        yield replace(program, leaves=(), seeds=())
    try:
        values = intermediate_values(program)
    except Exception:  # noqa: BLE001 - the oracle fails: only cutting is possible
        values = {}
    for step in program.steps:
        if step.name in program.outputs or step.name not in values:
            continue
        as_input = Input(step.name, step.dtype, np.array(values[step.name], order="C"))
        steps = tuple(s for s in program.steps if s is not step)
        leaf = (step.name,) if program.seeds and step.dtype in FLOAT_DTYPES else ()
        yield _pruned(replace(program, inputs=program.inputs + (as_input,), steps=steps,
                              leaves=program.leaves + leaf))
    for field_name in ("inputs", "seeds"):
        arguments = getattr(program, field_name)
        for i, argument in enumerate(arguments):
            for simpler in (argument.contiguous(), _simpler_values(argument)):
                yield replace(program, **{field_name: arguments[:i] + (simpler,) + arguments[i + 1:]})


def _size(program: Program) -> tuple[int, ...]:
    return (len(program.steps) + len(program.seeds), len(program.outputs),
            sum(i.values.size for i in program.arguments), sum(i.view != "contiguous" for i in program.arguments),
            len(program.source()) + sum(len(i.source()) for i in program.arguments))


def shrink_program(program: Program, failure: Failure) -> tuple[Program, Failure]:
    """The smallest program reachable by `_candidates` that fails the same way."""
    return shrink(_pruned(program), failure, _candidates, _size,
                  lambda p, mode: check(p, (mode,) if mode != "numpy" else ()))


# ---------------------------------------------------------------------------
# Driving.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """A failure found: the seed that generated it, how it failed, and the shrunk case (a `Program` or a
    `fuzz_training.TrainingCase`)."""

    seed: int
    failure: Failure
    case: Program | fuzz_training.TrainingCase

    def text(self) -> str:
        what = "program" if isinstance(self.case, Program) else "training run"
        command = f"python -m tensorgraphs.testing.fuzz_programs --seed {self.seed}"
        return (f"{what} of seed {self.seed} ({command}): {self.failure.mode} {self.failure.kind}: "
                f"{self.failure.detail}\n{textwrap.indent(self.case.reproducer(), '    ')}")


def fuzz(seeds: Sequence[int], batch: int = 16, modes: Sequence[str] = MODES,
         on_report: Callable[[Report], None] | None = None,
         progress: Callable[[int], None] | None = None) -> list[Report]:
    """Runs the programs of `seeds` in batches; every failure of a program (one per mode) is shrunk and
    reported."""
    reports = []
    for start in range(0, len(seeds), batch):
        chunk = list(seeds[start:start + batch])
        programs = [random_program(s) for s in chunk]
        if check_batch(programs, modes):
            for seed, program in zip(chunk, programs):
                for failure in check_batch([program], modes):
                    small, small_failure = shrink_program(program, failure)
                    reports.append(Report(seed, small_failure, small))
                    if on_report is not None:
                        on_report(reports[-1])
        if progress is not None:
            progress(len(chunk))
    return reports


def fuzz_training_runs(seeds: Sequence[int], on_report: Callable[[Report], None] | None = None) -> list[Report]:
    """The training runs of `seeds` (`fuzz_training`), each failure shrunk and reported."""
    reports = []
    for seed in seeds:
        case = fuzz_training.random_case(seed)
        failure = fuzz_training.check(case)
        if failure is not None:
            small, small_failure = fuzz_training.shrink_case(case, failure)
            reports.append(Report(seed, small_failure, small))
            if on_report is not None:
                on_report(reports[-1])
    return reports


def date_seed(day: datetime.date | None = None) -> int:
    """A seed that changes every day, so every CI run covers new programs."""
    day = day or datetime.datetime.now(datetime.UTC).date()
    return int(day.strftime("%Y%m%d")) * 100_000


def default_seeds(long: bool = False) -> range:
    """The seeds of a run: from TG_FUZZ_SEED (else the date), TG_FUZZ_PROGRAMS of them (else 300, or 10,000
    for a long run)."""
    start = int(os.environ.get("TG_FUZZ_SEED") or date_seed())
    return range(start, start + int(os.environ.get("TG_FUZZ_PROGRAMS") or (10_000 if long else 300)))


def training_seeds(seeds: Sequence[int]) -> list[int]:
    """One training run per 50 programs, at least one per optimizer of `fuzz_training`."""
    count = max(len(fuzz_training.OPTIMIZERS), len(seeds) // 50) if len(seeds) > 1 else 1
    return list(seeds[:count])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Random Tensor-API programs: numpy device vs compiled paths.")
    parser.add_argument("--long", action="store_true", help="10,000 programs instead of 300")
    parser.add_argument("--count", type=int, help="number of programs (default: TG_FUZZ_PROGRAMS or 300)")
    parser.add_argument("--start", type=int, help="first seed (default: TG_FUZZ_SEED or today's)")
    parser.add_argument("--seed", type=int, help="run only this seed's program and training run")
    parser.add_argument("--batch", type=int, default=16, help="programs per compiled graph")
    parser.add_argument("--show", action="store_true", help="with --seed: print the program")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--no-training", action="store_true", help="programs only")
    parser.add_argument("--known-bugs", action="store_true",
                        help="also generate what the known bugs of fuzz_known_bugs trigger")
    args = parser.parse_args(argv)
    if args.known_bugs:
        os.environ["TG_FUZZ_KNOWN_BUGS"] = "1"
    if args.seed is not None:
        seeds: Sequence[int] = [args.seed]
        if args.show:
            print(random_program(args.seed).reproducer())
    else:
        seeds = default_seeds(args.long)
        seeds = range(args.start if args.start is not None else seeds.start,
                      (args.start if args.start is not None else seeds.start) + (args.count or len(seeds)))
    began, done = time.monotonic(), 0

    def progress(n: int) -> None:
        nonlocal done
        done += n
        rate = done / max(time.monotonic() - began, 1e-9)
        print(f"\r{done}/{len(seeds)} programs, {rate:.1f}/s, ETA {(len(seeds) - done) / rate:.0f} s", end="",
              file=sys.stderr, flush=True)

    def on_report(report: Report) -> None:
        print("\n" + report.text(), flush=True)

    reports = fuzz(seeds, args.batch, args.modes.split(","), on_report, progress if len(seeds) > 1 else None)
    trained = [] if args.no_training else training_seeds(seeds)
    reports += fuzz_training_runs(trained, on_report)
    print(f"\nfuzz_programs: {len(seeds)} programs and {len(trained)} training runs from seed {seeds[0]}, "
          f"{len(reports)} failing", file=sys.stderr)
    return 1 if reports else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        traceback.print_exc(limit=0)
        sys.exit(130)
