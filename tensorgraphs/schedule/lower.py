"""Lowering one fused group of primitive nodes to a loop-IR kernel.

A kernel computes one materialized node: loops over its shape, and a store of
its value at every index. The value is evaluated by walking the graph down to
materialized nodes (loads) with a symbolic multi-index: movement ops rewrite
the index (never copy), elementwise ops become scalar lets, and a reduction not
materialized becomes an inner reduction loop (softmax's max and sum run inside
the row loop of the kernel that consumes them).

Every let is placed in the outermost loop where all it depends on is defined
(loop-invariant code motion by construction), and each (node, index) pair is
computed once per kernel. The lowering reports nodes it had to recompute (an
expensive value evaluated more often than it has elements, a costly one read at
several taps of a window) so the scheduler can materialize them instead. A padded
window's two inner loops are cut where the padding's bounds checks stop, so its
interior reads without them (`interiors_of_padding`).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Collection

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.codegen import index as ix
from tensorgraphs.codegen.index import Const, Expr, Opaque, Var
from tensorgraphs.codegen.loop_ir import (
    PARALLEL_MIN_WORK,
    Accumulate,
    IndexValue,
    Kernel,
    KernelParam,
    Let,
    Lit,
    Load,
    Local,
    Loop,
    Operand,
    ParallelAxis,
    Reduce,
    Ref,
    Stmt,
    Store,
    TransposeLocal,
)
from tensorgraphs.codegen.loop_merge import merge_contiguous_loops
from tensorgraphs.graph.composite import is_composite, params_of
from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.graph.ops import ELEMENTWISE, MOVEMENT, REDUCE, Op
from tensorgraphs.schedule.options import program_threads

Index = tuple[Expr, ...]

EXPENSIVE = frozenset({Op.REDUCE_SUM, Op.REDUCE_MAX, Op.EXP2, Op.LOG2, Op.SIN, Op.GATHER})
"""Ops whose recomputation (more evaluations than elements) makes the scheduler materialize them. A gather is one:
each evaluation selects among the gathered axis (a max-pool's value by its argmax, read again by the next conv's
nine taps)."""

CHEAP_RECOMPUTE_LIMIT = 16
"""A cheap value inside a reduction is recomputed up to this many times per element (a matrix product's scaled
operand) before it gets a buffer (a backward pass's long chains feeding a weight gradient would run N times)."""

SELECTIONS = frozenset({Op.MAX, Op.WHERE, Op.AND, "in_range", "zero_unless"})
"""Operations that pick a value (a window's maxima, its padding and the checks that place it) rather than compute
one: not counted as the cost of computing a value again (`WINDOW_RECOMPUTE_LETS`)."""

WINDOW_RECOMPUTE_LETS = 4
"""A cheap value computed inline at several indices of one output, more often than it has elements (a batch norm
and activation read by the taps of a pooling or depthwise-conv window), gets a buffer when each further index
costs at least this many operations besides SELECTIONS: one store and one load per element instead of the chain at
every tap. A window's own maxima and short partial sums (a separable window's) stay inline."""

NOT_COMPUTED = MOVEMENT | frozenset({Op.CONST, Op.IOTA, Op.ASSIGN, Op.COPY})
"""Ops that only rewrite an index or pass a value on: never worth a buffer of their own."""

TILE = 32
"""A load whose stride along the innermost loop is at least this many elements walks memory transposed."""

TRANSPOSE_TILE = 16
"""Block size of transposing loop nests: a 16 x 16 float32 tile is 16 vector registers (transposed in registers,
`TransposeLocal`) and each of its rows one cache line. Tiles walk the source's rows, so reads are 16 sequential
streams the hardware prefetcher follows (faster than larger tiles transposed by strided stores: bench/NOTES.md)."""

FORWARDED = frozenset({Op.EXP2, Op.LOG2, Op.SIN})
"""Values worth a store and a load to avoid computing them twice (see `forward_through_output`)."""

ROW_STAGE_BYTES = 32 << 10
"""Rows up to this size forward a value through a private row array (stays in L1/L2), longer ones through the
output buffer."""

STAGED_PLANE_BYTES = 8 << 10
"""Largest plane (last two dims) of a staged value (`Lowering._staged_block`) filled at once: with the rows of its
inputs streaming past, it stays in L1 (a 55 x 111 float32 plane of a stem max pool's column results, 24 KiB, did
not: slower than a row at a time; bench/NOTES.md)."""

STAGED_ROW_BYTES = (256, ROW_STAGE_BYTES)
"""Sizes of a staged value's row filled at once where its plane is too large. Shorter rows are read back too soon
after their stores (a 55-float row, the loads straddling the last vector stores and the scalar tail's, took longer
than a buffer of its own): such a value gets a buffer."""

ROW_BLOCK_MAX = 1024
"""Widest output block of `reduce_into_output`: its accumulators (a float sum's doubles and float chunk sums,
12 KiB) stay in L1 beside the rows streaming through."""

ROW_BLOCK_MIN = 8
"""Narrowest output block of `reduce_into_output` short of the whole axis: one vector of floats."""

ROW_CHUNK = 8
"""`reduce_into_output` adds a float column's rows in float this many at a time, each chunk's sum then in double:
converting every element to double cost a third of the time of a cache-resident 1024 x 1024 sum. Chunks of 16
(half the double pass) put sums of a few hundred rows over an ulp from the exact sum."""

ROW_CHUNK_MIN_ROWS = 256
"""A float sum over fewer rows adds them to its double accumulators one by one: a chunk's float rounding, measured
against a column sum of few rows, reached 2 ulps of it at 16 rows and stayed within one from about 200 rows on
(never more than torch's float sum)."""

ROW_ACCUMULATED = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64})
"""Dtypes `reduce_into_output` reduces (its final store of float16/bfloat16 would need their rounding)."""

@dataclass
class Scope:
    """A loop body (or the kernel's top level): lets placed here, then nested loops."""

    depth: int
    trips: int  # how many times this body runs per kernel call
    var: Var | None = None  # the counter of the loop whose body this is
    stmts: list[Stmt] = field(default_factory=list)
    loops: list[tuple[Var, Scope] | Stmt] = field(default_factory=list)  # nested loops, and statements between them

    def child(self, var: Var) -> Scope:
        return Scope(self.depth + 1, self.trips * var.extent, var)

    def then(self, stmt: Stmt) -> None:
        """`stmt` after the loops opened here so far, before any opened later."""
        self.loops.append(stmt)

    def assemble(self) -> list[Stmt]:
        """The body; an innermost body is `stmts` itself, so statements added later still land in it."""
        if not self.loops:
            return self.stmts
        return self.stmts + [Loop(item[0], item[1].assemble()) if isinstance(item, tuple) else item
                             for item in self.loops]


