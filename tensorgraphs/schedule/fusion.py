"""The scheduler: partitions a graph into fused kernels.

Steps, each a plain function:

1. `to_primitive`: every composite is replaced by its reference decomposition
   (recursively), except those the planner (`plan.choices.route_of`) runs otherwise: float32
   matrix products a GEMM library runs (`schedule.extern`: kept whole, their operands and
   result materialized), likewise convolutions a conv kernel runs (`schedule.convolution`), attentions
   the fused attention kernel runs (`schedule.attention`:
   likewise, its operands read in place through strided views); scans (cumsum, cumprod:
   kept whole and materialized, one loop along their axis: `lower.Lowering.scan_nest`) and host
   calls (`graph.host_call`: kept whole, their sources and result materialized; one call back), concatenations
   (kept whole and materialized, one loop per input into its slice: `lower.concat_nests`); large full
   reductions are split in two so both halves run in parallel (`split_full_reduction`). A
   product's (or convolution's) elementwise consumers that the kernel applies itself (bias,
   activation, residual, scale) are then folded into its call (`schedule.extern.fuse_epilogues`), after a
   convolution's per-channel scale went into its weights (`schedule.convolution.fold_channel_scales`).
   Stored composites (a separable window's partial results) stay whole through those passes, then are
   decomposed and *staged*: the kernel reading them computes them a block at a time (`decompose_stored`).
2. `schedule_kernels`: decides which nodes get a buffer ("materialized"):
   inputs, roots and scatter-adds always; everything else is computed inside
   the kernels that consume it (`schedule.lower`). Fusion therefore follows from
   what is *not* materialized: elementwise chains, elementwise producers of a
   reduction and reductions consumed row by row (softmax, layer norm) all land
   in one kernel. A node is materialized after all when lowering shows that
   inlining it costs extra work:

   * an expensive node (reduction, exp2/log2/sin) evaluated more often than it
     has elements, e.g. a column reduction consumed by an elementwise op that runs
     along its rows, or exp(x) feeding a matrix product;
   * a cheap node evaluated inside a reduction's body more than
     `CHEAP_RECOMPUTE_LIMIT` times per element (a backward chain feeding a weight
     gradient would otherwise run once per output column);
   * a matrix product whose operands are read down their columns but which is
     consumed transposed or by an elementwise op: in a buffer of its own it
     accumulates output rows (contiguous, vectorized; see `lower.reduce_into_output`);
   * a reduction inlined into more than one kernel (it would run once per kernel);
   * a cheap value a window reads at several taps (a batch norm and relu before a pool or a
     depthwise conv) whose every tap costs `lower.WINDOW_RECOMPUTE_LETS` operations or more
     (`Lowering.settle_windows` picks which of a chain).

   Reductions are decided first: what a recomputed reduction reads is itself
   evaluated too often only until that reduction gets its buffer (a lowering stops
   at a node it recomputes, so nested reductions never multiply its work); then the
   outermost of the other values (`outermost`).

   Cheap elementwise nodes shared by several kernels are recomputed in each:
   recomputing costs a few instructions per element; materializing costs a store
   and a load through memory.

The loop repeats until no kernel asks for a new buffer (each round only adds);
buffers are named by node position, so only kernels that visited a new buffer's
node are lowered again.

3. `store_in_consumers`: a buffer a plain elementwise kernel writes only to be
   read back at the same index (an optimizer's new moments, program outputs the
   parameter update reads) is computed and stored by the kernel reading it: a
   kernel may store several arrays, at one index (Adam: three kernels per
   parameter become one).
4. `write_slices_in_place`: a piece of a concatenation lives in its slice of the
   concatenation's buffer (a view), where the kernels making and reading it
   address it; the concatenation copies only the pieces that cannot.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Collection

from tensorgraphs.codegen.loop_ir import (
    LIBRARY_CALLS,
    BufferView,
    Kernel,
    Local,
    Reduce,
    Store,
    TransposeLocal,
    walk,
    written_through,
)
from tensorgraphs.graph.composite import decompose, is_composite, params_of
from tensorgraphs.graph.host_call import runs_as_host_call
from tensorgraphs.graph.node import Node, rebuild, toposort, with_sources
from tensorgraphs.graph.ops import REDUCE, Op
from tensorgraphs.plan.choices import DECOMPOSE, route_of
from tensorgraphs.plan.consumers import uses_in, using
from tensorgraphs.schedule.attention import AttentionLowering, operand_bases, runs_as_fused_attention
from tensorgraphs.schedule.convolution import (
    WINOGRAD_WEIGHTS,
    ConvLowering,
    WinogradWeightsLowering,
    conv_operand_bases,
    fold_channel_scales,
    prepare_winograd_weights,
    runs_as_conv_kernel,
)
from tensorgraphs.schedule.extern import (
    GemmLowering,
    fuse_epilogues,
    gemm_operand_bases,
    transposed_product,
)
from tensorgraphs.schedule.fft import FftLowering, runs_as_fft
from tensorgraphs.schedule.host_call import HostCallLowering
from tensorgraphs.schedule.lower import EXPENSIVE, Lowering, lower_node, runs_as_concat, runs_as_loops
from tensorgraphs.schedule.quantized import QuantizedLinearLowering, runs_as_int8_gemm

IsInput = Callable[[Node], bool]

SPLIT_MIN_SIZE = 1 << 16
"""A full reduction over at least this many elements is split into parallel partial reductions."""
SPLIT_PARTS = (64, 32, 16, 8, 4, 2)


@dataclass(frozen=True)
class BufferSpec:
    """One array of a program: `role` is input, output or temp."""

    name: str
    node: Node
    role: str


@dataclass
class Schedule:
    kernels: list[Kernel]
    buffers: list[BufferSpec]  # position = slot in the program's pointer array
    outputs: list[str]  # the buffer of each root

    def __str__(self) -> str:
        listed = "\n".join(f"  {b.name}: {b.role} {b.node.dtype.name}{list(b.node.shape)}" for b in self.buffers)
        return f"schedule: {len(self.kernels)} kernels\n{listed}\n" + "\n".join(map(str, self.kernels))


def to_primitive(roots: list[Node], is_input: IsInput, keep_stored: bool = False) -> tuple[list[Node], set[Node]]:
    """The roots rebuilt from primitives only, and the nodes that must be materialized (partial sums); with
    `keep_stored`, stored composites whole (`decompose_stored`)."""
    memo: dict[Node, Node] = {}
    forced: set[Node] = set()
    uses = Counter(roots) + Counter(s for n in toposort(roots, stop=is_input) for s in n.src)

    def convert(root: Node) -> Node:
        for node in toposort([root], stop=lambda n: n in memo or is_input(n)):
            if node in memo:
                continue
            if is_input(node):
                memo[node] = node
            elif (swapped := transposed_product(node, uses)) is not None:
                memo[node] = convert(swapped)
            elif runs_as_loops(node):
                memo[node] = with_sources(node, tuple(memo[s] for s in node.src))
                forced.add(memo[node])
            elif runs_as_host_call(node):
                memo[node] = with_sources(node, tuple(memo[s] for s in node.src))
                forced.update(s for s in (memo[node], *memo[node].src) if not is_input(s))
            elif is_composite(node) and node.op.stored and keep_stored:
                memo[node] = with_sources(node, tuple(memo[s] for s in node.src))
            elif is_composite(node) and route_of(node) != DECOMPOSE:  # a native library runs it
                memo[node] = with_sources(node, tuple(memo[s] for s in node.src))
                forced.add(memo[node])
                forced.update(b for b in library_operand_bases(memo[node], is_input) if not is_input(b))
            elif is_composite(node):  # the planner chose its decomposition
                from tensorgraphs.rewrite import optimize

                # canonical, as the rewritten gradient built from the same decomposition: common parts (an
                # attention's scores) are then the same nodes, computed once
                (canonical,) = optimize([decompose(node)], ["canonical"], stop=set(node.src).__contains__)
                memo[node] = convert(canonical)
                if node.op.stored and not is_input(memo[node]):
                    forced.add(memo[node])
            else:
                memo[node] = split_full_reduction(with_sources(node, tuple(memo[s] for s in node.src)), forced)
        return memo[root]

    return [convert(r) for r in roots], forced


def decompose_stored(roots: list[Node], materialized: set[Node],
                     is_input: IsInput) -> tuple[list[Node], set[Node], set[Node]]:
    """The roots with the stored composites `to_primitive` kept whole decomposed, once no pass rebuilds the graph
    any more; the nodes materialized; and the stored results, *staged*: each kernel reading one along its rows
    computes them itself, a plane or a row at a time (`lower.Lowering._staged_block`); one reading it otherwise
    asks it a buffer."""
    order = toposort(roots, stop=is_input)
    stored = [n for n in order if is_composite(n) and n.op.stored]
    forced: set[Node] = set()

    def decomposed(node: Node, rebuilt: dict[Node, Node]) -> Node:
        whole = with_sources(node, tuple(rebuilt[s] for s in node.src))
        (result,), inner = to_primitive([whole], lambda n: is_input(n) or n in whole.src)
        forced.update(inner - {result})
        return result

    rebuilt = rebuild(order, {n: functools.partial(decomposed, n) for n in stored}, is_input)
    materialized = {rebuilt.get(n, n) for n in materialized} | forced
    staged = {rebuilt[n] for n in stored if not is_input(rebuilt[n])} - materialized
    return [rebuilt[r] for r in roots], materialized, staged


def library_operand_bases(node: Node, is_input: IsInput) -> list[Node]:
    """The buffers a library call on `node` reads its operands from: the fused attention kernel reads strided
    views in place, a conv kernel or a GEMM where its operands are stored (`conv_operand_bases`,
    `gemm_operand_bases`)."""
    if runs_as_fused_attention(node):
        return operand_bases(node, is_input)
    if runs_as_int8_gemm(node) or runs_as_fft(node):
        return list(node.src)
    return conv_operand_bases(node) if runs_as_conv_kernel(node) else gemm_operand_bases(node)


def split_full_reduction(node: Node, forced: set[Node]) -> Node:
    """A large reduction to one element as parts, each reducing a contiguous slice, then the parts."""
    if node.op not in REDUCE or node.size != 1 or node.src[0].size < SPLIT_MIN_SIZE:
        return node
    (source,) = node.src
    parts = next((p for p in SPLIT_PARTS if source.size % p == 0), None)
    if parts is None:
        return node
    sliced = Node(Op.RESHAPE, source.dtype, (parts, source.size // parts), (source,), (parts, source.size // parts))
    partial = Node(node.op, node.dtype, (parts, 1), (sliced,), (1,))
    forced.add(partial)
    total = Node(node.op, node.dtype, (1, 1), (partial,), (0,))
    return Node(Op.RESHAPE, node.dtype, node.shape, (total,), node.shape)


def schedule_kernels(roots: list[Node], is_input: IsInput | None = None) -> Schedule:
    """Kernels computing `roots`; nodes where `is_input` holds (and BUFFERs) are read from given arrays. The planner
    chooses each composite's route for its use in this graph (`plan.consumers`: with the passes that follow it)."""
    given = is_input or (lambda n: False)
    leaf = lambda n: n.op is Op.BUFFER or given(n)  # noqa: E731
    with using(uses_in(roots, leaf)):
        return _schedule(roots, leaf)


