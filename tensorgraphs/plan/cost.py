"""How long a kernel takes on a signature: measured, else fitted, else a roofline.

1. An exact row in the kernel database (same device, kernel, implementation,
   dtype and shape): its median.
2. Rows of the same kernel on other shapes: a least-squares fit of
   time = c0 + c1 * flops + c2 * bytes (relative error minimized, coefficients
   kept non-negative) when there are three or more and the signature lies within
   `EXTRAPOLATION` of their flops and bytes; otherwise (one or two rows, or a shape
   far from the rows), the roofline scaled by how far the measured rows were from
   it. A fit over large shapes says little of small ones: its intercept, decisive
   there, is what the large rows determine least.
3. Nothing measured: the roofline, overhead + max(flops / peak FLOP/s,
   bytes / bandwidth), from the device's peaks, measured once and stored.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import operator
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.dtypes import float32
from tensorgraphs.graph.node import binary, buffer
from tensorgraphs.graph.ops import Op
from tensorgraphs.kerneldb import DevicePeaks, KernelDB, Measurement, default_db, device_description
from tensorgraphs.kerneldb import device_fingerprint as current_fingerprint
from tensorgraphs.plan.measure import time_samples
from tensorgraphs.plan.signature import Signature
from tensorgraphs.runtime.buffer import Buffer

MIN_ROWS_FOR_FIT = 3
EXTRAPOLATION = 2.0
"""How far outside its rows' flops and bytes (as a factor) a fit still predicts."""


@dataclass(frozen=True)
class Estimate:
    seconds: float
    source: str  # "measured", "regression", "scaled roofline", "roofline"

    def __add__(self, other: Estimate) -> Estimate:
        if self.source == "free" or other.source == "free":
            return Estimate(self.seconds + other.seconds, other.source if self.source == "free" else self.source)
        source = self.source if self.source == other.source else "mixed"
        return Estimate(self.seconds + other.seconds, source)

    @staticmethod
    def total(estimates: Iterable[Estimate]) -> Estimate:
        """The sum; its source is the parts' common source, "mixed", or "free" when there are none."""
        return functools.reduce(operator.add, estimates, FREE)


FREE = Estimate(0.0, "free")

NOMINAL_PEAKS = DevicePeaks(bandwidth=20e9, flops=100e9, overhead=2e-6)
"""Roofline peaks for where nothing may be measured (compiling a program) and none are stored yet: every
candidate then gets the same roofline, and its prior decides."""


def measure_device_peaks() -> DevicePeaks:
    """Copy bandwidth (16 MB float32), float32 GEMM throughput (256^3) and one interpreted primitive's overhead."""
    source = np.ones(1 << 22, dtype=np.float32)
    target = np.empty_like(source)
    copy_time = min(time_samples(lambda: np.copyto(target, source), budget=0.05))
    square = np.ones((256, 256), dtype=np.float32)
    gemm_time = min(time_samples(lambda: square @ square, budget=0.05))
    tiny = buffer(Buffer("numpy", float32, (4,), np.ones(4, np.float32)), float32, (4,))
    add = binary(Op.ADD, tiny, tiny)
    known = {tiny: tiny.arg.data}
    overhead = min(time_samples(lambda: REFERENCE.evaluate([add], known), budget=0.02))
    return DevicePeaks(bandwidth=2 * source.nbytes / copy_time, flops=2 * 256**3 / gemm_time, overhead=overhead)


@dataclass(frozen=True)
class _Fit:
    """time = coefficients . (1, flops, bytes) within the rows' `flops` and `bytes` ranges, else (or with too few
    rows to fit) the roofline times `scale`."""

    coefficients: tuple[float, float, float] | None
    scale: float
    flops: tuple[float, float] = (0.0, 0.0)
    bytes: tuple[float, float] = (0.0, 0.0)

    def covers(self, flops: float, nbytes: float) -> bool:
        """Whether a signature's flops and bytes lie within `EXTRAPOLATION` of the fitted rows'."""
        return all(low / EXTRAPOLATION <= value <= high * EXTRAPOLATION
                   for value, (low, high) in ((flops, self.flops), (nbytes, self.bytes)))


def _features(flops: float, nbytes: float) -> np.ndarray:
    return np.array([1.0, flops, nbytes])


