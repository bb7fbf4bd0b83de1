"""The rewrite engine: named rule sets applied bottom-up to a fixpoint.

`rewrite(roots, ruleset)` rebuilds every node from its rewritten sources, then
applies the first matching rule again and again until none matches; whatever a
replacement builds is rewritten the same way. Results are memoized per node id
for the pass (the originals are held, so ids stay valid), so shared subgraphs
are rewritten once and the result is a fixpoint of the whole rule set. Nodes are
hash-consed, so rewriting never mutates: it returns new roots.

`optimize(roots)` runs the active rule sets in order; realization calls it.
`TG_DEBUG=rewrite` prints the graph before and after each rule set with the
number of times each rule fired.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import Counter
from typing import Callable, Iterable, Iterator, Sequence

from tensorgraphs.graph.node import Node, toposort, with_sources
from tensorgraphs.rewrite.pattern import OpKey, Rule, op_key

MAX_REWRITES_IN_A_ROW = 200  # a node replaced more often than this (each replacement rewritten again) means a cycle


class RewriteError(RuntimeError):
    """Rules that never reach a fixpoint, or a replacement with the wrong shape or dtype."""


class RuleSet:
    """Named rules, indexed by the op at the root of their pattern; the first match (in order) wins."""

    def __init__(self, name: str, rules: Iterable[Rule] = (), exact: bool = True) -> None:
        self.name = name
        self.exact = exact  # False: results may differ from the unrewritten graph (NaN, Inf, signed zero)
        self.rules: list[Rule] = []
        self._by_op: dict[OpKey, list[Rule]] = {}
        self._any_op: list[Rule] = []
        for rule in rules:
            self.add(rule)

    def add(self, rule: Rule) -> Rule:
        if any(r.name == rule.name for r in self.rules):
            raise ValueError(f"rule set {self.name!r} already has a rule named {rule.name!r}")
        self.rules.append(rule)
        self._reindex()
        return rule

    def remove(self, name: str) -> None:
        self.rules = [r for r in self.rules if r.name != name]
        self._reindex()

    def _reindex(self) -> None:
        global _edits
        _edits += 1
        keys = {key for r in self.rules for key in r.pattern.ops or ()}
        self._any_op = [r for r in self.rules if r.pattern.ops is None]
        self._by_op = {key: [r for r in self.rules if r.pattern.ops is None or key in r.pattern.ops] for key in keys}

    def candidates(self, node: Node) -> list[Rule]:
        return self._by_op.get(op_key(node.op), self._any_op)

    def __repr__(self) -> str:
        return f"RuleSet({self.name!r}, {len(self.rules)} rules{'' if self.exact else ', inexact'})"


def apply_first(ruleset: RuleSet, node: Node, fired: Counter[str] | None = None) -> Node | None:
    """The replacement from the first rule that matches `node` and does not decline, or None."""
    for rule in ruleset.candidates(node):
        bindings = rule.pattern.match(node)
        if bindings is None:
            continue
        replacement = rule.replace(**bindings)
        if replacement is None or replacement is node:
            continue
        if replacement.shape != node.shape or replacement.dtype is not node.dtype:
            raise RewriteError(f"rule {rule.name!r} replaced {node} by {replacement}: shape or dtype differs")
        if fired is not None:
            fired[rule.name] += 1
        return replacement
    return None


_VISIT, _BUILD, _LINK = 0, 1, 2


def rewrite(roots: Sequence[Node], ruleset: RuleSet, stop: Callable[[Node], bool] | None = None,
            fired: Counter[str] | None = None) -> list[Node]:
    """`roots` rewritten bottom-up to a fixpoint of `ruleset`; nodes where `stop` holds are kept as they are."""
    done: dict[int, Node] = {}
    held: list[Node] = []  # keeps every node whose id is a key of `done` alive during the pass
    # (node, state, replacement, how many rewrites in a row produced this node)
    stack: list[tuple[Node, int, Node | None, int]] = [(r, _VISIT, None, 0) for r in reversed(roots)]
    while stack:
        node, state, replacement, generation = stack.pop()
        if state == _LINK:
            done[id(node)] = done[id(replacement)]
            held.append(node)
            continue
        if id(node) in done:
            continue
        if state == _VISIT:
            if stop is not None and stop(node):
                done[id(node)] = node
                held.append(node)
                continue
            stack.append((node, _BUILD, None, generation))
            stack.extend((s, _VISIT, None, 0) for s in node.src if id(s) not in done)
            continue
        built = with_sources(node, tuple(done[id(s)] for s in node.src))
        new = apply_first(ruleset, built, fired)
        if new is None:
            done[id(node)] = done[id(built)] = built
            held += (node, built)
            continue
        if generation >= MAX_REWRITES_IN_A_ROW:
            raise RewriteError(f"rule set {ruleset.name!r} does not reach a fixpoint (last: {built} -> {new})")
        stack.append((node, _LINK, new, generation))
        stack.append((new, _VISIT, None, generation + 1))
    return [done[id(r)] for r in roots]


# ---------------------------------------------------------------------------
# Named rule sets and the ones realization applies.
# ---------------------------------------------------------------------------

RULESETS: dict[str, RuleSet] = {}
_edits = 0  # rules added or removed, in any rule set
DEFAULT_ACTIVE = ("canonical", "user")
_state = threading.local()


def named_ruleset(name: str, exact: bool = True) -> RuleSet:
    """The rule set called `name`, created empty on first use."""
    if name not in RULESETS:
        RULESETS[name] = RuleSet(name, exact=exact)
    return RULESETS[name]


def active_rulesets() -> tuple[str, ...]:
    return getattr(_state, "active", DEFAULT_ACTIVE)


def rewriting_key() -> tuple[tuple[str, ...], int]:
    """Equal while `optimize` rewrites every graph the same way: the same rule sets active, no rule added or
    removed since (a cache of rewritten graphs keys on it)."""
    return active_rulesets(), _edits


@contextlib.contextmanager
def using(*names: str) -> Iterator[None]:
    """Realize with exactly these rule sets inside the block, e.g. `using("canonical", "fast_math", "user")`;
    `using()` turns rewriting off."""
    unknown = [n for n in names if n not in RULESETS]
    if unknown:
        raise ValueError(f"unknown rule sets {unknown}; available: {sorted(RULESETS)}")
    previous = active_rulesets()
    _state.active = tuple(names)
    try:
        yield
    finally:
        _state.active = previous


def _debugging() -> bool:
    return "rewrite" in os.environ.get("TG_DEBUG", "").split(",")


def optimize(roots: Sequence[Node], names: Sequence[str] | None = None,
             stop: Callable[[Node], bool] | None = None) -> list[Node]:
    """`roots` after each named rule set in turn (the active ones by default)."""
    roots = list(roots)
    for name in active_rulesets() if names is None else names:
        rules = RULESETS[name]
        if not rules.rules:
            continue
        fired: Counter[str] = Counter()
        before = roots
        roots = rewrite(roots, rules, stop, fired)
        if _debugging():
            _print_pass(name, before, roots, fired, stop)
    return roots


def _print_pass(name: str, before: list[Node], after: list[Node], fired: Counter[str],
                stop: Callable[[Node], bool] | None) -> None:
    from tensorgraphs.graph.show import graph_text

    count = lambda roots: len(toposort(roots, stop))
    summary = ", ".join(f"{rule} x{n}" for rule, n in fired.most_common()) or "no rule fired"
    print(f"--- rewrite {name}: {count(before)} -> {count(after)} nodes; {summary}", file=sys.stderr)
    print(f"before:\n{graph_text(before, stop)}\nafter:\n{graph_text(after, stop)}", file=sys.stderr)
