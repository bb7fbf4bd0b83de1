"""`tg.profile()` and TG_PROFILE=1: per-kernel time, share, throughput against the roofline, Chrome trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.runtime.realize import default_device


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))


def _model_step() -> np.ndarray:
    rng = np.random.default_rng(0)
    x, w = (tg.tensor(rng.standard_normal(s), dtype=tg.float32) for s in [(64, 32), (32, 48)])
    return (x @ w).softmax(-1).sum().numpy()


def test_profile_reports_each_kernel_and_writes_a_chrome_trace(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    outside = default_device()
    with tg.profile(trace=trace) as prof:
        assert default_device() == "planned"
        _model_step()
    assert default_device() == outside
    stats = {k.name: k for k in prof.summary()}
    assert {"numpy.matmul", "numpy.softmax", "reference.REDUCE_SUM"} <= set(stats)
    matmul = stats["numpy.matmul"]
    assert matmul.calls == 1 and matmul.flops == 2 * 64 * 32 * 48 and matmul.gflops > 0
    report = capsys.readouterr().err
    for header in ("kernel", "share", "GB/s", "GFLOP/s", "roofline", "numpy.matmul", "total"):
        assert header in report
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["name"] for e in events} == set(stats)
    assert all(e["ph"] == "X" and e["dur"] >= 0 and "signature" in e["args"] for e in events)


def test_profile_sessions_do_not_leak(capsys):
    with tg.profile(report=False) as first:
        _model_step()
    _model_step()
    count = len(first.events)
    assert count > 0 and capsys.readouterr().err == ""
    _model_step()
    assert len(first.events) == count


def test_tg_profile_environment_variable_reports_at_exit(tmp_path):
    trace = tmp_path / "env-trace.json"
    package_root = os.path.dirname(os.path.dirname(tg.__file__))
    env = {**os.environ, "TG_PROFILE": "1", "TG_PROFILE_TRACE": str(trace), "TG_CACHE_DIR": str(tmp_path / "c"),
           "PYTHONPATH": package_root}
    code = ("import numpy as np, tensorgraphs as tg\n"
            "x = tg.tensor(np.ones((8, 8)), dtype=tg.float32)\n"
            "print((x @ x).softmax(-1).sum().item())\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "numpy.matmul" in done.stderr and "Chrome trace" in done.stderr
    assert json.loads(trace.read_text())["traceEvents"]
