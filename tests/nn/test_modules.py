"""Every tg.nn layer against torch.nn: same constructor call, torch's weights copied in, then the forward
output and the gradients of every parameter (and float input) are compared.

A case's `build(nn)` is called once with `torch.nn` and once with `tg.nn`, so both sides get the same
arguments by construction.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest
import torch

import tensorgraphs as tg


@dataclass
class Case:
    name: str
    build: Callable[[Any], Any]
    inputs: Callable[[np.random.Generator], list[np.ndarray]]
    train: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)
    rtol: float = 1e-4
    atol: float = 1e-5


def normal(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.standard_normal(shape).astype(np.float32)


def inputs(*makers: Callable[[np.random.Generator], np.ndarray]) -> Callable[[np.random.Generator], list]:
    return lambda rng: [make(rng) for make in makers]


def indices(high: int, *shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.integers(0, high, shape).astype(np.int64)


def lib_of(nn: Any) -> Any:
    """torch for torch.nn, tg for tg.nn: lets a case build constructor tensors on either side."""
    return torch if nn is torch.nn else tg


def causal(n: int) -> np.ndarray:
    return np.triu(np.ones((n, n), bool), 1)


CASES = [
    Case("Linear", lambda nn: nn.Linear(4, 3), inputs(normal(2, 4))),
    Case("Linear_nobias_3d", lambda nn: nn.Linear(4, 3, bias=False), inputs(normal(2, 5, 4))),
    Case("Bilinear", lambda nn: nn.Bilinear(3, 4, 2), inputs(normal(5, 3), normal(5, 4))),
    Case("Embedding", lambda nn: nn.Embedding(7, 3, padding_idx=1), inputs(indices(7, 2, 5))),
    Case("LayerNorm", lambda nn: nn.LayerNorm(6), inputs(normal(3, 6))),
    Case("LayerNorm_2d_nobias", lambda nn: nn.LayerNorm((2, 3), bias=False), inputs(normal(4, 2, 3))),
    Case("RMSNorm", lambda nn: nn.RMSNorm(5, eps=1e-6), inputs(normal(3, 5))),
    Case("GroupNorm", lambda nn: nn.GroupNorm(2, 4), inputs(normal(2, 4, 3, 3))),
    Case("BatchNorm1d_train", lambda nn: nn.BatchNorm1d(3), inputs(normal(5, 3)), train=True),
    Case("BatchNorm1d_3d_train", lambda nn: nn.BatchNorm1d(3), inputs(normal(4, 3, 2)), train=True),
    Case("BatchNorm2d_train", lambda nn: nn.BatchNorm2d(2), inputs(normal(3, 2, 2, 2)), train=True),
    Case("BatchNorm1d_cumulative_average", lambda nn: nn.BatchNorm1d(3, momentum=None), inputs(normal(5, 3)),
         train=True),
    Case("BatchNorm2d_untracked_eval", lambda nn: nn.BatchNorm2d(2, affine=False, track_running_stats=False),
         inputs(normal(3, 2, 2, 2))),
    Case("BatchNorm2d_eval", lambda nn: nn.BatchNorm2d(2), inputs(normal(3, 2, 2, 2))),
    Case("Dropout_eval", lambda nn: nn.Dropout(0.3), inputs(normal(3, 4))),
    Case("Conv1d", lambda nn: nn.Conv1d(2, 4, 3, stride=2, padding=1), inputs(normal(2, 2, 7))),
    Case("Conv2d", lambda nn: nn.Conv2d(2, 3, 3, padding="same"), inputs(normal(1, 2, 5, 5))),
    Case("Conv2d_reflect", lambda nn: nn.Conv2d(2, 3, (3, 2), padding=(1, 2), padding_mode="reflect"),
         inputs(normal(1, 2, 4, 5))),
    Case("Conv1d_circular_same", lambda nn: nn.Conv1d(2, 2, 4, padding="same", padding_mode="circular"),
         inputs(normal(2, 2, 6))),
    Case("Conv2d_replicate", lambda nn: nn.Conv2d(1, 2, 3, stride=2, padding=1, padding_mode="replicate"),
         inputs(normal(1, 1, 5, 5))),
    Case("Conv2d_groups", lambda nn: nn.Conv2d(4, 4, (2, 3), stride=(1, 2), groups=2, bias=False),
         inputs(normal(2, 4, 4, 5))),
    Case("ConvTranspose2d", lambda nn: nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1),
         inputs(normal(1, 2, 3, 3))),
    Case("MaxPool2d", lambda nn: nn.MaxPool2d(2), inputs(normal(1, 2, 4, 4))),
    Case("AvgPool2d", lambda nn: nn.AvgPool2d(3, stride=2, padding=1), inputs(normal(1, 2, 5, 5))),
    Case("AdaptiveAvgPool2d", lambda nn: nn.AdaptiveAvgPool2d((2, 3)), inputs(normal(1, 2, 5, 7))),
    Case("Flatten", lambda nn: nn.Flatten(), inputs(normal(2, 3, 2))),
    Case("Unflatten", lambda nn: nn.Unflatten(1, (2, 3)), inputs(normal(2, 6))),
    Case("Identity", lambda nn: nn.Identity(), inputs(normal(2, 3))),
    Case("Sequential", lambda nn: nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)), inputs(normal(4, 3))),
    Case("ModuleList", lambda nn: _Stack(nn), inputs(normal(2, 3))),
    *(Case(name, build, inputs(normal(3, 5))) for name, build in {
        "ReLU": lambda nn: nn.ReLU(), "GELU": lambda nn: nn.GELU(), "GELU_tanh": lambda nn: nn.GELU("tanh"),
        "SiLU": lambda nn: nn.SiLU(), "Tanh": lambda nn: nn.Tanh(), "Sigmoid": lambda nn: nn.Sigmoid(),
        "LeakyReLU": lambda nn: nn.LeakyReLU(0.2), "ELU": lambda nn: nn.ELU(alpha=0.5), "SELU": lambda nn: nn.SELU(),
        "Softplus": lambda nn: nn.Softplus(beta=2.0), "Mish": lambda nn: nn.Mish(), "ReLU6": lambda nn: nn.ReLU6(),
        "Hardtanh": lambda nn: nn.Hardtanh(-0.5, 0.5), "Softmax": lambda nn: nn.Softmax(dim=1),
        "LogSoftmax": lambda nn: nn.LogSoftmax(dim=-1), "LogSigmoid": lambda nn: nn.LogSigmoid(),
    }.items()),
    Case("MultiheadAttention", lambda nn: nn.MultiheadAttention(8, 2), inputs(normal(3, 2, 8), normal(4, 2, 8),
                                                                            normal(4, 2, 8))),
    Case("MultiheadAttention_kdim_masks", lambda nn: nn.MultiheadAttention(8, 2, kdim=5, vdim=6, batch_first=True),
         lambda rng: [normal(2, 3, 8)(rng), normal(2, 4, 5)(rng), normal(2, 4, 6)(rng)],
         kwargs={"key_padding_mask": np.array([[0, 0, -np.inf, 0], [0, -np.inf, 0, 0]], np.float32),
                 "attn_mask": np.zeros((3, 4), np.float32) - np.eye(3, 4, dtype=np.float32),
                 "average_attn_weights": False}),
    Case("MultiheadAttention_bias_kv_zero_attn", lambda nn: nn.MultiheadAttention(8, 2, add_bias_kv=True,
                                                                                  add_zero_attn=True),
         inputs(normal(3, 2, 8), normal(4, 2, 8), normal(4, 2, 8)),
         kwargs={"key_padding_mask": np.array([[False, True, False, False], [False, False, False, True]])}),
    Case("TransformerEncoderLayer", lambda nn: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0),
         inputs(normal(3, 2, 8)), kwargs={"src_mask": causal(3)}),
    Case("TransformerEncoderLayer_prenorm_gelu",
         lambda nn: nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, activation="gelu", batch_first=True,
                                               norm_first=True), inputs(normal(2, 3, 8))),
    Case("TransformerEncoder", lambda nn: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, batch_first=True), 2, norm=nn.LayerNorm(8),
        enable_nested_tensor=False), inputs(normal(2, 3, 8))),
    Case("TransformerDecoderLayer", lambda nn: nn.TransformerDecoderLayer(8, 2, 12, dropout=0.0, norm_first=True),
         inputs(normal(3, 2, 8), normal(4, 2, 8)), kwargs={"tgt_mask": causal(3), "tgt_is_causal": True}),
    Case("TransformerDecoder_norm_padding", lambda nn: nn.TransformerDecoder(
        nn.TransformerDecoderLayer(8, 2, 12, dropout=0.0), 2, norm=nn.LayerNorm(8)),
         inputs(normal(3, 2, 8), normal(4, 2, 8)),
         kwargs={"tgt_mask": causal(3), "memory_key_padding_mask": np.array([[0, 0, 0, 1], [0, 1, 0, 0]], bool),
                 "tgt_key_padding_mask": np.array([[0, 0, 1], [0, 0, 0]], bool)}),
    Case("Transformer_masks", lambda nn: nn.Transformer(8, 2, 2, 2, 16, dropout=0.0),
         inputs(normal(4, 2, 8), normal(3, 2, 8)),
         kwargs={"tgt_mask": np.triu(np.full((3, 3), -np.inf, np.float32), 1),
                 "src_key_padding_mask": np.array([[0, 0, 0, 1], [0, 0, 0, 0]], bool),
                 "memory_key_padding_mask": np.array([[0, 0, 0, 1], [0, 0, 0, 0]], bool),
                 "memory_mask": np.array([[0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]], bool)}),
    Case("Transformer_batch_first_prenorm_gelu",
         lambda nn: nn.Transformer(8, 2, 1, 2, 12, dropout=0.0, activation="gelu", batch_first=True,
                                   norm_first=True),
         inputs(normal(2, 5, 8), normal(2, 3, 8)), kwargs={"tgt_mask": causal(3), "tgt_is_causal": True}),
    Case("RNN", lambda nn: nn.RNN(3, 4, num_layers=2), inputs(normal(5, 2, 3))),
    Case("RNN_relu_bidirectional", lambda nn: nn.RNN(3, 4, nonlinearity="relu", bidirectional=True,
                                                     batch_first=True), inputs(normal(2, 4, 3), normal(2, 2, 4))),
    Case("GRU", lambda nn: nn.GRU(3, 4, batch_first=True), inputs(normal(2, 4, 3))),
    Case("GRU_bidirectional_2layer", lambda nn: nn.GRU(3, 2, num_layers=2, bidirectional=True),
         inputs(normal(3, 2, 3))),
    Case("LSTM", lambda nn: nn.LSTM(3, 4, num_layers=2), inputs(normal(4, 2, 3))),
    Case("LSTM_unbatched_bidirectional", lambda nn: nn.LSTM(3, 2, bidirectional=True, bias=False),
         inputs(normal(4, 3))),
    Case("LSTM_proj_size", lambda nn: nn.LSTM(3, 4, num_layers=2, proj_size=2, batch_first=True),
         inputs(normal(2, 3, 3))),
    Case("RNNCell", lambda nn: nn.RNNCell(3, 4), inputs(normal(2, 3), normal(2, 4))),
    Case("GRUCell", lambda nn: nn.GRUCell(3, 4), inputs(normal(2, 3), normal(2, 4))),
    Case("LSTMCell", lambda nn: nn.LSTMCell(3, 4), inputs(normal(2, 3))),
    Case("MSELoss", lambda nn: nn.MSELoss(), inputs(normal(3, 4), normal(3, 4))),
    Case("L1Loss_sum", lambda nn: nn.L1Loss(reduction="sum"), inputs(normal(3, 4), normal(3, 4))),
    Case("SmoothL1Loss", lambda nn: nn.SmoothL1Loss(beta=0.5), inputs(normal(3, 4), normal(3, 4))),
    Case("HuberLoss", lambda nn: nn.HuberLoss(delta=0.7), inputs(normal(3, 4), normal(3, 4))),
    Case("CrossEntropyLoss", lambda nn: nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=2),
         inputs(normal(5, 4), indices(4, 5))),
    Case("NLLLoss", lambda nn: nn.NLLLoss(reduction="sum"), inputs(normal(5, 4), indices(4, 5))),
    Case("BCEWithLogitsLoss", lambda nn: nn.BCEWithLogitsLoss(), lambda rng: [
        normal(3, 4)(rng), rng.random((3, 4)).astype(np.float32)]),
    Case("CrossEntropyLoss_weight", lambda nn: nn.CrossEntropyLoss(lib_of(nn).tensor([1.0, 2.0, 0.5, 1.5])),
         inputs(normal(5, 4), indices(4, 5))),
    Case("BCELoss", lambda nn: nn.BCELoss(reduction="sum"), lambda rng: [
        rng.uniform(0.05, 0.95, (3, 4)).astype(np.float32), rng.random((3, 4)).astype(np.float32)]),
    Case("BCEWithLogitsLoss_pos_weight", lambda nn: nn.BCEWithLogitsLoss(pos_weight=lib_of(nn).tensor([2.0, 0.5])),
         lambda rng: [normal(3, 2)(rng), rng.random((3, 2)).astype(np.float32)]),
    Case("KLDivLoss", lambda nn: nn.KLDivLoss(reduction="batchmean"), inputs(normal(3, 4), normal(3, 4))),
]


class _Stack:
    """A user module written once against either namespace (ModuleList of Linear + ReLU)."""

    def __new__(cls, nn: Any) -> Any:
        class Stack(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(2)])
                self.act = nn.ReLU()

            def forward(self, x: Any) -> Any:
                for layer in self.layers:
                    x = self.act(layer(x))
                return x

        return Stack()


def _outputs(result: Any) -> list[Any]:
    """Tensors in a module's result (tuples of outputs and states, None for skipped weights)."""
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in _outputs(item)]
    return [] if result is None else [result]


