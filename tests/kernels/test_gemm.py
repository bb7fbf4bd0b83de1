"""The generated GEMM and the BLAS kernel against torch (float64) on odd shapes, strides, batches, epilogues and
prologues. The BLAS kernel builds without AVX-512 (its epilogue passes in plain C), the GEMM library needs it."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, ShapeError
from tensorgraphs.kernels import blas, gemm

needs_gemm = pytest.mark.skipif(not gemm.available(), reason="needs AVX-512F and a C compiler")
needs_blas = pytest.mark.skipif(not blas.available(), reason="needs scipy-openblas32 and a C compiler")

IMPLEMENTATIONS = {
    "generated": pytest.param(gemm.matmul, marks=needs_gemm),
    "blas": pytest.param(blas.matmul, marks=needs_blas),
}
implementations = pytest.mark.parametrize("matmul", list(IMPLEMENTATIONS.values()), ids=list(IMPLEMENTATIONS))

# (M, N, K); the large ones reach each threading strategy: row bands (tall), column bands (wide) and a shared
# team (too short and too narrow for bands)
ODD_SHAPES = [
    (1, 1, 1),
    (7, 33, 255),
    (33, 7, 1),
    (1, 255, 33),
    (255, 1, 7),
    (1000, 33, 255),
    (7, 1000, 255),
    (7, 255, 1000),
    (500, 1000, 70),  # column bands, their last partial vector split by rows across row blocks
    (13, 24, 40),  # a last panel of 8 columns (AVX2: half a vector's registers), then of 9
    (13, 25, 40),
]


def random(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


TORCH_ACTIVATIONS = {
    "none": lambda t: t,
    "relu": torch.relu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
}


def reference(
    a,
    b,
    *,
    bias=None,
    residual=None,
    activation="none",
    alpha=1.0,
    a_prologue="none",
    b_prologue="none",
    activation_after_residual=False,
) -> np.ndarray:
    """gemm.h in float64 torch: activation(alpha * a_prologue(a) @ b_prologue(b) + bias) + residual, or with
    `activation_after_residual` activation(alpha * a_prologue(a) @ b_prologue(b) + bias + residual)."""
    as64 = lambda x: torch.from_numpy(np.asarray(x, np.float64))
    a, b = TORCH_ACTIVATIONS[a_prologue](as64(a)), TORCH_ACTIVATIONS[b_prologue](as64(b))
    y = alpha * torch.matmul(a, b)
    if bias is not None:
        y = y + as64(bias)
    if residual is not None and activation_after_residual:
        y = y + as64(residual)
    y = TORCH_ACTIVATIONS[activation](y)
    if residual is not None and not activation_after_residual:
        y = y + as64(residual)
    return y.numpy()


def assert_close(actual: np.ndarray, expected: np.ndarray, k: int, context: str) -> None:
    assert actual.shape == expected.shape, context
    scale = np.sqrt(max(k, 1)) * max(1.0, float(np.abs(expected).max(initial=0.0)) / np.sqrt(max(k, 1)))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=2e-6 * scale, err_msg=context)


@implementations
@pytest.mark.parametrize(("m", "n", "k"), ODD_SHAPES)
def test_odd_shapes_agree_with_torch(matmul, m, n, k):
    a, b = random((m, k), 1), random((k, n), 2)
    assert_close(matmul(a, b), reference(a, b), k, f"{m}x{n}x{k}")


@needs_gemm
@pytest.mark.parametrize("transpose_a", [False, True])
def test_blocks_beyond_every_cache_block(transpose_a):
    """M, N, K past MC, NC and KC (several blocks each, none a multiple of the block)."""
    blocks = gemm.blocking()
    m, n, k = blocks["MC"] * 2 + 3, blocks["NC"] + 37, blocks["KC"] * 2 + 5
    a, b = random((k, m), 3).T if transpose_a else random((m, k), 3), random((k, n), 4)
    assert_close(gemm.matmul(a, b), reference(a, b), k, f"{m}x{n}x{k}")


@needs_gemm
@pytest.mark.parametrize("transpose_a", [False, True])
def test_row_blocks_of_whole_micro_panels_fill_a_whole_k_block(transpose_a):
    """M = 2 MC: row blocks of MC rows rounded up to whole micro-panels (258 for MC 256), each packed with K blocks
    of exactly KC, fill the packed A block to its last row (a buffer of MC x KC floats overflowed there:
    AddressSanitizer found the write past it; these values alone need not show it)."""
    blocks = gemm.blocking()
    m, n, k = blocks["MC"] * 2, 300, blocks["KC"] * 2  # past A_IN_PLACE_COLUMNS: A is packed
    a = random((k, m), 7).T if transpose_a else random((m, k), 7)
    b = random((k, n), 8)
    assert_close(gemm.matmul(a, b), reference(a, b), k, f"{m}x{n}x{k}")


@implementations
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_transposed_operands_through_strides(matmul, transpose_a, transpose_b):
    m, n, k = 37, 70, 45
    a = random((k, m), 5).T if transpose_a else random((m, k), 5)
    b = random((n, k), 6).T if transpose_b else random((k, n), 6)
    assert_close(matmul(a, b), reference(a, b), k, f"transpose_a={transpose_a} transpose_b={transpose_b}")


@needs_gemm
@pytest.mark.parametrize(("m", "n", "k"), ODD_SHAPES)
@pytest.mark.parametrize(("transpose_a", "transpose_b"), [(True, False), (False, True), (True, True)])
def test_transposed_operands_on_odd_shapes(m, n, k, transpose_a, transpose_b):
    """Each transposed operand has its own packing routine (A a column at a time, B by 16x16 transposes): their
    tails of rows, columns and reduction, and the zero padding of partial tiles."""
    a = random((k, m), 11).T if transpose_a else random((m, k), 11)
    b = random((n, k), 12).T if transpose_b else random((k, n), 12)
    assert_close(gemm.matmul(a, b), reference(a, b), k, f"{m}x{n}x{k} transpose_a={transpose_a} b={transpose_b}")


@needs_gemm
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("k", [1, 2, 3, 7, 8, 9, 15, 16, 17, 18, 31, 33, 383, 385, 769])
def test_packing_stores_at_every_edge_of_a_block(k, transpose_a, transpose_b):
    """Packing writes whole vectors whose overrun a later store of the same block overwrites, and masks only a
    block's last columns (A's K steps and panels, B's transposes): K around the transpose width (8, 16), the K
    block and its tail, with M and N ending inside a register tile and across panels."""
    for m, n in ((1, 1), (5, 17), (7, 9), (13, 33), (61, 40)):
        a = random((k, m), 13).T if transpose_a else random((m, k), 13)
        b = random((n, k), 14).T if transpose_b else random((k, n), 14)
        assert_close(gemm.matmul(a, b), reference(a, b), k, f"{m}x{n}x{k} transpose_a={transpose_a} b={transpose_b}")


@needs_gemm
@pytest.mark.parametrize("m", [6, 7, 12, 245, 481])
@pytest.mark.parametrize(("n", "k"), [(1, 5), (16, 33), (49, 400), (64, 800), (65, 70), (196, 90), (256, 40),
                                      (257, 40)])
def test_row_major_a_read_in_place_by_few_panels(m, n, k):
    """Few B panels read row-major A's full micro-panels in place (rows a stride apart, here a slice of a wider
    array) and pack only the rows past the last full one: every M remainder, row blocks (MC) and K blocks (KC), at
    most and just past the 256 columns (gemm.c's A_IN_PLACE_COLUMNS), with the whole epilogue."""
    a = random((m, k + 9), 15)[:, 3 : 3 + k]
    b, bias, residual = random((k, n), 16), random((n,), 17), random((m, n), 18)
    got = gemm.matmul(a, b, bias=bias, residual=residual, activation="relu", alpha=0.5)
    expected = reference(a, b, bias=bias, residual=residual, activation="relu", alpha=0.5)
    assert_close(got, expected, k, f"{m}x{n}x{k}")


@needs_gemm
@pytest.mark.parametrize("m", [5, 6])
@pytest.mark.parametrize("n", [145, 146])
@pytest.mark.parametrize("k", [385, 770])
@pytest.mark.parametrize("b_prologue", ["none", "gelu_tanh"])
def test_a_team_sharing_one_row_block_adds_the_last_columns_once(m, n, k, b_prologue):
    """A single row block that the team splits by panels, with its last few columns as dot products (gemm.c's
    with_dot_tail) and more than one K block: the tail is packed (and its prologue applied) by one thread and its
    partial sums added by one part of the block, not by each (which doubled every K block after the first)."""
    a, b = random((m, k), 29), random((k, n + 11), 30)[:, 5 : 5 + n]
    got = gemm.matmul(a, b, b_prologue=b_prologue, activation="relu")
    assert_close(got, reference(a, b, b_prologue=b_prologue, activation="relu"), k, f"{m}x{n}x{k} {b_prologue}")


@needs_gemm
@pytest.mark.parametrize("m", [5, 6, 16, 31, 32, 33])
@pytest.mark.parametrize(("n", "k"), [(64, 16), (100, 64), (145, 385), (1000, 385), (3025, 128), (200, 1000)])
def test_few_rows_read_whole_b_panels_in_place(m, n, k):
    """With few rows of A (at most gemm.c's B_IN_PLACE_ROWS, and just past it) the whole panels of row-major B are
    multiplied where B lies (rows a stride apart that no vector load is aligned to: a slice of a wider array) and
    only a last partial panel is packed: short reductions, K blocks (KC), and the threads' column bands (wide
    products), with the whole epilogue."""
    b = random((k, n + 11), 25)[:, 5 : 5 + n]
    a, bias, residual = random((m, k), 26), random((n,), 27), random((m, n), 28)
    got = gemm.matmul(a, b, bias=bias, residual=residual, activation="relu", alpha=0.5)
    expected = reference(a, b, bias=bias, residual=residual, activation="relu", alpha=0.5)
    assert_close(got, expected, k, f"{m}x{n}x{k}")


@needs_gemm
@pytest.mark.parametrize("m", [12, 13, 250])
@pytest.mark.parametrize("n", [17, 18, 19, 20, 21, 49, 196])
@pytest.mark.parametrize("k", [7, 40, 385, 1000])
@pytest.mark.parametrize("epilogue", ["affine", "residual", "general"])
def test_last_few_columns_as_dot_products(m, n, k, epilogue):
    """The last N % 16 columns of a product whose A rows are read in place, when at most 4 (gemm.c's dot_tail; 5
    take a vector tile), with each kind of epilogue: a bias per row and relu, that and a residual, a bias per
    column; K within one block and across K blocks (KC), not a multiple of 16; the rows past the last full micro-panel
    (m = 13) take a vector tile."""
    a = random((m, k + 5), 20)[:, 2 : 2 + k]
    b = random((k, n), 21)
    arguments = {"affine": dict(bias=random((m, 1), 22), activation="relu", alpha=0.5),
                 "residual": dict(bias=random((m, 1), 22), residual=random((m, n), 23), activation="relu"),
                 "general": dict(bias=random((n,), 24), alpha=-2.0)}[epilogue]
    assert_close(gemm.matmul(a, b, **arguments), reference(a, b, **arguments), k, f"{m}x{n}x{k} {epilogue}")


@needs_gemm
@pytest.mark.parametrize(("m", "n"), [(7, 40), (300, 200), (521, 1000), (1000, 37)])
@pytest.mark.parametrize("k", [1, 10, 31, 32])
@pytest.mark.parametrize("layout", ["plain", "transposed"])
@pytest.mark.parametrize("a_prologue", ["none", "relu"])
def test_short_reductions_walk_c_along_its_rows(m, n, k, layout, a_prologue):
    """K below gemm.c's SHORT_REDUCTION: the tiles go along C's rows, every B panel packed (and activated) first,
    across row blocks (MC), A read in place (no prologue, few panels) or packed, panels of every width and a last
    partial vector; K 32 takes the usual order. With the whole epilogue and a prologue on B."""
    a, b = operands(m, n, k, layout, 23)
    arguments = dict(a_prologue=a_prologue, b_prologue="gelu_tanh", bias=random((n,), 25),
                     residual=random((m, n), 26), activation="relu", alpha=0.5)
    assert_close(gemm.matmul(a, b, **arguments), reference(a, b, **arguments), k, f"{layout} {m}x{n}x{k}")


@needs_gemm
@pytest.mark.parametrize("m", [12, 13, 14, 15, 16, 17])
@pytest.mark.parametrize(("n", "k"), [(40, 10), (40, 70), (300, 70)])
@pytest.mark.parametrize("layout", ["plain", "transposed", "strided"])
@pytest.mark.parametrize("activation", ["relu", "gelu_tanh"])
def test_short_last_row_tiles_multiply_only_the_rows_they_hold(m, n, k, layout, activation):
    """The last row tile of every height (m % 6 rows: gemm.c's tiles multiply a third, two thirds or all of their
    TG_MR rows), with A read in place (few panels, row-major), packed (many panels, transposed or strided), short
    and long K, the epilogue on registers (relu) or by vector (gelu), and a residual."""
    a, b = operands(m, n, k, layout, 31)
    arguments = dict(bias=random((m, 1), 33), residual=random((m, n), 34), activation=activation, alpha=0.5)
    assert_close(gemm.matmul(a, b, **arguments), reference(a, b, **arguments), k, f"{layout} {m}x{n}x{k}")


@needs_gemm
@pytest.mark.parametrize("m", [7, 13, 300, 521])
@pytest.mark.parametrize(("n", "k"), [(1, 5), (8, 33), (10, 1000), (16, 400), (17, 40)])
def test_relu_of_a_taken_in_place_by_a_single_panel(m, n, k):
    """A single B panel (N <= 16, a classifier head's) reads row-major A in place with its relu prologue taken as
    each element is read: the full micro-panels in place (rows a stride apart, a slice of a wider array), the rows
    past them packed and activated, across row blocks (MC) and K blocks (KC); N 17 (two panels) packs A. With the
    whole epilogue."""
    a = random((m, k + 9), 27)[:, 3 : 3 + k]
    b, bias, residual = random((k, n), 28), random((n,), 29), random((m, n), 30)
    arguments = dict(a_prologue="relu", bias=bias, residual=residual, activation="relu", alpha=0.5)
    assert_close(gemm.matmul(a, b, **arguments), reference(a, b, **arguments), k, f"{m}x{n}x{k}")


@implementations
@pytest.mark.parametrize(("m", "n", "k"), [*ODD_SHAPES, (3, 40, 20)])  # (3, 40, 20): the few-row kernel, bands
@pytest.mark.parametrize("activation", ["relu", "gelu_tanh"])
@pytest.mark.parametrize("after_residual", [False, True])
def test_activation_before_or_after_the_residual(matmul, m, n, k, activation, after_residual):
    """activation(alpha * a @ b + bias) + residual and activation(alpha * a @ b + bias + residual) (a ResNet block's
    relu after its skip connection), on every path: the few-row kernel, the blocked one's tiles of every width, the
    BLAS kernel's pass."""
    a, b, bias, residual = random((m, k), 31), random((k, n), 32), random((n,), 33), random((m, n), 34)
    arguments = dict(bias=bias, residual=residual, activation=activation, alpha=-0.5,
                     activation_after_residual=after_residual)
    assert_close(matmul(a, b, **arguments), reference(a, b, **arguments), k, f"{m}x{n}x{k} {arguments}")


@implementations
@pytest.mark.parametrize("m", [2, 16])  # the few-row kernel, the blocked one
def test_activation_after_the_residual_keeps_nan_inf_and_signed_zeros_like_torch(matmul, m):
    """relu(NaN) is NaN, relu(-inf) 0 and relu(-0.0) -0.0 as in torch: a zero product times alpha -1 is -0.0, plus a
    -0.0 bias and residual stays -0.0, and -0.0 plus +0.0 is +0.0. (OpenBLAS's sgemm gives +0.0 for alpha -1 times
    a zero product: the BLAS kernel's signs of zero are its product's.)"""
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, -3.0], np.float32)
    a, b = np.zeros((m, 5), np.float32), random((5, 24), 35)
    residual = np.resize(special, (m, 24))
    bias = np.full(24, -0.0, np.float32)
    for after_residual in (False, True):
        arguments = dict(bias=bias, residual=residual, activation="relu", alpha=-1.0,
                         activation_after_residual=after_residual)
        got, expected = matmul(a, b, **arguments), reference(a, b, **arguments)
        np.testing.assert_array_equal(got, expected.astype(np.float32), err_msg=str(after_residual))
        if matmul is gemm.matmul:
            np.testing.assert_array_equal(np.signbit(got), np.signbit(expected), err_msg=str(after_residual))