def _schedule(roots: list[Node], leaf: IsInput) -> Schedule:
    primitive_roots, materialized = to_primitive(roots, leaf, keep_stored=True)
    primitive_roots, materialized = fold_channel_scales(primitive_roots, materialized, leaf)
    primitive_roots, materialized = fuse_epilogues(primitive_roots, materialized | set(primitive_roots), leaf)
    primitive_roots, materialized = prepare_winograd_weights(primitive_roots, materialized, leaf)
    primitive_roots, materialized, staged = decompose_stored(primitive_roots, materialized, leaf)
    order = toposort(primitive_roots, stop=leaf)
    materialized |= too_deep_to_inline(order, materialized, leaf)
    materialized |= chains_shared_before_lowering(order, materialized, leaf)
    inputs = [n for n in order if leaf(n)]
    position = {n: i for i, n in enumerate(order)}
    lowered: dict[Node, Lowering | GemmLowering | ConvLowering | WinogradWeightsLowering | AttentionLowering
                        | HostCallLowering | FftLowering] = {}
    added = set(materialized)
    while True:
        buffers = _name_buffers(order, inputs, materialized, primitive_roots, position)
        names = {b.node: b.name for b in buffers}
        computed = [n for n in order if n in materialized and not leaf(n) and n.size > 0]
        for n in computed:  # a lowering changes only when a node it visited got a buffer
            previous = lowered.get(n)
            if previous is None or not added.isdisjoint(previous.inlined) or not added.isdisjoint(previous.recomputed):
                lower = (AttentionLowering if runs_as_fused_attention(n) else
                         ConvLowering if runs_as_conv_kernel(n) else
                         WinogradWeightsLowering if n.op is WINOGRAD_WEIGHTS else
                         HostCallLowering if runs_as_host_call(n) else
                         QuantizedLinearLowering if runs_as_int8_gemm(n) else
                         FftLowering if runs_as_fft(n) else
                         GemmLowering if is_composite(n) and not runs_as_loops(n) else
                         functools.partial(lower_node, staged=staged))
                lowered[n] = lower(f"k{position[n]}_{n.op.name.lower()}", n, names)
        lowerings = [lowered[n] for n in computed]
        recomputed = outermost(set().union(*(low.recomputed for low in lowerings)), materialized, leaf)
        inlined_by = Counter(n for low in lowerings for n in low.inlined)  # how many kernels compute each inline
        reductions = {n for n in recomputed if n.op in REDUCE} | {
            n for n, count in inlined_by.items() if n.op in REDUCE and count > 1}
        added = (reductions or recomputed or shared_chains(inlined_by, order, materialized, leaf)) - materialized
        if not added:  # it is a buffer
            break
        materialized |= added
    homes = store_in_consumers(computed, lowered, names, order, materialized, leaf, set(primitive_roots), staged)
    written = {n: low.kernel() for n in computed if (low := homes.get(n, lowered[n])) is not None}
    placed = write_slices_in_place(written, names, set(primitive_roots), staged)
    # empty: a node another kernel's library call computes, or a concatenation whose pieces all wrote themselves
    kernels = [kernel for kernel in written.values() if kernel.body]
    return Schedule(kernels, [b for b in buffers if b.node not in placed], [names[r] for r in primitive_roots])


