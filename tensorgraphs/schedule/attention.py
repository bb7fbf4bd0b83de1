"""Scaled-dot-product attention run by the fused kernel (`tensorgraphs.kernels.attention`) instead of lowered loops.

The attention composite, its logsumexp and its per-input backward composites (nn.functional.attention) are kept
whole by the scheduler when `runs_as_fused_attention` holds: the scores (L x S per head) are then never stored.
Nodes of one call share their sources: the attention and its logsumexp are one forward call writing both, the
gradients of q, k and v one backward call writing all three. The call is made by the first of them in program
order (they all read the same, already computed, buffers); the others' kernels are empty.

Operands are read in place through views (a head split of a projection: reshape, permute, slice, broadcast; a
cast widening bfloat16, as a float32 attention of bfloat16 values has) when the view is strided with unit stride
along the head dim (`strided_view`); anything else is materialized. A float32 attention of bfloat16 q, k and v
(what autocast builds) runs the kernel's bfloat16 variant, as torch computes bfloat16 attention on the cpu: its
weights and their gradients are rounded to bfloat16 before their products too (attention.h). The batch dims must
fold into at most two strided dims (batch, heads) for every operand, or all operands are materialized.

TG_ATTENTION=0 turns this off (the decomposition is scheduled instead); set it before the first program is built.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

from tensorgraphs import dtypes
from tensorgraphs.codegen.loop_ir import AttentionCall, Kernel, KernelParam, StridedOperand
from tensorgraphs.graph.composite import is_composite
from tensorgraphs.graph.node import Node
from tensorgraphs.graph.ops import Op
from tensorgraphs.kernels.gemm import merge_batch_dims
from tensorgraphs.kernels.gemm.build import compiler_works
from tensorgraphs.plan.choices import Candidate, register_candidates, route_of
from tensorgraphs.schedule.extern import LibraryCallLowering, widens_bfloat16

FORWARD = "scaled_dot_product_attention"
LOGSUMEXP = "scaled_dot_product_attention_logsumexp"
BACKWARD = "scaled_dot_product_attention_backward"
KERNEL_GRADIENTS = ("dq", "dk", "dv")
"""The gradients the backward kernel computes, by the backward composite's `wrt` (a float mask's is not one)."""


def _fused_kernel_fits(node: Node) -> bool:
    """Whether `node` is a float32 attention (or its logsumexp, or the gradient of its q, k or v) that the fused
    kernel can compute on this machine."""
    if not attention_enabled():
        return False
    if node.op.name == BACKWARD and dict(node.arg)["wrt"] >= len(KERNEL_GRADIENTS):
        return False
    q, k, v, *masks = _inputs(node)
    floats = all(x.dtype == dtypes.float32 for x in (node, q, k, v, *_saved(node)))
    masks_fit = all(m.dtype in (dtypes.bool_, dtypes.float32) for m in masks) and len(masks) <= 1
    return floats and masks_fit and min(q.size, k.size, v.size) > 0


FUSED = "fused"
for _composite in (FORWARD, LOGSUMEXP, BACKWARD):
    register_candidates(_composite, Candidate(FUSED, _fused_kernel_fits, prior=1.0))


def runs_as_fused_attention(node: Node) -> bool:
    """Whether `node` is an attention composite the planner runs by the fused kernel."""
    return is_composite(node) and node.op.name in (FORWARD, LOGSUMEXP, BACKWARD) and route_of(node) == FUSED


def attention_enabled() -> bool:
    """A C compiler builds the kernel (portable C) and TG_ATTENTION=0 does not turn it off."""
    return os.environ.get("TG_ATTENTION", "1") != "0" and compiler_works()


def _inputs(node: Node) -> tuple[Node, ...]:
    """q, k, v and the mask if any (a backward node's sources end with out, lse and the output's gradient)."""
    return node.src[:-3] if node.op.name == BACKWARD else node.src


def _saved(node: Node) -> tuple[Node, ...]:
    """out, lse and the output's gradient for a backward node; nothing for a forward one."""
    return node.src[-3:] if node.op.name == BACKWARD else ()


