"""Convolutions run by a conv2d kernel of the GEMM library instead of their decomposition (patches and a matmul).

A float32 `conv2d` composite with one group, NCHW, and the same padding before and after each spatial dim has up to
four candidates besides its decomposition (`CONV_CANDIDATES`, chosen per shape by the planner, `plan.choices`): on a
machine with AVX-512 (or AVX2 and FMA), "implicit_gemm" (tg_conv2d_f32: the GEMM packing its panels straight from
the image; on AVX2 a strided conv's from explicit columns), for few input channels "direct" (tg_conv2d_direct_f32:
the GEMM's register tile over vectors read in place from a padded copy of the image, no im2col, `_direct_fits`) and,
for 3x3 kernels at stride 1 without dilation, "winograd" (tg_conv2d_winograd_f32: F(4x4, 3x3), fewer multiplies but
about ten times the rounding error, chosen unmeasured only in the shape class where it wins clearly:
`_winograd_prior`); with OpenBLAS installed, "im2col" (tg_conv2d_im2col_f32: explicit im2col blocks and sgemm,
portable C, for strided convs where the implicit packing's gathers cost most, and the conv kernel of machines
without AVX-512; chosen only where measured faster than the decomposition, `IM2COL_PRIOR`). A grouped pointwise conv
(ShuffleNet's 1x1s) has "grouped_gemm" (`_grouped_fits`). Run by a kernel, the composite is kept whole by the
scheduler: one `ConvCall` (for "grouped_gemm" a `GemmCall` per image, batched over the groups) reading x and the
weight where their buffers hold them in NCHW order (through reshapes and slices of the leading dim:
`extern.contiguous_storage`; anything else is materialized first) and writing a buffer of its own, or its images
into their slice of a concatenation's (`fusion.write_slices_in_place`: the kernels take the output's image stride).

Its elementwise consumers that the kernel applies before storing (a scale, a bias per output channel: the
frontend adds conv's bias after the composite, an activation, a residual; gemm.h's epilogue) are fused into the
call by `extern.fuse_epilogues`, which grows conv chains with the rules of `EPILOGUE_KIND`.

Only the forward pass runs here: conv2d has no gradient rule of its own, so autograd differentiates its
decomposition and the gradients are matmuls (planned as such).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.codegen.loop_ir import ConvCall, GemmCall, GemmEpilogue, Kernel, KernelParam, NativeCall
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import REGISTRY, Composite, as_node, as_value, is_composite, make_node
from tensorgraphs.graph.node import Node, rebuild, toposort, with_sources
from tensorgraphs.graph.ops import Op
from tensorgraphs.kernels import blas, gemm
from tensorgraphs.plan.choices import (
    DECOMPOSITION,
    KERNEL_LIBRARIES,
    OPENBLAS,
    Candidate,
    register_candidates,
    route_of,
)
from tensorgraphs.schedule.extern import (
    EPILOGUE_KINDS,
    EpilogueChain,
    EpilogueKind,
    LibraryCallLowering,
    activate_and_add,
    consumers_of,
    contiguous_storage,
    epilogue_rules,
    gemm_enabled,
    libraries_enabled,
)

CONV2D = "conv2d"
INT32_ELEMENTS = 1 << 30
"""Arrays at least this large are left to the decomposition (the kernels index images with 32-bit offsets)."""


def _conv_params(node: Node) -> dict[str, Any]:
    return dict(node.arg)


def _library_fits(node: Node) -> bool:
    """Whether `node` is a conv2d a library call can compute: float32 NCHW, each padding the same on both sides
    (the kernels take one per dim), nothing empty or too large."""
    if not is_composite(node) or node.op.name != CONV2D:
        return False
    x, weight = node.src
    floats = all(n.dtype == dtypes.float32 for n in (node, x, weight))
    symmetric = all(before == after >= 0 for before, after in _conv_params(node)["padding"])
    sizes = (x.size, weight.size, node.size)
    return floats and symmetric and 0 < min(sizes) and max(sizes) < INT32_ELEMENTS


def _conv_fits(node: Node) -> bool:
    """Whether a conv2d kernel (tg_conv2d_f32's contract) computes `node`: `_library_fits` with one group."""
    return _library_fits(node) and _conv_params(node)["groups"] == 1


def _kernel_fits(node: Node) -> bool:
    """`_conv_fits` on a machine that runs the GEMM library (AVX-512)."""
    return gemm_enabled() and _conv_fits(node)


def _im2col_fits(node: Node) -> bool:
    """`_conv_fits` where the im2col kernel builds (OpenBLAS and a C compiler) and TG_GEMM=0 does not turn the
    libraries off."""
    return libraries_enabled() and blas.conv_available() and _conv_fits(node)


def _winograd_fits(node: Node) -> bool:
    """`_kernel_fits`, with a 3x3 kernel at stride 1 without dilation (F(4x4, 3x3))."""
    if not _kernel_fits(node):
        return False
    params = _conv_params(node)
    return node.src[1].shape[2:] == (3, 3) and params["stride"] == (1, 1) and params["dilation"] == (1, 1)


DIRECT_MAX_CHANNELS, DIRECT_MIN_WIDTH = 16, 16
"""Where the direct conv applies: its register tile runs along one output row, reading the padded image in place
under each of the cin x kh x kw taps, so it pays where the implicit GEMM's per-panel packing weighs most against
few taps (3-channel stems: 1.2-1.5x faster on AVX2, bench/NOTES.md) and its tiles are filled (rows of at least
a vector); 1x1 kernels pack cheaply (plain rows) and ran alike."""
DIRECT_MIN_TAPS_AVX512 = 32
"""On AVX-512 the direct conv applies only with at least this many taps (cin x kh x kw): below it the implicit
GEMM's tiles walk C along its rows (gemm.c's SHORT_REDUCTION), which wrote the 3x3 stems (27 taps) faster than the
direct conv's tiles in the models: SqueezeNet's 3 -> 64 0.60 against 0.65 ms at batch 1, 5.1 against 7.2 at batch 8,
ShuffleNet's 3 -> 24 0.29 against 0.32, VGG-19's 3 -> 64 at stride 1 2.1 against 2.7; ResNet-50's 7x7 stem (147
taps) stays 1.2x faster direct (bench/NOTES.md)."""
DIRECT_MAX_OUT_CHANNELS, DIRECT_MIN_WIDTH_FEW_OUTPUTS, DIRECT_MIN_WIDTH_FEW_OUTPUTS_STRIDE_1 = 32, 28, 14
DIRECT_LANES_CHANNELS, DIRECT_MIN_WIDTH_LANES = (16, 32), 7
"""The direct conv also applies to few output channels on rows of 28 or more, whatever the input channels: each
packed panel of the implicit GEMM then serves at most 6 row tiles, so its packing weighs as much as against few
taps (DenseNet-121's 3x3 layers, 128 -> 32: 1.05-1.14x faster at 28 and 56 columns, at batch 1 and 8; slower at
14, bench/NOTES.md). At stride 1 its tiles run across rows, so rows of 14 no longer end in partial tiles: 1.15x
the implicit GEMM at 14x14 (batch 1 and 8); and on AVX-512 16 or 32 output channels on rows of at most 14 are the
vectors' lanes, so those run down to rows of 7: 1.2x the implicit GEMM at 7x7 (batch 1 and 8; AVX2 has no lanes
path: 0.9x at batch 8 there)."""


@dataclasses.dataclass(frozen=True)
class WinogradClass:
    """Where Winograd runs unmeasured (`_winograd_prior`). It transforms the weights (once while they stay, a
    preparation: `schedule.prepared`), each input channel of a tile and each output channel of a tile, then
    multiplies tiles x channels x channels at a quarter of the direct product's multiplies: it pays where the 36
    products have tiles enough (4x4 output tiles over all images, `tiles`) to stream the transformed weights (four
    times the weights) for, channels enough on both sides (`channels`) for the tiles' transforms, and where the tiles
    cover mostly real outputs (`coverage`; 13x13 computes 16x16)."""

    tiles: int
    channels: int
    coverage: float


WINOGRAD_CLASS = {"avx2": WinogradClass(48, 64, 0.75), "avx512": WinogradClass(16, 16, 0.6)}
"""The class by instruction set. On AVX2, ResNet-50, VGG-19, Inception v1, SqueezeNet and DenseNet-121's 3x3
stride-1 convs at batch 1 and 8 gained 1.2-2.2x in it and lost up to 5x outside it (7x7 at batch 1: 4 tiles; the
weights transformed at every call then). On AVX-512 (the products' 6 x 64 register tile) Winograd also won with 16
and 32 channels on a side (SqueezeNet's 16->64 at 55x55, 32->128 at 27x27, DenseNet's 128->32: 1.3-1.7x the implicit
GEMM's and the direct conv's speed at batch 1) and, with its weights' transform kept, at 16 tiles (14x14 and 13x13
at batch 1: ResNet-50's 256->256 1.3x, SqueezeNet's 48->192 and 64->256 1.7-1.9x, DenseNet's 128->32 1.5x the
direct conv); it still lost at 4 tiles (7x7 at batch 1: 2.8 against the implicit GEMM's 2.6 ms at 512 channels;
bench/NOTES.md). A training step transforms its weights at every step, a tenth slower than the implicit GEMM at 16
tiles."""
WINOGRAD_PRIOR = (0.8, 1.1)
"""Winograd's prior in its class (ahead of the implicit GEMM) and outside it (behind)."""


def _winograd_prior(node: Node) -> float:
    """WINOGRAD_PRIOR by the shape class of `node` (WINOGRAD_CLASS of this machine's instruction set)."""
    (batch, channels, *_), (out_channels, height, width) = node.src[0].shape, node.shape[1:]
    tiles, bounds = -(-height // 4) * -(-width // 4), WINOGRAD_CLASS["avx512" if gemm.avx512() else "avx2"]
    in_class = (batch * tiles >= bounds.tiles and min(channels, out_channels) >= bounds.channels
                and height * width >= bounds.coverage * 16 * tiles)
    return WINOGRAD_PRIOR[0] if in_class else WINOGRAD_PRIOR[1]


def _direct_fits(node: Node) -> bool:
    """`_kernel_fits`, with a window larger than 1x1 and few input channels on wide output rows, or few output
    channels on wider ones (at stride 1, wide ones); on AVX-512 with taps enough."""
    if not _kernel_fits(node):
        return False
    x, weight = node.src
    if gemm.avx512() and math.prod(weight.shape[1:]) < DIRECT_MIN_TAPS_AVX512:
        return False
    out_channels, width = weight.shape[0], node.shape[3]
    few_inputs = x.shape[1] <= DIRECT_MAX_CHANNELS and width >= DIRECT_MIN_WIDTH
    min_width = DIRECT_MIN_WIDTH_FEW_OUTPUTS
    if _conv_params(node)["stride"] == (1, 1):
        lanes = out_channels in DIRECT_LANES_CHANNELS and gemm.avx512()
        min_width = DIRECT_MIN_WIDTH_LANES if lanes else DIRECT_MIN_WIDTH_FEW_OUTPUTS_STRIDE_1
    few_outputs = out_channels <= DIRECT_MAX_OUT_CHANNELS and width >= min_width
    return weight.shape[2] * weight.shape[3] > 1 and (few_inputs or few_outputs)


def _grouped_fits(node: Node) -> bool:
    """A grouped pointwise conv (1x1 at stride 1 without padding, several input channels per group) on a machine
    that runs the GEMM library: per image one batched product over the groups, the decomposition's product, which
    then takes the epilogue (a bias per output channel, a batch norm folded into the weights, a relu, a residual)
    that the decomposition ran as a pass over its result."""
    if not (gemm_enabled() and _library_fits(node)):
        return False
    params, weight = _conv_params(node), node.src[1]
    pointwise = weight.shape[2:] == (1, 1) and params["stride"] == (1, 1) and not any(map(any, params["padding"]))
    return params["groups"] > 1 and weight.shape[1] > 1 and pointwise and node.shape[0] <= GROUPED_MAX_BATCH


GROUPED_MAX_BATCH = 32
"""Most images a "grouped_gemm" conv takes: each is a call of its own in the generated C."""


IMPLICIT_GEMM, DIRECT, WINOGRAD, IM2COL, GROUPED = "implicit_gemm", "direct", "winograd", "im2col", "grouped_gemm"
IM2COL_PRIOR = DECOMPOSITION.prior * 1.25
"""Behind the decomposition: OpenBLAS's kernel rounds some output channels differently from others (the same
weights give results a bit apart, which a softmax over huge logits turns into different classes: ONNX's light
squeezenet), so programs keep the decomposition's results unless `tg tune` (or TG_TUNE=1) measured im2col faster;
and what runs stays what `tg.export` writes, which cannot link OpenBLAS."""
DIRECT_PRIOR = 0.9
"""Ahead of the implicit GEMM where it applies (`_direct_fits`): what a machine with no measurements runs."""
CONV_CANDIDATES = (Candidate(IMPLICIT_GEMM, _kernel_fits, prior=1.0),
                   Candidate(DIRECT, _direct_fits, prior=DIRECT_PRIOR),
                   Candidate(WINOGRAD, _winograd_fits, prior=_winograd_prior),
                   Candidate(IM2COL, _im2col_fits, prior=IM2COL_PRIOR, needs=frozenset({KERNEL_LIBRARIES, OPENBLAS})),
                   Candidate(GROUPED, _grouped_fits, prior=1.0))
register_candidates(CONV2D, *CONV_CANDIDATES)
C_FUNCTIONS = {**{name: gemm.C_FUNCTIONS[gemm.CONV_ALGORITHMS[name]] for name in (IMPLICIT_GEMM, DIRECT)},
               WINOGRAD: gemm.C_FUNCTIONS["conv2d_winograd_prepared"], IM2COL: blas.CONV_FUNCTION,
               GROUPED: gemm.C_FUNCTIONS["matmul"]}
"""The kernel's C function by candidate (Winograd's reads its weights' transform: `prepare_winograd_weights`)."""
WINOGRAD_WEIGHTS_FUNCTION = gemm.C_FUNCTIONS["winograd_weights"]
"""The kernel making the transform."""
RESIDUAL_OVER_OUTPUT = frozenset({IMPLICIT_GEMM, DIRECT, WINOGRAD})
"""The algorithms whose kernels take the output as their own residual (gemm.h, tg_conv2d_fn): the memory plan may
put a conv's output over a residual that dies in it."""


def _epilogue_decomposition(x: Any, weight: Any, *operands: Any, alpha: float, bias: bool, bias_offset: int,
                            activation: str, residual: bool, activation_after_residual: bool, algorithm: str,
                            prepared: bool = False, **conv: Any) -> Any:
    """What the fused call computes, in gemm.h's order (the reference for the kernel; the weights' transform, the
    last operand where `prepared`, is only another form of the weights)."""
    given = iter(operands)
    out = as_value(make_node(REGISTRY[CONV2D], (as_node(x), as_node(weight)), conv, x.dtype,
                             _out_shape(x.shape, weight.shape, conv))) * alpha
    if bias:
        channels = out.shape[1]
        out = out + next(given).reshape(-1).narrow(0, bias_offset, channels).reshape(channels, 1, 1)
    return activate_and_add(out, activation, next(given).reshape(out.shape) if residual else None,
                            activation_after_residual)


def _out_shape(x_shape: tuple[int, ...], weight_shape: tuple[int, ...], conv: dict[str, Any]) -> tuple[int, ...]:
    sizes = tuple((x_shape[2 + i] + sum(conv["padding"][i]) - conv["dilation"][i] * (weight_shape[2 + i] - 1) - 1)
                  // conv["stride"][i] + 1 for i in range(2))
    return (x_shape[0], weight_shape[0], *sizes)


def _conv_out_type(x: Any, w: Any, *_: Any, prepared: bool = False, **params: Any) -> tuple[dtypes.DType, tuple]:
    return x.dtype, _out_shape(x.shape, w.shape, params)


CONV_EPILOGUE = Composite("conv2d_epilogue", _conv_out_type, _epilogue_decomposition)
"""A conv2d with its epilogue: sources (x, weight, bias?, residual?, the weights' transform where `prepared`), the
bias a vector over the output channels (starting `bias_offset` elements into its buffer), the residual shaped like
the result, both contiguous buffers; `algorithm` is the candidate that runs it. Made by `fuse_epilogues` only (and
`prepare_winograd_weights`), so it is not registered."""

WINOGRAD_G = ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6), (1 / 24, 1 / 12, 1 / 6),
              (1 / 24, -1 / 12, 1 / 6), (0, 0, 1))
"""G of Winograd's F(4x4, 3x3): a 3x3 kernel g becomes the 6x6 G g G^T."""


def _winograd_weights_decomposition(weight: Any) -> Any:
    """tg_winograd_weights_f32's result: G g G^T of each kernel, point-major (36 matrices of out x in channels),
    then 1 where every weight is finite, else 0 (the two joined as the sum of their zero-padded selves)."""
    g_matrix = weight.new_tensor(np.array(WINOGRAD_G, dtype=np.float32))
    transformed = as_node((g_matrix @ weight @ g_matrix.T).permute(2, 3, 0, 1).reshape(-1))
    finite = as_node(weight.isfinite().all().float().reshape(1))
    return as_value(g.binary(Op.ADD, g.movement(Op.PAD, transformed, ((0, 1),)),
                             g.movement(Op.PAD, finite, ((transformed.size, 0),))))


def _transform_shape(weight_shape: tuple[int, ...]) -> tuple[int]:
    return (gemm.winograd_weights_size(*weight_shape[:2]),)


WINOGRAD_WEIGHTS = Composite("winograd_weights", lambda w: (dtypes.float32, _transform_shape(w.shape)),
                             _winograd_weights_decomposition)
"""The Winograd kernel's form of conv weights (out, in, 3, 3), made by its own kernel, which `prepares`: kept
across calls while the weights stay (`schedule.prepared`). Made by `prepare_winograd_weights` only."""


def prepare_winograd_weights(roots: list[Node], materialized: set[Node],
                             is_leaf: Callable[[Node], bool]) -> tuple[list[Node], set[Node]]:
    """Each conv the Winograd kernel runs reads its weights' transform (`WINOGRAD_WEIGHTS`) instead of making it at
    every call; the transforms get buffers."""
    order = toposort(roots, stop=is_leaf)
    replaced = {conv: functools.partial(_prepared_conv, conv) for conv in order
                if not is_leaf(conv) and runs_as_conv_kernel(conv) and _algorithm(conv) == WINOGRAD}
    rebuilt = rebuild(order, replaced, is_leaf)
    transforms = {rebuilt[conv].src[-1] for conv in replaced}
    return [rebuilt[r] for r in roots], {rebuilt.get(n, n) for n in materialized} | transforms


def _algorithm(conv: Node) -> str:
    """The candidate running a conv kernel's node (`runs_as_conv_kernel`)."""
    return dict(conv.arg)["algorithm"] if conv.op is CONV_EPILOGUE else route_of(conv)


NO_EPILOGUE = {"alpha": 1.0, "bias": False, "bias_offset": 0, "activation": "none", "residual": False,
               "activation_after_residual": False}
"""`CONV_EPILOGUE`'s parameters of a conv whose result is stored as it is."""


def _prepared_conv(conv: Node, rebuilt: dict[Node, Node]) -> Node:
    """`conv` (a fused one, or a conv2d without epilogue) reading its weights' transform."""
    sources = tuple(rebuilt[s] for s in conv.src)
    weight = sources[1]
    transform = make_node(WINOGRAD_WEIGHTS, (weight,), {}, dtypes.float32, _transform_shape(weight.shape))
    params = dict(conv.arg) if conv.op is CONV_EPILOGUE else {**_conv_params(conv), **NO_EPILOGUE,
                                                                "algorithm": WINOGRAD}
    return make_node(CONV_EPILOGUE, (*sources, transform), {**params, "prepared": True}, conv.dtype, conv.shape)


def _channel_vector(node: Node) -> bool:
    """An EXPAND of a vector over the channels (dim 1) of an NCHW result."""
    source = node.src[0]
    return node.ndim == 4 and source.ndim == 4 and source.shape[1] == node.shape[1] == source.size


def runs_as_conv_kernel(node: Node) -> bool:
    """Whether `node` is a conv2d the planner runs by a kernel, or such a conv with its epilogue."""
    return node.op is CONV_EPILOGUE or (is_composite(node) and node.op.name == CONV2D
                                        and route_of(node) in C_FUNCTIONS)


def _conv_with_epilogue(chain: EpilogueChain, shape: tuple[int, ...], rebuilt: dict[Node, Node]) -> Node:
    conv = chain.product
    sources = tuple(rebuilt[n] for n in (*conv.src, *chain.operands()))
    params = {**_conv_params(conv), **chain.epilogue_params(), "algorithm": route_of(conv)}
    return make_node(CONV_EPILOGUE, sources, params, dtypes.float32, shape)


EPILOGUE_KIND = EpilogueKind(
    lambda node: is_composite(node) and node.op.name == CONV2D and runs_as_conv_kernel(node),
    lambda is_chain_end: epilogue_rules(is_chain_end, bias_vector=_channel_vector, layout=False),
    _conv_with_epilogue,
)
EPILOGUE_KINDS.append(EPILOGUE_KIND)


def _channel_values(node: Node, channels: int) -> Node | None:
    """The vector over the output channels that `node`, an operand of an NCHW result, broadcasts (a batch norm's
    statistics and parameters: expanded channel vectors, constants, their sums and products); None if it is not
    one."""
    if node.op is Op.EXPAND and _channel_vector(node):
        return g.movement(Op.RESHAPE, node.src[0], (channels,))
    if node.op is Op.CONST:
        return g.const(node.arg, node.dtype, (channels,))
    if node.op in (Op.ADD, Op.MUL):
        values = [_channel_values(source, channels) for source in node.src]
        return None if None in values else g.binary(node.op, *values)
    return None


def _channel_affine(conv: Node, consumers: dict[Node, set[Node | None]]) -> tuple[Node, Node | None, Node | None]:
    """The last node of the chain of per-channel multiplies and adds that alone consume `conv`, with the chain as
    end = conv * scale + shift (vectors over the channels; None: 1, 0)."""
    end, scale, shift, channels = conv, None, None, conv.shape[1]
    while len(consumers[end]) == 1 and (user := next(iter(consumers[end]))) is not None and user.op in (Op.ADD,
                                                                                                         Op.MUL):
        other = user.src[1] if user.src[0] is end else user.src[0]
        values = None if other is end or other.op is Op.CONST else _channel_values(other, channels)  # (alpha's)
        if values is None:
            break
        if user.op is Op.MUL:
            scale = values if scale is None else g.binary(Op.MUL, scale, values)
            shift = None if shift is None else g.binary(Op.MUL, shift, values)
        else:
            shift = values if shift is None else g.binary(Op.ADD, shift, values)
        end = user
    return end, scale, shift


def _scaled_conv(conv: Node, scale: Node, shift: Node | None, rebuilt: dict[Node, Node]) -> Node:
    """conv(x, w * scale) (+ shift) on the new graph."""
    x, weight = (rebuilt[s] for s in conv.src)
    channels = weight.shape[0]
    per_row = g.movement(Op.RESHAPE, scale, (channels, 1, 1, 1))
    out = with_sources(conv, (x, g.binary(Op.MUL, weight, g.movement(Op.EXPAND, per_row, weight.shape))))
    if shift is None:
        return out
    return g.binary(Op.ADD, out, g.movement(Op.EXPAND, g.movement(Op.RESHAPE, shift, (1, channels, 1, 1)), out.shape))


def fold_channel_scales(roots: list[Node], materialized: set[Node],
                        is_leaf: Callable[[Node], bool]) -> tuple[list[Node], set[Node]]:
    """A conv kernel's result scaled and shifted per output channel (a batch norm after it, also after its bias),
    conv(x, w) * scale + shift, as conv(x, w * scale) + shift: the kernel's epilogue adds the shift and applies a
    relu after it (`fuse_epilogues`), so a pass over the output becomes one over the weights, taken where the weights
    are the smaller (ResNet-50's last layers at batch 1 keep their pass). The scaled weights get a buffer."""
    order = toposort(roots, stop=is_leaf)
    consumers = consumers_of(order, roots, is_leaf)
    replaced = {}
    for conv in order:
        if is_leaf(conv) or not is_composite(conv) or conv.op.name != CONV2D or not runs_as_conv_kernel(conv):
            continue
        end, scale, shift = _channel_affine(conv, consumers)
        if scale is not None and conv.src[1].size <= end.size:
            replaced[end] = lambda rebuilt, conv=conv, scale=scale, shift=shift: _scaled_conv(conv, scale, shift,
                                                                                               rebuilt)
    rebuilt = rebuild(order, replaced, is_leaf)
    folded = {rebuilt[end] for end in replaced}
    convs = {n.src[0] if n.op is Op.ADD else n for n in folded}
    return [rebuilt[r] for r in roots], {rebuilt.get(n, n) for n in materialized} | convs | {
        c.src[1] for c in convs}


def conv_operand_bases(node: Node) -> list[Node]:
    """The nodes whose buffers the kernel of `node` reads x and the weight from."""
    return [contiguous_storage(operand)[0] for operand in node.src[:2]]


class ConvLowering(LibraryCallLowering):
    """The kernel of one conv2d call and its epilogue."""

    def kernel(self) -> Kernel:
        x, weight, *operands = self.node.src
        params = _conv_params(self.node)
        (x_base, x_offset), (w_base, w_offset) = contiguous_storage(x), contiguous_storage(weight)
        read = {self.buffers[n]: n for n in (x_base, w_base, *operands)}
        buffers = [KernelParam(name, n.dtype, n.size, False) for name, n in read.items()]
        out = self.buffers[self.node]
        buffers.append(KernelParam(out, self.node.dtype, self.node.size, True))
        given = iter(self.buffers[o] for o in operands)
        fused = self.node.op is CONV_EPILOGUE
        bias = next(given) if fused and params["bias"] else None
        residual = next(given) if fused and params["residual"] else None
        prepared = next(given) if fused and params.get("prepared") else None
        algorithm = params["algorithm"] if fused else route_of(self.node)
        assert (algorithm == WINOGRAD) == (prepared is not None), self.node  # `prepare_winograd_weights`
        epilogue = GemmEpilogue(params["alpha"] if fused else 1.0, bias, activation=params["activation"] if fused
                                else "none", residual=residual, bias_offset=params["bias_offset"] if bias else 0,
                                activation_after_residual=fused and params["activation_after_residual"])
        if algorithm == GROUPED:
            return Kernel(self.name, buffers, self._grouped_calls(self.buffers[x_base], x_offset, self.buffers[w_base],
                                                                  w_offset, epilogue))
        call = ConvCall(
            *x.shape, weight.shape[0], tuple(weight.shape[2:]), params["stride"],
            tuple(before for before, _ in params["padding"]), params["dilation"], self.buffers[x_base],
            self.buffers[w_base], out, C_FUNCTIONS[algorithm], x_offset, w_offset, bias, epilogue.bias_offset,
            residual, epilogue.alpha, epilogue.activation,
            activation_after_residual=epilogue.activation_after_residual, prepared=prepared,
            residual_over_output=algorithm in RESIDUAL_OVER_OUTPUT)
        assert math.prod(call.out_size) * call.batch * call.out_channels == self.node.size, call
        return Kernel(self.name, buffers, [call])

    def _grouped_calls(self, x_name: str, x_offset: int, w_name: str, w_offset: int,
                       epilogue: GemmEpilogue) -> list[GemmCall]:
        """A grouped pointwise conv (`_grouped_fits`) as one product per image, batched over the groups: weights
        (groups, out/groups, in/groups) @ the image's (groups, in/groups, positions), the bias a column vector per
        group, the residual and the result the image's (groups, out/groups, positions)."""
        x, weight = self.node.src[:2]
        batch, groups = x.shape[0], _conv_params(self.node)["groups"]
        rows, depth, positions = weight.shape[0] // groups, weight.shape[1], math.prod(self.node.shape[2:])
        image_in, image_out = x.size // batch, self.node.size // batch
        out = self.buffers[self.node]
        epilogue = dataclasses.replace(epilogue, bias_strides=(rows, 1, 0),
                                       residual_strides=(rows * positions, positions))
        return [GemmCall(groups, rows, positions, depth, w_name, (rows * depth, depth, 1), x_name,
                         (depth * positions, positions, 1), out, (rows * positions, positions),
                         dataclasses.replace(epilogue, residual_offset=image * image_out) if epilogue.residual
                         else epilogue, w_offset, x_offset + image * image_in, c_offset=image * image_out)
                for image in range(batch)]


class WinogradWeightsLowering(LibraryCallLowering):
    """The kernel making one conv's `WINOGRAD_WEIGHTS`: a preparation (`Kernel.prepares`)."""

    def kernel(self) -> Kernel:
        (weight,) = self.node.src
        base, offset = contiguous_storage(weight)
        weights, transform = self.buffers[base], self.buffers[self.node]
        call = NativeCall(WINOGRAD_WEIGHTS_FUNCTION, (weight.shape[0], weight.shape[1], weights, transform),
                          ((2, offset),))
        return Kernel(self.name, [KernelParam(weights, base.dtype, base.size, False),
                                  KernelParam(transform, self.node.dtype, self.node.size, True)], [call], prepares=True)

