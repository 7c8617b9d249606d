"""The digits example with the MXNet engine (``dt-train-digits``, the default ``--engine mxnet``): Gluon,
kvstore dist_sync under the launcher (one process per worker host), the local kvstore alone (one worker),
on the node's devices (``el.ctx``: every GPU of the node, else the CPU): each worker's share of a step is
split across them (``gluon.utils.split_and_load``).  MXNet is imported when training starts.
"""
from __future__ import annotations

import numpy as np

from dynatrain_runtime.examples.digits_common import (MODELS, epoch_reporter, make_elastic, say_start,
                                                      simulate_compute, write_final)


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


def train_mxnet(args, x_train, y_train, x_val, y_val):
    """Train with the MXNet engine; the exit status of ``el.finish()``."""
    # MXNet is imported before the launcher assigns this (possibly pre-warmed) process its role.
    import mxnet as mx
    from mxnet import gluon, nd

    el = make_elastic(args, len(x_train), kvstore=args.kvstore, engine="mxnet")
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
