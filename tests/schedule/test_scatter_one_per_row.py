"""A scatter adding one value per row along its axis (a gather's gradient: cross_entropy's one-hot) is computed per
element and fused into its consumer (issues 14, 19): values and gradients against torch, the index bounds check
kept, and the fused loops vectorized."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.backends.cpu.driver import GCC
from tensorgraphs.runtime.realize import realize

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included

OPTIONS = [{}, {"weighted": True}, {"ignore_index": 1}, {"label_smoothing": 0.2},
           {"weighted": True, "ignore_index": 0, "label_smoothing": 0.1}]
SHAPES = [(37, 203), (256, 65), (2, 5, 3), (7,)]  # (input shape): class dim 1, or 0 unbatched


def logits_and_targets(shape: tuple, ignore: int | None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    classes = shape[0] if len(shape) == 1 else shape[1]
    target = rng.integers(0, classes, shape[:1] + shape[2:] if len(shape) > 1 else ())
    if ignore is not None and target.size > 1:
        target.flat[0] = ignore
    return (rng.standard_normal(shape) * 2).astype(np.float32), np.asarray(target)


def loss_and_grad(x: np.ndarray, target: np.ndarray, weight: np.ndarray | None, kwargs: dict,
                  cotangent: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """cross_entropy and its gradient for the logits, ours (computed together, as a training step) and torch's."""
    ours_x = tg.tensor(x, requires_grad=True)
    ours = F.cross_entropy(ours_x, tg.tensor(target), None if weight is None else tg.tensor(weight), **kwargs)
    (ours_grad,) = tg.grad([ours], [ours_x], grad_outputs=[tg.tensor(cotangent)])
    theirs_x = torch.tensor(x, requires_grad=True)
    theirs = TF.cross_entropy(theirs_x, torch.tensor(target), None if weight is None else torch.tensor(weight),
                              **kwargs)
    (theirs_grad,) = torch.autograd.grad([theirs], [theirs_x], grad_outputs=[torch.tensor(cotangent)])
    return realize([ours.node, ours_grad.node]), [theirs.detach().numpy(), theirs_grad.numpy()]


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_cross_entropy_and_its_gradient_match_torch(shape: tuple, options: dict, reduction: str) -> None:
    x, target = logits_and_targets(shape, options.get("ignore_index"))
    classes = shape[0] if len(shape) == 1 else shape[1]
    weight = np.random.default_rng(1).uniform(0.2, 2.0, classes).astype(np.float32) if options.get("weighted") else None
    kwargs = {k: v for k, v in options.items() if k != "weighted"} | {"reduction": reduction}
    cotangent = np.random.default_rng(2).standard_normal(target.shape if reduction == "none" else ()).astype(np.float32)
    ours, theirs = loss_and_grad(x, target, weight, kwargs, cotangent)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t, rtol=1e-4, atol=1e-5)


def test_nan_and_infinite_logits_give_torch_gradients() -> None:
    x, target = logits_and_targets((6, 9), ignore=2)
    x[0, 3], x[1, 1], x[2, 0], x[3, target[3]] = np.nan, np.inf, -np.inf, -np.inf
    cotangent = np.ones(6, np.float32)
    ours, theirs = loss_and_grad(x, target, None, {"ignore_index": 2, "reduction": "none"}, cotangent)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_an_out_of_range_index_raises_in_a_gradient_computed_alone() -> None:
    x = tg.tensor(np.ones((4, 5), np.float32), requires_grad=True)
    for bad in (5, -1):
        index = tg.tensor(np.array([[0], [bad], [2], [4]]))
        (gradient,) = tg.grad([x.gather(1, index).sum()], [x])  # the gather itself is not computed
        with pytest.raises(IndexError, match="out of bounds"):
            gradient.numpy()
    with pytest.raises(IndexError, match="out of bounds"):
        loss_and_grad(np.ones((3, 4), np.float32), np.array([0, 4, 1]), None, {}, np.float32(1.0))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_scatter_add_of_one_value_per_row_matches_torch(axis: int) -> None:
    rng = np.random.default_rng(3)
    base = rng.standard_normal((4, 6, 5)).astype(np.float32)
    base[0, 0, 0], base[1, 2, 3] = -0.0, np.nan
    shape = tuple(1 if d == axis else s for d, s in enumerate(base.shape))
    index = rng.integers(0, base.shape[axis], shape)
    values = rng.standard_normal(shape).astype(np.float32)
    values.flat[1] = np.nan
    ours = tg.scatter_add(tg.tensor(base), axis, tg.tensor(index), tg.tensor(values)) * 2
    theirs = torch.tensor(base).scatter_add(axis, torch.tensor(index), torch.tensor(values)) * 2
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())  # NaN and -0.0 where torch has them
    flat = tg.scatter_add(tg.tensor(base.reshape(-1)), 0, tg.tensor(np.array([7])), tg.tensor(values.reshape(-1)[:1]))
    expected = torch.tensor(base.reshape(-1)).scatter_add(0, torch.tensor([7]), torch.tensor(values.reshape(-1)[:1]))
    np.testing.assert_array_equal(flat.numpy(), expected.numpy())


@pytest.mark.skipif(GCC.command != "gcc", reason="the vectorization report is gcc's")
@pytest.mark.parametrize("shape", [(700, 1000), (256, 65)])
def test_cross_entropy_gradient_fuses_the_one_hot_and_its_loops_vectorize(shape: tuple, tmp_path) -> None:
    x, target = logits_and_targets(shape, ignore=None)
    logits = tg.tensor(x, requires_grad=True)
    (gradient,) = tg.grad([F.cross_entropy(logits, tg.tensor(target))], [logits])
    program, _ = CPU.program([gradient.node])
    kernels = program.source.split("#define TG_KERNEL")[1]
    assert "scatter_add" not in kernels  # no serial kernel filling a (rows, classes) one-hot
    source = tmp_path / "program.c"
    source.write_text(program.source)
    report = subprocess.run([GCC.command, *GCC.flags, "-fopt-info-vec-optimized", "-o", str(tmp_path / "p.so"),
                             str(source)], capture_output=True, text=True).stderr
    vectorized = {int(line) for line in re.findall(r"program\.c:(\d+):\d+: optimized: loop vectorized", report)}
    lines = program.source.splitlines()
    stores = [i for i, line in enumerate(lines) if re.match(r"\s+p\d+\[.*\] = ", line) and "tg_exp2f(" in
              "\n".join(lines[_enclosing_loop(lines, i):i])]
    assert stores, kernels
    for i in stores:  # the gradient's output loop: exp, the one-hot's compare and select, the store
        assert _enclosing_loop(lines, i) + 1 in vectorized, (lines[_enclosing_loop(lines, i)], report)


def _enclosing_loop(lines: list[str], i: int) -> int:
    """The index of the innermost `for` line enclosing line `i`."""
    depth = len(lines[i]) - len(lines[i].lstrip())
    return next(j for j in range(i - 1, -1, -1)
                if lines[j].lstrip().startswith("for (") and len(lines[j]) - len(lines[j].lstrip()) < depth)
