"""Realization: turn lazy nodes into data on the current device's backend.

Results of realized tensors are remembered per node while the node lives, so a
tensor printed twice is computed once and later graphs start from its value.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from typing import Iterator, Mapping, Protocol

import numpy as np

from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.errors import ArgumentError
from tensorgraphs.graph.node import Node
from tensorgraphs.rewrite import optimize
from tensorgraphs.runtime.tracing import refuse_values


class Backend(Protocol):
    name: str

    def evaluate(self, roots: list[Node], known: dict[Node, np.ndarray] | None = None) -> list[np.ndarray]: ...


BACKENDS: dict[str, Backend] = {"numpy": REFERENCE}
_state = threading.local()
_realized: dict[str, weakref.WeakKeyDictionary[Node, np.ndarray]] = {}
"""Per device: values of realized nodes, kept while the node lives (devices never share results)."""


def register_backend(backend: Backend) -> None:
    BACKENDS[backend.name] = backend


def default_device() -> str:
    """The device realizations run on: `set_default_device`'s, else "cpu" (compiled C) where a C compiler is
    installed, else the reference interpreter "numpy"."""
    return getattr(_state, "device", None) or _initial_device()


@functools.cache
def _initial_device() -> str:
    from tensorgraphs.codegen.compiler import compiler_available

    return "cpu" if "cpu" in BACKENDS and compiler_available() else "numpy"


def set_default_device(name: str) -> None:
    if name not in BACKENDS:
        raise ArgumentError(f"unknown device {name!r}; available: {', '.join(sorted(BACKENDS))}")
    _state.device = name


@contextlib.contextmanager
def device(name: str) -> Iterator[None]:
    """Run realizations inside the block on backend `name`."""
    previous = default_device()
    set_default_device(name)
    try:
        yield
    finally:
        _state.device = previous


def realized_values(name: str) -> Mapping[Node, np.ndarray]:
    """The values device `name` has realized and still remembers."""
    return _realized.setdefault(name, weakref.WeakKeyDictionary())


def realize(nodes: list[Node]) -> list[np.ndarray]:
    """Values of `nodes`, computed together (shared work done once) on the current device.

    The active rewrite rule sets run first (canonical form, user rules); results are remembered under
    the original nodes.
    """
    refuse_values("realize")
    name = default_device()
    known = realized_values(name)
    optimized = optimize(nodes, stop=known.__contains__)
    values = BACKENDS[name].evaluate(optimized, known=known)
    for node, value in zip(nodes, values):
        known[node] = value
    return values
