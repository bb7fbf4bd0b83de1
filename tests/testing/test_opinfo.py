"""Op conformance with PyTorch, driven by the one table in tensorgraphs.testing.opinfo, on every backend.

Plus focused tests of type promotion: tg.promote_types against torch.promote_types for every pair,
and the result dtypes of tensor-tensor, tensor-0-dim-tensor and tensor-scalar operations.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from typing import Callable

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.codegen import c_renderer
from tensorgraphs.graph.ops import Op
from tensorgraphs.runtime.realize import BACKENDS
from tensorgraphs.testing.opinfo import OP_INFOS, check_op, find
from tensorgraphs.testing.samples import ALL_DTYPES

REFERENCE = "numpy"
COMPILED = "cpu"
COMPILED_DEVICES = (COMPILED, "portable")
QUICK_OPS = ("add", "exp", "sum", "matmul", "getitem", "where")  # what other backends run by default
"""Compiling backends are slow to check sample by sample: by default the devices that generate C (cpu, portable)
check one sample of every op (compiled, values and gradients), other backends these ops in float32; every sample
of every op runs with `pytest -m slow`."""


def _cases() -> list:
    cases = [pytest.param(info, REFERENCE, None, False, id=f"{info.name}-{REFERENCE}",
                          marks=pytest.mark.device(REFERENCE)) for info in OP_INFOS]
    for device in COMPILED_DEVICES:
        compiled = pytest.mark.device(device, compile=True)
        for info in OP_INFOS:
            cases.append(pytest.param(info, device, None, True, id=f"{info.name}-{device}-quick", marks=compiled))
            cases.append(pytest.param(info, device, None, False, id=f"{info.name}-{device}",
                                      marks=[compiled, pytest.mark.slow]))
    for device in sorted(set(BACKENDS) - {REFERENCE, *COMPILED_DEVICES}):
        for info in OP_INFOS:
            on_device = pytest.mark.device(device)
            cases.append(pytest.param(info, device, None, False, id=f"{info.name}-{device}",
                                      marks=[on_device, pytest.mark.slow]))
            if info.name in QUICK_OPS:
                cases.append(pytest.param(info, device, ("float32",), False, id=f"{info.name}-{device}-float32",
                                          marks=on_device))
    return cases


@pytest.mark.parametrize(("info", "device", "dtypes", "quick"), _cases())
def test_op_matches_torch(info, device, dtypes, quick):
    failures = check_op(info, device, dtypes, quick)
    assert not failures, f"{len(failures)} failing samples:\n" + "\n".join(failures[:10])


@pytest.mark.parametrize(("table", "op", "wrong"), [
    ("BINARY", Op.ADD, lambda add: lambda a, t: f"({a[0]} - {a[1]})" if t.is_floating_point else add(a, t)),
    ("UNARY_FLOAT", Op.SIN, lambda sin: tuple(f"-{name}" for name in sin)),
], ids=["add", "sin"])
def test_a_wrong_sign_in_one_kernel_of_the_c_renderer_fails_the_default_cpu_check(
        table: str, op: Op, wrong: Callable, monkeypatch: pytest.MonkeyPatch, isolated_kernels: Callable) -> None:
    """The default run's check of the cpu device (one sample per op, compiled) catches a broken kernel, and passes
    again once the kernel is repaired."""
    info = find(op.name.lower())
    spellings = getattr(c_renderer, table)
    right = spellings[op]
    monkeypatch.setitem(spellings, op, wrong(right))
    failures = check_op(info, COMPILED, quick=True)
    assert failures and failures[0].startswith(f"{info.name} on cpu, float32, seed {info.seed('float32')}, quick")
    assert "values differ" in failures[0], failures
    monkeypatch.setitem(spellings, op, right)
    isolated_kernels()
    assert check_op(info, COMPILED, quick=True) == []


def test_table_covers_the_issue_ops():
    names = {info.name for info in OP_INFOS}
    required = """tensor zeros ones full empty arange linspace eye rand randn randint zeros_like ones_like full_like
        neg abs sign exp exp2 log log2 log1p expm1 sqrt rsqrt sin cos tan asin acos atan atan2 sinh cosh tanh asinh
        acosh atanh erf sigmoid relu leaky_relu elu selu gelu gelu(tanh) silu softplus mish hardtanh clamp floor ceil
        round trunc reciprocal maximum minimum where lerp masked_fill isnan isinf nan_to_num lt gt le ge eq ne
        logical_and logical_or logical_xor logical_not bitwise_and bitwise_or bitwise_xor bitwise_not
        sum mean prod amax amin max min argmax argmin var std logsumexp softmax log_softmax cumsum cumprod all any
        norm reshape view permute transpose T mT expand broadcast_to squeeze unsqueeze flatten unflatten flip roll
        contiguous getitem pad(constant) pad(reflect) pad(replicate) cat stack split chunk unbind tile repeat
        repeat_interleave tril triu gather scatter_add index_select take_along_dim one_hot matmul einsum
        sort argsort msort topk multinomial""".split()
    assert sorted(set(required) - names) == []


def test_a_wrong_op_is_reported_with_op_dtype_shape_and_seed():
    broken = dataclasses.replace(find("exp"), name="exp(broken)", op=tg.exp2)
    failures = check_op(broken, "numpy")
    assert failures and all("exp(broken) on numpy" in f and "seed" in f for f in failures)
    assert any("float32[" in f for f in failures)


# ---------------------------------------------------------------------------
# type promotion
# ---------------------------------------------------------------------------

PAIRS = list(itertools.product(ALL_DTYPES, repeat=2))


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_promote_types_matches_torch(a, b):
    assert tg.promote_types(getattr(tg, a), getattr(tg, b)).name == str(
        torch.promote_types(getattr(torch, a), getattr(torch, b))
    ).removeprefix("torch.")


def _tensors(dtype: str, shape: tuple[int, ...]) -> tuple[tg.Tensor, torch.Tensor]:
    data = np.ones(shape, dtype=np.float32)
    return tg.tensor(data, dtype=getattr(tg, dtype)), torch.from_numpy(data).to(getattr(torch, dtype))


def _dtype_name(t: object) -> str:
    return t.dtype.name if isinstance(t, tg.Tensor) else str(t.dtype).removeprefix("torch.")


RESULT_OPS = {"+": operator.add, "*": operator.mul, "/": operator.truediv, "<": operator.lt}


@pytest.mark.parametrize("symbol", list(RESULT_OPS))
@pytest.mark.parametrize("scalar", [True, 2, 2.5], ids=["bool", "int", "float"])
def test_result_dtype_with_python_scalars(symbol, scalar):
    fn = RESULT_OPS[symbol]
    for dtype in ALL_DTYPES:
        for shape in ((2,), ()):
            tg_x, torch_x = _tensors(dtype, shape)
            for tg_out, torch_out in ((fn(tg_x, scalar), fn(torch_x, scalar)), (fn(scalar, tg_x), fn(scalar, torch_x))):
                assert _dtype_name(tg_out) == _dtype_name(torch_out), (dtype, shape, symbol, scalar)


@pytest.mark.parametrize("symbol", [*RESULT_OPS, "maximum"])
def test_result_dtype_of_tensors_and_zero_dim_tensors(symbol):
    """Dimensioned tensors decide within a category; a 0-dim tensor only when its category is higher."""
    fn = RESULT_OPS.get(symbol, lambda a, b: a.maximum(b))
    for a, b in PAIRS:
        for shape_a, shape_b in (((2,), (2,)), ((2,), ()), ((), (2,)), ((), ())):
            tg_a, torch_a = _tensors(a, shape_a)
            tg_b, torch_b = _tensors(b, shape_b)
            expected = _dtype_name(fn(torch_a, torch_b))
            assert _dtype_name(fn(tg_a, tg_b)) == expected, (a, shape_a, symbol, b, shape_b)
