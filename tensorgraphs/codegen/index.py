"""Symbolic integer index expressions and their simplifier.

Movement ops (reshape, permute, expand, pad, shrink, flip) never copy data: they
turn into index expressions on the loads of a kernel. Every constructor here
returns a simplified expression, so `(i*4 + j) // 4` with `0 <= j < 4` is built
as `i` directly. Simplification uses each expression's value range:

* sums are kept as one linear combination `c0 + c1*t1 + ...` (constants folded,
  like terms merged);
* `(q*d + r) // d -> q + r // d` and `(q*d + r) % d -> r % d` for any integer q;
  then `r // d -> k` and `r % d -> r - k*d` when `k*d <= r < (k+1)*d`;
* a common factor g of every coefficient and d: `(g*r) // (g*e) -> r // e`,
  `(g*r) % (g*e) -> g * (r % e)`;
* `x // a // b -> x // (a*b)`, `x % a % b -> x % b` when b divides a;
* `(x // d) * d + x % d -> x` (with any common coefficient);
* `x & a & b -> x & (a & b)`, and `x & m -> x` when `0 <= x <= m` and m+1 is a power of two;
* `clamp(x, lo, hi) -> x` when x is already within [lo, hi].

Division and modulo are floor division and Python's modulo (the divisor is a
positive constant), so the identities hold for negative values too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property


class Expr:
    """Base class: an integer-valued expression with a known range [lo, hi]."""

    lo: int
    hi: int

    def __add__(self, other: Expr | int) -> Expr:
        return add(self, other)

    def __radd__(self, other: int) -> Expr:
        return add(other, self)

    def __sub__(self, other: Expr | int) -> Expr:
        return add(self, mul(as_expr(other), -1))

    def __mul__(self, other: int) -> Expr:
        return mul(self, other)

    __rmul__ = __mul__

    def __floordiv__(self, other: int) -> Expr:
        return floordiv(self, other)

    def __mod__(self, other: int) -> Expr:
        return mod(self, other)

    def __and__(self, other: int) -> Expr:
        return bitand(self, other)


@dataclass(frozen=True, repr=False)
class Const(Expr):
    value: int

    @property
    def lo(self) -> int:
        return self.value

    @property
    def hi(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return str(self.value)


@dataclass(frozen=True, repr=False)
class Var(Expr):
    """A loop counter running over [0, extent)."""

    name: str
    extent: int

    @property
    def lo(self) -> int:
        return 0

    @property
    def hi(self) -> int:
        return self.extent - 1

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, repr=False)
class Opaque(Expr):
    """A value known only at run time (a gathered index) with a guaranteed range."""

    name: str
    lo: int
    hi: int

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, repr=False)
class Sum(Expr):
    """constant + sum(coefficient * term); terms are non-Sum expressions, sorted, coefficients nonzero."""

    terms: tuple[tuple[Expr, int], ...]
    constant: int

    @cached_property
    def lo(self) -> int:  # type: ignore[override]
        return self.constant + sum(c * (t.lo if c > 0 else t.hi) for t, c in self.terms)

    @cached_property
    def hi(self) -> int:  # type: ignore[override]
        return self.constant + sum(c * (t.hi if c > 0 else t.lo) for t, c in self.terms)

    def __repr__(self) -> str:
        parts = [repr(t) if c == 1 else f"{t!r}*{c}" for t, c in self.terms]
        if self.constant:
            parts.append(str(self.constant))
        return "(" + " + ".join(parts) + ")"


@dataclass(frozen=True, repr=False)
class Div(Expr):
    """Floor division by a positive constant."""

    x: Expr
    divisor: int

    @property
    def lo(self) -> int:
        return self.x.lo // self.divisor

    @property
    def hi(self) -> int:
        return self.x.hi // self.divisor

    def __repr__(self) -> str:
        return f"{self.x!r}//{self.divisor}"


@dataclass(frozen=True, repr=False)
class Mod(Expr):
    """Modulo a positive constant, result in [0, divisor)."""

    x: Expr
    divisor: int

    @property
    def lo(self) -> int:
        return 0

    @property
    def hi(self) -> int:
        return self.divisor - 1

    def __repr__(self) -> str:
        return f"{self.x!r}%{self.divisor}"


@dataclass(frozen=True, repr=False)
class And(Expr):
    """Bitwise and with a non-negative constant mask."""

    x: Expr
    mask: int

    @property
    def lo(self) -> int:
        return 0

    @property
    def hi(self) -> int:
        return self.mask if self.x.lo < 0 else min(self.mask, self.x.hi)

    def __repr__(self) -> str:
        return f"{self.x!r}&{self.mask}"


@dataclass(frozen=True, repr=False)
class Clamp(Expr):
    """x limited to [low, high] (a padded view's index, kept inside its source)."""

    x: Expr
    low: int
    high: int

    @property
    def lo(self) -> int:
        return min(max(self.x.lo, self.low), self.high)

    @property
    def hi(self) -> int:
        return max(min(self.x.hi, self.high), self.low)

    def __repr__(self) -> str:
        return f"clamp({self.x!r}, {self.low}, {self.high})"


def as_expr(value: Expr | int) -> Expr:
    return value if isinstance(value, Expr) else Const(int(value))


def _linear(e: Expr) -> tuple[dict[Expr, int], int]:
    """e as (term -> coefficient, constant)."""
    if isinstance(e, Const):
        return {}, e.value
    if isinstance(e, Sum):
        return dict(e.terms), e.constant
    return {e: 1}, 0


def _congruent(a: Expr, b: Expr, divisor: int) -> bool:
    """Whether a - b is a multiple of `divisor` for all values (then a % divisor == b % divisor): `mod` drops
    such multiples from its operand, `floordiv` keeps them."""
    terms, constant = _linear(a)
    other, other_constant = _linear(b)
    differences = [terms.get(t, 0) - other.get(t, 0) for t in {*terms, *other}]
    return (constant - other_constant) % divisor == 0 and all(d % divisor == 0 for d in differences)


def _recombine(terms: dict[Expr, int], constant: int) -> tuple[dict[Expr, int], int]:
    """(x // d) * d*c + (y % d) * c -> x * c where y = x modulo d: a reshape followed by its inverse (a row of one
    shape split across rows of another) leaves no division."""
    for term, coefficient in list(terms.items()):
        if not isinstance(term, Mod) or not coefficient:
            continue
        quotient = next((t for t, c in terms.items() if isinstance(t, Div) and t.divisor == term.divisor
                         and c == coefficient * term.divisor and _congruent(t.x, term.x, term.divisor)), None)
        if quotient is not None:
            del terms[term], terms[quotient]
            inner, inner_constant = _linear(quotient.x)
            for t, c in inner.items():
                terms[t] = terms.get(t, 0) + c * coefficient
            return _recombine(terms, constant + inner_constant * coefficient)
    return terms, constant


def _from_linear(terms: dict[Expr, int], constant: int) -> Expr:
    terms, constant = _recombine(dict(terms), constant)
    kept = sorted(((t, c) for t, c in terms.items() if c), key=lambda tc: repr(tc[0]))
    if not kept:
        return Const(constant)
    if constant == 0 and len(kept) == 1 and kept[0][1] == 1:
        return kept[0][0]
    return Sum(tuple(kept), constant)


def add(a: Expr | int, b: Expr | int) -> Expr:
    terms, constant = _linear(as_expr(a))
    other, other_constant = _linear(as_expr(b))
    for t, c in other.items():
        terms[t] = terms.get(t, 0) + c
    return _from_linear(terms, constant + other_constant)


def mul(a: Expr | int, factor: int) -> Expr:
    terms, constant = _linear(as_expr(a))
    return _from_linear({t: c * factor for t, c in terms.items()}, constant * factor)


def _split(x: Expr, divisor: int) -> tuple[Expr, Expr]:
    """x = quotient*divisor + rest, moving every term whose coefficient divisor divides."""
    terms, constant = _linear(x)
    quotient = {t: c // divisor for t, c in terms.items() if c % divisor == 0}
    rest = {t: c for t, c in terms.items() if c % divisor}
    return _from_linear(quotient, constant // divisor), _from_linear(rest, constant % divisor)


def _common_factor(x: Expr, divisor: int) -> int:
    terms, constant = _linear(x)
    return math.gcd(divisor, constant, *terms.values())


def floordiv(x: Expr | int, divisor: int) -> Expr:
    x = as_expr(x)
    assert divisor > 0, divisor
    if divisor == 1:
        return x
    if isinstance(x, Const):
        return Const(x.value // divisor)
    if isinstance(x, Div):
        return floordiv(x.x, x.divisor * divisor)
    quotient, rest = _split(x, divisor)
    if rest.lo // divisor == rest.hi // divisor:
        return add(quotient, rest.lo // divisor)
    factor = _common_factor(rest, divisor)
    if factor > 1:
        return add(quotient, floordiv(_scaled_down(rest, factor), divisor // factor))
    split = _small_part(rest, divisor)
    if split is not None:
        big, factor = split
        return add(quotient, floordiv(_scaled_down(big, factor), divisor // factor))
    return add(quotient, Div(rest, divisor))


def mod(x: Expr | int, divisor: int) -> Expr:
    x = as_expr(x)
    assert divisor > 0, divisor
    if divisor == 1:
        return Const(0)
    if isinstance(x, Const):
        return Const(x.value % divisor)
    if isinstance(x, Mod) and x.divisor % divisor == 0:
        return mod(x.x, divisor)
    terms, constant = _linear(x)
    rest = _from_linear({t: c % divisor for t, c in terms.items()}, constant % divisor)
    if rest.lo // divisor == rest.hi // divisor:
        return add(rest, -(rest.lo // divisor) * divisor)
    factor = _common_factor(rest, divisor)
    if factor > 1:
        return mul(mod(_scaled_down(rest, factor), divisor // factor), factor)
    split = _small_part(rest, divisor)
    if split is not None:
        big, factor = split
        return add(mul(mod(_scaled_down(big, factor), divisor // factor), factor), add(rest, mul(big, -1)))
    return Mod(rest, divisor)


def _small_part(x: Expr, divisor: int) -> tuple[Expr, int] | None:
    """x = big + small with g = gcd(divisor, big's coefficients) > 1 and 0 <= small < g, as (big, g).

    Then `x // d == (big/g) // (d/g)` and `x % d == g * ((big/g) % (d/g)) + small`.
    """
    terms, constant = _linear(x)
    by_size = sorted(terms.items(), key=lambda tc: abs(tc[1]))
    for count in range(len(by_size)):
        small = _from_linear(dict(by_size[:count]), constant)
        big = dict(by_size[count:])
        factor = math.gcd(divisor, *big.values())
        if factor > 1 and 0 <= small.lo and small.hi < factor:
            return _from_linear(big, 0), factor
    return None


def _scaled_down(x: Expr, factor: int) -> Expr:
    terms, constant = _linear(x)
    return _from_linear({t: c // factor for t, c in terms.items()}, constant // factor)


def bitand(x: Expr | int, mask: int) -> Expr:
    x = as_expr(x)
    assert mask >= 0, mask
    if isinstance(x, Const):
        return Const(x.value & mask)
    if isinstance(x, And):
        return bitand(x.x, x.mask & mask)
    if (mask + 1) & mask == 0 and 0 <= x.lo and x.hi <= mask:
        return x
    return And(x, mask)


def clamp(x: Expr | int, low: int, high: int) -> Expr:
    x = as_expr(x)
    if low <= x.lo and x.hi <= high:
        return x
    if isinstance(x, Const):
        return Const(min(max(x.value, low), high))
    return Clamp(x, low, high)


def substitute(e: Expr, old: Var, new: Expr) -> Expr:
    """`e` with every `old` replaced by `new`, simplified again."""
    if e == old:
        return new
    if isinstance(e, Sum):
        total: Expr = Const(e.constant)
        for t, c in e.terms:
            total = add(total, mul(substitute(t, old, new), c))
        return total
    rebuild = {Div: floordiv, Mod: mod, And: bitand}
    if type(e) in rebuild:
        return rebuild[type(e)](substitute(e.x, old, new), e.divisor if not isinstance(e, And) else e.mask)
    if isinstance(e, Clamp):
        return clamp(substitute(e.x, old, new), e.low, e.high)
    return e


def stride(e: Expr, var: Var) -> int | None:
    """How much `e` grows when `var` grows by one, if that is the same for every value of `var` (None if not)."""
    step = add(substitute(e, var, add(var, 1)), mul(e, -1))
    return step.value if isinstance(step, Const) else None


def values_within(e: Expr, var: Var, low: int, high: int) -> tuple[int, int] | None:
    """The values [first, last] of `var` for which `e` lies within [low, high] whatever its other terms are (first >
    last: none), or None where `e` is not linear in `var`."""
    terms, constant = _linear(e)
    coefficient = terms.pop(var, 0)
    if not coefficient or any(var.name in symbols(t) for t in terms):
        return None
    rest = _from_linear(terms, constant)
    at_least, at_most = low - rest.lo, high - rest.hi  # coefficient * var within [at_least, at_most]
    if coefficient < 0:
        coefficient, at_least, at_most = -coefficient, -at_most, -at_least
    return -(-at_least // coefficient), at_most // coefficient


def symbols(e: Expr) -> set[str]:
    """Names of the loop counters and run-time values `e` depends on."""
    if isinstance(e, (Var, Opaque)):
        return {e.name}
    if isinstance(e, Sum):
        return set().union(*(symbols(t) for t, _ in e.terms))
    if isinstance(e, (Div, Mod, And, Clamp)):
        return symbols(e.x)
    return set()


def flatten(index: tuple[Expr, ...], shape: tuple[int, ...]) -> Expr:
    """Row-major linear offset of a multi-index into a contiguous array of `shape`."""
    offset: Expr = Const(0)
    for i, size in zip(index, shape):
        offset = add(mul(offset, size), i)
    return offset


def unflatten(offset: Expr, shape: tuple[int, ...]) -> tuple[Expr, ...]:
    """The multi-index of a row-major linear offset into `shape`."""
    if math.prod(shape) == 0:  # no element is ever addressed
        return tuple(Const(0) for _ in shape)
    index = []
    stride = math.prod(shape)
    for size in shape:
        stride //= size
        index.append(mod(floordiv(offset, stride), size) if size > 1 else Const(0))
    return tuple(index)
