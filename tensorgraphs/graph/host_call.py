"""Host calls: nodes whose value a function of the running process computes, called back from a compiled program.

A collective across processes (the all-reduce of a data-parallel step) is not arithmetic the compiler can
generate: it is a `host_call` node, kept whole by the scheduler and run as one kernel that calls the named
function (`runtime.host_calls`) on its source's array, between the kernels that produce the source and those
that read the result. It has no decomposition, so it runs only in compiled programs.
"""

from __future__ import annotations

from typing import Any

from tensorgraphs.errors import UnsupportedError, fail
from tensorgraphs.graph.composite import Composite, make_node, register
from tensorgraphs.graph.node import Node


def _no_decomposition(*inputs: Any, function: str) -> Any:
    fail("host_call", f"the host function {function!r} runs only inside a compiled program (tg.compile); it has "
         "no decomposition the reference interpreter could run", kind=UnsupportedError)


HOST_CALL = register(Composite("host_call", lambda source, *after, function: (source.dtype, source.shape),
                               _no_decomposition))
"""`host_call(function, source, after?)`: the value `function` gives `source`, of its dtype and shape."""


def host_call(function: str, source: Node, after: Node | None = None) -> Node:
    """A node computed by the host function named `function` from `source`; `after` (only waited for) orders
    it after another node, such as the previous collective."""
    src = (source,) if after is None else (source, after)
    return make_node(HOST_CALL, src, {"function": function}, source.dtype, source.shape)


def runs_as_host_call(node: Node) -> bool:
    return node.op is HOST_CALL
