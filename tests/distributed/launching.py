"""Process groups for the tests: `launch(scenario, out, world, timeout)` starts one process per rank on localhost
(gloo), each running `workers.py` (itself, or under torchrun), and returns what each wrote, or fails the test
when one outlives the timeout (all are killed then: nothing hangs)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

WORKERS = Path(__file__).with_name("workers.py")
ROOT = Path(__file__).parents[2]


@dataclass
class Rank:
    returncode: int
    output: str  # stdout and stderr
    results: dict[str, np.ndarray] | None  # what it saved, if it finished


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(scenario: str, out: Path, world: int, timeout: float, torchrun: bool = False) -> list[Rank]:
    """With `torchrun`, one `torchrun --standalone` starts the ranks (its exit status and output are every
    rank's); else one process per rank is started here with torch's environment variables."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    script = [str(WORKERS), scenario, str(out)]
    if torchrun:
        commands = [([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
                      *script], env)]
    else:
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)})
        commands = [([sys.executable, *script], {**env, "RANK": str(r)}) for r in range(world)]
    processes = [subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, start_new_session=True) for command, environment in commands]
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for process in processes:
            os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"scenario {scenario!r}: a rank ran longer than {timeout} s (hung?)")
    if torchrun:
        processes, outputs = processes * world, outputs * world
    ranks = []
    for r, (process, output) in enumerate(zip(processes, outputs)):
        saved = out / f"rank{r}.npz"
        ranks.append(Rank(process.returncode, output, dict(np.load(saved)) if saved.exists() else None))
    return ranks
