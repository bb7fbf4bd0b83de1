"""Realization: turn lazy nodes into data, remembering the results of realized tensors."""

from __future__ import annotations

import weakref

import numpy as np

from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.graph.node import Node

_realized: weakref.WeakKeyDictionary[Node, np.ndarray] = weakref.WeakKeyDictionary()


def realize(nodes: list[Node]) -> list[np.ndarray]:
    """Values of `nodes`, computed together (shared work done once) and remembered while each node lives."""
    values = REFERENCE.evaluate(nodes, known=_realized)
    for node, value in zip(nodes, values):
        _realized[node] = value
    return values


def is_realized(node: Node) -> bool:
    return node in _realized
