"""tg.set_float32_matmul_precision: torch's values are accepted and remembered; others fail clearly."""

from __future__ import annotations

import pytest

import tensorgraphs as tg
from tensorgraphs.errors import ArgumentError


def test_float32_matmul_precision_is_remembered_and_validated() -> None:
    previous = tg.get_float32_matmul_precision()
    try:
        tg.set_float32_matmul_precision("medium")
        assert tg.get_float32_matmul_precision() == "medium"
        with pytest.raises(ArgumentError, match="highest, high, medium"):
            tg.set_float32_matmul_precision("low")
    finally:
        tg.set_float32_matmul_precision(previous)

