"""Devices that run generated C: fused kernels compiled once, one native call per evaluation.

`evaluate` finds the program for the graph's *structure* (ops, dtypes, shapes,
constants and wiring; not which arrays feed it), compiling it on first sight:
schedule -> loop IR -> C -> shared library (cached on disk). Temporaries live
in one arena per program (`tensorgraphs.memory`: offsets by liveness, verified
on every compile). Running it binds the input arrays, takes output memory from
a pool shared by all programs and calls `tg_run` once (`tg_run_steps` for K
steps), through the target's runtime (`runtime.device`); one call at a time per
program. Inputs a caller donates (a compiled
training step's parameters) may be overwritten by their new values when the
schedule allows it (`Program.updated_in_place`). Graphs touching few elements
run on the reference interpreter instead (`NativeBackend.interpret_below`). A program built with tuned choices
runs them where the step check kept them, else the defaults (`plan.step_check`).
A `CTarget` (renderer, compiler driver, runtime, planner features) makes this
machinery a device: `backends.cpu`, `backends.portable`.

TG_DEBUG=schedule prints each new schedule, TG_DEBUG=codegen its C source,
TG_DEBUG=memory its arena plan; TG_POISON=1 fills the arena with NaN before each run.
"""

from __future__ import annotations

import _signal
import ctypes
import functools
import itertools
import operator
import os
import signal
import sys
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping, MutableMapping, Sequence

import numpy as np

from tensorgraphs import memory
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.codegen.c_renderer import TG_HOST_FAILED, TG_INTERRUPTED, CStyleRenderer, uses_host_calls
from tensorgraphs.codegen.compiler import CompilerDriver, link_library, load
from tensorgraphs.codegen.loop_ir import AttentionCall, ConvCall, GemmCall, Kernel, walk
from tensorgraphs.codegen.size_template import SIZES_ARRAY
from tensorgraphs.errors import UnsupportedError
from tensorgraphs.graph.node import Node, structure, toposort
from tensorgraphs.graph.ops import Op
from tensorgraphs.plan.choices import (
    ALL_FEATURES,
    SCHEDULE_SEARCH,
    collecting,
    routes_taken,
    still_taken,
    target_features,
    targeting,
    untuned,
)
from tensorgraphs.plan.kernel_search import kernel_search
from tensorgraphs.plan.step_check import step_check
from tensorgraphs.runtime import host_calls, tracing
from tensorgraphs.runtime.buffer import DEAD_REFERENCE
from tensorgraphs.runtime.device import DeviceBuffer, DeviceRuntime
from tensorgraphs.schedule.fusion import Schedule, schedule_kernels
from tensorgraphs.schedule.prepared import preparations

PROGRAM_CACHE_SIZE = 512


KERNEL_OBSERVERS: list[Callable[[str, float, float, float, float], None]] = []
"""While any is registered (`tg.profile`), programs run their timed build and report every kernel as
(name, start, seconds, flops, bytes); a graph interpreted instead of compiled is one "interpreted graph"."""


def kernel_work(kernel: Kernel) -> tuple[float, float]:
    """(flops of its library calls, bytes of the buffers it reads and writes once each): for a roofline."""
    body = list(walk(kernel.body))
    flops = sum(2.0 * s.batch * s.m * s.n * s.k for s in body if isinstance(s, GemmCall))
    flops += sum(s.flops for s in body if isinstance(s, (ConvCall, AttentionCall)))
    return flops, float(sum(b.size * b.dtype.itemsize for b in kernel.buffers))


def _report(name: str, start: float, seconds: float, flops: float = 0.0, nbytes: float = 0.0) -> None:
    for observe in KERNEL_OBSERVERS:
        observe(name, start, seconds, flops, nbytes)


def _debug(stage: str) -> bool:
    return stage in os.environ.get("TG_DEBUG", "").split(",")


