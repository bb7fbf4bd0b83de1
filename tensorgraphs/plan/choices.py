"""The compiled path's choices: which implementation of each composite a compiled program runs.

The scheduler asks `route_of(node)` for every composite it meets. A composite's candidates are its rows in
`CANDIDATES` (registered by whoever can lower them: `schedule.extern` registers the GEMM library and the BLAS
kernel for `matmul`) plus its decomposition (lowered loops, fused with their neighbours), always last. With one
applicable candidate there is nothing to decide. Otherwise the choice is per use (`plan.consumers.Use`: the
composite's `Signature`, its inputs anonymous, with the elementwise passes that follow it, so identical layers are
planned once), the candidate with the smallest

1. measured time: its row in the kernel database (kernel id `compiled.<composite>.<candidate>`, the signature with
   its consumers, `Use.measured_as`), else
2. predicted time (`CostModel.predict`): a regression over the candidate's other measured shapes, or, with
   none, the roofline times the candidate's `prior` (so a machine with no measurements gets the table's order; a
   prior may depend on the node's shape class, e.g. Winograd's on the tiles and channels of a conv).

Measuring happens only under `tg tune` or with TG_TUNE=1 (then on first need, at most `MEASURE_LIMIT`
uses per process), so compiling stays fast by default: a measurement compiles the composite with the elementwise
passes that follow it in the program (a batch norm, a relu, a residual) with each candidate forced (`forced`) and
times the programs interleaved, so it measures exactly what would run, under the same load, and a candidate that
fuses those passes into its call is charged the same work as one that leaves them. A candidate's `applies` must
depend on the node's signature only (dtypes, shapes, parameters).
A candidate also names the target features it `needs` (a call of a native kernel library); a program built for a
target without them (`targeting`: the portable C device) runs the decomposition.
A compiled program remembers the routes it was built with (`routes_taken`) and is rebuilt when one changed.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, Iterator, TypeVar

import numpy as np

from tensorgraphs.graph.composite import is_composite
from tensorgraphs.graph.node import Node
from tensorgraphs.kerneldb import KernelDB, default_db, device_fingerprint, per_database
from tensorgraphs.plan.consumers import Use, use_of, using
from tensorgraphs.plan.cost import NOMINAL_PEAKS, CostModel, Estimate
from tensorgraphs.plan.measure import kernel_clock, random_array, time_interleaved
from tensorgraphs.plan.signature import Signature, TensorSpec, signature_of

DECOMPOSE = "decompose"
KERNEL_LIBRARIES = "kernel_libraries"
"""A target feature: its programs may call the native kernel libraries (`tensorgraphs.kernels`)."""
OPENBLAS = "openblas"
"""A target feature: its programs may call kernels linked against OpenBLAS (an exported library links only libc,
libm and OpenMP)."""
SCHEDULE_SEARCH = "schedule_search"
"""A target feature: its renderer reads `ScheduleOptions`, so its generated kernels are worth searching
(`plan.kernel_search`)."""
ALL_FEATURES = frozenset({KERNEL_LIBRARIES, OPENBLAS, SCHEDULE_SEARCH})
MEASURE_LIMIT = 64
"""Uses TG_TUNE=1 measures per process at most (each costs a compile per candidate)."""
CHOICE_CACHE_SIZE = 4096
T = TypeVar("T")


@dataclass(frozen=True)
class Candidate:
    """One way a compiled program can run a composite: `applies(node)` says whether it can run this node on a
    target with the features it `needs`; `prior` is its time as a multiple of the roofline, assumed until it is
    measured: one figure, or a function of the node (like `applies`, of its signature only)."""

    name: str
    applies: Callable[[Node], bool]
    prior: float | Callable[[Node], float] = 1.0
    needs: frozenset[str] = frozenset({KERNEL_LIBRARIES})

    def prior_of(self, node: Node) -> float:
        """The prior on `node`."""
        return self.prior(node) if callable(self.prior) else self.prior


def _always(node: Node) -> bool:
    return True


DECOMPOSITION = Candidate(DECOMPOSE, _always, prior=4.0, needs=frozenset())
CANDIDATES: dict[str, list[Candidate]] = {}
"""Composite name -> its dedicated candidates (the decomposition is implied)."""


def register_candidates(composite: str, *candidates: Candidate) -> None:
    """Add candidates of `composite` (a name registered twice is replaced: re-imports stay idempotent)."""
    table = CANDIDATES.setdefault(composite, [])
    for candidate in candidates:
        table[:] = [c for c in table if c.name != candidate.name] + [candidate]


def candidates_of(node: Node) -> list[Candidate]:
    """The candidates that can run `node` on the target being built for, the decomposition last."""
    features = _FEATURES.get()
    return [c for c in CANDIDATES.get(node.op.name, ()) if c.needs <= features and c.applies(node)] + [DECOMPOSITION]


def kernel_id(sig: Signature, candidate: str) -> str:
    """The kernel database's name for `candidate` running composite `sig.name` in a compiled program."""
    return f"compiled.{sig.name}.{candidate}"


