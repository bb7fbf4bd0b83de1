"""The `run_ranks` fixture: a scenario of `workers.py` on a process group of localhost processes."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

pytest.importorskip("torch.distributed")

from launching import Rank, free_port, launch  # noqa: E402


@pytest.fixture(scope="session")
def group_results(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[dict]]:
    """`group_results(part)`: each rank's results of that part of workers.py's "everything" scenario, run once
    under torchrun (a tg script launched as torch's are)."""
    out = tmp_path_factory.mktemp("everything")
    ranks = launch("everything", out, 2, timeout=180, torchrun=True)
    if any(rank.returncode != 0 or rank.results is None for rank in ranks):
        pytest.fail(f"the 'everything' scenario failed:\n{ranks[0].output[-4000:]}")

    def part(name: str) -> list[dict]:
        return [{key.partition(":")[2]: value for key, value in rank.results.items()
                 if key.startswith(name + ":")} for rank in ranks]

    return part


@pytest.fixture
def run_ranks(tmp_path: Path) -> Callable[..., list[Rank]]:
    """`run_ranks(scenario, world=2, timeout=90, check=True, torchrun=False)`: each rank's result (see `launch`);
    with `check`, every rank must succeed."""

    def run(scenario: str, world: int = 2, timeout: float = 90, check: bool = True,
            torchrun: bool = False) -> list[Rank]:
        out = tmp_path / scenario
        out.mkdir()
        ranks = launch(scenario, out, world, timeout, torchrun)
        for r, rank in enumerate(ranks):
            if check and rank.returncode != 0:
                pytest.fail(f"scenario {scenario!r}: rank {r} exited with {rank.returncode}:\n{rank.output[-3000:]}")
        return ranks

    return run


@pytest.fixture
def one_process_group() -> Iterator[None]:
    """A process group of this process alone (world size 1), destroyed after the test."""
    import tensorgraphs as tg

    tg.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", world_size=1, rank=0)
    try:
        yield
    finally:
        tg.distributed.destroy_process_group()
