"""Neural-network building blocks with PyTorch's names: `tg.nn.Linear`, `tg.nn.functional`, `tg.nn.init`, ..."""

from tensorgraphs import missing as _missing
from tensorgraphs.nn import functional, init, parallel, utils
from tensorgraphs.nn.activation import (
    ELU,
    GELU,
    SELU,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    LeakyReLU,
    LogSigmoid,
    LogSoftmax,
    Mish,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Softsign,
    Tanh,
)
from tensorgraphs.nn.container import ModuleDict, ModuleList, Sequential
from tensorgraphs.nn.conv import Conv1d, Conv2d, ConvTranspose2d
from tensorgraphs.nn.dropout import Dropout
from tensorgraphs.nn.flatten import Flatten, Unflatten
from tensorgraphs.nn.linear import Bilinear, Identity, Linear
from tensorgraphs.nn.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from tensorgraphs.nn.module import Module
from tensorgraphs.nn.normalization import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm, RMSNorm
from tensorgraphs.nn.parameter import Parameter
from tensorgraphs.nn.pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from tensorgraphs.nn.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from tensorgraphs.nn.sparse import Embedding
from tensorgraphs.nn.transformer import (
    MultiheadAttention,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "AdaptiveAvgPool2d", "AvgPool2d", "BCELoss", "BCEWithLogitsLoss", "BatchNorm1d", "BatchNorm2d", "Bilinear",
    "Conv1d", "Conv2d", "ConvTranspose2d", "CrossEntropyLoss", "Dropout", "ELU", "Embedding", "Flatten", "GELU",
    "GRU", "GRUCell", "GroupNorm", "Hardsigmoid", "Hardswish", "Hardtanh", "HuberLoss", "Identity", "KLDivLoss",
    "L1Loss", "LSTM", "LSTMCell", "LayerNorm", "LeakyReLU", "Linear", "LogSigmoid", "LogSoftmax", "MSELoss",
    "MaxPool2d", "Mish", "Module", "ModuleDict", "ModuleList", "MultiheadAttention", "NLLLoss", "Parameter",
    "RMSNorm", "RNN", "RNNCell", "ReLU", "ReLU6", "SELU", "Sequential", "SiLU", "Sigmoid", "SmoothL1Loss",
    "Softmax", "Softplus", "Softsign", "Tanh", "Transformer", "TransformerDecoder", "TransformerDecoderLayer",
    "TransformerEncoder", "TransformerEncoderLayer", "Unflatten", "functional", "init", "parallel", "utils",
]

__getattr__ = _missing.module_getattr(__name__, globals())  # missing torch names: "not implemented yet"
