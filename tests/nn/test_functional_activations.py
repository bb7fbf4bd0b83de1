"""tg.nn.functional activations, softmax and log_softmax against torch: values, gradients, NaN, composites."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from functional_check import check, normal

import tensorgraphs as tg
import tensorgraphs.nn.functional as F

# name -> keyword arguments (torch's names) tried for that activation
ACTIVATIONS = {
    "relu": [{}],
    "relu6": [{}],
    "leaky_relu": [{}, {"negative_slope": 0.2}],
    "elu": [{}, {"alpha": 0.5}],
    "selu": [{}],
    "gelu": [{}, {"approximate": "tanh"}],
    "silu": [{}],
    "softplus": [{}, {"beta": 2.0, "threshold": 3.0}],
    "mish": [{}],
    "hardtanh": [{}, {"min_val": -0.5, "max_val": 2.0}],
    "sigmoid": [{}],
    "tanh": [{}],
    "logsigmoid": [{}],
    "softsign": [{}],
    "hardsigmoid": [{}],
    "hardswish": [{}],
    "celu": [{}, {"alpha": 0.5}],
    "threshold": [{"threshold": 0.5, "value": -2.0}],
    "hardshrink": [{}, {"lambd": 1.0}],
    "softshrink": [{}, {"lambd": 1.0}],
    "tanhshrink": [{}],
}
CASES = [(name, kwargs) for name, options in ACTIVATIONS.items() for kwargs in options]


@pytest.mark.parametrize("shape", [(7,), (1, 3), (2, 3, 7)])
@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_activation_matches_torch(name: str, kwargs: dict, shape: tuple) -> None:
    x = normal(len(shape), *shape, scale=4.0)
    check(lambda t: getattr(F, name)(t, **kwargs), lambda t: getattr(TF, name)(t, **kwargs), [x], grad=[0],
          rtol=1e-5, atol=2e-6, grad_atol=1e-4, name=name)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_propagates_nan_and_handles_extremes(name: str) -> None:
    values = [math.nan, -math.inf, -50.0, 0.0, 50.0] + ([] if name == "gelu" else [math.inf])  # torch: gelu(inf) = nan
    x = np.array(values, np.float32)
    kwargs = ACTIVATIONS[name][0]
    ours = getattr(F, name)(tg.tensor(x), **kwargs).numpy()
    theirs = getattr(TF, name)(torch.tensor(x), **kwargs).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6, equal_nan=True, err_msg=name)


@pytest.mark.parametrize("name", ["relu", "relu6", "hardtanh", "leaky_relu", "elu", "hardswish", "hardsigmoid", "celu",
                                  "threshold", "hardshrink", "softshrink"])
def test_gradient_at_the_joints_matches_torch(name: str) -> None:
    x = np.array([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 6.0], np.float32)
    kwargs = ACTIVATIONS[name][0]
    check(lambda t: getattr(F, name)(t, **kwargs), lambda t: getattr(TF, name)(t, **kwargs), [x], grad=[0], name=name)


@pytest.mark.parametrize("shape,dim", [((4,), 0), ((2, 6, 3), 1), ((3, 2), -1)])
def test_glu_matches_torch(shape: tuple, dim: int) -> None:
    check(lambda t: F.glu(t, dim), lambda t: TF.glu(t, dim), [normal(8, *shape)], grad=[0], name="glu")


def test_glu_of_an_odd_dim_is_an_error_as_in_torch() -> None:
    with pytest.raises(RuntimeError):
        TF.glu(torch.ones(2, 3))
    with pytest.raises(tg.ArgumentError, match="glu.*even"):
        F.glu(tg.ones(2, 3))


@pytest.mark.parametrize("shape,weight_shape", [((5,), (1,)), ((2, 3), (3,)), ((2, 3, 4, 4), (3,)), ((2, 3, 4), (1,))])
def test_prelu_matches_torch(shape: tuple, weight_shape: tuple) -> None:
    check(F.prelu, TF.prelu, [normal(9, *shape), normal(10, *weight_shape)], grad=[0, 1], name="prelu")


@pytest.mark.parametrize("name,args", [("relu_", ()), ("elu_", (0.5,)), ("celu_", (0.5,)), ("selu_", ()),
                                       ("leaky_relu_", (0.2,)), ("hardtanh_", (-0.5, 0.5)), ("threshold_", (0.1, 3.0))])
def test_in_place_spellings_rebind_the_input_as_torch(name: str, args: tuple) -> None:
    x = normal(11, 3, 4)
    ours, theirs = tg.tensor(x), torch.tensor(x)
    returned = getattr(F, name)(ours, *args)
    getattr(TF, name)(theirs, *args)
    assert returned is ours
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax", "softmin"])
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((1, 3), -1), ((2, 3, 7), 1), ((3, 1, 7), 0)])
def test_softmax_matches_torch(fn: str, shape: tuple, dim: int) -> None:
    x = normal(7, *shape, scale=3.0)
    check(lambda t: getattr(F, fn)(t, dim), lambda t: getattr(TF, fn)(t, dim), [x], grad=[0], name=fn)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax", "softmin"])
def test_softmax_inf_and_nan_rows(fn: str) -> None:
    x = np.array([[math.nan, 1.0, 2.0], [-math.inf, -math.inf, -math.inf], [-math.inf, 0.0, 1.0],
                  [1000.0, 0.0, -1000.0]], np.float32)
    check(lambda t: getattr(F, fn)(t, -1), lambda t: getattr(TF, fn)(t, -1), [x], name=fn)


def test_softmax_dtype_argument_and_implicit_dim() -> None:
    x = np.arange(6).reshape(2, 3)
    check(lambda t: F.softmax(t, 1, dtype=tg.float32), lambda t: TF.softmax(t, 1, dtype=torch.float32), [x])
    y = normal(3, 2, 3)
    with pytest.warns(UserWarning, match="Implicit dimension") as record:
        ours = F.softmax(tg.tensor(y))
    assert record[0].filename == __file__, "the warning points at the user's line"
    np.testing.assert_allclose(ours.numpy(), torch.softmax(torch.tensor(y), 1).numpy(), rtol=1e-6)
    with pytest.raises(tg.DTypeError, match="softmax"):
        F.softmax(tg.tensor(x), 1)


@pytest.mark.parametrize("fn,op", [("softmax", "softmax"), ("log_softmax", "log_softmax"), ("gelu", "gelu")])
def test_composite_node_is_kept_in_the_graph(fn: str, op: str) -> None:
    x = tg.randn(2, 5)
    out = getattr(F, fn)(x, -1) if fn != "gelu" else F.gelu(x)
    assert out.node.op.name == op


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_backward_graph_uses_the_explicit_rule(fn: str) -> None:
    """The explicit gradient never differentiates the decomposition, whose max would appear in the backward."""
    x = tg.randn(4, 5, requires_grad=True)
    (gx,) = tg.grad(getattr(F, fn)(x, -1), [x], grad_outputs=tg.randn(4, 5))
    from tensorgraphs.graph.node import toposort
    from tensorgraphs.graph.ops import Op

    ops = {n.op for n in toposort([gx.node])}
    assert Op.REDUCE_MAX not in ops


def test_inplace_writes_the_tensor_and_refuses_grad_leaves() -> None:
    x = tg.tensor([-1.0, 2.0])
    out = F.relu(x, inplace=True)
    assert out is x and x.tolist() == [0.0, 2.0]
    with pytest.raises(tg.AutogradError, match="in-place"):
        F.relu(tg.tensor([1.0], requires_grad=True), inplace=True)


def test_argument_errors() -> None:
    with pytest.raises(tg.ArgumentError, match="approximate"):
        F.gelu(tg.randn(3), approximate="fast")
    with pytest.raises(tg.DTypeError, match="elu"):
        F.elu(tg.tensor([1, 2]))


def test_float64_softmax_is_exact_and_methods_use_the_composite() -> None:
    x = normal(9, 3, 7).astype(np.float64)
    check(lambda t: F.log_softmax(t, -1), lambda t: TF.log_softmax(t, -1), [x], grad=[0], rtol=1e-12, atol=1e-12)
    assert tg.tensor(x).softmax(-1).node.op.name == "softmax"
    assert tg.tensor(x).softmax(-1).dtype is tg.float64
