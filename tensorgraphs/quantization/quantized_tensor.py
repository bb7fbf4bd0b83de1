"""Quantized tensors with PyTorch's names: an integer tensor (`int_repr`) with a scale and a zero point, per tensor
or per channel, and the `quantize` / `dequantize` composites that convert between them and float32.

The arithmetic is torch's, so `int_repr` agrees bit for bit: a value is multiplied by the float32 reciprocal of
its float32 scale, the zero point added in float32, the sum rounded half to even and saturated to the dtype's
range (NaN saturates to the top, as torch's vectorized kernels do). Dequantizing computes (q - zero_point) * scale
in the scale's dtype: float32 per tensor, float64 per channel, as torch does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tensorgraphs import dtypes
from tensorgraphs.dtypes import DType
from tensorgraphs.errors import ArgumentError, DTypeError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.creation import tensor
from tensorgraphs.frontend.tensor import Tensor, apply_composite, cast
from tensorgraphs.graph.composite import Composite, register


@dataclass(frozen=True, eq=False)
class QuantizedDType:
    """A quantized element type: the integer type holding it and that type's range."""

    name: str
    storage: DType
    qmin: int
    qmax: int

    def __repr__(self) -> str:
        return f"tg.{self.name}"

    is_floating_point = False
    is_quantized = True


qint8 = QuantizedDType("qint8", dtypes.int8, -128, 127)
quint8 = QuantizedDType("quint8", dtypes.uint8, 0, 255)
qint32 = QuantizedDType("qint32", dtypes.int32, -(2**31), 2**31 - 1)
QUANTIZED_DTYPES = {d.name: d for d in (qint8, quint8, qint32)}

_INT32_BELOW_2_31 = 2147483520.0  # the largest float32 below 2**31: every float32 up to it converts to int32


def to_quantized_dtype(op: str, value: object) -> QuantizedDType:
    """Accept a tg quantized dtype, torch's, or its name."""
    if isinstance(value, QuantizedDType):
        return value
    name = str(value).replace("torch.", "").replace("tg.", "")
    if name not in QUANTIZED_DTYPES:
        fail(op, f"dtype must be one of {', '.join(f'tg.{n}' for n in QUANTIZED_DTYPES)}, got {value!r}",
             kind=DTypeError)
    return QUANTIZED_DTYPES[name]


def _saturate(t: Tensor, rounded: Tensor, dtype: QuantizedDType) -> Tensor:
    """`rounded` (t rounded) saturated to the range of `dtype`, NaN as torch gives it, in its storage type."""
    if dtype is qint32:  # float32 cannot hold 2**31 - 1: clamp below it, then pick the ends by comparison
        inside = cast(ew.clamp(rounded, -(2.0**31), _INT32_BELOW_2_31), dtypes.int32)
        return ew.where(ew.ge(t, 2.0**31), qint32.qmax, ew.where(ew.isnan(t), qint32.qmin, inside))
    top = ew.logical_or(ew.gt(t, float(dtype.qmax)), ew.isnan(t))
    return cast(ew.where(top, float(dtype.qmax), ew.clamp(rounded, float(dtype.qmin), None)), dtype.storage)


def _quantize_infer(x: Tensor, scale: Tensor, zero_point: Tensor, *, dtype: str) -> tuple:
    return QUANTIZED_DTYPES[dtype].storage, x.shape


def _quantize_decomposition(x: Tensor, scale: Tensor, zero_point: Tensor, *, dtype: str) -> Tensor:
    """round(x * (1 / scale) + zero_point) saturated, all in float32 (see the module docstring)."""
    scaled = ew.mul(x, ew.reciprocal(cast(scale, dtypes.float32)))
    t = ew.add(scaled, cast(zero_point, dtypes.float32))
    return _saturate(t, ew.round(t), QUANTIZED_DTYPES[dtype])


def _dequantize_infer(q: Tensor, scale: Tensor, zero_point: Tensor) -> tuple:
    return dtypes.float32, q.shape


def _dequantize_decomposition(q: Tensor, scale: Tensor, zero_point: Tensor) -> Tensor:
    shifted = ew.sub(cast(q, scale.dtype), cast(zero_point, scale.dtype))
    return cast(ew.mul(shifted, scale), dtypes.float32)


QUANTIZE = register(Composite("quantize", infer=_quantize_infer, decompose=_quantize_decomposition))
"""quantize(x, scale, zero_point; dtype): the integers of x quantized (scale and zero_point broadcast
to x)."""
DEQUANTIZE = register(Composite("dequantize", infer=_dequantize_infer, decompose=_dequantize_decomposition))
"""dequantize(q, scale, zero_point): (q - zero_point) * scale as float32, computed in scale's dtype."""


