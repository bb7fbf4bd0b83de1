"""Matrix products run by the GEMM library instead of lowered loops ("extern" kernels).

A float32 `matmul` composite is kept whole by the scheduler when the AVX-512 GEMM
library (`tensorgraphs.kernels.gemm`) runs on this machine: its kernel is one
`GemmCall` reading two buffers and writing its own. An operand needs no copy when
it is a buffer, a reshape of one (buffers are contiguous), or either of those
with its last two axes swapped (the transpose becomes swapped strides); anything
else is materialized into a buffer first. The kernel reads and writes through its
`Kernel.buffers` like any other, so liveness and the memory planner see it as one.

TG_GEMM=0 turns this off (matmuls lowered to loops, for comparison); set it before
the first program is built, since compiled programs are cached by graph.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from tensorgraphs import dtypes
from tensorgraphs.codegen.loop_ir import Buffer, GemmCall, Kernel
from tensorgraphs.graph.composite import is_composite
from tensorgraphs.graph.node import Node
from tensorgraphs.graph.ops import Op
from tensorgraphs.kernels import gemm


def runs_as_gemm(node: Node) -> bool:
    """Whether `node` is a float32 matrix product the GEMM library computes on this machine."""
    if not is_composite(node) or node.op.name != "matmul" or node.dtype != dtypes.float32:
        return False
    a, b = node.src
    shapes_fit = a.ndim == b.ndim >= 2 and a.shape[:-2] == b.shape[:-2]  # batch dims fold into one (contiguous)
    return shapes_fit and a.dtype == b.dtype == dtypes.float32 and min(a.shape + b.shape[-1:]) > 0 and gemm_enabled()


def gemm_enabled() -> bool:
    """The GEMM library runs on this machine and TG_GEMM=0 does not turn it off."""
    return os.environ.get("TG_GEMM", "1") != "0" and gemm.available()


def _swaps_last_two(node: Node) -> bool:
    order = tuple(range(node.ndim))
    return node.op is Op.PERMUTE and tuple(node.arg) == order[:-2] + (order[-1], order[-2])


def operand_base(view: Node) -> Node:
    """The node whose buffer holds `view`'s elements (see the module docstring)."""
    base = view.src[0] if _swaps_last_two(view) else view
    while base.op is Op.RESHAPE:
        base = base.src[0]
    return base


def operand_strides(view: Node) -> tuple[int, int, int]:
    """(batch, row, column) element strides of `view` read from its base's contiguous buffer; the batch dims
    are contiguous there, so they fold into one of stride rows * columns."""
    stored = view.src[0].shape if _swaps_last_two(view) else view.shape
    contiguous = [math.prod(stored[d + 1:]) for d in range(len(stored))]
    if _swaps_last_two(view):
        contiguous[-2], contiguous[-1] = contiguous[-1], contiguous[-2]
    return math.prod(stored[-2:]), contiguous[-2], contiguous[-1]


@dataclass
class GemmLowering:
    """The kernel of one matrix product; like `lower.Lowering`, it inlines and recomputes nothing."""

    name: str
    node: Node
    buffers: dict[Node, str]
    inlined: set[Node] = field(default_factory=set)
    recomputed: set[Node] = field(default_factory=set)

    def kernel(self) -> Kernel:
        a, b = self.node.src
        *_, m, k = a.shape
        n = b.shape[-1]
        batch = math.prod(a.shape[:-2])
        a_name, b_name, c_name = self.buffers[operand_base(a)], self.buffers[operand_base(b)], self.buffers[self.node]
        params = {name: Buffer(name, dtypes.float32, source.size, False)
                  for name, source in ((a_name, operand_base(a)), (b_name, operand_base(b)))}
        params[c_name] = Buffer(c_name, dtypes.float32, self.node.size, True)
        call = GemmCall(batch, m, n, k, a_name, operand_strides(a), b_name, operand_strides(b), c_name,
                        (m * n, n))
        return Kernel(self.name, list(params.values()), [call])
