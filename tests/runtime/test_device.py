"""tg.device: a value like torch.device (type, index, str, ==) that is also the device-scoping context manager."""

from __future__ import annotations

import pickle

import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.errors import ArgumentError, UnsupportedError


@pytest.mark.parametrize("spec", ["cpu", "cuda:1", ("cuda", 0), "numpy"])
def test_device_value_matches_torch(spec: str | tuple) -> None:
    args = spec if isinstance(spec, tuple) else (spec,)
    mine = tg.device(*args)
    expected = torch.device(*(["cpu"] if args[0] == "numpy" else args))
    if args[0] != "numpy":
        assert (repr(mine), str(mine), mine.type, mine.index) == (repr(expected), str(expected), expected.type,
                                                                   expected.index)
    assert mine == tg.device(str(mine)) and hash(mine) == hash(tg.device(str(mine)))
    assert mine != str(mine)  # as torch: a device is not equal to its string
    assert pickle.loads(pickle.dumps(mine)) == mine


def test_device_is_a_context_manager_that_restores_the_previous_device() -> None:
    outside = tg.default_device()
    numpy_device = tg.device("numpy")
    with numpy_device as entered:
        assert entered is numpy_device and tg.default_device() == "numpy"
        with tg.device("cpu"):
            assert tg.default_device() == "cpu"
            with numpy_device:  # the same object entered twice
                assert tg.default_device() == "numpy"
            assert tg.default_device() == "cpu"
        assert tg.ones(2).device == numpy_device
    assert tg.default_device() == outside


def test_unknown_and_missing_devices_fail_clearly() -> None:
    with pytest.raises(ArgumentError, match="unknown device 'gpu'.*test_device.py"):
        tg.device("gpu")
    with pytest.raises(ArgumentError, match="invalid device string"):
        tg.device("cpu:first")
    outside = tg.default_device()
    with pytest.raises(UnsupportedError, match="no 'cuda' device.*is_available"):
        with tg.device("cuda"):
            pass
    assert tg.default_device() == outside
    assert not tg.cuda.is_available() and tg.cuda.device_count() == 0
