"""Running exported libraries from C: a harness built with plain gcc against the static library, run in a
subprocess, reading its inputs from and writing its outputs to files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from tensorgraphs.export import Exported

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "NAME.h"

/* harness WEIGHTS STEPS INPUTS OUTPUTS [SAVED]: STEPS calls, each reading every input's bytes from INPUTS in turn
   and appending every output's bytes to OUTPUTS; WEIGHTS "-" means the embedded weights; NAME_save(SAVED) after. */
int main(int argc, char **argv) {
    if (argc < 5) return 2;
    NAME_ctx *ctx = NAME_create(strcmp(argv[1], "-") ? argv[1] : NULL);
    if (!ctx) {
        fprintf(stderr, "%s\n", NAME_last_error());
        return 1;
    }
    int steps = atoi(argv[2]), n_in = NAME_num_inputs(), n_out = NAME_num_outputs();
    FILE *in = fopen(argv[3], "rb"), *out = fopen(argv[4], "wb");
    void *inputs[n_in + 1], *outputs[n_out + 1];
    for (int i = 0; i < n_in; i++) inputs[i] = malloc(NAME_input_bytes(i) + 1);
    for (int j = 0; j < n_out; j++) outputs[j] = malloc(NAME_output_bytes(j) + 1);
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < n_in; i++)
            if (fread(inputs[i], 1, NAME_input_bytes(i), in) != NAME_input_bytes(i)) return 3;
        if (NAME_run(ctx, (const void *const *)inputs, outputs)) {
            fprintf(stderr, "%s\n", NAME_last_error());
            return 1;
        }
        for (int j = 0; j < n_out; j++) fwrite(outputs[j], 1, NAME_output_bytes(j), out);
    }
    fclose(in);
    fclose(out);
    if (argc > 5 && NAME_save(ctx, argv[5])) {
        fprintf(stderr, "%s\n", NAME_last_error());
        return 1;
    }
    NAME_destroy(ctx);
    return 0;
}
"""


def compile_c(source: str, directory: Path, executable: str, libraries: list[str], openmp: bool = True) -> Path:
    """`source` written to `directory` and built with plain gcc against the static `libraries` (in `directory`)."""
    path = directory / f"{executable}.c"
    path.write_text(source)
    archives = [str(directory / f"lib{name}.a") for name in libraries]
    command = ["gcc", "-std=c11", "-Wall", "-Werror", "-o", str(directory / executable), str(path), f"-I{directory}",
               *archives, *(["-fopenmp"] if openmp else []), "-lm", "-lpthread"]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return directory / executable


def run_c(exported: Exported, steps: list[list[np.ndarray]], weights: str | None = "",
          saved: Path | None = None, openmp: bool = True) -> list[list[np.ndarray]]:
    """The library's outputs for each step's inputs, called from the C harness (`weights`: a file, "" for the
    exported one, None for the embedded weights)."""
    directory = exported.files["header"].parent
    prefix = exported.files["header"].stem
    harness = directory / f"harness_{prefix}"
    if not harness.exists():
        compile_c(HARNESS.replace("NAME", prefix), directory, harness.name, [prefix], openmp)
    fed = directory / "inputs.bin"
    fed.write_bytes(b"".join(np.ascontiguousarray(a, spec.storage).tobytes()
                             for step in steps for spec, a in zip(exported.program.inputs, step)))
    received = directory / "outputs.bin"
    path = "-" if weights is None else (weights or str(exported.files["weights"]))
    command = [str(harness), path, str(len(steps)), str(fed), str(received), *([str(saved)] if saved else [])]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    data, offset, results = received.read_bytes(), 0, []
    for _ in steps:
        outputs = []
        for spec in exported.program.outputs:
            outputs.append(np.frombuffer(data, spec.storage, int(np.prod(spec.shape)), offset).reshape(spec.shape))
            offset += spec.nbytes
        results.append(outputs)
    return results
