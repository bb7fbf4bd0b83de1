"""What a function traced by `tg.compile` changes besides its return value.

A training step assigns parameters and optimizer state and sets `.grad`; while
tracing nothing is computed, so those effects are recorded here instead: the
first node each changed tensor had (what the traced graph reads), and the node
it holds at the end (what the compiled program must write back). The compiled
function turns them into program inputs read from the tensor at every call and
outputs written back into it after the call.
"""

from __future__ import annotations

import contextlib
import operator
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from tensorgraphs.errors import ArgumentError, UnsupportedError, fail
from tensorgraphs.graph.node import Node, toposort, with_sources
from tensorgraphs.graph.ops import Op
from tensorgraphs.runtime.buffer import Buffer

if TYPE_CHECKING:
    from tensorgraphs.frontend.tensor import Tensor

_state = threading.local()
traces_recording = 0
"""How many traces are being recorded, on any thread: a cheap test before `active()` on hot paths."""
_recording_lock = threading.Lock()
values_replaced = 0
"""Counts the times an existing tensor was given another node (`Tensor.node` set, a tensor made a view): while it
stands still, every tensor holds the node it held, so a compiled call binds the arrays it read last time again
(`compiled._Trace.read_inputs`) instead of reading each tensor."""


values_written = 0
"""Counts the times an array a tensor holds was written in place (a compiled step updating state it alone holds, a
collective writing into a private buffer): a program's kept preparations of such arrays are then made again
(`schedule.prepared`)."""


def note_value_replaced() -> None:
    global values_replaced
    values_replaced += 1


def note_value_written() -> None:
    global values_written
    values_written += 1


def placeholder(node: Node) -> Node:
    """Mark a BUFFER node as a placeholder (see `is_placeholder`)."""
    node.arg.placeholder = True
    return node


def is_placeholder(node: Node) -> bool:
    """Whether `node` is a buffer that only stands for a value while a function is traced (its arguments,
    stand-ins): its data is meaningless, so a graph that reads one after its trace would compute with made-up
    values."""
    return node.op is Op.BUFFER and node.arg.placeholder


def refuse_placeholders(what: str, leaves: Iterable[Node]) -> None:
    """Called where values are computed from `leaves` outside a trace: a placeholder among them has no value (a
    tensor made inside a traced function, kept in a variable that outlived the call), so refuse clearly rather
    than compute with made-up zeros."""
    if any(is_placeholder(n) for n in leaves):
        fail(what, "this tensor was computed inside a function traced by tg.compile, from its placeholder "
             "arguments, and kept past the call: it has no value; return it from the function instead",
             kind=UnsupportedError)


@dataclass(frozen=True)
class Captured:
    """Where a traced function read a buffer: from `tensor`, or (`grad_of`) from that leaf's `.grad`. The compiled
    program reads the tensor found there at every call, so later assigns, steps and loaded weights count."""

    tensor: Tensor | None = None
    grad_of: Tensor | None = None

    def current(self) -> Tensor | None:
        return self.tensor if self.grad_of is None else self.grad_of._grad


@dataclass
class Trace:
    """Effects recorded while tracing one call."""

    assigned: dict[int, tuple[Tensor, Node]] = field(default_factory=dict)  # id -> (tensor, node before)
    grads: dict[int, tuple[Tensor, Tensor | None]] = field(default_factory=dict)  # id -> (leaf, grad before)
    grads_read: set[int] = field(default_factory=set)  # leaves whose gradient from before the call was used
    stand_ins: dict[Node, Node] = field(default_factory=dict)  # leaf buffer standing in for an assigned value
    modes: dict[int, tuple[Any, bool]] = field(default_factory=dict)  # id -> (module called, its `training`)
    conditions: list[Callable[[], bool]] = field(default_factory=list)  # true while the trace's choices hold
    captured: dict[Node, Captured] = field(default_factory=dict)  # node read -> the tensor it was read from
    created: set[int] = field(default_factory=set)  # ids of the tensors made while tracing
    lives: list[Buffer] = field(default_factory=list)  # live buffers made while tracing (random keys), in order

    def stand_in(self, node: Node, value: Node) -> Node:
        """Let the leaf buffer `node` stand for `value` (which tracing cannot compute) until `resolve`."""
        self.stand_ins[placeholder(node)] = value
        return node

    def note_assign(self, tensor: Tensor) -> None:
        self.assigned.setdefault(id(tensor), (tensor, tensor.node))

    def note_grad(self, leaf: Tensor, cleared: bool = False) -> None:
        """`leaf.grad` is about to change; unless `cleared` (zero_grad), its present value (or absence) is used."""
        if id(leaf) not in self.grads and not cleared:
            self.grads_read.add(id(leaf))
        self.grads.setdefault(id(leaf), (leaf, leaf.grad))

    def resolve(self, roots: list[Node]) -> list[Node]:
        """`roots` with every stand-in replaced by the value it stands for, itself resolved (a value computed
        after an earlier assign reads that assign's stand-in). Stand-ins exist only while tracing."""
        rebuilt: dict[Node, Node] = {}

        def resolved(root: Node) -> Node:
            for node in toposort([root], stop=rebuilt.__contains__):
                if node in rebuilt:
                    continue
                if node in self.stand_ins:
                    rebuilt[node] = resolved(self.stand_ins[node])
                else:
                    rebuilt[node] = with_sources(node, tuple(rebuilt[s] for s in node.src))
            return rebuilt[root]

        return [resolved(r) for r in roots] if self.stand_ins else roots

    def restore(self) -> None:
        """Put every changed tensor back as it was before tracing (the compiled program then runs the call)."""
        for tensor, before in self.assigned.values():
            tensor.node = before
        for leaf, before in self.grads.values():
            leaf.grad = before