@needs_gemm
def test_the_gradient_activation_never_comes_after_the_residual():
    a, b, residual = random((3, 4), 36), random((4, 5), 37), random((3, 5), 38)
    with pytest.raises(ArgumentError, match="after the residual"):
        gemm.matmul(a, b, residual=residual, activation="gelu_tanh_grad", activation_after_residual=True)


@needs_gemm
def test_relu_of_a_taken_in_place_propagates_nan_and_inf_like_torch():
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 1e30, -1e30, -20.0, 3.0], np.float32)
    a, b = np.tile(special[:, None], (2, 3)), np.ones((3, 10), np.float32)  # 16 rows: past the few-row kernel
    np.testing.assert_allclose(gemm.matmul(a, b, a_prologue="relu"), reference(a, b, a_prologue="relu"), rtol=1e-6)


@implementations
def test_general_strides(matmul):
    """Neither stride is 1 (every other row and column): the generated kernel packs, BLAS copies."""
    a, b = random((40, 66), 7)[::2, ::3], random((44, 34), 8)[::2, ::2]
    assert_close(matmul(a, b), reference(a, b), 22, "strided")


BATCH_CASES = [
    ((4, 7, 9), (9, 5)),  # shared B: folded into one taller GEMM
    ((7, 9), (4, 9, 5)),  # shared A: stride-0 batch
    ((2, 1, 7, 33), (3, 33, 5)),  # two broadcast batch dims
    ((8, 30, 40), (8, 40, 20)),  # one small problem per thread
    ((3, 65, 40), (3, 40, 70)),  # whole team per problem
]


