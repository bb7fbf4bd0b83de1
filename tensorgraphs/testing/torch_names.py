"""Run a PyTorch program unmodified on tensorgraphs: inside `torch_names()`, `import torch` and its usual
submodules (`torch.nn`, `torch.nn.functional`, `torch.optim`, `torch.utils.data`, ...) give tensorgraphs' modules
of the same names. The real torch modules, if imported, are put back when the block ends."""

from __future__ import annotations

import contextlib
import importlib
import sys
from typing import Iterator

ALIASES = {
    "torch": "tensorgraphs",
    "torch.nn": "tensorgraphs.nn",
    "torch.nn.functional": "tensorgraphs.nn.functional",
    "torch.nn.init": "tensorgraphs.nn.init",
    "torch.optim": "tensorgraphs.optim",
    "torch.optim.lr_scheduler": "tensorgraphs.optim.lr_scheduler",
    "torch.utils": "tensorgraphs.utils",
    "torch.utils.data": "tensorgraphs.utils.data",
    "torch.cuda": "tensorgraphs.cuda",
}


@contextlib.contextmanager
def torch_names() -> Iterator[None]:
    """`torch.*` imports resolve to tensorgraphs inside the block (module docstring)."""
    saved = {name: sys.modules.get(name) for name in ALIASES}
    try:
        for name, target in ALIASES.items():
            sys.modules[name] = importlib.import_module(target)
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
