"""The digits MLP example: its train/test split, a short run that learns, and the default run above 90%."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from tensorgraphs.examples import digits_mlp

CLASSES = 10


def test_split_is_disjoint_seeded_and_covers_every_class() -> None:
    train, test = digits_mlp.load_digits_split(seed=0, image_shape=(1, 8, 8))
    (train_images, train_labels), (test_images, test_labels) = train.tensors, test.tensors
    assert train_images.shape[1:] == test_images.shape[1:] == (1, 8, 8) and train_images.dtype == np.float32
    assert test_labels.dtype == np.int64 and len(test) == int(digits_mlp.TEST_FRACTION * (len(train) + len(test)))
    assert 0.0 <= train_images.min() and train_images.max() == 1.0
    assert set(train_labels) == set(test_labels) == set(range(CLASSES))
    train_rows = {image.tobytes() for image in train_images}
    assert sum(image.tobytes() in train_rows for image in test_images) < 0.05 * len(test)  # only true duplicates
    again, other = digits_mlp.load_digits_split(seed=0)[1], digits_mlp.load_digits_split(seed=1)[1]
    np.testing.assert_array_equal(again.tensors[1], test_labels)
    assert not np.array_equal(other.tensors[1], test_labels)


def test_without_scikit_learn_the_example_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(SystemExit, match=r"pip install 'tensorgraphs\[examples\]'"):
        digits_mlp.load_digits_split(seed=0)


def test_one_epoch_learns_far_above_chance(capsys) -> None:
    result = digits_mlp.main(["--epochs", "1", "--device", "numpy"])
    assert result["train_loss"] < 0.5 * math.log(CLASSES), result  # cross entropy of a uniform guess: log 10
    assert result["test_accuracy"] > 0.7, result  # chance is 0.1
    output = capsys.readouterr().out
    assert "MLP with 9,610 parameters" in output and "epoch 1: train loss" in output and "test accuracy" in output


@pytest.mark.slow
def test_default_training_reaches_90_percent() -> None:
    """`python -m tensorgraphs.examples.digits_mlp` with its defaults (about ten seconds)."""
    assert digits_mlp.main([])["test_accuracy"] > 0.9
