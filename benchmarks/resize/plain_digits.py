#!/usr/bin/env python3
"""Baseline: the same Gluon net on digits as a plain MXNet dist_sync job (no elastic helper).

The net is the example's (``dynatrain_runtime.examples.mxnet_digits.build_net``, ``--model``).

Started with the usual DMLC_* environment, one process per role.  Rank 0 prints one
JSON line: {"samples_per_s": ..., "steps": ..., "seconds": ...}.
"""
import argparse
import json
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

from dynatrain_runtime.engines.denormals import flush_denormals
from dynatrain_runtime.script.elastic import init_trainer_kvstore
from dynatrain_runtime.examples.digits_common import MODELS
from dynatrain_runtime.examples.mxnet_digits import build_net, forward_eval

ap = argparse.ArgumentParser()
ap.add_argument("--data", required=True)
ap.add_argument("--epochs", type=int, default=5)
ap.add_argument("--global-batch", type=int, default=64)
ap.add_argument("--lr", type=float, default=0.1)
ap.add_argument("--seed", type=int, default=42)
ap.add_argument("--model", choices=MODELS, default="mlp")
ap.add_argument("--keep-denormals", action="store_true",
                help="as a plain script is written; by default denormals are flushed, as the runtime's MXNet workers do")
args = ap.parse_args()
if not args.keep_denormals:
    flush_denormals()                           # the same numerics as the elastic workers (engines/denormals.py)

with np.load(args.data) as d:
    x, y = d["x"].astype("float32"), d["y"].astype("float32")
perm = np.random.RandomState(args.seed).permutation(len(x))
train = perm[int(round(len(x) * 0.2)):]
x, y = x[train], y[train]
kv = mx.kv.create("dist_sync")
rank, world = kv.rank, kv.num_workers
mx.random.seed(args.seed)
net = build_net(args.model)
net.initialize(mx.init.Xavier())
forward_eval(net, nd.zeros((1, 64)))
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr, "momentum": 0.9},
                        kvstore=kv, update_on_kvstore=False)
init_trainer_kvstore(mx, trainer, kv)          # MXNet 1.9.1's own lazy init races (see its doc)
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
