"""Kernels writing straight into their slices of a concatenation (`schedule.fusion.write_slices_in_place`): values
against torch where a piece is a conv, a product or a generated kernel, and where it must keep its copy (read
elsewhere, concatenated twice, a program output); the structure (no cat kernel left, the pieces' buffers gone, a
smaller arena), so the copies cannot silently come back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.codegen import index as ix
from tensorgraphs.codegen.loop_ir import BufferView, ConvCall, GemmCall, Load, Store, walk
from tensorgraphs.graph.composite import params_of
from tensorgraphs.graph.node import toposort
from tensorgraphs.kernels import blas
from tensorgraphs.memory.packing import aligned
from tensorgraphs.plan.choices import forced
from tensorgraphs.plan.signature import signature_of
from tensorgraphs.schedule import convolution as conv
from tensorgraphs.schedule import schedule_kernels
from tensorgraphs.schedule.extern import gemm_enabled

pytestmark = pytest.mark.device("cpu", compile=True)  # small graphs too: generated C, not the interpreter

needs_gemm = pytest.mark.skipif(not gemm_enabled(), reason="the conv and GEMM kernels need a C compiler and AVX2")


def _floats(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _fire(x: tg.Tensor | torch.Tensor, squeeze, left, right, conv, relu, cat):
    """SqueezeNet's fire module: a 1x1 squeeze, then a 1x1 and a 3x3 expand concatenated along the channels."""
    s = relu(conv(x, squeeze))
    return cat([relu(conv(s, left)), relu(conv(s, right, padding=1))], 1)


def _fire_arrays(batch: int) -> list[np.ndarray]:
    return [_floats((batch, 8, 9, 9), 0), _floats((4, 8, 1, 1), 1), _floats((6, 4, 1, 1), 2), _floats((5, 4, 3, 3), 3)]


def _fire_expected(arrays: list[np.ndarray], after=lambda t: t) -> np.ndarray:
    x, *weights = map(torch.tensor, arrays)
    return after(_fire(x, *weights, torch.conv2d, torch.relu, torch.cat)).numpy()


def _fire_tg(arrays: list[np.ndarray], after=lambda t: t) -> tg.Tensor:
    x, *weights = map(tg.tensor, arrays)
    return after(_fire(x, *weights, F.conv2d, F.relu, tg.cat))


def _kernel_kinds(roots: list[tg.Tensor]) -> list[str]:
    program, _ = CPU.program([r.node for r in roots])
    return [k.name.split("_", 1)[1] for k in program.kernels]


@needs_gemm
def test_a_fire_module_s_expand_convs_write_their_slices_and_no_cat_kernel_is_left() -> None:
    arrays = _fire_arrays(1)
    pooled = lambda t: t.amax((2, 3)) * 2  # noqa: E731
    out = _fire_tg(arrays, pooled)
    program, _ = CPU.program([out.node])
    assert "cat" not in _kernel_kinds([out])
    calls = [s for k in program.kernels for s in walk(k.body) if isinstance(s, ConvCall)]
    squeeze, left, right = calls
    assert left.out == right.out != squeeze.out and (left.out_offset, right.out_offset) == (0, 6 * 81), calls
    assert program.memory.arena_bytes <= 4 * (4 + 11) * 81 + 128  # the squeeze and the concatenation, no piece
    np.testing.assert_allclose(out.numpy(), _fire_expected(arrays, pooled), rtol=1e-4, atol=1e-4)


@needs_gemm
@pytest.mark.parametrize("batch", [2, 8])
def test_at_a_larger_batch_the_expand_convs_write_their_slices_an_image_of_the_concatenation_apart(batch: int) -> None:
    """Each conv's slice of the channels is one block per image: the conv kernel writes its images there, the
    concatenation's image (11 channels) apart, so no cat kernel is left, nor any piece's buffer."""
    arrays = _fire_arrays(batch)
    out = _fire_tg(arrays, lambda t: t * 3)
    program, _ = CPU.program([out.node])
    assert _kernel_kinds([out]) == ["conv2d_epilogue"] * 3 + ["mul"]
    squeeze, left, right = [s for k in program.kernels for s in walk(k.body) if isinstance(s, ConvCall)]
    assert left.out == right.out != squeeze.out and (left.out_offset, right.out_offset) == (0, 6 * 81)
    assert (squeeze.out_stride, left.out_stride, right.out_stride) == (4 * 81, 11 * 81, 11 * 81)
    assert program.memory.arena_bytes <= aligned(4 * batch * 4 * 81) + aligned(4 * batch * 11 * 81)
    np.testing.assert_allclose(out.numpy(), _fire_expected(arrays, lambda t: t * 3), rtol=1e-4, atol=1e-4)


