"""The primitive operators: the whole instruction set every model decomposes into.

Exact semantics of each op live in docs/ops.md; this module holds the one
shape/dtype rule per op. Stages attach their own rule tables keyed by `Op`
(the reference backend's numpy kernels, autograd's gradient rules), so
searching for `Op.MAX` finds everything about MAX.
"""

from __future__ import annotations

from enum import Enum, auto


class Op(Enum):
    # sources
    BUFFER = auto()  # arg: Buffer (data owned outside the graph)
    CONST = auto()  # arg: Python scalar, every element equal
    IOTA = auto()  # 1-D, element i = i
    # unary
    EXP2 = auto()
    LOG2 = auto()
    SIN = auto()
    SQRT = auto()
    CAST = auto()  # dtype conversion, C semantics (float->int truncates)
    # binary
    ADD = auto()
    MUL = auto()
    DIV = auto()  # float: IEEE division; integer: floor division
    MOD = auto()  # integer only: remainder with the divisor's sign
    MAX = auto()  # NaN propagates
    CMPLT = auto()
    CMPNE = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    # ternary
    WHERE = auto()
    # reductions, arg: sorted tuple of axes; reduced axes keep size 1
    REDUCE_SUM = auto()
    REDUCE_MAX = auto()
    # movement (views), arg described per op
    RESHAPE = auto()  # arg: new shape
    PERMUTE = auto()  # arg: axis order
    EXPAND = auto()  # arg: new shape, only size-1 axes grow
    PAD = auto()  # arg: ((before, after), ...) zero padding
    SHRINK = auto()  # arg: ((start, stop), ...)
    FLIP = auto()  # arg: tuple of axes
    # indexing, arg: axis
    GATHER = auto()  # src: (x, index)
    SCATTER_ADD = auto()  # src: (base, index, values)
    # state
    ASSIGN = auto()  # src: (target, value)
    COPY = auto()  # arg: device name

    __hash__ = object.__hash__  # members are singletons; Enum's own hash is Python code on every graph lookup


UNARY = frozenset({Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.CAST})
BINARY = frozenset({Op.ADD, Op.MUL, Op.DIV, Op.MOD, Op.MAX, Op.CMPLT, Op.CMPNE, Op.AND, Op.OR, Op.XOR})
COMPARISON = frozenset({Op.CMPLT, Op.CMPNE})
COMMUTATIVE = frozenset({Op.ADD, Op.MUL, Op.MAX, Op.CMPNE, Op.AND, Op.OR, Op.XOR})
ELEMENTWISE = UNARY | BINARY | {Op.WHERE}
REDUCE = frozenset({Op.REDUCE_SUM, Op.REDUCE_MAX})
MOVEMENT = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.PAD, Op.SHRINK, Op.FLIP})
SOURCES = frozenset({Op.BUFFER, Op.CONST, Op.IOTA})
