"""torch.nn.functional's names: activations, normalization, convolution and pooling, attention, losses.

Composites (kept whole in the graph until a later stage decomposes them):
softmax, log_softmax, gelu, layer_norm, conv2d, scaled_dot_product_attention,
cross_entropy (class-index targets). Everything else is a composition of
Tensor ops.
"""

from tensorgraphs import missing as _missing
from tensorgraphs.frontend.movement import one_hot, pad
from tensorgraphs.nn.functional.activations import (
    elu,
    gelu,
    hardsigmoid,
    hardswish,
    hardtanh,
    leaky_relu,
    log_softmax,
    logsigmoid,
    mish,
    relu,
    relu6,
    selu,
    sigmoid,
    silu,
    softmax,
    softplus,
    softsign,
    tanh,
)
from tensorgraphs.nn.functional.attention import scaled_dot_product_attention
from tensorgraphs.nn.functional.conv import conv1d, conv2d, conv_transpose2d
from tensorgraphs.nn.functional.linear import dropout, embedding, linear
from tensorgraphs.nn.functional.losses import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cross_entropy,
    kl_div,
    l1_loss,
    mse_loss,
    nll_loss,
    smooth_l1_loss,
)
from tensorgraphs.nn.functional.normalization import batch_norm, group_norm, layer_norm, rms_norm
from tensorgraphs.nn.functional.pooling import adaptive_avg_pool2d, avg_pool2d, max_pool2d

__all__ = [
    "adaptive_avg_pool2d", "avg_pool2d", "batch_norm", "binary_cross_entropy", "binary_cross_entropy_with_logits",
    "conv1d", "conv2d", "conv_transpose2d", "cross_entropy", "dropout", "elu", "embedding", "gelu", "group_norm",
    "hardsigmoid", "hardswish", "hardtanh", "kl_div", "l1_loss", "layer_norm", "leaky_relu", "linear", "log_softmax",
    "logsigmoid", "max_pool2d", "mish", "mse_loss", "nll_loss", "one_hot", "pad", "relu", "relu6", "rms_norm",
    "scaled_dot_product_attention", "selu", "sigmoid", "silu", "smooth_l1_loss", "softmax", "softplus", "softsign",
    "tanh",
]

__getattr__ = _missing.module_getattr(__name__, globals())  # missing torch names: "not implemented yet"
