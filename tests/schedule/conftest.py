"""The fusion and lowering tests describe the loop lowering of matrix products: they run with TG_GEMM=0
(test_extern.py tests the GEMM library path)."""

from __future__ import annotations

import pytest

LOOP_LOWERING_MODULES = ("test_fusion", "test_lower")


@pytest.fixture(autouse=True)
def _loop_lowered_matmuls(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.module.__name__.rsplit(".", 1)[-1] in LOOP_LOWERING_MODULES:
        monkeypatch.setenv("TG_GEMM", "0")
