"""Realization: turn lazy nodes into data on the current device's backend.

Results of realized tensors are remembered per node while the node lives, so a
tensor printed twice is computed once and later graphs start from its value.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Mapping, Protocol

import numpy as np

from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.errors import ArgumentError, UnsupportedError, fail
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


def set_default_device(name: str | device) -> None:
    _state.device = device(name).require_available()


OTHER_DEVICE_TYPES = ("cuda", "mps", "xpu", "hip", "meta")
"""torch's device types tensorgraphs has no backend for: `device("cuda")` is a value (as in torch), using it fails."""


class device:
    """A device as torch.device is one (`type`, `index`, str, repr, ==, hash), and a context manager:
    `with tg.device("numpy"):` runs the block's realizations on that backend and restores the previous one.

    Tensors are lazy and live wherever they are realized, so a device names the backend that computes them.
    """

    __slots__ = ("type", "index")

    def __init__(self, type: str | device, index: int | None = None) -> None:
        if isinstance(type, device):
            type, index = type.type, type.index if index is None else index
        name, colon, suffix = str(type).partition(":")
        if colon:
            if index is not None or not suffix.isdigit():
                fail("device", f"invalid device string {type!r}: expected a type and an optional index, as 'cpu' "
                     f"or 'cuda:0'", kind=ArgumentError)
            index = int(suffix)
        if name not in BACKENDS and name not in OTHER_DEVICE_TYPES:
            fail("device", f"unknown device {name!r}; available: {', '.join(sorted(BACKENDS))}", kind=ArgumentError)
        if index is not None and (not isinstance(index, int) or index < 0):
            fail("device", f"device index must be a non-negative int, got {index!r}", kind=ArgumentError)
        self.type, self.index = name, index

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"device(type={self.type!r})" if self.index is None else \
            f"device(type={self.type!r}, index={self.index})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __reduce__(self) -> tuple:
        return device, (self.type, self.index)

    def require_available(self) -> str:
        """The backend's name; an UnsupportedError for torch's device types that tensorgraphs lacks."""
        if self.type not in BACKENDS:
            fail("device", f"tensorgraphs has no {self.type!r} device (tg.cuda.is_available() is False); its "
                           f"devices are {', '.join(sorted(BACKENDS))}: use 'cpu'", kind=UnsupportedError)
        return self.type

    def __enter__(self) -> device:
        name = self.require_available()
        _previous_devices().append(default_device())
        _state.device = name
        return self

    def __exit__(self, *exc: object) -> None:
        _state.device = _previous_devices().pop()


def _previous_devices() -> list[str]:
    if not hasattr(_state, "previous"):
        _state.previous = []
    return _state.previous


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
