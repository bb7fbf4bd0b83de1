"""The cpu target's C: the C-style renderer (`codegen.c_renderer`) with OpenMP threads, vector transposes,
streaming stores and calls of the native kernel libraries.

Grid axis 0 of a kernel carries `#pragma omp parallel for`; inner loops are plain
counted loops gcc vectorizes. Outputs larger than the last-level cache, written
once and not read back by the kernel, in short runs (a transposing tile's rows)
go to memory with streaming stores, a whole cache line at a time
(`streaming_loop`): no read-for-ownership, no eviction of data still in use.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections import Counter
from pathlib import Path

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.codegen import index as ix
from tensorgraphs.codegen.c_renderer import C_PREAMBLE, STORAGE, CStyleRenderer, literal, render_index
from tensorgraphs.codegen.loop_ir import (
    PARALLEL_MIN_WORK,
    AttentionCall,
    ConvCall,
    FftCall,
    GemmCall,
    Kernel,
    Let,
    Load,
    Local,
    Loop,
    NativeCall,
    ParallelAxis,
    Reduce,
    ScheduleOptions,
    Store,
    StridedOperand,
    TransposeLocal,
    walk,
)
from tensorgraphs.kernels import LIBRARIES, attention, fft, gemm

PREAMBLE = C_PREAMBLE + (Path(__file__).parent / "cpu_preamble.h").read_text()
"""The cpu target's: C_PREAMBLE with vector transposes and streaming stores."""
CACHE_LINE = 64
"""Bytes per streaming store (`tg_stream_line`), and the alignment of staging arrays."""


