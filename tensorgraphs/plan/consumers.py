"""A composite as a program uses it: its signature and the elementwise passes over its result that follow it.

Candidates differ in what they leave to the rest of the program: a conv kernel applies a batch norm, a bias, a
relu or a residual in its call (its epilogue), where the decomposition leaves them as passes over its result (or
fuses them into its own loops). Timed alone, a candidate that fuses them ties one that leaves them, so the
compiled path's planner (`plan.choices`) times every candidate on the same work: the composite followed by its
`consumers`, the largest region of elementwise ops after it that the rest of the graph reads through one node (at
most `MAX_CONSUMERS`), their other operands anonymous. An operand keeps its constants, views and elementwise ops on
data smaller than the composite's result, so a batch norm's statistics stay vectors over the channels (what the
epilogue folds), and is cut at anything else (a residual becomes a whole tensor of input).

The scheduler names the uses of the graph it builds (`using(uses_in(...))`); a composite met elsewhere (a nested
one of a decomposition, one asked about on its own) is used `alone`. A signature used with two chains in one graph
is planned for the first (in graph order).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterator

from tensorgraphs.graph.composite import is_composite
from tensorgraphs.graph.node import Node, structure, toposort, with_sources
from tensorgraphs.graph.ops import ELEMENTWISE, MOVEMENT, Op
from tensorgraphs.plan.signature import Signature, TensorSpec, placeholder, placeholder_node, signature_of

MAX_CONSUMERS = 12
"""Most consumers timed with a composite: epilogues are a few ops (a batch norm's four, a relu's two, a
residual)."""


@dataclass(frozen=True, eq=False)
class Use:
    """A composite with the consumers a candidate may fuse or leave: `roots` computes the consumers' exit from
    placeholders (just the composite when `consumers` is ""), `consumers` is their structural key. Uses are equal
    when both their signature and their consumers are."""

    signature: Signature
    consumers: str
    roots: tuple[Node, ...]
    composite: Node

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Use) and (self.signature, self.consumers) == (other.signature, other.consumers)

    def __hash__(self) -> int:
        return hash((self.signature, self.consumers))

    @property
    def measured_as(self) -> Signature:
        """The kernel database's signature of a candidate's time on this use: the composite's, with its consumers as
        a parameter (rows of candidates timed alone, before consumers were, have none: they are not read)."""
        sig = self.signature
        return Signature(sig.name, (*sig.params, ("consumers", self.consumers)), sig.inputs, sig.output)

    def inputs(self) -> list[Node]:
        """The placeholders `roots` reads, in graph order."""
        return [n for n in toposort(list(self.roots)) if n.op is Op.BUFFER]

    def __str__(self) -> str:
        return str(self.signature) + (f" then {self.consumers}" if self.consumers else "")


def alone(sig: Signature) -> Use:
    """`sig` used with no consumers."""
    node = placeholder_node(sig)
    return Use(sig, "", (node,), node)


def _operand(node: Node, kept: dict[Node, Node], limit: int) -> Node:
    """An operand of the consumers on placeholders: its constants, views and elementwise ops over fewer than `limit`
    elements of data (a batch norm's statistics, broadcast) kept, cut at any other node (at most
    `MAX_OPERAND_NODES` looked at)."""
    looked = 0

    def stop(n: Node) -> bool:
        nonlocal looked
        looked += 1
        return n in kept or n.op not in _KEPT or looked > MAX_OPERAND_NODES

    data: dict[Node, int] = {}  # elements of data a node reads, broadcasts not counted
    for n in toposort([node], stop=stop):
        if n in kept:
            continue
        inside = n.op in _KEPT and all(s in kept for s in n.src)
        if n.op is Op.CONST:
            data[n] = 1
        else:
            data[n] = max((data.get(s, s.size) for s in n.src), default=n.size) if inside else n.size
        if n.op is Op.CONST or (inside and data[n] < limit):
            kept[n] = with_sources(n, tuple(kept[s] for s in n.src))
        else:
            kept[n] = placeholder(TensorSpec(n.dtype, n.shape))
    return kept[node]


_KEPT = ELEMENTWISE | MOVEMENT | {Op.CONST}
MAX_OPERAND_NODES = 64


def _consumers_key(roots: tuple[Node, ...]) -> str:
    """The ops of the consumers and a digest of their structure (ops, dtypes, shapes, arguments; placeholders by
    dtype and shape), the same in every process."""
    (entries, _), _ = structure(list(roots), lambda n: n.op is Op.BUFFER)
    text = repr([entry if entry[0] == "input" else (entry[0].name, *entry[1:]) for entry in entries])
    ops = [entry[0].name for entry in entries if entry[0] != "input" and entry[0] in ELEMENTWISE]
    return f"{'+'.join(ops)} {hashlib.blake2b(text.encode(), digest_size=6).hexdigest()}"


def use_with(composite: Node, consumers: list[Node]) -> Use:
    """`composite` followed by `consumers` (elementwise, sources first, the last the only one read elsewhere), on
    placeholders."""
    sig = signature_of(composite)
    if not consumers:
        return alone(sig)
    start = placeholder_node(sig)
    kept = {composite: start}
    for node in consumers:
        kept[node] = with_sources(
            node, tuple(kept[s] if s in kept else _operand(s, kept, composite.size) for s in node.src)
        )
    roots = (kept[consumers[-1]],)
    return Use(sig, _consumers_key(roots), roots, start)


def _consumers(composite: Node, users: dict[Node, list[Node | None]], position: dict[Node, int]) -> list[Node]:
    """The largest region of elementwise ops that follow `composite` and leave through one node (a relu reads its
    input twice), grown by the elementwise users of the region at each step: the consumers, sources first, the exit
    last."""
    region, found = {composite}, []
    while True:
        outs = {u for n in region for u in users[n] if u is not None and u not in region and u.op in ELEMENTWISE}
        if not outs or len(region) + len(outs) > MAX_CONSUMERS + 1:
            return found
        region |= outs
        exits = [n for n in region if any(u is None or u not in region for u in users[n])]
        if len(exits) == 1:
            found = sorted(region - {composite}, key=position.__getitem__)


def uses_in(roots: list[Node], is_leaf: Callable[[Node], bool]) -> dict[Signature, Use]:
    """The use of each composite signature of the graph of `roots` (the first in graph order)."""
    order = toposort(roots, stop=is_leaf)
    position = {n: i for i, n in enumerate(order)}
    users: defaultdict[Node, list[Node | None]] = defaultdict(list, {r: [None] for r in roots})
    for node in order:
        if not is_leaf(node):
            for source in node.src:
                users[source].append(node)
    found: dict[Signature, Use] = {}
    for node in order:
        if not is_leaf(node) and is_composite(node) and signature_of(node) not in found:
            found[signature_of(node)] = use_with(node, _consumers(node, users, position))
    return found


_USES: contextvars.ContextVar[dict[Signature, Use] | None] = contextvars.ContextVar("uses", default=None)


@contextlib.contextmanager
def using(uses: dict[Signature, Use]) -> Iterator[None]:
    """Composites planned inside are used as `uses` says (others `alone`): those of the graph being built."""
    token = _USES.set(uses)
    try:
        yield
    finally:
        _USES.reset(token)


def use_of(sig: Signature) -> Use:
    """How the graph being built uses `sig` (`using`), or `alone`."""
    found = (_USES.get() or {}).get(sig)
    return found if found is not None else alone(sig)
