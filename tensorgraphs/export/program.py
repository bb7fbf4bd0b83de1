"""What an exported program is made of: the arrays its caller passes and receives, the tensors its context
holds (weights, optimizer state, constants: the safetensors file), and where each pointer of `tg_program`'s
buffer array comes from at a call.

A traced program's inputs are split by what feeds them in Python: an argument, a number argument or a live
value (the learning rate, a random key) becomes an input of the C call; everything else (parameters, state,
captured constants) becomes a tensor of the context, loaded once. A state the call updates is written into a
spare buffer and swapped with its tensor after the call, or over the tensor itself where the program updates it
in place; state outputs nothing reads again (gradients left after the step) go to context scratch memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.backends.cpu.renderer import library_functions
from tensorgraphs.backends.native import Program, ProgramLayout
from tensorgraphs.compiled import _Argument, _argument_values, _Live, _NumberArgument, _Trace
from tensorgraphs.errors import ArgumentError, UnsupportedError, fail
from tensorgraphs.export.names import unique
from tensorgraphs.kernels import LIBRARIES
from tensorgraphs.runtime.tracing import Captured

SAFETENSORS_DTYPES = {
    np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
    np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16", np.dtype(np.int8): "I8",
    np.dtype(np.uint8): "U8", np.dtype(np.uint32): "U32",
}
"""The file encoding of each storage type (bool is stored as U8, bfloat16 as the F32 holding its values)."""

Source = tuple[str, int]
"""Where a slot's pointer comes from: ("input", i), ("output", j), ("tensor", t), ("spare", t) (the tensor's
second buffer), ("scratch", s) or ("arena", byte offset)."""


@dataclass(frozen=True)
class ArraySpec:
    name: str
    dtype: dtypes.DType
    shape: tuple[int, ...]

    @property
    def storage(self) -> np.dtype:
        return np.dtype(self.dtype.storage)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.storage.itemsize

    @property
    def file_dtype(self) -> str:
        return SAFETENSORS_DTYPES[self.storage]


@dataclass(frozen=True)
class ExportedProgram:
    source: str  # the C translation unit defining `int tg_program(void **buffers)`
    inputs: list[ArraySpec]
    outputs: list[ArraySpec]
    tensors: list[ArraySpec]  # held by each context: the safetensors file's entries, in order
    values: list[np.ndarray]  # the tensors' values at export time
    scratch: list[ArraySpec]  # outputs the context holds but does not save
    slots: list[Source]
    copies: list[tuple[str, int, int]]  # after a call: ("output" | "tensor", index, slot) copied from the slot
    swaps: list[int]  # tensors whose new value is in their spare buffer after a call
    arena_bytes: int
    libraries: tuple[str, ...]  # kernel libraries the program calls: "gemm", "attention", "fft"


def describe(trace: _Trace, args: tuple[Any, ...], argument_names: list[str], tensor_names: Mapping[int, str],
             output_names: list[str] | None = None) -> ExportedProgram:
    """The exported form of `trace` (traced on `args`), naming arguments by `argument_names`, the tensors it
    reads by `tensor_names` (id of the tensor -> name) and its results by `output_names`."""
    if any(state.kind == "argument" for state in trace.states):
        fail("export", "the function writes into its arguments in place, which a C library cannot hand back: return "
             "the new value instead", kind=UnsupportedError)
    results = len(trace.result_dtypes)
    if output_names is None:
        output_names = ["output"] if results == 1 else [f"output.{j}" for j in range(results)]
    elif len(output_names) != results:
        fail("export", f"{len(output_names)} output names for {results} results", kind=ArgumentError)
    program = trace.program
    layout = program.layout()
    inputs, input_of, held = _split_inputs(trace, args, argument_names, tensor_names)
    tensor_of = {index: t for t, index in enumerate(held)}  # program input -> the context tensor feeding it
    tensors, values, slots = _context_tensors(trace, layout, held, input_of, tensor_of)
    updates = {state.output_index: tensor_of[state.input_index] for state in trace.states
               if state.output_index is not None and state.input_index is not None}
    scratch, swaps, copies = _place_outputs(layout, slots, updates, results)
    outputs = [ArraySpec(name, dtype, layout.slots[layout.outputs[j]].shape)
               for j, (name, dtype) in enumerate(zip(unique(output_names), trace.result_dtypes))]
    libraries = _kernel_libraries(program)
    return ExportedProgram(program.source, inputs, outputs, tensors, values, scratch, slots, copies, swaps,
                           layout.arena_bytes, libraries)


def _split_inputs(trace: _Trace, args: tuple[Any, ...], argument_names: list[str], tensor_names: Mapping[int, str]
                  ) -> tuple[list[ArraySpec], dict[int, int], dict[int, tuple[str, np.ndarray]]]:
    """The C call's inputs (arguments in order, then live values), which C input feeds each program input, and
    the program inputs the context holds instead, as (name, value), in the modules' own order (state_dict's)."""
    values = _argument_values(args)
    fed: dict[int, tuple[int, str]] = {}  # program input -> (order key, name) of the C input feeding it
    held: dict[int, tuple[str, np.ndarray]] = {}
    constants = unnamed = 0
    for index, read in enumerate(trace.readers):
        if isinstance(read, (_Argument, _NumberArgument)):
            fed[index] = (read.position, argument_names[read.position])
        elif isinstance(read, _Live):
            live_name = getattr(read.read, "__name__", "")
            fed[index] = (len(args) + trace.live_order.index(index), live_name if live_name.isidentifier() else "live")
        else:
            source = trace.sources.get(index)
            name = _held_name(source, tensor_names)
            if name is None and source is not None:
                name, unnamed = f"tensor.{unnamed}", unnamed + 1
            elif name is None:
                name, constants = f"constant.{constants}", constants + 1
            held[index] = (name, np.asarray(read(values)))
    rank = {name: k for k, name in enumerate(tensor_names.values())}
    held = dict(sorted(held.items(), key=lambda item: rank.get(item[1][0], len(rank))))
    order = sorted(fed, key=lambda i: fed[i][0])
    inputs = [ArraySpec(name, trace.inputs[i].dtype, trace.inputs[i].shape)
              for i, name in zip(order, unique([fed[i][1] for i in order]))]
    return inputs, {index: k for k, index in enumerate(order)}, held


def _context_tensors(trace: _Trace, layout: ProgramLayout, held: dict[int, tuple[str, np.ndarray]],
                     input_of: dict[int, int], tensor_of: dict[int, int]
                     ) -> tuple[list[ArraySpec], list[np.ndarray], list[Source]]:
    """The tensors a context holds (the held inputs, then the constants the program holds) with their values, and
    the sources of every slot but the outputs' (("pending", -1) until `_place_outputs`)."""
    names = [name for name, _ in held.values()]
    values = [value for _, value in held.values()]
    types = [trace.inputs[index].dtype for index in held]
    slots: list[Source] = []
    for slot in layout.slots:
        if slot.role == "input":
            p = slot.position
            slots.append(("input", input_of[p]) if p in input_of else ("tensor", tensor_of[p]))
        elif slot.role == "constant":
            assert slot.array is not None
            slots.append(("tensor", len(values)))
            names.append(f"constant.{sum(n.startswith('constant.') for n in names)}")
            values.append(slot.array)
            types.append(dtypes.from_numpy_dtype(slot.dtype))
        elif slot.role == "temp":
            slots.append(("arena", slot.offset))
        else:
            slots.append(("pending", -1))
    tensors = [ArraySpec(name, dtype, tuple(value.shape)) for name, dtype, value in zip(unique(names), types, values)]
    return tensors, values, slots