@dataclass
class Lowering:
    """Builds one kernel; `buffers` maps every materialized node to its buffer name."""

    name: str
    buffers: dict[Node, str]
    inlined: set[Node] = field(default_factory=set)
    recomputed: set[Node] = field(default_factory=set)
    _root: Scope = field(default_factory=lambda: Scope(0, 1))
    _scope_of: dict[str, Scope] = field(default_factory=dict)
    _memo: dict[tuple[Node, Index], Operand] = field(default_factory=dict)
    _same: dict[tuple, Ref] = field(default_factory=dict)  # value numbering: one let per (op, args)
    _params: dict[str, KernelParam] = field(default_factory=dict)
    _counter: int = 0
    _max_trips: int = 1
    serial: bool = False  # scatter-add: its accumulating stores must not race
    _nest: list[Var] = field(default_factory=list)  # the store nest's loop counters, outermost first
    _loads: list[Load] = field(default_factory=list)
    _reduce_vars: list[Var] = field(default_factory=list)
    _reduced_in: dict[Node, set[Var]] = field(default_factory=dict)  # the reductions each value is computed in
    _computed_at: Counter[Node] = field(default_factory=Counter)  # at how many indices each value is computed
    _lets_made: int = 0  # lets other than SELECTIONS created so far (what computing a value at one index costs)
    _window_trips: Counter[Node] = field(default_factory=Counter)  # runs of each value inlined outside reductions
    _window_reads: set[Node] = field(default_factory=set)  # values `_windowed` found
    _nests: int = 0  # store nests opened so far
    _trips_per_nest: dict[Node, dict[int, int]] = field(default_factory=dict)  # an expensive value's runs, by nest
    _reduce_home: dict[Var, Scope] = field(default_factory=dict)  # where the `Reduce` looping over a var sits
    _store_index: Expr | None = None
    _shape: tuple[int, ...] = ()
    riders: tuple[Node, ...] = ()  # materialized nodes this kernel also computes and stores (`store_nest`)
    _nest_index: Index | None = None
    stored_riders: set[Node] = field(default_factory=set)  # riders `store_nest` stored
    _misplaced: set[Node] = field(default_factory=set)  # riders read at another index than the store's
    _bounds_checks: list[tuple[Expr, int]] = field(default_factory=list)  # (position, size) a padding checks
    decided: bool = False  # what to materialize is settled: recompute nothing (`lower_node`'s second lowering)
    staged: Collection[Node] = frozenset()  # nodes computed a block at a time into a `Local` (`_staged_block`)
    _blocks: dict[tuple, str] = field(default_factory=dict)  # staged blocks filled: (node, outer index, body) -> name
    _parent_of: dict[str, Scope] = field(default_factory=dict)  # each loop's enclosing body, by counter
    _interiors: dict[Node, Interiors] = field(default_factory=dict)  # `_unchecked`, by staged node
    _staged_outer: dict[tuple[Node, int], Index] = field(default_factory=dict)  # the block each body stages

    # -- entry points --------------------------------------------------------
    def store_nest(self, node: Node, out: str, shape: tuple[int, ...],
                   compute: Callable[[Index], tuple[Index, Operand]], accumulate: bool = False,
                   interiors: dict[int, tuple[int, int]] | None = None) -> None:
        """One loop nest over `shape`; `compute(index)` gives (output index, value) to store. A nest without loops
        (every extent 1) stores after the nests opened before it: a scatter-add of one element adds to the base
        copied in by the first nest. `interiors` ([start, stop) of its innermost dims: `interiors_of_padding`) cut
        the loop of each into the part before, the interior and the part after, each with a body of its own; an
        inner dim is cut in every part of the outer one (a border row's interior columns read without checks too:
        9 bodies for a 3x3 window, the 7 border ones short)."""
        dims = [d for d, size in enumerate(shape) if size > 1]
        interiors = interiors or {}
        self._nests += 1
        self._shape = shape
        scope = self._root
        index: list[Expr] = [Const(0)] * len(shape)
        for d in dims[:len(dims) - len(interiors)]:
            index[d], scope = self._open_loop(scope, "i", shape[d])
        leaves = [(tuple(index), scope)]
        for d in dims[len(dims) - len(interiors):]:
            first, stop = interiors[d]
            leaves = [self._open_range(leaf, at, d, start, end) for at, leaf in leaves
                      for start, end in ((0, first), (first, stop), (stop, shape[d])) if start < end]
        self._max_trips = max(self._max_trips, math.prod(shape))  # cut or not (dynamic shapes' templates)
        for leaf_index, leaf in leaves:
            self._nest = [v for v in map(leaf_index.__getitem__, dims) if isinstance(v, Var)]
            self._nest_index = leaf_index
            out_index, value = compute(leaf_index)
            self._param(out, node, writes=True)
            self._store_index = ix.flatten(out_index, node.shape)
            emit = leaf.stmts.append if dims else leaf.then
            emit(Store(out, self._store_index, value, accumulate))
        self._store_riders(emit, shape)

    def _open_range(self, scope: Scope, index: Index, dim: int, start: int, stop: int) -> tuple[Index, Scope]:
        """`index` with `dim` running over [start, stop): a loop opened in `scope`, one trip included (so the
        program's structure is the same at every size the range is not empty: dynamic shapes' templates)."""
        at = list(index)
        var, inner = self._open_loop(scope, "i", stop - start)
        at[dim] = var + start
        return tuple(at), inner

    def interiors_of_padding(self) -> dict[int, tuple[int, int]]:
        """The ranges [start, stop) of the two innermost dims where padded values are read without bounds checks
        (a padded window's interior: vectorized, and no selects), by dim: the whole dim where no check depends
        linearly on its loop alone; {} where both are whole."""
        if not self._bounds_checks or self._nest_index is None:
            return {}
        dims = {v: d for d, v in enumerate(self._nest_index) if isinstance(v, Var)}
        interiors = {}
        for var in self._nest[-2:]:
            first, last = 0, var.extent - 1
            for position, size in self._bounds_checks:
                inside = ix.values_within(position, var, 0, size - 1) if var.name in ix.symbols(position) else None
                if inside is not None:
                    first, last = max(first, inside[0]), min(last, inside[1])
            interiors[dims[var]] = (first, last + 1) if first <= last else (0, var.extent)
        return {} if all(interior == (0, self._shape[d]) for d, interior in interiors.items()) else interiors

    def scan_nest(self, node: Node, out: str, axis: int, combine: Op) -> None:
        """An inclusive scan along `axis`: out[.., 0, ..] = x[.., 0, ..], then out[.., k, ..] = combine(out[.., k-1,
        ..], x[.., k, ..]) in a loop over k, the other axes around it (inner ones contiguous and vectorized).
        The loop over k carries the running value, so a kernel whose outermost loop is k runs on one thread."""
        (source,) = node.src
        first, rest = list(node.shape), list(node.shape)
        first[axis], rest[axis] = 1, node.shape[axis] - 1
        self.store_nest(node, out, tuple(first), lambda index: (index, self.value(source, index)))

        def step(index: Index) -> tuple[Index, Operand]:
            at = index[:axis] + (index[axis] + 1,) + index[axis + 1:]
            # Where k is fixed at 0 (an axis of 2), out[.., 0, ..] is x[.., 0, ..]: a nest without loops would load
            # it before the first nest's store (both store after the kernel's loops, in order).
            previous = self.value(source, index) if isinstance(index[axis], Const) else \
                self._load_at(out, node.dtype, ix.flatten(index, node.shape))
            return at, self._let(node.dtype, combine, (previous, self.value(source, at)))

        self.store_nest(node, out, tuple(rest), step)
        self.serial = all(size == 1 for size in node.shape[:axis])

    def _store_riders(self, emit: Callable[[Stmt], None], shape: tuple[int, ...]) -> None:
        """A store of each rider computed at the nest's own index, after every load of the body (so an output
        may still take the bytes of an input it reads at that index: `memory.inplace`)."""
        assert self._nest_index is not None
        for rider in self.riders:
            value = self._memo.get((rider, self._nest_index))
            if rider.shape != shape or rider in self._misplaced or value is None:  # (a slice of it, or not read)
                continue
            self._param(self.buffers[rider], rider, writes=True)
            emit(Store(self.buffers[rider], ix.flatten(self._nest_index, shape), value))
            self.stored_riders.add(rider)

    def transposed_nest(self, node: Node, out: str) -> None:
        """The last two axes in TRANSPOSE_TILE blocks: each tile is filled along the source's contiguous axis,
        transposed in registers and written out along the output's (contiguous loads and stores only).
        Blocks are visited along the source's rows; the rows and columns past the last whole tile follow in
        plain loop nests."""
        dims = [d for d, size in enumerate(node.shape) if size > 1]
        a, b = dims[-2:]
        side = TRANSPOSE_TILE
        scope = self._root
        index: list[Expr] = [Const(0)] * node.ndim
        for d in dims[:-2]:
            index[d], scope = self._open_loop(scope, "i", node.shape[d])
        whole_a, whole_b = node.shape[a] // side * side, node.shape[b] // side * side
        block_b, blocks_scope = self._open_loop(scope, "blk", whole_b // side)
        block_a, block_scope = self._open_loop(blocks_scope, "blk", whole_a // side)
        block_scope.stmts.append(Local("tile", node.dtype, side * side))
        column, column_scope = self._open_loop(block_scope, "t", side)
        row, row_scope = self._open_loop(column_scope, "t", side)
        index[a], index[b] = block_a * side + row, block_b * side + column
        row_scope.stmts.append(Store("tile", column * side + row, self.define(node, tuple(index))))
        block_scope.then(TransposeLocal("tile", side))
        row, row_scope = self._open_loop(block_scope, "t", side)
        column, column_scope = self._open_loop(row_scope, "t", side)
        index[a], index[b] = block_a * side + row, block_b * side + column
        self._param(out, node, writes=True)
        staged = self._load_at("tile", node.dtype, row * side + column)
        column_scope.stmts.append(Store(out, ix.flatten(tuple(index), node.shape), staged))
        self._max_trips = max(self._max_trips, column_scope.trips)
        self._edge_nest(node, out, scope, index, (a, whole_a, node.shape[a]), (b, 0, node.shape[b]))
        self._edge_nest(node, out, scope, index, (a, 0, whole_a), (b, whole_b, node.shape[b]))

    def _edge_nest(self, node: Node, out: str, scope: Scope, index: list[Expr], rows: tuple[int, int, int],
                   columns: tuple[int, int, int]) -> None:
        """Plain loops over output rows [start, stop) x columns [start, stop) of the tiled axes (axis, start,
        stop): columns outside, so the innermost loop reads the source contiguously."""
        (a, a_start, a_stop), (b, b_start, b_stop) = rows, columns
        if a_start == a_stop or b_start == b_stop:
            return
        column, scope = self._open_loop(scope, "e", b_stop - b_start)
        row, scope = self._open_loop(scope, "e", a_stop - a_start)
        index = list(index)
        index[a], index[b] = row + a_start, column + b_start
        scope.stmts.append(Store(out, ix.flatten(tuple(index), node.shape), self.define(node, tuple(index))))
        self._max_trips = max(self._max_trips, scope.trips)

    def tiled_axes(self) -> list[int]:
        return [d for d, size in enumerate(self._shape) if size > 1][-2:]

    def reads_transposed(self) -> bool:
        """Whether some load walks memory with a large stride along the innermost loop but not the next one."""
        if len(self._nest) < 2:
            return False
        outer, inner = self._nest[-2:]
        return any(_coefficient(load.index, inner) >= TILE and _coefficient(load.index, outer) == 1
                   for load in self._loads)

    def reduces_across_rows(self) -> bool:
        """Whether a reduction walks memory with a large stride while the output walks it contiguously."""
        if not self._nest or not self._reduce_vars:
            return False
        inner, reduced = self._nest[-1], self._reduce_vars[-1]
        return any(_coefficient(load.index, reduced) >= TILE and _coefficient(load.index, inner) == 1
                   for load in self._loads)

    def reduce_into_output(self, node: Node, out: str, block: int) -> None:
        """A reduction over leading rows: the output's last axis, in blocks, accumulates row after row.

        Each block of `block` columns (the grid's parallel axis: threads take blocks) has accumulators private to
        its iteration: acc[j] = identity; for each reduced row r: acc[j] = combine(acc[j], x[r, ..., j]); then
        out[..., j] = acc[j]. Every load and store is contiguous along j, the innermost (vectorized) loop, and rows
        are read one after another by one loop (a sequential stream per input, which the prefetcher follows: a loop
        per row position, such as a chunk's first row stored apart, cuts it into runs of a row). A float sum
        accumulates in double, as the renderer's reductions do (`accumulator_type`): each column adds its rows in
        order, so float32 would drift with their number (torch's cascade sum loses O(log rows) ulps). Its rows
        come ROW_CHUNK at a time (where it sums at least ROW_CHUNK_MIN_ROWS), added in float to part[j], then part[j] to
        acc[j] in double and part[j] zeroed in the same pass: within an ulp of the exact sum still. Rows past the
        last whole chunk go to acc[j] one by one.
        """
        (source,) = node.src
        dims = [d for d, size in enumerate(node.shape) if size > 1]
        last = dims[-1]
        index: list[Expr] = [Const(0)] * node.ndim
        scope = self._root
        for d in dims[:-1]:
            index[d], scope = self._open_loop(scope, "i", node.shape[d])
        blocks, block_scope = self._open_loop(scope, "blk", node.shape[last] // block)
        self._param(out, node, writes=True)
        self._max_trips = max(self._max_trips, source.size)  # every element is read once: the threads' work
        combine = Op.ADD if node.op is Op.REDUCE_SUM else Op.MAX
        acc_dtype = dtypes.float64 if combine is Op.ADD and node.dtype.is_floating_point else node.dtype
        acc = self._fresh("acc")
        block_scope.stmts.append(Local(acc, acc_dtype, block))
        start, init_scope = self._open_loop(block_scope, "t", block)
        identity = Lit(0 if combine is Op.ADD else -math.inf if node.dtype.is_floating_point
                       else int(np.iinfo(node.dtype.storage).min), acc_dtype)
        init_scope.stmts.append(Store(acc, start, identity))
        source_index = list(index)
        scope = block_scope
        *outer, inner = [axis for axis in node.arg if source.shape[axis] > 1] or node.arg
        for axis in outer:
            source_index[axis], scope = self._open_loop(scope, "r", source.shape[axis])

        def row(scope: Scope, at_row: Expr) -> tuple[Var, Scope, Operand]:
            """A loop over the block's columns j in `scope`, and the source's value at (row `at_row`, j) in it."""
            position, body = self._open_loop(scope, "t", block)
            at = list(source_index)
            at[last], at[inner] = blocks * block + position, at_row
            return position, body, self.value(source, tuple(at))

        def update(buffer: str, dtype: dtypes.DType, position: Var, body: Scope, value: Operand) -> None:
            """buffer[j] = combine(buffer[j], value) in `dtype`."""
            if value.dtype is not dtype:
                value = self._let(dtype, Op.CAST, (value,))
            total = self._let(dtype, combine, (self._load_at(buffer, dtype, position), value))
            body.stmts.append(Store(buffer, position, total))

        rows = source.shape[inner]
        summed = source.size // max(node.size, 1)  # rows per column, over every reduced axis
        chunked = rows // ROW_CHUNK if acc_dtype is not node.dtype and summed >= ROW_CHUNK_MIN_ROWS else 0
        if chunked:  # part[j] += each row of a chunk (one loop: one stream), then acc[j] += part[j]; part[j] = 0
            part = self._fresh("part")
            block_scope.stmts.append(Local(part, node.dtype, block))
            init_scope.stmts.append(Store(part, start, Lit(0, node.dtype)))
            chunks, chunk_scope = self._open_loop(scope, "r", chunked)
            within, row_scope = self._open_loop(chunk_scope, "r", ROW_CHUNK)
            update(part, node.dtype, *row(row_scope, chunks * ROW_CHUNK + within))
            flush, flush_scope = self._open_loop(chunk_scope, "t", block)
            update(acc, acc_dtype, flush, flush_scope, self._load_at(part, node.dtype, flush))
            flush_scope.stmts.append(Store(part, flush, Lit(0, node.dtype)))
        if rows > chunked * ROW_CHUNK:
            rest, rest_scope = self._open_loop(scope, "r", rows - chunked * ROW_CHUNK)
            update(acc, acc_dtype, *row(rest_scope, rest + chunked * ROW_CHUNK))
        column, store_scope = self._open_loop(block_scope, "t", block)
        out_index = list(index)
        out_index[last] = blocks * block + column
        result = self._load_at(acc, acc_dtype, column)
        if acc_dtype is not node.dtype:
            result = self._let(node.dtype, Op.CAST, (result,))
        store_scope.stmts.append(Store(out, ix.flatten(tuple(out_index), node.shape), result))

    def forward_through_output(self, out: str, node: Node) -> None:
        """Compute an expensive value once when a reduction and the output loop both need it, row by row.

        Softmax needs exp(x - max) in its sum and again in its output loop. When the same node is
        evaluated at (..., r) in a reduction over r and at (..., j) in the output loop over j (same
        extent, same row), the reduction also stores it to a row array private to the row's iteration
        (`Local`, cache-resident) and the output loop loads it from there, so the output is written once
        and never read (it may bypass the cache: streaming stores). A row longer than ROW_STAGE_BYTES goes
        through out[..., r] instead (a location the output loop overwrites later on the same thread). The
        let it replaces becomes dead code the C compiler drops.
        """
        if not self._nest or not self._store_index:
            return
        column = self._nest[-1]
        through_output = column.extent * node.dtype.itemsize > ROW_STAGE_BYTES
        computed_at: dict[Node, list[tuple[Index, Ref]]] = {}
        for (source, index), found in self._memo.items():
            if isinstance(found, Ref):
                computed_at.setdefault(source, []).append((index, found))
        for (source, index), found in list(self._memo.items()):
            if source.op not in FORWARDED or source.dtype is not node.dtype or not isinstance(found, Ref):
                continue
            scope = self._scope_of[found.name]
            if scope.var is not column:
                continue
            early = self._same_value_in_a_row_loop(computed_at[source], index, column)
            if early is None:
                continue
            row = self._scope_of[early.name].var
            assert row is not None
            # through the output only where the reduction runs once per output row (not above a broadcast axis)
            if not through_output or self._reduce_home[row].depth == scope.depth - 1:
                self._forward(out, found, early, scope, self._scope_of[early.name])
                if through_output:  # one value only: a second would overwrite the first's stores in `out`
                    return

    def _same_value_in_a_row_loop(self, computed_at: list[tuple[Index, Ref]], index: Index, column: Var) -> Ref | None:
        """Of a node's values `computed_at` indices, the one computed innermost in a reduction over `row` at
        `index` with `column` -> `row`."""
        for other_index, computed in computed_at:
            scope = self._scope_of[computed.name]
            row = scope.var
            if row is None or row not in self._reduce_vars or scope.loops or row.extent != column.extent:
                continue
            if other_index == tuple(ix.substitute(e, column, row) for e in index):
                return computed
        return None

    def _forward(self, out: str, late: Ref, early: Ref, late_scope: Scope, early_scope: Scope) -> None:
        offset = self._store_index
        column, row = self._nest[-1], early_scope.var
        assert offset is not None and row is not None
        target, early_offset = out, ix.substitute(offset, column, row)
        if column.extent * late.dtype.itemsize <= ROW_STAGE_BYTES:
            target, early_offset, offset = self._fresh("row"), row, column
            row_scope = self._reduce_home[row]  # (above the output's inner loops when it is broadcast along them)
            row_scope.stmts.insert(0, Local(target, late.dtype, column.extent))
        position = next(k for k, s in enumerate(early_scope.stmts) if getattr(s, "name", None) == early.name)
        early_scope.stmts.insert(position + 1, Store(target, early_offset, early))
        position = next(k for k, s in enumerate(late_scope.stmts) if getattr(s, "name", None) == late.name)
        late_scope.stmts[position] = Load(late.name, late.dtype, target, offset)

    def _open_loop(self, scope: Scope, prefix: str, extent: int) -> tuple[Var, Scope]:
        var = self._fresh_var(prefix, extent)
        inner = scope.child(var)
        scope.loops.append((var, inner))
        self._scope_of[var.name] = inner
        self._parent_of[var.name] = scope
        return var, inner

    def _staged(self, node: Node, index: Index) -> Operand:
        """Staged `node` at `index`, loaded from its block (`_staged_block`); where it has none, the scheduler
        gives `node` a buffer (a lowering that must not ask computes it inline)."""
        found = self._staged_block(node, index)
        if found is not None:
            name, dims = found
            return self._load_at(name, node.dtype, ix.flatten(index[-dims:], node.shape[-dims:]))
        if self.decided:
            self.inlined.add(node)
            return self.define(node, index)
        self.recomputed.add(node)
        return Lit(0, node.dtype)

    def _staged_block(self, node: Node, index: Index) -> tuple[str, int] | None:
        """The array private to an iteration of the store nest holding the block of `node` that `index` reads
        (all of its last one or two dims), and how many dims the block spans: filled by loops of their own
        before the nest's loops over those dims, where the nest reads the block with those loops alone (the
        innermost walking the last dim: a separable window's next dim reading at a stride). Each element is
        then computed once, not at every tap reading it, and stays in L1 instead of a buffer written and read
        back through memory. A block is a plane where that fits STAGED_PLANE_BYTES, else a row of
        STAGED_ROW_BYTES; none where an iteration reads more than one."""
        if self._nest_index is None:
            return None
        nest = _index_symbols(self._nest_index)  # (a cut loop's counter in an index with its start)
        loops, scope = [], self._innermost(nest)
        while scope.var is not None and scope.var.name in nest:  # the nest's loops, innermost first
            loops.append(scope.var)
            scope = self._parent_of[scope.var.name]
        for dims in (2, 1):
            size = math.prod(node.shape[-dims:]) * node.dtype.itemsize
            low, high = STAGED_ROW_BYTES if dims == 1 else (0, STAGED_PLANE_BYTES)
            if len(loops) < dims or node.ndim < dims or not low <= size <= high:
                continue
            inner = {v.name for v in loops[:dims]}
            outer, block = index[:-dims], index[-dims:]
            if (loops[0].name in ix.symbols(block[-1]) and _index_symbols(block) <= inner
                    and _index_symbols(outer) <= nest - inner):
                parent = self._parent_of[loops[dims - 1].name]
                if self._staged_outer.setdefault((node, id(parent)), outer) != outer:
                    return None  # read at several blocks per iteration (a local response norm's channels after a
                    # pool): each would be computed again for every block
                return self._block_filled(node, outer, loops[dims - 1]), dims
        return None

    def _block_filled(self, node: Node, outer: Index, loop: Var) -> str:
        """The array holding `node` at `outer` (its trailing dims whole), filled before `loop` in the body around
        it (once per body): a loop over each dim, cut where padding checks stop (`_unchecked`) once what to
        materialize is `decided`."""
        parent = self._parent_of[loop.name]
        key = (node, outer, id(parent))
        if key in self._blocks:
            return self._blocks[key]
        dims = node.ndim - len(outer)
        name = self._blocks[key] = self._fresh("staged")
        parent.stmts.insert(0, Local(name, node.dtype, math.prod(node.shape[-dims:])))
        position = next(k for k, item in enumerate(parent.loops) if isinstance(item, tuple) and item[0] is loop)
        # uncut while deciding what to materialize: a padded input read at the taps of 9 cut loops is no value
        # computed again (`_recomputes` counts indices)
        interiors = self._unchecked(node) if self.decided else {}
        leaves: list[tuple[Index, Scope]] = [((), parent)]
        for d in range(len(outer), node.ndim):
            first, stop = interiors.get(d, (0, node.shape[d]))
            cut = []
            for at, scope in leaves:
                for start, end in ((0, first), (first, stop), (stop, node.shape[d])):
                    if start < end:  # each part a loop of its own, the interior's without padding checks
                        var, inner = self._open_loop(scope, "s", end - start)
                        if scope is parent:
                            parent.loops.insert(position, parent.loops.pop())
                            position += 1
                        cut.append(((*at, var + start), inner))
            leaves = cut
        self.inlined.add(node)
        for at, scope in leaves:
            self._max_trips = max(self._max_trips, scope.trips)
            scope.stmts.append(Store(name, ix.flatten(at, node.shape[-dims:]), self.define(node, (*outer, *at))))
        return name

    @property
    def stages(self) -> bool:
        """Whether this kernel fills staged blocks (`_staged_block`)."""
        return bool(self._blocks)

    def _unchecked(self, node: Node) -> Interiors:
        """Where `node` reads its padding without bounds checks: the interiors of its own store nest
        (`interiors_of_padding`)."""
        if node not in self._interiors:
            probe = Lowering(self.name, self.buffers, decided=True)
            probe.store_nest(node, "probe", node.shape, lambda index: (index, probe.define(node, index)))
            self._interiors[node] = probe.interiors_of_padding()
        return self._interiors[node]

    def kernel(self) -> Kernel:
        body = merge_contiguous_loops(self._root.assemble())
        if not self.serial:  # the target decides from the work whether threads pay (at run time if it varies)
            for stmt in body:
                if isinstance(stmt, Loop):
                    stmt.parallel = ParallelAxis(0, self._max_trips)
        return Kernel(self.name, list(self._params.values()), body, serial=self.serial)

    # -- values --------------------------------------------------------------
    def value(self, node: Node, index: Index) -> Operand:
        if node.size == 0:  # never read (padding, an empty reduction): no index into it exists
            return _zero(node.dtype)
        key = (node, index)
        found = self._memo.get(key)
        if found is None:
            if node in self.buffers and not self._rides_here(node, index):
                found = self._load(node, index)
            elif node in self.staged:
                found = self._staged(node, index)
            elif not self.decided and self._recomputes(node, index):
                # The scheduler will give it a buffer and lower this kernel again, so its subgraph is not
                # walked now (nested reductions would multiply the work): a placeholder value.
                self.recomputed.add(node)
                found = Lit(0, node.dtype)
            else:
                self.inlined.add(node)
                made = self._lets_made
                found = self.define(node, index)
                if not self.decided:
                    self._note_recomputation(node, index, found, self._lets_made - made)
            self._memo[key] = found
        return found

    def _rides_here(self, node: Node, index: Index) -> bool:
        """Whether `node` is a rider this kernel computes (and stores): read at the store's own index. Read at
        any other index it is loaded, and not stored here (the scheduler gives it back its own kernel)."""
        if node not in self.riders:
            return False
        if index != self._nest_index:
            self._misplaced.add(node)
            return False
        return True

    def _computed_again(self, node: Node, value: Ref) -> bool:
        """Whether expensive `node` runs more often than it has elements (in one store nest, or summed over the
        nests: a concatenation's each read their own part of it), or inside a second reduction: one reduction and
        the output loop share a value (`forward_through_output`), but row operations chained in one kernel
        (softmax of a softmax) would evaluate the first one's exp in every later reduction."""
        scope = self._scope_of[value.name]
        if scope.var in self._reduce_vars:
            self._reduced_in.setdefault(node, set()).add(scope.var)
        trips = self._trips_per_nest.setdefault(node, {})
        trips[self._nests] = max(trips.get(self._nests, 0), scope.trips)
        return sum(trips.values()) > node.size or len(self._reduced_in.get(node, ())) > 1

    def _note_recomputation(self, node: Node, index: Index, value: Operand, lets: int) -> None:
        """Flags `node`, just computed inline at `index` with `lets` new operations, if it is an expensive value
        computed too often, or notes it if a window reads it (`settle_windows` decides)."""
        if node.op in EXPENSIVE and isinstance(value, Ref) and self._computed_again(node, value):
            self.recomputed.add(node)
        elif self._windowed(node, index, value, lets):
            self._window_reads.add(node)

    def _windowed(self, node: Node, index: Index, value: Operand, lets: int) -> bool:
        """Whether cheap `node`, just computed at `index` with `lets` new operations, is read by a window: computed
        at several indices of the store nest (no reduction's), more often than it has elements in all, each index
        costing at least WINDOW_RECOMPUTE_LETS."""
        if node.op in NOT_COMPUTED or not isinstance(value, Ref):
            return False
        symbols = _index_symbols(index)
        if any(v.name in symbols for v in self._reduce_vars):
            return False
        self._window_trips[node] += self._scope_of[value.name].trips
        return (self._computed_at[node] > 1 and lets >= WINDOW_RECOMPUTE_LETS
                and self._window_trips[node] > node.size)

    def settle_windows(self) -> None:
        """Flags the values read by windows (`_windowed`) that get buffers: along a chain of them, the ones evaluated
        most often per element (a batch norm's relu read by a depthwise conv's taps, not the partial sums of a pool
        reading that conv) and, of those, the outermost (the relu, not the batch norm inside it)."""
        ratio = {n: self._window_trips[n] / n.size for n in self._window_reads}
        inside = {n: self._window_reads.intersection(toposort(list(n.src), stop=self.buffers.__contains__))
                  for n in self._window_reads}
        for n in self._window_reads:
            if not any(ratio[m] > ratio[n] for m in inside[n]) and not any(
                    n in inside[m] and ratio[m] >= ratio[n] for m in self._window_reads):
                self.recomputed.add(n)

    def _recomputes(self, node: Node, index: Index) -> bool:
        """Whether `node` at `index` would run more often than it has elements: a reduction anywhere; inside a
        reduction's body (a matrix product's operand, evaluated once per output column) an expensive value, or
        a cheap one more than CHEAP_RECOMPUTE_LIMIT times; and any value this kernel already computes at
        CHEAP_RECOMPUTE_LIMIT other indices (chained shifts, x + roll(x), would double the work per link)."""
        if node.op in NOT_COMPUTED:
            return False
        if self._computed_at[node] >= CHEAP_RECOMPUTE_LIMIT:
            return True
        self._computed_at[node] += 1
        symbols = _index_symbols(index)
        if node.op not in REDUCE and not any(v.name in symbols for v in self._reduce_vars):
            return False
        limit = 1 if node.op in EXPENSIVE else CHEAP_RECOMPUTE_LIMIT
        return self._innermost(symbols).trips > limit * node.size

    def define(self, node: Node, index: Index) -> Operand:
        """The value of `node` at `index` computed from its sources."""
        if node.op in ELEMENTWISE:
            return self._let(node.dtype, node.op, tuple(self.value(s, index) for s in node.src))
        if node.op in MOVEMENT:
            return _MOVEMENT[node.op](self, node, index)
        if node.op in REDUCE:
            return self._reduce(node, index)
        return _SPECIAL[node.op](self, node, index)

    def _load(self, node: Node, index: Index) -> Operand:
        buffer = self.buffers[node]
        self._param(buffer, node, writes=False)
        return self._load_at(buffer, node.dtype, ix.flatten(index, node.shape))

    def _load_at(self, buffer: str, dtype: dtypes.DType, offset: Expr) -> Ref:
        key = ("load", buffer, offset)
        if key not in self._same:
            load = Load(self._fresh("v"), dtype, buffer, offset)
            self._loads.append(load)
            self._same[key] = self._place(load, dtype, self._innermost(ix.symbols(offset)))
        return self._same[key]

    def _let(self, dtype: dtypes.DType, op: Op | str, args: tuple[Operand, ...]) -> Operand:
        key = (dtype, op, tuple((a.dtype, repr(a.value)) if isinstance(a, Lit) else a for a in args))
        if key not in self._same:
            let = Let(self._fresh("v"), dtype, op, args)
            self._lets_made += op not in SELECTIONS
            scope = max(map(self._scope_of_operand, args), key=lambda s: s.depth, default=self._root)
            self._same[key] = self._place(let, dtype, scope)
        return self._same[key]

    def _scope_of_operand(self, operand: Operand) -> Scope:
        """The innermost loop body whose counters `operand` depends on."""
        if isinstance(operand, Ref):
            return self._scope_of[operand.name]
        if isinstance(operand, IndexValue):
            return self._innermost(ix.symbols(operand.expr))
        return self._root

    def _place(self, stmt: Load | Let, dtype: dtypes.DType, scope: Scope) -> Ref:
        """`stmt` placed in `scope` (the innermost loop body of the counters it depends on)."""
        scope.stmts.append(stmt)
        self._scope_of[stmt.name] = scope
        return Ref(stmt.name, dtype)

    def _innermost(self, symbols: set[str] | frozenset[str]) -> Scope:
        scopes = [self._scope_of[s] for s in symbols]
        return max(scopes, key=lambda s: s.depth, default=self._root)

    def _reduce(self, node: Node, index: Index) -> Operand:
        scope = self._innermost(_index_symbols(index))
        (source,) = node.src
        inner = list(index)
        loops: list[tuple[Var, Scope]] = []
        body_scope = scope
        for axis in node.arg:
            if source.shape[axis] == 1:
                continue
            var = self._fresh_var("r", source.shape[axis])
            self._reduce_vars.append(var)
            self._reduce_home[var] = scope
            body_scope = body_scope.child(var)
            self._scope_of[var.name] = body_scope
            loops.append((var, body_scope))
            inner[axis] = var
        self._max_trips = max(self._max_trips, body_scope.trips)
        acc = self._fresh("acc")
        combine = Op.ADD if node.op is Op.REDUCE_SUM else Op.MAX
        update = self.value(source, tuple(inner))
        accumulate = Accumulate(acc, combine, update)
        body: list[Stmt] = [accumulate]
        if loops:
            body_scope.stmts.append(accumulate)
            for (_, outer), nested in zip(loops, loops[1:]):
                outer.loops.append(nested)
            body = [Loop(loops[0][0], loops[0][1].assemble())]
        scope.stmts.append(Reduce(acc, node.dtype, combine, body))
        self._scope_of[acc] = scope
        return Ref(acc, node.dtype)

    # -- names ---------------------------------------------------------------
    def _fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def _fresh_var(self, prefix: str, extent: int) -> Var:
        return Var(self._fresh(prefix), extent)

    def _param(self, name: str, node: Node, writes: bool) -> None:
        existing = self._params.get(name)
        if existing is None:
            self._params[name] = KernelParam(name, node.dtype, node.size, writes)
        else:
            existing.writes |= writes


def _zero(dtype: dtypes.DType) -> Lit:
    return Lit(False if dtype.is_bool else 0, dtype)


def _coefficient(e: Expr, var: Var) -> int:
    if e == var:
        return 1
    return dict(e.terms).get(var, 0) if isinstance(e, ix.Sum) else 0


@functools.lru_cache(maxsize=1 << 12)
def _index_symbols(index: Index) -> frozenset[str]:
    """The counters `index` depends on (cached: every node of an elementwise chain is read at the same index)."""
    return frozenset().union(*map(ix.symbols, index))


# ---------------------------------------------------------------------------
# Movement ops: how each maps an index of its output to an index of its source.
# ---------------------------------------------------------------------------


def _reshape(low: Lowering, node: Node, index: Index) -> Operand:
    (source,) = node.src
    return low.value(source, ix.unflatten(ix.flatten(index, node.shape), source.shape))


def _permute(low: Lowering, node: Node, index: Index) -> Operand:
    source_index: list[Expr] = [Const(0)] * node.ndim
    for out_axis, in_axis in enumerate(node.arg):
        source_index[in_axis] = index[out_axis]
    return low.value(node.src[0], tuple(source_index))


def _expand(low: Lowering, node: Node, index: Index) -> Operand:
    (source,) = node.src
    return low.value(source, tuple(Const(0) if s == 1 else i for s, i in zip(source.shape, index)))


def _shrink(low: Lowering, node: Node, index: Index) -> Operand:
    return low.value(node.src[0], tuple(i + start for i, (start, _) in zip(index, node.arg)))


def _flip(low: Lowering, node: Node, index: Index) -> Operand:
    (source,) = node.src
    flipped = tuple(ix.add(s - 1, ix.mul(i, -1)) if axis in node.arg else i
                    for axis, (i, s) in enumerate(zip(index, source.shape)))
    return low.value(source, flipped)


def _pad(low: Lowering, node: Node, index: Index) -> Operand:
    """Padding reads its source at a clamped index and selects 0 outside it (no out-of-bounds load)."""
    (source,) = node.src
    shifted = [i - before for i, (before, _) in zip(index, node.arg)]
    if any(p.hi < 0 or p.lo >= size for p, size in zip(shifted, source.shape)):
        return _zero(node.dtype)  # a border: padding only
    inside: Operand = Lit(True, dtypes.bool_)
    for position, size in zip(shifted, source.shape):
        if position.lo < 0 or position.hi >= size:
            low._bounds_checks.append((position, size))
            check = low._let(dtypes.bool_, "in_range", (IndexValue(position, dtypes.int64), Lit(0, dtypes.int64),
                                                        Lit(size, dtypes.int64)))
            inside = check if isinstance(inside, Lit) else low._let(dtypes.bool_, Op.AND, (inside, check))
    clamped = tuple(ix.clamp(p, 0, s - 1) for p, s in zip(shifted, source.shape))
    value = low.value(source, clamped)
    if isinstance(inside, Lit):
        return value
    return low._let(node.dtype, "zero_unless", (inside, value))


_MOVEMENT: dict[Op, Callable[[Lowering, Node, Index], Operand]] = {
    Op.RESHAPE: _reshape,
    Op.PERMUTE: _permute,
    Op.EXPAND: _expand,
    Op.SHRINK: _shrink,
    Op.FLIP: _flip,
    Op.PAD: _pad,
}


# ---------------------------------------------------------------------------
# Sources, indexing and state ops.
# ---------------------------------------------------------------------------


def _gather(low: Lowering, node: Node, index: Index) -> Operand:
    source, positions = node.src
    axis, size = node.arg, source.shape[node.arg]
    position = low.value(positions, index)
    checked = low._let(dtypes.int64, "checked_index", (position, Lit(size, dtypes.int64)))
    assert isinstance(checked, Ref)
    source_index = list(index)
    source_index[axis] = Opaque(checked.name, 0, size - 1)
    return low.value(source, tuple(source_index))


def scatters_one_per_row(node: Node) -> bool:
    """Whether SCATTER_ADD `node` adds at most one value to each row along its axis: an index of size 1 there and
    of the output's size elsewhere (a gather's gradient picking one element per row, cross_entropy's one-hot). Such a
    scatter is computed per element (`_scatter_one_per_row`), fused like an elementwise op, not materialized by a
    serial kernel that fills the output and then adds into it."""
    positions = node.src[1]
    return all(p == (1 if d == node.arg else s) for d, (p, s) in enumerate(zip(positions.shape, node.shape)))


def _scatter_one_per_row(low: Lowering, node: Node, index: Index) -> Operand:
    """base + value where the row's index hits this element, base elsewhere: one compare and select per element
    (vectorized), the index read and bounds-checked once per row (its let sits outside the axis's loop)."""
    assert scatters_one_per_row(node), "a scatter adding several values per row runs as loops of its own"
    base, positions, values = node.src
    axis, size = node.arg, node.shape[node.arg]
    row = index[:axis] + (Const(0),) + index[axis + 1:]
    position = low._let(dtypes.int64, "checked_index", (low.value(positions, row), Lit(size, dtypes.int64)))
    missed = low._let(dtypes.bool_, Op.CMPNE, (position, IndexValue(index[axis], dtypes.int64)))
    kept = low.value(base, index)
    return low._let(node.dtype, Op.WHERE, (missed, kept, low._let(node.dtype, Op.ADD, (kept, low.value(values, row)))))


_SPECIAL: dict[Op, Callable[[Lowering, Node, Index], Operand]] = {
    Op.CONST: lambda low, node, index: Lit(node.arg, node.dtype),
    Op.IOTA: lambda low, node, index: low._let(node.dtype, Op.CAST, (IndexValue(index[0], dtypes.int64),)),
    Op.GATHER: _gather,
    Op.SCATTER_ADD: _scatter_one_per_row,
    Op.ASSIGN: lambda low, node, index: low.value(node.src[1], index),
    Op.COPY: lambda low, node, index: low.value(node.src[0], index),
}


def _row_block(reduction: Node) -> int | None:
    """The block width `reduce_into_output` would use for `reduction` (None: it cannot): a divisor of the innermost
    output axis (a matmul's N) of at least two vectors, from ROW_BLOCK_MIN to ROW_BLOCK_MAX.
    Blocks are what threads share, so first a number of blocks the threads it runs on divide (on 2 threads
    700 x 1000's 2 blocks of 500, not 5 of 200 where one thread would wait for another's third block; one thread
    where its work is below PARALLEL_MIN_WORK), then the widest: a thread reads the rows of its block one after
    another, and the longer their contiguous runs the better the prefetcher follows them (on one thread 1 block of
    1024 columns took 0.6x the time of 2 of 512, 256 columns in 2 blocks 2x that of 1: bench/NOTES.md)."""
    columns = [size for size in reduction.shape if size > 1][-1:]
    if reduction.dtype not in ROW_ACCUMULATED or not columns or columns[0] < 2 * ROW_BLOCK_MIN:
        return None
    (size,) = columns
    threads = program_threads() if reduction.src[0].size >= PARALLEL_MIN_WORK else 1
    widths = [b for b in range(ROW_BLOCK_MIN, min(size, ROW_BLOCK_MAX) + 1) if size % b == 0]
    return max(widths, key=lambda b: ((size // b) % threads == 0, b), default=None)


SCANS = {"cumsum": Op.ADD, "cumprod": Op.MUL}
"""Composites lowered as one loop along their axis (`Lowering.scan_nest`), by name: their combining op."""


CONCAT = "cat"
"""The composite lowered as one loop nest per input, each storing into its slice of the output (`concat_nests`)."""


def runs_as_scan(node: Node) -> bool:
    return is_composite(node) and node.op.name in SCANS


def runs_as_concat(node: Node) -> bool:
    return is_composite(node) and node.op.name == CONCAT


def runs_as_scatter(node: Node) -> bool:
    """Whether `node` is a scatter adding several values to a row: run by a serial kernel of its own that fills its
    output and then adds into it (one value per row is computed per element: `scatters_one_per_row`)."""
    return node.op is Op.SCATTER_ADD and not scatters_one_per_row(node)


def runs_as_loops(node: Node) -> bool:
    """Whether `node` is lowered to loops of its own by `lower_node` (its result materialized): a scan, a
    concatenation or a scatter adding several values per row."""
    return runs_as_scan(node) or runs_as_concat(node) or runs_as_scatter(node)


def _reduction_over_rows(piece: Node, buffers: dict[Node, str]) -> Node | None:
    """The reduction over leading rows (contiguous along the kept last axis) that a piece of a concatenation is a
    reshape of, when it has no buffer yet: inlined into the piece's nest it would walk a column at a time (the
    stacked q, k, v bias's gradient: three column sums), so it gets a buffer, computed by `reduce_into_output`."""
    reduction = piece
    while reduction.op is Op.RESHAPE and reduction not in buffers:
        reduction = reduction.src[0]
    if reduction in buffers or reduction.op not in REDUCE or _row_block(reduction) is None:
        return None
    source = reduction.src[0]
    over_rows = source.ndim - 1 not in reduction.arg and source.size // reduction.size >= TILE
    return reduction if over_rows else None


Interiors = dict[int, tuple[int, int]]
"""[start, stop) of a nest's innermost dims where padded values are read without checks (`interiors_of_padding`)."""


def concat_nests(low: Lowering, node: Node, out: str, placed: Collection[Node] = (),
                 interiors: dict[Node, Interiors] | None = None) -> None:
    """out[.., offset + i, ..] = piece[.., i, ..] for each piece along the axis, one nest each (its loops cut at
    the piece's `interiors`), but for the pieces `placed`, which their own kernels write into their slices
    (`schedule.fusion.write_slices_in_place`)."""
    axis, offset = params_of(node)["axis"], 0
    for piece in node.src:
        def place(index: Index, piece: Node = piece, start: int = offset) -> tuple[Index, Operand]:
            return index[:axis] + (index[axis] + start,) + index[axis + 1:], low.value(piece, index)

        if piece.size and piece not in placed:
            low.store_nest(node, out, piece.shape, place, interiors=(interiors or {}).get(piece))
        offset += piece.shape[axis]


def concat_interiors(low: Lowering, node: Node, out: str, placed: Collection[Node]) -> dict[Node, Interiors]:
    """Each piece's interiors (a padded window computed inline: a ShuffleNet unit's average pool), from its nest
    lowered alone with `low`'s decisions; none for a nest with a reduction inside."""
    found = {}
    for piece in set(node.src) - set(placed):
        alone = Lowering(low.name, low.buffers, inlined=low.inlined, decided=True, staged=low.staged)
        concat_nests(alone, node, out, set(node.src) - {piece})
        if not alone._reduce_vars and (interiors := alone.interiors_of_padding()):
            found[piece] = interiors
    return found


def lower_node(name: str, node: Node, buffers: dict[Node, str], riders: tuple[Node, ...] = (),
               placed: Collection[Node] = (), staged: Collection[Node] = frozenset()) -> Lowering:
    """The kernel computing materialized `node` into its buffer, every other materialized node loaded, except
    `riders`: computed and stored too where read at the output's own index (`Lowering.stored_riders` says which;
    only a plain store nest stores them). A concatenation leaves out its pieces `placed` (`concat_nests`). Nodes
    `staged` are computed a block at a time where read along rows (`Lowering._staged_block`), else asked a buffer
    for."""
    out = buffers[node]
    if runs_as_scan(node):
        low = Lowering(name, buffers, staged=staged)
        low.scan_nest(node, out, params_of(node)["axis"], SCANS[node.op.name])
        return low
    if runs_as_concat(node):
        low = Lowering(name, buffers, staged=staged)
        concat_nests(low, node, out, placed)
        low.recomputed |= {r for piece in node.src if (r := _reduction_over_rows(piece, buffers)) is not None}
        if not low.recomputed and ((interiors := concat_interiors(low, node, out, placed)) or low.stages):
            low = Lowering(name, buffers, staged=staged, inlined=low.inlined, decided=True)
            concat_nests(low, node, out, placed, interiors)
        return low
    if runs_as_scatter(node):
        low = Lowering(name, buffers, staged=staged)
        base, positions, values = node.src
        low.store_nest(node, out, node.shape, lambda index: (index, low.value(base, index)))

        def scatter(index: Index) -> tuple[Index, Operand]:
            position = low.value(positions, index)
            checked = low._let(dtypes.int64, "checked_index", (position, Lit(node.shape[node.arg], dtypes.int64)))
            assert isinstance(checked, Ref)
            target = list(index)
            target[node.arg] = Opaque(checked.name, 0, node.shape[node.arg] - 1)
            return tuple(target), low.value(values, index)

        low.store_nest(node, out, values.shape, scatter, accumulate=True)
        low.serial = True
        return low
    low = Lowering(name, buffers, staged=staged, riders=riders)
    low.store_nest(node, out, node.shape, lambda index: (index, low.define(node, index)))
    low.settle_windows()
    if low.recomputed:  # the scheduler lowers it again once those have buffers
        return low
    if low.reads_transposed() and all(node.shape[d] >= TRANSPOSE_TILE for d in low.tiled_axes()):
        low = Lowering(name, buffers, staged=staged)
        low.transposed_nest(node, out)
    elif low.reduces_across_rows():
        reduction, reordered = node, False
        while reduction.op in (Op.RESHAPE, Op.PERMUTE) and reduction.src[0] not in buffers:
            reordered |= reduction.op is Op.PERMUTE
            reduction = reduction.src[0]
        block = _row_block(reduction)
        if reduction.op in REDUCE and not reordered and block is not None:
            low = Lowering(name, buffers, staged=staged)
            low.reduce_into_output(reduction, out, block)
        else:  # consumed transposed or elementwise (a matmul in a backward chain): in its own buffer instead
            low.recomputed |= {n for n in low.inlined if n.op in REDUCE and _row_block(n) is not None
                               and (n is reduction or n.src[0].size // n.size >= TILE)}
    elif interiors := (low.interiors_of_padding() if not riders and not low._reduce_vars else {}):
        # the same values and decisions, the inner loops cut where padding checks stop (vectorized inside)
        low = Lowering(name, buffers, staged=staged, inlined=low.inlined, decided=True)
        low.store_nest(node, out, node.shape, lambda index: (index, low.define(node, index)), interiors=interiors)
    elif low.stages and not riders:  # the same, its staged blocks' loops cut where padding checks stop
        low = Lowering(name, buffers, staged=staged, inlined=low.inlined, decided=True)
        low.store_nest(node, out, node.shape, lambda index: (index, low.define(node, index)))
    else:
        low.forward_through_output(out, node)
    return low