def _copy_torch_weights(torch_module: torch.nn.Module, tg_module: tg.nn.Module) -> None:
    tg_module.load_state_dict({k: v.detach().numpy() for k, v in torch_module.state_dict().items()})


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_module_matches_torch(case: Case) -> None:
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    arrays = case.inputs(rng)
    ref, mine = case.build(torch.nn), case.build(tg.nn)
    assert [k for k, _ in ref.named_parameters()] == [k for k, _ in mine.named_parameters()], case.name
    _copy_torch_weights(ref, mine)
    ref.train(case.train)
    mine.train(case.train)

    ref_in = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    tg_in = [tg.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    as_array = lambda convert: {k: convert(v) if isinstance(v, np.ndarray) else v for k, v in case.kwargs.items()}
    ref_out = _outputs(ref(*ref_in, **as_array(torch.tensor)))
    tg_out = _outputs(mine(*tg_in, **as_array(tg.tensor)))
    assert len(ref_out) == len(tg_out)
    for r, t in zip(ref_out, tg_out):
        np.testing.assert_allclose(t.detach().numpy(), r.detach().numpy(), rtol=case.rtol, atol=case.atol,
                                   err_msg=f"{case.name} forward")

    cotangents = [rng.standard_normal(tuple(r.shape)).astype(np.float32) for r in ref_out]
    sum(((r * torch.tensor(c)).sum() for r, c in zip(ref_out, cotangents) if r.requires_grad)).backward()
    sum(((t * tg.tensor(c)).sum() for t, c in zip(tg_out, cotangents) if t.requires_grad)).backward()
    pairs = [(f"param {name}", p.grad, dict(mine.named_parameters())[name].grad)
             for name, p in ref.named_parameters()]
    pairs += [(f"input {i}", r.grad, t.grad) for i, (r, t) in enumerate(zip(ref_in, tg_in)) if r.requires_grad]
    for label, expected, got in pairs:
        if expected is None:
            assert got is None or not np.any(got.numpy()), f"{case.name} {label}: torch has no gradient"
            continue
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=case.rtol, atol=case.atol,
                                   err_msg=f"{case.name} gradient of {label}")
    for name, buffer in ref.named_buffers():  # running statistics after a training step
        np.testing.assert_allclose(dict(mine.named_buffers())[name].numpy(), buffer.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"{case.name} buffer {name}")


