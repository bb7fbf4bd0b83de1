"""The table of ONNX op lowerings, the node a lowering reads its attributes from, and the values it computes on.

A value is a `Tensor` or a numpy array: arrays are what is known when the graph is built (constants, shapes,
integer initializers) and what lowerings read where ONNX passes a shape, axes or sizes as an input. A node whose
inputs are all arrays is folded (evaluated once, on the reference interpreter) into an array.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import onnx

from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.errors import ArgumentError, UnsupportedError, fail
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.graph.ops import Op
from tensorgraphs.onnx.dtypes import tg_dtype
from tensorgraphs.runtime.tracing import is_placeholder

Value = Tensor | np.ndarray
STANDARD_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class OnnxNode:
    """One NodeProto as its lowering sees it: attributes with their defaults, the opset of its domain."""

    proto: onnx.NodeProto
    opset: int
    scope: Any = None
    """What control-flow ops run their subgraphs with: the values visible here and the model's opsets."""
    overrides: tuple[tuple[str, Any], ...] = ()

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    @property
    def outputs(self) -> int:
        return len(self.proto.output)

    def describe(self) -> str:
        domain = self.proto.domain or "ai.onnx"
        return f"node {self.proto.name!r} ({self.op_type}, domain {domain!r}, opset {self.opset})"

    def overriding(self, **attributes: Any) -> OnnxNode:
        """This node with some attributes fixed (an op lowered as another that it is a case of)."""
        return replace(self, overrides=self.overrides + tuple(attributes.items()))

    def attr(self, name: str, default: Any = None) -> Any:
        fixed = dict(self.overrides)
        if name in fixed:
            return fixed[name]
        for attribute in self.proto.attribute:
            if attribute.name == name:
                value = onnx.helper.get_attribute_value(attribute)
                if isinstance(value, bytes):
                    return value.decode()
                if isinstance(value, onnx.TensorProto):
                    return onnx.numpy_helper.to_array(value)
                return list(value) if isinstance(value, (list, tuple)) or hasattr(value, "extend") else value
        return default

    def has(self, name: str) -> bool:
        return any(attribute.name == name for attribute in self.proto.attribute)

    def fail(self, message: str, kind: type = UnsupportedError) -> Any:
        fail("onnx", f"{self.describe()}: {message}", kind=kind)

    def require(self, condition: bool, message: str) -> None:
        if not condition:
            self.fail(message, ArgumentError)


Lowering = Callable[..., Any]


@dataclass(frozen=True)
class LoweringRule:
    """How one ONNX op becomes tensorgraphs ops; `fold`: may run at build time when its inputs are all known."""

    op_type: str
    lower: Lowering
    fold: bool = True


LOWERINGS: dict[str, LoweringRule] = {}


def lowers(*op_types: str, fold: bool = True) -> Callable[[Lowering], Lowering]:
    """Register `lower(node, *inputs) -> value or tuple of values` for `op_types` (standard domain); absent
    optional inputs are None."""

    def register(lower: Lowering) -> Lowering:
        for op_type in op_types:
            LOWERINGS[op_type] = LoweringRule(op_type, lower, fold)
        return lower

    return register


def tensor(value: Value) -> Tensor:
    return value if isinstance(value, Tensor) else Tensor.from_numpy(np.asarray(value), _dtype_of(np.asarray(value)))


def _dtype_of(array: np.ndarray) -> Any:
    return tg_dtype(onnx.helper.np_dtype_to_tensor_dtype(array.dtype), "a constant")


def known(value: Value) -> np.ndarray:
    """The array of a value a lowering needs at build time (a shape, axes, sizes): a buffer's data (a graph input
    or an integer initializer, also while tg.compile traces), else the tensor computed now."""
    if isinstance(value, np.ndarray):
        return value
    node = value.node
    if node.op is Op.BUFFER and not is_placeholder(node):
        return np.asarray(node.arg.data)
    return value.numpy()


def evaluate(values: Sequence[Value | None]) -> tuple[np.ndarray | None, ...]:
    """Arrays of `values` computed on the reference interpreter (no compilation; allowed while tracing, as the
    values are built from constants only)."""
    nodes = [v.node for v in values if isinstance(v, Tensor)]
    computed = iter(REFERENCE.evaluate(nodes))
    return tuple(None if v is None else np.asarray(next(computed) if isinstance(v, Tensor) else v) for v in values)


def ints(value: Value | None) -> list[int] | None:
    return None if value is None else [int(v) for v in known(value).reshape(-1)]


def scalar(value: Value | None, default: Any = None) -> Any:
    return default if value is None else known(value).reshape(-1)[0].item()


def is_known(value: Value | None) -> bool:
    return value is None or isinstance(value, np.ndarray)


def has_lowering(node: onnx.NodeProto) -> bool:
    return node.domain in STANDARD_DOMAINS and node.op_type in LOWERINGS


def lowering_for(node: onnx.NodeProto, opset: int) -> LoweringRule:
    """The rule for `node`, or an error naming the op, its domain and opset and the node."""
    rule = LOWERINGS.get(node.op_type) if node.domain in STANDARD_DOMAINS else None
    if rule is None:
        OnnxNode(node, opset).fail("no lowering for this op in tensorgraphs (supported: the standard domain's "
                                   f"{len(LOWERINGS)} ops listed by `tensorgraphs.onnx.lowering.LOWERINGS`)")
    return rule

