"""The portable device: generated C that a plain C11 compiler builds, for a machine without gcc, OpenMP or AVX-512.

It is the backend seam's smallest example (docs/backends.md): the base renderer's spelling (one thread, no
intrinsics or vector extensions, no streaming stores), a plain compiler driver (`TG_PORTABLE_CC`, default `cc`;
no -march=native, no OpenMP) and no kernel libraries, so the planner decomposes GEMM and attention for it.
Scheduling, the memory arena, the one-native-call runtime and the program caches are shared (`backends.native`).
Use it with `tg.device("portable")`.
"""

from __future__ import annotations

import os

from tensorgraphs.backends.native import CTarget, NativeBackend
from tensorgraphs.codegen.c_renderer import CStyleRenderer
from tensorgraphs.codegen.compiler import CompilerDriver
from tensorgraphs.runtime.host import POOLED_BYTES, HostRuntime
from tensorgraphs.runtime.realize import register_backend


class PortableRenderer(CStyleRenderer):
    """ISO C11 and POSIX (the entry point's Ctrl-C handling) with the base spelling; `a * b + c` is never
    contracted into an fma (gcc's ISO modes do not; clang would without the pragma), so it rounds as the reference
    backend does."""

    preamble = "#define _POSIX_C_SOURCE 200809L\n#pragma STDC FP_CONTRACT OFF\n" + CStyleRenderer.preamble


DRIVER = CompilerDriver(os.environ.get("TG_PORTABLE_CC", "cc"), ("-O2", "-std=c11", "-shared", "-fPIC"))

RUNTIME = HostRuntime(alignment=64, aligned_from=POOLED_BYTES)
"""The process's memory (nothing is streamed: only pooled outputs need aligning)."""

PORTABLE = NativeBackend("portable", CTarget(PortableRenderer, DRIVER, RUNTIME, features=frozenset()))
register_backend(PORTABLE)
