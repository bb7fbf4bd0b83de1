"""Benchmark: eager training steps (no tg.compile), tg against torch eager, each system in its own process.

    .venv/bin/python bench/eager.py [--models gpt,enc2,lstm] [--steps 20] [--threads N] [--clock wall|cpu]

Models: "gpt", a nanoGPT-sized character model (2 pre-LN blocks, width 64, 4 heads, context 64, vocabulary
65, batch 4; AdamW), "enc2", bench/train.py's 2-layer encoder (Adam), and "lstm", PyTorch's
word_language_model LSTM (embedding 200, 2-layer LSTM 200 with dropout 0.2, 35 time steps, batch 20; a
1000-word vocabulary; the hidden state detached between steps, `clip_grad_norm_(0.25)`, SGD). All systems
start from the same weights (numpy, one seed, loaded through `load_state_dict`) and train on the same data;
each step is written as in PyTorch: forward, loss, `zero_grad()`, `backward()`, `optimizer.step()`, and
`loss.item()` read.

Reported: the median step after warm-up, and the first step alone (tg compiles its programs there); for tg also
the time spent in native programs (compiled kernels) and the rest of the step, the Python overhead (graph
building, hashing, binding, interpreting small graphs).
On a machine shared with other work, `--threads 1 --clock cpu` compares the CPU time of each system's one thread
(OMP_NUM_THREADS and torch.set_num_threads; time the thread was descheduled does not count), far less noisy than
wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from train import D_MODEL, MODELS, build_model, make_data

SEED = 0
LR = 1e-3
WARMUP_STEPS = 3
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter
VOCAB, CONTEXT, WIDTH, HEADS, LAYERS, BATCH = 65, 64, 64, 4, 2, 4
WORDS, LSTM_WIDTH, LSTM_LAYERS, BPTT, LSTM_BATCH = 1000, 200, 2, 35, 20


def gpt(nn: Any, F: Any) -> Any:
    """The same GPT in torch.nn or tg.nn."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
            self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
            self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x: Any) -> Any:
            batch, length, width = x.shape
            q, k, v = (t.reshape(batch, length, HEADS, width // HEADS).transpose(1, 2)
                       for t in self.qkv(self.ln_1(x)).split(width, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(batch, length, width))
            return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
            self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
            self.ln_f, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

        def forward(self, idx: Any) -> Any:
            x = self.tokens(idx) + self.positions.weight[: idx.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    return GPT()


def lstm_lm(nn: Any) -> Any:
    """word_language_model's RNNModel (LSTM, untied weights) in torch.nn or tg.nn."""

    class LanguageModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Embedding(WORDS, LSTM_WIDTH)
            self.rnn = nn.LSTM(LSTM_WIDTH, LSTM_WIDTH, LSTM_LAYERS, dropout=0.2)
            self.decoder = nn.Linear(LSTM_WIDTH, WORDS)

        def forward(self, x: Any, hidden: Any) -> tuple[Any, Any]:
            output, hidden = self.rnn(self.encoder(x), hidden)
            return self.decoder(output).reshape(-1, WORDS), hidden

    return LanguageModel()


def setup(system: str, model: str) -> Callable[[], float]:
    """One eager training step of `model` on `system` ("tg" or "torch"), returning the loss."""
    if system == "torch":
        import torch as lib
        import torch.nn.functional as F
        from torch import nn
        to_tensor = lib.from_numpy
        if "OMP_NUM_THREADS" in os.environ:
            lib.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    else:
        import tensorgraphs as lib
        import tensorgraphs.nn.functional as F
        from tensorgraphs import nn
        to_tensor = lib.from_numpy
    rng = np.random.default_rng(SEED)
    if model == "gpt":
        net = gpt(nn, F)
        inputs = rng.integers(0, VOCAB, (BATCH, CONTEXT))
        targets = rng.integers(0, VOCAB, (BATCH, CONTEXT))
        loss_fn = lambda out, y: F.cross_entropy(out.reshape(-1, VOCAB), y.reshape(-1))  # noqa: E731
        optimizer_class = lib.optim.AdamW
    elif model == "lstm":
        net = lstm_lm(nn)
        inputs = rng.integers(0, WORDS, (BPTT, LSTM_BATCH))
        targets = rng.integers(0, WORDS, (BPTT * LSTM_BATCH,))
        loss_fn, optimizer_class = F.cross_entropy, lib.optim.SGD
    else:
        net = build_model(nn, F, MODELS[model])
        inputs, targets = make_data(MODELS[model])
        loss_fn, optimizer_class = F.mse_loss, lib.optim.Adam
    weights = {name: (rng.standard_normal(p.shape) * 0.02).astype(np.float32)
               for name, p in net.state_dict().items()}
    net.load_state_dict({name: to_tensor(w) for name, w in weights.items()})
    optimizer = optimizer_class(net.parameters(), lr=LR)
    x, y = to_tensor(inputs), to_tensor(targets)

    def step() -> float:
        loss = loss_fn(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    hidden = [None]

    def recurrent_step() -> float:
        output, state = net(x, hidden[0])
        hidden[0] = tuple(h.detach() for h in state)  # word_language_model's repackage_hidden
        loss = loss_fn(output, y)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), 0.25)
        optimizer.step()
        return loss.item()

    return recurrent_step if model == "lstm" else step


def native_seconds() -> Callable[[], float]:
    """Counts the seconds tg spends inside compiled programs from now on (the rest of a step is Python)."""
    from tensorgraphs.backends import native

    total = [0.0]
    run = native.Program.run

    def timed_run(self: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
        start = clock()
        try:
            return run(self, inputs)
        finally:
            total[0] += clock() - start

    native.Program.run = timed_run
    return lambda: total[0]


def worker(system: str, model: str, steps: int) -> None:
    step = setup(system, model)
    native = native_seconds() if system == "tg" else lambda: 0.0
    start = clock()
    losses = [step()]
    first = clock() - start
    losses += [step() for _ in range(WARMUP_STEPS - 1)]
    times, natives = [], []
    for _ in range(steps):
        before, start = native(), clock()
        losses.append(step())
        times.append(clock() - start)
        natives.append(native() - before)
    median = statistics.median(times)
    print(json.dumps({"ms": median * 1e3, "native_ms": statistics.median(natives) * 1e3, "first_s": first,
                      "first_loss": losses[0], "last_loss": losses[-1]}))


def run_worker(system: str, model: str, steps: int, clock_name: str,
               threads: int | None) -> dict[str, float] | str:
    command = [sys.executable, __file__, "--worker", system, model, "--steps", str(steps), "--clock", clock_name]
    env = dict(os.environ)
    if threads:
        command += ["--threads", str(threads)]
        env.update({name: str(threads) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        return lines[-1][:80]
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt,enc2,lstm",
                        help="comma-separated subset of gpt,lstm,enc1,enc2,enc4,mlp")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run, after warm-up")
    parser.add_argument("--threads", type=int, default=None, help="threads of both systems (OMP_NUM_THREADS)")
    parser.add_argument("--clock", choices=CLOCKS, default="wall", help="wall-clock or process CPU time")
    parser.add_argument("--worker", nargs=2, metavar=("SYSTEM", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: add --threads 1")
    global clock
    clock = CLOCKS[args.clock]
    if args.worker:
        worker(*args.worker, args.steps)
        return
    print(f"eager training steps: median of {args.steps} after {WARMUP_STEPS} warm-up (d_model {D_MODEL} encoders), "
          f"{args.clock} clock, {args.threads or 'default'} threads")
    header = ["model", "tg ms", "torch eager ms", "tg / torch", "tg native ms", "tg Python ms", "first step tg s",
              "first step torch s", "loss tg", "loss torch"]
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for model in args.models.split(","):
        tg_result, torch_result = (run_worker(system, model, args.steps, args.clock, args.threads)
                                   for system in ("tg", "torch"))
        if isinstance(tg_result, str) or isinstance(torch_result, str):
            print(f"{model} | error: {tg_result if isinstance(tg_result, str) else torch_result}")
            continue
        print(" | ".join([model, f"{tg_result['ms']:.1f}", f"{torch_result['ms']:.1f}",
                          f"{tg_result['ms'] / torch_result['ms']:.2f}x", f"{tg_result['native_ms']:.1f}",
                          f"{tg_result['ms'] - tg_result['native_ms']:.1f}", f"{tg_result['first_s']:.2f}",
                          f"{torch_result['first_s']:.2f}", f"{tg_result['last_loss']:.4f}",
                          f"{torch_result['last_loss']:.4f}"]), flush=True)


if __name__ == "__main__":
    main()
