"""`Module`: the base class of layers, with PyTorch's registration, traversal and state_dict rules."""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError
from tensorgraphs.frontend.grad_mode import no_grad
from tensorgraphs.frontend.placement import to_arguments
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.nn.parameter import Parameter
from tensorgraphs.runtime import tracing


class IncompatibleKeys(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]


def indent_lines(text: str, spaces: int = 2) -> str:
    lines = text.split("\n")
    return "\n".join([lines[0]] + [" " * spaces + line for line in lines[1:]])


class Module:
    """Base class for layers: assigning a Parameter, Module or registered buffer to an attribute registers it."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "_modules", OrderedDict())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        trace = tracing.active()
        if trace is not None:  # a compiled function is specialized to the train/eval mode it was traced in
            trace.modes.setdefault(id(self), (self, self.training))
        return self.forward(*args, **kwargs)

    # -- registration --------------------------------------------------------
    def _registries(self) -> tuple[dict, dict, dict]:
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign to a Module before Module.__init__() call")
        return self._parameters, self._buffers, self._modules

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(tg.nn.Parameter or None required)")
        self._registries()
        self._forget(name)
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(Tensor or None required)")
        self._registries()
        self._forget(name)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent_buffers.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._registries()
        self._forget(name)
        self._modules[name] = module

    register_module = add_module

    def _forget(self, name: str) -> None:
        for registry in self._registries():
            registry.pop(name, None)
        self._non_persistent_buffers.discard(name)
        self.__dict__.pop(name, None)

    def __setattr__(self, name: str, value: Any) -> None:
        params = self.__dict__.get("_parameters")
        buffers = self.__dict__.get("_buffers")
        modules = self.__dict__.get("_modules")
        if isinstance(value, Parameter):
            self.register_parameter(name, value)
        elif params is not None and name in params:
            self.register_parameter(name, value)  # None allowed, anything else is a TypeError
        elif isinstance(value, Module):
            self.add_module(name, value)
        elif modules is not None and name in modules:
            self.add_module(name, value)
        elif buffers is not None and name in buffers:
            persistent = name not in self._non_persistent_buffers
            self.register_buffer(name, value, persistent)
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        for registry in ("_parameters", "_buffers", "_modules"):
            found = self.__dict__.get(registry)
            if found is not None and name in found:
                return found[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        if any(name in registry for registry in self._registries()):
            self._forget(name)
        else:
            object.__delattr__(self, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {k for r in self._registries() for k in r})

    # -- traversal -----------------------------------------------------------
    def named_modules(self, memo: set[int] | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        memo = set() if memo is None else memo
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is not None:
                yield from module.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def named_children(self) -> Iterator[tuple[str, Module]]:
        seen: set[int] = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self) -> Iterator[Module]:
        for _, module in self.named_children():
            yield module

    def _named_members(self, registry: str, prefix: str, recurse: bool,
                       remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        owners = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for owner_prefix, owner in owners:
            for name, value in getattr(owner, registry).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield (f"{owner_prefix}.{name}" if owner_prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        yield from self._named_members("_parameters", prefix, recurse, remove_duplicate)  # type: ignore[misc]

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        yield from self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, buffer in self.named_buffers(recurse=recurse):
            yield buffer

    def get_submodule(self, target: str) -> Module:
        module = self
        for part in filter(None, target.split(".")):
            if part not in module._modules:
                raise AttributeError(f"{type(module).__name__} has no attribute `{part}`")
            module = module._modules[part]
        return module

    def get_parameter(self, target: str) -> Parameter:
        owner, _, name = target.rpartition(".")
        module = self.get_submodule(owner)
        if name not in module._parameters:
            raise AttributeError(f"{type(module).__name__} has no parameter `{name}`")
        return module._parameters[name]

    # -- modes and bulk changes ----------------------------------------------
    def train(self, mode: bool = True) -> Module:
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def apply(self, fn: Callable[[Module], None]) -> Module:
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for param in self.parameters():
            param.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        from tensorgraphs.optim.optimizer import clear_grad

        for param in self.parameters():
            clear_grad(param, set_to_none)

    def _apply_to_tensors(self, fn: Callable[[Tensor], Tensor]) -> Module:
        """Replace every parameter and buffer by fn(it). Parameters become new Parameter objects (create
        optimizers afterwards); one shared by several modules stays shared."""
        replaced: dict[int, Tensor] = {}
        for module in self.modules():
            for registry, convert in ((module._parameters, lambda p: Parameter(fn(p.detach()), p.requires_grad)),
                                      (module._buffers, fn)):
                for name, tensor in registry.items():
                    if tensor is not None:
                        if id(tensor) not in replaced:
                            replaced[id(tensor)] = convert(tensor)
                        registry[name] = replaced[id(tensor)]
        return self

    def to(self, *args: Any, **kwargs: Any) -> Module:
        """Module.to(dtype) casts floating point parameters and buffers; devices are checked (tensors are computed
        on the current device, see tg.device)."""
        target = to_arguments("Module.to", args, kwargs)
        if target is None:
            return self
        return self._apply_to_tensors(lambda t: t.to(target) if t.is_floating_point() else t)

    def float(self) -> Module:
        return self.to(dtypes.float32)

    def double(self) -> Module:
        return self.to(dtypes.float64)

    def half(self) -> Module:
        return self.to(dtypes.float16)

    def bfloat16(self) -> Module:
        return self.to(dtypes.bfloat16)

    def cpu(self) -> Module:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Module:
        """Parameters get fresh buffers; buffers share their (immutable) nodes until assigned."""
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for buffer in self.buffers():
            memo.setdefault(id(buffer), Tensor(buffer.node))
        for key, value in self.__dict__.items():
            object.__setattr__(clone, key, copy.deepcopy(value, memo))
        return clone

    # -- state_dict ----------------------------------------------------------
    def state_dict(self, destination: dict[str, Tensor] | None = None, prefix: str = "",
                   keep_vars: bool = False) -> dict[str, Tensor]:
        """Parameters and persistent buffers by dotted name. As in torch the values alias them (parameters as
        detached views unless keep_vars): `state_dict()[k].copy_(w)` under no_grad() loads a weight."""
        destination = OrderedDict() if destination is None else destination
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buffer in self._buffers.items():
            if buffer is not None and name not in self._non_persistent_buffers:
                destination[prefix + name] = buffer
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination, prefix + name + ".", keep_vars)
        return destination

    def _local_state(self) -> dict[str, Tensor]:
        state = {k: v for k, v in self._parameters.items() if v is not None}
        state.update((k, v) for k, v in self._buffers.items()
                     if v is not None and k not in self._non_persistent_buffers)
        return state

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True,
                        assign: bool = False) -> IncompatibleKeys:
        """Copy values (tg tensors, numpy arrays, torch tensors) into parameters and buffers, cast to their dtypes.

        Values are always copied (objects and requires_grad are kept); `assign` is accepted for torch's signature.
        """
        expected: dict[str, Tensor] = {}
        for prefix, module in self.named_modules(remove_duplicate=False):
            for name, target in module._local_state().items():
                expected[f"{prefix}.{name}" if prefix else name] = target
        missing = [k for k in expected if k not in state_dict]
        unexpected = [k for k in state_dict if k not in expected]
        errors = []
        values = {}
        for key, target in expected.items():
            if key not in state_dict:
                continue
            value = _as_array(state_dict[key])
            if tuple(value.shape) != target.shape:
                errors.append(f"size mismatch for {key}: copying a param with shape {tuple(value.shape)} from "
                              f"checkpoint, the shape in current model is {target.shape}.")
            values[key] = value
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". ")
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". ")
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(errors))
        with no_grad():
            for key, value in values.items():
                target = expected[key]
                target.assign(Tensor.from_numpy(value, target.dtype))
        return IncompatibleKeys(missing, unexpected)

    # -- printing ------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [line for line in self.extra_repr().split("\n") if line]
        lines += [f"({name}): {indent_lines(repr(module))}" for name, module in self._modules.items()]
        if not lines:
            return f"{type(self).__name__}()"
        if len(lines) == 1 and not self._modules:
            return f"{type(self).__name__}({lines[0]})"
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"


def bind_arguments(owner: str, defaults: dict[str, Any], args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments by torch's positional order and names, with their defaults."""
    if len(args) > len(defaults):
        raise TypeError(f"{owner} takes at most {len(defaults)} arguments, got {len(args)}")
    values = dict(defaults)
    values.update(zip(defaults, args))
    for key, value in kwargs.items():
        if key not in defaults:
            raise TypeError(f"{owner} got an unexpected keyword argument '{key}'")
        values[key] = value
    return values


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        return np.asarray(value.detach()._value())
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor, without importing torch
        value = value.detach()
        if str(getattr(value, "dtype", "")) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    array = np.asarray(value)
    if array.dtype == object:
        raise ArgumentError(f"cannot load a {type(value).__name__} into a tensor")
    return array
