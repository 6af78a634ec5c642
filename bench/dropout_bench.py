"""kiln's dropout benchmark in Python PyTorch: torch.nn.functional.dropout (p = 0.1, training) on
4 M elements in fp32 and bf16, paired rounds of 10 calls. Prints one JSON object per dtype.

    /usr/bin/python3 bench/dropout_bench.py --threads 2 --rounds 9
"""
import argparse
import json
import statistics
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with torch.no_grad():
        for name, dtype in (("Float", torch.float32), ("BFloat16", torch.bfloat16)):
            x = torch.randn(1 << 22).to(dtype)
            torch.nn.functional.dropout(x, 0.1, training=True)
            times = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                for _ in range(10):
                    torch.nn.functional.dropout(x, 0.1, training=True)
                times.append(1e3 * (time.perf_counter() - start) / 10)
            print(json.dumps({"dtype": name, "contender": "Python F.dropout", "ms": statistics.median(times)}))


if __name__ == "__main__":
    main()