@functools.cache
def code_hash() -> str:
    """Identifies the code that generates compiled programs (scheduler, codegen, native kernels, compiler):
    measurements taken with other code don't count."""
    from tensorgraphs.kernels.gemm.build import compiler_version

    package = Path(__file__).resolve().parent.parent
    digest = hashlib.blake2b(compiler_version().encode(), digest_size=6)
    for folder in ("schedule", "codegen", "kernels", "backends"):
        for source in sorted((package / folder).rglob("*")):
            if source.suffix in (".py", ".c", ".h"):
                digest.update(source.read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class Option:
    """A candidate of one signature: its predicted time (the cost model's fit or the prior; not its row for this
    signature alone) and its measured time, if any."""

    candidate: str
    predicted: Estimate
    measured: float | None

    @property
    def seconds(self) -> float:
        return self.predicted.seconds if self.measured is None else self.measured


# ---------------------------------------------------------------------------
# Who asked: the compiled function being traced, and collectors (`tg tune`, `tg explain`)
# ---------------------------------------------------------------------------

_FORCED: contextvars.ContextVar[tuple[tuple[Signature, str], ...]] = contextvars.ContextVar("forced", default=())
_LABEL: contextvars.ContextVar[str] = contextvars.ContextVar("planning_for", default="eager graphs")
_COLLECTORS: list[dict[str, dict[Use, Node]]] = []
_FEATURES: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("target_features", default=ALL_FEATURES)


def target_features() -> frozenset[str]:
    """The features of the target being planned for (`targeting`)."""
    return _FEATURES.get()


@contextlib.contextmanager
def targeting(features: frozenset[str]) -> Iterator[None]:
    """Composites planned inside are planned for a target with `features` (default: all, the cpu device); a backend
    building inside an enclosing `targeting` narrows it with `target_features()` (`tg.export` leaves out OPENBLAS)."""
    token = _FEATURES.set(features)
    try:
        yield
    finally:
        _FEATURES.reset(token)


@contextlib.contextmanager
def forced(routes: dict[Signature, str]) -> Iterator[None]:
    """Programs built inside run each signature in `routes` by the candidate named there."""
    token = _FORCED.set((*_FORCED.get(), *routes.items()))
    try:
        yield
    finally:
        _FORCED.reset(token)


@contextlib.contextmanager
def planning_for(label: str) -> Iterator[None]:
    """Composites planned inside belong to `label` (a compiled function) in what collectors record."""
    token = _LABEL.set(label)
    try:
        yield
    finally:
        _LABEL.reset(token)


def planning_label() -> str:
    """The compiled function being traced (what `planning_for` named), or "eager graphs"."""
    return _LABEL.get()


@contextlib.contextmanager
def collecting() -> Iterator[dict[str, dict[Use, Node]]]:
    """Records every composite planned inside: label -> {its use: a node of it}, in first-seen order."""
    found: dict[str, dict[Use, Node]] = {}
    _COLLECTORS.append(found)
    try:
        yield found
    finally:
        _COLLECTORS[:] = [c for c in _COLLECTORS if c is not found]  # by identity: equal dicts are others


class Recorder(Generic[T]):
    """What programs built inside `recording()` saw (kernels searched, step checks), for `tg tune` and `tg explain`;
    nested recordings each get everything."""

    def __init__(self) -> None:
        self._open: list[list[T]] = []

    def __bool__(self) -> bool:
        return bool(self._open)

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[T]]:
        seen: list[T] = []
        self._open.append(seen)
        try:
            yield seen
        finally:
            self._open[:] = [r for r in self._open if r is not seen]  # by identity: equal lists are others

    def add(self, item: T) -> None:
        for seen in self._open:
            seen.append(item)


