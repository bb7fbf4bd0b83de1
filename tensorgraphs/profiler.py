"""`with tg.profile():` where the time goes, per kernel, against the device's roofline.

Realizations inside the block run on the device they run on anyway: the cpu
device's compiled programs run their timed build and report each kernel (`tg.compile`d
functions included; a graph small enough to be interpreted is one "interpreted graph"),
and the "planned" device's executor reports every kernel and primitive call. On exit
the block prints, per kernel: calls, time, share of the total, achieved GB/s and
GFLOP/s and the fraction of the roofline bound (min(peak FLOP/s, bandwidth x
arithmetic intensity)) it reached, and it can write a Chrome trace (JSON) that
chrome://tracing and Perfetto open.

`TG_PROFILE=1` profiles the whole program and reports at exit (trace written to
`TG_PROFILE_TRACE`, default tg-trace-<pid>.json).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from tensorgraphs.backends.native import KERNEL_OBSERVERS
from tensorgraphs.kerneldb import DevicePeaks
from tensorgraphs.plan.executor import OBSERVERS
from tensorgraphs.plan.signature import Signature


@dataclass(frozen=True)
class Event:
    """One kernel call: `detail` says what it computed (a signature on the planned device)."""

    name: str
    start: float
    seconds: float
    flops: float
    bytes: float
    detail: str = ""


@dataclass(frozen=True)
class KernelStats:
    name: str
    calls: int
    seconds: float
    flops: float
    bytes: float

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9 if self.seconds else 0.0

    @property
    def gbytes(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds else 0.0


def _roofline_fraction(k: KernelStats, peaks: DevicePeaks) -> str:
    """Achieved throughput over the roofline bound min(peak FLOP/s, bandwidth x FLOP per byte)."""
    if not k.seconds or not (k.flops or k.bytes):
        return "-"
    if not k.flops:
        return f"{k.bytes / k.seconds / peaks.bandwidth:.1%}"
    bound = min(peaks.flops, peaks.bandwidth * k.flops / k.bytes) if k.bytes else peaks.flops
    return f"{k.flops / k.seconds / bound:.1%}"


@dataclass(eq=False)
class Profile:
    """Events recorded while active; `summary`, `report` and `export_chrome_trace` read them."""

    events: list[Event] = field(default_factory=list)

    def on_composite(self, sig: Signature, implementation: str) -> None:
        return None

    def on_call(self, name: str, sig: Signature, start: float, seconds: float) -> None:
        self.events.append(Event(name, start, seconds, sig.flops, sig.bytes, str(sig)))

    def on_kernel(self, name: str, start: float, seconds: float, flops: float, nbytes: float) -> None:
        self.events.append(Event(name, start, seconds, flops, nbytes))

    def summary(self) -> list[KernelStats]:
        """Per kernel id, slowest first."""
        totals: dict[str, list[float]] = {}
        for e in self.events:
            entry = totals.setdefault(e.name, [0, 0.0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += e.seconds
            entry[2] += e.flops
            entry[3] += e.bytes
        stats = [KernelStats(name, int(c), s, f, b) for name, (c, s, f, b) in totals.items()]
        return sorted(stats, key=lambda k: -k.seconds)

    def report(self) -> str:
        from tensorgraphs.plan.planner import default_planner

        peaks = default_planner().cost_model.peaks()
        stats = self.summary()
        total = sum(k.seconds for k in stats) or 1.0
        width = max([len(k.name) for k in stats] + [6])
        lines = [f"{'kernel':<{width}}  {'calls':>6}  {'time ms':>9}  {'share':>6}  {'GB/s':>7}  {'GFLOP/s':>8}  "
                 f"{'roofline':>8}",
                 f"{'':<{width}}  (device peaks: {peaks.bandwidth / 1e9:.1f} GB/s, {peaks.flops / 1e9:.1f} GFLOP/s)"]
        for k in stats:
            lines.append(f"{k.name:<{width}}  {k.calls:>6}  {k.seconds * 1e3:>9.3f}  {k.seconds / total:>6.1%}  "
                         f"{k.gbytes:>7.2f}  {k.gflops:>8.2f}  {_roofline_fraction(k, peaks):>8}")
        lines.append(f"{'total':<{width}}  {len(self.events):>6}  {total * 1e3:>9.3f}")
        return "\n".join(lines)

    def export_chrome_trace(self, path: str | os.PathLike) -> Path:
        """Write the events as Chrome trace "complete" events (microseconds), one track."""
        origin = min((e.start for e in self.events), default=0.0)
        events = [{"name": e.name, "cat": "kernel", "ph": "X", "pid": os.getpid(), "tid": 0,
                   "ts": (e.start - origin) * 1e6, "dur": e.seconds * 1e6,
                   "args": {"detail": e.detail, "flops": e.flops, "bytes": e.bytes}}
                  for e in self.events]
        target = Path(path)
        target.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        return target


@contextlib.contextmanager
def _observing(session: Profile) -> Iterator[Profile]:
    OBSERVERS.append(session)
    KERNEL_OBSERVERS.append(session.on_kernel)
    try:
        yield session
    finally:
        OBSERVERS.remove(session)
        KERNEL_OBSERVERS.remove(session.on_kernel)


@contextlib.contextmanager
def profile(report: bool = True, trace: str | os.PathLike | None = None) -> Iterator[Profile]:
    """Profile realizations inside the block; print the report to stderr and write `trace` at the end."""
    with _observing(Profile()) as session:
        yield session
    if report:
        print(session.report(), file=sys.stderr)
    if trace is not None:
        session.export_chrome_trace(trace)


def install_from_environment() -> None:
    """`TG_PROFILE=1`: profile the whole program and report at exit."""
    if os.environ.get("TG_PROFILE", "") in ("", "0"):
        return
    session = Profile()
    OBSERVERS.append(session)
    KERNEL_OBSERVERS.append(session.on_kernel)
    trace = os.environ.get("TG_PROFILE_TRACE") or f"tg-trace-{os.getpid()}.json"

    def finish() -> None:
        print(session.report(), file=sys.stderr)
        print(f"Chrome trace: {session.export_chrome_trace(trace)}", file=sys.stderr)

    atexit.register(finish)
