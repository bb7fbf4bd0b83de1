"""Recurrent layers (RNN, GRU, LSTM), unrolled over the sequence: forward, reverse or bidirectional, with
ONNX's gate orders (GRU: z r h; LSTM: i o f c), activations, clip, peepholes and both layouts."""

from __future__ import annotations

from typing import Callable

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.onnx.lowering import OnnxNode, Value, ints, lowers, tensor

Activation = Callable[[Tensor], Tensor]
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def activation(name: str, alpha: float | None, beta: float | None) -> Activation:
    table: dict[str, Activation] = {
        "Tanh": tg.tanh, "Sigmoid": tg.sigmoid, "Relu": F.relu, "Softsign": F.softsign, "Softplus": F.softplus,
        "Affine": lambda x: tg.add(tg.mul(x, alpha), beta),
        "LeakyRelu": lambda x: tg.where(x >= 0, x, tg.mul(x, 0.01 if alpha is None else alpha)),
        "ThresholdedRelu": lambda x: tg.where(x > (1.0 if alpha is None else alpha), x, tg.zeros_like(x)),
        "ScaledTanh": lambda x: tg.mul(tg.tanh(tg.mul(x, beta)), alpha),
        "HardSigmoid": lambda x: tg.clamp(tg.add(tg.mul(x, 0.2 if alpha is None else alpha),
                                                 0.5 if beta is None else beta), 0.0, 1.0),
        "Elu": lambda x: tg.where(x > 0, x, tg.mul(tg.expm1(x), 1.0 if alpha is None else alpha)),
    }
    return table[name]


def _activations(node: OnnxNode, directions: int) -> list[list[Activation]]:
    names = node.attr("activations") or DEFAULTS[node.op_type] * directions
    alphas, betas = node.attr("activation_alpha") or [], node.attr("activation_beta") or []
    functions = [activation(n, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None)
                 for i, n in enumerate(names)]
    per = len(functions) // directions
    return [functions[d * per:(d + 1) * per] for d in range(directions)]


def _step(node: OnnxNode, fs: list[Activation], x: Tensor, h: Tensor, c: Tensor | None, w: Tensor, r: Tensor,
          wb: Tensor, rb: Tensor, peephole: Tensor | None) -> tuple[Tensor, Tensor | None]:
    clip = node.attr("clip")
    act = (lambda f: lambda v: f(tg.clamp(v, -clip, clip))) if clip is not None else (lambda f: f)
    xw = tg.add(tg.matmul(x, w.T), wb)
    if node.op_type == "RNN":
        return act(fs[0])(tg.add(xw, tg.add(tg.matmul(h, r.T), rb))), None
    if node.op_type == "GRU":
        size = h.shape[-1]
        xz, xr, xh = tg.split(xw, size, dim=-1)
        rz, rr, rh = tg.split(r, size, dim=0)
        bz, br, bh = tg.split(rb, size, dim=-1)
        z = act(fs[0])(tg.add(xz, tg.add(tg.matmul(h, rz.T), bz)))
        reset = act(fs[0])(tg.add(xr, tg.add(tg.matmul(h, rr.T), br)))
        if node.attr("linear_before_reset", 0):
            candidate = act(fs[1])(tg.add(xh, tg.mul(reset, tg.add(tg.matmul(h, rh.T), bh))))
        else:
            candidate = act(fs[1])(tg.add(xh, tg.add(tg.matmul(tg.mul(reset, h), rh.T), bh)))
        return tg.add(tg.mul(tg.sub(1.0, z), candidate), tg.mul(z, h)), None
    gates = tg.add(xw, tg.add(tg.matmul(h, r.T), rb))
    gi, go, gf, gc = tg.split(gates, h.shape[-1], dim=-1)
    pi, po, pf = tg.split(peephole, h.shape[-1]) if peephole is not None else (None, None, None)
    i = act(fs[0])(gi if pi is None else tg.add(gi, tg.mul(pi, c)))
    f = act(fs[0])(gf if pf is None else tg.add(gf, tg.mul(pf, c)))
    if node.attr("input_forget", 0):
        f = tg.sub(1.0, i)
    c = tg.add(tg.mul(f, c), tg.mul(i, act(fs[1])(gc)))
    o = act(fs[0])(go if po is None else tg.add(go, tg.mul(po, c)))
    return tg.mul(o, fs[2](c)), c


@lowers("RNN", "GRU", "LSTM")
def recurrent(node: OnnxNode, x: Value, w: Value, r: Value, b: Value | None = None, lengths: Value | None = None,
              initial_h: Value | None = None, initial_c: Value | None = None, peephole: Value | None = None) -> tuple:
    x, w, r = tensor(x), tensor(w), tensor(r)
    layout = node.attr("layout", 0)
    if layout:
        x = tg.transpose(x, 0, 1)
    steps, batch = x.shape[0], x.shape[1]
    if lengths is not None and any(n != steps for n in ints(lengths)):
        node.fail("sequence_lens shorter than the sequence are not supported")
    size = node.attr("hidden_size") or r.shape[-1]
    directions = w.shape[0]
    gates = GATES[node.op_type] * size
    b = tg.zeros((directions, 2 * gates), dtype=x.dtype) if b is None else tensor(b)
    zeros = tg.zeros((directions, batch, size), dtype=x.dtype)
    h0 = zeros if initial_h is None else tensor(initial_h)
    c0 = zeros if initial_c is None else tensor(initial_c)
    functions = _activations(node, directions)
    reverse = node.attr("direction", "forward") == "reverse"
    ys, hs, cs = [], [], []
    for d in range(directions):
        h, c = h0[d], c0[d] if node.op_type == "LSTM" else None
        p = tensor(peephole)[d] if peephole is not None else None
        order = range(steps - 1, -1, -1) if reverse or d == 1 else range(steps)
        outputs: dict[int, Tensor] = {}
        for t in order:
            h, c = _step(node, functions[d], x[t], h, c, w[d], r[d], b[d, :gates], b[d, gates:], p)
            outputs[t] = h
        ys.append(tg.stack([outputs[t] for t in range(steps)]))
        hs.append(h)
        cs.append(c)
    y = tg.stack(ys, dim=1)  # (steps, directions, batch, size)
    y_h = tg.stack(hs)
    y = tg.permute(y, (2, 0, 1, 3)) if layout else y
    y_h = tg.transpose(y_h, 0, 1) if layout else y_h
    if node.op_type != "LSTM":
        return y, y_h
    y_c = tg.stack(cs)
    return y, y_h, tg.transpose(y_c, 0, 1) if layout else y_c