# ---------------------------------------------------------------------------
# The planner of the compiled path
# ---------------------------------------------------------------------------


_TUNING: contextvars.ContextVar[bool] = contextvars.ContextVar("tuning", default=False)
_UNTUNED: contextvars.ContextVar[bool] = contextvars.ContextVar("untuned", default=False)


def tuning_enabled() -> bool:
    """TG_TUNE=1 or inside `tuning` (not `untuned`): measure a composite's candidates the first time a program
    needs its choice (and search the schedules of its generated kernels: `plan.kernel_search`)."""
    return not _UNTUNED.get() and (_TUNING.get() or os.environ.get("TG_TUNE", "0") not in ("", "0"))


def is_untuned() -> bool:
    """Whether programs built now run the defaults (`untuned`)."""
    return _UNTUNED.get()


@contextlib.contextmanager
def untuned() -> Iterator[None]:
    """Programs built inside run the defaults, what a machine with no measurements runs: each composite by its
    candidate of smallest `prior`, generated kernels as lowered (`plan.kernel_search`); nothing is measured or
    searched. `plan.step_check` compares whole programs built so with the tuned ones."""
    token = _UNTUNED.set(True)
    try:
        yield
    finally:
        _UNTUNED.reset(token)


@contextlib.contextmanager
def tuning() -> Iterator[None]:
    """`tg tune`'s run of a script: as TG_TUNE=1, so the kernels searched are those of the measured choices."""
    token = _TUNING.set(True)
    try:
        yield
    finally:
        _TUNING.reset(token)


class CompiledPlanner:
    """Chooses among a composite's candidates by measured or predicted time (see the module docstring)."""

    def __init__(self, db: KernelDB | None = None, fingerprint: str | None = None) -> None:
        db = db if db is not None else default_db()
        fingerprint = fingerprint or device_fingerprint()
        self.cost_model = CostModel(db, fingerprint, peaks=db.device_peaks(fingerprint) or NOMINAL_PEAKS)
        self.measured_signatures = 0  # by TG_TUNE=1, bounded by MEASURE_LIMIT
        self._chosen: dict[tuple[frozenset[str], bool, Use], str] = {}
        self._generation = db.generation

    def route(self, node: Node) -> str:
        """The candidate that runs composite `node` as the graph being built uses it (recorded by any collector)."""
        sig = signature_of(node)
        use = use_of(sig)
        for found in _COLLECTORS:
            found.setdefault(_LABEL.get(), {}).setdefault(use, node)
        if (route := dict(_FORCED.get()).get(sig)) is not None:
            return route
        return self.choice(use)

    def choice(self, use: Use) -> str:
        """The candidate of the smallest measured or predicted time on `use` (measured first when tuning)."""
        candidates = candidates_of(use.composite)
        if len(candidates) == 1:
            return candidates[0].name
        if self._generation != self.cost_model.db.generation:  # new measurements: choices may change
            self._chosen.clear()
            self._generation = self.cost_model.db.generation
        key = (_FEATURES.get(), _UNTUNED.get(), use)
        if key not in self._chosen:
            if tuning_enabled() and self.measured_signatures < MEASURE_LIMIT and self.unmeasured(use):
                self.measure(use)
            if len(self._chosen) >= CHOICE_CACHE_SIZE:
                self._chosen.clear()
            if _UNTUNED.get():  # every candidate has the signature's roofline: the prior alone orders them
                self._chosen[key] = min(candidates, key=lambda c: c.prior_of(use.composite)).name
            else:
                self._chosen[key] = min(self.options(use), key=lambda o: o.seconds).candidate
        return self._chosen[key]

    def options(self, use: Use) -> list[Option]:
        """Every candidate of `use`, in table order (ties go to the earlier)."""
        sig, model = use.measured_as, self.cost_model
        options = []
        for candidate in candidates_of(use.composite):
            name = kernel_id(sig, candidate.name)
            predicted = model.predict(name, code_hash(), sig)
            if predicted.source == "roofline":
                predicted = Estimate(predicted.seconds * candidate.prior_of(use.composite), "prior")
            row = model.measured(name, code_hash(), sig)
            options.append(Option(candidate.name, predicted, None if row is None else row.median))
        return options

    def unmeasured(self, use: Use) -> list[Candidate]:
        sig = use.measured_as
        return [c for c in candidates_of(use.composite)
                if self.cost_model.measured(kernel_id(sig, c.name), code_hash(), sig) is None]

    def measure(self, use: Use, budget: float = 0.05) -> int:
        """Time the unmeasured candidates of `use`, each as a program of its own computing the composite and its
        consumers, and store the rows; how many."""
        sig = use.measured_as
        self.measured_signatures += 1
        pending = self.unmeasured(use)
        for candidate, samples in zip(pending, time_candidates(use, [c.name for c in pending], budget)):
            self.cost_model.db.record(self.cost_model.fingerprint, kernel_id(sig, candidate.name), code_hash(),
                                      sig.dtype_key, sig.shape_key, sig.flops, sig.bytes, samples)
        return len(pending)


