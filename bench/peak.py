"""The FMA peak of this machine: GFLOP/s of independent FMAs of the widest vectors on every OpenMP thread, the
ceiling the GEMM benchmarks (bench/gemm.py) and the training steps' GEMM floor (bench/train.py) are measured
against."""

from __future__ import annotations

import ctypes
import subprocess
import tempfile
from pathlib import Path

PEAK_SOURCE = r"""
#include <omp.h>
#include <time.h>
#ifdef __AVX512F__ /* registers of 16 floats, 32 of them */
enum { LANES = 16, ACCUMULATORS = 24 };
#else /* AVX2: 8 floats, 16 registers */
enum { LANES = 8, ACCUMULATORS = 12 };
#endif
typedef float vec __attribute__((vector_size(4 * LANES)));
static double seconds(clockid_t clock) {
    struct timespec now;
    clock_gettime(clock, &now);
    return now.tv_sec + 1e-9 * now.tv_nsec;
}
float fma_peak_sink[64]; /* visible outside, so the FMAs cannot be optimized away */
double fma_peak_gflops(long reps, int cpu_clock) {
    clockid_t clock = cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC;
    double start = seconds(clock);
    #pragma omp parallel
    {
        vec acc[ACCUMULATORS], x = (vec){0} + 1.0f, y = (vec){0} + 1e-7f;
        for (int i = 0; i < ACCUMULATORS; i++) acc[i] = (vec){0} + (float)i;
        for (long r = 0; r < reps; r++) {
            _Pragma("GCC unroll 24") for (int i = 0; i < ACCUMULATORS; i++) acc[i] = acc[i] * x + y; /* FMAs */
            __asm__ volatile("" : "+x"(x));
        }
        for (int i = 1; i < ACCUMULATORS; i++) acc[0] += acc[i];
        float sum = 0.0f;
        for (int lane = 0; lane < LANES; lane++) sum += acc[0][lane];
        fma_peak_sink[omp_get_thread_num() % 64] = sum;
    }
    return 2.0 * LANES * ACCUMULATORS * reps * omp_get_max_threads() / (seconds(clock) - start) * 1e-9;
}
"""


def fma_peak(cpu_clock: bool) -> float:
    """GFLOP/s of independent FMAs of the widest vectors (AVX-512 or AVX2) on every OpenMP thread (best of 5)."""
    with tempfile.TemporaryDirectory() as scratch:
        source, library = Path(scratch) / "peak.c", Path(scratch) / "peak.so"
        source.write_text(PEAK_SOURCE)
        command = ["gcc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", str(source)]
        subprocess.run([*command, "-o", str(library)], check=True)
        function = ctypes.CDLL(str(library)).fma_peak_gflops
        function.restype, function.argtypes = ctypes.c_double, [ctypes.c_long, ctypes.c_int]
        return max(function(20_000_000, cpu_clock) for _ in range(5))
