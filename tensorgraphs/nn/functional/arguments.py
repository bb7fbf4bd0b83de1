"""Argument conventions shared by the functional ops: int-or-tuple sizes, loss reductions, inplace."""

from __future__ import annotations

from typing import Sequence

from tensorgraphs.errors import ArgumentError, DTypeError, fail
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.checks import ints_arg
from tensorgraphs.frontend.inplace_ops import check_writable, write
from tensorgraphs.frontend.tensor import Tensor

REDUCTIONS = ("none", "mean", "sum")


def tuple_of(op: str, name: str, value: int | Sequence[int], n: int, minimum: int = 1) -> tuple[int, ...]:
    """torch's `_pair`: an int means the same size in every one of the n spatial dims; each at least `minimum`."""
    values = ints_arg(op, name, value)
    if len(values) == 1:
        values *= n
    if len(values) != n:
        fail(op, f"{name} must be an int or a tuple of {n} ints, got {value!r}", kind=ArgumentError)
    if min(values) < minimum:
        fail(op, f"{name} must be at least {minimum}, got {values}", kind=ArgumentError)
    return values


def legacy_reduction(size_average: bool | None, reduce: bool | None, reduction: str) -> str:
    """The deprecated size_average/reduce flags, mapped as torch's `_Reduction.legacy_get_string`."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


def check_reduction(op: str, reduction: str) -> None:
    if reduction not in REDUCTIONS:
        fail(op, f"{reduction!r} is not a valid value for reduction (expected one of {REDUCTIONS})", kind=ArgumentError)


def reduce_loss(op: str, loss: Tensor, reduction: str) -> Tensor:
    check_reduction(op, reduction)
    if reduction == "mean":
        return rd.mean(loss)
    return rd.sum(loss) if reduction == "sum" else loss


def require_float(op: str, **tensors: Tensor | None) -> None:
    """Every named tensor (None skipped) must be floating point, as torch's float-only kernels demand."""
    for name, t in tensors.items():
        if t is not None and not t.dtype.is_floating_point:
            fail(op, f"expected a floating point {name}, got {t.dtype.name}", kind=DTypeError)


def require_same_dtype(op: str, **tensors: Tensor | None) -> None:
    present = {name: t for name, t in tensors.items() if t is not None}
    if len({t.dtype for t in present.values()}) > 1:
        listed = ", ".join(f"{name} {t.dtype.name}" for name, t in present.items())
        fail(op, f"expected tensors of one dtype, got {listed}", kind=DTypeError)


def finish_inplace(op: str, x: Tensor, out: Tensor, inplace: bool) -> Tensor:
    """`inplace=True` writes the result into `x`, with torch's rules (`frontend.inplace_ops`)."""
    if not inplace:
        return out
    check_writable(x, op)
    return write(x, out)
