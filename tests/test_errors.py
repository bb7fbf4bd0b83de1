"""Errors are raised at the call, name the op and operands, and point at the user's file:line."""

from __future__ import annotations

import os
import sys
import sysconfig
from types import TracebackType
from typing import Any

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.errors import fail, user_location

THIS_FILE = os.path.basename(__file__)


class raises_on_next_line:
    """Expect `kind` from the statement right after the `with` line, its message holding every fragment
    and this file's name with that statement's line (no frame of tensorgraphs in its place)."""

    def __init__(self, kind: type[BaseException], *fragments: str) -> None:
        self.kind = kind
        self.fragments = fragments
        self._raises = pytest.raises(kind)

    def __enter__(self) -> None:
        self.line = sys._getframe(1).f_lineno + 1
        self.info = self._raises.__enter__()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> bool:
        suppressed = self._raises.__exit__(kind, error, traceback)
        message = str(self.info.value)
        assert f"{THIS_FILE}:{self.line})" in message, f"location missing or wrong: {message}"
        for fragment in self.fragments:
            assert fragment in message, f"{fragment!r} not in {message!r}"
        return suppressed


def test_broadcast_error_names_both_shapes_and_this_line() -> None:
    with raises_on_next_line(tg.ShapeError, "add", "(3, 4)", "(5, 4)"):
        tg.ones(3, 4) + tg.ones(5, 4)


def test_shape_errors_are_also_runtime_errors_like_torch() -> None:
    with pytest.raises(RuntimeError):
        tg.ones(3, 4) + tg.ones(5, 4)


def test_matmul_names_both_shapes() -> None:
    with raises_on_next_line(tg.ShapeError, "matmul", "(3, 4)", "(5, 4)"):
        tg.ones(3, 4) @ tg.ones(5, 4)
    with raises_on_next_line(tg.ShapeError, "matmul", "()"):
        tg.matmul(tg.ones(()), tg.ones(3))


def test_reshape_names_the_shapes() -> None:
    with raises_on_next_line(tg.ShapeError, "reshape", "(5, 3)", "12"):
        tg.ones(3, 4).reshape(5, 3)
    with raises_on_next_line(tg.ShapeError, "reshape", "-1"):
        tg.ones(3, 4).view(-1, -1)


def test_cat_names_the_mismatching_shapes() -> None:
    with raises_on_next_line(tg.ShapeError, "cat", "(3, 4)", "(3, 5)"):
        tg.cat([tg.ones(3, 4), tg.ones(3, 5)])
    with raises_on_next_line(tg.ShapeError, "cat", "dim 2"):
        tg.cat([tg.ones(3, 4), tg.ones(3, 4)], dim=2)


def test_permute_rejects_non_permutations() -> None:
    with raises_on_next_line(tg.ShapeError, "permute", "(0, 0)"):
        tg.ones(3, 4).permute(0, 0)
    with raises_on_next_line(tg.ShapeError, "permute", "dim 2"):
        tg.ones(3, 4).permute(0, 1, 2)


def test_gather_checks_index_dtype_and_dim() -> None:
    with raises_on_next_line(tg.DTypeError, "gather", "float32"):
        tg.ones(3, 4).gather(1, tg.zeros(3, 4))
    with raises_on_next_line(tg.ShapeError, "gather", "dim 2"):
        tg.ones(3, 4).gather(2, tg.zeros(3, 4, dtype=tg.int64))


def test_gather_with_out_of_range_values_raises_index_error_where_the_value_is_read() -> None:
    bad = tg.ones(3, 4).gather(1, tg.full((3, 4), 7, dtype=tg.int64))  # data-dependent: found when computed
    with raises_on_next_line(IndexError, "gather", "index 7", "size 4"):
        bad.numpy()


@pytest.mark.parametrize("index", [3, -4])
def test_index_out_of_range(index: int) -> None:
    with raises_on_next_line(IndexError, "index", f"index {index}", "size 3"):
        tg.ones(3, 4)[index]


def test_too_many_indices() -> None:
    with raises_on_next_line(tg.ShapeError, "too many indices"):
        tg.ones(3, 4)[0, 0, 0]


@pytest.mark.parametrize("dim", [2, -3])
def test_sum_over_a_bad_dim(dim: int) -> None:
    with raises_on_next_line(tg.ShapeError, "sum", f"dim {dim}", "[-2, 1]"):
        tg.ones(3, 4).sum(dim)


