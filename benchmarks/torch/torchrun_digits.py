#!/usr/bin/env python3
"""The digits model as a plain DDP script written for torchrun: the baseline of benchmarks/torch.

What a PyTorch user writes today for ``torchrun --nnodes=MIN:MAX --rdzv-backend=c10d`` (the anchor's
set-up, /work/shared/anchors/torchrun.md): ``gloo`` through ``env://`` (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT from torchrun), DistributedDataParallel, an MLP 64-128-10 (or the example's small conv net,
``--model conv``) on scikit-learn's digits, a global batch of 64 split over WORLD_SIZE, an optional sleep
per step, rank 0 checkpointing every ``--checkpoint-every`` steps with an atomic rename, and every start
resuming from the newest checkpoint: a membership change restarts every worker, and the steps since that
checkpoint are done again.  Nothing of dynatrain is imported: it runs unchanged under torchrun, or
started directly with the same environment (the plain-DDP throughput baseline).  It flushes denormals as the
runtime's torch workers do (the same numerics; `--keep-denormals`: as a plain script is usually written).

Data: the example's ``.npz`` (``dt-prepare-digits``) when ``--data`` names one, else ``load_digits``;
the same train/validation split (seed permutation, 20 % validation) and, per epoch, one sample order
(seed + epoch) as the elastic example, so both train the same samples in the same order.

Measurement outputs (rank 0 only, whichever worker is rank 0 in a round):
  ``--timeline PATH``: one JSON line per start ``{"event": "start", "t", "resume_step", "world", ...}``
  and per completed step ``{"t", "step", "world"}`` (appended, a single write each);
  at the end one JSON line on stdout ``{"samples_per_s", "steps", "seconds"}`` counted from the
  second epoch this process ran (the first one warms up).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

MODELS = ("mlp", "conv")


def build_net(model="mlp", hidden=128):
    """The example's nets, in PyTorch: ``mlp`` 64-hidden-10; ``conv`` two 3x3 convolutions on the
    8x8 image (32 and 64 channels, padding 1), 2x2 max pooling, hidden, 10."""
    if model == "mlp":
        return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    if model == "conv":
        return nn.Sequential(nn.Unflatten(1, (1, 8, 8)),
                             nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(64 * 4 * 4, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    raise ValueError("unknown model %r" % model)


def load_data(path, seed, val_fraction):
    if path and os.path.exists(path):
        with np.load(path) as d:
            x, y = d["x"].astype("float32"), d["y"].astype("int64")
    else:
        from sklearn.datasets import load_digits
        digits = load_digits()
        x, y = (digits.data / 16.0).astype("float32"), digits.target.astype("int64")
    perm = np.random.RandomState(seed).permutation(len(x))
    n_val = int(round(len(x) * val_fraction))
    return x[perm[n_val:]], y[perm[n_val:]], x[perm[:n_val]], y[perm[:n_val]]


def checkpoint_path(args):
    return os.path.join(args.checkpoint_dir, "checkpoint.pt")


def save_checkpoint(args, model, opt, step):
    """Atomic: write a temporary file, fsync, rename over the newest one."""
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    final = checkpoint_path(args)
    tmp = "%s.tmp.%d" % (final, os.getpid())
    with open(tmp, "wb") as handle:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, final)


def load_checkpoint(args, model, opt):
    if not args.checkpoint_dir or not os.path.exists(checkpoint_path(args)):
        return 0
    path = checkpoint_path(args)
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return int(state["step"])


class Timeline(object):
    """Rank 0's step records, one appended line each (O_APPEND: whole lines even across restarts)."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None

    def write(self, **rec):
        if self.fd is not None:
            os.write(self.fd, (json.dumps(rec) + "\n").encode())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--data", default=None, help="the example's digits .npz [load_digits]")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--model", choices=MODELS, default="mlp")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--val-fraction", type=float, default=0.2)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="sleep per step, s")
    ap.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints (0 = none)")
    ap.add_argument("--checkpoint-dir", default=None, help="where rank 0 checkpoints (none: no checkpoints)")
    ap.add_argument("--timeline", default=None, help="rank 0 appends its start and step records here")
    ap.add_argument("--keep-denormals", action="store_true",
                    help="as a plain script is written; by default denormals are flushed, as the runtime's torch "
                         "workers do (the same numerics)")
    args = ap.parse_args(argv)
    if not args.keep_denormals:
        torch.set_flush_denormal(True)                  # before gloo's threads start: they inherit it

    dist.init_process_group(backend="gloo")             # env:// (torchrun's environment)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, x_val, y_val = load_data(args.data, args.seed, args.val_fraction)
    torch.manual_seed(args.seed)
    net = build_net(args.model, args.hidden)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
    step = load_checkpoint(args, net, opt)              # every rank reads the newest checkpoint
    model = DDP(net)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    timeline = Timeline(args.timeline if rank == 0 else None)
    timeline.write(event="start", t=time.time(), resume_step=step, world=world, pid=os.getpid(),
                   restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    if rank == 0:
        print("torchrun_digits: rank 0 of %d, resume at step %d, %d train samples" % (world, step, len(x)),
              flush=True)
    spe = int(math.ceil(len(x) / float(args.global_batch)))
    total = spe * args.epochs
    first_epoch = step // spe
    t0, samples, steps = None, 0, 0
    while step < total:
        epoch, pos = divmod(step, spe)
        if t0 is None and epoch == first_epoch + 1:    # measure from the second epoch of this process
            t0 = time.time()
        order = np.random.RandomState(args.seed + epoch).permutation(len(x))
        chunk = order[pos * args.global_batch:(pos + 1) * args.global_batch]
        part = np.array_split(chunk, world)[rank]
        weight = 1.0
        if len(part) == 0:                              # every rank takes part in the all-reduce
            part, weight = chunk[:1], 0.0
        xb, yb = torch.from_numpy(x[part]), torch.from_numpy(y[part])
        # DDP averages gradients over the world: scale so the result is the mean over the global batch
        loss = loss_fn(model(xb), yb) * (weight * world / len(chunk))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if t0 is not None:
            samples += len(chunk)
            steps += 1
        timeline.write(t=time.time(), step=step, world=world)
        if rank == 0 and args.checkpoint_dir and args.checkpoint_every and step % args.checkpoint_every == 0:
            save_checkpoint(args, net, opt, step)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if rank == 0:
        with torch.no_grad():
            acc = float((net(torch.from_numpy(x_val)).argmax(1).numpy() == y_val).mean())
        seconds = time.time() - t0 if t0 is not None else float("nan")
        print(json.dumps({"samples_per_s": samples / seconds if steps else float("nan"), "steps": steps,
                          "seconds": seconds, "val_acc": acc, "world": world, "step": step}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
