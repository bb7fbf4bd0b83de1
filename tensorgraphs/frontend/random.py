"""Counter-based random numbers: the same stream on every backend, reproducible from the seed.

Element i of the k-th random call after `manual_seed(s)` is the first word of
Threefry-2x32 (20 rounds, Salmon et al. 2011) with key (s mod 2**32, k) and
counter (i, s // 2**32). It is a pure function of the graph, so every backend
computes the same bits.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, DTypeError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend.tensor import Tensor, apply, apply_composite, cast, live_buffer
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.graph.ops import Op
from tensorgraphs.runtime import tracing

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA
_MASK = 0xFFFFFFFF


class Generator:
    """A random stream (a seed and a call count), as torch.Generator. `tg.manual_seed` seeds the default one
    (process-wide: threads share it) and returns it; a Generator passed as `generator=` draws from its own."""

    def __init__(self, device: Any = "cpu") -> None:
        self._lock = threading.Lock()
        self._seed = 0
        self._calls = 0

    def manual_seed(self, seed: int) -> Generator:
        with self._lock:
            self._seed = int(seed) & 0xFFFFFFFFFFFFFFFF
            self._calls = 0
        return self

    def initial_seed(self) -> int:
        return self._seed

    def seed(self) -> int:
        """Seed from the operating system's entropy (as torch.Generator.seed); returns the seed."""
        seed = int.from_bytes(os.urandom(8), "little")
        self.manual_seed(seed)
        return seed

    def next_key(self) -> tuple[int, int, int]:
        """(key0, key1, counter_high) of the next random call."""
        with self._lock:
            calls = self._calls
            self._calls += 1
            return self._seed & _MASK, calls & _MASK, self._seed >> 32


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    return default_generator.manual_seed(seed)


def initial_seed() -> int:
    return default_generator.initial_seed()


def _u32(value: int, shape: tuple[int, ...]) -> Tensor:
    return Tensor(g.const(value & _MASK, dtypes.uint32, shape))


def _rotl(x: Tensor, r: int) -> Tensor:
    high = apply(Op.MUL, x, _u32(1 << r, x.shape))
    low = apply(Op.DIV, x, _u32(1 << (32 - r), x.shape))
    return apply(Op.OR, high, low)


def threefry2x32(key: tuple[Tensor | int, Tensor | int], x0: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
    """Threefry-2x32-20 on uint32 tensors, from ADD, MUL, DIV, OR and XOR only; the key words are uint32
    tensors broadcastable to the counters, or ints."""
    shape = x0.shape
    k0, k1 = (_u32(k, shape) if isinstance(k, int) else k.expand(shape) for k in key)
    ks = (k0, k1, apply(Op.XOR, apply(Op.XOR, k0, k1), _u32(_PARITY, shape)))
    x0 = apply(Op.ADD, x0, ks[0])
    x1 = apply(Op.ADD, x1, ks[1])
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x0 = apply(Op.ADD, x0, x1)
            x1 = apply(Op.XOR, _rotl(x1, r), x0)
        x0 = apply(Op.ADD, x0, ks[(block + 1) % 3])
        x1 = apply(Op.ADD, apply(Op.ADD, x1, ks[(block + 2) % 3]), _u32(block + 1, shape))
    return x0, x1


def _bits_shape(key: Tensor, *, shape: tuple[int, ...]) -> tuple:
    return dtypes.uint32, tuple(shape)


def _bits_decomposition(key: Tensor, *, shape: tuple[int, ...]) -> Tensor:
    n = math.prod(shape)
    counters = Tensor(g.iota(n, dtypes.uint32))
    words = [key[i].reshape(1) for i in range(3)]
    x0, _ = threefry2x32((words[0], words[1]), counters, words[2].expand((n,)))
    return x0.reshape(shape)


RANDOM_BITS = register(Composite("random_bits", infer=_bits_shape, decompose=_bits_decomposition))


def _key_buffer(generator: Generator | None) -> Tensor:
    """The next call's (key0, key1, counter_high) as a uint32 buffer, not constants: a compiled program reads
    the next key at every call (so each call draws new numbers), instead of the one it was traced with."""
    stream = default_generator if generator is None else generator

    def random_key() -> np.ndarray:  # an exported program takes it as an input of this name
        return np.asarray(stream.next_key(), np.uint32)

    if tracing.active() is None:
        return Tensor.from_numpy(random_key(), dtypes.uint32)
    return live_buffer(np.zeros(3, np.uint32), random_key, dtypes.uint32)  # no key drawn while tracing


def random_bits(shape: tuple[int, ...], generator: Generator | None = None) -> Tensor:
    """uint32 bits for a fresh random call."""
    if math.prod(shape) >= 2**32:
        fail("random", f"at most 2**32 - 1 random numbers per call, asked for shape {shape}", kind=ArgumentError)
    return apply_composite(RANDOM_BITS, _key_buffer(generator), shape=tuple(shape))


# How many random bits a uniform float gets: as many as its significand holds (float64 is limited
# by the 32-bit word), so every value k * 2**-bits is exact and rounding can never reach 1.0.
_UNIFORM_BITS = {dtypes.float16: 11, dtypes.bfloat16: 8, dtypes.float32: 24, dtypes.float64: 32}


def uniform_bits_to_float(bits: Tensor, dtype: dtypes.DType) -> Tensor:
    """The top bits of `bits` as a float in [0, 1), exact in `dtype`."""
    kept = _UNIFORM_BITS[dtype]
    top = apply(Op.DIV, bits, _u32(1 << (32 - kept), bits.shape)) if kept < 32 else bits
    return ew.mul(cast(cast(top, dtypes.int64), dtype), 2.0**-kept)


def _require_float(op: str, dtype: dtypes.DType) -> None:
    if not dtype.is_floating_point:
        fail(op, f"expected a floating point dtype, got {dtype.name} (use randint for integers)", kind=DTypeError)


def rand(shape: tuple[int, ...], dtype: dtypes.DType, generator: Generator | None = None) -> Tensor:
    _require_float("rand", dtype)
    return uniform_bits_to_float(random_bits(shape, generator), dtype)


def randn(shape: tuple[int, ...], dtype: dtypes.DType, generator: Generator | None = None) -> Tensor:
    """Box-Muller on two uniforms (in float32, or float64 for float64); u1 is in (0, 1] so the log is finite."""
    _require_float("randn", dtype)
    n = math.prod(shape)
    u = rand((2, n), dtypes.float64 if dtype is dtypes.float64 else dtypes.float32, generator)
    u1 = ew.sub(1.0, u[0])
    radius = ew.sqrt(ew.mul(ew.log(u1), -2.0))
    normal = ew.mul(radius, ew.cos(ew.mul(u[1], 2 * math.pi)))
    return cast(normal.reshape(shape), dtype)


def randint(low: int, high: int, shape: tuple[int, ...], dtype: dtypes.DType,
            generator: Generator | None = None) -> Tensor:
    span = high - low
    if span <= 0:
        fail("randint", f"expected low < high, got low={low}, high={high}", kind=ArgumentError)
    if span > 2**32:
        fail("randint", f"the range high - low must be at most 2**32, got {span}", kind=ArgumentError)
    bits = random_bits(shape, generator)
    if span < 2**32:
        bits = apply(Op.MOD, bits, _u32(span, bits.shape))
    return cast(ew.add(cast(bits, dtypes.int64), low), dtype)


def bernoulli_mask(shape: tuple[int, ...], p: float) -> Tensor:
    """True with probability 1 - p (the dropout keep mask)."""
    return ew.ge(rand(shape, dtypes.float32), p)
