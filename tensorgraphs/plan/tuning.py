"""`tg tune` and `tg explain`: measure the candidates of a script's composites, and show the choices.

Both run the script (on its own device, or the one `--device` names) and collect
every composite it runs: those its compiled programs plan (`plan.choices`: each
`tg.compile`d function, and eager graphs the cpu backend compiles) and those it
realizes on the "planned" device (nested ones included).

Tuning measures what the database lacks (so an interrupted tune resumes where it
stopped), within the time budget: for a compiled program, each candidate of a
composite that has a choice, as a program of its own computing the composite with
the elementwise passes that follow it there (`plan.consumers`: a candidate that
fuses them is charged the same work as one that leaves them; while the script
runs, as TG_TUNE=1 would, then those left), and the schedules of each generated kernel
(`plan.kernel_search`, as its program is built), then each program with tuned choices
as a whole against its defaults (`plan.step_check`); for the planned device, each
candidate route as measurement tasks (each kernel, its COPY in and out, each
primitive of a decomposition). Explaining only reads the database: it measures
nothing.
"""

from __future__ import annotations

import contextlib
import runpy
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.graph.node import Node
from tensorgraphs.plan.choices import CompiledPlanner, candidates_of, collecting, compiled_planner, route_in, tuning
from tensorgraphs.plan.consumers import Use
from tensorgraphs.plan.cost import reference_impl_hash
from tensorgraphs.plan.executor import OBSERVERS
from tensorgraphs.plan.implementations import KERNEL_BACKENDS, Implementation
from tensorgraphs.plan.kernel_search import SeenKernel, kernel_search, recording, searching
from tensorgraphs.plan.measure import random_array, time_samples
from tensorgraphs.plan.planner import DECOMPOSE, Planner, Route, copy_signature
from tensorgraphs.plan.signature import Signature, placeholder_node
from tensorgraphs.plan.step_check import SeenStep, describe
from tensorgraphs.plan.step_check import recording as recording_steps
from tensorgraphs.runtime.realize import device


class _Observer:
    """Observer that remembers each composite signature realized, in first-seen order."""

    def __init__(self) -> None:
        self.signatures: dict[Signature, None] = {}

    def on_composite(self, sig: Signature, implementation: str) -> None:
        self.signatures.setdefault(sig, None)

    def on_call(self, name: str, sig: Signature, start: float, seconds: float) -> None:
        return None


@dataclass(frozen=True)
class ScriptComposites:
    """What a script ran: composite signatures realized on the planned device, and per compiled function (or
    "eager graphs") the composites its compiled programs planned, each with a node of it."""

    planned: list[Signature]
    compiled: dict[str, dict[Use, Node]]


def run_script(script: str, argv: list[str] | None = None, device_name: str | None = None) -> ScriptComposites:
    """Run `script` as __main__ (on `device_name` when given), importing from its folder as `python SCRIPT` would,
    and collect the composites it ran."""
    observer = _Observer()
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *(argv or [])]
    sys.path.insert(0, str(Path(script).resolve().parent))
    OBSERVERS.append(observer)
    try:
        with collecting() as compiled, device(device_name) if device_name else contextlib.nullcontext():
            runpy.run_path(script, run_name="__main__")
    finally:
        OBSERVERS.remove(observer)
        sys.argv, sys.path[:] = saved_argv, saved_path
    return ScriptComposites(list(observer.signatures), compiled)


def collect_composites(script: str, argv: list[str] | None = None) -> list[Signature]:
    """Run `script` as __main__ on the planned device; the composite signatures it realized."""
    return run_script(script, argv, "planned").planned


@dataclass(frozen=True)
class Task:
    """One measurement: `prepare()` builds inputs and returns the call to time."""

    kernel: str
    impl_hash: str
    signature: Signature
    prepare: Callable[[], Callable[[], Any]]

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.kernel, self.impl_hash, self.signature.dtype_key, self.signature.shape_key


def _inputs(sig: Signature) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [random_array(spec, rng) for spec in sig.inputs]


def _kernel_call(kernel: Implementation, sig: Signature) -> Callable[[], Any]:
    """The kernel alone on inputs already on its backend (copies are measured as their own tasks)."""
    backend = KERNEL_BACKENDS[kernel.backend]
    native = [backend.to_native(a) for a in _inputs(sig)]
    params = dict(sig.params)

    def run() -> None:
        kernel.fn(*native, **params)
        backend.synchronize()

    return run


