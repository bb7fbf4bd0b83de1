"""One gradient rule per differentiable primitive, written with Tensor ops and registered into autograd's table.

A rule gets the node's output, the incoming gradient and the node's inputs
(all as Tensors) and returns one gradient per input, or None where no
gradient flows (`tensorgraphs.autograd.rules`). They are Tensor code, so they
live in the front end, which registers them as it registers decomposition
bodies; autograd calls them through the same value hook (`as_value`).
"""

from __future__ import annotations

import math
from typing import Sequence

from tensorgraphs.autograd.rules import add_in_order, register, register_gradient_sum
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.linalg import MATMUL
from tensorgraphs.frontend.tensor import Tensor, apply, apply_composite, cast, expand_to, full_like_node
from tensorgraphs.graph import node as g
from tensorgraphs.graph.ops import Op


def _unbroadcast_sum(grad: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum `grad` over the axes where `shape` has size 1 but grad does not (EXPAND's transpose)."""
    axes = tuple(i for i, (s, t) in enumerate(zip(shape, grad.shape)) if s != t)
    return apply(Op.REDUCE_SUM, grad, arg=axes) if axes else grad


def _padded_axis(t: Tensor) -> int | None:
    """The one axis `t` zero-pads its source along (None: `t` is no padding, or pads several axes)."""
    if t.node.op is not Op.PAD:
        return None
    axes = [axis for axis, widths in enumerate(t.node.arg) if widths != (0, 0)]
    return axes[0] if len(axes) == 1 else None


def _joined_slices(slices: list[Tensor], axis: int) -> tuple[Tensor, list[Tensor]]:
    """The concatenation of zero-padded slices' sources along `axis`, zeros in the gaps, taking slices by start
    while their ranges are disjoint; and the slices left out (overlapping one taken)."""
    pieces, left_out, end = [], [], 0
    for part in sorted(slices, key=lambda t: t.node.arg[axis][0]):
        start = part.node.arg[axis][0]
        if start < end:
            left_out.append(part)
            continue
        if start > end:
            pieces.append(_zeros_along(part, axis, start - end))
        pieces.append(Tensor(part.node.src[0]))
        end = start + part.node.src[0].shape[axis]
    if end < slices[0].shape[axis]:
        pieces.append(_zeros_along(slices[0], axis, slices[0].shape[axis] - end))
    return mv.cat(pieces, axis), left_out


def _zeros_along(like: Tensor, axis: int, size: int) -> Tensor:
    return Tensor(g.const(0, like.dtype, like.shape[:axis] + (size,) + like.shape[axis + 1:]))


def _folded_stack(pieces: Sequence[Tensor]) -> Tensor:
    """Equally shaped (..., K, N) pieces joined along K: a stack folded, (..., n * K, N). A stack of time steps'
    gradients is then the node a slice gradient's join (`_joined_slices`) already built for the whole sequence."""
    stacked = mv.stack(pieces, -3)
    return mv.reshape(stacked, stacked.shape[:-3] + (len(pieces) * pieces[0].shape[-2], pieces[0].shape[-1]))


def _join_copies_less(products: Sequence[Tensor]) -> bool:
    """Whether joining n (M, K) @ (K, N) products copies fewer elements, n * K * (M + N), than summing them reads
    and writes, (n - 1) * M * N: true for a recurrence's weight gradient (K the batch, small), false for the input
    gradient of q, k and v projections (K the width)."""
    (m, k), n = products[0].node.src[0].shape[-2:], products[0].shape[-1]
    return len(products) * k * (m + n) < (len(products) - 1) * m * n


def _joined_products(parts: Sequence[Tensor]) -> list[Tensor]:
    """`parts` with the products of equally shaped operands (the weight gradient of an unrolled recurrence: one
    product per time step) replaced by one product of their operands joined along the reduction axis:
    sum_i a_i @ b_i = [a_1 .. a_n] @ [b_1; ..; b_n], one large GEMM instead of n small ones and n - 1 sums, where
    that copies less than the sums move (`_join_copies_less`). The pieces are joined in the order the graph
    computes them (the contributions arrive in reverse)."""
    groups: dict[tuple, list[Tensor]] = {}
    for part in reversed(parts):
        if part.node.op is MATMUL:
            a, b = part.node.src
            groups.setdefault((a.shape, b.shape), []).append(part)
    joined = [group for group in groups.values() if len(group) > 1 and _join_copies_less(group)]
    products = [apply_composite(MATMUL, mv.mT(_folded_stack([mv.mT(Tensor(p.node.src[0])) for p in group])),
                                _folded_stack([Tensor(p.node.src[1]) for p in group])) for group in joined]
    taken = {id(p) for group in joined for p in group}
    return [*products, *(p for p in parts if id(p) not in taken)]


def _sum_gradients(parts: Sequence[Tensor]) -> Tensor:
    """The contributions to one gradient, summed. Zero-padded slices along one axis with disjoint ranges (the
    gradients of a split's pieces, or of a sequence's time steps) are joined into one concatenation, as torch's
    split backward does: their sum would evaluate every slice, bounds-checked, at each element. The join is the sum
    exactly, but for the sign of a zero (a slice's -0.0 stays -0.0, as in torch). Products of equally shaped
    operands are joined into one product (`_joined_products`)."""
    parts = _joined_products(parts)
    if len(parts) == 1:
        return parts[0]
    axes = [_padded_axis(part) for part in parts]
    axis = next((a for a in axes if a is not None), None)
    slices = [part for part, a in zip(parts, axes) if a == axis]
    if axis is None or len(slices) < 2:
        return add_in_order(parts)
    joined, left_out = _joined_slices(slices, axis)
    return add_in_order([joined, *left_out, *(part for part, a in zip(parts, axes) if a != axis)])


def _max_grad(out: Tensor, grad: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """As PyTorch's maximum: ties split the gradient evenly; an operand gets all of it unless it is
    strictly smaller (so next to a NaN both operands do)."""

    def share(x: Tensor, y: Tensor) -> Tensor:
        return cast(ew.where(ew.lt(x, y), 0.0, ew.where(ew.eq(x, y), 0.5, 1.0)), grad.dtype)

    return ew.mul(grad, share(a, b)), ew.mul(grad, share(b, a))


def _reduce_max_grad(out: Tensor, grad: Tensor, x: Tensor) -> tuple[Tensor]:
    """The gradient is shared evenly among the elements equal to the maximum."""
    hits = cast(ew.eq(x, expand_to(out, x.shape)), grad.dtype)
    count = apply(Op.REDUCE_SUM, hits, arg=out.node.arg)
    return (ew.mul(hits, expand_to(ew.div(grad, count), x.shape)),)


def _pad_grad(out: Tensor, grad: Tensor, x: Tensor) -> tuple[Tensor]:
    bounds = tuple((before, before + s) for (before, _), s in zip(out.node.arg, x.shape))
    return (apply(Op.SHRINK, grad, arg=bounds),)


def _shrink_grad(out: Tensor, grad: Tensor, x: Tensor) -> tuple[Tensor]:
    widths = tuple((b, s - e) for (b, e), s in zip(out.node.arg, x.shape))
    return (apply(Op.PAD, grad, arg=widths),)


def _permute_grad(out: Tensor, grad: Tensor, x: Tensor) -> tuple[Tensor]:
    order = out.node.arg
    inverse = tuple(order.index(i) for i in range(len(order)))
    return (apply(Op.PERMUTE, grad, arg=inverse),)


def _gather_grad(out: Tensor, grad: Tensor, x: Tensor, index: Tensor) -> tuple[Tensor, None]:
    zeros = Tensor(g.const(0, grad.dtype, x.shape))
    return apply(Op.SCATTER_ADD, zeros, index, grad, arg=out.node.arg), None


def _scatter_add_grad(out: Tensor, grad: Tensor, base: Tensor, index: Tensor, values: Tensor) -> tuple:
    return grad, None, apply(Op.GATHER, grad, index, arg=out.node.arg)


def _where_grad(out: Tensor, grad: Tensor, cond: Tensor, a: Tensor, b: Tensor) -> tuple:
    zero = full_like_node(0, grad)
    return None, ew.where(cond, grad, zero), ew.where(cond, zero, grad)


register({
    Op.EXP2: lambda out, grad, x: (ew.mul(grad, ew.mul(out, math.log(2.0))),),
    Op.LOG2: lambda out, grad, x: (ew.div(grad, ew.mul(x, math.log(2.0))),),
    Op.SIN: lambda out, grad, x: (ew.mul(grad, ew.cos(x)),),
    Op.SQRT: lambda out, grad, x: (ew.div(grad, ew.mul(out, 2.0)),),
    Op.CAST: lambda out, grad, x: (cast(grad, x.dtype) if x.dtype.is_floating_point else None,),
    Op.ADD: lambda out, grad, a, b: (grad, grad),
    Op.MUL: lambda out, grad, a, b: (ew.mul(grad, b), ew.mul(grad, a)),
    Op.DIV: lambda out, grad, a, b: (ew.div(grad, b), ew.neg(ew.div(ew.mul(grad, out), b))),
    Op.MAX: _max_grad,
    Op.WHERE: _where_grad,
    Op.REDUCE_SUM: lambda out, grad, x: (expand_to(grad, x.shape),),
    Op.REDUCE_MAX: _reduce_max_grad,
    Op.RESHAPE: lambda out, grad, x: (apply(Op.RESHAPE, grad, arg=x.shape),),
    Op.PERMUTE: _permute_grad,
    Op.EXPAND: lambda out, grad, x: (_unbroadcast_sum(grad, x.shape),),
    Op.PAD: _pad_grad,
    Op.SHRINK: _shrink_grad,
    Op.FLIP: lambda out, grad, x: (mv.flip(grad, out.node.arg),),
    Op.GATHER: _gather_grad,
    Op.SCATTER_ADD: _scatter_add_grad,
    Op.ASSIGN: lambda out, grad, target, value: (None, grad),
    Op.COPY: lambda out, grad, x: (grad,),
})
register_gradient_sum(_sum_gradients)
