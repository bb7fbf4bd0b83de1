"""Matrix products run by a GEMM library instead of lowered loops ("extern" kernels).

A float32 `matmul` composite has three candidates (`PRODUCT_CANDIDATES`, chosen per shape by the planner,
`plan.choices`): the generated AVX-512 GEMM (`tensorgraphs.kernels.gemm`), the BLAS kernel with the same
contract (`tensorgraphs.kernels.blas`), or its decomposition. Run by a library, it is kept whole by the
scheduler: its kernel is one `GemmCall` of the chosen C function reading two buffers and writing its own.
An operand needs no copy when it is a buffer, a reshape of one (buffers are contiguous), a slice of one's leading
dim (a contiguous block: an offset, as the q/k/v rows of an attention's in_proj
weight), a slice of the rows of those (each batch entry's first rows: the filled rows of a KV cache, read with
the source's batch stride), or any of those with its last two axes swapped (the transpose becomes
swapped strides); anything else is materialized into a buffer first. The kernel reads and writes through its
`Kernel.buffers` like any other, so liveness and the memory planner see it as one.

Elementwise consumers the library applies on its registers before the store
(gemm.h: c = activation(alpha * (a @ b) + bias) + residual, or the activation after
the residual add, as a ResNet block's relu) are fused into the
call by `fuse_epilogues`, so `gelu(linear(x, w, b))` is one kernel. Each
`EpilogueRule` is a pattern over the primitive graph and the stage of the
epilogue it fills; activations are matched against their graphs (`ACTIVATIONS`:
relu's primitives, the registered gelu composite, decomposed as the scheduler
decomposes them; constants match through broadcasts, commutative operands either way). A
rule fuses only when the value it consumes is needed nowhere else (a training
step keeps the pre-activation for the backward pass: bias fuses, the activation
does not), and only operands that are buffers anyway (inputs, other products,
roots) become bias or residual; a bias may be a block of one (a slice of the
stacked q/k/v in_proj_bias, read at an offset like an operand).

gelu's backward pass (the gelu_backward composite, g * gelu'(x)) fuses into the product that computes g
(`gelu_grad_rule`): the epilogue's gradient activation multiplies by gelu'(x), reading x as its residual, so the
gradient of gelu's output is never stored.

An operand that is an activation of a buffer (`gelu(h) @ w`, and the weight gradient reading the same gelu(h))
is read as that buffer with a prologue (`fuse_prologues`): the library activates the operand while packing it,
so the activated value is never stored. This is done only when nothing but products reads the activated value,
and after the epilogues, so an activation that can be the producer's epilogue is computed once there instead.

TG_GEMM=0 turns the libraries off (matmuls lowered to loops, for comparison); set it before
the first program is built, since compiled programs are cached by graph.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tensorgraphs import dtypes
from tensorgraphs.codegen.loop_ir import GemmCall, GemmEpilogue, Kernel, KernelParam
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import REGISTRY, Composite, as_node, as_value, is_composite, make_node
from tensorgraphs.graph.node import Node, rebuild, toposort
from tensorgraphs.graph.ops import Op
from tensorgraphs.kernels import blas, gemm
from tensorgraphs.plan.choices import KERNEL_LIBRARIES, OPENBLAS, Candidate, register_candidates, route_of
from tensorgraphs.rewrite import graph_pattern, optimize, pattern_variable
from tensorgraphs.rewrite.pattern import Bindings, Pattern, op, same_value, var


def _product_fits(node: Node) -> bool:
    """Whether the GEMM library can compute `node`: a float32 or bfloat16 matrix product (`gemm.GEMM_FUNCTIONS`)
    whose batch dims fold into one."""
    if not is_composite(node) or node.op.name != "matmul" or (node.dtype.name,) * 2 not in gemm.GEMM_FUNCTIONS:
        return False
    a, b = node.src
    shapes_fit = a.ndim == b.ndim >= 2 and a.shape[:-2] == b.shape[:-2]  # batch dims fold into one (contiguous)
    return shapes_fit and a.dtype == b.dtype == node.dtype and min(a.shape + b.shape[-1:]) > 0


def _float32_product(node: Node) -> bool:
    """A product of float32 values (the BLAS kernel's only kind)."""
    return node.dtype == dtypes.float32 and operand_dtype(node) == dtypes.float32


def libraries_enabled() -> bool:
    """TG_GEMM=0 does not turn off the kernel libraries (products and convolutions: GEMM, BLAS, im2col)."""
    return os.environ.get("TG_GEMM", "1") != "0"


def gemm_enabled() -> bool:
    """The GEMM library runs on this machine and TG_GEMM=0 does not turn it off."""
    return libraries_enabled() and gemm.available()


PRODUCT_CANDIDATES = (
    Candidate("gemm", lambda node: gemm_enabled() and _product_fits(node), prior=1.0),
    Candidate("blas", lambda node: libraries_enabled() and blas.available() and _product_fits(node)
              and _float32_product(node), prior=1.2, needs=frozenset({KERNEL_LIBRARIES, OPENBLAS})),
)
register_candidates("matmul", *PRODUCT_CANDIDATES)
GEMM_ROUTES = frozenset(c.name for c in PRODUCT_CANDIDATES)
"""The library candidates of a product (all take tg_gemm_f32's arguments, gemm.h)."""


def runs_as_gemm(node: Node) -> bool:
    """Whether `node` is a matrix product the planner runs by a GEMM library (`GEMM_ROUTES`)."""
    return is_composite(node) and node.op.name == "matmul" and route_of(node) in GEMM_ROUTES


def gemm_function(node: Node) -> str:
    """The C function computing product `node` (a `matmul` or a `GEMM_EPILOGUE`: its product's choice): the BLAS
    kernel, or the GEMM library's kernel for its operand and result dtypes."""
    if node.op is GEMM_EPILOGUE:
        a, b = node.src[:2]
        dtype = dtypes.bfloat16 if dict(node.arg)["rounded"] else node.dtype  # a rounded result, maybe widened
        node = make_node(REGISTRY["matmul"], (a, b), {}, dtype, a.shape[:-1] + b.shape[-1:])
    if route_of(node) == "blas":
        return blas.C_FUNCTION
    return gemm.C_FUNCTIONS[gemm.GEMM_FUNCTIONS[operand_dtype(node).name, node.dtype.name]]


def _swaps_last_two(node: Node) -> bool:
    order = tuple(range(node.ndim))
    return node.op is Op.PERMUTE and tuple(node.arg) == order[:-2] + (order[-1], order[-2])


def _transposed(view: Node) -> Node:
    """`view` with its last two axes swapped, a swap of a swap undone."""
    if _swaps_last_two(view):
        return view.src[0]
    order = list(range(view.ndim))
    order[-2:] = order[-1], order[-2]
    return Node(Op.PERMUTE, view.dtype, view.shape[:-2] + view.shape[:-3:-1], (view,), tuple(order))


def transposed_product(node: Node, uses: Mapping[Node, int]) -> Node | None:
    """`node` = mT(a @ b) as mT(b) @ mT(a), when nothing else reads a @ b: the GEMM then writes the transposed
    product itself, not the product and then a transposed copy of it (a weight gradient, typically). The same
    products are summed in the same order."""
    if not _swaps_last_two(node) or not runs_as_gemm(product := node.src[0]) or uses[product] != 1:
        return None
    a, b = product.src
    return Node(product.op, product.dtype, node.shape, (_transposed(b), _transposed(a)), product.arg)


def _storage(view: Node) -> Node:
    """The node whose contiguous buffer a chain of reshapes reads."""
    while view.op is Op.RESHAPE:
        view = view.src[0]
    return view


def _leading_slice_start(view: Node) -> int | None:
    """Elements of its source before `view`, when `view` slices only the leading dim (a contiguous block)."""
    if view.op is not Op.SHRINK:
        return None
    (start, _), *rest = view.arg
    inner = view.src[0].shape[1:]
    if any(bounds != (0, size) for bounds, size in zip(rest, inner)):
        return None
    return start * math.prod(inner)


FLOAT_STORAGE = (dtypes.float32, dtypes.bfloat16)
"""Dtypes whose buffers hold float32 values (bfloat16 is stored as float32), which the library reads as floats."""


def widens_bfloat16(node: Node) -> bool:
    """A cast of bfloat16 to float32: its buffer holds the same floats (bfloat16 is stored as float32)."""
    return node.op is Op.CAST and node.dtype == dtypes.float32 and node.src[0].dtype == dtypes.bfloat16


def _rounds_to_bfloat16(node: Node) -> bool:
    """A cast of float32 to bfloat16: a product that rounds its operands to bfloat16 while packing them reads it as
    its float32 source (so float32 master weights need no bfloat16 copy)."""
    return node.op is Op.CAST and node.dtype == dtypes.bfloat16 and node.src[0].dtype == dtypes.float32


def _contiguous_chain(view: Node, rounding: bool = False) -> list[Node]:
    """`view` and the reshapes and slices of the leading dim under it (each a contiguous block of its source), casts
    that widen bfloat16, and with `rounding` (the reader rounds to bfloat16) casts to bfloat16, down to the node
    whose buffer holds its elements (last)."""
    chain = [view]
    while (chain[-1].op is Op.RESHAPE or _leading_slice_start(chain[-1]) is not None or widens_bfloat16(chain[-1])
           or (rounding and _rounds_to_bfloat16(chain[-1]))):
        chain.append(chain[-1].src[0])
    return chain


def _row_slice_start(view: Node) -> int | None:
    """Elements of its source before `view`, when `view` slices only the rows (the second last dim) of a batch of
    matrices: each batch entry's rows start there, a batch stride of the source's apart (`operand_strides`)."""
    if view.op is not Op.SHRINK or view.ndim < 3:
        return None
    source = view.src[0].shape
    (start, _), kept = view.arg[-2], [*view.arg[:-2], view.arg[-1]]
    if any(bounds != (0, size) for bounds, size in zip(kept, [*source[:-2], source[-1]])):
        return None
    return start * source[-1]


def _view_chain(view: Node, rounding: bool = False) -> list[Node]:
    """`view` and the views under it down to the node whose buffer holds its elements (last): a swap of the
    last two axes, then a slice of the rows, then reshapes, slices of the leading dim and casts (see
    `_contiguous_chain`)."""
    chain = [view]
    if _swaps_last_two(chain[-1]):
        chain.append(chain[-1].src[0])
    if _row_slice_start(chain[-1]) is not None:
        chain.append(chain[-1].src[0])
    return [*chain[:-1], *_contiguous_chain(chain[-1], rounding)]


def _storage_and_offset(chain: list[Node]) -> tuple[Node, int]:
    *views, storage = chain
    return storage, sum(_leading_slice_start(node) or _row_slice_start(node) or 0 for node in views)


def contiguous_storage(view: Node) -> tuple[Node, int]:
    """The node whose buffer holds `view`'s elements in `view`'s own order (through reshapes, slices of the leading
    dim and casts widening bfloat16; never a transpose), and the element offset where they start there."""
    return _storage_and_offset(_contiguous_chain(view))


def operand_dtype(product: Node) -> dtypes.DType:
    """What the library rounds a product's operands to while packing them: bfloat16 for a bfloat16 product, and
    for a float32 product of bfloat16 values (each operand a widened bfloat16 node under its views), which sums
    the same exact products in float32 (a float16/bfloat16 linear is one: torch's addmm rounds once, at the end);
    float32 otherwise."""
    if product.dtype == dtypes.bfloat16 or (product.op is GEMM_EPILOGUE and dict(product.arg)["rounded"]):
        return dtypes.bfloat16  # a bfloat16 product (maybe widened by its epilogue)
    widened = all(any(map(widens_bfloat16, _view_chain(operand))) for operand in product.src[:2])
    return dtypes.bfloat16 if widened else dtypes.float32


def operand_storage(view: Node, rounding: bool = False) -> tuple[Node, int]:
    """The node whose buffer holds `view`'s elements (`rounding`: as read by a product that rounds its operands to
    bfloat16), and the element offset where they start there."""
    return _storage_and_offset(_view_chain(view, rounding))


def gemm_operand_bases(product: Node) -> list[Node]:
    """The nodes whose buffers a product reads its operands from."""
    rounding = operand_dtype(product) == dtypes.bfloat16
    return [operand_storage(operand, rounding)[0] for operand in product.src[:2]]


def operand_strides(view: Node) -> tuple[int, int, int]:
    """(batch, row, column) element strides of `view` read from its base's contiguous buffer; the batch dims
    are contiguous there, so they fold into one of stride rows * columns (the rows of the source where `view`
    slices them: `_row_slice_start`)."""
    stored = view.src[0] if _swaps_last_two(view) else view
    rows = stored.src[0].shape[-2] if _row_slice_start(stored) is not None else stored.shape[-2]
    contiguous = [math.prod(stored.shape[d + 1:]) for d in range(stored.ndim)]
    if _swaps_last_two(view):
        contiguous[-2], contiguous[-1] = contiguous[-1], contiguous[-2]
    return rows * stored.shape[-1], contiguous[-2], contiguous[-1]


# ---------------------------------------------------------------------------
# Epilogues: the elementwise consumers of a product that the GEMM applies itself.
# ---------------------------------------------------------------------------


def _relu(x: Node) -> Node:
    """max(x, 0) keeping NaN, in the primitives the front end's relu is made of: where(x < 0 or x == 0, 0, x)."""
    zero = g.const(0.0, x.dtype, x.shape)
    equal = g.binary(Op.XOR, g.binary(Op.CMPNE, x, zero), g.const(True, dtypes.bool_, x.shape))
    return g.where(g.binary(Op.OR, g.binary(Op.CMPLT, x, zero), equal), zero, x)


def _gelu_tanh(x: Node) -> Node:
    return make_node(REGISTRY["gelu"], (x,), {"approximate": "tanh"}, x.dtype, x.shape)


ACTIVATIONS: dict[str, Callable[[Node], Node]] = {"relu": _relu, "gelu_tanh": _gelu_tanh}
"""The library's activations (`gemm.ACTIVATIONS`) as graphs: relu is no composite, so its primitives; gelu the
registered composite."""

GELU_TANH_GRAD = "gelu_tanh_grad"
"""The epilogue's gradient activation (`gemm.EPILOGUE_ACTIVATIONS`): the result times gelu'(residual)."""


def _gelu_tanh_grad(grad: Node, x: Node) -> Node:
    """grad * gelu'(x), tanh form: the registered gelu_backward composite (gelu's gradient rule)."""
    return make_node(REGISTRY["gelu_backward"], (grad, x), {"approximate": "tanh"}, grad.dtype, grad.shape)


def activate_and_add(out: Any, activation: str, residual: Any | None, after_residual: bool) -> Any:
    """`out` with the epilogue's activation and residual (None: none) in gemm.h's order: the residual added after the
    activation, or with `after_residual` before it."""
    if residual is not None and after_residual:
        out = out + residual
    out = out if activation == "none" else as_value(ACTIVATIONS[activation](as_node(out)))
    return out + residual if residual is not None and not after_residual else out


def _epilogue_decomposition(a: Any, b: Any, *operands: Any, shape: tuple[int, ...], alpha: float, bias: bool,
                            bias_offset: int, activation: str, residual: bool, activation_after_residual: bool,
                            rounded: bool = False, widened: bool = False) -> Any:
    """What the fused call computes, in the order gemm.h applies it (the reference for the kernel); the gradient
    activation reads the residual instead of adding it."""
    given = iter(operands)
    out = ((a @ b) * alpha).reshape(shape)
    if bias:
        out = out + next(given).reshape(-1).narrow(0, bias_offset, shape[-1]).float()
    if activation == GELU_TANH_GRAD:
        out = as_value(_gelu_tanh_grad(as_node(out), as_node(next(given).reshape(shape))))
    else:
        out = activate_and_add(out, activation, next(given).reshape(shape) if residual else None,
                               activation_after_residual)
    out = out.bfloat16() if rounded else out
    return out.float() if widened else out


def _epilogue_dtype(rounded: bool, widened: bool) -> dtypes.DType:
    return dtypes.bfloat16 if rounded and not widened else dtypes.float32


def _epilogue_infer(a: Any, b: Any, *operands: Any, shape: tuple[int, ...], rounded: bool = False,
                    widened: bool = False, **params: Any) -> tuple[dtypes.DType, tuple[int, ...]]:
    return _epilogue_dtype(rounded, widened), shape


GEMM_EPILOGUE = Composite("matmul_epilogue", _epilogue_infer, _epilogue_decomposition)
"""A product with its epilogue: sources (a, b, bias?, residual?), bias a vector over the last axis (starting
`bias_offset` elements into its buffer: the q, k or v block of a stacked in_proj_bias; float32 or bfloat16) and
residual shaped like the result, both contiguous buffers; `rounded`: the result rounded to bfloat16 last (a
product of bfloat16 values, whose kernel rounds its result), and `widened`: that bfloat16 result as float32 (the
same floats). Made by `fuse_epilogues` only, so it is not registered."""

LAYOUT, ALPHA, BIAS, ACTIVATION, RESIDUAL, ACTIVATION_AFTER_RESIDUAL, ROUND, WIDEN = range(8)
"""Epilogue stages in the order gemm.h applies them (one activation, before or after the residual); a reshape
keeping the rows (LAYOUT) may come anywhere."""


@dataclass(frozen=True)
class EpilogueChain:
    """A library call's result (`product`: a matrix product, or another `EpilogueKind`'s call) and the epilogue
    fused into it so far; `stage` is the last stage filled."""

    product: Node
    kind: EpilogueKind
    stage: int = LAYOUT
    alpha: float = 1.0
    bias: Node | None = None
    bias_offset: int = 0
    activation: str = "none"
    residual: Node | None = None
    activation_after_residual: bool = False
    rounded: bool = False
    widened: bool = False

    def fuses_anything(self, end: Node) -> bool:
        """Whether the chain ending at `end` does more than the product: an epilogue, or a reshape of it (the
        call writes the reshaped result, so a reshaped product that is a root needs no copy)."""
        return self.stage > LAYOUT or end is not self.product

    def operands(self) -> tuple[Node, ...]:
        return tuple(n for n in (self.bias, self.residual) if n is not None)

    @property
    def rounds_itself(self) -> bool:
        """A product of bfloat16 values typed bfloat16: its kernel rounds the result, so the graph's epilogue ops
        come after that rounding."""
        return self.product.dtype == dtypes.bfloat16

    def epilogue_params(self) -> dict[str, Any]:
        """The fused node's epilogue parameters (its sources end with `operands()` on the new graph)."""
        return {"alpha": self.alpha, "bias": self.bias is not None, "bias_offset": self.bias_offset,
                "activation": self.activation, "residual": self.residual is not None,
                "activation_after_residual": self.activation_after_residual}

    def node(self, shape: tuple[int, ...], rebuilt: dict[Node, Node]) -> Node:
        return self.kind.build(self, shape, rebuilt)


def _product_with_epilogue(chain: EpilogueChain, shape: tuple[int, ...], rebuilt: dict[Node, Node]) -> Node:
    a, b = chain.product.src
    sources = tuple(rebuilt[n] for n in (a, b, *chain.operands()))
    rounded = chain.rounded or chain.rounds_itself
    params = {"shape": shape, **chain.epilogue_params(), "rounded": rounded, "widened": chain.widened}
    return make_node(GEMM_EPILOGUE, sources, params, _epilogue_dtype(rounded, chain.widened), shape)


Update = Callable[[EpilogueChain, Bindings], EpilogueChain]


@dataclass(frozen=True)
class EpilogueRule:
    """`pattern` binds "x" to the end of a chain (a product, or an epilogue op fused into one); `update` fills
    `stage` of the chain's epilogue from the bindings."""

    stage: int
    pattern: Pattern
    update: Update


@dataclass(frozen=True)
class EpilogueKind:
    """Library calls whose kernel applies an epilogue (gemm.h's): `starts(node)` says whether `node` is such a call
    (a chain starts there), `rules(is_chain_end)` are what extends a chain, `build(chain, shape, rebuilt)` is the
    node a fused chain becomes on the new graph."""

    starts: Callable[[Node], bool]
    rules: Callable[[Callable[[Node], bool]], list[EpilogueRule]]
    build: Callable[[EpilogueChain, tuple[int, ...], dict[Node, Node]], Node]


EPILOGUE_KINDS: list[EpilogueKind] = []
"""Every kind `fuse_epilogues` grows chains for: matrix products (here), convolutions (`schedule.convolution`)."""


def _broadcast_constant(node: Node) -> Node | None:
    """The CONST that `node` is a view of, if any (constants are broadcast by reshape and expand)."""
    while node.op in (Op.RESHAPE, Op.EXPAND):
        node = node.src[0]
    return node if node.op is Op.CONST else None


def _is_constant(value: Any) -> Callable[[Node], bool]:
    return lambda node: (c := _broadcast_constant(node)) is not None and same_value(c.arg, value)


def _keeps_rows(node: Node) -> bool:
    return node.shape[-1:] == node.src[0].shape[-1:]


def _row_vector(node: Node) -> bool:
    """An EXPAND of a vector over the last axis to every row."""
    source = node.src[0]
    return source.shape[-1:] == node.shape[-1:] and math.prod(source.shape[:-1]) == 1


@functools.cache
def activation_templates() -> tuple[tuple[str, Node, Node], ...]:
    """(name, placeholder, definition) per activation: each built on a 0-d placeholder and decomposed to
    primitives, as the scheduler decomposes the graph (rewrite canonicalization only reorders commutative
    operands and turns broadcast constants into constants, which the patterns see through)."""
    templates = []
    for name, activation in ACTIVATIONS.items():
        placeholder = pattern_variable()
        templates.append((name, placeholder, optimize([activation(placeholder)], ["decompose"])[0]))
    return tuple(templates)


def _template_pattern(template: Node, variables: dict[Node, Pattern]) -> Pattern:
    """`template` as a pattern: each placeholder is its pattern in `variables`, a constant matches any broadcast of
    its value. (Unlike `rewrite.pattern_of`, constants are matched through views: the scheduler's graph is not
    re-canonicalized.)"""

    def constant(node: Node) -> Pattern | None:
        found = _broadcast_constant(node)
        return None if found is None else Pattern(where=_is_constant(found.arg))

    return graph_pattern(template, variables, constant)


def _setting(name: str, value: Callable[[Bindings], Any]) -> Update:
    """An update that sets the chain's `name` to `value(bindings)`."""
    return lambda chain, found: dataclasses.replace(chain, **{name: value(found)})


def _setting_bias(chain: EpilogueChain, found: Bindings) -> EpilogueChain:
    """The bias read where its buffer holds it: through reshapes and slices (a block of a stacked bias)."""
    bias, offset = _storage_and_offset(_contiguous_chain(found["bias"]))
    return dataclasses.replace(chain, bias=bias, bias_offset=offset)


def epilogue_rules(is_chain_end: Callable[[Node], bool], bias_vector: Callable[[Node], bool] = _row_vector,
                   layout: bool = True) -> list[EpilogueRule]:
    """What the GEMM can apply after a chain end (see gemm.h for the order): a bias that is an EXPAND where
    `bias_vector` holds (a row vector for a product), and with `layout` reshapes keeping the rows."""
    x = var("x", where=is_chain_end)
    scalar = var("alpha", where=lambda n: _broadcast_constant(n) is not None)
    rules = [EpilogueRule(LAYOUT, op(Op.RESHAPE, x, where=_keeps_rows), lambda chain, _: chain)] if layout else []
    rules += [
        EpilogueRule(ALPHA, op(Op.MUL, x, scalar),
                     _setting("alpha", lambda f: float(_broadcast_constant(f["alpha"]).arg))),
        EpilogueRule(BIAS, op(Op.ADD, x, op(Op.EXPAND, var("bias"), where=bias_vector)), _setting_bias),
        EpilogueRule(RESIDUAL, op(Op.ADD, x, var("residual")), _setting("residual", lambda f: _storage(f["residual"]))),
        EpilogueRule(ROUND, op(Op.CAST, x, where=_rounds_to_bfloat16), _setting("rounded", lambda _: True)),
        EpilogueRule(WIDEN, op(Op.CAST, x, where=widens_bfloat16), _setting("widened", lambda _: True)),
    ]
    for name, placeholder, template in activation_templates():
        pattern = _template_pattern(template, {placeholder: x})
        rules.append(EpilogueRule(ACTIVATION, pattern, _setting("activation", lambda _, name=name: name)))
        rules.append(EpilogueRule(ACTIVATION_AFTER_RESIDUAL, pattern, lambda chain, _, name=name: dataclasses.replace(
            chain, activation=name, activation_after_residual=True)))
    return rules


@functools.cache
def gelu_tanh_grad_template() -> tuple[Node, Node, Node]:
    """(grad placeholder, x placeholder, gelu_tanh_grad(grad, x)) decomposed as the scheduler decomposes it."""
    grad, x = pattern_variable(), pattern_variable()
    return grad, x, optimize([_gelu_tanh_grad(grad, x)], ["decompose"])[0]


def gelu_grad_rule(is_chain_end: Callable[[Node], bool]) -> EpilogueRule:
    """A product's result times gelu'(x) (gelu's backward pass, `gelu_tanh_grad_template`): the epilogue's
    gradient activation, reading x as its residual, so the gradient is never stored before it."""
    grad, x, template = gelu_tanh_grad_template()
    pattern = _template_pattern(template, {grad: var("x", where=is_chain_end), x: var("gate")})
    return EpilogueRule(RESIDUAL, pattern, lambda chain, found: dataclasses.replace(
        chain, activation=GELU_TANH_GRAD, residual=_storage(found["gate"])))


EPILOGUE_KINDS.append(EpilogueKind(runs_as_gemm,  # late-bound
                                   lambda is_chain_end: [*epilogue_rules(is_chain_end), gelu_grad_rule(is_chain_end)],
                                   _product_with_epilogue))


def consumers_of(order: list[Node], roots: list[Node], is_leaf: Callable[[Node], bool]) -> dict[Node, set[Node | None]]:
    """The nodes reading each node of `order`; None for a root (its value leaves the program)."""
    consumers: dict[Node, set[Node | None]] = defaultdict(set)
    for node in order:
        for source in () if is_leaf(node) else node.src:
            consumers[source].add(node)
    for root in roots:
        consumers[root].add(None)
    return consumers


def _region(root: Node, start: Node, position: dict[Node, int]) -> set[Node]:
    """The nodes from `start` (excluded) up to `root` that depend on `start`: what one epilogue op computes.
    (`position` is a topological order: nothing before `start` depends on it.)"""
    region: set[Node] = set()
    for node in toposort([root], stop=lambda n: position.get(n, -1) <= position[start]):  # -1: beyond a leaf
        if any(s is start or s in region for s in node.src):
            region.add(node)
    return region


def fuse_epilogues(roots: list[Node], materialized: set[Node],
                   is_leaf: Callable[[Node], bool]) -> tuple[list[Node], set[Node]]:
    """`roots` with each product's fusable elementwise consumers folded into one `GEMM_EPILOGUE` node, then its
    operands' activations into `GEMM_PROLOGUE` nodes (`fuse_prologues`), and the nodes to materialize (those
    given, mapped onto the new graph, plus the fused products and their operands, less the activated operands)."""
    order = toposort(roots, stop=is_leaf)
    chains = _grow_chains(order, roots, materialized, is_leaf)
    fused = {end: chain for end, chain in chains.items() if chain.fuses_anything(end)}
    rebuilt = rebuild(order, {end: functools.partial(chain.node, end.shape) for end, chain in fused.items()}, is_leaf)
    operands = {rebuilt[n] for chain in fused.values() for n in chain.operands() if not is_leaf(n)}
    kept = {rebuilt.get(n, n) for n in materialized} | {rebuilt[end] for end in fused} | operands
    return fuse_prologues([rebuilt[r] for r in roots], kept, is_leaf)


def _grow_chains(order: list[Node], roots: list[Node], materialized: set[Node],
                 is_leaf: Callable[[Node], bool]) -> dict[Node, EpilogueChain]:
    """Every library call's chain (of each of `EPILOGUE_KINDS`), by its end. Walking the graph sources first, a rule
    of the chain's kind extends it when every node it replaces (the chain end and the op's inner nodes) is consumed
    only inside the op, the op's result is float32 (or, last, the product of bfloat16 values rounded to bfloat16),
    its bias is a vector of floats (through reshapes and leading-dim slices; materialized if it is not already, at
    little cost), and its residual (of the result's size) is in a buffer anyway (materialized, a leaf, or a chain
    end)."""
    consumers = consumers_of(order, roots, is_leaf)
    position = {node: i for i, node in enumerate(order)}
    chains = {node: EpilogueChain(node, kind) for node in order
              if not is_leaf(node) and (kind := next((k for k in EPILOGUE_KINDS if k.starts(node)), None))}
    rejected: set[Node] = set()  # ends tried at this node and rule (a commutative op may bind x to either)

    def is_chain_end(kind: EpilogueKind) -> Callable[[Node], bool]:
        return lambda n: n in chains and chains[n].kind is kind and n not in rejected

    rules = [rule for kind in EPILOGUE_KINDS for rule in kind.rules(is_chain_end(kind))]

    def holds_floats(operand: Node) -> bool:
        return operand in position and operand.dtype in FLOAT_STORAGE

    def buffered(operand: Node) -> bool:
        return holds_floats(operand) and (is_leaf(operand) or operand in materialized or operand in chains)

    def extension(rule: EpilogueRule, node: Node, found: Bindings) -> EpilogueChain | None:
        end, chain = found["x"], chains[found["x"]]
        if rule.stage != LAYOUT and rule.stage <= chain.stage:
            return None
        if rule.stage == ROUND and operand_dtype(chain.product) != dtypes.bfloat16:
            return None  # the bfloat16 kernel that rounds its result also rounds its operands
        if chain.rounds_itself and rule.stage not in (LAYOUT, WIDEN):
            return None  # the kernel would apply it before rounding: once where the graph rounds twice
        if rule.stage == WIDEN and chain.stage != ROUND and not chain.rounds_itself:
            return None
        if rule.stage == ACTIVATION_AFTER_RESIDUAL and (chain.residual is None or chain.activation != "none"):
            return None  # one activation: without a residual, the one before it (ACTIVATION) is the same
        extended = rule.update(chain, found)
        if chain.activation != "none" and extended.activation != chain.activation:
            return None  # the gradient activation after an activation (its later stage: it reads the residual)
        region = _region(node, end, position)
        closed = all(consumers[n] <= region for n in region - {node} | {end})
        shapes_fit = extended.residual is None or extended.residual.size == node.size  # a bias is a row vector
        operands_fit = (extended.bias is None or holds_floats(extended.bias)) and (
            extended.residual is None or buffered(extended.residual)) and all(
            found[name] is not end for name in ("bias", "residual", "gate") if name in found)
        fits = closed and shapes_fit and operands_fit
        return dataclasses.replace(extended, stage=max(chain.stage, rule.stage)) if fits else None

    def first_extension(node: Node) -> tuple[Node, EpilogueChain] | None:
        for rule in rules:
            rejected.clear()
            while (found := rule.pattern.match(node)) is not None:
                if (extended := extension(rule, node, found)) is not None:
                    return found["x"], extended
                rejected.add(found["x"])
        return None

    for node in order:
        if node.dtype in FLOAT_STORAGE and (step := first_extension(node)) is not None:
            end, chains[node] = step
            del chains[end]
    return chains


# ---------------------------------------------------------------------------
# Prologues: an activation the GEMM applies to an operand while packing it.
# ---------------------------------------------------------------------------


def _prologue_decomposition(x: Any, *, activation: str) -> Any:
    return as_value(ACTIVATIONS[activation](as_node(x.float())))


GEMM_PROLOGUE = Composite("matmul_prologue", lambda x, **_: (dtypes.float32, x.shape), _prologue_decomposition)
"""activation(x), float32, read by products only, which apply it while packing x (a buffer of floats: float32 or
bfloat16); never materialized. Made by `fuse_prologues` only, so it is not registered."""


def _is_product(node: Node) -> bool:
    return runs_as_gemm(node) or node.op is GEMM_EPILOGUE


def fuse_prologues(roots: list[Node], materialized: set[Node],
                   is_leaf: Callable[[Node], bool]) -> tuple[list[Node], set[Node]]:
    """`roots` with every product operand stored as activation(x) (through views: `operand_storage`) reading
    `GEMM_PROLOGUE(x)` instead, when x is a float32 buffer anyway (a leaf or materialized; or bfloat16 values
    widened from one, which the prologue reads as they are stored) of the same shape and nothing but product
    operands reads the activated value; and `materialized` less the activated values."""
    order = toposort(roots, stop=is_leaf)
    consumers = consumers_of(order, roots, is_leaf)
    readers: dict[Node, set[Node]] = defaultdict(set)  # storage -> the products and views reading it as operand
    read_whole = set()  # bias and residual operands
    for product in filter(_is_product, order):
        for operand in product.src[:2]:
            *views, storage = _view_chain(operand, operand_dtype(product) == dtypes.bfloat16)
            readers[storage] |= {product, *views}
        read_whole.update(product.src[2:])

    def stored(x: Node) -> Node:
        return x.src[0] if widens_bfloat16(x) else x

    def buffered(x: Node) -> bool:
        return x.dtype == dtypes.float32 and (is_leaf(stored(x)) or stored(x) in materialized)

    patterns = [(name, _template_pattern(template, {placeholder: var("x", where=buffered)}))
                for name, placeholder, template in activation_templates()]
    activated: dict[Node, tuple[str, Node]] = {}  # storage -> (activation, x)
    for storage, reading in readers.items():
        views = {node for node in reading if not _is_product(node)}
        if is_leaf(storage) or storage in read_whole or any(not consumers[n] <= reading for n in views | {storage}):
            continue
        for name, pattern in patterns:
            found = pattern.match(storage)
            if found is not None and found["x"].shape == storage.shape:
                activated[storage] = name, stored(found["x"])
                break
    if not activated:
        return roots, materialized

    def prologue(name: str, x: Node) -> Callable[[dict[Node, Node]], Node]:
        return lambda rebuilt: make_node(GEMM_PROLOGUE, (rebuilt[x],), {"activation": name}, dtypes.float32, x.shape)

    rebuilt = rebuild(order, {storage: prologue(*found) for storage, found in activated.items()}, is_leaf)
    kept = {rebuilt.get(n, n) for n in materialized if n not in activated}
    return [rebuilt[r] for r in roots], kept


def gemm_operand(view: Node, rounding: bool) -> tuple[Node, int, str]:
    """The node whose buffer a product reads for operand `view` (`rounding`: the product rounds its operands to
    bfloat16), the element offset there, and the prologue."""
    storage, offset = operand_storage(view, rounding)
    if storage.op is GEMM_PROLOGUE:
        return storage.src[0], offset, dict(storage.arg)["activation"]
    return storage, offset, "none"


@dataclass
class LibraryCallLowering:
    """The kernel of one call into a kernel library, with `lower.Lowering`'s interface: it inlines and recomputes
    nothing."""

    name: str
    node: Node
    buffers: dict[Node, str]
    inlined: set[Node] = field(default_factory=set)
    recomputed: set[Node] = field(default_factory=set)


class GemmLowering(LibraryCallLowering):
    """The kernel of one matrix product and its epilogue."""

    def kernel(self) -> Kernel:
        a, b, *operands = self.node.src
        *_, m, k = a.shape
        n = b.shape[-1]
        batch = math.prod(a.shape[:-2])
        operands_dtype = operand_dtype(self.node)
        rounding = operands_dtype == dtypes.bfloat16
        (a_base, a_offset, a_prologue), (b_base, b_offset, b_prologue) = gemm_operand(a, rounding), gemm_operand(
            b, rounding)
        a_name, b_name, c_name = self.buffers[a_base], self.buffers[b_base], self.buffers[self.node]
        params = {name: KernelParam(name, source.dtype, source.size, False)
                  for name, source in ((a_name, a_base), (b_name, b_base), *((self.buffers[o], o) for o in operands))}
        params[c_name] = KernelParam(c_name, self.node.dtype, self.node.size, True)
        call = GemmCall(batch, m, n, k, a_name, operand_strides(a), b_name, operand_strides(b), c_name,
                        (m * n, n), self.epilogue(m, n), a_offset, b_offset, a_prologue, b_prologue,
                        gemm_function(self.node), self._product_dtype(), operands_dtype)
        return Kernel(self.name, list(params.values()), [call])

    def _product_dtype(self) -> dtypes.DType:
        """bfloat16 for a product that rounds its result (maybe read as float32: `widened`)."""
        rounded = self.node.op is GEMM_EPILOGUE and dict(self.node.arg)["rounded"]
        return dtypes.bfloat16 if rounded else self.node.dtype

    def epilogue(self, m: int, n: int) -> GemmEpilogue:
        if self.node.op is not GEMM_EPILOGUE:
            return GemmEpilogue()
        params = dict(self.node.arg)
        operands = iter(self.buffers[o] for o in self.node.src[2:])
        bias = next(operands) if params["bias"] else None
        residual = next(operands) if params["residual"] else None
        return GemmEpilogue(params["alpha"], bias, (0, 0, 1), params["activation"], residual, (m * n, n),
                            bias_offset=params["bias_offset"],
                            activation_after_residual=params["activation_after_residual"])
