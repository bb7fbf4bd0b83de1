"""Finite-difference gradient checks in float64 for every differentiable primitive.

Each case builds one primitive node with `apply` on float64 leaves; the
gradient from `tg.grad` is compared with central differences of
sum(output * cotangent), evaluated on the reference backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.frontend.tensor import Tensor, apply, cast
from tensorgraphs.graph.composite import decompose
from tensorgraphs.graph.ops import Op

F64 = tg.float64


@dataclass
class Case:
    """One primitive: how to build it from tensors, and its sample inputs (float ones are differentiated)."""

    name: str
    build: Callable[..., Tensor]
    inputs: Callable[[np.random.Generator], list[np.ndarray]]
    eps: float = 1e-6
    rtol: float = 1e-6
    atol: float = 1e-8


def _normal(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.standard_normal(shape)


def _positive(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.uniform(0.5, 2.0, shape)


def _distinct(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    """Values at least 0.1 apart, so MAX and REDUCE_MAX have no ties within a finite-difference step."""
    return lambda rng: rng.permutation(np.arange(np.prod(shape)) * 0.1 - 0.7).reshape(shape) + 1e-3


def _inputs(*makers: Callable[[np.random.Generator], np.ndarray]) -> Callable[[np.random.Generator], list]:
    return lambda rng: [make(rng) for make in makers]


def _index(*shape: int, high: int) -> Callable[[np.random.Generator], np.ndarray]:
    """int64 indices with repeats, so accumulation into one element is checked too."""
    return lambda rng: rng.integers(0, high, shape).astype(np.int64)


CASES = [
    Case("EXP2", lambda x: apply(Op.EXP2, x), _inputs(_normal(2, 3))),
    Case("LOG2", lambda x: apply(Op.LOG2, x), _inputs(_positive(2, 3))),
    Case("SIN", lambda x: apply(Op.SIN, x), _inputs(_normal(2, 3))),
    Case("SQRT", lambda x: apply(Op.SQRT, x), _inputs(_positive(2, 3))),
    # float64 -> float32 -> float64: float32 rounding limits the finite differences' accuracy
    Case("CAST", lambda x: cast(cast(x, tg.float32), F64), _inputs(_normal(2, 3)), eps=1e-3, rtol=1e-4, atol=2e-4),
    Case("ADD", lambda a, b: apply(Op.ADD, a, b), _inputs(_normal(2, 3), _normal(2, 3))),
    Case("MUL", lambda a, b: apply(Op.MUL, a, b), _inputs(_normal(2, 3), _normal(2, 3))),
    Case("DIV", lambda a, b: apply(Op.DIV, a, b), _inputs(_normal(2, 3), _positive(2, 3))),
    Case("MAX", lambda a, b: apply(Op.MAX, a, b), lambda rng: list(_distinct(2, 2, 3)(rng))),
    Case("WHERE", lambda c, a, b: apply(Op.WHERE, c, a, b),
         _inputs(lambda rng: rng.random((2, 3)) < 0.5, _normal(2, 3), _normal(2, 3))),
    Case("REDUCE_SUM", lambda x: apply(Op.REDUCE_SUM, x, arg=(0, 2)), _inputs(_normal(2, 3, 2))),
    Case("REDUCE_MAX", lambda x: apply(Op.REDUCE_MAX, x, arg=(1,)), _inputs(_distinct(2, 4, 2))),
    Case("RESHAPE", lambda x: apply(Op.RESHAPE, x, arg=(3, 1, 2)), _inputs(_normal(2, 3))),
    Case("PERMUTE", lambda x: apply(Op.PERMUTE, x, arg=(2, 0, 1)), _inputs(_normal(2, 3, 4))),
    Case("EXPAND", lambda x: apply(Op.EXPAND, x, arg=(2, 4, 3)), _inputs(_normal(2, 1, 3))),
    Case("PAD", lambda x: apply(Op.PAD, x, arg=((1, 0), (2, 3))), _inputs(_normal(2, 3))),
    Case("SHRINK", lambda x: apply(Op.SHRINK, x, arg=((1, 3), (0, 2))), _inputs(_normal(3, 4))),
    Case("FLIP", lambda x: apply(Op.FLIP, x, arg=(0, 2)), _inputs(_normal(2, 3, 2))),
    Case("GATHER", lambda x, i: apply(Op.GATHER, x, i, arg=1), _inputs(_normal(2, 3), _index(2, 5, high=3))),
    Case("SCATTER_ADD", lambda base, i, v: apply(Op.SCATTER_ADD, base, i, v, arg=0),
         _inputs(_normal(3, 2), _index(4, 2, high=3), _normal(4, 2))),
]
DIFFERENTIABLE_PRIMITIVES = {"EXP2", "LOG2", "SIN", "SQRT", "CAST", "ADD", "MUL", "DIV", "MAX", "WHERE", "REDUCE_SUM",
                             "REDUCE_MAX", "RESHAPE", "PERMUTE", "EXPAND", "PAD", "SHRINK", "FLIP", "GATHER",
                             "SCATTER_ADD"}


def _leaf(array: np.ndarray, requires_grad: bool) -> Tensor:
    dtype = F64 if array.dtype.kind == "f" else None
    return Tensor.from_numpy(array, dtype, requires_grad=requires_grad and array.dtype.kind == "f")


def _objective(build: Callable[..., Tensor], arrays: list[np.ndarray], cotangent: np.ndarray) -> float:
    """sum(build(arrays) * cotangent), evaluated on the reference backend without autograd."""
    out = build(*(_leaf(a, requires_grad=False) for a in arrays))
    return float(np.sum(REFERENCE.evaluate([out.node])[0] * cotangent))


def numeric_gradients(build: Callable[..., Tensor], arrays: list[np.ndarray], cotangent: np.ndarray,
                      eps: float) -> list[np.ndarray | None]:
    """Central differences of the objective for every float input."""
    grads: list[np.ndarray | None] = []
    for position, array in enumerate(arrays):
        if array.dtype.kind != "f":
            grads.append(None)
            continue
        grad = np.zeros_like(array)
        for flat in range(array.size):
            shifted = [a.copy() for a in arrays]
            shifted[position].flat[flat] = array.flat[flat] + eps
            upper = _objective(build, shifted, cotangent)
            shifted[position].flat[flat] = array.flat[flat] - eps
            lower = _objective(build, shifted, cotangent)
            grad.flat[flat] = (upper - lower) / (2 * eps)
        grads.append(grad)
    return grads


def analytic_gradients(build: Callable[..., Tensor], arrays: list[np.ndarray],
                       cotangent: np.ndarray) -> list[np.ndarray | None]:
    leaves = [_leaf(a, requires_grad=True) for a in arrays]
    out = build(*leaves)
    wrt = [t for t in leaves if t.requires_grad]
    grads = iter(tg.grad(out, wrt, grad_outputs=Tensor.from_numpy(cotangent, out.dtype)))
    return [REFERENCE.evaluate([next(grads).node])[0] if t.requires_grad else None for t in leaves]


def check_gradients(name: str, build: Callable[..., Tensor], arrays: list[np.ndarray], *, seed: int,
                    eps: float = 1e-6, rtol: float = 1e-6, atol: float = 1e-8) -> None:
    rng = np.random.default_rng(seed)
    leaves = [_leaf(a, requires_grad=False) for a in arrays]
    out_shape = build(*leaves).shape
    cotangent = rng.standard_normal(out_shape)
    expected = numeric_gradients(build, arrays, cotangent, eps)
    actual = analytic_gradients(build, arrays, cotangent)
    for position, (got, want) in enumerate(zip(actual, expected)):
        if want is None:
            continue
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol,
                                   err_msg=f"{name}: gradient of input {position} (seed {seed})")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_primitive_gradient_matches_finite_differences(case: Case) -> None:
    seed = sum(map(ord, case.name))
    arrays = case.inputs(np.random.default_rng(seed))
    check_gradients(case.name, case.build, arrays, seed=seed, eps=case.eps, rtol=case.rtol, atol=case.atol)


def test_every_differentiable_primitive_has_a_case() -> None:
    from tensorgraphs.autograd.rules import GRAD_RULES

    assert {c.name for c in CASES} == DIFFERENTIABLE_PRIMITIVES
    state_ops = {Op.ASSIGN, Op.COPY}
    assert {op.name for op in GRAD_RULES if op not in state_ops} == DIFFERENTIABLE_PRIMITIVES


# ---------------------------------------------------------------------------
# composites: through their gradient rule and through their decomposition
# ---------------------------------------------------------------------------


def _through_decomposition(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`fn`'s composite replaced by its decomposition, so autograd differentiates the primitives."""
    return lambda *ts: Tensor.result(decompose(fn(*ts).node), *ts)


