"""Tensor.register_post_accumulate_grad_hook, as torch's: called with the leaf after backward accumulated into it."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg


def test_hook_sees_the_accumulated_gradient_eager_and_compiled() -> None:
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    seen: list[np.ndarray] = []
    handle = w.register_post_accumulate_grad_hook(lambda leaf: seen.append(leaf.grad.numpy()))
    (w * 3).sum().backward()
    (w * 3).sum().backward()
    np.testing.assert_array_equal(seen[0], [3, 3])
    np.testing.assert_array_equal(seen[1], [6, 6])
    handle.remove()
    (w * 3).sum().backward()
    assert len(seen) == 2


def test_a_hook_may_replace_the_gradient_in_a_compiled_step() -> None:
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    w.register_post_accumulate_grad_hook(lambda leaf: setattr(leaf, "grad", leaf.grad * 10))

    @tg.compile
    def step(x: tg.Tensor) -> tg.Tensor:
        w.grad = None
        loss = (w * x).sum()
        loss.backward()
        return loss

    step(tg.tensor([1.0, 4.0]))
    np.testing.assert_array_equal(w.grad.numpy(), [10, 40])


def test_only_leaves_that_require_grad() -> None:
    with pytest.raises(tg.AutogradError, match="non-leaf"):
        tg.tensor([1.0]).register_post_accumulate_grad_hook(print)
