"""`tg.profile()` and TG_PROFILE=1: per-kernel time, share, throughput against the roofline, Chrome trace."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.runtime.realize import default_device
from tensorgraphs.schedule.extern import gemm_enabled


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))


def _inputs() -> tuple[tg.Tensor, tg.Tensor]:
    rng = np.random.default_rng(0)
    return tuple(tg.tensor(rng.standard_normal(s), dtype=tg.float32) for s in [(64, 32), (32, 48)])


def _model_step() -> np.ndarray:
    x, w = _inputs()
    return (x @ w).softmax(-1).sum().numpy()


@tg.compile
def _compiled_step(x: tg.Tensor, w: tg.Tensor) -> tg.Tensor:
    return (x @ w).softmax(-1).sum()


@pytest.mark.skipif(not gemm_enabled(), reason="the product is a GEMM library call only where the library runs")
@pytest.mark.long
def test_profile_reports_the_kernels_of_the_device_that_runs(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    outside = default_device()
    x, w = _inputs()
    _compiled_step(x, w)  # traced and compiled outside: only its run is profiled
    with tg.profile(trace=trace) as prof:
        assert default_device() == outside
        _compiled_step(x, w)
        _model_step()  # small: the cpu device interprets it
    stats = {k.name: k for k in prof.summary()}
    (product,) = [k for name, k in stats.items() if name.endswith("_matmul")]
    assert product.calls == 1 and product.flops == 2 * 64 * 32 * 48 and product.gflops > 0
    assert stats["interpreted graph"].calls == 1
    report = capsys.readouterr().err
    for header in ("kernel", "share", "GB/s", "GFLOP/s", "roofline", product.name, "total"):
        assert header in report
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["name"] for e in events} == set(stats)
    assert all(e["ph"] == "X" and e["dur"] >= 0 and "flops" in e["args"] for e in events)


def test_profile_on_the_planned_device_reports_its_kernels(capsys):
    with tg.profile(report=False) as prof, tg.device("planned"):
        _model_step()
    stats = {k.name: k for k in prof.summary()}
    assert {"numpy.matmul", "numpy.softmax", "reference.REDUCE_SUM"} <= set(stats)
    assert stats["numpy.matmul"].flops == 2 * 64 * 32 * 48


def test_profile_sessions_do_not_leak(capsys):
    with tg.profile(report=False) as first:
        _model_step()
    _model_step()
    count = len(first.events)
    assert count > 0 and capsys.readouterr().err == ""
    _model_step()
    assert len(first.events) == count


@pytest.mark.long
def test_tg_profile_environment_variable_reports_at_exit(tmp_path):
    trace = tmp_path / "env-trace.json"
    package_root = os.path.dirname(os.path.dirname(tg.__file__))
    env = {**os.environ, "TG_PROFILE": "1", "TG_PROFILE_TRACE": str(trace), "TG_CACHE_DIR": str(tmp_path / "c"),
           "PYTHONPATH": package_root}
    code = ("import numpy as np, tensorgraphs as tg\n"
            "x = tg.tensor(np.ones((8, 8)), dtype=tg.float32)\n"
            "print(tg.compile(lambda a: (a @ a).softmax(-1).sum())(x).item())\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^k\d+_\w+ ", done.stderr, re.MULTILINE) and "Chrome trace" in done.stderr  # compiled kernels
    assert json.loads(trace.read_text())["traceEvents"]
