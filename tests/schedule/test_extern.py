"""Float32 matrix products run by the GEMM library from generated C (schedule.extern)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.kernels import gemm
from tensorgraphs.schedule.fusion import schedule_kernels

pytestmark = pytest.mark.skipif(not gemm.available(), reason="the GEMM library needs AVX-512")


def _program_source(result: tg.Tensor) -> str:
    program, _ = CPU.program([result.node])
    return program.source


@pytest.mark.parametrize("m, k, n", [(1, 7, 33), (7, 33, 1), (33, 1, 7), (5, 64, 9)])
@pytest.mark.parametrize("transpose_w", [False, True])
def test_matmul_calls_gemm_and_matches_torch(m: int, k: int, n: int, transpose_w: bool) -> None:
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k) if transpose_w else (k, n), dtype=np.float32)
    expected = torch.from_numpy(x) @ (torch.from_numpy(w).T if transpose_w else torch.from_numpy(w))
    with tg.device("cpu"):
        weight = tg.tensor(w).T if transpose_w else tg.tensor(w)
        result = tg.tensor(x) @ weight
        assert "tg_gemm_f32(" in _program_source(result)
        np.testing.assert_allclose(result.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


def test_batched_folded_and_transposed_operands_need_no_copy() -> None:
    """A 3-D input times a transposed weight, a 4-D batch times a transposed batch: each call reads the inputs
    in place (a reshape or a transpose of a buffer is only strides)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 7, 33), dtype=np.float32)
    w = rng.standard_normal((5, 33), dtype=np.float32)
    y = rng.standard_normal((2, 3, 4, 6), dtype=np.float32)
    z = rng.standard_normal((2, 3, 5, 6), dtype=np.float32)
    with tg.device("cpu"):
        products = [(tg.tensor(x) @ tg.tensor(w).T, x @ w.T), (tg.tensor(y) @ tg.tensor(z).mT, y @ z.swapaxes(-1, -2))]
        for result, expected in products:
            schedule = schedule_kernels([result.node])
            role = {spec.name: spec.role for spec in schedule.buffers}
            (call,) = [k for k in schedule.kernels if k.name.endswith("matmul")]
            assert all(role[b.name] == "input" for b in call.buffers if not b.writes)
            np.testing.assert_allclose(result.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_computed_operands_and_consumers_stay_fused_around_the_call() -> None:
    """exp(x) @ w + 1: the operand is materialized by a kernel, the consumer reads the product's buffer."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, 17), dtype=np.float32)
    w = rng.standard_normal((17, 11), dtype=np.float32)
    with tg.device("cpu"):
        result = (tg.tensor(x).exp() @ tg.tensor(w)) + 1
        assert "tg_gemm_f32(" in _program_source(result)
        np.testing.assert_allclose(result.numpy(), np.exp(x) @ w + 1, rtol=1e-5, atol=1e-5)


def test_other_dtypes_keep_the_loops() -> None:
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    with tg.device("cpu"):
        result = tg.tensor(x) @ tg.tensor(x).T
        assert "tg_gemm_f32(" not in _program_source(result)
        np.testing.assert_allclose(result.numpy(), x @ x.T)
