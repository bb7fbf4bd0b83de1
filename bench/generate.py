"""Benchmark: batch-1 greedy decoding with a KV cache, tokens per second, tg against torch eager and torch.compile.

    .venv/bin/python bench/generate.py [--models shipped,gpt2-small] [--tokens 48] [--prompt 1]
                                       [--no-torch-compile] [--threads N] [--clock wall|cpu]

Models: the shipped GPT with `tg train`'s default config (4 layers, width 128, block 64, the corpus's characters)
and a GPT-2-small-sized one (12 layers, width 768, 12 heads, block 1024, 50257 tokens); random weights, the same
in every system. Each system reads a `--prompt`-token prompt in one call (the prefill), then decodes `--tokens`
tokens in all, one token per call:

- tg: `GPT.generate(temperature=0)`: a prefill program compiled once for every prompt length (dynamic shapes),
  then one call of a compiled program per token (the cache a fixed block_size buffer, updated in place; a step
  reads the cache's filled rows rounded up to a power of two, 64 at least: a program per such count, compiled
  once); the first call's extra time is the compile time.
- torch eager: the usual KV cache, keys and values concatenated to the past ones at every step.
- torch.compile: a static cache (block_size rows, the new rows written with index_copy_, later rows masked), so
  one graph serves every position (a growing cache would recompile per length); compile time is its first call.

tokens/s is the median over `--repeats` timed runs after warm-up (prompt included); prefill ms, the median time
of a run that stops at the first new token. The greedy tokens of every system must agree (a check, reported). The
machine is shared: figures vary with what else runs (on a loaded 2-core machine two threads of either system can
run many times slower than one, each parallel region waiting for a descheduled thread: compare with --threads 1,
and `--threads 1 --clock cpu` counts the process's CPU time, not the time it was descheduled).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as TF
from torch import nn

import tensorgraphs as tg
from tensorgraphs.examples import gpt


@dataclass(frozen=True)
class Model:
    name: str
    config: gpt.GPTConfig


def models() -> dict[str, Model]:
    vocab = len(gpt.CharCorpus.load().chars)
    defaults = gpt.parse_args([])
    shipped = gpt.GPTConfig(vocab, defaults.block_size, defaults.n_layer, defaults.n_head, defaults.n_embd)
    return {
        "shipped": Model("shipped GPT", shipped),
        "gpt2-small": Model("GPT-2-small-sized", gpt.GPTConfig(50257, 1024, 12, 12, 768)),
    }


class TorchAttention(nn.Module):
    def __init__(self, config: gpt.GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor], position: torch.Tensor | None) -> torch.Tensor:
        """Tokens at consecutive positions (several: the prompt, from position 0); `position` None: append to a
        growing cache; else write rows `position` of a static one."""
        batch, length, channels = x.shape
        q, k, v = [
            t.reshape(batch, length, self.n_head, -1).transpose(1, 2) for t in self.qkv(x).split(channels, dim=2)
        ]
        if position is None:
            cache[0], cache[1] = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
            y = TF.scaled_dot_product_attention(q, cache[0], cache[1], is_causal=length > 1)
        else:
            cache[0].index_copy_(2, position, k)
            cache[1].index_copy_(2, position, v)
            visible = torch.arange(cache[0].shape[2]).reshape(1, -1) <= position.reshape(-1, 1)
            y = TF.scaled_dot_product_attention(q, cache[0], cache[1], attn_mask=visible)
        return self.proj(y.transpose(1, 2).reshape(batch, length, channels))


class TorchBlock(nn.Module):
    def __init__(self, config: gpt.GPTConfig) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(config.n_embd), nn.LayerNorm(config.n_embd)
        self.attn = TorchAttention(config)
        self.mlp = nn.ModuleDict(
            {"fc": nn.Linear(config.n_embd, 4 * config.n_embd), "proj": nn.Linear(4 * config.n_embd, config.n_embd)}
        )

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor], position: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, position)
        return x + self.mlp.proj(TF.gelu(self.mlp.fc(self.ln_2(x)), approximate="tanh"))


class TorchGPT(nn.Module):
    """The shipped GPT's layers and parameter names, decoding one token per call."""

    def __init__(self, config: gpt.GPTConfig) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.position_embedding = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList([TorchBlock(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(
        self, token: torch.Tensor, position: torch.Tensor, caches: list[list[torch.Tensor]], static: bool
    ) -> torch.Tensor:
        x = self.token_embedding(token) + self.position_embedding(position)
        for block, cache in zip(self.blocks, caches):
            x = block(x, cache, position if static else None)
        return self.head(self.ln_f(x))[:, -1].argmax(-1, keepdim=True)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter

Decoder = Callable[[list[int], int], list[int]]
"""(prompt, count) -> the prompt and `count` greedy tokens after it."""


def torch_decoder(model: TorchGPT, config: gpt.GPTConfig, compiled: bool) -> Decoder:
    step = torch.compile(model, fullgraph=True) if compiled else model
    head = config.n_embd // config.n_head

    def decode(prompt: list[int], count: int) -> list[int]:
        rows = config.block_size if compiled else 0
        caches = [[torch.zeros(1, config.n_head, rows, head) for _ in range(2)] for _ in range(config.n_layer)]
        tokens = list(prompt)
        fed, positions = torch.tensor([prompt]), torch.arange(len(prompt))
        with torch.no_grad():
            for _ in range(count):
                tokens.append(int(step(fed, positions, caches, compiled)))
                fed, positions = torch.tensor([tokens[-1:]]), torch.tensor([len(tokens) - 1])
        return tokens

    return decode


def timed(decode: Decoder, prompt: list[int], count: int, repeats: int) -> tuple[float, float, float, list[int]]:
    """(first call's seconds beyond a timed one: the compile time, median seconds per run, median seconds to the
    first new token, the tokens)."""
    began = clock()
    decode(prompt, 1)
    tokens = decode(prompt, count)
    first = clock() - began
    runs, prefills = [], []
    for _ in range(repeats):
        began = clock()
        decode(prompt, 1)
        prefills.append(clock() - began)
        began = clock()
        decode(prompt, count)
        runs.append(clock() - began)
    median, prefill = statistics.median(runs), statistics.median(prefills)
    return max(first - median - prefill, 0.0), median, prefill, tokens


def bench(model: Model, prompt: list[int], count: int, repeats: int, torch_compile: bool) -> list[dict[str, Any]]:
    tg.manual_seed(0)
    ours = gpt.GPT(model.config)
    reference = TorchGPT(model.config).eval()
    reference.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    systems: dict[str, Decoder] = {
        "tg": lambda ids, n: ours.generate(tg.tensor([ids]), n, temperature=0).numpy()[0].tolist(),
        "torch eager": torch_decoder(reference, model.config, compiled=False),
    }
    if torch_compile:
        systems["torch.compile"] = torch_decoder(reference, model.config, compiled=True)
    rows = []
    for system, decode in systems.items():
        compile_s, seconds, prefill, tokens = timed(decode, prompt, count, repeats)
        rows.append(
            {
                "model": model.name,
                "system": system,
                "tokens_per_s": count / seconds,
                "prefill_ms": prefill * 1e3,
                "compile_s": compile_s,
                "tokens": tokens,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="shipped,gpt2-small")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--prompt", type=int, default=1, help="prompt length (token ids 0, 1, ...)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-torch-compile", dest="torch_compile", action="store_false")
    # one setting for both: tg's programs link libgomp.so.1, which resolves to the copy torch loaded at import, so
    # torch.set_num_threads sets tg's threads too (OMP_NUM_THREADS reaches a runtime of tg's own, not yet started)
    parser.add_argument("--threads", "--torch-threads", type=int, default=0, help="threads of both (0: default)")
    parser.add_argument("--clock", choices=CLOCKS, default="wall", help="cpu needs --threads 1")
    args = parser.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: add --threads 1")
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    global clock
    clock = CLOCKS[args.clock]
    known = models()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads (tg's too); "
        f"{args.clock} clock, load average {os.getloadavg()[0]:.1f}; batch 1, a {args.prompt}-token prompt, "
        f"{args.tokens} greedy tokens"
    )
    print(
        f"{'model':<20}{'system':<16}{'tokens/s':>10}{'vs eager':>10}{'prefill ms':>11}{'compile s':>11}  same tokens"
    )
    for key in args.models.split(","):
        config = known[key].config
        prompt = [i % config.vocab_size for i in range(min(args.prompt, config.block_size - 1))]
        count = min(args.tokens, config.block_size - len(prompt))
        rows = bench(known[key], prompt, count, args.repeats, args.torch_compile)
        eager = next(r for r in rows if r["system"] == "torch eager")
        for row in rows:
            same = "yes" if row["tokens"] == eager["tokens"] else "NO"
            compile_s = f"{row['compile_s']:.2f}" if row["system"] != "torch eager" else ""
            ratio = row["tokens_per_s"] / eager["tokens_per_s"]
            print(
                f"{row['model']:<20}{row['system']:<16}{row['tokens_per_s']:>10.1f}{ratio:>9.2f}x"
                f"{row['prefill_ms']:>11.1f}{compile_s:>11}  {same}"
            )


if __name__ == "__main__":
    main()
