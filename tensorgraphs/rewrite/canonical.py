"""The canonical form: rule tables that keep every value bit for bit.

`canonical` (on by default) folds constants (computed by the reference backend's
kernels in the node's own dtype, so integer wraparound and bfloat16 rounding are
what the unrewritten graph gives), removes identities that are exact in IEEE 754,
collapses chains of views, and orders operands of commutative ops by structure so
that equal expressions become one hash-consed node.

Choices made for exactness:
* `x + 0 -> x` only for integers and bool; for floats only `x + (-0.0) -> x`,
  because -0.0 + 0.0 is +0.0.
* Float ADD/MUL chains are not reassociated ((a+b)+c is not a+(b+c) in floats);
  integer and bool chains of ADD, MUL, MAX, AND, OR, XOR (exact with wraparound)
  are flattened, sorted and their constants folded into one.
* Float MAX keeps its operand order: max(-0.0, 0.0) returns the second operand.

`fast_math` (opt-in: `tg.rewrite.using("canonical", "fast_math", "user")`) holds
the float rules that are wrong for NaN, Inf or signed zeros: x*0 -> 0, x-x -> 0,
x+0 -> x, x != x -> False.

`decompose` (never on by default) replaces every composite by its reference
decomposition, all the way down to primitives.
"""

from __future__ import annotations

import functools
from typing import Any

from tensorgraphs import dtypes
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.dtypes import DType
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import decompose, is_composite
from tensorgraphs.graph.node import Node
from tensorgraphs.graph.ops import COMMUTATIVE, ELEMENTWISE, MOVEMENT, Op
from tensorgraphs.rewrite.engine import RuleSet
from tensorgraphs.rewrite.pattern import Pattern, Rule, const, keep, op, var
from tensorgraphs.rewrite.structural_hash import precedes

# ---------------------------------------------------------------------------
# Predicates and replacements the tables are written with.
# ---------------------------------------------------------------------------


def is_exact_arithmetic(node: Node) -> bool:
    """Integers and bool: arithmetic is exact (with wraparound), no NaN or signed zero."""
    return not node.dtype.is_floating_point


def has_constant_sources(node: Node) -> bool:
    return bool(node.src) and all(s.op is Op.CONST for s in node.src)


def fold(node: Node) -> Node:
    """The CONST equal to `node`, whose sources are all CONST: computed by the reference kernels on one element."""
    scalar_sources = tuple(g.const(s.arg, s.dtype) for s in node.src)
    value = REFERENCE.evaluate([Node(node.op, node.dtype, (), scalar_sources, node.arg)])[0]
    return g.const(value.item(), node.dtype, node.shape)


def constant_like(node: Node, c: Node) -> Node:
    return g.const(c.arg, node.dtype, node.shape)


def zero_like(node: Node, **_: Any) -> Node:
    return g.const(0, node.dtype, node.shape)


def has_all_bits_set(node: Node) -> bool:
    """True for bool, -1 (or 2**bits - 1) for integers: the identity of AND."""
    if node.dtype.is_bool:
        return node.arg is True
    return node.dtype.is_integer and node.arg % (1 << node.dtype.bits) == (1 << node.dtype.bits) - 1


# Casting A -> B -> A returns x exactly when B holds every value of A.
_EXACT_WIDENING: dict[DType, frozenset[DType]] = {
    dtypes.bool_: frozenset(dtypes.ALL_DTYPES),
    dtypes.uint8: frozenset({dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint32, dtypes.float16,
                             dtypes.bfloat16, dtypes.float32, dtypes.float64}),
    dtypes.int8: frozenset({dtypes.int16, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.bfloat16,
                            dtypes.float32, dtypes.float64}),
    dtypes.int16: frozenset({dtypes.int32, dtypes.int64, dtypes.float32, dtypes.float64}),
    dtypes.int32: frozenset({dtypes.int64, dtypes.float64}),
    dtypes.uint32: frozenset({dtypes.int64, dtypes.float64}),
    dtypes.float16: frozenset({dtypes.float32, dtypes.float64}),
    dtypes.bfloat16: frozenset({dtypes.float32, dtypes.float64}),
    dtypes.float32: frozenset({dtypes.float64}),
}