@implementations
@pytest.mark.parametrize(("a_shape", "b_shape"), BATCH_CASES, ids=str)
def test_batched_and_broadcast_batches(matmul, a_shape, b_shape):
    a, b = random(a_shape, 9), random(b_shape, 10)
    assert_close(matmul(a, b), reference(a, b), a_shape[-1], f"{a_shape} @ {b_shape}")


@implementations
@pytest.mark.parametrize(("a_shape", "b_shape"), [((7,), (7,)), ((7,), (3, 7, 5)), ((2, 4, 7), (7,))], ids=str)
def test_vectors_are_promoted_and_squeezed_like_torch(matmul, a_shape, b_shape):
    a, b = random(a_shape, 18), random(b_shape, 19)
    assert_close(matmul(a, b), reference(a, b), 7, f"{a_shape} @ {b_shape}")


@implementations
def test_batch_dims_that_do_not_merge(matmul):
    """A permuted batch view: the wrapper loops over the outer dim and passes the inner one as a batch stride."""
    a = random((5, 3, 7, 9), 11).transpose(1, 0, 2, 3)
    b = random((3, 9, 4), 12)[:, None]
    assert_close(matmul(a, b), reference(a, b), 9, "permuted batch")


EPILOGUES = {
    "bias": dict(bias="row"),
    "column_bias": dict(bias="column"),
    "relu": dict(activation="relu"),
    "gelu": dict(activation="gelu_tanh"),
    "residual": dict(residual=True),
    "scale": dict(alpha=0.125),
    "linear_bias_gelu": dict(bias="row", activation="gelu_tanh"),
    "everything": dict(bias="row", activation="relu", residual=True, alpha=-0.5),
}


