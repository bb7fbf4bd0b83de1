"""Matrix products: the `matmul` composite and what is built on it (mm, bmm, einsum, ...)."""

from __future__ import annotations

import math
import string
from typing import Any

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, DTypeError, ShapeError, UnsupportedError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.autocast import LOWER, OPAQUE, autocast_op
from tensorgraphs.frontend.tensor import Tensor, apply_composite, broadcast_shapes, cast, expand_to
from tensorgraphs.graph.composite import Composite, register


def _matmul_infer(a: Tensor, b: Tensor) -> tuple:
    return a.dtype, a.shape[:-1] + b.shape[-1:]


def _matmul_decomposition(a: Tensor, b: Tensor) -> Tensor:
    """(..., M, K) @ (..., K, N): broadcast to (..., M, N, K), multiply, sum over K. float16/bfloat16 operands are
    multiplied and summed in float32 (their products are exact there) and the sum rounded once, as torch does on
    the cpu and the GEMM library's bfloat16 kernel does."""
    wide = dtypes.float32 if a.dtype in (dtypes.float16, dtypes.bfloat16) else a.dtype
    products = ew.mul(mv.unsqueeze(cast(a, wide), -2), mv.unsqueeze(mv.mT(cast(b, wide)), -3))
    return cast(rd.sum(products, -1, dtype=wide), a.dtype)


def _matmul_grad(out: Tensor, grad: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    return _batched_matmul(grad, mv.mT(b)), _batched_matmul(mv.mT(a), grad)


MATMUL = register(Composite("matmul", infer=_matmul_infer, decompose=_matmul_decomposition, grad=_matmul_grad))


def _batched_matmul(a: Tensor, b: Tensor) -> Tensor:
    """The composite itself: equal batch dims, a (..., M, K), b (..., K, N), same dtype."""
    return apply_composite(MATMUL, a, b)


@autocast_op(LOWER)
def matmul(a: Tensor, b: Tensor) -> Tensor:
    """torch.matmul: 1-D operands are promoted and squeezed; batch dims broadcast."""
    for t in (a, b):
        if not isinstance(t, Tensor):
            fail("matmul", f"expected Tensor operands, got {type(t).__name__}", kind=DTypeError)
        if t.ndim == 0:
            fail("matmul", f"both arguments need at least 1 dimension, got shapes {a.shape} and {b.shape}")
    if a.dtype is not b.dtype:
        fail("matmul", f"expected both operands to have the same dtype, got {a.dtype.name} and {b.dtype.name}",
             kind=DTypeError)
    if a.dtype.is_bool:
        fail("matmul", "bool matrices are not supported; cast to an integer or float dtype", kind=DTypeError)
    a2 = mv.unsqueeze(a, 0) if a.ndim == 1 else a
    b2 = mv.unsqueeze(b, -1) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        fail("matmul", f"shapes {a.shape} and {b.shape} cannot be multiplied "
             f"({a2.shape[-1]} columns vs {b2.shape[-2]} rows)")
    if b2.ndim == 2 and a2.ndim > 2:
        folded = mv.reshape(a2, (math.prod(a2.shape[:-1]), a2.shape[-1]))
        out = mv.reshape(_batched_matmul(folded, b2), a2.shape[:-1] + b2.shape[-1:])
    else:
        batch = broadcast_shapes("matmul", a2.shape[:-2], b2.shape[:-2])
        out = _batched_matmul(expand_to(a2, batch + a2.shape[-2:]), expand_to(b2, batch + b2.shape[-2:]))
    if a.ndim == 1:
        out = mv.squeeze(out, -2)
    if b.ndim == 1:
        out = mv.squeeze(out, -1)
    return out


@autocast_op(LOWER)
def mm(a: Tensor, b: Tensor) -> Tensor:
    if a.ndim != 2 or b.ndim != 2:
        fail("mm", f"expected 2-D tensors, got shapes {a.shape} and {b.shape}")
    return matmul(a, b)


@autocast_op(LOWER)
def bmm(a: Tensor, b: Tensor) -> Tensor:
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0]:
        fail("bmm", f"expected 3-D tensors with equal batch size, got shapes {a.shape} and {b.shape}")
    return matmul(a, b)


@autocast_op(OPAQUE)
def dot(a: Tensor, b: Tensor) -> Tensor:
    if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
        fail("dot", f"expected two 1-D tensors of equal size, got shapes {a.shape} and {b.shape}")
    return matmul(a, b)


def outer(a: Tensor, b: Tensor) -> Tensor:
    return ew.mul(mv.unsqueeze(a, 1), mv.unsqueeze(b, 0))


@autocast_op(LOWER, applies=lambda equation, *operands: len(operands) > 1)
def einsum(equation: str, *operands: Any) -> Tensor:
    """Align every operand on one index order, multiply (broadcasting), sum the contracted indices."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    equation = equation.replace(" ", "")
    inputs, _, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(operands):
        fail("einsum", f"equation has {len(terms)} operands but {len(operands)} tensors were given", kind=ArgumentError)
    if "." in equation:
        terms, output = _expand_ellipsis(terms, output if "->" in equation else None, operands)
    elif "->" not in equation:
        letters = "".join(terms)
        output = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    sizes: dict[str, int] = {}
    for term, t in zip(terms, operands):
        if len(term) != t.ndim:
            fail("einsum", f"operand '{term}' has {len(term)} indices but the tensor has shape {t.shape}")
        if len(set(term)) != len(term):
            fail("einsum", f"repeated index in '{term}' (diagonals) is not supported; use torch.diagonal first",
                 kind=UnsupportedError)
        for c, s in zip(term, t.shape):
            if sizes.setdefault(c, s) != s and 1 not in (s, sizes[c]):
                fail("einsum", f"index '{c}' has sizes {sizes[c]} and {s}")
            sizes[c] = max(sizes[c], s)
    order = list(output) + sorted(set(sizes) - set(output))
    dtype = operands[0].dtype
    for t in operands[1:]:
        dtype = dtypes.promote_types(dtype, t.dtype)
    product = None
    for term, t in zip(terms, operands):
        aligned = mv.permute(cast(t, dtype), [term.index(c) for c in order if c in term])
        aligned = mv.reshape(aligned, tuple(sizes[c] if c in term else 1 for c in order))
        product = aligned if product is None else ew.mul(product, aligned)
    contracted = tuple(range(len(output), len(order)))
    if not contracted:
        return product
    return rd.sum(product, contracted, dtype=dtype if len(operands) > 1 else None)  # torch: one operand sums as sum()


def _expand_ellipsis(terms: list[str], output: str | None, operands: tuple) -> tuple[list[str], str]:
    spare = [c for c in string.ascii_letters if c not in "".join(terms) + (output or "")]
    width = max(t.ndim - len(term.replace("...", "")) for term, t in zip(terms, operands) if "..." in term)
    fill = "".join(spare[:width])
    expanded = []
    for term, t in zip(terms, operands):
        n = t.ndim - len(term.replace("...", ""))
        expanded.append(term.replace("...", fill[width - n :]))
    if output is None:
        letters = "".join(expanded)
        output = fill + "".join(sorted(c for c in set(letters) - set(fill) if letters.count(c) == 1))
    elif "..." in output:
        output = output.replace("...", fill)
    else:
        raise ShapeError("einsum: output must contain '...' when inputs do")
    return expanded, output