class QuantizedTensor:
    """A quantized tensor: `int_repr()` integers with a scale and a zero point per tensor (`axis` None) or per slice
    along `axis` (scales float64, zero points int64, as torch keeps them)."""

    def __init__(self, integers: Tensor, scale: Tensor, zero_point: Tensor, dtype: QuantizedDType,
                 axis: int | None = None) -> None:
        self._integers, self._scale, self._zero_point, self._axis = integers, scale, zero_point, axis
        self.dtype = dtype

    is_quantized = True

    @property
    def shape(self) -> tuple[int, ...]:
        return self._integers.shape

    @property
    def ndim(self) -> int:
        return self._integers.ndim

    def size(self, dim: int | None = None) -> Any:
        return self._integers.size(dim) if dim is not None else self._integers.size()

    def dim(self) -> int:
        return self.ndim

    def int_repr(self) -> Tensor:
        return self._integers

    def qscheme(self) -> str:
        return "per_tensor_affine" if self._axis is None else "per_channel_affine"

    def _per_tensor(self, name: str) -> None:
        if self._axis is not None:
            fail(name, "the tensor is quantized per channel: use q_per_channel_scales/zero_points", kind=ArgumentError)

    def _per_channel(self, name: str) -> None:
        if self._axis is None:
            fail(name, "the tensor is quantized per tensor: use q_scale/q_zero_point", kind=ArgumentError)

    def q_scale(self) -> float:
        self._per_tensor("q_scale")
        return float(self._scale.item())

    def q_zero_point(self) -> int:
        self._per_tensor("q_zero_point")
        return int(self._zero_point.item())

    def q_per_channel_scales(self) -> Tensor:
        self._per_channel("q_per_channel_scales")
        return self._scale

    def q_per_channel_zero_points(self) -> Tensor:
        self._per_channel("q_per_channel_zero_points")
        return self._zero_point

    def q_per_channel_axis(self) -> int:
        self._per_channel("q_per_channel_axis")
        assert self._axis is not None
        return self._axis

    def dequantize(self) -> Tensor:
        """The float32 values (q - zero_point) * scale."""
        scale = cast(self._scale, dtypes.float32) if self._axis is None else self._scale
        along = lambda t: _along(t, self._axis, self.ndim)  # noqa: E731
        return apply_composite(DEQUANTIZE, self._integers, along(scale), along(self._zero_point))

    def __repr__(self) -> str:
        if self._axis is None:
            params = f"scale={self.q_scale()}, zero_point={self.q_zero_point()}"
        else:
            params = f"axis={self._axis}, scales={self._scale.tolist()}, zero_points={self._zero_point.tolist()}"
        return f"QuantizedTensor({self.dequantize()!r}, dtype={self.dtype!r}, {params})"


def _along(t: Tensor, axis: int | None, ndim: int) -> Tensor:
    """A per-channel parameter shaped to broadcast along `axis` of a tensor of `ndim` dims (a per-tensor one, axis
    None, is 0-d already)."""
    if axis is None:
        return t
    return mv.reshape(t, tuple(-1 if d == axis else 1 for d in range(ndim)))


def _float_input(op: str, x: Any) -> Tensor:
    if not isinstance(x, Tensor):
        fail(op, f"expected a Tensor, got {type(x).__name__}", kind=ArgumentError)
    if x.dtype is not dtypes.float32:
        fail(op, f"quantizes only float32 tensors (as torch), got {x.dtype.name}", kind=DTypeError)
    return x.detach()


def _check_zero_points(op: str, zero_points: list[int], dtype: QuantizedDType) -> None:
    bad = [z for z in zero_points if not dtype.qmin <= z <= dtype.qmax]
    if bad:
        fail(op, f"zero_point {bad[0]} is outside the range [{dtype.qmin}, {dtype.qmax}] of {dtype!r}",
             kind=ArgumentError)


def quantize_per_tensor(x: Tensor, scale: Any, zero_point: Any, dtype: Any) -> QuantizedTensor:
    """torch.quantize_per_tensor: one scale and zero point (Python numbers, or 0-d tensors computed lazily)."""
    x, qdtype = _float_input("quantize_per_tensor", x), to_quantized_dtype("quantize_per_tensor", dtype)
    if not isinstance(zero_point, Tensor):
        _check_zero_points("quantize_per_tensor", [int(zero_point)], qdtype)
    scale_t = cast(scale, dtypes.float32) if isinstance(scale, Tensor) else tensor(float(scale), dtype=dtypes.float64)
    zero_t = cast(zero_point, dtypes.int64) if isinstance(zero_point, Tensor) else tensor(int(zero_point))
    integers = apply_composite(QUANTIZE, x, scale_t, zero_t, dtype=qdtype.name)
    return QuantizedTensor(integers, scale_t, zero_t, qdtype)


def quantize_per_channel(x: Tensor, scales: Any, zero_points: Any, axis: int, dtype: Any) -> QuantizedTensor:
    """torch.quantize_per_channel: a scale and a zero point per slice of x along `axis`."""
    op = "quantize_per_channel"
    x, qdtype = _float_input(op, x), to_quantized_dtype(op, dtype)
    if not -x.ndim <= axis < x.ndim:
        fail(op, f"axis {axis} is out of range for a tensor of {x.ndim} dims", kind=ArgumentError)
    axis %= x.ndim
    scales_t = scales if isinstance(scales, Tensor) else tensor(scales, dtype=dtypes.float64)
    scales_t = cast(scales_t, dtypes.float64)
    zeros_t = cast(zero_points if isinstance(zero_points, Tensor) else tensor(zero_points), dtypes.int64)
    if scales_t.shape != (x.shape[axis],) or zeros_t.shape != (x.shape[axis],):
        fail(op, f"scales {scales_t.shape} and zero_points {zeros_t.shape} must have one entry per slice along axis "
             f"{axis} (size {x.shape[axis]})", kind=ArgumentError)
    _check_zero_points(op, [int(z) for z in zeros_t.tolist()], qdtype)
    integers = apply_composite(QUANTIZE, x, _along(cast(scales_t, dtypes.float32), axis, x.ndim),
                               _along(zeros_t, axis, x.ndim), dtype=qdtype.name)
    return QuantizedTensor(integers, scales_t, zeros_t, qdtype, axis)
