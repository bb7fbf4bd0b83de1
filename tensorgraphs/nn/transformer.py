"""MultiheadAttention, the Transformer encoder/decoder layers and stacks, and nn.Transformer, with torch's
parameters and arguments."""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

from tensorgraphs import dtypes
from tensorgraphs.errors import ShapeError, fail
from tensorgraphs.frontend import creation, linalg
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.tensor import Tensor, cast
from tensorgraphs.nn import functional as F
from tensorgraphs.nn import init
from tensorgraphs.nn.container import ModuleList
from tensorgraphs.nn.dropout import Dropout
from tensorgraphs.nn.linear import Linear, new_parameter
from tensorgraphs.nn.module import Module
from tensorgraphs.nn.normalization import LayerNorm

Activation = str | Callable[[Tensor], Tensor]
_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class NonDynamicallyQuantizableLinear(Linear):
    """torch's name for MultiheadAttention.out_proj (a plain Linear), kept so reprs match."""


def _additive_mask(mask: Tensor | None, dtype: dtypes.DType) -> Tensor | None:
    """torch's MHA masks: bool True means "do not attend"; floats are added to the scores."""
    if mask is None or not mask.dtype.is_bool:
        return mask
    return cast(ew.where(mask, -math.inf, 0.0), dtype)


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention.

    Parameters are torch's: `in_proj_weight` (3E, E) when key/value dims equal embed_dim, else
    `q_proj_weight`, `k_proj_weight`, `v_proj_weight`; `in_proj_bias`; `bias_k`, `bias_v`; `out_proj`.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}), both positive")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.head_dim = embed_dim // num_heads
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = new_parameter(3 * embed_dim, embed_dim, dtype=dtype)
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = new_parameter(embed_dim, embed_dim, dtype=dtype)
            self.k_proj_weight = new_parameter(embed_dim, self.kdim, dtype=dtype)
            self.v_proj_weight = new_parameter(embed_dim, self.vdim, dtype=dtype)
        self.in_proj_bias = new_parameter(3 * embed_dim, dtype=dtype) if bias else None
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        self.bias_k = new_parameter(1, 1, embed_dim, dtype=dtype) if add_bias_kv else None
        self.bias_v = new_parameter(1, 1, embed_dim, dtype=dtype) if add_bias_kv else None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """xavier_uniform projections, zero biases (torch's choice, not Linear's default)."""
        for weight in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if weight is not None:
                init.xavier_uniform_(weight)
        for bias in (self.in_proj_bias, self.out_proj.bias):
            if bias is not None:
                init.zeros_(bias)
        for bias in (self.bias_k, self.bias_v):
            if bias is not None:
                init.xavier_normal_(bias)

    def _projections(self) -> list[tuple[Tensor, Tensor | None]]:
        e = self.embed_dim
        biases = [None] * 3 if self.in_proj_bias is None else [self.in_proj_bias[i * e:(i + 1) * e] for i in range(3)]
        if self._qkv_same_embed_dim:
            weights = [self.in_proj_weight[i * e:(i + 1) * e] for i in range(3)]
        else:
            weights = [self.q_proj_weight, self.k_proj_weight, self.v_proj_weight]
        return list(zip(weights, biases))

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return mv.transpose(mv.reshape(x, (batch, length, self.num_heads, self.head_dim)), 1, 2)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint")
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = (mv.unsqueeze(t, 0) for t in (query, key, value))
            key_padding_mask = None if key_padding_mask is None else mv.unsqueeze(key_padding_mask, 0)
        elif not self.batch_first:
            query, key, value = (mv.transpose(t, 0, 1) for t in (query, key, value))
        (wq, bq), (wk, bk), (wv, bv) = self._projections()
        batch, length, source = query.shape[0], query.shape[1], key.shape[1]
        q, k, v = (F.linear(x, w, b) for x, w, b in ((query, wq, bq), (key, wk, bk), (value, wv, bv)))
        if self.bias_k is not None:  # one more key/value position, the same learned vector for every batch row
            k, v = (mv.cat([t, mv.expand(bias, (batch, 1, self.embed_dim))], 1)
                    for t, bias in ((k, self.bias_k), (v, self.bias_v)))
        q, k, v = (self._split_heads(t) for t in (q, k, v))
        if self.add_zero_attn:  # and one more all-zero key/value position
            k, v = mv.pad_dim(k, 2, 0, 1), mv.pad_dim(v, 2, 0, 1)
        mask = self._merged_mask(attn_mask, key_padding_mask, batch, length, source, q.dtype)
        if mask is not None and k.shape[2] > source:  # the added positions are attended to
            mask = mv.pad_dim(mask, -1, 0, k.shape[2] - source)
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            scores = ew.mul(linalg.matmul(q, mv.mT(k)), 1.0 / math.sqrt(self.head_dim))
            weights = F.softmax(scores if mask is None else ew.add(scores, mask), -1)
            weights = F.dropout(weights, dropout_p) if dropout_p else weights  # returned after dropout, as torch
            attended = linalg.matmul(weights, v)
        else:
            weights = None
            attended = F.scaled_dot_product_attention(q, k, v, mask, dropout_p)
        merged = mv.reshape(mv.transpose(attended, 1, 2), (batch, length, self.embed_dim))
        out = self.out_proj(merged)
        if weights is not None and average_attn_weights:
            weights = rd.mean(weights, 1)
        if unbatched:
            return mv.squeeze(out, 0), None if weights is None else mv.squeeze(weights, 0)
        return (out if self.batch_first else mv.transpose(out, 0, 1)), weights

    def _merged_mask(self, attn_mask: Tensor | None, key_padding_mask: Tensor | None, batch: int, length: int,
                     source: int, dtype: dtypes.DType) -> Tensor | None:
        """One additive mask of shape (N, H, L, S), or None."""
        attn_mask, key_padding_mask = _additive_mask(attn_mask, dtype), _additive_mask(key_padding_mask, dtype)
        if attn_mask is not None and attn_mask.ndim == 3:  # (N * H, L, S)
            attn_mask = mv.reshape(attn_mask, (batch, self.num_heads, length, source))
        if key_padding_mask is not None:
            padding = mv.reshape(key_padding_mask, (batch, 1, 1, source))
            attn_mask = padding if attn_mask is None else ew.add(attn_mask, padding)
        return attn_mask


