"""Conv1d, Conv2d and ConvTranspose2d: torch's weight layouts, arguments and default initialization."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Sequence

from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.nn import functional as F
from tensorgraphs.nn.linear import new_parameter, reset_linear_like
from tensorgraphs.nn.module import Module

Size = int | Sequence[int]
_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _ntuple(value: Size, n: int) -> tuple[int, ...]:
    return (value,) * n if isinstance(value, int) else tuple(value)


class _ConvNd(Module):
    """Shared constructor: `dims` spatial dims; `transposed` swaps the weight's first two axes."""

    dims: ClassVar[int]
    transposed: ClassVar[bool] = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Size, stride: Size = 1,
                 padding: Size | str = 0, dilation: Size = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None,
                 output_padding: Size = 0) -> None:
        super().__init__()
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError("in_channels and out_channels must be divisible by groups (a positive integer)")
        if padding_mode not in _PADDING_MODES or (self.transposed and padding_mode != "zeros"):
            raise ValueError(f"padding_mode must be one of {_PADDING_MODES} ('zeros' for transposed convolutions), "
                             f"but got padding_mode='{padding_mode}'")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride = _ntuple(kernel_size, self.dims), _ntuple(stride, self.dims)
        self.padding = padding if isinstance(padding, str) else _ntuple(padding, self.dims)
        self.dilation, self.output_padding = _ntuple(dilation, self.dims), _ntuple(output_padding, self.dims)
        self.padding_mode = padding_mode
        channels = (in_channels, out_channels // groups) if self.transposed else (out_channels, in_channels // groups)
        self.weight = new_parameter(*channels, *self.kernel_size, dtype=dtype)
        self.bias = new_parameter(out_channels, dtype=dtype) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_linear_like(self.weight, self.bias)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        defaults = {"padding": (0,) * self.dims, "dilation": (1,) * self.dims,
                    "output_padding": (0,) * self.dims, "groups": 1}
        for name, default in defaults.items():
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)!r}"
        text += ", bias=False" if self.bias is None else ""
        return text + (f", padding_mode={self.padding_mode}" if self.padding_mode != "zeros" else "")


class _Conv(_ConvNd):
    function: ClassVar[Callable[..., Tensor]]

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Size, stride: Size = 1,
                 padding: Size | str = 0, dilation: Size = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype)

    def forward(self, input: Tensor) -> Tensor:
        padding = self.padding
        if self.padding_mode != "zeros":  # pad explicitly with the mode, then convolve without padding
            input = mv.pad(input, self._explicit_padding(), mode=self.padding_mode)
            padding = 0
        return type(self).function(input, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)

    def _explicit_padding(self) -> list[int]:
        """F.pad's list (last dim first); 'same' puts the odd extra element after, as torch."""
        pairs = []
        for i in range(self.dims):
            if self.padding == "valid":
                pairs.append((0, 0))
            elif self.padding == "same":
                total = self.dilation[i] * (self.kernel_size[i] - 1)
                pairs.append((total // 2, total - total // 2))
            else:
                pairs.append((self.padding[i], self.padding[i]))
        return [width for pair in reversed(pairs) for width in pair]


class Conv1d(_Conv):
    dims, function = 1, F.conv1d


class Conv2d(_Conv):
    dims, function = 2, F.conv2d


class ConvTranspose2d(_ConvNd):
    dims, transposed = 2, True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Size, stride: Size = 1, padding: Size = 0,
                 output_padding: Size = 0, groups: int = 1, bias: bool = True, dilation: Size = 1,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype, output_padding)

    def forward(self, input: Tensor, output_size: Sequence[int] | None = None) -> Tensor:
        output_padding = self.output_padding
        if output_size is not None:
            wanted = tuple(output_size)[-2:]
            natural = [(size - 1) * s - 2 * p + d * (k - 1) + 1 for size, s, p, d, k in
                       zip(input.shape[-2:], self.stride, self.padding, self.dilation, self.kernel_size)]
            output_padding = tuple(w - n for w, n in zip(wanted, natural))
        return F.conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding, output_padding,
                                  self.groups, self.dilation)