def test_requires_grad_on_integer_tensors() -> None:
    with raises_on_next_line(tg.DTypeError, "requires_grad", "int64"):
        tg.ones(3, dtype=tg.int64).requires_grad_()
    with raises_on_next_line(tg.DTypeError, "floating point"):
        tg.tensor([1, 2], requires_grad=True)


def test_item_on_many_elements() -> None:
    with raises_on_next_line(RuntimeError, "item", "3 elements"):
        tg.ones(3).item()


def test_bool_mask_indexing_is_unsupported_and_names_an_alternative() -> None:
    x = tg.ones(3)
    with raises_on_next_line(tg.UnsupportedError, "boolean mask", "where", "masked_fill"):
        x[x > 0]


def test_item_assignment_into_a_leaf_that_requires_grad_points_here() -> None:
    x = tg.ones(3, requires_grad=True)
    with raises_on_next_line(tg.AutogradError, "leaf Variable that requires grad", "in-place"):
        x[0] = 2.0


def test_backward_errors_point_here() -> None:
    x = tg.ones(3, requires_grad=True)
    with raises_on_next_line(tg.ArgumentError, "backward", "scalar"):
        (x * 2).backward()


# Calls torch refuses with a TypeError (or IndexError), written once for both libraries (`m` is tg or torch).
BAD_ARGUMENTS = {
    "a string in tensor data": lambda m: m.tensor([1, "a"]),
    "a float size": lambda m: m.zeros(2.5),
    "a string size": lambda m: m.zeros("3"),
    "a bool size": lambda m: m.ones(True),
    "a float size in a tuple": lambda m: m.full((2, 2.0), 1.0),
    "a string fill value": lambda m: m.full((2,), "a"),
    "a string arange end": lambda m: m.arange("3"),
    "a float eye size": lambda m: m.eye(2.0),
    "a float dim of sum": lambda m: m.ones(3, 4).sum(dim=1.0),
    "a float dim of softmax": lambda m: m.ones(3, 4).softmax(1.0),
    "a float dim of unsqueeze": lambda m: m.ones(3, 4).unsqueeze(1.0),
    "a float dim of flip": lambda m: m.ones(3, 4).flip(0.0),
    "a float index": lambda m: m.ones(3, 4)[1.5],
    "a float slice bound": lambda m: m.ones(3, 4)[1:2.5],
    "a float reshape size": lambda m: m.ones(3, 4).reshape(2.0, 6),
    "a float view size": lambda m: m.ones(3, 4).view(2.0, 6),
    "a float expand size": lambda m: m.ones(3, 1).expand(3, 2.0),
    "a float chunk count": lambda m: m.ones(3, 4).chunk(2.0),
    "a float split size": lambda m: m.ones(3, 4).split(2.0),
    "a float narrow start": lambda m: m.ones(3, 4).narrow(0, 1.0, 1),
    "a float repeat": lambda m: m.ones(3, 4).repeat(2.0, 1),
    "a float pad width": lambda m: m.nn.functional.pad(m.ones(3, 4), (1.0, 1)),
    "a float conv stride": lambda m: m.nn.functional.conv2d(m.ones(1, 1, 4, 4), m.ones(1, 1, 2, 2), stride=1.5),
    "a float layer_norm shape": lambda m: m.nn.functional.layer_norm(m.ones(3, 4), (4.0,)),
}


@pytest.mark.parametrize("name", BAD_ARGUMENTS)
def test_an_argument_of_the_wrong_type_raises_torchs_error_at_the_users_line(name: str) -> None:
    """The same exception class as torch (TypeError, IndexError for an index), with the op and this file:line."""
    import torch

    call = BAD_ARGUMENTS[name]
    with pytest.raises(Exception) as torch_error:
        call(torch)
    with pytest.raises(tg.TGError) as error:
        call(tg)
    expected = type(torch_error.value)
    assert expected in (TypeError, IndexError), f"torch raised {expected.__name__}: {torch_error.value}"
    assert isinstance(error.value, expected), f"{type(error.value).__name__}, not {expected.__name__}: {error.value}"
    assert f"{THIS_FILE}:{call.__code__.co_firstlineno})" in str(error.value), str(error.value)


