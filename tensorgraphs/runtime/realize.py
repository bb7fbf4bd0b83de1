"""Realization: turn lazy nodes into data on the current device's backend.

Results of realized tensors are remembered per node while the node lives, so a
tensor printed twice is computed once and later graphs start from its value.

Eager code builds the same graphs over and over (one per training step, with
new parameter buffers each time). A backend that can `prepare` a graph gets it
once per *structure* (ops, dtypes, shapes, constants, wiring: `structure`): the
rewritten graph over data-free placeholders becomes an executable, and a graph
seen before is only bound to its new input arrays (no rewriting, scheduling or
code generation).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Hashable, Mapping, Protocol, Sequence

import numpy as np

from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.dtypes import DType
from tensorgraphs.errors import ArgumentError, UnsupportedError, fail
from tensorgraphs.graph import node as g
from tensorgraphs.graph.node import Node, structure, substitute, toposort
from tensorgraphs.graph.ops import SOURCES, Op
from tensorgraphs.rewrite import optimize
from tensorgraphs.rewrite.engine import rewriting_key
from tensorgraphs.runtime import tracing
from tensorgraphs.runtime.buffer import HOST, Buffer, byte_span
from tensorgraphs.runtime.tracing import refuse_placeholders, refuse_values


class Executable(Protocol):
    """A prepared graph: its roots' values from the host arrays of its inputs, in order."""

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]: ...


class Backend(Protocol):
    """Runs graphs. A backend may also have `prepare(roots, inputs) -> Executable`: a graph over data-free
    BUFFER `inputs` made into something that runs again on other arrays; realization then reuses it.

    Values cross this boundary as host numpy arrays; a compiled backend keeps device buffers and programs behind
    it (`runtime.device`), and docs/backends.md says how to write one."""

    name: str

    def evaluate(self, roots: list[Node], known: dict[Node, np.ndarray] | None = None) -> list[np.ndarray]: ...


BACKENDS: dict[str, Backend] = {"numpy": REFERENCE}
_state = threading.local()
_realized: dict[str, weakref.WeakKeyDictionary[Node, np.ndarray]] = {}
"""Per device: values of realized nodes, kept while the node lives (devices never share results)."""


def register_backend(backend: Backend) -> None:
    BACKENDS[backend.name] = backend


def default_device() -> str:
    """The device realizations run on: `set_default_device`'s, else "cpu" (compiled C) where a C compiler is
    installed, else the reference interpreter "numpy"."""
    return getattr(_state, "device", None) or _initial_device()


@functools.cache
def _initial_device() -> str:
    from tensorgraphs.backends.cpu.driver import GCC

    return "cpu" if "cpu" in BACKENDS and GCC.available() else "numpy"


def set_default_device(name: str | device) -> None:
    _state.device = device(name).require_available()


OTHER_DEVICE_TYPES = ("cuda", "mps", "xpu", "hip", "meta")
"""torch's device types tensorgraphs has no backend for: `device("cuda")` is a value (as in torch), using it fails."""


class device:
    """A device as torch.device is one (`type`, `index`, str, repr, ==, hash), and a context manager:
    `with tg.device("numpy"):` runs the block's realizations on that backend and restores the previous one.

    Tensors are lazy and live wherever they are realized, so a device names the backend that computes them.
    """

    __slots__ = ("type", "index")

    def __init__(self, type: str | device, index: int | None = None) -> None:
        if isinstance(type, device):
            type, index = type.type, type.index if index is None else index
        name, colon, suffix = str(type).partition(":")
        if colon:
            if index is not None or not suffix.isdigit():
                fail("device", f"invalid device string {type!r}: expected a type and an optional index, as 'cpu' "
                     f"or 'cuda:0'", kind=ArgumentError)
            index = int(suffix)
        if name not in BACKENDS and name not in OTHER_DEVICE_TYPES:
            fail("device", f"unknown device {name!r}; available: {', '.join(sorted(BACKENDS))}", kind=ArgumentError)
        if index is not None and (not isinstance(index, int) or index < 0):
            fail("device", f"device index must be a non-negative int, got {index!r}", kind=ArgumentError)
        self.type, self.index = name, index

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"device(type={self.type!r})" if self.index is None else \
            f"device(type={self.type!r}, index={self.index})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __reduce__(self) -> tuple:
        return device, (self.type, self.index)

    def require_available(self) -> str:
        """The backend's name; an UnsupportedError for torch's device types that tensorgraphs lacks."""
        if self.type not in BACKENDS:
            fail("device", f"tensorgraphs has no {self.type!r} device (tg.cuda.is_available() is False); its "
                           f"devices are {', '.join(sorted(BACKENDS))}: use 'cpu'", kind=UnsupportedError)
        return self.type

    def __enter__(self) -> device:
        name = self.require_available()
        _previous_devices().append(default_device())
        _state.device = name
        return self

    def __exit__(self, *exc: object) -> None:
        _state.device = _previous_devices().pop()


