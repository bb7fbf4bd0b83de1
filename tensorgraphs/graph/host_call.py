"""Host calls: nodes whose value a function of the running process computes, called back from a compiled program.

A collective across processes (the all-reduce of a data-parallel step) is not arithmetic the compiler can
generate: it is a `host_call` node, kept whole by the scheduler and run as one kernel that calls the named
function (`runtime.host_calls`) on its sources' arrays, between the kernels that produce the sources and those
that read the result. It has no decomposition, so it runs only in compiled programs.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from tensorgraphs.errors import UnsupportedError, fail
from tensorgraphs.graph.composite import Composite, make_node, register
from tensorgraphs.graph.node import Node


def _no_decomposition(*inputs: Any, function: str, sources: int, placement: str) -> Any:
    fail("host_call", f"the host function {function!r} runs only inside a compiled program (tg.compile); it has "
         "no decomposition the reference interpreter could run", kind=UnsupportedError)


def _infer(*inputs: Any, function: str, sources: int, placement: str) -> tuple[Any, tuple[int, ...]]:
    return inputs[0].dtype, (sum(math.prod(x.shape) for x in inputs[:sources]),)


HOST_CALL = register(Composite("host_call", _infer, _no_decomposition))
"""`host_call(function, sources, after?)`: a vector of all the sources' elements, one after the other, as the
host function `function` computes it from them."""


def host_call(function: str, sources: Sequence[Node], after: Node | None = None, placement: str = "") -> Node:
    """A node computed by the host function named `function` from `sources` (of one dtype; each read as its
    contiguous elements); `after` (only waited for) orders it after another node, such as the previous
    collective. `placement`: "early" for a function that starts asynchronous work, "late" for one that waits
    for it (see `codegen.loop_ir.HostCall`)."""
    if len({s.dtype for s in sources}) != 1:
        raise ValueError(f"host_call: the sources must have one dtype, got {sorted({s.dtype.name for s in sources})}")
    src = (*sources, *([] if after is None else [after]))
    size = sum(s.size for s in sources)
    params = {"function": function, "sources": len(sources), "placement": placement}
    return make_node(HOST_CALL, src, params, sources[0].dtype, (size,))


def runs_as_host_call(node: Node) -> bool:
    return node.op is HOST_CALL


def host_call_sources(node: Node) -> tuple[tuple[Node, ...], Node | None]:
    """The node's sources, and the node it waits for (if any)."""
    count = dict(node.arg)["sources"]
    return node.src[:count], (node.src[count] if len(node.src) > count else None)