# Where torch takes an int (or a Number), anything with `__index__` (or a one-element tensor) stands.
INT_LIKE_ARGUMENTS = {
    "a numpy int size": lambda m: m.zeros(np.int64(2)),
    "a tensor size": lambda m: m.zeros(m.tensor(2)),
    "a numpy int index": lambda m: m.arange(12).reshape(3, 4)[np.int64(1)],
    "a tensor index": lambda m: m.arange(12).reshape(3, 4)[m.tensor(1)],
    "a numpy int slice bound": lambda m: m.arange(12).reshape(3, 4)[:, np.int32(1):],
    "a True index": lambda m: m.arange(12).reshape(3, 4)[True],
    "a False index": lambda m: m.arange(12).reshape(3, 4)[False, 1],
    "a numpy int reshape size": lambda m: m.arange(12).reshape(np.int32(2), 6),
    "a tensor arange end": lambda m: m.arange(m.tensor(3)),
    "a tensor fill value": lambda m: m.full((2,), m.tensor(2.5)),
    "a numpy int dim": lambda m: m.arange(12).reshape(3, 4).sum(np.int64(1)),
}


@pytest.mark.parametrize("name", INT_LIKE_ARGUMENTS)
def test_int_like_arguments_are_accepted_as_torch_does(name: str) -> None:
    import torch

    call = INT_LIKE_ARGUMENTS[name]
    expected, got = call(torch), call(tg)
    assert got.shape == tuple(expected.shape) and got.dtype.name == str(expected.dtype).removeprefix("torch.")
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


@pytest.mark.parametrize("data", [[[1], [1, 2]], None, object()])
def test_data_that_is_no_array_of_numbers_raises_at_the_users_line(data: Any) -> None:
    with raises_on_next_line(tg.ArgumentError, "tensor", "could not convert"):
        tg.tensor(data)


def test_view_as_another_dtype_is_unsupported_rather_than_a_silent_conversion() -> None:
    """torch's view(dtype) reinterprets the bits; converting the values instead would be silently wrong."""
    x = tg.ones(3, 4)
    assert x.view(tg.float32) is x
    with raises_on_next_line(tg.UnsupportedError, "view", "int32", ".to(dtype)"):
        x.view(tg.int32)


def test_every_error_class_is_a_tg_error() -> None:
    for kind in (tg.ShapeError, tg.DTypeError, tg.ArgumentError, tg.ArgumentTypeError, tg.IndexingError,
                 tg.UnsupportedError):
        assert issubclass(kind, tg.TGError)
    assert issubclass(tg.ArgumentTypeError, TypeError) and issubclass(tg.IndexingError, IndexError)
    assert issubclass(tg.DTypeError, TypeError) and issubclass(tg.ArgumentError, ValueError)
    assert issubclass(tg.UnsupportedError, NotImplementedError)


# ---------------------------------------------------------------------------
# user_location: which frames count as the user's
# ---------------------------------------------------------------------------


def _run_as(source: str, filename: str, module: str) -> Any:
    """Run `source` as if it lived in `filename` and belonged to module `module`."""
    namespace = {"__name__": module, "tg": tg, "fail": fail, "user_location": user_location}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def test_frames_of_the_standard_library_are_skipped() -> None:
    fake_stdlib_file = os.path.join(sysconfig.get_path("stdlib"), "fake_callback_module.py")
    namespace = _run_as("def call(fn):\n    return fn()\n", fake_stdlib_file, "fake_callback_module")
    with raises_on_next_line(tg.ShapeError, "add"):
        namespace["call"](lambda: tg.ones(2) + tg.ones(3))


def test_generated_code_of_tensorgraphs_is_skipped() -> None:
    """dataclass-made methods run from `<string>` but belong to a tensorgraphs module."""
    namespace = _run_as("def generated():\n    return user_location()\n", "<string>", "tensorgraphs.fake")
    location = namespace["generated"]()
    assert location.endswith(f"{THIS_FILE}:{sys._getframe().f_lineno - 1}")


def test_users_generated_code_counts_as_the_users() -> None:
    """Code typed into IPython or run with exec is the user's, even though its file name is `<...>`."""
    with pytest.raises(tg.ShapeError, match=r"\(at <ipython-input-1>:2\)"):
        _run_as("x = tg.ones(2)\ny = x + tg.ones(3)\n", "<ipython-input-1>", "__main__")


def test_fail_names_op_message_and_location() -> None:
    with raises_on_next_line(tg.ArgumentError, "myop: something is off"):
        fail("myop", "something is off", kind=tg.ArgumentError)
