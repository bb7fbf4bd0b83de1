"""`tg.compile(fn)`: trace once per input signature, then replay the compiled program on new data (of a module:
`nn.compiled_module`).

The first call with a given signature (each tensor argument's dtype, shape and
requires_grad, each number argument's type, every other argument's value, the
keywords used, the grad mode, the autocast region) runs `fn` on placeholders, building its graph,
and compiles that graph for the current device where it compiles to native code (`cpu`, `portable`), else
for `cpu`. Later calls bind the new arrays
to the same program: no Python runs per op or per kernel, one native call per
step. Python numbers are program inputs too,
read at every call, unless `fn` uses one as a value (a shape, a branch): that
trace then holds for that value only.

A training step compiles whole: what `fn` assigns (parameters and optimizer
state through `optimizer.step()`, module buffers) and the `.grad` that
`backward()` and `zero_grad()` leave are recorded while tracing
(`runtime.tracing`) and become part of the program: the tensors' current values
are read at every call and their new values written back after it, as fresh
buffers (references held elsewhere stay valid). The learning rate is read at
every call, so schedulers work; other hyperparameters are fixed when traced.

Tensors `fn` reads that are not arguments (parameters, module buffers,
gradients, closures) are read from the tensor at every call too, so the program
sees weights trained or loaded since. A leaf `fn` makes from an argument
(`x.detach().requires_grad_()`) reads the argument. `fn` must not read tensor
values (placeholders while tracing) or branch on them.

`steps(*stacked)` runs K calls in ONE native call: each tensor argument has a
leading axis of K, one slice fed per step (the seed's Feeder); state carries
from step to step inside the call; the results come back stacked (its Receiver).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import operator
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.backends.native import (
    Binder,
    Binding,
    Changes,
    NativeBackend,
    Program,
    every_input,
    run_explained,
)
from tensorgraphs.dynamic import DynamicShapes, DynamicSpec, NotAnInstance, RenderedSource, parameter_names
from tensorgraphs.errors import ArgumentError, TGError, UnsupportedError, fail
from tensorgraphs.frontend.autocast import AutocastState, autocast_state
from tensorgraphs.frontend.grad_mode import is_grad_enabled
from tensorgraphs.frontend.inplace_ops import overwritten
from tensorgraphs.frontend.tensor import Tensor, host_buffer
from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.graph.ops import Op
from tensorgraphs.plan.choices import planning_for
from tensorgraphs.rewrite import optimize
from tensorgraphs.runtime import differentiable, tracing
from tensorgraphs.runtime.buffer import DEAD_REFERENCE
from tensorgraphs.runtime.realize import BACKENDS, default_device, graph_without_data, realized_values

Reader = Callable[[list[Any]], np.ndarray]
"""How one program input gets its array at a call, from the call's arguments (tensors as arrays)."""


@dataclass
class _State:
    """A tensor the traced function changes: read from `input_index` (if the program reads it), written from
    `output_index`. `kind` says what to rebind: the tensor itself ("value") or its gradient ("grad")."""

    tensor: Tensor
    kind: str
    output_index: int | None  # None: the gradient ends up cleared
    input_index: int | None = None
    written: Node | None = None  # the node the last call gave the tensor, when its array is updated in place
    argument: int | None = None  # kind "argument": the position of the argument written in place


