"""The generated GEMM and conv2d kernels (implicit im2col, Winograd): C with AVX-512 intrinsics (on an AVX2 machine,
each 16-lane vector a pair of AVX registers: avx512_on_avx2.h), built once per machine and cached.

Generated C calls them by name (`C_FUNCTIONS`, declared in `HEADER`, linked from `library_path()`); Python
calls them on numpy arrays through `matmul` and `conv2d` below, which the tests and the benchmark use.
The contract of every argument is in gemm.h.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.kernels.gemm.build import SOURCE_DIR, KernelBuildError, build_library, compiler_version, load_library

LIBRARY = "tg_gemm"
SOURCES = ("describe.c", "gemm.c", "gemv.c", "conv.c", "columns.c", "winograd.c", "direct.c")
HEADER = SOURCE_DIR / "gemm.h"
WINOGRAD_HEADER = SOURCE_DIR / "winograd.h"
"""Declares tg_conv2d_winograd_f32 (tg_conv2d_f32's contract), the weights' transform tg_winograd_weights_f32, and
tg_conv2d_winograd_prepared_f32 (the conv given that transform)."""
DIRECT_HEADER = SOURCE_DIR / "direct.h"
"""Declares tg_conv2d_direct_f32 (tg_conv2d_f32's contract)."""
C_FUNCTIONS = {
    "matmul": "tg_gemm_f32",
    "matmul_bf16": "tg_gemm_bf16",
    "matmul_bf16_f32": "tg_gemm_bf16_f32",
    "conv2d": "tg_conv2d_f32",
    "conv2d_winograd": "tg_conv2d_winograd_f32",
    "winograd_weights": "tg_winograd_weights_f32",
    "conv2d_winograd_prepared": "tg_conv2d_winograd_prepared_f32",
    "conv2d_direct": "tg_conv2d_direct_f32",
}
CONV_ALGORITHMS = {"implicit_gemm": "conv2d", "winograd": "conv2d_winograd", "direct": "conv2d_direct"}
"""conv2d's kernels (keys of C_FUNCTIONS) by algorithm; all are tg_conv2d_fn (gemm.h). (The im2col kernel, which
links OpenBLAS, is `blas.conv2d`.)"""
WINOGRAD_FUNCTIONS = ("conv2d_winograd", "winograd_weights", "conv2d_winograd_prepared")
"""The keys of C_FUNCTIONS that winograd.h declares."""
GEMM_FUNCTIONS = {
    ("float32", "float32"): "matmul",
    ("bfloat16", "bfloat16"): "matmul_bf16",
    ("bfloat16", "float32"): "matmul_bf16_f32",
}
"""The product kernel (a key of C_FUNCTIONS) by (operand dtype, result dtype). Every array is float32: bfloat16
operands are rounded to bfloat16 while packing, their exact products summed in float32, and a bfloat16 result is
rounded after the epilogue (gemm.h)."""
ACTIVATIONS = {"none": 0, "relu": 1, "gelu_tanh": 2}
EPILOGUE_ACTIVATIONS = {**ACTIVATIONS, "gelu_tanh_grad": 3}
"""An epilogue may also apply a gradient activation: gelu_tanh_grad multiplies by gelu'(residual) (gemm.h)."""
AFTER_RESIDUAL = 16
"""TG_ACT_AFTER_RESIDUAL (gemm.h): the flag in an epilogue's activation code that applies it after the residual."""


def epilogue_code(activation: str, after_residual: bool) -> int:
    """The C code of an epilogue's activation (`EPILOGUE_ACTIVATIONS`), applied after the residual add with
    `after_residual` (not the gradient activation, which reads the residual instead)."""
    if after_residual and activation not in ACTIVATIONS:
        fail("epilogue", f"{activation} cannot come after the residual", ArgumentError)
    return EPILOGUE_ACTIVATIONS[activation] | (AFTER_RESIDUAL if after_residual else 0)


STATUS = {-1: "a stride the kernel does not take", -2: "an unknown activation", -3: "out of memory"}

_i64, _ptr, _f32, _i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int32
GEMM_ARGTYPES = (
    [_i64] * 4
    + [_ptr, _i64, _i64, _i64] * 2
    + [_ptr, _i64, _i64, _f32, _ptr, _i64, _i64, _i64, _ptr, _i64, _i64]
    + [_i32] * 3  # activation, a_prologue, b_prologue
)
CONV_ARGTYPES = [_i64] * 13 + [_ptr] * 4 + [_i64, _f32, _ptr, _i32]
OTHER_ARGTYPES = {
    "winograd_weights": [_i64, _i64, _ptr, _ptr],
    "conv2d_winograd_prepared": [*CONV_ARGTYPES, _ptr],  # the weights' transform last
}


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return frozenset(next((line.split() for line in cpuinfo if line.startswith("flags")), ()))
    except OSError:
        return frozenset()


def avx512() -> bool:
    """Whether these kernels run on AVX-512F itself (else on AVX2 and FMA standing in for it)."""
    return "avx512f" in _cpu_flags()


@functools.cache
def available() -> bool:
    """Whether this machine can run these kernels: AVX-512F (they use its intrinsics), or AVX2 and FMA (which stand
    in for it: avx512_on_avx2.h), and a C compiler."""
    try:
        return (avx512() or {"avx2", "fma"} <= _cpu_flags()) and bool(compiler_version())
    except KernelBuildError:
        return False


def library_path() -> Path:
    """The compiled library (built on first call) for generated programs to link against."""
    return build_library(LIBRARY, SOURCES)


@functools.cache
def _functions() -> dict[str, Callable[..., int]]:
    library = load_library(LIBRARY, SOURCES)
    functions = {}
    conv = ((name, CONV_ARGTYPES) for name in CONV_ALGORITHMS.values())
    gemms = ((name, GEMM_ARGTYPES) for name in GEMM_FUNCTIONS.values())
    for name, argtypes in (*gemms, *conv, *OTHER_ARGTYPES.items()):
        function = getattr(library, C_FUNCTIONS[name])
        function.argtypes, function.restype = argtypes, ctypes.c_int
        functions[name] = function
    library.tg_gemm_config.argtypes = [ctypes.POINTER(ctypes.c_int64 * 5)]
    functions["config"] = library.tg_gemm_config
    library.tg_gemm_path_counts.argtypes = [ctypes.POINTER(ctypes.c_int64 * 2)]
    functions["path_counts"] = library.tg_gemm_path_counts
    return functions


def blocking() -> dict[str, int]:
    """The register tile and cache blocks compiled in (MR, NR, MC, KC, NC)."""
    values = (ctypes.c_int64 * 5)()
    _functions()["config"](ctypes.byref(values))
    return dict(zip(("MR", "NR", "MC", "KC", "NC"), values, strict=True))


def path_counts() -> dict[str, int]:
    """How many products this process has run by each path of the library (generated programs' calls included):
    "few_rows" read B in place (gemv.c), "blocked" packed it (gemm.c)."""
    values = (ctypes.c_int64 * 2)()
    _functions()["path_counts"](ctypes.byref(values))
    return dict(zip(("few_rows", "blocked"), values, strict=True))


def _check_status(op: str, status: int) -> None:
    if status != 0:
        fail(op, f"the kernel rejected its arguments: {STATUS.get(status, status)}", ArgumentError)


def _address(array: np.ndarray, offset: int = 0) -> int:
    return array.ctypes.data + 4 * offset


def _element_strides(array: np.ndarray) -> tuple[int, ...]:
    return tuple(stride // 4 for stride in array.strides)


def merge_batch_dims(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> list[tuple[int, list[int]]]:
    """Adjacent batch dims that every operand walks with one stride become one dim: [(size, strides)]."""
    merged: list[tuple[int, list[int]]] = []
    for dim, size in enumerate(shape):
        if size == 1:
            continue
        inner = [operand[dim] for operand in strides]
        if merged and all(outer == stride * size for outer, stride in zip(merged[-1][1], inner, strict=True)):
            merged[-1] = (merged[-1][0] * size, inner)
        else:
            merged.append((size, inner))
    return merged


def _float32(op: str, name: str, value: object) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype != np.float32:
        fail(op, f"{name} must be float32, got {array.dtype}", ArgumentError)
    if any(stride % 4 for stride in array.strides):
        array = np.ascontiguousarray(array)
    return array


def _check_activations(op: str, known: dict[str, int] = ACTIVATIONS, **activations: str) -> None:
    for name, activation in activations.items():
        if activation not in known:
            fail(op, f"{name} must be one of {sorted(known)}, got {activation!r}", ArgumentError)


def _gemm_operands(
    a: np.ndarray,
    b: np.ndarray,
    bias: np.ndarray | None,
    residual: np.ndarray | None,
    out: np.ndarray | None,
) -> tuple[list[np.ndarray], tuple[int, int, int]]:
    """[a, b, out, bias?, residual?] as views of the output's batch shape, and (M, N, K); checks everything."""
    a, b = _float32("matmul", "a", a), _float32("matmul", "b", b)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        fail("matmul", f"shapes {a.shape} and {b.shape} cannot be multiplied (need (..., M, K) @ (..., K, N))")
    (m, k), n = a.shape[-2:], b.shape[-1]
    try:
        batch_shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        fail("matmul", f"batch dims of {a.shape} and {b.shape} do not broadcast")
    out_shape = (*batch_shape, m, n)
    if out is None:
        out = np.empty(out_shape, np.float32)
    elif out.shape != out_shape or out.dtype != np.float32 or (n > 1 and out.strides[-1] != 4):
        fail("matmul", f"out must be float32 {out_shape} with unit column stride, got {out.dtype} {out.shape}")
    elif any(x is not None and np.may_share_memory(out, x) for x in (a, b, bias, residual)):
        fail("matmul", "out must not overlap an input (the kernel stores partial sums in it)", ArgumentError)
    operands = [np.broadcast_to(a, (*batch_shape, m, k)), np.broadcast_to(b, (*batch_shape, k, n)), out]
    for extra, unit_columns in ((bias, False), (residual, True)):
        if extra is not None:
            view = np.broadcast_to(_float32("matmul", "epilogue operand", extra), out_shape)
            if view.strides[-1] not in ((4,) if unit_columns else (0, 4)) and n > 1:
                view = np.ascontiguousarray(view)
            operands.append(view)
    return operands, (m, n, k)


def bind_gemm(
    function: Callable[..., int],
    a: np.ndarray,
    b: np.ndarray,
    *,
    bias: np.ndarray | None = None,
    residual: np.ndarray | None = None,
    activation: str = "none",
    alpha: float = 1.0,
    out: np.ndarray | None = None,
    a_prologue: str = "none",
    b_prologue: str = "none",
    activation_after_residual: bool = False,
) -> Callable[[], np.ndarray]:
    """A call, with every argument already converted, of
    out = activation(alpha * (a_prologue(a) @ b_prologue(b)) + bias) + residual
    (with `activation_after_residual`, activation(alpha * (a_prologue(a) @ b_prologue(b)) + bias + residual))
    through `function` (any C function with tg_gemm_f32's signature): what a generated program does, so
    repeated calls (benchmarks) pay no Python beyond ctypes. The prologues are activations (`ACTIVATIONS`) the
    kernel applies to an operand while packing it; the epilogue's activation may also be gelu_tanh_grad, which
    multiplies by gelu'(residual) instead of adding the residual (gemm.h).

    a (..., M, K) and b (..., K, N) broadcast their batch dims like torch.matmul (a 1-D a or b is a row or column
    that is squeezed from the result); bias and residual broadcast to the output. Transposed or broadcast
    operands are passed as strides, never copied.
    """
    a, b = np.asarray(a), np.asarray(b)
    vector_axes = tuple(axis for axis, vector in ((-2, a.ndim == 1), (-1, b.ndim == 1)) if vector)
    if vector_axes and out is not None:
        fail("matmul", "out= needs matrix operands (vectors are promoted and squeezed like torch.matmul)")
    a, b = a.reshape(1, -1) if a.ndim == 1 else a, b.reshape(-1, 1) if b.ndim == 1 else b
    _check_activations("matmul", EPILOGUE_ACTIVATIONS, activation=activation)
    _check_activations("matmul", a_prologue=a_prologue, b_prologue=b_prologue)
    if activation == "gelu_tanh_grad" and residual is None:
        fail("matmul", "activation gelu_tanh_grad reads gelu's input as its residual: pass residual=", ArgumentError)
    code = epilogue_code(activation, activation_after_residual)
    operands, (m, n, k) = _gemm_operands(a, b, bias, residual, out)
    strides = [_element_strides(operand) for operand in operands]
    dims = merge_batch_dims(operands[2].shape[:-2], [s[:-2] for s in strides])
    inner_size, inner_strides = dims.pop() if dims else (1, [0] * len(operands))
    calls = []
    for outer in np.ndindex(*(size for size, _ in dims)):
        offsets = [
            sum(i * dim_strides[o] for i, (_, dim_strides) in zip(outer, dims, strict=True))
            for o in range(len(operands))
        ]
        pointers = [_address(operand, offset) for operand, offset in zip(operands, offsets, strict=True)]
        args = [inner_size, m, n, k]
        args += [pointers[0], inner_strides[0], *strides[0][-2:], pointers[1], inner_strides[1], *strides[1][-2:]]
        args += [pointers[2], inner_strides[2], strides[2][-2], alpha]
        extra = iter(range(3, len(operands)))
        args += (
            [pointers[o := next(extra)], inner_strides[o], *strides[o][-2:]] if bias is not None else [None, 0, 0, 0]
        )
        args += [pointers[o := next(extra)], inner_strides[o], strides[o][-2]] if residual is not None else [None, 0, 0]
        calls.append((*args, code, ACTIVATIONS[a_prologue], ACTIVATIONS[b_prologue]))

    def run() -> np.ndarray:
        for args in calls:
            _check_status("matmul", function(*args))
        return operands[2].squeeze(vector_axes) if vector_axes else operands[2]  # keeps the operands alive

    return run


def call_gemm(function: Callable[..., int], a: np.ndarray, b: np.ndarray, **epilogue: object) -> np.ndarray:
    """Run `bind_gemm`'s call once."""
    return bind_gemm(function, a, b, **epilogue)()


def _gemm_function(dtype: str, result: str | None) -> Callable[..., int]:
    key = (dtype, dtype if result is None else result)
    if key not in GEMM_FUNCTIONS:
        fail("matmul", f"(dtype, result) must be one of {sorted(GEMM_FUNCTIONS)}, got {key}", ArgumentError)
    return _functions()[GEMM_FUNCTIONS[key]]


def matmul(
    a: np.ndarray, b: np.ndarray, *, dtype: str = "float32", result: str | None = None, **epilogue: object
) -> np.ndarray:
    """The generated GEMM on numpy float32 arrays: operands rounded to `dtype`, the result to `result` (`dtype` if
    None; see `GEMM_FUNCTIONS`); see `bind_gemm` for the epilogue arguments."""
    return call_gemm(_gemm_function(dtype, result), a, b, **epilogue)


def bind_matmul(
    a: np.ndarray, b: np.ndarray, *, dtype: str = "float32", result: str | None = None, **epilogue: object
) -> Callable[[], np.ndarray]:
    """`matmul` with its arguments converted once (see `bind_gemm`)."""
    return bind_gemm(_gemm_function(dtype, result), a, b, **epilogue)


def _pair(op: str, name: str, value: int | tuple[int, int]) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2:
        fail(op, f"{name} must be an int or a pair, got {value!r}", ArgumentError)
    return pair  # type: ignore[return-value]


def call_conv(
    function: Callable[..., int],
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    *,
    residual: np.ndarray | None = None,
    activation: str = "none",
    alpha: float = 1.0,
    activation_after_residual: bool = False,
    out: np.ndarray | None = None,
    out_over_residual: bool = False,
) -> np.ndarray:
    """torch.nn.functional.conv2d (NCHW, groups=1) with the GEMM's epilogue,
    out = activation(alpha * conv2d(x, weight) + bias) + residual (with `activation_after_residual`,
    activation(alpha * conv2d(x, weight) + bias + residual)), by `function` (any C function with the signature
    tg_conv2d_fn, gemm.h). `out`, if given, may have its images any distance apart, each contiguous (a slice of a
    concatenation along the channels); nothing else of its buffer is written. With `out_over_residual` (a kernel
    of this library: gemm.h) `out` may be the residual itself, contiguous, overwritten by the result."""
    x, weight = (np.ascontiguousarray(_float32("conv2d", name, v)) for name, v in (("x", x), ("weight", weight)))
    if x.ndim != 4 or weight.ndim != 4 or x.shape[1] != weight.shape[1]:
        fail("conv2d", f"input {x.shape} and weight {weight.shape} do not fit (need NCHW and (Cout, Cin, kH, kW))")
    _check_activations("conv2d", activation=activation)
    (sh, sw), (ph, pw), (dh, dw) = (
        _pair("conv2d", n, v) for n, v in (("stride", stride), ("padding", padding), ("dilation", dilation))
    )
    (batch, cin, h, w), (cout, _, kh, kw) = x.shape, weight.shape
    oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        fail("conv2d", f"input {x.shape} with padding {(ph, pw)} is smaller than the kernel {weight.shape}")
    over_residual = out_over_residual and out is not None and out is residual and out.flags.c_contiguous
    out = _conv_out(out, (batch, cout, oh, ow), x, weight, bias, None if over_residual else residual)
    bias, residual = (
        None if value is None else np.ascontiguousarray(np.broadcast_to(_float32("conv2d", name, value), shape))
        for name, value, shape in (("bias", bias, (cout,)), ("residual", residual, out.shape))
    )
    geometry = (batch, cin, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw)
    pointers = [None if array is None else _address(array) for array in (x, weight, bias, out, residual)]
    code = epilogue_code(activation, activation_after_residual)
    status = function(*geometry, *pointers[:4], out.strides[0] // 4, alpha, pointers[4], code)
    _check_status("conv2d", status)
    return out


def _conv_out(out: np.ndarray | None, shape: tuple[int, ...], *inputs: np.ndarray | None) -> np.ndarray:
    """`out` checked to be a conv kernel's output of `shape` (images any distance apart, each contiguous, overlapping
    no input), or a new array."""
    if out is None:
        return np.empty(shape, np.float32)
    if out.shape != shape or out.dtype != np.float32 or not all(image.flags.c_contiguous for image in out[:1]):
        fail("conv2d", f"out must be float32 {shape} with contiguous images, got {out.dtype} {out.shape}")
    if shape[0] > 1 and out.strides[0] < 4 * out[0].size:
        fail("conv2d", "out's images must not overlap", ArgumentError)
    if any(array is not None and np.may_share_memory(out, array) for array in inputs):
        fail("conv2d", "out must not overlap an input", ArgumentError)
    return out


def conv2d(
    x: np.ndarray,
    weight: np.ndarray,
    *args: Any,
    algorithm: str = "implicit_gemm",
    prepared: np.ndarray | None = None,
    **kwargs: Any,
) -> np.ndarray:
    """torch.nn.functional.conv2d (NCHW, groups=1) with the GEMM's epilogue (arguments as `call_conv`; `out` may be
    the residual), by `algorithm` (`CONV_ALGORITHMS`): an implicit-im2col GEMM, a direct conv (any geometry; fast for
    few input channels), or Winograd F(4x4, 3x3) (3x3 kernels at stride 1; other convs run the implicit GEMM), which
    takes the weights' transform as `prepared` (`winograd_weights(weight)`) instead of making it."""
    if algorithm not in CONV_ALGORITHMS:
        fail("conv2d", f"algorithm must be one of {sorted(CONV_ALGORITHMS)}, got {algorithm!r}", ArgumentError)
    kwargs = {"out_over_residual": True, **kwargs}
    if prepared is None:
        return call_conv(_functions()[CONV_ALGORITHMS[algorithm]], x, weight, *args, **kwargs)
    if algorithm != "winograd":
        fail("conv2d", f"only winograd takes prepared weights, not {algorithm!r}", ArgumentError)
    cout, cin = np.shape(weight)[:2]
    if (prepared.dtype != np.float32 or prepared.shape != (winograd_weights_size(cout, cin),)
            or not prepared.flags.c_contiguous):
        fail("conv2d", f"prepared must be winograd_weights of a {(cout, cin)} weight, got {prepared.shape}")
    prepared_conv, u = _functions()["conv2d_winograd_prepared"], _address(prepared)
    return call_conv(lambda *arguments: prepared_conv(*arguments, u), x, weight, *args, **kwargs)


def winograd_weights_size(cout: int, cin: int) -> int:
    """The floats of tg_winograd_weights_f32's transform: 36 matrices of cout x cin, then the finite flag."""
    return 36 * cout * cin + 1


def winograd_weights(weight: np.ndarray) -> np.ndarray:
    """The Winograd F(4x4, 3x3) transform of `weight` (cout, cin, 3, 3) that `conv2d(..., prepared=)` takes:
    tg_winograd_weights_f32's 36 * cout * cin floats (point-major, each point a cout x cin matrix) and a last one,
    1 where every weight is finite, else 0."""
    weight = np.ascontiguousarray(_float32("winograd_weights", "weight", weight))
    if weight.ndim != 4 or weight.shape[2:] != (3, 3):
        fail("winograd_weights", f"weight must be (cout, cin, 3, 3), got {weight.shape}", ArgumentError)
    cout, cin = weight.shape[:2]
    u = np.empty(winograd_weights_size(cout, cin), np.float32)
    _check_status("winograd_weights", _functions()["winograd_weights"](cout, cin, _address(weight), _address(u)))
    return u


def conv1d(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
    *,
    residual: np.ndarray | None = None,
    activation: str = "none",
    alpha: float = 1.0,
    activation_after_residual: bool = False,
) -> np.ndarray:
    """torch.nn.functional.conv1d (NCL, groups=1): conv2d over images of height 1."""
    x, weight = np.asarray(x), np.asarray(weight)
    if x.ndim != 3 or weight.ndim != 3:
        fail("conv1d", f"input {x.shape} and weight {weight.shape} do not fit (need NCL and (Cout, Cin, k))")
    as_image = lambda array: None if array is None else np.asarray(array)[:, :, None, :]
    out = conv2d(
        as_image(x),
        as_image(weight),
        bias,
        (1, stride),
        (0, padding),
        (1, dilation),
        residual=as_image(residual),
        activation=activation,
        alpha=alpha,
        activation_after_residual=activation_after_residual,
    )
    return out[:, :, 0, :]