def test_a_generated_piece_writes_through_a_strided_view() -> None:
    """At batch 2 a generated piece stores through the strided view (its index maps each batch's block)."""
    a, b = _floats((2, 3, 4, 5), 4), _floats((2, 2, 4, 5), 5)
    joined = tg.cat([tg.tensor(a).cumsum(3), tg.tensor(b) * 2], 1).sum((2, 3))
    kernels = schedule_kernels([joined.node]).kernels
    assert [k.name.split("_", 1)[1] for k in kernels] == ["cumsum", "cat", "reshape"]
    scan, copy = ({s.buffer for s in walk(k.body) if isinstance(s, Store)} for k in kernels[:2])
    assert len(scan) == 1 and scan == copy  # the cat stores only the product; the scan its own slice
    np.testing.assert_allclose(joined.numpy(), np.concatenate([np.cumsum(a, 3), b * 2], 1).sum((2, 3)), rtol=1e-5)


@needs_gemm
def test_products_write_their_rows_of_a_concatenation_and_the_output_is_one() -> None:
    """The concatenation is the program's output: the GEMM calls write into it at their offsets."""
    x, w1, w2 = _floats((5, 7), 6), _floats((7, 16), 7), _floats((7, 16), 8)
    out = tg.cat([tg.tensor(x) @ tg.tensor(w1), (tg.tensor(x) @ tg.tensor(w2)).relu()], 0)
    program, _ = CPU.program([out.node])
    calls = [s for k in program.kernels for s in walk(k.body) if isinstance(s, GemmCall)]
    assert [(c.c, c.c_offset) for c in calls] == [(calls[0].c, 0), (calls[0].c, 5 * 16)]
    assert "cat" not in _kernel_kinds([out]) and program.memory.arena_bytes == 0
    np.testing.assert_allclose(out.numpy(), np.concatenate([x @ w1, np.maximum(x @ w2, 0)], 0), rtol=1e-5, atol=1e-5)


@needs_gemm
def test_a_piece_concatenated_twice_keeps_its_copies_and_one_read_elsewhere_is_read_in_its_slice() -> None:
    """`expand` is concatenated twice into `twice` (copied), and also into `also` (a program output), whose slice
    it then lives in: the conv writes it there, `twice`'s copy and the sum read it from there."""
    arrays = _fire_arrays(1)
    x, squeeze, left, _ = map(tg.tensor, arrays)
    extra = _floats((3, 8, 1, 1), 9)
    expand = F.relu(F.conv2d(F.relu(F.conv2d(x, squeeze)), left))
    twice = tg.cat([expand, expand], 1)
    also = tg.cat([expand, F.relu(F.conv2d(x, tg.tensor(extra)))], 1)
    other = expand.sum()
    program, _ = CPU.program([twice.node, also.node, other.node])
    kinds = [k.name.split("_", 1)[1] for k in program.kernels]
    assert kinds.count("cat") == 1 and program.memory.arena_bytes == aligned(4 * 4 * 81), kinds  # the squeeze's
    tx, tsqueeze, tleft, _ = map(torch.tensor, arrays)
    texpand = torch.relu(torch.conv2d(torch.relu(torch.conv2d(tx, tsqueeze)), tleft))
    results = CPU.evaluate([twice.node, also.node, other.node])
    expected = (
        torch.cat([texpand, texpand], 1),
        torch.cat([texpand, torch.relu(torch.conv2d(tx, torch.tensor(extra)))], 1),
        texpand.sum(),
    )
    for got, want in zip(results, expected):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


def _dense_block(x, weights, conv, relu, cat):
    """DenseNet's block: each layer reads the concatenation so far (through a batch norm's scale and shift here)
    and adds its features to it."""
    features = x
    for w in weights:
        features = cat([features, relu(conv(relu(features * 0.5 + 0.25), w, padding=1))], 1)
    return features


