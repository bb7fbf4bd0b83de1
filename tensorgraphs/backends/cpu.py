"""The cpu backend: fused kernels generated as C, compiled once, one native call per evaluation.

`evaluate` finds the program for the graph's *structure* (ops, dtypes, shapes,
constants and wiring; not which arrays feed it), compiling it on first sight:
schedule -> loop IR -> C -> shared library (cached on disk). Temporaries live
in one arena per program (`tensorgraphs.memory`: offsets by liveness, verified
on every compile). Running it binds the input arrays, allocates outputs and
calls `tg_program` once.

TG_DEBUG=schedule prints each new schedule, TG_DEBUG=codegen its C source,
TG_DEBUG=memory its arena plan; TG_POISON=1 fills the arena with NaN before each run.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from tensorgraphs import memory
from tensorgraphs.codegen.c_renderer import render_program, uses_gemm
from tensorgraphs.codegen.compiler import link_library, load
from tensorgraphs.graph.node import Node, _arg_key, toposort
from tensorgraphs.graph.ops import Op
from tensorgraphs.kernels import gemm
from tensorgraphs.runtime.realize import register_backend
from tensorgraphs.schedule.fusion import Schedule, schedule_kernels

PROGRAM_CACHE_SIZE = 512
POOLED_BYTES = 1 << 20
"""Outputs at least this large are recycled once the caller drops them (fresh pages cost ~0.4 ms per MiB)."""


def _debug(stage: str) -> bool:
    return stage in os.environ.get("TG_DEBUG", "").split(",")


def structure(roots: list[Node], is_input: Callable[[Node], bool]) -> tuple[tuple, list[Node]]:
    """A key equal for graphs that compute the same thing from different input arrays, and those inputs in order."""
    position: dict[Node, int] = {}
    entries: list[tuple] = []
    inputs: list[Node] = []
    for node in toposort(roots, stop=is_input):
        position[node] = len(entries)
        if is_input(node):
            inputs.append(node)
            entries.append(("input", node.dtype.name, node.shape))
        else:
            op = (type(node.op).__name__, node.op.name)
            entries.append((op, node.dtype.name, node.shape, _arg_key(node.arg), tuple(position[s] for s in node.src)))
    return (tuple(entries), tuple(position[r] for r in roots)), inputs


@dataclass
class _Slot:
    """Where one pointer of the program's buffer array comes from."""

    role: str  # "input" (position in the call's inputs), "captured" (a constant array or arena view), "output"
    dtype: Any
    shape: tuple[int, ...]
    position: int = -1
    array: np.ndarray | None = None


class Program:
    """A compiled schedule: `run(inputs)` returns the roots' values (one native call).

    `reuse_memory=False` gives every temporary bytes of its own (unplanned execution, for comparison).
    """

    def __init__(self, schedule: Schedule, inputs: list[Node], reuse_memory: bool = True) -> None:
        schedule = memory.order_for_memory(schedule)
        self.memory = memory.plan_memory(schedule, reuse=reuse_memory)
        memory.verify_plan(schedule, self.memory)
        if _debug("memory"):
            print(self.memory, file=sys.stderr)
        self.arena = memory.Arena(self.memory.arena_bytes)
        # loop IR only: a cached program keeps no graph (or its arrays) alive
        self.kernels = memory.alias_free(schedule.kernels, self.memory.in_place)
        source = render_program(self.kernels, [b.name for b in schedule.buffers])
        if _debug("schedule"):
            print(schedule, file=sys.stderr)
        if _debug("codegen"):
            print(source, file=sys.stderr)
        self.source = source
        link = link_library(gemm.library_path()) if uses_gemm(self.kernels) else ()
        entry = load(source, link).tg_program
        entry.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        entry.restype = ctypes.c_int
        self._entry = entry
        position = {node: i for i, node in enumerate(inputs)}
        self._slots: list[_Slot] = []
        for spec in schedule.buffers:
            node = spec.node
            storage = np.dtype(node.dtype.storage)
            if spec.role == "input" and node in position:
                slot = _Slot("input", storage, node.shape, position[node])
            elif spec.role == "input":  # a BUFFER made by a decomposition: part of the program
                slot = _Slot("captured", storage, node.shape, array=_contiguous(node.arg.data, storage))
            elif spec.role == "temp":
                slot = _Slot("captured", storage, node.shape,
                             array=self.arena.view(self.memory.offsets[spec.name], storage, node.shape))
            else:
                slot = _Slot(spec.role, storage, node.shape)
            self._slots.append(slot)
        slot_of = {spec.name: i for i, spec in enumerate(schedule.buffers)}
        self._outputs = [slot_of[name] for name in schedule.outputs]
        self._pool: dict[int, list[np.ndarray]] = {i: [] for i, s in enumerate(self._slots) if s.role == "output"}

    @property
    def kernel_count(self) -> int:
        return len(self.kernels)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if memory.poison_enabled():
            self.arena.poison()
        arrays = [self._array(i, slot, inputs) for i, slot in enumerate(self._slots)]
        pointers = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        if self._entry(pointers):
            raise IndexError("gather/scatter_add: an index is out of bounds for the dimension it indexes")
        for i in self._pool:
            if arrays[i].nbytes >= POOLED_BYTES and len(self._pool[i]) < 2:
                self._pool[i].append(arrays[i])
        return [arrays[i] for i in self._outputs]

    def _array(self, index: int, slot: _Slot, inputs: list[np.ndarray]) -> np.ndarray:
        if slot.role == "input":
            return _contiguous(inputs[slot.position], slot.dtype)
        if slot.role == "captured":
            assert slot.array is not None
            return slot.array
        pool = self._pool[index]
        for position in range(len(pool)):
            if sys.getrefcount(pool[position]) <= 2:  # only the pool and getrefcount's argument hold it
                return pool.pop(position)
        return np.empty(slot.shape, slot.dtype)


def _contiguous(array: Any, dtype: np.dtype) -> np.ndarray:
    return np.asarray(array, dtype=dtype, order="C")  # keeps 0-d arrays 0-d, unlike ascontiguousarray


class CpuBackend:
    """Runs graphs as compiled C programs, one program per graph structure."""

    name = "cpu"

    def __init__(self) -> None:
        self._programs: OrderedDict[tuple, Program] = OrderedDict()

    def program(self, roots: list[Node], known: Mapping[Node, Any] | None = None) -> tuple[Program, list[Node]]:
        """The compiled program for `roots` and the nodes whose arrays it takes, in order."""
        known = {} if known is None else known
        is_input = lambda n: n.op is Op.BUFFER or n in known  # noqa: E731
        key, inputs = structure(roots, is_input)
        found = self._programs.get(key)
        if found is None:
            given = set(inputs)  # not `known`: a node a decomposition builds may be realized elsewhere
            found = Program(schedule_kernels(roots, given.__contains__), inputs)
            self._programs[key] = found
            if len(self._programs) > PROGRAM_CACHE_SIZE:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(key)
        return found, inputs

    def evaluate(self, roots: list[Node], known: Mapping[Node, np.ndarray] | None = None) -> list[np.ndarray]:
        known = {} if known is None else known
        program, inputs = self.program(roots, known)
        arrays = [known[n] if n in known else n.arg.data for n in inputs]
        return program.run(arrays)


CPU = CpuBackend()
register_backend(CPU)