def _activation(activation: Activation) -> Callable[[Tensor], Tensor]:
    if isinstance(activation, str):
        if activation not in _ACTIVATIONS:
            raise RuntimeError(f"activation should be relu/gelu, not {activation}")
        return _ACTIVATIONS[activation]
    return activation


class _TransformerLayer(Module):
    """What encoder and decoder layers share: PyTorch's attribute names and registration order (so state_dicts
    and parameter order match torch's), the self-attention block and the feed-forward block."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, activation: Activation,
                 layer_norm_eps: float, batch_first: bool, norm_first: bool, bias: bool, dtype: Any,
                 cross_attention: bool) -> None:
        super().__init__()
        attention = dict(dropout=dropout, bias=bias, batch_first=batch_first, dtype=dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, **attention)
        if cross_attention:
            self.multihead_attn = MultiheadAttention(d_model, nhead, **attention)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = norm_first
        self._blocks = 3 if cross_attention else 2
        for i in range(1, self._blocks + 1):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        for i in range(1, self._blocks + 1):
            setattr(self, f"dropout{i}", Dropout(dropout))
        self.activation = _activation(activation)

    def _sa_block(self, x: Tensor, attn_mask: Tensor | None, key_padding_mask: Tensor | None,
                  is_causal: bool) -> Tensor:
        out = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                             is_causal=is_causal)[0]
        return self.dropout1(out)

    def _ff_block(self, x: Tensor) -> Tensor:
        last_dropout = getattr(self, f"dropout{self._blocks}")
        return last_dropout(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoderLayer(_TransformerLayer):
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: Activation = F.relu, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, dtype, cross_attention=False)

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        x = src
        attend = lambda y: self._sa_block(y, src_mask, src_key_padding_mask, is_causal)
        if self.norm_first:
            x = x + attend(self.norm1(x))
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + attend(x))
        return self.norm2(x + self._ff_block(x))


class TransformerDecoderLayer(_TransformerLayer):
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: Activation = F.relu, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, dtype, cross_attention=True)

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: bool = False, memory_is_causal: bool = False) -> Tensor:
        x = tgt
        attend = lambda y: self._sa_block(y, tgt_mask, tgt_key_padding_mask, tgt_is_causal)
        cross = lambda y: self._mha_block(y, memory, memory_mask, memory_key_padding_mask, memory_is_causal)
        if self.norm_first:
            x = x + attend(self.norm1(x))
            x = x + cross(self.norm2(x))
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + attend(x))
        x = self.norm2(x + cross(x))
        return self.norm3(x + self._ff_block(x))

    def _mha_block(self, x: Tensor, memory: Tensor, attn_mask: Tensor | None, key_padding_mask: Tensor | None,
                   is_causal: bool) -> Tensor:
        out = self.multihead_attn(x, memory, memory, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                  need_weights=False, is_causal=is_causal)[0]
        return self.dropout2(out)


class TransformerEncoder(Module):
    """`num_layers` deep copies of `encoder_layer` (so all start from the same weights, as torch)."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers, self.norm = num_layers, norm

    def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool | None = None) -> Tensor:
        output = src
        for layer in self.layers:
            output = layer(output, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                           is_causal=bool(is_causal))
        return output if self.norm is None else self.norm(output)


