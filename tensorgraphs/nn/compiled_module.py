"""`tg.compile`: of a function (`tensorgraphs.compiled`), or of a module as `torch.compile(model)` does.

A compiled module is a `Module` wrapping the original one as its submodule `_orig_mod` (torch's name, so
`parameters()`, `state_dict()` keys, `train()`/`eval()` and optimizers see the same tensors as torch's
wrapper): calling it runs the module's forward as one compiled program, and its results are differentiable
(`runtime.differentiable`), so a loss built on them, `loss.backward()` and `optimizer.step()` work as in eager
code. Compiling the whole training step (`tg.compile` of a function that calls backward and step) stays the
fastest route: it compiles the backward pass and the update too.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from tensorgraphs.compiled import CompiledFunction
from tensorgraphs.dynamic import DynamicSpec
from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.nn.module import IncompatibleKeys, Module
from tensorgraphs.runtime import tracing

_ORIGINAL = "_orig_mod"


class CompiledModule(Module):
    """`module` with a compiled, differentiable forward; other attributes are read from `module`."""

    def __init__(self, module: Module, dynamic: DynamicSpec = None) -> None:
        super().__init__()
        self._orig_mod = module
        self._dynamic = dynamic
        object.__setattr__(self, "compiled_forward", CompiledFunction(module, differentiable=True, dynamic=dynamic))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if tracing.active() is not None:  # inside a compiled function: part of its program
            return self._orig_mod(*args, **kwargs)
        return self.compiled_forward(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules")
            if not modules or _ORIGINAL not in modules:
                raise
            return getattr(modules[_ORIGINAL], name)

    def __deepcopy__(self, memo: dict[int, Any]) -> CompiledModule:
        return CompiledModule(copy.deepcopy(self._orig_mod, memo), self._dynamic)  # compiled again when first called

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True,
                        assign: bool = False) -> IncompatibleKeys:
        """As `Module.load_state_dict`; keys without the `_orig_mod.` prefix (saved from the module before it
        was compiled) are taken as the module's own."""
        prefix = _ORIGINAL + "."
        named = {key if key.startswith(prefix) else prefix + key: value for key, value in state_dict.items()}
        return super().load_state_dict(named, strict, assign)


def compile(target: Callable[..., Any] | Module | None = None, **options: Any) -> Any:
    """Compile a function (`CompiledFunction`) or a module (`CompiledModule`) for the cpu backend; usable as a
    decorator, with or without arguments. `dynamic=True` or `{argument: {dimension: name or tg.Dim}}` compiles
    one program for many sizes of those dimensions (`tensorgraphs.dynamic`). torch.compile's other options
    (`mode`, `fullgraph`, `backend`, `options`) are accepted and change nothing; `disable=True` returns `target`
    itself."""
    unknown = set(options) - {"mode", "fullgraph", "dynamic", "backend", "options", "disable"}
    if unknown:
        fail("compile", f"unknown option(s) {', '.join(sorted(unknown))}; torch.compile's are mode, fullgraph, "
             "dynamic, backend, options and disable", kind=ArgumentError)
    if target is None:
        return lambda function: compile(function, **options)
    if options.get("disable"):
        return target
    if isinstance(target, Module):
        return CompiledModule(target, dynamic=options.get("dynamic"))
    return CompiledFunction(target, dynamic=options.get("dynamic"))
