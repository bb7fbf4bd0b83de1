"""The implementation registry: dedicated kernels of composites, each checked against its reference.

An `Implementation` declares the composite it implements (by name, from
`tensorgraphs.graph.composite.REGISTRY`), the kernel backend it runs on, the
dtypes it accepts, a shape predicate, and the callable. A `KernelBackend` says
how data gets to and from it; its COPY in and out are themselves measured
kernels (`<backend>.copy_in`, `<backend>.copy_out`), so a kernel on another
device costs what its copies cost. Other backends add kernels with
`register_kernel_backend` and `register_implementation`: table entries, nothing else.

Before a kernel may be chosen it is run on random inputs of the shapes it
accepts and compared with the composite's reference decomposition (evaluated
by the numpy reference interpreter); a kernel that disagrees is rejected with
the composite, shapes and error in the message. `register_implementation` checks at
once (so a user's wrong kernel fails where it is registered); the built-in
tables check lazily, the first time a kernel is about to be chosen.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import warnings
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.dtypes import DType
from tensorgraphs.errors import TGError
from tensorgraphs.graph.composite import REGISTRY, as_value, make_node
from tensorgraphs.graph.node import Shape, buffer
from tensorgraphs.plan.measure import random_array
from tensorgraphs.plan.signature import Signature, TensorSpec, signature_of
from tensorgraphs.runtime.buffer import Buffer


class ImplementationRejected(TGError, ValueError):
    """A kernel disagrees with the reference decomposition of the composite it claims to implement."""


def _nothing() -> None:
    return None


@dataclass(frozen=True, eq=False)
class KernelBackend:
    """Where kernels run. `home` backends share the executor's numpy arrays, so they need no copies."""

    name: str
    is_available: Callable[[], bool]
    to_native: Callable[[np.ndarray], Any]
    to_numpy: Callable[[Any], np.ndarray]
    version: Callable[[], str]
    synchronize: Callable[[], None] = _nothing
    home: bool = False

    @functools.cached_property
    def impl_hash(self) -> str:
        """Identifies the copy kernels' implementation: the backend and its library version."""
        return hashlib.blake2b(f"{self.name}|{self.version()}".encode(), digest_size=6).hexdigest()

    @property
    def copy_in(self) -> str:
        return f"{self.name}.copy_in"

    @property
    def copy_out(self) -> str:
        return f"{self.name}.copy_out"


@dataclass(frozen=True)
class Sample:
    """Verification inputs: one shape per input, and the composite's parameters."""

    shapes: tuple[Shape, ...]
    params: tuple[tuple[str, Any], ...] = ()


def _always(sig: Signature) -> bool:
    return True


@dataclass(frozen=True, eq=False)
class Implementation:
    """`fn(*native_inputs, **params)` computes composite `composite` on backend `backend`."""

    name: str
    composite: str
    backend: str
    fn: Callable[..., Any]
    dtypes: tuple[DType, ...]
    accepts: Callable[[Signature], bool] = _always
    samples: tuple[Sample, ...] = ()

    def applies_to(self, sig: Signature) -> bool:
        return (sig.name == self.composite and all(s.dtype in self.dtypes for s in (*sig.inputs, sig.output))
                and self.accepts(sig))

    @functools.cached_property
    def impl_hash(self) -> str:
        """Changes when the kernel's code or its backend's library version does: old measurements then don't count."""
        try:
            code = inspect.getsource(self.fn)
        except (OSError, TypeError):
            code = getattr(self.fn, "__qualname__", repr(self.fn))
        text = f"{code}|{KERNEL_BACKENDS[self.backend].version()}"
        return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()

    def __repr__(self) -> str:
        return f"Implementation({self.name})"


def call_implementation(kernel: Implementation, arrays: list[np.ndarray], sig: Signature) -> np.ndarray:
    """Run `kernel` on numpy inputs through its backend; the result as the output dtype's numpy storage."""
    backend = KERNEL_BACKENDS[kernel.backend]
    out = kernel.fn(*(backend.to_native(a) for a in arrays), **dict(sig.params))
    result = np.asarray(backend.to_numpy(out), dtype=sig.output.dtype.storage)
    if result.shape != sig.output.shape:
        raise ImplementationRejected(f"kernel {kernel.name!r} returned shape {result.shape} for {sig}")
    return result


