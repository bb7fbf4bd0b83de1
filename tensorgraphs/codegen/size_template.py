"""One C program for many sizes: a rendered program with its size-dependent integer literals turned into
expressions of sizes read at run time.

The renderer writes every loop bound, stride and GEMM dimension as a literal. Rendering the same graph at a
few values of its size symbols (batch, sequence) and comparing the sources finds the literals that change; each
is fitted as a polynomial (rational coefficients with a small common denominator, total degree at most 3) in the
symbols: sizes probed on a lattice (even sizes only, say) give literals such as a half of a size. The template is sound
for a size only where it is checked: `SizeTemplate.matches` compares the program rendered for that size with the
template evaluated there, literal for literal, so the template's binary run with those sizes computes exactly
what that size's own program would. Anything else in the source that changes (a float constant such as a mean's
1/n, another kernel order, another planner choice) leaves no template, or no match: that size compiles alone.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from tensorgraphs.codegen.compiler import UNIT_BREAK

MAX_DEGREE = 3
"""Sizes appear multiplied together (batch * sequence * width, sequence * sequence in attention)."""

DENOMINATORS = (1, 2, 4, 8, 16, 32, 64, 3, 6, 12)
"""Common denominators a polynomial's coefficients may have: a stride-2 conv's output rows are half its input's,
a reshape into pairs halves a size."""

SIZES_ARRAY = "tg_sizes"
"""The program's array of size values, set before each run."""

_INTEGER = re.compile(r"(?<![\w.+\-])(\d+)(?![\w.])")
"""A decimal integer literal on its own: not part of a name, a float, a hex or an exponent."""

Monomial = tuple[int, ...]  # the exponent of each symbol


def monomials(symbols: int) -> list[Monomial]:
    """Every product of the symbols up to MAX_DEGREE, constant first."""
    return [e for e in itertools.product(range(MAX_DEGREE + 1), repeat=symbols) if sum(e) <= MAX_DEGREE]


def probe_offsets(symbols: int) -> list[tuple[int, ...]]:
    """Offsets from a size at which to render, enough to fit `monomials(symbols)` (the triangular grid is
    unisolvent for them) and one more to check the fit."""
    grid = sorted(monomials(symbols), key=lambda e: (sum(e), e))
    return [*grid, tuple(MAX_DEGREE + 1 for _ in range(symbols))]  # a new value of every symbol


@dataclass(frozen=True)
class Polynomial:
    terms: tuple[tuple[int, Monomial], ...]  # (integer numerator of the coefficient, exponents)
    denominator: int = 1  # every coefficient's

    def __call__(self, sizes: Sequence[int]) -> int | Fraction:
        """The value at `sizes`; a Fraction where the division is not exact (no literal equals it)."""
        value = Fraction(sum(c * math.prod(s**e for s, e in zip(sizes, exps)) for c, exps in self.terms),
                         self.denominator)
        return int(value) if value.denominator == 1 else value

    def widened(self, symbols: Sequence[int], count: int) -> Polynomial:
        """This polynomial of the given `symbols` as one of all `count` symbols."""
        def widen(exps: Monomial) -> Monomial:
            full = [0] * count
            for k, e in zip(symbols, exps):
                full[k] = e
            return tuple(full)

        return Polynomial(tuple((c, widen(exps)) for c, exps in self.terms), self.denominator)

    def render(self) -> str:
        parts = []
        for c, exps in self.terms:
            factors = [f"{SIZES_ARRAY}[{i}]" for i, e in enumerate(exps) for _ in range(e)]
            parts.append(" * ".join([str(c), *factors]))
        numerator = f"({' + '.join(parts) or '0'})"
        # exact: a template runs only at sizes where the literal it replaces equals this (`SizeTemplate.matches`)
        return f"((int64_t){numerator})" if self.denominator == 1 else f"((int64_t){numerator} / {self.denominator})"


def _fit(points: Sequence[Sequence[int]], values: Sequence[int]) -> Polynomial | None:
    """The polynomial through every (point, value) of degree at most MAX_DEGREE whose coefficients share one of
    the DENOMINATORS, if there is one."""
    exps = monomials(len(points[0]))
    matrix = np.array([[math.prod(float(s)**e for s, e in zip(p, m)) for m in exps] for p in points])
    solution = np.linalg.lstsq(matrix, np.array(values, dtype=float), rcond=None)[0]
    for denominator in DENOMINATORS:
        numerators = [round(c * denominator) for c in solution]
        poly = Polynomial(tuple((n, m) for n, m in zip(numerators, exps) if n != 0), denominator)
        if all(poly(p) == v for p, v in zip(points, values)):
            return poly
    return None


def _split(source: str) -> tuple[list[str], list[int]]:
    """The source's text between integer literals, and the literals."""
    pieces = _INTEGER.split(source)
    return pieces[0::2], [int(n) for n in pieces[1::2]]


@dataclass(frozen=True)
class SizeTemplate:
    """A program's source with `holes`: the literals that vary with the sizes, as polynomials."""

    symbols: int
    text: tuple[str, ...]  # the fixed text around each literal
    literals: tuple[int | Polynomial, ...]  # a fixed value or a hole
    pinned: tuple[tuple[int, int], ...] = ()  # (symbol, size): symbols every sample had at one size

    @classmethod
    def fit(cls, samples: Sequence[tuple[Sequence[int], str]]) -> SizeTemplate | None:
        """The template every (sizes, source) sample is an instance of, or None (their text differs, or a literal
        is no polynomial of the sizes)."""
        points = [tuple(sizes) for sizes, _ in samples]
        varying = [k for k in range(len(points[0])) if len({p[k] for p in points}) > 1]
        pinned = tuple((k, points[0][k]) for k in range(len(points[0])) if k not in varying)
        split = [_split(source) for _, source in samples]
        text, _ = split[0]
        if any(other != text or len(numbers) != len(split[0][1]) for other, numbers in split):
            return None
        literals: list[int | Polynomial] = []
        for values in zip(*(numbers for _, numbers in split)):
            if len(set(values)) == 1:
                literals.append(values[0])
                continue
            poly = _fit([tuple(p[k] for k in varying) for p in points], values) if varying else None
            if poly is None:
                return None
            literals.append(poly.widened(varying, len(points[0])))
        return cls(len(points[0]), tuple(text), tuple(literals), pinned)

    @property
    def holes(self) -> int:
        return sum(isinstance(v, Polynomial) for v in self.literals)

    def matches(self, source: str, sizes: Sequence[int]) -> bool:
        """Whether `source` is this template at `sizes`: the template's program run with `sizes` is `source`."""
        text, numbers = _split(source)
        return (all(sizes[k] == size for k, size in self.pinned)
                and tuple(text) == self.text and len(numbers) == len(self.literals)
                and all(n == (v(sizes) if isinstance(v, Polynomial) else v) for n, v in zip(numbers, self.literals)))

    def render(self) -> str:
        """The program with sizes read from `int64_t tg_sizes[]` (declared in the leading part every compile unit
        shares, defined once with the entry point)."""
        out = [self.text[0]]
        for value, text in zip(self.literals, self.text[1:]):
            out.append(value.render() if isinstance(value, Polynomial) else str(value))
            out.append(text)
        source = "".join(out)
        declaration = f"extern int64_t {SIZES_ARRAY}[{self.symbols}];\n"
        definition = f"int64_t {SIZES_ARRAY}[{self.symbols}];\n"
        head, found, rest = source.partition(f"\n{UNIT_BREAK}\n")
        if not found:
            return source + definition  # a program with no functions cannot read sizes
        return head + "\n" + declaration + found + rest + definition
