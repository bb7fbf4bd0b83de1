"""The `Optimizer` base: param groups, per-parameter state, and in-graph updates committed with `assign`.

A step is two halves. `step_updates()` builds, as lazy Tensor ops under `no_grad`, the new
value of every parameter and state tensor and returns `(target, new_value)` pairs: a pure
graph a compiled training step can capture. `commit()` evaluates all of them in one
realization and writes them back with `Tensor.assign`, keeping every target object (so
references held by modules, schedulers and compiled programs stay valid).

An eager `step()` builds that graph once per layout (which parameters have gradients, their
shapes and dtypes, the state's, the hyperparameters other than the learning rate) over
placeholders, and at later steps only runs it on the current arrays (`realize.cached_executable`):
the same graph and values, without rebuilding it per step. Where every group allows it, the
groups are stored flat (`optim.flat`) and the step's program updates each group as one vector.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable

import numpy as np

from tensorgraphs.dtypes import DType, float32
from tensorgraphs.frontend.grad_mode import enable_grad, no_grad
from tensorgraphs.frontend.tensor import Tensor, live_buffer, node_values
from tensorgraphs.graph.node import Node
from tensorgraphs.optim.flat import FlatGroup, fusable, hyperparameters
from tensorgraphs.runtime import tracing
from tensorgraphs.runtime.realize import cached_executable, owned, placeholder, realize

ParamGroup = dict[str, Any]
Update = tuple[Tensor, Tensor]
Entry = tuple[ParamGroup, Tensor, dict[str, Any]]
"""A parameter that gets updated: its group, itself, its state."""


def state_buffer(shape: tuple[int, ...], dtype: DType, fill: float = 0.0) -> Tensor:
    """Optimizer state starts as a buffer (not a constant), so the first step's graph has the same
    structure as every later one and a compiled step is built once."""
    return Tensor.from_numpy(np.full(shape, fill, dtype=dtype.storage), dtype)


def live_scalar(read: Callable[[], float]) -> Tensor:
    """A hyperparameter a scheduler changes (lr) as a 0-d input buffer, not a constant baked into the graph;
    a compiled step calls `read` for its value at every call (an exported step takes it as its input `lr`)."""

    def lr() -> np.ndarray:
        return np.asarray(read(), dtype=np.float32)

    return live_buffer(lr(), lr, float32)


def clear_grad(param: Tensor, set_to_none: bool = True) -> None:
    """Drop the gradient, or zero it in place (the same grad object, as torch's zero_grad(set_to_none=False))."""
    trace = tracing.active()
    if trace is not None:  # a compiled step clears it at every call, whether it is there when traced or not
        trace.note_grad(param, cleared=set_to_none)
    if param.grad is None:
        return
    if set_to_none:
        param.grad = None
    else:
        param.grad.zero_()


def commit(updates: list[Update]) -> None:
    """Evaluate every new value together, then write each into its target (fresh buffers, no history kept)."""
    if not updates:
        return
    if tracing.active() is not None:  # compiled: the new values stay graphs the program computes
        for target, value in updates:
            target.assign(value)
        return
    values = realize([value.node for _, value in updates])
    for (target, _), value in zip(updates, values):
        target.assign(Tensor.from_numpy(np.asarray(value), target.dtype))


class Optimizer:
    """Base class: subclasses give `defaults`, `init_state` and `update` (new values as Tensor ops)."""

    def __init__(self, params: Iterable[Tensor] | Iterable[ParamGroup], defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self.state: dict[Tensor, dict[str, Any]] = {}
        self._flat: dict[int, FlatGroup] = {}  # by id of the param group
        self.param_groups: list[ParamGroup] = []
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            "but got a Tensor")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        for group in groups if isinstance(groups[0], dict) else [{"params": groups}]:
            self.add_param_group(group)

    def add_param_group(self, param_group: ParamGroup) -> None:
        group = dict(param_group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, Tensor) else list(params)
        for param in group["params"]:
            if not isinstance(param, Tensor) or not param.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            group.setdefault(name, default)
        existing = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in existing for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                clear_grad(param, set_to_none)

    def init_state(self, param: Tensor, group: ParamGroup) -> dict[str, Any]:
        """The state a parameter starts with (before its first update)."""
        return {}

    def update(self, param: Tensor, grad: Tensor, state: dict[str, Any], group: ParamGroup) -> dict[str, Tensor]:
        """New values: key "param" for the parameter, other keys for state entries (created if absent).
        `group["lr"]` is a 0-d tensor here (see `live_scalar`)."""
        raise NotImplementedError

    def _entries(self) -> list[Entry]:
        """The parameters with a gradient, with their state (created on their first update)."""
        entries = []
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state.get(param)
                if state is None:
                    state = self.state[param] = self.init_state(param, group)
                entries.append((group, param, state))
        return entries

    def _new_values(self, entries: list[Entry], lrs: dict[int, Tensor]) -> list[list[tuple[str, Tensor]]]:
        """Per entry, `update`'s (key, new value) pairs; `lrs` holds each group's learning rate by group id."""
        new = []
        with no_grad():
            for group, param, state in entries:
                grad = -param.grad if group.get("maximize") else param.grad
                new.append(list(self.update(param, grad, state, {**group, "lr": lrs[id(group)]}).items()))
        return new

    def step_updates(self) -> list[Update]:
        """Every (target, new value) pair of one step, as lazy in-graph Tensor ops."""
        for flat in self._flat.values():
            flat.unflatten()
        self._flat.clear()
        entries = self._entries()
        lrs = {id(group): live_scalar(lambda group=group: group["lr"]) for group in self.param_groups}
        updates: list[Update] = []
        for (_, param, state), values in zip(entries, self._new_values(entries, lrs)):
            for key, value in values:
                target = param if key == "param" else _state_target(state, key, value.shape, value.dtype)
                updates.append((target, value))
        return updates

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        if tracing.active() is not None:
            commit(self.step_updates())
        else:
            self._replayed_step()
        return loss

    def _replayed_step(self) -> None:
        """`commit(self.step_updates())` with the step's graph built once per layout (module docstring)."""
        stepped = [group for group in self.param_groups if any(p.grad is not None for p in group["params"])]
        flats = [self._flat_group(group) for group in stepped] if all(map(fusable, stepped)) else [None]
        if None not in flats:
            self._flat_step(flats)  # type: ignore[arg-type]
            return
        entries = self._entries()
        if not entries:
            return
        tensors = [t for _, param, state in entries for t in (param, param.grad, *_tensors(state))]
        nodes = [t.node for t in tensors]  # read once: the layout and the values come from the same nodes
        run, outputs = cached_executable(("optimizer step", self._layout(entries, nodes)),
                                         lambda: self._step_graph(entries, tensors))
        arrays = [*node_values(nodes), *(np.asarray(group["lr"], np.float32) for group in self.param_groups)]
        for (index, key, dtype), value in zip(outputs, owned(run(arrays), arrays)):
            _, param, state = entries[index]
            target = param if key == "param" else _state_target(state, key, value.shape, dtype)
            target._hold(value)

    def _flat_group(self, group: ParamGroup) -> FlatGroup | None:
        """`group` stored flat: as the last step left it, or fused anew (None where its state does not allow it)."""
        flat = self._flat.get(id(group))
        if flat is None or flat.group is not group or not flat.intact(self.state):
            flat = FlatGroup.fuse(group, self.state, self.init_state)
            if flat is not None:
                self._flat[id(group)] = flat
        return flat

    def _flat_step(self, flats: list[FlatGroup]) -> None:
        """The step of groups stored flat: one program over a few arrays per group (`optim.flat`)."""
        run, outputs = cached_executable(("flat optimizer step", type(self), tuple(f.layout() for f in flats)),
                                         lambda: self._flat_graph(flats))
        arrays = [array for flat in flats for array in flat.arrays()]
        for (index, key), value in zip(outputs, owned(run(arrays), arrays)):
            flats[index].take(key, value)

    def _flat_graph(self, flats: list[FlatGroup]) -> tuple[list[Node], list[Node], list[tuple[int, str]]]:
        """The flat step's graph over placeholders (in `FlatGroup.arrays`' order): roots, inputs, and which
        (group, key) each root is the new value of."""
        entries: list[Entry] = []
        lrs: dict[int, Tensor] = {}
        inputs: list[Node] = []
        for flat in flats:
            size = flat.spans[-1][1]
            twin = Tensor(placeholder(flat.params[0].dtype, (size,)))
            twin.grad = Tensor(placeholder(twin.dtype, (size,)))
            bases = {k: Tensor(placeholder(b.dtype, b.shape)) for k, b in flat.bases.items()}
            lrs[id(flat.group)] = Tensor(placeholder(float32, ()))
            entries.append((flat.group, twin, {k: b[0] if k in flat.scalars else b for k, b in bases.items()}))
            inputs += [twin.node, twin.grad.node, *(b.node for b in bases.values()), lrs[id(flat.group)].node]
        outputs, roots = [], []
        for index, values in enumerate(self._new_values(entries, lrs)):
            flat = flats[index]
            for key, value in values:
                assert key == "param" or key in flat.bases, f"{type(self).__name__} made state {key!r}"
                if key in flat.scalars:  # equal for every parameter: one element each
                    value = value.reshape(1).expand(len(flat.params))
                outputs.append((index, key))
                roots.append(value.node)
        return roots, inputs, outputs

    def _layout(self, entries: list[Entry], nodes: list[Node]) -> Hashable:
        """What the step's graph over `nodes` (of each entry's parameter, gradient and state tensors) depends on
        besides the arrays' values (see the module docstring)."""
        groups = {id(group): index for index, group in enumerate(self.param_groups)}
        hyper = tuple(hyperparameters(group) for group in self.param_groups)
        per_param = tuple((groups[id(group)], tuple((k, None if isinstance(v, Tensor) else repr(v))
                                                    for k, v in state.items()))
                          for group, _, state in entries)
        return type(self), hyper, per_param, tuple((n.dtype, n.shape) for n in nodes)

    def _step_graph(self, entries: list[Entry],
                    tensors: list[Tensor]) -> tuple[list[Node], list[Node], list[tuple[int, str, DType]]]:
        """The step's graph over placeholders of `tensors` and the learning rates: its roots, its inputs, and
        which (entry, key) each root is the new value of, with its dtype."""
        stand_ins = iter([Tensor(placeholder(t.dtype, t.shape)) for t in tensors])
        mirrored: list[Entry] = []
        for group, _, state in entries:
            twin = next(stand_ins)
            twin.grad = next(stand_ins)
            tensor_keys = [k for k, v in state.items() if isinstance(v, Tensor)]
            mirrored.append((group, twin, {**state, **{k: next(stand_ins) for k in tensor_keys}}))
        lrs = {id(group): Tensor(placeholder(float32, ())) for group in self.param_groups}
        outputs, roots = [], []
        for index, values in enumerate(self._new_values(mirrored, lrs)):
            for key, value in values:
                outputs.append((index, key, value.dtype))
                roots.append(value.node)
        inputs = [t.node for _, twin, state in mirrored for t in (twin, twin.grad, *_tensors(state))]
        return roots, inputs + [lrs[id(group)].node for group in self.param_groups], outputs

    # -- state_dict ----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """torch's layout: parameters are numbered in group order; state is keyed by those numbers."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            numbers = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": numbers})
        state = {index[id(p)]: dict(s) for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        by_number: dict[int, Tensor] = {}
        for group, saved in zip(self.param_groups, saved_groups):
            if len(group["params"]) != len(saved["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                                 "optimizer's group")
            by_number.update(zip(saved["params"], group["params"]))
            group.update({k: v for k, v in saved.items() if k != "params"})
        self.state = {}
        for number, saved_state in state_dict["state"].items():
            param = by_number[int(number)]
            self.state[param] = {k: _fresh(v) for k, v in saved_state.items()}

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines.extend(f"    {key}: {group[key]}" for key in sorted(group) if key != "params")
        return "\n".join(lines + [")"])


def _tensors(state: dict[str, Any]) -> list[Tensor]:
    return [v for v in state.values() if isinstance(v, Tensor)]


def _state_target(state: dict[str, Any], key: str, shape: tuple[int, ...], dtype: DType) -> Tensor:
    """The state tensor `key` that gets a new value, created (zeros) when `update` first makes it."""
    target = state.get(key)
    if not isinstance(target, Tensor):
        target = state[key] = state_buffer(shape, dtype)
    return target


def _fresh(value: Any) -> Any:
    """Loaded state gets its own buffers, so later assigns never touch the caller's tensors."""
    if isinstance(value, Tensor):
        return Tensor.from_numpy(np.asarray(value.detach()._value()), value.dtype)
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        return Tensor.from_numpy(value.detach().numpy())
    return value
