"""Losses against torch: every reduction, weights, ignore_index, label smoothing, NaN."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from functional_check import check, normal, uniform

import tensorgraphs as tg
import tensorgraphs.nn.functional as F

REDUCTIONS = ["mean", "sum", "none"]


def _targets(seed: int, shape: tuple, classes: int, ignore: int | None = None) -> np.ndarray:
    target = np.random.default_rng(seed).integers(0, classes, shape)
    if ignore is not None and target.size > 1:
        target.flat[0] = ignore
    return target


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name,kwargs", [("mse_loss", {}), ("l1_loss", {}), ("smooth_l1_loss", {"beta": 0.5}),
                                         ("smooth_l1_loss", {"beta": 0.0}), ("huber_loss", {}),
                                         ("huber_loss", {"delta": 0.3})])
@pytest.mark.parametrize("shapes", [((3, 7), (3, 7)), ((1,), (1,)), ((2, 3, 1), (2, 3, 7))])
def test_regression_losses_match_torch(name: str, kwargs: dict, reduction: str, shapes: tuple) -> None:
    inputs = [normal(1, *shapes[0]), normal(2, *shapes[1])]
    with pytest.warns(UserWarning) if shapes[0] != shapes[1] else _no_warning():
        check(lambda a, b: getattr(F, name)(a, b, reduction=reduction, **kwargs),
              lambda a, b: getattr(TF, name)(a, b, reduction=reduction, **kwargs), inputs, grad=[0, 1], name=name)


@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"])
@pytest.mark.parametrize("shapes", [((4, 1), (4,)), ((3,), (2, 3)), ((2, 3), (2, 3)), ((), ())])
def test_regression_losses_warn_of_broadcast_shapes_as_torch_at_the_users_line(name: str, shapes: tuple) -> None:
    """A (4, 1) prediction against a (4,) target compares every pair: torch warns, and so must we."""
    a, b = normal(1, *shapes[0]), normal(2, *shapes[1])
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        getattr(TF, name)(torch.tensor(a), torch.tensor(b))
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        getattr(F, name)(tg.tensor(a), tg.tensor(b))
    assert [w.category for w in ours] == [w.category for w in theirs]
    for warning in ours:
        message = str(warning.message)
        assert f"Using a target size ({shapes[1]}) that is different to the input size ({shapes[0]})" in message
        assert warning.filename == __file__, "the warning points at the user's line"


class _no_warning:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "huber_loss"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_weighted_regression_losses_match_torch(name: str, reduction: str) -> None:
    inputs = [normal(3, 3, 7), normal(4, 3, 7), uniform(5, 3, 7)]
    check(lambda a, b, w: getattr(F, name)(a, b, reduction=reduction, weight=w),
          lambda a, b, w: getattr(TF, name)(a, b, reduction=reduction, weight=w), inputs, grad=[0, 1, 2], name=name)


def test_legacy_reduction_flags_match_torch() -> None:
    inputs = [normal(6, 3, 4), normal(7, 3, 4)]
    for flags in [{"size_average": False}, {"reduce": False}, {"size_average": True, "reduce": True}]:
        with pytest.warns(UserWarning):
            check(lambda a, b: F.mse_loss(a, b, **flags), lambda a, b: TF.mse_loss(a, b, **flags), inputs, grad=[0])


OPTIONS = [{}, {"weighted": True}, {"ignore_index": 1}, {"label_smoothing": 0.2},
           {"weighted": True, "ignore_index": 0, "label_smoothing": 0.1}]
CLASSIFICATION_CASES = (  # every option on two layouts, the plain and the fullest option on batch 1 and unbatched
    [(shapes, options) for shapes in [((3, 7), (3,)), ((2, 5, 3, 1), (2, 3, 1))] for options in OPTIONS]
    + [(shapes, options) for shapes in [((1, 3), (1,)), ((7,), ())] for options in (OPTIONS[0], OPTIONS[-1])]
)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shapes,options", CLASSIFICATION_CASES)
def test_cross_entropy_class_indices_match_torch(reduction: str, shapes: tuple, options: dict) -> None:
    x_shape, t_shape = shapes
    classes = x_shape[0] if len(x_shape) == 1 else x_shape[1]
    kwargs = {k: v for k, v in options.items() if k != "weighted"} | {"reduction": reduction}
    inputs = [normal(8, *x_shape, scale=2.0), _targets(9, t_shape, classes, options.get("ignore_index"))]
    if options.get("weighted"):
        inputs.append(uniform(10, classes, low=0.2, high=2.0))
    for fn in ("cross_entropy",) + (("nll_loss",) if "label_smoothing" not in kwargs else ()):
        prepare = (lambda t: t) if fn == "cross_entropy" else None
        check(lambda x, t, *w: getattr(F, fn)(x if prepare else F.log_softmax(x, 0 if x.ndim == 1 else 1), t, *w,
                                              **kwargs),
              lambda x, t, *w: getattr(TF, fn)(x if prepare else TF.log_softmax(x, 0 if x.ndim == 1 else 1), t, *w,
                                               **kwargs),
              inputs, grad=[0], rtol=1e-4, atol=1e-5, name=fn)  # torch has no gradient for class weights


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("options", [{}, {"weighted": True}, {"label_smoothing": 0.3}])
@pytest.mark.parametrize("x_shape", [(3, 7), (2, 4, 3), (7,)])
def test_cross_entropy_probabilities_match_torch(reduction: str, options: dict, x_shape: tuple) -> None:
    classes = x_shape[0] if len(x_shape) == 1 else x_shape[1]
    class_dim = 0 if len(x_shape) == 1 else 1
    probabilities = torch.softmax(torch.tensor(normal(11, *x_shape)), class_dim).numpy()
    inputs = [normal(12, *x_shape), probabilities] + ([uniform(13, classes)] if options.get("weighted") else [])
    kwargs = {k: v for k, v in options.items() if k != "weighted"} | {"reduction": reduction}
    check(lambda x, t, *w: F.cross_entropy(x, t, *w, **kwargs), lambda x, t, *w: TF.cross_entropy(x, t, *w, **kwargs),
          inputs, grad=range(len(inputs)), rtol=1e-4, atol=1e-5, name="cross_entropy(probabilities)")


def test_cross_entropy_composite_node_and_all_ignored_is_nan() -> None:
    x, t = tg.randn(3, 4), tg.tensor([1, 2, 0])
    assert F.cross_entropy(x, t).node.op.name == "cross_entropy"
    everything_ignored = F.cross_entropy(x, tg.tensor([-100, -100, -100])).item()
    assert math.isnan(everything_ignored)
    assert math.isnan(TF.cross_entropy(torch.randn(3, 4), torch.tensor([-100, -100, -100])).item())


def test_cross_entropy_nan_logits_propagate_except_ignored_rows() -> None:
    x = normal(14, 3, 4)
    x[0, 2] = math.nan
    x[1, 1] = math.nan
    check(lambda a, t: F.cross_entropy(a, t, ignore_index=2, reduction="none"),
          lambda a, t: TF.cross_entropy(a, t, ignore_index=2, reduction="none"), [x, np.array([1, 2, 0])])


def test_classification_errors() -> None:
    with pytest.raises(tg.ShapeError, match=r"\(3, 4\).*\(2,\)"):
        F.cross_entropy(tg.randn(3, 4), tg.tensor([1, 2]))
    with pytest.raises(tg.ShapeError, match="weight"):
        F.cross_entropy(tg.randn(3, 4), tg.tensor([1, 2, 0]), weight=tg.ones(3))
    with pytest.raises(tg.ArgumentError, match="reduction"):
        F.nll_loss(tg.randn(3, 4), tg.tensor([1, 2, 0]), reduction="avg")
    with pytest.raises(tg.ArgumentError, match="ignore_index"):
        F.cross_entropy(tg.randn(3, 4), tg.rand(3, 4), ignore_index=1)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(3, 7), (1,), (2, 3, 1)])
@pytest.mark.parametrize("weighted", [False, True])
def test_binary_cross_entropy_matches_torch(reduction: str, shape: tuple, weighted: bool) -> None:
    inputs = [uniform(15, *shape, low=0.05, high=0.95), uniform(16, *shape)]
    inputs += [uniform(17, *shape[-1:])] if weighted else []
    check(lambda x, t, *w: F.binary_cross_entropy(x, t, *w, reduction=reduction),
          lambda x, t, *w: TF.binary_cross_entropy(x, t, *w, reduction=reduction), inputs, grad=[0, 1],
          rtol=1e-4, atol=1e-5, name="binary_cross_entropy")


def test_binary_cross_entropy_clamps_the_log_at_minus_100_and_keeps_nan() -> None:
    x = np.array([0.0, 1.0, 0.5, 1e-30], np.float32)
    check(lambda a, t: F.binary_cross_entropy(a, t, reduction="none"),
          lambda a, t: TF.binary_cross_entropy(a, t, reduction="none"), [x, np.array([1.0, 0.0, 1.0, 0.5], np.float32)])
    out = F.binary_cross_entropy(tg.tensor([0.5, math.nan]), tg.tensor([1.0, 1.0]), reduction="none").numpy()
    assert not np.isnan(out[0]) and np.isnan(out[1])  # torch raises on NaN input; a lazy graph cannot


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(1,), (2, 3, 4)])
@pytest.mark.parametrize("weights", [(), ("weight",), ("pos_weight",), ("weight", "pos_weight")])
def test_binary_cross_entropy_with_logits_matches_torch(reduction: str, shape: tuple, weights: tuple) -> None:
    x = normal(18, *shape, scale=5.0)
    x.reshape(-1)[0] = 40.0
    inputs = [x, uniform(19, *shape)] + [uniform(20 + i, *shape[-1:], low=0.2, high=3.0) for i in range(len(weights))]
    def build(fn):  # noqa: ANN001, ANN202
        return lambda a, t, *w: fn(a, t, reduction=reduction, **dict(zip(weights, w)))
    check(build(F.binary_cross_entropy_with_logits), build(TF.binary_cross_entropy_with_logits), inputs,
          grad=[0, 1], rtol=1e-4, atol=1e-5, name="binary_cross_entropy_with_logits")


@pytest.mark.parametrize("reduction", REDUCTIONS + ["batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("shape", [(3, 7), (1, 3), (2, 3, 4)])
def test_kl_div_matches_torch(reduction: str, log_target: bool, shape: tuple) -> None:
    input = torch.log_softmax(torch.tensor(normal(24, *shape)), -1).numpy()
    target = torch.softmax(torch.tensor(normal(25, *shape)), -1).numpy()
    target = np.log(target) if log_target else target
    check(lambda a, t: F.kl_div(a, t, reduction=reduction, log_target=log_target),
          lambda a, t: TF.kl_div(a, t, reduction=reduction, log_target=log_target), [input, target], grad=[0, 1],
          rtol=1e-4, atol=1e-5, name="kl_div")


def test_kl_div_zero_and_nan_targets() -> None:
    target = np.array([0.0, 0.5, math.nan, 0.5], np.float32)
    check(lambda a, t: F.kl_div(a, t, reduction="none"), lambda a, t: TF.kl_div(a, t, reduction="none"),
          [normal(26, 4), target])


def _signs(seed: int, shape: tuple) -> np.ndarray:
    return np.where(np.random.default_rng(seed).random(shape) < 0.5, -1.0, 1.0).astype(np.float32)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(3, 7), (1,), (2, 1, 4)])
def test_margin_losses_match_torch(reduction: str, shape: tuple) -> None:
    x, y, signs = normal(20, *shape), normal(21, *shape), _signs(22, shape)
    check(lambda a, t: F.soft_margin_loss(a, t, reduction=reduction),
          lambda a, t: TF.soft_margin_loss(a, t, reduction=reduction), [x, signs], grad=[0], name="soft_margin_loss")
    check(lambda a, b, t: F.margin_ranking_loss(a, b, t, margin=0.3, reduction=reduction),
          lambda a, b, t: TF.margin_ranking_loss(a, b, t, margin=0.3, reduction=reduction), [x, y, signs],
          grad=[0, 1], name="margin_ranking_loss")
    check(lambda a, t: F.hinge_embedding_loss(a, t, margin=0.5, reduction=reduction),
          lambda a, t: TF.hinge_embedding_loss(a, t, margin=0.5, reduction=reduction), [x, signs], grad=[0],
          name="hinge_embedding_loss")


def test_hinge_embedding_loss_of_targets_other_than_plus_minus_one_matches_torch() -> None:
    check(F.hinge_embedding_loss, TF.hinge_embedding_loss,
          [normal(23, 6), np.array([1, -1, 0, 2, 1, -1], np.float32)], grad=[0], name="hinge_embedding_loss")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("log_input,full", [(True, False), (False, False), (True, True), (False, True)])
def test_poisson_nll_loss_matches_torch(reduction: str, log_input: bool, full: bool) -> None:
    rates = uniform(24, 3, 5, low=0.1, high=3.0)
    counts = np.random.default_rng(25).poisson(1.5, (3, 5)).astype(np.float32)
    x = np.log(rates) if log_input else rates
    check(lambda a, t: F.poisson_nll_loss(a, t, log_input=log_input, full=full, reduction=reduction),
          lambda a, t: TF.poisson_nll_loss(a, t, log_input=log_input, full=full, reduction=reduction), [x, counts],
          grad=[0], rtol=1e-5, atol=1e-6, name="poisson_nll_loss")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("var_shape", [(3, 5), (3,), (3, 1)])
@pytest.mark.parametrize("full", [False, True])
def test_gaussian_nll_loss_matches_torch(reduction: str, var_shape: tuple, full: bool) -> None:
    var = uniform(30, *var_shape, low=0.2, high=2.0)
    var.flat[0] = 1e-9  # below eps: clamped, with the gradient still reaching var as in torch
    check(lambda a, t, v: F.gaussian_nll_loss(a, t, v, full=full, reduction=reduction),
          lambda a, t, v: TF.gaussian_nll_loss(a, t, v, full=full, reduction=reduction),
          [normal(31, 3, 5), normal(32, 3, 5), var], grad=[0, 1, 2], rtol=1e-5, atol=1e-6, name="gaussian_nll_loss")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p,weighted", [(1, False), (2, False), (1, True)])
@pytest.mark.parametrize("batch", [(4,), ()])
def test_multi_margin_loss_matches_torch(reduction: str, p: int, weighted: bool, batch: tuple) -> None:
    target = np.random.default_rng(33).integers(0, 5, batch)
    inputs = [normal(34, *batch, 5), target] + ([uniform(35, 5)] if weighted else [])
    check(lambda a, t, *w: F.multi_margin_loss(a, t, p=p, margin=0.7, weight=w[0] if w else None,
                                               reduction=reduction),
          lambda a, t, *w: TF.multi_margin_loss(a, t, p=p, margin=0.7, weight=w[0] if w else None,
                                                reduction=reduction),
          inputs, grad=[0], name="multi_margin_loss")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_multilabel_soft_margin_loss_matches_torch(reduction: str, weighted: bool) -> None:
    labels = (np.random.default_rng(36).random((3, 5)) < 0.5).astype(np.float32)
    inputs = [normal(37, 3, 5, scale=3.0), labels] + ([uniform(38, 5)] if weighted else [])
    check(lambda a, t, *w: F.multilabel_soft_margin_loss(a, t, w[0] if w else None, reduction=reduction),
          lambda a, t, *w: TF.multilabel_soft_margin_loss(a, t, w[0] if w else None, reduction=reduction),
          inputs, grad=[0], name="multilabel_soft_margin_loss")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(4, 6), (6,)])
def test_cosine_embedding_loss_matches_torch(reduction: str, shape: tuple) -> None:
    target = np.array([1.0, -1.0, -1.0, 1.0], np.float32)[: shape[0] if len(shape) == 2 else 1]
    target = target if len(shape) == 2 else np.float32(-1.0) * np.ones((), np.float32)
    check(lambda a, b, t: F.cosine_embedding_loss(a, b, t, margin=-0.2, reduction=reduction),
          lambda a, b, t: TF.cosine_embedding_loss(a, b, t, margin=-0.2, reduction=reduction),
          [normal(39, *shape), normal(40, *shape), np.asarray(target)], grad=[0, 1], rtol=1e-5, atol=1e-6,
          name="cosine_embedding_loss")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p,swap", [(2, False), (1, True), (3, False)])
def test_triplet_margin_loss_matches_torch(reduction: str, p: float, swap: bool) -> None:
    inputs = [normal(41, 4, 6), normal(42, 4, 6), normal(43, 4, 6)]
    check(lambda a, b, c: F.triplet_margin_loss(a, b, c, margin=2.0, p=p, swap=swap, reduction=reduction),
          lambda a, b, c: TF.triplet_margin_loss(a, b, c, margin=2.0, p=p, swap=swap, reduction=reduction),
          inputs, grad=[0, 1, 2], rtol=1e-5, atol=1e-5, name="triplet_margin_loss")
