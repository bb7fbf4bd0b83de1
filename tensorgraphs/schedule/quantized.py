"""Quantized linear layers and integer products (`quantized_linear`, `matmul_integer` composites) run by the int8
GEMM (`tensorgraphs.kernels.gemm.int8`: AVX-512 VNNI, or AVX2) instead of lowered loops: one call reading the
activations (a linear layer chooses their quantization parameters itself, unless they are static) and the packed
weights from their buffers (materialized where they are views) and writing the result (float32, or the int32 sums).

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

QUANTIZED_LINEAR, MATMUL_INTEGER = "quantized_linear", "matmul_integer"
INT8_GEMM = "int8_gemm"
ACTIVATION_DTYPES = {QUANTIZED_LINEAR: (dtypes.float32,), MATMUL_INTEGER: (dtypes.uint8, dtypes.int8)}
"""The activations' dtypes the kernel takes, by composite."""


def _int8_gemm_fits(node: Node) -> bool:
    """Whether the int8 GEMM runs on this machine and takes `node`'s activations."""
    return gemm_enabled() and int8.available() and node.src[0].dtype in ACTIVATION_DTYPES[node.op.name]


INT8_GEMM_PRIOR = 0.25 if int8.vnni() else 0.5
"""Its time as a multiple of the float roofline until measured: VPDPBUSD does 4 times an fma's multiply-adds per
instruction; without VNNI, VPMADDUBSW and VPMADDWD take two instructions for as many (gemm_int8.c)."""
for _composite in ACTIVATION_DTYPES:
    register_candidates(_composite, Candidate(INT8_GEMM, _int8_gemm_fits, prior=INT8_GEMM_PRIOR))


def runs_as_int8_gemm(node: Node) -> bool:
    """Whether `node` is a quantized linear layer or integer product the planner runs by the int8 GEMM."""
    return is_composite(node) and node.op.name in ACTIVATION_DTYPES and route_of(node) == INT8_GEMM


class QuantizedLinearLowering(LibraryCallLowering):
    """The kernel of one quantized linear layer or integer product: one call on contiguous buffers."""

    def kernel(self) -> Kernel:
        params = {self.buffers[s]: KernelParam(self.buffers[s], s.dtype, s.size, False) for s in self.node.src}
        out = self.buffers[self.node]
        params[out] = KernelParam(out, self.node.dtype, self.node.size, True)
        return Kernel(self.name, list(params.values()), [self.call(out)])

    def call(self, out: str) -> NativeCall:
        x, packed, colsum, *rest = self.node.src
        k, n, m = x.shape[-1], colsum.shape[0], math.prod(x.shape[:-1])
        arg, name = dict(self.node.arg), self.buffers.__getitem__
        if self.node.op.name == MATMUL_INTEGER:
            function = int8.C_FUNCTIONS["u8" if x.dtype == dtypes.uint8 else "s8"]
            return NativeCall(function, (m, n, k, name(x), k, arg["zero_point"], name(packed), name(colsum), out, n))
        w_scale, *bias = rest
        return NativeCall(int8.C_FUNCTIONS["linear"], (
            m, n, k, name(x), k, *(arg["qparams"] or (0.0, 0)), arg["quant_max"], name(packed), name(colsum),
            name(w_scale), name(bias[0]) if bias else None, out, n, ACTIVATIONS[arg["activation"]]))
