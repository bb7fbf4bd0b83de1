"""Shared settings for the example tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def torch_single_thread() -> Iterator[None]:
    """PyTorch references run on one thread: beside a second pytest worker on two cores, two threads each made a
    small training step about five times slower (threads spinning while they wait for a core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