def write_slices_in_place(written: dict[Node, Kernel], names: dict[Node, str], outputs: set[Node],
                          staged: Collection[Node] = frozenset()) -> set[Node]:
    """The nodes whose buffers become views of their slices of a concatenation's buffer (`BufferView`): the
    kernels writing them write there, those reading them read there (`written`, node -> the kernel computing it,
    is updated), and the concatenation copies only the other pieces. A piece qualifies when its buffer is a
    temporary that no other piece of the concatenation is stored in, and every kernel touching it can address the
    view (`written_through`: a library call's input only a contiguous one, its output one that keeps its blocks
    contiguous and equally far apart: a conv's images along the channels of a batch, at their offset and the
    concatenation's image stride). A concatenation of concatenations (a DenseNet's block, each layer's read by its
    batch norm too) so writes each input once, into the last one."""
    placed: set[Node] = set()
    views: list[tuple[str, BufferView]] = []  # every view made, in order: a chain of them composes
    for cat in [n for n in written if runs_as_concat(n)]:
        users, writers = _users_and_writers(written)
        axis = params_of(cat)["axis"]
        strides = tuple(math.prod(cat.shape[d + 1:]) for d in range(cat.ndim))
        stored = [_stored_in(piece, names) for piece in cat.src]
        pieces, start = set(), 0
        for piece, source in zip(cat.src, stored):
            name = names.get(source)
            if (name in writers and cat in users[name] and source not in outputs and stored.count(source) == 1):
                view = BufferView(names[cat], cat.size, start * strides[axis], piece.shape, strides)
                through = {user: written_through(written[user], name, view) for user in users[name] - {cat}}
                if None not in through.values():
                    written.update(through)
                    views.append((name, view))
                    pieces.add(piece)
                    placed.add(source)
            start += piece.shape[axis]
        if pieces:  # lowered from the names of the buffers, then through the views made so far
            kernel = lower_node(written[cat].name, cat, names, placed=pieces, staged=staged).kernel()
            for name, view in views:
                if any(b.name == name for b in kernel.buffers):
                    kernel = written_through(kernel, name, view)
                    assert kernel is not None, "a generated kernel addresses any view"
            written[cat] = kernel
    return placed


