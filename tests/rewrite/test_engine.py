"""The rewrite engine: patterns, fixpoints, memoization, user rules at realization, TG_DEBUG output."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs import dtypes
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.graph.ops import Op
from tensorgraphs.rewrite import (
    Pattern,
    RewriteError,
    Rule,
    RuleSet,
    const,
    keep,
    op,
    optimize,
    pattern_of,
    rewrite,
    using,
    var,
)
from tensorgraphs.runtime import realize

x, y = var("x"), var("y")


def buffer(*shape: int) -> Node:
    return tg.tensor(np.ones(shape, np.float32)).node


def test_a_name_used_twice_binds_one_node() -> None:
    a, b = buffer(3), buffer(3)
    pattern = op(Op.MUL, x, x)
    assert pattern.match(g.binary(Op.MUL, a, a)) == {"x": a}
    assert pattern.match(g.binary(Op.MUL, a, b)) is None


def test_op_alternatives_and_commutative_sources() -> None:
    a = buffer(3)
    one = g.const(1.0, dtypes.float32, (3,))
    pattern = op([Op.ADD, Op.MUL], x, const(1))
    assert pattern.match(g.binary(Op.MUL, one, a)) == {"x": a}  # sources swapped
    assert pattern.match(g.binary(Op.ADD, a, one)) == {"x": a}
    assert pattern.match(g.binary(Op.DIV, one, a)) is None  # DIV is not commutative, nor listed


def test_constant_values_compare_as_ieee() -> None:
    zero, negative_zero = (g.const(v, dtypes.float32) for v in (0.0, -0.0))
    nan = g.const(float("nan"), dtypes.float32)
    assert const(0.0).match(zero) is not None and const(0.0).match(negative_zero) is None
    assert const(float("nan")).match(nan) is not None
    assert const(1).match(g.const(True, dtypes.bool_)) is not None


def test_shared_subgraphs_are_rewritten_once() -> None:
    calls = []
    counting = RuleSet("count", [Rule("count exp2", op(Op.EXP2, x), lambda x: calls.append(x))])
    shared = g.unary(Op.EXP2, buffer(3))
    roots = [g.binary(Op.ADD, shared, shared), g.binary(Op.MUL, shared, shared)]
    rewrite(roots, counting)
    assert len(calls) == 1


def test_replacements_are_rewritten_to_a_fixpoint() -> None:
    a = buffer(2, 3)
    chain = a
    for order in [(1, 0), (1, 0), (1, 0), (1, 0)]:
        chain = g.movement(Op.PERMUTE, chain, order)
    assert optimize([chain], ["canonical"]) == [a]


def test_rules_that_cycle_raise() -> None:
    swap = RuleSet("cycle", [Rule("swap", op(Op.ADD, x, y, name="n"), lambda n, x, y: g.binary(Op.ADD, n.src[1],
                                                                                               n.src[0]))])
    node = g.binary(Op.ADD, buffer(3), g.unary(Op.SQRT, buffer(3)))
    with pytest.raises(RewriteError, match="fixpoint"):
        rewrite([node], swap)


def test_a_replacement_of_another_shape_is_refused() -> None:
    bad = RuleSet("bad", [Rule("flatten", op(Op.SQRT, x), lambda x: g.movement(Op.RESHAPE, x, (6,)))])
    with pytest.raises(RewriteError, match="shape or dtype"):
        rewrite([g.unary(Op.SQRT, buffer(2, 3))], bad)


def test_deep_chains_do_not_recurse() -> None:
    node = buffer(1)
    for _ in range(3_000):  # far deeper than Python's recursion limit
        node = g.binary(Op.MUL, node, g.const(1.0, dtypes.float32, (1,)))
        node = g.unary(Op.SQRT, node)
    out = optimize([node], ["canonical"])[0]
    assert len(toposort([out])) == 3_001


def test_nodes_where_stop_holds_are_kept() -> None:
    a = buffer(3)
    inner = g.binary(Op.MUL, a, g.const(1.0, dtypes.float32, (3,)))
    outer = g.unary(Op.SQRT, inner)
    assert optimize([outer], ["canonical"], stop=lambda n: n is inner) == [outer]


# -- user rules --------------------------------------------------------------

FUSED_SILU_CALLS: list[int] = []


def _fused_silu_decomposition(x: tg.Tensor) -> tg.Tensor:
    FUSED_SILU_CALLS.append(1)
    return x * tg.sigmoid(x)


FUSED_SILU = register(Composite("rewrite_test_fused_silu", infer=lambda x: (x.dtype, x.shape),
                                decompose=_fused_silu_decomposition))


def fused_silu(x: tg.Tensor) -> tg.Tensor:
    from tensorgraphs.frontend.tensor import apply_composite

    return apply_composite(FUSED_SILU, x)


@pytest.fixture
def silu_rule():
    rule = tg.rewrite.rule("x*sigmoid(x) -> fused silu", lambda x: x * tg.sigmoid(x), lambda x: fused_silu(x))
    tg.rewrite.register(rule)
    FUSED_SILU_CALLS.clear()
    yield rule
    tg.rewrite.unregister(rule.name)


def test_user_rule_fires_when_a_graph_is_realized(silu_rule) -> None:
    values = np.array([-3.0, -0.5, 0.0, 2.0], dtype=np.float32)
    t = tg.tensor(values)
    fused = (t * tg.sigmoid(t)).numpy()
    assert len(FUSED_SILU_CALLS) == 1, "the composite was not used"
    with using("canonical"):
        unfused = (t * tg.sigmoid(t) + 0).numpy()
    assert len(FUSED_SILU_CALLS) == 1
    np.testing.assert_array_equal(fused, unfused)


def test_user_rule_matches_any_float_shape_and_dtype(silu_rule) -> None:
    t = tg.tensor(np.ones((2, 3)), dtype=tg.float64)
    (out,) = optimize([(t * tg.sigmoid(t)).node])
    assert out.op is FUSED_SILU and out.src == (t.node,)


def test_user_rules_are_off_inside_using_without_them(silu_rule) -> None:
    t = tg.tensor(np.ones(3, np.float32))
    with using("canonical"):
        (t * tg.sigmoid(t)).numpy()
    assert not FUSED_SILU_CALLS


def test_using_rejects_unknown_rule_sets() -> None:
    with pytest.raises(ValueError, match="unknown rule sets"):
        with using("no_such_set"):
            pass


def test_pattern_of_a_tensor_function_matches_its_own_graph() -> None:
    pattern = pattern_of(lambda a, b: (a + b).exp())
    a, b = tg.tensor(np.ones(3, np.float32)), tg.tensor(np.zeros(3, np.float32))
    assert isinstance(pattern, Pattern)
    assert pattern.match(optimize([(a + b).exp().node], ["canonical"])[0]) == {"a": a.node, "b": b.node}
    assert pattern.match(optimize([(a * b).exp().node], ["canonical"])[0]) is None


def test_rule_names_are_unique_per_rule_set() -> None:
    rules = RuleSet("names", [Rule("x * 1", op(Op.MUL, x, const(1)), keep("x"))])
    with pytest.raises(ValueError, match="already has"):
        rules.add(Rule("x * 1", op(Op.MUL, x, const(1)), keep("x")))


def test_debug_output_shows_graphs_and_rule_counts(monkeypatch, capsys) -> None:
    monkeypatch.setenv("TG_DEBUG", "rewrite")
    # a graph seen before is not rewritten again, and a constant realized before (hash-consed) is an input
    monkeypatch.setattr(realize, "_executables", OrderedDict())
    monkeypatch.setattr(realize, "_realized", {})
    a = tg.tensor(np.ones(3, np.float32))
    (a * 1 * 1).numpy()
    err = capsys.readouterr().err
    assert "rewrite canonical" in err and "x * 1 x2" in err and "before:" in err and "after:" in err


def test_user_rule_fires_in_compiled_code(silu_rule) -> None:
    compiled = tg.compile(lambda t: t * tg.sigmoid(t) + 1)
    values = np.array([-2.0, 0.5, 3.0], dtype=np.float32)
    out = compiled(tg.tensor(values)).numpy()
    assert FUSED_SILU_CALLS, "the composite was not used"
    with using("canonical"):
        t = tg.tensor(values)
        expected = (t * tg.sigmoid(t) + 1).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-6)
