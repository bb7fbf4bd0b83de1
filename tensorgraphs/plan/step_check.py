"""Step check: a compiled program keeps its tuned choices only where the whole program is not slower with them.

The planner's measured choices (`plan.choices`) and the kernel search's schedules (`plan.kernel_search`) are each
decided on one kernel alone; in a program their gains need not add up (a neighbour's data no longer in cache, threads
started per kernel). So a program built with tuned choices (a route other than the default's, or a kernel with a
searched schedule) is measured whole against the same program built `untuned`: both on the same random inputs,
interleaved (`measure.time_interleaved`, by the timed builds' clock, TG_KERNEL_CLOCK), medians, within `BUDGET`
seconds. It keeps its tuned choices if it is not slower (the verdict `kept`), else it runs the defaults.

Checking happens only under `tg tune` (every program with tuned choices, past its budget too) or with TG_TUNE=1 (at
most `CHECK_LIMIT` programs per process), as the program is built: after its composites were measured and its
kernels searched. The verdict goes to the kernel database's `steps` table, keyed by a hash of the tuned program's C
source (other tuned choices make another program, checked again) and the code hash: a later build, in any process,
follows it without measuring; an interrupted tune checks only the programs left. Without a verdict a program runs
its tuned choices.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Callable, Protocol, TypeVar

import numpy as np

from tensorgraphs.codegen.loop_ir import Kernel, ScheduleOptions
from tensorgraphs.graph.node import Node
from tensorgraphs.kerneldb import KernelDB, StepVerdict, StoredView, device_fingerprint, per_database
from tensorgraphs.plan.choices import Recorder, code_hash, planning_label, still_taken, tuning_enabled, untuned
from tensorgraphs.plan.kernel_search import search_deadline
from tensorgraphs.plan.measure import kernel_clock, random_array, time_interleaved
from tensorgraphs.plan.signature import TensorSpec

BUDGET = 2.0
"""Seconds of interleaved runs per check (at least MIN_RUNS of each program, at most MAX_RUNS)."""
MIN_RUNS, MAX_RUNS = 5, 100
CHECK_LIMIT = 16
"""Programs TG_TUNE=1 checks per process at most (each costs a compile and `BUDGET`)."""


class Checked(Protocol):
    """What the check needs of a program: its code, its kernels and routes (to see what was tuned) and a run."""

    source: str
    kernels: list[Kernel]
    routes: tuple

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]: ...


P = TypeVar("P", bound=Checked)
Measure = Callable[[Callable[[], Any], Callable[[], Any]], tuple[float, float]]
"""Seconds per run of (the tuned program, the default one)."""


def time_programs(tuned: Callable[[], Any], default: Callable[[], Any]) -> tuple[float, float]:
    """The median seconds per run of each, interleaved within `BUDGET`."""
    samples = time_interleaved([tuned, default], BUDGET, MIN_RUNS, MAX_RUNS, kernel_clock())
    return statistics.median(samples[0]), statistics.median(samples[1])


def program_inputs(inputs: list[Node]) -> list[np.ndarray]:
    """Random floats and booleans, integers 1: an index in range (an index out of range stops a program early), a
    divisor other than zero."""
    rng = np.random.default_rng(0)
    return [
        random_array(TensorSpec(n.dtype, n.shape), rng)
        if n.dtype.is_floating_point or n.dtype.is_bool
        else np.ones(n.shape, n.dtype.storage)
        for n in inputs
    ]


def has_tuned_choices(program: Checked) -> bool:
    """Whether `program` runs anything the defaults would not: a composite's route, a kernel's schedule."""
    with untuned():
        default_routes = still_taken(program.routes)
    return not default_routes or any(kernel.options != ScheduleOptions() for kernel in program.kernels)


def program_hash(source: str) -> str:
    return hashlib.blake2b(source.encode(), digest_size=10).hexdigest()


@dataclass(frozen=True)
class SeenStep:
    """A program with tuned choices built while `recording`: its compiled function and the verdict, if any."""

    label: str
    key: str
    verdict: StepVerdict | None


_SEEN: Recorder[SeenStep] = Recorder()
recording = _SEEN.recording
"""Records the step check of every program with tuned choices built inside (`tg tune`, `tg explain`)."""


class StepCheck:
    """The verdicts of one kernel database and device, and the checks of this process."""

    def __init__(self, db: KernelDB, fingerprint: str) -> None:
        self.db, self.fingerprint = db, fingerprint
        self.checked = 0  # programs checked by TG_TUNE=1, bounded by CHECK_LIMIT
        # program hash -> stored verdict, for this device and code generator
        self.verdicts: StoredView[dict[str, StepVerdict]] = StoredView(db, lambda: db.steps(fingerprint, code_hash()))

    def may_check(self) -> bool:
        """Under `tg tune` always, past its budget too (a check costs a compile and `BUDGET`, and is what makes its
        choices safe to keep); with TG_TUNE=1 up to CHECK_LIMIT programs."""
        return search_deadline() is not None or (tuning_enabled() and self.checked < CHECK_LIMIT)

    def choose(self, tuned: P, build_default: Callable[[], P], inputs: list[Node], measure: Measure | None = None) -> P:
        """`tuned`, or the program `build_default` builds (the same graph `untuned`) where its verdict says so;
        without a verdict, checked first when tuning is on (measured by `measure`, default: `time_programs`) on
        inputs for the nodes `inputs`."""
        if not has_tuned_choices(tuned):
            return tuned
        key = program_hash(tuned.source)
        verdict = self.verdicts().get(key)
        default = None
        if verdict is None and self.may_check():
            default = build_default()
            verdict = self.check(key, tuned, default, inputs, measure or time_programs)
        _SEEN.add(SeenStep(planning_label(), key, verdict))
        if verdict is None or verdict.kept:
            return tuned
        return default if default is not None else build_default()

    def check(self, key: str, tuned: Checked, default: Checked, inputs: list[Node], measure: Measure) -> StepVerdict:
        """Measure both programs whole and store the verdict."""
        self.checked += 1
        arrays = program_inputs(inputs)
        with np.errstate(all="ignore"):
            tuned_seconds, default_seconds = measure(lambda: tuned.run(arrays), lambda: default.run(arrays))
        verdict = StepVerdict(planning_label(), tuned_seconds <= default_seconds, tuned_seconds, default_seconds)
        self.db.store_step(self.fingerprint, key, code_hash(), verdict)
        if search_deadline() is not None:  # `tg tune` says what it is doing
            print(f"step check: {verdict.name}: {describe(verdict)}", file=sys.stderr)
        return verdict


def describe(verdict: StepVerdict) -> str:
    """What the check decided, with both times."""
    what = "kept its tuned choices" if verdict.kept else "dropped its tuned choices (runs the defaults)"
    return (
        f"{what}: tuned {verdict.tuned_seconds * 1e3:,.3f} ms, defaults {verdict.default_seconds * 1e3:,.3f} ms "
        "per run of the whole program"
    )


_CHECKS: dict[int, StepCheck] = {}


def step_check(db: KernelDB | None = None) -> StepCheck:
    """The check over the default kernel database (`per_database`)."""
    return per_database(_CHECKS, lambda db: StepCheck(db, device_fingerprint()), db)
