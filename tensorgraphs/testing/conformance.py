"""Checking ops against PyTorch: the `OpInfo` record and `check_op`.

Each record names the op, its tensorgraphs and torch callables, a sample-input
generator, the dtypes it is checked in, whether it is differentiable, tolerances
per dtype and known skips (with the reason). `check_op` runs every sample on a
device and compares values, dtypes and shapes with torch, and for
differentiable ops the gradients of every float input (tg.grad against
torch.autograd.grad). The table of every op is `tensorgraphs.testing.opinfo.OP_INFOS`.

torch is imported only when a check runs: this module is also imported by the
`tg ops` command, which must work without torch installed.
"""

from __future__ import annotations

import importlib
import math
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from tensorgraphs.testing.samples import ALL_DTYPES, Library, Sample, TensorArg, build

SampleFn = Callable[[str, np.random.Generator, bool], Iterable[Sample]]
"""(dtype, rng, for_grad) -> samples; for_grad asks for inputs away from kinks, NaN and Inf."""

DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {  # dtype -> (rtol, atol)
    "float64": (1e-7, 1e-9),
    "float32": (1e-5, 1e-6),
    "float16": (4e-3, 1e-3),
    "bfloat16": (3e-2, 1e-2),
}
GRAD_DTYPES = ("float32", "float64")


class LazyModule:
    """A module imported on first attribute access (keeps torch out of `import tensorgraphs`)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


torch = LazyModule("torch")


@dataclass(frozen=True)
class Skip:
    """A known difference from torch that is not checked, and why. Empty filters match everything."""

    reason: str
    dtypes: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    grad_only: bool = False

    def matches(self, dtype: str, device: str, grad: bool) -> bool:
        return (
            (not self.dtypes or dtype in self.dtypes)
            and (not self.devices or device in self.devices)
            and (grad or not self.grad_only)
        )


@dataclass(frozen=True)
class OpInfo:
    """Everything the conformance checks need to know about one op."""

    name: str
    op: Callable[..., Any]  # tensorgraphs
    ref: Callable[..., Any]  # torch
    sample_inputs: SampleFn
    dtypes: tuple[str, ...] = ALL_DTYPES
    differentiable: bool = True
    tolerances: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # values and gradients
    skips: tuple[Skip, ...] = ()
    compare_values: bool = True  # False: only dtype and shape are compared (random numbers, empty)

    def tolerance(self, dtype: str) -> tuple[float, float]:
        """(rtol, atol) for results of `dtype`; integers and bools compare exactly."""
        return self.tolerances.get(dtype, DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0)))

    def skip_reason(self, dtype: str, device: str, grad: bool = False) -> str | None:
        return next((s.reason for s in self.skips if s.matches(dtype, device, grad)), None)

    def seed(self, dtype: str) -> int:
        return zlib.crc32(f"{self.name}/{dtype}".encode())


# ---------------------------------------------------------------------------
# libraries
# ---------------------------------------------------------------------------


def _tg_library() -> Library:
    import tensorgraphs as tg

    return Library(tg, lambda data, dtype, grad: tg.tensor(data, dtype=getattr(tg, dtype), requires_grad=grad))


def _torch_library() -> Library:
    import torch as real_torch

    def from_numpy(data: np.ndarray, dtype: str, grad: bool) -> Any:
        return real_torch.from_numpy(data.copy()).to(getattr(real_torch, dtype)).requires_grad_(grad)

    return Library(real_torch, from_numpy)


def _outputs(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _torch_to_numpy(t: Any) -> tuple[str, tuple[int, ...], np.ndarray]:
    import torch as real_torch

    data = t.detach()
    if data.dtype is real_torch.bfloat16:
        data = data.float()  # numpy has no bfloat16
    return str(t.dtype).removeprefix("torch."), tuple(t.shape), data.numpy()


def _tg_to_numpy(t: Any) -> tuple[str, tuple[int, ...], np.ndarray]:
    return t.dtype.name, tuple(t.shape), t.detach().numpy()


def _compare(
    actual: tuple[str, tuple[int, ...], np.ndarray],
    expected: tuple[str, tuple[int, ...], np.ndarray],
    tolerance: tuple[float, float],
    values: bool = True,
) -> str | None:
    """None when equal within tolerance, else what differs."""
    (a_dtype, a_shape, a), (e_dtype, e_shape, e) = actual, expected
    if a_dtype != e_dtype:
        return f"dtype {a_dtype}, torch gives {e_dtype}"
    if a_shape != e_shape:
        return f"shape {a_shape}, torch gives {e_shape}"
    if not values:
        return None
    if a.dtype.kind == "f" or e.dtype.kind == "f":
        a64, e64 = a.astype(np.float64), e.astype(np.float64)
        rtol, atol = tolerance
        with np.errstate(invalid="ignore"):
            close = np.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True) | (a64 == e64)
    else:
        close = a == e
    if close.all():
        return None
    where = np.argwhere(~close)
    first = tuple(int(i) for i in where[0])
    return (
        f"{len(where)} of {a.size} values differ, e.g. at {first}: {a[first]!r} vs torch {e[first]!r} "
        f"(rtol, atol = {tolerance})"
    )


# ---------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------


def _run(fn: Callable[..., Any], sample: Sample, lib: Library, requires_grad: bool) -> tuple[Any, list[Any]]:
    leaves: list[Any] = []
    args = build(sample.args, lib, requires_grad, leaves)
    kwargs = {k: build(v, lib, requires_grad, leaves) for k, v in sample.kwargs.items()}
    return fn(*args, **kwargs), leaves


def _run_torch(info: OpInfo, sample: Sample, requires_grad: bool) -> tuple[Any, list[Any]]:
    """The reference result; torch's warnings (e.g. var() of one element) are silenced, its values compared."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run(info.ref, sample, _torch_library(), requires_grad)


