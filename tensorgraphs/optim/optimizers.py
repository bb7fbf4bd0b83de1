"""SGD, Adam, AdamW, RMSprop, Adagrad, Adadelta, Adamax, NAdam and RAdam: torch's single-tensor update rules,
written as Tensor ops."""

from __future__ import annotations

import math
from typing import Any, Iterable

from tensorgraphs import dtypes
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend.tensor import Tensor, cast
from tensorgraphs.optim.optimizer import Optimizer, ParamGroup, state_buffer


def _check(name: str, value: float, low: float = 0.0) -> None:
    if not value >= low:
        raise ValueError(f"Invalid {name}: {value}")


def _bias_correction(beta: float, step: Tensor) -> Tensor:
    """1 - beta**step without cancellation: -expm1(step * log(beta)), so float32 stays exact to ~1 ulp."""
    return ew.neg(ew.expm1(ew.mul(step, math.log(beta))))


def _with_weight_decay(grad: Tensor, param: Tensor, weight_decay: float) -> Tensor:
    return ew.add(grad, ew.mul(param, weight_decay)) if weight_decay else grad


def check_implementation_options(owner: str, options: dict[str, Any]) -> None:
    """torch's foreach/fused/capturable/differentiable pick an implementation, not a result: accepted, ignored."""
    unknown = set(options) - {"foreach", "fused", "capturable", "differentiable"}
    if unknown:
        raise TypeError(f"{owner} got an unexpected keyword argument '{sorted(unknown)[0]}'")


def _step_counter() -> Tensor:
    return state_buffer((), dtypes.float32)


def _check_betas(betas: tuple[float, float]) -> None:
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")


def _scalar_power(base: float, exponent: Tensor) -> Tensor:
    """base ** exponent for a step-dependent 0-d exponent, in float64 as torch's Python-float scalars."""
    return ew.exp(ew.mul(cast(exponent, dtypes.float64), math.log(base)))


def _lerp(start: Tensor, end: Tensor, weight: float) -> Tensor:
    return ew.add(start, ew.mul(ew.sub(end, start), weight))


class SGD(Optimizer):
    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False,
                 **implementation: Any) -> None:
        check_implementation_options(type(self).__name__, implementation)
        for name, value in (("learning rate", lr), ("momentum value", momentum), ("weight_decay value", weight_decay)):
            _check(name, value)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def init_state(self, param: Tensor, group: ParamGroup) -> dict[str, Any]:
        if not group["momentum"]:
            return {}
        return {"step": _step_counter(), "momentum_buffer": state_buffer(param.shape, param.dtype)}

    def update(self, param: Tensor, grad: Tensor, state: dict[str, Any], group: ParamGroup) -> dict[str, Tensor]:
        direction = _with_weight_decay(grad, param, group["weight_decay"])
        new: dict[str, Tensor] = {}
        momentum = group["momentum"]
        if momentum:
            buffer = ew.add(ew.mul(state["momentum_buffer"], momentum), ew.mul(direction, 1 - group["dampening"]))
            if "step" in state:  # torch's first step takes the direction undamped; a select, so a compiled step
                # does the same at every call (a state loaded from torch has no count: it is past its first step)
                buffer = ew.where(ew.eq(state["step"], 0.0), direction, buffer)
                new["step"] = ew.add(state["step"], 1.0)
            new["momentum_buffer"] = buffer
            direction = ew.add(direction, ew.mul(buffer, momentum)) if group["nesterov"] else buffer
        new["param"] = ew.sub(param, ew.mul(direction, group["lr"]))
        return new


