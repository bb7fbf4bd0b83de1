"""Automatic mixed precision: `tg.autocast("cpu", dtype=tg.bfloat16)` with torch's CPU autocast semantics.

Inside an enabled region, an op on torch's lower-precision list (matmul, linear, convolutions, prelu, attention)
casts its float32 (and float16/bfloat16) tensor arguments to the autocast dtype, and an op on torch's float32
list (losses, prod, reflection and replication padding) casts them to float32; float64 tensors and every other
op are left alone, so other ops follow their inputs' promotion. The casts are ordinary CAST nodes: gradients
flow back through them to float32 parameters (whose master copy stays float32), and the bfloat16 products run
on the GEMM library's bfloat16 kernel, which rounds float32 operands while packing them.

As in torch, an op casts at its entry only: its body (and a gradient or decomposition built later) runs with
autocast suspended, so a listed op built from other listed ops casts once, and an op torch runs as one native
kernel outside the lists but we build from listed ones (dot) is marked `OPAQUE` so its body does not cast either.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

from tensorgraphs import dtypes
from tensorgraphs.dtypes import DType
from tensorgraphs.errors import ArgumentError, fail, warn

Fn = TypeVar("Fn", bound=Callable[..., Any])

LOWER, FLOAT32, OPAQUE = "lower", "float32", "opaque"
"""Policies: cast to the autocast dtype, cast to float32, or run uncast (the body does not autocast)."""

_CPU_DTYPES = (dtypes.bfloat16, dtypes.float16)


@dataclass(frozen=True)
class AutocastState:
    """Whether the cpu autocast is on and its dtype: part of a compiled function's trace key."""

    enabled: bool = False
    dtype: DType = dtypes.bfloat16


_OFF = AutocastState()


class _AutocastLocal(threading.local):
    state = _OFF  # each thread starts off (a class default: read for every op, without getattr's)


_local = _AutocastLocal()


def autocast_state() -> AutocastState:
    return _local.state


def _set_state(state: AutocastState) -> None:
    _local.state = state


@contextlib.contextmanager
def autocast_suspended() -> Iterator[None]:
    """Autocast off inside (an op's body, a decomposition, a gradient), restored after."""
    previous = autocast_state()
    _set_state(AutocastState(False, previous.dtype))
    try:
        yield
    finally:
        _set_state(previous)


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """torch.is_autocast_enabled: for `device_type` "cpu" the state of `tg.autocast("cpu")`; without one, as in
    torch, the CUDA state (always False here)."""
    return device_type == "cpu" and autocast_state().enabled


def get_autocast_dtype(device_type: str) -> DType:
    """The dtype `tg.autocast(device_type)` casts to (torch's defaults: bfloat16 on the cpu, float16 on CUDA)."""
    return autocast_state().dtype if device_type == "cpu" else dtypes.float16


class autocast:  # noqa: N801 - torch's name
    """torch.autocast: a context manager (or decorator) in which listed ops run in `dtype` (see the module
    docstring). Regions nest; `enabled=False` turns autocast off inside. As torch does on a machine without a
    GPU, "cuda" and a dtype the cpu autocast does not support warn and disable it."""

    def __init__(self, device_type: str, dtype: Any = None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:
        if not isinstance(device_type, str):
            fail("autocast", f"device_type must be a string such as 'cpu', got {type(device_type).__name__}",
                 kind=ArgumentError)
        if device_type not in ("cpu", "cuda"):
            fail("autocast", f"unsupported device_type {device_type!r}; tensorgraphs autocasts on 'cpu'",
                 kind=ArgumentError)
        self.device_type = device_type
        self.fast_dtype = dtypes.bfloat16 if dtype is None else dtypes.to_dtype(dtype)
        self.enabled = bool(enabled)
        if self.enabled and device_type == "cuda":
            warn("autocast", "CUDA is not available. Disabling autocast.")
            self.enabled = False
        elif self.enabled and self.fast_dtype not in _CPU_DTYPES:
            warn("autocast", f"the cpu autocast supports bfloat16 and float16, not {self.fast_dtype.name}. "
                 "Disabling autocast.")
            self.enabled = False
        self._previous: list[AutocastState] = []

    def __enter__(self) -> autocast:
        self._previous.append(autocast_state())
        if self.device_type == "cpu":
            dtype = self.fast_dtype if self.enabled else self._previous[-1].dtype
            _set_state(AutocastState(self.enabled, dtype))
        return self

    def __exit__(self, *exc: object) -> None:
        _set_state(self._previous.pop())

    def __call__(self, fn: Fn) -> Fn:
        @functools.wraps(fn)
        def autocast_wrapper(*args: Any, **kwargs: Any) -> Any:
            with autocast(self.device_type, self.fast_dtype, self.enabled):
                return fn(*args, **kwargs)

        return autocast_wrapper  # type: ignore[return-value]


def _cast_argument(value: Any, target: DType) -> Any:
    from tensorgraphs.frontend.tensor import Tensor, cast

    if isinstance(value, Tensor):
        eligible = value.dtype.is_floating_point and value.dtype is not dtypes.float64
        return cast(value, target) if eligible else value
    if isinstance(value, (list, tuple)) and any(isinstance(v, Tensor) for v in value):
        return type(value)(_cast_argument(v, target) for v in value)
    return value


def autocast_op(policy: str, applies: Callable[..., bool] = lambda *args, **kwargs: True) -> Callable[[Fn], Fn]:
    """Marks a frontend op with its autocast policy (`LOWER`, `FLOAT32` or `OPAQUE`): inside an enabled region
    (and where `applies(*args, **kwargs)`), its tensor arguments are cast and its body runs with autocast
    suspended."""

    def decorate(fn: Fn) -> Fn:
        @functools.wraps(fn)
        def autocast_op_wrapper(*args: Any, **kwargs: Any) -> Any:
            state = autocast_state()
            if not state.enabled or not applies(*args, **kwargs):
                return fn(*args, **kwargs)
            target = {LOWER: state.dtype, FLOAT32: dtypes.float32}.get(policy)
            if target is not None:
                args = tuple(_cast_argument(a, target) for a in args)
                kwargs = {name: _cast_argument(a, target) for name, a in kwargs.items()}
            with autocast_suspended():
                return fn(*args, **kwargs)

        return autocast_op_wrapper  # type: ignore[return-value]

    return decorate
