"""Sorting with torch's order: sort, argsort, msort and topk, all built on one `argsort` composite.

The composite's reference decomposition ranks every key by counting the keys that sort before it (one fused
reduction, n * n comparisons per row, no data-dependent control flow) and writes each index to its rank's
place (a scatter). Keys are ordered by (NaN-ness, value, input position), a total order, which makes it
torch's stable sort: equal values keep their input order, NaN ranks above +inf (last ascending, first
descending) and -0.0 equals 0.0. A dedicated kernel can replace the composite for long rows. Values are
the input gathered at the sorted indices, so gradients are torch's: scattered back to where each value
came from.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.tensor import Tensor, apply_composite, cast, expand_to, full_like_node, normalize_dim
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import Composite, register

SortResult = namedtuple("SortResult", ["values", "indices"])
TopKResult = namedtuple("TopKResult", ["values", "indices"])

def _nan_rank(keys: Tensor, descending: bool) -> Tensor | None:
    """Compared before values: ascending puts NaN after every number (1 vs 0), descending before it."""
    if not keys.dtype.is_floating_point:
        return None
    nan = ew.isnan(keys)
    return cast(ew.logical_not(nan) if descending else nan, dtypes.int8)


def _before(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor], descending: bool) -> Tensor:
    """Whether key a sorts strictly before key b: by NaN-ness, then value, then input position."""
    (value_a, index_a), (value_b, index_b) = a, b
    tied = ew.logical_not(ew.lt(value_b, value_a))  # NaNs tie with each other too
    before = ew.logical_or(ew.lt(value_a, value_b), ew.logical_and(tied, ew.lt(index_a, index_b)))
    rank_a, rank_b = _nan_rank(value_a, descending), _nan_rank(value_b, descending)
    if rank_a is None:
        return before
    return ew.logical_or(ew.lt(rank_a, rank_b), ew.logical_and(ew.eq(rank_a, rank_b), before))


def _ranked_argsort(x: Tensor, *, descending: bool) -> Tensor:
    """Each key's rank is how many keys sort before it; every index is then written to its rank's place."""
    n = x.shape[-1]
    keys = cast(x, dtypes.uint8) if x.dtype.is_bool else x
    if descending:  # an order-reversing bijection; NaN stays NaN and is placed by its NaN rank
        keys = ew.neg(keys) if keys.dtype.is_floating_point else ew.bitwise_not(keys)
    positions = expand_to(mv.reshape(Tensor(g.iota(n, dtypes.int64)), (1,) * (x.ndim - 1) + (n,)), x.shape)
    other = (mv.unsqueeze(keys, -2), mv.unsqueeze(positions, -2))  # key j along the last axis
    this = (mv.unsqueeze(keys, -1), mv.unsqueeze(positions, -1))  # the key i being ranked
    ranks = rd.sum(_before(other, this, descending), -1)
    return mv.scatter_add(full_like_node(0, positions), -1, ranks, positions)


ARGSORT = register(Composite("argsort", infer=lambda x, **_: (dtypes.int64, x.shape), decompose=_ranked_argsort,
                             grad=lambda out, grad, x, **_: (None,)))


def argsort(x: Tensor, dim: int = -1, descending: bool = False, *, stable: bool = False) -> Tensor:
    """torch.argsort; always stable (ties keep their input order), which torch guarantees only with stable=True."""
    if x.ndim == 0:
        return Tensor(g.const(0, dtypes.int64))
    d = normalize_dim("argsort", dim, x.ndim)
    last = mv.movedim(x.detach(), d, -1)
    return mv.movedim(apply_composite(ARGSORT, last, descending=bool(descending)), -1, d)


def sort(x: Tensor, dim: int = -1, descending: bool = False, *, stable: bool = False) -> SortResult:
    indices = argsort(x, dim, descending)
    return SortResult(mv.gather(x, dim, indices) if x.ndim else x, indices)


def msort(x: Tensor) -> Tensor:
    return sort(x, 0).values


def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> TopKResult:
    """The k largest (smallest) values along `dim` in order; among equal values the first in the input wins."""
    d = normalize_dim("topk", dim, x.ndim) if x.ndim else 0
    size = x.shape[d] if x.ndim else 1
    if not isinstance(k, int) or not 0 <= k <= size:
        fail("topk", f"k ({k}) is out of range for dimension {dim} of size {size} (shape {x.shape})",
             kind=ArgumentError)
    if x.ndim == 0:
        return TopKResult(x, Tensor(g.const(0, dtypes.int64)))
    last = mv.movedim(x.detach(), d, -1)
    chunked = size > 2 * TOPK_CHUNK and k <= TOPK_CHUNK // 4 and not x.dtype.is_bool
    indices = _chunked_top(last, k, largest) if chunked else mv.narrow(argsort(last, -1, largest), -1, 0, k)
    indices = mv.movedim(indices, -1, d)
    return TopKResult(mv.gather(x, d, indices), indices)


TOPK_CHUNK = 1024
"""Long rows are cut into chunks of this many: the top k of each chunk, then the top k of those candidates
(n * TOPK_CHUNK + (n / TOPK_CHUNK * k) ** 2 comparisons instead of n * n)."""


def _chunked_top(x: Tensor, k: int, largest: bool) -> Tensor:
    """Indices of the top k along the last dim. Candidates stay in chunk order and, within a chunk, in
    sorted order, so equal values among them are in input order and the stable final sort keeps it."""
    n = x.shape[-1]
    chunks = -(-n // TOPK_CHUNK)
    # padding loses every comparison it could win: -inf (or the dtype's least) for largest, NaN (or the
    # greatest) for smallest, and ties go to the real, earlier lanes
    filler = (-math.inf if largest else math.nan) if x.dtype.is_floating_point else \
        int(np.iinfo(x.dtype.storage).min if largest else np.iinfo(x.dtype.storage).max)
    blocks = mv.reshape(mv.pad_dim(x, -1, 0, chunks * TOPK_CHUNK - n, filler), x.shape[:-1] + (chunks, TOPK_CHUNK))
    local = mv.narrow(argsort(blocks, -1, largest), -1, 0, k)
    offsets = mv.reshape(ew.mul(Tensor(g.iota(chunks, dtypes.int64)), TOPK_CHUNK), (chunks, 1))
    candidates = mv.flatten(ew.add(local, offsets), -2)
    values = mv.gather(mv.flatten(blocks, -2), -1, candidates)
    return mv.gather(candidates, -1, mv.narrow(argsort(values, -1, largest), -1, 0, k))
