"""The kernel database: measured kernel times per device, in SQLite in the user cache dir."""

from tensorgraphs.kerneldb.db import (
    SCHEMA_VERSION,
    DevicePeaks,
    KernelDB,
    Measurement,
    ScheduleChoice,
    StepVerdict,
    StoredView,
    cache_dir,
    default_db,
    per_database,
)
from tensorgraphs.kerneldb.fingerprint import device_description, device_fingerprint

__all__ = [
    "SCHEMA_VERSION",
    "DevicePeaks",
    "KernelDB",
    "Measurement",
    "ScheduleChoice",
    "StepVerdict",
    "StoredView",
    "cache_dir",
    "default_db",
    "per_database",
    "device_description",
    "device_fingerprint",
]
