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
