"""The fuzzer: exact rule sets keep every bit on random graphs; inexact ones are caught and shrunk."""

from __future__ import annotations

import pytest

from tensorgraphs.graph.node import toposort
from tensorgraphs.rewrite import fuzz


def test_canonical_rules_keep_every_bit_on_300_random_graphs() -> None:
    report = fuzz.fuzz(range(300))
    assert report is None, report


@pytest.mark.slow
def test_canonical_rules_keep_every_bit_on_10000_random_graphs() -> None:
    report = fuzz.fuzz(range(300, 10_300))
    assert report is None, report


def test_inexact_rules_are_caught_and_shrunk_to_a_few_nodes() -> None:
    seeds = range(300)
    failing = next(s for s in seeds if fuzz.check(fuzz.random_graph(s), ("canonical", "fast_math")) is not None)
    found = fuzz.check(fuzz.random_graph(failing), ("canonical", "fast_math"))
    minimal = fuzz.shrink(found, ("canonical", "fast_math"))
    assert len(toposort(minimal.roots)) <= 3 < len(toposort(found.roots))
    report = fuzz.fuzz([failing], ("canonical", "fast_math"))
    assert f"--seed {failing}" in report and "expected" in report


def test_graphs_are_reproducible_from_their_seed() -> None:
    first, second = fuzz.random_graph(5), fuzz.random_graph(5)
    assert [n.op for n in toposort(first)] == [n.op for n in toposort(second)]


def test_command_line_exit_status(capsys) -> None:
    assert fuzz.main(["--seed", "3"]) == 0
    assert "all equal" in capsys.readouterr().out