def _check_values(info: OpInfo, sample: Sample, device: str) -> str | None:
    import tensorgraphs as tg

    try:
        expected = [_torch_to_numpy(t) for t in _outputs(_run_torch(info, sample, False)[0])]
    except Exception as error:  # noqa: BLE001 - any torch error means the sample is invalid or must raise
        expected = error
    try:
        with tg.device(device):
            actual = [_tg_to_numpy(t) for t in _outputs(_run(info.op, sample, _tg_library(), False)[0])]
    except Exception as error:  # noqa: BLE001
        if isinstance(expected, Exception):
            return None  # both reject the input: error conformance
        return f"tensorgraphs raised {type(error).__name__}: {error}"
    if isinstance(expected, Exception):
        return f"torch raised {type(expected).__name__}: {expected}; tensorgraphs returned a result"
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, torch gives {len(expected)}"
    for k, (a, e) in enumerate(zip(actual, expected)):
        problem = _compare(a, e, info.tolerance(e[0]), info.compare_values)
        if problem:
            return f"output {k}: {problem}" if len(actual) > 1 else problem
    return None


def _check_grads(info: OpInfo, sample: Sample, device: str, rng: np.random.Generator) -> str | None:
    import torch as real_torch

    import tensorgraphs as tg

    try:
        torch_out, torch_leaves = _run_torch(info, sample, True)
    except Exception:  # noqa: BLE001 - an input torch rejects is reported by the value check
        return None
    differentiable = [k for k, t in enumerate(_outputs(torch_out)) if t.requires_grad]
    if not torch_leaves or not differentiable:
        return None
    torch_outs = [_outputs(torch_out)[k] for k in differentiable]
    cotangents = [np.asarray(rng.standard_normal(tuple(t.shape))) for t in torch_outs]
    torch_seeds = [real_torch.from_numpy(c).to(t.dtype) for c, t in zip(cotangents, torch_outs)]
    try:
        expected = real_torch.autograd.grad(torch_outs, torch_leaves, torch_seeds, allow_unused=True)
    except RuntimeError:  # torch has no gradient for this input (e.g. scatter_add with a smaller index)
        return None
    try:
        with tg.device(device):
            tg_out, tg_leaves = _run(info.op, sample, _tg_library(), True)
            tg_outs = [_outputs(tg_out)[k] for k in differentiable]
            seeds = [tg.tensor(c, dtype=t.dtype) for c, t in zip(cotangents, tg_outs)]
            grads = tg.grad(tg_outs, tg_leaves, grad_outputs=seeds, allow_unused=True)
            actual = [None if gr is None else _tg_to_numpy(gr) for gr in grads]
    except Exception as error:  # noqa: BLE001
        return f"gradient: tensorgraphs raised {type(error).__name__}: {error}"
    for k, (leaf, a, e) in enumerate(zip(tg_leaves, actual, expected)):
        zeros = (leaf.dtype.name, tuple(leaf.shape), np.zeros(leaf.shape))
        problem = _compare(
            zeros if a is None else a,
            zeros if e is None else _torch_to_numpy(e),
            info.tolerance(leaf.dtype.name),
        )
        if problem:
            return f"gradient of input {k}: {problem}"
    return None


def check_op(info: OpInfo, device: str, dtypes: Sequence[str] | None = None, quick: bool = False) -> list[str]:
    """Run every sample of `info` on `device` against torch; one description per failing sample.

    `dtypes` limits the check to those of the op's dtypes (a quick check of a slow backend). `quick` checks one
    dtype (float32 where the op takes it) and of its samples the one with the most elements, values and gradients:
    every op on a backend that compiles each sample, in seconds.
    """
    failures = []
    chosen = [d for d in info.dtypes if dtypes is None or d in dtypes]
    if quick:
        chosen = sorted(chosen, key=lambda d: d != "float32")
        chosen = [d for d in chosen if not info.skip_reason(d, device)][:1]
    for dtype in chosen:
        seed = info.seed(dtype)
        for grad in (False, True):
            if grad and not (info.differentiable and dtype in GRAD_DTYPES and info.compare_values):
                continue
            if info.skip_reason(dtype, device, grad):
                continue
            rng = np.random.default_rng(seed + grad)
            samples: Iterable[tuple[int, Sample]] = enumerate(info.sample_inputs(dtype, rng, grad))
            if quick:
                samples = [max(samples, key=lambda numbered: _elements(numbered[1]))]
            for k, sample in samples:
                if grad:
                    problem = _check_grads(info, sample, device, rng)
                else:
                    problem = _check_values(info, sample, device)
                if problem:
                    failures.append(
                        f"{info.name} on {device}, {dtype}, seed {seed + grad}, {'quick ' * quick}sample {k} "
                        f"{sample.describe()}: {problem}"
                    )
    return failures


def _elements(value: Any) -> int:
    """Elements in the tensors of a sample (or of one of its arguments)."""
    if isinstance(value, Sample):
        return _elements(value.args) + _elements(tuple(value.kwargs.values()))
    if isinstance(value, TensorArg):
        return math.prod(value.shape)
    if isinstance(value, (list, tuple)):
        return sum(_elements(v) for v in value)
    return 0


def skipped(info: OpInfo, device: str) -> list[str]:
    """The known skips that apply on `device`, as 'dtype: reason' lines."""
    lines = []
    for dtype in info.dtypes:
        for grad in (False, True):
            reason = info.skip_reason(dtype, device, grad)
            if reason and (not grad or not info.skip_reason(dtype, device, False)):
                lines.append(f"{dtype}{' gradient' if grad else ''}: {reason}")
    return lines
