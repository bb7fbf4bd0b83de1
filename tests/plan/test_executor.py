"""The "planned" device: runs the planner's choices and agrees with the reference interpreter and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
from plan_testing import FP, training_step_roots

import tensorgraphs as tg
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.plan import DECOMPOSE, IMPLEMENTATIONS, KERNEL_BACKENDS, PlannedBackend, signature_of
from tensorgraphs.plan.executor import OBSERVERS
from tensorgraphs.plan.planner import copy_signature
from tensorgraphs.runtime.realize import BACKENDS
from tensorgraphs.testing.conformance import check_op
from tensorgraphs.testing.opinfo import OP_INFOS


class _Calls:
    def __init__(self) -> None:
        self.names: list[str] = []

    def on_composite(self, sig, implementation) -> None:
        return None

    def on_call(self, name, sig, start, seconds) -> None:
        self.names.append(name)


@pytest.fixture
def calls():
    observer = _Calls()
    OBSERVERS.append(observer)
    yield observer
    OBSERVERS.remove(observer)


def test_planned_is_a_registered_device():
    assert isinstance(BACKENDS["planned"], PlannedBackend)


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64], ids=lambda d: d.name)
def test_training_step_matches_the_reference(planner, calls, dtype):
    roots = training_step_roots(2, dtype=dtype)
    got = PlannedBackend(planner).evaluate(roots)
    expected = REFERENCE.evaluate(roots)
    tolerance = 1e-4 if dtype is tg.float32 else 1e-9
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=tolerance, atol=tolerance)
    assert "numpy.matmul" in calls.names and "numpy.layer_norm" in calls.names


def test_measurements_send_a_composite_to_torch_and_results_stay_equal(db, planner, calls):
    a, b = (tg.tensor(np.random.default_rng(s).standard_normal((32, 8)), dtype=tg.float32) for s in (0, 1))
    out = (a @ b.T).softmax(-1)
    sig = signature_of(out.node)
    backend = KERNEL_BACKENDS["torch"]
    impl_hash = IMPLEMENTATIONS.get("torch.softmax").impl_hash
    db.record(FP, "torch.softmax", impl_hash, sig.dtype_key, sig.shape_key, sig.flops, sig.bytes, [1e-9])
    for spec in {*sig.inputs, sig.output}:
        for kernel in (backend.copy_in, backend.copy_out):
            copy = copy_signature(spec)
            db.record(FP, kernel, backend.impl_hash, copy.dtype_key, copy.shape_key, 0, 0, [1e-9])
    assert planner.best(sig).implementation == "torch.softmax"
    got = PlannedBackend(planner).evaluate([out.node])[0]
    np.testing.assert_allclose(got, REFERENCE.evaluate([out.node])[0], rtol=1e-5, atol=1e-6)
    assert "torch.softmax" in calls.names


def test_a_decomposed_composite_runs_its_primitives_on_the_reference(db, planner, calls):
    x = tg.tensor(np.linspace(-3, 3, 40).reshape(5, 8), dtype=tg.float32)
    out = tg.nn.functional.gelu(x)
    sig = signature_of(out.node)
    for name in ("numpy.gelu", "torch.gelu"):
        db.record(FP, name, IMPLEMENTATIONS.get(name).impl_hash, sig.dtype_key, sig.shape_key, 0, 0, [1.0])
    assert planner.best(sig).implementation == DECOMPOSE
    got = PlannedBackend(planner).evaluate([out.node])[0]
    np.testing.assert_allclose(got, REFERENCE.evaluate([out.node])[0], rtol=1e-6, atol=1e-6)
    assert "numpy.erf" in calls.names and any(n.startswith("reference.") for n in calls.names)


def test_device_context_realizes_on_the_planned_device():
    x = tg.tensor(np.arange(12.0).reshape(3, 4), dtype=tg.float32)
    with tg.device("planned"):
        got = (x @ x.T).log_softmax(-1).numpy()
    np.testing.assert_allclose(got, REFERENCE.evaluate([(x @ x.T).log_softmax(-1).node])[0], rtol=1e-6)


@pytest.mark.parametrize("name", ["matmul", "softmax", "log_softmax", "erf"])
def test_conformance_with_torch(name):
    (info,) = [i for i in OP_INFOS if i.name == name]
    assert check_op(info, "planned") == []
