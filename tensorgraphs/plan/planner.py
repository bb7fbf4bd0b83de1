"""Routes through a graph: every way to compute each composite, and the cheapest.

A composite node can run as any applicable kernel on any available backend
(its cost: the kernel plus COPY of its inputs in and its output out when the
backend is not where the executor keeps values), or as its reference
decomposition, whose primitives run on the reference interpreter and whose
nested composites are planned the same way, recursively. A decomposition that
contains its own composite, directly or through others, is not a valid route.

`Planner.routes` lazily yields every valid route (a tree of choices); `best`
returns the cheapest, which, because costs add up and every composite starts
and ends on the executor's home device, is the cheapest option of each
signature on its own: plans are cached per `Signature` (the structural key of
a composite with its inputs anonymous), so N identical layers are planned once.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from tensorgraphs.errors import TGError
from tensorgraphs.graph.composite import decompose, is_composite
from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.kerneldb import KernelDB, per_database
from tensorgraphs.plan.cost import CostModel, Estimate, reference_impl_hash
from tensorgraphs.plan.implementations import IMPLEMENTATIONS, KERNEL_BACKENDS, Implementation, ImplementationRegistry
from tensorgraphs.plan.signature import Signature, TensorSpec, placeholder_node, signature_of

DECOMPOSE = "decompose"


class PlanError(TGError, RuntimeError):
    """No valid way to compute a composite (no kernel applies and its decomposition contains itself)."""


@dataclass(frozen=True, eq=False)
class Route:
    """One way to compute `signature`: a kernel, or its decomposition with a route for each nested composite.

    `own` is the kernel with its copies, or the decomposition's primitives; `estimate` adds the children.
    """

    signature: Signature
    implementation: str
    own: Estimate
    children: tuple[Route, ...] = ()
    estimate: Estimate = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "estimate", Estimate.total([self.own, *(c.estimate for c in self.children)]))

    def describe(self, indent: str = "") -> list[str]:
        lines = [f"{indent}{self.signature}: {self.implementation} ({self.estimate.seconds * 1e6:.1f} us, "
                 f"{self.estimate.source})"]
        for child in self.children:
            lines += child.describe(indent + "  ")
        return lines


@dataclass(frozen=True)
class Decomposition:
    """One level of a composite's reference decomposition: its primitives and its nested composites."""

    primitives: tuple[Signature, ...]
    composites: tuple[Signature, ...]


@dataclass(frozen=True)
class GraphPlan:
    """A path for every composite node of a graph (the primitives outside composites run as they are)."""

    choices: tuple[tuple[Node, Route], ...]

    @property
    def seconds(self) -> float:
        return sum(path.estimate.seconds for _, path in self.choices)


def copy_signature(spec: TensorSpec) -> Signature:
    return Signature("copy", (), (spec,), spec)


def _product(makers: list[Callable[[], Iterator[Route]]]) -> Iterator[tuple[Route, ...]]:
    """Cartesian product of lazily made iterators (itertools.product would exhaust them all first)."""
    if not makers:
        yield ()
        return
    for head in makers[0]():
        for tail in _product(makers[1:]):
            yield (head, *tail)


