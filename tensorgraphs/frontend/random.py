"""Counter-based random numbers: the same stream on every backend, reproducible from the seed.

Element i of the k-th random call after `manual_seed(s)` is the first word of
Threefry-2x32 (20 rounds, Salmon et al. 2011) with key (s mod 2**32, k) and
counter (i, s // 2**32). It is a pure function of the graph, so every backend
computes the same bits.
"""

from __future__ import annotations

import math
import threading

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend.tensor import Tensor, apply, apply_composite, cast
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.graph.ops import Op

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA
_MASK = 0xFFFFFFFF

_state = threading.local()


def manual_seed(seed: int) -> None:
    _state.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    _state.calls = 0


def initial_seed() -> int:
    return getattr(_state, "seed", 0)


def _next_key() -> tuple[int, int]:
    seed = initial_seed()
    calls = getattr(_state, "calls", 0)
    _state.calls = calls + 1
    return seed & _MASK, calls & _MASK


def _u32(value: int, shape: tuple[int, ...]) -> Tensor:
    return Tensor(g.const(value & _MASK, dtypes.uint32, shape))


def _rotl(x: Tensor, r: int) -> Tensor:
    high = apply(Op.MUL, x, _u32(1 << r, x.shape))
    low = apply(Op.DIV, x, _u32(1 << (32 - r), x.shape))
    return apply(Op.OR, high, low)


def threefry2x32(key: tuple[int, int], x0: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
    """Threefry-2x32-20 on uint32 tensors, from ADD, MUL, DIV, OR and XOR only."""
    shape = x0.shape
    ks = (key[0] & _MASK, key[1] & _MASK, (key[0] ^ key[1] ^ _PARITY) & _MASK)
    x0 = apply(Op.ADD, x0, _u32(ks[0], shape))
    x1 = apply(Op.ADD, x1, _u32(ks[1], shape))
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x0 = apply(Op.ADD, x0, x1)
            x1 = apply(Op.XOR, _rotl(x1, r), x0)
        x0 = apply(Op.ADD, x0, _u32(ks[(block + 1) % 3], shape))
        x1 = apply(Op.ADD, x1, _u32(ks[(block + 2) % 3] + block + 1, shape))
    return x0, x1


def _bits_shape(shape: tuple[int, ...], key0: int, key1: int, counter_high: int) -> tuple:
    return dtypes.uint32, tuple(shape)


def _bits_decomposition(*, shape: tuple[int, ...], key0: int, key1: int, counter_high: int) -> Tensor:
    n = math.prod(shape)
    counters = Tensor(g.iota(n, dtypes.uint32))
    x0, _ = threefry2x32((key0, key1), counters, _u32(counter_high, (n,)))
    return x0.reshape(shape)


RANDOM_BITS = register(Composite("random_bits", infer=_bits_shape, decompose=_bits_decomposition))


def random_bits(shape: tuple[int, ...]) -> Tensor:
    """uint32 bits for a fresh random call."""
    key0, key1 = _next_key()
    if math.prod(shape) >= 2**32:
        fail("random", f"at most 2**32 - 1 random numbers per call, asked for shape {shape}", kind=ArgumentError)
    return apply_composite(RANDOM_BITS, shape=tuple(shape), key0=key0, key1=key1, counter_high=initial_seed() >> 32)


def uniform_bits_to_float(bits: Tensor, dtype: dtypes.DType) -> Tensor:
    """The top 24 bits as a float in [0, 1)."""
    top = apply(Op.DIV, bits, _u32(256, bits.shape))
    return ew.mul(cast(cast(top, dtypes.int64), dtype), 2.0**-24)


def rand(shape: tuple[int, ...], dtype: dtypes.DType) -> Tensor:
    return uniform_bits_to_float(random_bits(shape), dtype)


def randn(shape: tuple[int, ...], dtype: dtypes.DType) -> Tensor:
    """Box-Muller on two uniforms; u1 is in (0, 1] so the log is finite."""
    n = math.prod(shape)
    u = rand((2, n), dtypes.float32)
    u1 = ew.sub(1.0, u[0])
    radius = ew.sqrt(ew.mul(ew.log(u1), -2.0))
    normal = ew.mul(radius, ew.cos(ew.mul(u[1], 2 * math.pi)))
    return cast(normal.reshape(shape), dtype)


def randint(low: int, high: int, shape: tuple[int, ...], dtype: dtypes.DType) -> Tensor:
    span = high - low
    if span <= 0:
        fail("randint", f"expected low < high, got low={low}, high={high}", kind=ArgumentError)
    if span > 2**32:
        fail("randint", f"the range high - low must be at most 2**32, got {span}", kind=ArgumentError)
    bits = random_bits(shape)
    drawn = cast(bits, dtypes.int64) if span == 2**32 else cast(apply(Op.MOD, bits, _u32(span, bits.shape)), dtypes.int64)
    return cast(ew.add(drawn, low), dtype)


def bernoulli_mask(shape: tuple[int, ...], p: float) -> Tensor:
    """True with probability 1 - p (the dropout keep mask)."""
    return ew.ge(rand(shape, dtypes.float32), p)
