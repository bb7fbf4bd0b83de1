"""Recurrent layers built once per structure (`nn.rnn._unrolled`): later calls re-bind the unrolled graph to their
inputs, weights and state instead of building it again, and compute what torch computes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.nn import rnn


def _copy_weights(module: Any, reference: torch.nn.Module) -> None:
    module.load_state_dict({k: tg.tensor(v.detach().numpy().copy()) for k, v in reference.state_dict().items()})


@pytest.mark.parametrize("kind, kwargs", [("LSTM", {"num_layers": 2}), ("GRU", {"bidirectional": True}),
                                          ("LSTM", {"proj_size": 2, "batch_first": True}), ("RNN", {})])
def test_later_calls_rebind_the_unrolled_graph_and_match_torch(kind: str, kwargs: dict[str, Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Three training steps (new weights after each SGD step, the state carried detached, new data each step):
    outputs and every gradient as torch's; the step function of the recurrence runs on the first call only."""
    built = []
    mode = {"LSTM": "LSTM", "GRU": "GRU", "RNN": "RNN_TANH"}[kind]
    gates, step, count = rnn._MODES[mode]

    def counted_step(*args: Any) -> Any:
        built.append(1)
        return step(*args)

    monkeypatch.setitem(rnn._MODES, mode, (gates, counted_step, count))
    monkeypatch.setattr(rnn, "_unrolled_graphs", type(rnn._unrolled_graphs)())
    reference = getattr(torch.nn, kind)(3, 4, **kwargs)
    module = getattr(tg.nn, kind)(3, 4, **kwargs)
    _copy_weights(module, reference)
    torch_opt, tg_opt = torch.optim.SGD(reference.parameters(), lr=0.1), tg.optim.SGD(module.parameters(), lr=0.1)
    rng = np.random.default_rng(4)
    torch_state = tg_state = None
    for step_number in range(3):
        data = rng.standard_normal((5, 2, 3)).astype(np.float32)
        want, torch_state = reference(torch.tensor(data), torch_state)
        got, tg_state = module(tg.tensor(data), tg_state)
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
        torch_state = tuple(s.detach() for s in torch_state) if kind == "LSTM" else torch_state.detach()
        tg_state = tuple(s.detach() for s in tg_state) if kind == "LSTM" else tg_state.detach()
        for loss, opt in (((want ** 2).sum(), torch_opt), ((got ** 2).sum(), tg_opt)):
            opt.zero_grad()
            loss.backward()
            opt.step()
        for name, p in reference.named_parameters():
            np.testing.assert_allclose(dict(module.named_parameters())[name].grad.numpy(), p.grad.numpy(),
                                       rtol=1e-4, atol=1e-5, err_msg=f"{kind} step {step_number} {name}")
        if step_number == 0:
            first_call = len(built)
    assert len(built) == first_call > 0, "only the first call builds the recurrence"


def test_rebound_outputs_follow_grad_mode_and_take_one_tensor_for_two_inputs() -> None:
    """Under no_grad the outputs require no grad (and their graph stops at the weights); one tensor given as both h0
    and c0 is read for both."""
    lstm = tg.nn.LSTM(3, 4)
    reference = torch.nn.LSTM(3, 4)
    _copy_weights(lstm, reference)
    data = np.random.default_rng(1).standard_normal((4, 2, 3)).astype(np.float32)
    state = np.random.default_rng(2).standard_normal((1, 2, 4)).astype(np.float32)
    lstm(tg.tensor(data))  # the structure is built
    with tg.no_grad():
        shared = tg.tensor(state)
        out, (h, c) = lstm(tg.tensor(data), (shared, shared))
    assert not out.requires_grad and not c.requires_grad
    want, (want_h, want_c) = reference(torch.tensor(data), (torch.tensor(state), torch.tensor(state)))
    for value, expected in ((out, want), (h, want_h), (c, want_c)):
        np.testing.assert_allclose(value.detach().numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert lstm(tg.tensor(data))[0].requires_grad


def _language_model(nn: Any) -> Any:
    """word_language_model's RNNModel, small: embedding, 2-layer LSTM with dropout between the layers, decoder."""

    class LanguageModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder, self.rnn, self.decoder = nn.Embedding(11, 6), nn.LSTM(6, 5, 2, dropout=0.2), nn.Linear(5, 11)

        def forward(self, x: Any, hidden: Any) -> tuple[Any, Any]:
            output, hidden = self.rnn(self.encoder(x), hidden)
            return self.decoder(output).reshape(-1, 11), hidden

    return LanguageModel()


@pytest.mark.long
def test_an_lstm_language_model_trains_as_in_torch() -> None:
    """word_language_model's eager loop (the state detached between steps, `clip_grad_norm_(0.25)`, SGD at lr 20),
    in eval mode so dropout draws nothing: losses, every weight after three steps and the carried state as torch's."""
    reference, model = _language_model(torch.nn), _language_model(tg.nn)
    _copy_weights(model, reference)
    reference.eval()
    model.eval()
    torch_opt, tg_opt = torch.optim.SGD(reference.parameters(), lr=20), tg.optim.SGD(model.parameters(), lr=20)
    rng = np.random.default_rng(8)
    torch_hidden = tg_hidden = None
    for step_number in range(3):
        words, targets = rng.integers(0, 11, (7, 3)), rng.integers(0, 11, (21,))
        losses = []
        for lib, net, opt, hidden in ((torch, reference, torch_opt, torch_hidden), (tg, model, tg_opt, tg_hidden)):
            output, hidden = net(lib.tensor(words), hidden)
            hidden = tuple(h.detach() for h in hidden)
            loss = lib.nn.functional.cross_entropy(output, lib.tensor(targets))
            opt.zero_grad()
            loss.backward()
            lib.nn.utils.clip_grad_norm_(net.parameters(), 0.25)
            opt.step()
            losses.append(loss.item())
            torch_hidden, tg_hidden = (hidden, tg_hidden) if lib is torch else (torch_hidden, hidden)
        np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, err_msg=f"step {step_number}")
    for name, p in reference.named_parameters():
        np.testing.assert_allclose(dict(model.named_parameters())[name].detach().numpy(), p.detach().numpy(),
                                   rtol=1e-4, atol=1e-5, err_msg=name)
    for got, want in zip(tg_hidden, torch_hidden):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
