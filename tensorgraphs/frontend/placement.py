"""Device arguments (`.to(...)`, `device=`): tensors are lazy and computed on the current device, so a device
argument is checked (a clear error for one tensorgraphs lacks, such as cuda) and otherwise changes nothing."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from tensorgraphs import dtypes
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.runtime.realize import device

F = TypeVar("F", bound=Callable[..., Any])
_TO_KEYWORDS = {"dtype", "device", "non_blocking", "copy", "memory_format"}


def check_device(value: Any) -> None:
    """A str, tg.device or torch.device naming a device tensorgraphs has; raises where the user called."""
    if value is not None:
        device(str(value)).require_available()


def accepts_device(fn: F) -> F:
    """Check a creation function's `device=` keyword before it runs."""

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        check_device(kwargs.get("device"))
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]


def _as_dtype(value: Any) -> dtypes.DType | None:
    try:
        return dtypes.to_dtype(value)
    except TypeError:
        return None


def to_arguments(owner: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dtypes.DType | None:
    """The dtype a `.to(...)` call asks for (None: keep), in torch's forms: to(dtype), to(device[, dtype]),
    to(tensor), to(dtype=, device=); the device is checked, non_blocking/copy/memory_format are ignored."""
    unknown = set(kwargs) - _TO_KEYWORDS
    if unknown:
        raise TypeError(f"{owner}() got an unexpected keyword argument '{sorted(unknown)[0]}'")
    check_device(kwargs.get("device"))
    target = None if kwargs.get("dtype") is None else dtypes.to_dtype(kwargs["dtype"])
    for arg in args:
        if isinstance(arg, Tensor):
            target = arg.dtype
        elif arg is None or isinstance(arg, bool):  # torch's positional non_blocking / copy
            continue
        elif (dtype := _as_dtype(arg)) is not None:
            target = dtype
        else:
            check_device(arg)
    return target