def _stored_in(piece: Node, names: dict[Node, str]) -> Node:
    """The node whose buffer holds `piece`'s elements in its order (a reshape's source's), or `piece` itself."""
    while piece not in names and piece.op is Op.RESHAPE:
        piece = piece.src[0]
    return piece


def _users_and_writers(written: dict[Node, Kernel]) -> tuple[dict[str, set[Node]], dict[str, set[Node]]]:
    """For each buffer name, the kernels (by the node they compute) touching it, and those writing it."""
    users: dict[str, set[Node]] = {}
    writers: dict[str, set[Node]] = {}
    for owner, kernel in written.items():
        for buffer in kernel.buffers:
            users.setdefault(buffer.name, set()).add(owner)
            if buffer.writes:
                writers.setdefault(buffer.name, set()).add(owner)
    return users, writers


def outermost(recomputed: set[Node], materialized: set[Node], leaf: IsInput) -> set[Node]:
    """The recomputed values (expensive ones all: reductions, exp2, ...) that no other one computes inline: a buffer
    for the outer value (a pool's result read by the next window's taps) ends the recomputation of the cheap ones
    inside it (the pool's own maxima), which a lowering flags again where it still recomputes them. Expensive
    values all get buffers at once: one round each along a chain of them (an unrolled recurrence's activations)
    would lower every kernel reading them again per round."""
    inside = {n for node in recomputed for n in toposort(list(node.src), stop=lambda n: n in materialized or leaf(n))}
    return {n for n in recomputed if n.op in EXPENSIVE or n not in inside}


