"""Train a small character-level GPT on the Gospels (American Standard Version, 1901) shipped with the package.

The model is written against `tg.nn` exactly as one writes it in PyTorch: token and position
embeddings, pre-LayerNorm transformer blocks with causal self-attention, a final LayerNorm and a
linear head. Training uses AdamW, reports validation loss against the text's unigram entropy (what
a model that ignores context achieves), saves a checkpoint (model, optimizer and step) that
`--resume` continues from, and ends with a sample. Run with `tg train` or
`python -m tensorgraphs.examples.gpt`; `--help` lists the settings. `--nproc N` trains data-parallel on N
processes of this machine (torchrun, DistributedDataParallel): each takes `--batch-size` rows of a global
batch N times as large, and rank 0 reports, evaluates, checkpoints and samples.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs import nn
from tensorgraphs.distributed import launch

TEXT_PATH = Path(__file__).parent / "data" / "asv_gospels.txt"
# The training step is compiled whole (a few seconds of compiling pays for itself over the run: bench/NOTES.md);
# evaluation runs lazily on this device (planned picks measured kernels per op); sampling runs compiled prefill
# and KV-cache decoding steps (`GPT.generate`).
DEFAULT_DEVICE = "planned"
# A decoding step attends over the cache rows filled so far, rounded up to a power of two (a program per size, each
# traced once): attention reads at most twice the rows it needs; below 64 rows the saving no longer pays a trace.
FEWEST_CACHE_ROWS = 64


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def heads(self, x: tg.Tensor) -> list[tg.Tensor]:
        """Queries, keys and values of x (batch, length, channels), each (batch, heads, length, head size)."""
        batch, length, channels = x.shape
        return [t.reshape(batch, length, self.n_head, channels // self.n_head).transpose(1, 2)
                for t in self.qkv(x).split(channels, dim=2)]

    def forward(self, x: tg.Tensor, cache: KVCache | None = None) -> tg.Tensor:
        """Causal attention over x (batch, length, channels); with `cache`, its keys and values are also written
        into the cache's rows 0..length-1 (a prefill: later rows are zeroed, and written before a query sees
        them)."""
        batch, length, channels = x.shape
        q, k, v = self.heads(x)
        if cache is not None:
            unused = cache.keys.shape[2] - length
            cache.keys.assign(F.pad(k, (0, 0, 0, unused)))
            cache.values.assign(F.pad(v, (0, 0, 0, unused)))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, channels))

    def decode(self, x: tg.Tensor, position: tg.Tensor, cache: KVCache, rows: int) -> tg.Tensor:
        """One token x (batch, 1, channels) at `position` (a 1-element int64 tensor, below `rows`): its key and
        value are written into the cache at that row, and it attends to rows 0..position, reading only the cache's
        first `rows` rows (later rows hold stale or no values: masked, or not read)."""
        batch, _, channels = x.shape
        q, k, v = self.heads(x)
        row = tg.arange(cache.keys.shape[2]).reshape(1, 1, -1, 1)
        cache.keys.assign(tg.where(row == position, k, cache.keys))
        cache.values.assign(tg.where(row == position, v, cache.values))
        keys, values = cache.keys[:, :, :rows], cache.values[:, :, :rows]
        visible = tg.arange(rows).reshape(1, 1, 1, -1) <= position
        # written out as two matrix products: for one query row they run as GEMVs over the cache, where the fused
        # attention kernel took ~10x as long at block 1024
        scores = (q @ keys.transpose(2, 3)) * (1.0 / math.sqrt(q.shape[-1]))
        y = F.softmax(tg.where(visible, scores, float("-inf")), dim=-1) @ values
        return self.proj(y.transpose(1, 2).reshape(batch, 1, channels))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.proj(self.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LN: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: tg.Tensor, cache: KVCache | None = None) -> tg.Tensor:
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))

    def decode(self, x: tg.Tensor, position: tg.Tensor, cache: KVCache, rows: int) -> tg.Tensor:
        x = x + self.attn.decode(self.ln_1(x), position, cache, rows)
        return x + self.mlp(self.ln_2(x))


@dataclass
class KVCache:
    """One layer's keys and values of every position so far, (batch, heads, block_size, head size) each: a fixed
    buffer, so one compiled decoding step serves every position."""

    keys: tg.Tensor
    values: tg.Tensor

    @classmethod
    def empty(cls, config: GPTConfig, batch: int) -> KVCache:
        shape = (batch, config.n_head, config.block_size, config.n_embd // config.n_head)
        return cls(tg.zeros(shape), tg.zeros(shape))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.position_embedding = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx: tg.Tensor) -> tg.Tensor:
        """Token ids (batch, length) -> next-token logits (batch, length, vocab)."""
        positions = tg.arange(idx.shape[1])
        x = self.token_embedding(idx) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def generate(self, idx: tg.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None) -> tg.Tensor:
        """Token ids (batch, length) followed by `max_new_tokens` sampled ones (temperature 0: the most likely).

        The prompt is one call of a prefill step (compiled once for every prompt length: `tg.compile(dynamic=)`)
        that fills the KV cache (model state, updated in place) and samples the first token; each further token is
        one call of a decoding step (compiled once per batch size and sampling mode) that reads the token and its
        position, extends the cache and samples the next token (random draws follow `tg.manual_seed`). When the
        context reaches block_size, the cache is refilled from the latest half block (positions restart at 0), as
        position embeddings exist only for block_size positions: the context is the one feeding every token by
        itself would leave.
        """
        if idx.ndim != 2 or max_new_tokens < 0 or idx.shape[1] == 0:
            raise ValueError(f"generate takes ids (batch, length >= 1) and max_new_tokens >= 0; got shape "
                             f"{tuple(idx.shape)} and {max_new_tokens}")
        ids = idx.numpy().astype(np.int64)
        if max_new_tokens == 0:
            return tg.Tensor.from_numpy(ids)
        length = ids.shape[1]
        start = 0  # the token at cache row 0
        for i in range(length):  # the refills a prompt longer than the block passes through
            start = self._refilled(i, start)
        tokens = np.zeros((ids.shape[0], length + max_new_tokens), np.int64)
        tokens[:, :length] = ids
        was_training = self.training
        self.eval()
        with tg.no_grad():
            tokens[:, length] = self._prefill(tokens[:, start:length], temperature, top_k)[:, 0]
            for i in range(length, length + max_new_tokens - 1):
                start, before = self._refilled(i, start), start
                if start != before:
                    following = self._prefill(tokens[:, start:i + 1], temperature, top_k)
                else:
                    following = self._decode(tokens[:, i:i + 1], i - start, temperature, top_k)
                tokens[:, i + 1] = following[:, 0]
        self.train(was_training)
        return tg.Tensor.from_numpy(tokens)

    def _refilled(self, i: int, start: int) -> int:
        """The token at cache row 0 once token `i` is in the cache: past the block, the latest half block's first."""
        block = self.config.block_size
        return i + 1 - max(block // 2, 1) if i - start == block else start

    def _prefill(self, tokens: np.ndarray, temperature: float, top_k: int | None) -> np.ndarray:
        """The cache filled from `tokens` (batch, length), from row 0; the next ids (batch, 1)."""
        if tokens.shape[1] == 1:  # a program of its own for length 1 (a dimension of 1 broadcasts): decode it
            return self._decode(tokens, 0, temperature, top_k)
        step = self.__dict__.get("_prefill_step")
        if step is None:
            lengths = tg.Dim("length", 1, self.config.block_size)
            step = self.__dict__["_prefill_step"] = tg.compile(self.prefill_step, dynamic={"token": {1: lengths}})
        return step(np.ascontiguousarray(tokens), float(temperature or 1.0), top_k, temperature == 0).numpy()

    def _decode(self, token: np.ndarray, position: int, temperature: float, top_k: int | None) -> np.ndarray:
        step = self.__dict__.setdefault("_decode_step", tg.compile(self.decode_step))
        return step(np.ascontiguousarray(token), np.array([position]), float(temperature or 1.0), top_k,
                    temperature == 0, self._cache_rows_read(position)).numpy()

    def _cache_rows_read(self, position: int) -> int:
        """The cache rows a decoding step at `position` reads: the least power of two past it, FEWEST_CACHE_ROWS
        at least and block_size at most (a program per such size)."""
        return min(max(FEWEST_CACHE_ROWS, 1 << position.bit_length()), self.config.block_size)

    def _caches(self, batch: int) -> list[KVCache]:
        """This batch size's KV cache of every block."""
        caches = self.__dict__.setdefault("_kv_caches", {})
        if batch not in caches:
            caches[batch] = [KVCache.empty(self.config, batch) for _ in self.blocks]
        return caches[batch]

    def prefill_step(self, token: tg.Tensor, temperature: float, top_k: int | None, greedy: bool) -> tg.Tensor:
        """Token ids (batch, length) at positions 0..length-1 -> the next ids (batch, 1), their keys and values
        written into this batch size's KV cache."""
        x = self.token_embedding(token) + self.position_embedding(tg.arange(token.shape[1]))
        for block, cache in zip(self.blocks, self._caches(token.shape[0])):
            x = block(x, cache)
        return self._next_token(x, temperature, top_k, greedy)

    def decode_step(self, token: tg.Tensor, position: tg.Tensor, temperature: float, top_k: int | None,
                    greedy: bool, rows: int) -> tg.Tensor:
        """Token ids (batch, 1) at `position` -> the next ids (batch, 1), extending this batch size's KV cache;
        attention reads the cache's first `rows` rows (more than `position`; a trace per value)."""
        x = self.token_embedding(token) + self.position_embedding(position)
        for block, cache in zip(self.blocks, self._caches(token.shape[0])):
            x = block.decode(x, position, cache, int(rows))
        return self._next_token(x, temperature, top_k, greedy)

    def _next_token(self, x: tg.Tensor, temperature: float, top_k: int | None, greedy: bool) -> tg.Tensor:
        """The ids (batch, 1) sampled after the last position of the blocks' output x."""
        logits = self.head(self.ln_f(x[:, -1:]))[:, -1]
        if greedy:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits / temperature
        if top_k is not None:
            kth = logits.topk(min(int(top_k), logits.shape[-1])).values[:, -1:]  # int(): traced for this k only
            logits = tg.where(logits < kth, float("-inf"), logits)
        return tg.multinomial(F.softmax(logits, dim=-1), 1)


def language_model_loss(model: GPT, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


# -- data --------------------------------------------------------------------------------------------------------


@dataclass
class CharCorpus:
    """The text as token ids, split 90/10 into train and validation by position."""

    chars: str
    train: np.ndarray
    val: np.ndarray

    @classmethod
    def load(cls, path: Path = TEXT_PATH) -> CharCorpus:
        text = path.read_text(encoding="utf-8")
        chars = "".join(sorted(set(text)))
        ids = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        lookup = np.zeros(max(map(ord, chars)) + 1, dtype=np.int64)
        lookup[[ord(c) for c in chars]] = np.arange(len(chars))
        tokens = lookup[ids]
        split = int(0.9 * len(tokens))
        return cls(chars, tokens[:split], tokens[split:])

    def decode(self, ids: Any) -> str:
        return "".join(self.chars[i] for i in ids)

    def unigram_entropy(self) -> float:
        """Cross-entropy (nats/char) on validation of the best context-free model: training character frequencies."""
        counts = np.bincount(self.train, minlength=len(self.chars)).astype(np.float64) + 1.0
        log_probs = np.log(counts / counts.sum())
        return float(-log_probs[self.val].mean())


def batch_at(tokens: np.ndarray, batch_size: int, block_size: int, seed: int, step: int, rank: int = 0,
             world: int = 1) -> tuple[tg.Tensor, tg.Tensor]:
    """Random windows and their next-character targets; a function of (seed, step), so a resumed run sees the
    same batches as an uninterrupted one. Rank `rank` of `world` takes its `batch_size` rows of the global batch
    of `world * batch_size`."""
    starts = np.random.default_rng([seed, step]).integers(0, len(tokens) - block_size - 1, batch_size * world)
    windows = np.stack([tokens[s:s + block_size + 1] for s in starts[rank * batch_size:(rank + 1) * batch_size]])
    return tg.Tensor.from_numpy(windows[:, :-1].copy()), tg.Tensor.from_numpy(windows[:, 1:].copy())


# -- training ----------------------------------------------------------------------------------------------------


def make_train_step(model: nn.Module, optimizer: tg.optim.Optimizer, compiled: bool,
                    autocast: bool = False) -> Callable[..., tg.Tensor]:
    """One optimizer step on a batch, returning the loss; `compiled`: the whole step as one native program;
    `autocast`: the forward pass under `tg.autocast("cpu", dtype=tg.bfloat16)` (weights and AdamW stay float32)."""

    def train_step(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        with tg.autocast("cpu", dtype=tg.bfloat16, enabled=autocast):
            loss = language_model_loss(model, x, y)
        loss.backward()
        optimizer.step()
        return loss

    return tg.compile(train_step) if compiled else train_step


def evaluate(model: GPT, tokens: np.ndarray, args: argparse.Namespace) -> float:
    """Mean loss over a fixed set of validation batches (the same ones at every evaluation)."""
    model.eval()
    with tg.no_grad():
        losses = [language_model_loss(model, *batch_at(tokens, args.batch_size, args.block_size, 0, i)).item()
                  for i in range(args.eval_batches)]
    model.train()
    return float(np.mean(losses))


def sample(model: GPT, corpus: CharCorpus, prompt: str, length: int, temperature: float, seed: int) -> str:
    """Temperature sampling of `length` characters after `prompt` through `GPT.generate` (KV cache, one compiled
    step per character), reproducible for a given `seed`."""
    lookup = {c: i for i, c in enumerate(corpus.chars)}
    ids = [lookup[c] for c in prompt if c in lookup] or [0]
    tg.manual_seed(seed)
    return corpus.decode(model.generate(tg.tensor([ids]), length, temperature=temperature).numpy()[0])


class Progress:
    """tqdm when installed, else a line rewritten in place (at most once a second): step, loss, items/s (`unit`:
    tokens here, images in the digits examples), ETA."""

    def __init__(self, start: int, total: int, tokens_per_step: int, unit: str = "tok") -> None:
        self.start, self.total, self.tokens_per_step, self.unit = start, total, tokens_per_step, unit
        self.began = self.shown = time.perf_counter()
        self.width = 0
        try:
            from tqdm import tqdm

            self.bar: Any = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
        except ImportError:
            self.bar = None

    def update(self, step: int, loss: float) -> None:
        now = time.perf_counter()
        done = step + 1 - self.start
        rate = self.tokens_per_step * done / (now - self.began)
        if self.bar is not None:
            self.bar.set_postfix({"loss": f"{loss:.3f}", f"{self.unit}_s": f"{rate:,.0f}"}, refresh=False)
            self.bar.update(1)
        elif now - self.shown >= 1.0 or step + 1 == self.total:
            self.shown = now
            eta = (now - self.began) / done * (self.total - step - 1)
            self._show(f"step {step + 1}/{self.total}  loss {loss:.4f}  {rate:,.0f} {self.unit}/s  ETA {eta:.0f}s",
                       end="")

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        else:
            self._show(line)

    def _show(self, line: str, end: str = "\n") -> None:
        print("\r" + line.ljust(self.width), end=end, flush=True)
        self.width = len(line) if end == "" else 0

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.width:
            print()


def use_blas_threads(count: int) -> None:
    """Set OpenBLAS's thread count after numpy has loaded it (what OPENBLAS_NUM_THREADS does before).

    This step's matrix products are small, so BLAS threads cost more in hand-offs than they save, and far
    more when other programs share the cores (bench/NOTES.md).
    """
    try:
        with open("/proc/self/maps") as maps:
            libraries = {line.split()[-1] for line in maps if "openblas" in line.split()[-1]}
    except OSError:
        return
    for path in libraries:
        library = ctypes.CDLL(path)
        for symbol in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads"):
            setter = getattr(library, symbol, None)
            if setter is not None:
                setter(count)
                break


def save_checkpoint(path: Path, model: GPT, optimizer: tg.optim.Optimizer, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tg.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
             "config": asdict(model.config)}, path)


def load_checkpoint(path: Path, model: GPT, optimizer: tg.optim.Optimizer) -> int:
    checkpoint = tg.load(path)
    if checkpoint["config"] != asdict(model.config):
        raise SystemExit(f"{path} was saved with model config {checkpoint['config']}, not {asdict(model.config)}")
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return int(checkpoint["step"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tg train", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="total optimizer steps")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=64, help="context length in characters")
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--eval-every", type=int, default=250, help="steps between validation losses")
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--device", default=DEFAULT_DEVICE,
                        help=f"tg device for evaluation, and for training steps with --no-compile "
                             f"(default {DEFAULT_DEVICE})")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="compile the whole training step (forward, backward, AdamW) into one native program")
    parser.add_argument("--autocast", action="store_true",
                        help="train in mixed precision: matrix products in bfloat16 (tg.autocast), weights float32")
    parser.add_argument("--checkpoint", type=Path, default=Path("gpt-checkpoint.safetensors"))
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--sample-length", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--blas-threads", type=int, default=1, help="OpenBLAS threads (0: leave as configured)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text", type=Path, default=TEXT_PATH, help="UTF-8 text to train on")
    parser.add_argument("--nproc", type=int, default=1,
                        help="processes training data-parallel on this machine (torchrun; each takes --batch-size "
                             "rows, so the global batch is NPROC times larger)")
    return parser.parse_args(argv)


def train(model: GPT, optimizer: tg.optim.Optimizer, corpus: CharCorpus, args: argparse.Namespace,
          start: int) -> dict[str, float]:
    """Steps start..args.steps with a progress bar and periodic validation; returns the last losses and timing.
    Under a launcher each process is one rank of a data-parallel run, and only rank 0 reports and evaluates."""
    rank, world = (tg.distributed.get_rank(), tg.distributed.get_world_size()) if launch.under_launcher() else (0, 1)
    trained = tg.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    entropy = corpus.unigram_entropy()
    result = {"unigram_entropy": entropy, "train_loss": math.nan, "val_loss": math.nan, "seconds_per_step": math.nan}
    progress = Progress(start, args.steps, args.batch_size * args.block_size * world) if rank == 0 else None
    train_step = make_train_step(trained, optimizer, args.compile, args.autocast)
    began = time.perf_counter()
    for step in range(start, args.steps):
        x, y = batch_at(corpus.train, args.batch_size, args.block_size, args.seed, step, rank, world)
        result["train_loss"] = train_step(x, y).item()
        if progress is None:
            continue
        progress.update(step, result["train_loss"])
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            result["val_loss"] = evaluate(model, corpus.val, args)
            progress.write(f"step {step + 1}: train loss {result['train_loss']:.3f}, "
                           f"val loss {result['val_loss']:.3f} (unigram entropy {entropy:.3f})")
    if progress is not None:
        progress.close()
    if args.steps > start:
        result["seconds_per_step"] = (time.perf_counter() - began) / (args.steps - start)
    return result


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    if args.nproc > 1 and not launch.under_launcher():
        raise SystemExit(launch.run_on_processes(args.nproc, "tensorgraphs.examples.gpt",
                                                 launch.without_option(sys.argv[1:] if argv is None else argv,
                                                                       "--nproc")))
    if args.blas_threads:
        use_blas_threads(args.blas_threads)
    if not launch.under_launcher():
        return run(args)
    tg.distributed.init_process_group("gloo")
    try:
        return run(args) if tg.distributed.get_rank() == 0 else _train_quietly(args)
    finally:
        tg.distributed.destroy_process_group()


def _train_quietly(args: argparse.Namespace) -> dict[str, float]:
    """A rank other than 0: it trains its share and reports nothing (rank 0 prints, checkpoints and samples)."""
    corpus = CharCorpus.load(args.text)
    model, optimizer, start = build(args, corpus)
    with tg.device(args.device):
        return train(model, optimizer, corpus, args, start)


def build(args: argparse.Namespace, corpus: CharCorpus) -> tuple[GPT, tg.optim.Optimizer, int]:
    """The model and optimizer (from the checkpoint with --resume) and the step to start from."""
    config = GPTConfig(len(corpus.chars), args.block_size, args.n_layer, args.n_head, args.n_embd)
    tg.manual_seed(args.seed)
    model = GPT(config)
    optimizer = tg.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    start = load_checkpoint(args.checkpoint, model, optimizer) if args.resume else 0
    return model, optimizer, start


def run(args: argparse.Namespace) -> dict[str, float]:
    """Train with reports, then checkpoint and sample."""
    corpus = CharCorpus.load(args.text)
    model, optimizer, start = build(args, corpus)
    config = model.config
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.text.name}: {len(corpus.train):,} train / {len(corpus.val):,} val chars, vocab {len(corpus.chars)}; "
          f"unigram entropy {corpus.unigram_entropy():.3f} nats/char")
    print(f"GPT with {n_params:,} parameters ({config}) on device {args.device}, steps {start}..{args.steps}")
    if launch.under_launcher():
        world = tg.distributed.get_world_size()
        print(f"data-parallel on {world} processes: {args.batch_size} rows each, global batch "
              f"{args.batch_size * world}")
    began = time.perf_counter()
    with tg.device(args.device):
        result = train(model, optimizer, corpus, args, start)
        if args.steps > start:
            print(f"trained in {time.perf_counter() - began:.0f} s ({result['seconds_per_step']:.3f} s/step)")
        save_checkpoint(args.checkpoint, model, optimizer, max(start, args.steps))
        print(f"saved {args.checkpoint} (step {max(start, args.steps)}); continue with --resume and more --steps")
        if args.sample_length:
            print("--- sample ---")
            print(sample(model, corpus, "\n", args.sample_length, args.temperature, args.seed))
    return result


if __name__ == "__main__":
    main()
