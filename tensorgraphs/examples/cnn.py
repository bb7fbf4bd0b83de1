"""Classify scikit-learn's bundled digits, as 1x8x8 images, with a small convolutional network.

Two convolution blocks (Conv2d, ReLU, MaxPool2d) take an 8x8 digit to 32 channels of 2x2, and a linear layer
maps them to ten logits. Data, training loop and settings are the MLP example's
(`tensorgraphs.examples.digits_mlp`). Run with `python -m tensorgraphs.examples.cnn` or `tg example cnn`;
`--help` lists the settings.
"""

from __future__ import annotations

from tensorgraphs import nn
from tensorgraphs.examples.digits_mlp import parse_args, run_example

IMAGE_SHAPE = (1, 8, 8)


def digits_cnn(channels: int = 16) -> nn.Module:
    """1x8x8 -> channels x 4x4 -> 2*channels x 2x2 -> 10 logits."""
    return nn.Sequential(
        nn.Conv2d(1, channels, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * channels * 2 * 2, 10))


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv, "tg example cnn", __doc__.splitlines()[0], lr=1e-2)
    return run_example(digits_cnn, IMAGE_SHAPE, args, "CNN")


if __name__ == "__main__":
    main()
