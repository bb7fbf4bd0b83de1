"""The counter-based RNG: Threefry known answers, the documented stream, reproducibility, distributions."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs import dtypes
from tensorgraphs.backends.numpy_backend import REFERENCE, NumpyBackend
from tensorgraphs.frontend import random as rng
from tensorgraphs.frontend.tensor import Tensor

MASK = 0xFFFFFFFF

# Known-answer vectors of Threefry-2x32-20 from Random123's kat_vectors: (key, counter, expected output).
THREEFRY_KAT = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


def _u32(values: list[int]) -> Tensor:
    return Tensor.from_numpy(np.array(values, dtype=np.uint32), dtypes.uint32)


def threefry_python(key: tuple[int, int], counter: tuple[int, int]) -> tuple[int, int]:
    """Threefry-2x32-20 on Python ints, written from the paper: the oracle for the stream's definition."""
    rotations = (13, 15, 26, 6, 17, 29, 16, 24)
    schedule = (key[0], key[1], key[0] ^ key[1] ^ 0x1BD11BDA)
    x0, x1 = (counter[0] + schedule[0]) & MASK, (counter[1] + schedule[1]) & MASK
    for round_index in range(20):
        x0 = (x0 + x1) & MASK
        r = rotations[round_index % 8]
        x1 = (((x1 << r) | (x1 >> (32 - r))) & MASK) ^ x0
        if round_index % 4 == 3:
            injection = round_index // 4 + 1
            x0 = (x0 + schedule[injection % 3]) & MASK
            x1 = (x1 + schedule[(injection + 1) % 3] + injection) & MASK
    return x0, x1


@pytest.mark.parametrize("key, counter, expected", THREEFRY_KAT)
def test_threefry_known_answers(key: tuple[int, int], counter: tuple[int, int], expected: tuple[int, int]) -> None:
    x0, x1 = rng.threefry2x32(key, _u32([counter[0]]), _u32([counter[1]]))
    got = (int(x0.numpy()[0]), int(x1.numpy()[0]))
    assert got == expected, f"threefry2x32{key, counter}: {[hex(v) for v in got]}"
    assert threefry_python(key, counter) == expected


def test_threefry_is_elementwise_over_many_counters() -> None:
    gen = np.random.default_rng(5)
    key = (int(gen.integers(0, 2**32)), int(gen.integers(0, 2**32)))
    counters = gen.integers(0, 2**32, size=(2, 16), dtype=np.uint64)
    x0, x1 = rng.threefry2x32(key, _u32(counters[0].tolist()), _u32(counters[1].tolist()))
    expected = [threefry_python(key, (int(c0), int(c1))) for c0, c1 in counters.T]
    assert list(zip(x0.numpy().tolist(), x1.numpy().tolist())) == expected


@pytest.mark.parametrize("seed", [0, 1234, 2**40 + 7])
def test_random_bits_follow_the_documented_stream(seed: int) -> None:
    """Element i of call k after manual_seed(s): word 0 of Threefry, key (s mod 2^32, k), counter (i, s >> 32)."""
    tg.manual_seed(seed)
    first = rng.random_bits((2, 3)).numpy()
    second = rng.random_bits((5,)).numpy()
    for call, bits in enumerate((first, second)):
        expected = [threefry_python((seed & MASK, call), (i, seed >> 32))[0] for i in range(bits.size)]
        assert bits.reshape(-1).tolist() == expected, f"call {call} after manual_seed({seed})"


def test_manual_seed_reproduces_the_stream() -> None:
    def draw() -> list[np.ndarray]:
        return [tg.rand(4, 3).numpy(), tg.randn(7).numpy(), tg.randint(0, 100, (5,)).numpy()]

    tg.manual_seed(42)
    first = draw()
    tg.manual_seed(42)
    again = draw()
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_calls_and_seeds_give_different_streams() -> None:
    tg.manual_seed(0)
    a, b = tg.rand(64).numpy(), tg.rand(64).numpy()
    tg.manual_seed(1)
    c = tg.rand(64).numpy()
    tg.manual_seed(2**32)  # same low word as seed 0: the high word must still change the stream
    d = tg.rand(64).numpy()
    tg.manual_seed(0)
    e = tg.rand(64).numpy()
    streams = [a, b, c, d]
    for i in range(len(streams)):
        for j in range(i + 1, len(streams)):
            assert not np.array_equal(streams[i], streams[j]), (i, j)
    np.testing.assert_array_equal(a, e)


def test_float64_reference_backend_gives_the_same_numbers() -> None:
    tg.manual_seed(3)
    nodes = [tg.rand(50).node, tg.randint(-5, 5, (50,)).node]
    for node, value, exact in zip(nodes, REFERENCE.evaluate(nodes), NumpyBackend(float64=True).evaluate(nodes)):
        np.testing.assert_array_equal(value, exact, err_msg=f"{node.dtype}")


