"""The folders are layers: the engine below the front end never imports it (issue 15's layering).

Every module under the engine folders is parsed (imports inside functions count too) and may import neither
`tensorgraphs.frontend` nor `tensorgraphs.nn`. Code below them reaches Tensor-written bodies (decompositions,
gradient rules) through `graph.composite.as_value`, which the front end registers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tensorgraphs

PACKAGE = Path(tensorgraphs.__file__).parent
ENGINE = ("graph", "rewrite", "plan", "schedule", "codegen", "backends", "autograd", "memory")
FRONT_ENDS = ("tensorgraphs.frontend", "tensorgraphs.nn")


def front_end_imports(path: Path) -> list[str]:
    imported = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        imported += [n for n in names if n.startswith(FRONT_ENDS)]
    return imported


def engine_modules() -> dict[str, Path]:
    return {str(p.relative_to(PACKAGE)): p for folder in ENGINE for p in sorted((PACKAGE / folder).rglob("*.py"))}


def test_the_engine_does_not_import_the_front_end() -> None:
    breaking = {name: front_end_imports(path) for name, path in engine_modules().items()}
    assert {name: imports for name, imports in breaking.items() if imports} == {}


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from tensorgraphs.frontend.tensor import Tensor\n    import tensorgraphs.nn\n")
    assert front_end_imports(module) == ["tensorgraphs.frontend.tensor", "tensorgraphs.frontend.tensor.Tensor",
                                         "tensorgraphs.nn"]
