"""The `tg` command line: `tg demo`, `tg train`, `tg example`, `tg ops`, `tg tune`, `tg explain`, `tg build`,
`tg run MODEL.onnx`."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path
from typing import NoReturn

# `tg example NAME` runs this module of tensorgraphs.examples
EXAMPLES = {"digits": "digits_mlp", "cnn": "cnn"}


def _demo(args: argparse.Namespace) -> int:
    from tensorgraphs.examples import demo

    demo.main(args.rest)
    return 0


def _train(args: argparse.Namespace) -> int:
    from tensorgraphs.examples import gpt

    gpt.main(args.rest)
    return 0


def _example(args: argparse.Namespace) -> int:
    importlib.import_module(f"tensorgraphs.examples.{EXAMPLES[args.name]}").main(args.rest)
    return 0


def _ops(args: argparse.Namespace) -> int:
    """Print which ops each backend runs and whether their conformance checks against PyTorch pass."""
    from tensorgraphs.graph.composite import REGISTRY
    from tensorgraphs.graph.ops import Op
    from tensorgraphs.runtime.realize import BACKENDS

    devices = [args.device] if args.device else sorted(BACKENDS)
    print("Primitives (every backend must run all of them):", ", ".join(op.name for op in Op))
    print("Composites:", ", ".join(sorted(REGISTRY)))
    try:
        import torch  # noqa: F401
    except ImportError:
        print("\nPyTorch is not installed, so conformance is not checked: pip install 'tensorgraphs[test]'")
        return 0
    from tensorgraphs.testing.opinfo import OP_INFOS, check_op

    infos = [i for i in OP_INFOS if not args.op or i.name in args.op]
    width = max((len(i.name) for i in infos), default=4)
    print(f"\n{'op':<{width}}  " + "  ".join(f"{d:<8}" for d in devices))
    failed = 0
    for info in infos:
        cells = []
        for device in devices:
            failures = check_op(info, device)
            failed += bool(failures)
            cells.append("pass" if not failures else "FAIL")
            if failures and args.verbose:
                for f in failures[:3]:
                    print(f"    {device}: {f}", file=sys.stderr)
        print(f"{info.name:<{width}}  " + "  ".join(f"{c:<8}" for c in cells))
    print(f"\n{len(infos)} ops x {len(devices)} backends, {failed} failing")
    return 1 if failed else 0


def _tune(args: argparse.Namespace) -> int:
    from tensorgraphs.plan.tuning import run_tune

    return run_tune(args.script, args.script_args, args.budget, args.device)


def _explain(args: argparse.Namespace) -> int:
    from tensorgraphs.plan.tuning import run_explain

    return run_explain(args.script, args.script_args, args.device)


class _OneLineParser(argparse.ArgumentParser):
    """Errors as one line on stderr and exit status 2, as a C compiler reports a bad option."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, _, dims = text.rpartition("=")
    try:
        return name, tuple(int(d) for d in dims.split("x")) if dims else ()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=DIMS (such as input=1x3x32x32)") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="tg build", description="Compile a model into a standalone C library: "
                            "DIR/NAME.h, libNAME.so, libNAME.a, NAME.c, NAME.safetensors and example.c.")
    parser.add_argument("model", type=Path, help="an ONNX model (.onnx), or a Python file defining `model` and "
                        "`example_args`")
    parser.add_argument("--name", required=True, help="the library's name, prefixing every C symbol")
    parser.add_argument("-o", dest="directory", type=Path, required=True, help="the directory to write into")
    parser.add_argument("-O", dest="optimization", choices=("0", "1", "2", "3"), default="3",
                        help="the C compiler's optimization level (-O3 by default)")
    parser.add_argument("--target", choices=("native", "x86-64-v3", "x86-64-v4"), default="native",
                        help="the CPU to compile for (-march)")
    parser.add_argument("--cc", help="the C compiler (default: $TG_CC or gcc)")
    parser.add_argument("-v", dest="verbose", action="store_true", help="print the commands run")
    parser.add_argument("--embed-weights", action="store_true", help="put the weights inside the library")
    parser.add_argument("--no-openmp", action="store_true", help="one thread, no OpenMP runtime to link")
    parser.add_argument("--shape", type=_shape, action="append", default=[], metavar="INPUT=DIMS",
                        help="sizes of an ONNX input's symbolic dims, such as input=8x3x32x32 (default 1)")
    return parser


def _build(args: argparse.Namespace) -> int:
    options = build_parser().parse_args(args.rest)
    if not options.model.is_file():
        print(f"tg build: error: {options.model}: no such file", file=sys.stderr)
        return 2
    from tensorgraphs.errors import ArgumentError, TGError
    from tensorgraphs.export import BuildOptions, export
    from tensorgraphs.export.sources import load_source

    try:
        source = load_source(options.model, dict(options.shape))
        built = export(source.model, source.example_args, options.directory, options.name,
                       embed_weights=options.embed_weights, input_names=source.input_names,
                       output_names=source.output_names,
                       options=BuildOptions(f"-O{options.optimization}", options.target, options.cc or BuildOptions.cc,
                                            not options.no_openmp, options.verbose))
    except TGError as error:  # one line, without the "(at file:line)" of a Python caller
        print(f"tg build: error: {re.sub(r' [(]at [^()]*[)]$', '', str(error).splitlines()[0])}", file=sys.stderr)
        return 2 if isinstance(error, ArgumentError) else 1
    sizes = ", ".join(f"{path.name} ({path.stat().st_size / 1024:.1f} KiB)" for path in built.files.values()
                      if path.exists())
    print(f"built {options.name} in {built.build_seconds:.1f} s: {sizes}")
    return 0


def _add_onnx_run(commands: argparse._SubParsersAction) -> None:
    from tensorgraphs.onnx.run import add_command  # its module imports onnx only when a model runs

    add_command(commands)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tg", description="tensorgraphs: a deep-learning compiler")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="fit a small network and print losses and gradient norms")
    demo.set_defaults(run=_demo)
    train = commands.add_parser("train", add_help=False,
                                help="train a small character-level GPT on a shipped text (`tg train --help`)")
    train.set_defaults(run=_train)
    example = commands.add_parser("example", add_help=False,
                                  help="train a small classifier on scikit-learn's digits (`tg example cnn --help`)")
    example.add_argument("name", choices=EXAMPLES, help="digits: an MLP, cnn: a convolutional network")
    example.set_defaults(run=_example)
    ops = commands.add_parser("ops", help="table of ops x backends with conformance results")
    ops.add_argument("--device", help="check one backend only")
    ops.add_argument("--op", nargs="*", help="check only these ops")
    ops.add_argument("-v", "--verbose", action="store_true", help="print the first failures of each op")
    ops.set_defaults(run=_ops)
    tune = commands.add_parser("tune", help="run a script, then measure the candidates of its composites")
    tune.add_argument("--budget", type=float, default=float("inf"), help="stop measuring after this many seconds")
    explain = commands.add_parser("explain", help="run a script, then show each composite's chosen implementation")
    for command, run in ((tune, _tune), (explain, _explain)):
        command.add_argument("--device", help="run the script on this device (default: the script's own)")
        command.add_argument("script", help="Python script to run (as __main__)")
        command.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")
        command.set_defaults(run=run)
    build = commands.add_parser("build", add_help=False, help="compile a model into a C library (`tg build --help`)")
    build.set_defaults(run=_build)
    _add_onnx_run(commands)
    args, rest = parser.parse_known_args(argv)
    if rest and args.command not in ("demo", "train", "example", "build"):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
