"""Test support shipped with the package: the op-conformance table checked against PyTorch."""