def store_in_consumers(computed: list[Node], lowered: dict[Node, Lowering | GemmLowering | AttentionLowering],
                       names: dict[Node, str],
                       order: list[Node], materialized: set[Node], leaf: IsInput,
                       outputs: set[Node], staged: Collection[Node] = frozenset()) -> dict[Node, Lowering | None]:
    """Kernels that also compute and store buffers their own kernels would write: node -> its new lowering, or
    None for a kernel no longer needed (its node *rides* in another kernel).

    A buffer a plain elementwise kernel writes only to be read again at the same index (an optimizer's new
    moment: a program output, then read by the parameter update) is stored by the first kernel reading it, its
    *home*, which computes it in the same loop body from what it loads: one pass over memory instead of a store
    and a load. A home that is itself a rider passes its riders on to its own home. Memory: a rider read by
    other kernels too makes its home run when they need it, so only a home writing a program output (no arena
    bytes) takes one; and a rider must not keep a temporary alive longer than its home's group reads it anyway.
    A rider is dropped when another reader would run before its home, when its home reads it at another index
    (a transpose, a reduction), lowers it in another nest (transposing tiles, accumulated rows) or stages rows
    in a `Local` (which keeps every output from overwriting an input in place), or when the home would inline
    a chain deeper than MAX_INLINE_DEPTH; the rest are tried again until all are stored where planned.
    """
    position = {n: i for i, n in enumerate(computed)}
    kernels = {n: lowered[n].kernel() for n in computed}
    reads = {n: {b.name for b in kernels[n].buffers if not b.writes} for n in computed}
    readers: dict[str, list[Node]] = {}
    for n in computed:
        for name in reads[n]:
            readers.setdefault(name, []).append(n)
    temporaries = {names[n] for n in computed if n not in outputs}
    home = {}
    for rider in computed:
        first, *others = readers.get(names[rider], [rider])  # read by nothing: its own "first reader"
        if (first is not rider and _plain(kernels[rider]) and not runs_as_loops(rider)
                and isinstance(lowered[first], Lowering)
                and first.shape == rider.shape and (first in outputs or not others)):
            home[rider] = first
    relowered: dict[tuple[Node, frozenset[Node]], Lowering] = {}
    while True:
        final = {n: _final_home(n, home) for n in home}
        group = {destination: [destination] for destination in final.values()}
        for rider in home:
            group[final[rider]].append(rider)
        at = {n: position[final.get(n, n)] for n in computed}  # where each node's kernel runs now

        def keeps_alive(rider: Node) -> bool:
            members = group[final[rider]]
            return any(not any(r is not rider and (r in members or at[r] >= at[rider]) for r in readers[name])
                       for name in reads[rider] & temporaries)

        dropped = {rider for rider in home if any(at[r] < at[rider] for r in readers[names[rider]])
                   or keeps_alive(rider)}
        too_deep = too_deep_to_inline(order, materialized - set(home), leaf)
        for destination, (_, *riders) in group.items():
            if not too_deep.isdisjoint(lowered[destination].inlined.union(*(lowered[r].inlined for r in riders))):
                dropped |= set(riders)
            if dropped & set(riders):  # lowered again once the others are settled
                continue
            key = (destination, frozenset(riders))
            if key not in relowered:
                relowered[key] = lower_node(lowered[destination].name, destination, names, tuple(riders), staged=staged)
            low = relowered[key]
            stages = any(isinstance(s, Local) for s in walk(low.kernel().body))
            dropped |= set(riders) if stages or low.recomputed else set(riders) - low.stored_riders
        if not dropped:
            break
        home = {rider: h for rider, h in home.items() if rider not in dropped}
    homes: dict[Node, Lowering | None] = {rider: None for rider in home}
    for destination, (_, *riders) in group.items():
        homes[destination] = relowered[(destination, frozenset(riders))]
    return homes


