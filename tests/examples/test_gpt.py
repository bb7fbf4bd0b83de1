"""The GPT example trains to the same losses as the same model in PyTorch; `tg train` checkpoints and resumes."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import tensorgraphs as tg
from tensorgraphs.cli import main as tg_main
from tensorgraphs.codegen.loop_ir import GemmCall, walk
from tensorgraphs.examples import gpt
from tensorgraphs.kernels import gemm
from tensorgraphs.testing.mixed_precision import assert_tracks_torch

EQUIVALENCE_STEPS = 50


class TorchCausalSelfAttention(nn.Module):
    def __init__(self, config: gpt.GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, channels = x.shape
        heads = [
            t.reshape(batch, length, self.n_head, channels // self.n_head).transpose(1, 2)
            for t in self.qkv(x).split(channels, dim=2)
        ]
        y = TF.scaled_dot_product_attention(*heads, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, channels))


class TorchBlock(nn.Module):
    def __init__(self, config: gpt.GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = TorchCausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.ModuleDict(
            {
                "fc": nn.Linear(config.n_embd, 4 * config.n_embd),
                "gelu": nn.GELU(approximate="tanh"),
                "proj": nn.Linear(4 * config.n_embd, config.n_embd),
            }
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp.proj(self.mlp.gelu(self.mlp.fc(self.ln_2(x))))


class TorchGPT(nn.Module):
    def __init__(self, config: gpt.GPTConfig) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.position_embedding = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList([TorchBlock(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.token_embedding(idx) + self.position_embedding(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


@pytest.mark.parametrize("device", ["numpy", "planned", "compiled"])
@pytest.mark.long
def test_training_matches_pytorch_from_the_same_weights(device: str, tmp_path, monkeypatch) -> None:
    """50 AdamW steps on the shipped text; every step's loss agrees within 1e-3 relative (float32), for lazy
    steps on two devices and for the whole step compiled into one program."""
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))  # the planner's choices must not depend on the user's cache
    corpus = gpt.CharCorpus.load()
    config = gpt.GPTConfig(len(corpus.chars), block_size=8, n_layer=2, n_head=2, n_embd=16)
    tg.manual_seed(0)
    model = gpt.GPT(config)
    reference = TorchGPT(config)
    reference.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in model.state_dict().items()})
    optimizer = tg.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    train_step = gpt.make_train_step(model, optimizer, compiled=device == "compiled")
    losses, reference_losses = [], []
    for step in range(EQUIVALENCE_STEPS):
        x, y = gpt.batch_at(corpus.train, 4, config.block_size, seed=0, step=step)
        with tg.device("numpy" if device == "compiled" else device):
            losses.append(train_step(x, y).item())
        reference_optimizer.zero_grad()
        logits = reference(torch.from_numpy(x.numpy()))
        loss = TF.cross_entropy(logits.reshape(-1, config.vocab_size), torch.from_numpy(y.numpy()).reshape(-1))
        loss.backward()
        reference_optimizer.step()
        reference_losses.append(loss.item())
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-3, err_msg="tg vs torch loss per step")
    assert losses[-1] < losses[0] - 0.5, f"the model should learn: losses {losses[0]:.3f} -> {losses[-1]:.3f}"


AUTOCAST_STEPS = 200


@pytest.mark.long
def test_autocast_training_tracks_torch_autocast(tmp_path, monkeypatch) -> None:
    """200 AdamW steps of the compiled step under tg.autocast (bfloat16) against torch's bfloat16 autocast run and
    its float32 run from the same weights on the same batches (see tensorgraphs.testing.mixed_precision)."""
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    corpus = gpt.CharCorpus.load()
    config = gpt.GPTConfig(len(corpus.chars), block_size=8, n_layer=2, n_head=2, n_embd=16)
    tg.manual_seed(0)
    model = gpt.GPT(config)
    weights = {k: torch.from_numpy(v.numpy().copy()) for k, v in model.state_dict().items()}
    optimizer = tg.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    train_step = gpt.make_train_step(model, optimizer, compiled=True, autocast=True)
    batches = [gpt.batch_at(corpus.train, 4, config.block_size, seed=0, step=step) for step in range(AUTOCAST_STEPS)]
    losses = [train_step(x, y).item() for x, y in batches]

    def torch_losses(autocast: bool) -> list[float]:
        reference = TorchGPT(config)
        reference.load_state_dict(weights)
        reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
        result = []
        for x, y in batches:
            reference_optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = reference(torch.from_numpy(x.numpy()))
                loss = TF.cross_entropy(logits.reshape(-1, config.vocab_size), torch.from_numpy(y.numpy()).reshape(-1))
            loss.backward()
            reference_optimizer.step()
            result.append(loss.item())
        return result

    assert_tracks_torch(losses, torch_losses(autocast=True), torch_losses(autocast=False))
    assert losses[-1] < losses[0] - 1.0, f"the model should learn: losses {losses[0]:.3f} -> {losses[-1]:.3f}"


TINY = [
    "--batch-size",
    "2",
    "--block-size",
    "8",
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--n-embd",
    "16",
    "--eval-every",
    "2",
    "--eval-batches",
    "1",
    "--sample-length",
    "20",
    "--device",
    "numpy",
    "--blas-threads",
    "0",
]


@pytest.mark.long
def test_tg_train_saves_a_checkpoint_and_resumes_where_it_stopped(tmp_path, capsys, monkeypatch) -> None:
    """Two steps, then two more from the checkpoint, give the same weights as four steps in one run."""
    split, straight = tmp_path / "split.safetensors", tmp_path / "straight.safetensors"
    assert tg_main(["train", *TINY, "--steps", "2", "--checkpoint", str(split)]) == 0
    assert tg.load(split)["step"] == 2
    with monkeypatch.context() as without_tqdm:
        without_tqdm.setitem(sys.modules, "tqdm", None)  # the built-in progress line
        assert tg_main(["train", *TINY, "--steps", "4", "--checkpoint", str(split), "--resume"]) == 0
    assert tg_main(["train", *TINY, "--steps", "4", "--checkpoint", str(straight)]) == 0
    output = capsys.readouterr().out
    assert "val loss" in output and "unigram entropy" in output and "--- sample ---" in output
    assert "step 4/4  loss" in output and "tok/s  ETA" in output
    resumed, uninterrupted = tg.load(split), tg.load(straight)
    assert resumed["step"] == uninterrupted["step"] == 4
    for name, value in uninterrupted["model"].items():
        np.testing.assert_allclose(resumed["model"][name].numpy(), value.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.slow
def test_default_training_learns_well_below_the_unigram_entropy(tmp_path) -> None:
    """`tg train` with its defaults (about two minutes): validation loss 1 nat/char or more below unigram entropy."""
    result = gpt.main(["--checkpoint", str(tmp_path / "gpt.safetensors"), "--sample-length", "0"])
    assert result["val_loss"] < result["unigram_entropy"] - 1.0, result


def _generation_pair(config: gpt.GPTConfig, seed: int = 0) -> tuple[gpt.GPT, TorchGPT]:
    tg.manual_seed(seed)
    model = gpt.GPT(config)
    reference = TorchGPT(config)
    reference.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in model.state_dict().items()})
    return model, reference.eval()


def _torch_logits(reference: TorchGPT, ids: list[list[int]]) -> np.ndarray:
    with torch.no_grad():
        return reference(torch.tensor(ids))[:, -1].numpy()


def _decode_programs(model: gpt.GPT) -> int:
    return model.__dict__["_decode_step"].compiled_programs


def test_greedy_generation_matches_full_forward_decoding_in_torch_and_tg() -> None:
    """Greedy tokens through the KV cache equal argmax of full forwards over the growing context (torch, and tg's
    own forward), for a batch of two prompts up to the block size; one compiled program serves every position."""
    config = gpt.GPTConfig(vocab_size=29, block_size=12, n_layer=2, n_head=2, n_embd=16)
    model, reference = _generation_pair(config)
    prompts = [[3, 1, 4], [2, 7, 1]]
    generated = model.generate(tg.tensor(prompts), config.block_size - 3, temperature=0).numpy()
    expected = [list(p) for p in prompts]
    for _ in range(config.block_size - 3):
        following = _torch_logits(reference, expected).argmax(axis=-1)
        expected = [row + [int(t)] for row, t in zip(expected, following)]
    np.testing.assert_array_equal(generated, expected)
    model.eval()
    with tg.no_grad():
        full = model(tg.tensor(expected[:1]))[0].numpy()
    np.testing.assert_array_equal(full[2:-1].argmax(axis=-1), expected[0][3:])
    assert _decode_programs(model) == 1


def _one_token_at_a_time(model: gpt.GPT, tokens: np.ndarray, temperature: float, top_k: int | None) -> np.ndarray:
    """The prefill as generate did it before there was one: every token by itself through the decoding step."""
    for position in range(tokens.shape[1]):
        following = model._decode(tokens[:, position : position + 1], position, temperature, top_k)
    return following


def test_prompts_of_every_length_are_prefilled_by_one_program_and_generate_as_torch_does() -> None:
    """A prompt is one call of the prefill step, compiled once for every length; the greedy tokens are the argmax
    of torch's full forwards over the growing context, for prompts of several lengths up to the block size."""
    config = gpt.GPTConfig(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=16)
    model, reference = _generation_pair(config, seed=2)
    rng = np.random.default_rng(0)
    for length in (5, 9, 2, 13):
        prompts = rng.integers(0, config.vocab_size, (2, length)).tolist()
        generated = model.generate(tg.tensor(prompts), config.block_size - length, temperature=0).numpy()
        expected = prompts
        for _ in range(config.block_size - length):
            following = _torch_logits(reference, expected).argmax(axis=-1)
            expected = [row + [int(t)] for row, t in zip(expected, following)]
        np.testing.assert_array_equal(generated, expected, err_msg=f"prompt length {length}")
    assert model.__dict__["_prefill_step"].compiled_programs == 1 and _decode_programs(model) == 1


