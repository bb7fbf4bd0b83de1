"""Loss functions with torch's reductions, including the cross_entropy composite (class-index targets)."""

from __future__ import annotations

import math

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, DTypeError, fail, warn
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.autocast import FLOAT32, autocast_op
from tensorgraphs.frontend.tensor import Tensor, apply_composite
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.nn.functional.activations import log_softmax, logsigmoid
from tensorgraphs.nn.functional.arguments import (
    check_reduction,
    legacy_reduction,
    reduce_loss,
    require_float,
    require_same_dtype,
)
from tensorgraphs.nn.functional.distance import pairwise_distance

# ---------------------------------------------------------------------------
# regression losses
# ---------------------------------------------------------------------------


def _warn_if_broadcast(op: str, input: Tensor, target: Tensor) -> None:
    """torch computes a regression loss of differently shaped input and target by broadcasting, with a warning:
    a (4, 1) prediction against a (4,) target silently compares every pair."""
    if target.shape != input.shape:
        warn(op, f"Using a target size ({target.shape}) that is different to the input size ({input.shape}). This "
             "will likely lead to incorrect results due to broadcasting. Please ensure they have the same size.")


def _check_weight_shape(op: str, input: Tensor, weight: Tensor) -> None:
    if weight.shape != input.shape:
        fail(op, f"weights and input must have the same size, got {weight.shape} and {input.shape}",
             kind=ArgumentError)


def _pointwise_loss(op: str, loss: Tensor, input: Tensor, weight: Tensor | None, reduction: str) -> Tensor:
    """Optionally weighted (weight of the input's shape; mean divides by the weights' sum, as torch)."""
    if weight is None:
        return reduce_loss(op, loss, reduction)
    _check_weight_shape(op, input, weight)
    check_reduction(op, reduction)
    weighted = ew.mul(loss, weight)
    return ew.div(rd.sum(weighted), rd.sum(weight)) if reduction == "mean" else reduce_loss(op, weighted, reduction)


@autocast_op(FLOAT32)
def mse_loss(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
             reduction: str = "mean", weight: Tensor | None = None) -> Tensor:
    _warn_if_broadcast("mse_loss", input, target)
    difference = ew.sub(input, target)
    loss = ew.mul(difference, difference)
    return _pointwise_loss("mse_loss", loss, input, weight, legacy_reduction(size_average, reduce, reduction))


@autocast_op(FLOAT32)
def l1_loss(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
            reduction: str = "mean", weight: Tensor | None = None) -> Tensor:
    _warn_if_broadcast("l1_loss", input, target)
    loss = ew.abs(ew.sub(input, target))
    return _pointwise_loss("l1_loss", loss, input, weight, legacy_reduction(size_average, reduce, reduction))


@autocast_op(FLOAT32)
def smooth_l1_loss(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """0.5 * d^2 / beta where |d| < beta, |d| - 0.5 * beta elsewhere; beta = 0 is the L1 loss."""
    if beta < 0:
        fail("smooth_l1_loss", f"smooth_l1_loss does not support negative values for beta, got {beta}",
             kind=ArgumentError)
    _warn_if_broadcast("smooth_l1_loss", input, target)
    distance = ew.abs(ew.sub(input, target))
    if beta == 0:
        loss = distance
    else:
        loss = ew.where(ew.lt(distance, beta), ew.div(ew.mul(ew.mul(distance, distance), 0.5), beta),
                        ew.sub(distance, 0.5 * beta))
    return reduce_loss("smooth_l1_loss", loss, legacy_reduction(size_average, reduce, reduction))


@autocast_op(FLOAT32)
def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: Tensor | None = None) -> Tensor:
    """0.5 * d^2 where |d| < delta, delta * (|d| - 0.5 * delta) elsewhere: smooth_l1_loss scaled by delta."""
    if delta <= 0:
        fail("huber_loss", f"huber_loss does not support non-positive values for delta, got {delta}",
             kind=ArgumentError)
    _warn_if_broadcast("huber_loss", input, target)
    distance = ew.abs(ew.sub(input, target))
    loss = ew.where(ew.lt(distance, delta), ew.mul(ew.mul(distance, distance), 0.5),
                    ew.mul(ew.sub(distance, 0.5 * delta), delta))
    if weight is not None:  # unlike mse_loss and l1_loss, torch's mean here divides by the count, not the weights
        _check_weight_shape("huber_loss", input, weight)
        loss = ew.mul(loss, weight)
    return reduce_loss("huber_loss", loss, reduction)


