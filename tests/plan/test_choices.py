"""The compiled path's planner: each composite runs the candidate the kernel database (or the cost model) picks,
measured only under `tg tune` or TG_TUNE=1, and what is chosen is what runs."""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest
from plan_testing import record_candidates, uses_of

import tensorgraphs as tg
from tensorgraphs import cli
from tensorgraphs.codegen.loop_ir import GemmCall, walk
from tensorgraphs.kerneldb import default_db
from tensorgraphs.kernels import blas, gemm
from tensorgraphs.plan import choices
from tensorgraphs.plan.choices import DECOMPOSE, candidates_of, code_hash, compiled_planner
from tensorgraphs.plan.consumers import Use
from tensorgraphs.plan.signature import Signature, TensorSpec, placeholder_node
from tensorgraphs.schedule.extern import GEMM_ROUTES, gemm_enabled

needs_gemm = pytest.mark.skipif(not gemm_enabled(), reason="the GEMM library does not run on this machine")

SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorgraphs as tg
    import tensorgraphs.nn.functional as F

    rng = np.random.default_rng(0)
    x = tg.tensor(rng.standard_normal((6, 12)), dtype=tg.float32)
    w1 = tg.tensor(rng.standard_normal((12, 20)) * 0.1, dtype=tg.float32)
    w2 = tg.tensor(rng.standard_normal((20, 4)) * 0.1, dtype=tg.float32)

    @tg.compile
    def mlp(x, w1, w2):
        return F.softmax(F.relu(x @ w1) @ w2, dim=-1)

    @tg.compile
    def gram(x):
        return x.T @ x

    print("result", float(mlp(x, w1, w2).sum()), float(gram(x).sum()))
