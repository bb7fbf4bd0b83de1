"""The lowerings, by family; importing this package fills `tensorgraphs.onnx.lowering.LOWERINGS`."""

from tensorgraphs.onnx.ops import (  # noqa: F401
    control,
    detection,
    elementwise,
    grid_sample,
    indexing,
    nn,
    quantize,
    reduce,
    resize,
    rnn,
    shape,
    signal,
)
