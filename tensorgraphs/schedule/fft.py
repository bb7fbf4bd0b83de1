"""Fourier transforms run by the FFT library (`tensorgraphs.kernels.fft`) instead of their decompositions.

A float32 `fft_c2c`, `fft_r2c` or `fft_c2r` composite (`frontend.spectral`) is kept whole by the scheduler when
the planner routes it to the library: its source is materialized (contiguous rows along the transformed axis) and
its kernel is one `FftCall` writing its own buffer. Other dtypes, and targets without kernel libraries, run the
decomposition.
"""

from __future__ import annotations

from tensorgraphs import dtypes
from tensorgraphs.codegen.loop_ir import FftCall, Kernel, KernelParam
from tensorgraphs.graph.composite import is_composite, params_of
from tensorgraphs.graph.node import Node
from tensorgraphs.kernels.gemm.build import KernelBuildError, compiler_version
from tensorgraphs.plan.choices import Candidate, register_candidates, route_of
from tensorgraphs.schedule.extern import LibraryCallLowering

KINDS = {"fft_c2c": "c2c", "fft_r2c": "r2c", "fft_c2r": "c2r", "fft_stft": "stft"}
"""Composite -> the library's transform kind."""
LIBRARY = "fft"


def _library_fits(node: Node) -> bool:
    """A float32 transform of a nonempty input (frames of even length above 2 for "stft"), on a machine with a C
    compiler to build the library."""
    if node.dtype != dtypes.float32 or any(s.dtype != dtypes.float32 for s in node.src) or node.size == 0:
        return False
    if KINDS[node.op.name] == "stft" and (transform_length(node) % 2 or transform_length(node) <= 2):
        return False
    try:
        return bool(compiler_version())
    except KernelBuildError:
        return False


for _composite in KINDS:
    register_candidates(_composite, Candidate(LIBRARY, _library_fits, prior=1.0))


def runs_as_fft(node: Node) -> bool:
    """Whether `node` is a transform the planner runs by the FFT library."""
    return is_composite(node) and node.op.name in KINDS and route_of(node) == LIBRARY


def transform_length(node: Node) -> int:
    """n, the length of the transform `node` computes."""
    kind = KINDS[node.op.name]
    if kind == "c2r":
        return params_of(node)["n"]
    if kind == "stft":
        return node.src[1].shape[0]
    return node.shape[-2] if kind == "c2c" else node.src[0].shape[-1]


class FftLowering(LibraryCallLowering):
    """The kernel of one transform: its source's buffer in, its own out."""

    def kernel(self) -> Kernel:
        kind, n = KINDS[self.node.op.name], transform_length(self.node)
        params = [KernelParam(self.buffers[s], s.dtype, s.size, False) for s in self.node.src]
        params.append(KernelParam(self.buffers[self.node], self.node.dtype, self.node.size, True))
        x, y = self.buffers[self.node.src[0]], self.buffers[self.node]
        if kind == "stft":
            signal, window = self.node.src
            framing = {"window": self.buffers[window], "frames": self.node.shape[-2], "length": signal.shape[-1],
                       **{name: params_of(self.node)[name] for name in ("hop", "pad")}}
            batch = signal.size // signal.shape[-1]
            return Kernel(self.name, params, [FftCall(kind, batch, n, False, x, y, **framing)])
        per_row = {"c2c": 2 * n, "r2c": n, "c2r": 2 * (n // 2 + 1)}[kind]
        inverse = bool(params_of(self.node).get("inverse", False))
        return Kernel(self.name, params, [FftCall(kind, self.node.src[0].size // per_row, n, inverse, x, y)])
