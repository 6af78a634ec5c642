"""kiln's memory benchmark GPT (12 blocks) in Python PyTorch: step time without
torch.utils.checkpoint, with it on every block and on every 2nd block, in interleaved rounds.
Prints one JSON object per case (median ms per step, median per-round ratio to none).

    /usr/bin/python3 bench/memory_bench.py --threads 2 --steps 5 --rounds 5
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gpt_model import GPT  # noqa: E402  (kiln's gpt, shared by the Python benchmarks)


def make_step(every):
    """An optimizer step of the GPT with torch.utils.checkpoint on every `every`-th block (0: none)."""
    torch.manual_seed(0)
    model = GPT(layers=12)
    if every:
        for i, block in enumerate(model.blocks):
            if i % every == 0:
                forward = block.forward
                block.forward = lambda x, f=forward: checkpoint(f, x)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(0, 64, (2048, 65))
    position = [0]

    def step():
        i = position[0] = (position[0] + 32) % 2048
        batch = tokens[i:i + 32]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, 64), batch[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()

    step()
    return step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cases = {"none": make_step(0), "blocks": make_step(1), "every-2nd": make_step(2)}
    times = {name: [] for name in cases}
    for _ in range(args.rounds):  # the cases take turns, as in kiln's benchmark
        for name, step in cases.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[name].append(1e3 * (time.perf_counter() - start) / args.steps)
    for name in cases:
        ratio = statistics.median(t / b for t, b in zip(times[name], times["none"]))
        print(json.dumps({"case": name, "python_ms": statistics.median(times[name]), "python_ratio": ratio}))


if __name__ == "__main__":
    main()
