"""The lazy `Tensor`: a node in the graph plus autograd bookkeeping.

Operations build nodes and check shapes and dtypes at the call, raising errors
that name the op, the operands and the user's line. Nothing runs until a value
is needed (`numpy()`, `item()`, `realize()`, printing).
"""

from __future__ import annotations

import functools
import math
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.dtypes import DType
from tensorgraphs.errors import ArgumentError, DTypeError, ShapeError, fail
from tensorgraphs.frontend.autocast import autocast_suspended
from tensorgraphs.frontend.checks import dims_arg, int_arg
from tensorgraphs.frontend.grad_mode import is_grad_enabled
from tensorgraphs.graph import composite as composites
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import DETACH, Composite, detach_node, make_node
from tensorgraphs.graph.node import Node, Shape
from tensorgraphs.graph.ops import BINARY, MOVEMENT, REDUCE, UNARY, Op
from tensorgraphs.runtime import tracing
from tensorgraphs.runtime.buffer import HOST, Buffer
from tensorgraphs.runtime.realize import as_realized, carry, default_device, device, realize

Scalar = bool | int | float


class Tensor:
    """A lazily evaluated n-dimensional array with PyTorch's names and semantics."""

    __slots__ = ("_node", "requires_grad", "_grad", "_base", "_steps", "_seen", "__weakref__")
    __array_priority__ = 1000  # numpy scalars on the left defer to our operators

    def __init__(self, node: Node, requires_grad: bool = False) -> None:
        self._node = node
        self._grad: Tensor | None = None
        self._base: Tensor | None = None  # a view's base, whose value it reads (frontend.inplace_ops)
        self._steps: tuple = ()  # a view's movement steps from its base's node
        self._seen: Node | None = None  # the base node a view's `_node` was computed from
        self.requires_grad = False
        if tracing.traces_recording:
            tracing.note_created(self)
        if requires_grad:
            self.requires_grad_(True)

    @property
    def node(self) -> Node:
        """The graph node holding this tensor's value. A function traced by tg.compile that reads a tensor made
        before the trace reads it from this tensor at every call (`tracing.note_read`). A view reads its base's
        present value (`frontend.inplace_ops`)."""
        base = self._base
        if base is not None:
            base_node = base._node if base._base is None and not tracing.traces_recording else base.node
            if self._seen is not base_node:
                self._node, self._seen = replay(self._steps, base_node), base_node
            return self._node
        node = self._node
        if tracing.traces_recording:
            tracing.note_read(self, node)
        return node

    @node.setter
    def node(self, node: Node) -> None:
        """Replace the value wholesale: a view stops being one (writes into a view go through `inplace_ops.write`)."""
        self._node = node
        self._base = None
        tracing.note_value_replaced()

    @property
    def grad(self) -> Tensor | None:
        grad = self._grad
        if grad is not None and tracing.traces_recording:
            tracing.note_grad_read(self, grad, grad._node)
        return grad

    @grad.setter
    def grad(self, grad: Tensor | None) -> None:
        self._grad = grad

    # -- construction ------------------------------------------------------
    @staticmethod
    def from_numpy(array: np.ndarray, dtype: DType | None = None, requires_grad: bool = False) -> Tensor:
        array = np.asarray(array)
        dtype = dtypes.from_numpy_dtype(array.dtype) if dtype is None else dtype
        data = array.astype(dtype.storage, order="C")  # a fresh copy; keeps 0-d arrays 0-d
        data = dtypes.round_to_storage(data, dtype)
        return Tensor(host_buffer(data, dtype), requires_grad=requires_grad)

    @staticmethod
    def result(node: Node, *parents: Tensor) -> Tensor:
        """Wrap a new node; it requires grad when recording, a parent does and it is float (as in PyTorch)."""
        out = Tensor(node)
        if node.dtype.is_floating_point:
            for parent in parents:
                if parent.requires_grad:
                    out.requires_grad = is_grad_enabled()
                    break
        return out

    def node_for_op(self) -> Node:
        """The node an op should consume: gradients are cut here when not recording; a value computed already is
        read as data (`as_realized`)."""
        if self.requires_grad:
            return self.node if is_grad_enabled() else detach_node(self.node)
        return as_realized(self.node)

    # -- properties ----------------------------------------------------------
    # Read for every op built: a tensor that is no view, outside a trace, answers from its own node directly.
    @property
    def shape(self) -> Shape:
        if self._base is None and not tracing.traces_recording:
            return self._node.shape
        return self.node.shape

    @property
    def dtype(self) -> DType:
        if self._base is None and not tracing.traces_recording:
            return self._node.dtype
        return self.node.dtype

    @property
    def ndim(self) -> int:
        if self._base is None and not tracing.traces_recording:
            return len(self._node.shape)
        return len(self.node.shape)

    @property
    def device(self) -> device:
        """The device that computes this tensor: the current one (tensors are lazy)."""
        return device(default_device())

    @property
    def is_leaf(self) -> bool:
        return not self.requires_grad or self.node.op is Op.BUFFER

    def size(self, dim: int | None = None) -> Shape | int:
        return self.shape if dim is None else self.shape[normalize_dim("size", dim, self.ndim)]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return math.prod(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            fail("len", "len() of a 0-d tensor", kind=ShapeError)
        return self.shape[0]

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    # -- materialization -----------------------------------------------------
    def realize(self) -> Tensor:
        realize([self.node])
        return self

    def numpy(self) -> np.ndarray:
        if self.requires_grad:
            fail("numpy", "can't call numpy() on a tensor that requires grad; use tensor.detach().numpy()",
                 kind=ArgumentError)
        return self._value().copy()

    def _value(self) -> np.ndarray:
        node = self.node
        if node.op is Op.BUFFER and not tracing.traces_recording and not node.arg.placeholder:
            return _held_value(node)  # what `node_values` reads, without its bookkeeping for many nodes
        return node_values([node])[0]

    def item(self) -> Scalar:
        if self.numel() != 1:
            fail("item", f"a tensor with {self.numel()} elements cannot be converted to a Python scalar")
        return self._value().reshape(()).item()

    def tolist(self) -> Any:
        return self._value().tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self._value()
        return value if dtype is None else value.astype(dtype)

    def __repr__(self) -> str:
        body = np.array2string(self._value(), separator=", ", prefix="tensor(", precision=4)
        extra = "" if self.dtype in (dtypes.float32, dtypes.int64, dtypes.bool_) else f", dtype={self.dtype!r}"
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({body}{extra}{grad})"

    def __bool__(self) -> bool:
        if self.numel() != 1:
            fail("bool", f"the truth value of a tensor with {self.numel()} elements is ambiguous; use .any() or .all()",
                 kind=ArgumentError)
        return bool(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __index__(self) -> int:
        if self.dtype.is_floating_point or self.numel() != 1:
            fail("index", "only integer tensors of a single element can be converted to an index", kind=DTypeError)
        return int(self.item())

    def __hash__(self) -> int:
        return id(self)

    # -- autograd ------------------------------------------------------------
    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if requires_grad and not (self.dtype.is_floating_point):
            fail("requires_grad_", f"only floating point tensors can require gradients, got {self.dtype.name}",
                 kind=DTypeError)
        if not self.is_leaf:
            if not requires_grad:
                fail("requires_grad_", "only leaf tensors can change requires_grad; use tensor.detach() to get a "
                     "tensor that does not require grad", kind=ArgumentError)
            return self
        if requires_grad and not self.requires_grad:
            self.node = _own_buffer(self.node)  # other tensors holding the old node must not send gradient here
        if self.node.op is Op.BUFFER:
            self.node.arg.grad_leaf = weakref.ref(self) if requires_grad else None
        self.requires_grad = requires_grad
        return self

    def detach(self) -> Tensor:
        """A tensor of the same storage (a view: writes into either show in both) that does not require grad."""
        out = Tensor(detach_node(self.node) if self.requires_grad else self.node)
        link_view(self, out)
        if self.requires_grad:
            carry(out.node, out)
        return out

    def backward(self, gradient: Tensor | None = None, retain_graph: bool | None = None,
                 create_graph: bool = False) -> None:
        from tensorgraphs.frontend.backward import backward

        backward(self, gradient, retain_graph, create_graph)

    def register_post_accumulate_grad_hook(self, hook: Callable[[Tensor], None]) -> Any:
        """torch's: `hook(self)` runs after each backward() that accumulates into this leaf's `.grad`."""
        from tensorgraphs.autograd.hooks import register_post_accumulate_grad_hook

        return register_post_accumulate_grad_hook(self, hook)

    def _hold(self, array: np.ndarray) -> None:
        """`assign` of an array nothing else holds (see `realize.owned`), kept as it is: no copy, no fresh pages."""
        node = _held(array, self.dtype)
        if self.requires_grad:
            node.arg.grad_leaf = weakref.ref(self)
        self.node = node

    # Operators and methods are attached by tensorgraphs.frontend.methods.


# decomposition bodies are written with Tensors, and a decomposition is the same whether or not it is built in an
# autocast region
composites.use_values(Tensor, lambda tensor: tensor.node, autocast_suspended)


def link_view(x: Tensor, out: Tensor) -> None:
    """Make `out` a view of `x` (torch's view ops) when its node is `x`'s under movement ops and detaches only."""
    if out is x:
        return
    source, node, steps = x._node, out._node, []
    read = as_realized(source)  # what an op on `x` consumed
    while node is not source and node is not read:
        if node.op in MOVEMENT and not (node.op is Op.PAD and any(w < 0 for pair in node.arg for w in pair)):
            steps.append((node.op, node.arg))
        elif node.op is DETACH:
            steps.append((DETACH, None))
        else:
            return
        node = node.src[0]
    steps.reverse()
    if x._base is None:
        out._base, out._steps, out._seen = x, tuple(steps), source
    else:
        out._base, out._steps, out._seen = x._base, x._steps + tuple(steps), x._seen


def viewing(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (an op that returns a tensor or a sequence of them) made a view op: each result is a view of the first
    argument where it is one (see `link_view`)."""

    @functools.wraps(fn)
    def view_op(x: Tensor, *args: Any, **kwargs: Any) -> Any:
        out = fn(x, *args, **kwargs)
        if isinstance(x, Tensor):
            for result in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(result, Tensor):
                    link_view(x, result)
        return out

    return view_op


def replay(steps: tuple, node: Node) -> Node:
    """`node` after a view's steps: movement ops `(op, arg)`, and detaches (`(DETACH, None)`, `.data`'s)."""
    for op, arg in steps:
        node = g.movement(op, node, arg) if isinstance(op, Op) else as_realized(detach_node(node))
    return node


def host_buffer(data: np.ndarray, dtype: DType) -> Node:
    """A BUFFER node holding `data` (in `dtype`'s storage type, C order) on the host."""
    return g.buffer(Buffer(HOST, dtype, tuple(data.shape), data), dtype, tuple(data.shape))


def _held(array: np.ndarray, dtype: DType) -> Node:
    """A BUFFER node holding `array` itself (converted only if not yet `dtype`'s storage in C order)."""
    return host_buffer(np.asarray(array, dtype=dtype.storage, order="C"), dtype)


def values_of(tensors: Sequence[Tensor]) -> list[np.ndarray]:
    """The tensors' values as arrays of their storage type (see `node_values`)."""
    return node_values([t.node for t in tensors])


def node_values(nodes: Sequence[Node]) -> list[np.ndarray]:
    """The nodes' values as arrays of their storage type, for one tensor's (`Tensor._value`) or many at once (an
    optimizer step reads hundreds): held buffers are read directly (outside a trace, which reads every buffer
    through its graph), the rest realized together, as one graph."""
    direct = [n.op is Op.BUFFER and not tracing.traces_recording for n in nodes]
    tracing.refuse_placeholders("realize", [n for n, held in zip(nodes, direct) if held])
    pending = list(dict.fromkeys(n for n, held in zip(nodes, direct) if not held))
    computed = dict(zip(pending, realize(pending))) if pending else {}
    return [_held_value(n) if held else computed[n].astype(n.dtype.storage, copy=False)
            for n, held in zip(nodes, direct)]


def _held_value(node: Node) -> np.ndarray:
    """A BUFFER node's array, as its storage type."""
    return node.arg.data.astype(node.dtype.storage, copy=False)


def held(array: np.ndarray, dtype: DType) -> Tensor:
    """A tensor holding `array` itself, which nothing else may hold (see `realize.owned`)."""
    return Tensor(_held(array, dtype))


def live_buffer(value: np.ndarray, read: Callable[[], np.ndarray], dtype: DType) -> Tensor:
    """A tensor holding `value` that a compiled program refills with `read()` at every call (`Buffer.live`):
    a learning rate a scheduler changes, the next random key."""
    tensor = Tensor.from_numpy(value, dtype)
    tensor.node.arg.live = read
    tracing.note_live(tensor.node.arg)
    return tensor


def _materialize(node: Node) -> Node:
    """A fresh BUFFER node holding `node`'s value (a copy: a compiled step may update a leaf's array in place)."""
    value = node.arg.data if node.op is Op.BUFFER else realize([node])[0]
    return host_buffer(np.array(value, dtype=node.dtype.storage, order="C"), node.dtype)


def fresh_buffer(node: Node) -> Node:
    """A BUFFER node of its own with `node`'s value: a copy, or while tracing a stand-in that the compiled program
    fills with `node`'s value at every call (so a copy of an argument still reads the argument)."""
    trace = tracing.active()
    return _materialize(node) if trace is None else _stand_in(trace, node)


def _stand_in(trace: tracing.Trace, value: Node) -> Node:
    """A leaf BUFFER node of its own for `value` while tracing: nothing is computed then, so the compiled program
    reads `value` wherever the graph reads this buffer (`Trace.resolve`)."""
    return trace.stand_in(host_buffer(np.zeros(value.shape, value.dtype.storage), value.dtype), value)


def _own_buffer(node: Node) -> Node:
    """A BUFFER node no other tensor has, with `node`'s value (a buffer's data is shared, as torch's detach does).
    While tracing it stands in for `node`, so a leaf made from an argument still reads the argument at every call."""
    trace = tracing.active()
    if trace is not None:
        return _stand_in(trace, node)
    if node.op is not Op.BUFFER:
        return _materialize(node)
    return g.buffer(Buffer(node.arg.device, node.dtype, node.shape, node.arg.data), node.dtype, node.shape)


# ---------------------------------------------------------------------------
# Helpers every op module uses.
# ---------------------------------------------------------------------------


def is_scalar(value: object) -> bool:
    return isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating, tracing.NumberArgument))


def _number_tensor(value: tracing.NumberArgument, dtype: DType) -> Tensor:
    """A number argument of a traced function as the program input it is (its placeholder), in `dtype`."""
    return cast(Tensor(value.node), dtype)


def as_tensor(value: Any, dtype: DType | None = None) -> Tensor:
    """A Tensor from a Tensor, a scalar, a numpy array or nested lists."""
    if isinstance(value, Tensor):
        return value if dtype is None else value.to(dtype)
    if isinstance(value, tracing.NumberArgument):
        return _number_tensor(value, dtypes.scalar_dtype(value.value) if dtype is None else dtype)
    if is_scalar(value):
        dtype = dtypes.scalar_dtype(value) if dtype is None else dtype
        return Tensor(g.const(value, dtype))
    array = dtypes.host_array("tensor", value)
    if dtype is None:  # numpy data keeps its type, nested Python lists take PyTorch's defaults
        numpy_data = isinstance(value, (np.ndarray, np.generic))
        dtype = dtypes.from_numpy_dtype(array.dtype) if numpy_data else dtypes.python_data_dtype(array.dtype)
    return Tensor.from_numpy(array, dtype)


def normalize_dim(op: str, dim: int, ndim: int) -> int:
    """A possibly negative dim as an index in [0, ndim); a 0-d tensor accepts 0 and -1."""
    dim = int_arg(op, "dim", dim)
    bound = max(ndim, 1)
    if not -bound <= dim < bound:
        fail(op, f"dim {dim} is out of range for a tensor with {ndim} dimensions (expected [{-bound}, {bound - 1}])",
             kind=ShapeError)
    return dim % bound


def normalize_dims(op: str, dim: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """`None` means every dim; duplicates are an error, as in PyTorch."""
    if dim is None:
        return tuple(range(ndim))
    dims = dims_arg(op, dim)
    normalized = tuple(normalize_dim(op, d, ndim) for d in dims)
    if len(set(normalized)) != len(normalized):
        fail(op, f"dim {tuple(dims)} appears multiple times in the list of dims", kind=ShapeError)
    return tuple(d for d in normalized if d < ndim)


def broadcast_shapes(op: str, *shapes: Shape) -> Shape:
    if shapes and all(s == shapes[0] for s in shapes):
        return tuple(shapes[0])
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(-ndim, 0):
        size = 1
        for s in shapes:
            if len(s) >= -axis and s[axis] != 1:
                if size != 1 and s[axis] != size:
                    sizes = sorted({s[axis] for s in shapes if len(s) >= -axis} - {1})
                    listed = " and ".join(str(tuple(s)) for s in shapes)
                    fail(op, f"shapes {listed} cannot be broadcast together (dim {axis}: sizes {sizes})")
                size = s[axis]
        result.append(size)
    return tuple(result)


def cast(t: Tensor, dtype: DType) -> Tensor:
    if t.dtype is dtype:
        return t
    return Tensor.result(g.unary(Op.CAST, t.node_for_op(), dtype), *([t] if dtype.is_floating_point else []))


def expand_to(t: Tensor, shape: Shape) -> Tensor:
    """Broadcast `t` to `shape` (shapes already checked)."""
    if t.shape == shape:
        return t
    node = t.node_for_op()
    lead = (1,) * (len(shape) - t.ndim) + t.shape
    node = g.movement(Op.RESHAPE, node, lead)
    return Tensor.result(g.movement(Op.EXPAND, node, shape), t)


def operands(op: str, *values: Any, dtype: DType | None = None,
             floating: bool = False) -> tuple[list[Tensor], DType]:
    """Tensors and scalars promoted to one dtype (PyTorch rules) and broadcast to one shape.

    `floating` ops (true division, atan2, ...) compute an integer or bool result type in the default
    float, so Python scalars convert to it directly (uint8 / -3 is -1/3, not 1/253).
    """
    tensors = [v for v in values if isinstance(v, Tensor)]
    if len(tensors) == len(values):  # the common case: tensors of one dtype and shape are taken as they are
        first_dtype, first_shape = tensors[0].dtype, tensors[0].shape
        if (dtype is None or dtype is first_dtype) and (first_dtype.is_floating_point or not floating) and all(
                t.dtype is first_dtype and t.shape == first_shape for t in tensors):
            return list(tensors), first_dtype
    scalars = [v for v in values if not isinstance(v, Tensor)]
    for s in scalars:
        if not is_scalar(s):
            fail(op, f"expected a Tensor or a number, got {type(s).__name__}", kind=DTypeError)
    if dtype is None:
        dims, zero_dims = [t.dtype for t in tensors if t.ndim], [t.dtype for t in tensors if not t.ndim]
        numbers = [s.value if isinstance(s, tracing.NumberArgument) else s for s in scalars]  # their types count
        dtype = dtypes.result_type(dims, zero_dims, numbers)
    if floating and not dtype.is_floating_point:
        dtype = dtypes.default_float
    shape = broadcast_shapes(op, *(t.shape for t in tensors))
    out = []
    for v in values:
        if isinstance(v, Tensor):
            t = cast(v, dtype)
        elif isinstance(v, tracing.NumberArgument):
            t = _number_tensor(v, dtype)
        else:
            out.append(Tensor(g.const(v, dtype, shape)))
            continue
        out.append(expand_to(t, shape))
    return out, dtype


def apply(op: Op, *inputs: Tensor, arg: Any = None) -> Tensor:
    """Build one primitive node from already-checked inputs."""
    nodes = [t.node_for_op() for t in inputs]
    if op in BINARY:
        node = g.binary(op, *nodes)
    elif op in MOVEMENT:
        node = g.movement(op, nodes[0], arg)
    elif op in REDUCE:
        node = g.reduce(op, nodes[0], arg)
    elif op is Op.WHERE:
        node = g.where(*nodes)
    elif op is Op.GATHER:
        node = g.gather(nodes[0], nodes[1], arg)
    elif op is Op.SCATTER_ADD:
        node = g.scatter_add(nodes[0], nodes[1], nodes[2], arg)
    else:
        assert op in UNARY and op is not Op.CAST, op
        node = g.unary(op, nodes[0])
    return Tensor.result(node, *inputs)


def apply_composite(composite: Composite, *inputs: Tensor, **params: Any) -> Tensor:
    dtype, shape = composite.infer(*inputs, **params)
    node = make_node(composite, tuple(t.node_for_op() for t in inputs), params, dtype, shape)
    return Tensor.result(node, *inputs)


def full_like_node(value: Scalar, t: Tensor, dtype: DType | None = None) -> Tensor:
    return Tensor(g.const(value, t.dtype if dtype is None else dtype, t.shape))
