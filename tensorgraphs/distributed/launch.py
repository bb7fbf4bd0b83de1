"""Starting a data-parallel run on this machine: one process per rank under torchrun (`torch.distributed.run`),
which gives each its rank, the world size and the rendezvous address in the environment."""

from __future__ import annotations

import os
import subprocess
import sys


def under_launcher() -> bool:
    """Whether this process is one rank of a run torchrun (or another launcher setting torch's variables) started."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def run_on_processes(nproc: int, module: str, argv: list[str]) -> int:
    """Run `python -m module argv` as `nproc` ranks on this machine (torchrun --standalone: a local rendezvous on
    a free port); returns torchrun's exit status (nonzero when a rank failed)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", module, *argv]
    return subprocess.call(command)


def without_option(argv: list[str], option: str) -> list[str]:
    """`argv` without `option` and its value (`--nproc 2` or `--nproc=2`): the ranks need not see it, and torchrun
    would take an abbreviation of its own options for one."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            kept.append(arg)
    return kept
