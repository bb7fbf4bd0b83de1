"""`tg.save` / `tg.load`: tensors in safetensors files, readable by `safetensors.torch.load_file` and back.

A flat `{name: Tensor}` (a module's state_dict) is stored as-is. Nested containers (an
optimizer's state_dict, a checkpoint with step counters) are flattened: tensors become
entries named by their dotted path, and the tree with its non-tensor leaves is kept as JSON
in the header's metadata under `STRUCTURE_KEY`, so `load` rebuilds the same structure.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.frontend.tensor import Tensor

RESERVED_PREFIX = "tensorgraphs."
STRUCTURE_KEY = RESERVED_PREFIX + "structure"
_TENSOR_LEAF = "__tensor__"
# tg dtype -> (safetensors header name, numpy type of the stored bytes)
_FORMATS = {
    dtypes.float64: ("F64", np.float64), dtypes.float32: ("F32", np.float32), dtypes.float16: ("F16", np.float16),
    dtypes.bfloat16: ("BF16", np.uint16), dtypes.int64: ("I64", np.int64), dtypes.int32: ("I32", np.int32),
    dtypes.int16: ("I16", np.int16), dtypes.int8: ("I8", np.int8), dtypes.uint8: ("U8", np.uint8),
    dtypes.bool_: ("BOOL", np.bool_),
}
_BY_HEADER = {header: dtype for dtype, (header, _) in _FORMATS.items()}


def _to_bytes_array(t: Tensor) -> np.ndarray:
    """The tensor's value in its file encoding; bfloat16 keeps the top half of each float32."""
    value = np.asarray(t.detach()._value())
    if t.dtype is dtypes.bfloat16:
        return (value.astype(np.float32, order="C").view(np.uint32) >> 16).astype(np.uint16)
    return value.astype(_FORMATS[t.dtype][1], order="C")  # a C-ordered copy; 0-d stays 0-d


def _from_bytes(header_dtype: str, shape: list[int], data: bytes) -> Tensor:
    dtype = _BY_HEADER.get(header_dtype)
    if dtype is None:
        raise ValueError(f"safetensors dtype {header_dtype} is not supported by tensorgraphs")
    array = np.frombuffer(bytes(data), dtype=_FORMATS[dtype][1]).reshape(shape)
    if dtype is dtypes.bfloat16:
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return Tensor.from_numpy(array.copy(), dtype)


def _flatten(obj: Any, prefix: str, tensors: dict[str, Tensor]) -> Any:
    """The JSON tree of `obj`, moving each tensor into `tensors` under its dotted path (made unique with a `#n`
    suffix where two paths spell the same: `{'a.b': x, 'a': {'b': y}}`, `{1: x, '1': y}`)."""
    if isinstance(obj, Tensor):
        name, copy = prefix, 1
        while name in tensors:
            name, copy = f"{prefix}#{copy}", copy + 1
        tensors[name] = obj
        return {_TENSOR_LEAF: name}
    if isinstance(obj, dict):
        return {"__dict__": [[_key(k), _flatten(v, f"{prefix}.{k}" if prefix else str(k), tensors)]
                             for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return [_flatten(v, f"{prefix}.{i}" if prefix else str(i), tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"tg.save stores tensors, containers and plain numbers; got {type(obj).__name__} at '{prefix}'")


def _key(key: Any) -> Any:
    if not isinstance(key, (str, int)):
        raise TypeError(f"tg.save needs str or int dict keys, got {type(key).__name__}")
    return key


def _unflatten(tree: Any, tensors: dict[str, Tensor]) -> Any:
    if isinstance(tree, dict) and _TENSOR_LEAF in tree:
        return tensors[tree[_TENSOR_LEAF]]
    if isinstance(tree, dict):
        return {k: _unflatten(v, tensors) for k, v in tree["__dict__"]}
    if isinstance(tree, list):
        return [_unflatten(v, tensors) for v in tree]
    return tree


def _is_flat(obj: Any) -> bool:
    return isinstance(obj, dict) and all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items())


def save(obj: dict[str, Any], f: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write `obj` (a state_dict, or nested containers of tensors and numbers) as a safetensors file."""
    from safetensors import TensorSpec, serialize_file

    reserved = [k for k in metadata or {} if k.startswith(RESERVED_PREFIX)]
    if reserved:
        fail("save", f"metadata keys starting with {RESERVED_PREFIX!r} are tensorgraphs' own; got {reserved}",
             kind=ArgumentError)
    tensors: dict[str, Tensor] = {}
    header = dict(metadata or {})
    if _is_flat(obj):
        tensors = dict(obj)
    else:
        header[STRUCTURE_KEY] = json.dumps(_flatten(obj, "", tensors))
    arrays = {name: _to_bytes_array(t) for name, t in tensors.items()}
    specs = {name: TensorSpec(dtype=tensors[name].dtype.name, shape=list(a.shape), data_ptr=a.ctypes.data,
                              data_len=a.nbytes) for name, a in arrays.items()}
    path = os.fspath(f)
    # written beside the target and moved over it at once: a crash never leaves a half-written checkpoint
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tg-save-")
    os.close(handle)
    try:
        serialize_file(specs, temporary, metadata=header or None)
        os.chmod(temporary, _new_file_mode())  # mkstemp's 0600 would make checkpoints private to their writer
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _new_file_mode() -> int:
    """The mode `open()` would give a new file: 0666 less the process's umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def load(f: str | os.PathLike, map_location: Any = None) -> Any:
    """Read a safetensors file (written by tg, torch or anyone) back into tg tensors."""
    from safetensors import deserialize, safe_open

    path = os.fspath(f)
    with open(path, "rb") as handle:
        entries = deserialize(handle.read())
    tensors = {name: _from_bytes(info["dtype"], info["shape"], info["data"]) for name, info in entries}
    with safe_open(path, framework="numpy") as handle:
        structure = (handle.metadata() or {}).get(STRUCTURE_KEY)
    if structure is None:
        return tensors
    return _unflatten(json.loads(structure), tensors)