@pytest.mark.long
def test_prefilling_generates_the_tokens_that_one_token_per_call_generates(monkeypatch) -> None:
    """Past the block size (the cache refilled from the latest half block, by a prefill too) and from prompts
    longer than the block, the greedy tokens are those of the decoding step fed one token at a time."""
    config = gpt.GPTConfig(vocab_size=23, block_size=8, n_layer=2, n_head=2, n_embd=16)
    model, _ = _generation_pair(config, seed=3)
    prompts = [tg.tensor([[1, 5, 7], [2, 2, 9]]), tg.tensor(np.arange(19).reshape(1, 19) % 23)]
    prefilled = [model.generate(prompt, 3 * config.block_size, temperature=0).numpy() for prompt in prompts]
    monkeypatch.setattr(gpt.GPT, "_prefill", _one_token_at_a_time)
    for prompt, got in zip(prompts, prefilled):
        np.testing.assert_array_equal(got, model.generate(prompt, 3 * config.block_size, temperature=0).numpy())


@pytest.mark.long
def test_sampling_keeps_to_the_top_k_and_is_reproducible_under_manual_seed() -> None:
    """Every sampled token is among the k most likely after its context (by torch on the same weights); the same
    seed gives the same tokens, top_k=1 gives the greedy ones; a sampling mode compiles one program, past the
    block size too (the cache is refilled from the latest half block)."""
    config = gpt.GPTConfig(vocab_size=23, block_size=8, n_layer=1, n_head=2, n_embd=16)
    model, reference = _generation_pair(config, seed=1)
    prompt = tg.tensor([[5, 9]])
    tg.manual_seed(7)
    sampled = model.generate(prompt, 5, temperature=1.5, top_k=3).numpy()[0]
    for length in range(2, len(sampled)):
        top = np.argsort(_torch_logits(reference, [sampled[:length].tolist()])[0])[-3:]
        assert sampled[length] in top, (length, sampled, top)
    tg.manual_seed(7)
    np.testing.assert_array_equal(model.generate(prompt, 5, temperature=1.5, top_k=3).numpy()[0], sampled)
    np.testing.assert_array_equal(
        model.generate(prompt, 6, temperature=0.7, top_k=1).numpy(), model.generate(prompt, 6, temperature=0).numpy()
    )
    programs = _decode_programs(model)
    model.generate(prompt, 3 * config.block_size, temperature=1.5, top_k=3)
    model.generate(tg.tensor([[1, 2, 3, 4]]), 4, temperature=0.9, top_k=3)  # the temperature is a program input
    assert _decode_programs(model) == programs == 3  # (top_k 3), (top_k 1), greedy