@needs_gemm
@pytest.mark.parametrize("batch", [1, 2, 8])
def test_a_dense_block_s_concatenations_live_in_the_last_one(batch: int) -> None:
    """Each concatenation is read by the next layer and by the next concatenation: it lives at the start of the
    last one, so only the block's input is copied, once. Above batch 1 its slice is strided: the batch norm's
    generated kernel reads it so, each conv writes its images there, a view of a view (the last concatenation's
    image apart)."""
    x = _floats((batch, 4, 6, 6), 20)
    weights = [_floats((3, 4 + 3 * k, 3, 3), 21 + k) for k in range(4)]
    out = _dense_block(tg.tensor(x), [tg.tensor(w) for w in weights], F.conv2d, F.relu, tg.cat)
    program, _ = CPU.program([(out * 2).node])
    kinds = [k.name.split("_", 1)[1] for k in program.kernels]
    assert kinds.count("cat") == 1, kinds
    stores = [s for k in program.kernels for s in walk(k.body) if isinstance(s, Store) and "cat" in k.name]
    assert len(stores) == 1, stores
    calls = [s for k in program.kernels for s in walk(k.body) if isinstance(s, ConvCall)]
    assert [(c.out, c.out_offset, c.out_stride) for c in calls] == [
        (stores[0].buffer, (4 + 3 * k) * 36, 16 * 36 if batch > 1 else 3 * 36) for k in range(4)
    ], calls
    expected = _dense_block(torch.tensor(x), [torch.tensor(w) for w in weights], torch.conv2d, torch.relu, torch.cat)
    np.testing.assert_allclose((out * 2).numpy(), (expected * 2).numpy(), rtol=1e-4, atol=1e-4)


@needs_gemm
@pytest.mark.parametrize("batch", [1, 2])
def test_gradients_through_a_concatenation_of_convs_match_torch(batch: int) -> None:
    """The expand convs' own results are the pieces (the relu comes after the concatenation, so the backward reads
    no piece alone): in the training program too each conv writes its slice, at batch 2 its images apart."""
    arrays = _fire_arrays(batch)
    after_cat = lambda t: t  # noqa: E731
    x, *weights = [tg.tensor(a, requires_grad=True) for a in arrays]
    loss = (_fire(x, *weights, F.conv2d, after_cat, tg.cat).relu() ** 2).mean()
    roots = [loss.node, *(g.node for g in tg.grad(loss, [x, *weights]))]
    program, _ = CPU.program(roots)
    _, left, right = [s for k in program.kernels for s in walk(k.body) if isinstance(s, ConvCall)]
    assert left.out == right.out and (left.out_offset, right.out_offset) == (0, 6 * 81), (left, right)
    assert batch == 1 or left.out_stride == right.out_stride == 11 * 81
    value, *grads = CPU.evaluate(roots)
    tx, *tweights = [torch.tensor(a, requires_grad=True) for a in arrays]
    tloss = (_fire(tx, *tweights, torch.conv2d, after_cat, torch.cat).relu() ** 2).mean()
    tgrads = torch.autograd.grad(tloss, [tx, *tweights])
    np.testing.assert_allclose(value, tloss.detach().numpy(), rtol=1e-4)
    for got, want in zip(grads, tgrads):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-3, atol=1e-4)


def test_every_size_of_a_dynamic_batch_concatenates_as_its_static_program() -> None:
    forward = tg.compile(
        lambda a, b: tg.cat([a.exp(), (b * 2).relu()], 1) + 1, dynamic={"a": {0: "batch"}, "b": {0: "batch"}}
    )
    for batch in (1, 3, 8):
        a, b = _floats((batch, 3, 5), batch), _floats((batch, 4, 5), batch + 1)
        np.testing.assert_allclose(
            forward(tg.tensor(a), tg.tensor(b)).numpy(),
            np.concatenate([np.exp(a), np.maximum(b * 2, 0)], 1) + 1,
            rtol=1e-5,
        )


def test_a_view_s_index_maps_each_outer_block() -> None:
    """A (2, 3, 4) piece at channel 5 of a (2, 9, 4) concatenation: two runs, the batch's (stride 36) and the
    piece's 12 contiguous elements; with a batch of 1 one contiguous block."""
    view = BufferView("out", 72, 20, (2, 3, 4), (36, 4, 1))
    assert view.runs() == [(2, 36), (12, 1)] and not view.contiguous
    i = ix.Var("i", 24)
    assert [ix.substitute(view.at(i), i, ix.Const(n)) for n in (0, 11, 12, 23)] == [
        ix.Const(20),
        ix.Const(31),
        ix.Const(56),
        ix.Const(67),
    ]
    single = BufferView("out", 36, 20, (1, 3, 4), (36, 4, 1))
    assert single.contiguous and repr(single.at(i)) == "(i + 20)"
    # a conv's two images of 12 (offset, stride) in base; a block across the two runs, or a half image, are not so
    assert view.blocks(0, 12, 2, 12) == (20, 36) and view.blocks(6, 12, 2, 6) == (26, 36)
    assert view.blocks(0, 0, 1, 24) is None and view.blocks(6, 12, 1, 12) is None
    assert single.blocks(0, 12, 1, 12) == (20, 12)


