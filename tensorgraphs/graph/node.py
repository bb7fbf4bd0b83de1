"""`Node`: the one IR, immutable and hash-consed.

Building the same node twice returns the same object, so equal subgraphs are
one object and common-subexpression elimination is free. Shape and dtype rules
are checked here as assertions: the Tensor API has already validated user input
and raised a readable error, so a failure here is a bug in tensorgraphs.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Iterator, Mapping

from tensorgraphs import dtypes
from tensorgraphs.dtypes import DType
from tensorgraphs.graph.ops import BINARY, COMPARISON, MOVEMENT, REDUCE, UNARY, Op

Shape = tuple[int, ...]


def _arg_key(arg: Any) -> Any:
    """Key for an op argument: floats by repr so -0.0 and 0.0 stay apart and NaN matches NaN."""
    if arg is None:
        return None
    if isinstance(arg, tuple):
        if set(map(type, arg)) <= _PLAIN_INTS:  # shapes, axes: the common case, keyed whole (checked in C)
            return ("ints", arg)
        return tuple(_arg_key(a) for a in arg)
    if isinstance(arg, float):
        return ("float", repr(arg))
    if isinstance(arg, (bool, int, str, DType, Op)):
        return (type(arg).__name__, arg)
    return ("id", id(arg))  # buffers, composites: identity


class _Interned(weakref.ref):
    """The interning table's reference to a node, which drops the node's entry when the node dies."""

    __slots__ = ("key",)


_INTERNED: dict[tuple, _Interned] = {}


def _forget(ref: _Interned, table: dict[tuple, _Interned] = _INTERNED) -> None:
    if table.get(ref.key) is ref:
        del table[ref.key]


class Node:
    """One operation in the graph. `op` is a primitive `Op` or a `Composite`."""

    __slots__ = ("op", "dtype", "shape", "size", "src", "arg", "arg_key", "__weakref__")
    _interned = _INTERNED
    """Every live non-BUFFER node by its key (op, dtype, shape, sources, argument); weak, so unused nodes die."""

    op: Any
    dtype: DType
    shape: Shape
    size: int  # elements: the product of `shape` (kept, as the scheduler asks it per node and index)
    src: tuple[Node, ...]
    arg: Any
    arg_key: Any  # `arg` as nodes are keyed by it (`_arg_key`)

    def __new__(cls, op: Any, dtype: DType, shape: Shape, src: tuple[Node, ...] = (), arg: Any = None) -> Node:
        if op is Op.BUFFER:  # each holds its own buffer object: nothing to share, so not interned
            return cls._made(op, dtype, shape, src, arg, ("id", id(arg)))
        return cls._interned_as(op, dtype, shape, src, arg, _arg_key(arg))

    @classmethod
    def _interned_as(cls, op: Any, dtype: DType, shape: Shape, src: tuple[Node, ...], arg: Any, arg_key: Any) -> Node:
        """The live node with this key, or a new one: `arg_key` given, as `with_sources` knows it already."""
        key = (op, dtype, shape, src, arg_key)  # sources by identity: a Node hashes and compares as an object
        ref = cls._interned.get(key)
        if ref is not None:
            found = ref()
            if found is not None:
                return found
        node = cls._made(op, dtype, shape, src, arg, arg_key)
        ref = _Interned(node, _forget)
        ref.key = key
        cls._interned[key] = ref
        return node

    @classmethod
    def _made(cls, op: Any, dtype: DType, shape: Shape, src: tuple[Node, ...], arg: Any, arg_key: Any) -> Node:
        node = object.__new__(cls)
        setattr_ = object.__setattr__  # past the immutability guard
        setattr_(node, "op", op)
        setattr_(node, "dtype", dtype)
        setattr_(node, "shape", shape)
        setattr_(node, "size", math.prod(shape))
        setattr_(node, "src", src)
        setattr_(node, "arg", arg)
        setattr_(node, "arg_key", arg_key)
        return node

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Node is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Node is immutable")

    def __reduce__(self):  # pragma: no cover - nodes are not meant to be pickled
        raise TypeError("Node cannot be pickled; realize the tensor instead")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        name = self.op.name if isinstance(self.op, Op) else f"composite:{self.op.name}"
        arg = "" if self.arg is None or self.op is Op.BUFFER else f", arg={self.arg!r}"
        return f"Node({name}, {self.dtype.name}, {self.shape}{arg}, src={len(self.src)})"

    def toposort(self) -> list[Node]:
        """Every node this one depends on, itself last, each after its sources."""
        return toposort([self])


def toposort(roots: list[Node], stop: Callable[[Node], bool] | None = None) -> list[Node]:
    """Nodes reachable from `roots`, sources first; below a node where `stop` holds is not visited."""
    order: list[Node] = []
    seen: set[Node] = set()  # a Node hashes and compares by identity
    stack: list[tuple[Node, Iterator[Node]]] = []
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        stack.append((root, iter(() if stop and stop(root) else root.src)))
        while stack:
            node, children = stack[-1]
            for child in children:
                if child not in seen:
                    seen.add(child)
                    stack.append((child, iter(() if stop and stop(child) else child.src)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def structure(roots: list[Node], is_input: Callable[[Node], bool]) -> tuple[tuple, list[Node]]:
    """A key equal for graphs that compute the same thing from different input arrays, and those inputs in order.
    Ops, composites and dtypes are singletons, so the key holds them as they are (it is built at every eager step)."""
    position: dict[Node, int] = {}
    entries: list[tuple] = []
    inputs: list[Node] = []
    found: set[Node] = set()  # `is_input` asked once per node (toposort asks it first)

    def stop(node: Node) -> bool:
        if is_input(node):
            found.add(node)
            return True
        return False

    for node in toposort(roots, stop=stop):
        position[node] = len(entries)
        if node in found:
            inputs.append(node)
            entries.append(("input", node.dtype, node.shape))
        else:
            entries.append((node.op, node.dtype, node.shape, node.arg_key,
                            tuple(map(position.__getitem__, node.src))))
    return (tuple(entries), tuple(position[r] for r in roots)), inputs


def with_sources(node: Node, src: tuple[Node, ...]) -> Node:
    """`node` reading `src` instead of its own sources (itself when they are the same nodes)."""
    if src == node.src:  # nodes compare by identity: the same sources
        return node
    return Node._interned_as(node.op, node.dtype, node.shape, src, node.arg, node.arg_key)


def substitute(roots: list[Node], replacements: dict[Node, Node]) -> list[Node]:
    """`roots` rebuilt with each key of `replacements` replaced by its value (the nodes between rebuilt)."""
    rebuilt = rebuild(toposort(roots, stop=replacements.__contains__), replacements)
    return [rebuilt[r] for r in roots]


Replacement = Node | Callable[[dict[Node, Node]], Node]


def rebuild(order: list[Node], replacements: Mapping[Node, Replacement],
            is_leaf: Callable[[Node], bool] = lambda node: False) -> dict[Node, Node]:
    """Each node of `order` (sources first) on the new graph: a replaced one as given, or built by its function from
    the new nodes so far; a leaf as it is; any other reading the new nodes of its sources. A caller rebuilding one
    graph many times keeps its order."""
    rebuilt = {node: r for node, r in replacements.items() if isinstance(r, Node)}
    for node in order:
        if node in rebuilt:
            continue
        replacement = replacements.get(node)
        if replacement is not None:
            rebuilt[node] = replacement(rebuilt)
        else:
            rebuilt[node] = node if is_leaf(node) else with_sources(node, tuple(rebuilt[s] for s in node.src))
    return rebuilt


# ---------------------------------------------------------------------------
# Builders: one per primitive family, each checking its shape/dtype rule.
# ---------------------------------------------------------------------------


_PLAIN_INTS = {int}


def _checked_shape(shape: Any) -> Shape:
    """A shape as a tuple of non-negative Python ints (numpy ints would leak into every later shape)."""
    if type(shape) is tuple and (not shape or (set(map(type, shape)) == _PLAIN_INTS and min(shape) >= 0)):
        return shape  # the common case, checked without a Python-level loop
    checked = tuple(int(s) for s in shape)
    assert all(s >= 0 for s in checked), f"negative size in shape {checked}"
    return checked


def _check_axes(axes: tuple[int, ...], ndim: int) -> None:
    assert all(0 <= a < ndim for a in axes) and len(set(axes)) == len(axes), f"axes {axes} for rank {ndim}"


def const(value: bool | int | float, dtype: DType, shape: Shape = ()) -> Node:
    if dtype.is_bool:
        value = bool(value)
    elif dtype.is_integer:
        value = _wrap_integer(int(value), dtype)
    else:
        value = float(value)
    return Node(Op.CONST, dtype, _checked_shape(shape), (), value)


def _wrap_integer(value: int, dtype: DType) -> int:
    """An integer outside `dtype`'s range wraps around (two's complement), as PyTorch's scalars do."""
    bits = dtype.bits
    value &= (1 << bits) - 1
    return value - (1 << bits) if dtype.kind == "i" and value >= 1 << (bits - 1) else value