@autocast_op(FLOAT32)
def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True, full: bool = False,
                     size_average: bool | None = None, eps: float = 1e-8, reduce: bool | None = None,
                     reduction: str = "mean") -> Tensor:
    """exp(x) - t * x for a log-rate x (else x - t * log(x + eps)); `full` adds Stirling's term where t > 1."""
    if log_input:
        loss = ew.sub(ew.exp(input), ew.mul(target, input))
    else:
        loss = ew.sub(input, ew.mul(target, ew.log(ew.add(input, eps))))
    if full:
        stirling = ew.add(ew.sub(ew.mul(target, ew.log(target)), target),
                          ew.mul(ew.log(ew.mul(target, 2 * math.pi)), 0.5))
        loss = ew.add(loss, ew.where(ew.le(target, 1), 0.0, stirling))
    return reduce_loss("poisson_nll_loss", loss, legacy_reduction(size_average, reduce, reduction))


# ---------------------------------------------------------------------------
# margin losses (targets of 1 and -1)
# ---------------------------------------------------------------------------


@autocast_op(FLOAT32)
def soft_margin_loss(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
                     reduction: str = "mean") -> Tensor:
    """log(1 + exp(-t * x)), as torch computes it."""
    loss = ew.log1p(ew.exp(ew.neg(ew.mul(target, input))))
    return reduce_loss("soft_margin_loss", loss, legacy_reduction(size_average, reduce, reduction))


@autocast_op(FLOAT32)
def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0,
                        size_average: bool | None = None, reduce: bool | None = None,
                        reduction: str = "mean") -> Tensor:
    """max(0, -t * (x1 - x2) + margin): x1 should rank above x2 where t = 1, below where t = -1."""
    if not input1.ndim == input2.ndim == target.ndim:
        fail("margin_ranking_loss", f"all inputs must have the same number of dims, got {input1.shape}, "
             f"{input2.shape} and {target.shape}")
    loss = ew.clamp(ew.add(ew.mul(ew.neg(target), ew.sub(input1, input2)), margin), min=0)
    return reduce_loss("margin_ranking_loss", loss, legacy_reduction(size_average, reduce, reduction))


@autocast_op(FLOAT32)
def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0, size_average: bool | None = None,
                         reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    """x where t = 1, max(0, margin - x) where t = -1 (both where t is neither, as torch)."""
    margin_term = ew.where(ew.ne(target, 1), ew.clamp(ew.sub(margin, input), min=0), 0.0)
    loss = ew.add(margin_term, ew.where(ew.ne(target, -1), input, 0.0))
    return reduce_loss("hinge_embedding_loss", loss, legacy_reduction(size_average, reduce, reduction))