def test_poisoned_arena_shows_every_slice_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the arena filled with NaN before each run, an element of the concatenation no kernel wrote would show."""
    monkeypatch.setenv("TG_POISON", "1")
    a, b, c = _floats((1, 2, 33), 10), _floats((1, 3, 33), 11), _floats((1, 1, 33), 12)
    joined = tg.cat([tg.tensor(a).cumsum(2), tg.tensor(b), tg.tensor(c).cumprod(2)], 1)
    out = (joined * joined).sum(1)
    expected = np.concatenate([np.cumsum(a, 2), b, np.cumprod(c, 2)], 1)
    np.testing.assert_allclose(out.numpy(), (expected * expected).sum(1), rtol=1e-5)
    kinds = [k.name.split("_", 1)[1] for k in schedule_kernels([out.node]).kernels]
    assert kinds == ["cumsum", "cumprod", "cat", "reshape"], kinds  # the cat copies the input only


def test_a_piece_of_two_concatenations_lives_in_the_first_and_the_second_copies_it_from_there() -> None:
    """`p` is placed in `first`; `second` then places `r` and copies `p` from its slice of `first`."""
    a, b, c = _floats((2, 3, 5), 30), _floats((2, 2, 5), 31), _floats((2, 4, 5), 32)
    p, q, r = tg.tensor(a).cumsum(2), tg.tensor(b).cumsum(2), tg.tensor(c).cumprod(2)
    first, second = tg.cat([p, q], 1), tg.cat([p, r], 1)
    schedule = schedule_kernels([first.node, second.node])
    assert [k.name.split("_", 1)[1] for k in schedule.kernels] == ["cumsum", "cumsum", "cumprod", "cat"]
    assert [b.role for b in schedule.buffers] == ["input"] * 3 + ["output"] * 2
    got = CPU.evaluate([first.node, second.node])
    np.testing.assert_allclose(got[0], np.concatenate([np.cumsum(a, 2), np.cumsum(b, 2)], 1), rtol=1e-5)
    np.testing.assert_allclose(got[1], np.concatenate([np.cumsum(a, 2), np.cumprod(c, 2)], 1), rtol=1e-5)


def test_a_padded_window_computed_in_a_concatenation_reads_its_interior_without_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ShuffleNet's stride-2 unit concatenates an average pool (padded 3x3/2 windows, computed in the cat's nest; here
    as one window, not separable) with a conv: the nest is cut where the padding checks stop, as a kernel of its own
    would be (`lower_node`)."""
    from onnx import TensorProto, helper

    from tensorgraphs.nn.functional import pooling

    monkeypatch.setattr(pooling, "SEPARABLE_MIN_TAPS", 10)

    x, y = _floats((1, 4, 10, 10), 40), _floats((1, 3, 5, 5), 41)
    nodes = [
        helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["p", "y"], ["out"], axis=1),
    ]
    value = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    graph = helper.make_graph(nodes, "unit", [value("x", x.shape), value("y", y.shape)], [value("out", (1, 7, 5, 5))])
    module = tg.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    out = module(tg.tensor(x), tg.tensor(y))
    (kernel,) = [k for k in schedule_kernels([out.node]).kernels if k.name.endswith("_cat")]
    bodies = [s for s in walk(kernel.body) if isinstance(s, Store)]
    unchecked = [s for s in walk(kernel.body) if isinstance(s, Load) and "clamp" not in repr(s.index)]
    assert len(bodies) == 5 and unchecked, kernel  # the pool's first row and column checked, then y's copy
    pooled = torch.nn.functional.avg_pool2d(torch.tensor(x), 3, 2, padding=1, count_include_pad=False)
    np.testing.assert_allclose(out.numpy(), torch.cat([pooled, torch.tensor(y)], 1).numpy(), rtol=1e-5, atol=1e-6)


