"""tensorgraphs: a deep-learning compiler with a lazy, PyTorch-named Tensor API.

    import tensorgraphs as tg
    x = tg.randn(4, 3, requires_grad=True)
    (x @ x.T).relu().sum().backward()
"""

from tensorgraphs import dtypes
from tensorgraphs import missing as _missing
from tensorgraphs.frontend.backward import grad
from tensorgraphs.dtypes import (
    bfloat16,
    bool_ as bool,
    complex64,
    complex128,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    promote_types,
    uint8,
)
from tensorgraphs.errors import (
    ArgumentError,
    ArgumentTypeError,
    AutogradError,
    DTypeError,
    IndexingError,
    ShapeError,
    TGError,
    UnsupportedError,
)
from tensorgraphs.frontend import copying as _copying  # noqa: F401  (deepcopy and pickle of tensors)
from tensorgraphs.frontend import methods as _methods  # noqa: F401  (attaches Tensor methods)
from tensorgraphs.frontend.creation import *  # noqa: F401,F403
from tensorgraphs.frontend.elementwise import *  # noqa: F401,F403
from tensorgraphs.frontend.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from tensorgraphs.frontend.precision import get_float32_matmul_precision, set_float32_matmul_precision
from tensorgraphs.frontend.random import Generator, default_generator, initial_seed
from tensorgraphs.frontend.linalg import bmm, dot, einsum, matmul, mm, outer
from tensorgraphs.frontend.movement import (
    broadcast_tensors,
    broadcast_to,
    cat,
    chunk,
    flatten,
    flip,
    gather,
    index_select,
    movedim,
    narrow,
    permute,
    repeat_interleave,
    reshape,
    roll,
    scatter_add,
    split,
    squeeze,
    stack,
    take_along_dim,
    tile,
    transpose,
    tril,
    triu,
    unbind,
    unflatten,
    unsqueeze,
)
from tensorgraphs.frontend.reduce import (
    all,
    amax,
    amin,
    any,
    argmax,
    argmin,
    count_nonzero,
    cumprod,
    cumsum,
    logsumexp,
    max,
    mean,
    min,
    norm,
    prod,
    std,
    sum,
    var,
    var_mean,
)
from tensorgraphs.frontend.sampling import multinomial
from tensorgraphs.frontend.sorting import argsort, msort, sort, topk
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.runtime.realize import default_device, device, set_default_device
from tensorgraphs import rewrite  # noqa: E402
from tensorgraphs.graph.show import show  # noqa: E402
from tensorgraphs import nn  # noqa: E402  (after Tensor methods exist)
from tensorgraphs import amp, cpu, cuda, data, distributed, fft, onnx, optim, utils  # noqa: E402  (onnx: lazily)
from tensorgraphs.stft import istft, stft  # noqa: E402
from tensorgraphs.frontend.complex import (  # noqa: E402
    ComplexTensor, angle, complex_from as complex, conj, imag, is_complex, polar, real, view_as_complex, view_as_real,
)
from tensorgraphs.amp import GradScaler, autocast, get_autocast_dtype, is_autocast_enabled  # noqa: E402
from tensorgraphs.serialization import load, save  # noqa: E402
from tensorgraphs import quantization  # noqa: E402
from tensorgraphs.quantization import qint8, qint32, quantize_per_channel, quantize_per_tensor, quint8  # noqa: E402

half, double, long, short = float16, float64, int64, int16
float = float32
int = int32
concat = concatenate = cat
__version__ = "0.1.0"
from tensorgraphs.backends import cpu as _cpu  # noqa: F401  (registers the "cpu" device)
from tensorgraphs.backends import portable as _portable  # noqa: F401  (registers the "portable" device)
from tensorgraphs import plan as _plan  # noqa: F401  (built-in kernels, the "planned" device)
from tensorgraphs.profiler import install_from_environment as _install_profiler, profile

_install_profiler()
from tensorgraphs.compiled import CompiledFunction  # noqa: E402  (trace once, replay compiled)
from tensorgraphs.dynamic import Dim  # noqa: E402  (a symbolic dimension for tg.compile(dynamic=...))
from tensorgraphs.nn.compiled_module import CompiledModule, compile  # noqa: E402
from tensorgraphs.export import export  # noqa: E402  (a compiled program as a C library)

__getattr__ = _missing.module_getattr(__name__, globals())  # missing torch names: "not implemented yet"
