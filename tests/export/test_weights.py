"""The weights file: readable by the safetensors library, written again byte for byte by NAME_save, and every
damaged or foreign file refused by NAME_create with a message (never read past its end)."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from c_harness import compile_c
from safetensors.numpy import load_file

import tensorgraphs as tg
from tensorgraphs.export import Exported

CREATE = r"""
#include <stdio.h>
#include "mlp.h"

/* create WEIGHTS [SAVED]: prints the error of a failed create, or saves the context's tensors. */
int main(int argc, char **argv) {
    mlp_ctx *ctx = mlp_create(argv[1]);
    if (!ctx) {
        printf("NULL: %s", mlp_last_error());
        return 0;
    }
    int status = argc > 2 ? mlp_save(ctx, argv[2]) : 0;
    mlp_destroy(ctx);
    return status;
}
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(16, 32), tg.nn.GELU(), tg.nn.Linear(32, 4))
    directory = tmp_path_factory.mktemp("weights")
    result = tg.export(model, (tg.randn(8, 16),), directory, name="mlp")
    compile_c(CREATE, directory, "create", ["mlp"])
    return result


def create(exported: Exported, weights: Path, saved: Path | None = None) -> str:
    directory = exported.files["header"].parent
    command = [str(directory / "create"), str(weights), *([str(saved)] if saved else [])]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_file_is_safetensors_with_the_state_dict_names(exported: Exported) -> None:
    loaded = load_file(exported.files["weights"])
    assert sorted(loaded) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    np.testing.assert_array_equal(loaded["0.weight"], exported.program.values[
        [t.name for t in exported.program.tensors].index("0.weight")])


def test_save_straight_after_create_writes_the_exported_file(exported: Exported, tmp_path: Path) -> None:
    assert create(exported, exported.files["weights"], tmp_path / "saved.safetensors") == ""
    assert (tmp_path / "saved.safetensors").read_bytes() == exported.files["weights"].read_bytes()


def test_a_file_written_by_tg_save_loads(exported: Exported, tmp_path: Path) -> None:
    tensors = {k: tg.tensor(v) for k, v in load_file(exported.files["weights"]).items()}
    tg.save(tensors, tmp_path / "other.safetensors", metadata={"note": "a \"quoted\" \\ value"})
    assert create(exported, tmp_path / "other.safetensors", tmp_path / "again.safetensors") == ""
    assert (tmp_path / "again.safetensors").read_bytes() == exported.files["weights"].read_bytes()


def header_and_data(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + size]), raw[8 + size:]


def written(path: Path, header: dict, data: bytes) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


@pytest.mark.parametrize("damage, message", [
    ("missing", "cannot read the weights file"),
    ("empty", "too short for a safetensors file"),
    ("truncated header", "its header says"),
    ("truncated data", "outside the file's"),
    ("no tensor", "it has no tensor '2.weight'"),
    ("other shape", "tensor '0.bias' is F32 of rank 1 in the file; the library needs F32"),
    ("other dtype", "tensor '0.bias' is F64"),
    ("not json", "malformed"),
])
def test_a_bad_weights_file_gives_null_and_says_why(exported: Exported, tmp_path: Path, damage: str,
                                                   message: str) -> None:
    original = exported.files["weights"]
    header, data = header_and_data(original)
    path = tmp_path / "bad.safetensors"
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated header":
        path.write_bytes(original.read_bytes()[:40])
    elif damage == "truncated data":
        path.write_bytes(original.read_bytes()[:-100])
    elif damage == "no tensor":
        del header["2.weight"]
        written(path, header, data)
    elif damage == "other shape":
        header["0.bias"]["shape"] = [16]
        header["0.bias"]["data_offsets"][1] -= 64
        written(path, header, data)
    elif damage == "other dtype":
        header["0.bias"]["dtype"] = "F64"
        written(path, header, data)
    elif damage == "not json":
        path.write_bytes(struct.pack("<Q", 8) + b"{\"a\": [}" + data)
    out = create(exported, path)
    assert out.startswith("NULL: mlp_create: "), out
    assert message in out and str(path) in out, out