COMPOSITES = {
    "matmul": (lambda a, b: tg.matmul(a, b),
               lambda rng: [rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 2))]),
    # |x| stays on one side of 0.5, where the decomposition switches formulas
    "erf": (lambda x: tg.erf(x), lambda rng: [np.array([-1.7, -0.8, -0.3, 0.1, 0.45, 0.9, 2.2])]),
}


@pytest.mark.parametrize("name", sorted(COMPOSITES))
@pytest.mark.parametrize("route", ["rule", "decomposition"])
def test_composite_gradient_matches_finite_differences(name: str, route: str) -> None:
    fn, make_inputs = COMPOSITES[name]
    build = fn if route == "rule" else _through_decomposition(fn)
    arrays = make_inputs(np.random.default_rng(7))
    # erf's rule is the exact derivative; its decomposition approximates erf to 1.5e-7
    atol = 1e-6 if (name, route) == ("erf", "rule") else 1e-8
    check_gradients(f"{name} via {route}", build, arrays, seed=11, atol=atol)


def test_composite_rule_and_decomposition_agree_on_matmul() -> None:
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((3, 4)), rng.standard_normal((4, 5))]
    cotangent = rng.standard_normal((3, 5))
    by_rule = analytic_gradients(tg.matmul, arrays, cotangent)
    by_decomposition = analytic_gradients(_through_decomposition(tg.matmul), arrays, cotangent)
    for a, b in zip(by_rule, by_decomposition):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------
