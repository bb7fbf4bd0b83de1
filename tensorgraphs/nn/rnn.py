"""RNN, GRU and LSTM (and their cells), unrolled over time with Tensor ops.

Each mode is one step function from the input's gate pre-activations (x @ W_ih^T + b_ih,
computed for the whole sequence in one matmul) and the previous state to the next state;
the layers, the cells, both directions and the stacking all share it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Callable, Hashable, Sequence

from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.autocast import autocast_state
from tensorgraphs.frontend.creation import tensor, zeros
from tensorgraphs.frontend.grad_mode import enable_grad
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.graph.node import Node, rebuild, toposort
from tensorgraphs.nn import functional as F
from tensorgraphs.nn import init
from tensorgraphs.nn.linear import new_parameter
from tensorgraphs.nn.module import Module
from tensorgraphs.runtime import tracing
from tensorgraphs.runtime.realize import carry, placeholder

State = tuple[Tensor, ...]  # (h,) or, for LSTM, (h, c)
Weights = tuple[Tensor, Tensor | None]  # (W_hh, b_hh)


def _tanh_step(gates_x: Tensor, state: State, w_hh: Tensor, b_hh: Tensor | None) -> State:
    return (ew.tanh(ew.add(gates_x, F.linear(state[0], w_hh, b_hh))),)


def _relu_step(gates_x: Tensor, state: State, w_hh: Tensor, b_hh: Tensor | None) -> State:
    return (F.relu(ew.add(gates_x, F.linear(state[0], w_hh, b_hh))),)


def _gru_step(gates_x: Tensor, state: State, w_hh: Tensor, b_hh: Tensor | None) -> State:
    h = state[0]
    x_r, x_z, x_n = mv.chunk(gates_x, 3, -1)
    h_r, h_z, h_n = mv.chunk(F.linear(h, w_hh, b_hh), 3, -1)
    reset, update = ew.sigmoid(ew.add(x_r, h_r)), ew.sigmoid(ew.add(x_z, h_z))
    candidate = ew.tanh(ew.add(x_n, ew.mul(reset, h_n)))
    return (ew.add(candidate, ew.mul(update, ew.sub(h, candidate))),)  # (1 - z) * n + z * h


def _lstm_step(gates_x: Tensor, state: State, w_hh: Tensor, b_hh: Tensor | None) -> State:
    h, c = state
    i, f, g, o = mv.chunk(ew.add(gates_x, F.linear(h, w_hh, b_hh)), 4, -1)
    c = ew.add(ew.mul(ew.sigmoid(f), c), ew.mul(ew.sigmoid(i), ew.tanh(g)))
    return ew.mul(ew.sigmoid(o), ew.tanh(c)), c


Step = Callable[[Tensor, State, Tensor, Tensor | None], State]
# mode -> (gates per hidden unit, step, tensors in the state)
_MODES: dict[str, tuple[int, Step, int]] = {
    "RNN_TANH": (1, _tanh_step, 1), "RNN_RELU": (1, _relu_step, 1),
    "GRU": (3, _gru_step, 1), "LSTM": (4, _lstm_step, 2),
}


def _rnn_mode(nonlinearity: str) -> str:
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
    return f"RNN_{nonlinearity.upper()}"


UNROLLED_CACHE_SIZE = 64
_unrolled_graphs: OrderedDict[Hashable, tuple[list[Node], list[Node], list[Node]]] = OrderedDict()
"""Per structure: the placeholders, the results' nodes and the nodes between them in the order they are built."""


def _unrolled(key: Hashable, build: Callable[..., list[Tensor]], inputs: Sequence[Tensor | None]) -> list[Tensor]:
    """`build(*inputs)`, a pure function of its inputs' values: its graph is built once per `key` and the inputs'
    dtypes and shapes, over placeholders, and later only re-bound to the inputs' nodes. A recurrence unrolled over
    time is thousands of ops; building them with Tensor ops at every eager step cost more than running them. A
    trace (`tg.compile`) builds once anyway."""
    present = [t for t in inputs if t is not None]
    if tracing.traces_recording:
        return build(*inputs)
    key = (key, autocast_state(), tuple(t is None for t in inputs), tuple((t.dtype, t.shape) for t in present))
    if key not in _unrolled_graphs:
        stand_ins = iter([Tensor(placeholder(t.dtype, t.shape)).requires_grad_() for t in present])
        filled = [None if t is None else next(stand_ins) for t in inputs]
        with enable_grad():
            results = build(*filled)
        free, roots = [t.node for t in filled if t is not None], [r.node for r in results]
        _unrolled_graphs[key] = free, roots, toposort(roots, stop=set(free).__contains__)
        if len(_unrolled_graphs) > UNROLLED_CACHE_SIZE:
            _unrolled_graphs.popitem(last=False)
    _unrolled_graphs.move_to_end(key)
    free, roots, order = _unrolled_graphs[key]
    rebuilt = rebuild(order, dict(zip(free, (t.node_for_op() for t in present))))
    return [Tensor.result(rebuilt[root], *present) for root in roots]