def note_condition(holds: Callable[[], bool]) -> None:
    """The trace being recorded made a choice from state that is not an argument (whether a data-parallel wrapper
    averages gradients): it is replayed only while `holds()`, else traced again."""
    trace = active()
    if trace is not None:
        trace.conditions.append(holds)


def note_created(tensor: Tensor) -> None:
    trace = active()
    if trace is not None:
        trace.created.add(id(tensor))


def note_live(buffer: Buffer) -> None:
    """A live buffer (`Buffer.live`) is made: a compiled call reads them in this order, so it draws random keys in
    the order eager code would."""
    trace = active()
    if trace is not None:
        trace.lives.append(buffer)


def note_read(tensor: Tensor, node: Node) -> None:
    """`tensor` is read while it holds `node`: a tensor made before the trace, and not assigned in it yet, is
    captured (see `Captured`)."""
    trace = active()
    if trace is None or id(tensor) in trace.created or id(tensor) in trace.assigned or is_placeholder(node):
        return
    if node.op is not Op.BUFFER or node.arg.live is None:
        trace.captured.setdefault(node, Captured(tensor=tensor))


def note_grad_read(leaf: Tensor, grad: Tensor, node: Node) -> None:
    """`leaf.grad` is read while it is `grad`, holding `node`: a gradient from before the trace, unless the trace
    set it, is read from the leaf at every call."""
    trace = active()
    if trace is not None and id(leaf) not in trace.grads and id(grad) not in trace.created:
        trace.captured.setdefault(node, Captured(grad_of=leaf))


def active() -> Trace | None:
    """The trace being recorded on this thread, if any."""
    return getattr(_state, "trace", None)


@contextlib.contextmanager
def recording() -> Iterator[Trace]:
    if active() is not None:
        fail("compile", "a function compiled with tg.compile cannot call another one while it is traced",
             kind=ArgumentError)
    global traces_recording
    _state.trace = trace = Trace()
    with _recording_lock:
        traces_recording += 1
    try:
        yield trace
    finally:
        with _recording_lock:
            traces_recording -= 1
        _state.trace = None


def refuse_values(what: str) -> None:
    """Called where a value would be computed: inside a trace the inputs are placeholders, so refuse clearly."""
    if active() is not None:
        fail(what, "tensor values cannot be read inside a function being traced by tg.compile (its inputs are "
             "placeholders then): return the tensor from the function and read it after the call",
             kind=ArgumentError)



class NumberArgument:
    """A Python int or float argument of a traced function. Tensor ops take it as a program input (`node`, a 0-d
    placeholder), so one program serves every value; any other use (a comparison, `int()`, a shape, `math.sqrt`)
    gets the number itself and marks it `specialized`: the trace then holds for this value only."""

    __slots__ = ("value", "node", "specialized")

    def __init__(self, value: int | float, node: Node) -> None:
        self.value = value
        self.node = node
        self.specialized = False

    def concrete(self) -> int | float:
        self.specialized = True
        return self.value

    def __index__(self) -> int:
        return operator.index(self.concrete())


def _concrete_unary(name: str) -> Callable[[NumberArgument], Any]:
    def method(self: NumberArgument, *rest: Any) -> Any:
        return getattr(self.concrete(), name)(*rest)

    return method


def _concrete_binary(name: str) -> Callable[[NumberArgument, Any], Any]:
    def method(self: NumberArgument, other: Any, *rest: Any) -> Any:
        if isinstance(other, NumberArgument):
            other = other.concrete()
        elif not isinstance(other, (int, float, complex)):
            return NotImplemented  # a Tensor's reflected operator takes the number as a program input
        return getattr(self.concrete(), name)(other, *rest)

    return method


for _name in ("__float__", "__int__", "__bool__", "__hash__", "__repr__", "__str__", "__format__", "__neg__",
              "__pos__", "__abs__", "__round__", "__trunc__", "__floor__", "__ceil__"):
    setattr(NumberArgument, _name, _concrete_unary(_name))
for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__radd__", "__sub__",
              "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__",
              "__mod__", "__rmod__", "__pow__", "__rpow__", "__divmod__", "__rdivmod__"):
    setattr(NumberArgument, _name, _concrete_binary(_name))
