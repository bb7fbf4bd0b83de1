"""The step check: a program with tuned choices is measured whole against its defaults (here by fixed times, never a
clock), keeps its choices only if not slower, and the verdict is stored, followed later without measuring, and an
interrupted tune checks only what is left."""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import pytest
from plan_testing import FAST, LAYER_NORM_SCRIPT, record_candidates

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs import cli
from tensorgraphs.codegen.loop_ir import GemmCall, ScheduleOptions, walk
from tensorgraphs.kerneldb import StepVerdict, default_db
from tensorgraphs.plan import kernel_search, step_check
from tensorgraphs.plan.choices import DECOMPOSE, code_hash
from tensorgraphs.plan.measure import time_interleaved
from tensorgraphs.plan.signature import Signature, TensorSpec
from tensorgraphs.schedule.extern import GEMM_ROUTES, gemm_enabled


class FixedTimes:
    """The step check's measurement: runs each program once (both must run), returns `tuned` and `default`
    seconds; `interrupt_at` (a count of checks) raises KeyboardInterrupt instead, as Ctrl-C would."""

    def __init__(self) -> None:
        self.tuned, self.default = 1e-3, 2e-3
        self.checks = 0
        self.interrupt_at: int | None = None

    def __call__(self, tuned: Callable[[], Any], default: Callable[[], Any]) -> tuple[float, float]:
        if self.checks == self.interrupt_at:
            raise KeyboardInterrupt
        tuned(), default()
        self.checks += 1
        return self.tuned, self.default


@pytest.fixture
def times(monkeypatch: pytest.MonkeyPatch, measured) -> FixedTimes:
    """Tuning on (TG_TUNE=1), kernel schedules measured by `fixed_seconds` (FAST wins), whole programs by
    `FixedTimes`."""
    fixed = FixedTimes()
    monkeypatch.setattr(step_check, "time_programs", fixed)
    monkeypatch.setattr(step_check, "_CHECKS", {})
    monkeypatch.setenv("TG_TUNE", "1")
    return fixed


@pytest.fixture
def later_process(monkeypatch: pytest.MonkeyPatch, isolated_kernels) -> Callable[[], None]:
    """Empties every cache a new process would not have (programs, searches, checks); the database stays."""

    def fresh() -> None:
        isolated_kernels()
        monkeypatch.setattr(kernel_search, "_SEARCHES", {})
        monkeypatch.setattr(step_check, "_CHECKS", {})

    return fresh


X = np.random.default_rng(0).standard_normal((40, 300)).astype(np.float32)


def scaled_softmax(a: tg.Tensor) -> tg.Tensor:
    return F.softmax(a * 2.0, dim=-1)


