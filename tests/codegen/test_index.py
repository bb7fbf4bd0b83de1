"""The index simplifier: the simplified forms, and equality with the unsimplified value everywhere."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgraphs.codegen import index as ix
from tensorgraphs.codegen.index import Const, Var

i, j, k = Var("i", 8), Var("j", 4), Var("k", 3)


@pytest.mark.parametrize("built, expected", [
    ((i * 4 + j) // 4, "i"),
    (ix.floordiv(i, 2) * 12 + ix.mod(i, 2) * 6 + j, "(i*6 + j)"),
    ((i * 4 + j) % 4, "j"),
    ((Var("x", 1000) & 63) & 63, "x&63"),
    ((Var("x", 1000) & 255) & 63, "x&63"),
    (Var("x", 64) & 63, "x"),
    ((i * 8 + j * 2 + 1) // 2, "(i*4 + j)"),
    ((i * 4 + j) // 8, "i//2"),
    ((i * 4 + j) % 8, "(i%2*4 + j)"),
    ((i * 4 + j + 4) // 4, "(i + 1)"),
    (i * 3 + 2 - i * 3, "2"),
    (ix.floordiv(ix.floordiv(Var("x", 100), 2), 5), "x//10"),
    (ix.mod(ix.mod(Var("x", 100), 12), 4), "x%4"),
    (ix.clamp(i - 1, 0, 7), "clamp((i + -1), 0, 7)"),
    (ix.clamp(i, 0, 7), "i"),
    (ix.floordiv(Const(-7), 2), "-4"),
    (ix.mod(Const(-7), 3), "2"),
])
def test_simplified_forms(built: ix.Expr, expected: str) -> None:
    assert repr(built) == expected


def test_reshape_round_trip_is_the_identity() -> None:
    offset = ix.flatten((i, j, k), (8, 4, 3))
    assert ix.unflatten(offset, (8, 4, 3)) == (i, j, k)
    assert ix.unflatten(ix.flatten((i, j), (8, 4)), (4, 2, 4)) == (ix.floordiv(i, 2), ix.mod(i, 2), j)


def test_a_row_split_across_rows_of_another_shape_reads_back_without_division() -> None:
    """A full reduction split into 64 parts of 2500 elements reads a (800, 200) buffer at
    (p*2500 + r) // 200 * 200 + (p*2500 + r) % 200, and `mod` has reduced its operand to (p*100 + r) % 200
    (2500 = 100 modulo 200): the two still recombine to the offset itself (division per element kept the
    reduction from vectorizing)."""
    part, r = Var("p", 64), Var("r", 2500)
    offset = part * 2500 + r
    assert repr(ix.flatten(ix.unflatten(offset, (800, 200)), (800, 200))) == "(p*2500 + r)"


def evaluate(e: ix.Expr, env: dict[str, int]) -> int:
    if isinstance(e, Const):
        return e.value
    if isinstance(e, (Var, ix.Opaque)):
        return env[e.name]
    if isinstance(e, ix.Sum):
        return e.constant + sum(c * evaluate(t, env) for t, c in e.terms)
    if isinstance(e, ix.Div):
        return evaluate(e.x, env) // e.divisor
    if isinstance(e, ix.Mod):
        return evaluate(e.x, env) % e.divisor
    if isinstance(e, ix.And):
        return evaluate(e.x, env) & e.mask
    assert isinstance(e, ix.Clamp)
    return min(max(evaluate(e.x, env), e.low), e.high)


terms = st.tuples(st.sampled_from([i, j, k]), st.integers(-6, 6))


@settings(max_examples=300, deadline=None)
@given(st.lists(terms, min_size=1, max_size=3), st.integers(-20, 20), st.integers(1, 12), st.integers(1, 12))
def test_simplification_preserves_values(parts: list, constant: int, d1: int, d2: int) -> None:
    """Every combination of div/mod/and built by the simplifier equals plain integer arithmetic."""
    linear = Const(constant)
    for var, coefficient in parts:
        linear = linear + var * coefficient
    built = {
        "div": ix.floordiv(linear, d1), "mod": ix.mod(linear, d1), "divdiv": ix.floordiv(ix.floordiv(linear, d1), d2),
        "modmod": ix.mod(ix.mod(linear, d1 * d2), d2), "divmod": ix.mod(ix.floordiv(linear, d1), d2) * 3 + linear,
        "and": ix.bitand(ix.bitand(linear, 2 ** d1 - 1), 2 ** d2 - 1),
        "recombined": ix.floordiv(linear + i * d1, d1) * (d1 * 3) + ix.mod(linear, d1) * 3,
    }
    for values in itertools.product(range(8), range(4), range(3)):
        env = dict(zip("ijk", values))
        plain = constant + sum(c * env[v.name] for v, c in parts)
        expected = {
            "div": plain // d1, "mod": plain % d1, "divdiv": plain // d1 // d2, "modmod": plain % (d1 * d2) % d2,
            "divmod": plain // d1 % d2 * 3 + plain, "and": plain & (2 ** d1 - 1) & (2 ** d2 - 1),
            "recombined": (plain + env["i"] * d1) * 3,
        }
        for name, e in built.items():
            assert evaluate(e, env) == expected[name], (name, e, env)
            assert e.lo <= expected[name] <= e.hi, (name, e, "range")


def test_stride_is_the_step_of_an_affine_index_and_none_otherwise() -> None:
    i, j = Var("i", 8), Var("j", 4)
    assert ix.stride(i * 4 + j + 7, j) == 1 and ix.stride(i * 4 + j, i) == 4 and ix.stride(Const(3), i) == 0
    assert ix.stride(ix.floordiv(i * 4 + j, 2), j) is None and ix.mod(j, 3) != j and ix.stride(ix.mod(j, 3), j) is None
