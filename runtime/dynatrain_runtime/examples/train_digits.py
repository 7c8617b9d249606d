"""Example elastic training script: an MLP (or a small conv net) on scikit-learn's digits (8x8, 10 classes).

MXNet Gluon (default) or PyTorch (``--engine torch``, or ``$DT_ENGINE`` -- the launcher's ``--engine``
sets it -- the same data, global batch, flags and accuracy; the torch side is ``torch_digits``).
Installed as ``dt-train-digits``.  Runs under the launcher (kvstore dist_sync, one process per worker host) or alone
(local kvstore, one worker), on the node's devices (``el.ctx``: every GPU of the node, else the CPU): each
worker's share of a step is split across them (``gluon.utils.split_and_load``).  Per epoch it prints loss/accuracy and appends an
``epoch`` record to ``$EFS_MOUNT/events.jsonl``; at the end rank 0 writes
``$EFS_MOUNT/results/final.json``.  Exit status: 0 = done, 75 = stopped at a
boundary on the launcher's request (checkpoint written), other = failure.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from dynatrain_runtime import BATCH_POLICIES, Elastic
from dynatrain_runtime.engines import ENGINES, engine_name

DEFAULT_DATA = os.environ.get("DT_DATA_PATH", "/var/lib/dynatrain/data/digits.npz")
MODELS = ("mlp", "conv")


def build_net(model="mlp", hidden=128):
    """The Gluon net of ``--model`` (uninitialised), shared with the plain dist_sync benchmark baseline.

    ``mlp``: 64 -> hidden -> 10, a step of a few hundred microseconds (the launcher's overhead shows);
    ``conv``: two 3x3 convolutions on the 8x8 image, pooling, hidden -> 10, a step closer to a real model's.
    Run every forward pass outside training under ``autograd.train_mode()`` (``forward_eval``): an
    inference-mode convolution makes MXNet's MKLDNN backend reorder the weights in place, and such a
    weight can no longer be pushed to the kvstore ("We can't generate TBlob for MKLDNN data").
    """
    from mxnet import gluon
    net = gluon.nn.HybridSequential()
    if model == "mlp":
        net.add(gluon.nn.Dense(hidden, activation="relu"), gluon.nn.Dense(10))
    elif model == "conv":
        net.add(gluon.nn.HybridLambda(lambda F, x: F.reshape(x, (-1, 1, 8, 8))),
                gluon.nn.Conv2D(32, 3, padding=1, activation="relu"),
                gluon.nn.Conv2D(64, 3, padding=1, activation="relu"),
                gluon.nn.MaxPool2D(2),
                gluon.nn.Dense(hidden, activation="relu"), gluon.nn.Dense(10))
    else:
        raise ValueError(f"unknown model {model!r} (one of {', '.join(MODELS)})")
    return net


def forward_eval(net, x):
    """``net(x)`` outside training, without MKLDNN's in-place weight reorder (see ``build_net``)."""
    from mxnet import autograd
    with autograd.train_mode():
        return net(x)


def device_shares(indices, weights, ndev):
    """Indices and weights of a share, padded to at least one sample per device.

    Every device then takes part in every step (its gradient is fresh, as the Trainer expects);
    a padding sample repeats the first index with weight 0, so it adds nothing (like the
    placeholder share of ``plan_step``), and the samples used stay exactly the share's.
    """
    idx, w = list(indices), [float(x) for x in weights]
    if len(idx) < ndev:
        idx += [idx[0]] * (ndev - len(idx))
        w += [0.0] * (ndev - len(w))
    return np.asarray(idx), np.asarray(w, dtype="float32")


def train_step(net, loss_fn, ctx, x, y, w):
    """Forward/backward of one share split across ``ctx``; returns its (weighted) loss and correct sums.

    On one device (the CPU) nothing is split or copied: the share is one batch, as before.
    """
    from mxnet import autograd, gluon, nd
    if len(ctx) == 1:
        xi, yi = nd.array(x, ctx=ctx[0]), nd.array(y, ctx=ctx[0])
        with autograd.record():
            out = net(xi)
            loss = loss_fn(out, yi)
            if not w.all():                   # a placeholder: weight 0
                loss = loss * nd.array(w, ctx=ctx[0])
        loss.backward()
        return loss.sum(), (out.argmax(axis=1) == yi).sum()
    xs, ys, ws = (gluon.utils.split_and_load(a, ctx, even_split=False) for a in (x, y, w))
    with autograd.record():
        outs = [net(xi) for xi in xs]
        losses = [loss_fn(o, yi) * wi for o, yi, wi in zip(outs, ys, ws)]
    autograd.backward(losses)
    loss = [lo.sum() for lo in losses]
    correct = [((o.argmax(axis=1) == yi) * wi).sum() for o, yi, wi in zip(outs, ys, ws)]
    home = ctx[0]         # one NDArray each, summed on the engine (no per-step sync)
    return nd.add_n(*[v.as_in_context(home) for v in loss]), nd.add_n(*[v.as_in_context(home) for v in correct])


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


def simulate_compute(args, batch):
    """The stand-ins for a heavier model: ``--step-sleep`` per step (every worker waits alike) and
    ``--sample-cost-ms`` per sample of the worker's share (data-parallel compute: a larger world
    gives each worker fewer samples, so samples/s rises)."""
    if args.step_sleep:
        time.sleep(args.step_sleep)
    if args.sample_cost_ms and not batch.placeholder:
        time.sleep(len(batch.indices) * args.sample_cost_ms / 1000.0)


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


def main(argv=None):
    args = parse_args(argv)
    x_train, y_train, x_val, y_val = load_data(args.data, args.seed, args.val_fraction)
    if args.engine == "torch":
        from dynatrain_runtime.examples.torch_digits import train_torch
        return train_torch(args, x_train, y_train, x_val, y_val)
    # MXNet is imported before the launcher assigns this (possibly pre-warmed) process its role.
    import mxnet as mx
    from mxnet import gluon, nd

    el = Elastic(num_samples=len(x_train), global_batch=args.global_batch, epochs=args.epochs,
                 seed=args.seed, lr=args.lr, batch_policy=args.batch_policy,
                 per_worker_batch=args.per_worker_batch, warmup_steps=args.warmup_steps,
                 checkpoint_every=args.checkpoint_every, audit_samples=args.audit_samples,
                 checkpoint_dir=args.checkpoint_dir, keep_checkpoints=args.keep_checkpoints,
                 kvstore=args.kvstore, engine="mxnet")
    mx.random.seed(args.seed)
    net = build_net(args.model, args.hidden)
    ctx = el.ctx                                             # the node's GPUs, or [cpu]
    net.initialize(mx.init.Xavier(), ctx=ctx)
    forward_eval(net, nd.zeros((1, x_train.shape[1]), ctx=ctx[0]))   # materialise shapes before a checkpoint load
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr, "momentum": args.momentum},
                            kvstore=el.kv, update_on_kvstore=False)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    el.attach(net, trainer)
    xv, yv = nd.array(x_val, ctx=ctx[0]), y_val

    def val_accuracy():
        return float((forward_eval(net, xv).argmax(axis=1).asnumpy() == yv).mean())

    el.on_epoch_end(epoch_reporter(el, args, val_accuracy))
    say_start(el, len(x_train), len(x_val), ",".join(str(c) for c in ctx))
    for batch in el.batches():
        # weights: 1 per sample of the share, 0 for a placeholder (no sample for us: take part, add nothing)
        idx, w = device_shares(batch.indices, batch.weights, len(ctx))
        loss, correct = train_step(net, loss_fn, ctx, x_train[idx], y_train[idx], w)
        trainer.step(batch.global_size)           # sum of all workers' gradients / global batch = mean
        if not batch.placeholder:                 # NDArrays: summed on the engine, no per-step sync
            batch.report(loss=loss, correct=correct)
        simulate_compute(args, batch)
    write_final(el, args, val_accuracy, len(x_train), len(x_val))
    return el.finish()


if __name__ == "__main__":
    sys.exit(main())
