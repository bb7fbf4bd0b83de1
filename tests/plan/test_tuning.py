"""`tg tune` and `tg explain` on a small transformer script: measure, store, resume, explain without measuring."""

from __future__ import annotations

import textwrap

import pytest

from tensorgraphs import cli
from tensorgraphs.kerneldb import default_db
from tensorgraphs.plan import IMPLEMENTATIONS, Planner
from tensorgraphs.plan.tuning import collect_composites, measurement_tasks, print_compiled_functions, tune

SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorgraphs as tg
    import tensorgraphs.nn.functional as F

    rng = np.random.default_rng(0)
    B, T, D = 2, 8, 16
    x = tg.tensor(rng.standard_normal((B, T, D)), dtype=tg.float32)
    w_qkv, w_up = (tg.tensor(rng.standard_normal(s) * 0.1, dtype=tg.float32) for s in [(D, 3 * D), (D, 4 * D)])
    h = F.layer_norm(x, (D,))
    q, k, v = (h @ w_qkv).reshape(B, T, 3, D).unbind(2)
    x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True)
    print("loss", float(F.gelu(x @ w_up).log_softmax(-1).mean()))
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "tiny_transformer.py"
    path.write_text(SCRIPT)
    return str(path)


def test_collect_composites_sees_nested_ones(script):
    names = {sig.name for sig in collect_composites(script)}
    assert {"layer_norm", "matmul", "scaled_dot_product_attention", "gelu", "log_softmax"} <= names


def test_tasks_cover_kernels_copies_and_primitives(script, planner):
    sigs = collect_composites(script)
    kernels = {t.kernel for t in measurement_tasks(planner, sigs)}
    assert {"numpy.matmul", "torch.matmul", "torch.copy_in", "torch.copy_out", "reference.MUL"} <= kernels


def test_budget_stops_and_a_later_run_resumes(script, planner):
    sigs = [s for s in collect_composites(script) if s.name == "matmul"]
    first = tune(planner, sigs, budget=0.0)
    assert first.measured == 0 and first.remaining > 0
    second = tune(planner, sigs)
    assert second.measured == first.remaining and second.remaining == 0
    third = tune(planner, sigs)
    assert third.measured == 0 and third.skipped == second.measured + second.skipped


def test_tune_then_explain_shows_measured_choices(script, capsys):
    assert cli.main(["tune", "--device", "planned", script]) == 0
    tuned = capsys.readouterr().out
    rows = default_db().count()
    assert rows > 50 and f"({rows} rows)" in tuned
    assert cli.main(["explain", "--device", "planned", script]) == 0
    explained = capsys.readouterr().out
    assert "0 new measurements" in explained and default_db().count() == rows
    chosen = [line for line in explained.splitlines() if line.lstrip().startswith("* ")]
    assert chosen and all("(measured), measured" in line for line in chosen)
    matmul = next(sig for sig in collect_composites(script) if sig.name == "matmul")
    planner = Planner()
    measured = {p.implementation: p.estimate.seconds for p in planner.options(matmul)}
    assert planner.best(matmul).estimate.seconds == min(measured.values())
    assert IMPLEMENTATIONS.get("numpy.matmul").name in measured


def test_explain_needs_no_tuning_and_marks_unmeasured(script, capsys):
    assert cli.main(["explain", "--device", "planned", script]) == 0
    out = capsys.readouterr().out
    assert "(roofline), measured -" in out and "0 new measurements" in out


def test_script_arguments_reach_the_script(tmp_path, capsys):
    path = tmp_path / "echo.py"
    path.write_text("import sys\nprint('argv', sys.argv[1:])\n")
    assert cli.main(["explain", str(path), "--flag", "3"]) == 0
    assert "argv ['--flag', '3']" in capsys.readouterr().out



@pytest.mark.long
def test_explain_prints_the_stats_of_compiled_functions(tmp_path, capsys):
    path = tmp_path / "compiled_step.py"
    path.write_text(textwrap.dedent("""
        import tensorgraphs as tg
        import tensorgraphs.nn.functional as F

        model = tg.nn.Linear(8, 2)
        optimizer = tg.optim.SGD(model.parameters(), lr=0.1)

        @tg.compile
        def explained_step(x, y):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            return loss

        explained_step(tg.randn(4, 8), tg.randn(4, 2))
    """))
    assert cli.main(["explain", str(path)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "explained_step(" in line)
    assert "explained_step(float32[4, 8], float32[4, 2]): " in line
    assert "kernels, arena" in line and "naive" in line and "compiled in" in line


@pytest.mark.long
def test_compiled_functions_are_listed_with_their_argument_types(capsys: pytest.CaptureFixture[str]) -> None:
    import tensorgraphs as tg

    layer = tg.nn.Linear(3, 2)
    scaled = tg.compile(lambda x, scale, reduction, module, bias=None: module(x) * scale + bias)
    scaled(tg.ones(2, 3), 2.0, "mean", layer, bias=tg.ones(1))
    print_compiled_functions()
    assert "<lambda>(float32[2, 3], float, 'mean', Linear, bias=float32[1]): " in capsys.readouterr().out
