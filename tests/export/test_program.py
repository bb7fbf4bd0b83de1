"""What feeds each buffer of an exported program: arguments, numbers and live values as C inputs, results that are
inputs or parameters copied out, random keys taken from the caller."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from c_harness import run_c

import tensorgraphs as tg
import tensorgraphs.nn as nn
from tensorgraphs import dtypes


def test_numbers_random_keys_and_results_that_are_inputs_or_parameters(tmp_path: Path) -> None:
    tg.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.Linear(32, 4))  # training mode: dropout draws

    def forward(x: tg.Tensor, scale: float) -> tuple[tg.Tensor, ...]:
        return model(x) * scale, x, model[0].bias

    x = tg.randn(8, 16)
    exported = tg.export(forward, (x, 2.5), tmp_path, name="multi")
    program = exported.program
    assert [(s.name, s.dtype, s.shape) for s in program.inputs] == [
        ("x", tg.float32, (8, 16)), ("scale", tg.float64, ()), ("random_key", dtypes.uint32, (3,))]
    assert [s.name for s in program.outputs] == ["output.0", "output.1", "output.2"]
    assert {index for kind, index, _ in program.copies if kind == "output"} == {1, 2}
    tg.manual_seed(5)
    key = np.asarray(tg.default_generator.next_key(), np.uint32)
    tg.manual_seed(5)  # the compiled call draws that same key
    expected = [t.detach().numpy() for t in tg.compile(forward)(x, 2.5)]
    got = run_c(exported, [[x.numpy(), np.float64(2.5), key]])[0][0]
    for have, want in zip(got, expected):
        np.testing.assert_array_equal(have, want)
    other_key = run_c(exported, [[x.numpy(), np.float64(2.5), key + 1]])[0][0][0]
    assert not np.array_equal(other_key, got[0])


def test_an_index_out_of_bounds_fails_the_call_with_a_message(tmp_path: Path) -> None:
    tg.manual_seed(0)
    embedding = nn.Embedding(10, 4)
    idx = np.array([[1, 2, 3]])
    exported = tg.export(embedding, (tg.tensor(idx),), tmp_path, name="lookup")
    got = run_c(exported, [[idx]])[0][0][0]
    np.testing.assert_array_equal(got, embedding.weight.detach().numpy()[idx])
    error = run_c(exported, [[np.array([[1, 12, 3]])]], failing=True)
    assert "lookup_run: an index (of a gather or scatter) is out of bounds" in error
