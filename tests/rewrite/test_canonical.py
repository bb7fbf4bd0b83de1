"""Canonical form: redundant graphs shrink to known node counts and compute the same values."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs import dtypes
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.graph import node as g
from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.graph.ops import Op
from tensorgraphs.rewrite import optimize, rewrite
from tensorgraphs.rewrite.canonical import CANONICAL, FAST_MATH, MAX_CHAIN_LEAVES

rng = np.random.default_rng(0)


def buffer_of(array: np.ndarray) -> Node:
    return tg.tensor(array).node


def assert_same_values(before: list[Node], after: list[Node]) -> None:
    for a, b in zip(REFERENCE.evaluate(before), REFERENCE.evaluate(after)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
        if a.dtype.kind == "f":
            np.testing.assert_array_equal(np.signbit(a), np.signbit(b))


def canonical(*roots: Node) -> list[Node]:
    out = rewrite(list(roots), CANONICAL)
    assert_same_values(list(roots), out)
    return out


# Held-out graphs with redundant work: (description, builder, expected node count after rewriting).
def double_transpose() -> list[Node]:
    x = tg.tensor(rng.standard_normal((3, 4, 5), dtype=np.float32))
    return [x.permute(2, 0, 1).permute(1, 2, 0).transpose(0, 2).transpose(2, 0).node]


def times_one_plus_zero() -> list[Node]:
    x = tg.tensor(rng.integers(-5, 5, (4, 3)))
    return [(x * 1 + 0).node]


def float_times_one_minus_zero() -> list[Node]:
    x = tg.tensor(np.array([-0.0, 0.0, np.nan, -np.inf, 2.5], dtype=np.float32))
    return [((x * 1) / 1 + (-0.0)).node]


def repeated_subexpressions() -> list[Node]:
    a = tg.tensor(rng.standard_normal((4, 3), dtype=np.float32))
    b = tg.tensor(rng.standard_normal((4, 3), dtype=np.float32))
    return [((a * b).exp() + (b * a).exp() + ((b * a).exp() + (a * b).exp())).node]


def dead_branches() -> list[Node]:
    x = tg.tensor(rng.standard_normal(6, dtype=np.float32))
    expensive = (x.exp() * x.sin()).sqrt()
    always = tg.ones(6, dtype=tg.bool)
    return [tg.where(always, x, expensive).node, tg.where(always.logical_not(), expensive, x * 2).node]


def double_negation_and_views() -> list[Node]:
    x = tg.tensor(rng.standard_normal((2, 3), dtype=np.float32))
    return [x.neg().neg().reshape(3, 2).reshape(6).reshape(2, 3).flip(0).flip(0).node]


def folded_integer_chain() -> list[Node]:
    x = tg.tensor(np.array([120, -128, 7], dtype=np.int8))
    return [(((x + 100) + 100) * 1 + (x - x)).node]


HELD_OUT = [
    (double_transpose, 1),  # BUFFER
    (times_one_plus_zero, 1),  # BUFFER
    (float_times_one_minus_zero, 1),  # BUFFER
    (repeated_subexpressions, 8),  # a, b, a*b, CONST log2(e), a*b*log2(e), EXP2, e+e, (e+e)+(e+e)
    (dead_branches, 3),  # x (the first root), CONST 2, x * 2
    (double_negation_and_views, 1),
    (folded_integer_chain, 3),  # x, CONST -56 (200 wraps in int8), x + -56
]


@pytest.mark.parametrize("build, expected", HELD_OUT, ids=[b.__name__ for b, _ in HELD_OUT])
def test_redundant_graphs_shrink_to_expected_node_count(build, expected) -> None:
    roots = build()
    out = canonical(*roots)
    assert len(toposort(out)) == expected, "\n".join(map(repr, toposort(out)))
    assert len(toposort(out)) < len(toposort(roots))


def test_repeated_subexpression_is_one_node() -> None:
    a = tg.tensor(rng.standard_normal(3, dtype=np.float32))
    b = tg.tensor(rng.standard_normal(3, dtype=np.float32))
    left, right = canonical((a * b).node, (b * a).node)
    assert left is right


def test_a_chain_reusing_its_own_links_is_not_flattened_into_exponentially_many_operands() -> None:
    x = tg.tensor(np.array([3, 5], dtype=np.int32))
    squared = x
    for _ in range(40):  # x ** 2**40: a product of 2**40 copies of x if flattened
        squared = squared * squared
    (out,) = canonical(squared.node)
    assert len(toposort([out])) <= MAX_CHAIN_LEAVES + 40 + 2
    np.testing.assert_array_equal(REFERENCE.evaluate([out])[0], REFERENCE.evaluate([squared.node])[0])


def test_integer_fold_wraps_like_the_dtype() -> None:
    x = tg.tensor(np.array([1, 2], dtype=np.int8))
    (out,) = canonical((x + 100 + 100).node)
    constant = next(n for n in out.src if n.op is Op.CONST)
    assert constant.arg == -56 and constant.dtype is dtypes.int8


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16, dtypes.float32])
def test_constant_folding_rounds_in_the_node_dtype(dtype) -> None:
    node = g.binary(Op.DIV, g.const(1.0, dtype, (2,)), g.const(3.0, dtype, (2,)))
    (out,) = canonical(node)
    assert out.op is Op.CONST


def test_float_plus_positive_zero_is_kept_and_fast_math_removes_it() -> None:
    x = buffer_of(np.array([-0.0, 1.0], dtype=np.float32))
    node = g.binary(Op.ADD, x, g.const(0.0, dtypes.float32, (2,)))
    assert canonical(node)[0] is node  # -0.0 + 0.0 is +0.0: not an identity
    assert rewrite([node], FAST_MATH)[0] is x


@pytest.mark.parametrize("inexact", ["x*0", "x-x", "x!=x"])
def test_rules_not_exact_under_nan_need_fast_math(inexact: str) -> None:
    x = tg.tensor(np.array([np.nan, np.inf, 1.0], dtype=np.float32))
    node = {"x*0": x * 0, "x-x": x - x, "x!=x": x != x}[inexact].node
    assert canonical(node)[0].op is not Op.CONST
    fast = optimize([node], ["canonical", "fast_math"])[0]
    assert fast.op is Op.CONST


def test_exact_rules_hold_for_integers() -> None:
    x = tg.tensor(np.array([3, -4], dtype=np.int32))
    for expr in (x * 0, x - x, x != x, x ^ x):
        (out,) = canonical(expr.node)
        assert out.op is Op.CONST


def test_cast_round_trip_only_through_wider_dtypes() -> None:
    x = tg.tensor(np.array([1.5, -2.25], dtype=np.float32))
    wide = canonical(x.double().float().node)[0]
    narrow = canonical(x.half().float().node)[0]
    assert wide is x.node and narrow is not x.node


def test_commutative_operands_order_deterministically() -> None:
    x = tg.tensor(rng.standard_normal(3, dtype=np.float32))
    y = tg.tensor(rng.standard_normal(3, dtype=np.float32))
    forward = canonical((x.exp() + y).node)[0]
    backward = canonical((y + x.exp()).node)[0]
    assert forward is backward
    constant_last = canonical((2.0 * x).node)[0]
    assert constant_last.src[1].op is Op.CONST


def test_float_max_keeps_operand_order() -> None:
    a = buffer_of(np.array([-0.0], dtype=np.float32))
    b = buffer_of(np.array([0.0], dtype=np.float32))
    nodes = [g.binary(Op.MAX, a, b), g.binary(Op.MAX, b, a)]
    assert canonical(*nodes) == nodes


def test_views_of_constants_fold() -> None:
    scalar = tg.Tensor(g.const(2.5, dtypes.float32))
    (out,) = canonical(scalar.expand(3, 4).permute(1, 0).reshape(12).node)
    assert out.op is Op.CONST and out.shape == (12,) and out.arg == 2.5


def test_nan_constants_fold_to_nan() -> None:
    node = g.binary(Op.MUL, g.const(math.nan, dtypes.float32, (2,)), g.const(0.0, dtypes.float32, (2,)))
    (out,) = canonical(node)
    assert out.op is Op.CONST and math.isnan(out.arg)
