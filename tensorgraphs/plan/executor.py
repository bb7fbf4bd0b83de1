"""The "planned" device: runs each composite the way the planner chose, everything else on the reference.

Values live as numpy arrays (the home device). A composite whose path is a
kernel runs through its kernel backend (copying in and out when that backend
is elsewhere); one whose path is its decomposition is expanded one level and
evaluated here again, so nested composites get their own choices. Primitives
run on the numpy reference interpreter, unchanged.

Observers (the profiler, `tg tune`'s collector) see every kernel and primitive
call with its signature and time.
"""

from __future__ import annotations

import time
from typing import Mapping, Protocol

import numpy as np

from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.graph.composite import decompose, is_composite
from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.plan.implementations import IMPLEMENTATIONS, call_implementation
from tensorgraphs.plan.planner import DECOMPOSE, Planner, default_planner
from tensorgraphs.plan.signature import Signature, signature_of
from tensorgraphs.runtime.realize import register_backend


class Observer(Protocol):
    def on_composite(self, sig: Signature, implementation: str) -> None: ...

    def on_call(self, name: str, sig: Signature, start: float, seconds: float) -> None: ...


OBSERVERS: list[Observer] = []


class PlannedBackend:
    """A realization backend (`tg.device("planned")`) that follows the planner's choices."""

    name = "planned"

    def __init__(self, planner: Planner | None = None) -> None:
        self._planner = planner

    @property
    def planner(self) -> Planner:
        return self._planner if self._planner is not None else default_planner()

    def evaluate(self, roots: list[Node], known: Mapping[Node, np.ndarray] | None = None) -> list[np.ndarray]:
        known = {} if known is None else known
        planner = self.planner
        values: dict[Node, np.ndarray] = {}
        for node in toposort(roots, stop=known.__contains__):
            cached = known.get(node)
            values[node] = self._run(node, values, planner) if cached is None else cached
        return [values[r] for r in roots]

    def _run(self, node: Node, values: dict[Node, np.ndarray], planner: Planner) -> np.ndarray:
        if not is_composite(node):
            if not OBSERVERS:
                return REFERENCE.evaluate([node], values)[0]
            return _observed(f"reference.{node.op.name}", signature_of(node),
                             lambda: REFERENCE.evaluate([node], values)[0])
        sig = signature_of(node)
        path = planner.best(sig)
        for observer in OBSERVERS:
            observer.on_composite(sig, path.implementation)
        if path.implementation == DECOMPOSE:
            return self.evaluate([decompose(node)], values)[0]
        kernel = IMPLEMENTATIONS.get(path.implementation)
        arrays = [values[s] for s in node.src]
        with np.errstate(all="ignore"):
            return _observed(kernel.name, sig, lambda: call_implementation(kernel, arrays, sig))


def _observed(name: str, sig: Signature, run) -> np.ndarray:
    start = time.perf_counter()
    out = run()
    seconds = time.perf_counter() - start
    for observer in OBSERVERS:
        observer.on_call(name, sig, start, seconds)
    return out


PLANNED = PlannedBackend()
register_backend(PLANNED)