@dataclass
class _Trace:
    program: Program
    roots: list[Node]  # the graph it computes, for errors (`run_explained`)
    inputs: list[Node]  # the nodes whose arrays it takes, in order
    readers: list[Reader]  # one per program input, in order
    result_dtypes: list[dtypes.DType]  # of fn's results, the program's first outputs (state outputs follow)
    states: list[_State]
    grads_present: tuple[tuple[Tensor, bool], ...]  # the gradients the trace read or replaced, as present then
    modes: tuple[tuple[Any, bool], ...]  # the modules called, and whether they were in training mode
    single: bool  # fn returned one tensor, not a sequence
    live_order: tuple[int, ...]  # the program inputs read live (random keys), in the order fn made them
    grad_enabled: bool  # the grad mode traced in (under no_grad the graph has no gradient paths)
    fixed_numbers: tuple[tuple[int, int | float], ...] = ()  # (position, value): number arguments used as values
    results_graph: differentiable.ResultGraph | None = None  # for results autograd can differentiate
    conditions: tuple[Callable[[], bool], ...] = ()  # `tracing.note_condition`: the trace holds while all do
    compile_seconds: float = 0.0
    sources: dict[int, tracing.Captured] = field(default_factory=dict)  # input -> the tensor read (for tg.export)
    autocast: AutocastState = AutocastState()  # the autocast region traced in (it decides which ops cast)
    backend: NativeBackend = CPU  # what the program was compiled for
    # `tracing.values_replaced` after the last call's reads, and then (from the second call at that count on) a
    # weak reference per input to the array a `_CurrentValue` read again (`DEAD_REFERENCE` where the input is read at
    # every call), the (position, reader) of those read at every call, and the token of the program's runs with
    # those arrays (`Program.run`'s caller)
    last_read: tuple[int, list[weakref.ref] | None, list[tuple[int, Reader]], Binding | None] | None = None

    def read_inputs(self, values: list[Any]) -> tuple[list[Any] | Changes, Binding | None]:
        """The arrays the program reads for a call with these argument values, in order (no live inputs), and the
        token to run it with. While no tensor has been given another node since the last call, every tensor it
        reads holds the array it held then (alive: the trace holds the tensor, the tensor its node, the node its
        array): only the inputs read at every call are read, given as `Changes` to the program, which binds only
        those when it ran this trace's arrays last (a model reads hundreds of parameters)."""
        last = self.last_read
        if (last is not None and last[0] == tracing.values_replaced and last[1] is not None
                and not tracing.traces_recording):
            fresh = {position: read(values) for position, read in last[2]}
            return Changes(fresh, functools.partial(self._everything, last[1], fresh, values)), last[3]
        inputs = [read(values) for read in self.readers]
        if last is None or last[0] != tracing.values_replaced:
            self.last_read = tracing.values_replaced, None, [], None
            return inputs, None
        refs = [weakref.ref(array) if isinstance(read, _CurrentValue) and read.array is array else DEAD_REFERENCE
                for read, array in zip(self.readers, inputs)]  # a second call with nothing replaced
        unread = [(position, read) for position, (read, ref) in enumerate(zip(self.readers, refs))
                  if ref is DEAD_REFERENCE]
        self.last_read = tracing.values_replaced, refs, unread, Binding()
        return inputs, self.last_read[3]

    def _everything(self, refs: list[weakref.ref], fresh: dict[int, Any], values: list[Any]) -> list[Any]:
        """Every input of a call given as `Changes`, in order: the arrays read last time (by a loop that runs in
        C), the fresh ones in their places."""
        inputs = list(map(operator.call, refs))
        for position, array in fresh.items():
            inputs[position] = array
        if all(map(operator.is_not, inputs, itertools.repeat(None))):
            return inputs
        return [fresh[position] if position in fresh else read(values) for position, read in enumerate(self.readers)]

    def stats(self) -> CompileStats:
        memory = self.program.memory
        return CompileStats(self.program.kernel_count, memory.arena_bytes, memory.naive_bytes, self.compile_seconds)

    @property
    def own_library(self) -> bool:
        """Whether the program was compiled for this trace alone (not a dynamic-shape template's library)."""
        return not self.program.sizes

    def holds(self, args: tuple[Any, ...]) -> bool:
        """Whether this trace fits the call: a gradient absent when traced must still be (and vice versa), every
        module called must be in the mode it was in (`train()`/`eval()`: dropout, batch norm), grad mode must be
        as it was, and so must autocast and the backend compiled for, a number argument the function used as a
        value (a shape, a branch) must have that value, and every other choice the trace made must still hold
        (`tracing.note_condition`)."""
        autocast = autocast_state()  # the same object while autocast is not entered or left
        return (self.grad_enabled == is_grad_enabled() and (self.autocast is autocast or self.autocast == autocast)
                and self.backend is compile_backend()
                and (not self.grads_present
                     or all((leaf.grad is not None) == present for leaf, present in self.grads_present))
                and (not self.modes or all(module.training == training for module, training in self.modes))
                and (not self.fixed_numbers or all(args[position] == value for position, value in self.fixed_numbers))
                and (not self.conditions or all(holds() for holds in self.conditions)))


@dataclass(frozen=True)
class CompileStats:
    """What one compiled signature costs: kernels per call, temporary bytes planned vs without reuse; and
    (from `CompiledFunction.stats`) how many programs the function has compiled in all."""

    kernels: int
    arena_bytes: int
    naive_bytes: int
    compile_seconds: float
    programs: int = 1

    def __str__(self) -> str:
        share = f" ({self.arena_bytes / self.naive_bytes:.1%})" if self.naive_bytes else ""
        programs = f", {self.programs} programs compiled in all" if self.programs > 1 else ""
        return (f"{self.kernels} kernels, arena {_binary_size(self.arena_bytes)} of {_binary_size(self.naive_bytes)} "
                f"naive{share}, compiled in {self.compile_seconds:.2f} s{programs}")


def _binary_size(count: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.1f} {unit}"
    return f"{count} B"


RECENT_TRACES: collections.deque[tuple[str, str, CompileStats]] = collections.deque(maxlen=256)
"""(function name, its arguments as traced, stats) of the latest traces in this process, for `tg explain`."""


