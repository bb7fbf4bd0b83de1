"""Attention run by the fused kernel from generated C (schedule.attention): the choice, operands read in place,
programs that never store the scores, and values and gradients against torch on the cpu device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.codegen.loop_ir import AttentionCall, walk
from tensorgraphs.schedule import attention
from tensorgraphs.schedule.attention import runs_as_fused_attention

pytestmark = pytest.mark.skipif(not attention.attention_enabled(), reason="the attention kernel needs a C compiler")


def _attention_calls(roots: list[tg.Tensor]) -> list[AttentionCall]:
    program, _ = CPU.program([r.node for r in roots])
    return [s for kernel in program.kernels for s in walk(kernel.body) if isinstance(s, AttentionCall)]


def _compare(arrays: list[np.ndarray], function: object, torch_function: object, grad_count: int) -> None:
    """function(*tensors) on the cpu device and torch_function(*tensors): the output, then d(sum(out^2)) with
    respect to the first `grad_count` arrays."""
    with tg.device("cpu"):
        ours = [tg.tensor(a, requires_grad=i < grad_count) for i, a in enumerate(arrays)]
        out = function(*ours)
        (out * out).sum().backward()
        got = [out.detach().numpy()] + [t.grad.numpy() for t in ours[:grad_count]]
    theirs = [torch.tensor(a, requires_grad=i < grad_count) for i, a in enumerate(arrays)]
    expected_out = torch_function(*theirs)
    (expected_out * expected_out).sum().backward()
    expected = [expected_out.detach().numpy()] + [t.grad.numpy() for t in theirs[:grad_count]]
    for i, (value, reference) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(value, reference, rtol=1e-4, atol=3e-5, err_msg=f"output {i} (0: value, then grads)")


def _qkv(rng: np.random.Generator, *shape: int) -> list[np.ndarray]:
    return [rng.standard_normal(shape, dtype=np.float32) for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
def test_training_step_matches_torch(causal: bool) -> None:
    arrays = _qkv(np.random.default_rng(0), 2, 3, 70, 8)
    _compare(arrays, lambda *t: F.scaled_dot_product_attention(*t, is_causal=causal),
             lambda *t: torch.nn.functional.scaled_dot_product_attention(*t, is_causal=causal), 3)


def test_bool_mask_with_fully_masked_rows_matches_torch() -> None:
    rng = np.random.default_rng(1)
    mask = rng.standard_normal((70, 50)) > 0
    mask[4] = False
    arrays = [*(rng.standard_normal(s, dtype=np.float32) for s in ((2, 70, 16), (2, 50, 16), (2, 50, 16))), mask]
    _compare(arrays, lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
             lambda q, k, v, m: torch.nn.functional.scaled_dot_product_attention(q, k, v, m), 3)


def test_float_mask_gets_its_gradient() -> None:
    """The kernel computes the q, k, v gradients; the mask's (a score-sized array anyway) is decomposed."""
    rng = np.random.default_rng(2)
    arrays = [*_qkv(rng, 1, 2, 33, 8), rng.standard_normal((1, 1, 33, 33), dtype=np.float32)]
    _compare(arrays, lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
             lambda q, k, v, m: torch.nn.functional.scaled_dot_product_attention(q, k, v, m), 4)


def test_one_tensor_as_query_key_and_value_gets_its_gradient_once() -> None:
    (x, *_) = _qkv(np.random.default_rng(3), 2, 9, 8)
    _compare([x], lambda t: F.scaled_dot_product_attention(t, t, t),
             lambda t: torch.nn.functional.scaled_dot_product_attention(t, t, t), 1)


