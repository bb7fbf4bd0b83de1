"""`tg.compile(fn)`: trace once per input signature, then replay the compiled program on new data.

The first call with a given signature (each tensor argument's dtype and shape,
every other argument's value) runs `fn` on placeholder tensors, building its
graph, and compiles that graph for the cpu backend. Later calls bind the new
arrays to the same program: no Python runs per op or per kernel, one native
call per step.

Tensors `fn` uses that are not arguments are captured as they are when traced
(nodes are immutable: `assign` gives a tensor a new node, which the trace does
not see); pass values that change, such as parameters being trained, as
arguments. `fn` must not branch on tensor values: they are placeholders while tracing.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.backends.cpu import CPU, Program
from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.frontend.tensor import HOST, Tensor
from tensorgraphs.graph import node as g
from tensorgraphs.graph.node import Node
from tensorgraphs.graph.ops import Op
from tensorgraphs.rewrite import optimize
from tensorgraphs.runtime.buffer import Buffer
from tensorgraphs.runtime.realize import realized_values


@dataclass
class _Trace:
    program: Program
    inputs: list[Node]  # what the program reads, in order
    placeholders: dict[Node, int]  # input node -> position among the call's tensor arguments
    captured: dict[Node, np.ndarray]  # realized values the graph used (fixed: nodes are immutable)
    outputs: list[Node]
    single: bool  # fn returned one tensor, not a sequence
    compile_seconds: float = 0.0


@dataclass(frozen=True)
class CompileStats:
    """What one compiled signature costs: kernels per call, temporary bytes planned vs without reuse."""

    kernels: int
    arena_bytes: int
    naive_bytes: int
    compile_seconds: float


class CompiledFunction:
    """`fn` compiled per input signature; call it like `fn`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.traces: dict[tuple, _Trace] = {}
        self._latest: _Trace | None = None
        functools.update_wrapper(self, fn)

    @property
    def stats(self) -> CompileStats:
        """Stats of the signature traced or called most recently (call the function once first)."""
        if self._latest is None:
            fail("compile", "no stats yet: call the compiled function once so that it is traced", kind=ArgumentError)
        program = self._latest.program
        return CompileStats(program.kernel_count, program.memory.arena_bytes, program.memory.naive_bytes,
                            self._latest.compile_seconds)

    def __call__(self, *args: Any) -> Any:
        arrays = [_array_of(a) for a in args if isinstance(a, (Tensor, np.ndarray))]
        signature = tuple(("tensor", a.dtype.name, a.shape) if isinstance(a, Tensor) else
                          ("array", a.dtype.str, a.shape) if isinstance(a, np.ndarray) else ("value", repr(a))
                          for a in args)
        trace = self.traces.get(signature)
        if trace is None:
            started = time.perf_counter()
            trace = self.traces[signature] = self._trace(args)
            trace.compile_seconds = time.perf_counter() - started
        self._latest = trace
        values = []
        for node in trace.inputs:
            if node in trace.placeholders:
                values.append(arrays[trace.placeholders[node]])
            elif node in trace.captured:
                values.append(trace.captured[node])
            else:
                values.append(node.arg.data)
        results = [_wrap(array, node.dtype) for array, node in zip(trace.program.run(values), trace.outputs)]
        return results[0] if trace.single else tuple(results)

    def _trace(self, args: tuple[Any, ...]) -> _Trace:
        placeholders: dict[Node, int] = {}
        placeholder_tensors: list[Tensor] = []
        traced_args = []
        for a in args:
            if isinstance(a, (Tensor, np.ndarray)):
                dtype = a.dtype if isinstance(a, Tensor) else dtypes.from_numpy_dtype(a.dtype)
                placeholder = _wrap(np.zeros(a.shape, dtype.storage), dtype)
                placeholders[placeholder.node] = len(placeholders)
                placeholder_tensors.append(placeholder)
                traced_args.append(placeholder)
            else:
                traced_args.append(a)
        result = self.fn(*traced_args)
        for position, placeholder in enumerate(placeholder_tensors):  # requires_grad_() gives it a new buffer node
            placeholders.setdefault(placeholder.node, position)
        single = isinstance(result, Tensor)
        outputs = [result] if single else list(result) if isinstance(result, (tuple, list)) else [result]
        if not all(isinstance(t, Tensor) for t in outputs):
            fail("compile", "the compiled function must return a Tensor or a sequence of Tensors", kind=ArgumentError)
        roots = [t.node for t in outputs]
        known = {n: v for n, v in realized_values("cpu").items() if n not in placeholders}
        roots = optimize(roots, stop=known.__contains__)  # canonical form and user rules, as in realize()
        program, inputs = CPU.program(roots, known)
        captured = {n: known[n] for n in inputs if n in known and n.op is not Op.BUFFER}
        return _Trace(program, inputs, placeholders, captured, roots, single)


def _array_of(value: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(value, Tensor):
        return value._value()
    return value


def _wrap(array: np.ndarray, dtype: dtypes.DType) -> Tensor:
    return Tensor(g.buffer(Buffer(HOST, dtype, tuple(array.shape), array), dtype, tuple(array.shape)))


def compile(fn: Callable[..., Any]) -> CompiledFunction:
    """Compile `fn` (Tensors in, a Tensor or tuple of Tensors out) for the cpu backend; usable as a decorator."""
    return CompiledFunction(fn)