class TransformerDecoder(Module):
    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(decoder_layer) for _ in range(num_layers)])
        self.num_layers, self.norm = num_layers, norm

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: bool | None = None, memory_is_causal: bool = False) -> Tensor:
        output = tgt
        for layer in self.layers:
            output = layer(output, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                           bool(tgt_is_causal), memory_is_causal)
        return output if self.norm is None else self.norm(output)


class Transformer(Module):
    """torch.nn.Transformer: an encoder stack and a decoder stack, each ending in a LayerNorm; every matrix
    parameter starts xavier_uniform (torch's `_reset_parameters`)."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1, activation: Activation = F.relu,
                 custom_encoder: Module | None = None, custom_decoder: Module | None = None,
                 layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False,
                 bias: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        layer = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                     layer_norm_eps=layer_norm_eps, batch_first=batch_first, norm_first=norm_first, bias=bias,
                     dtype=dtype)
        norm = lambda: LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)  # noqa: E731
        self.encoder = custom_encoder or TransformerEncoder(TransformerEncoderLayer(d_model, nhead, **layer),
                                                            num_encoder_layers, norm())
        self.decoder = custom_decoder or TransformerDecoder(TransformerDecoderLayer(d_model, nhead, **layer),
                                                            num_decoder_layers, norm())
        for parameter in self.parameters():
            if parameter.ndim > 1:
                init.xavier_uniform_(parameter)
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                src_is_causal: bool | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        batch_dim = 0 if self.batch_first else 1
        if src.ndim == 3 and src.shape[batch_dim] != tgt.shape[batch_dim]:
            fail("Transformer", f"the batch number of src ({src.shape[batch_dim]}) and tgt "
                 f"({tgt.shape[batch_dim]}) must be equal", kind=ShapeError)
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            fail("Transformer", f"the feature number of src and tgt must be equal to d_model ({self.d_model}), got "
                 f"{src.shape[-1]} and {tgt.shape[-1]}", kind=ShapeError)
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device: Any = None, dtype: Any = None) -> Tensor:
        """The causal mask: -inf above the diagonal (a position may not attend to later ones), 0 elsewhere."""
        return mv.triu(creation.full((sz, sz), -math.inf, dtype=dtype, device=device), 1)