def _carry(state: Sequence[Tensor]) -> None:
    """The state a layer returns is carried into its next call: the next realization computes it along, so the
    next call's graph starts from its value (`realize.carry`)."""
    for value in state:
        carry(value.node, value)


def _reset_uniform(module: Module, hidden_size: int) -> None:
    """torch's RNN default: every weight and bias uniform in +-1/sqrt(hidden_size)."""
    bound = 1.0 / math.sqrt(hidden_size) if hidden_size > 0 else 0
    for weight in module.parameters():
        init.uniform_(weight, -bound, bound)


def _recurrence(step: Step, reverse: bool, gates_x: Tensor, state: State, w_hh: Tensor, b_hh: Tensor | None,
                w_hr: Tensor | None) -> list[Tensor]:
    """`step` over the time steps of gates_x (L, N, G) (last to first if `reverse`), each new h projected by
    `w_hr` when given -> [outputs (L, N, H) in time order, *the final state]."""
    times = range(gates_x.shape[0])[::-1] if reverse else range(gates_x.shape[0])
    outputs = []
    for t in times:
        state = step(gates_x[t], state, w_hh, b_hh)
        if w_hr is not None:
            state = (F.linear(state[0], w_hr), *state[1:])
        outputs.append(state[0])
    return [mv.stack(outputs[::-1] if reverse else outputs), *state]


class RNNBase(Module):
    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if proj_size < 0 or (proj_size and (mode != "LSTM" or proj_size >= hidden_size)):
            raise ValueError("proj_size must be a positive integer smaller than hidden_size, and LSTM only")
        if not 0 <= dropout <= 1:
            raise ValueError("dropout should be a number in range [0, 1] representing the probability of an element "
                             "being zeroed")
        self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, float(dropout), bidirectional
        self.proj_size = proj_size
        gates = _MODES[mode][0] * hidden_size
        directions = 2 if bidirectional else 1
        output_size = proj_size or hidden_size  # h (and each layer's output) is projected down when proj_size > 0
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else output_size * directions
            for suffix in ("", "_reverse")[:directions]:
                setattr(self, f"weight_ih_l{layer}{suffix}", new_parameter(gates, layer_input, dtype=dtype))
                setattr(self, f"weight_hh_l{layer}{suffix}", new_parameter(gates, output_size, dtype=dtype))
                if bias:
                    setattr(self, f"bias_ih_l{layer}{suffix}", new_parameter(gates, dtype=dtype))
                    setattr(self, f"bias_hh_l{layer}{suffix}", new_parameter(gates, dtype=dtype))
                if proj_size:
                    setattr(self, f"weight_hr_l{layer}{suffix}", new_parameter(proj_size, hidden_size, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_uniform(self, self.hidden_size)

    def _weight(self, name: str, layer: int, suffix: str) -> Tensor | None:
        return getattr(self, f"{name}_l{layer}{suffix}", None)

    def _run_direction(self, sequence: Tensor, state: State, layer: int, suffix: str) -> tuple[Tensor, State]:
        """One layer, one direction over a (L, N, H_in) sequence -> outputs (L, N, H) and the final state."""
        w_ih, b_ih, w_hh, b_hh, w_hr = (self._weight(name, layer, suffix) for name in
                                        ("weight_ih", "bias_ih", "weight_hh", "bias_hh", "weight_hr"))
        gates_x = F.linear(sequence, w_ih, b_ih)
        step, reverse = _MODES[self.mode][1], bool(suffix)
        outputs, *final = _unrolled((step, reverse), lambda g, w, b, p, *s: _recurrence(step, reverse, g, s, w, b, p),
                                    (gates_x, w_hh, b_hh, w_hr, *state))
        return outputs, tuple(final)

    def forward(self, input: Tensor, hx: Tensor | tuple[Tensor, Tensor] | None = None) -> tuple[Any, Any]:
        unbatched = input.ndim == 2
        if unbatched:
            input = mv.unsqueeze(input, 1)
        elif self.batch_first:
            input = mv.transpose(input, 0, 1)
        directions = 2 if self.bidirectional else 1
        state_count = _MODES[self.mode][2]
        if hx is None:
            sizes = (self.proj_size or self.hidden_size, self.hidden_size)[:state_count]  # h, then c
            # data, not constants: the first call's graph is then the one later calls build from the state they
            # carry (`_carry`), and an eager loop compiles one program rather than two
            states = [tensor(zeros(self.num_layers * directions, input.shape[1], size, dtype=input.dtype))
                      for size in sizes]
        else:
            states = list(hx) if isinstance(hx, (tuple, list)) else [hx]
            states = [mv.unsqueeze(s, 1) for s in states] if unbatched else states
        finals: list[State] = []
        sequence = input
        for layer in range(self.num_layers):
            outputs = []
            for d, suffix in enumerate(("", "_reverse")[:directions]):
                index = layer * directions + d
                out, final = self._run_direction(sequence, tuple(s[index] for s in states), layer, suffix)
                outputs.append(out)
                finals.append(final)
            sequence = outputs[0] if directions == 1 else mv.cat(outputs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                sequence = F.dropout(sequence, self.dropout, True)
        final_states = [mv.stack([f[i] for f in finals]) for i in range(state_count)]
        if unbatched:
            sequence, final_states = mv.squeeze(sequence, 1), [mv.squeeze(s, 1) for s in final_states]
        elif self.batch_first:
            sequence = mv.transpose(sequence, 0, 1)
        _carry(final_states)
        return sequence, (tuple(final_states) if state_count == 2 else final_states[0])

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False),
                              ("proj_size", 0)):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)}"
        return text


