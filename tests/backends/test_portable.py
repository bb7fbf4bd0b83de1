"""The portable device: plain C11 (one thread, no intrinsics, no kernel library) that matches the reference."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.portable import DRIVER, PORTABLE

pytestmark = pytest.mark.device("portable", compile=True)  # checks generated C, small graphs included


def _block(x: tg.Tensor, w: tg.Tensor, q: tg.Tensor) -> list[tg.Tensor]:
    """A product with an epilogue, a row softmax, a tiled transpose, a long sum and causal attention."""
    hidden = F.gelu(x @ w)
    return [F.softmax(hidden, -1), (x.T.contiguous() * 2), hidden.sum(1),
            F.scaled_dot_product_attention(q, q, q, is_causal=True)]


def test_a_small_model_matches_the_reference_with_no_pragma_library_call_or_compiler_extension() -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in ((96, 64), (64, 80), (1, 2, 40, 16))]
    PORTABLE._programs.clear()
    results = {}
    for device in ("portable", "numpy"):
        with tg.device(device):
            results[device] = [t.numpy() for t in _block(*map(tg.tensor, arrays))]
    for got, expected in zip(results["portable"], results["numpy"]):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    kernels = "".join(program.source.split("#define TG_KERNEL")[1] for program in PORTABLE._programs.values())
    for spelling in ("#pragma", "__attribute__", "__builtin", "tg_gemm", "tg_attention", "tg_stream"):
        assert spelling not in kernels, spelling
    assert "for (int64_t tile_i" in kernels  # the tiled transpose, element by element


def test_the_driver_asks_for_iso_c_without_openmp_or_machine_specific_code() -> None:
    assert "-std=c11" in DRIVER.flags and not any(flag.startswith(("-fopenmp", "-march")) for flag in DRIVER.flags)


def test_compile_builds_for_the_portable_device_when_it_is_current() -> None:
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in ((96, 64), (64, 80), (1, 2, 40, 16))]
    with tg.device("numpy"):
        expected = [t.numpy() for t in _block(*map(tg.tensor, arrays))]
    block = tg.compile(_block)
    PORTABLE._programs.clear()
    with tg.device("portable"):
        got = [t.numpy() for t in block(*map(tg.tensor, arrays))]
    assert len(PORTABLE._programs) == 1 and block.compiled_programs == 1
    for result, reference in zip(got, expected):
        np.testing.assert_allclose(result, reference, rtol=1e-5, atol=1e-5)
    with tg.device("cpu"):  # another device: another program, not the portable one replayed
        block(*map(tg.tensor, arrays))
    assert block.compiled_programs == 2 and len(PORTABLE._programs) == 1
