"""Whether new operations record gradients (`tg.no_grad`, `tg.enable_grad`, `tg.set_grad_enabled`)."""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable


class _GradMode(threading.local):
    enabled = True  # each thread starts recording (a class default: read for every op built, without getattr's)


_state = _GradMode()


def is_grad_enabled() -> bool:
    return _state.enabled


def _set_grad_enabled(mode: bool) -> None:
    _state.enabled = mode


class _GradModeContext:
    """Sets the grad mode inside a `with` block or a decorated function, restoring the previous mode after."""

    def __init__(self, mode: bool) -> None:
        self.mode = mode
        self._previous: list[bool] = []

    def __enter__(self) -> None:
        self._previous.append(is_grad_enabled())
        _set_grad_enabled(self.mode)

    def __exit__(self, *exc: object) -> None:
        _set_grad_enabled(self._previous.pop())

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        mode = self.mode

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _GradModeContext(mode):
                return fn(*args, **kwargs)

        return wrapper


class _FixedGradMode(_GradModeContext):
    """A context manager, `@decorator()` or bare `@decorator` (torch accepts both decorator forms)."""

    mode: bool

    def __new__(cls, fn: Callable[..., Any] | None = None) -> Any:
        return super().__new__(cls) if fn is None else cls()(fn)

    def __init__(self, fn: None = None) -> None:
        super().__init__(self.mode)


class no_grad(_FixedGradMode):
    mode = False


class enable_grad(_FixedGradMode):
    mode = True


class set_grad_enabled(_GradModeContext):
    """As torch.set_grad_enabled: a context manager, a decorator, or a plain call that sets the mode at once."""

    def __init__(self, mode: bool) -> None:
        super().__init__(mode)
        self._previous.append(is_grad_enabled())
        _set_grad_enabled(mode)

    def __enter__(self) -> None:
        """The mode was already set when the object was made."""

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        _set_grad_enabled(self._previous.pop())  # used as a decorator: undo the immediate effect
        return super().__call__(fn)
