"""The digits CNN example: its shapes, a short `tg example cnn` run that learns, and the default run above 90%."""

from __future__ import annotations

import math

import pytest

import tensorgraphs as tg
from tensorgraphs.cli import main as tg_main
from tensorgraphs.examples import cnn

CLASSES = 10


def test_network_maps_images_to_one_logit_per_class() -> None:
    tg.manual_seed(0)
    model = cnn.digits_cnn(channels=4)
    assert model(tg.zeros(3, *cnn.IMAGE_SHAPE)).shape == (3, CLASSES)
    assert [type(layer).__name__ for layer in model][:3] == ["Conv2d", "ReLU", "MaxPool2d"]


def test_tg_example_cnn_learns_in_one_epoch(capsys, monkeypatch) -> None:
    results, run = [], cnn.main
    monkeypatch.setattr(cnn, "main", lambda argv: results.append(run(argv)))  # what `tg example` prints, as numbers
    assert tg_main(["example", "cnn", "--epochs", "1", "--device", "numpy", "--seed", "1"]) == 0
    (result,) = results
    assert result["train_loss"] < 0.5 * math.log(CLASSES), result  # cross entropy of a uniform guess: log 10
    assert result["test_accuracy"] > 0.5, result  # chance is 0.1
    assert "CNN with 6,090 parameters on device numpy, 1 epochs" in capsys.readouterr().out


@pytest.mark.slow
def test_default_training_reaches_90_percent() -> None:
    """`python -m tensorgraphs.examples.cnn` with its defaults (about twenty seconds)."""
    assert cnn.main([])["test_accuracy"] > 0.9