def iota(length: int, dtype: DType) -> Node:
    return Node(Op.IOTA, dtype, _checked_shape((length,)))


def buffer(buf: Any, dtype: DType, shape: Shape) -> Node:
    return Node(Op.BUFFER, dtype, _checked_shape(shape), (), buf)


def unary(op: Op, x: Node, dtype: DType | None = None) -> Node:
    assert op in UNARY, op
    if op is Op.CAST:
        assert dtype is not None
        return x if dtype is x.dtype else Node(op, dtype, x.shape, (x,))
    assert x.dtype.is_floating_point, f"{op.name} needs a float input, got {x.dtype}"
    return Node(op, x.dtype, x.shape, (x,))


def binary(op: Op, a: Node, b: Node) -> Node:
    assert op in BINARY, op
    assert a.shape == b.shape and a.dtype is b.dtype, f"{op.name}: {a} vs {b}"
    if op is Op.MOD:
        assert a.dtype.is_integer
    if op in (Op.AND, Op.OR, Op.XOR):
        assert not a.dtype.is_floating_point
    out_dtype = dtypes.bool_ if op in COMPARISON else a.dtype
    return Node(op, out_dtype, a.shape, (a, b))


def where(cond: Node, a: Node, b: Node) -> Node:
    assert cond.dtype.is_bool and cond.shape == a.shape == b.shape and a.dtype is b.dtype
    return Node(Op.WHERE, a.dtype, a.shape, (cond, a, b))