@dataclass(frozen=True)
class CTarget:
    """What a device running generated C is made of: how it spells C (`renderer`), how it builds a library from
    it (`driver`), the planner features it offers (`plan.choices.targeting`), and the memory and launches its
    programs run on (`runtime`: device buffers, `runtime.device`)."""

    renderer: type[CStyleRenderer]
    driver: CompilerDriver
    runtime: DeviceRuntime
    features: frozenset[str] = ALL_FEATURES


@dataclass
class _Slot:
    """Where one pointer of the program's buffer array comes from."""

    role: str  # "input" (position in the call's inputs), "captured" (a constant array or arena view), "output"
    dtype: Any
    shape: tuple[int, ...]
    position: int = -1
    array: DeviceBuffer | None = None


@dataclass(frozen=True)
class SlotLayout:
    """One pointer of `tg_program`'s buffer array, for callers without Python (`tg.export`): a program input
    (`position`), a constant the program holds (`array`), a temporary in the arena (`offset`), or an output."""

    role: str  # "input", "constant", "temp" or "output"
    dtype: np.dtype
    shape: tuple[int, ...]
    position: int = -1
    offset: int = -1
    array: np.ndarray | None = None


@dataclass(frozen=True)
class ProgramLayout:
    """How to call `tg_program` without this module: its slots, the slot holding each output, and the output slots
    written over an input slot's array (`Program.updated_in_place`)."""

    slots: list[SlotLayout]
    outputs: list[int]
    in_place: dict[int, int]  # output slot -> input slot
    arena_bytes: int


class Binding:
    """A token for one set of input arrays a caller runs a program with (`Program.run`'s `caller`): new whenever
    the set may change, so the program knows whether its address table holds that set."""

    __slots__ = ("__weakref__",)


@dataclass(frozen=True)
class Changes:
    """A call's inputs as what changed since the caller's last run (`Program.run`): `fresh` maps positions to
    this call's arrays; every other input is the array the run of the same `Binding` was given, alive since (the
    caller's promise). `everything()` gives the whole list, for a run that needs it."""

    fresh: dict[int, Any]
    everything: Callable[[], list[Any]]


def every_input(inputs: list[Any] | Changes) -> list[Any]:
    """A call's inputs in order, given whole or as `Changes`."""
    return inputs.everything() if isinstance(inputs, Changes) else inputs


Binder = Callable[[str], tuple[str, tuple[int, ...]]]
"""Given a program's rendered source, the source of the library to run instead and the values of its size
array (`codegen.size_template`): one library serves many sizes. It may raise to refuse the source."""


@functools.cache
def _library_lock(source: str) -> threading.Lock:
    """One run at a time per library: programs sharing one set its sizes before running it."""
    return threading.Lock()


