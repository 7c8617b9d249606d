"""The digits MLP as a torchft 0.2.0 user writes it: one replica group per host, healed from live peers.

The shape of torchft's own ``train_ddp.py``: a ``Manager`` (``ProcessGroupGloo``, ``min_replica_size=1``,
the default HTTP checkpoint transport, ``load_state_dict``/``state_dict`` callbacks), then the model wrapped
in ``torchft.DistributedDataParallel`` and the optimizer in ``torchft.Optimizer`` (``zero_grad`` starts the
quorum, ``step`` commits only when ``should_commit()``).  One process per replica group (group world size 1,
its own TCPStore on the group's 127.0.0.x address).  The model is the project's digits MLP 64 -> H -> 10
with SGD momentum, 32 samples per group and step, a sleep per step.

Run by ``bench_resize.py --systems torchft`` with ``benchmarks/.venv-torchft/bin/python`` (torch==2.13.0,
torchft==0.2.0); it imports nothing of dynatrain.  A SIGTERM is a graceful leave (torchft has no leave API:
finish the step, ``manager.shutdown()``, exit 0).  Measurement only: one JSON line per start, per step and
per state copy received is appended to ``--timeline`` (the copy is timed around the transport's
``recv_checkpoint``, which is left as it is).
"""
import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta

import numpy as np
import torch
from torch import nn
from torch.distributed import TCPStore

from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo


class Timeline(object):
    """One appended line per record (O_APPEND: whole lines, every group into one file)."""

    def __init__(self, path, group):
        self.fd, self.group = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), group

    def write(self, **rec):
        rec.update(group=self.group, t=rec.get("t", time.time()))
        os.write(self.fd, (json.dumps(rec) + "\n").encode())


def timed_recv(transport, timeline, nbytes):
    """Wrap ``recv_checkpoint`` to log how long the copy from the peer took (the only instrumentation)."""
    inner = transport.recv_checkpoint

    def recv(*args, **kwargs):
        t0 = time.time()
        out = inner(*args, **kwargs)
        timeline.write(event="healed", t0=t0, seconds=time.time() - t0, bytes=nbytes)
        return out
    transport.recv_checkpoint = recv


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--group", type=int, required=True)
    ap.add_argument("--addr", required=True, help="this group's 127.0.0.x address")
    ap.add_argument("--store-port", type=int, required=True)
    ap.add_argument("--lighthouse", required=True, help="http://127.0.0.1:PORT")
    ap.add_argument("--data", required=True, help="the example's digits .npz")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=10.0, help="Manager and gloo timeouts, s")
    ap.add_argument("--timeline", required=True)
    args = ap.parse_args(argv)
    timeline = Timeline(args.timeline, args.group)
    timeline.write(event="start", pid=os.getpid())
    stop = []
    signal.signal(signal.SIGTERM, lambda *_a: stop.append(1))

    with np.load(args.data) as d:
        x, y = torch.from_numpy(d["x"].astype("float32")), torch.from_numpy(d["y"].astype("int64"))
    store = TCPStore(args.addr, args.store_port, 1, True, wait_for_workers=False)  # the group's own store
    torch.manual_seed(42)
    net = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    inner_opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

    def load_state_dict(state):
        net.load_state_dict(state["model"])
        inner_opt.load_state_dict(state["optim"])

    def state_dict():
        return {"model": net.state_dict(), "optim": inner_opt.state_dict()}

    timeout = timedelta(seconds=args.timeout)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id="digits_%d" % args.group, timeout=timeout,
                      store_addr=args.addr, store_port=args.store_port, rank=0, world_size=1,
                      lighthouse_addr=args.lighthouse, hostname=args.addr)
    nbytes = 8 * sum(p.numel() for p in net.parameters())            # parameters + momentum, fp32
    timed_recv(manager._checkpoint_transport, timeline, nbytes)     # pylint: disable=protected-access
    model = DistributedDataParallel(manager, net)
    optimizer = Optimizer(manager, inner_opt)
    loss_fn = nn.CrossEntropyLoss()
    timeline.write(event="ready")
    gen = np.random.RandomState(args.group)
    while not stop:
        optimizer.zero_grad()                                      # starts the quorum
        idx = torch.from_numpy(gen.randint(0, len(x), 32))       # asking the quorum's size here would block on it
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()                                           # commits only if should_commit()
        timeline.write(step=manager.current_step(), participants=manager.num_participants())
        if args.step_sleep:
            time.sleep(args.step_sleep)
    manager.shutdown(wait=False)
    timeline.write(event="left")
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
