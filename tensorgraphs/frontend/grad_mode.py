"""Whether new operations record gradients (`tg.no_grad`, `tg.enable_grad`)."""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

_state = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_state, "enabled", True)


class set_grad_enabled:
    """Context manager and decorator, as torch.set_grad_enabled."""

    def __init__(self, mode: bool) -> None:
        self.mode = mode
        self.previous: list[bool] = []

    def __enter__(self) -> None:
        self.previous.append(is_grad_enabled())
        _state.enabled = self.mode

    def __exit__(self, *exc: object) -> None:
        _state.enabled = self.previous.pop()

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with type(self)(self.mode) if type(self) is set_grad_enabled else type(self)():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(set_grad_enabled):
    def __init__(self) -> None:
        super().__init__(False)


class enable_grad(set_grad_enabled):
    def __init__(self) -> None:
        super().__init__(True)