def _causal_attention_of_projection(qkv: object, library: object, heads: int) -> object:
    """Causal attention of q, k, v split from one (batch, T, 3 * heads * dim) projection: slices of its last
    dim, reshaped to heads and transposed (tg or torch)."""
    batch, length, width = qkv.shape
    dim = width // (3 * heads)
    q, k, v = (qkv[..., i * heads * dim:(i + 1) * heads * dim].reshape(batch, length, heads, dim).transpose(1, 2)
               for i in range(3))
    return library.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_heads_split_from_a_projection_are_read_in_place() -> None:
    """q, k, v as views of one (batch, T, 3 * heads * dim) projection (slice, reshape, transpose), and the
    output gradient flowing back through the same views: the kernel reads them all where they are."""
    rng = np.random.default_rng(4)
    batch, length, heads, dim = 2, 40, 3, 8
    x = rng.standard_normal((batch, length, 3 * heads * dim), dtype=np.float32)

    def split(qkv: object, library: object) -> object:
        out = _causal_attention_of_projection(qkv, library, heads)
        return out.transpose(1, 2).reshape(batch, length, heads * dim)

    _compare([x], lambda t: split(t, tg), lambda t: split(t, torch), 1)
    with tg.device("cpu"):
        projection = tg.tensor(x, requires_grad=True)
        out = split(projection, tg)
        calls = _attention_calls([out, *tg.grad((out * out).sum(), [projection])])
    assert [call.backward for call in calls] == [False, True]
    forward = calls[0]
    assert {forward.q.buffer, forward.k.buffer, forward.v.buffer} == {calls[1].q.buffer}  # the projection itself
    assert (forward.q.offset, forward.k.offset, forward.v.offset) == (0, heads * dim, 2 * heads * dim)
    assert forward.q.strides == (length * 3 * heads * dim, dim, 3 * heads * dim)


def test_bfloat16_heads_are_read_in_place_through_the_widening_cast() -> None:
    """A bfloat16 attention is a float32 one of widened bfloat16 values (nn.functional.attention): the kernel reads
    the bfloat16 projection's floats where they are, and the result is torch's bfloat16 attention to one rounding."""
    rng = np.random.default_rng(5)
    batch, length, heads, dim = 2, 24, 2, 8
    x = rng.standard_normal((batch, length, 3 * heads * dim), dtype=np.float32)

    expected = _causal_attention_of_projection(torch.from_numpy(x).bfloat16(), torch, heads).float().numpy()
    with tg.device("cpu"):
        out = _causal_attention_of_projection(tg.tensor(x).bfloat16(), tg, heads)
        (call,) = _attention_calls([out])
        program, _ = CPU.program([out.node])
        np.testing.assert_allclose(out.float().numpy(), expected, rtol=2**-7, atol=2**-7)
    assert {call.q.buffer, call.k.buffer, call.v.buffer} == {call.q.buffer}  # the one bfloat16 projection
    assert (call.k.offset, call.v.offset) == (heads * dim, 2 * heads * dim)
    assert program.kernel_count == 3  # the cast to bfloat16, the attention and its rounded result
    assert call.bf16 and "tg_attention_forward_bf16(" in program.source


def test_autocast_attention_runs_the_bfloat16_variant_and_matches_torch() -> None:
    """Under bfloat16 autocast the forward and backward calls are the kernel's bfloat16 variant (float32
    attention keeps the float32 one); values and gradients are torch's autocast attention's to bfloat16 precision
    (each rounds its weights before their products: neither is the other's exact oracle)."""
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal((2, 2, 100, 32), dtype=np.float32) for _ in range(3)]
    with tg.device("cpu"):
        for autocast in (False, True):  # the values compared below are the autocast ones
            ours = [tg.tensor(a, requires_grad=True) for a in arrays]
            with tg.autocast("cpu", dtype=tg.bfloat16, enabled=autocast):
                out = F.scaled_dot_product_attention(*ours, is_causal=True)
            grads = tg.grad((out.float() ** 2).sum(), ours)
            calls = _attention_calls([out, *grads])
            assert [(call.backward, call.bf16) for call in calls] == [(False, autocast), (True, autocast)]
        got = [out.float().detach().numpy(), *(g.numpy() for g in grads)]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected_out = torch.nn.functional.scaled_dot_product_attention(*theirs, is_causal=True)
    (expected_out.float() ** 2).sum().backward()
    expected = [expected_out.float().detach().numpy(), *(t.grad.numpy() for t in theirs)]
    for name, value, reference in zip(("out", "dq", "dk", "dv"), got, expected):
        scale = np.abs(reference).max()
        np.testing.assert_allclose(value, reference, rtol=0, atol=2**-6 * scale, err_msg=name)


def test_program_stores_no_score_sized_buffer() -> None:
    """Forward and backward at T = 512: no buffer is near T x T floats, and the arena is linear in T."""
    rng = np.random.default_rng(5)
    length = 512
    with tg.device("cpu"):
        q, k, v = (tg.tensor(a, requires_grad=True) for a in _qkv(rng, 1, 2, length, 16))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        loss = (out * out).sum()
        program, _ = CPU.program([loss.node, *(g.node for g in tg.grad(loss, [q, k, v]))])
    calls = [s for kernel in program.kernels for s in walk(kernel.body) if isinstance(s, AttentionCall)]
    assert [call.backward for call in calls] == [False, True]
    assert (calls[1].dq, calls[1].dk, calls[1].dv) != (None, None, None) and None not in (calls[1].dq, calls[1].dk)
    assert max(b.size for kernel in program.kernels for b in kernel.buffers) < length * length // 8
    heads_times_rows = 2 * length  # the temporaries: out, the output's gradient (each 16 floats a row) and lse
    assert program.memory.arena_bytes <= 4 * heads_times_rows * (16 + 16 + 1) + 1024


