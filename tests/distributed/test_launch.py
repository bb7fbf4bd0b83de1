"""`tg train --nproc N`: the shipped GPT trained data-parallel on N local processes (torchrun) learns what one
process learns on the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.distributed.launch import without_option

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).parents[2]
SMALL = ["--steps", "4", "--n-layer", "1", "--n-embd", "32", "--block-size", "16", "--eval-every", "4",
         "--eval-batches", "1", "--sample-length", "0"]


def test_without_option() -> None:
    assert without_option(["--steps", "3", "--nproc", "2", "--lr", "1"], "--nproc") == ["--steps", "3", "--lr", "1"]
    assert without_option(["--nproc=2", "--nprocs", "x"], "--nproc") == ["--nprocs", "x"]


def train(tmp_path: Path, name: str, *options: str) -> tuple[str, dict[str, tg.Tensor]]:
    checkpoint = tmp_path / f"{name}.safetensors"
    done = subprocess.run([sys.executable, "-m", "tensorgraphs.cli", "train", *SMALL, *options, "--checkpoint",
                           str(checkpoint)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, tg.load(checkpoint)["model"]


@pytest.mark.slow
def test_tg_train_on_two_processes_learns_what_one_process_learns(tmp_path: Path) -> None:
    output, parallel = train(tmp_path, "parallel", "--nproc", "2", "--batch-size", "4")
    assert "data-parallel on 2 processes: 4 rows each, global batch 8" in output
    _, single = train(tmp_path, "single", "--batch-size", "8")
    for name, value in single.items():
        # AdamW divides by the root of each gradient's second moment: a gradient that is zero in exact arithmetic
        # (attention's key bias) turns float noise into steps of lr, so the bound is loose
        error = np.linalg.norm(parallel[name].numpy() - value.numpy()) / np.linalg.norm(value.numpy())
        assert error < 1e-3, name