@implementations
@pytest.mark.parametrize("epilogue", list(EPILOGUES.values()), ids=list(EPILOGUES))
@pytest.mark.parametrize(("m", "n", "k"), [(33, 255, 7), (100, 70, 600), (20, 300, 40)])  # (20, 300): column bands
def test_epilogues(matmul, epilogue, m, n, k):
    a, b = random((2, m, k), 13), random((k, n), 14)
    arguments = dict(epilogue)
    bias_shape = {"row": (n,), "column": (m, 1)}
    if "bias" in arguments:
        arguments["bias"] = random(bias_shape[arguments["bias"]], 15)
    if arguments.get("residual"):
        arguments["residual"] = random((2, m, n), 16)
    assert_close(matmul(a, b, **arguments), reference(a, b, **arguments), k, f"{epilogue} {m}x{n}x{k}")


@needs_gemm
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["rows", "columns", "both_transposed"])
@pytest.mark.parametrize("epilogue", ["bias", "column_bias", "everything"])
@pytest.mark.parametrize(("n", "k"), [(70, 37), (1000, 300), (1, 17), (17, 1)])  # (1000, 300): two threads
def test_few_row_products_read_b_in_place(m, layout, epilogue, n, k):
    """At most four rows skip packing (gemv.c): B's rows or columns contiguous, a batch of B (attention's keys),
    A transposed, and every epilogue."""
    a = random((3, k, m), 21).transpose(0, 2, 1) if layout == "both_transposed" else random((3, m, k), 21)
    b = random((3, k, n), 22) if layout == "rows" else random((3, n, k), 22).transpose(0, 2, 1)
    arguments = dict(EPILOGUES[epilogue])
    if "bias" in arguments:
        arguments["bias"] = random({"row": (n,), "column": (m, 1)}[arguments["bias"]], 23)
    if arguments.get("residual"):
        arguments["residual"] = random((3, m, n), 24)
    assert_close(gemm.matmul(a, b, **arguments), reference(a, b, **arguments), k, f"{layout} {m}x{n}x{k}")


