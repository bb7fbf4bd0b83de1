"""Float32 matrix products run by the GEMM library from generated C (schedule.extern)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.codegen.loop_ir import GemmCall
from tensorgraphs.graph.ops import Op
from tensorgraphs.kernels import gemm
from tensorgraphs.rewrite import optimize
from tensorgraphs.rewrite.pattern import var
from tensorgraphs.schedule import extern
from tensorgraphs.schedule.extern import GEMM_EPILOGUE, GEMM_PROLOGUE, RESIDUAL, EpilogueRule, fuse_epilogues
from tensorgraphs.schedule.fusion import Schedule, schedule_kernels, to_primitive

pytestmark = [pytest.mark.device("cpu", compile=True),  # checks generated C, small graphs included
              pytest.mark.skipif(not gemm.available(), reason="the GEMM library needs AVX-512")]


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
            (call,) = [k for k in schedule.kernels if "matmul" in k.name]
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


@pytest.mark.parametrize("m, k, n", [(1, 7, 33), (33, 65, 7), (40, 128, 96)])
def test_bfloat16_product_reads_float32_operands_in_place(m: int, k: int, n: int) -> None:
    """x.bfloat16() @ w.bfloat16().T (what autocast builds for a linear): one bfloat16 GEMM call that reads both
    float32 inputs, since the library rounds operands while packing; the result is torch's bfloat16 product
    (float32 sums of exact products, rounded once), to one bfloat16 rounding of summation-order differences."""
    rng = np.random.default_rng(m + k + n)
    x, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((n, k), dtype=np.float32)
    expected = (torch.from_numpy(x).bfloat16() @ torch.from_numpy(w).bfloat16().T).float().numpy()
    with tg.device("cpu"):
        result = tg.tensor(x).bfloat16() @ tg.tensor(w).bfloat16().T
        schedule = schedule_kernels([result.node])
        ((call, kernel),) = [(s, k) for k in schedule.kernels for s in k.body if isinstance(s, GemmCall)]
        assert call.dtype is tg.bfloat16 and len(schedule.kernels) == 1
        role = {spec.name: spec.role for spec in schedule.buffers}
        assert all(role[b.name] == "input" for b in kernel.buffers if not b.writes)
        assert "tg_gemm_bf16(" in _program_source(result)
        np.testing.assert_allclose(result.float().numpy(), expected, rtol=2**-7, atol=k * 2**-20)


@pytest.mark.parametrize("epilogue", ["reshape", "scale", "bias", "relu", "residual", "widen"])
def test_ops_after_a_bfloat16_product_round_as_the_graph_says(epilogue: str) -> None:
    """A bfloat16 product rounds its result; a scale, bias, activation or residual after it is a bfloat16 op of its
    own, rounding again (as torch and the numpy device do), so it is not fused into the call (which would apply it
    before the one rounding); a reshape or a widening is, and the call stays a bfloat16 product. The operand is
    computed (a cast to bfloat16 of a float32 value), which the call reads where its buffer is."""
    rng = np.random.default_rng(1)
    a, b, bias = (tg.tensor(rng.standard_normal(shape, dtype=np.float32), dtype=tg.bfloat16)
                  for shape in ((16, 32), (32, 24), (24,)))
    ops = {"reshape": lambda p: p.reshape(-1), "scale": lambda p: p * 3, "bias": lambda p: p + bias,
           "relu": lambda p: p.relu(), "residual": lambda p: p + p.detach() * 1, "widen": lambda p: p.float()}

    def program(a: tg.Tensor, b: tg.Tensor) -> tg.Tensor:
        return ops[epilogue]((a**a.abs()) @ b)

    with tg.device("numpy"):
        expected = program(a, b).float().numpy()
    with tg.device("cpu"):
        result = program(a, b)
        calls = _gemm_calls(schedule_kernels([result.node]))
        np.testing.assert_array_equal(result.float().numpy(), expected)
    assert [call.dtype for call in calls] == [tg.bfloat16]


# ---------------------------------------------------------------------------
# Epilogues fused into the call (schedule.extern.fuse_epilogues)
# ---------------------------------------------------------------------------


def _floats(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _gemm_calls(schedule: Schedule) -> list[GemmCall]:
    return [stmt for kernel in schedule.kernels for stmt in kernel.body if isinstance(stmt, GemmCall)]


@pytest.mark.parametrize("name", list(extern.ACTIVATIONS))
def test_activation_templates_are_the_front_end_activations_decomposed(name: str) -> None:
    """The library's activations are matched by the graphs of `extern.ACTIVATIONS`: they must be what the front
    end builds for relu and gelu(approximate="tanh"), or the call would silently stop fusing them."""
    front_end = {"relu": F.relu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[name]
    ((placeholder, template),) = [(p, t) for n, p, t in extern.activation_templates() if n == name]
    assert optimize([front_end(tg.Tensor(placeholder)).node], ["decompose"]) == [template]


EPILOGUE_CASES = {  # name: (function of tg or torch tensors and their F module, operand shapes, the epilogue)
    "linear+bias": (lambda F, x, w, b: F.linear(x, w, b), [(2, 5, 33), (17, 33), (17,)], "acc + b"),
    "linear+bias+relu": (lambda F, x, w, b: F.relu(F.linear(x, w, b)), [(7, 9), (33, 9), (33,)], "relu"),
    "linear+bias+gelu": (lambda F, x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"),
                         [(3, 4, 16), (40, 16), (40,)], "gelu_tanh(acc + b"),
    "linear+residual": (lambda F, x, w, r: F.linear(x, w) + r, [(9, 31), (7, 31), (9, 7)], "acc + b"),
    "scale+bias+gelu+residual": (lambda F, x, w, b, r: F.gelu((x @ w) * 0.125 + b, approximate="tanh") + r,
                                 [(6, 20), (20, 24), (24,), (6, 24)], "gelu_tanh(0.125 * acc + b"),
    "batched+bias+relu+residual": (lambda F, x, y, b, r: r + F.relu(x @ y + b), [(2, 3, 5, 7), (2, 3, 7, 9), (9,),
                                                                                  (2, 3, 5, 9)], "relu(acc + b"),
    "scale+bias+residual+relu": (lambda F, x, w, b, r: F.relu((x @ w) * 0.125 + b + r),
                                 [(6, 20), (20, 24), (24,), (6, 24)], "relu(0.125 * acc + b"),
    "batched+bias+residual+gelu": (lambda F, x, y, b, r: F.gelu(r + (x @ y + b), approximate="tanh"),
                                   [(2, 3, 5, 7), (2, 3, 7, 9), (9,), (2, 3, 5, 9)], "gelu_tanh(acc + b"),
}


@pytest.mark.parametrize("case", ["scale+bias+gelu+residual", "scale+bias+residual+relu"])
def test_fused_node_decomposes_to_what_the_kernel_computes(case: str) -> None:
    """The fused node's reference decomposition (numpy backend) is the oracle of the call, the activation before or
    after the residual."""
    build, shapes, _ = EPILOGUE_CASES[case]
    arrays = [_floats(shape, seed) for seed, shape in enumerate(shapes)]
    result = build(F, *map(tg.tensor, arrays))
    (fused,), _ = fuse_epilogues(*to_primitive([result.node], lambda n: n.op is Op.BUFFER), lambda n: n.op is Op.BUFFER)
    assert fused.op is GEMM_EPILOGUE
    (reference,) = REFERENCE.evaluate([fused])
    with tg.device("cpu"):
        np.testing.assert_allclose(result.numpy(), reference, rtol=1e-5, atol=1e-5)


def test_linear_gelu_compiles_to_one_kernel() -> None:
    x, w, b = _floats((8, 16, 32), 0), _floats((64, 32), 1), _floats((64,), 2)
    compiled = tg.compile(lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"))
    got = compiled(x, w, b)
    assert compiled.stats.kernels == 1
    expected = torch.nn.functional.gelu(torch.nn.functional.linear(*map(torch.from_numpy, (x, w, b))),
                                        approximate="tanh")
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


def test_value_needed_before_the_activation_keeps_the_activation_out() -> None:
    """The pre-activation is also returned: bias fuses into the product, gelu reads its buffer."""
    x, w, b = _floats((9, 12), 3), _floats((10, 12), 4), _floats((10,), 5)
    with tg.device("cpu"):
        pre = F.linear(tg.tensor(x), tg.tensor(w), tg.tensor(b))
        post = F.gelu(pre, approximate="tanh")
        (call,) = _gemm_calls(schedule_kernels([pre.node, post.node]))
        assert call.epilogue.bias is not None and call.epilogue.activation == "none"
        expected = torch.nn.functional.linear(*map(torch.from_numpy, (x, w, b)))
        np.testing.assert_allclose(pre.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(post.numpy(), torch.nn.functional.gelu(expected, approximate="tanh").numpy(),
                                   rtol=1e-5, atol=1e-5)


def test_a_computed_bias_gets_a_kernel_of_its_own_and_is_fused() -> None:
    """A bias computed by the graph (2 * b, a bfloat16 rounding of a float32 bias under autocast) is a row vector:
    a small kernel stores it, and the call adds it (a pass over the product's output would cost far more)."""
    x, w, b = _floats((9, 12), 6), _floats((10, 12), 7), _floats((10,), 8)
    with tg.device("cpu"):
        result = F.linear(tg.tensor(x), tg.tensor(w), tg.tensor(b) * 2)
        schedule = schedule_kernels([result.node])
        (call,) = _gemm_calls(schedule)
        assert call.epilogue.bias is not None and len(schedule.kernels) == 2
        np.testing.assert_allclose(result.numpy(), x @ w.T + 2 * b, rtol=1e-5, atol=1e-5)


def _mlp_training_step() -> list[tg.Tensor]:
    rng = np.random.default_rng(0)
    x = tg.tensor(_floats((32, 64), 9))
    params = [tg.tensor((rng.normal(size=s) / np.sqrt(s[-1])).astype(np.float32), requires_grad=True)
              for s in ((128, 64), (128,), (128, 128), (128,), (10, 128), (10,))]
    w1, b1, w2, b2, w3, b3 = params
    hidden = F.gelu(F.linear(x, w1, b1), approximate="tanh")
    out = F.linear(F.relu(F.linear(hidden, w2, b2)) + hidden, w3, b3)
    loss = (out * out).mean()
    return [loss, *tg.grad(loss, params)]


def test_training_step_fuses_bias_keeps_pre_activations_and_adds_no_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    roots = [t.node for t in _mlp_training_step()]
    fused = schedule_kernels(roots)
    epilogues = [call.epilogue for call in _gemm_calls(fused)]
    assert sum(e.bias is not None for e in epilogues) == 3  # every forward linear
    assert all(e.activation == "none" for e in epilogues)  # gelu's and relu's backward read the pre-activation
    assert sum(e.residual is not None for e in epilogues) == 1  # the two gradients reaching `hidden`, summed
    monkeypatch.setattr(extern, "epilogue_rules", lambda is_chain_end: [])
    assert len(fused.kernels) <= len(schedule_kernels(roots).kernels)
    with tg.device("numpy"):
        expected = [t.detach().numpy() for t in _mlp_training_step()]
    monkeypatch.undo()
    with tg.device("cpu"):
        for got, want in zip([t.detach().numpy() for t in _mlp_training_step()], expected):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_transformer_layer_training_step_adds_no_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/memory.py's pre-LN layer, small: out_proj and the second FFN linear take bias and residual, the first
    FFN linear its bias (relu's backward reads the pre-activation), the q, k and v projections theirs (blocks of
    in_proj_bias), the attention scores their scale (the attention decomposed: fused, its scores are never a
    product of their own)."""
    monkeypatch.setenv("TG_ATTENTION", "0")
    tg.manual_seed(0)
    layer = tg.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
    x, target = tg.tensor(_floats((2, 8, 16), 10)), tg.tensor(_floats((2, 8, 16), 11))
    loss = ((layer(x) - target) ** 2).mean()
    roots = [loss.node, *(g.node for g in tg.grad(loss, list(layer.parameters())))]
    fused = schedule_kernels(roots)
    epilogues = [call.epilogue for call in _gemm_calls(fused)]
    assert sum(e.bias is not None and e.residual is not None for e in epilogues) == 2, epilogues
    assert sum(e.bias is not None and e.residual is None for e in epilogues) == 4, epilogues
    assert sorted(e.bias_offset for e in epilogues if e.bias is not None and e.residual is None) == [0, 0, 16, 32]
    assert any(math.isclose(e.alpha, 1 / math.sqrt(16 // 2)) for e in epilogues), epilogues  # q @ k^T / sqrt(d)
    monkeypatch.setattr(extern, "epilogue_rules", lambda is_chain_end: [])
    assert len(fused.kernels) <= len(schedule_kernels(roots).kernels)


def test_a_transposed_product_is_computed_transposed_not_copied() -> None:
    """mT(x.T @ g), a linear layer's weight gradient, is one GEMM writing g.T @ x; when the product is read too,
    it is computed once and copied transposed (never two GEMMs)."""
    rng = np.random.default_rng(5)
    x, g = (tg.tensor(rng.standard_normal((64, n), dtype=np.float32)) for n in (48, 32))
    gradient = (x.T @ g).T
    (kernel,) = schedule_kernels([gradient.node]).kernels
    assert [type(s) for s in kernel.body] == [GemmCall]
    with tg.device("cpu"):
        np.testing.assert_allclose(gradient.numpy(), g.numpy().T @ x.numpy(), rtol=1e-5, atol=1e-5)
    product = x.T @ g
    kernels = schedule_kernels([product.T.node, product.node]).kernels
    assert sum(isinstance(s, GemmCall) for k in kernels for s in k.body) == 1 and len(kernels) == 2


def test_a_bias_that_is_a_block_of_a_stacked_bias_is_read_at_an_offset() -> None:
    """The q/k/v biases of an attention are slices of in_proj_bias: the call reads them in place."""
    x, weight, bias = _floats((2, 5, 8), 16), _floats((24, 8), 17), _floats((24,), 18)
    expected = torch.nn.functional.linear(*map(torch.from_numpy, (x, weight[8:16], bias[8:16]))).numpy()
    with tg.device("cpu"):
        result = F.linear(tg.tensor(x), tg.tensor(weight)[8:16], tg.tensor(bias)[8:16])
        schedule = schedule_kernels([result.node])
        (call,) = _gemm_calls(schedule)
        assert len(schedule.kernels) == 1 and call.epilogue.bias_offset == 8 and call.b_offset == 64, schedule
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-5, atol=1e-5)
        strided = F.linear(tg.tensor(x), tg.tensor(weight)[8:16], tg.tensor(bias)[::3])  # not a block: a copy
        schedule = schedule_kernels([strided.node])
        (call,) = _gemm_calls(schedule)
        assert call.epilogue.bias is not None and call.epilogue.bias_offset == 0 and len(schedule.kernels) == 2
        np.testing.assert_allclose(strided.numpy(), expected - bias[8:16] + bias[::3], rtol=1e-5, atol=1e-5)
    leaf = lambda n: n.op is Op.BUFFER  # noqa: E731
    (fused,), _ = fuse_epilogues(*to_primitive([result.node], leaf), leaf)
    np.testing.assert_allclose(REFERENCE.evaluate([fused])[0], expected, rtol=1e-5, atol=1e-5)  # its decomposition


def test_leading_dim_slices_are_read_in_place_with_an_offset() -> None:
    """The q/k/v rows of a stacked projection weight: a slice of the leading dim is a contiguous block, read at
    an offset (no copy kernel); a column slice is not contiguous and is copied first."""
    rng = np.random.default_rng(6)
    x, stacked = (tg.tensor(rng.standard_normal(s, dtype=np.float32)) for s in ((16, 32), (96, 32)))
    value = x @ stacked[32:64].T
    (kernel,) = schedule_kernels([value.node]).kernels
    (call,) = kernel.body
    assert isinstance(call, GemmCall) and call.b_offset == 32 * 32 and call.a_offset == 0
    with tg.device("cpu"):
        np.testing.assert_allclose(value.numpy(), x.numpy() @ stacked.numpy()[32:64].T, rtol=1e-5, atol=1e-5)
        columns = x @ stacked[:32, :16]
        assert len(schedule_kernels([columns.node]).kernels) == 2
        np.testing.assert_allclose(columns.numpy(), x.numpy() @ stacked.numpy()[:32, :16], rtol=1e-5, atol=1e-5)


def test_row_slices_of_a_batch_are_read_in_place_with_the_sources_batch_stride() -> None:
    """The filled rows of a KV cache (batch, heads, rows, head size): a slice of the rows of every batch entry is
    read where it lies, as keys (transposed) and as values, each entry a batch stride of the whole source apart;
    a slice of the rows and the columns is copied first."""
    rng = np.random.default_rng(7)
    q, p, cache = (rng.standard_normal(s, dtype=np.float32) for s in ((2, 3, 1, 8), (2, 3, 1, 5), (2, 3, 10, 8)))
    cases = [(lambda c: tg.tensor(q) @ c[:, :, 2:7].mT, q @ cache[:, :, 2:7].swapaxes(-1, -2), (80, 1, 8)),
             (lambda c: tg.tensor(p) @ c[:, :, :5], p @ cache[:, :, :5], (80, 8, 1))]
    with tg.device("cpu"):
        for product, expected, strides in cases:
            result = product(tg.tensor(cache))
            (kernel,) = schedule_kernels([result.node]).kernels
            (call,) = kernel.body
            assert isinstance(call, GemmCall) and call.b_strides == strides and call.b_offset in (0, 16), call
            np.testing.assert_allclose(result.numpy(), expected, rtol=1e-5, atol=1e-5)
        both = tg.tensor(p) @ tg.tensor(cache)[:, :, :5, :4]
        assert len(schedule_kernels([both.node]).kernels) == 2
        np.testing.assert_allclose(both.numpy(), p @ cache[:, :, :5, :4], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# Prologues: an operand's activation applied while packing it (schedule.extern.fuse_prologues)
# ---------------------------------------------------------------------------

def _gelu(F, x):
    return F.gelu(x, approximate="tanh")


def _gelu_of(x: tg.Tensor) -> tg.Tensor:
    return _gelu(F, x)


PROLOGUE_CASES = {  # name: (function of tg or torch tensors and their F module, operand shapes, the call's text)
    "gelu(h) @ w.T": (lambda F, h, w: F.linear(_gelu(F, h), w), [(33, 40), (7, 40)], "gelu_tanh(b0)"),
    "x @ relu(y)": (lambda F, x, y: x @ F.relu(y), [(7, 33), (33, 255)], "(b0[231, 33, 1], relu(b1)"),
    "gelu(h).T @ g": (lambda F, h, g: _gelu(F, h).T @ g, [(33, 7), (33, 5)], "gelu_tanh(b0)"),
    "batched, transposed B": (lambda F, q, k: q @ F.relu(k).mT, [(2, 3, 5, 7), (2, 3, 4, 7)], "relu(b1)[28, 1, 7]"),
    "both operands": (lambda F, x, y: F.relu(x) @ _gelu(F, y), [(1, 255), (255, 1)], "gemm[1x1x1x255](relu(b0)"),
    "leading-dim slice": (lambda F, h, w: _gelu(F, h)[8:16] @ w, [(32, 9), (9, 4)], "gelu_tanh(b0+72)"),
    "row slice of a batch": (lambda F, q, k: q @ F.relu(k)[:, :, 1:4].mT, [(2, 3, 5, 7), (2, 3, 6, 7)],
                             "relu(b1+7)[42, 1, 7]"),
    "with bias and residual": (lambda F, h, w, b, r: F.linear(_gelu(F, h), w, b) + r,
                               [(2, 5, 33), (17, 33), (17,), (2, 5, 17)], "gelu_tanh(b0)"),
}


FUSED_CASES = {**{f"epilogue: {name}": case for name, case in EPILOGUE_CASES.items()},
               **{f"prologue: {name}": case for name, case in PROLOGUE_CASES.items()}}


@pytest.mark.parametrize("name", list(FUSED_CASES))
def test_fused_epilogue_or_prologue_is_one_kernel_and_matches_torch(name: str) -> None:
    build, shapes, call_text = FUSED_CASES[name]
    arrays = [_floats(shape, seed) for seed, shape in enumerate(shapes)]
    expected = build(torch.nn.functional, *map(torch.from_numpy, arrays)).numpy()
    with tg.device("cpu"):
        result = build(F, *map(tg.tensor, arrays))
        schedule = schedule_kernels([result.node])
        assert len(schedule.kernels) == 1, f"{name}: {schedule}"
        assert call_text in repr(_gemm_calls(schedule)[0]), f"{name}: {schedule}"
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-5, atol=1e-5, err_msg=name)


def test_linear_of_gelu_compiles_to_one_kernel() -> None:
    h, w = _floats((8, 16, 32), 0), _floats((64, 32), 1)
    compiled = tg.compile(lambda h, w: F.linear(F.gelu(h, approximate="tanh"), w))
    got = compiled(h, w)
    assert compiled.stats.kernels == 1
    expected = torch.nn.functional.linear(torch.nn.functional.gelu(torch.from_numpy(h), approximate="tanh"),
                                          torch.from_numpy(w))
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


def test_prologue_values_keep_nan_and_inf() -> None:
    h = np.array([[np.nan, np.inf, -np.inf, -0.0, 1e30, -1e30, -20.0, 3.0]], np.float32).T
    ones = np.ones((1, 3), np.float32)
    with tg.device("numpy"):
        expected = [(activation(tg.tensor(h)) @ tg.tensor(ones)).numpy() for activation in (F.relu, _gelu_of)]
    with tg.device("cpu"):
        for activation, want in zip((F.relu, _gelu_of), expected, strict=True):
            result = activation(tg.tensor(h)) @ tg.tensor(ones)
            assert len(schedule_kernels([result.node]).kernels) == 1
            np.testing.assert_allclose(result.numpy(), want, rtol=1e-6)


def test_activated_values_read_by_more_than_products_are_not_fused() -> None:
    """gelu(h) also returned, or also added to something, or gelu of a value that is not a buffer (h * 2): the
    activated value needs a buffer or a kernel anyway, and the product reads it."""
    h, w = _floats((9, 12), 12), _floats((12, 10), 13)
    with tg.device("cpu"):
        activated = _gelu(F, tg.tensor(h))
        product = activated @ tg.tensor(w)
        for roots in ([product, activated], [product, activated + 1]):
            (call,) = _gemm_calls(schedule_kernels([r.node for r in roots]))
            assert call.a_prologue == "none", roots
        (call,) = _gemm_calls(schedule_kernels([(_gelu(F, tg.tensor(h) * 2) @ tg.tensor(w)).node]))
        assert call.a_prologue == "none"
        expected = torch.nn.functional.gelu(torch.from_numpy(h), approximate="tanh").numpy()
        np.testing.assert_allclose(product.numpy(), expected @ w, rtol=1e-5, atol=1e-5)


def test_prologue_node_decomposes_to_what_the_kernel_computes() -> None:
    build, shapes, _ = PROLOGUE_CASES["both operands"]
    arrays = [_floats(shape, seed) for seed, shape in enumerate(shapes)]
    result = build(F, *map(tg.tensor, arrays))
    leaf = lambda n: n.op is Op.BUFFER  # noqa: E731
    (fused,), _ = fuse_epilogues(*to_primitive([result.node], leaf), leaf)
    assert [s.op for s in fused.src] == [GEMM_PROLOGUE, GEMM_PROLOGUE]
    (reference,) = REFERENCE.evaluate([fused])
    with tg.device("cpu"):
        np.testing.assert_allclose(result.numpy(), reference, rtol=1e-5, atol=1e-5)


def _gelu_encoder_training_step() -> list[tg.Tensor]:
    """bench/train.py's pre-LN encoder layer with GELU-tanh, small: loss and every parameter's gradient."""
    tg.manual_seed(0)
    layer = tg.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation=_gelu_of,
                                          batch_first=True, norm_first=True)
    x, target = tg.tensor(_floats((2, 8, 16), 14)), tg.tensor(_floats((2, 8, 16), 15))
    loss = ((layer(x) - target) ** 2).mean()
    return [loss, *tg.grad(loss, list(layer.parameters()))]


@pytest.mark.long
def test_encoder_training_step_reads_gelu_of_the_hidden_layer_in_both_products(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The FFN's second linear (gelu(h) as A) and its weight gradient (gelu(h) as B) apply gelu while packing h:
    the kernel computing gelu(h) is gone, and the step's values do not change."""
    roots = [t.node for t in _gelu_encoder_training_step()]
    fused = schedule_kernels(roots)
    calls = _gemm_calls(fused)
    assert sum(c.a_prologue == "gelu_tanh" for c in calls) == 1 and sum(c.b_prologue == "gelu_tanh" for c in calls) == 1
    with monkeypatch.context() as patched:
        patched.setattr(extern, "fuse_prologues", lambda roots, materialized, is_leaf: (roots, materialized))
        assert len(fused.kernels) < len(schedule_kernels(roots).kernels)
    with tg.device("numpy"):
        expected = [t.detach().numpy() for t in _gelu_encoder_training_step()]
    with tg.device("cpu"):
        for got, want in zip([t.detach().numpy() for t in _gelu_encoder_training_step()], expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# The gradient epilogue: gelu's backward pass applied by the product computing its output's gradient
# ---------------------------------------------------------------------------

def _gelu_input_gradient(F, grad, h, w, up):
    """The gradient of sum(gelu(h) @ w * up) with respect to h: gelu'(h) * (up @ w.T), by torch or tg."""
    loss = ((_gelu(F, h) @ w) * up).sum()
    if F is torch.nn.functional:
        return torch.autograd.grad(loss, [h])[0]
    return grad(loss, [h])[0]


def _gelu_gradient_arrays(shape: tuple[int, ...], k: int, n: int) -> list[np.ndarray]:
    return [_floats(shape[:-1] + (k,), 20), _floats((k, n), 21), _floats(shape[:-1] + (n,), 22)]


@pytest.mark.parametrize("shape, n", [((33, 40), 7), ((2, 5, 16), 17), ((1, 1), 1), ((64, 48), 80)])
def test_gelu_backward_is_the_epilogue_of_the_gradients_product(shape: tuple[int, ...], n: int) -> None:
    """d/dh of gelu(h) @ w: the product up @ w.T multiplies by gelu'(h) before storing (h read as its residual):
    the product's kernel writes the gradient, no kernel after it, and the gradient is torch's."""
    h, w, up = _gelu_gradient_arrays(shape, shape[-1], n)
    torch_h = torch.from_numpy(h).requires_grad_()
    expected = _gelu_input_gradient(torch.nn.functional, None, torch_h, torch.from_numpy(w), torch.from_numpy(up))
    with tg.device("cpu"):
        tg_h = tg.tensor(h, requires_grad=True)
        result = _gelu_input_gradient(F, tg.grad, tg_h, tg.tensor(w), tg.tensor(up))
        schedule = schedule_kernels([result.node])
        (call,) = _gemm_calls(schedule)
        assert schedule.kernels[-1].body == [call], schedule  # before it only up * the sum's gradient (ones)
        assert call.epilogue.activation == "gelu_tanh_grad" and call.epilogue.residual is not None, call
        np.testing.assert_allclose(result.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


def test_gelu_backward_epilogue_keeps_nan_inf_and_extremes_like_torch() -> None:
    h = np.array([[np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, -50.0, -9.0, 3.0, 50.0]], np.float32).T
    w, up = np.ones((1, 3), np.float32), np.full((11, 3), 0.5, np.float32)
    torch_h = torch.from_numpy(h).requires_grad_()
    expected = _gelu_input_gradient(torch.nn.functional, None, torch_h, torch.from_numpy(w), torch.from_numpy(up))
    with tg.device("cpu"):
        result = _gelu_input_gradient(F, tg.grad, tg.tensor(h, requires_grad=True), tg.tensor(w), tg.tensor(up))
        assert _gemm_calls(schedule_kernels([result.node]))[0].epilogue.activation == "gelu_tanh_grad"
        np.testing.assert_allclose(result.numpy(), expected.numpy(), rtol=1e-6, atol=1e-7, equal_nan=True)


def test_gelu_backward_epilogue_node_decomposes_to_what_the_kernel_computes() -> None:
    h, w, up = _gelu_gradient_arrays((9, 12), 12, 10)
    result = _gelu_input_gradient(F, tg.grad, tg.tensor(h, requires_grad=True), tg.tensor(w), tg.tensor(up))
    leaf = lambda n: n.op is Op.BUFFER  # noqa: E731
    (fused,), _ = fuse_epilogues(*to_primitive([result.node], leaf), leaf)
    assert fused.op is GEMM_EPILOGUE and dict(fused.arg)["activation"] == "gelu_tanh_grad"
    (reference,) = REFERENCE.evaluate([fused])
    with tg.device("cpu"):
        np.testing.assert_allclose(result.numpy(), reference, rtol=1e-5, atol=1e-5)


def test_encoder_training_step_applies_gelus_backward_in_the_products_epilogue(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The gradient of gelu(h) (dY @ W2) multiplies by gelu'(h) in its epilogue, reading h where the forward
    product stored it: no elementwise kernel of its own, one kernel fewer than without the rule, same values."""
    roots = [t.node for t in _gelu_encoder_training_step()]
    fused = schedule_kernels(roots)
    calls = _gemm_calls(fused)
    (gradient,) = [c for c in calls if c.epilogue.activation == "gelu_tanh_grad"]
    (forward,) = [c for c in calls if c.a_prologue == "gelu_tanh"]
    assert gradient.epilogue.residual == forward.a  # h, the pre-activation the forward product packs as gelu(h)
    never = EpilogueRule(RESIDUAL, var("x", where=lambda _: False), lambda chain, _: chain)
    with monkeypatch.context() as patched:
        patched.setattr(extern, "gelu_grad_rule", lambda is_chain_end: never)
        assert len(schedule_kernels(roots).kernels) == len(fused.kernels) + 1
    with tg.device("numpy"):
        expected = [t.detach().numpy() for t in _gelu_encoder_training_step()]
    with tg.device("cpu"):
        for got, want in zip([t.detach().numpy() for t in _gelu_encoder_training_step()], expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_autocast_feed_forward_rounds_in_the_epilogue_and_activates_while_packing() -> None:
    """linear, gelu, linear under bfloat16 autocast: the first product adds its bias and rounds to bfloat16 in its
    epilogue (tg_gemm_bf16), the second applies gelu to that bfloat16 result while packing it (a prologue), so no
    elementwise kernel runs between them; the values are the reference interpreter's (the same graph)."""
    x, w1, b1, w2, b2 = (_floats(s, 30 + i) for i, s in enumerate(((64, 32), (96, 32), (96,), (16, 96), (16,))))

    def feed_forward() -> tg.Tensor:
        with tg.autocast("cpu", dtype=tg.bfloat16):
            hidden = F.gelu(F.linear(tg.tensor(x), tg.tensor(w1), tg.tensor(b1)), approximate="tanh")
            return F.linear(hidden, tg.tensor(w2), tg.tensor(b2))

    with tg.device("numpy"):
        expected = feed_forward().float().numpy()
    with tg.device("cpu"):
        out = feed_forward()
        schedule = schedule_kernels([out.node])
        first, second = _gemm_calls(schedule)
        assert first.function == "tg_gemm_bf16" and first.epilogue.bias is not None
        assert second.a_prologue == "gelu_tanh" and second.a == first.c and second.epilogue.bias is not None
        others = [k for k in schedule.kernels if not any(isinstance(s, GemmCall) for s in k.body)]
        assert all(max(b.size for b in k.buffers) <= 96 for k in others), others  # the biases rounded, no more
        np.testing.assert_allclose(out.float().numpy(), expected, rtol=2**-7, atol=1e-6)


def test_autocast_weight_gradient_is_rounded_by_its_product_alone() -> None:
    """A float32 weight's gradient under autocast is its bfloat16 product's result rounded, then widened back to
    float32: the call rounds and stores those floats itself (no cast kernel after it); the values are the
    reference interpreter's."""
    x, w, dy = _floats((64, 32), 40), _floats((16, 32), 41), _floats((64, 16), 42)

    def weight_gradient() -> tg.Tensor:
        weight = tg.tensor(w, requires_grad=True)
        with tg.autocast("cpu", dtype=tg.bfloat16):
            out = F.linear(tg.tensor(x), weight)
        (grad,) = tg.grad((out.float() * tg.tensor(dy)).sum(), [weight])
        return grad

    with tg.device("numpy"):
        expected = weight_gradient().numpy()
    with tg.device("cpu"):
        grad = weight_gradient()
        schedule = schedule_kernels([grad.node])
        (call,) = _gemm_calls(schedule)
        assert grad.dtype is tg.float32 and call.function == "tg_gemm_bf16" and call.c == schedule.outputs[0]
        assert len(schedule.kernels) <= 2, schedule  # the call, and the product's operand dy rounded to bfloat16
        np.testing.assert_allclose(grad.numpy(), expected, rtol=2**-7, atol=1e-6)