def _call_key(node: Node) -> tuple:
    """Nodes one kernel call computes share this: forward or backward, sources and parameters but `wrt`."""
    params = tuple(item for item in node.arg if item[0] != "wrt")
    return node.op.name == BACKWARD, node.src, params


# ---------------------------------------------------------------------------
# Operands read in place through strided views.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StridedView:
    """A view's elements as `base`'s buffer holds them: element index i at offset + sum(i[d] * strides[d])."""

    base: Node
    offset: int
    strides: tuple[int, ...]


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))


def _reshaped_strides(shape: tuple[int, ...], strides: tuple[int, ...],
                      new_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides of `new_shape` over the same elements without a copy, or None (as numpy's no-copy reshape):
    each group of old dims whose product matches a group of new dims must be contiguous among itself."""
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    new = [n for n in new_shape if n != 1]
    found: list[int] = [0] * len(new)
    o = n = 0
    while n < len(new) and o < len(old):
        o_end, n_end, o_size, n_size = o + 1, n + 1, old[o][0], new[n]
        while o_size != n_size:
            if n_size < o_size:
                n_size, n_end = n_size * new[n_end], n_end + 1
            else:
                o_size, o_end = o_size * old[o_end][0], o_end + 1
        if any(old[d][1] != old[d + 1][0] * old[d + 1][1] for d in range(o, o_end - 1)):
            return None
        found[n_end - 1] = old[o_end - 1][1]
        for d in range(n_end - 1, n, -1):
            found[d - 1] = found[d] * new[d]
        o, n = o_end, n_end
    given = iter(found)
    return tuple(0 if size == 1 else next(given) for size in new_shape)


def _view_strides(view: Node, strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """`view`'s strides given its source's, or None when the view is not strided (pad, flip, a reshape that
    would need a copy). A cast widening bfloat16 reads its source's floats as they are."""
    source = view.src[0]
    if view.op is Op.PERMUTE:
        return tuple(strides[axis] for axis in view.arg)
    if view.op is Op.EXPAND:
        return tuple(0 if old != new else s for old, new, s in zip(source.shape, view.shape, strides))
    if view.op is Op.SHRINK:
        return strides
    if view.op is Op.RESHAPE:
        return _reshaped_strides(source.shape, strides, view.shape)
    return strides if widens_bfloat16(view) else None


def _widened_bfloat16(view: Node) -> bool:
    """Whether `view` is bfloat16 values widened to float32, under movement views."""
    while view.op in (Op.PERMUTE, Op.EXPAND, Op.SHRINK, Op.RESHAPE):
        view = view.src[0]
    return widens_bfloat16(view)


def strided_view(view: Node, is_buffer: Callable[[Node], bool]) -> StridedView:
    """`view` read from the buffer of the node under its chain of strided views (stopping at a buffer); the
    node itself, contiguous, when it is not such a view."""
    if not is_buffer(view) and (view.op in (Op.PERMUTE, Op.EXPAND, Op.SHRINK, Op.RESHAPE) or widens_bfloat16(view)):
        inner = strided_view(view.src[0], is_buffer)
        strides = _view_strides(view, inner.strides)
        if strides is not None:
            start = sum(lo * s for (lo, _), s in zip(view.arg, inner.strides)) if view.op is Op.SHRINK else 0
            return StridedView(inner.base, inner.offset + start, strides)
    return StridedView(view, 0, _contiguous(view.shape))


@dataclass(frozen=True)
class Layout:
    """Each operand's strided view and its (batch, heads, row[, column]) strides (the column only for the mask,
    every other operand has unit stride along its last dim), and the batch dims folded into (batch, heads)."""

    views: tuple[StridedView, ...]
    strides: tuple[tuple[int, ...], ...]
    batch: int
    heads: int


def _mask_position(node: Node) -> int | None:
    return 3 if len(_inputs(node)) == 4 else None


def _layout(node: Node, views: list[StridedView]) -> Layout | None:
    """The operands' batch dims folded into (batch, heads), or None when they take more than two dims or an
    operand other than the mask has a non-unit stride along its last dim."""
    q, *_ = read = [*_inputs(node), *_saved(node)]
    mask_at, batch_dims = _mask_position(node), q.ndim - 2
    if any(i != mask_at and n.shape[-1] > 1 and view.strides[-1] != 1 for i, (n, view) in enumerate(zip(read, views))):
        return None
    merged = merge_batch_dims(q.shape[:-2], [view.strides[:batch_dims] for view in views])
    if len(merged) > 2:
        return None
    (batch, outer), (heads, inner) = [(1, [0] * len(views))] * (2 - len(merged)) + merged
    strides = tuple((outer[i], inner[i], *view.strides[batch_dims:len(view.strides) - (i != mask_at)])
                    for i, view in enumerate(views))
    return Layout(tuple(views), strides, batch, heads)


def operand_layout(node: Node, is_buffer: Callable[[Node], bool]) -> Layout:
    """How the kernel reads `node`'s operands (q, k, v, mask?, then out, lse and dout for a backward node): in
    place where their views allow it, else each from its own materialized buffer (out and lse always)."""
    inputs, saved = _inputs(node), _saved(node)
    viewed = [*inputs, *saved[2:]]
    contiguous = [StridedView(n, 0, _contiguous(n.shape)) for n in (*inputs, *saved)]
    views = [strided_view(n, is_buffer) for n in viewed]
    views[len(inputs):len(inputs)] = contiguous[len(inputs):len(inputs) + len(saved[:2])]
    layout = _layout(node, views) or _layout(node, contiguous)
    assert layout is not None, node
    return layout


def operand_bases(node: Node, is_input: Callable[[Node], bool]) -> list[Node]:
    """The nodes whose buffers the kernel of `node` reads (the scheduler materializes those not inputs)."""
    return [view.base for view in operand_layout(node, is_input).views]


def _written(node: Node) -> str:
    """Which output of its call `node` is."""
    if node.op.name == BACKWARD:
        return KERNEL_GRADIENTS[dict(node.arg)["wrt"]]
    return "out" if node.op.name == FORWARD else "lse"


class AttentionLowering(LibraryCallLowering):
    """The kernel of one attention call."""

    def kernel(self) -> Kernel:
        """The call, made by the first node of the call in program order (`buffers` lists them in that order);
        an empty kernel for the others."""
        key = _call_key(self.node)
        members = [n for n in self.buffers if runs_as_fused_attention(n) and _call_key(n) == key]
        if members[0] is not self.node:
            return Kernel(self.name, [], [])
        layout = operand_layout(self.node, self.buffers.__contains__)
        params = {}
        for view in layout.views:
            name = self.buffers[view.base]
            params[name] = KernelParam(name, view.base.dtype, view.base.size, False)
        for member in members:
            params[self.buffers[member]] = KernelParam(self.buffers[member], member.dtype, member.size, True)
        operands = [StridedOperand(self.buffers[view.base], view.offset, strides)
                    for view, strides in zip(layout.views, layout.strides)]
        call = self._call(layout, operands, {_written(member): self.buffers[member] for member in members})
        return Kernel(self.name, list(params.values()), [call])

    def _call(self, layout: Layout, operands: list[StridedOperand], written: dict[str, str]) -> AttentionCall:
        q, k, v, *masks = _inputs(self.node)
        params = dict(self.node.arg)
        mask_kind = "none" if not masks else "bool" if masks[0].dtype == dtypes.bool_ else "add"
        sizes = {"batch": layout.batch, "heads": layout.heads, "queries": q.shape[-2], "keys": k.shape[-2],
                 "dim": q.shape[-1], "value_dim": v.shape[-1]}
        common = {**sizes, "q": operands[0], "k": operands[1], "v": operands[2],
                  "mask": operands[3] if masks else None, "mask_kind": mask_kind, "causal": params["is_causal"],
                  "scale": params["scale"], "bf16": all(map(_widened_bfloat16, (q, k, v)))}
        if self.node.op.name != BACKWARD:
            return AttentionCall(**common, backward=False, **written)
        out, lse, _ = (operand.buffer for operand in operands[-3:])
        return AttentionCall(**common, backward=True, out=out, lse=lse, dout=operands[-1], **written)
