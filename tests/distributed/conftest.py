"""The `run_ranks` fixture: a scenario of `workers.py` on a process group of localhost processes."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

pytest.importorskip("torch.distributed")

from launching import Rank, launch  # noqa: E402


@pytest.fixture
def run_ranks(tmp_path: Path) -> Callable[..., list[Rank]]:
    """`run_ranks(scenario, world=2, timeout=90, check=True)`: each rank's result; with `check`, every rank must
    succeed."""

    def run(scenario: str, world: int = 2, timeout: float = 90, check: bool = True) -> list[Rank]:
        out = tmp_path / scenario
        out.mkdir()
        ranks = launch(scenario, out, world, timeout)
        for r, rank in enumerate(ranks):
            if check and rank.returncode != 0:
                pytest.fail(f"scenario {scenario!r}: rank {r} exited with {rank.returncode}:\n{rank.output[-3000:]}")
        return ranks

    return run