@needs_gemm
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("layout", ["rows", "columns", "both_transposed"])
@pytest.mark.parametrize("operand", ["a", "b"])
def test_few_row_products_with_prologues(m, layout, operand):
    k, n = 37, 70
    a = random((k, m), 25).T if layout == "both_transposed" else random((m, k), 25)
    b = random((k, n), 26) if layout == "rows" else random((n, k), 26).T
    prologue = {f"{operand}_prologue": "gelu_tanh"}
    assert_close(gemm.matmul(a, b, **prologue), reference(a, b, **prologue), k, f"{layout} {operand}")


def few_row_operands(m: int, n: int, k: int, layout: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """a (m x k) and b (k x n) as gemv.c reads them: b's columns contiguous (a linear layer's x @ W.T), its rows
    contiguous, either one inside a wider buffer (rows or columns padded), or a not row-major (a strided copy)."""
    a = random((m, 2 * k + 1), seed)[:, 1::2] if layout == "strided_a" else random((m, k), seed)
    if layout in ("rows", "padded_rows"):
        return a, random((k, n + 3 * (layout == "padded_rows")), seed + 1)[:, :n]
    return a, random((n, k + 5 * (layout == "padded_columns")), seed + 1)[:, :k].T


@needs_gemm
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["columns", "rows", "padded_columns", "padded_rows", "strided_a"])
def test_few_row_products_on_every_tail_read_b_in_place(m, layout):
    """Sizes around the vector width (8 or 16 lanes) and the blocks of columns (16 in the dot order, up to 128 in
    the row order), and block counts that the dot order's streams (up to 8 blocks a task) do not divide, with a
    row bias: every one is computed without packing B."""
    before = gemm.path_counts()
    shapes = [(n, k) for n in (1, 7, 9, 17, 33, 130, 257) for k in (1, 5, 8, 17, 100, 511, 600)]
    for n, k in shapes:
        a, b = few_row_operands(m, n, k, layout, 31)
        bias = random((n,), 32)
        assert_close(gemm.matmul(a, b, bias=bias), reference(a, b, bias=bias), k, f"{layout} {m}x{n}x{k}")
    after = gemm.path_counts()
    assert (after["few_rows"] - before["few_rows"], after["blocked"] - before["blocked"]) == (len(shapes), 0)


@needs_gemm
def test_few_row_products_with_a_prologue_on_b_pack_it():
    """Activating B while reading it in every call is the blocked driver's job (it activates what it packs)."""
    a, b = random((1, 40), 33), random((40, 30), 34)
    before = gemm.path_counts()
    assert_close(gemm.matmul(a, b, b_prologue="relu"), reference(a, b, b_prologue="relu"), 40, "b prologue")
    after = gemm.path_counts()
    assert (after["few_rows"] - before["few_rows"], after["blocked"] - before["blocked"]) == (0, 1)


@needs_gemm
@pytest.mark.parametrize("layout", ["columns", "rows", "strided_a"])
def test_few_row_products_propagate_nan_and_inf(layout):
    """NaN and infinities in A, and in B's last column and last element of K (the tails): each reaches the
    outputs that read it (inf * 0 is NaN), and no other."""
    for m, n, k in ((2, 5, 3), (1, 9, 17), (3, 130, 33)):
        a, b = few_row_operands(m, n, k, layout, 35)
        a[-1, -1], a[0, 0] = np.inf, np.nan if m > 1 else a[0, 0]
        b[-1, -1], b[k // 2, 0], b[-1, n // 2] = np.nan, -np.inf, 0.0
        expected, actual = reference(a, b).astype(np.float32), gemm.matmul(a, b)
        context = f"{layout} {m}x{n}x{k}"
        special = ~np.isfinite(expected)
        assert np.isnan(expected).any() and np.isinf(expected).any(), context
        np.testing.assert_array_equal(actual[special], expected[special], err_msg=context)
        assert_close(np.where(special, 0, actual), np.where(special, 0, expected), k, context)


@implementations
def test_activations_propagate_nan_and_inf_like_torch(matmul):
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 1e30, -1e30, -20.0, 3.0], np.float32)
    a, b = special[:, None], np.ones((1, 17), np.float32)
    for activation in ("relu", "gelu_tanh"):
        expected = reference(a, b, activation=activation)
        np.testing.assert_allclose(matmul(a, b, activation=activation), expected, rtol=1e-6, err_msg=activation)


def gelu_tanh_derivative(h: np.ndarray) -> np.ndarray:
    """gelu'(h), tanh form, by float64 torch autograd."""
    x = torch.from_numpy(np.asarray(h, np.float64)).requires_grad_()
    (slope,) = torch.autograd.grad(torch.nn.functional.gelu(x, approximate="tanh").sum(), [x])
    return slope.numpy()


@implementations
@pytest.mark.parametrize(("m", "n", "k"), [(33, 255, 7), (100, 70, 600), (20, 300, 40), (13, 8, 40), (1000, 33, 255)])
def test_gelu_gradient_epilogue(matmul, m, n, k):
    """(a @ b + bias) * gelu'(h), h read as the residual (gelu's backward fused into the product): partial tiles,
    a last panel of 8 columns, several K blocks (600 > KC: the last one applies it), bands and a batch."""
    a, b, bias, h = random((2, m, k), 17), random((k, n), 18), random((n,), 19), 3 * random((2, m, n), 20)
    expected = reference(a, b, bias=bias) * gelu_tanh_derivative(h)
    actual = matmul(a, b, bias=bias, residual=h, activation="gelu_tanh_grad")
    assert_close(actual, expected, k, f"{m}x{n}x{k}")


