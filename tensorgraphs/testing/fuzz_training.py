"""Small random training runs: a few optimizer steps of an MLP must end where the `numpy` device ends.

A case is data: layer widths, activation, loss, optimizer (every optimizer of `tg.optim`, with some of its
options), the initial weights and the batches. Its source is a function `train(compiled, ...)` that makes
the parameters, runs the steps (under `tg.compile` when `compiled`, the step capturing parameters and
optimizer state as the README shows) and returns the losses and the final parameters. It runs on the
`numpy` device (the oracle), on the `cpu` device compiling every graph, and compiled; every result is a
CLOSE comparison (`fuzz_core`) at a tolerance `STEP_GROWTH` times looser than a program's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import numpy as np

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.optim import Optimizer
from tensorgraphs.testing import fuzz_known_bugs
from tensorgraphs.testing.fuzz_core import (
    CLOSE,
    RTOL,
    Failure,
    Input,
    compiling_everything,
    differs,
    largest_finite,
    last_line,
    shrink,
)

MODES = ("cpu", "compile")
OPTIMIZERS = tuple(sorted(name for name, value in vars(tg.optim).items()
                          if isinstance(value, type) and issubclass(value, Optimizer) and value is not Optimizer))
OPTIONS = {
    "SGD": ("", "momentum=0.9", "momentum=0.9, nesterov=True", "momentum=0.5, dampening=0.5, weight_decay=0.01"),
    "Adam": ("", "amsgrad=True", "weight_decay=0.01", "maximize=True"),
    "AdamW": ("", "amsgrad=True"),
    "RMSprop": ("", "momentum=0.5", "centered=True", "weight_decay=0.01"),
    "Adagrad": ("", "lr_decay=0.01", "weight_decay=0.01"),
}
"""Options drawn per optimizer beside the learning rate (an optimizer not listed runs with its defaults)."""
LEARNING_RATE = {"SGD": 0.1, "Adagrad": 0.1}
ACTIVATIONS = ("tanh()", "sigmoid()", "F.gelu(h)", "F.silu(h)")
STEP_GROWTH = 10


@dataclass(frozen=True)
class TrainingCase:
    widths: tuple[int, ...]
    activation: str
    loss: str  # "mse_loss" or "cross_entropy"
    optimizer: str  # e.g. "Adam(params, lr=0.01, amsgrad=True)"
    steps: int
    batch: int
    dtype: str
    arguments: tuple[Input, ...]  # x (steps, batch, in), y, then weight and bias per layer
    seed: int | None = None

    def source(self) -> str:
        names = [a.name for a in self.arguments]
        layers = []
        for i in range(len(self.widths) - 1):
            affine = f"h @ params[{2 * i}] + params[{2 * i + 1}]"
            last = i == len(self.widths) - 2
            layers.append(f"        h = {affine}" if last else f"        h = {self._activated(affine)}")
        return "\n".join([
            f"def train(compiled, {', '.join(names)}):",
            f"    params = [p.detach().clone().requires_grad_() for p in ({', '.join(names[2:])},)]",
            f"    optimizer = tg.optim.{self.optimizer}",
            "",
            "    def step(x, y):",
            "        optimizer.zero_grad()",
            "        h = x",
            *layers,
            f"        loss = F.{self.loss}(h, y)",
            "        loss.backward()",
            "        optimizer.step()",
            "        return loss.detach()",
            "",
            "    step = tg.compile(step) if compiled else step",
            f"    losses = [step(x[i], y[i]) for i in range({self.steps})]",
            "    return losses + [p.detach() for p in params]",
        ])

    def _activated(self, affine: str) -> str:
        return self.activation.replace("(h)", f"({affine})") if "(h)" in self.activation \
            else f"({affine}).{self.activation}"

    def function(self) -> Callable[..., list[tg.Tensor]]:
        namespace: dict[str, Any] = {"tg": tg, "F": F}
        exec(compile(self.source(), f"<fuzz training {self.seed}>", "exec"), namespace)  # noqa: S102
        return namespace["train"]

    def reproducer(self) -> str:
        names = ", ".join(a.name for a in self.arguments)
        return "\n".join([
            "import numpy as np",
            "import tensorgraphs as tg",
            "import tensorgraphs.nn.functional as F",
            "from tensorgraphs.backends.cpu import CPU",
            "",
            self.source(),
            "",
            *(a.source() for a in self.arguments),
            "with tg.device('numpy'):",
            f"    print('numpy   ', [t.numpy() for t in train(False, {names})])",
            "CPU.interpret_below = 0  # compile every graph, however small",
            "with tg.device('cpu'):",
            f"    print('cpu     ', [t.numpy() for t in train(False, {names})])",
            f"print('compile ', [t.numpy() for t in train(True, {names})])",
        ])


def random_case(seed: int) -> TrainingCase:
    rng = np.random.default_rng([seed, 1])
    name = OPTIMIZERS[seed % len(OPTIMIZERS)]
    options = OPTIONS.get(name, ("",))
    extra = options[int(rng.integers(len(options)))]
    optimizer = f"{name}(params, lr={LEARNING_RATE.get(name, 0.01)}{', ' + extra if extra else ''})"
    widths = tuple(int(w) for w in rng.integers(1, 9, int(rng.integers(2, 5))))
    loss = "cross_entropy" if rng.random() < 0.5 and widths[-1] > 1 else "mse_loss"
    batch, steps = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    dtype = "float64" if rng.random() < 0.25 else "float32"
    storage = np.dtype(dtype)
    x = Input("x", dtype, rng.standard_normal((steps, batch, widths[0])).astype(storage))
    if loss == "cross_entropy":
        y = Input("y", "int64", rng.integers(0, widths[-1], (steps, batch)))
    else:
        y = Input("y", dtype, rng.standard_normal((steps, batch, widths[-1])).astype(storage))
    weights = []
    for i, (n, m) in enumerate(zip(widths[:-1], widths[1:])):
        weights += [Input(f"w{i}", dtype, (rng.standard_normal((n, m)) / np.sqrt(n)).astype(storage)),
                    Input(f"b{i}", dtype, (0.1 * rng.standard_normal(m)).astype(storage))]
    case = TrainingCase(widths, str(rng.choice(ACTIVATIONS)), loss, optimizer, steps, batch, dtype,
                        (x, y, *weights), seed)
    return case


def _batch(case: TrainingCase, batch: int, rng: np.random.Generator) -> TrainingCase:
    """The case with batches of `batch` examples (taken from, or grown with, random data)."""
    x, y = case.arguments[:2]
    grown_x = np.concatenate([x.values, rng.standard_normal(x.values.shape).astype(x.values.dtype)], axis=1)
    grown_y = np.concatenate([y.values, y.values], axis=1)
    return replace(case, batch=batch, arguments=(replace(x, values=grown_x[:, :batch]),
                                                 replace(y, values=grown_y[:, :batch]), *case.arguments[2:]))


def run(case: TrainingCase, mode: str) -> list[np.ndarray]:
    """The losses and final parameters of training on the `numpy` device, the compiling cpu device, or
    under `tg.compile` ("compile")."""
    train = case.function()
    args = [a.tensor() for a in case.arguments]
    if mode == "compile":
        results = train(True, *args)
        with tg.device("numpy"):
            return [t.numpy() for t in results]
    with compiling_everything() if mode == "cpu" else contextlib.nullcontext(), tg.device(mode):
        return [t.numpy() for t in train(False, *args)]


def check(case: TrainingCase, modes: tuple[str, ...] = MODES) -> Failure | None:
    """None when the compiled paths train as the oracle does, else the first failure."""
    try:
        expected = run(case, "numpy")
    except Exception as error:  # noqa: BLE001 - the oracle's own failure is a finding too
        return Failure("numpy", type(error).__name__, last_line(error))
    rtol = RTOL[case.dtype] * STEP_GROWTH
    # The losses share one scale; each parameter has its own (a large loss must not hide a wrong update).
    scales = [largest_finite(expected[:case.steps])] * case.steps + [largest_finite([e]) for e in expected[case.steps:]]
    for mode in modes:
        if fuzz_known_bugs.skipped_training(case, mode):
            continue
        try:
            got = run(case, mode)
        except Exception as error:  # noqa: BLE001 - any crash of a compiled path is a finding
            return Failure(mode, type(error).__name__, last_line(error))
        for i, (e, g, scale) in enumerate(zip(expected, got, scales)):
            reason = differs(e, g, CLOSE, False, scale, rtol)
            if reason is not None:
                what = f"loss of step {i}" if i < case.steps else f"parameter {case.arguments[i - case.steps + 2].name}"
                return Failure(mode, "mismatch", f"{what}: {reason}")
    return None


def _candidates(case: TrainingCase) -> Iterator[TrainingCase]:
    """Smaller cases: fewer steps, smaller batches, no optimizer options, no activation."""
    x, y = case.arguments[:2]
    if case.steps > 1:
        yield replace(case, steps=case.steps - 1, arguments=(replace(x, values=x.values[:-1]),
                                                             replace(y, values=y.values[:-1]), *case.arguments[2:]))
    if case.batch > 1:
        yield replace(case, batch=case.batch - 1, arguments=(replace(x, values=x.values[:, :-1]),
                                                             replace(y, values=y.values[:, :-1]),
                                                             *case.arguments[2:]))
    if "," in case.optimizer.split("lr=")[1]:
        yield replace(case, optimizer=case.optimizer.split("lr=")[0] + "lr=" +
                      case.optimizer.split("lr=")[1].split(",")[0] + ")")


def _size(case: TrainingCase) -> tuple[int, ...]:
    return case.steps, case.batch, len(case.optimizer)


def shrink_case(case: TrainingCase, failure: Failure) -> tuple[TrainingCase, Failure]:
    return shrink(case, failure, _candidates, _size, lambda c, mode: check(c, (mode,) if mode != "numpy" else ()))