# ---------------------------------------------------------------------------
# Kernel backends
# ---------------------------------------------------------------------------


def _library_version(package: str) -> Callable[[], str]:
    return lambda: importlib.metadata.version(package)


@functools.cache
def _torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


@functools.cache
def _torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _numpy_to_torch(array: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(array)).to(_torch_device())


def _torch_to_numpy(tensor: Any) -> np.ndarray:
    return tensor.detach().cpu().numpy()


def _torch_synchronize() -> None:
    import torch

    if _torch_device() == "cuda":
        torch.cuda.synchronize()


KERNEL_BACKENDS: dict[str, KernelBackend] = {}


def register_kernel_backend(backend: KernelBackend) -> KernelBackend:
    KERNEL_BACKENDS[backend.name] = backend
    return backend


register_kernel_backend(KernelBackend("numpy", lambda: True, np.asarray, np.asarray, _library_version("numpy"),
                                      home=True))
register_kernel_backend(KernelBackend("torch", _torch_installed, _numpy_to_torch,
                                      _torch_to_numpy, _library_version("torch"), _torch_synchronize))


# ---------------------------------------------------------------------------
# Verification against the reference decomposition
# ---------------------------------------------------------------------------

# Inputs a kernel is checked on when it does not bring its own samples.
VERIFY_SAMPLES: dict[str, tuple[Sample, ...]] = {
    "matmul": (Sample(((3, 4), (4, 5))), Sample(((2, 3, 8), (2, 8, 5))), Sample(((1, 7), (7, 1)))),
    "softmax": (Sample(((4, 7),), (("dim", 1),)), Sample(((3, 4, 5),), (("dim", 0),))),
    "log_softmax": (Sample(((4, 7),), (("dim", 1),)), Sample(((3, 4, 5),), (("dim", 0),))),
    "gelu": (Sample(((5, 6),), (("approximate", "none"),)), Sample(((5, 6),), (("approximate", "tanh"),))),
    "erf": (Sample(((64,),)), Sample(((3, 5),))),
    "layer_norm": (Sample(((4, 6), (6,), (6,)), (("eps", 1e-5), ("normalized_ndim", 1))),
                   Sample(((2, 3, 4), (3, 4), (3, 4)), (("eps", 1e-3), ("normalized_ndim", 2)))),
}

# (relative, absolute) tolerance per dtype; float64's absolute bound admits approximate decompositions (erf).
TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2), "float32": (1e-4, 1e-5), "float64": (1e-7, 1e-6),
}


def _sample_node(composite_name: str, sample: Sample, dtype: DType, rng: np.random.Generator):
    """A composite node over fresh buffers of random data, built as the frontend builds it."""
    composite = REGISTRY[composite_name]
    sources = []
    for shape in sample.shapes:
        data = random_array(TensorSpec(dtype, tuple(shape)), rng)
        sources.append(buffer(Buffer("numpy", dtype, tuple(shape), data), dtype, tuple(shape)))
    params = dict(sample.params)
    out_dtype, out_shape = composite.infer(*map(as_value, sources), **params)
    return make_node(composite, tuple(sources), params, out_dtype, tuple(out_shape))