def test_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    def node(dtype: object, mask: object = None) -> object:
        q, k, v = (tg.zeros(1, 4, 8, dtype=dtype) for _ in range(3))
        return F.scaled_dot_product_attention(q, k, v, mask).node

    assert runs_as_fused_attention(node(tg.float32))
    assert runs_as_fused_attention(node(tg.float32, tg.ones(4, 4, dtype=tg.bool)))
    assert not runs_as_fused_attention(node(tg.float64))
    assert not runs_as_fused_attention(node(tg.float32).src[0])  # not an attention
    monkeypatch.setenv("TG_ATTENTION", "0")
    assert not runs_as_fused_attention(node(tg.float32))


@pytest.mark.parametrize("shape, strides, new_shape", [
    ((2, 3, 4), (12, 4, 1), (6, 4)),
    ((2, 3, 4), (12, 4, 1), (2, 12)),
    ((4, 3), (1, 4), (12,)),  # a transpose: not without a copy
    ((4, 3), (1, 4), (2, 2, 3)),
    ((2, 1, 6), (6, 6, 1), (2, 2, 1, 3)),
    ((3, 4), (0, 1), (3, 2, 2)),  # broadcast rows
])
def test_reshaped_strides_are_numpys(shape: tuple[int, ...], strides: tuple[int, ...],
                                     new_shape: tuple[int, ...]) -> None:
    base = np.lib.stride_tricks.as_strided(np.arange(64, dtype=np.float32), shape, [4 * s for s in strides])
    try:
        view = base.view()
        view.shape = new_shape  # numpy raises when the reshape needs a copy
        expected = tuple(s // 4 if n != 1 else 0 for s, n in zip(view.strides, new_shape))
    except AttributeError:
        expected = None
    assert attention._reshaped_strides(shape, strides, new_shape) == expected


def test_logsumexp_alone_is_a_forward_call_without_output() -> None:
    """A program needing the logsumexp but not the attention (its output computed by an earlier program) makes
    the forward call with no output buffer."""
    from tensorgraphs.frontend.tensor import apply_composite
    from tensorgraphs.nn.functional.attention import ATTENTION_LOGSUMEXP

    q, k, v = _qkv(np.random.default_rng(6), 1, 2, 70, 8)
    with tg.device("cpu"):
        lse = apply_composite(ATTENTION_LOGSUMEXP, *map(tg.tensor, (q, k, v)), is_causal=True, scale=0.5)
        (call,) = _attention_calls([lse])
        got = lse.numpy()
    assert call.out is None and call.lse is not None
    scores = torch.tensor(q) @ torch.tensor(k).transpose(-1, -2) * 0.5
    expected = torch.logsumexp(scores.masked_fill(torch.ones(70, 70).triu(1).bool(), -torch.inf), -1)
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("query_batch, key_batch", [((2, 3), (1, 3)), ((2, 3, 4), (2, 1, 4)), ((2, 3, 4), (1, 3, 1))])
def test_broadcast_batch_dims_match_torch(query_batch: tuple[int, ...], key_batch: tuple[int, ...]) -> None:
    """Keys and values broadcast over some batch dims: read with stride 0 where the dims fold into
    (batch, heads), else materialized first."""
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(s, dtype=np.float32) for s in
              ((*query_batch, 20, 8), (*key_batch, 30, 8), (*key_batch, 30, 8))]
    _compare(arrays, F.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention, 3)
    with tg.device("cpu"):
        q, k, v = map(tg.tensor, arrays)
        (call,) = _attention_calls([F.scaled_dot_product_attention(q, k, v)])
    if len(query_batch) == 2:  # read in place, the batch broadcast
        assert (call.batch, call.heads, call.k.strides[:2]) == (2, 3, (0, 30 * 8))
    else:  # three dims do not fold into two: contiguous copies, one dim of 24 problems
        assert (call.batch, call.heads, call.k.strides[1]) == (1, 24, 30 * 8)
