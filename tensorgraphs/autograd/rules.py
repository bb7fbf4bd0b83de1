"""The gradient rule of each differentiable primitive, by op.

A rule has a composite's `grad` contract: it gets the node's output, the incoming gradient and the node's inputs
as values (`graph.composite.as_value`) and returns one gradient per input, or None where no gradient flows. The
rules are written with the front end's Tensor ops, so the front end registers them
(`tensorgraphs.frontend.gradient_rules`), as it registers decomposition bodies; a backward pass is then an
ordinary primitive graph that later stages optimize like the forward.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

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
