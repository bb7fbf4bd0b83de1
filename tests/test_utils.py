"""torch's module paths: tg.utils.data is tg.data."""

from __future__ import annotations

import tensorgraphs as tg


def test_utils_data_is_the_data_module() -> None:
    import tensorgraphs.utils.data as utils_data
    from tensorgraphs.utils.data import DataLoader, TensorDataset

    assert utils_data is tg.data and tg.utils.data is tg.data
    assert DataLoader is tg.data.DataLoader and TensorDataset is tg.data.TensorDataset