def test_registration_traversal_and_state_dict() -> None:
    model = tg.nn.Sequential(tg.nn.Linear(2, 3), tg.nn.BatchNorm1d(3), tg.nn.ReLU())
    assert [n for n, _ in model.named_modules()] == ["", "0", "1", "2"]
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert [n for n, _ in model.named_buffers()] == ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                        "1.running_var", "1.num_batches_tracked"]
    assert len(list(model.children())) == 3
    model.eval()
    assert not any(m.training for m in model.modules())
    seen = []
    model.apply(lambda m: seen.append(type(m).__name__))
    assert seen == ["Linear", "BatchNorm1d", "ReLU", "Sequential"]


def test_shared_parameters_are_listed_once() -> None:
    shared = tg.nn.Linear(2, 2)
    model = tg.nn.Sequential(shared, shared)
    assert len(list(model.parameters())) == 2


def test_load_state_dict_strict_reports_keys() -> None:
    model = tg.nn.Linear(2, 3)
    with pytest.raises(RuntimeError, match='Missing key.*"bias"'):
        model.load_state_dict({"weight": np.zeros((3, 2), np.float32)})
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        model.load_state_dict({"weight": np.zeros((2, 2), np.float32), "bias": np.zeros(3, np.float32)})
    result = model.load_state_dict({"weight": np.ones((3, 2), np.float32), "extra": np.ones(1)}, strict=False)
    assert result.missing_keys == ["bias"] and result.unexpected_keys == ["extra"]
    assert np.all(model.weight.detach().numpy() == 1)


