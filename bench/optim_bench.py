"""kiln's optimizer benchmark in Python PyTorch: torch.optim.AdamW (default, and foreach=True)
and SGD with momentum on the same parameters and fixed gradients, paired rounds of 20 steps.
Prints one JSON object per (model, optimizer).

    /usr/bin/python3 bench/optim_bench.py --threads 2 --rounds 9
"""
import argparse
import json
import statistics
import time

import torch


def parameters(hidden):
    torch.manual_seed(0)
    sizes = [(hidden, 784), (hidden,), (hidden, hidden), (hidden,), (10, hidden), (10,)]
    params = []
    for shape in sizes:
        p = torch.nn.Parameter(torch.randn(shape) * 0.05)
        p.grad = torch.randn(shape) * 1e-2
        params.append(p)
    return params


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for model, hidden in (("mlp 784-256-256-10", 256), ("mlp 784-2048-2048-10", 2048)):
        optimizers = {
            "Python AdamW": torch.optim.AdamW(parameters(hidden), lr=1e-3, weight_decay=0.01),
            "Python AdamW (foreach)": torch.optim.AdamW(parameters(hidden), lr=1e-3, weight_decay=0.01, foreach=True),
            "Python SGD (momentum)": torch.optim.SGD(parameters(hidden), lr=0.1, momentum=0.9),
        }
        times = {name: [] for name in optimizers}
        with torch.no_grad():
            for opt in optimizers.values():
                opt.step()
            for _ in range(args.rounds):
                for name, opt in optimizers.items():
                    start = time.perf_counter()
                    for _ in range(20):
                        opt.step()
                    times[name].append(1e3 * (time.perf_counter() - start) / 20)
        for name in optimizers:
            print(json.dumps({"model": model, "optimizer": name, "step_ms": statistics.median(times[name])}))


if __name__ == "__main__":
    main()