def time_candidates(use: Use, candidates: list[str], budget: float = 0.05) -> list[list[float]]:
    """Seconds per run of a program computing `use` (the composite and its consumers), per candidate running the
    composite: the programs timed interleaved (`measure.time_interleaved`: drifting load weighs on all alike), about
    `budget` seconds each, by the timed builds' clock (as the kernel search measures)."""
    from tensorgraphs.backends.cpu import CPU_TARGET
    from tensorgraphs.backends.native import Program
    from tensorgraphs.schedule.fusion import schedule_kernels

    inputs = use.inputs()
    rng = np.random.default_rng(0)
    arrays = [random_array(TensorSpec(n.dtype, n.shape), rng) for n in inputs]
    programs = []
    for candidate in candidates:
        with forced({use.signature: candidate}):
            programs.append(Program(schedule_kernels(list(use.roots), set(inputs).__contains__), inputs, CPU_TARGET))
    with np.errstate(all="ignore"):
        return time_interleaved([functools.partial(program.run, arrays) for program in programs],
                                budget * len(programs), min_runs=5, clock=kernel_clock())


_PLANNERS: dict[int, CompiledPlanner] = {}


def compiled_planner(db: KernelDB | None = None) -> CompiledPlanner:
    """The planner over the default kernel database (`per_database`)."""
    return per_database(_PLANNERS, CompiledPlanner, db)


def routes_taken(collected: dict[str, dict[Use, Node]]) -> tuple[tuple[Use, str], ...]:
    """The route of every composite `collecting` saw while a program was built: what a cached program assumes."""
    planner = compiled_planner()
    return tuple((use, route_in(planner, use)) for found in collected.values() for use in found)


def route_in(planner: CompiledPlanner, use: Use) -> str:
    """The route of `use`'s composite where the graph being built uses it so (recorded by any collector)."""
    with using({use.signature: use}):
        return planner.route(use.composite)


def still_taken(routes: tuple[tuple[Use, str], ...]) -> bool:
    """Whether a program built with `routes` still runs what the planner chooses (measurements may have changed
    a choice); asking records the composites again for any collector, as building the program did."""
    planner = compiled_planner()
    return all(route_in(planner, use) == route for use, route in routes)


def route_of(node: Node) -> str:
    """How the compiled path runs composite `node`: a candidate's name, or DECOMPOSE."""
    if not is_composite(node):
        raise ValueError(f"route_of: {node.op.name} is a primitive, not a composite")
    return compiled_planner().route(node)
