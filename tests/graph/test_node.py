"""The Node IR: hash-consing, immutability, toposort order and the builders' shape/dtype rules."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest

from tensorgraphs import dtypes
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import REGISTRY, make_node
from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.graph.ops import Op
from tensorgraphs.runtime.buffer import Buffer

F32, I64 = dtypes.float32, dtypes.int64


def new_buffer(shape: tuple[int, ...] = (2, 3), dtype: dtypes.DType = F32) -> Node:
    data = np.zeros(shape, dtype.storage)
    return g.buffer(Buffer("numpy", dtype, shape, data), dtype, shape)


# ---------------------------------------------------------------------------
# hash-consing
# ---------------------------------------------------------------------------


def test_building_the_same_node_twice_returns_the_same_object() -> None:
    x = new_buffer()
    first = g.binary(Op.MUL, g.unary(Op.SIN, x), g.const(2.0, F32, (2, 3)))
    second = g.binary(Op.MUL, g.unary(Op.SIN, x), g.const(2.0, F32, (2, 3)))
    assert first is second
    assert g.reduce(Op.REDUCE_SUM, first, (1, 0)) is g.reduce(Op.REDUCE_SUM, first, (0, 1))
    assert g.movement(Op.PAD, x, [[1, 0], [0, 2]]) is g.movement(Op.PAD, x, ((1, 0), (0, 2)))
    assert g.movement(Op.RESHAPE, x, (np.int64(3), np.int64(2))) is g.movement(Op.RESHAPE, x, (3, 2))
    assert g.movement(Op.RESHAPE, x, (np.int64(3), 2)).shape == (3, 2)
    assert all(type(s) is int for s in g.movement(Op.RESHAPE, x, (np.int64(3), 2)).shape)


@pytest.mark.parametrize("make", [
    lambda x: g.unary(Op.SIN, x),
    lambda x: g.unary(Op.CAST, x, I64),
    lambda x: g.binary(Op.ADD, x, x),
    lambda x: g.movement(Op.FLIP, x, (1, 0)),
    lambda x: g.gather(x, g.const(0, I64, (2, 1)), 1),
], ids=["unary", "cast", "binary", "flip", "gather"])
def test_every_builder_hash_conses(make) -> None:
    x = new_buffer()
    assert make(x) is make(x)


def test_nodes_differing_in_any_field_are_different() -> None:
    x, y = new_buffer(), new_buffer()
    base = g.binary(Op.ADD, x, y)
    assert base is not g.binary(Op.ADD, y, x)  # operand order is part of the key (canonicalizing is a rewrite)
    assert base is not g.binary(Op.MUL, x, y)
    assert g.const(1, I64) is not g.const(1, dtypes.int32)
    assert g.const(1.0, F32, (2,)) is not g.const(1.0, F32, (3,))
    assert g.const(1, I64) is not g.const(1.0, F32)


def test_const_keys_keep_negative_zero_and_nan() -> None:
    zero, negative_zero = g.const(0.0, F32), g.const(-0.0, F32)
    assert zero is not negative_zero
    assert math.copysign(1.0, negative_zero.arg) == -1.0 and math.copysign(1.0, zero.arg) == 1.0
    assert g.const(float("nan"), F32) is g.const(float("nan"), F32)  # NaN != NaN, but one node
    assert g.const(float("inf"), F32) is not g.const(float("-inf"), F32)
    assert g.const(True, dtypes.bool_) is g.const(1, dtypes.bool_)  # values are converted to the dtype first


def test_composite_params_with_negative_zero_and_nan_are_keyed_exactly() -> None:
    composite = REGISTRY["detach"]
    x = new_buffer()
    make = lambda **params: make_node(composite, (x,), params, F32, x.shape)
    assert make(slope=0.0) is not make(slope=-0.0)
    assert make(slope=float("nan")) is make(slope=float("nan"))
    assert make(sizes=[1, 2]) is make(sizes=(1, 2))
    assert make(flag=True) is not make(flag=1)


def test_buffer_nodes_are_never_shared_but_what_reads_one_is() -> None:
    data = np.zeros((2, 3), np.float32)
    first = Buffer("numpy", F32, (2, 3), data)
    second = Buffer("numpy", F32, (2, 3), data)  # same contents, a different buffer
    assert g.buffer(first, F32, (2, 3)) is not g.buffer(second, F32, (2, 3))
    node = g.buffer(first, F32, (2, 3))
    assert g.unary(Op.SQRT, node) is g.unary(Op.SQRT, node)
    # every buffer node is made once, for a buffer of its own
    assert all(ref() is not node for ref in Node._interned.values())


def test_interned_nodes_are_released_when_unused() -> None:
    x = new_buffer()
    before = len(Node._interned)
    for i in range(100):
        g.binary(Op.ADD, x, g.const(float(i), F32, x.shape))
    gc.collect()
    assert len(Node._interned) <= before + 1


# ---------------------------------------------------------------------------
# immutability
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["op", "dtype", "shape", "src", "arg", "new_field"])
def test_nodes_are_immutable(field: str) -> None:
    node = g.unary(Op.SIN, new_buffer())
    with pytest.raises(AttributeError):
        setattr(node, field, None)
    if field != "new_field":
        with pytest.raises(AttributeError):
            delattr(node, field)
    assert node.op is Op.SIN and node.shape == (2, 3)


def test_node_fields_are_tuples() -> None:
    node = g.binary(Op.ADD, new_buffer(), new_buffer())
    assert isinstance(node.shape, tuple) and isinstance(node.src, tuple)
    assert isinstance(g.movement(Op.PAD, node, [[0, 1], [1, 0]]).arg[0], tuple)


# ---------------------------------------------------------------------------
# toposort
# ---------------------------------------------------------------------------


def _assert_topological(order: list[Node]) -> None:
    position = {id(n): i for i, n in enumerate(order)}
    assert len(position) == len(order), "a node appears twice"
    for n in order:
        for s in n.src:
            assert position[id(s)] < position[id(n)], f"{s} after its consumer {n}"


def test_toposort_puts_sources_first_each_node_once_root_last() -> None:
    x, y = new_buffer(), new_buffer()
    shared = g.binary(Op.MUL, x, y)
    left, right = g.unary(Op.SIN, shared), g.unary(Op.SQRT, shared)
    root = g.binary(Op.ADD, g.binary(Op.ADD, left, right), shared)
    order = root.toposort()
    _assert_topological(order)
    assert order[-1] is root
    assert {id(n) for n in order} == {id(n) for n in (x, y, shared, left, right, root, root.src[0])}


def test_toposort_of_several_roots_and_with_stop() -> None:
    x = new_buffer()
    a = g.unary(Op.SIN, x)
    b = g.unary(Op.SQRT, a)
    c = g.unary(Op.EXP2, a)
    order = toposort([b, c, b])
    _assert_topological(order)
    assert [n for n in order if n in (b, c)] == [b, c]
    stopped = toposort([b], stop=lambda n: n is a)
    assert stopped == [a, b]


def test_toposort_handles_deep_graphs_without_recursion() -> None:
    node = new_buffer((1,))
    for _ in range(5000):
        node = g.unary(Op.SIN, node)
    order = node.toposort()
    assert len(order) == 5001 and order[-1] is node and order[0].op is Op.BUFFER


# ---------------------------------------------------------------------------
# builders: shape and dtype rules are assertions (the Tensor API has already raised a readable error)
# ---------------------------------------------------------------------------

INVALID = {
    "binary shapes": lambda x: g.binary(Op.ADD, x, new_buffer((3, 2))),
    "binary dtypes": lambda x: g.binary(Op.ADD, x, new_buffer(dtype=dtypes.float64)),
    "unary on int": lambda x: g.unary(Op.SIN, new_buffer(dtype=I64)),
    "cast without dtype": lambda x: g.unary(Op.CAST, x),
    "mod on float": lambda x: g.binary(Op.MOD, x, x),
    "and on float": lambda x: g.binary(Op.AND, x, x),
    "not a binary op": lambda x: g.binary(Op.SIN, x, x),
    "where cond not bool": lambda x: g.where(x, x, x),
    "where shapes": lambda x: g.where(g.const(True, dtypes.bool_, (2, 3)), x, new_buffer((1, 3))),
    "reduce axis out of range": lambda x: g.reduce(Op.REDUCE_SUM, x, (2,)),
    "reduce duplicate axes": lambda x: g.reduce(Op.REDUCE_MAX, x, (1, 1)),
    "reshape count": lambda x: g.movement(Op.RESHAPE, x, (4, 2)),
    "reshape negative": lambda x: g.movement(Op.RESHAPE, x, (-2, -3)),
    "permute not a permutation": lambda x: g.movement(Op.PERMUTE, x, (0, 0)),
    "expand non-1 axis": lambda x: g.movement(Op.EXPAND, x, (4, 3)),
    "expand rank": lambda x: g.movement(Op.EXPAND, x, (1, 2, 3)),
    "pad negative": lambda x: g.movement(Op.PAD, x, ((0, -1), (0, 0))),
    "shrink out of bounds": lambda x: g.movement(Op.SHRINK, x, ((0, 3), (0, 3))),
    "shrink reversed": lambda x: g.movement(Op.SHRINK, x, ((1, 0), (0, 3))),
    "flip axis out of range": lambda x: g.movement(Op.FLIP, x, (2,)),
    "flip negative axis": lambda x: g.movement(Op.FLIP, x, (-1,)),
    "gather float index": lambda x: g.gather(x, x, 0),
    "gather rank": lambda x: g.gather(x, g.const(0, I64, (2,)), 0),
    "gather other axis": lambda x: g.gather(x, g.const(0, I64, (3, 3)), 1),
    "gather axis": lambda x: g.gather(x, g.const(0, I64, (2, 3)), 2),
    "scatter float index": lambda x: g.scatter_add(x, x, x, 0),
    "scatter values shape": lambda x: g.scatter_add(x, g.const(0, I64, (2, 3)), new_buffer((2, 2)), 0),
    "scatter axis": lambda x: g.scatter_add(x, g.const(0, I64, (2, 3)), x, 2),
    "scatter index larger": lambda x: g.scatter_add(x, g.const(0, I64, (2, 4)), new_buffer((2, 4)), 0),
    "const negative size": lambda x: g.const(0.0, F32, (2, -1)),
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_builders_reject_invalid_nodes(name: str) -> None:
    with pytest.raises((AssertionError, IndexError)):
        INVALID[name](new_buffer())


def test_builders_shape_and_dtype_rules() -> None:
    x = new_buffer((2, 3))
    assert g.binary(Op.CMPLT, x, x).dtype is dtypes.bool_
    assert g.binary(Op.MAX, x, x).dtype is F32
    assert g.reduce(Op.REDUCE_SUM, x, (1,)).shape == (2, 1)
    assert g.movement(Op.PERMUTE, x, (1, 0)).shape == (3, 2)
    assert g.movement(Op.PAD, x, ((1, 2), (0, 1))).shape == (5, 4)
    assert g.movement(Op.SHRINK, x, ((1, 2), (0, 3))).shape == (1, 3)
    assert g.movement(Op.EXPAND, g.movement(Op.RESHAPE, x, (2, 1, 3)), (2, 4, 3)).shape == (2, 4, 3)
    assert g.gather(x, g.const(0, I64, (2, 5)), 1).shape == (2, 5)
    assert g.scatter_add(x, g.const(0, I64, (1, 3)), new_buffer((1, 3)), 0).shape == (2, 3)


def test_no_op_builders_return_their_input() -> None:
    x = new_buffer((2, 1, 3))
    assert g.movement(Op.RESHAPE, x, (2, 1, 3)) is x
    assert g.movement(Op.PERMUTE, x, (0, 1, 2)) is x
    assert g.movement(Op.EXPAND, x, (2, 1, 3)) is x
    assert g.movement(Op.PAD, x, ((0, 0),) * 3) is x
    assert g.movement(Op.SHRINK, x, ((0, 2), (0, 1), (0, 3))) is x
    assert g.movement(Op.FLIP, x, (1,)) is x
    assert g.unary(Op.CAST, x, F32) is x
    assert g.reduce(Op.REDUCE_SUM, x, ()) is x
