"""The plain-Python arguments ops take (ints, sizes, dims), checked the one way every op shares.

PyTorch takes an int where anything with `__index__` stands (a Python or numpy int, a one-element integer
tensor) and raises TypeError for a float, a string or a bool; so does every op here, at the user's line,
instead of truncating 2.5 to 2 or failing deep inside.
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

from tensorgraphs.errors import ArgumentError, ArgumentTypeError, TGError, fail


def int_arg(op: str, name: str, value: Any, kind: type[TGError] = ArgumentTypeError) -> int:
    """`value` as an int; a bool, a float or a string is an error (torch: "must be int, not float")."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    fail(op, f"{name} must be an int, got {type(value).__name__} {value!r}", kind=kind)


def ints_arg(op: str, name: str, values: Any) -> tuple[int, ...]:
    """An int or a sequence of ints as a tuple of ints."""
    if isinstance(values, (tuple, list)):
        if all(type(v) is int for v in values):  # the common case, checked without naming each element
            return tuple(values)
        return tuple(int_arg(op, f"{name}[{i}]", v) for i, v in enumerate(values))
    return (int_arg(op, name, values),)


def size_arg(op: str, args: tuple[Any, ...], name: str = "size") -> tuple[int, ...]:
    """Sizes given as varargs (`zeros(2, 3)`) or as one sequence (`zeros((2, 3))`)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    if all(type(a) is int for a in args):  # the common case, checked without naming each element
        return args
    return tuple(int_arg(op, f"{name}[{i}]", a) for i, a in enumerate(args))


def nonnegative_size(op: str, args: tuple[Any, ...]) -> tuple[int, ...]:
    """A shape of a new tensor: ints, none negative."""
    shape = size_arg(op, args)
    if any(s < 0 for s in shape):
        fail(op, f"negative dimension in size {shape}", kind=ArgumentError)
    return shape


def dims_arg(op: str, dim: int | Sequence[int]) -> tuple[int, ...]:
    """One dim or a sequence of dims, each an int (not yet normalized against a rank)."""
    return ints_arg(op, "dim", dim)
