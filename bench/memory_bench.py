"""kiln's memory benchmark GPT (12 blocks) in Python PyTorch: step time without and with
torch.utils.checkpoint on every block. Prints one JSON object per case.

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
from precision_bench import GPT  # noqa: E402  (same model code as the precision benchmark)


def run(checkpointed, steps, rounds):
    torch.manual_seed(0)
    model = GPT(layers=12)
    if checkpointed:
        for block in model.blocks:
            forward = block.forward
            block.forward = lambda x, f=forward: checkpoint(f, x)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(0, 64, (2048, 65))

    def step(i):
        batch = tokens[(i * 32) % 2048:(i * 32) % 2048 + 32]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, 64), batch[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()

    step(0)
    times = []
    for r in range(rounds):
        start = time.perf_counter()
        for s in range(steps):
            step(s)
        times.append(1e3 * (time.perf_counter() - start) / steps)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name, flag in (("checkpointing none", False), ("checkpointing blocks", True)):
        print(json.dumps({"case": name, "python_ms": run(flag, args.steps, args.rounds)}))


if __name__ == "__main__":
    main()
