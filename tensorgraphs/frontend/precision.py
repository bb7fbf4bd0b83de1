"""torch.set_float32_matmul_precision: accepted and remembered; tensorgraphs' float32 matmuls always
accumulate in float32 (the "highest" precision), whatever is set."""

from __future__ import annotations

from tensorgraphs.errors import ArgumentError, fail

_PRECISIONS = ("highest", "high", "medium")
_precision = "highest"


def set_float32_matmul_precision(precision: str) -> None:
    global _precision
    if precision not in _PRECISIONS:
        fail("set_float32_matmul_precision", f"expected one of {', '.join(_PRECISIONS)}, got {precision!r}",
             kind=ArgumentError)
    _precision = precision


def get_float32_matmul_precision() -> str:
    return _precision