def casts_to_own_dtype(node: Node) -> bool:
    return node.dtype is node.src[0].dtype


def returns_through_wider_dtype(node: Node) -> bool:
    """CAST(CAST(x, wide), x.dtype) where `wide` holds every value of x.dtype."""
    inner = node.src[0]
    return (inner.op is Op.CAST and node.dtype is inner.src[0].dtype
            and inner.dtype in _EXACT_WIDENING.get(node.dtype, ()))


def is_noop_view(node: Node) -> bool:
    return g.movement(node.op, node.src[0], node.arg) is node.src[0]


def view_of(op_: Op, x: Node, arg: Any) -> Node:
    return g.movement(op_, x, arg)


def composed_permute(node: Node, inner: Node, x: Node) -> Node:
    return view_of(Op.PERMUTE, x, tuple(inner.arg[i] for i in node.arg))


def composed_shrink(node: Node, inner: Node, x: Node) -> Node:
    return view_of(Op.SHRINK, x, tuple((b0 + b1, b0 + e1) for (b0, _), (b1, e1) in zip(inner.arg, node.arg)))


def composed_pad(node: Node, inner: Node, x: Node) -> Node:
    return view_of(Op.PAD, x, tuple((b0 + b1, a0 + a1) for (b0, a0), (b1, a1) in zip(inner.arg, node.arg)))


def composed_flip(node: Node, inner: Node, x: Node) -> Node:
    return view_of(Op.FLIP, x, tuple(set(inner.arg) ^ set(node.arg)))


def outer_view(node: Node, inner: Node, x: Node) -> Node:
    """RESHAPE(RESHAPE(x)) and EXPAND(EXPAND(x)): only the outer argument matters."""
    return view_of(node.op, x, node.arg)


ASSOCIATIVE = frozenset({Op.ADD, Op.MUL, Op.MAX, Op.AND, Op.OR, Op.XOR})


def operands_out_of_order(node: Node) -> bool:
    """A commutative node whose operands are not in canonical order.

    Exact associative chains are ordered by `flattened_chain` instead; float MAX keeps its order (module doc).
    """
    if node.op in ASSOCIATIVE and (is_exact_arithmetic(node) or node.op is Op.MAX):
        return False
    a, b = node.src
    return a is not b and precedes(b, a)


def swapped(node: Node) -> Node:
    return g.binary(node.op, node.src[1], node.src[0])



MAX_CHAIN_LEAVES = 256
"""Longest chain `flattened_chain` orders: a chain reusing its own links (x = x * x, repeated) has 2**n operands."""


def chain_leaves(node: Node) -> list[Node] | None:
    """Operands of a chain of one associative op (same dtype), left to right; None past MAX_CHAIN_LEAVES."""
    leaves: list[Node] = []
    pending = [node]
    while pending:
        n = pending.pop()
        if n.op is node.op and n.dtype is node.dtype:
            pending.extend(reversed(n.src))
        else:
            leaves.append(n)
        if len(leaves) + len(pending) > MAX_CHAIN_LEAVES:
            return None
    return leaves


def flattened_chain(node: Node) -> Node:
    """An exact (integer/bool) associative chain as a left-deep chain of sorted operands, constants folded last."""
    leaves = chain_leaves(node)
    if leaves is None:
        return node
    constants = [n for n in leaves if n.op is Op.CONST]
    operands = sorted((n for n in leaves if n.op is not Op.CONST), key=functools.cmp_to_key(_compare))
    if constants:
        operands.append(functools.reduce(lambda a, b: fold(g.binary(node.op, a, b)), constants))
    return functools.reduce(lambda a, b: g.binary(node.op, a, b), operands)


def _compare(a: Node, b: Node) -> int:
    return 0 if a is b else -1 if precedes(a, b) else 1


# ---------------------------------------------------------------------------
# The tables.
# ---------------------------------------------------------------------------

x, y, c = var("x"), var("y"), const(name="c")
exact_x = var("x", where=is_exact_arithmetic)
neg_x = op(Op.MUL, x, const(-1))
all_ones = const(name="ones", where=has_all_bits_set)


def inner(view: Op) -> Pattern:
    return op(view, x, name="inner")