@pytest.mark.skipif(not gemm.available(), reason="needs the GEMM library (AVX-512F or AVX2, a C compiler)")
@pytest.mark.long
def test_a_batch_1_decoding_step_runs_its_products_on_the_few_row_kernel_reading_weights_in_place() -> None:
    """Per layer qkv, scores, weighted values, proj, fc, mlp proj, and the head: one-row products of the GEMM
    library, which runs each by its few-row kernel (never packing B); the weights are read where they lie (no
    kernel of the step writes a copy of them)."""
    config = gpt.GPTConfig(vocab_size=300, block_size=32, n_layer=2, n_head=2, n_embd=64)
    model, _ = _generation_pair(config)
    model.generate(tg.tensor([[1, 2]]), 2, temperature=0)
    (trace,) = [t for traces in model.__dict__["_decode_step"].traces.values() for t in traces]
    kernels = trace.program.kernels
    calls = [s for kernel in kernels for s in walk(kernel.body) if isinstance(s, GemmCall)]
    assert len(calls) == 6 * config.n_layer + 1, calls
    assert all(call.function == gemm.C_FUNCTIONS["matmul"] and call.m == 1 for call in calls), calls
    written = {buffer.name for kernel in kernels for buffer in kernel.buffers if buffer.writes}
    weights = [call for call in calls if call.batch == 1]  # the others read the KV cache (written: extended)
    assert len(weights) == 4 * config.n_layer + 1 and not {call.b for call in weights} & written, weights
    before = gemm.path_counts()
    model._decode(np.array([[3]]), 2, 1.0, None)
    after = gemm.path_counts()
    assert (after["few_rows"] - before["few_rows"], after["blocked"] - before["blocked"]) == (len(calls), 0)


