"""The fused attention kernels (kernels/attention) called on numpy arrays, against torch's
scaled_dot_product_attention forward and backward."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np
import pytest
import torch

from tensorgraphs.kernels import attention
from tensorgraphs.kernels.gemm import build


def _torch_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, dout: np.ndarray, mask: np.ndarray | None,
                     causal: bool) -> list[np.ndarray]:
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=None if mask is None else torch.tensor(mask), is_causal=causal)
    out.backward(torch.tensor(dout))
    return [out.detach().numpy()] + [t.grad.numpy() for t in (tq, tk, tv)]


def _check(shape: tuple[int, int, int, int, int, int], causal: bool = False, mask: np.ndarray | None = None,
           seed: int = 0, place: Callable[[np.ndarray], np.ndarray] = np.asarray) -> None:
    """The kernels against torch on random operands of `shape` (batch, heads, queries, keys, dim, value dim), each
    operand's memory laid out by `place`."""
    batch, heads, queries, keys, dim, value_dim = shape
    rng = np.random.default_rng(seed)
    q, k, v = (place(rng.standard_normal(s, dtype=np.float32)) for s in
               ((batch, heads, queries, dim), (batch, heads, keys, dim), (batch, heads, keys, value_dim)))
    dout = place(rng.standard_normal((batch, heads, queries, value_dim), dtype=np.float32))
    out, lse = attention.forward(q, k, v, mask, causal)
    got = [out, *attention.backward(q, k, v, out, lse, dout, mask, causal)]
    expected = _torch_reference(q, k, v, dout, mask, causal)
    for name, value, reference in zip(("out", "dq", "dk", "dv"), got, expected):
        np.testing.assert_allclose(value, reference, rtol=1e-4, atol=2e-5,
                                   err_msg=f"attention {name}, shape {shape}, causal {causal}, seed {seed}")


@pytest.mark.parametrize("shape", [
    (1, 1, 64, 64, 64, 64),  # one whole tile
    (1, 1, 1, 1, 8, 8),  # T = 1
    (2, 3, 70, 45, 8, 8),  # batch*heads > 1, T not a multiple of the tile, more queries than keys
    (1, 2, 150, 200, 64, 64),
    (1, 2, 100, 77, 24, 40),  # head dims not multiples of 16, differing
    (1, 2, 70, 45, 20, 12),  # nor of 8: keys read in place over 20 floats, values packed
])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch(shape: tuple[int, int, int, int, int, int], causal: bool) -> None:
    _check(shape, causal)


def _aligned(x: np.ndarray, row_floats: int) -> np.ndarray:
    """A copy of x starting on a 64-byte boundary with rows `row_floats` apart (a view of wider rows, as the heads
    of a projection): the forward reads such values in place (numpy's own arrays start 16 bytes past a line, and
    are packed)."""
    rows = x.size // x.shape[-1]
    block = np.full(rows * row_floats + 16, np.nan, np.float32)
    start = -block.ctypes.data % 64 // 4
    view = block[start:start + rows * row_floats].reshape(*x.shape[:-1], row_floats)[..., :x.shape[-1]]
    view[...] = x
    assert view.ctypes.data % 64 == 0
    return view


@pytest.mark.parametrize("shape", [(1, 2, 150, 200, 64, 64), (2, 3, 70, 45, 16, 8), (1, 1, 64, 64, 64, 64)])
@pytest.mark.parametrize("row_floats", [0, 200])
@pytest.mark.parametrize("causal", [False, True])
def test_keys_and_values_read_in_place_match_torch(shape: tuple[int, ...], row_floats: int, causal: bool) -> None:
    """Aligned operands, contiguous or rows of a wider array (NaN between them: never read), whole and partial key
    tiles: the forward's products read K and V where they lie."""
    _check(shape, causal, place=lambda x: _aligned(x, row_floats or x.shape[-1]))


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks_match_torch_fully_masked_rows_included(kind: str) -> None:
    rng = np.random.default_rng(5)
    allowed = rng.standard_normal((2, 1, 100, 77)) > 0
    allowed[0, 0, 3] = allowed[1, 0, 70] = False  # rows attending to nothing: zeros, zero gradients (as torch)
    mask = allowed if kind == "bool" else np.where(allowed, rng.standard_normal(allowed.shape), -np.inf)
    _check((2, 3, 100, 77, 16, 16), mask=mask.astype(np.bool_ if kind == "bool" else np.float32))


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 77), (1, 3, 100, 1), (2, 3, 100, 77)])
def test_broadcast_and_full_masks_match_torch(kind: str, mask_shape: tuple[int, ...]) -> None:
    """Masks broadcast along the queries (key padding) or the keys, or full: the kernel loads a vector of mask
    values per tile row where they are contiguous or broadcast, and gathers them where strided, with partial
    vectors at tile edges (100 queries, 77 keys)."""
    rng = np.random.default_rng(11)
    allowed = rng.standard_normal(mask_shape) > -0.5
    allowed[..., 0] = True  # every row attends to something
    mask = allowed if kind == "bool" else np.where(allowed, rng.standard_normal(mask_shape), -np.inf)
    _check((2, 3, 100, 77, 16, 16), mask=mask.astype(np.bool_ if kind == "bool" else np.float32))


