"""The official ONNX backend test suite (`onnx.backend.test.BackendTest`: node, simple, pytorch-converted,
pytorch-operator and the light real models) run against `tensorgraphs.onnx.backend`, each test isolated.

Tests run in a worker process, one at a time, each with a time limit: a test that crashes the worker or runs
past the limit is recorded as such and a new worker takes the next test. `python -m
tensorgraphs.testing.onnx_conformance [--jobs N] [PATTERN...]` prints each failure and the pass counts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import subprocess
import sys
import tempfile
import time
import unittest
import warnings
from dataclasses import dataclass
from typing import Iterable, Iterator

CORE_ELEMENT_TYPES = {"FLOAT", "DOUBLE", "FLOAT16", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32",
                      "UINT64", "BOOL"}
"""The dtypes of a core node test: float, int and bool (no strings, complex, 8-bit floats, 4-bit ints)."""
TIME_LIMIT_S = 120.0
MODULE = "tensorgraphs.testing.onnx_conformance"


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  # "pass", "fail", "skip", "crash", "timeout"
    message: str = ""
    seconds: float = 0.0


def backend_tests() -> dict[str, unittest.TestCase]:
    """Every test of the official suite by name (`test_abs_cpu`), as a runnable TestCase."""
    import onnx.backend.test

    from tensorgraphs.onnx.backend import TensorgraphsBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the suite's generators warn about the overflows they test
        suite = onnx.backend.test.BackendTest(TensorgraphsBackend, __name__)
    tests = {}
    for case_class in suite.test_cases.values():
        for name in unittest.TestLoader().getTestCaseNames(case_class):
            if name.endswith("_cpu"):
                tests[name] = case_class(name)
    return tests


def core_node_tests() -> set[str]:
    """Node tests whose nodes are all in the standard domain and whose values are float, int or bool tensors."""
    import onnx
    from onnx.backend.test.loader import load_model_tests

    core = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    for case in cases:
        graph = case.model.graph
        if any(node.domain not in ("", "ai.onnx") for node in graph.node):
            continue
        values = [*graph.input, *graph.output]
        if all(v.type.WhichOneof("value") == "tensor_type"
               and onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type) in CORE_ELEMENT_TYPES
               for v in values):
            core.add(case.name + "_cpu")
    return core


def _run_one(test: unittest.TestCase) -> Outcome:
    result = unittest.TestResult()
    start = time.perf_counter()
    test.run(result)
    seconds = round(time.perf_counter() - start, 3)
    name = test._testMethodName
    if result.errors or result.failures:
        (_, trace), = (result.errors or result.failures)[:1]
        return Outcome(name, "fail", _reason(trace), seconds)
    if result.skipped:
        return Outcome(name, "skip", result.skipped[0][1][:200], seconds)
    return Outcome(name, "pass", "", seconds)


def _reason(trace: str) -> str:
    """The line of a traceback that says what went wrong: the exception, or numpy's mismatch summary."""
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("Mismatched elements", "(shapes", "x and y nan location mismatch")):
            return line[:300]
    return lines[-1][:500]


def worker(compile_all: bool) -> None:
    """Read test names from stdin, one a line; write one JSON outcome a line to stdout. `compile_all`: the cpu
    device compiles every graph, however small (else small ones run on the interpreter)."""
    warnings.simplefilter("ignore")
    if compile_all:
        from tensorgraphs.backends.cpu import CPU

        CPU.interpret_below = 0
    tests = backend_tests()
    out = sys.stdout
    sys.stdout = sys.stderr  # what tests print must not mix with the outcomes
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        name = line.strip()
        outcome = _run_one(tests[name]) if name in tests else Outcome(name, "fail", "no such test")
        print(json.dumps(outcome.__dict__), file=out, flush=True)


class Worker:
    """A worker process that runs tests one at a time, each within `limit` seconds."""

    def __init__(self, env: dict[str, str], compile_all: bool) -> None:
        command = [sys.executable, "-m", MODULE, "--worker", *(["--compile-all"] if compile_all else [])]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.process.stdout, selectors.EVENT_READ)
        if self._read(600.0) is None:
            raise RuntimeError("the ONNX conformance worker did not start: run it with --worker to see why")

    def _read(self, limit: float) -> dict | None:
        if not self.selector.select(timeout=limit):
            return None
        line = self.process.stdout.readline()
        return json.loads(line) if line else None

    def run(self, name: str, limit: float) -> Outcome:
        start = time.monotonic()
        self.process.stdin.write(name + "\n")
        self.process.stdin.flush()
        reply = self._read(limit)
        if reply is not None:
            return Outcome(**reply)
        crashed = self.process.poll() is not None
        self.close()
        status = "crash" if crashed else "timeout"
        return Outcome(name, status, f"{status} after {time.monotonic() - start:.0f} s")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def run_isolated(names: list[str], jobs: int = 1, limit: float = TIME_LIMIT_S,
                 compile_all: bool = False) -> Iterator[Outcome]:
    """Outcomes of `names` from `jobs` workers; a crashed or timed-out worker is replaced."""
    env = dict(os.environ, ONNX_HOME=os.environ.get("ONNX_HOME", tempfile.mkdtemp(prefix="tg-onnx-home-")))
    queues = [names[i::jobs] for i in range(jobs)]
    if jobs == 1:
        yield from _drain(queues[0], env, limit, compile_all)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(jobs) as pool:
        for outcomes in pool.map(lambda queue: list(_drain(queue, env, limit, compile_all)), queues):
            yield from outcomes


def _drain(queue: list[str], env: dict[str, str], limit: float, compile_all: bool) -> Iterator[Outcome]:
    current: Worker | None = None
    for name in queue:
        if current is None or current.process.poll() is not None:
            current = Worker(env, compile_all)
        outcome = current.run(name, limit)
        if outcome.status in ("crash", "timeout"):
            current = None
        yield outcome
    if current is not None:
        current.close()


def read_expected_failures(path: str) -> dict[str, str]:
    """`name  # reason` per line (blank lines and lines starting with # are comments) -> {name: reason}."""
    expected = {}
    with open(path) as file:
        for line in file:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, _, reason = line.partition("#")
            expected[name.strip()] = reason.strip()
    return expected


def select(names: Iterable[str], patterns: list[str]) -> list[str]:
    compiled = [re.compile(p) for p in patterns]
    return sorted(n for n in names if not compiled or any(p.search(n) for p in compiled))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("patterns", nargs="*", help="regular expressions selecting tests (default: all)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--compile-all", action="store_true", help="compile every graph to C (else small graphs "
                        "run on the interpreter)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write every outcome to this file")
    args = parser.parse_args()
    if args.worker:
        worker(args.compile_all)
        return
    names = select(backend_tests(), args.patterns)
    core = core_node_tests()
    outcomes = []
    for outcome in run_isolated(names, args.jobs, compile_all=args.compile_all):
        outcomes.append(outcome)
        if outcome.status != "pass":
            print(f"{outcome.status:8} {outcome.name}: {outcome.message}", flush=True)
    passed = {o.name for o in outcomes if o.status == "pass"}
    chosen_core = core & set(names)
    print(f"passed {len(passed)} of {len(outcomes)}; core node tests: {len(passed & chosen_core)} of "
          f"{len(chosen_core)}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump([o.__dict__ for o in outcomes], file, indent=0)


if __name__ == "__main__":
    main()
