"""Errors raised at the user's call, naming the op, the operands and the user's file:line."""

from __future__ import annotations

import os
import sys
import sysconfig
import warnings
from types import FrameType
from typing import NoReturn

_PACKAGE = __name__.partition(".")[0]
_PACKAGE_DIR = os.path.dirname(os.path.realpath(__file__))
_STDLIB_DIRS = tuple({os.path.realpath(sysconfig.get_path(name)) for name in ("stdlib", "platstdlib")})


class TGError(Exception):
    """Base class of every error tensorgraphs raises on purpose."""


class ShapeError(TGError, ValueError, RuntimeError):
    """Shapes that do not fit the op (RuntimeError too, as PyTorch raises)."""


class DTypeError(TGError, TypeError, RuntimeError):
    """A dtype the op does not accept."""


class ArgumentError(TGError, ValueError):
    """An argument value the op does not accept."""


class AutogradError(TGError, RuntimeError):
    """A use autograd forbids (an in-place write into a leaf that requires grad, a value needed for backward
    modified since, a second backward through a graph): a RuntimeError as in PyTorch."""


class UnsupportedError(TGError, NotImplementedError):
    """Something tensorgraphs does not do; the message says what to use instead."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of a type the op does not take (a float where an int must be), a TypeError as in PyTorch."""


class IndexingError(TGError, IndexError):
    """An index out of range or not an int, an IndexError as in PyTorch."""


def _is_user_frame(frame: FrameType) -> bool:
    """Not tensorgraphs (by file, or by module for generated code such as dataclass methods), not the stdlib.

    Frames of generated code that is not ours (`<string>`, `<ipython-input-1>`) are the user's.
    """
    module = frame.f_globals.get("__name__", "")
    if module == _PACKAGE or module.startswith(_PACKAGE + "."):
        return False
    filename = frame.f_code.co_filename
    if filename.startswith("<"):
        return True
    path = os.path.realpath(filename)
    return not any(path.startswith(directory + os.sep) for directory in (_PACKAGE_DIR, *_STDLIB_DIRS))


def user_location() -> str:
    """file:line of the innermost frame of the user's code: the line that called into tensorgraphs."""
    frame = sys._getframe(1)
    while frame is not None:
        if _is_user_frame(frame):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def fail(op: str, message: str, kind: type[TGError] = ShapeError) -> NoReturn:
    """Raise `kind` with "op: message" and the caller's location."""
    raise kind(f"{op}: {message} (at {user_location()})")


def check(condition: bool, op: str, message: str, kind: type[TGError] = ShapeError) -> None:
    if not condition:
        fail(op, message, kind)



def warn(op: str, message: str, category: type[Warning] = UserWarning) -> None:
    """Warn "op: message", attributed to the user's line (as torch's `stacklevel=2` does for its own callers)."""
    frame, level = sys._getframe(1), 2
    while frame is not None and not _is_user_frame(frame):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"{op}: {message}", category, stacklevel=level if frame is not None else 2)
