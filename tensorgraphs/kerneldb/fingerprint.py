"""Which machine a measurement belongs to: CPU model, cores, C compiler, library versions.

Times measured on one machine say nothing about another, so every row in the
kernel database carries the fingerprint of the device it was measured on.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _compiler() -> str:
    """First line of `$CC --version` (the compiler the C backend would use), or "none"."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return "none"
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (done.stdout.splitlines() or ["unknown"])[0].strip()


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def device_description() -> dict[str, str]:
    """What the fingerprint is made of (stored in the database beside it, for people to read)."""
    return {
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "cores": str(os.cpu_count()),
        "compiler": _compiler(),
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
    }


@functools.cache
def device_fingerprint() -> str:
    text = json.dumps(device_description(), sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
