"""Loop IR -> one C translation unit per program: the C-style renderer every C-like target subclasses.

Each kernel becomes a function taking its buffers as `restrict` pointers; an
entry point `tg_program(void **buffers)` calls them in order, so a whole step is
one native call. A reduction's innermost loop keeps `ScheduleOptions.lanes` independent partial
results (combined in order afterwards), so float sums and NaN-propagating maxima
vectorize without reassociation flags.

Spelling of every op lives in the tables below (`BINARY`, `UNARY_FLOAT`, ...).
Every identifier in the source is generated here or sanitized (`c_identifier`).
`CStyleRenderer` renders portable single-threaded C from those tables; a target
overrides its tables and hooks (`backends.cpu.renderer.CpuRenderer`: OpenMP,
vector transposes, streaming stores, library calls; docs/backends.md).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from fractions import Fraction
from pathlib import Path
from typing import Callable, Collection

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.codegen import index as ix
from tensorgraphs.codegen.compiler import UNIT_BREAK
from tensorgraphs.codegen.loop_ir import (
    LIBRARY_CALLS,
    Accumulate,
    AttentionCall,
    ConvCall,
    FftCall,
    GemmCall,
    HostCall,
    Kernel,
    Let,
    Lit,
    Load,
    Local,
    Loop,
    NativeCall,
    Operand,
    ParallelAxis,
    Reduce,
    Ref,
    ScheduleOptions,
    Stmt,
    Store,
    TransposeLocal,
)
from tensorgraphs.dtypes import DType
from tensorgraphs.errors import UnsupportedError
from tensorgraphs.graph.ops import Op


def _pi(digits: int = 120) -> Fraction:
    """pi to `digits` decimals (Machin's formula in integers): enough for 2^E mod 2pi up to E = 127."""
    def arctan_inverse(x: int, one: int) -> int:
        total = term = one // x
        n, sign = 1, -1
        while term:
            term //= x * x
            n += 2
            total += sign * (term // n)
            sign = -sign
        return total

    one = 10 ** (digits + 10)
    return Fraction(16 * arctan_inverse(5, one) - 4 * arctan_inverse(239, one), one)


def _sin_table() -> str:
    """tg_pow2_mod_2pi[E + 149] = 2^E mod 2pi as (hi, lo) doubles, E = -149 .. 105 (every float exponent)."""
    two_pi = 2 * _pi()
    rows = []
    for exponent in range(-149, 106):
        t = Fraction(2) ** exponent % two_pi
        hi = float(t)
        rows.append(f"    {{{hi.hex()}, {float(t - Fraction(hi)).hex()}}},")
    return "static const double tg_pow2_mod_2pi[256][2] = {\n" + "\n".join(rows) + "\n    {0, 0}};\n"


_HEADER = (Path(__file__).parent / "c_preamble.h").read_text()
_SPLIT = _HEADER.index("typedef union")
C_PREAMBLE = _HEADER[:_SPLIT] + _sin_table() + "\n" + _HEADER[_SPLIT:]
"""The C runtime every C-like target includes (math, rounding, integer division, index helpers)."""

STORAGE = {
    dtypes.bool_: "uint8_t", dtypes.uint8: "uint8_t", dtypes.uint32: "uint32_t", dtypes.int8: "int8_t",
    dtypes.int16: "int16_t", dtypes.int32: "int32_t", dtypes.int64: "int64_t", dtypes.float16: "_Float16",
    dtypes.bfloat16: "float", dtypes.float32: "float", dtypes.float64: "double",
}
"""C element type of each dtype's array (bfloat16 is stored as float32 holding bfloat16 values)."""

COMPUTE = {**STORAGE, dtypes.float16: "float"}
"""C type scalars are computed in; float16 and bfloat16 values are rounded after each rounding op."""

ROUND = {dtypes.float16: "tg_round_f16", dtypes.bfloat16: "tg_round_bf16"}
"""Every op's float16/bfloat16 result is rounded to its storage, as the reference backend does."""


def c_identifier(text: str) -> str:
    """A safe C identifier from any string (user strings never reach the source unescaped)."""
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", text)[:48]
    return cleaned if re.match(r"[A-Za-z_]", cleaned) else f"_{cleaned}"


def literal(value: object, dtype: DType) -> str:
    """A C literal equal to `value` stored as `dtype` (floats exact, via hexadecimal)."""
    if dtype.is_bool:
        return "1" if value else "0"
    if dtype.is_integer:
        number = int(value)  # type: ignore[call-overload]
        if dtype is dtypes.int64 and number == -(2**63):
            return "(-INT64_C(9223372036854775807) - 1)"
        if dtype is dtypes.int64:  # a cast, not INT64_C: a size template's expression may stand for the number
            return f"((int64_t){number})"
        return f"{number}u" if dtype.kind == "u" else str(number)
    stored = float(dtypes.round_to_storage(np.asarray(value, dtype=dtype.storage), dtype))
    suffix = "" if dtype is dtypes.float64 else "f"
    if math.isnan(stored):
        return "NAN"
    if math.isinf(stored):
        return "INFINITY" if stored > 0 else "(-INFINITY)"
    return f"{stored.hex()}{suffix}" if stored >= 0 else f"(-{(-stored).hex()}{suffix})"


def render_index(e: ix.Expr) -> str:
    if isinstance(e, ix.Const):
        return str(e.value)
    if isinstance(e, (ix.Var, ix.Opaque)):
        return e.name
    if isinstance(e, ix.Sum):
        parts = [render_index(t) if c == 1 else f"{render_index(t)} * {c}" for t, c in e.terms]
        return "(" + " + ".join(parts + ([str(e.constant)] if e.constant else [])) + ")"
    if isinstance(e, ix.Div):
        inner = render_index(e.x)
        return f"({inner} / {e.divisor})" if e.x.lo >= 0 else f"tg_floordiv_index({inner}, {e.divisor})"
    if isinstance(e, ix.Mod):
        inner = render_index(e.x)
        return f"({inner} % {e.divisor})" if e.x.lo >= 0 else f"tg_mod_index({inner}, {e.divisor})"
    if isinstance(e, ix.And):
        return f"({render_index(e.x)} & {e.mask})"
    assert isinstance(e, ix.Clamp), e
    return f"tg_clamp_index({render_index(e.x)}, {e.low}, {e.high})"


def operand(o: Operand) -> str:
    if isinstance(o, Ref):
        return o.name
    if isinstance(o, Lit):
        return literal(o.value, o.dtype)
    return render_index(o.expr)


# ---------------------------------------------------------------------------
# Op spellings. Each takes the operand strings and the operands' dtype.
# ---------------------------------------------------------------------------

Spelling = Callable[[list[str], DType], str]


def _wrapping(op: str) -> Spelling:
    """Integer + and * wrap around (through unsigned arithmetic for 32/64-bit types)."""
    def spell(a: list[str], t: DType) -> str:
        if t.is_floating_point or t.itemsize < 4:
            return f"({a[0]} {op} {a[1]})"
        unsigned = f"uint{t.bits}_t"
        return f"({STORAGE[t]})(({unsigned}){a[0]} {op} ({unsigned}){a[1]})"
    return spell


def _int_or_float(int_spelling: str, float_spelling: str) -> Spelling:
    return lambda a, t: (float_spelling if t.is_floating_point else int_spelling).format(*a, T=STORAGE[t])


BINARY: dict[Op, Spelling] = {
    Op.ADD: lambda a, t: f"({a[0]} | {a[1]})" if t.is_bool else _wrapping("+")(a, t),
    Op.MUL: lambda a, t: f"({a[0]} & {a[1]})" if t.is_bool else _wrapping("*")(a, t),
    Op.DIV: _int_or_float("tg_floordiv_{T}({0}, {1})", "({0} / {1})"),
    Op.MOD: lambda a, t: f"tg_mod_{STORAGE[t]}({a[0]}, {a[1]})",  # integers only
    Op.MAX: lambda a, t: (f"{'tg_max' if t is dtypes.float64 else 'tg_maxf'}({a[0]}, {a[1]})" if t.is_floating_point
                          else f"({a[0]} > {a[1]} ? {a[0]} : {a[1]})"),
    Op.CMPLT: lambda a, t: f"({a[0]} < {a[1]})",
    Op.CMPNE: lambda a, t: f"({a[0]} != {a[1]})",
    Op.AND: lambda a, t: f"({a[0]} & {a[1]})",
    Op.OR: lambda a, t: f"({a[0]} | {a[1]})",
    Op.XOR: lambda a, t: f"({a[0]} ^ {a[1]})",
}

UNARY_FLOAT = {  # (float32 compute, float64 compute)
    Op.EXP2: ("tg_exp2f", "exp2"),
    Op.LOG2: ("tg_log2f", "log2"),
    Op.SIN: ("tg_sinf", "sin"),
    Op.SQRT: ("sqrtf", "sqrt"),
}

EXTRA: dict[str, Spelling] = {
    "in_range": lambda a, t: f"({a[0]} >= {a[1]} && {a[0]} < {a[2]})",
    "checked_index": lambda a, t: f"tg_checked_index({a[0]}, {a[1]}, status)",
    "zero_unless": lambda a, t: f"({a[0]} ? {a[1]} : 0)",
}


class CStyleRenderer:
    """Renders one kernel function in a C-like language; `render_program` renders a whole program.

    A target's spelling is overridable: the tables (`storage`/`compute` types, `binary`, `unary_float` and
    `extra` op templates, `rounding` functions), the text before the kernels (`preamble`, `includes`,
    `kernel_qualifier`), and hooks for what a target may do its own way: `loop_header`, `parallel` (base:
    serial), `unroll_hint` and `function_attributes` (a kernel's `ScheduleOptions`; base: none), `reduce_hint`
    (a line before a reduction's lane loop), `local_qualifier` (a staging array's alignment), `transpose` (a tile
    transposed in place), `loop` (streaming stores), `library_call` (kernel libraries) and `kernel_end`. This base
    renders portable C99 for one thread and calls no library.
    """

    storage = STORAGE
    compute = COMPUTE
    rounding = ROUND
    binary = BINARY
    unary_float = UNARY_FLOAT
    extra = EXTRA
    preamble = C_PREAMBLE
    kernel_qualifier = "#define TG_KERNEL\n"
    local_qualifier = ""
    reduce_hint = ""

    def __init__(self, kernel: Kernel, sizes_at_run_time: bool = False) -> None:
        self.kernel = kernel
        self.sizes_at_run_time = sizes_at_run_time
        """The program is a size template (`codegen.size_template`): a choice made from sizes is rendered as a
        test at run time, so that one text holds for every size."""
        self.streamed = self.streamed_buffers(kernel)
        self.uses_status = False
        self.reduce_dtypes: dict[str, tuple[Op, DType]] = {}
        self.element_type = {b.name: self.storage[b.dtype] for b in kernel.buffers}
        self.element_dtype = {b.name: b.dtype for b in kernel.buffers}
        self.array = {b.name: f"p{position}" for position, b in enumerate(kernel.buffers)}
        """Parameters are named by position, so kernels that differ only in their buffers render the same."""

    def streamed_buffers(self, kernel: Kernel) -> set[str]:
        """Outputs `kernel` writes with streaming stores (none by default)."""
        return set()

    def cast(self, value: str, source: DType, target: DType) -> str:
        if target.is_bool:
            return f"({value} != 0)"
        if target.is_integer and source.is_floating_point:
            if target.kind == "u":
                return f"({self.storage[target]})tg_to_unsigned({value}, {float(2 ** target.bits)!r})"
            info = np.iinfo(target.storage)
            return f"({self.storage[target]})tg_to_signed({value}, {float(info.min)!r}, {float(info.max)!r})"
        return f"({self.compute[target]})({value})"

    def spell_let(self, let: Let) -> str:
        args = [operand(a) for a in let.args]
        source_dtype = let.args[0].dtype if let.args else let.dtype
        if isinstance(let.op, str):
            return self.extra[let.op](args, source_dtype)
        if let.op is Op.CAST:
            text = self.cast(args[0], source_dtype, let.dtype)
        elif let.op is Op.WHERE:
            text = f"({args[0]} ? {args[1]} : {args[2]})"
        elif let.op in self.unary_float:
            single, double = self.unary_float[let.op]
            text = f"{double if let.dtype is dtypes.float64 else single}({args[0]})"
        else:
            text = self.binary[let.op](args, source_dtype)
        if let.dtype in self.rounding:
            text = f"{self.rounding[let.dtype]}({text})"
        return text

    def accumulator_type(self, op: Op, dtype: DType) -> str:
        """float sums accumulate in double (16 lanes, then in order): no float32 drift on long rows."""
        if op is Op.ADD and dtype.is_floating_point:
            return "double"
        return self.compute[dtype]

    def identity(self, op: Op, dtype: DType) -> str:
        if op is Op.ADD:
            return "0"
        if dtype.is_floating_point:
            return "(-INFINITY)"
        return "0" if dtype.kind in "ub" else f"INT{dtype.bits}_MIN"

    def combine(self, op: Op, acc: str, value: str, dtype: DType) -> str:
        if op is Op.ADD:
            return f"{acc} + {value}" if dtype.is_floating_point else self.binary[Op.ADD]([acc, value], dtype)
        return self.binary[Op.MAX]([value, acc], dtype)

    def render(self, name: str | None = None) -> str:
        """The function, named `name` (default: the kernel's)."""
        body_lines = self.block(self.kernel.body, 1) + self.kernel_end()
        params = [f"{'' if b.writes else 'const '}{self.storage[b.dtype]} *restrict {self.array[b.name]}"
                  for b in self.kernel.buffers]
        if self.uses_status:
            params.append("int *status")
        self.signature = (f"TG_KERNEL {self.function_attributes(self.kernel.options)}void "
                          f"{c_identifier(name or self.kernel.name)}({', '.join(params) or 'void'})")
        return "\n".join([self.signature + " {", *body_lines, "}"])

    def kernel_end(self) -> list[str]:
        """Lines that end every kernel's body."""
        return []

    def function_attributes(self, options: ScheduleOptions) -> str:
        """What goes before a kernel function's return type for its options (here: nothing)."""
        return ""

    def unroll_hint(self, unroll: int) -> list[str]:
        """Lines before a loop to unroll `unroll` times (here: none, C has no portable spelling)."""
        return []

    def unrolled(self, loop: Loop, pad: str) -> list[str]:
        """The unroll hint of `loop`, if it has one."""
        return [pad + line for line in self.unroll_hint(loop.unroll)] if loop.unroll else []

    def block(self, stmts: list[Stmt], depth: int) -> list[str]:
        lines: list[str] = []
        for stmt in stmts:
            lines += self.statement(stmt, depth)
        return lines

    def statement(self, stmt: Stmt, depth: int) -> list[str]:
        pad = "    " * depth
        if isinstance(stmt, Let):
            self.uses_status |= stmt.op == "checked_index"
            return [f"{pad}const {self.compute[stmt.dtype]} {stmt.name} = {self.spell_let(stmt)};"]
        if isinstance(stmt, Load):
            source = self.array.get(stmt.buffer, stmt.buffer)
            return [f"{pad}const {self.compute[stmt.dtype]} {stmt.name} = {source}[{render_index(stmt.index)}];"]
        if isinstance(stmt, Store):
            return [self.store(stmt, pad)]
        if isinstance(stmt, Loop):
            return self.loop(stmt, depth)
        if isinstance(stmt, Reduce):
            return self.reduce(stmt, depth)
        if isinstance(stmt, HostCall):
            self.uses_status = True
            return [pad + line for line in host_call(stmt, self.array, self.element_dtype[stmt.output])]
        if isinstance(stmt, LIBRARY_CALLS):
            return [pad + self.library_call(stmt)]
        if isinstance(stmt, Local):
            self.element_type[stmt.name], self.element_dtype[stmt.name] = self.compute[stmt.dtype], stmt.dtype
            return [f"{pad}{self.compute[stmt.dtype]} {stmt.name}[{stmt.size}]{self.local_qualifier};"]
        if isinstance(stmt, TransposeLocal):
            return self.transpose(stmt, pad)
        assert isinstance(stmt, Accumulate), stmt
        op, dtype = self.reduce_dtypes[stmt.acc]
        return [f"{pad}{stmt.acc} = {self.combine(op, stmt.acc, operand(stmt.value), dtype)};"]

    def loop_header(self, var: str, extent: int) -> str:
        return f"for (int64_t {var} = 0; {var} < {extent}; {var}++) {{"

    def loop(self, loop: Loop, depth: int) -> list[str]:
        pad = "    " * depth
        head = [*self.unrolled(loop, pad), pad + self.loop_header(loop.var.name, loop.var.extent)]
        return self.parallel([*head, *self.block(loop.body, depth + 1), pad + "}"], loop.parallel, pad)

    def parallel(self, loop: list[str], parallel: ParallelAxis | None, pad: str) -> list[str]:
        """`loop` as the target runs a loop over `parallel`'s grid axis (here: in order, one thread)."""
        return loop

    def transpose(self, stmt: TransposeLocal, pad: str) -> list[str]:
        """The square local array transposed in place, element by element."""
        n, t = stmt.side, stmt.name
        return [f"{pad}for (int64_t {t}_i = 0; {t}_i < {n}; {t}_i++) {{",
                f"{pad}    for (int64_t {t}_j = 0; {t}_j < {t}_i; {t}_j++) {{",
                f"{pad}        const {self.element_type[t]} {t}_kept = {t}[{t}_i * {n} + {t}_j];",
                f"{pad}        {t}[{t}_i * {n} + {t}_j] = {t}[{t}_j * {n} + {t}_i];",
                f"{pad}        {t}[{t}_j * {n} + {t}_i] = {t}_kept;",
                f"{pad}    }}", f"{pad}}}"]

    def library_call(self, call: GemmCall | ConvCall | AttentionCall | NativeCall | FftCall) -> str:
        """The call of a kernel library; a target without libraries never gets one (the planner decomposes)."""
        raise UnsupportedError(f"{type(self).__name__} calls no kernel library: {call!r} should have been "
                               "decomposed (its planner candidate must not apply to this target)")

    def store(self, stmt: Store, pad: str) -> str:
        target = f"{self.array.get(stmt.buffer, stmt.buffer)}[{render_index(stmt.index)}]"
        dtype = self.element_dtype[stmt.buffer]
        value = operand(stmt.value)
        if stmt.accumulate:
            value = self.binary[Op.ADD]([target, value], dtype)
            if dtype in self.rounding:
                value = f"{self.rounding[dtype]}({value})"
        return f"{pad}{target} = ({self.element_type[stmt.buffer]})({value});"

    def reduce(self, stmt: Reduce, depth: int) -> list[str]:
        pad = "    " * depth
        acc_type = self.accumulator_type(stmt.op, stmt.dtype)
        self.reduce_dtypes[f"{stmt.acc}_sum"] = (stmt.op, stmt.dtype)
        lines = [f"{pad}{acc_type} {stmt.acc}_sum = {self.identity(stmt.op, stmt.dtype)};", f"{pad}{{"]
        inner = _rename_accumulator(stmt.body, stmt.acc, f"{stmt.acc}_sum")
        lines += self.lanes_or_block(inner, stmt, depth + 1)
        lines.append(f"{pad}}}")
        final = f"({self.compute[stmt.dtype]}){stmt.acc}_sum"
        if stmt.dtype in self.rounding and stmt.op is Op.ADD:
            final = f"{self.rounding[stmt.dtype]}({final})"
        lines.append(f"{pad}const {self.compute[stmt.dtype]} {stmt.acc} = {final};")
        return lines

    def lanes_or_block(self, stmts: list[Stmt], stmt: Reduce, depth: int) -> list[str]:
        """The innermost loop that accumulates runs the options' `lanes` partial results when long enough."""
        lines: list[str] = []
        long_enough = 2 * self.kernel.options.lanes
        for s in stmts:
            if isinstance(s, Loop) and any(isinstance(b, Accumulate) for b in s.body) and s.var.extent >= long_enough:
                lines += self.lane_loop(s, stmt, depth)
            elif isinstance(s, Loop):
                pad = "    " * depth
                lines += self.unrolled(s, pad)
                lines.append(pad + self.loop_header(s.var.name, s.var.extent))
                lines += self.lanes_or_block(s.body, stmt, depth + 1)
                lines.append(pad + "}")
            else:
                lines += self.statement(s, depth)
        return lines

    def lane_loop(self, loop: Loop, stmt: Reduce, depth: int) -> list[str]:
        pad, v, n, lanes_n = "    " * depth, loop.var.name, loop.var.extent, self.kernel.options.lanes
        acc = f"{stmt.acc}_sum"
        acc_type = self.accumulator_type(stmt.op, stmt.dtype)
        main = n - n % lanes_n
        lanes = f"{stmt.acc}_lane"
        self.reduce_dtypes[lanes + "[lane]"] = (stmt.op, stmt.dtype)
        per_lane = _rename_accumulator(loop.body, acc, lanes + "[lane]")
        lines = [
            f"{pad}{acc_type} {lanes}[{lanes_n}];",
            f"{pad}for (int lane = 0; lane < {lanes_n}; lane++) {lanes}[lane] = {self.identity(stmt.op, stmt.dtype)};",
            *self.unrolled(loop, pad),
            f"{pad}for (int64_t {v}_block = 0; {v}_block < {main}; {v}_block += {lanes_n}) {{",
            *([f"{pad}    {self.reduce_hint}"] if self.reduce_hint else []),
            f"{pad}    for (int lane = 0; lane < {lanes_n}; lane++) {{",
            f"{pad}        const int64_t {v} = {v}_block + lane;",
            *self.block(per_lane, depth + 2),
            f"{pad}    }}",
            f"{pad}}}",
            f"{pad}for (int lane = 0; lane < {lanes_n}; lane++) "
            f"{acc} = {self.combine(stmt.op, acc, f'{lanes}[lane]', stmt.dtype)};",
        ]
        if main < n:
            lines += [f"{pad}for (int64_t {v} = {main}; {v} < {n}; {v}++) {{", *self.block(loop.body, depth + 1),
                      f"{pad}}}"]
        return lines

    @classmethod
    def includes(cls, kernels: list[Kernel]) -> str:
        """`#include` lines the kernels need beyond the preamble."""
        return ""

    @classmethod
    def libraries(cls, kernels: list[Kernel]) -> list[Path]:
        """Shared libraries the kernels call (the program is linked against them)."""
        return []

    @classmethod
    def render_program(cls, kernels: list[Kernel], buffers: list[str], timed: bool = False,
                       sizes_at_run_time: bool = False, skippable: Collection[int] = ()) -> str:
        """The translation unit: preamble, kernels, and `int tg_program(void **buffers)` calling each in order
        (stopping early with TG_INTERRUPTED when Ctrl-C comes while `tg_run` watches for it, see INTERRUPTS).
        `tg_run(buffers, prepared, watch)` leaves out the `skippable` kernels (positions) when `prepared` says
        their results are still in their buffers (`schedule.prepared`).

        Kernels that render the same apart from their name (the same layer repeated, on other buffers) become
        one function called several times: the C compiler's time grows with the distinct code only. Functions
        are separated by `UNIT_BREAK` lines, where the compiler driver may cut the program into units it
        compiles in parallel (hence kernels with hidden external linkage, declared before the entry point).
        `timed` adds up each kernel call's wall time in `double tg_kernel_seconds[]` (for profiling);
        `sizes_at_run_time`: see `CStyleRenderer.sizes_at_run_time`.
        """
        host_calls = uses_host_calls(kernels)
        parts = [cls.preamble + cls.includes(kernels) + (HOST_ENTRY if host_calls else "") + cls.kernel_qualifier]
        declarations = []
        calls = []
        slot = {name: i for i, name in enumerate(buffers)}
        function_named: dict[str, str] = {}  # rendered with a placeholder name -> the function's name
        for index, kernel in enumerate(kernels):
            renderer = cls(kernel, sizes_at_run_time)
            name = function_named.setdefault(renderer.render("tg_kernel"), c_identifier(kernel.name))
            if name == c_identifier(kernel.name):
                parts.append(renderer.render())
                declarations.append(renderer.signature + ";")
            args = [f"({cls.storage[b.dtype]} *)buffers[{slot[b.name]}]" for b in kernel.buffers]
            if renderer.uses_status:
                args.append("&status")
            call = f"    {name}({', '.join(args)});"
            if index in skippable:
                call = f"    if (!prepared) {call.strip()}"
            calls.extend(_timed(call, index) if timed else [call])
            calls.append("    if (tg_interrupted) return TG_INTERRUPTED;")
            if any(isinstance(stmt, HostCall) for stmt in kernel.body):
                calls.append("    if (status) return status;")
        clock = [f"double tg_kernel_seconds[{max(len(kernels), 1)}];", timer()] if timed else []
        host = ["int (*tg_host)(const char *, const char *, int64_t, const void *const *, const int64_t *, void *);"
                ] if host_calls else []
        entry = [*declarations, *clock, *host, INTERRUPTS, "static int tg_program_runs(void **buffers, int prepared) {",
                 "    int status = 0;", *calls, "    return status;", "}", PROGRAM_ENTRY,
                 STEPS_ENTRY.format(slots=len(buffers)), WATCHED_ENTRIES]
        return f"\n{UNIT_BREAK}\n".join(parts + ["\n".join(entry)]) + "\n"


TG_HOST_FAILED = -2
"""What `tg_program` and `tg_steps` return when a host call's function failed (`runtime.host_calls` keeps the
error)."""

HOST_ENTRY = f"""
/* Host calls: the runtime points tg_host at its dispatcher before the program runs; nonzero means the host
   function failed, and the program stops before its next kernel. */
#define TG_HOST_FAILED ({TG_HOST_FAILED})
extern int (*tg_host)(const char *function, const char *dtype, int64_t count, const void *const *sources,
                      const int64_t *sizes, void *output);
"""


def host_call(call: HostCall, array: dict[str, str], dtype: DType) -> list[str]:
    """The call back into the host; `dtype` is the arrays' (numpy's spelling, so the host can view them)."""
    count = len(call.sources)
    args = [f'"{call.function}"', f'"{np.dtype(dtype.storage).str}"', count, "sources", "sizes", array[call.output]]
    return ["{", f"    const void *const sources[{count}] = {{{', '.join(array[s] for s in call.sources)}}};",
            f"    const int64_t sizes[{count}] = {{{', '.join(map(str, call.sizes))}}};",
            f"    if (tg_host({', '.join(map(str, args))})) *status = TG_HOST_FAILED;", "}"]


def uses_host_calls(kernels: list[Kernel]) -> bool:
    """Whether the program calls back into the host (the runtime then binds `tg_host`)."""
    return any(isinstance(stmt, HostCall) for kernel in kernels for stmt in kernel.body)


def _rename_accumulator(stmts: list[Stmt], source: str, target: str) -> list[Stmt]:
    """The same statements with the Accumulates into `source` writing to `target` (a lane, the sum)."""
    renamed: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Accumulate) and s.acc == source:
            renamed.append(Accumulate(target, s.op, s.value))
        elif isinstance(s, Loop):
            renamed.append(dataclasses.replace(s, body=_rename_accumulator(s.body, source, target)))
        else:
            renamed.append(s)
    return renamed


TG_INTERRUPTED = -1
"""What `tg_program` and `tg_steps` return when a Ctrl-C stopped them."""

INTERRUPTS = f"""
/* Ctrl-C during a run: Python handles a signal only when the native call returns, so between
   tg_watch_interrupts and tg_unwatch_interrupts a SIGINT only sets tg_interrupted and the run stops before
   its next kernel. tg_unwatch_interrupts puts the previous handler back and says whether one came. */
#include <signal.h>
#define TG_INTERRUPTED ({TG_INTERRUPTED})
static volatile sig_atomic_t tg_interrupted;
static struct sigaction tg_previous_handler;
static void tg_on_interrupt(int signal) {{ (void)signal; tg_interrupted = 1; }}
static void tg_watch_interrupts(void) {{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = tg_on_interrupt;
    sigemptyset(&action.sa_mask);
    tg_interrupted = 0;
    sigaction(SIGINT, &action, &tg_previous_handler);
}}
static int tg_unwatch_interrupts(void) {{
    sigaction(SIGINT, &tg_previous_handler, NULL);
    return tg_interrupted;
}}
/* Around one entry's run: with `watch`, the handler in place during it, and its status TG_INTERRUPTED if a SIGINT
   came. */
static void tg_start_run(int watch) {{
    if (watch) tg_watch_interrupts(); else tg_interrupted = 0;
}}
static int tg_end_run(int watch, int status) {{
    return watch && tg_unwatch_interrupts() ? TG_INTERRUPTED : status;
}}
"""

PROGRAM_ENTRY = """
/* Every kernel, in order. */
int tg_program(void **buffers) { return tg_program_runs(buffers, 0); }"""

WATCHED_ENTRIES = """
/* The entries Python calls: tg_program (tg_steps) in one native call, with `watch` (Python's own SIGINT handling
   would raise) a Ctrl-C during it stops it before its next kernel and makes it return TG_INTERRUPTED; with
   `prepared`, without the kernels whose results the last run left (render_program's `skippable`). */
int tg_run(void **buffers, int prepared, int watch) {
    tg_start_run(watch);
    return tg_end_run(watch, tg_program_runs(buffers, prepared));
}
int tg_run_steps(void **buffers, long steps, const long *advance, const long *swap_with, int watch) {
    tg_start_run(watch);
    return tg_end_run(watch, tg_steps(buffers, steps, advance, swap_with));
}"""

TIMER = """#include <time.h>
static double tg_now(void) {{
    struct timespec t;
    clock_gettime({clock}, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}}"""


def timer() -> str:
    """The timed build's clock: wall time, or with TG_KERNEL_CLOCK=cpu the process's CPU time (for one thread on a
    loaded machine: time the thread was descheduled does not count)."""
    cpu = os.environ.get("TG_KERNEL_CLOCK", "wall") == "cpu"
    return TIMER.format(clock="CLOCK_PROCESS_CPUTIME_ID" if cpu else "CLOCK_MONOTONIC")


def _timed(call: str, index: int) -> list[str]:
    return ["    {", "    double started = tg_now();", "    " + call,
            f"    tg_kernel_seconds[{index}] += tg_now() - started;", "    }"]


STEPS_ENTRY = """
/* `steps` calls of tg_program in one native call: after each, every buffer pointer moves on by its byte
   stride (a fed input's next slice, a collected output's next row) and carried pairs swap pointers, so
   this step's new state is the next step's input. */
int tg_steps(void **buffers, long steps, const long *advance, const long *swap_with) {{
    for (long step = 0; step < steps; step++) {{
        int status = tg_program(buffers);
        if (status) return status;
        for (long i = 0; i < {slots}; i++) {{
            buffers[i] = (char *)buffers[i] + advance[i];
            long j = swap_with[i];
            if (j > i) {{ void *kept = buffers[i]; buffers[i] = buffers[j]; buffers[j] = kept; }}
        }}
    }}
    return 0;
}}"""

