"""The in-place mode's guarded exchange (dynatrain_runtime.engines.torch_inplace.guard_backward, armed by the stable
model's set_target): DDP's own gradient average (no comm hook), and a backward pass whose peer was killed sets the
lost flag instead of raising in the script; the rest of the step runs on the bare module; a script's own error in
backward still raises.  Two real processes in a gloo group on 127.0.0.1."""
from __future__ import annotations

import json
import os
import socket
import subprocess

PROGRAM = r"""
import datetime, json, os, signal, sys
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from dynatrain_runtime.engines.torch_inplace import LostFlag, make_stable

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
module = nn.Linear(8, 2)
stable, lost = make_stable(module), LostFlag()
stable.set_target(DistributedDataParallel(module), lost)   # arms the backward guard with it
x = torch.full((4, 8), rank + 1.0)          # each rank's own input: the average differs from either
out = {"first_grad": None}
for step in range(10000):
    if rank == 1 and step == 20:
        os.kill(os.getpid(), signal.SIGKILL)
    module.zero_grad()
    stable(x).sum().backward()
    if out["first_grad"] is None:
        out["first_grad"] = sorted(set(module.weight.grad.reshape(-1).tolist()))
    if lost.is_set():
        break
out["lost_at"] = step
out["error"] = type(lost.error).__name__
stable(x).sum().backward()                  # the rest of the step: the bare module, no exchange
out["local_after"] = True
try:
    (torch.ones(2, requires_grad=True) * 2).backward()   # the script's own error: not a lost peer
    out["own_error"] = None
except RuntimeError as exc:
    out["own_error"] = str(exc)[:80]
print(json.dumps(out), flush=True)
os._exit(0)                                 # the broken group's teardown is not this test's
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_killed_peer_sets_the_flag_instead_of_raising_and_the_average_is_ddps(torch_python, tmp_path):
    prog = tmp_path / "guard.py"
    prog.write_text(PROGRAM)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([torch_python, str(prog)], env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        out0, err0 = procs[0].communicate(timeout=240)
        procs[1].communicate(timeout=60)
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 0, err0[-2000:]
    assert procs[1].returncode == -9                       # killed, as planned
    res = json.loads(out0.strip().splitlines()[-1])
    # d(sum of outputs)/dW = the batch's sum of x: 4 x 1.0 on rank 0, 4 x 2.0 on rank 1 -> DDP's mean 6.0
    assert res["first_grad"] == [6.0], res
    assert res["lost_at"] in (20, 21), res                 # seen in the step the peer died in (or the next)
    assert res["error"] == "RuntimeError" or res["error"].startswith("Dist"), res
    assert res["local_after"] is True
    assert res["own_error"] and "scalar" in res["own_error"], res
