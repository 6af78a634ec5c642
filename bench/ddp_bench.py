"""The ddp recipe's GPT in Python PyTorch, trained by torch.nn.parallel.DistributedDataParallel
on Gloo over 127.0.0.1, for kiln's DDP benchmark (issue 8). Same model (875,264 parameters),
per-rank batch (16 x 128 byte tokens), AdamW with kiln's decay groups, gradient clipping, threads.
Data are random tokens sliced from a tensor: the data pipeline is not what is measured.

Starts --ranks copies of itself (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as torchrun sets
them) and prints rank 0's JSON object: the mean ms/step of --steps synchronized steps after
--warmup, then the same steps' backward times next to --steps backwards under model.no_sync():
their difference is the all-reduce time backward does not hide (plus waiting for the slower rank).
With --zero1, AdamW runs inside torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO stage 1:
each rank keeps and steps the state of its share of the parameters, whole tensors assigned
greedily by size, then broadcasts them), the Python counterpart of kiln's sharding::zero1; rank 0
also reports the optimizer state it holds.

    /usr/bin/python3 bench/ddp_bench.py --ranks 2 --threads 1 --warmup 10 --steps 20 [--zero1]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gpt_model import GPT  # noqa: E402  (kiln's gpt, shared by the Python benchmarks)

VOCAB, SEQ, D, LAYERS, HEADS, DROPOUT, BATCH = 256, 128, 128, 4, 4, 0.1, 16
KILN_PARAMETERS = 875264  # `kiln launch -n 2 recipes/ddp.toml` prints it


def rank_main(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(args.threads)
    # The store is only the rendezvous. Debian 13's torch (2.6) defaults it to a libuv server its
    # build lacks; the classic one works everywhere (kiln falls back to it by itself).
    os.environ.setdefault("USE_LIBUV", "0")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = GPT(VOCAB, SEQ, D, LAYERS, HEADS, DROPOUT)
    parameters = sum(p.numel() for p in model.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
    # kiln's recipe: no weight decay on biases, LayerNorm gains and embeddings.
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.startswith(("tok.", "pos."))]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and not n.startswith(("tok.", "pos.")))]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    if args.zero1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, lr=1e-3)
    else:
        optimizer = torch.optim.AdamW(groups, lr=1e-3)
    torch.manual_seed(1 + rank)
    tokens = torch.randint(0, VOCAB, (1024, SEQ + 1))

    def step(i, sync=True):
        batch = tokens[(i * BATCH) % 1024:(i * BATCH) % 1024 + BATCH]
        inputs, targets = batch[:, :-1], batch[:, 1:]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(inputs).reshape(-1, VOCAB), targets.reshape(-1))
        start = time.perf_counter()
        if sync:
            loss.backward()
        else:
            with ddp.no_sync():
                loss.backward()
        backward = time.perf_counter() - start
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        optimizer.step()
        loss.item()
        return backward

    for i in range(args.warmup):
        step(i)
    dist.barrier()
    start = time.perf_counter()
    backward_sync = [step(args.warmup + i) for i in range(args.steps)]
    seconds = time.perf_counter() - start
    # The same steps with the gradient all-reduce off (each rank steps on its own gradients).
    dist.barrier()
    backward_local = [step(args.warmup + args.steps + i, sync=False) for i in range(args.steps)]
    dist.barrier()
    if rank == 0:
        logging = ddp._get_ddp_logging_data()
        buckets = logging.get("rebuilt_bucket_sizes") or logging.get("bucket_sizes")
        gradient_bytes = sum(4 * p.numel() for p in model.parameters() if p.requires_grad)
        # The state this rank holds (ZeroRedundancyOptimizer: its local optimizer's share).
        local = optimizer.optim if args.zero1 else optimizer
        state_bytes = sum(t.numel() * t.element_size() for st in local.state.values() for t in st.values()
                          if torch.is_tensor(t) and t.dim() > 0)
        print(json.dumps({
            "ranks": world, "threads": args.threads, "batch_per_rank": BATCH, "seq_len": SEQ,
            "parameters": parameters, "kiln_parameters": KILN_PARAMETERS,
            "warmup": args.warmup, "steps": args.steps,
            "python_ms": 1e3 * seconds / args.steps,
            "backward_ms": 1e3 * statistics.median(backward_sync),
            "backward_no_sync_ms": 1e3 * statistics.median(backward_local),
            "exposed_allreduce_ms": 1e3 * (statistics.median(backward_sync) - statistics.median(backward_local)),
            "allreduce_bytes_per_step": gradient_bytes,
            "bucket_bytes": buckets,
            "optimizer_state_bytes": state_bytes,
            "zero1": args.zero1,
        }), flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--zero1", action="store_true", help="AdamW inside ZeroRedundancyOptimizer")
    args = parser.parse_args()
    if "RANK" in os.environ:
        return rank_main(args)
    env = dict(os.environ, WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    ranks = [subprocess.Popen([sys.executable, __file__] + sys.argv[1:],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(args.ranks)]
    status = [r.wait() for r in ranks]
    if any(status):
        sys.exit(f"ddp_bench: rank exit statuses {status}")


if __name__ == "__main__":
    main()
