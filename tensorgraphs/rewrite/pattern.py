"""Patterns and rules: what a rewrite matches and what it builds instead.

A `Pattern` describes a node: which ops it may have (alternatives), patterns for
its sources, an optional CONST value, an optional predicate on the node, and a
name to bind the matched node under. A name used twice must match the same node,
so `mul(x, sigmoid(x))` only matches when both `x` are one node. Binary patterns
on commutative ops also match with their sources swapped.

A `Rule` pairs a pattern with a replacement: a function called with the bindings
as keyword arguments that returns the new node, or None to decline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from tensorgraphs.graph.composite import Composite
from tensorgraphs.graph.node import Node
from tensorgraphs.graph.ops import COMMUTATIVE, Op

OpKey = Op | str  # a primitive, or a composite by name
Bindings = dict[str, Node]
_ANY_VALUE = object()


def op_key(op: Op | Composite | str) -> OpKey:
    """Rules index nodes by this key: the `Op` itself, or the composite's name."""
    return op.name if isinstance(op, Composite) else op


def same_value(a: Any, b: Any) -> bool:
    """CONST values as IEEE sees them: -0.0 differs from 0.0, NaN equals NaN, 1 == 1.0 == True."""
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


@dataclass(frozen=True, eq=False)
class Pattern:
    ops: frozenset[OpKey] | None = None  # None: any op
    src: tuple[Pattern, ...] | None = None  # None: any sources
    name: str | None = None
    value: Any = _ANY_VALUE  # for CONST patterns
    where: Callable[[Node], bool] | None = None

    def match(self, node: Node) -> Bindings | None:
        """The bindings of a match of this pattern rooted at `node`, or None."""
        bindings: Bindings = {}
        return bindings if _match(self, node, bindings) else None


def _match(pattern: Pattern, node: Node, bindings: Bindings) -> bool:
    if pattern.ops is not None and op_key(node.op) not in pattern.ops:
        return False
    if pattern.value is not _ANY_VALUE and not same_value(node.arg, pattern.value):
        return False
    if pattern.where is not None and not pattern.where(node):
        return False
    if pattern.name is not None:
        bound = bindings.get(pattern.name)
        if bound is not None and bound is not node:
            return False
        bindings[pattern.name] = node
    if pattern.src is None:
        return True
    if len(pattern.src) != len(node.src):
        return False
    if len(node.src) == 2 and node.op in COMMUTATIVE:
        saved = dict(bindings)
        if _match_all(pattern.src, node.src, bindings):
            return True
        bindings.clear()
        bindings.update(saved)
        return _match_all(pattern.src, node.src[::-1], bindings)
    return _match_all(pattern.src, node.src, bindings)


def _match_all(patterns: tuple[Pattern, ...], nodes: tuple[Node, ...], bindings: Bindings) -> bool:
    for p, n in zip(patterns, nodes):
        if not _match(p, n, bindings):
            return False
    return True


# ---------------------------------------------------------------------------
# Pattern builders: the vocabulary rule tables are written in.
# ---------------------------------------------------------------------------


def var(name: str, where: Callable[[Node], bool] | None = None) -> Pattern:
    """Any node, bound to `name`."""
    return Pattern(name=name, where=where)


def op(ops: Op | Composite | str | Iterable[Op | Composite | str], *src: Pattern, name: str | None = None,
       where: Callable[[Node], bool] | None = None, any_src: bool = False) -> Pattern:
    """A node whose op is `ops` (or one of them) with sources matching `src` (any sources if `any_src`)."""
    alternatives = [ops] if isinstance(ops, (Op, Composite, str)) else list(ops)
    return Pattern(frozenset(op_key(o) for o in alternatives), None if any_src else tuple(src), name, where=where)


def const(value: Any = _ANY_VALUE, name: str | None = None, where: Callable[[Node], bool] | None = None) -> Pattern:
    """A CONST node, with `value` if given (compared by `same_value`)."""
    return Pattern(frozenset({Op.CONST}), (), name, value, where)


@dataclass(frozen=True)
class Rule:
    """`replace(**bindings)` returns the node that takes the matched node's place, or None to decline."""

    name: str
    pattern: Pattern
    replace: Callable[..., Node | None]


def keep(name: str) -> Callable[..., Node]:
    """A replacement that is one of the bound nodes: `Rule("x * 1", mul(x, one), keep("x"))`."""
    return lambda **bindings: bindings[name]
