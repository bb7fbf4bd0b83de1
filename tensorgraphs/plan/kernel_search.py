"""Kernel search: the schedule each generated kernel runs fastest with, measured, stored and reused.

A generated kernel (loop IR lowered from fused primitives, no library call) can run with other
`ScheduleOptions` than the lowering's (`schedule.options`: threads, collapsed loops, unrolling, vector width,
reduction lanes), all computing the same values. A beam search, as tinygrad's BEAM and TVM's autotuners do,
measures them: from the default schedule, each round changes one option of each of the `BEAM` fastest schedules
so far and measures those not measured yet, until a round finds nothing faster or after `ROUNDS`. A round's
schedules are compiled into one program that times each of them itself (`render_program(timed=True)`), run
after one another under the same load. The fastest is kept only when it beats the default by `MIN_GAIN`:
smaller differences are noise.

Searching happens only under `tg tune` or with TG_TUNE=1 (at most `SEARCH_LIMIT` kernels per process), for the
programs users run (not those built to measure something). Each measured schedule is stored in the kernel
database as it is measured (an interrupted search resumes without measuring it again), the choice in its
`schedules` table, keyed by the kernel's structural hash: its rendered code with parameters named by position,
so the same kernel on other buffers, in any program or process, finds it. Building a program applies the
stored choices (`KernelSearch.schedule`); without any, kernels stay as lowered.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import dataclasses
import hashlib
import statistics
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from tensorgraphs.codegen.compiler import load
from tensorgraphs.codegen.loop_ir import LIBRARY_CALLS, Kernel, Loop, ScheduleOptions, walk
from tensorgraphs.kerneldb import KernelDB, ScheduleChoice, StoredView, device_fingerprint, per_database
from tensorgraphs.plan.choices import Recorder, code_hash, is_untuned, planning_label, tuning_enabled
from tensorgraphs.plan.measure import random_array, rounds_within
from tensorgraphs.plan.signature import TensorSpec
from tensorgraphs.schedule.options import option_space, with_options

if TYPE_CHECKING:
    from tensorgraphs.backends.native import CTarget

BEAM = 3
ROUNDS = 3
MIN_GAIN = 0.05
SEARCH_LIMIT = 64
"""Kernels TG_TUNE=1 searches per process at most (each costs a compile per round)."""
RUN_BUDGET = 0.2
"""Seconds of timed runs per round (at least MIN_RUNS, at most MAX_RUNS)."""
MIN_RUNS, MAX_RUNS = 5, 200

Measure = Callable[[Kernel, list[ScheduleOptions]], list[float]]
"""Seconds per run of a kernel with each of the schedules."""


@dataclass(frozen=True)
class SearchResult:
    """The schedule chosen, its time and the default's, and how many distinct schedules were measured."""

    options: ScheduleOptions
    seconds: float
    default_seconds: float
    candidates: int


def searchable(kernel: Kernel) -> bool:
    """Generated loops only: a library call (GEMM, attention) has its own candidates (`plan.choices`)."""
    body = list(walk(kernel.body))
    return any(isinstance(s, Loop) for s in body) and not any(isinstance(s, LIBRARY_CALLS) for s in body)


def beam_search(kernel: Kernel, measure: Measure, render: Callable[[Kernel], str],
                known: dict[ScheduleOptions, float] | None = None, beam: int = BEAM,
                rounds: int = ROUNDS) -> SearchResult:
    """The fastest schedule of `kernel` by `measure`; schedules that `render` the same are measured once, and
    those in `known` (seconds) not at all."""
    known = known or {}
    times: dict[ScheduleOptions, float] = {}  # one schedule per distinct rendering
    rendered: dict[str, ScheduleOptions] = {}
    tried: set[ScheduleOptions] = set()

    def measure_new(schedules: list[ScheduleOptions]) -> None:
        new = []
        for options in schedules:
            if options in tried:
                continue
            tried.add(options)
            if rendered.setdefault(render(with_options(kernel, options)), options) is not options:
                continue
            if options in known:
                times[options] = known[options]
            else:
                new.append(options)
        if new:
            times.update(zip(new, measure(kernel, new)))

    default = ScheduleOptions()
    measure_new([default])
    space = option_space(kernel)
    frontier = [default]
    for _ in range(rounds):
        measure_new([dataclasses.replace(options, **{name: value}) for options in frontier
                     for name, values in space.items() for value in values])
        fastest = sorted(times, key=times.__getitem__)[:beam]
        if fastest == frontier:
            break
        frontier = fastest
    best = min(times, key=times.__getitem__)
    if times[best] > times[default] * (1 - MIN_GAIN):
        best = default
    return SearchResult(best, times[best], times[default], len(times))


def timed_on(target: CTarget) -> Measure:
    """Measures schedules on `target`: one program with a copy of the kernel per schedule, each timed by the
    program, on random values (integer ones small: index checks clamp the rest)."""

    def measure(kernel: Kernel, schedules: list[ScheduleOptions]) -> list[float]:
        variants = [dataclasses.replace(with_options(kernel, options), name=f"schedule{i}")
                    for i, options in enumerate(schedules)]
        library = load(target.renderer.render_program(variants, [b.name for b in kernel.buffers], timed=True),
                       target.driver)
        seconds = (ctypes.c_double * len(variants)).in_dll(library, "tg_kernel_seconds")
        entry = library.tg_program
        entry.argtypes, entry.restype = [ctypes.POINTER(ctypes.c_void_p)], ctypes.c_int
        rng = np.random.default_rng(0)
        arrays = [target.runtime.to_device(random_array(TensorSpec(b.dtype, (b.size,)), rng),
                                           np.dtype(b.dtype.storage)) for b in kernel.buffers]
        runs: list[list[float]] = []
        with np.errstate(all="ignore"):
            target.runtime.launch(entry, arrays)  # warm-up: pages, caches, threads
            for _ in rounds_within(RUN_BUDGET, MIN_RUNS, MAX_RUNS):
                ctypes.memset(seconds, 0, ctypes.sizeof(seconds))
                target.runtime.launch(entry, arrays)
                runs.append(list(seconds))
        return [statistics.median(run[i] for run in runs) for i in range(len(variants))]

    return measure