def _plain(kernel: Kernel) -> bool:
    """One elementwise pass writing one buffer once (no reduction, staging or library call): what a kernel
    reading it at the same index can compute on the way."""
    stores = [s for s in walk(kernel.body) if isinstance(s, Store)]
    return (len(stores) == 1 and not stores[0].accumulate
            and not any(isinstance(s, (Reduce, Local, TransposeLocal, *LIBRARY_CALLS)) for s in walk(kernel.body)))


def _final_home(rider: Node, home: dict[Node, Node]) -> Node:
    while rider in home:
        rider = home[rider]
    return rider


MAX_INLINE_DEPTH = 96
"""Longest chain of nodes one kernel computes inline: lowering walks it recursively (a hundred fused softmaxes
exceeded Python's recursion limit), and so does the C compiler's expression handling."""


def too_deep_to_inline(order: list[Node], materialized: set[Node], leaf: IsInput) -> set[Node]:
    """Nodes to give buffers so that no kernel inlines a chain longer than MAX_INLINE_DEPTH."""
    depth: dict[Node, int] = {}
    cut: set[Node] = set()
    for node in order:
        if leaf(node) or node in materialized:
            depth[node] = 0
            continue
        depth[node] = 1 + max((depth[s] for s in node.src), default=0)
        if depth[node] >= MAX_INLINE_DEPTH:
            cut.add(node)
            depth[node] = 0
    return cut


