"""In-place operations with PyTorch's semantics, on a graph whose nodes never change.

An in-place op computes its new value functionally and makes the tensor point at the new node; graphs built
before keep reading the old node, so backward differentiates what was computed. A view (`reshape`, basic
indexing, `detach`, `.data`, ...: `tensor.viewing`) records its base and the movement steps from the base's
node, and reads the base's present value; a write into a view rebuilds the base (`_unview`: the written
region from the new value, the rest from the old), so the base and every other view see it.

Autograd's rules are torch's: outside `no_grad()` a leaf that requires grad (or a view of one) cannot be
written. Inside it, such a leaf stays a leaf: its new value becomes a buffer of its own. A write also marks
the replaced node as overwritten (`overwritten`), so a backward that still needs that value raises torch's
error instead of silently differentiating a value the user has changed.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from tensorgraphs import dtypes
from tensorgraphs.errors import AutogradError, DTypeError, IndexingError, ShapeError, UnsupportedError, fail
from tensorgraphs.frontend import creation
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.grad_mode import is_grad_enabled
from tensorgraphs.frontend.tensor import (
    DETACH,
    Tensor,
    as_tensor,
    broadcast_shapes,
    cast,
    detach_node,
    expand_to,
    fresh_buffer,
    link_view,
    replay,
)
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import Composite, make_node, register
from tensorgraphs.graph.node import Node
from tensorgraphs.graph.ops import Op
from tensorgraphs.runtime import tracing

overwritten: weakref.WeakKeyDictionary[Node, weakref.ref[Node]] = weakref.WeakKeyDictionary()
"""A node replaced by an in-place write of a tensor that requires grad -> the node that replaced it (held weakly:
it reads the old node, which would otherwise never be freed)."""

CLONE = register(Composite("clone", infer=lambda x: (x.dtype, x.shape), decompose=lambda x: x,
                           grad=lambda out, grad, x: (grad,)))
"""`clone()`: a node of its own with its input's value and gradient, so a write into a clone is not one into the
original (`overwritten` is by node)."""

DATA = "data"
"""The step of a `.data` view: a detach whose writes autograd does not see (no `overwritten` mark), as torch's."""


# ---------------------------------------------------------------------------
# the write itself
# ---------------------------------------------------------------------------


def check_writable(target: Tensor, op: str) -> None:
    """torch's rule: outside no_grad(), a leaf that requires grad, or a view of one, cannot be written in place."""
    if not (is_grad_enabled() and target.requires_grad):
        return
    base = target._base
    if base is not None and base.requires_grad and base.is_leaf:
        fail(op, "a view of a leaf Variable that requires grad is being used in an in-place operation.",
             kind=AutogradError)
    if base is None and target.is_leaf:
        fail(op, "a leaf Variable that requires grad is being used in an in-place operation.", kind=AutogradError)


def write(target: Tensor, value: Tensor) -> Tensor:
    """Make `target` hold `value` (of its shape and dtype): through its base if it is a view."""
    base = target if target._base is None else target._base
    node = value.node_for_op()
    if target._base is not None:
        node = _unview(target._steps, base.node, node)
    _commit(base, node, value.requires_grad and is_grad_enabled(), all(op != DATA for op, _ in target._steps))
    if target is not base and base.requires_grad and is_grad_enabled():
        target.requires_grad = True
    return target


def _commit(base: Tensor, node: Node, grad: bool, tracked: bool = True) -> None:
    """Point the non-view `base` at `node` (a tensor that requires `grad` wrote it); `tracked`: autograd sees it."""
    trace = tracing.active()
    if trace is not None and not any(leaf._grad is base for leaf, _ in trace.grads.values()):
        trace.note_assign(base)  # a gradient the traced backward set is written back as that leaf's gradient
    before = base.node
    tracked = tracked and base.requires_grad and before.op is not Op.CONST  # constants are shared by equal ones
    if base.requires_grad and before.op is Op.BUFFER:  # a leaf stays a leaf, with a buffer of its own
        while node.op is DETACH:
            node = node.src[0]
        base.node = fresh_buffer(node)
        base.node.arg.grad_leaf = weakref.ref(base)
    else:
        base.node = node
        base.requires_grad = base.requires_grad or (grad and node.dtype.is_floating_point)
    if tracked:
        overwritten[before] = weakref.ref(base.node)


