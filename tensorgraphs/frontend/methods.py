"""Attach the op functions to `Tensor` as methods and Python operators, PyTorch's names."""

from __future__ import annotations

from typing import Any

from tensorgraphs import dtypes
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import inplace_ops, linalg, sampling, sorting
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.placement import to_arguments
from tensorgraphs.frontend.tensor import Tensor, cast
from tensorgraphs.graph.show import graph_text
from tensorgraphs.missing import tensor_getattr

_METHODS = {
    ew: """add sub mul div floor_divide remainder fmod reciprocal pow neg abs sign exp exp2 log log2 log10 log1p
           expm1 sqrt rsqrt sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh erf erfc sigmoid
           floor ceil round trunc frac maximum minimum clamp lerp masked_fill isnan isinf isfinite nan_to_num
           lt gt le ge eq ne logical_not logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor
           bitwise_not bitwise_left_shift bitwise_right_shift signbit where""",
    rd: """sum mean prod amax amin argmax argmin max min var std logsumexp all any norm cumsum cumprod
           count_nonzero""",
    mv: """reshape view permute transpose movedim expand squeeze unsqueeze flatten unflatten flip contiguous
           narrow split chunk unbind repeat tile repeat_interleave roll tril triu gather scatter_add index_select
           take_along_dim pad_dim""",
    linalg: "matmul mm bmm dot outer",
    sorting: "sort argsort msort topk",
    sampling: "multinomial",
}

for module, names in _METHODS.items():
    for name in names.split():
        setattr(Tensor, name, getattr(module, name))

Tensor.where = lambda self, condition, other: ew.where(condition, self, other)  # torch: x.where(cond, y)
Tensor.clip = ew.clamp
Tensor.absolute = ew.abs
Tensor.negative = ew.neg
Tensor.subtract = ew.sub
Tensor.multiply = ew.mul
Tensor.divide = ew.div
Tensor.true_divide = ew.div
Tensor.greater = ew.gt
Tensor.less = ew.lt
Tensor.equal = lambda self, other: bool(rd.all(ew.eq(self, other))) if self.shape == other.shape else False
Tensor.type_as = lambda self, other: cast(self, other.dtype)
Tensor.broadcast_to = mv.broadcast_to
Tensor.expand_as = lambda self, other: mv.expand(self, other.shape)
Tensor.view_as = lambda self, other: mv.reshape(self, other.shape)
Tensor.reshape_as = lambda self, other: mv.reshape(self, other.shape)
Tensor.T = property(mv.T)
Tensor.t = lambda self: mv.transpose(self, 0, 1) if self.ndim == 2 else mv.reshape(self, self.shape)
Tensor.mT = property(mv.mT)
Tensor.softmax = lambda self, dim, dtype=None: _functional().softmax(self, dim, dtype=dtype)
Tensor.log_softmax = lambda self, dim, dtype=None: _functional().log_softmax(self, dim, dtype=dtype)
Tensor.relu = lambda self: _functional().relu(self)
for _name in """clone assign copy_ fill_ zero_ normal_ uniform_ index_put_ scatter_ index_add_ detach_ new_tensor
                new_zeros new_ones new_empty new_full""".split():
    setattr(Tensor, _name, getattr(inplace_ops, _name))
Tensor.data = property(inplace_ops.detached, inplace_ops.set_data)
Tensor.__setitem__ = inplace_ops.setitem
_INPLACE = """add sub mul div floor_divide remainder fmod reciprocal pow neg abs sign exp exp2 log log2 log10 log1p
              expm1 sqrt rsqrt sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh erf erfc sigmoid
              floor ceil round trunc frac maximum minimum clamp clip lerp masked_fill nan_to_num lt gt le ge eq ne
              logical_not logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor bitwise_not
              bitwise_left_shift bitwise_right_shift relu scatter_add subtract multiply divide true_divide negative
              absolute tril triu cumsum cumprod greater less"""
for _name in _INPLACE.split():
    setattr(Tensor, _name + "_", inplace_ops.inplace(getattr(Tensor, _name), _name + "_"))
