"""The runtime seam: device buffers, and what crosses between them and the host.

Realization (`runtime.realize`) talks to every backend in host numpy arrays: `Backend.evaluate` and a prepared
`Executable` take the inputs' arrays and return the roots' values. Inside, a compiled backend works in device
buffers: its program binds one buffer per slot of the generated entry point (inputs moved to the device,
outputs allocated there, temporaries views of one arena on the device) and launches a loaded library over them.
A `DeviceRuntime` is that backend's memory and launch: only `to_device` and `to_host` cross the boundary. A GPU
runtime would allocate with its driver and copy; the host runtime (`runtime.host`) of the cpu and portable
devices runs on the process's memory, so its buffers are numpy arrays and crossing copies nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

DeviceBuffer = Any
"""One array in a device's memory (the host runtime's: a numpy array)."""


class DeviceArena(Protocol):
    """One allocation holding a program's temporaries at the offsets its memory plan gives."""

    def view(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> DeviceBuffer: ...

    def poison(self) -> None: ...


class DeviceRuntime(Protocol):
    """Memory and launches of one device (see the module docstring)."""

    def to_device(self, array: np.ndarray, dtype: np.dtype) -> DeviceBuffer:
        """`array` as a contiguous buffer of `dtype` on the device."""
        ...

    def to_host(self, buffer: DeviceBuffer) -> np.ndarray:
        """The buffer's values as a host array the caller may keep."""
        ...

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> DeviceBuffer:
        """An uninitialized buffer (a program's output)."""
        ...

    def outputs(self, specs: Sequence[tuple[tuple[int, ...], np.dtype]]) -> list[DeviceBuffer]:
        """Uninitialized buffers of one run's outputs, by (shape, dtype) (a runtime may place them together)."""
        ...

    def arena(self, nbytes: int) -> DeviceArena: ...

    def launch(self, entry: Callable[..., int], buffers: Sequence[DeviceBuffer], *args: Any) -> int:
        """`entry(buffers, *args)` of a loaded program; its status (0: success)."""
        ...

    def launch_again(self, entry: Callable[..., int], changed: Mapping[int, DeviceBuffer], *args: Any) -> int:
        """`entry` over the buffers its last `launch` passed, but for the `changed` ones (slot -> buffer), which the
        caller knows to be the same and alive; its status."""
        ...
