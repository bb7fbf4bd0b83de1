"""`tg run MODEL.onnx --input NAME=FILE.npy ...`: run a model on the cpu device, print its outputs or save them.

Inputs not given are an error naming them; outputs are saved as OUTDIR/<i>_<name>.npy, the name reduced to
letters, digits and underscores (a model's names never become paths as they are).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.onnx.names import attribute_name


def parse_inputs(pairs: list[str]) -> dict[str, np.ndarray]:
    arrays = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            fail("tg run", f"--input takes NAME=FILE.npy, got {pair!r}", kind=ArgumentError)
        arrays[name] = np.load(path, allow_pickle=False)
    return arrays


def output_path(directory: Path, index: int, name: str) -> Path:
    return directory / f"{index}_{attribute_name(name, set())}.npy"


def main(args: argparse.Namespace) -> int:
    from tensorgraphs.onnx.backend import prepare

    rep = prepare(args.model)
    given = parse_inputs(args.input or [])
    names = [proto.name for proto in rep.module.inputs]
    missing = [n for n in names if n not in given]
    unknown = sorted(set(given) - set(names))
    if missing or unknown:
        fail("tg run", f"the model takes inputs {names}; missing {missing}, unknown {unknown}", kind=ArgumentError)
    outputs = rep.run([given[n] for n in names])
    for index, (name, value) in enumerate(zip(rep.module.output_names, outputs)):
        if args.output:
            path = output_path(Path(args.output), index, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, value)
            print(f"{name}: {value.dtype} {value.shape} -> {path}")
        else:
            print(f"{name}: {value.dtype} {value.shape}\n{value}")
    return 0


def add_command(commands: argparse._SubParsersAction) -> None:
    command = commands.add_parser("run", help="run an ONNX model on given inputs (.npy files)")
    command.add_argument("model", help="the .onnx file")
    command.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="one per graph input")
    command.add_argument("--output", metavar="DIR", help="save the outputs here as .npy instead of printing them")
    command.set_defaults(run=main)
