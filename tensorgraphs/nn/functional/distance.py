"""Vector norms and similarities along a dim: normalize, cosine_similarity, pairwise_distance, pdist."""

from __future__ import annotations

import numpy as np

from tensorgraphs.errors import fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.tensor import Tensor, broadcast_shapes, expand_to
from tensorgraphs.nn.functional.arguments import require_float


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out: None = None) -> Tensor:
    """x / max(||x||_p, eps) along `dim`: unit vectors, zero vectors kept at zero."""
    require_float("normalize", input=input)
    return ew.div(input, ew.clamp(rd.norm(input, p, dim, keepdim=True), min=eps))


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """x1 / max(||x1||, eps) . x2 / max(||x2||, eps) along `dim` (inputs broadcast), as torch."""
    require_float("cosine_similarity", x1=x1, x2=x2)
    shape = broadcast_shapes("cosine_similarity", x1.shape, x2.shape)
    x1, x2 = expand_to(x1, shape), expand_to(x2, shape)
    return rd.sum(ew.mul(normalize(x1, 2.0, dim, eps), normalize(x2, 2.0, dim, eps)), dim)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """||x1 - x2 + eps||_p along the last dim (eps keeps the gradient finite where x1 == x2)."""
    require_float("pairwise_distance", x1=x1, x2=x2)
    difference = ew.add(ew.sub(x1, x2), eps)
    return rd.norm(difference, p, -1 if difference.ndim else None, keepdim)


def pdist(input: Tensor, p: float = 2) -> Tensor:
    """The p-norm distance of every pair of rows i < j of an (N, M) input, in row-major order of the pairs."""
    if input.ndim != 2:
        fail("pdist", f"expected a 2D input, got {input.shape}")
    require_float("pdist", input=input)
    first, second = np.triu_indices(input.shape[0], k=1)
    rows = [mv.index_select(input, 0, Tensor.from_numpy(i.astype(np.int64))) for i in (first, second)]
    return rd.norm(ew.sub(*rows), p, 1)
