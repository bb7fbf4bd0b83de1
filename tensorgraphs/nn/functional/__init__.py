"""torch.nn.functional's names: activations, normalization, convolution and pooling, attention, losses,
distances, padding and channel shuffles.

Composites (kept whole in the graph until a later stage decomposes them):
softmax, log_softmax, gelu, layer_norm, conv2d, scaled_dot_product_attention,
cross_entropy (class-index targets). Everything else is a composition of
Tensor ops.
"""

from tensorgraphs import missing as _missing
from tensorgraphs.frontend.movement import one_hot, pad
from tensorgraphs.nn.functional.activations import (
    celu,
    celu_,
    elu,
    elu_,
    gelu,
    glu,
    hardshrink,
    hardsigmoid,
    hardswish,
    hardtanh,
    hardtanh_,
    leaky_relu,
    leaky_relu_,
    log_softmax,
    logsigmoid,
    mish,
    prelu,
    relu,
    relu6,
    relu_,
    selu,
    selu_,
    sigmoid,
    silu,
    softmax,
    softmin,
    softplus,
    softshrink,
    softsign,
    tanh,
    tanhshrink,
    threshold,
    threshold_,
)
from tensorgraphs.nn.functional.attention import scaled_dot_product_attention
from tensorgraphs.nn.functional.conv import conv1d, conv2d, conv_transpose1d, conv_transpose2d, fold, unfold
from tensorgraphs.nn.functional.distance import cosine_similarity, normalize, pairwise_distance, pdist
from tensorgraphs.nn.functional.linear import bilinear, dropout, dropout1d, dropout2d, dropout3d, embedding, linear
from tensorgraphs.nn.functional.losses import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cosine_embedding_loss,
    cross_entropy,
    gaussian_nll_loss,
    hinge_embedding_loss,
    huber_loss,
    kl_div,
    l1_loss,
    margin_ranking_loss,
    mse_loss,
    multi_margin_loss,
    multilabel_soft_margin_loss,
    nll_loss,
    poisson_nll_loss,
    smooth_l1_loss,
    soft_margin_loss,
    triplet_margin_loss,
)
from tensorgraphs.nn.functional.normalization import (
    batch_norm,
    group_norm,
    instance_norm,
    layer_norm,
    local_response_norm,
    rms_norm,
)
from tensorgraphs.nn.functional.pooling import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
    avg_pool1d,
    avg_pool2d,
    lp_pool1d,
    lp_pool2d,
    max_pool1d,
    max_pool2d,
)
from tensorgraphs.nn.functional.shuffle import channel_shuffle, native_channel_shuffle, pixel_shuffle, pixel_unshuffle

__all__ = [
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d", "avg_pool1d",
    "avg_pool2d", "batch_norm", "bilinear", "binary_cross_entropy", "binary_cross_entropy_with_logits", "celu",
    "celu_", "channel_shuffle", "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "cosine_embedding_loss",
    "cosine_similarity", "cross_entropy", "dropout", "dropout1d", "dropout2d", "dropout3d", "elu", "elu_",
    "embedding", "fold", "gaussian_nll_loss", "gelu", "glu", "group_norm", "hardshrink", "hardsigmoid", "hardswish",
    "hardtanh", "hardtanh_", "hinge_embedding_loss", "huber_loss", "instance_norm", "kl_div", "l1_loss",
    "layer_norm", "leaky_relu", "leaky_relu_", "linear", "local_response_norm", "log_softmax", "logsigmoid",
    "lp_pool1d", "lp_pool2d", "margin_ranking_loss", "max_pool1d", "max_pool2d", "mish", "mse_loss",
    "multi_margin_loss", "multilabel_soft_margin_loss", "native_channel_shuffle", "nll_loss", "normalize",
    "one_hot", "pad", "pairwise_distance", "pdist", "pixel_shuffle", "pixel_unshuffle", "poisson_nll_loss", "prelu",
    "relu", "relu6", "relu_", "rms_norm", "scaled_dot_product_attention", "selu", "selu_", "sigmoid", "silu",
    "smooth_l1_loss", "soft_margin_loss", "softmax", "softmin", "softplus", "softshrink", "softsign", "tanh",
    "tanhshrink", "threshold", "threshold_", "triplet_margin_loss", "unfold",
]

__getattr__ = _missing.module_getattr(__name__, globals())  # missing torch names: "not implemented yet"