def _last_level_cache_bytes() -> int:
    """The largest CPU cache of this machine (32 MiB when the system does not say)."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes, default=32 << 20)


STREAM_MIN_BYTES = _last_level_cache_bytes()
"""Outputs at least this large are written with streaming stores: no later kernel would find them in a cache, so
reading each line before overwriting it (read-for-ownership), and evicting useful data for it, only cost time."""

STREAM_MAX_RUN_BYTES = 1024
"""Only short contiguous runs of stores are streamed (a transposing tile's rows): the core already hides the
read-for-ownership of a long sequential store stream (figures: bench/NOTES.md)."""

def streamed_buffers(kernel: Kernel) -> set[str]:
    """Outputs of `kernel` written with streaming stores: at least STREAM_MIN_BYTES, written by one plain store
    and never read by the kernel (so a line holds nothing the kernel needs before it is written whole)."""
    large = {b.name for b in kernel.buffers if b.writes and b.size * np.dtype(b.dtype.storage).itemsize
             >= STREAM_MIN_BYTES}
    stores = Counter(s.buffer for s in walk(kernel.body) if isinstance(s, Store))
    excluded = {s.buffer for s in walk(kernel.body) if isinstance(s, Load) or (isinstance(s, Store) and s.accumulate)}
    return {name for name in large if stores[name] == 1 and name not in excluded}


class CpuRenderer(CStyleRenderer):
    """The cpu target: gcc's C with OpenMP threads, vector transposes, streaming stores of large outputs and
    calls of the native kernel libraries (GEMM, fused attention)."""

    preamble = PREAMBLE
    kernel_qualifier = '#define TG_KERNEL __attribute__((visibility("hidden")))\n'
    local_qualifier = f" __attribute__((aligned({CACHE_LINE})))"
    reduce_hint = "#pragma omp simd"  # without it gcc leaves the NaN-propagating max scalar

    def streamed_buffers(self, kernel: Kernel) -> set[str]:
        return streamed_buffers(kernel)

    def kernel_end(self) -> list[str]:
        """A serial kernel's streaming stores (or the calling thread's) are fenced before it returns."""
        return ["    tg_stream_fence();"] if self.streamed else []

    def loop(self, loop: Loop, depth: int) -> list[str]:
        streamed = self.streamed_store(loop)
        inner = loop.body[0] if len(loop.body) == 1 else None
        if loop.parallel and loop.parallel.nested > 1 and isinstance(inner, Loop) and self.streamed_store(inner):
            # a streamed loop has statements around it: OpenMP cannot split it together with the loop outside
            loop = dataclasses.replace(loop, parallel=dataclasses.replace(loop.parallel, nested=1))
        return super().loop(loop, depth) if streamed is None else self.streaming_loop(loop, streamed, depth)

    def unroll_hint(self, unroll: int) -> list[str]:
        return [f"#pragma GCC unroll {unroll}"]

    def function_attributes(self, options: ScheduleOptions) -> str:
        return f'__attribute__((target("prefer-vector-width={options.vector_bits}"))) ' if options.vector_bits else ""

    def transpose(self, stmt: TransposeLocal, pad: str) -> list[str]:
        return [f"{pad}tg_transpose_tile{stmt.side}({stmt.name});"]

    def library_call(self, call: GemmCall | ConvCall | AttentionCall | NativeCall | FftCall) -> str:
        if isinstance(call, NativeCall):
            return native_call(call, self.array)
        if isinstance(call, FftCall):
            return fft_call(call, self.array)
        if isinstance(call, GemmCall):
            return gemm_call(call, self.array)
        return conv_call(call, self.array) if isinstance(call, ConvCall) else attention_call(call, self.array)

    @classmethod
    def includes(cls, kernels: list[Kernel]) -> str:
        headers = sorted({LIBRARIES[function].header for function in library_functions(kernels)})
        return "".join(f'#include "{header}"\n' for header in headers)

    @classmethod
    def libraries(cls, kernels: list[Kernel]) -> list[Path]:
        return sorted({LIBRARIES[function].path() for function in library_functions(kernels)})

    def parallel(self, loop: list[str], parallel: ParallelAxis | None, pad: str) -> list[str]:
        """`loop` split across OpenMP threads when it is grid axis 0 (other axes run in order inside a thread), with
        the loop nested in it when the axis says so: on the options' number of threads where they set one, else
        where its work is at least PARALLEL_MIN_WORK. A kernel that streams fences in each thread. Where sizes are
        read at run time the work is compared there, with the loop written both ways: an OpenMP `if` clause would
        still start a team of one (bench/NOTES.md)."""
        if parallel is None or parallel.axis != 0:
            return loop
        threads = self.kernel.options.threads
        by_work = threads <= 1  # threads 1 never marks a loop parallel (schedule.options)
        if by_work and parallel.work < PARALLEL_MIN_WORK and not self.sizes_at_run_time:
            return loop
        clauses = "schedule(static)" + (f" collapse({parallel.nested})" if parallel.nested > 1 else "")
        team = f" num_threads({threads})" if threads > 1 else ""
        if not self.streamed:
            split = [f"{pad}#pragma omp parallel for {clauses}{team}", *loop]
        else:
            split = [f"{pad}#pragma omp parallel{team}", pad + "{", f"{pad}#pragma omp for {clauses}", *loop,
                     f"{pad}tg_stream_fence();", pad + "}"]
        if not (by_work and self.sizes_at_run_time):
            return split
        inner = [f"    {line}" for line in split], [f"    {line}" for line in loop]
        return [f"{pad}if ({parallel.work} >= {PARALLEL_MIN_WORK}) {{", *inner[0], f"{pad}}} else {{", *inner[1],
                f"{pad}}}"]

    def streamed_store(self, loop: Loop) -> Store | None:
        """The store of an innermost `loop` to a streamed buffer, when it writes whole lines in a short run:
        contiguous along the loop, one line to STREAM_MAX_RUN_BYTES per run, its position known before the loop
        starts."""
        if any(isinstance(s, (Loop, Reduce, Local, TransposeLocal)) for s in loop.body):
            return None
        stores = [s for s in loop.body if isinstance(s, Store) and s.buffer in self.streamed]
        if len(stores) != 1:  # none, or several outputs (a kernel storing riders): plain stores
            return None
        (store,) = stores
        run = loop.var.extent * np.dtype(self.element_dtype[store.buffer].storage).itemsize
        defined_inside = {s.name for s in loop.body if isinstance(s, (Let, Load))}
        if (ix.stride(store.index, loop.var) != 1 or not CACHE_LINE <= run <= STREAM_MAX_RUN_BYTES
                or ix.symbols(store.index) & defined_inside):
            return None
        return store

    def streaming_loop(self, loop: Loop, store: Store, depth: int) -> list[str]:
        """`loop` as whole cache lines, each computed into an aligned staging array and streamed to memory, and
        the elements before the first line boundary and after the last whole line with plain stores."""
        pad, v, n = "    " * depth, loop.var.name, loop.var.extent
        dtype = self.element_dtype[store.buffer]
        per_line = CACHE_LINE // np.dtype(dtype.storage).itemsize
        target, staged = self.array[store.buffer], f"{v}_staged"
        self.element_type[staged], self.element_dtype[staged] = STORAGE[dtype], dtype
        line_start = ix.Var(f"{v}_line", n)
        to_staging = [Store(staged, loop.var - line_start, store.value) if s is store else s for s in loop.body]
        lines_loop = [
            f"{pad}for (int64_t {v}_line = {v}_head; {v}_line < {v}_end; {v}_line += {per_line}) {{",
            f"{pad}    {STORAGE[dtype]} {staged}[{per_line}] __attribute__((aligned({CACHE_LINE})));",
            f"{pad}    for (int64_t {v} = {v}_line; {v} < {v}_line + {per_line}; {v}++) {{",
            *self.block(to_staging, depth + 2),
            f"{pad}    }}",
            f"{pad}    tg_stream_line(&{target}[{render_index(ix.substitute(store.index, loop.var, line_start))}], "
            f"{staged});",
            f"{pad}}}",
        ]
        first = render_index(ix.substitute(store.index, loop.var, ix.Const(0)))
        return [
            f"{pad}const int64_t {v}_head = tg_stream_head(&{target}[{first}], {n}, sizeof({target}[0]));",
            f"{pad}const int64_t {v}_end = {v}_head + ({n} - {v}_head) / {per_line} * {per_line};",
            *self.parallel(lines_loop, loop.parallel, pad),
            f"{pad}for (int64_t {v}_rest = 0; {v}_rest < {n} - ({v}_end - {v}_head); {v}_rest++) {{",
            f"{pad}    const int64_t {v} = {v}_rest < {v}_head ? {v}_rest : {v}_rest - {v}_head + {v}_end;",
            *self.block(loop.body, depth + 1),
            f"{pad}}}",
        ]


def gemm_call(call: GemmCall, array: dict[str, str]) -> str:
    """The GEMM library call with its fused epilogue; arguments are checked when the schedule is built, so the
    status it returns is always 0."""
    sizes = [call.batch, call.m, call.n, call.k]
    epilogue = call.epilogue
    pointer = functools.partial(c_pointer, array)
    no_bias = ["NULL", 0, 0, 0]
    bias = [pointer(epilogue.bias, epilogue.bias_offset), *epilogue.bias_strides] if epilogue.bias else no_bias
    residual = ([pointer(epilogue.residual, epilogue.residual_offset), *epilogue.residual_strides]
                if epilogue.residual else ["NULL", 0, 0])
    a, b = pointer(call.a, call.a_offset), pointer(call.b, call.b_offset)
    args = [*sizes, a, *call.a_strides, b, *call.b_strides, pointer(call.c, call.c_offset), *call.c_strides,
            literal(epilogue.alpha, dtypes.float32), *bias, *residual,
            gemm.epilogue_code(epilogue.activation, epilogue.activation_after_residual),
            gemm.ACTIVATIONS[call.a_prologue], gemm.ACTIVATIONS[call.b_prologue]]
    return f"(void){call.function}({', '.join(map(str, args))});"


def c_pointer(array: dict[str, str], name: str | None, offset: int = 0) -> str:
    """A library call's pointer argument: buffer `name`'s array from element `offset` on (NULL for None)."""
    return "NULL" if name is None else f"{array[name]} + {offset}" if offset else array[name]


def conv_call(call: ConvCall, array: dict[str, str]) -> str:
    """A conv2d kernel's call with its fused epilogue (tg_conv2d_f32's arguments, gemm.h); arguments are checked when
    the schedule is built, so its status is 0 unless scratch memory ran out."""

    pointer = functools.partial(c_pointer, array)
    args = [call.batch, call.channels, call.height, call.width, call.out_channels, *call.kernel, *call.stride,
            *call.padding, *call.dilation, pointer(call.x, call.x_offset), pointer(call.weight, call.weight_offset),
            pointer(call.bias, call.bias_offset), pointer(call.out, call.out_offset), call.out_stride,
            literal(call.alpha, dtypes.float32), pointer(call.residual),
            gemm.epilogue_code(call.activation, call.activation_after_residual)]
    if call.prepared is not None:
        args.append(pointer(call.prepared))
    return f"(void){call.function}({', '.join(map(str, args))});"


def library_functions(kernels: list[Kernel]) -> set[str]:
    """The native libraries' C functions the program calls (it is linked against their libraries)."""
    return {function for kernel in kernels for stmt in kernel.body for function in _called(stmt)}


