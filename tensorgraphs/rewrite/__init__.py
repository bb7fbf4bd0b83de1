"""Graph rewriting: canonical form, simplification and user rules (see docs/rewrite.md).

    import tensorgraphs as tg
    rule = tg.rewrite.rule("x*sigmoid(x) -> silu", lambda x: x * tg.sigmoid(x), lambda x: fused_silu(x))
    tg.rewrite.register(rule)          # into the "user" rule set, applied whenever a graph is realized

Rule sets: `canonical` (exact, on by default), `fast_math` (inexact, opt-in with
`using`), `decompose` (composites to primitives, opt-in), `user` (on by default, empty until
you register rules).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import as_node, as_value
from tensorgraphs.graph.node import Node
from tensorgraphs.graph.ops import Op
from tensorgraphs.rewrite.canonical import CANONICAL, DECOMPOSE, FAST_MATH
from tensorgraphs.rewrite.dce import live_nodes
from tensorgraphs.rewrite.engine import (
    RULESETS,
    RewriteError,
    RuleSet,
    active_rulesets,
    named_ruleset,
    optimize,
    rewrite,
    using,
)
from tensorgraphs.rewrite.pattern import Pattern, Rule, const, keep, op, var
from tensorgraphs.rewrite.structural_hash import node_digest, structural_hash
from tensorgraphs.runtime.buffer import HOST, Buffer

RULESETS.update(canonical=CANONICAL, fast_math=FAST_MATH, decompose=DECOMPOSE, user=RuleSet("user"))

__all__ = ["CANONICAL", "DECOMPOSE", "FAST_MATH", "RULESETS", "Pattern", "Rule", "RuleSet", "RewriteError",
           "active_rulesets", "const", "graph_pattern", "keep", "live_nodes", "named_ruleset", "node_digest", "op",
           "optimize", "pattern_of", "pattern_variable", "register", "rewrite", "rule", "structural_hash", "unregister",
           "using", "var"]


def pattern_of(fn: Callable[..., Any]) -> Pattern:
    """The pattern a Tensor function builds, traced on 0-d float32 placeholders named after its parameters.

    Constants match by value (any shape) and each parameter becomes a variable of any dtype and shape,
    so `pattern_of(lambda x: x * tg.sigmoid(x))` matches x*sigmoid(x) for every float tensor x. Meant
    for elementwise expressions: views traced on 0-d placeholders would match 0-d shapes only.
    """
    names = list(inspect.signature(fn).parameters)
    placeholders = {name: pattern_variable() for name in names}
    traced = optimize([as_node(fn(**{name: as_value(p) for name, p in placeholders.items()}))], ["canonical"])[0]
    variables = {placeholders[name]: var(name) for name in names}
    return graph_pattern(traced, variables, lambda node: const(node.arg) if node.op is Op.CONST else None)


def pattern_variable() -> Node:
    """A fresh 0-d float32 BUFFER: what a pattern variable is while its template graph is built."""
    return g.buffer(Buffer(HOST, dtypes.float32, (), np.zeros((), np.float32)), dtypes.float32, ())


def graph_pattern(template: Node, variables: dict[Node, Pattern],
                  constant: Callable[[Node], Pattern | None]) -> Pattern:
    """A traced graph as a pattern: `variables` give the patterns of its placeholder nodes, `constant` that of a
    constant (None for any other node), and every other node matches its op and argument."""
    patterns: dict[Node, Pattern] = {}
    for node in template.toposort():
        if node in variables:
            patterns[node] = variables[node]
        elif (constant_pattern := constant(node)) is not None:
            patterns[node] = constant_pattern
        else:
            same_arg = (lambda n, arg=node.arg: n.arg == arg) if node.arg is not None else None
            patterns[node] = op(node.op, *(patterns[s] for s in node.src), where=same_arg)
    return patterns[template]


def rule(name: str, pattern: Pattern | Callable[..., Any], replace: Callable[..., Any]) -> Rule:
    """A rule whose replacement is a Tensor function of the pattern's variables.

    `pattern` is a `Pattern` (built with `var`, `op`, `const`) or a Tensor function traced by `pattern_of`.
    """
    if not isinstance(pattern, Pattern):
        pattern = pattern_of(pattern)
    wanted = set(inspect.signature(replace).parameters)

    def replace_nodes(**bindings: Node) -> Node:
        return as_node(replace(**{k: as_value(v) for k, v in bindings.items() if k in wanted}))

    return Rule(name, pattern, replace_nodes)


def register(new_rule: Rule, ruleset: str = "user") -> Rule:
    """Add `new_rule` to a named rule set (created if new); the `user` set applies at every realization."""
    return named_ruleset(ruleset).add(new_rule)


def unregister(name: str, ruleset: str = "user") -> None:
    RULESETS[ruleset].remove(name)