def kernel_hash(kernel: Kernel, render: Callable[[Kernel], str]) -> str:
    """The structural hash of a kernel as lowered: its rendered code (parameters named by position, so not which
    buffers it reads) and its parameters' dtypes, sizes and roles."""
    digest = hashlib.blake2b(render(kernel).encode(), digest_size=10)
    digest.update(repr([(b.dtype.name, b.size, b.writes) for b in kernel.buffers] + [kernel.serial]).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class SeenKernel:
    """A generated kernel of a program built while `recording`: where, and its stored choice if any."""

    label: str
    name: str
    key: str
    choice: ScheduleChoice | None


_SEARCH_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("search_deadline", default=None)
_SEEN: Recorder[SeenKernel] = Recorder()


@contextlib.contextmanager
def searching(deadline: float) -> Iterator[None]:
    """`tg tune`: programs built inside search each unsearched kernel until `time.perf_counter()` passes
    `deadline` (no SEARCH_LIMIT), each reported on stderr."""
    token = _SEARCH_DEADLINE.set(deadline)
    try:
        yield
    finally:
        _SEARCH_DEADLINE.reset(token)


def search_deadline() -> float | None:
    """The end of `tg tune`'s budget (`searching`), or None outside it."""
    return _SEARCH_DEADLINE.get()


recording = _SEEN.recording
"""Records every generated kernel of the programs built inside (`tg explain`)."""


class KernelSearch:
    """The stored schedules of one kernel database and device, and the searches of this process."""

    def __init__(self, db: KernelDB, fingerprint: str) -> None:
        self.db, self.fingerprint = db, fingerprint
        self.searched = 0  # kernels searched by TG_TUNE=1, bounded by SEARCH_LIMIT
        # kernel hash -> stored choice, for this device and code generator
        self.choices: StoredView[dict[str, ScheduleChoice]] = StoredView(
            db, lambda: db.schedules(fingerprint, code_hash()))

    def may_search(self) -> bool:
        deadline = _SEARCH_DEADLINE.get()
        if deadline is not None:
            return time.perf_counter() < deadline
        return tuning_enabled() and self.searched < SEARCH_LIMIT

    def schedule(self, kernels: list[Kernel], target: CTarget, search: bool,
                 measure: Measure | None = None) -> list[Kernel]:
        """`kernels` with their stored schedules (as lowered when building `untuned`); with `search`, unsearched
        ones are searched first when tuning is on (measured by `measure`, default: on `target`)."""
        if is_untuned():
            return kernels
        search = search and self.may_search()
        if not search and not self.choices() and not _SEEN:
            return kernels  # nothing stored: no kernel to hash
        render = lambda kernel: target.renderer(kernel).render("tg_kernel")  # noqa: E731
        scheduled = []
        for kernel in kernels:
            if not searchable(kernel):
                scheduled.append(kernel)
                continue
            key = kernel_hash(kernel, render)
            choice = self.choices().get(key)
            if choice is None and search and self.may_search():
                choice = self.search(kernel, key, render, measure or timed_on(target))
            _SEEN.add(SeenKernel(planning_label(), kernel.name, key, choice))
            scheduled.append(kernel if choice is None else with_options(kernel, ScheduleOptions.parse(choice.options)))
        return scheduled

    def search(self, kernel: Kernel, key: str, render: Callable[[Kernel], str], measure: Measure) -> ScheduleChoice:
        """Search `kernel`'s schedules (resuming from those measured before) and store the choice."""
        self.searched += 1
        candidate_id = f"schedule.{key}"
        known = {ScheduleOptions.parse(row.shape): row.median
                 for row in self.db.measurements(self.fingerprint, candidate_id) if row.impl_hash == code_hash()}

        def measure_and_store(kernel: Kernel, schedules: list[ScheduleOptions]) -> list[float]:
            seconds = measure(kernel, schedules)
            for options, spent in zip(schedules, seconds):
                self.db.record(self.fingerprint, candidate_id, code_hash(), "", str(options), 0.0,
                               float(sum(b.size * b.dtype.itemsize for b in kernel.buffers)), [spent])
            return seconds

        result = beam_search(kernel, measure_and_store, render, known)
        choice = ScheduleChoice(kernel.name, str(result.options), result.seconds, result.default_seconds,
                                result.candidates)
        self.db.store_schedule(self.fingerprint, key, code_hash(), choice)
        if _SEARCH_DEADLINE.get() is not None:  # `tg tune` says what it is doing
            print(f"kernel search: {kernel.name}: {choice.options}, {choice.seconds * 1e6:,.1f} us (default "
                  f"{choice.default_seconds * 1e6:,.1f} us, {choice.candidates} schedules)", file=sys.stderr)
        return choice


_SEARCHES: dict[int, KernelSearch] = {}


def kernel_search(db: KernelDB | None = None) -> KernelSearch:
    """The search over the default kernel database (`per_database`)."""
    return per_database(_SEARCHES, lambda db: KernelSearch(db, device_fingerprint()), db)
