"""`tg.export`: a compiled program written out as a standalone C library (no Python, no numpy at run time).

    tg.export(model, (x,), "out", name="mlp")   # out/mlp.h, libmlp.a, libmlp.so, mlp.c, mlp.safetensors, example.c

Anything `tg.compile` compiles exports, a whole training step included: the program is the one the Python
process runs for the same call (traced as `tg.compile` traces it; matrix products the BLAS kernel runs there are
planned again without it, `EXPORT_FEATURES`), its weights and state live in each context of
the library (`NAME_create` loads them, `NAME_run` updates them, `NAME_save` writes them back). The modules:
`program` (what feeds each buffer), `c_api` (NAME.h, NAME.c, example.c), `weights` (the safetensors layout),
`build` (the compiler driver), `names` (names, escaping).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from tensorgraphs.compiled import CompiledFunction
from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.export import c_api, names, weights
from tensorgraphs.export.build import BuildOptions, build_library
from tensorgraphs.export.program import ExportedProgram, describe
from tensorgraphs.nn.compiled_module import CompiledModule
from tensorgraphs.nn.module import Module
from tensorgraphs.optim.optimizer import Optimizer
from tensorgraphs.plan.choices import ALL_FEATURES, OPENBLAS, targeting

__all__ = ["BuildOptions", "Exported", "export"]


@dataclass(frozen=True)
class Exported:
    """What `export` wrote: the files (by kind: "header", "source", "static", "shared", "weights", "example")
    and the program's description."""

    files: dict[str, Path]
    program: ExportedProgram
    build_seconds: float


EXPORT_FEATURES = ALL_FEATURES - {OPENBLAS}
"""What an exported program may call: the cpu device's kernels but the BLAS one (the library links only libc, libm
and OpenMP). Its program is the one `tg.compile` builds for the same call planned for these features
(`plan.choices.targeting`), which is the one the Python process runs unless the BLAS kernel is chosen there."""


def export(fn: Callable[..., Any] | Module, example_args: Any, directory: str | Path, name: str, *,
           embed_weights: bool = False, options: BuildOptions | None = None,
           holders: Mapping[str, Module | Optimizer] | None = None,
           input_names: list[str] | None = None, output_names: list[str] | None = None) -> Exported:
    """Write `fn` (a function `tg.compile` can compile, a module, or what `tg.compile` returned), traced on
    `example_args` (a tuple of arguments, or one tensor), as a C library named `name` into `directory` (created
    if missing).

    The library's inputs are the tensor and number arguments the program reads, then its live values (`lr`,
    `random_key`); its outputs are `fn`'s results. Tensors it reads otherwise (parameters, optimizer state) are
    held by each context and named after the modules and optimizers `fn` reaches (`holders` overrides which:
    {"model": model, "opt": optimizer}); `input_names` names the arguments (default: `fn`'s parameter names),
    `output_names` the results (default: output, or output.0, output.1, ...). `embed_weights` puts the weights
    inside the library (`NAME_create(NULL)`); `options` sets the compiler, -O, -march, OpenMP and verbosity.
    """
    started = time.perf_counter()
    prefix = names.check_prefix(name)
    options = (options or BuildOptions()).check()
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    if isinstance(fn, CompiledModule):  # tg.compile(model): the module it compiles
        fn = fn._orig_mod
    compiled = fn if isinstance(fn, CompiledFunction) else CompiledFunction(fn)
    with targeting(EXPORT_FEATURES):
        trace = compiled.traced(*args)
    found = names.holders(compiled.fn) if holders is None else dict(holders)
    arguments = list(input_names) if input_names is not None else names.argument_names(compiled.fn, len(args))
    if len(arguments) != len(args):
        fail("export", f"{len(arguments)} input names for {len(args)} arguments", kind=ArgumentError)
    program = describe(trace, args, arguments, names.tensor_names(found), output_names)
    for spec in program.tensors:
        if len(spec.name.encode()) >= 1000:
            fail("export", f"tensor name {spec.name[:40]!r}... is longer than the library's reader takes "
                 "(1000 bytes)", kind=ArgumentError)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    files = {"header": folder / f"{prefix}.h", "source": folder / f"{prefix}.c",
             "weights": folder / f"{prefix}.safetensors", "example": folder / "example.c",
             "static": folder / f"lib{prefix}.a", "shared": folder / f"lib{prefix}.so"}
    weights.write(files["weights"], program.tensors, program.values)
    files["header"].write_text(c_api.render_header(prefix, program, embed_weights))
    files["source"].write_text(c_api.render_source(prefix, program, embed_weights))
    files["example"].write_text(c_api.render_example(prefix, embed_weights, options.openmp))
    build_library(folder, prefix, program.libraries, c_api.exported_symbols(prefix), options)
    return Exported(files, program, time.perf_counter() - started)
