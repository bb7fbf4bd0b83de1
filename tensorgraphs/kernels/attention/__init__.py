"""The fused attention kernels (attention.c), built once per machine and cached like the GEMM library.

Generated C calls them by name (`C_FUNCTIONS`, declared in `HEADER`, linked from `library_path()`); Python calls
them on numpy arrays through `forward` and `backward` below, which the tests and the benchmark use. The contract
of every argument is in attention.h.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tensorgraphs.errors import fail
from tensorgraphs.kernels.gemm.build import build_library, load_library

SOURCE_DIR = Path(__file__).resolve().parent
LIBRARY = "tg_attention"
SOURCES = ("attention.c",)
HEADER = SOURCE_DIR / "attention.h"
C_FUNCTIONS = {"forward": "tg_attention_forward_f32", "backward": "tg_attention_backward_f32",
               "forward_bf16": "tg_attention_forward_bf16", "backward_bf16": "tg_attention_backward_bf16"}
MASK_KINDS = {"none": 0, "bool": 1, "add": 2}


class Mask(ctypes.Structure):
    """tg_attention_mask: the mask's address, its (batch, head, row, column) strides and its kind."""

    _fields_ = [("data", ctypes.c_void_p), ("bs", ctypes.c_int64), ("hs", ctypes.c_int64), ("rs", ctypes.c_int64),
                ("cs", ctypes.c_int64), ("kind", ctypes.c_int32)]


_i64, _ptr, _f32, _i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int32
_OPERANDS = [_ptr, _i64, _i64, _i64] * 3
FORWARD_ARGTYPES = [_i64] * 6 + _OPERANDS + [Mask, _i32, _f32, _ptr, _ptr]
BACKWARD_ARGTYPES = [_i64] * 6 + _OPERANDS + [Mask, _i32, _f32, _ptr, _ptr, _ptr, _i64, _i64, _i64] + [_ptr] * 3


def function_name(backward: bool, bf16: bool) -> str:
    """The key of `C_FUNCTIONS` computing the forward or backward pass, in float32 or on bfloat16 products."""
    return ("backward" if backward else "forward") + ("_bf16" if bf16 else "")


def library_path() -> Path:
    """The compiled library (built on first call) for generated programs to link against."""
    return build_library(LIBRARY, SOURCES, source_dir=SOURCE_DIR)


@functools.cache
def _functions() -> dict[str, Callable[..., int]]:
    library = load_library(LIBRARY, SOURCES, source_dir=SOURCE_DIR)
    functions = {}
    for name in C_FUNCTIONS:
        argtypes = BACKWARD_ARGTYPES if name.startswith("backward") else FORWARD_ARGTYPES
        function = getattr(library, C_FUNCTIONS[name])
        function.argtypes, function.restype = argtypes, ctypes.c_int
        functions[name] = function
    return functions


def _heads(op: str, x: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """`x` (B, H, rows, cols) as float32 with a unit column stride, and its (B, H, row) element strides."""
    if x.ndim != 4:
        fail(op, f"expected (batch, heads, rows, cols) arrays, got shape {x.shape}")
    x = np.asarray(x, np.float32)
    if (x.shape[-1] > 1 and x.strides[-1] != 4) or any(s % 4 for s in x.strides):
        x = np.ascontiguousarray(x)
    return x, [s // 4 for s in x.strides[:3]]


def _mask(mask: np.ndarray | None, shape: tuple[int, ...]) -> tuple[Mask, np.ndarray | None]:
    if mask is None:
        return Mask(None, 0, 0, 0, 0, MASK_KINDS["none"]), None
    kind = "bool" if mask.dtype == np.bool_ else "add"
    view = np.broadcast_to(mask.astype(np.uint8 if kind == "bool" else np.float32, copy=False), shape)
    strides = [s // view.itemsize for s in view.strides]
    return Mask(view.ctypes.data, *strides, MASK_KINDS[kind]), view


def _problem(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None) -> tuple[list, list, tuple]:
    """The sizes, the operand arguments and what must stay alive during the call."""
    (q, qs), (k, ks), (v, vs) = (_heads("attention", x) for x in (q, k, v))
    b, h, queries, e = q.shape
    s, ev = k.shape[2], v.shape[3]
    mask_struct, mask_view = _mask(mask, (b, h, queries, s))
    operands = [q.ctypes.data, *qs, k.ctypes.data, *ks, v.ctypes.data, *vs, mask_struct]
    return [b, h, queries, s, e, ev], operands, (q, k, v, mask_view)


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, causal: bool = False,
            scale: float | None = None, bf16: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(out, logsumexp) of softmax(scale * q k^T + mask) v for (B, H, L, E) arrays; mask bool (True = attend)
    or float, broadcast to (B, H, L, S). `bf16`: the products on bfloat16 values (attention.h)."""
    sizes, operands, alive = _problem(q, k, v, mask)
    b, h, queries, _, e, ev = sizes
    scale = 1.0 / np.sqrt(max(e, 1)) if scale is None else scale
    out, lse = np.empty((b, h, queries, ev), np.float32), np.empty((b, h, queries), np.float32)
    function = _functions()[function_name(False, bf16)]
    status = function(*sizes, *operands, int(causal), scale, out.ctypes.data, lse.ctypes.data)
    del alive
    if status:
        raise MemoryError("attention forward: out of memory")
    return out, lse


def backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, lse: np.ndarray, dout: np.ndarray,
             mask: np.ndarray | None = None, causal: bool = False, scale: float | None = None,
             bf16: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) of `forward` given its (out, lse) and the gradient `dout` of out."""
    sizes, operands, alive = _problem(q, k, v, mask)
    b, h, queries, s, e, ev = sizes
    scale = 1.0 / np.sqrt(max(e, 1)) if scale is None else scale
    out, lse = np.ascontiguousarray(out, np.float32), np.ascontiguousarray(lse, np.float32)
    dout, dout_strides = _heads("attention", dout)
    grads = tuple(np.empty(shape, np.float32) for shape in ((b, h, queries, e), (b, h, s, e), (b, h, s, ev)))
    function = _functions()[function_name(True, bf16)]
    status = function(*sizes, *operands, int(causal), scale, out.ctypes.data, lse.ctypes.data, dout.ctypes.data,
                      *dout_strides, *(g.ctypes.data for g in grads))
    del alive
    if status:
        raise MemoryError("attention backward: out of memory")
    return grads
