"""Errors raised at the user's call, naming the op, the operands and the user's file:line."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class TGError(Exception):
    """Base class of every error tensorgraphs raises on purpose."""


class ShapeError(TGError, ValueError, RuntimeError):
    """Shapes that do not fit the op (RuntimeError too, as PyTorch raises)."""


class DTypeError(TGError, TypeError, RuntimeError):
    """A dtype the op does not accept."""


class ArgumentError(TGError, ValueError):
    """An argument value the op does not accept."""


class UnsupportedError(TGError, NotImplementedError):
    """Something tensorgraphs does not do; the message says what to use instead."""


def user_location() -> str:
    """file:line of the innermost frame outside the tensorgraphs package."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_PACKAGE_DIR + os.sep):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def fail(op: str, message: str, kind: type[TGError] = ShapeError) -> NoReturn:
    """Raise `kind` with "op: message" and the caller's location."""
    raise kind(f"{op}: {message} (at {user_location()})")


def check(condition: bool, op: str, message: str, kind: type[TGError] = ShapeError) -> None:
    if not condition:
        fail(op, message, kind)