def _copy_call(backend_name: str, direction: str, sig: Signature) -> Callable[[], Any]:
    backend = KERNEL_BACKENDS[backend_name]
    (array,) = _inputs(sig)
    if direction == "in":
        return lambda: (backend.to_native(array), backend.synchronize())
    native = backend.to_native(array)
    return lambda: backend.to_numpy(native)


def _primitive_call(sig: Signature) -> Callable[[], Any]:
    node = placeholder_node(sig)
    known = dict(zip(node.src, _inputs(sig)))
    return lambda: REFERENCE.evaluate([node], known)


def measurement_tasks(planner: Planner, signatures: list[Signature]) -> list[Task]:
    """Every distinct measurement the candidate paths of `signatures` (and their nested composites) need."""
    tasks: dict[tuple, Task] = {}

    def add(task: Task) -> None:
        tasks.setdefault(task.key, task)

    def visit(sig: Signature, stack: tuple[str, ...]) -> None:
        for kernel in planner.registry.candidates(sig, planner.backends):
            if not planner.registry.ensure_verified(kernel):
                continue
            add(Task(kernel.name, kernel.impl_hash, sig, lambda k=kernel: _kernel_call(k, sig)))
            backend = KERNEL_BACKENDS[kernel.backend]
            if not backend.home:
                for spec in {*sig.inputs}:
                    copy = copy_signature(spec)
                    add(Task(backend.copy_in, backend.impl_hash, copy,
                             lambda b=backend.name, c=copy: _copy_call(b, "in", c)))
                out = copy_signature(sig.output)
                add(Task(backend.copy_out, backend.impl_hash, out,
                         lambda b=backend.name, o=out: _copy_call(b, "out", o)))
        decomposition = planner.valid_decomposition(sig, stack)
        if decomposition is None:
            return
        for primitive in decomposition.primitives:
            add(Task(f"reference.{primitive.name}", reference_impl_hash(), primitive,
                     lambda p=primitive: _primitive_call(p)))
        for child in dict.fromkeys(decomposition.composites):
            visit(child, stack + (sig.name,))

    for sig in signatures:
        visit(sig, ())
    return list(tasks.values())


@dataclass
class TuneReport:
    measured: int = 0
    skipped: int = 0  # already in the database
    failed: int = 0  # raised on random inputs (e.g. indices out of range)
    remaining: int = 0  # left when the budget ran out

    def __str__(self) -> str:
        return (f"measured {self.measured}, already in the database {self.skipped}, failed {self.failed}, "
                f"left for a later run {self.remaining}")


class _TextBar:
    """A progress bar on stderr for when tqdm is not installed."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0

    def update(self, label: str) -> None:
        self.done += 1
        filled = 30 * self.done // max(self.total, 1)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {label[:50]:<50}")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[str], None]]:
    try:
        from tqdm import tqdm
    except ImportError:
        bar = _TextBar(total)
        yield bar.update
        bar.close()
        return
    with tqdm(total=total, unit="kernel", file=sys.stderr) as bar:
        def update(label: str) -> None:
            bar.set_postfix_str(label[:50])
            bar.update()

        yield update


def tune(planner: Planner, signatures: list[Signature], budget: float = float("inf"),
         per_task: float = 0.05) -> TuneReport:
    """Measure the tasks of `signatures` not yet in the database until `budget` seconds have passed."""
    model = planner.cost_model
    tasks = measurement_tasks(planner, signatures)
    pending = [t for t in tasks if model.measured(t.kernel, t.impl_hash, t.signature) is None]
    report = TuneReport(skipped=len(tasks) - len(pending))
    deadline = time.perf_counter() + budget
    with _progress(len(pending)) as advance:
        for i, task in enumerate(pending):
            if time.perf_counter() >= deadline:
                report.remaining = len(pending) - i
                break
            try:
                with np.errstate(all="ignore"):
                    samples = time_samples(task.prepare(), budget=per_task)
            except Exception:  # noqa: BLE001 - a primitive on random inputs may legitimately fail; the model covers it
                report.failed += 1
            else:
                sig = task.signature
                model.db.record(model.fingerprint, task.kernel, task.impl_hash, sig.dtype_key, sig.shape_key,
                                sig.flops, sig.bytes, samples)
                report.measured += 1
            advance(f"{task.kernel} {task.signature.shape_key}")
    return report


# ---------------------------------------------------------------------------
# explain
# ---------------------------------------------------------------------------


def measured_seconds(planner: Planner, path: Route) -> float | None:
    """The path's time from exact database rows only (None when any part was not measured)."""
    model = planner.cost_model
    parts: list[tuple[str, str, Signature]]
    if path.implementation == DECOMPOSE:
        primitives = planner.decomposition(path.signature).primitives
        parts = [(f"reference.{p.name}", reference_impl_hash(), p) for p in primitives]
    else:
        kernel = planner.registry.get(path.implementation)
        backend = KERNEL_BACKENDS[kernel.backend]
        parts = [(kernel.name, kernel.impl_hash, path.signature)]
        if not backend.home:
            parts += [(backend.copy_in, backend.impl_hash, copy_signature(s)) for s in path.signature.inputs]
            parts.append((backend.copy_out, backend.impl_hash, copy_signature(path.signature.output)))
    total = 0.0
    for kernel_id, impl_hash, sig in parts:
        row = model.measured(kernel_id, impl_hash, sig)
        if row is None:
            return None
        total += row.median
    for child in path.children:
        child_time = measured_seconds(planner, child)
        if child_time is None:
            return None
        total += child_time
    return total