class Adam(Optimizer):
    decoupled_weight_decay = False

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, amsgrad: bool = False, *, maximize: bool = False,
                 **implementation: Any) -> None:
        check_implementation_options(type(self).__name__, implementation)
        for name, value in (("learning rate", lr), ("epsilon value", eps), ("weight_decay value", weight_decay)):
            _check(name, value)
        _check_betas(betas)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize))

    def init_state(self, param: Tensor, group: ParamGroup) -> dict[str, Any]:
        state = {"step": _step_counter(), "exp_avg": state_buffer(param.shape, param.dtype),
                 "exp_avg_sq": state_buffer(param.shape, param.dtype)}
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = state_buffer(param.shape, param.dtype)
        return state

    def update(self, param: Tensor, grad: Tensor, state: dict[str, Any], group: ParamGroup) -> dict[str, Tensor]:
        lr, (beta1, beta2), weight_decay = group["lr"], group["betas"], group["weight_decay"]
        step = ew.add(state["step"], 1.0)
        if self.decoupled_weight_decay:
            param = ew.mul(param, ew.sub(1.0, ew.mul(lr, weight_decay)))
        else:
            grad = _with_weight_decay(grad, param, weight_decay)
        exp_avg = ew.add(state["exp_avg"], ew.mul(ew.sub(grad, state["exp_avg"]), 1 - beta1))
        exp_avg_sq = ew.add(ew.mul(state["exp_avg_sq"], beta2), ew.mul(ew.mul(grad, grad), 1 - beta2))
        new = {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        second_moment = exp_avg_sq
        if group["amsgrad"]:
            second_moment = new["max_exp_avg_sq"] = ew.maximum(state["max_exp_avg_sq"], exp_avg_sq)
        step_size = ew.div(lr, _bias_correction(beta1, step))
        denom = ew.add(ew.div(ew.sqrt(second_moment), ew.sqrt(_bias_correction(beta2, step))), group["eps"])
        new["param"] = ew.sub(param, ew.mul(ew.div(exp_avg, denom), step_size))
        return new


class AdamW(Adam):
    """Adam with decoupled weight decay: the parameter shrinks by lr * weight_decay before the Adam step."""

    decoupled_weight_decay = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, **implementation: Any) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, **implementation)


class RMSprop(Optimizer):
    def __init__(self, params: Iterable[Any], lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False, *,
                 maximize: bool = False, **implementation: Any) -> None:
        check_implementation_options(type(self).__name__, implementation)
        for name, value in (("learning rate", lr), ("epsilon value", eps), ("momentum value", momentum),
                            ("weight_decay value", weight_decay), ("alpha value", alpha)):
            _check(name, value)
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, maximize=maximize))

    def init_state(self, param: Tensor, group: ParamGroup) -> dict[str, Any]:
        state = {"step": _step_counter(), "square_avg": state_buffer(param.shape, param.dtype)}
        if group["momentum"] > 0:
            state["momentum_buffer"] = state_buffer(param.shape, param.dtype)
        if group["centered"]:
            state["grad_avg"] = state_buffer(param.shape, param.dtype)
        return state

    def update(self, param: Tensor, grad: Tensor, state: dict[str, Any], group: ParamGroup) -> dict[str, Tensor]:
        alpha = group["alpha"]
        grad = _with_weight_decay(grad, param, group["weight_decay"])
        square_avg = ew.add(ew.mul(state["square_avg"], alpha), ew.mul(ew.mul(grad, grad), 1 - alpha))
        new = {"step": ew.add(state["step"], 1.0), "square_avg": square_avg}
        if group["centered"]:
            grad_avg = new["grad_avg"] = ew.add(state["grad_avg"], ew.mul(ew.sub(grad, state["grad_avg"]), 1 - alpha))
            variance = ew.sub(square_avg, ew.mul(grad_avg, grad_avg))
        else:
            variance = square_avg
        avg = ew.add(ew.sqrt(variance), group["eps"])
        if group["momentum"] > 0:
            buffer = new["momentum_buffer"] = ew.add(ew.mul(state["momentum_buffer"], group["momentum"]),
                                                     ew.div(grad, avg))
            new["param"] = ew.sub(param, ew.mul(buffer, group["lr"]))
        else:
            new["param"] = ew.sub(param, ew.mul(ew.div(grad, avg), group["lr"]))
        return new


class Adagrad(Optimizer):
    def __init__(self, params: Iterable[Any], lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, *, maximize: bool = False,
                 **implementation: Any) -> None:
        check_implementation_options(type(self).__name__, implementation)
        for name, value in (("learning rate", lr), ("lr_decay value", lr_decay), ("weight_decay value", weight_decay),
                            ("initial_accumulator_value value", initial_accumulator_value), ("epsilon value", eps)):
            _check(name, value)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay, eps=eps,
                                      initial_accumulator_value=initial_accumulator_value, maximize=maximize))
        for group in self.param_groups:  # torch creates Adagrad's state eagerly
            for param in group["params"]:
                self.state[param] = self.init_state(param, group)

    def init_state(self, param: Tensor, group: ParamGroup) -> dict[str, Any]:
        return {"step": _step_counter(),
                "sum": state_buffer(param.shape, param.dtype, group["initial_accumulator_value"])}

    def update(self, param: Tensor, grad: Tensor, state: dict[str, Any], group: ParamGroup) -> dict[str, Tensor]:
        step = ew.add(state["step"], 1.0)
        grad = _with_weight_decay(grad, param, group["weight_decay"])
        clr = ew.div(group["lr"], ew.add(ew.mul(ew.sub(step, 1.0), group["lr_decay"]), 1.0))
        total = ew.add(state["sum"], ew.mul(grad, grad))
        std = ew.add(ew.sqrt(total), group["eps"])
        return {"step": step, "sum": total, "param": ew.sub(param, ew.mul(ew.div(grad, std), clr))}