CANONICAL = RuleSet("canonical", [
    # constants
    Rule("fold constants", op(ELEMENTWISE, name="node", where=has_constant_sources, any_src=True), fold),
    Rule("view of a constant", op(MOVEMENT - {Op.PAD}, c, name="node"), constant_like),
    Rule("zero padding of zero", op(Op.PAD, const(0, name="c"), name="node"), constant_like),
    Rule("max of a constant", op(Op.REDUCE_MAX, c, name="node"), constant_like),
    # identities exact in IEEE 754
    Rule("x * 1", op(Op.MUL, x, const(1)), keep("x")),
    Rule("x / 1", op(Op.DIV, x, const(1)), keep("x")),
    Rule("x + (-0.0)", op(Op.ADD, x, const(-0.0)), keep("x")),
    Rule("-(-x)", op(Op.MUL, neg_x, const(-1)), keep("x")),
    Rule("where(c, x, x)", op(Op.WHERE, var("cond"), x, x), keep("x")),
    Rule("where(True, x, y)", op(Op.WHERE, const(True), x, y), keep("x")),
    Rule("where(False, x, y)", op(Op.WHERE, const(False), x, y), keep("y")),
    Rule("max(x, x), x & x, x | x", op([Op.MAX, Op.AND, Op.OR], x, x), keep("x")),
    Rule("x < x", op(Op.CMPLT, x, x, name="node"), zero_like),
    Rule("cast to its own dtype", op(Op.CAST, x, where=casts_to_own_dtype), keep("x")),
    Rule("cast there and back", op(Op.CAST, op(Op.CAST, x), where=returns_through_wider_dtype), keep("x")),
    # identities exact for integers and bool only
    Rule("x + 0 (exact dtypes)", op(Op.ADD, exact_x, const(0)), keep("x")),
    Rule("x - x (exact dtypes)", op(Op.ADD, exact_x, neg_x, name="node"), zero_like),
    Rule("x * 0, x & 0 (exact dtypes)", op([Op.MUL, Op.AND], exact_x, const(0), name="node"), zero_like),
    Rule("x != x (exact dtypes)", op(Op.CMPNE, exact_x, x, name="node"), zero_like),
    Rule("x ^ x", op(Op.XOR, x, x, name="node"), zero_like),
    Rule("x | 0, x ^ 0", op([Op.OR, Op.XOR], x, const(0)), keep("x")),
    Rule("x & ~0", op(Op.AND, x, all_ones), keep("x")),
    Rule("x | ~0", op(Op.OR, x, all_ones), keep("ones")),
    # views
    Rule("no-op view", op(MOVEMENT, x, where=is_noop_view), keep("x")),
    Rule("reshape of reshape", op(Op.RESHAPE, inner(Op.RESHAPE), name="node"), outer_view),
    Rule("expand of expand", op(Op.EXPAND, inner(Op.EXPAND), name="node"), outer_view),
    Rule("permute of permute", op(Op.PERMUTE, inner(Op.PERMUTE), name="node"), composed_permute),
    Rule("flip of flip", op(Op.FLIP, inner(Op.FLIP), name="node"), composed_flip),
    Rule("shrink of shrink", op(Op.SHRINK, inner(Op.SHRINK), name="node"), composed_shrink),
    Rule("pad of pad", op(Op.PAD, inner(Op.PAD), name="node"), composed_pad),
    # operand order
    Rule("flatten exact chains", op(ASSOCIATIVE, name="node", where=is_exact_arithmetic, any_src=True),
         flattened_chain),
    Rule("order commutative operands", op(COMMUTATIVE, name="node", where=operands_out_of_order, any_src=True),
         swapped),
])

FAST_MATH = RuleSet("fast_math", exact=False, rules=[
    Rule("x * 0", op(Op.MUL, x, const(0), name="node"), zero_like),
    Rule("x - x", op(Op.ADD, x, neg_x, name="node"), zero_like),
    Rule("x + 0", op(Op.ADD, x, const(0)), keep("x")),
    Rule("x != x", op(Op.CMPNE, x, x, name="node"), zero_like),
])

DECOMPOSE = RuleSet("decompose", [
    Rule("decompose composites", Pattern(name="node", where=is_composite), decompose),
])