class Planner:
    """Chooses implementations by estimated cost. `backends` limits which kernel backends are considered."""

    def __init__(self, cost_model: CostModel | None = None, registry: ImplementationRegistry = IMPLEMENTATIONS,
                 backends: Iterable[str] | None = None) -> None:
        self.cost_model = cost_model if cost_model is not None else CostModel()
        self.registry = registry
        self.backends = None if backends is None else frozenset(backends)
        self.planned = 0  # signatures planned (plan-cache misses), for tests and TG_DEBUG
        self._best: dict[Signature, Route] = {}
        self._decompositions: dict[Signature, Decomposition] = {}
        self._generation = self.cost_model.generation

    # -- costs -----------------------------------------------------------------
    def kernel_cost(self, kernel: Implementation, sig: Signature) -> Estimate:
        """The kernel's own time plus COPY in of every input and out of the output when off the home device."""
        model = self.cost_model
        parts = [model.estimate(kernel.name, kernel.impl_hash, sig)]
        backend = KERNEL_BACKENDS[kernel.backend]
        if not backend.home:
            parts += [model.estimate(backend.copy_in, backend.impl_hash, copy_signature(s)) for s in sig.inputs]
            parts.append(model.estimate(backend.copy_out, backend.impl_hash, copy_signature(sig.output)))
        return Estimate.total(parts)

    def primitive_cost(self, sig: Signature) -> Estimate:
        return self.cost_model.estimate(f"reference.{sig.name}", reference_impl_hash(), sig)

    def decomposition(self, sig: Signature) -> Decomposition:
        found = self._decompositions.get(sig)
        if found is None:
            node = placeholder_node(sig)
            inner = [n for n in toposort([decompose(node)], stop=set(node.src).__contains__) if n not in node.src]
            found = Decomposition(tuple(signature_of(n) for n in inner if not is_composite(n)),
                                  tuple(signature_of(n) for n in inner if is_composite(n)))
            self._decompositions[sig] = found
        return found

    def decomposition_cost(self, sig: Signature) -> Estimate:
        return Estimate.total(self.primitive_cost(p) for p in self.decomposition(sig).primitives)

    def valid_decomposition(self, sig: Signature, stack: tuple[str, ...]) -> Decomposition | None:
        """The decomposition, unless a nested composite is `sig`'s own or one on `stack` (the planning path here).

        Longer cycles are caught as the recursion reaches them, so no path ever contains its own composite.
        """
        found = self.decomposition(sig)
        inside = stack + (sig.name,)
        if any(child.name in inside for child in found.composites):
            return None
        return found

    # -- the cheapest path ---------------------------------------------------------
    def _check_generation(self) -> None:
        if self._generation != self.cost_model.generation:  # new measurements: plans may change
            self._best.clear()
            self._generation = self.cost_model.generation

    def best(self, sig: Signature) -> Route:
        """The cheapest path (cached per signature); `TG_DEBUG=plan` prints each newly planned one."""
        self._check_generation()
        known = sig in self._best
        path = self._best_within(sig, ())
        if not known and "plan" in os.environ.get("TG_DEBUG", "").split(","):
            print("\n".join(f"[plan] {line}" for line in path.describe()), file=sys.stderr)
        return path

    def best_for(self, node: Node) -> Route:
        return self.best(signature_of(node))

    def _best_within(self, sig: Signature, stack: tuple[str, ...]) -> Route:
        found = self._best.get(sig)
        if found is not None:
            return found
        self.planned += 1
        options: list[tuple[float, int, Implementation | None, Callable[[], Route]]] = []
        for i, kernel in enumerate(self.registry.candidates(sig, self.backends)):
            cost = self.kernel_cost(kernel, sig)
            options.append((cost.seconds, i, kernel, lambda k=kernel, c=cost: Route(sig, k.name, c)))
        decomposed = self._decomposed_route(sig, stack)
        if decomposed is not None:
            options.append((decomposed.estimate.seconds, len(options), None, lambda: decomposed))
        for _, _, kernel, make in sorted(options, key=lambda option: option[:2]):
            if kernel is None or self.registry.ensure_verified(kernel):
                found = self._best[sig] = make()
                return found
        raise PlanError(f"no way to compute {sig}: no verified kernel applies and its decomposition contains "
                        f"itself (through {' -> '.join(stack + (sig.name,))})")

    def _decomposed_route(self, sig: Signature, stack: tuple[str, ...]) -> Route | None:
        decomposition = self.valid_decomposition(sig, stack)
        if decomposition is None:
            return None
        try:
            children = tuple(self._best_within(child, stack + (sig.name,)) for child in decomposition.composites)
        except PlanError:
            return None
        return Route(sig, DECOMPOSE, self.decomposition_cost(sig), children)

    def options(self, sig: Signature) -> list[Route]:
        """Each verified kernel, and the decomposition with the best path of each nested composite."""
        self._check_generation()
        found = [Route(sig, k.name, self.kernel_cost(k, sig)) for k in self.registry.candidates(sig, self.backends)
                 if self.registry.ensure_verified(k)]
        decomposed = self._decomposed_route(sig, ())
        return found + ([decomposed] if decomposed is not None else [])

    def plan(self, roots: list[Node]) -> GraphPlan:
        """The cheapest path of every composite node in the graph of `roots`."""
        return GraphPlan(tuple((n, self.best_for(n)) for n in toposort(roots) if is_composite(n)))

    # -- every path ------------------------------------------------------------------
    def routes(self, sig: Signature, stack: tuple[str, ...] = ()) -> Iterator[Route]:
        """Every valid route of one composite, lazily: its kernels (verified first), then each decomposition route."""
        self._check_generation()
        for kernel in self.registry.candidates(sig, self.backends):
            if self.registry.ensure_verified(kernel):
                yield Route(sig, kernel.name, self.kernel_cost(kernel, sig))
        decomposition = self.valid_decomposition(sig, stack)
        if decomposition is None:
            return
        inside = stack + (sig.name,)
        own = self.decomposition_cost(sig)
        makers = [lambda child=child: self.routes(child, inside) for child in decomposition.composites]
        for children in _product(makers):
            yield Route(sig, DECOMPOSE, own, children)

    def graph_routes(self, roots: list[Node]) -> Iterator[GraphPlan]:
        """Every combination of routes of the graph's composite nodes, lazily."""
        composites = [n for n in toposort(roots) if is_composite(n)]
        makers = [lambda n=n: self.routes(signature_of(n)) for n in composites]
        for chosen in _product(makers):
            yield GraphPlan(tuple(zip(composites, chosen)))


_PLANNERS: dict[int, Planner] = {}


def default_planner(db: KernelDB | None = None) -> Planner:
    """The planner over the default kernel database (`per_database`)."""
    return per_database(_PLANNERS, lambda db: Planner(CostModel(db)), db)