class Program:
    """A compiled schedule: `run(inputs)` returns the roots' values (one native call).

    `reuse_memory=False` gives every temporary bytes of its own (unplanned execution, for comparison). With
    `binder`, the program runs the library it names (a template for many sizes) with its sizes set. Generated
    kernels run the schedules searched for them (`plan.kernel_search`); with `search`, those not searched yet
    are searched when tuning is on (a program a user runs, not one built to measure something).
    """

    def __init__(self, schedule: Schedule, inputs: list[Node], target: CTarget, reuse_memory: bool = True,
                 donated: Sequence[tuple[int, int]] = (), binder: Binder | None = None, search: bool = False,
                 varying: Collection[int] | None = None) -> None:
        self.target, self.runtime = target, target.runtime
        schedule = memory.order_for_memory(schedule)
        self.preparations = preparations(schedule, inputs, varying)
        self.memory = memory.plan_memory(schedule, reuse=reuse_memory, kept=self.preparations.kept)
        memory.verify_plan(schedule, self.memory, self.preparations.kept)
        if _debug("memory"):
            print(self.memory, file=sys.stderr)
        # loop IR only: a cached program keeps no graph (or its arrays) alive
        self.kernels = memory.alias_free(schedule.kernels, self.memory.in_place)
        self.updated_in_place = self._update_in_place(schedule, inputs, donated)
        if SCHEDULE_SEARCH in target.features:
            self.kernels = kernel_search().schedule(self.kernels, target, search)
        self._sizes_at_run_time = binder is not None
        source = target.renderer.render_program(self.kernels, [b.name for b in schedule.buffers],
                                                sizes_at_run_time=self._sizes_at_run_time,
                                                skippable=self.preparations.kernels)
        if _debug("schedule"):
            print(schedule, file=sys.stderr)
        if _debug("codegen"):
            print(source, file=sys.stderr)
        self.source = source
        self._buffer_names = [b.name for b in schedule.buffers]
        libraries = target.renderer.libraries(self.kernels)
        self._link = tuple(flag for library in libraries for flag in link_library(library))
        library_source, self.sizes = binder(source) if binder else (source, ())
        library = self._load(library_source)
        self._set_sizes = self._size_setter(library)
        self.arena = self.runtime.arena(self.memory.arena_bytes)
        self._entry = library.tg_run
        self._entry.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        self._entry.restype = ctypes.c_int
        self._steps_entry = library.tg_run_steps
        self._steps_entry.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_long, ctypes.POINTER(ctypes.c_long),
                                      ctypes.POINTER(ctypes.c_long), ctypes.c_int]
        self._steps_entry.restype = ctypes.c_int
        position = {node: i for i, node in enumerate(inputs)}
        self._slots: list[_Slot] = []
        for spec in schedule.buffers:
            node = spec.node
            storage = np.dtype(node.dtype.storage)
            if spec.role == "input" and node in position:
                slot = _Slot("input", storage, node.shape, position[node])
            elif spec.role == "input":  # a BUFFER made by a decomposition: part of the program
                slot = _Slot("captured", storage, node.shape, array=self.runtime.to_device(node.arg.data, storage))
            elif spec.role == "temp":
                slot = _Slot("captured", storage, node.shape,
                             array=self.arena.view(self.memory.offsets[spec.name], storage, node.shape))
            else:
                slot = _Slot(spec.role, storage, node.shape)
            self._slots.append(slot)
        slot_of = {spec.name: i for i, spec in enumerate(schedule.buffers)}
        self._outputs = [slot_of[name] for name in schedule.outputs]
        self._input_slot = {slot.position: i for i, slot in enumerate(self._slots) if slot.role == "input"}
        self._in_place_slots = {self._outputs[output]: self._input_slot[position]
                                for output, position in self.updated_in_place.items()}
        self._input_slot_indices = [i for i, slot in enumerate(self._slots) if slot.role == "input"]
        self._input_positions = [self._slots[i].position for i in self._input_slot_indices]
        self._input_index = {position: k for k, position in enumerate(self._input_positions)}
        self._output_slots = [i for i, slot in enumerate(self._slots)
                              if slot.role not in ("input", "captured") and i not in self._in_place_slots]
        self._output_specs = tuple((self._slots[i].shape, self._slots[i].dtype) for i in self._output_slots)
        self._slot_arrays = [slot.array for slot in self._slots]
        # per input slot, in order: the array the last run passed as it was given (held weakly), see `_arrays`
        self._passed: list[weakref.ref] = [DEAD_REFERENCE] * len(self._input_slot_indices)
        self._converted: frozenset[int] = frozenset()  # input positions the last `_arrays` passed a copy of
        self._given_anew: frozenset[int] = frozenset()  # and those it passed another array than the run before
        # the caller's binding whose arrays `tg_run`'s address table holds, and the positions it holds copies of
        self._bound: tuple[weakref.ref, frozenset[int]] | None = None
        # `tracing.values_written` when the last run of `tg_run` made the preparations' results for the arrays
        # bound: while it stands, a run binding none of their inputs anew skips them (None: made by no such run)
        self._prepared_at: int | None = None
        # outputs a run given `Changes` can return: none is an input's array, unless one updated in place
        self._takes_changes = all(i in self._output_slots or i in self._in_place_slots or self._slots[i].role ==
                                  "captured" for i in self._outputs)
        self._in_place_positions = frozenset(self._slots[i].position for i in self._in_place_slots.values())
        # one run at a time: runs share the arena, the slots and the pool (and a template library its sizes)
        self._running = _library_lock(library_source) if self.sizes else threading.Lock()
        self.routes: tuple = ()  # how the planner ran each composite (`plan.choices.routes_taken`)

    def _update_in_place(self, schedule: Schedule, inputs: list[Node],
                         donated: Sequence[tuple[int, int]]) -> dict[int, int]:
        """Output index -> input position, for each donated (input position, output index) pair whose output
        can be written over the input: the kernel making it passes `memory.writes_in_place_safely` and no later
        kernel reads the input. That kernel then reads the input through the output's pointer."""
        name_of = {spec.node: spec.name for spec in schedule.buffers if spec.role == "input"}
        updated = {}
        for position, output in donated:
            donor, target = name_of.get(inputs[position]), schedule.outputs[output]
            writers = [k for k, kernel in enumerate(self.kernels) if any(b.writes and b.name == target
                                                                            for b in kernel.buffers)]
            if donor is None or len(writers) != 1 or schedule.outputs.count(target) != 1:
                continue
            (k,) = writers
            later_readers = [kernel for kernel in self.kernels[k + 1:] if donor in {b.name for b in kernel.buffers}]
            if later_readers or not memory.writes_in_place_safely(self.kernels[k], donor, target):
                continue
            self.kernels[k] = memory.read_through_output(self.kernels[k], donor, target)
            updated[output] = position
        return updated

    def _size_setter(self, library: ctypes.CDLL) -> Callable[[], None]:
        """What sets the library's sizes to this program's before a run (nothing for a library of one size)."""
        if not self.sizes:
            return lambda: None
        array = (ctypes.c_int64 * len(self.sizes)).in_dll(library, SIZES_ARRAY)
        sizes = list(self.sizes)

        def set_sizes() -> None:
            array[:] = sizes

        return set_sizes

    def _load(self, source: str) -> ctypes.CDLL:
        library = load(source, self.target.driver, self._link)
        if uses_host_calls(self.kernels):
            host_calls.bind(library)
        return library

    def layout(self) -> ProgramLayout:
        slots = []
        for name, slot in zip(self._buffer_names, self._slots):
            if name in self.memory.offsets:
                slots.append(SlotLayout("temp", slot.dtype, slot.shape, offset=self.memory.offsets[name]))
            elif slot.role == "captured":
                slots.append(SlotLayout("constant", slot.dtype, slot.shape, array=slot.array))
            else:
                slots.append(SlotLayout(slot.role, slot.dtype, slot.shape, position=slot.position))
        return ProgramLayout(slots, list(self._outputs), dict(self._in_place_slots), self.memory.arena_bytes)

    @property
    def kernel_count(self) -> int:
        return len(self.kernels)

    def run(self, inputs: list[np.ndarray] | Changes, caller: Binding | None = None) -> list[np.ndarray]:
        """The roots' values for the inputs' host arrays (the runtime moves both across). A `caller` gives the
        binding its arrays are; given as `Changes` since the last run of that binding, when no other run of
        `tg_run` came between (its address table holds that binding's arrays), only the fresh inputs and the
        outputs are bound."""
        with self._running:
            if memory.poison_enabled():
                self.arena.poison()
            if isinstance(inputs, Changes):
                if self._holds(caller, inputs.fresh.keys()) and not KERNEL_OBSERVERS:
                    return self._run_changes(inputs.fresh)
                inputs = inputs.everything()
            arrays = self._arrays(inputs)
            if KERNEL_OBSERVERS:
                self._run_timed(arrays)
            else:
                self._set_sizes()
                self._bound = None  # until the launch has rewritten the address table
                status = self._launch_preparing(self._given_anew, lambda prepared: self._interruptible(
                    self.runtime.launch, self._entry, arrays, prepared))
                self._bound = None if caller is None else (weakref.ref(caller), self._converted)
                _check_status(status)
            return [self.runtime.to_host(arrays[i]) for i in self._outputs]

    def _holds(self, caller: Binding | None, fresh: Collection[int]) -> bool:
        """Whether `tg_run`'s address table holds `caller`'s arrays, except at most the `fresh` positions, and
        a run can bind those alone: the inputs it holds copies of are fresh, and so are those updated in place."""
        bound = self._bound
        return (caller is not None and bound is not None and bound[0]() is caller and self._takes_changes
                and bound[1] <= fresh and self._in_place_positions <= fresh)

    def _run_changes(self, fresh: dict[int, Any]) -> list[np.ndarray]:
        """A run binding only the `fresh` inputs (position -> array) and the outputs (see `run`)."""
        changed = {}
        for position, array in fresh.items():
            slot = self._input_slot.get(position)
            if slot is not None:  # else the schedule reads nothing of it
                changed[slot] = self.runtime.to_device(array, self._slots[slot].dtype)
                self._passed[self._input_index[position]] = DEAD_REFERENCE  # what `_arrays` compares stays true
        self._bind_outputs(changed)
        self._set_sizes()
        bound, self._bound = self._bound, None
        status = self._launch_preparing(fresh, lambda prepared: self._interruptible(
            self.runtime.launch_again, self._entry, changed, prepared))
        self._bound = bound
        _check_status(status)
        return [self.runtime.to_host(changed[i] if i in changed else self._slot_arrays[i]) for i in self._outputs]

    def _launch_preparing(self, given_anew: Collection[int], launch: Callable[[int], int]) -> int:
        """`launch(prepared)` of a `tg_run` given new arrays at the positions `given_anew` (the others: those of the
        last run), `prepared` 1 where the arena still holds what the preparations (`schedule.prepared`) would make:
        the last run of `tg_run` (of either build) made or kept it, no array was written in place since, and none of
        their inputs is given anew. Its status; a run that fails leaves them to be made again."""
        prepared = (bool(self.preparations.kernels) and self._prepared_at == tracing.values_written
                    and self.preparations.inputs.isdisjoint(given_anew) and not memory.poison_enabled())
        self._prepared_at = None
        status = launch(int(prepared))
        self._prepared_at = tracing.values_written if status == 0 else None
        return status

    def _run_timed(self, arrays: list[DeviceBuffer]) -> None:
        """One run of the timed build, each kernel reported to `KERNEL_OBSERVERS`."""
        library, seconds = self._timed
        ctypes.memset(seconds, 0, ctypes.sizeof(seconds))
        self._bound = None  # its arrays are in the timed build's table, not `tg_run`'s (the builds share the arena)
        start = time.perf_counter()
        _check_status(self._launch_preparing(self._given_anew, lambda prepared: self.runtime.launch(
            library.tg_run, arrays, prepared, 0)))
        for kernel, spent in zip(self.kernels, seconds):
            _report(kernel.name, start, spent, *kernel_work(kernel))
            start += spent

    @functools.cached_property
    def _timed(self) -> tuple[Any, Any]:
        """The timed build of this program (`render_program(timed=True)`) and its per-kernel seconds."""
        library = self._load(self.target.renderer.render_program(self.kernels, self._buffer_names, timed=True,
                                                                 sizes_at_run_time=self._sizes_at_run_time,
                                                                 skippable=self.preparations.kernels))
        return library, (ctypes.c_double * max(len(self.kernels), 1)).in_dll(library, "tg_kernel_seconds")

    def _interruptible(self, launch: Callable[..., int], *args: Any) -> int:
        """`launch(*args, watch)` of `tg_run` or `tg_run_steps`, which with `watch` stop between kernels on Ctrl-C,
        raising KeyboardInterrupt here, instead of running to the end first. Only where Python's own SIGINT handling
        would raise it: on the main thread, with the default handler (a handler of the user's runs after the call,
        as before). `_signal.getsignal`: `signal.getsignal` converts the handler to an enum through a raised
        ValueError (~15 us a call)."""
        watch = threading.current_thread() is threading.main_thread() and (
            _signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        status = launch(*args, watch)
        if status == TG_INTERRUPTED:
            raise KeyboardInterrupt
        return status

    def kernel_seconds(self, inputs: list[np.ndarray], repeat: int = 5) -> list[tuple[str, float]]:
        """Each kernel's median wall time over `repeat` runs (a timed build of the same program; for profiling)."""
        with self._running:
            library, seconds = self._timed
            arrays = self._arrays(inputs)
            self._bound = self._prepared_at = None  # another entry ran: `tg_run` binds and prepares anew
            runs = []
            for _ in range(repeat):
                ctypes.memset(seconds, 0, ctypes.sizeof(seconds))
                _check_status(self.runtime.launch(library.tg_program, arrays))
                runs.append(list(seconds))
            return [(kernel.name, float(np.median([run[i] for run in runs]))) for i, kernel in enumerate(self.kernels)]

    def run_steps(self, inputs: list[np.ndarray], steps: int, fed: set[int],
                  carried: dict[int, int]) -> list[np.ndarray]:
        """`steps` (>= 1) runs in one native call (`tg_run_steps`). The inputs at positions in `fed` have a leading
        axis of `steps`, one slice per run. Output `j` in `carried` becomes input `carried[j]` of the next run
        and comes back as its last value; the other outputs come back stacked along a new first axis."""
        with self._running:
            if memory.poison_enabled():
                self.arena.poison()
            partner = {self._outputs[j]: self._input_slot.get(p) for j, p in carried.items()}
            if len(partner) != len(carried) or any(self._outputs.count(i) > 1 for i in partner):
                raise UnsupportedError("a K-step call cannot return a value the step also carries to the next step")
            arrays: list[DeviceBuffer] = []
            advance = (ctypes.c_long * max(len(self._slots), 1))()
            swap_with = (ctypes.c_long * max(len(self._slots), 1))(*[-1] * len(self._slots))
            carried_inputs = {p for p in partner.values() if p is not None}
            for i, slot in enumerate(self._slots):
                if i in self._in_place_slots:  # its input's array, set below: updated in place, nothing to swap
                    array = self.runtime.empty((0,), slot.dtype)
                elif slot.role == "input":
                    array = self.runtime.to_device(inputs[slot.position], slot.dtype)
                    if slot.position in fed:
                        advance[i] = array.nbytes // steps
                    elif i in carried_inputs:
                        array = array.copy()  # the runs overwrite it: never the caller's array
                elif slot.role == "captured":
                    assert slot.array is not None
                    array = slot.array
                elif i in partner:
                    array = self.runtime.empty(slot.shape, slot.dtype)
                    if partner[i] is not None:  # ping-pong between this array and the input's
                        swap_with[i], swap_with[partner[i]] = partner[i], i
                else:
                    array = self.runtime.empty((steps, *slot.shape), slot.dtype)
                    advance[i] = array.nbytes // steps
                arrays.append(array)
            for output_slot, input_slot in self._in_place_slots.items():
                arrays[output_slot] = arrays[input_slot]
            self._set_sizes()
            self._bound = self._prepared_at = None  # another entry ran: `tg_run` binds and prepares anew
            _check_status(self._interruptible(self.runtime.launch, self._steps_entry, arrays, steps, advance,
                                              swap_with))
            # every run ends with a swap: after an even number the newest state is back in the input's array
            newest = {i: arrays[p] if p is not None and steps % 2 == 0 and i not in self._in_place_slots else arrays[i]
                      for i, p in partner.items()}
            return [self.runtime.to_host(newest.get(i, arrays[i])) for i in self._outputs]

    def _arrays(self, inputs: list[np.ndarray]) -> list[DeviceBuffer]:
        """One buffer per slot: inputs moved to the device, captured buffers, and the run's outputs allocated
        together (`DeviceRuntime.outputs`); an output updated in place is its input's buffer (the caller's to
        overwrite). An input given as it was last time is passed without converting it (its dtype and layout hold),
        found by loops that run in C: a model passes hundreds of parameters."""
        arrays: list[DeviceBuffer] = list(self._slot_arrays)
        given = list(map(inputs.__getitem__, self._input_positions))
        passed = map(operator.call, self._passed)
        converted, anew = [], []
        for k in itertools.compress(range(len(given)), map(operator.is_not, passed, given)):
            anew.append(self._input_positions[k])
            dtype = self._slots[self._input_slot_indices[k]].dtype
            array = given[k] = self.runtime.to_device(given[k], dtype)
            if array is inputs[self._input_positions[k]]:
                self._passed[k] = weakref.ref(array)
            else:
                self._passed[k] = DEAD_REFERENCE
                converted.append(self._input_positions[k])
        self._converted, self._given_anew = frozenset(converted), frozenset(anew)
        for i, array in zip(self._input_slot_indices, given):
            arrays[i] = array
        self._bind_outputs(arrays)
        return arrays

    def _bind_outputs(self, buffers: MutableMapping[int, Any] | list[Any]) -> None:
        """The run's outputs into `buffers` (by slot), allocated together (`DeviceRuntime.outputs`); an output updated
        in place is its input's buffer (the caller's to overwrite), which `buffers` holds already."""
        for i, buffer in zip(self._output_slots, self.runtime.outputs(self._output_specs)):
            buffers[i] = buffer
        for output_slot, input_slot in self._in_place_slots.items():
            buffers[output_slot] = buffers[input_slot]


def _elements_touched(roots: list[Node], known: Collection[Node]) -> int:
    """Elements read and written by the graph's computed nodes: a cheap measure of its work."""
    stop = lambda n: n.op is Op.BUFFER or n in known  # noqa: E731
    return sum(node.size + sum(s.size for s in node.src) for node in toposort(roots, stop=stop) if not stop(node))


def _check_status(status: int) -> None:
    if status == TG_HOST_FAILED:
        host_calls.raise_failure()
    if status:
        raise IndexError("gather/scatter_add: an index is out of bounds for the dimension it indexes")


INTERPRET_BELOW = 1 << 16
"""Graphs touching fewer elements than this run on the reference interpreter instead: compiling a new graph
costs ~0.1 s, interpreting a small one microseconds per op (what eager use, printing and small tests need)."""


class NativeBackend:
    """Runs graphs as compiled C programs of `target`, one program per graph structure; small graphs are
    interpreted (`interpret_below` elements touched; 0 compiles everything)."""

    def __init__(self, name: str, target: CTarget, interpret_below: int = INTERPRET_BELOW) -> None:
        self.name, self.target = name, target
        self._programs: OrderedDict[tuple, Program] = OrderedDict()
        self.interpret_below = interpret_below

    def program(self, roots: list[Node], known: Mapping[Node, Any] | None = None,
                donate: Mapping[Node, int] | None = None, binder: Binder | None = None,
                varying: Callable[[Node], bool] | None = None) -> tuple[Program, list[Node]]:
        """The compiled program for `roots` and the nodes whose arrays it takes, in order. `donate` maps input
        nodes to the root each may be overwritten with (see `Program.updated_in_place`); `binder` (see
        `Program`) makes a program of its own, never cached here. `varying` tells the inputs that change from call to
        call, where the caller knows (the others keep preparations: `schedule.prepared`)."""
        known = {} if known is None else known
        is_input = lambda n: n.op is Op.BUFFER or n in known  # noqa: E731
        key, inputs = structure(roots, is_input)
        position = {node: i for i, node in enumerate(inputs)}
        donated = tuple(sorted((position[n], root) for n, root in (donate or {}).items() if n in position))
        changing = None if varying is None else frozenset(i for i, node in enumerate(inputs) if varying(node))
        key = (key, donated, changing)
        # the planner offers only what this target can run, and what the caller allows (tg.export: no OpenBLAS)
        with targeting(self.target.features & target_features()):
            found = None if binder else self._programs.get(key)
            if found is None or not still_taken(found.routes):
                given = set(inputs)  # not `known`: a node a decomposition builds may be realized elsewhere
                with collecting() as planned:
                    schedule = schedule_kernels(roots, given.__contains__)
                found = Program(schedule, inputs, self.target, donated=donated, binder=binder, search=True,
                                varying=changing)
                found.routes = routes_taken(planned)
                if binder:
                    return found, inputs
                found = step_check().choose(found, functools.partial(self._untuned, roots, inputs, donated, changing,
                                                                     found.routes), inputs)
                self._programs[key] = found
                if len(self._programs) > PROGRAM_CACHE_SIZE:
                    self._programs.popitem(last=False)
            else:
                self._programs.move_to_end(key)
        return found, inputs

    def _untuned(self, roots: list[Node], inputs: list[Node], donated: tuple[tuple[int, int], ...],
                 varying: frozenset[int] | None, routes: tuple) -> Program:
        """The program for `roots` with the defaults (`plan.choices.untuned`), for `plan.step_check`. It keeps the
        tuned program's `routes`: while the planner's choices hold, so does the step check's verdict."""
        with untuned():
            program = Program(schedule_kernels(roots, set(inputs).__contains__), inputs, self.target, donated=donated,
                              varying=varying)
        program.routes = routes
        return program

    def evaluate(self, roots: list[Node], known: Mapping[Node, np.ndarray] | None = None) -> list[np.ndarray]:
        known = {} if known is None else known
        is_input = lambda n: n.op is Op.BUFFER or n in known  # noqa: E731
        inputs = [n for n in toposort(roots, stop=is_input) if is_input(n)]
        return self.prepare(roots, inputs)([known[n] if n in known else n.arg.data for n in inputs])

    def prepare(self, roots: list[Node], inputs: list[Node]) -> Prepared:
        return Prepared(self, roots, inputs)


class Prepared:
    """`roots` over `inputs`, run on each call's arrays for them: interpreted while the backend interprets graphs
    this small (`NativeBackend.interpret_below`, read at each call), else as the compiled program (built once)."""

    def __init__(self, backend: NativeBackend, roots: list[Node], inputs: list[Node]) -> None:
        self.backend, self.roots, self.inputs = backend, roots, inputs
        self.touched = _elements_touched(roots, set(inputs))
        self._program: Program | None = None
        self._order: list[Node] = []  # the program's inputs
        self._positions: list[int | None] = []  # of each in `inputs` (None: a BUFFER the graph itself holds)

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        below = self.backend.interpret_below
        if below and self.touched < below:
            start = time.perf_counter()
            values = REFERENCE.evaluate(self.roots, dict(zip(self.inputs, arrays)))
            if KERNEL_OBSERVERS:
                _report("interpreted graph", start, time.perf_counter() - start)
            return values
        if self._program is None:
            self._program, self._order = self.backend.program(self.roots, dict.fromkeys(self.inputs))
            position = {n: i for i, n in enumerate(self.inputs)}
            self._positions = [position.get(n) for n in self._order]
        bound = [n.arg.data if p is None else arrays[p] for p, n in zip(self._positions, self._order)]
        return run_explained(self._program, self.roots, self._order, bound)


def run_explained(program: Program, roots: list[Node], inputs: list[Node], arrays: list[np.ndarray] | Changes,
                  caller: Binding | None = None) -> list[np.ndarray]:
    """`program.run(arrays, caller)`; when it reports an index out of bounds, the reference interpreter runs the
    graph (`roots` over `inputs` holding `arrays`) to raise the error that names the op, the index and the user's
    line."""
    try:
        return program.run(arrays, caller)
    except IndexError:
        REFERENCE.evaluate(roots, dict(zip(inputs, every_input(arrays))))
        raise
