"""tg.nn.functional against torch.nn.functional's public names: every function is exported or a known gap.

A torch function missing here must be listed in NOT_YET with the reason; a name listed there that is
exported, or a torch name neither exported nor listed, fails the test, so the list stays the true set
of gaps. Values and gradients of each function are checked in the test module of its family.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from functional_check import check, normal

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.testing.opinfo import OP_INFOS

# torch's own machinery that torch.nn.functional happens to import, not ops
NOT_OPS = {"Optional", "assert_int_or_pair", "boolean_dispatch", "handle_torch_function", "has_torch_function",
           "has_torch_function_unary", "has_torch_function_variadic"}

_THREE_D = "3-d convolution and pooling are not implemented"
_INDICES = "pooling that returns argmax indices is not implemented"
_UNPOOL = "unpooling scatters by argmax indices, which pooling does not return yet"
_RESAMPLE = "resampling (interpolation, grids) is not implemented"
_RANDOM = "needs a random op not implemented yet"
_LOW_PRECISION = "scaled/grouped low-precision GEMM kernels are not implemented"
NOT_YET = {
    "adaptive_avg_pool3d": _THREE_D,
    "adaptive_max_pool1d_with_indices": _INDICES,
    "adaptive_max_pool2d_with_indices": _INDICES,
    "adaptive_max_pool3d": _THREE_D,
    "adaptive_max_pool3d_with_indices": _INDICES,
    "affine_grid": _RESAMPLE,
    "alpha_dropout": _RANDOM,
    "avg_pool3d": _THREE_D,
    "conv3d": _THREE_D,
    "conv_tbc": "time-batch-channel convolution is not implemented",
    "conv_transpose3d": _THREE_D,
    "ctc_loss": "needs a dynamic-programming scan over time",
    "embedding_bag": "per-bag offsets give data-dependent segments",
    "feature_alpha_dropout": _RANDOM,
    "fractional_max_pool2d": _RANDOM,
    "fractional_max_pool2d_with_indices": _INDICES,
    "fractional_max_pool3d": _THREE_D,
    "fractional_max_pool3d_with_indices": _INDICES,
    "grid_sample": _RESAMPLE,
    "grouped_mm": _LOW_PRECISION,
    "gumbel_softmax": _RANDOM,
    "interpolate": _RESAMPLE,
    "linear_cross_entropy": "the fused linear + cross_entropy is not implemented",
    "lp_pool3d": _THREE_D,
    "max_pool1d_with_indices": _INDICES,
    "max_pool2d_with_indices": _INDICES,
    "max_pool3d": _THREE_D,
    "max_pool3d_with_indices": _INDICES,
    "max_unpool1d": _UNPOOL,
    "max_unpool2d": _UNPOOL,
    "max_unpool3d": _UNPOOL,
    "multi_head_attention_forward": "nn.MultiheadAttention's functional form is not implemented",
    "multilabel_margin_loss": "targets padded with -1 give data-dependent label sets",
    "rrelu": _RANDOM,
    "rrelu_": _RANDOM,
    "scaled_grouped_mm": _LOW_PRECISION,
    "scaled_mm": _LOW_PRECISION,
    "triplet_margin_with_distance_loss": "not implemented yet",
    "upsample": _RESAMPLE,
    "upsample_bilinear": _RESAMPLE,
    "upsample_nearest": _RESAMPLE,
}


def _torch_functions() -> set[str]:
    names = set()
    for name in dir(TF):
        value = getattr(TF, name)
        if not name.startswith("_") and callable(value) and not inspect.isclass(value) and name not in NOT_OPS:
            names.add(name)
    return names


def test_every_torch_function_is_exported_or_listed_as_not_yet() -> None:
    torch_names = _torch_functions()
    missing = {name for name in torch_names if not hasattr(F, name)}
    new_gaps = sorted(missing - set(NOT_YET))
    assert not new_gaps, f"export these or list them in NOT_YET: {new_gaps}"
    stale = set(NOT_YET) - missing
    assert not stale, f"exported (or gone from torch) but still listed in NOT_YET: {sorted(stale)}"


def test_every_exported_name_is_torchs() -> None:
    """tg.nn.functional holds torch's names only (a misspelt export would shadow nothing and help no one)."""
    assert set(F.__all__) <= _torch_functions(), sorted(set(F.__all__) - _torch_functions())
    assert all(hasattr(F, name) for name in F.__all__)


def test_every_op_of_the_op_table_under_a_functional_name_is_exported() -> None:
    """An op the table checks against torch (pad, one_hot, relu, ...) is where PyTorch users look for it."""
    torch_names = _torch_functions()
    covered = {info.name.partition("(")[0] for info in OP_INFOS} & torch_names
    assert covered, "no op of the table has a torch.nn.functional name: the lookup is broken"
    assert not covered - set(F.__all__), sorted(covered - set(F.__all__))


@pytest.mark.parametrize("pad,mode", [((1, 2), "constant"), ((2, 1, 0, 1), "reflect"), ((1, 1, 2, 0), "replicate"),
                                      ((1, 0, 1, 1), "circular")])
def test_pad_matches_torch(pad: tuple, mode: str) -> None:
    check(lambda t: F.pad(t, pad, mode), lambda t: TF.pad(t, pad, mode), [normal(1, 2, 3, 4)], grad=[0], name="pad")


def test_one_hot_matches_torch() -> None:
    labels = np.array([[0, 3], [2, 1]])
    np.testing.assert_array_equal(F.one_hot(tg.tensor(labels), 5).numpy(),
                                  TF.one_hot(torch.tensor(labels), 5).numpy())