@needs_gemm
def test_convs_and_products_read_their_operands_in_a_slice() -> None:
    """Each concatenation puts new features first and is read by the next conv straight from its slice of the
    last one (the conv's input at an offset), and a product reads rows of a concatenation it is concatenated with."""
    x = _floats((1, 4, 6, 6), 50)
    weights = [_floats((2, 4 + 2 * k, 3, 3), 51 + k) for k in range(3)]

    def block(x, weights, conv, relu, cat):
        for w in weights:
            x = cat([relu(conv(x, w, padding=1)), x], 1)
        return x

    out = block(tg.tensor(x), [tg.tensor(w) for w in weights], F.conv2d, F.relu, tg.cat) * 2
    program, _ = CPU.program([out.node])
    calls = [s for k in program.kernels for s in walk(k.body) if isinstance(s, ConvCall)]
    assert [c.x_offset for c in calls] == [0, 4 * 36, 2 * 36] and len({c.x for c in calls[1:]}) == 1, calls
    expected = block(torch.tensor(x), [torch.tensor(w) for w in weights], torch.conv2d, torch.relu, torch.cat) * 2
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)
    a, w1, w2 = _floats((4, 8), 60), _floats((8, 8), 61), _floats((8, 8), 62)
    rows = tg.cat([tg.tensor(a) @ tg.tensor(w1), tg.tensor(a).cumsum(1)], 0)
    both = tg.cat([rows, rows @ tg.tensor(w2)], 0)
    program, _ = CPU.program([both.node])
    gemms = [s for k in program.kernels for s in walk(k.body) if isinstance(s, GemmCall)]
    assert [(g.a == g.c, g.a_offset, g.c_offset) for g in gemms] == [(False, 0, 0), (True, 0, 64)], gemms
    expected_rows = np.concatenate([a @ w1, np.cumsum(a, 1)], 0)
    np.testing.assert_allclose(
        both.numpy(), np.concatenate([expected_rows, expected_rows @ w2], 0), rtol=1e-5, atol=1e-5
    )


def _conv_pair(x, first, second, bias, residual, stride, conv, relu, cat):
    """Two 3x3 convs of x concatenated along the channels, the second with a bias, a relu and a residual."""
    fused = relu(conv(x, second, bias, stride=stride, padding=1)) + residual
    return cat([relu(conv(x, first, stride=stride, padding=1)), fused], 1)


# (algorithm, image side, stride): merged small images (7x7; 13x13 at stride 2: AVX2's explicit columns) and large
# ones (34x32: one GEMM each, the direct conv's rows)
CONV_PATHS = [
    (conv.IMPLICIT_GEMM, 7, 1),
    (conv.IMPLICIT_GEMM, 34, 1),
    (conv.IMPLICIT_GEMM, 13, 2),
    (conv.WINOGRAD, 7, 1),
    (conv.WINOGRAD, 34, 1),
    (conv.DIRECT, 34, 1),
    *((conv.IM2COL, side, stride) for side, stride in ((7, 1), (34, 1), (13, 2)) if blas.conv_available()),
]


@needs_gemm
@pytest.mark.parametrize("batch", [1, 2, 8])
@pytest.mark.parametrize("path", CONV_PATHS, ids=str)
def test_every_conv_algorithm_writes_its_images_into_the_slice(path: tuple[str, int, int], batch: int) -> None:
    """Odd channel counts (5 in, 7 and 3 out), the second conv with its bias, relu and residual (read from its own
    contiguous buffer); values against torch with the arena poisoned (an element no kernel wrote would be NaN)."""
    algorithm, side, stride = path
    x, bias = _floats((batch, 5, side, side - (side > 8) * 2), 70), _floats((3,), 71)
    first, second = _floats((7, 5, 3, 3), 72), _floats((3, 5, 3, 3), 73)
    out_size = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(second), stride=stride, padding=1).shape
    arrays = (x, first, second, bias, _floats(tuple(out_size), 74))
    out = _conv_pair(*map(tg.tensor, arrays), stride, F.conv2d, F.relu, tg.cat) * 2
    nodes = [n for n in toposort([out.node]) if n.op.name == "conv2d"]
    with forced({signature_of(n): algorithm for n in nodes}), pytest.MonkeyPatch.context() as patch:
        patch.setenv("TG_POISON", "1")
        program, _ = CPU.program([out.node])
        got = out.numpy()
    calls = [s for k in program.kernels for s in walk(k.body) if isinstance(s, ConvCall)]
    positions = out_size[2] * out_size[3]
    assert [c.function for c in calls] == [conv.C_FUNCTIONS[algorithm]] * 2 and calls[1].residual, calls
    assert [(c.out, c.out_offset) for c in calls] == [(calls[0].out, 0), (calls[0].out, 7 * positions)], calls
    assert batch == 1 or {c.out_stride for c in calls} == {10 * positions}, calls
    assert "cat" not in [k.name.split("_", 1)[1] for k in program.kernels]
    expected = (_conv_pair(*map(torch.tensor, arrays), stride, torch.conv2d, torch.relu, torch.cat) * 2).numpy()
    # Winograd's rounding error grows with the largest outputs (about ten times the direct sum's)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5 * np.abs(expected).max())


