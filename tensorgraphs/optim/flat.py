"""Flat storage for an eager optimizer step: a param group updated as one vector (torch's foreach/fused optimizers).

Every update rule is elementwise in the parameter, its gradient and its per-element state, with 0-d values (the
step count, the learning rate) broadcast; so a group whose parameters share a dtype and a step count can be
updated as one vector. Its per-element state is one flat tensor per key, its 0-d state (equal for every
parameter) one element per parameter, and each parameter's state entry becomes a view of it (`Tensor._base`):
the step's program takes a handful of arrays (the flat parameters, gradients and state) and returns as many, and
the state is replaced by one assignment per key. Parameters are leaves and keep buffers of their own, as
consecutive views of the program's flat output: a later step that finds them still holding those nodes passes
that array whole.

Nothing of this is visible as semantics: a state entry is a tensor with the values torch's would have (a view
sees its base's present value). State replaced, loaded or written is fused again from its present values; where
the layout breaks (a parameter without a gradient, step counts that differ, other dtypes) the step takes the
per-parameter path, which makes each state entry it updates a tensor of its own, and the next step that can fuses
the group again.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

import numpy as np

from tensorgraphs.dtypes import float32, float64
from tensorgraphs.frontend.tensor import Tensor, node_values, replay
from tensorgraphs.graph.node import Node
from tensorgraphs.graph.ops import Op
from tensorgraphs.runtime import tracing

ParamGroup = dict[str, Any]
FLAT_DTYPES = (float32, float64)
"""Parameter dtypes a group is fused for (float16 and bfloat16 parameters keep the per-parameter step)."""


def hyperparameters(group: ParamGroup) -> tuple:
    """What a group's update graph depends on besides its tensors and the learning rate (an input)."""
    return tuple((k, repr(v)) for k, v in sorted(group.items()) if k not in ("params", "lr"))


def fusable(group: ParamGroup) -> bool:
    """Whether the parameters of `group` could be one vector at this step: each has a gradient of its own dtype
    and shape, and all share one of `FLAT_DTYPES` (0-d parameters are left out: their state would look 0-d)."""
    params = group["params"]
    dtype = params[0].dtype if params else None
    return dtype in FLAT_DTYPES and all(
        p.dtype is dtype and p.ndim and (grad := p.grad) is not None and grad.dtype is dtype and grad.shape == p.shape
        for p in params)


def _become_view(tensor: Tensor, base: Tensor, steps: tuple) -> Tensor:
    """`tensor` made a view of `base` through `steps` (movement ops), as a view op's result is one: the same
    object, so whoever holds it (a state_dict taken before) goes on seeing the optimizer's updates."""
    node = base.node
    tensor._node, tensor._base, tensor._steps, tensor._seen = replay(steps, node), base, steps, node
    tracing.note_value_replaced()
    return tensor