@pytest.mark.parametrize("causal", [False, True])
def test_one_head_split_into_key_chunks_matches_torch(causal: bool) -> None:
    """One head of many key tiles: the backward splits its key tiles into chunks whose dq parts are summed."""
    _check((1, 1, 300, 700, 16, 16), causal)


def test_weights_below_floats_normal_range_match_torch() -> None:
    """Scores hundreds apart: weights below 2^-126 of the row's largest are 0 here (torch's are denormals, below
    any sum's ulp), the rest as torch's."""
    rng = np.random.default_rng(12)
    q, k, v, dout = (rng.standard_normal((1, 2, 70, 8), dtype=np.float32) for _ in range(4))
    q *= np.float32(40.0)
    out, lse = attention.forward(q, k, v)
    got = [out, *attention.backward(q, k, v, out, lse, dout)]
    for name, value, reference in zip(("out", "dq", "dk", "dv"), got, _torch_reference(q, k, v, dout, None, False)):
        np.testing.assert_allclose(value, reference, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("operand", [0, 1, 2])
def test_nan_inputs_give_torchs_nan_gradients(operand: int) -> None:
    """A NaN in q, k or v: outputs and gradients NaN where torch's are (the exponentials keep NaN)."""
    rng = np.random.default_rng(13)
    arrays = [rng.standard_normal((1, 2, 70, 16), dtype=np.float32) for _ in range(4)]
    arrays[operand][0, 1, 5, 2] = np.nan
    q, k, v, dout = arrays
    out, lse = attention.forward(q, k, v)
    got = [out, *attention.backward(q, k, v, out, lse, dout)]
    for name, value, reference in zip(("out", "dq", "dk", "dv"), got, _torch_reference(q, k, v, dout, None, False)):
        np.testing.assert_array_equal(np.isnan(value), np.isnan(reference), err_msg=name)
        np.testing.assert_allclose(value, reference, rtol=1e-4, atol=2e-5, err_msg=name)


def test_logsumexp_is_that_of_the_scaled_scores() -> None:
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 90, 8), dtype=np.float32) for _ in range(3))
    _, lse = attention.forward(q, k, v, causal=True)
    scores = (q.astype(np.float64) @ k.swapaxes(-1, -2)) / np.sqrt(8) + np.triu(np.full((90, 90), -np.inf), 1)
    np.testing.assert_allclose(lse, np.log(np.exp(scores).sum(-1)), rtol=1e-5, atol=1e-5)


def test_nan_inputs_give_nan_rows() -> None:
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, 70, 16), dtype=np.float32) for _ in range(3))
    q[0, 0, 5, 2] = np.nan
    out, _ = attention.forward(q, k, v)
    assert np.isnan(out[0, 0, 5]).all() and not np.isnan(np.delete(out[0, 0], 5, 0)).any()


def test_huge_finite_scores_match_torch() -> None:
    """Scores near 1e37 (finite): exp(x - max) must not pick up the rounding error of a huge max (which an fma
    of x * log2(e) - max * log2(e) would)."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, 33, 16), dtype=np.float32) for _ in range(3))
    q, k = q * np.float32(3e18), k * np.float32(3e18)
    out, _ = attention.forward(q, k, v)
    expected = torch.nn.functional.scaled_dot_product_attention(*map(torch.tensor, (q, k, v))).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_portable_build_matches_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same source built for a CPU without AVX-512 (gcc splits the 16-float vectors into what it has, and the
    bfloat16 pairs are multiplied as floats)."""
    portable = tuple("-march=x86-64-v2" if flag == "-march=native" else flag for flag in build.FLAGS)
    library = build.load_library(attention.LIBRARY, attention.SOURCES, portable, source_dir=attention.SOURCE_DIR)
    functions = {}
    for name, function in attention.C_FUNCTIONS.items():
        functions[name] = getattr(library, function)
        backward = name.startswith("backward")
        functions[name].argtypes = attention.BACKWARD_ARGTYPES if backward else attention.FORWARD_ARGTYPES
        functions[name].restype = ctypes.c_int
    monkeypatch.setattr(attention, "_functions", lambda: functions)
    _check((2, 3, 70, 45, 24, 8), causal=True)
    _check_bfloat16((2, 3, 70, 45, 24, 8), causal=True)