class RNN(RNNBase):
    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device: Any = None, dtype: Any = None) -> None:
        self.nonlinearity = nonlinearity
        super().__init__(_rnn_mode(nonlinearity), input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, dtype=dtype)


class GRU(RNNBase):
    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         dtype=dtype)


class LSTM(RNNBase):
    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, dtype=dtype)


class RNNCellBase(Module):
    def __init__(self, mode: str, input_size: int, hidden_size: int, bias: bool = True, dtype: Any = None) -> None:
        super().__init__()
        self.mode, self.input_size, self.hidden_size, self.bias = mode, input_size, hidden_size, bias
        gates = _MODES[mode][0] * hidden_size
        self.weight_ih = new_parameter(gates, input_size, dtype=dtype)
        self.weight_hh = new_parameter(gates, hidden_size, dtype=dtype)
        self.bias_ih = new_parameter(gates, dtype=dtype) if bias else None
        self.bias_hh = new_parameter(gates, dtype=dtype) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_uniform(self, self.hidden_size)

    def forward(self, input: Tensor, hx: Tensor | tuple[Tensor, Tensor] | None = None) -> Any:
        unbatched = input.ndim == 1
        if unbatched:
            input = mv.unsqueeze(input, 0)
        state_count = _MODES[self.mode][2]
        if hx is None:
            state = (zeros(input.shape[0], self.hidden_size, dtype=input.dtype),) * state_count
        else:
            state = tuple(hx) if isinstance(hx, (tuple, list)) else (hx,)
            state = tuple(mv.unsqueeze(s, 0) for s in state) if unbatched else state
        step = _MODES[self.mode][1]
        state = step(F.linear(input, self.weight_ih, self.bias_ih), state, self.weight_hh, self.bias_hh)
        if unbatched:
            state = tuple(mv.squeeze(s, 0) for s in state)
        _carry(state)
        return state if state_count == 2 else state[0]

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device: Any = None, dtype: Any = None) -> None:
        self.nonlinearity = nonlinearity
        super().__init__(_rnn_mode(nonlinearity), input_size, hidden_size, bias, dtype)


class GRUCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__("GRU", input_size, hidden_size, bias, dtype)


class LSTMCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__("LSTM", input_size, hidden_size, bias, dtype)
