"""Fuzzer: random primitive graphs must compute the same bits before and after exact rewriting.

    python -m tensorgraphs.rewrite.fuzz            # 300 graphs
    python -m tensorgraphs.rewrite.fuzz --long     # 10,000 graphs
    python -m tensorgraphs.rewrite.fuzz --seed 17  # one graph, the one a failure names

Graphs mix elementwise, comparison, cast, view and reduce ops over random shapes
and dtypes, with inputs full of special values (NaN, +-Inf, -0.0, wrapping
integers) and deliberate redundancy (x*1, double views, repeated and swapped
subexpressions) so that rules fire. Both graphs run on the reference backend and
must agree bit for bit (NaN equals NaN, -0.0 differs from 0.0). A failure is
shrunk to a minimal graph and printed with its inputs and both results.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.dtypes import DType
from tensorgraphs.graph import node as g
from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.graph.ops import Op
from tensorgraphs.graph.show import graph_text
from tensorgraphs.rewrite.engine import RewriteError, RuleSet, optimize, rewrite
from tensorgraphs.rewrite.pattern import Pattern, Rule
from tensorgraphs.runtime.buffer import Buffer

DTYPES = (dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int32, dtypes.int8, dtypes.uint8,
          dtypes.int64, dtypes.bool_)
SHAPES = ((), (3,), (2, 3), (2, 1, 3), (1, 4))
SPECIAL_FLOATS = (0.0, -0.0, 1.0, -1.0, 2.0, 0.5, math.nan, math.inf, -math.inf)
SPECIAL_INTS = (0, 1, -1, 2, 3)
Generator = Callable[[np.random.Generator, list[Node]], Node | None]


def random_values(rng: np.random.Generator, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
    if dtype.is_bool:
        return rng.random(shape) < 0.5
    if dtype.is_integer:
        info = np.iinfo(dtype.storage)
        wide = rng.integers(info.min, info.max, shape, endpoint=True, dtype=np.int64)
        return np.where(rng.random(shape) < 0.5, rng.integers(-4, 5, shape), wide).astype(dtype.storage)
    values = rng.standard_normal(shape) * 3
    special = rng.choice(np.array(SPECIAL_FLOATS), shape)
    values = np.where(rng.random(shape) < 0.3, special, values)
    return dtypes.round_to_storage(np.asarray(values, dtype=dtype.storage), dtype)


def buffer_node(values: np.ndarray, dtype: DType) -> Node:
    return g.buffer(Buffer("numpy", dtype, values.shape, values), dtype, values.shape)


def special_constant(rng: np.random.Generator, like: Node) -> Node:
    values = (True, False) if like.dtype.is_bool else SPECIAL_INTS if like.dtype.is_integer else SPECIAL_FLOATS
    return g.const(values[rng.integers(len(values))], like.dtype, like.shape)


def pick(rng: np.random.Generator, pool: list[Node], where: Callable[[Node], bool] = lambda n: True) -> Node | None:
    """A node from the pool, recent ones more often."""
    choices = [n for n in pool if where(n)]
    if not choices:
        return None
    return choices[len(choices) - 1 - min(int(rng.exponential(3)), len(choices) - 1)]


def partner(rng: np.random.Generator, pool: list[Node], a: Node) -> Node:
    """A second operand for `a`: another pool node of its dtype and shape, `a` itself, or a special constant."""
    roll = rng.random()
    if roll < 0.3:
        return special_constant(rng, a)
    if roll < 0.4:
        return a
    other = pick(rng, pool, lambda n: n.shape == a.shape and n.dtype is a.dtype and n is not a)
    return special_constant(rng, a) if other is None else other


def _binary(rng: np.random.Generator, pool: list[Node]) -> Node | None:
    a = pick(rng, pool)
    b = partner(rng, pool, a)
    ops = [Op.ADD, Op.MUL, Op.MAX, Op.CMPLT, Op.CMPNE]
    if a.dtype.is_floating_point:
        ops += [Op.DIV]
    else:
        ops += [Op.AND, Op.OR, Op.XOR]
    if a.dtype.is_integer:
        ops += [Op.DIV, Op.MOD]
    return g.binary(ops[rng.integers(len(ops))], *((a, b) if rng.random() < 0.5 else (b, a)))


def _unary(rng: np.random.Generator, pool: list[Node]) -> Node | None:
    x = pick(rng, pool, lambda n: n.dtype.is_floating_point)
    ops = (Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT)
    return None if x is None else g.unary(ops[rng.integers(len(ops))], x)


def _identity(rng: np.random.Generator, pool: list[Node]) -> Node | None:
    """x*1, x/1, x+0, x+(-0.0), -(-x), x-x and friends: redundancy for the rules to remove."""
    x = pick(rng, pool, lambda n: not n.dtype.is_bool)
    if x is None:
        return None
    value, op = [(1, Op.MUL), (1, Op.DIV), (0, Op.ADD), (-0.0, Op.ADD), (-1, Op.MUL)][rng.integers(5)]
    if op is Op.DIV and x.dtype.is_integer and rng.random() < 0.5:
        value = 0  # integer division by zero is defined (0)
    once = g.binary(op, x, g.const(value, x.dtype, x.shape))
    return g.binary(op, once, g.const(value, x.dtype, x.shape)) if rng.random() < 0.5 else once


def _where(rng: np.random.Generator, pool: list[Node]) -> Node | None:
    a = pick(rng, pool, lambda n: not n.dtype.is_bool)
    if a is None:
        return None
    b = partner(rng, pool, a)
    cond = g.binary([Op.CMPLT, Op.CMPNE][rng.integers(2)], a, b)
    if rng.random() < 0.3:
        cond = g.const(bool(rng.integers(2)), dtypes.bool_, a.shape)
    return g.where(cond, a, b) if rng.random() < 0.7 else g.where(cond, b, b)


def _cast(rng: np.random.Generator, pool: list[Node]) -> Node | None:
    x = pick(rng, pool)
    target = DTYPES[rng.integers(len(DTYPES))]
    out = g.unary(Op.CAST, x, target)
    return g.unary(Op.CAST, out, x.dtype) if rng.random() < 0.5 else out


def _view(rng: np.random.Generator, pool: list[Node]) -> Node | None:
    """One or two random views (two of the same kind half the time, to give chains to collapse)."""
    x = pick(rng, pool)
    first = _random_view(rng, x)
    return _random_view(rng, first, first.op if first is not x and rng.random() < 0.5 else None)


def _random_view(rng: np.random.Generator, x: Node, op: Op | None = None) -> Node:
    ops = (Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.PAD, Op.SHRINK, Op.FLIP)
    op = ops[rng.integers(len(ops))] if op is None else op
    shape = x.shape
    if op is Op.RESHAPE:
        arg = (math.prod(shape),) if len(shape) != 1 else (1, shape[0])
    elif op is Op.PERMUTE:
        arg = tuple(int(i) for i in rng.permutation(len(shape)))
    elif op is Op.EXPAND:
        arg = tuple(3 if s == 1 else s for s in shape)
    elif op is Op.PAD:
        arg = tuple((int(rng.integers(2)), int(rng.integers(2))) for _ in shape)
    elif op is Op.SHRINK:
        starts = [int(rng.integers(s)) for s in shape]
        arg = tuple((b, int(rng.integers(b + 1, s + 1))) for b, s in zip(starts, shape))
    else:
        arg = tuple(i for i in range(len(shape)) if rng.random() < 0.5)
    return g.movement(op, x, arg)


def _reduce(rng: np.random.Generator, pool: list[Node]) -> Node | None:
    x = pick(rng, pool, lambda n: n.ndim > 0 and not n.dtype.is_bool)
    if x is None:
        return None
    axes = tuple(i for i in range(x.ndim) if rng.random() < 0.5) or (0,)
    out = g.reduce([Op.REDUCE_SUM, Op.REDUCE_MAX][rng.integers(2)], x, axes)
    return g.movement(Op.EXPAND, out, x.shape) if rng.random() < 0.5 else out


def _repeat(rng: np.random.Generator, pool: list[Node]) -> Node | None:
    """An existing binary node rebuilt with swapped operands: a repeated subexpression."""
    x = pick(rng, pool, lambda n: len(n.src) == 2 and n.op in (Op.ADD, Op.MUL, Op.MAX, Op.CMPNE, Op.AND))
    return None if x is None else g.binary(x.op, x.src[1], x.src[0])


GENERATORS: tuple[Generator, ...] = (_binary, _binary, _unary, _identity, _identity, _where, _cast, _view, _view,
                                     _reduce, _repeat)


def random_graph(seed: int, steps: int = 14) -> list[Node]:
    """The roots of one random graph (several outputs sharing nodes)."""
    rng = np.random.default_rng(seed)
    dtype = DTYPES[rng.integers(len(DTYPES))]
    shape = SHAPES[rng.integers(len(SHAPES))]
    pool = [buffer_node(random_values(rng, dtype, shape), dtype) for _ in range(int(rng.integers(1, 3)))]
    for _ in range(steps):
        node = GENERATORS[rng.integers(len(GENERATORS))](rng, pool)
        if node is not None:
            pool.append(node)
    roots = [pool[-1]] + [n for n in pool[:-1] if rng.random() < 0.2]
    return roots


# ---------------------------------------------------------------------------
# Checking and shrinking.
# ---------------------------------------------------------------------------


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and values; every NaN equals every NaN; the sign of zero counts."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, b))
    signs_a, signs_b = np.signbit(a) & ~np.isnan(a), np.signbit(b) & ~np.isnan(b)
    return bool(np.array_equal(a, b, equal_nan=True) and np.array_equal(signs_a, signs_b))


@dataclass
class Mismatch:
    roots: list[Node]
    optimized: list[Node]
    expected: list[np.ndarray]
    got: list[np.ndarray]
    error: str | None = None  # the rewrite raised instead

    def report(self) -> str:
        if self.error is not None:
            return f"graph:\n{graph_text(self.roots)}\nrewriting raised {self.error}"
        buffers = [n for n in toposort(self.roots) if n.op is Op.BUFFER]
        inputs = "\n".join(f"  input {i}: {n.dtype.name}{list(n.shape)} = {n.arg.data.tolist()}"
                           for i, n in enumerate(buffers))
        results = "\n".join(f"  root {i}: expected {e.tolist()}, got {o.tolist()}"
                            for i, (e, o) in enumerate(zip(self.expected, self.got)) if not same_bits(e, o))
        return (f"graph:\n{graph_text(self.roots)}\n{inputs}\nrewritten:\n{graph_text(self.optimized)}\n{results}")


def check(roots: Sequence[Node], rulesets: Sequence[str] = ("canonical",)) -> Mismatch | None:
    """None when the rewritten graph gives the same bits as `roots`."""
    roots = list(roots)
    try:
        optimized = optimize(roots, rulesets)
    except RewriteError as error:
        return Mismatch(roots, [], [], [], f"{type(error).__name__}: {error}")
    expected, got = REFERENCE.evaluate(roots), REFERENCE.evaluate(optimized)
    if all(same_bits(e, o) for e, o in zip(expected, got)):
        return None
    return Mismatch(roots, optimized, expected, got)


def _substitute(roots: list[Node], old: Node, new: Node) -> list[Node]:
    return rewrite(roots, RuleSet("substitute", [Rule("substitute", Pattern(where=lambda n: n is old),
                                                      lambda: new)]))


def _smaller_graphs(roots: list[Node]) -> list[list[Node]]:
    """Candidates with fewer nodes: one subgraph as the only root, or one node replaced by its value as an input."""
    nodes = [n for n in toposort(roots) if n.src]
    candidates = [[n] for n in nodes if [n] != roots]
    values = dict(zip(nodes, REFERENCE.evaluate(nodes)))
    candidates += [_substitute(roots, n, buffer_node(values[n].astype(n.dtype.storage), n.dtype)) for n in nodes]
    return candidates


def shrink(mismatch: Mismatch, rulesets: Sequence[str] = ("canonical",)) -> Mismatch:
    """The smallest failing graph reachable by cutting subgraphs and turning nodes into inputs."""
    while True:
        size = len(toposort(mismatch.roots))
        for candidate in _smaller_graphs(mismatch.roots):
            if len(toposort(candidate)) < size and (found := check(candidate, rulesets)) is not None:
                mismatch = found
                break
        else:
            return mismatch


def fuzz(seeds: Sequence[int], rulesets: Sequence[str] = ("canonical",)) -> str | None:
    """The report of the first seed whose graph changes value under rewriting (shrunk), or None."""
    for seed in seeds:
        found = check(random_graph(seed), rulesets)
        if found is not None:
            minimal = shrink(found, rulesets)
            command = f"python -m tensorgraphs.rewrite.fuzz --seed {seed} --rulesets {','.join(rulesets)}"
            return f"seed {seed} ({command}):\n{minimal.report()}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Random graphs, rewritten and unrewritten, must agree bit for bit.")
    parser.add_argument("--long", action="store_true", help="10,000 graphs instead of 300")
    parser.add_argument("--seed", type=int, help="run only this seed")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--rulesets", default="canonical", help="comma-separated rule sets to apply")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + (10_000 if args.long else 300))
    report = fuzz(seeds, args.rulesets.split(","))
    print(report if report else f"fuzz: {len(seeds)} graphs, all equal after rewriting")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())