def _previous_devices() -> list[str]:
    if not hasattr(_state, "previous"):
        _state.previous = []
    return _state.previous


def realized_values(name: str) -> Mapping[Node, np.ndarray]:
    """The values device `name` has realized and still remembers."""
    return _realized.setdefault(name, weakref.WeakKeyDictionary())


_as_buffers: dict[str, weakref.WeakKeyDictionary[Node, Node]] = {}


def as_realized(node: Node) -> Node:
    """`node`, or a BUFFER holding its value where the current device has realized it (outside a trace): a graph
    built on it starts from the value and keeps nothing of the graph that computed it alive. Without this a loop
    carrying state (`h = f(x, h)`, `x = x * a + b`) chains every step's graph, and with it every value and weight
    of every step, into the next one."""
    if node.op in SOURCES or tracing.traces_recording:
        return node
    name = default_device()
    value = _realized.get(name, {}).get(node)
    if value is None:
        return node
    buffers = _as_buffers.setdefault(name, weakref.WeakKeyDictionary())
    found = buffers.get(node)
    if found is None:
        data = np.asarray(value, dtype=node.dtype.storage, order="C")
        found = buffers[node] = g.buffer(Buffer(HOST, node.dtype, node.shape, data), node.dtype, node.shape)
    return found


_carried: dict[int, tuple[weakref.ref, Node]] = {}
"""Carried nodes by their owner's id, in the order they were marked (a graph's extra outputs keep one order, so one
structure); an entry leaves when its owner dies."""


def carry(node: Node, owner: Any) -> None:
    """Mark `node` as state that eager code carries into later graphs while `owner` (the tensor holding it) lives:
    an RNN's hidden state, a tensor detached from a graph that requires grad. The next realization of a graph it is
    computed from computes it too (`carried_with`), so later graphs start from its value (`as_realized`) instead of
    recomputing (and growing by) every step before it. A temporary an op detaches inside its own graph dies at once,
    and is never computed for it."""
    if not tracing.traces_recording:
        key = id(owner)
        _carried[key] = weakref.ref(owner, lambda _: _carried.pop(key, None)), node


def carried_with(roots: list[Node]) -> list[Node]:
    """The carried nodes (`carry`) not known yet that are computed from the graph of `roots` or inside it (roots
    aside); they are no longer carried once returned."""
    known = realized_values(default_device())
    pending = {key: node for key, (_, node) in list(_carried.items()) if node not in known}
    if not pending:
        return []
    graph = {n for n in toposort(roots, stop=known.__contains__) if n.op not in SOURCES}
    below = lambda n: n in graph or n in known  # noqa: E731
    outputs = set(roots)
    state = {key: node for key, node in pending.items()
             if node not in outputs and any(n in graph for n in toposort([node], stop=below))}
    for key in state:
        _carried.pop(key, None)
    return list(dict.fromkeys(state.values()))


def realize(nodes: list[Node]) -> list[np.ndarray]:
    """Values of `nodes`, computed together (shared work done once) on the current device.

    The active rewrite rule sets run first (canonical form, user rules); results are remembered under
    the original nodes.
    """
    refuse_values("realize")
    name = default_device()
    known = realized_values(name)
    if all(n in known for n in nodes):  # computed before (a loss its backward pass computed): nothing to run
        return [known[n] for n in nodes]
    wanted, nodes = len(nodes), [*nodes, *carried_with(nodes)]
    backend = BACKENDS[name]
    if hasattr(backend, "prepare"):
        key, inputs = structure(nodes, lambda n: n.op is Op.BUFFER or is_data_view(n) or n in known)
        refuse_placeholders("realize", map(view_source, inputs))
        run, _ = cached_executable(("graph", key), lambda: (*graph_without_data(nodes, inputs), None))
        values = run([known[n] if n in known else input_value(n) for n in inputs])
    else:
        refuse_placeholders("realize", toposort(nodes, stop=known.__contains__))
        values = backend.evaluate(optimize(nodes, stop=known.__contains__), known=known)
    for node, value in zip(nodes, values):
        known[node] = value
    return values[:wanted]


DATA_VIEWS = frozenset({Op.SHRINK, Op.RESHAPE, Op.PERMUTE, Op.FLIP})
"""The views a data view is made of: none grows the data (a broadcast or a padding stays in the graph)."""


