"""The lowerings, by family; importing this package fills `tensorgraphs.onnx.lowering.LOWERINGS`."""

from tensorgraphs.onnx.ops import control, elementwise, indexing, nn, quantize, reduce, resize, rnn, shape  # noqa: F401
