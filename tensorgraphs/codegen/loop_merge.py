"""Merging perfectly nested loops that every index walks as one: an image's rows and columns where each buffer the
body reads or writes holds them contiguously (`index = s * (columns * row + column) + rest`) become one loop of
rows * columns iterations. A compiler vectorizes such a loop with one remainder in all instead of one per row: with
8-lane vectors a 55-wide row left 7 of its 55 elements to scalar code, and a 7-wide one all of them."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

from tensorgraphs.codegen.index import Const, Expr, Var, stride, substitute
from tensorgraphs.codegen.loop_ir import Accumulate, IndexValue, Let, Load, Loop, Operand, Reduce, Stmt, Store

FLAT_STATEMENTS = (Let, Load, Store, Accumulate)
"""What a merged inner loop may hold: straight-line code whose indices are all in view (no nested loop, reduction,
local tile or library call, whose own structure depends on the loop). A reduction's accumulation keeps its order
(rows, then columns, as one run), and a run long enough gets the renderer's partial results per lane: a global
average pool over 13x13 planes added 169 values one after another, latency-bound, in rows too short for lanes."""


def merge_contiguous_loops(body: list[Stmt]) -> list[Stmt]:
    """`body` with every loop that holds only a mergeable loop (`_mergeable`) merged with it, innermost first."""
    merged: list[Stmt] = []
    for stmt in body:
        if isinstance(stmt, Loop):
            stmt = dataclasses.replace(stmt, body=merge_contiguous_loops(stmt.body))
            if len(stmt.body) == 1 and isinstance(stmt.body[0], Loop) and _mergeable(stmt, stmt.body[0]):
                stmt = _merge(stmt, stmt.body[0])
        elif isinstance(stmt, Reduce):
            stmt = dataclasses.replace(stmt, body=merge_contiguous_loops(stmt.body))
        merged.append(stmt)
    return merged


def _mergeable(outer: Loop, inner: Loop) -> bool:
    """Whether `inner` (all of `outer`'s body) runs straight-line code in which every index steps by the same
    amount from the last column of a row to the first of the next as between columns, and neither loop carries a
    schedule of its own (a parallel axis, an unroll) or runs an accumulating store (a scatter-add's order)."""
    if outer.parallel or inner.parallel or outer.unroll or inner.unroll:
        return False
    if not all(isinstance(s, FLAT_STATEMENTS) and not (isinstance(s, Store) and s.accumulate) for s in inner.body):
        return False
    for index in _indices(inner.body):
        column, row = stride(index, inner.var), stride(index, outer.var)
        if column is None or row != inner.var.extent * column:
            return False
    return True


def _merge(outer: Loop, inner: Loop) -> Loop:
    """One loop over both: with `row` and `column` the counters, each index's `row * columns + column` becomes the
    new counter (named as `outer`'s, whose other uses all lie in `inner`)."""
    position = Var(outer.var.name, outer.var.extent * inner.var.extent)

    def reindexed(index: Expr) -> Expr:
        return substitute(substitute(index, outer.var, Const(0)), inner.var, position)

    return Loop(position, [_reindex(s, reindexed) for s in inner.body])


def _indices(body: list[Stmt]) -> Iterator[Expr]:
    for stmt in body:
        if isinstance(stmt, (Load, Store)):
            yield stmt.index
        valued = isinstance(stmt, (Store, Accumulate))
        operands = stmt.args if isinstance(stmt, Let) else (stmt.value,) if valued else ()
        yield from (operand.expr for operand in operands if isinstance(operand, IndexValue))


def _reindex(stmt: Stmt, reindexed: Callable[[Expr], Expr]) -> Stmt:
    def operand(value: Operand) -> Operand:
        return dataclasses.replace(value, expr=reindexed(value.expr)) if isinstance(value, IndexValue) else value

    if isinstance(stmt, Load):
        return dataclasses.replace(stmt, index=reindexed(stmt.index))
    if isinstance(stmt, Store):
        return dataclasses.replace(stmt, index=reindexed(stmt.index), value=operand(stmt.value))
    if isinstance(stmt, Accumulate):
        return dataclasses.replace(stmt, value=operand(stmt.value))
    return dataclasses.replace(stmt, args=tuple(operand(arg) for arg in stmt.args))