def _bfloat16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (ties to even), as float64."""
    return torch.from_numpy(np.asarray(x, np.float32)).bfloat16().double().numpy()


def _bfloat16_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, dout: np.ndarray, mask: np.ndarray | None,
                        causal: bool) -> list[np.ndarray]:
    """attention.h's bfloat16 variant in float64 for one key tile (so the softmax's max is the row's): the
    unnormalized weights rounded before their product with v, the normalized weights before dV = P^T dO, the
    score gradients dS before dQ and dK."""
    scale = 1 / np.sqrt(q.shape[-1])
    scores = scale * q.astype(np.float64) @ k.swapaxes(-1, -2)
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, -np.inf)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    total = weights.sum(-1, keepdims=True)
    out = _bfloat16(weights) @ v / total
    weights /= total
    score_grads = weights * (dout @ v.swapaxes(-1, -2) - (dout * out).sum(-1, keepdims=True))
    return [out, scale * _bfloat16(score_grads) @ k, scale * _bfloat16(score_grads).swapaxes(-1, -2) @ q,
            _bfloat16(weights).swapaxes(-1, -2) @ dout]


def _check_bfloat16(shape: tuple[int, ...], causal: bool = False, mask: np.ndarray | None = None) -> None:
    """The bfloat16 variant on bfloat16 inputs against its float64 reference: equal to float32 rounding except
    where a weight or score gradient lies that close to a bfloat16 rounding boundary (rare, so the mean error is
    tiny; there within one bfloat16 step of the term)."""
    batch, heads, queries, keys, dim, value_dim = shape
    rng = np.random.default_rng(7)
    q, k, v = (_bfloat16(rng.standard_normal(s)).astype(np.float32) for s in
               ((batch, heads, queries, dim), (batch, heads, keys, dim), (batch, heads, keys, value_dim)))
    dout = _bfloat16(rng.standard_normal((batch, heads, queries, value_dim))).astype(np.float32)
    out, lse = attention.forward(q, k, v, mask, causal, bf16=True)
    got = [out, *attention.backward(q, k, v, out, lse, dout, mask, causal, bf16=True)]
    for name, value, reference in zip(("out", "dq", "dk", "dv"), got, _bfloat16_reference(q, k, v, dout, mask, causal)):
        scale = np.abs(reference).max()
        error = np.abs(value - reference).mean() / scale  # the float32 kernel's is above 1e-4 here
        assert error < 1e-5, f"bfloat16 attention {name}, shape {shape}: mean error {error:.1e} of the largest"
        np.testing.assert_allclose(value, reference, rtol=0, atol=2**-8 * scale, err_msg=f"bfloat16 {name} {shape}")


@pytest.mark.parametrize("shape, causal", [((2, 3, 70, 45, 24, 8), True), ((1, 2, 33, 64, 40, 48), False),
                                           ((2, 2, 130, 50, 64, 64), False)])
def test_bfloat16_variant_rounds_weights_and_score_gradients_before_their_products(shape: tuple, causal: bool) -> None:
    _check_bfloat16(shape, causal)


def test_bfloat16_variant_with_a_bool_mask() -> None:
    mask = np.random.default_rng(8).standard_normal((33, 60)) > 0
    _check_bfloat16((2, 2, 33, 60, 16, 16), mask=mask)


@pytest.mark.parametrize("bf16", [False, True])
def test_repeated_calls_reuse_their_scratch(bf16: bool) -> None:
    """The packed keys and values and each thread's tiles live in scratch kept across calls: once warm, a forward
    and backward call fault in almost no fresh pages (allocated afresh, the packed keys and values alone were
    512 pages a call here). Outputs are preallocated, so the count is the kernels' own."""
    import resource

    rng = np.random.default_rng(9)
    q, k, v, dout = (rng.standard_normal((8, 4, 128, 64), dtype=np.float32) for _ in range(4))
    sizes, operands, alive = attention._problem(q, k, v, None)
    out, lse = np.empty_like(q), np.empty(q.shape[:3], np.float32)
    grads = [np.empty_like(q) for _ in range(3)]
    strides = [s // 4 for s in dout.strides[:3]]
    forward = attention._functions()[attention.function_name(False, bf16)]
    backward = attention._functions()[attention.function_name(True, bf16)]

    def call() -> None:
        assert forward(*sizes, *operands, 0, 0.125, out.ctypes.data, lse.ctypes.data) == 0
        assert backward(*sizes, *operands, 0, 0.125, out.ctypes.data, lse.ctypes.data, dout.ctypes.data, *strides,
                        *(g.ctypes.data for g in grads)) == 0

    call()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        call()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del alive
    assert faults < 10 * 16, f"{faults} page faults in 10 calls"
