"""The engine-neutral part of the digits example (``dt-train-digits``): the command line, the data, the
``Elastic`` helper the script trains with, the per-epoch report, the simulated compute and the result.

``train_digits`` (the command) parses, loads and hands over to one file per engine: ``mxnet_digits``
(Gluon, dist_sync) or ``torch_digits`` (DDP); both build on this module and nothing here imports them.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np

from dynatrain_runtime import BATCH_POLICIES, Elastic
from dynatrain_runtime.engines import ENGINES, engine_name

DEFAULT_DATA = os.environ.get("DT_DATA_PATH", "/var/lib/dynatrain/data/digits.npz")
MODELS = ("mlp", "conv")
DIE_VAR = "DT_TEST_DIE_AFTER_UPDATE"    # tests: "HOST:STEP" -- that host's worker is killed after that step's update


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Elastic MLP / conv net on the digits data set (MXNet Gluon or PyTorch)")
    ap.add_argument("--engine", choices=ENGINES, default=None,
                    help="mxnet (Gluon, dist_sync) or torch (DDP) [$DT_ENGINE, else mxnet]")
    ap.add_argument("--data", default=DEFAULT_DATA, help="prepared .npz (dt-prepare-digits) [%(default)s]")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--global-batch", type=int, default=64,
                    help="global batch (fixed-global) and the batch --lr is tuned for [%(default)s]")
    ap.add_argument("--per-worker-batch", type=int, default=32, help="per-worker batch for fixed-per-worker")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--model", choices=MODELS, default="mlp", help="the net (build_net) [%(default)s]")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seed", type=int, default=42, help="init, sample order and split seed")
    ap.add_argument("--val-fraction", type=float, default=0.2)
    ap.add_argument("--batch-policy", choices=BATCH_POLICIES, default="fixed-global")
    ap.add_argument("--warmup-steps", type=int, default=0,
                    help="linear LR warm-up after each world change (fixed-per-worker) [%(default)s]")
    ap.add_argument("--eval-every", type=int, default=1,
                    help="validate every N epochs on rank 0 (0 = after the last only) [%(default)s]")
    ap.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints (0 = only on stop)")
    ap.add_argument("--checkpoint-dir", default=None, help="default $EFS_MOUNT/checkpoints")
    ap.add_argument("--keep-checkpoints", type=int, default=2)
    ap.add_argument("--audit-samples", action="store_true",
                    help="record the sample indices of every committed step (test mode)")
    ap.add_argument("--step-sleep", type=float, default=0.0, help="sleep per step, seconds (tests/benchmarks)")
    ap.add_argument("--sample-cost-ms", type=float, default=0.0,
                    help="simulated compute: sleep this many ms per sample a worker processes, as a heavier "
                         "model's forward/backward costs; more workers then raise samples/s (the demo)")
    ap.add_argument("--result", default=None, help="result JSON (default $EFS_MOUNT/results/final.json)")
    ap.add_argument("--kvstore", default="dist_sync", help="(mxnet) the kvstore type [%(default)s]")
    args = ap.parse_args(argv)
    args.engine = engine_name(args.engine)
    return args


def make_elastic(args, num_samples, **engine_options):
    """The helper API for ``args`` (the flags both engines share) and ``num_samples`` training samples;
    ``engine_options``: ``engine=`` and what only that engine takes (MXNet's ``kvstore=``)."""
    return Elastic(num_samples=num_samples, global_batch=args.global_batch, epochs=args.epochs,
                   seed=args.seed, lr=args.lr, batch_policy=args.batch_policy,
                   per_worker_batch=args.per_worker_batch, warmup_steps=args.warmup_steps,
                   checkpoint_every=args.checkpoint_every, audit_samples=args.audit_samples,
                   checkpoint_dir=args.checkpoint_dir, keep_checkpoints=args.keep_checkpoints, **engine_options)


def simulate_compute(args, batch):
    """The stand-ins for a heavier model: ``--step-sleep`` per step (every worker waits alike) and
    ``--sample-cost-ms`` per sample of the worker's share (data-parallel compute: a larger world
    gives each worker fewer samples, so samples/s rises).  ``DT_TEST_DIE_AFTER_UPDATE``: a kill between a step's
    gradient exchange and its commit's collective (tests)."""
    if args.step_sleep:
        time.sleep(args.step_sleep)
    if args.sample_cost_ms and not batch.placeholder:
        time.sleep(len(batch.indices) * args.sample_cost_ms / 1000.0)
    if os.environ.get(DIE_VAR) == f"{os.environ.get('DT_WORKER_IP')}:{batch.step}":
        os.kill(os.getpid(), signal.SIGKILL)          # after the step's update, before its commit


def load_data(path, seed, val_fraction):
    if not os.path.exists(path):
        sys.exit(f"train_digits: data {path} not found: run dt-prepare-digits --out {path} first")
    with np.load(path) as data:
        x, y = data["x"].astype("float32"), data["y"].astype("float32")
    perm = np.random.RandomState(seed).permutation(len(x))          # fixed train/val split
    n_val = int(round(len(x) * val_fraction))
    val, train = perm[:n_val], perm[n_val:]
    return x[train], y[train], x[val], y[val]


def epoch_reporter(el, args, val_accuracy):
    """The ``on_epoch_end`` callback: rank 0 validates (every --eval-every epochs), prints and logs the epoch."""
    def epoch_end(summary):
        if el.rank != 0:
            return
        last = summary["epoch"] + 1 == args.epochs
        if last or (args.eval_every and (summary["epoch"] + 1) % args.eval_every == 0):
            summary["val_acc"] = val_accuracy()
        s = summary
        val = f" val_acc {s['val_acc']:.4f}" if "val_acc" in s else ""
        print(f"epoch {s['epoch']} step {s['step']} world {s['world']} train_loss {s['train_loss']:.4f} "
              f"train_acc {s['train_acc']:.4f}{val} samples/s {s['samples_per_s']:.1f}", flush=True)
        el.log_event("epoch", **summary)
    return epoch_end


def say_start(el, num_train, num_val, devices):
    if el.rank == 0:
        print(f"train_digits: rank 0 of {el.world}, generation {el.generation}, start at epoch {el.epoch} "
              f"step {el.step} (pos {el.pos}), {num_train} train / {num_val} val, "
              f"engine {el.engine_name}, devices {devices}", flush=True)


def write_final(el, args, val_accuracy, num_train, num_val):
    """Rank 0, once training finished: the validation accuracy into the result JSON and events.jsonl."""
    if el.finished and el.rank == 0:
        acc = val_accuracy()
        path = el.write_result({"val_acc": acc, "num_train": num_train, "num_val": num_val,
                                "global_batch": args.global_batch, "batch_policy": args.batch_policy,
                                "seed": args.seed, "engine": el.engine_name, "model": args.model},
                               path=args.result)
        el.log_event("train_end", val_acc=acc, step=el.step, epoch=el.epoch, result=path)
        print(f"train_digits: finished: val_acc {acc:.4f} after {el.epoch} epochs, {el.step} steps -> {path}",
              flush=True)
