"""Names from a model (which may hold any characters) made safe for Python attributes and file names."""

from __future__ import annotations

import re


def attribute_name(name: str, taken: set[str]) -> str:
    """A Python identifier for an ONNX name (which may hold any characters), unique among `taken`."""
    base = re.sub(r"\W", "_", name, flags=re.ASCII) or "_"
    base = "_" + base if base[0].isdigit() else base
    candidate, count = base, 1
    while candidate in taken:
        count += 1
        candidate = f"{base}_{count}"
    taken.add(candidate)
    return candidate
