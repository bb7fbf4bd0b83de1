"""Running exported libraries from C: a harness built with plain gcc against the static library, run in a
subprocess, reading its inputs from and writing its outputs to files."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from tensorgraphs.export import Exported

HARNESS = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "NAME.h"

/* harness WEIGHTS SAVED STEPS INPUTS OUTPUTS [INPUTS OUTPUTS ...]: per (INPUTS, OUTPUTS) pair, a context on a
   thread of its own (all at once) makes STEPS calls, each reading every input's bytes from INPUTS in turn and
   appending every output's bytes to OUTPUTS. WEIGHTS "-": the embedded weights; SAVED (not "-"): the first
   context's tensors are saved there at the end. */
typedef struct {
    NAME_ctx *ctx;
    const char *inputs, *outputs;
    int steps, failed;
} job;

static void *work(void *argument) {
    job *j = argument;
    int n_in = NAME_num_inputs(), n_out = NAME_num_outputs();
    FILE *in = fopen(j->inputs, "rb"), *out = fopen(j->outputs, "wb");
    void *inputs[n_in + 1], *outputs[n_out + 1];
    for (int i = 0; i < n_in; i++) inputs[i] = malloc(NAME_input_bytes(i) + 1);
    for (int k = 0; k < n_out; k++) outputs[k] = malloc(NAME_output_bytes(k) + 1);
    for (int step = 0; step < j->steps && !j->failed; step++) {
        for (int i = 0; i < n_in; i++) j->failed |= fread(inputs[i], 1, NAME_input_bytes(i), in) != NAME_input_bytes(i);
        if (!j->failed && NAME_run(j->ctx, (const void *const *)inputs, outputs)) {
            fprintf(stderr, "%s\n", NAME_last_error());
            j->failed = 1;
        }
        for (int k = 0; k < n_out; k++) fwrite(outputs[k], 1, NAME_output_bytes(k), out);
    }
    fclose(in);
    fclose(out);
    for (int i = 0; i < n_in; i++) free(inputs[i]);
    for (int k = 0; k < n_out; k++) free(outputs[k]);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 6 || argc % 2) return 2;
    int count = (argc - 4) / 2, failed = 0;
    job jobs[count];
    pthread_t threads[count];
    for (int t = 0; t < count; t++) {
        jobs[t] = (job){NAME_create(strcmp(argv[1], "-") ? argv[1] : NULL), argv[4 + 2 * t], argv[5 + 2 * t],
                        atoi(argv[3]), 0};
        if (!jobs[t].ctx) {
            fprintf(stderr, "%s\n", NAME_last_error());
            return 1;
        }
    }
    for (int t = 0; t < count; t++) pthread_create(&threads[t], NULL, work, &jobs[t]);
    for (int t = 0; t < count; t++) {
        pthread_join(threads[t], NULL);
        failed |= jobs[t].failed;
    }
    if (!failed && strcmp(argv[2], "-") && NAME_save(jobs[0].ctx, argv[2])) {
        fprintf(stderr, "%s\n", NAME_last_error());
        failed = 1;
    }
    for (int t = 0; t < count; t++) NAME_destroy(jobs[t].ctx);
    return failed;
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


def run_c(exported: Exported, *runs: list[list[np.ndarray]], weights: str | None = "",
          saved: Path | None = None, openmp: bool = True, failing: bool = False) -> Any:
    """Per run (a list of steps, each the inputs of one call), the library's outputs at each step, from the C
    harness: each run on a context and a thread of its own, all at once. `weights`: a file, "" for the exported
    one, None for the embedded weights; `saved`: where the first run's context saves its tensors at the end;
    `failing`: the harness must fail, and its error output is returned."""
    directory = exported.files["header"].parent
    prefix = exported.files["header"].stem
    harness = directory / f"harness_{prefix}"
    if not harness.exists():
        compile_c(HARNESS.replace("NAME", prefix), directory, harness.name, [prefix], openmp)
    files = []
    for number, steps in enumerate(runs):
        fed, received = directory / f"inputs{number}.bin", directory / f"outputs{number}.bin"
        fed.write_bytes(b"".join(np.ascontiguousarray(a, spec.storage).tobytes()
                                 for step in steps for spec, a in zip(exported.program.inputs, step)))
        files += [str(fed), str(received)]
    path = "-" if weights is None else (weights or str(exported.files["weights"]))
    command = [str(harness), path, str(saved or "-"), str(len(runs[0])), *files]
    result = subprocess.run(command, capture_output=True, text=True)
    if failing:
        assert result.returncode != 0
        return result.stderr
    assert result.returncode == 0, result.stderr
    return [_outputs(exported, Path(received).read_bytes(), len(steps)) for steps, received in zip(runs, files[1::2])]


def _outputs(exported: Exported, data: bytes, steps: int) -> list[list[np.ndarray]]:
    offset, results = 0, []
    for _ in range(steps):
        outputs = []
        for spec in exported.program.outputs:
            outputs.append(np.frombuffer(data, spec.storage, int(np.prod(spec.shape)), offset).reshape(spec.shape))
            offset += spec.nbytes
        results.append(outputs)
    return results
