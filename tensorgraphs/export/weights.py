"""The safetensors file of an exported library's tensors, in one fixed layout.

Python writes it at export time and the library's `NAME_save` writes the same bytes (the header is a constant
of the generated C), so a file saved straight after `NAME_create` equals the exported one. Entries follow the
context's order, data packed without gaps; the header is compact JSON padded with spaces to a multiple of 8.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from tensorgraphs.export.program import ArraySpec


def header(tensors: list[ArraySpec]) -> bytes:
    """The JSON header (without its length prefix)."""
    entries, offset = {}, 0
    for spec in tensors:
        entries[spec.name] = {"dtype": spec.file_dtype, "shape": list(spec.shape),
                              "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8)


def write(path: Path, tensors: list[ArraySpec], values: list[np.ndarray]) -> None:
    """Write the tensors' `values` as `path` (atomically: a failed write keeps the old file)."""
    text = header(tensors)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for spec, value in zip(tensors, values):
            f.write(np.ascontiguousarray(value, dtype=spec.storage).tobytes())
    os.replace(temporary, path)
