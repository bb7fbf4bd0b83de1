"""scaled_dot_product_attention against torch: masks, causal, scale, broadcasting, fully masked rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from functional_check import check, normal

import tensorgraphs as tg
import tensorgraphs.nn.functional as F


def _qkv(batch: tuple, length: int, source: int, dim: int, value_dim: int) -> list[np.ndarray]:
    return [normal(1, *batch, length, dim), normal(2, *batch, source, dim), normal(3, *batch, source, value_dim)]


@pytest.mark.parametrize("batch,length,source,dim,value_dim", [((2, 3), 7, 7, 4, 4), ((1,), 1, 3, 3, 2),
                                                              ((), 3, 7, 1, 5)])
@pytest.mark.parametrize("is_causal,scale", [(False, None), (True, None), (False, 0.3)])
def test_attention_matches_torch(batch: tuple, length: int, source: int, dim: int, value_dim: int,
                                 is_causal: bool, scale: float | None) -> None:
    kwargs = {"is_causal": is_causal, "scale": scale}
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs),
          lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, **kwargs),
          _qkv(batch, length, source, dim, value_dim), grad=[0, 1, 2], rtol=1e-4, atol=1e-5, name="sdpa")


@pytest.mark.parametrize("length,source,dim,value_dim", [(3, 4, 0, 5), (3, 0, 4, 5), (3, 4, 4, 0), (0, 4, 4, 5)])
@pytest.mark.parametrize("scale", [None, 0.5])
def test_attention_with_an_empty_dim_matches_torch(length: int, source: int, dim: int, value_dim: int,
                                                   scale: float | None) -> None:
    """A head of size 0 scores 0 (uniform weights), no keys give zeros: as torch, not a ZeroDivisionError."""
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=scale),
          lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, scale=scale),
          _qkv((2,), length, source, dim, value_dim), grad=[0, 1, 2], name="sdpa empty")


@pytest.mark.parametrize("mask_shape", [(7, 5), (2, 1, 7, 5), (3, 1, 5)])
def test_attention_bool_mask_matches_torch(mask_shape: tuple) -> None:
    mask = np.random.default_rng(5).random(mask_shape) > 0.4
    mask.reshape(-1, mask_shape[-1])[0] = False  # a fully masked row attends to nothing: zeros
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
          lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, attn_mask=m),
          _qkv((2, 3), 7, 5, 4, 3) + [mask], grad=[0, 1, 2], rtol=1e-4, atol=1e-5, name="sdpa bool mask")


def test_attention_float_mask_gets_gradients() -> None:
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
          lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, attn_mask=m),
          _qkv((2,), 3, 7, 4, 4) + [normal(4, 3, 7)], grad=[0, 1, 2, 3], rtol=1e-4, atol=1e-5, name="sdpa float mask")


def test_attention_broadcasts_batch_dims_and_grouped_query_heads() -> None:
    q, k, v = normal(1, 2, 4, 3, 5), normal(2, 1, 4, 6, 5), normal(3, 2, 4, 6, 2)
    check(F.scaled_dot_product_attention, TF.scaled_dot_product_attention, [q, k, v], grad=[0, 1, 2], rtol=1e-4,
          atol=1e-5, name="sdpa broadcast")
    k, v = normal(4, 2, 2, 6, 5), normal(5, 2, 2, 6, 2)
    check(lambda *t: F.scaled_dot_product_attention(*t, enable_gqa=True),
          lambda *t: TF.scaled_dot_product_attention(*t, enable_gqa=True), [q, k, v], grad=[0, 1, 2], rtol=1e-4,
          atol=1e-5, name="sdpa gqa")


def test_attention_is_one_composite_node_with_nan_propagation() -> None:
    q = normal(6, 1, 3, 4)
    q[0, 1, 2] = np.nan
    out = F.scaled_dot_product_attention(tg.tensor(q), tg.tensor(q), tg.tensor(q))
    assert out.node.op.name == "scaled_dot_product_attention"
    theirs = TF.scaled_dot_product_attention(*(torch.tensor(q),) * 3)
    np.testing.assert_allclose(out.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6, equal_nan=True)


def test_attention_dropout_is_reproducible() -> None:
    q, k, v = (tg.tensor(a) for a in _qkv((2,), 4, 4, 3, 3))
    tg.manual_seed(1)
    first = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).numpy()
    tg.manual_seed(1)
    np.testing.assert_array_equal(first, F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).numpy())
    assert not np.allclose(first, F.scaled_dot_product_attention(q, k, v).numpy())


def test_attention_errors() -> None:
    q = tg.randn(2, 3, 4)
    with pytest.raises(tg.ShapeError, match=r"\(2, 3, 4\).*\(2, 3, 5\)"):
        F.scaled_dot_product_attention(q, tg.randn(2, 3, 5), tg.randn(2, 3, 5))
    with pytest.raises(tg.ArgumentError, match="is_causal"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=tg.ones(3, 3, dtype=tg.bool), is_causal=True)
    with pytest.raises(tg.DTypeError, match="attn_mask"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=tg.ones(3, 3, dtype=tg.int64))
