"""Structural hash: equal computations on different buffers share a key; any structural change breaks it."""

from __future__ import annotations

import math

import numpy as np

import tensorgraphs as tg
from tensorgraphs.graph.node import toposort
from tensorgraphs.rewrite import node_digest, optimize, structural_hash

rng = np.random.default_rng(0)
D = 8


def weights(seed: int) -> dict[str, tg.Tensor]:
    r = np.random.default_rng(seed)
    make = lambda *shape: tg.tensor(r.standard_normal(shape, dtype=np.float32))
    return {"wq": make(D, D), "wk": make(D, D), "wv": make(D, D), "w1": make(D, 4 * D), "w2": make(4 * D, D),
            "gain": make(D)}


def block(x: tg.Tensor, w: dict[str, tg.Tensor], activation=tg.erf) -> tg.Tensor:
    centered = x - x.mean(-1, keepdim=True)
    h = centered * ((centered * centered).mean(-1, keepdim=True) + 1e-5).rsqrt() * w["gain"]
    scores = (h @ w["wq"]) @ (h @ w["wk"]).T * (1 / math.sqrt(D))
    e = (scores - scores.amax(-1, keepdim=True)).exp()
    x = x + (e / e.sum(-1, keepdim=True)) @ (h @ w["wv"])
    return x + activation(x @ w["w1"]) @ w["w2"]


def test_identical_blocks_with_different_weights_share_one_key() -> None:
    x1 = tg.tensor(rng.standard_normal((4, D), dtype=np.float32))
    x2 = tg.tensor(rng.standard_normal((4, D), dtype=np.float32))
    first, second = block(x1, weights(1)), block(x2, weights(2))
    assert first.node is not second.node
    assert structural_hash(first.node) == structural_hash(second.node)
    assert node_digest(first.node) == node_digest(second.node)


def test_stacked_layers_share_a_key_after_rewriting() -> None:
    x = tg.tensor(rng.standard_normal((4, D), dtype=np.float32))
    layer1 = block(x, weights(1))
    layer2 = block(tg.tensor(layer1.numpy()), weights(2))  # its input is a buffer, as the first layer's
    assert structural_hash(optimize([layer1.node])) == structural_hash(optimize([layer2.node]))


def test_a_block_differing_in_one_op_gets_another_key() -> None:
    x = tg.tensor(rng.standard_normal((4, D), dtype=np.float32))
    w = weights(1)
    assert structural_hash(block(x, w).node) != structural_hash(block(x, w, activation=tg.sigmoid).node)


def test_how_inputs_are_shared_is_part_of_the_key() -> None:
    a, b = (tg.tensor(rng.standard_normal(3, dtype=np.float32)) for _ in range(2))
    assert structural_hash((a * a).node) != structural_hash((a * b).node)
    assert structural_hash((a * b).node) == structural_hash((b * a).node)  # positions, not identities
    assert node_digest((a * a).node) == node_digest((a * b).node)  # the anonymous digest does not see sharing


def test_dtype_shape_and_constants_are_part_of_the_key() -> None:
    a = tg.tensor(np.ones(3, np.float32))
    keys = {structural_hash(n) for n in ((a + 1).node, (a + 2).node, (a.double() + 1).node,
                                          (tg.tensor(np.ones(4, np.float32)) + 1).node)}
    assert len(keys) == 4


def test_key_is_stable_text() -> None:
    a = tg.tensor(np.ones(3, np.float32))
    key = structural_hash((a * 2).node)
    assert isinstance(key, str) and len(key) == 32 and key == structural_hash([(a * 2).node])


def test_operand_order_is_the_same_at_every_size() -> None:
    """The canonical form of a graph traced at another row count differs only in sizes (one program template)."""
    w = weights(2)

    def wiring(rows: int) -> list[tuple[str, tuple[int, ...]]]:
        x = tg.tensor(rng.standard_normal((rows, D), dtype=np.float32))
        (root,) = optimize([block(x, w).node])
        order = toposort([root])
        index = {n: i for i, n in enumerate(order)}
        return [(n.op.name, tuple(index[s] for s in n.src)) for n in order]

    assert wiring(5) == wiring(7) == wiring(16)
