"""The scaled_dot_product_attention composite: softmax(q @ k^T * scale + mask) @ v, built from the matmul and
softmax composites (so a fused attention kernel can replace the whole node)."""

from __future__ import annotations

import math

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, DTypeError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import linalg
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.autocast import LOWER, autocast_op
from tensorgraphs.frontend.tensor import Tensor, apply_composite, broadcast_shapes, cast, expand_to
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.nn.functional.activations import softmax
from tensorgraphs.nn.functional.arguments import require_float, require_same_dtype
from tensorgraphs.nn.functional.linear import dropout


def _attention_infer(q: Tensor, k: Tensor, v: Tensor, *mask: Tensor, is_causal: bool, scale: float) -> tuple:
    return q.dtype, q.shape[:-1] + v.shape[-1:]


def _masked_scores(q: Tensor, k: Tensor, *mask: Tensor, is_causal: bool, scale: float) -> Tensor:
    scores = ew.mul(linalg.matmul(q, mv.mT(k)), scale)
    if is_causal:
        allowed = mv.tril(Tensor(g.const(True, dtypes.bool_, scores.shape[-2:])))
        scores = ew.where(allowed, scores, -math.inf)
    for m in mask:
        scores = ew.where(m, scores, -math.inf) if m.dtype.is_bool else ew.add(scores, m)
    return scores


def _attention_weights(q: Tensor, k: Tensor, *mask: Tensor, is_causal: bool, scale: float) -> Tensor:
    """Rows whose scores are all -inf (fully masked) weigh nothing, as torch's safe softmax (and no NaN gradient)."""
    scores = _masked_scores(q, k, *mask, is_causal=is_causal, scale=scale)
    fully_masked = rd.all(ew.eq(scores, -math.inf), -1, keepdim=True)
    return ew.where(fully_masked, 0.0, softmax(ew.where(fully_masked, 0.0, scores), -1))


def _attention_decomposition(q: Tensor, k: Tensor, v: Tensor, *mask: Tensor, is_causal: bool, scale: float,
                             dropout_p: float = 0.0) -> Tensor:
    weights = _attention_weights(q, k, *mask, is_causal=is_causal, scale=scale)
    if dropout_p:
        weights = dropout(weights, dropout_p)
    return linalg.matmul(weights, v)


def _logsumexp_decomposition(q: Tensor, k: Tensor, v: Tensor, *mask: Tensor, is_causal: bool, scale: float) -> Tensor:
    """Per query, the logsumexp of its scores: -inf for a fully masked row."""
    return rd.logsumexp(_masked_scores(q, k, *mask, is_causal=is_causal, scale=scale), -1)


def _backward_infer(q: Tensor, k: Tensor, v: Tensor, *rest: Tensor, is_causal: bool, scale: float, wrt: int) -> tuple:
    return q.dtype, (q, k, v, *rest[:-3])[wrt].shape


def _backward_decomposition(q: Tensor, k: Tensor, v: Tensor, *rest: Tensor, is_causal: bool, scale: float,
                            wrt: int) -> Tensor:
    """The gradient of the attention with respect to its input number `wrt` (q, k, v, mask), given the gradient
    of its output (the last source; the output and its logsumexp before it are what a fused kernel reads)."""
    *mask, _, _, grad = rest
    weights = _attention_weights(q, k, *mask, is_causal=is_causal, scale=scale)
    if wrt == 2:
        return linalg.matmul(mv.mT(weights), grad)
    grad_weights = linalg.matmul(grad, mv.mT(v))
    grad_scores = ew.mul(weights, ew.sub(grad_weights, rd.sum(ew.mul(weights, grad_weights), -1, keepdim=True)))
    if wrt == 3:
        return grad_scores
    return ew.mul(linalg.matmul(grad_scores, k) if wrt == 0 else linalg.matmul(mv.mT(grad_scores), q), scale)


ATTENTION_LOGSUMEXP = register(
    Composite("scaled_dot_product_attention_logsumexp", lambda q, *_, **__: (q.dtype, q.shape[:-1]),
              _logsumexp_decomposition)
)
"""What a fused attention's forward pass saves for its backward pass (the same sources as the attention)."""

ATTENTION_BACKWARD = register(Composite("scaled_dot_product_attention_backward", _backward_infer,
                                        _backward_decomposition))
"""One input's gradient; sources (q, k, v, *mask, out, logsumexp, grad_out), so a fused kernel computes the
gradients of q, k and v (the nodes sharing these sources) in one pass."""