def _microseconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.1f} us"


def explain(planner: Planner, signatures: list[Signature]) -> str:
    """Per composite: the chosen implementation, predicted and measured time, and every alternative."""
    lines = []
    for sig in signatures:
        chosen = planner.best(sig)
        lines.append(f"{sig}")
        alternatives = sorted(planner.options(sig), key=lambda p: p.estimate.seconds)
        for path in alternatives:
            mark = "*" if path.implementation == chosen.implementation else " "
            lines.append(f"  {mark} {path.implementation:<36} predicted {_microseconds(path.estimate.seconds):>14} "
                         f"({path.estimate.source}), measured {_microseconds(measured_seconds(planner, path))}")
            if path.children:
                nested = ", ".join(f"{c.signature.name}: {c.implementation}" for c in path.children)
                lines.append(f"      nested: {nested}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# compiled programs
# ---------------------------------------------------------------------------


def _with_choices(compiled: dict[str, dict[Use, Node]]) -> list[Use]:
    """Each distinct use of a composite that has more than one candidate (the only ones worth measuring)."""
    uses = dict.fromkeys(use for found in compiled.values() for use in found)
    return [use for use in uses if len(candidates_of(use.composite)) > 1]


def tune_compiled(planner: CompiledPlanner, compiled: dict[str, dict[Use, Node]],
                  budget: float = float("inf")) -> TuneReport:
    """Measure the unmeasured candidates of every composite with a choice until `budget` seconds have passed."""
    uses = _with_choices(compiled)
    pending = [use for use in uses if planner.unmeasured(use)]
    report = TuneReport(skipped=sum(len(candidates_of(u.composite)) - len(planner.unmeasured(u)) for u in uses))
    deadline = time.perf_counter() + budget
    with _progress(len(pending)) as advance:
        for i, use in enumerate(pending):
            if time.perf_counter() >= deadline:
                report.remaining = sum(len(planner.unmeasured(u)) for u in pending[i:])
                break
            report.measured += planner.measure(use)
            advance(str(use))
    return report


def explain_compiled(planner: CompiledPlanner, compiled: dict[str, dict[Use, Node]]) -> str:
    """Per compiled function, per composite use: its candidates with predicted and measured times, * the choice."""
    lines = []
    for label, found in compiled.items():
        lines.append(f"compiled function {label}:" if label != "eager graphs" else "eager graphs (compiled):")
        for use in found:
            options = planner.options(use)
            if len(options) == 1:
                lines.append(f"  {use}: {options[0].candidate} (the only candidate)")
                continue
            chosen = route_in(planner, use)
            lines.append(f"  {use}")
            for option in options:
                mark = "*" if option.candidate == chosen else " "
                predicted = f"{_microseconds(option.predicted.seconds):>14} ({option.predicted.source})"
                lines.append(f"    {mark} {option.candidate:<12} predicted {predicted}, "
                             f"measured {_microseconds(option.measured)}")
    return "\n".join(lines)


def explain_kernels(seen: list[SeenKernel]) -> str:
    """Per compiled function, its generated kernels' searched schedules (each distinct kernel once)."""
    lines = []
    for label in dict.fromkeys(kernel.label for kernel in seen):
        kernels = list({k.key: k for k in seen if k.label == label}.values())
        searched = [k for k in kernels if k.choice is not None]
        lines.append(f"generated kernels of {label}: {len(kernels)} distinct, {len(searched)} searched"
                     + (" (tg tune searches them)" if len(searched) < len(kernels) else ""))
        for kernel in searched:
            choice = kernel.choice
            assert choice is not None
            lines.append(f"    {kernel.name:<24} {choice.options:<36} {_microseconds(choice.seconds):>14}, default "
                         f"{_microseconds(choice.default_seconds)} ({choice.candidates} schedules measured)")
    return "\n".join(lines)


def explain_steps(seen: list[SeenStep]) -> str:
    """Per compiled program with tuned choices: whether the step check kept them, with both times."""
    lines = []
    for step in {(step.label, step.key): step for step in seen}.values():
        verdict = "not checked yet (tg tune checks it): runs its tuned choices" if step.verdict is None else \
            describe(step.verdict)
        lines.append(f"step check of {step.label}: {verdict}")
    return "\n".join(lines)


def run_tune(script: str, argv: list[str], budget: float, device_name: str | None = None) -> int:
    """`tg tune`: run the script, then measure the candidates of its composites."""
    from tensorgraphs.plan.planner import default_planner

    started = time.perf_counter()
    searches_before = kernel_search().searched
    with tuning(), searching(started + budget), recording() as seen, recording_steps() as steps:
        found = run_script(script, argv, device_name)
    compiled = compiled_planner()
    print(f"{script}: {len(_with_choices(found.compiled))} distinct composite calls with a choice in compiled "
          f"programs, {len(found.planned)} on the planned device")
    print("compiled programs:", tune_compiled(compiled, found.compiled, budget - (time.perf_counter() - started)))
    kernels = {kernel.key: kernel for kernel in seen}
    searched = kernel_search().searched - searches_before
    print(f"generated kernels: {len(kernels)} distinct, searched {searched}, searched before "
          f"{sum(k.choice is not None for k in kernels.values()) - searched}, left for a later run "
          f"{sum(k.choice is None for k in kernels.values())}")
    verdicts = [None if v is None else v.kept for v in {step.key: step.verdict for step in steps}.values()]
    print(f"step checks: {len(verdicts)} programs with tuned choices, kept {verdicts.count(True)}, dropped "
          f"{verdicts.count(False)}, left for a later run {verdicts.count(None)}")
    if found.planned:
        planner = default_planner()
        print("planned device:", tune(planner, found.planned, budget - (time.perf_counter() - started)))
    db = compiled.cost_model.db
    print(f"kernel database: {db.path} ({db.count()} rows)")
    return 0


def run_explain(script: str, argv: list[str], device_name: str | None = None) -> int:
    """`tg explain`: run the script, then print each composite's candidates and choice (no measuring)."""
    from tensorgraphs.plan.planner import default_planner

    compiled = compiled_planner()
    db = compiled.cost_model.db
    before = db.count()
    with recording() as seen, recording_steps() as steps:
        found = run_script(script, argv, device_name)
    if found.compiled:
        print(explain_compiled(compiled, found.compiled))
    if seen:
        print(explain_kernels(seen))
    if steps:
        print(explain_steps(steps))
    if found.planned:
        print("planned device:")
        print(explain(default_planner(), found.planned))
    print(f"kernel database: {db.path} ({db.count()} rows, {db.count() - before} new measurements; "
          "* marks the chosen implementation)")
    print_compiled_functions()
    return 0


def print_compiled_functions() -> None:
    """What each `tg.compile`d function the script traced costs (kernels, memory, compile time)."""
    from tensorgraphs.compiled import RECENT_TRACES

    if not RECENT_TRACES:
        return
    print("\ncompiled functions (tg.compile), one line per traced signature:")
    for name, arguments, stats in RECENT_TRACES:
        print(f"  {name}({arguments}): {stats}")