@needs_gemm
def test_gelu_and_its_gradient_are_accurate_over_the_whole_range():
    """gelu and gelu' (epilogue, prologue, gradient epilogue) within a few ulp of float64 over [-30, 30], through the
    tails where exp(-2u) leaves the float range (0 or inf: gelu's exact zeros), as x * sigmoid(2u) in float64. (Where
    the result is tiny, float32's u is only good to ~1e-7 * |2u|, which exp scales: hence the absolute tolerance.)"""
    x = np.concatenate([np.linspace(-30, 30, 6001), [-11.5, -10.8, -10.5, 9.5, 10.0]]).astype(np.float32)
    x64 = torch.from_numpy(x.astype(np.float64))
    u = 0.7978845608028654 * (x64 + 0.044715 * x64**3)
    s = torch.sigmoid(2 * u)
    expected = {"gelu": (x64 * s).numpy(),
                "gradient": (s + 2 * x64 * s * (1 - s) * 0.7978845608028654 * (1 + 3 * 0.044715 * x64**2)).numpy()}
    column, ones = x[:, None], np.ones((1, 17), np.float32)
    actual = {"gelu": [gemm.matmul(column, ones, activation="gelu_tanh"),
                       gemm.matmul(column, ones, a_prologue="gelu_tanh")],
              "gradient": [gemm.matmul(np.ones_like(column), ones, residual=np.repeat(column, 17, 1),
                                       activation="gelu_tanh_grad")]}
    for name, results in actual.items():
        for result in results:
            np.testing.assert_allclose(result, np.repeat(expected[name][:, None], 17, 1), rtol=2e-6, atol=1e-7,
                                       err_msg=name)


def test_gelu_gradient_epilogue_needs_its_input():
    with pytest.raises(ArgumentError, match="residual"):
        gemm.bind_gemm(lambda *args: 0, random((3, 4), 0), random((4, 2), 0), activation="gelu_tanh_grad")


PROLOGUES = [("a", "relu"), ("a", "gelu_tanh"), ("b", "relu"), ("b", "gelu_tanh")]
prologues = pytest.mark.parametrize(("operand", "prologue"), PROLOGUES, ids=[f"{o}:{p}" for o, p in PROLOGUES])


def operands(m: int, n: int, k: int, layout: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """a (m x k) and b (k x n): contiguous, both transposed (strides swapped), or neither stride 1."""
    if layout == "transposed":
        return random((k, m), seed).T, random((n, k), seed + 1).T
    if layout == "strided":
        return random((2 * m, 3 * k), seed)[::2, ::3], random((2 * k, 2 * n), seed + 1)[::2, ::2]
    return random((m, k), seed), random((k, n), seed + 1)


@implementations
@prologues
@pytest.mark.parametrize("layout", ["plain", "transposed", "strided"])
@pytest.mark.parametrize(("m", "n", "k"), ODD_SHAPES)
def test_prologues_on_odd_shapes_and_every_packing_path(matmul, operand, prologue, layout, m, n, k):
    """Each packing path (row-major A by 16x16 transposes, transposed A a column at a time, B by rows or by
    transposes, strided operands element by element) and each threading strategy activates what it packs, and
    the zero padding of partial tiles stays zero."""
    a, b = operands(m, n, k, layout, 20)
    arguments = {f"{operand}_prologue": prologue}
    assert_close(matmul(a, b, **arguments), reference(a, b, **arguments), k, f"{arguments} {layout} {m}x{n}x{k}")


@implementations
@prologues
@pytest.mark.parametrize(("a_shape", "b_shape"), BATCH_CASES, ids=str)
def test_prologues_on_batched_and_broadcast_batches(matmul, operand, prologue, a_shape, b_shape):
    a, b = random(a_shape, 21), random(b_shape, 22)
    arguments = {f"{operand}_prologue": prologue}
    assert_close(matmul(a, b, **arguments), reference(a, b, **arguments), a_shape[-1], f"{arguments} {a_shape}")


@implementations
@pytest.mark.parametrize("epilogue", ["linear_bias_gelu", "everything"])
@pytest.mark.parametrize(("m", "n", "k"), [(33, 255, 7), (100, 70, 600), (20, 300, 40)])
def test_prologues_with_epilogues(matmul, epilogue, m, n, k):
    """gelu on A, relu on a transposed B, and the epilogue: nothing interferes."""
    a, b = random((2, m, k), 23), random((n, k), 24).T
    arguments = dict(EPILOGUES[epilogue], a_prologue="gelu_tanh", b_prologue="relu", bias=random((n,), 25))
    if arguments.get("residual"):
        arguments["residual"] = random((2, m, n), 26)
    assert_close(matmul(a, b, **arguments), reference(a, b, **arguments), k, f"{epilogue} {m}x{n}x{k}")


@needs_gemm
def test_prologues_beyond_every_cache_block():
    """Several column blocks (A packed, and activated, once per block of NC columns) and K blocks."""
    blocks = gemm.blocking()
    m, n, k = blocks["MC"] + 3, blocks["NC"] + 37, blocks["KC"] + 5
    a, b = random((k, m), 27).T, random((k, n), 28)
    arguments = dict(a_prologue="gelu_tanh", b_prologue="gelu_tanh")
    assert_close(gemm.matmul(a, b, **arguments), reference(a, b, **arguments), k, f"{m}x{n}x{k}")


@implementations
@pytest.mark.parametrize("operand", ["a", "b"])
def test_prologues_propagate_nan_and_inf_like_torch(matmul, operand):
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 1e30, -1e30, -20.0, 3.0], np.float32)
    a, b = (
        (special[:, None], np.ones((1, 17), np.float32))
        if operand == "a"
        else (np.ones((17, 1), np.float32), special[None, :])
    )
    for prologue in ("relu", "gelu_tanh"):
        arguments = {f"{operand}_prologue": prologue}
        np.testing.assert_allclose(
            matmul(a, b, **arguments), reference(a, b, **arguments), rtol=1e-6, err_msg=f"{arguments}"
        )