def _cache_products(model: gpt.GPT) -> list[GemmCall]:
    """The products of every decoding program that read the KV cache (a batch entry per head)."""
    traces = [t for traces in model.__dict__["_decode_step"].traces.values() for t in traces]
    calls = [s for t in traces for kernel in t.program.kernels for s in walk(kernel.body) if isinstance(s, GemmCall)]
    return [call for call in calls if call.batch == model.config.n_head]


def test_decoding_attends_over_the_filled_rows_rounded_up_to_a_power_of_two() -> None:
    """A decoding step at position p reads the cache's first max(64, 2^k > p) rows, block_size at most, in place
    (a program per row count): the scores' and the weighted values' products span those rows, a batch stride of the
    whole cache apart. Greedy tokens from one token to the full cache (past each row count's edge) are the argmax
    of torch's full forwards."""
    config = gpt.GPTConfig(vocab_size=29, block_size=160, n_layer=2, n_head=2, n_embd=16)
    model, reference = _generation_pair(config, seed=4)
    assert [model._cache_rows_read(p) for p in (0, 63, 64, 127, 128, 159)] == [64, 64, 128, 128, 160, 160]
    generated = model.generate(tg.tensor([[3]]), config.block_size - 1, temperature=0).numpy()
    expected = [[3]]
    for _ in range(config.block_size - 1):
        expected[0].append(int(_torch_logits(reference, expected)[0].argmax()))
    np.testing.assert_array_equal(generated, expected)
    assert _decode_programs(model) == 3
    head = config.n_embd // config.n_head
    calls = _cache_products(model)
    assert all(call.b_strides[0] == config.block_size * head for call in calls), calls
    assert len(calls) == 3 * 2 * config.n_layer, calls
    assert sorted(call.n for call in calls if call.k == head) == [64, 64, 128, 128, 160, 160]  # scores
    assert sorted(call.k for call in calls if call.n == head) == [64, 64, 128, 128, 160, 160]  # weighted values


def test_generate_rejects_an_empty_prompt() -> None:
    model = gpt.GPT(gpt.GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4))
    with pytest.raises(ValueError, match="length >= 1"):
        model.generate(tg.tensor(np.zeros((1, 0), np.int64)), 3)


@pytest.mark.slow
def test_a_gpt2_small_sized_model_generates_greedily_as_torch_does() -> None:
    """12 layers, width 768, 50257 tokens, block 1024, random weights: greedy tokens as torch's full forwards, past
    the first 64 cache rows (a decoding program reading 64 rows, then one reading 128)."""
    config = gpt.GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    model, reference = _generation_pair(config)
    generated = model.generate(tg.tensor([[10, 20, 30]]), 66, temperature=0).numpy().tolist()
    expected = [[10, 20, 30]]
    for _ in range(66):
        expected[0].append(int(_torch_logits(reference, expected)[0].argmax()))
    assert generated == expected
    assert _decode_programs(model) == 2
