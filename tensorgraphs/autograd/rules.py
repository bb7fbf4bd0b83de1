"""The gradient rule of each differentiable primitive, by op.

A rule has a composite's `grad` contract: it gets the node's output, the incoming gradient and the node's inputs
as values (`graph.composite.as_value`) and returns one gradient per input, or None where no gradient flows. The
rules are written with the front end's Tensor ops, so the front end registers them
(`tensorgraphs.frontend.gradient_rules`), as it registers decomposition bodies; a backward pass is then an
ordinary primitive graph that later stages optimize like the forward.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from tensorgraphs.graph.ops import Op

GradientRule = Callable[..., tuple[Any, ...]]

GRAD_RULES: dict[Op, GradientRule] = {}
"""Ops absent here (comparisons, MOD, AND/OR/XOR, IOTA, CONST, BUFFER) pass no gradient."""


def register(rules: Mapping[Op, GradientRule]) -> None:
    """Add the gradient rules of `rules`' ops; an op has one rule."""
    taken = set(rules).intersection(GRAD_RULES)
    if taken:
        raise ValueError(f"gradient rules of {sorted(op.name for op in taken)} are already registered")
    GRAD_RULES.update(rules)


def add_in_order(parts: Sequence[Any]) -> Any:
    """The sum of a node's gradient contributions, left to right in the order they arrived."""
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


GradientSum = Callable[[Sequence[Any]], Any]
GRADIENT_SUM: list[GradientSum] = [add_in_order]
"""How the contributions to one node's gradient are summed (the front end registers one that joins the disjoint
slices of a split into one concatenation, `register_gradient_sum`)."""


def register_gradient_sum(gradient_sum: GradientSum) -> None:
    GRADIENT_SUM[0] = gradient_sum
