"""The cpu device: the native machinery (`backends.native`) with the cpu target's renderer (`renderer`: OpenMP,
vector transposes, streaming stores, the GEMM and attention libraries), gcc driver (`driver`) and host runtime."""

from __future__ import annotations

from tensorgraphs.backends.cpu.driver import GCC
from tensorgraphs.backends.cpu.renderer import CACHE_LINE, STREAM_MIN_BYTES, CpuRenderer
from tensorgraphs.backends.native import CTarget, NativeBackend
from tensorgraphs.runtime.host import HostRuntime
from tensorgraphs.runtime.realize import register_backend

HOST_RUNTIME = HostRuntime(alignment=CACHE_LINE, aligned_from=STREAM_MIN_BYTES)
"""The process's memory; outputs that may be streamed start on a cache line."""

CPU_TARGET = CTarget(CpuRenderer, GCC, HOST_RUNTIME)
CPU = NativeBackend("cpu", CPU_TARGET)
register_backend(CPU)
