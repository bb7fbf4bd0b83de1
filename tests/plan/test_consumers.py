"""Candidates are timed on the same work: a composite with the elementwise passes that follow it (`plan.consumers`),
so a candidate that fuses them into its call (grouped_gemm's batch norm and relu) is compared with one that leaves
them as passes (the decomposition). Timing here is a fixed function of each program's kernels, never a clock."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from plan_testing import record_candidates, uses_of

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs import cli
from tensorgraphs.codegen.loop_ir import GemmCall, Kernel, walk
from tensorgraphs.graph.ops import Op
from tensorgraphs.kerneldb import default_db
from tensorgraphs.plan import choices
from tensorgraphs.plan.choices import DECOMPOSE, compiled_planner, forced
from tensorgraphs.plan.consumers import Use, alone, uses_in
from tensorgraphs.schedule.extern import gemm_enabled
from tensorgraphs.schedule.fusion import Schedule, schedule_kernels

needs_gemm = pytest.mark.skipif(not gemm_enabled(), reason="grouped_gemm calls the GEMM library")
GROUPED = "grouped_gemm"
X, W, CHANNELS, GROUPS = (2, 16, 6, 6), (16, 4, 1, 1), 16, 4


def _floats(shape: tuple[int, ...], seed: int) -> tg.Tensor:
    return tg.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _conv_bn_relu(x: tg.Tensor, w: tg.Tensor, *stats: tg.Tensor) -> tg.Tensor:
    return F.relu(F.batch_norm(F.conv2d(x, w, groups=GROUPS), *stats))


def _arguments() -> list[tg.Tensor]:
    stats = [tg.tensor(np.random.default_rng(i).uniform(0.5, 1.5, CHANNELS).astype(np.float32)) for i in range(4)]
    return [_floats(X, 10), _floats(W, 11), *stats]


def _conv_use(root: tg.Tensor) -> Use:
    (use,) = [u for u in uses_in([root.node], lambda n: n.op is Op.BUFFER).values() if u.signature.name == "conv2d"]
    return use


def _bytes(kernel: Kernel) -> int:
    return sum(b.size * b.dtype.itemsize for b in kernel.buffers)


class WorkTimer:
    """Stands in for `choices.time_candidates`: each candidate's program (the use's roots, its composite forced to
    the candidate) costs 1 us per kernel plus its kernels' bytes at 10 GB/s; remembers what it timed."""

    def __init__(self) -> None:
        self.timed: list[tuple[Use, str, Schedule]] = []

    def __call__(self, use: Use, candidates: list[str], budget: float = 0.05) -> list[list[float]]:
        inputs = set(use.inputs())
        seconds = []
        for candidate in candidates:
            with forced({use.signature: candidate}):
                schedule = schedule_kernels(list(use.roots), inputs.__contains__)
            self.timed.append((use, candidate, schedule))
            seconds.append([sum(1e-6 + _bytes(k) / 1e10 for k in schedule.kernels)])
        return seconds

    def convs(self) -> list[tuple[Use, str]]:
        """The conv uses timed and the candidates (a decomposition's nested products are timed too)."""
        return [(u, c) for u, c, _ in self.timed if u.signature.name == "conv2d"]

    def program(self, candidate: str) -> Schedule:
        (schedule,) = [s for u, c, s in self.timed if u.signature.name == "conv2d" and c == candidate]
        return schedule


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> WorkTimer:
    timer = WorkTimer()
    monkeypatch.setattr(choices, "time_candidates", timer)
    return timer


def test_a_use_is_the_composite_with_its_passes_and_their_operands_anonymous() -> None:
    x, w, *stats = _arguments()
    use = _conv_use(_conv_bn_relu(x, w, *stats))
    assert use.consumers and use.consumers.split()[0].endswith("WHERE")  # the relu ends it
    # the batch norm's statistics stay vectors over the channels (what a conv kernel folds), not whole tensors
    assert sorted(n.shape for n in use.inputs()) == sorted([X, W, *[(CHANNELS,)] * 4])
    # another program with the same structure on other data uses the composite alike
    assert _conv_use(_conv_bn_relu(*_arguments())) == use
    assert alone(use.signature).consumers == "" and _conv_use(F.conv2d(x, w, groups=GROUPS).sum(0)).consumers == ""
    residual = _conv_use(F.conv2d(x, w, groups=GROUPS) + _floats(X, 3).exp())
    assert residual.consumers and sorted(n.shape for n in residual.inputs()) == sorted([X, W, X])  # cut at exp
    twice = F.conv2d(x, w, groups=GROUPS)  # read by two passes that leave separately: no single end
    assert uses_in([(twice * 2).node, (twice + 1).node], lambda n: n.op is Op.BUFFER)[use.signature].consumers == ""


def test_the_database_key_of_a_use_differs_from_a_composite_timed_alone() -> None:
    use = _conv_use(_conv_bn_relu(*_arguments()))
    sig = use.signature
    assert use.measured_as.shape_key != sig.shape_key and alone(sig).measured_as.shape_key != sig.shape_key
    assert use.measured_as.shape_key != alone(sig).measured_as.shape_key
    assert use.measured_as.inputs == sig.inputs and use.measured_as.flops == sig.flops


