"""Suite-wide fixtures: the device a test exercises (the `device` marker), kernel caches isolated from a test
that breaks a renderer, counting spies (speed guards count work, never seconds) and a compiled training step.

The suite runs with a cache directory of its own (unless TG_CACHE_DIR names one): the user's kernel database
holds their `tg tune` measurements, which would change what the planner chooses and so what tests observe."""

from __future__ import annotations

import functools
import os
from collections import Counter, OrderedDict
from typing import Any, Callable

import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.kerneldb.db import cache_dir
from tensorgraphs.runtime import realize

if not os.environ.get("TG_CACHE_DIR"):
    os.environ["TG_CACHE_DIR"] = str(cache_dir().with_name(cache_dir().name + "-tests"))
DEVICE_MARKER_OPTIONS = {"compile"}


@pytest.fixture(autouse=True)
def device_under_test(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The device named by the test's `@pytest.mark.device(name, compile=...)`, or None without one.

    `compile=True` makes the device compile every graph, however small: the cpu device otherwise interprets graphs
    touching fewer than `interpret_below` elements, so a test of generated C on small inputs would check the
    interpreter instead.
    """
    marker = request.node.get_closest_marker("device")
    return None if marker is None else apply_device_marker(marker, monkeypatch)


def apply_device_marker(marker: pytest.Mark, monkeypatch: pytest.MonkeyPatch) -> str:
    """Checks a `device` marker (a misspelt option must not silently leave graphs interpreted) and applies it."""
    (name,) = marker.args
    unknown = set(marker.kwargs) - DEVICE_MARKER_OPTIONS
    if name not in realize.BACKENDS or unknown:
        raise pytest.UsageError(f"the device marker takes one of {sorted(realize.BACKENDS)} and only the options "
                                f"{sorted(DEVICE_MARKER_OPTIONS)}: {marker}")
    if marker.kwargs.get("compile"):
        backend = realize.BACKENDS[name]
        if not hasattr(backend, "interpret_below"):
            raise pytest.UsageError(f"the {name} device has no interpreter to bypass: {marker}")
        monkeypatch.setattr(backend, "interpret_below", 0)
    return name


@pytest.fixture
def isolated_kernels(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Fresh process-wide caches of compiled programs and of prepared executables (which hold their programs),
    and every graph compiled: programs built while a test breaks a renderer never reach other tests. Returns the
    function that empties the caches again (after the renderer is repaired)."""

    def isolate() -> None:
        monkeypatch.setattr(CPU, "_programs", OrderedDict())
        monkeypatch.setattr(realize, "_executables", OrderedDict())
        monkeypatch.setattr(CPU, "interpret_below", 0)

    isolate()
    return isolate


CallCounter = Callable[..., Counter]


@pytest.fixture
def count_calls(monkeypatch: pytest.MonkeyPatch) -> CallCounter:
    """`count_calls(owner, "name", ...)` wraps those functions of `owner` (a class, object or module) for the test
    and returns the test's one Counter of calls by function name."""
    calls: Counter = Counter()

    def spy(owner: object, *names: str) -> Counter:
        for name in names:
            original = getattr(owner, name)

            @functools.wraps(original)
            def counting(*args: Any, _original: Callable = original, _name: str = name, **kwargs: Any) -> Any:
                calls[_name] += 1
                return _original(*args, **kwargs)

            monkeypatch.setattr(owner, name, counting)
        return calls

    return spy


def _compiled_classifier_step(model: tg.nn.Module, optimizer: tg.optim.Optimizer) -> tg.CompiledFunction:
    @tg.compile
    def step(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


@pytest.fixture
def compiled_step() -> Callable[[tg.nn.Module, tg.optim.Optimizer], tg.CompiledFunction]:
    """Builds one classification training step (zero_grad, cross entropy, backward, optimizer step) of a model and
    its optimizer, compiled whole by `tg.compile`."""
    return _compiled_classifier_step
