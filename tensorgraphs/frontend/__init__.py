"""The lazy, PyTorch-named Tensor API."""