@pytest.mark.parametrize("dtype", [tg.float16, tg.bfloat16, tg.float32, tg.float64])
def test_rand_is_in_unit_interval(dtype: dtypes.DType) -> None:
    tg.manual_seed(7)
    x = tg.rand(20000, dtype=dtype)
    assert x.dtype is dtype
    values = x.numpy().astype(np.float64)
    assert values.min() >= 0.0 and values.max() < 1.0, (dtype, values.min(), values.max())
    assert abs(values.mean() - 0.5) < 6 * math.sqrt(1 / 12 / values.size) + 2.0 ** -rng._UNIFORM_BITS[dtype]
    assert len(np.unique(values)) > min(20000, 2 ** rng._UNIFORM_BITS[dtype]) // 4


def test_randn_mean_and_std() -> None:
    tg.manual_seed(11)
    n = 200_000
    values = tg.randn(n).numpy().astype(np.float64)
    # 6-sigma bounds: the standard error of the mean is 1/sqrt(n), of the variance sqrt(2/n)
    assert abs(values.mean()) < 6 / math.sqrt(n)
    assert abs(values.var() - 1.0) < 6 * math.sqrt(2 / n)
    assert abs(np.mean(np.abs(values) < 1.0) - 0.682689) < 6 * math.sqrt(0.25 / n)
    assert np.isfinite(values).all()


def test_randn_float64_has_float64_precision() -> None:
    tg.manual_seed(12)
    values = tg.randn(1000, dtype=tg.float64).numpy()
    assert values.dtype == np.float64
    assert not np.array_equal(values, values.astype(np.float32).astype(np.float64))


@pytest.mark.parametrize("low, high", [(0, 10), (-3, 4), (5, 6), (-(2**31), 2**31)])
def test_randint_range_and_uniformity(low: int, high: int) -> None:
    tg.manual_seed(13)
    n = 70_000
    values = tg.randint(low, high, (n,)).numpy()
    assert values.dtype == np.int64
    assert values.min() >= low and values.max() < high
    span = high - low
    if span <= 16:
        counts = np.bincount(values - low, minlength=span)
        expected = n / span
        chi_square = float(((counts - expected) ** 2 / expected).sum())
        # far above the 99.99th percentile of chi-square with at most 15 degrees of freedom (about 44)
        assert chi_square < 60, (low, high, counts)
    else:
        assert values.min() < low + span // 100 and values.max() > high - span // 100


def test_randint_with_only_high_and_dtype() -> None:
    tg.manual_seed(14)
    values = tg.randint(3, (1000,), dtype=tg.int32)
    assert values.dtype is tg.int32
    assert set(values.numpy().tolist()) == {0, 1, 2}


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3), (), (1,), (3, 1, 2)])
def test_shapes_including_size_zero(shape: tuple[int, ...]) -> None:
    for name, make in {"rand": lambda: tg.rand(shape), "randn": lambda: tg.randn(shape),
                       "randint": lambda: tg.randint(0, 3, shape)}.items():
        out = make()
        assert out.shape == shape, name
        assert out.numpy().shape == shape, name


def test_invalid_arguments() -> None:
    with pytest.raises(tg.ArgumentError, match="low < high"):
        tg.randint(5, 5, (2,))
    with pytest.raises(tg.ArgumentError, match="2\\*\\*32"):
        tg.randint(0, 2**33, (2,))
    with pytest.raises(tg.DTypeError, match="floating point"):
        tg.rand(3, dtype=tg.int64)
    with pytest.raises(tg.DTypeError, match="floating point"):
        tg.randn(3, dtype=tg.int32)


def test_the_stream_is_shared_by_threads_like_torch() -> None:
    tg.manual_seed(21)
    expected = [tg.rand(8).numpy(), tg.rand(8).numpy()]
    tg.manual_seed(21)
    drawn: list[np.ndarray] = [tg.rand(8).numpy()]
    worker = threading.Thread(target=lambda: drawn.append(tg.rand(8).numpy()))
    worker.start()
    worker.join()
    for got, want in zip(drawn, expected):
        np.testing.assert_array_equal(got, want)


def test_a_rejected_call_does_not_advance_the_stream() -> None:
    tg.manual_seed(22)
    expected = tg.rand(4).numpy()
    tg.manual_seed(22)
    with pytest.raises(tg.ArgumentError):
        rng.random_bits((2**16, 2**16))
    np.testing.assert_array_equal(tg.rand(4).numpy(), expected)


def test_manual_seed_returns_the_default_generator_and_generators_have_their_own_stream() -> None:
    generator = tg.manual_seed(5)
    assert generator is tg.default_generator and generator.initial_seed() == 5 == tg.initial_seed()
    first = tg.rand(4).numpy()
    own = tg.Generator().manual_seed(5)
    np.testing.assert_array_equal(tg.rand(4, generator=own).numpy(), first)  # same seed, same stream
    np.testing.assert_array_equal(tg.randint(0, 9, (3,), generator=tg.Generator().manual_seed(5)).numpy(),
                                  tg.randint(0, 9, (3,), generator=tg.Generator().manual_seed(5)).numpy())
    assert not np.array_equal(tg.rand(4).numpy(), first)  # the default stream went on