def _mismatch(kernel: Implementation, sig: Signature, expected: np.ndarray, got: np.ndarray) -> str | None:
    """None when `got` matches `expected` within the dtype's tolerance, else what is wrong."""
    rtol, atol = TOLERANCES.get(sig.output.dtype.name, (0.0, 0.0))
    expected64, got64 = expected.astype(np.float64), got.astype(np.float64)
    close = np.isclose(got64, expected64, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return None
    with np.errstate(invalid="ignore"):
        error = float(np.nanmax(np.where(close, 0.0, np.abs(got64 - expected64))))
    return (f"kernel {kernel.name!r} does not compute composite {kernel.composite!r} on {sig}: max error {error:.3g} "
            f"against the reference decomposition (tolerance rtol={rtol:g}, atol={atol:g})")


def verify_implementation(kernel: Implementation) -> None:
    """Raise `ImplementationRejected` unless the kernel matches the reference on every sample it accepts."""
    if kernel.composite not in REGISTRY:
        raise ImplementationRejected(f"kernel {kernel.name!r}: no composite named {kernel.composite!r} is registered "
                             f"(known: {', '.join(sorted(REGISTRY))})")
    samples = kernel.samples or VERIFY_SAMPLES.get(kernel.composite, ())
    rng = np.random.default_rng(zlib.crc32(kernel.name.encode()))
    checked = 0
    for sample in samples:
        for dtype in kernel.dtypes:
            node = _sample_node(kernel.composite, sample, dtype, rng)
            sig = signature_of(node)
            if not kernel.applies_to(sig):
                continue
            expected = REFERENCE.evaluate([node])[0]
            try:
                with np.errstate(all="ignore"):
                    got = call_implementation(kernel, [s.arg.data for s in node.src], sig)
            except Exception as error:  # noqa: BLE001 - any failure of a user's kernel is a rejection
                message = f"kernel {kernel.name!r} failed on {sig}: {type(error).__name__}: {error}"
                raise ImplementationRejected(message) from error
            problem = _mismatch(kernel, sig, expected, got)
            if problem:
                raise ImplementationRejected(problem)
            checked += 1
    if not checked:
        raise ImplementationRejected(f"kernel {kernel.name!r}: none of the verification samples of "
                                     f"{kernel.composite!r} fit its dtypes and shape constraints; "
                                     "pass samples=(Sample(...),)")


class ImplementationRegistry:
    """Kernels by composite name. Verified kernels may be chosen; rejected ones are kept out, with the reason."""

    def __init__(self) -> None:
        self._by_composite: dict[str, list[Implementation]] = {}
        self._by_name: dict[str, Implementation] = {}
        self._verified: set[str] = set()
        self.rejected: dict[str, str] = {}

    def register(self, kernel: Implementation, verify: bool = True) -> Implementation:
        if kernel.backend not in KERNEL_BACKENDS:
            raise ImplementationRejected(f"kernel {kernel.name!r}: unknown kernel backend {kernel.backend!r} "
                                 f"(known: {', '.join(sorted(KERNEL_BACKENDS))})")
        if kernel.name in self._by_name:
            raise ValueError(f"a kernel named {kernel.name!r} is already registered")
        if verify:
            verify_implementation(kernel)
            self._verified.add(kernel.name)
        self._by_name[kernel.name] = kernel
        self._by_composite.setdefault(kernel.composite, []).append(kernel)
        return kernel

    def unregister(self, name: str) -> None:
        kernel = self._by_name.pop(name)
        self._by_composite[kernel.composite].remove(kernel)
        self._verified.discard(name)
        self.rejected.pop(name, None)

    def get(self, name: str) -> Implementation:
        return self._by_name[name]

    def candidates(self, sig: Signature, backends: frozenset[str] | None = None) -> list[Implementation]:
        """Kernels that could compute `sig` on an available backend (verification still pending for some)."""
        return [k for k in self._by_composite.get(sig.name, ())
                if k.name not in self.rejected and (backends is None or k.backend in backends)
                and k.applies_to(sig) and KERNEL_BACKENDS[k.backend].is_available()]

    def ensure_verified(self, kernel: Implementation) -> bool:
        """Verify a kernel registered lazily; a failure keeps it out from now on, with a warning."""
        if kernel.name in self._verified:
            return True
        if kernel.name in self.rejected:
            return False
        try:
            verify_implementation(kernel)
        except ImplementationRejected as error:
            self.rejected[kernel.name] = str(error)
            warnings.warn(str(error), RuntimeWarning, stacklevel=3)
            return False
        self._verified.add(kernel.name)
        return True

    def __iter__(self):
        return iter(list(self._by_name.values()))


IMPLEMENTATIONS = ImplementationRegistry()


def register_implementation(kernel: Implementation, verify: bool = True) -> Implementation:
    """Add a kernel to the global registry, checked against its composite's reference now (unless verify=False)."""
    return IMPLEMENTATIONS.register(kernel, verify)
