"""Dead-code elimination for multi-output graphs.

Nodes are immutable and point only at their sources, so after rewriting, dead
code is exactly what no root reaches: `live_nodes` is the program to run. For a
node list built elsewhere (a schedule), `prune` keeps the live ones in order.
"""

from __future__ import annotations

from typing import Callable, Sequence

from tensorgraphs.graph.node import Node, toposort


def live_nodes(roots: Sequence[Node], stop: Callable[[Node], bool] | None = None) -> list[Node]:
    """Every node some root needs, sources first, each once (shared subgraphs of several outputs too)."""
    return toposort(list(roots), stop)


def prune(nodes: Sequence[Node], roots: Sequence[Node]) -> list[Node]:
    """`nodes` without those no root needs, order kept."""
    live = {id(n) for n in live_nodes(roots)}
    return [n for n in nodes if id(n) in live]
