"""Linear maps and lookups: linear, embedding, and dropout (of elements or of whole channels)."""

from __future__ import annotations

from tensorgraphs.errors import ArgumentError, DTypeError, ShapeError, UnsupportedError, fail, warn
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import linalg, random
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.autocast import LOWER, autocast_op
from tensorgraphs.frontend.tensor import Tensor, cast
from tensorgraphs.nn.functional.arguments import finish_inplace, require_float, require_same_dtype


@autocast_op(LOWER)
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """input @ weight.T + bias, with weight of shape (out_features, in_features) or (in_features,)."""
    if weight.ndim not in (1, 2):
        fail("linear", f"weight must be 1-D or 2-D, got shape {weight.shape}")
    if input.ndim == 0 or input.shape[-1] != weight.shape[-1]:
        fail("linear", f"input {input.shape} and weight {weight.shape} do not fit: the input's last dim must equal "
             f"in_features = {weight.shape[-1]}")
    require_same_dtype("linear", input=input, weight=weight, bias=bias)

    def affine(x: Tensor, w: Tensor, *b: Tensor) -> Tensor:
        out = linalg.matmul(x, mv.mT(w) if w.ndim == 2 else w)
        return ew.add(out, *b) if b else out

    # float16/bfloat16: the product and the bias are summed in float32 and rounded once, as torch's addmm on the cpu
    return ew.in_float32_for_halves(affine, input, weight, *(() if bias is None else (bias,)))


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y[..., o] = x1 . weight[o] . x2 + bias[o], weight of shape (out, in1, in2): one matmul, then a product with
    x2 summed over in2."""
    if weight.ndim != 3 or input1.shape[-1:] != weight.shape[1:2] or input2.shape[-1:] != weight.shape[2:]:
        fail("bilinear", f"inputs {input1.shape} and {input2.shape} do not fit weight {weight.shape} of shape "
             "(out_features, in1_features, in2_features)")
    require_same_dtype("bilinear", input1=input1, input2=input2, weight=weight, bias=bias)
    out_features, in1, in2 = weight.shape
    flat = mv.reshape(mv.permute(weight, (1, 0, 2)), (in1, out_features * in2))
    projected = mv.reshape(linalg.matmul(input1, flat), input1.shape[:-1] + (out_features, in2))
    out = rd.sum(ew.mul(projected, mv.unsqueeze(input2, -2)), -1)
    return out if bias is None else ew.add(out, bias)


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """Rows of `weight` picked by integer `input`; the padding row gets no gradient."""
    if not input.dtype.is_integer:
        fail("embedding", f"expected an integer index tensor, got {input.dtype.name}", kind=DTypeError)
    if weight.ndim != 2:
        fail("embedding", f"weight must be 2-D (num_embeddings, embedding_dim), got shape {weight.shape}")
    if max_norm is not None or scale_grad_by_freq:
        fail("embedding", "max_norm and scale_grad_by_freq are not supported; renormalize the weight yourself",
             kind=UnsupportedError)
    rows = weight.shape[0]
    rows_picked = mv.index_select(weight, 0, mv.reshape(input, -1))
    if padding_idx is not None:
        if not -rows <= padding_idx < rows:
            fail("embedding", f"padding_idx {padding_idx} must be within num_embeddings ({rows})", kind=ShapeError)
        is_padding = mv.unsqueeze(ew.eq(mv.reshape(input, -1), padding_idx % rows), -1)
        rows_picked = ew.where(is_padding, rows_picked.detach(), rows_picked)
    return mv.reshape(rows_picked, input.shape + (weight.shape[1],))


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero each element with probability p and scale the rest by 1 / (1 - p); random under tg.manual_seed."""
    return _dropout("dropout", input, p, training, inplace, input.shape)


def _dropout(op: str, input: Tensor, p: float, training: bool, inplace: bool, mask_shape: tuple[int, ...]) -> Tensor:
    """Dropout with one keep-or-zero draw per element of `mask_shape` (broadcast over the input)."""
    if not 0.0 <= p <= 1.0:
        fail(op, f"dropout probability has to be between 0 and 1, but got {p}", kind=ArgumentError)
    require_float(op, input=input)
    if not training or p == 0.0:
        return input
    if p == 1.0:
        out = ew.mul(input, 0.0)
    else:
        keep = random.bernoulli_mask(mask_shape, p)
        out = ew.mul(input, cast(ew.where(keep, 1.0 / (1.0 - p), 0.0), input.dtype))
    return finish_inplace(op, input, out, inplace)


def _channel_dropout(op: str, input: Tensor, p: float, training: bool, inplace: bool, spatial: int) -> Tensor:
    """Whole channels zeroed: one draw per (sample, channel) of an (N, C, *spatial) or (C, *spatial) input."""
    if input.ndim not in (spatial + 1, spatial + 2):
        fail(op, f"expected {spatial + 1}D or {spatial + 2}D input, got input of size {input.shape}")
    channels = input.ndim - spatial
    return _dropout(op, input, p, training, inplace, input.shape[:channels] + (1,) * spatial)


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    return _channel_dropout("dropout1d", input, p, training, inplace, 1)


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """A 3-d input is taken as (N, C, L), with torch's warning (torch will read it as (C, H, W) some day)."""
    if input.ndim == 3:
        warn("dropout2d", "Received a 3D input to dropout2d and assuming that channel-wise 1D dropout behavior is "
             "desired - input is interpreted as shape (N, C, L), where C is the channel dim. This behavior will "
             "change in a future release to interpret the input as one without a batch dimension, i.e. shape "
             "(C, H, W). To maintain the 1D channel-wise dropout behavior, please switch to using dropout1d instead.")
        return _channel_dropout("dropout2d", input, p, training, inplace, 1)
    return _channel_dropout("dropout2d", input, p, training, inplace, 2)


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    return _channel_dropout("dropout3d", input, p, training, inplace, 3)
