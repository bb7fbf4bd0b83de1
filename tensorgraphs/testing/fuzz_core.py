"""What the compiled-path fuzzers share: arguments as data, comparison with the oracle, shrinking.

A fuzz case (a random program, a small training run) is plain data that prints as runnable Python. It runs
on the `numpy` device (the oracle) and on a compiled path; each result is compared at one of three levels:

* EXACT: ops every backend computes identically (IEEE +, *, /, sqrt, comparisons, views, casts, max-based
  ops, integer arithmetic): bit for bit, NaN positions and the sign of zero included (unless the sign of
  that zero is unspecified, as for max-based ops);
* CLOSE: rounding may differ (transcendental functions, float sums in any order, matmul, mean, softmax):
  NaN and infinity positions exactly, finite values within `rtol * (|expected| + scale)`, `scale` being the
  largest finite magnitude among the values the result depends on and `rtol` per dtype in `RTOL`;
* UNSTABLE: a discontinuous op (comparison, rounding, argmax, cast to an integer) applied to a CLOSE value:
  only dtype and shape are compared, since one ulp can flip the result.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np

import tensorgraphs as tg
from tensorgraphs import dtypes
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.testing.samples import VIEWS

EXACT, CLOSE, UNSTABLE = 0, 1, 2
RTOL = {"float64": 1e-9, "float32": 2e-4, "float16": 2e-2, "bfloat16": 8e-2}
"""Relative tolerance of CLOSE results per dtype: a few ulp, times the error growth of a short chain."""


@contextlib.contextmanager
def compiling_everything() -> Iterator[None]:
    """The cpu device compiles every graph, however small (small ones are interpreted otherwise)."""
    previous, CPU.interpret_below = CPU.interpret_below, 0
    try:
        yield
    finally:
        CPU.interpret_below = previous


@dataclass(frozen=True)
class Input:
    """An argument: `values` (numpy storage of `dtype`), seen through `view`, a layout of `samples.VIEWS`
    ("permuted", "strided", "expanded"), so that compiled code also gets non-contiguous arguments."""

    name: str
    dtype: str
    values: np.ndarray
    view: str = "contiguous"
    shape: tuple[int, ...] | None = None  # the viewed shape, when `view` changes it

    @staticmethod
    def viewed(name: str, dtype: str, shape: tuple[int, ...], view: str,
               make: Callable[[tuple[int, ...]], np.ndarray]) -> Input:
        """An input of `shape` whose values `make(base_shape)` are stored in the layout `view` needs."""
        if not shape or 0 in shape:
            view = "contiguous"
        return Input(name, dtype, make(VIEWS[view][0](shape)), view, shape)

    def view_text(self) -> str:
        """The Python suffix turning the stored tensor into the argument."""
        shape = self.shape if self.shape is not None else self.values.shape
        return {"contiguous": "", "permuted": f".permute({', '.join(map(str, reversed(range(len(shape)))))})",
                "strided": "[..., ::2]", "expanded": f".expand({', '.join(map(str, shape))})"}[self.view]

    def source(self) -> str:
        storage = np.dtype(dtypes.to_dtype(self.dtype).storage).name
        array = f"np.array({self.values.tolist()!r}, dtype=np.{storage})"
        if self.values.ndim and self.values.size == 0:
            array = f"np.zeros({self.values.shape}, dtype=np.{storage})"
        return f"{self.name} = tg.tensor({array}, dtype=tg.{self.dtype}){self.view_text()}"

    def tensor(self) -> tg.Tensor:
        base = tg.tensor(self.values, dtype=getattr(tg, self.dtype))
        return eval("base" + self.view_text(), {"base": base})  # noqa: S307 - our own generated text

    def contiguous(self) -> Input:
        """The same argument values stored contiguously (a simpler reproducer)."""
        with tg.device("numpy"):
            values = np.array(self.tensor().numpy(), order="C")
        return Input(self.name, self.dtype, values)


@dataclass(frozen=True)
class Failure:
    """How a case failed: on which path (`mode`), and the error type or 'mismatch'."""

    mode: str
    kind: str
    detail: str


def differs(expected: np.ndarray, got: np.ndarray, level: int, signed_zero: bool, scale: float,
            rtol: float) -> str | None:
    """Why `got` is not an acceptable result where `expected` is the oracle's, or None."""
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return f"shape/dtype {got.dtype}{list(got.shape)}, expected {expected.dtype}{list(expected.shape)}"
    if level == UNSTABLE:
        return None
    if expected.dtype.kind != "f":
        bad = expected != got
    else:
        e, g = expected.astype(np.float64), got.astype(np.float64)
        nan_e, nan_g = np.isnan(e), np.isnan(g)
        if level == EXACT:
            bad = ~((e == g) | (nan_e & nan_g))
            if signed_zero:
                bad |= (e == 0) & (g == 0) & (np.signbit(e) != np.signbit(g))
        else:
            with np.errstate(invalid="ignore"):
                close = np.abs(e - g) <= rtol * (np.abs(e) + scale)
            bad = (nan_e != nan_g) | ~(close | (e == g) | (nan_e & nan_g))
    if not bad.any():
        return None
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    return f"{int(bad.sum())} of {bad.size} elements differ, first at {list(where)}: " \
           f"expected {expected[where]!r}, got {got[where]!r}"


def largest_finite(values: Iterable[np.ndarray]) -> float:
    """The largest finite magnitude among float `values` (the scale of CLOSE comparisons)."""
    scale = 0.0
    for v in values:
        if v.dtype.kind == "f" and v.size:
            finite = np.abs(v[np.isfinite(v)].astype(np.float64))
            scale = max(scale, float(finite.max()) if finite.size else 0.0)
    return scale


def last_line(error: BaseException) -> str:
    """An error in one line: its type, message start and end."""
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    return text[-1][:300] if len(text) == 1 else (text[0][:200] + " ... " + text[-1][:200])


Case = TypeVar("Case")


def shrink(case: Case, failure: Failure, candidates: Callable[[Case], Iterable[Case]],
           size: Callable[[Case], tuple[int, ...]],
           check: Callable[[Case, str], Failure | None]) -> tuple[Case, Failure]:
    """The smallest case reachable through `candidates` that still fails in the same mode the same way
    (`check(case, mode)` gives its failure, or None)."""
    while True:
        for candidate in candidates(case):
            if size(candidate) >= size(case):
                continue
            try:
                found = check(candidate, failure.mode)
            except Exception:  # noqa: BLE001 - a candidate that breaks the harness is not a smaller case
                found = None
            if found is not None and (found.mode, found.kind) == (failure.mode, failure.kind):
                case, failure = candidate, found
                break
        else:
            return case, failure