class FlatGroup:
    """One param group stored flat: its state as one tensor per key (`bases`: the per-element state of every
    parameter end to end; a 0-d state, equal for all, one element per parameter, in `scalars`), each parameter's
    state entries views of them, and the flat array the parameters' buffers are views of after a fused step."""

    def __init__(self, group: ParamGroup, states: list[dict[str, Any]], bases: dict[str, Tensor],
                 scalars: frozenset[str]) -> None:
        self.group, self.params, self.states, self.bases = group, list(group["params"]), states, bases
        self.scalars = scalars
        self.spans = [(start, start + p.numel()) for p, start in
                      zip(self.params, np.cumsum([0] + [p.numel() for p in self.params]).tolist())]
        self.views = [{k: _become_view(state[k], b, self._steps(k, index)) for k, b in bases.items()}
                      for index, state in enumerate(states)]
        # a write into an entry (through its view) replaces its base's node: the group is fused again from the
        # entries' values, and 0-d entries no longer equal step on their own
        self.base_nodes = {k: b._node for k, b in bases.items()}
        self.nodes: list[Node] = []  # the parameters' nodes the last fused step gave them
        self.flat: np.ndarray | None = None  # the array those nodes' buffers are views of

    def _region(self, key: str, index: int) -> tuple[int, int, tuple[int, ...]]:
        """Where parameter `index`'s entry `key` lies in its base: (start, stop, the entry's shape)."""
        if key in self.scalars:
            return index, index + 1, ()
        start, stop = self.spans[index]
        return start, stop, self.params[index].shape

    def _steps(self, key: str, index: int) -> tuple:
        start, stop, shape = self._region(key, index)
        return (Op.SHRINK, ((start, stop),)), (Op.RESHAPE, shape)

    @staticmethod
    def fuse(group: ParamGroup, state: dict[Tensor, dict[str, Any]],
             init_state: Callable[[Tensor, ParamGroup], dict[str, Any]]) -> FlatGroup | None:
        """`group` (`fusable`) stored flat from its present state (created for parameters that have none yet,
        when none has); None where the states do not line up (other keys, dtypes, or step counts)."""
        params = group["params"]
        states = [state.get(p) for p in params]
        if all(s is None for s in states):
            states = [state.setdefault(p, init_state(p, group)) for p in params]
        if any(s is None for s in states):
            return None
        keys = list(states[0])
        if any(list(s) != keys or not all(isinstance(v, Tensor) for v in s.values()) for s in states):
            return None
        if len({id(v) for s in states for v in s.values()}) != len(keys) * len(states):
            return None  # one tensor in two places cannot be a view of both
        elementwise = [all(s[k].shape == p.shape for s, p in zip(states, params)) for k in keys]
        if any(not per_element and any(s[k].shape != () for s in states) for k, per_element in zip(keys, elementwise)):
            return None
        if any(len({s[k].dtype for s in states}) > 1 for k in keys):
            return None
        values = node_values([s[k].node for s in states for k in keys])
        bases = {}
        for i, (key, per_element) in enumerate(zip(keys, elementwise)):
            column = values[i::len(keys)]
            if not per_element and any(not np.array_equal(v, column[0]) for v in column):
                return None  # step counts that differ: each parameter steps on its own
            bases[key] = Tensor.from_numpy(np.concatenate([v.reshape(-1) for v in column]), states[0][key].dtype)
        return FlatGroup(group, states, bases, frozenset(k for k, e in zip(keys, elementwise) if not e))

    def intact(self, state: dict[Tensor, dict[str, Any]]) -> bool:
        """Whether the group still has these parameters and each its state of views of `bases` (an entry given a
        value of its own, by the per-parameter step or `Tensor.node`, is no view any more)."""
        params, bases = self.group["params"], self.bases
        return len(params) == len(self.params) and all(b._node is self.base_nodes[k] for k, b in bases.items()) and all(
            p is mine and state.get(p) is s and len(s) == len(views)
            and all(s.get(k) is v and v._base is bases[k] for k, v in views.items())
            for p, mine, s, views in zip(params, self.params, self.states, self.views))

    def layout(self) -> Hashable:
        """What the group's update graph depends on (besides the optimizer's type)."""
        return (hyperparameters(self.group), self.params[0].dtype, self.spans[-1][1],
                tuple((k, b.dtype, b.shape, k in self.scalars) for k, b in self.bases.items()))

    def arrays(self) -> list[np.ndarray]:
        """The update's inputs: the flat parameters, the flat gradients, each base's value, the learning rate."""
        params = self.params
        if self.flat is not None and all(p.node is n for p, n in zip(params, self.nodes)):
            flat = self.flat
        else:  # written since (in place, `.data`, load_state_dict): their present values
            flat = np.concatenate([a.reshape(-1) for a in node_values([p.node for p in params])])
        grads = np.concatenate([a.reshape(-1) for a in node_values([p.grad.node for p in params])])
        return [flat, grads, *node_values([b.node for b in self.bases.values()]),
                np.asarray(self.group["lr"], np.float32)]

    def unflatten(self) -> None:
        """Give each state entry still a view of `bases` a buffer of its own with its present value (a slice of its
        base's array): a graph of per-parameter updates (`step_updates`, a traced step) then reads and writes it in
        place, not through a write into the whole flat tensor per parameter."""
        bases = self.bases
        if tracing.traces_recording:  # nothing is computed while tracing: only bases that are arrays already
            if any(b._node.op is not Op.BUFFER for b in bases.values()):
                return
            values = [b._node.arg.data for b in bases.values()]
        else:
            values = node_values([b.node for b in bases.values()])
        arrays = dict(zip(bases, values))
        for index, views in enumerate(self.views):
            for key, view in views.items():
                if view._base is bases[key]:
                    start, stop, shape = self._region(key, index)
                    view._hold(arrays[key][start:stop].reshape(shape))

    def take(self, key: str, value: np.ndarray) -> None:
        """Hold the update's new value of `key` ("param": the parameters, as views of one flat array)."""
        if key != "param":
            self.bases[key]._hold(value)
            self.base_nodes[key] = self.bases[key]._node
            return
        for param, (start, stop) in zip(self.params, self.spans):
            param._hold(value[start:stop].reshape(param.shape))
        self.nodes = [p.node for p in self.params]
        self.flat = value