""")
PRODUCTS = [((6, 12), (12, 20)), ((6, 20), (20, 4)), ((12, 6), (6, 12))]  # the script's matmuls


def _matmul(a: tuple[int, int], b: tuple[int, int]) -> Signature:
    spec = lambda shape: TensorSpec(tg.float32, shape)  # noqa: E731
    return Signature("matmul", (), (spec(a), spec(b)), spec((a[0], b[1])))


@pytest.fixture
def timed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Signature, str]]:
    """Every candidate the planner times, in order."""
    calls: list[tuple[Signature, str]] = []
    original = choices.time_candidates

    def counting(use: Use, candidates: list[str], budget: float = 0.05) -> list[list[float]]:
        calls.extend((use.signature, candidate) for candidate in candidates)
        return original(use, candidates, budget)

    monkeypatch.setattr(choices, "time_candidates", counting)
    return calls


C_FUNCTION_OF = {"gemm": gemm.C_FUNCTIONS["matmul"], "blas": blas.C_FUNCTION}


def _gemm_calls(fn: tg.CompiledFunction) -> list[GemmCall]:
    (trace,) = [t for traces in fn.traces.values() for t in traces]
    return [s for kernel in trace.program.kernels for s in walk(kernel.body) if isinstance(s, GemmCall)]


def _candidate_count(sig: Signature) -> int:
    return len(candidates_of(placeholder_node(sig)))


@needs_gemm
@pytest.mark.long
def test_tune_then_explain_shows_measured_choices_and_explaining_again_measures_nothing(tmp_path, capsys, timed):
    script = tmp_path / "held_out.py"
    script.write_text(SCRIPT)
    expected = sum(_candidate_count(_matmul(a, b)) for a, b in PRODUCTS)

    assert cli.main(["tune", str(script)]) == 0
    assert "compiled programs: measured" in capsys.readouterr().out
    assert sorted({(sig.inputs[0].shape, sig.inputs[1].shape) for sig, _ in timed}) == sorted(PRODUCTS)
    assert len(timed) == expected
    fingerprint = compiled_planner().cost_model.fingerprint
    rows = [m for m in default_db().measurements(fingerprint) if m.kernel.startswith("compiled.matmul.")]
    assert len(rows) == expected and all(m.impl_hash == code_hash() for m in rows)

    for _ in range(2):
        rows_before = default_db().count()
        assert cli.main(["explain", str(script)]) == 0
        explained = capsys.readouterr().out
        assert len(timed) == expected and default_db().count() == rows_before  # nothing measured
        assert "compiled function mlp:" in explained and "compiled function gram:" in explained
        for a, b in PRODUCTS:
            block = explained.split(str(_matmul(a, b)), 1)[1].split("\n")[1:1 + _candidate_count(_matmul(a, b))]
            assert all(re.search(r"measured [\d.,]+ us$", line) for line in block), block
            assert sum(line.lstrip().startswith("* ") for line in block) == 1
        assert "softmax(float32[6, 4], dim=1) -> float32[6, 4]: decompose (the only candidate)" in explained


@needs_gemm
def test_a_decomposition_chosen_in_the_database_is_what_runs(timed):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 9)).astype(np.float32)
    sig = _matmul((5, 7), (7, 9))
    record_candidates(sig, {DECOMPOSE: 1e-9, **{name: 1.0 for name in GEMM_ROUTES}})
    product = tg.compile(lambda a, b: a @ b)
    out = product(tg.tensor(x), tg.tensor(w))
    assert _gemm_calls(product) == [] and timed == []
    np.testing.assert_allclose(out.numpy(), x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)


@needs_gemm
@pytest.mark.parametrize("library", ["gemm", "blas"])
@pytest.mark.long
def test_the_library_chosen_in_the_database_is_what_runs(library):
    if library == "blas" and not blas.available():
        pytest.skip("scipy-openblas32 is not installed")
    rng = np.random.default_rng(2)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in [(6, 8), (8, 10), (10,)])
    sig = _matmul((6, 8), (8, 10))
    relu_linear = lambda a, b, c: (a @ b + c).relu()  # noqa: E731
    (use,) = [u for u in uses_of(relu_linear, *map(tg.tensor, (x, w, bias))) if u.signature == sig]
    record_candidates(use, {name: 1e-9 if name == library else 1.0 for name in [*GEMM_ROUTES, DECOMPOSE]})
    linear = tg.compile(relu_linear)
    out = linear(tg.tensor(x), tg.tensor(w), tg.tensor(bias))
    assert [call.function for call in _gemm_calls(linear)] == [C_FUNCTION_OF[library]]  # epilogue fused
    np.testing.assert_allclose(out.numpy(), np.maximum(x.astype(np.float64) @ w + bias, 0), rtol=1e-5, atol=1e-5)


@needs_gemm
@pytest.mark.long
def test_compiling_predicts_without_measuring_and_follows_the_table_order(timed):
    x = tg.tensor(np.ones((4, 3), np.float32))
    product = tg.compile(lambda a: a @ a.T)
    product(x)
    assert timed == [] and [c.function for c in _gemm_calls(product)] == [C_FUNCTION_OF["gemm"]]


@needs_gemm
@pytest.mark.long
def test_tg_tune_measures_on_first_need_once(monkeypatch, timed):
    monkeypatch.setenv("TG_TUNE", "1")
    x = tg.tensor(np.ones((3, 5), np.float32))
    first, second = tg.compile(lambda a: a @ a.T), tg.compile(lambda a: (a @ a.T).sum(0))
    first(x)
    sig = _matmul((3, 5), (5, 3))
    assert [s for s, _ in timed] == [sig] * _candidate_count(sig)
    second(x)  # the same product with no elementwise pass after it: measured already
    assert len(timed) == _candidate_count(sig)
    tg.compile(lambda a: (a @ a.T) * 2)(x)  # with a pass after it: timed again, with the pass
    assert [s for s, _ in timed] == [sig] * 2 * _candidate_count(sig)


@needs_gemm
def test_a_cached_program_is_rebuilt_when_a_measurement_changes_the_choice():
    x = tg.tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
    before = tg.compile(lambda a: a @ a.T)
    before(x)
    assert _gemm_calls(before)
    record_candidates(_matmul((4, 3), (3, 4)), {DECOMPOSE: 1e-9, **{name: 1.0 for name in GEMM_ROUTES}})
    after = tg.compile(lambda a: a @ a.T)  # the same graph structure: the cached program would use the GEMM
    np.testing.assert_allclose(after(x).numpy(), x.numpy() @ x.numpy().T)
    assert _gemm_calls(after) == []


@needs_gemm
def test_a_target_without_kernel_libraries_gets_only_the_decomposition_and_others_keep_their_choice() -> None:
    node = placeholder_node(_matmul((64, 64), (64, 64)))
    assert len(candidates_of(node)) > 1
    with choices.targeting(frozenset()):
        assert [c.name for c in candidates_of(node)] == [DECOMPOSE]
        assert compiled_planner().route(node) == DECOMPOSE
    assert compiled_planner().route(node) in GEMM_ROUTES  # the choice for the cpu target is its own
