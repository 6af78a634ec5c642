"""kiln's data-loader benchmark in Python PyTorch: torch.utils.data.DataLoader over the
Fashion-MNIST training set with the same per-sample augmentation as bench/data_bench.cpp (random
crop after 4 px of zero padding, horizontal flip with p = 0.5, the same tensor ops), batches of
128, shuffled, for 0, 1 and 2 workers. Prints one JSON object per worker count.

    /usr/bin/python3 bench/data_bench.py --threads 2 --rounds 5

Python's workers are processes (fork), not threads: each makes whole batches in its own
interpreter (torch sets 1 intra-op thread there) and sends them to the main process through
shared memory. That is what a Python user gets, so it is the comparison made, not a
thread-for-thread one.

Each measurement starts a fresh iterator (forking the workers), takes `warmup` batches and times
`batches` more, as the C++ side does; reported is the median over rounds.
"""
import argparse
import gzip
import json
import os
import random
import statistics
import struct
import sys
import time

import torch

PADDING = 4
BATCH = 128


def read_idx(path):
    """An IDX file (gzip) as a uint8 tensor of its shape; no numpy needed."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = struct.unpack(">" + "I" * (magic & 0xFF), data[4:4 + 4 * (magic & 0xFF)])
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=4 + 4 * len(dims)).view(*dims)


def load_train(directory):
    """float32 [60000, 1, 28, 28], standardised with the training set's own mean and std (kiln
    uses the rounded constants 0.2860 / 0.3530 of the same statistics), and int64 labels."""
    images = read_idx(os.path.join(directory, "train-images-idx3-ubyte.gz")).float().div_(255)
    labels = read_idx(os.path.join(directory, "train-labels-idx1-ubyte.gz")).long()
    mean, std = images.mean().item(), images.std().item()
    return images.sub_(mean).div_(std).unsqueeze(1).contiguous(), labels


class Augmented(torch.utils.data.Dataset):
    """get(i) as in the C++ bench and kiln's random_crop + horizontal_flip: pad-and-crop as a copy
    of the shifted window into zeros, then a flip. Python's `random` is reseeded in each worker by
    the DataLoader, so the workers' draws differ."""

    def __init__(self, inputs, targets):
        self.inputs, self.targets = inputs, targets

    def __len__(self):
        return self.inputs.shape[0]

    def __getitem__(self, i):
        x = self.inputs[i]
        dy, dx = random.randint(-PADDING, PADDING), random.randint(-PADDING, PADDING)
        h, w = x.shape[-2], x.shape[-1]
        rows, cols = h - abs(dy), w - abs(dx)
        out = torch.zeros_like(x)
        out.narrow(-2, max(0, -dy), rows).narrow(-1, max(0, -dx), cols).copy_(
            x.narrow(-2, max(0, dy), rows).narrow(-1, max(0, dx), cols))
        if random.random() < 0.5:
            out = out.flip(-1)
        return out, self.targets[i]


def time_loader(dataset, workers, warmup, batches):
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True,
                                         num_workers=workers)
    it = iter(loader)
    sink = 0.0
    for _ in range(warmup):
        sink += next(it)[0][0, 0, 0, 0].item()
    start = time.perf_counter()
    for _ in range(batches):
        sink += next(it)[0][0, 0, 0, 0].item()
    seconds = time.perf_counter() - start
    del it  # stops the workers before the next measurement starts its own
    return seconds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("KILN_BENCH_ROUNDS", 5)))
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dataset = Augmented(*load_train(args.data))

    # The same kind of batch as the C++ loaders: [128, 1, 28, 28] float32 and [128] int64.
    x, y = next(iter(torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True)))
    assert x.shape == (BATCH, 1, 28, 28) and x.dtype == torch.float32, (x.shape, x.dtype)
    assert y.shape == (BATCH,) and y.dtype == torch.int64, (y.shape, y.dtype)
    assert int((x == 0).flatten(1).any(1).sum()) >= BATCH // 2, "fewer than half the images have padding zeros"
    print(json.dumps({"check": "ok", "python_batch": [list(x.shape), list(y.shape)]}), flush=True)

    images = args.batches * BATCH
    for workers in (int(w) for w in args.workers.split(",")):
        rates = []
        for r in range(args.rounds):
            rates.append(images / time_loader(dataset, workers, args.warmup, args.batches))
            print(f"  workers {workers}, round {r}: Python {rates[-1]:.0f} img/s", file=sys.stderr, flush=True)
        print(json.dumps({"loader": "python", "workers": workers, "threads": args.threads,
                          "images_per_s": round(statistics.median(rates)),
                          "rounds_images_per_s": [round(r) for r in rates]}),
              flush=True)


if __name__ == "__main__":
    main()