def _called(stmt: object) -> tuple[str, ...]:
    if isinstance(stmt, (GemmCall, ConvCall)):
        return (stmt.function,)
    if isinstance(stmt, AttentionCall):
        return (_attention_function(stmt),)
    if isinstance(stmt, NativeCall):
        return (stmt.function,)
    if isinstance(stmt, FftCall):
        return (fft.C_FUNCTIONS[stmt.kind],)
    return ()


def _attention_function(call: AttentionCall) -> str:
    return attention.C_FUNCTIONS[attention.function_name(call.backward, call.bf16)]


def native_call(call: NativeCall, array: dict[str, str]) -> str:
    """A library function called with buffers, NULLs and literals (its status is 0 unless memory ran out)."""

    offset = dict(call.offsets)

    def argument(position: int, arg: str | int | float | None) -> str:
        if arg is None or isinstance(arg, str):
            return c_pointer(array, arg, offset.get(position, 0))
        return literal(arg, dtypes.float32) if isinstance(arg, float) else str(arg)

    return f"(void){call.function}({', '.join(itertools.starmap(argument, enumerate(call.args)))});"


def attention_call(call: AttentionCall, array: dict[str, str]) -> str:
    """The fused attention library call (attention.h); its status is 0 unless scratch memory ran out."""

    def operand(given: StridedOperand) -> list[object]:
        return [c_pointer(array, given.buffer, given.offset), *given.strides]

    output = functools.partial(c_pointer, array)

    mask = operand(call.mask) if call.mask else ["NULL", 0, 0, 0, 0]
    mask_struct = f"(tg_attention_mask){{{', '.join(map(str, mask))}, {attention.MASK_KINDS[call.mask_kind]}}}"
    args = [call.batch, call.heads, call.queries, call.keys, call.dim, call.value_dim, *operand(call.q),
            *operand(call.k), *operand(call.v), mask_struct, int(call.causal), literal(call.scale, dtypes.float32)]
    if call.backward:
        assert call.out and call.lse and call.dout
        args += [array[call.out], array[call.lse], *operand(call.dout), *map(output, (call.dq, call.dk, call.dv))]
    else:
        args += [output(call.out), output(call.lse)]
    return f"(void){_attention_function(call)}({', '.join(map(str, args))});"


def fft_call(call: FftCall, array: dict[str, str]) -> str:
    """The FFT library call (fft.h); its status is 0 unless scratch memory ran out."""
    if call.kind == "stft":
        args = [call.batch, call.length, call.frames, call.n, call.hop, call.pad, array[call.x],
                array[call.window] if call.window else "NULL", array[call.y]]
    else:
        args = [call.batch, call.n, *([int(call.inverse)] if call.kind == "c2c" else []), array[call.x], array[call.y]]
    return f"(void){fft.C_FUNCTIONS[call.kind]}({', '.join(map(str, args))});"
