"""Schedule options applied to a lowered kernel, and the values worth trying on it.

The lowering decides what a kernel computes and schedules it by rule (threads above PARALLEL_MIN_WORK
iterations, compiler-chosen unrolling and vector width, REDUCTION_LANES partial sums). `with_options` gives a
kernel other `ScheduleOptions` without changing its values: it marks the loops (grid axis 0, nesting, unroll)
and records the rest for the renderer. `option_space` lists the values `plan.kernel_search` tries.
"""

from __future__ import annotations

import dataclasses
import os

from tensorgraphs.codegen.loop_ir import (
    Accumulate,
    Kernel,
    Loop,
    ParallelAxis,
    Reduce,
    ScheduleOptions,
    Stmt,
    walk,
)
from tensorgraphs.kernels import gemm

UNROLLS = (2, 4, 8)
LANES = (8, 32)
COLLAPSE_BELOW = 64
"""An outer parallel loop shorter than this may share grid axis 0 with the loop nested in it (else its threads
get few iterations each, or none)."""


def with_options(kernel: Kernel, options: ScheduleOptions) -> Kernel:
    """`kernel` scheduled by `options`: threads 0 keeps the lowering's parallel loops, 1 runs every loop in order,
    more splits every top-level loop (never those of a `serial` kernel); `unroll` marks the innermost loops that
    run in order."""
    body = [_scheduled(stmt, options, top=True, serial=kernel.serial) for stmt in kernel.body]
    return dataclasses.replace(kernel, body=body, options=options)


def _scheduled(stmt: Stmt, options: ScheduleOptions, top: bool, serial: bool) -> Stmt:
    if isinstance(stmt, Reduce):
        return dataclasses.replace(stmt, body=[_scheduled(s, options, False, serial) for s in stmt.body])
    if not isinstance(stmt, Loop):
        return stmt
    parallel = stmt.parallel if options.threads == 0 else None
    if top and options.threads > 1 and not serial:
        parallel = stmt.parallel if stmt.parallel is not None else ParallelAxis(0, stmt.var.extent)
    if parallel is not None and options.collapse > 1 and _collapsible(stmt):
        parallel = dataclasses.replace(parallel, nested=options.collapse)
    body = [_scheduled(s, options, False, serial) for s in stmt.body]
    if parallel is not None and parallel.nested > 1:  # nothing may stand between collapsed loops
        body = [dataclasses.replace(s, unroll=0) if isinstance(s, Loop) else s for s in body]
    innermost = not any(isinstance(s, (Loop, Reduce)) for s in stmt.body)
    unroll = options.unroll if innermost and parallel is None else 0
    return dataclasses.replace(stmt, body=body, parallel=parallel, unroll=unroll)


def _collapsible(loop: Loop) -> bool:
    """A short loop whose body is one loop: OpenMP can split their iterations together."""
    return loop.var.extent < COLLAPSE_BELOW and len(loop.body) == 1 and isinstance(loop.body[0], Loop)


def option_space(kernel: Kernel) -> dict[str, tuple[int, ...]]:
    """Option name -> the values besides the default worth trying on `kernel`. Coarse: a value that changes
    nothing here renders the same C as another, and the search measures each distinct rendering once."""
    if not any(isinstance(stmt, Loop) for stmt in walk(kernel.body)):
        return {}
    loops = [stmt for stmt in kernel.body if isinstance(stmt, Loop)]
    space: dict[str, tuple[int, ...]] = {}
    if loops and not kernel.serial:
        cores = _cores()
        space["threads"] = tuple(sorted({1, cores // 2, cores} - {0}))
        if any(_collapsible(loop) for loop in loops):
            space["collapse"] = (2,)
    space["unroll"] = UNROLLS
    space["vector_bits"] = (128, 256, 512) if gemm.avx512() else (128, 256)
    if any(isinstance(s, Accumulate) for s in walk(kernel.body)):
        space["lanes"] = LANES
    return space


def program_threads() -> int:
    """The threads a parallel loop of a compiled program runs on: OpenMP's team, OMP_NUM_THREADS (its outermost
    level) where set, else the cores this process may run on."""
    setting = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(setting) if setting.isdigit() and int(setting) > 0 else _cores()


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

