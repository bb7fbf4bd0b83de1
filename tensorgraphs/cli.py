"""The `tg` command line: `tg demo`, `tg train`, `tg example`, `tg ops`, `tg run MODEL.onnx`."""

from __future__ import annotations

import argparse
import importlib
import sys

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

    return run_tune(args.script, args.script_args, args.budget)


def _explain(args: argparse.Namespace) -> int:
    from tensorgraphs.plan.tuning import run_explain

    return run_explain(args.script, args.script_args)


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
    tune = commands.add_parser("tune", help="run a script, then measure the candidate kernels of its composites")
    tune.add_argument("--budget", type=float, default=float("inf"), help="stop measuring after this many seconds")
    explain = commands.add_parser("explain", help="run a script, then show each composite's chosen implementation")
    for command, run in ((tune, _tune), (explain, _explain)):
        command.add_argument("script", help="Python script to run (as __main__)")
        command.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")
        command.set_defaults(run=run)
    _add_onnx_run(commands)
    args, rest = parser.parse_known_args(argv)
    if rest and args.command not in ("demo", "train", "example"):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
