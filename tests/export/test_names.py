"""Names from user code reach the C source only as escaped literals, and still name the right tensors."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from c_harness import run_c

import tensorgraphs as tg
from tensorgraphs.export.names import c_string, check_prefix, unique

HOSTILE = 'a"b\\c*/d??/e\nf\u00e9\U0001f600'


def test_c_string_escapes_everything_that_could_end_a_literal_or_comment() -> None:
    literal = c_string(HOSTILE)
    assert re.fullmatch(r'"(?:[^"\\\n*?]|\\[\\"n]|\\[0-7]{3})*"', literal), literal
    assert all(32 <= ord(ch) < 127 for ch in literal)
    assert c_string("model.0.weight") == '"model.0.weight"'


def test_a_c_compiler_reads_the_literal_back_as_the_utf8_bytes(tmp_path: Path) -> None:
    source = tmp_path / "s.c"
    source.write_text(f'#include <stdio.h>\n/* {c_string(HOSTILE)} */\nint main(void) {{ fputs({c_string(HOSTILE)}, '
                      "stdout); return 0; }\n")
    subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", "-o", str(tmp_path / "s"), str(source)], check=True)
    assert subprocess.run([str(tmp_path / "s")], capture_output=True).stdout == HOSTILE.encode()


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "a b", "x" * 41, "é"])
def test_a_prefix_that_is_not_a_c_identifier_is_refused(name: str) -> None:
    with pytest.raises(tg.ArgumentError, match="cannot prefix C symbols"):
        check_prefix(name)


def test_repeated_names_are_made_distinct() -> None:
    assert unique(["a", "a", "b", "a"]) == ["a", "a#1", "b", "a#2"]


def test_tensors_named_by_hostile_strings_load_from_c(tmp_path: Path) -> None:
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(16, 4))
    x = tg.randn(3, 16)

    def forward(x: tg.Tensor) -> tg.Tensor:
        return model(x)

    exported = tg.export(forward, (x,), tmp_path, name="odd", holders={HOSTILE: model})
    assert {t.name for t in exported.program.tensors} == {f"{HOSTILE}.0.weight", f"{HOSTILE}.0.bias"}
    got = run_c(exported, [[x.numpy()]])[0][0][0]
    np.testing.assert_array_equal(got, tg.compile(forward)(x).numpy())
