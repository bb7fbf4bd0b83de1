"""torch.utils's module paths: `tg.utils.data` is `tg.data` (the same module), so
`from tensorgraphs.utils.data import DataLoader` works as `from torch.utils.data import DataLoader` does."""

import sys

from tensorgraphs import data

sys.modules[f"{__name__}.data"] = data

__all__ = ["data"]
