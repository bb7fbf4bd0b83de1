"""Loss modules: a torch.nn.functional loss plus its constructor arguments (weights are buffers, as torch)."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.nn import functional as F
from tensorgraphs.nn.functional.arguments import legacy_reduction
from tensorgraphs.nn.module import Module, bind_arguments

_LEGACY = ("size_average", "reduce")
_BUFFERS = ("weight", "pos_weight")


class Loss(Module):
    """`arguments` lists torch's constructor arguments in order; size_average/reduce fold into `reduction`."""

    function: ClassVar[Callable[..., Tensor]]
    arguments: ClassVar[dict[str, Any]] = {"size_average": None, "reduce": None, "reduction": "mean"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        values = bind_arguments(type(self).__name__, self.arguments, args, kwargs)
        self.reduction = legacy_reduction(values.pop("size_average", None), values.pop("reduce", None),
                                          values.pop("reduction"))
        for key, value in values.items():
            if key in _BUFFERS:
                self.register_buffer(key, value)
            else:
                setattr(self, key, value)

    def options(self) -> dict[str, Any]:
        names = [k for k in self.arguments if k not in _LEGACY]
        return {name: getattr(self, name) for name in names}

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return type(self).function(input, target, **self.options())


class L1Loss(Loss):
    function = F.l1_loss


class MSELoss(Loss):
    function = F.mse_loss


class SmoothL1Loss(Loss):
    function, arguments = F.smooth_l1_loss, {**Loss.arguments, "beta": 1.0}


class HuberLoss(Loss):
    """delta * smooth_l1(beta=delta): the same curve scaled, so it reuses smooth_l1_loss."""

    arguments = {"reduction": "mean", "delta": 1.0}

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return ew.mul(F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.delta), self.delta)


class KLDivLoss(Loss):
    function, arguments = F.kl_div, {**Loss.arguments, "log_target": False}


class NLLLoss(Loss):
    function = F.nll_loss
    arguments = {"weight": None, "size_average": None, "ignore_index": -100, "reduce": None, "reduction": "mean"}


class CrossEntropyLoss(Loss):
    function = F.cross_entropy
    arguments = {"weight": None, "size_average": None, "ignore_index": -100, "reduce": None, "reduction": "mean",
                 "label_smoothing": 0.0}


class BCELoss(Loss):
    function, arguments = F.binary_cross_entropy, {"weight": None, **Loss.arguments}


class BCEWithLogitsLoss(Loss):
    function = F.binary_cross_entropy_with_logits
    arguments = {"weight": None, **Loss.arguments, "pos_weight": None}
