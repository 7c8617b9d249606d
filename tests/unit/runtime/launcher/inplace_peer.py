"""One member of a 3-process gloo group for test_inplace's peer transfer: ranks 0 and 1 hold a trained model
and optimizer (momentum), rank 2 (a joiner) holds a differently initialised one and receives the state.
Prints one JSON line: the stats and a digest of the state after the transfer."""
import datetime
import json
import sys
import types
import zlib

import torch
import torch.distributed as dist

from dynatrain_runtime.engines.torch_inplace import settle, tensors_of

rank, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, 3, rank == 0, timeout=datetime.timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=3, timeout=datetime.timedelta(seconds=60))
torch.manual_seed(0 if rank < 2 else 99)
model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
if rank < 2:                                     # the holders' state: after two identical steps
    torch.manual_seed(1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
engine = types.SimpleNamespace(dist=dist, rank=rank, world=3, module=model, optimizer=opt, backend="gloo",
                               device=torch.device("cpu"))
meta, stats, _healing = settle(engine, 7 if rank < 2 else -1, lambda: {"step": 7, "epoch": 1, "pos": 64})
_layout, tensors = tensors_of(model, opt)
digest = 0
for t in tensors:
    digest = zlib.adler32(t.detach().contiguous().view(-1).view(torch.uint8).numpy(), digest)
print(json.dumps({"rank": rank, "meta": meta, "stats": stats, "digest": digest, "tensors": len(tensors)}),
      flush=True)
dist.destroy_process_group()
