"""Dynamic shapes for `tg.compile(fn, dynamic=...)`: one compiled library for many sizes of chosen dimensions.

`dynamic=True` marks every dimension (above 1) of every tensor argument; `dynamic={"x": {0: "batch"}}` marks
dimension 0 of argument `x` as the symbol `batch` (or `tg.Dim("batch", 1, 4096)`, which bounds it). Dimensions
of equal size share a symbol under `dynamic=True`; dimensions named alike must be equal.

A call traces and renders its program as before (each size keeps its own trace, schedule and verified memory
plan), but compiles nothing when the source is an instance of one of its family's `SizeTemplate`s: that
template's library runs with the call's sizes. A template is fitted from programs rendered (never compiled) at
a few probe sizes near a call's, on the lattice of sizes the function takes there (every size, or only even
ones for a reshape into pairs); a size whose program is an instance of none (the renderer parallelizes a loop
only past some work, a stride-2 pool's output rows at an odd size) fits another, up to MAX_TEMPLATES per family.
A symbol the function cannot vary (its size is tied to a parameter's) stays fixed at the first call's value. A
size outside its `Dim` range, or whose program is an instance of no template, compiles a program of its own: a
guard that fails costs a compile, never a wrong result. A size the function cannot take at all raises its error
at the call, with a note naming the call's dynamic sizes.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tensorgraphs.codegen.size_template import SizeTemplate, probe_offsets
from tensorgraphs.errors import ArgumentError, TGError, fail

MAX_SIZE = 2**31 - 1
MAX_TEMPLATES = 4
"""Templates a family fits at most (each probe set costs about a dozen traces); later sizes compile alone."""

STRIDES = (1, 2, 4, 8)
"""Steps between the sizes a symbol is probed at, smallest first: the first at which the function traces."""

WIDER_LATTICES = (1, 2)
"""Multiples of a family's strides a fit tries, in order: a stride-2 conv's output size is a polynomial of its
input size only over sizes of one parity."""


@dataclass(frozen=True)
class Dim:
    """A symbolic dimension: `name` and the sizes it may take, `min` to `max` inclusive."""

    name: str
    min: int = 1
    max: int = MAX_SIZE

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.max:
            fail("tg.Dim", f"{self.name!r} needs 1 <= min <= max; got min={self.min}, max={self.max}",
                 kind=ArgumentError)


DynamicSpec = bool | None | Mapping[str, Mapping[int, str | Dim]]
Mark = tuple[int, int]  # (argument index in the call's arguments, positional then keyword; dimension)


class RenderedSource(Exception):  # noqa: N818  (control flow, not an error)
    """Raised by a probe's binder to stop at the rendered source: probes are never compiled."""

    def __init__(self, source: str) -> None:
        super().__init__("rendered only")
        self.source = source


class NotAnInstance(Exception):  # noqa: N818
    """The program rendered for a size is no instance of its family's template."""


@dataclass
class Family:
    """Calls that differ only in the sizes of the symbols in `free`: one template, one library."""

    free: list[Dim]  # the symbols that vary
    strides: list[int]  # the step between sizes each free symbol is probed at (`STRIDES`)
    marks: list[list[Mark]]  # where each free symbol is, in the arguments
    fixed: dict[Mark, int]  # marked dimensions the function could not vary, at their traced size
    templates: list[tuple[SizeTemplate, str]] = field(default_factory=list)  # each with its library's source
    used: set[int] = field(default_factory=set)  # the templates whose library a call ran (it is compiled)
    fits: int = 0  # templates fitted or tried

    def sizes(self, shapes: Mapping[int, tuple[int, ...]]) -> tuple[int, ...] | None:
        """The free symbols' sizes in a call with these argument shapes, or None if the family does not hold."""
        if any(shapes[i][d] != size for (i, d), size in self.fixed.items()):
            return None
        seen = [{shapes[i][d] for i, d in marks} for marks in self.marks]
        if any(len(sizes) != 1 for sizes in seen):
            return None
        sizes = tuple(size for (size,) in seen)
        return sizes if all(dim.min <= s <= dim.max for dim, s in zip(self.free, sizes)) else None

    def binder(self, sizes: tuple[int, ...]) -> Callable[[str], tuple[str, tuple[int, ...]]]:
        """For `Program`: the library of the first template the source at `sizes` is an instance of."""
        def bind(source: str) -> tuple[str, tuple[int, ...]]:
            for index, (template, library) in enumerate(self.templates):
                if template.matches(source, sizes):
                    self.used.add(index)
                    return library, sizes
            raise NotAnInstance(str(sizes))

        return bind

    def fit(self, sizes: tuple[int, ...], shapes: Mapping[int, tuple[int, ...]],
            render: Callable[[Mapping[int, tuple[int, ...]]], str]) -> bool:
        """Fit another template from probes near `sizes`; False if none fits or the family has fitted enough."""
        if self.fits >= MAX_TEMPLATES:
            return False
        self.fits += 1
        for widening in WIDER_LATTICES:
            strides = [stride * widening for stride in self.strides]
            for direction in (1, -1):  # probes above the sizes, else below (a threshold may lie on one side)
                probes = _probes(self.free, sizes, direction, strides)
                if probes is None:
                    continue
                try:
                    samples = [(probe, render(_resized(shapes, self.marks, probe))) for probe in probes]
                except Exception:  # noqa: BLE001  (a size the function cannot take: no template from these probes)
                    continue
                template = SizeTemplate.fit(samples)
                if template is not None:
                    self.templates.append((template, template.render()))
                    return True
        return False