_AUGMENTED = {"__iadd__": "add_", "__isub__": "sub_", "__imul__": "mul_", "__itruediv__": "div_",
              "__ifloordiv__": "floor_divide_", "__imod__": "remainder_", "__ipow__": "pow_",
              "__iand__": "bitwise_and_", "__ior__": "bitwise_or_", "__ixor__": "bitwise_xor_",
              "__ilshift__": "bitwise_left_shift_", "__irshift__": "bitwise_right_shift_"}
for _name, _method in _AUGMENTED.items():
    setattr(Tensor, _name, getattr(Tensor, _method))


def _functional() -> Any:
    from tensorgraphs.nn import functional

    return functional


def to(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """tensor.to(dtype) / to(device) / to(device, dtype) / to(other): a cast; devices are checked (see placement)."""
    target = to_arguments("Tensor.to", args, kwargs)
    return self if target is None else cast(self, target)


Tensor.to = to


def _format(self: Tensor, spec: str) -> str:
    """f"{loss:.4f}" formats a 0-d tensor's value, as torch; other tensors take only the empty spec."""
    return format(self.item(), spec) if self.ndim == 0 else object.__format__(self, spec)


Tensor.__format__ = _format
Tensor.__getattr__ = tensor_getattr  # a missing torch name says so
for _name, _dtype in {"float": dtypes.float32, "double": dtypes.float64, "half": dtypes.float16,
                      "bfloat16": dtypes.bfloat16, "int": dtypes.int32, "long": dtypes.int64, "bool": dtypes.bool_,
                      "byte": dtypes.uint8, "short": dtypes.int16, "char": dtypes.int8}.items():
    setattr(Tensor, _name, lambda self, _d=_dtype: cast(self, _d))
Tensor.cpu = lambda self: self
Tensor.is_complex = lambda self: False  # complex values are frontend.complex.ComplexTensor
Tensor.graph = lambda self: graph_text(self)  # the graph as indented text (tg.show prints it)
Tensor.__getitem__ = mv.getitem

_OPERATORS = {
    "__add__": ew.add, "__radd__": lambda a, b: ew.add(b, a),
    "__sub__": ew.sub, "__rsub__": ew.rsub,
    "__mul__": ew.mul, "__rmul__": lambda a, b: ew.mul(b, a),
    "__truediv__": ew.div, "__rtruediv__": lambda a, b: ew.div(b, a),
    "__floordiv__": ew.floor_divide, "__rfloordiv__": lambda a, b: ew.floor_divide(b, a),
    "__mod__": ew.remainder, "__rmod__": lambda a, b: ew.remainder(b, a),
    "__pow__": ew.pow, "__rpow__": ew.rpow,
    "__matmul__": linalg.matmul, "__rmatmul__": lambda a, b: linalg.matmul(b, a),
    "__neg__": ew.neg, "__pos__": lambda a: a, "__abs__": ew.abs, "__invert__": ew.bitwise_not,
    "__and__": ew.bitwise_and, "__rand__": lambda a, b: ew.bitwise_and(b, a),
    "__or__": ew.bitwise_or, "__ror__": lambda a, b: ew.bitwise_or(b, a),
    "__xor__": ew.bitwise_xor, "__rxor__": lambda a, b: ew.bitwise_xor(b, a),
    "__lshift__": ew.bitwise_left_shift, "__rshift__": ew.bitwise_right_shift,
    "__lt__": ew.lt, "__gt__": ew.gt, "__le__": ew.le, "__ge__": ew.ge, "__eq__": ew.eq, "__ne__": ew.ne,
}
_DEFERRING = ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__matmul__", "__rmatmul__")
"""Operators that leave an operand whose class sets `tensor_operators_defer` (a complex tensor) to its own
reflected method, as Python does on NotImplemented."""


def _deferring(fn: Any) -> Any:
    def operator(a: Tensor, b: Any) -> Any:
        # a Tensor has no such attribute: asking it would build Tensor's missing-name error at every operator
        return NotImplemented if type(b) is not Tensor and getattr(b, "tensor_operators_defer", False) else fn(a, b)

    return operator


for _name, _fn in _OPERATORS.items():
    setattr(Tensor, _name, _deferring(_fn) if _name in _DEFERRING else _fn)
