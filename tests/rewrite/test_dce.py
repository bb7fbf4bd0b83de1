"""Dead-code elimination for multi-output graphs."""

from __future__ import annotations

import numpy as np

import tensorgraphs as tg
from tensorgraphs.graph.node import toposort
from tensorgraphs.rewrite import CANONICAL, live_nodes, rewrite
from tensorgraphs.rewrite.dce import prune


def test_outputs_share_live_nodes_and_dead_branches_disappear() -> None:
    x = tg.tensor(np.arange(4, dtype=np.float32))
    expensive = x.exp().sqrt()
    first = tg.where(tg.zeros(4, dtype=tg.bool), expensive, x + 1)  # the expensive branch is dead
    second = (x + 1) * 2
    before = [first.node, second.node]
    after = rewrite(before, CANONICAL)
    live = live_nodes(after)
    assert expensive.node not in live and len(live) == 5  # x, 1, x + 1, 2, (x + 1) * 2
    assert prune(toposort(before), after) == [n for n in toposort(before) if n in live]