@needs_gemm
@pytest.mark.long
def test_the_timed_comparison_charges_the_decomposition_its_passes(monkeypatch, work) -> None:
    """grouped_gemm and the decomposition compute the same conv, batch norm and relu; the decomposition leaves the
    batch norm and relu as a pass over its result, which its timing includes, so the fused call wins."""
    monkeypatch.setenv("TG_TUNE", "1")
    arguments = _arguments()
    sig = _conv_use(_conv_bn_relu(*arguments)).signature
    # an entry of the old, unfair kind (the conv timed alone, the decomposition ahead) is not read
    default_db().record(
        compiled_planner().cost_model.fingerprint,
        choices.kernel_id(sig, DECOMPOSE),
        choices.code_hash(),
        sig.dtype_key,
        sig.shape_key,
        sig.flops,
        sig.bytes,
        [1e-9],
    )
    conv = tg.compile(_conv_bn_relu)
    out = conv(*arguments)
    (use,) = {u for u, _ in work.convs()}  # the graph the scheduler sees (rewritten), with its passes
    assert use.signature == sig and "WHERE" in use.consumers
    assert sorted(c for _, c in work.convs()) == sorted([DECOMPOSE, GROUPED])

    def passes_after_the_product(schedule: Schedule) -> int:
        """Kernels after the one computing the product that are not library calls (passes over its result)."""
        calls = [i for i, k in enumerate(schedule.kernels) if any(isinstance(s, GemmCall) for s in walk(k.body))]
        return sum(not any(isinstance(s, GemmCall) for s in walk(k.body)) for k in schedule.kernels[calls[-1] + 1 :])

    assert passes_after_the_product(work.program(GROUPED)) == 0  # the batch norm and relu in the call
    assert passes_after_the_product(work.program(DECOMPOSE)) == 1  # one pass over the result, timed with it
    options = {o.candidate: o.measured for o in compiled_planner().options(use)}
    assert options[GROUPED] < options[DECOMPOSE]
    assert choices.route_in(compiled_planner(), use) == GROUPED
    (trace,) = [t for traces in conv.traces.values() for t in traces]
    assert [k for k in trace.program.kernels if any(isinstance(s, GemmCall) for s in walk(k.body))]
    x, w, *stats = (a.numpy().astype(np.float64) for a in arguments)
    mean, var, gain, shift = (s.reshape(-1, 1, 1) for s in stats)
    grouped = np.concatenate(
        [np.einsum("oi,nihw->nohw", w[4 * g : 4 * g + 4, :, 0, 0], x[:, 4 * g : 4 * g + 4]) for g in range(GROUPS)],
        axis=1,
    )
    expected = np.maximum((grouped - mean) / np.sqrt(var + 1e-5) * gain + shift, 0)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)


@needs_gemm
@pytest.mark.long
def test_a_timed_use_is_not_timed_again_and_the_composite_alone_is_another(monkeypatch, work) -> None:
    monkeypatch.setenv("TG_TUNE", "1")
    arguments = _arguments()
    tg.compile(_conv_bn_relu)(*arguments)
    tg.compile(lambda *a: _conv_bn_relu(*a).sum())(*arguments)  # the same conv use (the sum is no pass of it)
    assert len(work.convs()) == 2
    tg.compile(lambda x, w: F.conv2d(x, w, groups=GROUPS))(*arguments[:2])  # alone: timed on its own work
    assert [u.consumers for u, _ in work.convs()[2:]] == ["", ""]


SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorgraphs as tg
    import tensorgraphs.nn.functional as F

    rng = np.random.default_rng(0)
    x = tg.tensor(rng.standard_normal((2, 16, 6, 6)), dtype=tg.float32)
    w = tg.tensor(rng.standard_normal((16, 4, 1, 1)) * 0.5, dtype=tg.float32)
    stats = [tg.tensor(rng.uniform(0.5, 1.5, 16), dtype=tg.float32) for _ in range(4)]

    @tg.compile
    def unit(x, w, mean, var, gain, shift):
        return F.relu(F.batch_norm(F.conv2d(x, w, groups=4), mean, var, gain, shift))

    print("result", float(unit(x, w, *stats).sum()))
""")


@needs_gemm
@pytest.mark.long
def test_tg_tune_keeps_the_fused_call_when_it_is_faster_in_total(tmp_path, capsys, work, measured) -> None:
    script = tmp_path / "grouped_unit.py"
    script.write_text(SCRIPT)
    assert cli.main(["tune", str(script)]) == 0
    assert "compiled programs: measured" in capsys.readouterr().out
    (use,) = {u for u, _ in work.convs()}
    assert "WHERE" in use.consumers
    fingerprint = compiled_planner().cost_model.fingerprint
    rows = [m for m in default_db().measurements(fingerprint) if m.kernel.startswith("compiled.conv2d.")]
    assert {m.kernel for m in rows} == {f"compiled.conv2d.{GROUPED}", f"compiled.conv2d.{DECOMPOSE}"}
    assert all(m.shape == use.measured_as.shape_key and "consumers" in m.shape for m in rows)

    assert cli.main(["explain", str(script)]) == 0
    explained = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(explained) if line.strip().startswith("conv2d(") and "then" in line)
    marked = [line.split()[1] for line in explained[at + 1 : at + 3] if line.lstrip().startswith("*")]
    assert marked == [GROUPED]


def test_recorded_candidates_of_a_use_are_what_the_planner_reads() -> None:
    (use,) = [u for u in uses_of(_conv_bn_relu, *_arguments()) if u.signature.name == "conv2d"]
    record_candidates(use, {DECOMPOSE: 2.0})
    assert {o.candidate: o.measured for o in compiled_planner().options(use)}[DECOMPOSE] == 2.0
    assert {o.candidate: o.measured for o in compiled_planner().options(alone(use.signature))}[DECOMPOSE] is None
