"""torch's `Tensor.register_post_accumulate_grad_hook`: a function called with a leaf after `backward()` has
accumulated into its `.grad` (data-parallel training averages gradients there)."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable

from tensorgraphs.errors import AutogradError, fail

Tensor = Any  # the front end's Tensor (this layer does not import it)
Hook = Callable[[Tensor], None]
_hooks: dict[int, tuple[weakref.ref[Any], list[Hook]]] = {}
"""id of a leaf -> (the leaf, its hooks in registration order); by id, since a Tensor's == compares values."""


class RemovableHandle:
    """What registering a hook returns (torch's name): `remove()` unregisters it."""

    def __init__(self, hooks: list[Hook], hook: Hook) -> None:
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


def register_post_accumulate_grad_hook(tensor: Tensor, hook: Hook) -> RemovableHandle:
    """Call `hook(tensor)` after each `backward()` that accumulates into `tensor.grad` (a leaf)."""
    if not (tensor.requires_grad and tensor.is_leaf):
        fail("register_post_accumulate_grad_hook", "post accumulate grad hooks cannot be registered on non-leaf "
             "tensors (or tensors that do not require grad)", kind=AutogradError)
    key = id(tensor)
    entry = _hooks.get(key)
    if entry is None or entry[0]() is not tensor:
        # the dict is bound now: at interpreter exit the module's globals may be gone when the leaf dies
        entry = _hooks[key] = (weakref.ref(tensor, lambda _, hooks=_hooks: hooks.pop(key, None)), [])
    entry[1].append(hook)
    return RemovableHandle(entry[1], hook)


def run_post_accumulate_grad_hooks(leaves: Iterable[Tensor]) -> None:
    """Run the hooks of `leaves` (whose gradients a backward just accumulated), leaf by leaf in order."""
    if not _hooks:
        return
    for leaf in leaves:
        entry = _hooks.get(id(leaf))
        if entry is not None and entry[0]() is leaf:
            for hook in list(entry[1]):
                hook(leaf)