def test_setattr_rejects_a_plain_tensor_for_a_parameter() -> None:
    model = tg.nn.Linear(2, 3)
    with pytest.raises(TypeError, match="parameter 'weight'"):
        model.weight = tg.zeros(3, 2)
    model.bias = None
    assert [n for n, _ in model.named_parameters()] == ["weight"]


@pytest.mark.parametrize("size", [1, 4])
def test_generate_square_subsequent_mask_matches_torch(size: int) -> None:
    mask = tg.nn.Transformer.generate_square_subsequent_mask(size)
    want = torch.nn.Transformer.generate_square_subsequent_mask(size)
    assert mask.dtype is tg.float32
    np.testing.assert_array_equal(mask.numpy(), want.numpy())
    assert tg.nn.Transformer.generate_square_subsequent_mask(2, dtype=tg.float64).dtype is tg.float64


def test_transformer_rejects_mismatched_inputs_at_the_call() -> None:
    model = tg.nn.Transformer(8, 2, 1, 1, 16)
    with pytest.raises(tg.ShapeError, match="batch number of src \\(2\\) and tgt \\(3\\).*test_modules.py"):
        model(tg.ones(4, 2, 8), tg.ones(5, 3, 8))
    with pytest.raises(tg.ShapeError, match="equal to d_model \\(8\\)"):
        model(tg.ones(4, 2, 6), tg.ones(5, 2, 6))


