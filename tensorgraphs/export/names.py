"""Names in an exported library: the C prefix, string literals, and the names of the tensors it holds.

Names that come from user code (parameters, arguments, file paths in messages) reach the C source only as
string literals written by `c_string`, which spells every byte outside a small safe set as an octal escape: no
quote, backslash, `*/`, trigraph or newline can end the literal or the comment it is shown in.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Iterator, Mapping

from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.nn.module import Module
from tensorgraphs.optim.optimizer import Optimizer

_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _.,:;#@+-=<>()[]{}/")
_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n"}
_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,39}")


def c_string(text: str) -> str:
    """`text` (as UTF-8) as a C string literal."""
    return '"' + "".join(chr(b) if b in _SAFE else _ESCAPES.get(b, f"\\{b:03o}") for b in text.encode()) + '"'


def check_prefix(name: str) -> str:
    """`name` if it can prefix the library's C symbols (a letter, then letters, digits, underscores)."""
    if not isinstance(name, str) or not _PREFIX.fullmatch(name):
        fail("export", f"name {name!r} cannot prefix C symbols: use a letter followed by up to 39 letters, digits "
             "or underscores (such as 'mlp' or 'gpt_small')", kind=ArgumentError)
    return name


def argument_names(fn: Callable[..., Any], count: int) -> list[str]:
    """The names of `fn`'s first `count` positional parameters (`input.i` where it has none)."""
    target = fn.forward if isinstance(fn, Module) else fn
    try:
        parameters = [p.name for p in inspect.signature(target).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        parameters = []
    return [parameters[i] if i < len(parameters) else f"input.{i}" for i in range(count)]


def holders(fn: Callable[..., Any]) -> dict[str, Module | Optimizer]:
    """The modules and optimizers `fn` reaches by name (its closure, and the globals its code names): where the
    tensors it reads get their names ("model.fc.weight", "optimizer.fc.weight.exp_avg")."""
    if isinstance(fn, Module):
        return {"": fn}
    code = getattr(fn, "__code__", None)
    found: dict[str, Any] = {}
    if code is not None:
        cells = fn.__closure__ or ()
        found.update({name: cell.cell_contents for name, cell in zip(code.co_freevars, cells) if _filled(cell)})
        module_globals = getattr(fn, "__globals__", {})
        found.update({name: module_globals[name] for name in code.co_names if name in module_globals})
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, Module):
        found[""] = owner
    return {name: value for name, value in found.items() if isinstance(value, (Module, Optimizer))}


def _filled(cell: Any) -> bool:
    """Whether a closure cell holds a value (a variable assigned after the function was defined may not yet)."""
    try:
        return cell.cell_contents is not None
    except ValueError:
        return False


def tensor_names(holders: Mapping[str, Module | Optimizer]) -> dict[int, str]:
    """id(tensor) -> its name: a module's state_dict names (prefixed with the holder's name), an optimizer's
    state as `<optimizer>.<parameter>.<key>`, and each parameter's gradient as `<parameter>.grad`."""
    names: dict[int, str] = {}
    for holder, value in holders.items():
        if isinstance(value, Module):
            for name, tensor in _module_tensors(value):
                names.setdefault(id(tensor), _join(holder, name))
    for holder, value in holders.items():
        if isinstance(value, Optimizer):
            for index, (param, state) in enumerate(value.state.items()):
                param_name = names.get(id(param), f"param{index}")
                for key, tensor in state.items():
                    if isinstance(tensor, Tensor):
                        names.setdefault(id(tensor), _join(holder, f"{param_name}.{key}"))
    return names


def _module_tensors(module: Module) -> Iterator[tuple[str, Tensor]]:
    yield from module.named_parameters()
    yield from module.named_buffers()


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def unique(names: list[str]) -> list[str]:
    """`names` with repeats made distinct by a `#n` suffix (as tg.save does)."""
    seen: set[str] = set()
    result = []
    for name in names:
        candidate, copy = name, 1
        while candidate in seen:
            candidate, copy = f"{name}#{copy}", copy + 1
        seen.add(candidate)
        result.append(candidate)
    return result
