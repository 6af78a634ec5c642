"""The quickstart job in Python PyTorch, as a user would write it instead of kiln.

Same model (784-256-256-10, dropout 0.1), same data (Debian's Fashion-MNIST), AdamW
(lr 1e-3, weight decay 0.01), batch 128, same thread count. Times `steps` steps per round
after a warmup; prints one JSON object with the median ms/step over rounds.

    /usr/bin/python3 bench/step_bench.py --threads 1 --steps 300 --rounds 7
"""
import argparse
import gzip
import json
import statistics
import time

import numpy as np
import torch


def load_images(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    n, rows, cols = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
    pixels = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, rows * cols)
    return (torch.from_numpy(pixels.astype(np.float32)) / 255.0 - 0.2860) / 0.3530


def load_labels(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8, offset=8).astype(np.int64))


def make_model():
    return torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(256, 10))


def time_steps(x, y, steps, seed):
    torch.manual_seed(seed)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=gen)
    position, loss_sum = 0, 0.0
    model.train()
    start = time.perf_counter()
    for _ in range(steps):
        if position + 128 > len(x):
            order, position = torch.randperm(len(x), generator=gen), 0
        idx = order[position:position + 128]
        position += 128
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        loss_sum += loss.item()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = load_images(f"{args.data}/train-images-idx3-ubyte.gz")
    y = load_labels(f"{args.data}/train-labels-idx1-ubyte.gz")
    time_steps(x, y, 50, 1)  # warmup
    times = [time_steps(x, y, args.steps, 100 + r) for r in range(args.rounds)]
    print(json.dumps({"threads": args.threads, "python_ms": 1e3 * statistics.median(times),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