def test_repr_matches_torch() -> None:
    build = lambda nn: nn.Sequential(nn.Conv2d(1, 2, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                                     nn.Dropout(0.1), nn.LayerNorm(4), nn.Linear(4, 2, bias=False),
                                     nn.Embedding(5, 2, padding_idx=0), nn.LeakyReLU(0.2), nn.GELU("tanh"),
                                     nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2), nn.Tanh()]),
                                     nn.TransformerEncoderLayer(4, 2, 8), nn.LSTM(3, 4, 2), nn.BatchNorm2d(3))
    assert repr(build(tg.nn)) == repr(build(torch.nn))


def test_zero_grad_and_requires_grad() -> None:
    model = tg.nn.Linear(2, 1)
    model(tg.ones(1, 2)).sum().backward()
    assert model.weight.grad is not None
    model.zero_grad()
    assert model.weight.grad is None
    model.requires_grad_(False)
    assert not any(p.requires_grad for p in model.parameters())


def test_deepcopy_gives_independent_parameters() -> None:
    layer = tg.nn.Linear(2, 2)
    clone = copy.deepcopy(layer)
    np.testing.assert_array_equal(clone.weight.detach().numpy(), layer.weight.detach().numpy())
    tg.nn.init.zeros_(clone.weight)
    assert np.any(layer.weight.detach().numpy() != 0)


def test_dropout_trains_and_evaluates() -> None:
    tg.manual_seed(0)
    drop = tg.nn.Dropout(0.5)
    out = drop(tg.ones(1000)).numpy()
    assert set(np.unique(out)) <= {0.0, 2.0} and 0.4 < (out == 0).mean() < 0.6
    np.testing.assert_array_equal(drop.eval()(tg.ones(5)).numpy(), np.ones(5))


def test_module_to_dtype_casts_parameters() -> None:
    layer = tg.nn.Linear(2, 2).double()
    assert layer.weight.dtype is tg.float64 and layer.weight.requires_grad


def test_state_dict_of_a_repeated_module_loads_back() -> None:
    shared = tg.nn.Linear(2, 2)
    model = tg.nn.Sequential(shared, shared)
    state = model.state_dict()
    assert list(state) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    model.load_state_dict(state)


def test_module_to_keeps_tied_weights_tied() -> None:
    embedding, head = tg.nn.Embedding(5, 3), tg.nn.Linear(3, 5, bias=False)
    head.weight = embedding.weight
    model = tg.nn.Sequential(embedding, head).double()
    assert model[0].weight is model[1].weight and model[1].weight.dtype is tg.float64
    assert len(list(model.parameters())) == 1