def _place_outputs(layout: ProgramLayout, slots: list[Source], updates: dict[int, int],
                   results: int) -> tuple[list[ArraySpec], list[int], list[tuple[str, int, int]]]:
    """Fill in the output slots' sources: over the input where the program updates it in place, else a state's
    spare buffer, else the caller's output, else context scratch. Returns the scratch arrays, the tensors to swap
    with their spares after a call, and the copies after a call for outputs that share a slot with another.
    `updates`: output index -> the context tensor that output is the new value of."""
    scratch: list[ArraySpec] = []
    swaps: list[int] = []
    for slot_index, slot in enumerate(layout.slots):
        if slot.role != "output":
            continue
        outputs = [j for j, s in enumerate(layout.outputs) if s == slot_index]
        updated = [updates[j] for j in outputs if j in updates]
        if slot_index in layout.in_place:
            slots[slot_index] = slots[layout.in_place[slot_index]]
        elif updated and updated[0] not in swaps:
            slots[slot_index] = ("spare", updated[0])
            swaps.append(updated[0])
        elif any(j < results for j in outputs):
            slots[slot_index] = ("output", min(outputs))
        else:
            slots[slot_index] = ("scratch", len(scratch))
            scratch.append(ArraySpec(f"scratch.{len(scratch)}", dtypes.from_numpy_dtype(slot.dtype), slot.shape))
    copies = [("output", j, layout.outputs[j]) for j in range(results) if slots[layout.outputs[j]] != ("output", j)]
    copies += [("tensor", t, layout.outputs[j]) for j, t in updates.items()
               if slots[layout.outputs[j]] not in (("spare", t), ("tensor", t))]
    return scratch, swaps, copies


def _kernel_libraries(program: Program) -> tuple[str, ...]:
    """The kernel libraries the program calls; one it cannot contain (the BLAS kernel, which links OpenBLAS) is
    refused with what to do."""
    functions = library_functions(program.kernels)
    foreign = sorted(f for f in functions if LIBRARIES[f].sources is None)
    if foreign:
        fail("export", f"the program calls {', '.join(foreign)}, which an exported library cannot contain (it links "
             "only libc, libm and OpenMP): the function was compiled and run before it was exported; export the "
             "function or module itself (not what tg.compile returned), which is traced without OpenBLAS",
             kind=UnsupportedError)
    return tuple(sorted({LIBRARIES[f].sources.name for f in functions}))  # type: ignore[union-attr]


def _held_name(source: Captured | None, names: Mapping[int, str]) -> str | None:
    """The name of the tensor (or gradient) a program input is read from, when it has one."""
    if source is None:
        return None
    if source.grad_of is not None:
        owner = names.get(id(source.grad_of))
        return None if owner is None else f"{owner}.grad"
    return names.get(id(source.tensor)) if source.tensor is not None else None
