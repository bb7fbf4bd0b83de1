"""Sequential, ModuleList and ModuleDict: modules that hold modules."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Iterator, Mapping

from tensorgraphs.nn.module import Module, indent_lines


def _index(op: str, index: int, length: int) -> int:
    if not -length <= index < length:
        raise IndexError(f"{op}: index {index} is out of range")
    return index % length


class Sequential(Module):
    """Calls its modules in order; built from modules or from one OrderedDict of named modules."""

    def __init__(self, *args: Module | Mapping[str, Module]) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], Mapping):
            for name, module in args[0].items():
                self.add_module(name, module)
        else:
            for i, module in enumerate(args):
                self.add_module(str(i), module)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return Sequential(OrderedDict(list(self._modules.items())[index]))
        return list(self._modules.values())[_index("Sequential", index, len(self))]

    def __setitem__(self, index: int, module: Module) -> None:
        key = list(self._modules)[_index("Sequential", index, len(self))]
        self.add_module(key, module)

    def __delitem__(self, index: int | slice) -> None:
        keys = list(self._modules)
        for key in keys[index] if isinstance(index, slice) else [keys[_index("Sequential", index, len(self))]]:
            del self._modules[key]
        self._modules = OrderedDict((str(i), m) for i, m in enumerate(self._modules.values()))  # torch renumbers

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self

    def forward(self, input: Any) -> Any:
        for module in self:
            input = module(input)
        return input


class ModuleList(Module):
    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return ModuleList(list(self._modules.values())[index])
        return self._modules[str(_index("ModuleList", index, len(self)))]

    def __setitem__(self, index: int, module: Module) -> None:
        self.add_module(str(_index("ModuleList", index, len(self))), module)

    def __delitem__(self, index: int | slice) -> None:
        modules = list(self._modules.values())
        del modules[index]
        self._modules = OrderedDict((str(i), m) for i, m in enumerate(modules))

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for module in modules:
            self.append(module)
        return self

    def __repr__(self) -> str:
        """Runs of identical modules print once, as torch: `(0-11): 12 x TransformerEncoderLayer(...)`."""
        if not len(self):
            return "ModuleList()"
        runs: list[list[Any]] = []  # [first index, last index, repr]
        for i, text in enumerate(repr(m) for m in self):
            if runs and runs[-1][2] == text:
                runs[-1][1] = i
            else:
                runs.append([i, i, text])
        lines = [f"({a}): {text}" if a == b else f"({a}-{b}): {b - a + 1} x {text}" for a, b, text in runs]
        return "ModuleList(\n  " + "\n  ".join(indent_lines(line) for line in lines) + "\n)"

    def insert(self, index: int, module: Module) -> None:
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._modules = OrderedDict()
        self.extend(modules)


class ModuleDict(Module):
    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def keys(self) -> Iterable[str]:
        return self._modules.keys()

    def items(self) -> Iterable[tuple[str, Module]]:
        return self._modules.items()

    def values(self) -> Iterable[Module]:
        return self._modules.values()

    def pop(self, key: str) -> Module:
        return self._modules.pop(key)

    def clear(self) -> None:
        self._modules.clear()

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        for key, module in (modules.items() if isinstance(modules, Mapping) else modules):
            self.add_module(key, module)
