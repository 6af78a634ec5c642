"""The mixed-precision recipe's GPT in Python PyTorch, fp32 and bf16 autocast (and fp16 autocast
with GradScaler where the CPU autocast has float16, PyTorch 2.x), for kiln's precision
benchmark. Same model shape, data shape, AdamW, threads; prints one JSON object per precision
with the median ms/step.

    /usr/bin/python3 bench/precision_bench.py --threads 2 --steps 50 --rounds 5
"""
import argparse
import json
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gpt_model import GPT  # noqa: E402  (kiln's gpt, shared by the Python benchmarks)


AUTOCAST_DTYPE = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_fp16_works():
    """PyTorch 1.13's CPU autocast refuses float16 and has no CPU GradScaler; 2.x has both."""
    try:
        with warnings.catch_warnings():  # 1.13 warns and runs fp32 instead
            warnings.simplefilter("ignore")
            with torch.autocast("cpu", dtype=torch.float16):
                y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
            y.float().sum().backward()
        torch.amp.GradScaler("cpu")
        return y.dtype == torch.float16
    except (RuntimeError, AttributeError, TypeError):
        return False


def time_steps(precision, steps, seed):
    torch.manual_seed(seed)
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dtype = AUTOCAST_DTYPE[precision]
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None  # as kiln's fp16: 2^16, dynamic
    tokens = torch.randint(0, 64, (4096, 65))
    start = time.perf_counter()
    for step in range(steps):
        batch = tokens[(step * 32) % 4096:(step * 32) % 4096 + 32]
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 64), batch[:, 1:].reshape(-1))
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        loss.item()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for precision in ("fp32", "bf16") + (("fp16",) if cpu_fp16_works() else ()):
        time_steps(precision, 5, 0)  # warmup
        times = [time_steps(precision, args.steps, r) for r in range(args.rounds)]
        print(json.dumps({"precision": precision, "python_ms": 1e3 * statistics.median(times)}))


if __name__ == "__main__":
    main()
