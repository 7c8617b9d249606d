#!/usr/bin/env python3
"""Baseline: the same Gluon MLP on digits as a plain MXNet dist_sync job (no elastic helper).

Started with the usual DMLC_* environment, one process per role.  Rank 0 prints one
JSON line: {"samples_per_s": ..., "steps": ..., "seconds": ...}.
"""
import argparse
import json
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

ap = argparse.ArgumentParser()
ap.add_argument("--data", required=True)
ap.add_argument("--epochs", type=int, default=5)
ap.add_argument("--global-batch", type=int, default=64)
ap.add_argument("--lr", type=float, default=0.1)
ap.add_argument("--seed", type=int, default=42)
args = ap.parse_args()

with np.load(args.data) as d:
    x, y = d["x"].astype("float32"), d["y"].astype("float32")
perm = np.random.RandomState(args.seed).permutation(len(x))
train = perm[int(round(len(x) * 0.2)):]
x, y = x[train], y[train]
kv = mx.kv.create("dist_sync")
rank, world = kv.rank, kv.num_workers
mx.random.seed(args.seed)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(128, activation="relu"), gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())
net(nd.zeros((1, 64)))
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr, "momentum": 0.9},
                        kvstore=kv, update_on_kvstore=False)
trainer._init_kvstore()
trainer._init_params()
nd.waitall()
kv._barrier()
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
t0, samples, steps = None, 0, 0
for epoch in range(args.epochs):
    order = np.random.RandomState(args.seed + epoch).permutation(len(x))
    for pos in range(0, len(x), args.global_batch):
        chunk = order[pos:pos + args.global_batch]
        part = np.array_split(chunk, world)[rank]
        with autograd.record():
            loss = loss_fn(net(nd.array(x[part])), nd.array(y[part]))
        loss.backward()
        trainer.step(len(chunk))
        loss.sum().asscalar()
        if t0 is None and epoch == 1:           # measure from the second epoch (warm)
            t0 = time.time()
        if t0 is not None:
            samples += len(chunk)
            steps += 1
if rank == 0:
    dt = time.time() - t0
    print(json.dumps({"samples_per_s": samples / dt, "steps": steps, "seconds": dt}), flush=True)
