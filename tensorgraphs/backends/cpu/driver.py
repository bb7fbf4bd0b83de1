"""The cpu target's compiler driver: gcc (`TG_CC`) with OpenMP, tuned for this machine."""

from __future__ import annotations

import os
import platform

from tensorgraphs.codegen.compiler import CompilerDriver

COMPILER = os.environ.get("TG_CC", "gcc")
NO_SPILLS_TO_INTEGER_REGISTERS = ("-mtune-ctrl=^inter_unit_moves_to_vec,^inter_unit_moves_from_vec",)
"""gcc's tuning for AMD Zen spills float registers to integer ones, and every value so spilled crosses back
before use: a fully unrolled loop body that needs more than 16 vector registers (a depthwise conv on 7x7 images:
9 weights, the bias and the padding taps' products per channel) ran 2.5x slower (bench/NOTES.md). Off, they
spill to the stack like elsewhere. x86 gcc only (clang does not know the option)."""
NO_UNROLL_AND_JAM = ("-fno-loop-unroll-and-jam",)
"""gcc's -O3 unrolls a loop over rows around a loop over columns that accumulates into a local array (a column
sum, `schedule.lower.reduce_into_output`) and jams the copies into one loop: each load then reads every other row,
a stream the prefetcher follows worse than rows read one after another (a (1024, 256) column sum read from memory
took 1.4x as long: bench/NOTES.md). No kernel of ours is written for it. gcc only (clang does not jam at -O3)."""
NO_JUMP_THREADING = ("-fno-thread-jumps",)
"""A loop that reads several padded neighbours (`cond ? x[clamped index] : 0` with conditions invariant in the
loop: a local response normalization's window over channels) had its blocks duplicated by gcc's jump threading
along those conditions, and the copies were left unvectorized (gcc 12: "data ref analysis failed"); Inception's
LRNs then took a third of its time. Our kernels are straight-line loop bodies, which threading does not help:
over 60 programs no other loop changed."""
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
         "-fno-tree-slp-vectorize", "-std=gnu11", "-shared", "-fPIC",
         *(NO_SPILLS_TO_INTEGER_REGISTERS if platform.machine() in ("x86_64", "AMD64")
           and "clang" not in os.path.basename(COMPILER) else ()),
         *(NO_UNROLL_AND_JAM + NO_JUMP_THREADING if "clang" not in os.path.basename(COMPILER) else ()))
"""Never -ffast-math: it changes NaN/Inf results. The two -fno flags are enough to vectorize our math;
-ffp-contract=off keeps a*b+c rounded twice, as every other backend computes it. The straight-line (SLP)
vectorizer of gcc 12 miscompiles short unrolled reductions of comparisons (`(x == 2).all(1)` over rows of 4
uint8 stored 254); our loops are vectorized by the loop vectorizer and explicit vector types, not by SLP."""


OPENMP_ENVIRONMENT = (("GOMP_SPINCOUNT", "3000"),)
"""Read by the OpenMP runtime when the first program loads (a user's own setting wins): idle threads spin a few tens
of microseconds before sleeping, not libgomp's several ms, so a thread waiting for a descheduled peer soon leaves
its core to the others (figures: bench/NOTES.md)."""


GCC = CompilerDriver(COMPILER, FLAGS, environment=OPENMP_ENVIRONMENT)
"""The cpu target's driver: gcc (`TG_CC`) with OpenMP, tuned for this machine."""
