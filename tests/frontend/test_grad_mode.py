"""tg.no_grad / tg.enable_grad as context managers and as decorators with and without parentheses."""

from __future__ import annotations

import tensorgraphs as tg


def test_no_grad_and_enable_grad_decorate_with_and_without_parentheses() -> None:
    x = tg.ones(2, requires_grad=True)

    @tg.no_grad
    def bare(t: tg.Tensor) -> bool:
        return (t * 2).requires_grad

    @tg.no_grad()
    def called(t: tg.Tensor) -> bool:
        return (t * 2).requires_grad

    @tg.enable_grad
    def enabled(t: tg.Tensor) -> bool:
        return (t * 2).requires_grad

    assert not bare(x) and not called(x) and bare.__name__ == "bare"
    with tg.no_grad():
        assert enabled(x)
        assert not (x * 2).requires_grad
    assert (x * 2).requires_grad