class Adadelta(Optimizer):
    def __init__(self, params: Iterable[Any], lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0, *, maximize: bool = False, **implementation: Any) -> None:
        check_implementation_options(type(self).__name__, implementation)
        for name, value in (("learning rate", lr), ("epsilon value", eps), ("weight_decay value", weight_decay)):
            _check(name, value)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize))

    def init_state(self, param: Tensor, group: ParamGroup) -> dict[str, Any]:
        return {"step": _step_counter(), "square_avg": state_buffer(param.shape, param.dtype),
                "acc_delta": state_buffer(param.shape, param.dtype)}

    def update(self, param: Tensor, grad: Tensor, state: dict[str, Any], group: ParamGroup) -> dict[str, Tensor]:
        rho, eps = group["rho"], group["eps"]
        grad = _with_weight_decay(grad, param, group["weight_decay"])
        square_avg = ew.add(ew.mul(state["square_avg"], rho), ew.mul(ew.mul(grad, grad), 1 - rho))
        std = ew.sqrt(ew.add(square_avg, eps))
        delta = ew.mul(ew.div(ew.sqrt(ew.add(state["acc_delta"], eps)), std), grad)
        acc_delta = ew.add(ew.mul(state["acc_delta"], rho), ew.mul(ew.mul(delta, delta), 1 - rho))
        return {"step": ew.add(state["step"], 1.0), "square_avg": square_avg, "acc_delta": acc_delta,
                "param": ew.sub(param, ew.mul(delta, group["lr"]))}


class Adamax(Optimizer):
    def __init__(self, params: Iterable[Any], lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, *, maximize: bool = False,
                 **implementation: Any) -> None:
        check_implementation_options(type(self).__name__, implementation)
        for name, value in (("learning rate", lr), ("epsilon value", eps), ("weight_decay value", weight_decay)):
            _check(name, value)
        _check_betas(betas)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      maximize=maximize))

    def init_state(self, param: Tensor, group: ParamGroup) -> dict[str, Any]:
        return {"step": _step_counter(), "exp_avg": state_buffer(param.shape, param.dtype),
                "exp_inf": state_buffer(param.shape, param.dtype)}

    def update(self, param: Tensor, grad: Tensor, state: dict[str, Any], group: ParamGroup) -> dict[str, Tensor]:
        beta1, beta2 = group["betas"]
        step = ew.add(state["step"], 1.0)
        grad = _with_weight_decay(grad, param, group["weight_decay"])
        exp_avg = _lerp(state["exp_avg"], grad, 1 - beta1)
        exp_inf = ew.maximum(ew.mul(state["exp_inf"], beta2), ew.add(ew.abs(grad), group["eps"]))
        step_size = ew.div(group["lr"], _bias_correction(beta1, step))
        return {"step": step, "exp_avg": exp_avg, "exp_inf": exp_inf,
                "param": ew.sub(param, ew.mul(ew.div(exp_avg, exp_inf), step_size))}