def view_source(node: Node) -> Node:
    """The node under `node`'s `DATA_VIEWS` (itself if it is none)."""
    while node.op in DATA_VIEWS:
        node = node.src[0]
    return node


def is_data_view(node: Node) -> bool:
    """Whether `node` is a slice (`DATA_VIEWS`, a SHRINK among them) of a buffer no leaf differentiates into: a batch
    taken from a data set, at another offset at each step. Eager graphs take its value as an input array, so they
    keep one structure (and one compiled program) while the slice moves; the array copies no more than the slice.
    Without a SHRINK (a frozen weight's transpose) the view stays in the graph, which reads it in place."""
    sliced = False
    while node.op in DATA_VIEWS:
        sliced = sliced or node.op is Op.SHRINK
        node = node.src[0]
    return sliced and node.op is Op.BUFFER and node.arg.grad_leaf is None


def input_value(node: Node) -> np.ndarray:
    """The array of an eager graph's input: a buffer's data, or a data view of one (`is_data_view`) read from it."""
    return node.arg.data if node.op is Op.BUFFER else REFERENCE.evaluate([node])[0]


EXECUTABLE_CACHE_SIZE = 512
_executables: OrderedDict[Hashable, tuple[Executable, Any]] = OrderedDict()


def cached_executable(key: Hashable, build: Callable[[], tuple[list[Node], list[Node], Any]]) -> tuple[Executable, Any]:
    """The executable kept under `key` on the current device, with what `build` said about it; on first sight
    `build()` gives (roots, placeholder inputs, info) and the graph is `prepare`d. `key` must fix the graph
    `build` makes: the cache adds the device and the rewriting state."""
    full_key = (default_device(), rewriting_key(), key)
    found = _executables.get(full_key)
    if found is not None:
        _executables.move_to_end(full_key)
        return found
    roots, inputs, info = build()
    found = _executables[full_key] = prepare(roots, inputs), info
    if len(_executables) > EXECUTABLE_CACHE_SIZE:
        _executables.popitem(last=False)
    return found


def prepare(roots: list[Node], inputs: list[Node]) -> Executable:
    """`roots` over the BUFFER nodes `inputs` (placeholders: their data is never read) as an executable of the
    current device that takes the inputs' arrays at each call: rewritten once, then prepared by the backend (or
    evaluated at each call, for a backend that cannot prepare)."""
    backend = BACKENDS[default_device()]
    optimized = optimize(roots, stop=set(inputs).__contains__)
    if hasattr(backend, "prepare"):
        return backend.prepare(optimized, inputs)
    return lambda arrays: backend.evaluate(optimized, dict(zip(inputs, arrays)))


def owned(values: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """`values` (an executable's results for `inputs`) where each shares memory with no input and no other value,
    so a tensor may hold it as its own: a result that is an input or a view of one (an interpreted graph returns
    those) is copied, and of results overlapping in one allocation all but one. Disjoint parts of one allocation
    (a compiled program's small outputs share one) are distinct memory."""
    taken = {id(_memory_of(a)) for a in inputs}
    by_owner: dict[int, list[int]] = {}
    for index, value in enumerate(values):
        by_owner.setdefault(id(_memory_of(value)), []).append(index)
    copied: set[int] = set()
    for owner, indices in by_owner.items():
        if owner in taken:
            copied.update(indices)
        elif len(indices) > 1:
            end = None
            spans = {i: byte_span(values[i]) for i in indices}
            for index in sorted(indices, key=lambda i: (spans[i][0], i)):  # same start: the earlier result stays
                start, stop = spans[index]
                if end is not None and start < end:
                    copied.add(index)
                else:
                    end = stop
    return [value.copy() if index in copied else value for index, value in enumerate(values)]


def _memory_of(array: np.ndarray) -> Any:
    """The object owning `array`'s memory (the end of its chain of bases)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array if array.base is None else array.base


def placeholder(dtype: DType, shape: tuple[int, ...]) -> Node:
    """A BUFFER node of `dtype` and `shape` whose data (zero-stride zeros) is never read: an input of `prepare`."""
    return g.buffer(Buffer(HOST, dtype, shape, np.broadcast_to(np.zeros((), dtype.storage), shape)), dtype, shape)


def graph_without_data(roots: list[Node], inputs: list[Node]) -> tuple[list[Node], list[Node]]:
    """`roots` and `inputs` with every input a zero-stride BUFFER of its dtype and shape: the graph runs again on
    other arrays and keeps none of the arrays it was built with alive."""
    free = {n: placeholder(n.dtype, n.shape) for n in inputs}
    return substitute(roots, free), [free[n] for n in inputs]