@implementations
def test_empty_reduction_gives_the_epilogue_of_zero(matmul):
    bias = random((5,), 17)
    np.testing.assert_allclose(
        matmul(np.ones((3, 0), np.float32), np.ones((0, 5), np.float32), bias=bias), np.broadcast_to(bias, (3, 5))
    )


@needs_gemm
def test_bad_arguments_raise_where_called():
    with pytest.raises(ShapeError, match="matmul"):
        gemm.matmul(random((3, 4), 0), random((5, 2), 0))
    with pytest.raises(ArgumentError, match="float32"):
        gemm.matmul(np.ones((3, 4)), random((4, 2), 0))
    with pytest.raises(ArgumentError, match="overlap"):
        residual = random((3, 2), 0)
        gemm.matmul(random((3, 4), 0), random((4, 2), 0), residual=residual, out=residual)
    with pytest.raises(ArgumentError, match="activation"):
        gemm.matmul(random((3, 4), 0), random((4, 2), 0), activation="tanh")
    with pytest.raises(ArgumentError, match="b_prologue"):
        gemm.matmul(random((3, 4), 0), random((4, 2), 0), b_prologue="tanh")


C_CALLER = r"""
#include <stdio.h>
#include "gemm.h"
int main(void) {
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, -1, 2, 0.5f, 1}, bias[2] = {10, 20}, c[4];
    /* (2x3) @ relu(3x2) + bias, relu */
    int status = GEMM(1, 2, 2, 3, a, 0, 3, 1, b, 0, 2, 1, c, 0, 2, 1.0f, bias, 0, 0, 1, NULL, 0, 0, TG_ACT_RELU,
                      TG_ACT_NONE, TG_ACT_RELU);
    printf("%d %g %g %g %g\n", status, c[0], c[1], c[2], c[3]);
    return status;
}
"""


@pytest.mark.parametrize(
    "kernel", [pytest.param("generated", marks=needs_gemm), pytest.param("blas", marks=needs_blas)]
)
def test_a_c_program_links_and_calls_the_kernel(kernel, tmp_path):
    """What generated C does: include gemm.h, link the cached library, call the function by name."""
    library = gemm.library_path() if kernel == "generated" else blas.library_path()
    function = gemm.C_FUNCTIONS["matmul"] if kernel == "generated" else blas.C_FUNCTION
    assert f"tg_gemm_fn {function};" in gemm.HEADER.read_text()
    (tmp_path / "caller.c").write_text(C_CALLER)
    command = [
        "gcc",
        f"-DGEMM={function}",
        f"-I{gemm.HEADER.parent}",
        str(tmp_path / "caller.c"),
        str(library),
        f"-Wl,-rpath,{library.parent}",
        "-o",
        str(tmp_path / "caller"),
    ]
    subprocess.run(command, check=True)
    output = subprocess.run([str(tmp_path / "caller")], capture_output=True, text=True, check=True).stdout.split()
    expected = np.maximum(
        np.arange(1, 7, dtype=np.float32).reshape(2, 3) @ np.float32([[1, 0], [0, 2], [0.5, 1]]) + np.float32([10, 20]),
        0,
    )
    assert output[0] == "0"
    np.testing.assert_allclose(np.float32(output[1:]).reshape(2, 2), expected)


@implementations
def test_concurrent_calls_from_python_threads(matmul):
    """ctypes drops the GIL: each calling thread has its own packing scratch and OpenMP team."""
    pairs = [(random((150, 70), seed), random((70, 90), seed + 1)) for seed in range(0, 16, 2)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda pair: matmul(*pair), pairs))
    for (a, b), result in zip(pairs, results, strict=True):
        assert_close(result, reference(a, b), 70, "concurrent")


# ---------------------------------------------------------------------------
# bfloat16 products
# ---------------------------------------------------------------------------

# The bfloat16 GEMM (`gemm.matmul(..., dtype="bfloat16")`, VDPBF16PS) against a numpy oracle that rounds the
# (prologue-activated) operands to bfloat16, multiplies in float64 and rounds the epilogue's result to bfloat16.
#
# Tolerance: the kernel's products of bfloat16 values are exact in float32, its sum of K of them is within
# K * 2^-24 * sum|a||b| of the exact one (float32 summation), and the result is then rounded to bfloat16 (half an
# ulp: 2^-9 relative). So every element is within 2^-8 |exact| + K * 2^-23 * sum|a||b| of the oracle, and almost
# every element equals the oracle rounded to bfloat16 (they differ only where the float32 sum and the exact one
# round to different sides of a bfloat16 boundary). A kernel that did not round its float32 operands would miss
# that: its operands differ from the oracle's by up to 2^-9 relative each, so most results would round differently.


def bf16(x: np.ndarray) -> np.ndarray:
    return dtypes.round_to_storage(np.asarray(x, np.float32), dtypes.bfloat16)


