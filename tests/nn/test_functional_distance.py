"""normalize, cosine_similarity and pairwise_distance against torch: values and gradients, broadcasting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch.nn.functional as TF
from functional_check import check, normal

import tensorgraphs.nn.functional as F


@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, -1), (3.0, 0), (math.inf, 1)])
def test_normalize_matches_torch(p: float, dim: int) -> None:
    check(lambda t: F.normalize(t, p, dim), lambda t: TF.normalize(t, p, dim), [normal(1, 3, 4, 2)], grad=[0],
          rtol=1e-5, atol=1e-6, name="normalize")


def test_normalize_keeps_a_zero_vector_at_zero_as_torch() -> None:
    x = np.zeros((2, 3), np.float32)
    x[1] = [1.0, 2.0, 2.0]
    check(F.normalize, TF.normalize, [x], name="normalize zeros")


@pytest.mark.parametrize("shapes,dim", [(((4, 5), (4, 5)), 1), (((2, 3, 5), (3, 5)), -1), (((3, 1), (1, 4)), 0)])
def test_cosine_similarity_matches_torch(shapes: tuple, dim: int) -> None:
    inputs = [normal(2, *shapes[0]), normal(3, *shapes[1])]
    check(lambda a, b: F.cosine_similarity(a, b, dim), lambda a, b: TF.cosine_similarity(a, b, dim), inputs,
          grad=[0, 1], rtol=1e-5, atol=1e-6, name="cosine_similarity")


@pytest.mark.parametrize("shapes", [((4, 5), (4, 5)), ((2, 3, 5), (3, 5)), ((5,), (5,))])
@pytest.mark.parametrize("p,keepdim", [(2.0, False), (1.0, True), (3.0, False)])
def test_pairwise_distance_matches_torch(shapes: tuple, p: float, keepdim: bool) -> None:
    inputs = [normal(4, *shapes[0]), normal(5, *shapes[1])]
    check(lambda a, b: F.pairwise_distance(a, b, p, keepdim=keepdim),
          lambda a, b: TF.pairwise_distance(a, b, p, keepdim=keepdim), inputs, grad=[0, 1], rtol=1e-5, atol=1e-5,
          name="pairwise_distance")


@pytest.mark.parametrize("shape", [(5, 3), (2, 4), (1, 3)])
@pytest.mark.parametrize("p", [2.0, 1.0, math.inf])
def test_pdist_matches_torch(shape: tuple, p: float) -> None:
    check(lambda t: F.pdist(t, p), lambda t: TF.pdist(t, p), [normal(6, *shape)], grad=[0], rtol=1e-5, atol=1e-6,
          name="pdist")
