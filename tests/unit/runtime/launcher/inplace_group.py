"""The 3-process gloo group of test_inplace's peer-transfer scripts (inplace_peer.py, inplace_overlap_peer.py):
ranks 0 and 1 hold a trained model and optimizer (momentum) at step ``STEP``, rank 2 (a joiner) a differently
initialised one."""
import datetime
import os
import sys
import time
import types
import zlib

import torch
import torch.distributed as dist

from dynatrain_runtime.engines.torch import HostBuffers
from dynatrain_runtime.engines.torch_inplace import tensors_of

WORLD, STEP = 3, 7
HEADER = {"step": STEP, "epoch": 1, "pos": 64}


def join(rank, port):
    """Form the group; returns this member's engine (``module``, ``optimizer``, ``dist``, ...)."""
    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0 if rank < 2 else 99)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if rank < 2:                                     # the holders' state: after two identical steps
        torch.manual_seed(1)
        for _step in range(2):
            opt.zero_grad()
            model(torch.randn(8, 64)).sum().backward()
            opt.step()
    return types.SimpleNamespace(dist=dist, rank=rank, world=WORLD, module=model, optimizer=opt, backend="gloo",
                                 device=torch.device("cpu"), store=store, _host=HostBuffers())


def leave(engine):
    """End this member once every member is done, skipping the C++ teardown: now and then gloo's or the store's
    threads aborted a member at exit ("terminate called without an active exception", SIGABRT) after it had
    printed its result; what these scripts check is the transfer, not torch's teardown. Rank 0 hosts the store:
    it goes last, so that no member's store client loses its server."""
    sys.stdout.flush()
    engine.dist.barrier()
    if engine.rank:
        engine.store.add("left", 1)
    else:
        deadline = time.monotonic() + 30
        while engine.store.add("left", 0) < WORLD - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    os._exit(0)


def digest(engine):
    """adler32 over the model's and the optimizer's tensors, and how many there are."""
    value, tensors = 0, tensors_of(engine.module, engine.optimizer)[1]
    for t in tensors:
        value = zlib.adler32(t.detach().contiguous().view(-1).view(torch.uint8).numpy(), value)
    return value, len(tensors)
