"""SizeTemplate: literals that vary with the sizes become polynomials; anything else leaves no template."""

from __future__ import annotations

from tensorgraphs.codegen.compiler import UNIT_BREAK
from tensorgraphs.codegen.size_template import SizeTemplate, probe_offsets


def program(batch: int, seq: int) -> str:
    """A stand-in program with a bound of batch*seq, a stride of seq*seq, a fixed width and float constants."""
    return (f"#include <stdint.h>\n{UNIT_BREAK}\nvoid k1(float *p) {{ for (int64_t i = 0; i < {batch * seq}; i++) "
            f"p[i * {seq * seq} + 64] = 0x1.0p+8f * 2.5f; }}\n{UNIT_BREAK}\nint main(void) {{ return 0; }}\n")


def samples(make=program, base=(5, 7)) -> list[tuple[tuple[int, ...], str]]:
    points = [(base[0] + a, base[1] + b) for a, b in probe_offsets(2)]
    return [(p, make(*p)) for p in points]


def test_fits_products_of_sizes_and_matches_only_its_instances() -> None:
    template = SizeTemplate.fit(samples())
    assert template is not None and template.holes == 2
    assert template.matches(program(100, 3), (100, 3))
    assert not template.matches(program(100, 3), (100, 4))  # the source of other sizes
    assert not template.matches(program(100, 3).replace("2.5f", "2.6f"), (100, 3))
    rendered = template.render()
    assert "tg_sizes[0] * tg_sizes[1]" in rendered and "tg_sizes[1] * tg_sizes[1]" in rendered
    assert rendered.count("extern int64_t tg_sizes[2];") == 1 and rendered.endswith("int64_t tg_sizes[2];\n")
    assert "+ 64]" in rendered and "0x1.0p+8f" in rendered  # fixed literals and float exponents stay


def test_no_template_when_text_or_a_float_varies() -> None:
    def mean_of_rows(batch: int, seq: int) -> str:
        return program(batch, seq).replace("2.5f", f"{1 / batch!r}f")

    assert SizeTemplate.fit(samples(mean_of_rows)) is None


def test_no_template_for_a_literal_beyond_degree_three() -> None:
    def quartic(batch: int, seq: int) -> str:
        return program(batch, seq).replace("+ 64]", f"+ {batch**4}]")

    assert SizeTemplate.fit(samples(quartic)) is None


def test_a_symbol_at_one_size_in_every_sample_is_pinned() -> None:
    points = [(1, 7 + k) for k in range(5)]
    template = SizeTemplate.fit([(p, program(*p)) for p in points])
    assert template is not None and template.pinned == ((0, 1),)
    assert template.matches(program(1, 40), (1, 40)) and not template.matches(program(2, 40), (2, 40))


def test_a_literal_that_is_a_fraction_of_a_size_fits_on_its_lattice() -> None:
    """Probed at even batches, a literal of batch / 2 (rows of a reshape into pairs) is a polynomial with
    denominator 2; the template matches even batches and no odd one (no literal equals a half)."""
    def halved(batch: int, seq: int) -> str:
        return program(batch, seq).replace("+ 64]", f"+ {batch // 2}]")

    points = [(6 + 2 * a, 7 + b) for a, b in probe_offsets(2)]
    template = SizeTemplate.fit([(p, halved(*p)) for p in points])
    assert template is not None and template.holes == 3
    assert template.matches(halved(40, 3), (40, 3)) and not template.matches(halved(41, 3), (41, 3))
    assert "((int64_t)(1 * tg_sizes[0]) / 2)" in template.render()
