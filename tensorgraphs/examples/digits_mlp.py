"""Classify scikit-learn's bundled 8x8 handwritten digits with a small MLP.

The images come from `sklearn.datasets.load_digits` (1,797 of them, ten classes, pixels 0-16; install
scikit-learn with `pip install 'tensorgraphs[examples]'`) and are split into train and test sets by a seeded
permutation. Training is the PyTorch loop written against tg's names: `tg.data.DataLoader` batches, cross
entropy, `loss.backward()`, `tg.optim.Adam`. Test accuracy is printed after every epoch. Run with
`python -m tensorgraphs.examples.digits_mlp` or `tg example digits`; `--help` lists the settings.
The CNN example (`tensorgraphs.examples.cnn`) shares this file's data, training loop and settings.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs import nn
from tensorgraphs.data import DataLoader, TensorDataset
from tensorgraphs.examples.gpt import Progress

TEST_FRACTION = 0.2
# The C "cpu" device is faster per step but spends seconds compiling, more than these few hundred small steps win
# back (bench/NOTES.md).
DEFAULT_DEVICE = "planned"


def digits_mlp(hidden: int = 128) -> nn.Module:
    """64 pixels -> hidden -> 10 logits."""
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def load_digits_split(seed: int, image_shape: Sequence[int] = (64,)) -> tuple[TensorDataset, TensorDataset]:
    """(train, test) datasets of float32 images scaled to [0, 1] with the given per-image shape, and int64 labels.

    The split is a permutation drawn from `seed`, so a run is reproducible and every class appears in both sets.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise SystemExit("this example needs scikit-learn: pip install 'tensorgraphs[examples]'") from error
    digits = load_digits()
    images = (digits.data / 16.0).astype(np.float32).reshape(-1, *image_shape)
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    test, train = np.split(order, [int(TEST_FRACTION * len(labels))])
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


def accuracy(model: nn.Module, dataset: TensorDataset) -> float:
    """Fraction of the dataset's images whose largest logit is the label (the whole set as one batch)."""
    images, labels = dataset.tensors
    model.eval()
    with tg.no_grad():
        predictions = model(tg.from_numpy(images)).argmax(dim=1).numpy()
    model.train()
    return float(np.mean(predictions == labels))


def train(model: nn.Module, train_set: TensorDataset, test_set: TensorDataset,
          args: argparse.Namespace) -> dict[str, float]:
    """`args.epochs` passes over shuffled full batches (every step has one shape) with a progress bar; returns the
    last training loss, the final test accuracy and the wall time per step (the per-epoch evaluations included)."""
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True, generator=args.seed)
    optimizer = tg.optim.Adam(model.parameters(), lr=args.lr)
    result = {"train_loss": math.nan, "test_accuracy": math.nan, "seconds_per_step": math.nan}
    progress = Progress(0, args.epochs * len(loader), args.batch_size, unit="img")
    began, step = time.perf_counter(), 0
    for epoch in range(args.epochs):
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            result["train_loss"] = loss.item()
            progress.update(step, result["train_loss"])
            step += 1
        result["test_accuracy"] = accuracy(model, test_set)
        progress.write(f"epoch {epoch + 1}: train loss {result['train_loss']:.4f}, "
                       f"test accuracy {result['test_accuracy']:.1%}")
    progress.close()
    if step:
        result["seconds_per_step"] = (time.perf_counter() - began) / step
    return result


def parse_args(argv: list[str] | None, prog: str, description: str, lr: float) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=lr, help=f"Adam learning rate (default {lr})")
    parser.add_argument("--device", default=DEFAULT_DEVICE, help=f"tg device to run on (default {DEFAULT_DEVICE})")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights, the split and the batch order")
    return parser.parse_args(argv)


def run_example(make_model: Callable[[], nn.Module], image_shape: Sequence[int], args: argparse.Namespace,
                name: str) -> dict[str, float]:
    """Build the model from `args.seed`, train it on the digits on `args.device` and report; the examples' main."""
    train_set, test_set = load_digits_split(args.seed, image_shape)
    tg.manual_seed(args.seed)
    model = make_model()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"digits: {len(train_set)} train / {len(test_set)} test images; {name} with {n_params:,} parameters "
          f"on device {args.device}, {args.epochs} epochs of batch {args.batch_size}")
    with tg.device(args.device):
        result = train(model, train_set, test_set, args)
    print(f"test accuracy {result['test_accuracy']:.1%} ({result['seconds_per_step'] * 1e3:.0f} ms/step)")
    return result


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv, "tg example digits", __doc__.splitlines()[0], lr=1e-2)
    return run_example(digits_mlp, (64,), args, "MLP")


if __name__ == "__main__":
    main()
