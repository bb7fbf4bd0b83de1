"""The GEMM and conv2d kernels' fuzzer: a few of its cases agree with torch, and its comparison catches a wrong
result. The long runs are `python -m tensorgraphs.testing.fuzz_kernels` (with 1 and 2 threads)."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgraphs.kernels import gemm
from tensorgraphs.testing import fuzz_kernels

pytestmark = pytest.mark.skipif(not gemm.available(), reason="needs AVX-512F or AVX2 and a C compiler")


def test_a_few_cases_agree_with_torch():
    for seed in range(8):
        case, problems = fuzz_kernels.run(seed)
        assert not problems, f"seed {seed} {case}: {problems}"


def test_draws_cover_products_and_convolutions():
    kinds = {fuzz_kernels.draw(seed)["kind"] for seed in range(20)}
    assert kinds == {"matmul", "conv"}


def test_comparison_catches_a_wrong_element_and_a_misplaced_nan():
    expected = np.arange(12.0).reshape(3, 4)
    actual = expected.astype(np.float32)
    assert fuzz_kernels._compare(actual, expected, 10) is None
    actual[2, 1] += 0.01
    assert "1 of 12 results off" in fuzz_kernels._compare(actual, expected, 10)
    expected[0, 0], actual[2, 1] = np.nan, expected[2, 1]
    assert "non-finite" in fuzz_kernels._compare(actual, expected, 10)


@pytest.mark.slow
def test_500_cases_agree_with_torch():
    failed = {seed: problems for seed in range(1000, 1500) if (problems := fuzz_kernels.run(seed)[1])}
    assert not failed, failed
