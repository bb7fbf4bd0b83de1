"""Quantized linear layers (`quantized_linear` composites) run by the int8 GEMM (`tensorgraphs.kernels.gemm.int8`)
instead of lowered loops: one call reading the activations (choosing their quantization parameters itself, unless
they are static) and the packed weights from their buffers (materialized where they are views) and writing the
float32 result.

TG_GEMM=0 turns it off with the other GEMM libraries (the decomposition is scheduled instead).
"""

from __future__ import annotations

import math

from tensorgraphs import dtypes
from tensorgraphs.codegen.loop_ir import Kernel, KernelParam, NativeCall
from tensorgraphs.graph.composite import is_composite
from tensorgraphs.graph.node import Node
from tensorgraphs.kernels.gemm import ACTIVATIONS, int8
from tensorgraphs.plan.choices import Candidate, register_candidates, route_of
from tensorgraphs.schedule.extern import LibraryCallLowering, gemm_enabled

QUANTIZED_LINEAR = "quantized_linear"
INT8_GEMM = "int8_gemm"


def _int8_gemm_fits(node: Node) -> bool:
    """Whether the int8 GEMM runs on this machine and `node`'s activations are float32."""
    return gemm_enabled() and int8.available() and node.src[0].dtype == dtypes.float32


register_candidates(QUANTIZED_LINEAR, Candidate(INT8_GEMM, _int8_gemm_fits, prior=0.25))


def runs_as_int8_gemm(node: Node) -> bool:
    """Whether `node` is a quantized linear layer the planner runs by the int8 GEMM."""
    return is_composite(node) and node.op.name == QUANTIZED_LINEAR and route_of(node) == INT8_GEMM


class QuantizedLinearLowering(LibraryCallLowering):
    """The kernel of one quantized linear layer: one tg_qlinear_f32 call on contiguous buffers."""

    def kernel(self) -> Kernel:
        x, packed, colsum, w_scale, *bias = self.node.src
        k, n = x.shape[-1], colsum.shape[0]
        params = {self.buffers[s]: KernelParam(self.buffers[s], s.dtype, s.size, False) for s in self.node.src}
        out = self.buffers[self.node]
        params[out] = KernelParam(out, self.node.dtype, self.node.size, True)
        arg = dict(self.node.arg)
        name = self.buffers.__getitem__
        call = NativeCall(int8.C_FUNCTIONS["linear"], (
            math.prod(x.shape[:-1]), n, k, name(x), k, *(arg["qparams"] or (0.0, 0)), arg["quant_max"], name(packed),
            name(colsum), name(w_scale), name(bias[0]) if bias else None, out, n, ACTIVATIONS[arg["activation"]]))
        return Kernel(self.name, list(params.values()), [call])
