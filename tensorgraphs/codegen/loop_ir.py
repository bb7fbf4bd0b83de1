"""The loop IR: what one kernel does, as loops, scalar lets, loads, stores and reductions.

Produced by `tensorgraphs.schedule.lower` from a fused group of graph nodes and
turned into C by `tensorgraphs.codegen.c_renderer`. Values are scalar SSA
names; every memory access carries a simplified symbolic index (`codegen.index`).
Nothing here knows C: the renderer owns every spelling.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

from tensorgraphs import dtypes
from tensorgraphs.codegen.index import Expr, Var, add, as_expr, mul, unflatten
from tensorgraphs.dtypes import DType
from tensorgraphs.graph.ops import Op


@dataclass(frozen=True)
class Ref:
    """A scalar computed earlier in the kernel."""

    name: str
    dtype: DType

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Lit:
    """A constant scalar (bool, int or float, already rounded to `dtype`'s storage)."""

    value: Any
    dtype: DType

    def __repr__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class IndexValue:
    """The value of an index expression (an IOTA element, a bounds check operand)."""

    expr: Expr
    dtype: DType

    def __repr__(self) -> str:
        return f"idx({self.expr!r})"


Operand = Ref | Lit | IndexValue


@dataclass(frozen=True)
class Let:
    """`name = op(*args)`; op is an elementwise `Op` or one of the extra names in `EXTRA_OPS`."""

    name: str
    dtype: DType
    op: Op | str
    args: tuple[Operand, ...]

    def __repr__(self) -> str:
        op = self.op.name if isinstance(self.op, Op) else self.op
        return f"{self.name}: {self.dtype.name} = {op}({', '.join(map(repr, self.args))})"


EXTRA_OPS = {
    "in_range": "1 when low <= args[0] < high (args: index, low, high); guards padded loads",
    "checked_index": "args[0] clamped into [0, args[1]); an out-of-range value raises IndexError after the call",
    "zero_unless": "args[1] when args[0] is true, else 0 (the padding value)",
}


@dataclass(frozen=True)
class Load:
    name: str
    dtype: DType
    buffer: str
    index: Expr

    def __repr__(self) -> str:
        return f"{self.name}: {self.dtype.name} = {self.buffer}[{self.index!r}]"


@dataclass(frozen=True)
class Store:
    """`buffer[index] = value`, or `buffer[index] += value` when `accumulate` (scatter-add)."""

    buffer: str
    index: Expr
    value: Operand
    accumulate: bool = False

    def __repr__(self) -> str:
        return f"{self.buffer}[{self.index!r}] {'+=' if self.accumulate else '='} {self.value!r}"


@dataclass(frozen=True)
class ParallelAxis:
    """A loop whose iterations are independent (no carried dependence), as axis `axis` of a grid of workers: 0 is
    the outermost such loop of a nest. A CPU target splits axis 0 across its threads; a GPU target would map axis
    i to grid dimension i. A target may run any axis in order, and does where `work` (the kernel's innermost
    iterations per call) is too little to pay for starting its workers; `nested` perfectly nested loops from this
    one share the axis."""

    axis: int
    work: int
    nested: int = 1

    def __str__(self) -> str:
        text = f"parallel{'' if self.axis == 0 else f'[{self.axis}]'}(work {self.work})"
        return text if self.nested == 1 else f"{text} x{self.nested}"


PARALLEL_MIN_WORK = 1 << 16
"""Below this much `ParallelAxis.work` the cpu target runs a kernel on one thread (OpenMP start-up costs more)."""


@dataclass
class Loop:
    """for var in range(var.extent): body. `parallel`: the grid axis its iterations are split over (None: in
    order); `unroll`: how many iterations the target should unroll (0: its compiler's choice)."""

    var: Var
    body: list[Stmt] = field(default_factory=list)
    parallel: ParallelAxis | None = None
    unroll: int = 0


@dataclass(frozen=True)
class Accumulate:
    """acc = op(acc, value) inside a `Reduce`'s loops."""

    acc: str
    op: Op
    value: Operand

    def __repr__(self) -> str:
        return f"{self.acc} {self.op.name}= {self.value!r}"


@dataclass
class Reduce:
    """acc = identity of op; run body (loops ending in an `Accumulate`); acc is then a usable scalar."""

    acc: str
    dtype: DType
    op: Op
    body: list[Stmt] = field(default_factory=list)


@dataclass(frozen=True)
class Local:
    """A small array private to one iteration of the enclosing loop (a staging tile)."""

    name: str
    dtype: DType
    size: int

    def __repr__(self) -> str:
        return f"local {self.name}: {self.dtype.name}[{self.size}]"


@dataclass(frozen=True)
class TransposeLocal:
    """Transposes the square `side` x `side` local array `name` in place (a transposing tile between the loop that
    fills it along the source's contiguous axis and the loop that writes it out along the output's): in vector
    registers, so neither loop has to store or load with a stride."""

    name: str
    side: int

    def __repr__(self) -> str:
        return f"transpose {self.name}[{self.side}x{self.side}]"


def _at_offset(buffer: str, offset: int) -> str:
    return f"{buffer}+{offset}" if offset else buffer


@dataclass(frozen=True)
class GemmEpilogue:
    """What the GEMM applies to each output element before storing it (gemm.h), in this order:
    c = activation(alpha * (a @ b) + bias) + residual, with `activation_after_residual`
    c = activation(alpha * (a @ b) + bias + residual), or for the gradient activation gelu_tanh_grad
    c = (alpha * (a @ b) + bias) * gelu'(residual). `bias_strides` are (batch, row, column), the column stride 0
    or 1 (a row vector over N is (0, 0, 1)), from `bias_offset` elements into its buffer; `residual_strides` are
    (batch, row), from `residual_offset` elements into its buffer."""

    alpha: float = 1.0
    bias: str | None = None
    bias_strides: tuple[int, int, int] = (0, 0, 0)
    activation: str = "none"
    residual: str | None = None
    residual_strides: tuple[int, int] = (0, 0)
    bias_offset: int = 0
    residual_offset: int = 0
    activation_after_residual: bool = False

    def __repr__(self) -> str:
        parts = [f"{self.alpha!r} * acc"] if self.alpha != 1.0 else ["acc"]
        parts += [f"{_at_offset(self.bias, self.bias_offset)}{list(self.bias_strides)}"] if self.bias else []
        residual = f"{_at_offset(self.residual, self.residual_offset)}{list(self.residual_strides)}"
        if self.activation == "gelu_tanh_grad":
            return f"({' + '.join(parts)}) * gelu_tanh'({residual})"
        return _activated(parts, self.activation, residual if self.residual else None, self.activation_after_residual)


def _activated(parts: list[str], activation: str, residual: str | None, after_residual: bool) -> str:
    """The text of an epilogue: the sum of `parts`, `activation` of it, the residual added before or after."""
    if residual is not None and after_residual:
        parts = [*parts, residual]
    text = " + ".join(parts)
    text = f"{activation}({text})" if activation != "none" else text
    return f"{text} + {residual}" if residual is not None and not after_residual else text


@dataclass(frozen=True)
class GemmCall:
    """c = epilogue(a_prologue(a) @ b_prologue(b)) by the GEMM library (`tensorgraphs.kernels.gemm`), a float32 or
    a bfloat16 product (`dtype`; every array is float32); `a` and `b` start `a_offset`/`b_offset` elements into
    their buffers; a prologue is an activation (`gemm.ACTIVATIONS`) the library applies to the operand while
    packing it.

    Strides are in elements: `a_strides`/`b_strides` are (batch, row, column), `c_strides` (batch, row); a
    batch stride of 0 broadcasts, a transposed operand is its swapped row/column strides (gemm.h).
    """

    batch: int
    m: int
    n: int
    k: int
    a: str
    a_strides: tuple[int, int, int]
    b: str
    b_strides: tuple[int, int, int]
    c: str
    c_strides: tuple[int, int]
    epilogue: GemmEpilogue = GemmEpilogue()
    a_offset: int = 0  # elements of `a`'s buffer before the operand starts (a slice of its leading dim)
    b_offset: int = 0
    a_prologue: str = "none"
    b_prologue: str = "none"
    function: str = "tg_gemm_f32"  # the library's C function (schedule.extern.gemm_function)
    dtype: DType = dtypes.float32  # of the product: a bfloat16 one rounds its result to bfloat16
    operands: DType = dtypes.float32  # bfloat16: the library rounds the operands so while packing them (gemm.h)
    c_offset: int = 0  # elements of `c`'s buffer before the result starts (an image's, a concatenation's slice)

    def __repr__(self) -> str:
        a, b = (f"{prologue}({_at_offset(name, offset)})" if prologue != "none" else _at_offset(name, offset)
                for name, offset, prologue in ((self.a, self.a_offset, self.a_prologue),
                                               (self.b, self.b_offset, self.b_prologue)))
        kind = "gemm" if self.operands == dtypes.float32 else f"gemm.{self.operands.name}"
        kind += "" if self.dtype == self.operands else f"->{self.dtype.name}"
        sizes = f"{self.batch}x{self.m}x{self.n}x{self.k}"
        product = f"{kind}[{sizes}]({a}{list(self.a_strides)}, {b}{list(self.b_strides)})"
        epilogue = "" if self.epilogue == GemmEpilogue() else f" -> {self.epilogue!r}"
        library = "" if self.function == "tg_gemm_f32" else f" by {self.function}"
        return f"{_at_offset(self.c, self.c_offset)}{list(self.c_strides)} = {product}{epilogue}{library}"


@dataclass(frozen=True)
class ConvCall:
    """out = activation(alpha * conv2d(x, weight) + bias) + residual (with `activation_after_residual`,
    activation(alpha * conv2d(x, weight) + bias + residual)) by a conv2d kernel of the GEMM library
    (`function`, tg_conv2d_f32's contract in gemm.h): float32, NCHW, groups 1, every array contiguous but the output,
    whose images may lie `out_image_stride` elements apart (0: contiguous); x (batch, channels, height, width),
    weight (out_channels, channels, *kernel), a bias per output channel, the residual and out (batch, out_channels,
    *out_size). `x`, `weight`, `bias` and `out` start their `*_offset` elements into their buffers; padding is
    (height, width), the same before and after."""

    batch: int
    channels: int
    height: int
    width: int
    out_channels: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    x: str
    weight: str
    out: str
    function: str
    x_offset: int = 0
    weight_offset: int = 0
    bias: str | None = None
    bias_offset: int = 0
    residual: str | None = None
    alpha: float = 1.0
    activation: str = "none"
    out_offset: int = 0  # elements of `out`'s buffer before the result starts (its slice of a concatenation)
    activation_after_residual: bool = False
    out_image_stride: int = 0
    prepared: str | None = None  # the Winograd kernel's weights transformed (tg_winograd_weights_f32)
    residual_over_output: bool = False  # `function` reads each element's residual before writing it (gemm.h)

    @property
    def out_stride(self) -> int:
        """Elements from one output image to the next."""
        return self.out_image_stride or self.out_channels * math.prod(self.out_size)

    def __repr__(self) -> str:
        geometry = (f"{self.batch}x{self.channels}x{self.height}x{self.width} -> {self.out_channels}, kernel "
                    f"{list(self.kernel)}, stride {list(self.stride)}, padding {list(self.padding)}, dilation "
                    f"{list(self.dilation)}")
        conv = f"{self.alpha!r} * conv" if self.alpha != 1.0 else "conv"
        parts = [f"{conv}[{geometry}]({_at_offset(self.x, self.x_offset)}, "
                 f"{_at_offset(self.weight, self.weight_offset)})"]
        parts += [_at_offset(self.bias, self.bias_offset)] if self.bias else []
        text = _activated(parts, self.activation, self.residual, self.activation_after_residual)
        contiguous = self.out_channels * math.prod(self.out_size)
        apart = f"[images {self.out_stride} apart]" if self.out_stride != contiguous else ""
        return f"{_at_offset(self.out, self.out_offset)}{apart} = {text} by {self.function}"

    def adds_in_place(self, donor: str, output: str) -> bool:
        """Whether `output` may take the bytes of `donor`, the residual it adds, element for element: `function`
        reads each element's residual before it writes the element, and the output fills its own buffer."""
        contiguous = self.out_channels * math.prod(self.out_size)
        return (self.residual_over_output and self.residual == donor and self.out == output and self.out_offset == 0
                and self.out_stride == contiguous and donor not in (self.x, self.weight, self.bias, self.prepared))

    @property
    def flops(self) -> float:
        """Multiply-adds of the direct algorithm, twice."""
        return 2.0 * self.batch * self.out_channels * self.channels * math.prod(self.kernel) * math.prod(
            self.out_size)

    @property
    def out_size(self) -> tuple[int, int]:
        return tuple((size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1  # type: ignore[return-value]
                     for size, kernel, stride, pad, dilation in zip((self.height, self.width), self.kernel,
                                                                     self.stride, self.padding, self.dilation))


@dataclass(frozen=True)
class StridedOperand:
    """An array read in place: element (b, h, i[, j]) at buffer[offset + b*strides[0] + h*strides[1] + ...], the
    last axis not listed when its stride is 1."""

    buffer: str
    offset: int
    strides: tuple[int, ...]

    def __repr__(self) -> str:
        return f"{_at_offset(self.buffer, self.offset)}{list(self.strides)}"


@dataclass(frozen=True)
class AttentionCall:
    """Fused scaled-dot-product attention by `tensorgraphs.kernels.attention` (attention.h), float32, over
    `batch` x `heads` problems of `queries` queries and `keys` keys, head dims `dim` (q, k) and `value_dim` (v).

    Forward: writes `out` and `lse` (each may be None: not wanted). Backward: reads `out`, `lse` and `dout`
    and writes `dq`, `dk`, `dv` (those not None). Outputs are contiguous buffers. `mask_kind` is "none",
    "bool" or "add" (attention.h). `bf16`: the tile products on bfloat16 values (the kernel's bf16 variant)."""

    batch: int
    heads: int
    queries: int
    keys: int
    dim: int
    value_dim: int
    q: StridedOperand
    k: StridedOperand
    v: StridedOperand
    mask: StridedOperand | None
    mask_kind: str
    causal: bool
    scale: float
    backward: bool
    bf16: bool = False
    out: str | None = None
    lse: str | None = None
    dout: StridedOperand | None = None
    dq: str | None = None
    dk: str | None = None
    dv: str | None = None

    def __repr__(self) -> str:
        operands = [f"{name}={getattr(self, name)!r}" for name in ("q", "k", "v", "mask", "dout")
                    if getattr(self, name) is not None]
        flags = f"{self.mask_kind} mask{', causal' if self.causal else ''}, scale {self.scale!r}"
        flags += ", bfloat16 products" if self.bf16 else ""
        sizes = f"[{self.batch}x{self.heads}x{self.queries}x{self.keys}]"
        if self.backward:
            written = ", ".join(f"{name}={getattr(self, name)}" for name in ("dq", "dk", "dv") if getattr(self, name))
            return (f"{written} = attention_backward{sizes}({', '.join(operands)}, out={self.out}, lse={self.lse}; "
                    f"{flags})")
        written = ", ".join(f"{name}={getattr(self, name)}" for name in ("out", "lse") if getattr(self, name))
        return f"{written} = attention{sizes}({', '.join(operands)}; {flags})"

    @property
    def flops(self) -> float:
        """Multiply-adds of the attention's matrix products, twice: forward q k^T and p v; backward the products of
        their gradients (dp = dout v^T, and dv, dk, dq where written), not the scores the kernel computes again.
        Half of them when causal."""
        qk, pv = self.dim, self.value_dim
        per_score = (qk + pv if not self.backward else
                     pv + (pv if self.dv else 0) + (qk if self.dk else 0) + (qk if self.dq else 0))
        return 2.0 * self.batch * self.heads * self.queries * self.keys * per_score * (0.5 if self.causal else 1.0)


@dataclass(frozen=True)
class HostCall:
    """`output` = `function`(`sources`), computed by a function of the running process that the program calls
    back (`runtime.host_calls`: a collective across processes); each source is a contiguous array of its
    `sizes` entry, the output a vector of their total size. `after` is read by nothing: a buffer the call must
    wait for (the previous collective, so every process issues them in the same order). A failing function
    stops the program (`TG_HOST_FAILED`). `placement` "early" marks a call that starts work going on after it
    returns (run it as soon as its sources exist), "late" one that waits for such work (run it, and what reads
    its result, as late as possible): the kernels between run while the work proceeds (`memory.order`)."""

    function: str
    sources: tuple[str, ...]
    sizes: tuple[int, ...]
    output: str
    after: str | None = None
    placement: str = ""

    def __repr__(self) -> str:
        after = f", after {self.after}" if self.after else ""
        placed = f" ({self.placement})" if self.placement else ""
        return f"{self.output}[{sum(self.sizes)}] = host {self.function}({', '.join(self.sources)}{after}){placed}"


@dataclass(frozen=True)
class NativeCall:
    """A call of a kernel library's C function `function` (`tensorgraphs.kernels.LIBRARIES`) whose arguments are
    `args` in order: a str is a buffer (passed as its array, from the element `offsets` gives for its position, if
    any), None a NULL pointer, a number a literal (a float as float32). What it reads and writes is its kernel's
    parameters."""

    function: str
    args: tuple[str | int | float | None, ...]
    offsets: tuple[tuple[int, int], ...] = ()  # (argument position, elements)

    def __repr__(self) -> str:
        offset = dict(self.offsets)
        args = [f"{arg!r} + {offset[i]}" if offset.get(i) else repr(arg) for i, arg in enumerate(self.args)]
        return f"{self.function}({', '.join(args)})"


@dataclass(frozen=True)
class FftCall:
    """`y` = the unnormalized transform `kind` ("c2c", "r2c", "c2r" or "stft", `kernels.fft` C_FUNCTIONS) of
    length `n` of each of the `batch` contiguous rows of `x`, float32, complex values as (re, im) pairs (fft.h).
    "stft" transforms the `frames` frames, `hop` apart, of each of `batch` signals of `length` samples reflected
    `pad` samples beyond each end, times `window`."""

    kind: str
    batch: int
    n: int
    inverse: bool
    x: str
    y: str
    window: str | None = None
    frames: int = 1
    hop: int = 0
    length: int = 0
    pad: int = 0

    def __repr__(self) -> str:
        direction = " inverse" if self.inverse else ""
        framing = f", {self.frames} frames hop {self.hop} pad {self.pad}, window {self.window}"
        framing = framing if self.kind == "stft" else ""
        return f"{self.y} = fft.{self.kind}[{self.batch}x{self.n}{direction}]({self.x}{framing})"


LIBRARY_CALLS = (GemmCall, ConvCall, AttentionCall, HostCall, NativeCall, FftCall)
"""Statements that call a hand-written kernel library or the host: a whole kernel's work, never a cheap
elementwise pass (nor one to run twice)."""

Stmt = (Let | Load | Store | Loop | Reduce | Accumulate | Local | TransposeLocal | GemmCall | ConvCall | AttentionCall
        | HostCall | NativeCall | FftCall)


@dataclass
class KernelParam:
    """A kernel parameter: one array of the program."""

    name: str
    dtype: DType
    size: int
    writes: bool


REDUCTION_LANES = 16
"""Independent partial results a reduction's inner loop keeps by default: one AVX-512 register of float32."""


@dataclass(frozen=True)
class ScheduleOptions:
    """How a target runs a kernel, never what it computes: every choice gives the same values.

    `threads` split grid axis 0 (0: as the lowering marked it, every thread above its work threshold; 1: every
    loop in order on the calling thread; n: every top-level loop on n threads, unless the kernel is `serial`);
    `collapse` 2 splits the two outermost loops together (a short outer loop over a perfectly nested one);
    `unroll` is applied to the innermost loops that run in order (0: the compiler decides); `vector_bits` is the
    vector width the compiler should prefer (0: its default for the CPU); `lanes` are the independent partial
    results a reduction's inner loop keeps. The lowering leaves the defaults; `plan.kernel_search` measures
    others (`schedule.options.with_options` applies them)."""

    threads: int = 0
    collapse: int = 1
    unroll: int = 0
    vector_bits: int = 0
    lanes: int = REDUCTION_LANES

    def __str__(self) -> str:
        changed = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                   if getattr(self, f.name) != f.default]
        return " ".join(changed) or "default"

    @classmethod
    def parse(cls, text: str) -> ScheduleOptions:
        """The options `str` spelled (how the kernel database stores them)."""
        pairs = [] if text == "default" else [item.split("=") for item in text.split()]
        return cls(**{name: int(value) for name, value in pairs})


@dataclass
class Kernel:
    """One kernel: its parameters and body; `serial` when its iterations must run in order (a scatter-add's
    accumulating stores, a scan), and the `options` it is rendered with. A kernel that `prepares` computes another
    kernel's operand in a form of its own (the Winograd transform of conv weights): where what it reads stays the
    same from call to call (parameters), a program keeps its result and runs it again only when that changes, however
    many bytes it writes (`schedule.prepared`, which keeps other such kernels only where they write no more than
    they read)."""

    name: str
    buffers: list[KernelParam]
    body: list[Stmt]
    serial: bool = False
    options: ScheduleOptions = ScheduleOptions()
    prepares: bool = False

    def __str__(self) -> str:
        params = ", ".join(f"{'out ' if b.writes else ''}{b.name}: {b.dtype.name}[{b.size}]" for b in self.buffers)
        notes = ("serial " if self.serial else "") + ("" if self.options == ScheduleOptions() else f"[{self.options}]")
        return f"kernel {self.name}({params}){' ' + notes.strip() if notes else ''}\n" + "\n".join(
            format_stmts(self.body, 1))


def format_stmts(stmts: list[Stmt], depth: int) -> list[str]:
    """Readable listing (TG_DEBUG=schedule, test failures)."""
    pad = "  " * depth
    lines = []
    for stmt in stmts:
        if isinstance(stmt, Loop):
            unrolled = f" (unroll {stmt.unroll})" if stmt.unroll else ""
            lines.append(f"{pad}{f'{stmt.parallel} ' if stmt.parallel else ''}for {stmt.var.name} < {stmt.var.extent}:"
                         f"{unrolled}")
            lines += format_stmts(stmt.body, depth + 1)
        elif isinstance(stmt, Reduce):
            lines.append(f"{pad}{stmt.acc}: {stmt.dtype.name} = reduce {stmt.op.name}:")
            lines += format_stmts(stmt.body, depth + 1)
        else:
            lines.append(pad + repr(stmt))
    return lines


def walk(body: list[Stmt]) -> Iterator[Stmt]:
    """Every statement of `body`, those inside loops and reductions included, in order."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (Loop, Reduce)):
            yield from walk(stmt.body)


BUFFER_FIELDS: dict[type, tuple[str, ...]] = {
    Load: ("buffer",),
    Store: ("buffer",),
    GemmCall: ("a", "b", "c"),
    GemmEpilogue: ("bias", "residual"),
    ConvCall: ("x", "weight", "out", "bias", "residual", "prepared"),
    StridedOperand: ("buffer",),
    AttentionCall: ("out", "lse", "dq", "dk", "dv"),
    HostCall: ("output", "after"),
    FftCall: ("x", "y", "window"),
}
"""The fields of loop IR statements that name a buffer."""


def rename_buffer(stmt: Any, old: str, new: str) -> Any:
    """`stmt` (and the statements inside it) naming buffer `new` wherever it named `old`."""
    if isinstance(stmt, (Load, Store)):  # most statements of a kernel: answered first
        return dataclasses.replace(stmt, buffer=new) if stmt.buffer == old else stmt
    if isinstance(stmt, (Let, Accumulate, Local, TransposeLocal)):
        return stmt
    if isinstance(stmt, (Loop, Reduce)):
        return dataclasses.replace(stmt, body=[rename_buffer(s, old, new) for s in stmt.body])
    changes: dict[str, Any] = {name: new for name in BUFFER_FIELDS.get(type(stmt), ()) if getattr(stmt, name) == old}
    if isinstance(stmt, GemmCall):
        changes["epilogue"] = rename_buffer(stmt.epilogue, old, new)
    if isinstance(stmt, NativeCall) and old in stmt.args:
        changes["args"] = tuple(new if arg == old else arg for arg in stmt.args)
    if isinstance(stmt, HostCall) and old in stmt.sources:
        changes["sources"] = tuple(new if name == old else name for name in stmt.sources)
    if isinstance(stmt, AttentionCall):
        changes.update({name: rename_buffer(operand, old, new) for name in ("q", "k", "v", "mask", "dout")
                        if (operand := getattr(stmt, name)) is not None})
    return dataclasses.replace(stmt, **changes) if changes else stmt


@dataclass(frozen=True)
class BufferView:
    """A buffer whose elements live in another, `base` (of `size` elements): element `i` of the buffer (its row-major
    offset over `shape`) is base[offset + the dot product of its multi-index with `strides`]. Kernels write and read
    the buffer through the view (`written_through`) instead of in bytes of its own (a conv writing its slice of a
    concatenation)."""

    base: str
    size: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def runs(self) -> list[tuple[int, int]]:
        """(size, stride) of each run of axes the view keeps contiguous, outermost first (axes of size 1 left out)."""
        merged: list[tuple[int, int]] = []
        for size, stride in zip(self.shape, self.strides):
            if size == 1:
                continue
            if merged and merged[-1][1] == size * stride:
                merged[-1] = (merged[-1][0] * size, stride)
            else:
                merged.append((size, stride))
        return merged

    @property
    def contiguous(self) -> bool:
        """Whether the view is one contiguous block of `base` (then a library call writes it through a pointer)."""
        return all(stride == 1 for _, stride in self.runs())

    def place(self, element: int) -> int:
        """Where element `element` of the viewed buffer lives in `base` (`at` for a known index)."""
        where = self.offset
        for size, stride in reversed(self.runs()):
            element, part = divmod(element, size)
            where += part * stride
        return where

    def blocks(self, offset: int, stride: int, count: int, size: int) -> tuple[int, int] | None:
        """(offset, stride) in `base` of the `count` blocks of `size` elements `stride` apart from element `offset`
        of the viewed buffer (a conv's output images), where each is contiguous there and they lie equally far
        apart; else None. (A view of a slice is increasing: a block whose ends lie `size - 1` apart is contiguous.)"""
        starts = [self.place(offset + i * stride) for i in range(count)]
        if any(self.place(offset + i * stride + size - 1) - start != size - 1 for i, start in enumerate(starts)):
            return None
        apart = {later - start for start, later in zip(starts, starts[1:])}
        return (starts[0], apart.pop() if apart else stride) if len(apart) <= 1 else None

    def at(self, index: Expr) -> Expr:
        """Where element `index` of the viewed buffer lives in `base`."""
        runs = self.runs()
        if self.contiguous:
            return add(index, self.offset)
        place = as_expr(self.offset)
        for part, (_, stride) in zip(unflatten(index, tuple(size for size, _ in runs)), runs):
            place = add(place, mul(part, stride))
        return place


OFFSET_FIELDS: dict[type, dict[str, str]] = {
    GemmCall: {"a": "a_offset", "b": "b_offset", "c": "c_offset"},
    GemmEpilogue: {"bias": "bias_offset"},
    ConvCall: {"x": "x_offset", "weight": "weight_offset", "bias": "bias_offset", "out": "out_offset"},
}
"""The buffer fields of library calls that start some elements into their buffer (and the field saying how many):
such an operand may be a contiguous `BufferView`, an output written in blocks (`_written_blocks`) one that keeps
each block contiguous."""


def _written_blocks(stmt: Any, field_name: str) -> tuple[int, int, int] | None:
    """(count, size, stride) of the blocks of contiguous elements that the output `field_name` of library call
    `stmt` covers: a conv's images, a product's whole result where its rows and batches follow one another; None
    where it is not so known."""
    if isinstance(stmt, ConvCall) and field_name == "out":
        return stmt.batch, stmt.out_channels * math.prod(stmt.out_size), stmt.out_stride
    if isinstance(stmt, GemmCall) and field_name == "c" and stmt.c_strides[1] == stmt.n and (
            stmt.batch == 1 or stmt.c_strides[0] == stmt.m * stmt.n):
        return 1, stmt.batch * stmt.m * stmt.n, 0
    return None


def _through_view(stmt: Any, name: str, view: BufferView) -> Any:
    """`stmt` addressing `view.base` where it addressed buffer `name`; None where it cannot."""
    if isinstance(stmt, (Load, Store)):
        return dataclasses.replace(stmt, buffer=view.base, index=view.at(stmt.index)) if stmt.buffer == name else stmt
    if isinstance(stmt, (Loop, Reduce)):
        body = [_through_view(s, name, view) for s in stmt.body]
        return None if None in body else dataclasses.replace(stmt, body=body)
    if rename_buffer(stmt, name, view.base) == stmt:  # does not name it
        return stmt
    offsets = OFFSET_FIELDS.get(type(stmt), {})
    changes: dict[str, Any] = {}
    for field_name in BUFFER_FIELDS.get(type(stmt), ()):
        if getattr(stmt, field_name) != name:
            continue
        if field_name not in offsets:
            return None
        offset, blocks = getattr(stmt, offsets[field_name]), _written_blocks(stmt, field_name)
        if blocks is None:
            if not view.contiguous:
                return None
            changes[offsets[field_name]] = offset + view.offset
        else:
            count, size, stride = blocks
            if (placed := view.blocks(offset, stride, count, size)) is None:
                return None
            changes[offsets[field_name]] = placed[0]
            if isinstance(stmt, ConvCall):
                changes["out_image_stride"] = placed[1]
        changes[field_name] = view.base
    if isinstance(stmt, GemmCall):
        changes["epilogue"] = _through_view(stmt.epilogue, name, view)
    changed = dataclasses.replace(stmt, **changes)
    return None if None in changes.values() or rename_buffer(changed, name, "") != changed else changed


def written_through(kernel: Kernel, name: str, view: BufferView) -> Kernel | None:
    """`kernel` storing and loading buffer `name`'s elements through `view`, in its base; None where a statement
    cannot address the view (a library call's operand without an offset, an input where the view is not one
    contiguous block, an output whose blocks it does not keep contiguous and equally far apart)."""
    body = [_through_view(stmt, name, view) for stmt in kernel.body]
    if None in body:
        return None
    touched = [b for b in kernel.buffers if b.name in (name, view.base)]
    base = KernelParam(view.base, touched[0].dtype, view.size, any(b.writes for b in touched))
    return dataclasses.replace(kernel, body=body, buffers=[*(b for b in kernel.buffers if b not in touched), base])