def _unview(steps: tuple, base: Node, value: Node) -> Node:
    """The base's new node when the view reached from `base` by `steps` is written with `value`."""
    nodes = [base]
    for step in steps[:-1]:
        nodes.append(replay((step,), nodes[-1]))
    for (op, arg), source in zip(reversed(steps), reversed(nodes)):
        value = _unstep(op, arg, source, value)
    return value


def _unstep(op: Any, arg: Any, source: Node, value: Node) -> Node:
    """`source` after its view by one step (`op`, `arg`) is written with `value`."""
    if op is DETACH or op == DATA:
        return detach_node(value)
    if op is Op.RESHAPE:
        return g.movement(Op.RESHAPE, value, source.shape)
    if op is Op.PERMUTE:
        return g.movement(Op.PERMUTE, value, tuple(sorted(range(len(arg)), key=arg.__getitem__)))
    if op is Op.FLIP:
        return g.movement(Op.FLIP, value, arg)
    if op is Op.PAD:
        return g.movement(Op.SHRINK, value, tuple((lo, lo + s) for (lo, _), s in zip(arg, source.shape)))
    if op is Op.SHRINK:
        widths = tuple((lo, s - hi) for (lo, hi), s in zip(arg, source.shape))
        inside = g.movement(Op.PAD, g.const(True, dtypes.bool_, value.shape), widths)
        return g.where(inside, g.movement(Op.PAD, value, widths), source)
    assert op is Op.EXPAND, op
    if arg != source.shape:
        fail("in-place", "unsupported operation: more than one element of the written-to tensor refers to a single "
             "memory location. Please clone() the tensor before performing the operation.", kind=ShapeError)
    return value


def _fitted(target: Tensor, value: Any, op: str, any_dtype: bool = False) -> Tensor:
    """`value` broadcast to `target`'s shape and cast to its dtype; torch's errors where it cannot be."""
    value = as_tensor(value, target.dtype if not isinstance(value, Tensor) else None)
    if value.shape != target.shape:
        if broadcast_shapes(op, value.shape, target.shape) != target.shape:
            fail(op, f"output with shape {list(target.shape)} doesn't match the broadcast shape "
                 f"{list(broadcast_shapes(op, value.shape, target.shape))}", kind=ShapeError)
        value = expand_to(value, target.shape)
    if value.dtype is not target.dtype:
        narrowing = (value.dtype.is_floating_point and not target.dtype.is_floating_point) or (
            target.dtype.is_bool and not value.dtype.is_bool)
        if narrowing and not any_dtype:
            fail(op, f"result type {value.dtype.name} can't be cast to the desired output type {target.dtype.name}",
                 kind=DTypeError)
        value = cast(value, target.dtype)
    return value


