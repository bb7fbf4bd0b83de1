"""Graph views: indented text for the terminal, DOT (and SVG through graphviz) for pictures.

Nodes are numbered in dependency order (`%0` is a source), so the numbers are the
same every time a graph is shown. The text view prints each root as a tree, one
line per node with op, dtype, shape and argument; a node already printed shows
as `%n ^` instead of its subtree again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import warnings
from typing import Any, Callable

from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.graph.ops import Op

INDENT = "  "


def _roots(target: Any) -> list[Node]:
    """Nodes of a Tensor, a Node, or a sequence of either."""
    if isinstance(target, Node):
        return [target]
    if hasattr(target, "node"):
        return [target.node]
    return [n for t in target for n in _roots(t)]


def describe(node: Node) -> str:
    """One node as `OP dtype[shape] arg`."""
    arg = "" if node.arg in (None, ()) or node.op is Op.BUFFER else f" {node.arg!r}"
    return f"{node.op.name} {node.dtype.name}{list(node.shape)}{arg}"


def graph_text(target: Any, stop: Callable[[Node], bool] | None = None) -> str:
    """The graph as indented trees, one per root; below nodes where `stop` holds nothing is shown."""
    roots = _roots(target)
    number = {id(n): i for i, n in enumerate(toposort(roots, stop))}
    lines: list[str] = []
    printed: set[int] = set()
    stack: list[tuple[Node, int]] = [(r, 0) for r in reversed(roots)]
    while stack:
        node, depth = stack.pop()
        label = f"{INDENT * depth}%{number[id(node)]}"
        if id(node) in printed:
            lines.append(f"{label} ^")
            continue
        printed.add(id(node))
        lines.append(f"{label} {describe(node)}")
        if stop is None or not stop(node):
            stack.extend((s, depth + 1) for s in reversed(node.src))
    return "\n".join(lines)


def graph_dot(target: Any) -> str:
    """The graph in graphviz's DOT language, edges from sources to users."""
    order = toposort(_roots(target))
    number = {id(n): i for i, n in enumerate(order)}
    lines = ["digraph tensorgraphs {", "  node [shape=box, fontname=monospace];"]
    for node in order:
        label = describe(node).replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'  n{number[id(node)]} [label="%{number[id(node)]} {label}"];')
        lines.extend(f"  n{number[id(s)]} -> n{number[id(node)]};" for s in node.src)
    lines.append("}")
    return "\n".join(lines)


def _render_svg(dot: str) -> str | None:
    """SVG text from the graphviz `dot` program or Python package, or None when neither is installed."""
    if shutil.which("dot"):
        return subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True).stdout
    try:
        import graphviz  # type: ignore[import-not-found]
    except ImportError:
        return None
    return graphviz.Source(dot).pipe(format="svg").decode()


def show(target: Any, path: str | os.PathLike[str] | None = None) -> str | None:
    """Print the graph of a tensor (or node, or several) as indented text; with `path`, write DOT or SVG.

    A `.svg` path needs graphviz; without it the DOT text is written next to it (`.dot`) with a warning.
    Returns the path written, if any.
    """
    if path is None:
        print(graph_text(target))
        return None
    path = os.fspath(path)
    dot = graph_dot(target)
    if path.endswith(".svg"):
        svg = _render_svg(dot)
        if svg is not None:
            with open(path, "w") as f:
                f.write(svg)
            return path
        path = path[: -len(".svg")] + ".dot"
        warnings.warn(f"graphviz is not installed; wrote DOT text to {path}", stacklevel=2)
    with open(path, "w") as f:
        f.write(dot)
    return path

