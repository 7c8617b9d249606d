"""One member of a 3-process gloo group for test_inplace's overlapped transfer: ranks 0 and 1 hold a trained model
and optimizer (momentum), rank 2 (a joiner) a differently initialised one.  The state moves behind the first step
at world 3 (``InPlaceWorker``'s hook on the optimizer step), in which the joiner takes a placeholder batch.
``argv[3]`` "0": this rank asks for no overlap (every rank must then take the synchronous path).
Prints one JSON line: the stats, the global step's shares, and digests of the state before and after the step."""
import copy
import json
import sys
import types

import torch
from torch.nn.parallel import DistributedDataParallel

from dynatrain_runtime.engines.torch import TorchEngine
from dynatrain_runtime.engines.torch_inplace import settle
from dynatrain_runtime.script.data import plan_step
from dynatrain_runtime.script.inplace import InPlaceWorker
from inplace_group import HEADER, STEP, WORLD, digest, join, leave

rank, port, want = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] != "0"
BATCH = 12
engine = join(rank, port)
model, opt = engine.module, engine.optimizer
boundary = copy.deepcopy(model)                # a holder's boundary model (the joiner's: its own): the mean's reference
boundary.zero_grad(set_to_none=True)
worker = InPlaceWorker(types.SimpleNamespace(engine=engine), peer_wait=5)
meta, stats, healing = settle(engine, STEP if rank < 2 else -1, lambda: HEADER, overlap=want)
worker._heal(healing)                            # pylint: disable=protected-access
script_hook = []                                 # a hook the script registers after el.wrap (gradient clipping, EMA)
opt.register_step_pre_hook(lambda _opt, _args, _kwargs: script_hook.append(1))
ddp = DistributedDataParallel(model, init_sync=False)
# the first step at world 3: the same data everywhere, each rank's share of it by the plan
torch.manual_seed(5)
x, y = torch.randn(BATCH, 64), torch.randint(0, 10, (BATCH,))
healing_ranks = worker.healing_ranks(STEP)
indices, weights, global_size = plan_step(list(range(BATCH)), 0, WORLD, rank, BATCH, healing_ranks)
opt.param_groups[0]["lr"] = 0.05                 # this step's LR (set_lr): the joiner keeps it over the loaded one
opt.zero_grad()
per_sample = torch.nn.functional.cross_entropy(ddp(x[indices]), y[indices], reduction="none")
TorchEngine.weighted_loss(per_sample, weights, TorchEngine.grad_scale(WORLD, global_size)).backward()
before = digest(engine)[0]                       # the joiner: still its own state (loaded in the step's hook)
grads = [p.grad.clone() for p in model.parameters()]
opt.step()
done = worker.after_step()
after = digest(engine)[0]
opt.step()                                       # the next step: the transfer's hook is gone, the script's stays
# the averaged gradient is the mean over the global batch: as one process computing it over all 12 samples
torch.nn.functional.cross_entropy(boundary(x), y).backward()
mean_ok = all(float((g - r.grad).norm() / r.grad.norm()) < 1e-5 for g, r in zip(grads, boundary.parameters()))
print(json.dumps({"mean_ok": mean_ok, "rank": rank, "meta": meta, "stats": done.get("transfer", stats), "before": before,
                  "after": after, "indices": indices, "weights": weights, "global_size": global_size,
                  "healing": sorted(healing_ranks), "lr": opt.param_groups[0]["lr"],
                  "script_hook": len(script_hook),
                  "hooks": len(opt._optimizer_step_pre_hooks)}),  # pylint: disable=protected-access
      flush=True)
leave(engine)