def inplace(fn: Callable[..., Tensor], name: str) -> Callable[..., Tensor]:
    """The in-place method `name` of the out-of-place `fn(self, ...)`."""

    def method(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        check_writable(self, name)
        return write(self, _fitted(self, fn(self, *args, **kwargs), name))

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"In place: `self` becomes `self.{name[:-1]}(...)` (PyTorch's `{name}`)."
    return method


# ---------------------------------------------------------------------------
# methods whose value is not an out-of-place op of the same name
# ---------------------------------------------------------------------------


def assign(self: Tensor, value: Any) -> Tensor:
    """Replace the contents (shape and dtype kept) without autograd's checks: what optimizers, `nn.init` and
    `load_state_dict` use. A leaf that requires grad stays a leaf, with a buffer of its own."""
    return write(self, _fitted(self, value, "assign", any_dtype=True))


def copy_(self: Tensor, src: Any, non_blocking: bool = False) -> Tensor:
    check_writable(self, "copy_")
    return write(self, _fitted(self, src, "copy_", any_dtype=True))


def fill_(self: Tensor, value: Any) -> Tensor:
    if isinstance(value, Tensor) and value.ndim:
        fail("fill_", f"fill_ only supports 0-dimension value tensor but got tensor with {value.ndim} dimensions",
             kind=ShapeError)
    check_writable(self, "fill_")
    return write(self, _fitted(self, value, "fill_", any_dtype=True))


def zero_(self: Tensor) -> Tensor:
    return fill_(self, 0)


def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> Tensor:
    check_writable(self, "normal_")
    noise = creation.randn(self.shape, dtype=self.dtype, generator=generator)
    return write(self, ew.add(ew.mul(noise, std), mean))


def uniform_(self: Tensor, a: float = 0.0, b: float = 1.0, *, generator: Any = None) -> Tensor:
    check_writable(self, "uniform_")
    noise = creation.rand(self.shape, dtype=self.dtype, generator=generator)
    return write(self, ew.add(ew.mul(noise, b - a), a))


def clone(self: Tensor, memory_format: Any = None) -> Tensor:
    return Tensor.result(make_node(CLONE, (self.node_for_op(),), {}, self.dtype, self.shape), self)


def detached(self: Tensor) -> Tensor:
    """`.data`: the same storage, outside autograd."""
    out = Tensor(detach_node(self.node))
    base = self if self._base is None else self._base
    seen = self._node if self._base is None else self._seen
    out._base, out._steps, out._seen = base, self._steps + ((DATA, None),), seen
    return out


def detach_(self: Tensor) -> Tensor:
    """Stop recording gradients through this tensor, in place (torch refuses it on a view that requires grad)."""
    if not self.requires_grad:
        return self
    if self._base is not None:
        fail("detach_", "Can't detach views in-place. Use detach() instead.", kind=AutogradError)
    if self.is_leaf:
        return self.requires_grad_(False)
    self.node = detach_node(self.node)
    self.requires_grad = False
    return self


def set_data(self: Tensor, value: Tensor) -> None:
    """`x.data = y`: x takes y's value (any shape), keeping its identity and requires_grad."""
    if not isinstance(value, Tensor):
        fail("data", f"data must be a Tensor, got {type(value).__name__}", kind=DTypeError)
    node = value.node
    while node.op is DETACH:
        node = node.src[0]
    if self.requires_grad:
        node = fresh_buffer(node)
        node.arg.grad_leaf = weakref.ref(self)
    self.node = node


# ---------------------------------------------------------------------------
# indexed writes
# ---------------------------------------------------------------------------


def setitem(self: Tensor, index: Any, value: Any) -> None:
    """`x[index] = value` for every index `x[index]` reads, plus a boolean mask (a where() of the mask)."""
    check_writable(self, "setitem")
    items = list(index) if isinstance(index, tuple) else [index]
    if any(isinstance(i, Tensor) and i.dtype.is_bool for i in items):
        _masked_setitem(self, items, value)
    elif any(isinstance(i, (Tensor, list)) for i in items):
        _put(self, mv.getitem(_positions(self), index), value, accumulate=False, op="setitem")
    else:
        view = mv.getitem(self, index)
        if view._base is None:  # a 0-d tensor's x[...] is the tensor itself
            link_view(self, view)
        write(view, _fitted(view, value, "setitem", any_dtype=True))


def _masked_setitem(self: Tensor, items: list, value: Any) -> None:
    """`x[mask] = v`, `x[..., mask] = v`, `x[:, mask] = v`: v a single value or broadcast over the dims after."""
    at = next(k for k, i in enumerate(items) if isinstance(i, Tensor))
    mask, before, after = items[at], items[:at], items[at + 1:]
    full = [i is Ellipsis or (isinstance(i, slice) and i == slice(None)) for i in before + after]
    if not all(full) or sum(i is Ellipsis for i in items) > 1:
        fail("setitem", "a boolean mask index can only be combined with ':' and '...'", kind=UnsupportedError)
    ellipsis_first = any(i is Ellipsis for i in before)
    lead = self.ndim - mask.ndim - sum(i is not Ellipsis for i in after) if ellipsis_first else len(before)
    if lead + mask.ndim > self.ndim or self.shape[lead:lead + mask.ndim] != mask.shape:
        fail("setitem", f"the mask of shape {mask.shape} does not match the indexed tensor's shape {self.shape} "
             f"at dim {lead}", kind=IndexingError)
    rest = self.shape[lead + mask.ndim:]
    value = as_tensor(value, self.dtype if not isinstance(value, Tensor) else None)
    if value.numel() == 1:
        value = value.reshape(())
    elif broadcast_shapes("setitem", value.shape, rest) != rest:
        fail("setitem", f"a value of shape {value.shape} cannot be put into the {mask.shape} mask's positions "
             "(its count of True is data dependent); use a single value or where()", kind=UnsupportedError)
    condition = mask.reshape((1,) * lead + mask.shape + (1,) * len(rest))
    write(self, _fitted(self, ew.where(condition, cast(value, self.dtype), self), "setitem", any_dtype=True))


def _positions(x: Tensor) -> Tensor:
    """Each element's flat position, in `x`'s shape: an index read from it tells which elements it selects."""
    return creation.arange(x.numel(), dtype=dtypes.int64).reshape(x.shape)


def _put(x: Tensor, positions: Tensor, value: Any, accumulate: bool, op: str) -> Tensor:
    """Write `value` (broadcast to `positions`' shape) at the flat `positions` of `x`; added if `accumulate`.
    Positions written twice take the mean of their values (torch leaves which one wins undefined)."""
    check_writable(x, op)
    value = as_tensor(value, x.dtype if not isinstance(value, Tensor) else None)
    if broadcast_shapes(op, value.shape, positions.shape) != positions.shape:
        fail(op, f"shape mismatch: value tensor of shape {list(value.shape)} cannot be broadcast to indexing result "
             f"of shape {list(positions.shape)}", kind=ShapeError)
    value = expand_to(value, positions.shape)
    work = x.dtype if x.dtype.is_floating_point else dtypes.int64
    flat = positions.reshape(-1)
    sums = mv.scatter_add(creation.zeros(x.numel(), dtype=work), 0, flat, cast(value, work).reshape(-1))
    sums = sums.reshape(x.shape)
    if accumulate:
        return write(x, cast(ew.add(cast(x, work), sums), x.dtype))
    hits = mv.scatter_add(creation.zeros(x.numel(), dtype=work), 0, flat,
                          creation.ones(flat.numel(), dtype=work)).reshape(x.shape)
    mean = ew.div(sums, hits) if work.is_floating_point else ew.floor_divide(sums, ew.maximum(hits, 1))
    return write(x, cast(ew.where(ew.gt(hits, 0), mean, cast(x, work)), x.dtype))


def index_put_(self: Tensor, indices: tuple, values: Any, accumulate: bool = False) -> Tensor:
    return _put(self, mv.getitem(_positions(self), tuple(indices)), values, accumulate, "index_put_")


def scatter_(self: Tensor, dim: int, index: Tensor, src: Any = None, value: Any = None, *,
             reduce: str | None = None) -> Tensor:
    """torch.Tensor.scatter_: self[index[i][j]][j] = src[i][j] for dim 0; `reduce="add"` accumulates."""
    if reduce not in (None, "add"):
        fail("scatter_", f"reduce={reduce!r} is not supported; use None or 'add'", kind=UnsupportedError)
    source = value if src is None else src
    if isinstance(source, Tensor) and source.ndim:
        source = mv.getitem(source, tuple(slice(0, s) for s in index.shape))
    return _put(self, mv.gather(_positions(self), dim, index), source, reduce == "add", "scatter_")


def index_add_(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Any = 1) -> Tensor:
    """self[..., index[i], ...] += alpha * source[..., i, ...] along `dim`."""
    picked = mv.index_select(_positions(self), dim, index)
    return _put(self, picked, ew.mul(source, alpha) if alpha != 1 else source, True, "index_add_")


def new_tensor(self: Tensor, data: Any, *, dtype: Any = None, device: Any = None,
               requires_grad: bool = False) -> Tensor:
    return creation.tensor(data, dtype=self.dtype if dtype is None else dtype, requires_grad=requires_grad)


def _new(make: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def method(self: Tensor, *args: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False,
               **kwargs: Any) -> Tensor:
        return make(*args, dtype=self.dtype if dtype is None else dtype, requires_grad=requires_grad, **kwargs)

    return method


new_zeros, new_ones, new_empty, new_full = (_new(f) for f in (creation.zeros, creation.ones, creation.empty,
                                                               creation.full))