# tie rules, compared with PyTorch
# ---------------------------------------------------------------------------


def test_max_splits_ties_evenly_and_handles_nan_like_torch_maximum() -> None:
    a_values = np.array([1.0, 2.0, 3.0, -0.0, 5.0, np.nan, 1.0, np.nan])
    b_values = np.array([1.0, 1.0, 4.0, 0.0, 5.0, 1.0, np.nan, np.nan])
    cotangent = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    a = Tensor.from_numpy(a_values, F64, requires_grad=True)
    b = Tensor.from_numpy(b_values, F64, requires_grad=True)
    grads = tg.grad(apply(Op.MAX, a, b), [a, b], grad_outputs=Tensor.from_numpy(cotangent, F64))
    ta = torch.tensor(a_values, requires_grad=True)
    tb = torch.tensor(b_values, requires_grad=True)
    expected = torch.autograd.grad(torch.maximum(ta, tb), [ta, tb], grad_outputs=torch.tensor(cotangent))
    for got, want in zip(grads, expected):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("axes", [(1,), (0, 1)])
def test_reduce_max_shares_gradient_among_equal_maxima_like_torch_amax(axes: tuple[int, ...]) -> None:
    values = np.array([[3.0, 1.0, 3.0, 3.0], [2.0, 2.0, -1.0, 0.0], [5.0, 4.0, 5.0, 1.0]])
    x = Tensor.from_numpy(values, F64, requires_grad=True)
    out = apply(Op.REDUCE_MAX, x, arg=axes)
    cotangent = np.arange(1.0, 1.0 + out.numel()).reshape(out.shape)
    (got,) = tg.grad(out, [x], grad_outputs=Tensor.from_numpy(cotangent, F64))
    tx = torch.tensor(values, requires_grad=True)
    expected = torch.autograd.grad(torch.amax(tx, dim=axes, keepdim=True), [tx], torch.tensor(cotangent))[0]
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-15)
