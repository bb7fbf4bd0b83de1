"""The kernel search: a beam search over a generated kernel's schedules, by a fixed measurement here (so the
choices are deterministic), stored in the kernel database and reused by later programs without measuring."""

from __future__ import annotations

import dataclasses
import re
import sqlite3

import numpy as np
import pytest
from plan_testing import FAST, LAYER_NORM_SCRIPT, fixed_seconds

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs import cli, kerneldb
from tensorgraphs.backends.cpu import CPU_TARGET
from tensorgraphs.codegen.loop_ir import Kernel, ScheduleOptions
from tensorgraphs.kerneldb import default_db
from tensorgraphs.plan import kernel_search
from tensorgraphs.plan.choices import code_hash
from tensorgraphs.plan.kernel_search import MIN_GAIN, beam_search, searchable
from tensorgraphs.schedule.fusion import schedule_kernels
from tensorgraphs.schedule.options import with_options


def _softmax_kernel() -> Kernel:
    x = tg.tensor(np.ones((40, 300), np.float32))
    (kernel,) = schedule_kernels([F.softmax(x, dim=-1).node], {x.node}.__contains__).kernels
    return kernel


def _render(kernel: Kernel) -> str:
    return CPU_TARGET.renderer(kernel).render("tg_kernel")


def test_the_beam_finds_the_best_combination_and_measures_each_rendering_once():
    kernel = _softmax_kernel()
    batches: list[list[ScheduleOptions]] = []

    def measure(kernel: Kernel, schedules: list[ScheduleOptions]) -> list[float]:
        batches.append(schedules)
        return [fixed_seconds(options) for options in schedules]

    result = beam_search(kernel, measure, _render)
    assert result.options == ScheduleOptions(**FAST)
    assert result.seconds == pytest.approx(0.7) and result.default_seconds == 1.0
    measured = [options for batch in batches for options in batch]
    assert batches[0] == [ScheduleOptions()] and len(measured) == len(set(measured)) == result.candidates
    assert len({_render(with_options(kernel, o)) for o in measured}) == len(measured)


def test_a_gain_within_noise_keeps_the_default():
    kernel = _softmax_kernel()
    result = beam_search(kernel, lambda k, schedules: [1.0 - MIN_GAIN / 2 * (o != ScheduleOptions())
                                                       for o in schedules], _render)
    assert result.options == ScheduleOptions() and result.seconds == result.default_seconds


def test_search_under_tg_tune_stores_choices_and_a_later_program_reuses_them_without_measuring(
        monkeypatch, measured, isolated_kernels):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 300)).astype(np.float32)
    step = lambda a: F.softmax(a * 2.0, dim=-1)  # noqa: E731
    monkeypatch.setenv("TG_TUNE", "1")
    first = tg.compile(step)
    first(tg.tensor(x))
    assert measured, "TG_TUNE=1 searches the generated kernels"
    searched = {name for name, _ in measured}
    (trace,) = [t for traces in first.traces.values() for t in traces]
    kernels = [k for k in trace.program.kernels if k.name in searched]
    assert kernels and all(k.options == ScheduleOptions(**FAST) for k in kernels)
    stored = default_db().schedules(kernel_search.kernel_search().fingerprint, code_hash())
    assert {choice.options for choice in stored.values()} == {str(ScheduleOptions(**FAST))}

    # a later program ("any process": fresh program caches and search state), tuning off: no measuring
    monkeypatch.delenv("TG_TUNE")
    isolated_kernels()
    monkeypatch.setattr(kernel_search, "_SEARCHES", {})
    count = len(measured)
    again = tg.compile(step)
    out = again(tg.tensor(x)).numpy()
    assert len(measured) == count
    (trace,) = [t for traces in again.traces.values() for t in traces]
    assert [k.options for k in trace.program.kernels if k.name in searched] == [k.options for k in kernels]
    e = np.exp(2.0 * x.astype(np.float64) - (2.0 * x).max(-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_an_interrupted_search_resumes_without_measuring_again(monkeypatch, measured):
    kernel = _softmax_kernel()
    search = kernel_search.kernel_search()
    rounds = []

    def interrupted(kernel: Kernel, schedules: list[ScheduleOptions]) -> list[float]:
        if len(rounds) == 2:
            raise KeyboardInterrupt
        rounds.append(schedules)
        return [fixed_seconds(options) for options in schedules]

    with pytest.raises(KeyboardInterrupt):
        search.search(kernel, "k", _render, interrupted)
    done = {options for batch in rounds for options in batch}
    again: list[ScheduleOptions] = []

    def resumed(kernel: Kernel, schedules: list[ScheduleOptions]) -> list[float]:
        again.extend(schedules)
        return [fixed_seconds(options) for options in schedules]

    choice = search.search(kernel, "k", _render, resumed)
    assert choice.options == str(ScheduleOptions(**FAST))
    assert again and done.isdisjoint(again)


def test_tg_tune_then_explain_lists_the_searched_kernels(tmp_path, capsys, measured, isolated_kernels):
    script = tmp_path / "held_out.py"
    script.write_text(LAYER_NORM_SCRIPT)
    assert cli.main(["tune", str(script)]) == 0
    tuned = capsys.readouterr().out
    kernels = len({name for name, _ in measured})
    assert kernels and f"generated kernels: {kernels} distinct, searched {kernels}," in tuned
    count = len(measured)
    rows = default_db().count()
    isolated_kernels()  # `tg explain` runs in a process of its own: its programs are built again
    assert cli.main(["explain", str(script)]) == 0
    explained = capsys.readouterr().out
    assert len(measured) == count and default_db().count() == rows  # explaining measures nothing
    assert re.search(r"generated kernels of normalized: (\d+) distinct, \1 searched\n", explained), explained
    block = explained.split("generated kernels of normalized:")[1].split("\n")[1]
    assert block.split()[1:4] == str(ScheduleOptions(**FAST)).split()


def test_library_calls_are_not_searched():
    a = tg.tensor(np.ones((64, 64), np.float32))
    for kernel in schedule_kernels([(a @ a).node], {a.node}.__contains__).kernels:
        assert searchable(kernel) == (not any(type(s).__name__ == "GemmCall" for s in kernel.body))
    assert not searchable(dataclasses.replace(_softmax_kernel(), body=[]))


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_database_gains_the_tables_it_lacks_and_keeps_its_measurements(tmp_path, version):
    """Version 1 had no schedules table, version 2 no steps table (`plan.step_check`)."""
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    lacking = "".join(kerneldb.db._MIGRATIONS[v] for v in range(version, kerneldb.SCHEMA_VERSION))
    conn.executescript(kerneldb.db._SCHEMA.replace(lacking, "") + f"PRAGMA user_version = {version};")
    conn.execute("INSERT INTO measurements VALUES ('fp', 'k', 'h', 'f32', '(2,)', 1, 1, 0.5, 0.5, 1, 0)")
    conn.commit()
    conn.close()
    db = kerneldb.KernelDB(path)
    assert [m.median for m in db.measurements("fp")] == [0.5]
    db.store_schedule("fp", "key", "h", kerneldb.ScheduleChoice("k1", "unroll=4", 1.0, 2.0, 3))
    assert db.schedules("fp", "h") == {"key": kerneldb.ScheduleChoice("k1", "unroll=4", 1.0, 2.0, 3)}
    db.store_step("fp", "program", "h", kerneldb.StepVerdict("step", False, 2.0, 1.0))
    assert db.steps("fp", "h") == {"program": kerneldb.StepVerdict("step", False, 2.0, 1.0)}