def parameter_names(fn: Callable[..., Any]) -> list[str]:
    """The names of `fn`'s parameters in order (a module's `forward`'s)."""
    target = getattr(fn, "forward", fn)
    try:
        return [p.name for p in inspect.signature(target).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return []


class DynamicShapes:
    """The symbols a compiled function's calls may vary, and the families of programs they share."""

    def __init__(self, spec: DynamicSpec, names: list[str]) -> None:
        self.spec, self.names = spec, names
        if isinstance(spec, Mapping):
            for name, dims in spec.items():
                if not isinstance(dims, Mapping) or not all(isinstance(d, int) and isinstance(s, (str, Dim))
                                                            for d, s in dims.items()):
                    fail("compile", f"dynamic[{name!r}] must map dimension numbers to names or tg.Dim, got "
                         f"{dims!r}", kind=ArgumentError)
        self.families: dict[tuple, list[Family]] = {}

    @property
    def programs(self) -> int:
        """Template libraries compiled so far."""
        return sum(len(f.used) for families in self.families.values() for f in families)

    def argument_names(self, count: int, keywords: Sequence[str]) -> list[str | None]:
        """The parameter name of each of a call's `count` arguments, the last `keywords` passed by name."""
        positional = count - len(keywords)
        return [*self.names[:positional], *[None] * (positional - len(self.names)), *keywords]

    def symbols(self, shapes: Mapping[int, tuple[int, ...]], names: Sequence[str | None]) -> dict[Dim, list[Mark]]:
        """The symbols marked in a call with these tensor argument shapes (index -> shape) and argument names
        (`argument_names`), each with where it is."""
        found: dict[Dim, list[Mark]] = {}
        if self.spec is True:
            by_size: dict[int, list[Mark]] = {}
            for i, shape in shapes.items():
                for d, size in enumerate(shape):
                    if size > 1:
                        by_size.setdefault(size, []).append((i, d))
            return {Dim(f"size{k}"): marks for k, marks in enumerate(by_size.values())}
        for name, dims in (self.spec or {}).items():
            index = list(names).index(name) if name in names else None
            if index is None or index not in shapes:
                fail("compile", f"dynamic names {name!r}, which is not a tensor argument of this call "
                     f"(parameters: {', '.join(self.names) or 'unknown'})", kind=ArgumentError)
            for d, symbol in dims.items():
                if not -len(shapes[index]) <= d < len(shapes[index]):
                    fail("compile", f"dynamic marks dimension {d} of {name!r}, which has shape "
                         f"{list(shapes[index])}", kind=ArgumentError)
                dim = symbol if isinstance(symbol, Dim) else Dim(symbol)
                same = next((known for known in found if known.name == dim.name), dim)
                found.setdefault(same, []).append((index, d % len(shapes[index])))
        for dim, marks in found.items():
            sizes = {shapes[i][d] for i, d in marks}
            if len(sizes) > 1:
                fail("compile", f"the dimensions named {dim.name!r} differ in this call: {sorted(sizes)}",
                     kind=ArgumentError)
        return found

    def described(self, shapes: Mapping[int, tuple[int, ...]], names: Sequence[str | None]) -> str | None:
        """The call's dynamic sizes, for an error the call raised: `'batch' = 7 (x dimension 0)`; None where the
        specification does not fit the call (the error says so already)."""
        try:
            symbols = self.symbols(shapes, names)
        except TGError:
            return None

        def where(marks: list[Mark]) -> str:
            return ", ".join(f"{names[i] or f'argument {i}'} dimension {d}" for i, d in marks)

        parts = [f"{dim.name!r} = {shapes[i][d]} ({where(marks)})" for dim, marks in symbols.items()
                 for i, d in marks[:1]]
        return "dynamic sizes of this call: " + ("; ".join(parts) or "none")

    def family(self, key: tuple, shapes: Mapping[int, tuple[int, ...]], names: Sequence[str | None],
               render: Callable[[Mapping[int, tuple[int, ...]]], str]) -> tuple[Family, tuple[int, ...]] | None:
        """The family a call belongs to (made on first sight: which symbols vary) and its sizes; None when no
        family can hold the call. `render(shapes)` renders the program for other argument shapes, raising if the
        function cannot be traced at them."""
        for family in self.families.get(key, []):
            sizes = family.sizes(shapes)
            if sizes is not None:
                return family, sizes
        symbols = self.symbols(shapes, names)
        if any(not dim.min <= shapes[i][d] <= dim.max for dim, marks in symbols.items() for i, d in marks):
            return None
        strides = {dim: _stride(dim, marks, shapes, render) for dim, marks in symbols.items()}
        free = [dim for dim, stride in strides.items() if stride is not None]
        fixed = {m: shapes[m[0]][m[1]] for dim, marks in symbols.items() if dim not in free for m in marks}
        family = Family(free, [strides[dim] for dim in free], [symbols[dim] for dim in free], fixed)
        self.families.setdefault(key, []).append(family)
        sizes = family.sizes(shapes)
        assert sizes is not None
        return (family, sizes) if free else None


def _resized(shapes: Mapping[int, tuple[int, ...]], marks: Sequence[list[Mark]],
             sizes: Sequence[int]) -> dict[int, tuple[int, ...]]:
    out = {i: list(shape) for i, shape in shapes.items()}
    for group, size in zip(marks, sizes):
        for i, d in group:
            out[i][d] = size
    return {i: tuple(shape) for i, shape in out.items()}


def _probes(dims: Sequence[Dim], sizes: Sequence[int], direction: int,
            strides: Sequence[int]) -> list[tuple[int, ...]] | None:
    """Sizes from `sizes` on in `direction` (or the other way, near a bound), `strides` apart, to render at
    (`probe_offsets`); a size of 1 stays 1 (it broadcasts: programs differ), so the template holds for it alone.
    None if no room."""
    varying = [k for k, size in enumerate(sizes) if size != 1]
    top = max(max(offsets) for offsets in probe_offsets(1))
    steps = {}
    for k in varying:
        steps[k] = next((step for step in (direction * strides[k], -direction * strides[k])
                         if dims[k].min <= sizes[k] + step * top <= dims[k].max), 0)
    if not varying or 0 in steps.values():
        return None
    probes = []
    for offsets in probe_offsets(len(varying)):
        probe = list(sizes)
        for k, offset in zip(varying, offsets):
            probe[k] += steps[k] * offset
        probes.append(tuple(probe))
    return probes


def _stride(dim: Dim, marks: list[Mark], shapes: Mapping[int, tuple[int, ...]],
            render: Callable[[Mapping[int, tuple[int, ...]]], str]) -> int | None:
    """The smallest of STRIDES by which the symbol's size can change (in its range) with the function still
    tracing, or None: the function cannot vary it (it is tied to a parameter's size), so it stays fixed."""
    size = shapes[marks[0][0]][marks[0][1]]
    for stride in STRIDES:
        other = size + stride if size + stride <= dim.max else size - stride
        if not dim.min <= other <= dim.max:
            continue
        try:
            render(_resized(shapes, [marks], [other]))
        except Exception:  # noqa: BLE001  (any failure: the function cannot take that size)
            continue
        return stride
    return None