MAX_SHARED_INLINE_NODES = 32
"""Most nodes that computing a value inline may take (its cone back to buffers and inputs) when more than one
kernel computes it: a larger one (an RNN's cell state, a recurrence of elementwise steps, forward activations a
backward recomputes) gets a buffer, as otherwise every kernel reading it recomputes all of it (and the program's
C grows with the product of its size and its readers)."""


def chains_shared_before_lowering(order: list[Node], materialized: set[Node], leaf: IsInput) -> set[Node]:
    """The `shared_chains` known before lowering: a chain several kernels would inline (an unrolled recurrence's
    cell state, read at every step) is cut before its first lowering, which would walk all of it once per reader.
    Reductions count as buffers here, as most of them become buffers in the first rounds, which often leaves the
    chains they end short enough to inline: the rounds of `schedule_kernels` cut those that remain too long."""
    reductions = {n for n in order if n.op in REDUCE}
    return shared_chains(kernels_reaching(order, materialized, leaf), order, materialized | reductions, leaf)


def kernels_reaching(order: list[Node], materialized: set[Node], leaf: IsInput) -> Counter[Node]:
    """How many kernels (one per materialized node) reach each other node through nodes computed inline: 1, or 2
    for two or more."""
    owner: dict[Node, Node | None] = {}  # the one kernel reaching a node; None: several
    for node in reversed(order):
        if leaf(node) or (node not in materialized and node not in owner):
            continue
        kernel = node if node in materialized else owner[node]
        for source in node.src:
            if not (leaf(source) or source in materialized):
                owner[source] = kernel if owner.get(source, kernel) is kernel else None
    return Counter({node: 1 if kernel is not None else 2 for node, kernel in owner.items()})


def shared_chains(inlined_by: Counter[Node], order: list[Node], materialized: set[Node], leaf: IsInput) -> set[Node]:
    """Nodes more than one kernel computes inline (`inlined_by`: how many) whose cone has more than
    MAX_SHARED_INLINE_NODES nodes."""
    cone: dict[Node, frozenset[Node] | None] = {}  # None: more than the limit
    cut: set[Node] = set()
    for node in order:
        if leaf(node) or node in materialized:
            cone[node] = frozenset()
            continue
        sources = [cone[s] for s in node.src]
        nodes = None if None in sources else frozenset({node}).union(*sources)
        if nodes is None or len(nodes) > MAX_SHARED_INLINE_NODES:
            nodes = None
            if inlined_by[node] > 1:
                cut.add(node)
                nodes = frozenset()
        cone[node] = nodes
    return cut


def _name_buffers(order: list[Node], inputs: list[Node], materialized: set[Node], roots: list[Node],
                  position: dict[Node, int]) -> list[BufferSpec]:
    """Inputs first, then materialized nodes in order; a buffer is named after its node's position in `order`,
    so names stay the same while the scheduler adds buffers (and kernels lowered earlier stay valid)."""
    outputs, given = set(roots), set(inputs)
    specs = [BufferSpec(f"b{position[n]}", n, "input") for n in inputs]
    for node in order:
        if node in materialized and node not in given:
            specs.append(BufferSpec(f"b{position[node]}", node, "output" if node in outputs else "temp"))
    return specs


def count_kernels(roots: list[Node]) -> int:
    """How many kernels the cpu backend runs for `roots` (fusion tests assert this)."""
    return len(schedule_kernels(roots).kernels)