def gaussian_nll_loss(input: Tensor, target: Tensor, var: Tensor | float, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean") -> Tensor:
    """0.5 * (log(var) + (x - t)^2 / var), var clamped at eps without blocking its gradient (as torch's
    no-grad clamp); var of the input's shape, or without its last dim, or with a last dim of 1.

    torch also raises if a var entry is negative; that check reads the data, so here such an entry gives NaN."""
    var = var if isinstance(var, Tensor) else Tensor(g.const(float(var), input.dtype, ()))
    if var.shape != input.shape and var.ndim:
        if var.shape == input.shape[:-1]:
            var = mv.unsqueeze(var, -1)
        elif not (var.shape[:-1] == input.shape[:-1] and var.shape[-1] == 1):
            fail("gaussian_nll_loss", f"var of shape {var.shape} does not fit input of shape {input.shape}",
                 kind=ArgumentError)
    check_reduction("gaussian_nll_loss", reduction)
    clamped = ew.add(var, ew.sub(ew.clamp(var, min=eps), var).detach())
    difference = ew.sub(input, target)
    loss = ew.mul(ew.add(ew.log(clamped), ew.div(ew.mul(difference, difference), clamped)), 0.5)
    if full:
        loss = ew.add(loss, 0.5 * math.log(2 * math.pi))
    return reduce_loss("gaussian_nll_loss", loss, reduction)


# ---------------------------------------------------------------------------
# negative log likelihood and cross entropy
# ---------------------------------------------------------------------------


def _class_dim(x: Tensor) -> int:
    return 0 if x.ndim == 1 else 1


def _nll_terms(log_probs: Tensor, target: Tensor, weight: Tensor, ignore_index: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-target loss -weight[t] * log_probs[t], the weight each target counts with, and the not-ignored mask
    (ignored targets contribute 0 and weigh 0)."""
    class_dim = _class_dim(log_probs)
    kept = ew.ne(target, ignore_index)
    safe_target = ew.where(kept, target, 0)
    picked = mv.squeeze(mv.gather(log_probs, class_dim, mv.unsqueeze(safe_target, class_dim)), class_dim)
    target_weight = mv.reshape(mv.index_select(weight, 0, mv.reshape(safe_target, -1)), target.shape)
    target_weight = ew.where(kept, target_weight, 0.0)
    loss = ew.where(kept, ew.neg(ew.mul(picked, target_weight)), 0.0)
    return loss, target_weight, kept


def _weighted_reduction(loss: Tensor, target_weight: Tensor, reduction: str) -> Tensor:
    """nll's reductions: 'mean' divides by the total weight of the counted targets."""
    if reduction == "mean":
        return ew.div(rd.sum(loss), rd.sum(target_weight))
    return rd.sum(loss) if reduction == "sum" else loss


def _cross_entropy_infer(x: Tensor, target: Tensor, weight: Tensor, *, ignore_index: int, label_smoothing: float,
                         reduction: str) -> tuple:
    return x.dtype, target.shape if reduction == "none" else ()


def _cross_entropy_decomposition(x: Tensor, target: Tensor, weight: Tensor, *, ignore_index: int,
                                 label_smoothing: float, reduction: str) -> Tensor:
    """nll of log_softmax, mixed with label_smoothing / C times the weighted sum over all classes."""
    class_dim = _class_dim(x)
    log_probs = log_softmax(x, class_dim)
    loss, target_weight, kept = _nll_terms(log_probs, target, weight, ignore_index)
    if label_smoothing:
        class_weight = mv.reshape(weight, (-1,) + (1,) * (x.ndim - class_dim - 1))
        smooth = ew.neg(rd.sum(ew.mul(log_probs, class_weight), class_dim))
        smooth = ew.where(kept, smooth, 0.0)
        classes = x.shape[class_dim]
        loss = ew.add(ew.mul(loss, 1.0 - label_smoothing), ew.mul(smooth, label_smoothing / classes))
    return _weighted_reduction(loss, target_weight, reduction)


CROSS_ENTROPY = register(Composite("cross_entropy", _cross_entropy_infer, _cross_entropy_decomposition))


def _check_classification(op: str, input: Tensor, target: Tensor, weight: Tensor | None) -> None:
    if input.ndim == 0:
        fail(op, f"expected input of shape (C,), (N, C) or (N, C, d1, ...), got {input.shape}")
    class_dim = _class_dim(input)
    expected = input.shape[:class_dim] + input.shape[class_dim + 1 :]
    if target.dtype.is_floating_point:
        if target.shape != input.shape:
            fail(op, f"probability targets must have the input's shape {input.shape}, got {target.shape}")
    elif not target.dtype.is_integer:
        fail(op, f"expected integer class indices or float probabilities as target, got {target.dtype.name}",
             kind=DTypeError)
    elif target.shape != expected:
        fail(op, f"input {input.shape} expects class-index target of shape {expected}, got {target.shape}")
    if weight is not None and weight.shape != (input.shape[class_dim],):
        fail(op, f"weight must hold one value per class ({input.shape[class_dim]},), got {weight.shape}")
    require_float(op, input=input)
    require_same_dtype(op, input=input, weight=weight)


def _class_weights(input: Tensor, weight: Tensor | None) -> Tensor:
    return Tensor(g.const(1.0, input.dtype, (input.shape[_class_dim(input)],))) if weight is None else weight


@autocast_op(FLOAT32)
def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: bool | None = None,
             ignore_index: int = -100, reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    """-input[target] per target, from log-probabilities; ignore_index targets count neither loss nor weight."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction("nll_loss", reduction)
    _check_classification("nll_loss", input, target, weight)
    if target.dtype.is_floating_point:
        fail("nll_loss", f"expected integer class indices as target, got {target.dtype.name}", kind=DTypeError)
    loss, target_weight, _ = _nll_terms(input, target, _class_weights(input, weight), ignore_index)
    return _weighted_reduction(loss, target_weight, reduction)


@autocast_op(FLOAT32)
def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: bool | None = None,
                  ignore_index: int = -100, reduce: bool | None = None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """Class-index targets build the cross_entropy composite; probability targets are a plain composition."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction("cross_entropy", reduction)
    _check_classification("cross_entropy", input, target, weight)
    if not 0.0 <= label_smoothing <= 1.0:
        fail("cross_entropy", f"label_smoothing must be between 0.0 and 1.0, got {label_smoothing}",
             kind=ArgumentError)
    if target.dtype.is_floating_point:
        return _cross_entropy_probabilities(input, target, weight, ignore_index, reduction, label_smoothing)
    return apply_composite(CROSS_ENTROPY, input, target, _class_weights(input, weight), ignore_index=int(ignore_index),
                           label_smoothing=float(label_smoothing), reduction=reduction)


def _cross_entropy_probabilities(input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                                 reduction: str, label_smoothing: float) -> Tensor:
    """-sum(target * weight * log_softmax(input)) over classes; 'mean' divides by the number of samples."""
    if ignore_index >= 0:
        fail("cross_entropy", "ignore_index is not supported for floating point target", kind=ArgumentError)
    class_dim = _class_dim(input)
    classes = input.shape[class_dim]
    if label_smoothing:
        target = ew.add(ew.mul(target, 1.0 - label_smoothing), label_smoothing / classes)
    products = ew.mul(log_softmax(input, class_dim), target)
    if weight is not None:
        products = ew.mul(products, mv.reshape(weight, (-1,) + (1,) * (input.ndim - class_dim - 1)))
    loss = ew.neg(rd.sum(products, class_dim))
    if reduction == "mean":
        return ew.div(rd.sum(loss), input.numel() // classes if input.numel() else float("nan"))
    return reduce_loss("cross_entropy", loss, reduction)


@autocast_op(FLOAT32)
def multi_margin_loss(input: Tensor, target: Tensor, p: int = 1, margin: float = 1.0, weight: Tensor | None = None,
                      size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    """Per sample: the mean over classes j != y of max(0, margin - x[y] + x[j])^p, times weight[y]."""
    if p not in (1, 2):
        fail("multi_margin_loss", f"only p == 1 and p == 2 supported, got {p}", kind=ArgumentError)
    if input.ndim > 2 or target.shape != (input.shape[:1] if input.ndim == 2 else ()):
        fail("multi_margin_loss", f"expected input of 1 or 2 dims and target of its batch size, got {input.shape} "
             f"and {target.shape}")
    if not target.dtype.is_integer:
        fail("multi_margin_loss", f"expected integer class targets, got {target.dtype.name}", kind=DTypeError)
    x = input if input.ndim == 2 else mv.unsqueeze(input, 0)
    y = mv.reshape(target, (x.shape[0], 1))
    terms = ew.clamp(ew.add(ew.sub(margin, mv.gather(x, 1, y)), x), min=0)
    terms = ew.mul(terms, terms) if p == 2 else terms
    if weight is not None:
        terms = ew.mul(terms, mv.reshape(mv.index_select(weight, 0, mv.reshape(y, -1)), (x.shape[0], 1)))
    is_target = ew.eq(mv.reshape(Tensor(g.iota(x.shape[1], dtypes.int64)), (1, -1)), y)
    loss = ew.div(rd.sum(ew.where(is_target, 0.0, terms), 1), x.shape[1])
    loss = loss if input.ndim == 2 else mv.reshape(loss, ())
    return reduce_loss("multi_margin_loss", loss, legacy_reduction(size_average, reduce, reduction))


def multilabel_soft_margin_loss(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                size_average: bool | None = None, reduce: bool | None = None,
                                reduction: str = "mean") -> Tensor:
    """Binary cross entropy of each class's logit, averaged over the classes (the last dim)."""
    loss = ew.neg(ew.add(ew.mul(target, logsigmoid(input)), ew.mul(ew.sub(1.0, target), logsigmoid(ew.neg(input)))))
    if weight is not None:
        loss = ew.mul(loss, weight)
    loss = ew.div(rd.sum(loss, -1), input.shape[-1])
    return reduce_loss("multilabel_soft_margin_loss", loss, legacy_reduction(size_average, reduce, reduction))


@autocast_op(FLOAT32)
def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0,
                          size_average: bool | None = None, reduce: bool | None = None,
                          reduction: str = "mean") -> Tensor:
    """1 - cos(x1, x2) where t = 1, max(0, cos(x1, x2) - margin) where t = -1 (cos along the last dim)."""
    dim = input1.ndim - 1
    squared_norms = [ew.add(rd.sum(ew.mul(x, x), dim), 1e-12) for x in (input1, input2)]
    cos = ew.div(rd.sum(ew.mul(input1, input2), dim), ew.sqrt(ew.mul(*squared_norms)))
    loss = ew.add(ew.where(ew.eq(target, 1), ew.sub(1.0, cos), 0.0),
                  ew.where(ew.eq(target, -1), ew.clamp(ew.sub(cos, margin), min=0), 0.0))
    return reduce_loss("cosine_embedding_loss", loss, legacy_reduction(size_average, reduce, reduction))


@autocast_op(FLOAT32)
def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0, p: float = 2,
                        eps: float = 1e-6, swap: bool = False, size_average: bool | None = None,
                        reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    """max(0, margin + d(a, p) - d(a, n)), d the pairwise p-norm distance; `swap` takes the nearer of d(a, n)
    and d(p, n)."""
    if not anchor.ndim == positive.ndim == negative.ndim:
        fail("triplet_margin_loss", f"anchor, positive and negative must have the same number of dims, got "
             f"{anchor.shape}, {positive.shape} and {negative.shape}")
    to_positive = pairwise_distance(anchor, positive, p, eps)
    to_negative = pairwise_distance(anchor, negative, p, eps)
    if swap:
        to_negative = ew.minimum(to_negative, pairwise_distance(positive, negative, p, eps))
    loss = ew.clamp(ew.sub(ew.add(to_positive, margin), to_negative), min=0)
    return reduce_loss("triplet_margin_loss", loss, legacy_reduction(size_average, reduce, reduction))


# ---------------------------------------------------------------------------
# binary and distribution losses
# ---------------------------------------------------------------------------


def _check_same_shape(op: str, input: Tensor, target: Tensor) -> None:
    if target.shape != input.shape:
        fail(op, f"using a target size ({target.shape}) that is different to the input size ({input.shape}) is not "
             "supported; please ensure they have the same size", kind=ArgumentError)


@autocast_op(FLOAT32)
def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                         size_average: bool | None = None, reduce: bool | None = None,
                         reduction: str = "mean") -> Tensor:
    """-weight * (t * log(x) + (1 - t) * log(1 - x)) with both logs clamped at -100, as torch."""
    _check_same_shape("binary_cross_entropy", input, target)
    require_float("binary_cross_entropy", input=input, target=target)
    log_x = ew.maximum(ew.log(input), -100.0)
    log_not_x = ew.maximum(ew.log1p(ew.neg(input)), -100.0)
    loss = ew.neg(ew.add(ew.mul(target, log_x), ew.mul(ew.sub(1.0, target), log_not_x)))
    if weight is not None:
        loss = ew.mul(loss, weight)
    return reduce_loss("binary_cross_entropy", loss, legacy_reduction(size_average, reduce, reduction))


@autocast_op(FLOAT32)
def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     size_average: bool | None = None, reduce: bool | None = None,
                                     reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    """(1 - t) * x - (1 + (pos_weight - 1) * t) * logsigmoid(x): stable for any logit."""
    _check_same_shape("binary_cross_entropy_with_logits", input, target)
    require_float("binary_cross_entropy_with_logits", input=input, target=target)
    positive_scale = 1.0 if pos_weight is None else ew.add(ew.mul(ew.sub(pos_weight, 1.0), target), 1.0)
    loss = ew.sub(ew.mul(ew.sub(1.0, target), input), ew.mul(positive_scale, logsigmoid(input)))
    if weight is not None:
        loss = ew.mul(loss, weight)
    return reduce_loss("binary_cross_entropy_with_logits", loss, legacy_reduction(size_average, reduce, reduction))


@autocast_op(FLOAT32)
def kl_div(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
           reduction: str = "mean", log_target: bool = False) -> Tensor:
    """target * (log(target) - input) pointwise, input being log-probabilities (0 where target is 0);
    'batchmean' divides the sum by the batch size."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    if log_target:
        loss = ew.mul(ew.exp(target), ew.sub(target, input))
    else:
        target_log_target = ew.where(ew.eq(target, 0), 0.0, ew.mul(target, ew.log(target)))
        loss = ew.sub(target_log_target, ew.mul(target, input))
    if reduction == "batchmean":
        total = rd.sum(loss)
        return ew.div(total, input.shape[0]) if input.ndim else total
    return reduce_loss("kl_div", loss, reduction)
