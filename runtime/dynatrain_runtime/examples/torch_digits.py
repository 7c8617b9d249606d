"""The digits example with the torch engine (``dt-train-digits --engine torch``): the same nets, data,
global batch, flags and accuracy bar as ``mxnet_digits`` (both on ``digits_common``), with the helper API::

    el = Elastic(..., engine="torch")
    model, opt = el.wrap(model, opt)          # el.device; DistributedDataParallel when world > 1
    for batch in el.batches():
        ...
        batch.weighted_loss(per_sample).backward()
        opt.step()
        batch.report(loss=..., correct=...)
    sys.exit(el.finish())

Under the launcher (``--engine torch``) every worker gets torchrun's environment; under plain
``torchrun`` the same script trains too (without elasticity); alone it trains as a world of one.
"""
from __future__ import annotations

from dynatrain_runtime.examples.digits_common import (MODELS, epoch_reporter, make_elastic, say_start,
                                                      simulate_compute, write_final)


def build_torch_net(model="mlp", hidden=128, inputs=64):
    """The torch twin of ``mxnet_digits.build_net``: ``mlp`` 64 -> hidden -> 10, or ``conv`` (two 3x3
    convolutions on the 8x8 image, 2x2 max pooling, hidden -> 10)."""
    from torch import nn
    if model == "mlp":
        return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    if model == "conv":
        return nn.Sequential(nn.Unflatten(1, (1, 8, 8)),
                             nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(64 * 4 * 4, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    raise ValueError(f"unknown model {model!r} (one of {', '.join(MODELS)})")


def train_torch(args, x_train, y_train, x_val, y_val):
    """Train with the torch engine; the exit status of ``el.finish()``."""
    import torch
    import torch.nn.functional as F

    el = make_elastic(args, len(x_train), engine="torch")
    torch.manual_seed(args.seed)
    model = build_torch_net(args.model, args.hidden, x_train.shape[1])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    model, opt = el.wrap(model, opt)
    dev = el.device
    xs, ys = torch.from_numpy(x_train).to(dev), torch.from_numpy(y_train.astype("int64")).to(dev)
    xv, yv = torch.from_numpy(x_val).to(dev), torch.from_numpy(y_val.astype("int64")).to(dev)

    def val_accuracy():
        net = el.module                       # the bare model: one worker evaluates, DDP stays out of it
        with torch.no_grad():
            net.eval()
            acc = float((net(xv).argmax(dim=1) == yv).float().mean())
            net.train()
        return acc

    el.on_epoch_end(epoch_reporter(el, args, val_accuracy))
    say_start(el, len(x_train), len(x_val), str(dev))
    for batch in el.batches():
        # weights: 1 per sample of the share, 0 for a placeholder (no sample for us: take part, add nothing)
        idx = torch.as_tensor(batch.indices, device=dev)
        x, y = xs[idx], ys[idx]
        out = model(x)
        per_sample = F.cross_entropy(out, y, reduction="none")
        opt.zero_grad(set_to_none=True)
        batch.weighted_loss(per_sample).backward()    # DDP's average of it: the mean over the global batch
        opt.step()
        if not batch.placeholder:                 # tensors: summed on the device, no per-step sync
            batch.report(loss=per_sample.detach().sum(), correct=(out.argmax(dim=1) == y).sum())
        simulate_compute(args, batch)
    write_final(el, args, val_accuracy, len(x_train), len(x_val))
    return el.finish()
