"""AttributeErrors for the torch names tensorgraphs lacks.

Each torch-named namespace (`tg`, `tg.nn`, `tg.nn.functional`, `tg.optim`, `tg.data`, `tg.cuda`, and
Tensor attributes) gets a `__getattr__` from here: a missing name raises an AttributeError that says it is
not implemented yet and gives the tensorgraphs spelling where one exists (`TG_SPELLING`, also read by
`tensorgraphs.testing.coverage`, which writes docs/torch-coverage.md).
"""

from __future__ import annotations

from typing import Any, Callable, NoReturn

TORCH_NAMESPACE = {
    "tensorgraphs": "torch",
    "tensorgraphs.nn": "torch.nn",
    "tensorgraphs.nn.functional": "torch.nn.functional",
    "tensorgraphs.optim": "torch.optim",
    "tensorgraphs.data": "torch.utils.data",
    "tensorgraphs.cuda": "torch.cuda",
    "tensorgraphs.amp": "torch.amp",
    "tensorgraphs.cpu": "torch.cpu",
    "Tensor": "torch.Tensor",
}
"""tensorgraphs namespace -> the torch namespace whose names it mirrors."""

TG_SPELLING = {
    "torch.autograd": "tg.grad(outputs, inputs) or loss.backward()",
    "torch.inference_mode": "tg.no_grad()",
    "torch.jit": "tg.compile(fn_or_module)",
    "torch.backends": "tg.set_float32_matmul_precision(...)",
    "torch.as_tensor": "tg.tensor(data)",
    "torch.Tensor.new_zeros": "tg.zeros(size, dtype=x.dtype)",
    "torch.Tensor.new_ones": "tg.ones(size, dtype=x.dtype)",
    "torch.Tensor.new_full": "tg.full(size, value, dtype=x.dtype)",
    "torch.Tensor.new_empty": "tg.empty(size, dtype=x.dtype)",
    "torch.Tensor.new_tensor": "tg.tensor(data, dtype=x.dtype)",
    "torch.Tensor.cuda": "x (tensorgraphs has no cuda device; tg.cuda.is_available() is False)",
    "torch.Tensor.is_cuda": "False (tensorgraphs has no cuda device)",
    "torch.nn.DataParallel": "the module itself (tensorgraphs runs on one device)",
}
"""Where tensorgraphs has a torch name under another spelling: the torch name -> what to write instead."""


def _namespace_name(namespace: str) -> str:
    return "Tensor" if namespace == "Tensor" else namespace.replace("tensorgraphs", "tg", 1)


def not_implemented(namespace: str, name: str, has: Callable[[str], bool]) -> AttributeError:
    """The error for `name` missing from `namespace`; `has(other)` tells whether the namespace has `other`."""
    torch_name = f"{TORCH_NAMESPACE[namespace]}.{name}"
    message = f"{_namespace_name(namespace)}.{name} is not implemented in tensorgraphs yet"
    if torch_name in TG_SPELLING:
        return AttributeError(f"{message}; write {TG_SPELLING[torch_name]}")
    if name.endswith("_") and has(name[:-1]):
        return AttributeError(f"{message}; the out-of-place {name[:-1]} exists: x = x.{name[:-1]}(...)")
    return AttributeError(f"{message} (docs/torch-coverage.md lists torch's names and their status here)")


def module_getattr(module_name: str, namespace: dict[str, Any]) -> Callable[[str], NoReturn]:
    """A module-level `__getattr__` for `module_name`, whose globals are `namespace`."""

    def __getattr__(name: str) -> NoReturn:
        if name.startswith("__"):  # protocol probes (__path__, __wrapped__, ...) get Python's own error
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        raise not_implemented(module_name, name, namespace.__contains__)

    return __getattr__


def tensor_getattr(tensor: Any, name: str) -> NoReturn:
    """`Tensor.__getattr__`: only called when normal lookup failed."""
    if name.startswith("__"):
        raise AttributeError(f"'Tensor' object has no attribute {name!r}")
    raise not_implemented("Tensor", name, lambda other: hasattr(type(tensor), other))
