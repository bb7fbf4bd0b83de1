"""Structural keys: what a subgraph computes, independent of which buffers feed it.

`structural_hash(roots)` names each input buffer only by its dtype, shape and the
position where it first appears, so twelve identical transformer layers with
different weights share one key (later stages key plans and compiled kernels on
it), while a layer that differs in one op, constant or in how its inputs are
shared gets another. Keys are blake2b digests of op names, dtypes, shapes and
arguments: stable across processes, unlike Python's salted `hash`.

`node_digest` is the same digest with every buffer anonymous; it is memoized
per node. `precedes` orders operands by the digest with sizes left out too, so a
graph traced at another batch or sequence length gets the same canonical form
(and one program template, `tensorgraphs.dynamic`).
"""

from __future__ import annotations

import hashlib
import itertools
import re
import weakref
from typing import Callable, Sequence

from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.graph.ops import Op

_digests: weakref.WeakKeyDictionary[Node, bytes] = weakref.WeakKeyDictionary()
_order_digests: weakref.WeakKeyDictionary[Node, bytes] = weakref.WeakKeyDictionary()
_ordinals: weakref.WeakKeyDictionary[Node, int] = weakref.WeakKeyDictionary()
_next_ordinal = itertools.count()


def _describe(node: Node, source_digests: list[bytes], leaf_label: Callable[[Node], str], sized: bool = True) -> bytes:
    op_name = node.op.name if isinstance(node.op, Op) else f"composite:{node.op.name}"
    arg = leaf_label(node) if node.op is Op.BUFFER else repr(node.arg)
    text = f"{op_name}|{node.dtype.name}|{node.shape}|{arg}|"
    if not sized:
        text = _NUMBER.sub("#", text)
    return hashlib.blake2b(text.encode() + b"".join(source_digests), digest_size=16).digest()


_NUMBER = re.compile(r"\d+")


def _anonymous(node: Node) -> str:
    return "input"


def node_digest(node: Node, sized: bool = True) -> bytes:
    """Structure of the graph below `node` with all buffers alike (memoized while the node lives); without
    `sized`, every number (sizes, constants, arguments) left out as well."""
    digests = _digests if sized else _order_digests
    known = digests.get(node)
    if known is not None:
        return known
    for n in toposort([node], stop=digests.__contains__):
        if n not in digests:
            digests[n] = _describe(n, [digests[s] for s in n.src], _anonymous, sized)
    return digests[node]


def structural_hash(roots: Node | Sequence[Node]) -> str:
    """Key of the subgraph computing `roots`: buffers count only by dtype, shape and first position."""
    roots = [roots] if isinstance(roots, Node) else list(roots)
    order = toposort(roots)
    positions = {n: i for i, n in enumerate(n for n in order if n.op is Op.BUFFER)}
    label = lambda n: f"input{positions[n]}"
    digests: dict[Node, bytes] = {}
    for n in order:
        digests[n] = _describe(n, [digests[s] for s in n.src], label)
    return hashlib.blake2b(b"".join(digests[r] for r in roots), digest_size=16).hexdigest()


def precedes(a: Node, b: Node) -> bool:
    """Canonical operand order: constants last, then by structure whatever the sizes, then by first time asked
    (stable ties)."""
    a_const, b_const = a.op is Op.CONST, b.op is Op.CONST
    if a_const != b_const:
        return b_const
    da, db = node_digest(a, sized=False), node_digest(b, sized=False)
    if da != db:
        return da < db
    return _ordinal(a) < _ordinal(b)


def _ordinal(node: Node) -> int:
    found = _ordinals.get(node)
    if found is None:
        found = _ordinals[node] = next(_next_ordinal)
    return found