@needs_gemm
def test_a_residual_read_by_a_conv_keeps_its_own_buffer_and_is_copied() -> None:
    """A conv reads its residual as a contiguous buffer of its own (tg_conv2d_fn): a piece that is another conv's
    residual is not placed (its cat copies it), the conv reading it writes its strided slice."""
    x, first, second = _floats((2, 4, 7, 7), 80), _floats((3, 4, 3, 3), 81), _floats((3, 4, 1, 1), 82)

    def pieces(x, first, second, conv, relu, cat):
        a = relu(conv(x, first, padding=1))
        return cat([a, relu(conv(x, second)) + a], 1) * 2

    out = pieces(*map(tg.tensor, (x, first, second)), F.conv2d, F.relu, tg.cat)
    program, _ = CPU.program([out.node])
    (copy,) = [k for k in program.kernels if k.name.endswith("_cat")]
    (store,) = [s for s in walk(copy.body) if isinstance(s, Store)]
    a_call, b_call = [s for k in program.kernels for s in walk(k.body) if isinstance(s, ConvCall)]
    assert b_call.residual == a_call.out != store.buffer == b_call.out and b_call.out_offset == 3 * 49, program.kernels
    assert b_call.out_stride == 6 * 49
    expected = pieces(*map(torch.tensor, (x, first, second)), torch.conv2d, torch.relu, torch.cat)
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


@needs_gemm
@pytest.mark.parametrize("batch", [1, 2])
def test_a_grouped_pointwise_conv_writes_each_image_into_the_slice(batch: int) -> None:
    """ "grouped_gemm" runs a product per image (batched over the groups), each one contiguous block: each writes it
    in its image's slice of the concatenation."""
    x, weight, other = _floats((batch, 8, 5, 5), 90), _floats((6, 4, 1, 1), 91), _floats((3, 8, 1, 1), 92)

    def unit(x, weight, other, conv, cat):
        return cat([conv(x, other), conv(x, weight, groups=2).relu()], 1) * 2

    out = unit(*map(tg.tensor, (x, weight, other)), F.conv2d, tg.cat)
    grouped = [n for n in toposort([out.node]) if n.op.name == "conv2d" and params_of(n)["groups"] == 2]
    with forced({signature_of(grouped[0]): conv.GROUPED}):
        program, _ = CPU.program([out.node])
        got = out.numpy()
    products = [s for k in program.kernels for s in walk(k.body) if isinstance(s, GemmCall)]
    (call,) = [s for k in program.kernels for s in walk(k.body) if isinstance(s, ConvCall)]
    assert [(p.c, p.c_offset) for p in products] == [(call.out, 3 * 25 + i * 9 * 25) for i in range(batch)], products
    assert "cat" not in [k.name.split("_", 1)[1] for k in program.kernels]
    expected = unit(*map(torch.tensor, (x, weight, other)), torch.conv2d, torch.cat)
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-4)


@needs_gemm
def test_an_onnx_conv_and_concat_model_writes_in_place_and_matches_onnxruntime() -> None:
    """Convs concatenated along the channels at batch 4 (as an ONNX graph runs them): no copy, ORT's values."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    x = _floats((4, 6, 7, 7), 100)
    arrays = {"w1": _floats((5, 6, 1, 1), 101), "b1": _floats((5,), 102), "w2": _floats((3, 6, 3, 3), 103)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["x", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["r1", "c2"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["out"]),
    ]
    value = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    initializers = [numpy_helper.from_array(array, name) for name, array in arrays.items()]
    graph = helper.make_graph(nodes, "pair", [value("x", x.shape)], [value("out", (4, 8, 1, 1))], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    out = tg.onnx.load(model)(tg.tensor(x)).detach()
    program, _ = CPU.program([out.node])
    assert "cat" not in [k.name.split("_", 1)[1] for k in program.kernels], program.kernels
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-5)
