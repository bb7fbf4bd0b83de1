"""The official ONNX backend test suite against tensorgraphs.onnx.backend (`tensorgraphs.testing.onnx_conformance`
runs each test isolated, with a time limit).

expected_failures.txt lists the tests known to fail, each with its reason; a listed test that passes fails the run
too, so the list only shrinks. The default suite runs a fixed sample of the suite (every STRIDE-th test and one
real model); `pytest -m slow tests/onnx/test_backend.py` runs all of it and checks the core pass rate. Both compile
every graph to C, however small (the backend's cpu device otherwise interprets small graphs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("onnx")

from tensorgraphs.testing.onnx_conformance import (  # noqa: E402
    Outcome,
    backend_tests,
    core_node_tests,
    read_expected_failures,
    run_isolated,
)

EXPECTED_FAILURES = Path(__file__).with_name("expected_failures.txt")
STRIDE = 8
REAL_MODELS = {"test_bvlc_alexnet_cpu", "test_densenet121_cpu", "test_inception_v1_cpu", "test_inception_v2_cpu",
               "test_resnet50_cpu", "test_shufflenet_cpu", "test_squeezenet_cpu", "test_vgg19_cpu",
               "test_zfnet512_cpu"}
SAMPLED_MODEL = "test_squeezenet_cpu"
CORE_TARGET = 0.95


@pytest.fixture(scope="module")
def all_tests() -> list[str]:
    return sorted(backend_tests())


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    return read_expected_failures(str(EXPECTED_FAILURES))


def surprises(outcomes: list[Outcome], expected: dict[str, str]) -> list[str]:
    """Tests that fail unlisted, and listed tests that pass (their entry must go)."""
    found = [f"{o.name}: {o.status}: {o.message}" for o in outcomes if o.status != "pass" and o.name not in expected]
    found += [f"{o.name}: passes now; remove it from {EXPECTED_FAILURES.name}" for o in outcomes
              if o.status == "pass" and o.name in expected]
    return found


@pytest.mark.long
def test_expected_failures_name_tests_of_the_suite_and_give_reasons(all_tests, expected) -> None:
    unknown = sorted(set(expected) - set(all_tests))
    assert not unknown, f"not tests of the suite: {unknown}"
    assert all(expected.values()), [name for name, reason in expected.items() if not reason]


def sample(all_tests: list[str]) -> list[str]:
    light = [name for name in all_tests if name not in REAL_MODELS]
    return [*light[::STRIDE], SAMPLED_MODEL]


@pytest.mark.long
def test_a_sample_of_the_official_suite(all_tests, expected) -> None:
    outcomes = list(run_isolated(sample(all_tests), compile_all=True))
    problems = surprises(outcomes, expected)
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_the_official_suite(all_tests, expected) -> None:
    outcomes = list(run_isolated(all_tests, jobs=2, compile_all=True))
    problems = surprises(outcomes, expected)
    assert not problems, "\n".join(problems)
    core = core_node_tests()
    passed = {o.name for o in outcomes if o.status == "pass"}
    assert len(passed & core) >= CORE_TARGET * len(core), f"core node tests: {len(passed & core)} of {len(core)}"
    assert REAL_MODELS <= passed


def test_the_backend_interface_runs_nodes_and_models() -> None:
    import numpy as np
    from onnx import helper

    from tensorgraphs.onnx import backend

    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, alpha=0.5)
    a, b, c = (np.random.default_rng(i).standard_normal(s).astype(np.float32) for i, s in
               enumerate([(2, 3), (4, 3), (4,)]))
    (y,) = backend.run_node(node, [a, b, c])
    np.testing.assert_allclose(y, 0.5 * a @ b.T + c, rtol=1e-6)
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    with pytest.raises(Exception, match=r"device 'CUDA' is not supported"):
        backend.prepare(helper.make_model(helper.make_graph([], "g", [], [])), "CUDA")
