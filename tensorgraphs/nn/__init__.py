"""Neural-network building blocks with PyTorch's names."""

from tensorgraphs.nn import functional  # noqa: F401
