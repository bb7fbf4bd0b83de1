"""The compiled-path fuzzer: the day's programs and training runs agree with the numpy device, and a wrong
kernel is caught and shrunk to a reproducer."""

from __future__ import annotations

import datetime
from typing import Callable

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.codegen import c_renderer
from tensorgraphs.graph.ops import Op
from tensorgraphs.testing import fuzz_known_bugs, fuzz_training
from tensorgraphs.testing import fuzz_programs as fp
from tensorgraphs.testing.fuzz_core import Input

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included


def _failures(reports: list[fp.Report], seeds: range) -> str:
    return f"first seed {seeds.start} (rerun: TG_FUZZ_SEED={seeds.start} TG_FUZZ_PROGRAMS={len(seeds)}):\n" + \
        "\n\n".join(r.text() for r in reports)


@pytest.mark.long
def test_the_days_programs_and_training_runs_agree_with_the_numpy_device() -> None:
    seeds = fp.default_seeds()
    assert len(seeds) >= 300 or "TG_FUZZ_PROGRAMS" in __import__("os").environ
    reports = fp.fuzz(seeds) + fp.fuzz_training_runs(fp.training_seeds(seeds))
    assert not reports, _failures(reports, seeds)


@pytest.mark.slow
def test_10000_programs_agree_with_the_numpy_device() -> None:
    seeds = fp.default_seeds(long=True)
    reports = fp.fuzz(seeds) + fp.fuzz_training_runs(fp.training_seeds(seeds))
    assert not reports, _failures(reports, seeds)


def test_a_wrong_sign_in_the_add_kernel_is_caught_and_shrunk_to_a_reproducer(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        isolated_kernels: Callable[[], None]) -> None:
    add = c_renderer.BINARY[Op.ADD]
    monkeypatch.setitem(c_renderer.BINARY, Op.ADD,
                        lambda a, t: f"({a[0]} - {a[1]})" if t.is_floating_point else add(a, t))
    reports = fp.fuzz(range(32), modes=("cpu",))
    assert reports and all(r.failure.mode == "cpu" for r in reports)
    shrunk = [r for r in reports if len(r.case.steps) < len(fp.random_program(r.seed).steps)]
    report = min(shrunk, key=lambda r: len(r.case.steps))
    assert len(report.case.steps) == 1, report.text()
    assert f"--seed {report.seed}" in report.text() and "expected" in report.failure.detail
    exec(report.case.reproducer(), {})  # noqa: S102 - runnable as printed
    printed = capsys.readouterr().out
    assert printed.startswith("numpy") and "cpu" in printed and "compile" in printed
    monkeypatch.setitem(c_renderer.BINARY, Op.ADD, add)
    isolated_kernels()
    assert fp.check(report.case, ("cpu",)) is None  # the reproducer fails only because of the injected bug


@pytest.mark.usefixtures("isolated_kernels")
def test_a_wrong_square_root_in_adam_is_caught_and_shrunk_to_one_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(c_renderer.UNARY_FLOAT, Op.SQRT, ("cbrtf", "cbrt"))
    seed = next(s for s in range(100) if fuzz_training.random_case(s).optimizer.startswith("Adam(")
                and fuzz_training.random_case(s).steps > 1)
    [report] = fp.fuzz_training_runs([seed])
    assert report.failure.mode == "cpu" and report.failure.kind == "mismatch"
    assert (report.case.steps, report.case.batch) == (1, 1) and "tg.optim.Adam(" in report.case.reproducer()


def test_the_generator_draws_gradients_of_arguments_inside_compiled_functions() -> None:
    programs = [fp.random_program(s) for s in range(40)]
    differentiated = fp.programs_for("compile-grad", programs)
    assert 4 <= len(differentiated) < len(programs)
    source = differentiated[0].source()
    assert ".detach().requires_grad_()" in source and "tg.grad(" in source


def test_programs_cover_every_dtype_and_non_contiguous_arguments() -> None:
    programs = [fp.random_program(s) for s in range(100)]
    dtypes = {s.dtype for p in programs for s in p.steps}
    assert dtypes == set(fp.ALL_DTYPES)
    assert {i.view for p in programs for i in p.inputs} == {"contiguous", "permuted", "strided", "expanded"}


@pytest.mark.parametrize("view", ["permuted", "strided", "expanded"])
def test_a_non_contiguous_argument_holds_the_values_it_prints(view: str) -> None:
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    argument = Input.viewed("x", "float32", (2, 3, 4), view, lambda shape: np.arange(np.prod(shape),
                                                                                          dtype=np.float32).reshape(shape))
    namespace: dict = {"tg": tg, "np": np}
    exec(argument.source(), namespace)  # noqa: S102
    with tg.device("numpy"):
        printed, built = namespace["x"].numpy(), argument.tensor().numpy()
        contiguous = argument.contiguous().tensor().numpy()
    assert printed.shape == (2, 3, 4) and np.array_equal(printed, built) and np.array_equal(built, contiguous)
    assert view != "permuted" or np.array_equal(built, base.reshape(4, 3, 2).transpose(2, 1, 0))


def test_known_bugs_are_left_out_unless_asked_for_and_unspecified_behaviour_always(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bug = fuzz_known_bugs.KnownBug("integer-pow", "why", step=lambda p: "**" in p.text and p.dtype == "int32")
    monkeypatch.setattr(fuzz_known_bugs, "KNOWN_BUGS", (bug, fuzz_known_bugs.KnownBug("m", "why", mode="compile-grad")))
    monkeypatch.delenv("TG_FUZZ_KNOWN_BUGS", raising=False)
    assert fuzz_known_bugs.skipped_mode("compile-grad").name == "m"
    x = fp.Var("x0", tg.tensor([5, 6], dtype=tg.int32))
    assert fuzz_known_bugs.skipped_step(fp.Proposal("x0 ** x0", (x,), "int32", 2)).name == "integer-pow"
    assert fuzz_known_bugs.skipped_step(fp.Proposal("x0 + x0", (x,), "int32", 2)) is None
    big = fp.Var("x1", tg.full((2, 2), 1e30))
    overflowing = fp.Proposal("x1 @ x1", (big,), "float32", 4)
    monkeypatch.setenv("TG_FUZZ_KNOWN_BUGS", "1")
    assert fuzz_known_bugs.skipped_mode("compile-grad") is None
    assert fuzz_known_bugs.skipped_step(fp.Proposal("x0 ** x0", (x,), "int32", 2)) is None
    assert fuzz_known_bugs.skipped_step(overflowing).name == "gemm-overflow"


def test_seeds_move_with_the_date_unless_the_environment_fixes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TG_FUZZ_SEED", raising=False)
    monkeypatch.delenv("TG_FUZZ_PROGRAMS", raising=False)
    assert fp.date_seed(datetime.date(2026, 1, 1)) != fp.date_seed(datetime.date(2026, 1, 2))
    assert fp.default_seeds().start == fp.date_seed() and len(fp.default_seeds()) == 300
    assert len(fp.default_seeds(long=True)) == 10_000
    monkeypatch.setenv("TG_FUZZ_SEED", "17")
    monkeypatch.setenv("TG_FUZZ_PROGRAMS", "5")
    assert fp.default_seeds() == range(17, 22)


def test_programs_are_reproducible_from_their_seed() -> None:
    assert fp.random_program(11).source() == fp.random_program(11).source()
    assert fuzz_training.random_case(11).source() == fuzz_training.random_case(11).source()


def test_command_line_runs_one_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert fp.main(["--seed", "3", "--show"]) == 0
    assert "def program(" in capsys.readouterr().out