class _AdamVariant(Optimizer):
    """NAdam and RAdam: Adam's moments, torch's optional decoupled weight decay."""

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], **implementation: Any) -> None:
        check_implementation_options(type(self).__name__, implementation)
        for name, key in (("learning rate", "lr"), ("epsilon value", "eps"), ("weight_decay value", "weight_decay")):
            _check(name, defaults[key])
        _check_betas(defaults["betas"])
        super().__init__(params, {**defaults, "betas": tuple(defaults["betas"])})

    def init_state(self, param: Tensor, group: ParamGroup) -> dict[str, Any]:
        return {"step": _step_counter(), "exp_avg": state_buffer(param.shape, param.dtype),
                "exp_avg_sq": state_buffer(param.shape, param.dtype)}

    def moments(self, param: Tensor, grad: Tensor, state: dict[str, Any], group: ParamGroup
                ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(step, param after decoupled decay, grad after coupled decay, exp_avg, exp_avg_sq)."""
        beta1, beta2 = group["betas"]
        weight_decay = group["weight_decay"]
        if group["decoupled_weight_decay"]:
            param = ew.mul(param, ew.sub(1.0, ew.mul(group["lr"], weight_decay)))
        else:
            grad = _with_weight_decay(grad, param, weight_decay)
        exp_avg = _lerp(state["exp_avg"], grad, 1 - beta1)
        exp_avg_sq = ew.add(ew.mul(state["exp_avg_sq"], beta2), ew.mul(ew.mul(grad, grad), 1 - beta2))
        return ew.add(state["step"], 1.0), param, grad, exp_avg, exp_avg_sq


class NAdam(_AdamVariant):
    def __init__(self, params: Iterable[Any], lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, maximize: bool = False, **implementation: Any) -> None:
        _check("momentum_decay value", momentum_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize), **implementation)

    def init_state(self, param: Tensor, group: ParamGroup) -> dict[str, Any]:
        return {**super().init_state(param, group), "mu_product": state_buffer((), dtypes.float32, 1.0)}

    def update(self, param: Tensor, grad: Tensor, state: dict[str, Any], group: ParamGroup) -> dict[str, Tensor]:
        beta1, beta2 = group["betas"]
        step, param, grad, exp_avg, exp_avg_sq = self.moments(param, grad, state, group)
        decay = lambda k: _scalar_power(0.96, ew.mul(k, group["momentum_decay"]))  # noqa: E731
        mu = ew.mul(ew.sub(1.0, ew.mul(decay(step), 0.5)), beta1)
        mu_next = ew.mul(ew.sub(1.0, ew.mul(decay(ew.add(step, 1.0)), 0.5)), beta1)
        mu_product = ew.mul(cast(state["mu_product"], dtypes.float64), mu)
        lr = cast(group["lr"], dtypes.float64)
        denom = ew.add(ew.sqrt(ew.div(exp_avg_sq, cast(_bias_correction(beta2, step), param.dtype))), group["eps"])
        grad_scale = ew.div(ew.mul(lr, ew.sub(1.0, mu)), ew.sub(1.0, mu_product))
        avg_scale = ew.div(ew.mul(lr, mu_next), ew.sub(1.0, ew.mul(mu_product, mu_next)))
        change = ew.add(ew.mul(grad, cast(grad_scale, param.dtype)), ew.mul(exp_avg, cast(avg_scale, param.dtype)))
        return {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq,
                "mu_product": cast(mu_product, dtypes.float32), "param": ew.sub(param, ew.div(change, denom))}


class RAdam(_AdamVariant):
    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, decoupled_weight_decay: bool = False, *,
                 maximize: bool = False, **implementation: Any) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      decoupled_weight_decay=decoupled_weight_decay, maximize=maximize),
                         **implementation)

    def update(self, param: Tensor, grad: Tensor, state: dict[str, Any], group: ParamGroup) -> dict[str, Tensor]:
        """The rectified step where the variance is tractable (rho_t > 5), plain momentum before: a `where` on
        the step counter, so one traced program serves every step."""
        beta1, beta2 = group["betas"]
        step, param, grad, exp_avg, exp_avg_sq = self.moments(param, grad, state, group)
        step64 = cast(step, dtypes.float64)
        correction2 = ew.neg(ew.expm1(ew.mul(step64, math.log(beta2))))
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = ew.sub(rho_inf, ew.div(ew.mul(ew.mul(step64, 2.0), _scalar_power(beta2, step)), correction2))
        rectified = ew.gt(rho_t, 5.0)
        safe_rho = ew.where(rectified, rho_t, 5.0)
        rect = ew.sqrt(ew.div(ew.mul(ew.mul(ew.sub(safe_rho, 4.0), ew.sub(safe_rho, 2.0)), rho_inf),
                              ew.mul(safe_rho, (rho_inf - 4) * (rho_inf - 2))))
        adaptive = ew.div(cast(ew.mul(ew.sqrt(correction2), rect), param.dtype),
                          ew.add(ew.sqrt(exp_avg_sq), group["eps"]))
        scale = ew.where(rectified, adaptive, 1.0)
        step_size = ew.div(group["lr"], _bias_correction(beta1, step))
        return {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq,
                "param": ew.sub(param, ew.mul(ew.mul(exp_avg, step_size), scale))}