def oracle(
    a, b, *, bias=None, residual=None, activation="none", alpha=1.0, a_prologue="none", b_prologue="none"
) -> tuple[np.ndarray, np.ndarray]:
    """The exact bfloat16 product (float64, before the final rounding) and sum |a||b| for the tolerance."""
    activated = lambda x, name: TORCH_ACTIVATIONS[name](torch.from_numpy(np.asarray(x, np.float32))).numpy()
    a64, b64 = (bf16(activated(x, name)).astype(np.float64) for x, name in ((a, a_prologue), (b, b_prologue)))
    bound = np.abs(alpha) * (np.abs(a64) @ np.abs(b64))
    y = alpha * (a64 @ b64)
    if bias is not None:
        y = y + bias
    y = TORCH_ACTIVATIONS[activation](torch.from_numpy(y)).numpy()
    return (y + residual if residual is not None else y), bound


def assert_bf16_product(actual: np.ndarray, exact: np.ndarray, bound: np.ndarray, k: int, context: str) -> None:
    assert actual.shape == exact.shape, context
    np.testing.assert_array_equal(actual, bf16(actual), err_msg=f"{context}: results are not bfloat16 values")
    tolerance = 2.0**-8 * np.abs(exact) + k * 2.0**-23 * bound + 1e-30
    excess = np.abs(actual - exact) - tolerance
    assert excess.max(initial=-1) <= 0, f"{context}: off by {excess.max()} beyond the tolerance"
    same = np.mean(actual == bf16(exact))
    assert same >= 0.9, f"{context}: only {same:.0%} of the results are the exact product rounded"


@needs_gemm
@pytest.mark.parametrize(("m", "n", "k"), [*ODD_SHAPES, (2, 3, 2), (64, 64, 64), (130, 260, 801)])
@pytest.mark.parametrize("layout", ["plain", "transposed", "strided"])
def test_bf16_products_of_float32_operands_rounded_while_packed(m, n, k, layout):
    """Operands that are not bfloat16 values are rounded on every packing path (odd K included: the last pair
    is padded with zero)."""
    a, b = operands(m, n, k, layout, 3)
    assert_bf16_product(gemm.matmul(a, b, dtype="bfloat16"), *oracle(a, b), k, f"{layout} {m}x{n}x{k}")


@needs_gemm
def test_bf16_operands_give_the_float32_sum_of_exact_products():
    """Small integers: every product and partial sum is exact in float32, so the result is exact."""
    rng = np.random.default_rng(0)
    a, b = rng.integers(-8, 9, (37, 300)).astype(np.float32), rng.integers(-8, 9, (300, 45)).astype(np.float32)
    expected = bf16(a.astype(np.float64) @ b)
    np.testing.assert_array_equal(gemm.matmul(a, b, dtype="bfloat16"), expected)


@needs_gemm
@pytest.mark.parametrize(("a_shape", "b_shape"), [((3, 40, 70), (3, 70, 50)), ((4, 1, 33, 20), (5, 20, 17))])
def test_bf16_batched_and_broadcast_batches(a_shape, b_shape):
    a, b = random(a_shape, 5), random(b_shape, 6)
    exact, bound = oracle(a, b)
    assert_bf16_product(gemm.matmul(a, b, dtype="bfloat16"), exact, bound, a_shape[-1], f"{a_shape} @ {b_shape}")


@needs_gemm
@pytest.mark.parametrize(("m", "n", "k"), [(33, 255, 7), (100, 70, 600), (20, 300, 40)])
def test_bf16_epilogue_then_one_rounding(m, n, k):
    """alpha, bias, activation and residual apply to the float32 sum; the result is rounded once, last."""
    a, b = random((2, m, k), 13), random((k, n), 14)
    arguments = dict(bias=random((n,), 15), residual=random((2, m, n), 16), activation="gelu_tanh", alpha=-0.5)
    exact, bound = oracle(a, b, **arguments)
    bound = bound + np.abs(arguments["residual"]) + np.abs(arguments["bias"])
    assert_bf16_product(gemm.matmul(a, b, dtype="bfloat16", **arguments), exact, bound, k, f"{m}x{n}x{k}")


@needs_gemm
@pytest.mark.parametrize("operand", ["a", "b"])
def test_bf16_prologue_applies_before_rounding(operand):
    a, b = random((50, 90), 7), random((90, 40), 8)
    prologue = {f"{operand}_prologue": "gelu_tanh"}
    assert_bf16_product(gemm.matmul(a, b, dtype="bfloat16", **prologue), *oracle(a, b, **prologue), 90, operand)


@needs_gemm
def test_bf16_nan_and_inf_propagate():
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 1e30, -3.0], np.float32)
    a, b = special[:, None], np.ones((1, 17), np.float32)
    expected = bf16(special[:, None] * np.ones((1, 17), np.float32))
    np.testing.assert_array_equal(gemm.matmul(a, b, dtype="bfloat16"), expected)


@needs_gemm
def test_bf16_operands_with_a_float32_result_are_not_rounded_at_the_end():
    """Small integers whose sums need more than bfloat16's 8 bits: exact in float32, so the unrounded result is
    the exact product."""
    rng = np.random.default_rng(1)
    a, b = rng.integers(-8, 9, (30, 200)).astype(np.float32), rng.integers(-8, 9, (200, 20)).astype(np.float32)
    exact = a.astype(np.float64) @ b
    assert not np.array_equal(exact, bf16(exact))
    np.testing.assert_array_equal(gemm.matmul(a, b, dtype="bfloat16", result="float32"), exact)
    a, b = random((33, 300), 2), random((300, 17), 3)
    unrounded = gemm.matmul(a, b, dtype="bfloat16", result="float32")
    np.testing.assert_array_equal(bf16(unrounded), gemm.matmul(a, b, dtype="bfloat16"))


@needs_gemm
def test_gemm_unknown_dtype_raises():
    with pytest.raises(ArgumentError, match="must be one of"):
        gemm.matmul(random((2, 2), 0), random((2, 2), 1), dtype="float16")