def reduce(op: Op, x: Node, axes: tuple[int, ...]) -> Node:
    assert op in REDUCE
    axes = tuple(sorted(axes))
    _check_axes(axes, x.ndim)
    if not axes:
        return x
    shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    return Node(op, x.dtype, shape, (x,), axes)


def movement_shape(op: Op, shape: Shape, arg: Any) -> Shape:
    """The shape rule of every movement op (the Tensor API validates `arg` first)."""
    assert op in MOVEMENT
    if op is Op.RESHAPE:
        assert math.prod(arg) == math.prod(shape) and (not arg or min(arg) >= 0), (shape, arg)
        return tuple(arg)
    if op is Op.PERMUTE:
        assert sorted(arg) == list(range(len(shape))), arg
        return tuple(shape[i] for i in arg)
    if op is Op.EXPAND:
        assert len(arg) == len(shape) and all(s == t or s == 1 for s, t in zip(shape, arg)), (shape, arg)
        return tuple(arg)
    if op is Op.PAD:
        assert len(arg) == len(shape) and all(b >= 0 and a >= 0 for b, a in arg), arg
        return tuple(s + b + a for s, (b, a) in zip(shape, arg))
    if op is Op.SHRINK:
        assert len(arg) == len(shape) and all(0 <= b <= e <= s for s, (b, e) in zip(shape, arg)), (shape, arg)
        return tuple(e - b for b, e in arg)
    _check_axes(arg, len(shape))  # FLIP
    return shape


def is_noop_view(op: Op, shape: Shape, arg: Any) -> bool:
    """Whether a movement op with this argument leaves every index where it is."""
    if op in (Op.RESHAPE, Op.EXPAND):
        return tuple(arg) == shape
    if op is Op.PERMUTE:
        return tuple(arg) == tuple(range(len(shape)))
    if op is Op.PAD:
        return arg == ((0, 0),) * len(arg)
    if op is Op.SHRINK:
        return all(b == 0 and e == s for (b, e), s in zip(arg, shape))
    return not any(shape[a] > 1 for a in arg)  # FLIP of size-1 axes


def _plain_ints(arg: Any) -> Any:
    """Nested tuples of Python ints, so equal arguments given as lists or numpy ints share one node."""
    if type(arg) is tuple and set(map(type, arg)) <= _PLAIN_INTS:
        return arg
    return tuple(_plain_ints(a) if isinstance(a, (list, tuple)) else int(a) for a in arg)


def movement(op: Op, x: Node, arg: Any) -> Node:
    arg = _plain_ints(arg)
    if op is Op.FLIP:
        arg = tuple(sorted(arg))
    shape = movement_shape(op, x.shape, arg)
    return x if is_noop_view(op, x.shape, arg) else Node(op, x.dtype, shape, (x,), arg)


def gather(x: Node, index: Node, axis: int) -> Node:
    """out[..., i, ...] = x[..., index[..., i, ...], ...] along `axis`; other axes equal."""
    assert index.dtype.is_integer and index.ndim == x.ndim and 0 <= axis < x.ndim, (x, index, axis)
    assert all(a == b for d, (a, b) in enumerate(zip(x.shape, index.shape)) if d != axis), (x, index, axis)
    return Node(Op.GATHER, x.dtype, index.shape, (x, index), axis)


def scatter_add(base: Node, index: Node, values: Node, axis: int) -> Node:
    """The transpose of GATHER: out = base; out[..., index[i], ...] += values[i]."""
    assert index.dtype.is_integer and index.shape == values.shape and base.dtype is values.dtype
    assert index.ndim == base.ndim and 0 <= axis < base.ndim, (base, index, axis)
    assert all(i <= b for d, (b, i) in enumerate(zip(base.shape, index.shape)) if d != axis), (base, index, axis)
    return Node(Op.SCATTER_ADD, base.dtype, base.shape, (base, index, values), axis)