def _attention_grad(out: Tensor, grad: Tensor, q: Tensor, k: Tensor, v: Tensor, *mask: Tensor, is_causal: bool,
                    scale: float) -> tuple[Tensor | None, ...]:
    params = {"is_causal": is_causal, "scale": scale}
    lse = apply_composite(ATTENTION_LOGSUMEXP, q, k, v, *mask, **params)
    sources = (q, k, v, *mask, out, lse, grad)
    grads = tuple(apply_composite(ATTENTION_BACKWARD, *sources, wrt=i, **params) for i in range(3))
    mask_grads = tuple(None if m.dtype.is_bool else apply_composite(ATTENTION_BACKWARD, *sources, wrt=3, **params)
                       for m in mask)
    return grads + mask_grads


SCALED_DOT_PRODUCT_ATTENTION = register(
    Composite("scaled_dot_product_attention", _attention_infer, _attention_decomposition, _attention_grad)
)


@autocast_op(LOWER)
def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """query (..., L, E), key (..., S, E), value (..., S, Ev) -> (..., L, Ev); batch dims broadcast.

    With dropout_p > 0 the decomposition is built directly (its random draw is fixed at the call), not the composite.
    """
    op = "scaled_dot_product_attention"
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.ndim < 2:
            fail(op, f"{name} must have at least 2 dims, got shape {t.shape}")
    require_float(op, query=query)
    require_same_dtype(op, query=query, key=key, value=value)
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        fail(op, f"query {query.shape}, key {key.shape} and value {value.shape} do not fit: expected query (..., L, E),"
             " key (..., S, E), value (..., S, Ev)")
    if enable_gqa and min(query.ndim, key.ndim, value.ndim) >= 3 and key.shape[-3] != query.shape[-3]:
        if query.shape[-3] % key.shape[-3] or key.shape[-3] != value.shape[-3]:
            fail(op, f"with enable_gqa the query heads must be a multiple of the key/value heads, got query "
                 f"{query.shape}, key {key.shape}, value {value.shape}")
        repeats = query.shape[-3] // key.shape[-3]
        key, value = mv.repeat_interleave(key, repeats, -3), mv.repeat_interleave(value, repeats, -3)
    if not 0.0 <= dropout_p <= 1.0:
        fail(op, f"dropout_p must be in [0, 1], got {dropout_p}", kind=ArgumentError)
    batch = broadcast_shapes(op, query.shape[:-2], key.shape[:-2], value.shape[:-2])
    q, k, v = (expand_to(t, batch + t.shape[-2:]) for t in (query, key, value))
    masks = () if attn_mask is None else (_checked_mask(op, attn_mask, q, k, is_causal),)
    # an empty head scores 0 whatever the scale (torch gives uniform weights, not a division by zero)
    scale = 1.0 / math.sqrt(max(q.shape[-1], 1)) if scale is None else float(scale)
    if dropout_p:
        return _attention_decomposition(q, k, v, *masks, is_causal=is_causal, scale=scale, dropout_p=dropout_p)

    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        wide = [cast(m, q.dtype) if m.dtype.is_floating_point else m for m in masks]
        return apply_composite(SCALED_DOT_PRODUCT_ATTENTION, q, k, v, *wide, is_causal=is_causal, scale=scale)

    # float16/bfloat16: scores, softmax and the weighted sum in float32, the result rounded once, as torch's fused
    # attention on the cpu (which also rounds the weights, and in the backward pass the score gradients, before
    # their products; so does the cpu device's fused kernel for bfloat16, schedule.attention)
    return ew.in_float32_for_halves(attention, q, k, v)


def _checked_mask(op: str, mask: Tensor, q: Tensor, k: Tensor, is_causal: bool) -> Tensor:
    """The mask broadcast to the score shape (..., L, S); bool (True = attend) or the query's float dtype."""
    if is_causal:
        fail(op, "explicit attn_mask should not be set when is_causal=True", kind=ArgumentError)
    if not (mask.dtype.is_bool or mask.dtype is q.dtype):
        fail(op, f"expected attn_mask dtype to be bool or to match the query dtype {q.dtype.name}, got "
             f"{mask.dtype.name}", kind=DTypeError)
    scores_shape = q.shape[:-1] + k.shape[-2:-1]
    if broadcast_shapes(op, mask.shape, scores_shape) != scores_shape:
        fail(op, f"attn_mask of shape {mask.shape} does not broadcast to the attention scores' shape {scores_shape}")
    return expand_to(mask, scores_shape)