class CompiledFunction:
    """`fn` compiled per input signature; call it like `fn`. If `differentiable`, its results require grad where
    what they are computed from does (arguments, parameters), and `backward()` on them works as in eager code
    (`runtime.differentiable`); `fn` must then not call `backward()` itself."""

    def __init__(self, fn: Callable[..., Any], differentiable: bool = False, dynamic: DynamicSpec = None) -> None:
        self.fn = fn
        self.differentiable = differentiable
        self.dynamic = DynamicShapes(dynamic, parameter_names(fn)) if dynamic else None
        self.traces: dict[tuple, list[_Trace]] = {}
        self._latest: _Trace | None = None
        functools.update_wrapper(self, fn)

    @property
    def stats(self) -> CompileStats:
        """Stats of the signature traced or called most recently (call the function once first)."""
        if self._latest is None:
            fail("compile", "no stats yet: call the compiled function once so that it is traced", kind=ArgumentError)
        return dataclasses.replace(self._latest.stats(), programs=self.compiled_programs)

    @property
    def compiled_programs(self) -> int:
        """How many programs calls so far have compiled: one per input signature and trace condition, except
        that sizes of dynamic dimensions share one (`tensorgraphs.dynamic`)."""
        own = sum(trace.own_library for candidates in self.traces.values() for trace in candidates)
        return own + (self.dynamic.programs if self.dynamic else 0)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        trace, inputs, caller = self._bound(args, kwargs)
        graphs = None
        if trace.results_graph is not None and is_grad_enabled():
            inputs = every_input(inputs)
            graphs = trace.results_graph.bind((*args, *kwargs.values()), inputs)
        outputs = run_explained(trace.program, trace.roots, trace.inputs, inputs, caller)
        return self._finish(trace, outputs, graphs, (*args, *kwargs.values()))

    def kernel_times(self, *args: Any, repeat: int = 5, **kwargs: Any) -> list[tuple[str, float]]:
        """(kernel, median seconds) of each kernel the call would run, in order; the call's effects are not kept."""
        trace, inputs, _ = self._bound(args, kwargs)
        return trace.program.kernel_seconds(every_input(inputs), repeat)

    def _bound(self, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> tuple[_Trace, list[np.ndarray] | Changes, Binding | None]:
        """The trace for the call, the arrays its program reads (in order, or as `Changes`) and the token to run
        them with (`_Trace.read_inputs`)."""
        trace = self._trace_for(args, kwargs)
        values = _argument_values((*args, *kwargs.values()))
        if not trace.live_order:
            return trace, *trace.read_inputs(values)
        live = set(trace.live_order)
        inputs: list[Any] = [None if i in live else read(values) for i, read in enumerate(trace.readers)]
        for i in trace.live_order:  # random keys drawn in eager code's order
            inputs[i] = trace.readers[i](values)
        return trace, inputs, None

    def steps(self, *args: Any) -> Any:
        """Run `fn` K times in one native call: every tensor argument has a leading axis of K (one slice per
        step); state changes carry from step to step, live values (learning rate, random keys) are read once per
        step. Returns the results stacked along a new first axis."""
        stacked = _argument_values(args)
        tensors = [v for a, v in zip(args, stacked) if _is_tensor_like(a)]
        lengths = {v.shape[0] if v.ndim else None for v in tensors}
        if len(lengths) != 1 or None in lengths:
            fail("compile.steps", "every tensor argument needs the same leading (steps) axis; got shapes "
                 f"{[v.shape for v in tensors]}", kind=ArgumentError)
        (count,) = lengths
        if count < 1:
            fail("compile.steps", "the steps axis is empty: give at least one step", kind=ArgumentError)
        first = [v[0] if _is_tensor_like(a) else a for a, v in zip(args, stacked)]
        trace = self._trace_for(tuple(first), {})
        fed = {i for i, read in enumerate(trace.readers) if isinstance(read, (_Argument, _Live))}
        inputs: list[Any] = [None if isinstance(read, _Live) else read(stacked) for read in trace.readers]
        drawn = [[trace.readers[i](stacked) for i in trace.live_order] for _ in range(count)]  # step by step
        for j, i in enumerate(trace.live_order):
            inputs[i] = np.stack([step[j] for step in drawn])
        if any(s.kind == "argument" for s in trace.states):
            fail("compile.steps", "the function writes into its arguments in place, which steps() cannot feed back; "
                 "call it once per step", kind=UnsupportedError)
        carried = {s.output_index: s.input_index for s in trace.states
                   if s.output_index is not None and s.input_index is not None}
        outputs = trace.program.run_steps(inputs, count, fed, carried)
        return self._finish(trace, outputs)

    def traced(self, *args: Any, **kwargs: Any) -> _Trace:
        """The trace (and compiled program) a call with these arguments runs, traced now if new, not run (tg.export
        writes it out)."""
        return self._trace_for(args, kwargs)

    def _trace_for(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Trace:
        keywords = tuple(kwargs)
        positional = len(args)
        args = (*args, *kwargs.values())  # keyword arguments follow the positional ones, as program inputs
        signature = (keywords, *map(_argument_key, args))
        if None in signature:
            position = signature.index(None) - 1
            label = (f"argument {position}" if position < positional
                     else f"keyword argument {keywords[position - positional]!r}")
            fail("compile", f"{label} is a {type(args[position]).__name__}, which a compiled function cannot take: "
                 "pass Tensors, numpy arrays, numbers, bools, strings, None, tuples of those, or objects such as "
                 "modules (tensors in a list or dict: pass each one as an argument)", kind=ArgumentError)
        candidates = self.traces.setdefault(signature, [])
        trace = next((t for t in candidates if t.holds(args)), None)
        if trace is None:
            started = time.perf_counter()
            with planning_for(getattr(self.fn, "__qualname__", repr(self.fn))):  # for tg tune / tg explain
                try:
                    trace = self._sized_trace(args, keywords, signature) if self.dynamic else None
                    if trace is None:
                        trace = self._new_trace(args, keywords)
                except TGError as error:
                    if self.dynamic:  # the sizes the function could not take, by the names the user gave them
                        names = self.dynamic.argument_names(len(args), keywords)
                        if note := self.dynamic.described(_tensor_shapes(args), names):
                            error.add_note(note)
                    raise
            trace.compile_seconds = time.perf_counter() - started
            candidates.append(trace)
            names = [""] * (len(args) - len(keywords)) + [f"{k}=" for k in keywords]
            described = ", ".join(name + _describe_key(key) for name, key in zip(names, signature[1:]))
            RECENT_TRACES.append((getattr(self.fn, "__qualname__", repr(self.fn)), described, trace.stats()))
        self._latest = trace
        return trace

    def _new_trace(self, args: tuple[Any, ...], keywords: tuple[str, ...], binder: Binder | None = None) -> _Trace:
        """A trace of the call, numbers as program inputs where tracing can follow their use."""
        try:
            return self._trace(args, keywords, numbers_as_inputs=True, binder=binder)
        except (RenderedSource, NotAnInstance):
            raise
        except Exception:
            if not any(_is_number(a) for a in args):
                raise
            return self._trace(args, keywords, numbers_as_inputs=False, binder=binder)  # a use tracing cannot follow

    def _sized_trace(self, args: tuple[Any, ...], keywords: tuple[str, ...], signature: tuple) -> _Trace | None:
        """The call's trace running its dynamic-shape family's library, or None where it cannot (see `dynamic`)."""
        assert self.dynamic is not None
        shapes = _tensor_shapes(args)
        names = self.dynamic.argument_names(len(args), keywords)
        symbols = self.dynamic.symbols(shapes, names)
        marked = {mark for marks in symbols.values() for mark in marks}
        general = [key if key[0] not in ("tensor", "array") else
                   (*key[:2], tuple(None if (i, d) in marked else n for d, n in enumerate(key[2])), *key[3:])
                   for i, key in enumerate(signature[1:])]
        family_key = (signature[0], *general, tuple(tuple(marks) for marks in symbols.values()))

        def render(probe: Mapping[int, tuple[int, ...]]) -> str:
            stand_ins = tuple(_stand_in(a, probe[i]) if i in probe else a for i, a in enumerate(args))
            try:
                self._new_trace(stand_ins, keywords, binder=_render_only)
            except RenderedSource as rendered:
                return rendered.source
            raise AssertionError("a probe trace compiled a program")

        found = self.dynamic.family(family_key, shapes, names, render)
        if found is None:
            return None
        family, sizes = found

        def instance() -> _Trace | None:
            try:
                return self._new_trace(args, keywords, binder=family.binder(sizes))
            except NotAnInstance:
                return None

        trace = instance() if family.templates else None  # the templates fitted so far
        if trace is None and family.fit(sizes, shapes, render):  # then one fitted near these sizes
            trace = instance()
        return trace

    def _finish(self, trace: _Trace, outputs: list[np.ndarray], graphs: list[Node | None] | None = None,
                args: tuple[Any, ...] = ()) -> Any:
        """Rebind the state the call changed (arguments written in place among `args`) and wrap its results (as
        differentiable ones where `graphs` has a graph, see `ResultGraph.bind`)."""
        for state in trace.states:
            array = None if state.output_index is None else outputs[state.output_index]
            if state.kind == "argument":
                _write_argument(args[state.argument], array, state.tensor.dtype)
            else:
                _rebind(state, array)
        if graphs is None:
            results = list(map(_wrap, outputs, trace.result_dtypes))
        else:
            results = [_wrap(array, dtype) if graph is None else differentiable.differentiable_result(graph, array)
                       for array, dtype, graph in zip(outputs, trace.result_dtypes, graphs)]
        return results[0] if trace.single else tuple(results)

    def _trace(self, args: tuple[Any, ...], keywords: tuple[str, ...], numbers_as_inputs: bool,
               binder: Binder | None = None) -> _Trace:
        """Trace `fn` on placeholders of `args` (the last `len(keywords)` passed by those names): tensors always,
        Python numbers if `numbers_as_inputs` (else the trace holds for their values only). `binder`: see
        `Program`."""
        placeholders: dict[Node, int] = {}
        numbers: dict[Node, int] = {}  # placeholder -> position of a number argument
        traced_args: list[Any] = []
        arguments: set[int] = set()  # ids of the tensor placeholders
        for position, a in enumerate(args):
            if _is_tensor_like(a):
                dtype = a.dtype if isinstance(a, Tensor) else dtypes.from_numpy_dtype(a.dtype)
                placeholder = _wrap(np.broadcast_to(np.zeros((), dtype.storage), a.shape), dtype)  # no memory
                placeholder.requires_grad_(isinstance(a, Tensor) and a.requires_grad)
                placeholders[tracing.placeholder(placeholder.node)] = position
                arguments.add(id(placeholder))
                traced_args.append(placeholder)
            elif numbers_as_inputs and _is_number(a):
                dtype = dtypes.float64 if isinstance(a, float) else dtypes.int64
                number = tracing.NumberArgument(a, tracing.placeholder(_wrap(np.zeros((), dtype.storage), dtype).node))
                numbers[number.node] = position
                traced_args.append(number)
            else:
                traced_args.append(a)
        positional = len(traced_args) - len(keywords)
        with tracing.recording() as effects:
            try:
                result = self.fn(*traced_args[:positional], **dict(zip(keywords, traced_args[positional:])))
                outputs = _result_tensors(result)
                states, roots = _effects(effects, [t.node for t in outputs], placeholders, arguments)
            finally:
                effects.restore()
                for _, before in effects.assigned.values():  # the writes were only traced: not in-place writes
                    overwritten.pop(before, None)
        shared = _sharing_a_node(effects, placeholders)
        if shared:  # each is a state of its own: give it an array of its own, and trace again
            for tensor in shared:
                _set_array(tensor, np.array(tensor._value()))
            return self._trace(args, keywords, numbers_as_inputs, binder)
        results = roots[:len(outputs)]
        state_inputs = {s.tensor.node if s.kind == "value" else s.tensor.grad.node: s for s in states
                        if s.kind == "value" or (s.kind == "grad" and s.tensor.grad is not None)}
        captured = {n: c for n, c in effects.captured.items() if n not in state_inputs}
        backend = compile_backend()
        known = _fixed_values(roots, realized_values(backend.name), {*placeholders, *state_inputs, *captured})
        boundary = lambda n: n in known or n in state_inputs or n in captured  # noqa: E731
        roots = optimize(roots, stop=boundary)  # canonical form and user rules, as in realize()
        graphed = self.differentiable and not effects.grads  # no backward inside: results can be differentiated
        # a differentiable result's graph reads state as it was before the call, so it is never updated in place
        donate = {} if graphed else {n: s.output_index for n, s in state_inputs.items() if s.kind == "value"}
        read_anew = {*placeholders, *numbers, *state_inputs}  # at every call; and live buffers (random keys)
        program, inputs = backend.program(roots, {**known, **dict.fromkeys([*state_inputs, *captured])}, donate,
                                          binder, lambda n: n in read_anew or (n.op is Op.BUFFER and n.arg.live))
        _refuse_earlier_placeholders(inputs, captured, {*placeholders, *numbers})
        readers: list[Reader] = []
        sources: dict[int, tracing.Captured] = {}
        for index, node in enumerate(inputs):
            if node in placeholders:
                readers.append(_Argument(placeholders[node]))
            elif node in numbers:
                readers.append(_NumberArgument(numbers[node], node.dtype))
            elif node in state_inputs:
                state = state_inputs[node]
                state.input_index = index
                sources[index] = _source(state)
                in_place = state.output_index in program.updated_in_place
                readers.append(_overwritable_value(state) if in_place else _CurrentValue(_source(state), node))
            elif node in captured:
                readers.append(_CurrentValue(captured[node], node))
                sources[index] = captured[node]
            elif node in known and node.op is not Op.BUFFER:
                readers.append(_fixed(known[node]))
            elif node.arg.live is not None:
                readers.append(_Live(node.arg.live))
            else:
                readers.append(_fixed(node.arg.data))
        grads_present = tuple((leaf, leaf.grad is not None) for key, (leaf, _) in effects.grads.items()
                              if key in effects.grads_read)
        grads_present += tuple((c.grad_of, True) for c in captured.values() if c.grad_of is not None)
        single = isinstance(result, Tensor)
        made = {id(buffer): order for order, buffer in enumerate(effects.lives)}
        live_order = sorted((i for i, read in enumerate(readers) if isinstance(read, _Live)),
                            key=lambda i: made.get(id(inputs[i].arg), len(made)))
        fixed_numbers = tuple((p, a) for p, (a, t) in enumerate(zip(args, traced_args))
                              if _is_number(a) and getattr(t, "specialized", True))
        results_graph = None
        if graphed:
            sources = _leaf_sources(inputs, placeholders, numbers, state_inputs, captured)
            results_graph = differentiable.ResultGraph.build(results, sources)
        return _Trace(program, *graph_without_data(roots, inputs), readers, [t.dtype for t in outputs], states,
                      grads_present, tuple(effects.modes.values()), single, tuple(live_order), is_grad_enabled(),
                      fixed_numbers, results_graph, conditions=tuple(effects.conditions), sources=sources,
                      autocast=autocast_state(), backend=backend)


def compile_backend() -> NativeBackend:
    """The backend `tg.compile` builds for now: the current device where it compiles to native code, else cpu (the
    reference interpreter has no programs to replay)."""
    backend = BACKENDS.get(default_device())
    return backend if isinstance(backend, NativeBackend) else CPU


def _leaf_sources(inputs: list[Node], placeholders: Mapping[Node, int], numbers: Mapping[Node, int],
                  state_inputs: Mapping[Node, _State],
                  captured: Mapping[Node, tracing.Captured]) -> dict[Node, differentiable.LeafSource]:
    """Where a differentiable result's graph finds each leaf that varies from call to call."""
    sources: dict[Node, differentiable.LeafSource] = {
        node: differentiable.fed(index, node.dtype) for index, node in enumerate(inputs)}
    sources.update({node: differentiable.argument(position) for node, position in placeholders.items()})
    sources.update({node: differentiable.number(position, node.dtype) for node, position in numbers.items()})
    sources.update({node: differentiable.tensor(_source(state).current) for node, state in state_inputs.items()})
    sources.update({node: differentiable.tensor(source.current) for node, source in captured.items()})
    return sources


def _effects(effects: tracing.Trace, results: list[Node], placeholders: dict[Node, int],
             arguments: Collection[int]) -> tuple[list[_State], list[Node]]:
    """The changed tensors as program states, and every node the program computes: fn's results first."""
    states: list[_State] = []
    finals: list[Node] = []
    for tensor, before in effects.assigned.values():
        if tensor.node is before:
            continue
        if before in placeholders:  # written back into the caller's argument after each call
            states.append(_State(tensor, "argument", len(results) + len(finals), argument=placeholders[before]))
        else:
            states.append(_State(tensor, "value", len(results) + len(finals)))
        finals.append(tensor.node)
    for leaf, _ in effects.grads.values():
        if id(leaf) in arguments:
            fail("compile", "a function compiled with tg.compile cannot set the .grad of its own arguments "
                 "(backward() through an argument that requires grad); take gradients with tg.grad and return "
                 "them, or detach the argument", kind=UnsupportedError)
        grad = leaf.grad
        if grad is not None and grad.node.op is Op.BUFFER and grad.node not in effects.stand_ins:
            continue  # unchanged, or a gradient set from outside the trace
        states.append(_State(leaf, "grad", None if grad is None else len(results) + len(finals)))
        if grad is not None:
            finals.append(grad.node)
    return states, effects.resolve(results + finals)


def _sharing_a_node(effects: tracing.Trace, placeholders: Collection[Node]) -> list[Tensor]:
    """The tensors the trace assigned that held the same node as another one before it (equal lazy values, such as
    two `tg.zeros(n)`, are one hash-consed node): as program inputs they would be one array, read for both."""
    holders: dict[Node, list[Tensor]] = {}
    for tensor, before in effects.assigned.values():
        if before not in placeholders:
            holders.setdefault(before, []).append(tensor)
    return [tensor for tensors in holders.values() if len(tensors) > 1 for tensor in tensors]


def _refuse_earlier_placeholders(inputs: list[Node], captured: Mapping[Node, tracing.Captured],
                                 placeholders: Collection[Node]) -> None:
    """A placeholder of another trace has no value: a program reading it, or a captured lazy tensor computed from
    it, would silently compute with zeros."""
    lazy = [n for n in captured if n.op is not Op.BUFFER]
    if any(tracing.is_placeholder(n) and n not in placeholders for n in (*inputs, *toposort(lazy))):
        fail("compile", "the traced function reads a tensor computed inside an earlier trace (an argument of "
             "another call, or a value derived from one, kept in a variable that outlives the call): it has no "
             "value; pass it as an argument or return it instead", kind=UnsupportedError)


def _fixed_values(roots: list[Node], realized: Mapping[Node, np.ndarray], varying: set[Node]) -> dict[Node, np.ndarray]:
    """The realized values the program may capture: of nodes in its graph that read nothing `varying` (arguments,
    state read at every call). A node over a parameter, say, was realized with the parameter's value then. A
    constant (reading no data at all) is never captured, though an earlier evaluation realized it (nodes are
    shared): it stays a literal the program folds, the same whichever evaluations ran before."""
    varying = set(varying)
    reads_data: set[Node] = set()
    fixed = {}
    for node in toposort(roots):
        if node.op is Op.BUFFER or any(s in reads_data for s in node.src):
            reads_data.add(node)
        if node in varying or any(s in varying for s in node.src):
            varying.add(node)
        elif node in realized and node in reads_data:
            fixed[node] = realized[node]
    return fixed


class _Argument:
    """Reads the call's tensor argument at `position` (a class, not a closure, so `steps` can tell them apart)."""

    def __init__(self, position: int) -> None:
        self.position = position

    def __call__(self, arrays: list[np.ndarray]) -> np.ndarray:
        return arrays[self.position]


def _source(state: _State) -> tracing.Captured:
    return tracing.Captured(grad_of=state.tensor) if state.kind == "grad" else tracing.Captured(tensor=state.tensor)


class _NumberArgument:
    """Reads the call's number argument at `position`, as the 0-d array of `dtype` its placeholder is."""

    def __init__(self, position: int, dtype: dtypes.DType) -> None:
        self.position, self.dtype = position, dtype

    def __call__(self, values: list[Any]) -> np.ndarray:
        return np.asarray(values[self.position], self.dtype.storage)


class _CurrentValue:
    """Reads the tensor's value as it is at the call (the trace read `node` from it). A buffer node checked at one
    call is known at the next (held weakly: holding its array would make in-place updates copy it)."""

    __slots__ = ("source", "node", "checked")

    def __init__(self, source: tracing.Captured, node: Node) -> None:
        self.source, self.node = source, node
        self.checked: weakref.ref | None = None

    @property
    def array(self) -> np.ndarray | None:
        """The array the last call read, when the tensor still holds it as a buffer of its own (not a view's, not
        a gradient's): what a later call reads while no tensor is given another node (`_Trace.read_inputs`)."""
        tensor, checked = self.source.tensor, self.checked
        if self.source.grad_of is not None or tensor is None or tensor._base is not None or checked is None:
            return None
        node = checked()
        return node.arg.data if node is tensor._node else None

    def __call__(self, arrays: list[np.ndarray]) -> np.ndarray:
        tensor, checked = self.source.current(), self.checked
        now = None if tensor is None else tensor.node
        if checked is not None and checked() is now:
            return now.arg.data
        node = self.node
        if tensor is None or tensor.shape != node.shape or tensor.dtype is not node.dtype:
            now = "no gradient" if tensor is None else f"{tensor.dtype.name}{list(tensor.shape)}"
            fail("compile", f"a tensor the compiled function reads was {node.dtype.name}{list(node.shape)} when "
                 f"traced and is {now} now; compile the function again (tg.compile) for the new tensor",
                 kind=ArgumentError)
        if now.op is Op.BUFFER:
            self.checked = weakref.ref(now)
        return _stored_value(tensor)


def _overwritable_value(state: _State) -> Reader:
    """The state's array for a program that updates it in place: the array itself when nothing but the tensor
    can see it (it is the node this function gave the tensor, and neither node nor array is referenced
    elsewhere: no view, lazy graph or cached result), else a copy, so that nothing the user holds changes."""

    def read(arrays: list[np.ndarray]) -> np.ndarray:
        node = state.tensor.node
        if node is state.written and sys.getrefcount(node) <= _PRIVATE_NODE_REFS:
            array = node.arg.data
            if sys.getrefcount(array) <= _PRIVATE_ARRAY_REFS:
                tracing.note_value_written()
                return array
        return np.array(_stored_value(state.tensor), order="C")

    return read


_PRIVATE_NODE_REFS = 4  # the tensor, `state.written`, `node` in `read` and getrefcount's argument
_PRIVATE_ARRAY_REFS = 3  # the node's Buffer, `array` in `read` and getrefcount's argument


def _stored_value(tensor: Tensor) -> np.ndarray:
    """The tensor's array: its buffer's, as a compiled call leaves it (no realization), else realized."""
    node = tensor.node
    return node.arg.data if node.op is Op.BUFFER else tensor._value()


class _Live:
    """Reads a live buffer (see `Buffer.live`) at every call; `steps` reads it once per step."""

    def __init__(self, read: Callable[[], Any]) -> None:
        self.read = read

    def __call__(self, arrays: list[np.ndarray]) -> np.ndarray:
        return self.read()


def _tensor_shapes(args: tuple[Any, ...]) -> dict[int, tuple[int, ...]]:
    """Each tensor argument's shape, by its position among the call's arguments."""
    return {i: tuple(a.shape) for i, a in enumerate(args) if _is_tensor_like(a)}


def _render_only(source: str) -> tuple[str, tuple[int, ...]]:
    raise RenderedSource(source)


def _stand_in(value: Tensor | np.ndarray, shape: tuple[int, ...]) -> Tensor | np.ndarray:
    """An argument of `value`'s kind, dtype and grad requirement with another shape, for tracing only."""
    if isinstance(value, np.ndarray):
        return np.broadcast_to(np.zeros((), value.dtype), shape)
    stand_in = _wrap(np.broadcast_to(np.zeros((), value.dtype.storage), shape), value.dtype)
    return stand_in.requires_grad_(value.requires_grad)


def _fixed(array: np.ndarray) -> Reader:
    return lambda arrays: array


def _write_argument(argument: Any, array: np.ndarray, dtype: dtypes.DType) -> None:
    """What the call wrote into an argument, written into the caller's tensor (through its base if a view) or
    numpy array, as an in-place op would in eager code."""
    if isinstance(argument, Tensor):
        argument.assign(_wrap(array, dtype))
    else:
        np.copyto(argument, array, casting="unsafe")


def _rebind(state: _State, array: np.ndarray | None) -> None:
    """Give the tensor (or its gradient) the program's new value, as a buffer of its own."""
    tensor = state.tensor
    if state.kind == "grad":
        tensor.grad = None if array is None else _wrap(array, tensor.dtype)
        return
    assert array is not None
    written = state.written
    if written is not None and tensor.node is written and written.arg.data is array:
        return  # updated in place in the array only this tensor's node holds (`_overwritable_value`): nothing moved
    state.written = _set_array(tensor, array)


def _set_array(tensor: Tensor, array: np.ndarray) -> Node:
    """Make `array` the tensor's value, as a buffer of its own (a leaf keeps its gradient link); returns its node."""
    tensor.node = _wrap(array, tensor.dtype).node
    if tensor.requires_grad:
        tensor.node.arg.grad_leaf = weakref.ref(tensor)
    return tensor.node


def _result_tensors(result: Any) -> list[Tensor]:
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    if not all(isinstance(t, Tensor) for t in outputs):
        fail("compile", "the compiled function must return a Tensor or a sequence of Tensors", kind=ArgumentError)
    return outputs


def _is_tensor_like(value: Any) -> bool:
    return isinstance(value, (Tensor, np.ndarray))


def _is_number(value: Any) -> bool:
    """A Python int or float a program can take as an input (bools stay values: they choose branches)."""
    return type(value) is float or (type(value) is int and -(2**63) <= value < 2**63)


def _argument_values(args: tuple[Any, ...]) -> list[Any]:
    return [_array_of(a) if _is_tensor_like(a) else a for a in args]


_VALUE_TYPES = (type(None), bool, int, float, str, np.generic, dtypes.DType)


def _argument_key(value: Any) -> tuple | None:
    """What calls with the same trace have in common in one argument: a tensor's dtype, shape and whether it
    requires grad, a number's type, another value itself (compared by value, or for an object such as a module by
    identity); None for a value a compiled function cannot take."""
    if isinstance(value, Tensor):
        return ("tensor", value.dtype.name, value.shape, value.requires_grad)
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape)
    if _is_number(value):
        return ("number", type(value).__name__)
    if _is_plain_value(value):
        return ("value", repr(value))
    if type(value).__hash__ is object.__hash__ and type(value).__eq__ is object.__eq__:
        return ("object", value)
    return None


def _describe_key(key: tuple) -> str:
    """An `_argument_key` as the reader would write the argument's type: float32[2, 3], float, 'mean'."""
    if key[0] in ("tensor", "array"):
        return f"{key[1]}{list(key[2])}"
    return key[1] if key[0] in ("number", "value") else type(key[1]).__name__


def _is_plain_value(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_is_plain_value(v) for v in value)
    return isinstance(value, _VALUE_TYPES)


def _array_of(value: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(value, Tensor):
        return value._value()
    return value


def _wrap(array: np.ndarray, dtype: dtypes.DType) -> Tensor:
    return Tensor(host_buffer(array, dtype))