def _fit_nonnegative(features: np.ndarray, times: np.ndarray) -> np.ndarray | None:
    """Least squares of relative error; a feature whose coefficient comes out negative is dropped and refitted."""
    weighted = features / times[:, None]
    scale = np.abs(weighted).max(axis=0)
    scale[scale == 0] = 1.0
    active = [i for i in range(features.shape[1]) if features[:, i].any()]
    while active:
        solution, *_ = np.linalg.lstsq(weighted[:, active] / scale[active], np.ones(len(times)), rcond=None)
        solution = solution / scale[active]
        if (solution >= 0).all():
            coefficients = np.zeros(features.shape[1])
            coefficients[active] = solution
            return coefficients
        active.pop(int(np.argmin(solution)))
    return None


class CostModel:
    """Estimates from one database for one device; fits are cached until the database is written to."""

    def __init__(self, db: KernelDB | None = None, fingerprint: str | None = None,
                 peaks: DevicePeaks | None = None) -> None:
        self.db = db if db is not None else default_db()
        self.fingerprint = fingerprint or current_fingerprint()
        self._peaks = peaks
        self._rows: dict[str, dict[tuple[str, str, str], Measurement]] = {}
        self._fits: dict[tuple[str, str, str], _Fit | None] = {}
        self._generation = self.db.generation

    @property
    def generation(self) -> int:
        return self.db.generation

    def peaks(self) -> DevicePeaks:
        """The device's roofline peaks: given, stored in the database, or measured now and stored."""
        if self._peaks is None:
            self._peaks = self.db.device_peaks(self.fingerprint)
        if self._peaks is None:
            self._peaks = measure_device_peaks()
            self.db.store_device(self.fingerprint, json.dumps(device_description()), self._peaks)
        return self._peaks

    def roofline(self, flops: float, nbytes: float) -> float:
        peaks = self.peaks()
        return peaks.overhead + max(flops / peaks.flops, nbytes / peaks.bandwidth)

    def _kernel_rows(self, kernel: str) -> dict[tuple[str, str, str], Measurement]:
        if self._generation != self.db.generation:
            self._rows.clear()
            self._fits.clear()
            self._generation = self.db.generation
        if kernel not in self._rows:
            rows = self.db.measurements(self.fingerprint, kernel)
            self._rows[kernel] = {(m.impl_hash, m.dtype, m.shape): m for m in rows}
        return self._rows[kernel]

    def measured(self, kernel: str, impl_hash: str, sig: Signature) -> Measurement | None:
        return self._kernel_rows(kernel).get((impl_hash, sig.dtype_key, sig.shape_key))

    def estimate(self, kernel: str, impl_hash: str, sig: Signature) -> Estimate:
        row = self.measured(kernel, impl_hash, sig)
        return Estimate(row.median, "measured") if row is not None else self.predict(kernel, impl_hash, sig)

    def predict(self, kernel: str, impl_hash: str, sig: Signature) -> Estimate:
        """The estimate from the fit over the kernel's rows (the roofline without any), whether or not `sig`
        itself was measured."""
        fit = self._fit(kernel, impl_hash, sig.dtype_key)
        roofline = self.roofline(sig.flops, sig.bytes)
        if fit is None:
            return Estimate(roofline, "roofline")
        if fit.coefficients is None or not fit.covers(sig.flops, sig.bytes):
            return Estimate(fit.scale * roofline, "scaled roofline")
        return Estimate(float(np.dot(fit.coefficients, _features(sig.flops, sig.bytes))), "regression")

    def _fit(self, kernel: str, impl_hash: str, dtype: str) -> _Fit | None:
        key = (kernel, impl_hash, dtype)
        if key not in self._fits:
            rows = [m for m in self._kernel_rows(kernel).values() if m.impl_hash == impl_hash]
            same_dtype = [m for m in rows if m.dtype == dtype]
            self._fits[key] = self._fit_rows(same_dtype or rows)
        return self._fits[key]

    def _fit_rows(self, rows: list[Measurement]) -> _Fit | None:
        if not rows:
            return None
        times = np.array([m.median for m in rows])
        ratios = times / np.array([self.roofline(m.flops, m.bytes) for m in rows])
        scaled = _Fit(None, float(np.median(ratios)))
        if len(rows) < MIN_ROWS_FOR_FIT:
            return scaled
        coefficients = _fit_nonnegative(np.stack([_features(m.flops, m.bytes) for m in rows]), times)
        if coefficients is None or not coefficients.any():
            return scaled
        flops, nbytes = [m.flops for m in rows], [m.bytes for m in rows]
        return _Fit(tuple(float(c) for c in coefficients), scaled.scale, (min(flops), max(flops)),
                    (min(nbytes), max(nbytes)))


@functools.cache
def reference_impl_hash() -> str:
    """Implementation hash of the reference interpreter's primitives (changes with numpy)."""
    return hashlib.blake2b(f"reference|{importlib.metadata.version('numpy')}".encode(), digest_size=6).hexdigest()