def expected_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(2.0 * x.astype(np.float64) - (2.0 * x).max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def run_compiled(fn: Callable[..., tg.Tensor], *arrays: np.ndarray) -> tuple[np.ndarray, Any]:
    """`fn` compiled and called once: its result and the program it ran."""
    compiled = tg.compile(fn)
    out = compiled(*(tg.tensor(a) for a in arrays)).numpy()
    (trace,) = [t for traces in compiled.traces.values() for t in traces]
    return out, trace.program


def verdicts() -> dict[str, StepVerdict]:
    return default_db().steps(step_check.step_check().fingerprint, code_hash())


def searched_options(program: Any) -> set[ScheduleOptions]:
    return {kernel.options for kernel in program.kernels}


@pytest.mark.parametrize("tuned_faster", [True, False])
def test_the_whole_program_keeps_its_tuned_choices_only_if_not_slower(times, tuned_faster):
    if not tuned_faster:
        times.tuned, times.default = times.default, times.tuned
    out, program = run_compiled(scaled_softmax, X)
    assert times.checks == 1
    (verdict,) = verdicts().values()
    assert verdict == StepVerdict("scaled_softmax", tuned_faster, times.tuned, times.default)
    assert (ScheduleOptions(**FAST) in searched_options(program)) == tuned_faster
    if not tuned_faster:
        assert searched_options(program) == {ScheduleOptions()}  # every kernel as lowered
    np.testing.assert_allclose(out, expected_softmax(X), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tuned_faster", [True, False])
def test_a_stored_verdict_is_followed_later_without_measuring(
    times, measured, later_process, monkeypatch, tuned_faster
):
    if not tuned_faster:
        times.tuned, times.default = times.default, times.tuned
    _, first = run_compiled(scaled_softmax, X)
    schedules, checks = len(measured), times.checks
    for tune in ("1", "0"):  # a second `tg tune` and a plain run: neither measures anything
        monkeypatch.setenv("TG_TUNE", tune)
        later_process()
        out, again = run_compiled(scaled_softmax, X)
        assert len(measured) == schedules and times.checks == checks
        assert again.source == first.source
        np.testing.assert_allclose(out, expected_softmax(X), rtol=1e-5, atol=1e-6)


def test_an_interrupted_tune_checks_only_the_programs_left(times, later_process):
    def shifted_softmax(a: tg.Tensor) -> tg.Tensor:
        return F.softmax(a - 1.0, dim=0)

    scaled, _ = run_compiled(scaled_softmax, X)
    times.interrupt_at = 1
    with pytest.raises(KeyboardInterrupt):
        run_compiled(shifted_softmax, X)
    assert [v.name for v in verdicts().values()] == ["scaled_softmax"]
    times.interrupt_at = None
    later_process()
    run_compiled(scaled_softmax, X)
    run_compiled(shifted_softmax, X)
    assert times.checks == 2 and sorted(v.name for v in verdicts().values()) == [
        "scaled_softmax",
        "test_an_interrupted_tune_checks_only_the_programs_left.<locals>.shifted_softmax",
    ]


def test_a_program_without_tuned_choices_is_not_measured(times, monkeypatch):
    monkeypatch.setattr(kernel_search, "timed_on", lambda target: lambda kernel, schedules: [1.0] * len(schedules))
    _, program = run_compiled(scaled_softmax, X)
    assert searched_options(program) == {ScheduleOptions()}
    assert times.checks == 0 and verdicts() == {}


@pytest.mark.skipif(not gemm_enabled(), reason="the GEMM library does not run on this machine")
@pytest.mark.parametrize("tuned_faster", [True, False])
@pytest.mark.long
def test_a_measured_route_is_checked_too(times, monkeypatch, tuned_faster):
    """The database says the decomposition beats the GEMM for this product (the default runs the GEMM)."""
    monkeypatch.setattr(kernel_search, "timed_on", lambda target: lambda kernel, schedules: [1.0] * len(schedules))
    if not tuned_faster:
        times.tuned, times.default = times.default, times.tuned
    spec = lambda shape: TensorSpec(tg.float32, shape)  # noqa: E731
    sig = Signature("matmul", (), (spec((5, 7)), spec((7, 9))), spec((5, 9)))
    record_candidates(
        sig, {candidate: 1e-9 if candidate == DECOMPOSE else 1.0 for candidate in [DECOMPOSE, *GEMM_ROUTES]}
    )
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 9)).astype(np.float32)
    out, program = run_compiled(lambda a, b: a @ b, x, w)
    gemm_calls = [s for kernel in program.kernels for s in walk(kernel.body) if isinstance(s, GemmCall)]
    assert times.checks == 1 and bool(gemm_calls) != tuned_faster
    np.testing.assert_allclose(out, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)


def test_tg_tune_then_explain_says_whether_the_step_check_kept_the_choices(tmp_path, capsys, times, later_process):
    script = tmp_path / "held_out.py"
    script.write_text(LAYER_NORM_SCRIPT)
    assert cli.main(["tune", str(script)]) == 0
    tuned = capsys.readouterr().out  # the eager sum compiles too (the fixtures compile every graph): two programs
    assert re.search(
        r"step checks: (\d+) programs with tuned choices, kept \1, dropped 0, left for a later run 0", tuned
    ), tuned
    rows = default_db().count()
    later_process()
    assert cli.main(["explain", str(script)]) == 0
    explained = capsys.readouterr().out
    assert times.checks == 2 and default_db().count() == rows  # explaining measures nothing
    assert (
        "step check of normalized: kept its tuned choices: tuned 1.000 ms, defaults 2.000 ms per run of the "
        "whole program"
    ) in explained


def test_interleaved_timing_alternates_the_order_every_round():
    ticks, order = iter(range(1000)), []
    runs = [lambda: order.append("a"), lambda: order.append("b")]
    samples = time_interleaved(runs, budget=0.0, min_runs=3, clock=lambda: float(next(ticks)))
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then rounds
    assert samples == [[1.0] * 3, [1.0] * 3]
