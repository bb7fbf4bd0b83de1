"""The kernel registry: every kernel is checked against its composite's reference before it may be chosen."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional  # noqa: F401  (registers softmax, gelu, layer_norm, attention)
from tensorgraphs.plan import (
    IMPLEMENTATIONS,
    Implementation,
    ImplementationRejected,
    Planner,
    Sample,
    register_implementation,
    signature_of,
)
from tensorgraphs.plan.implementations import ImplementationRegistry, verify_implementation

F32 = (tg.float32,)


def _wrong_softmax(x: np.ndarray, dim: int) -> np.ndarray:
    exps = np.exp(x)
    return exps / exps.sum(axis=dim, keepdims=True) + 1e-3  # off by a little everywhere


def test_a_wrong_softmax_kernel_is_rejected_at_registration():
    kernel = Implementation("user.softmax", "softmax", "numpy", _wrong_softmax, F32)
    with pytest.raises(ImplementationRejected) as caught:
        register_implementation(kernel)
    message = str(caught.value)
    for part in ("'user.softmax'", "'softmax'", "float32[4, 7]", "dim=1", "max error 0.001"):
        assert part in message
    with pytest.raises(KeyError):
        IMPLEMENTATIONS.get("user.softmax")


def test_a_correct_user_kernel_is_accepted_and_can_be_chosen(model):
    registry = ImplementationRegistry()
    registry.register(Implementation("user.softmax", "softmax", "numpy", _right_softmax, F32))
    x = tg.tensor(np.ones((4, 3)), dtype=tg.float32).softmax(-1)
    assert Planner(model, registry=registry).best(signature_of(x.node)).implementation == "user.softmax"


def _right_softmax(x: np.ndarray, dim: int) -> np.ndarray:
    exps = np.exp(x - x.max(axis=dim, keepdims=True))
    return exps / exps.sum(axis=dim, keepdims=True)


@pytest.mark.parametrize(("kernel", "message"), [
    (Implementation("user.raises", "softmax", "numpy", lambda x, dim: x[100], F32), "failed on softmax.*IndexError"),
    (Implementation("user.shape", "softmax", "numpy", lambda x, dim: x.sum(dim), F32), "returned shape"),
    (Implementation("user.unknown", "no_such_composite", "numpy", np.negative, F32), "no composite named"),
    (Implementation("user.nothing", "softmax", "numpy", _right_softmax, F32, accepts=lambda sig: False),
     "none of the verification samples"),
    (Implementation("user.matmul", "matmul", "numpy", lambda a, b: a @ b.T, F32, samples=(Sample(((3, 3), (3, 3))),)),
     "max error"),
])
def test_broken_kernels_are_rejected_with_the_reason(kernel, message):
    with pytest.raises(ImplementationRejected, match=message):
        ImplementationRegistry().register(kernel)


def test_unknown_backend_is_rejected():
    with pytest.raises(ImplementationRejected, match="unknown kernel backend 'tpu'"):
        ImplementationRegistry().register(Implementation("user.tpu", "softmax", "tpu", _right_softmax, F32))


def test_a_lazily_registered_wrong_kernel_is_never_chosen(model):
    registry = ImplementationRegistry()
    registry.register(Implementation("lazy.softmax", "softmax", "numpy", _wrong_softmax, F32), verify=False)
    sig = signature_of(tg.tensor(np.ones((4, 3)), dtype=tg.float32).softmax(-1).node)
    with pytest.warns(RuntimeWarning, match="lazy.softmax"):
        assert Planner(model, registry=registry).best(sig).implementation == "decompose"
    assert "lazy.softmax" in registry.rejected
    assert registry.candidates(sig) == []


@pytest.mark.parametrize("kernel", list(IMPLEMENTATIONS), ids=lambda k: k.name)
def test_every_builtin_kernel_matches_its_reference(kernel):
    verify_implementation(kernel)


def test_dtype_and_shape_constraints_select_candidates():
    f64 = signature_of(tg.tensor(np.ones((2, 3)), dtype=tg.float64).softmax(-1).node)
    erf64 = signature_of(tg.erf(tg.tensor(np.ones(3), dtype=tg.float64)).node)
    assert {k.name for k in IMPLEMENTATIONS.candidates(f64)} == {"numpy.softmax", "torch.softmax"}
    assert {k.name for k in IMPLEMENTATIONS.candidates(erf64)} == {"torch.erf"}  # numpy's erf is float32-exact only
    assert [k.name for k in IMPLEMENTATIONS.candidates(f64, backends=frozenset({"numpy"}))] == ["numpy.softmax"]
