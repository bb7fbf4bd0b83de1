"""Graph views: indented text, DOT, SVG when graphviz is installed."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.graph import show as show_module
from tensorgraphs.graph.node import toposort


def example() -> tg.Tensor:
    x = tg.tensor(np.ones((2, 3), np.float32))
    shared = x.exp()
    return (shared * shared).sum(1)


def test_text_has_one_line_per_node_with_op_dtype_shape(capsys) -> None:
    t = example()
    tg.show(t)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("%") and "RESHAPE float32[2] (2,)" in lines[0]
    assert lines[1].startswith("  %") and "REDUCE_SUM float32[2, 1] (1,)" in lines[1]
    assert any(line.startswith("    ") and "BUFFER float32[2, 3]" in line for line in lines)
    repeated = [line for line in lines if line.endswith(" ^")]
    assert len(repeated) == 1  # the shared exp is printed once, then referenced
    assert len(lines) == len(toposort([t.node])) + len(repeated)
    assert t.graph() == "\n".join(lines)


def test_numbers_are_stable_and_sources_come_first() -> None:
    t = example()
    assert t.graph() == example().graph()
    assert "%0 BUFFER" in t.graph()


def test_several_roots_are_shown_together() -> None:
    t = example()
    text = show_module.graph_text([t, t.node.src[0].src[0]])
    assert text.count("REDUCE_SUM") == 1 and text.splitlines()[-1].endswith("^")


def test_dot_lists_every_node_and_edge() -> None:
    t = example()
    dot = show_module.graph_dot(t)
    nodes = toposort([t.node])
    assert dot.startswith("digraph") and dot.count("[label=") == len(nodes)
    assert dot.count("->") == sum(len(n.src) for n in nodes)


def test_dot_file(tmp_path) -> None:
    path = tg.show(example(), tmp_path / "graph.dot")
    assert open(path).read().startswith("digraph")


def test_svg_falls_back_to_dot_without_graphviz(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(show_module, "_render_svg", lambda dot: None)
    with pytest.warns(UserWarning, match="graphviz"):
        path = tg.show(example(), tmp_path / "graph.svg")
    assert path.endswith("graph.dot") and open(path).read().startswith("digraph")


def test_svg_with_graphviz(tmp_path) -> None:
    if show_module._render_svg("digraph { a }") is None:
        pytest.skip("graphviz is not installed")
    path = tg.show(example(), tmp_path / "graph.svg")
    assert "<svg" in open(path).read()
