"""The environment a torch generation's workers get: torchrun's, so a script written for torchrun runs.

``procs`` processes per node (``--procs-per-node``: one per usable GPU, ``auto``; one on a CPU node):
the launcher keeps one process *per host* (the child wrapper, which membership, failure detection,
drain, stop and recovery know) and gives it the node's part of the environment -- ``GROUP_RANK`` (the
node's rank), ``RANK`` of its local rank 0 (``GROUP_RANK * procs``), ``WORLD_SIZE`` (nodes x procs),
``LOCAL_WORLD_SIZE`` = procs; the wrapper starts ``procs`` copies of the script and gives each its own
``LOCAL_RANK`` and ``RANK`` (``local_env``), as torchrun does.  The master's local rank 0 is ``RANK``
0, so the generation's TCPStore (``torch.distributed``'s rendezvous, ``MASTER_ADDR:MASTER_PORT``, a
fresh port every generation) lives on the node that never leaves; the others follow in membership
order.  No scheduler or server processes: the workers connect among themselves.  Pure Python (but
``node_gpus``, which asks ``nvidia-smi``).
"""

from __future__ import annotations

import os
import subprocess

from ..engines import devices

AUTO = "auto"


def torch_ranks(membership, master):
    """``{host: node rank}``: the master 0, then the other members in ``host_worker`` order."""
    order = ([master] if master in membership else []) + [h for h in membership if h != master]
    return {host: rank for rank, host in enumerate(order)}


def torch_worker_env(membership, master, port, generation, procs=1):
    """``{host: env}`` of one generation: torchrun's variables (plus its TORCHELASTIC_* ones) of each
    node's local rank 0; the wrapper derives its other local processes' with ``local_env``."""
    ranks = torch_ranks(membership, master)
    procs = int(procs)
    nodes, world = str(len(membership)), str(len(membership) * procs)
    addr = master if master in membership else min(ranks, key=ranks.get)
    out = {}
    for host, node_rank in ranks.items():
        rank = str(node_rank * procs)
        out[host] = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(procs),
                     "GROUP_RANK": str(node_rank), "GROUP_WORLD_SIZE": nodes, "ROLE_RANK": rank,
                     "ROLE_WORLD_SIZE": world, "ROLE_NAME": "default", "MASTER_ADDR": addr,
                     "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "dynatrain",
                     "TORCHELASTIC_RESTART_COUNT": str(max(0, int(generation) - 1)),
                     "TORCHELASTIC_MAX_RESTARTS": "0", "DT_WORKER_IP": host}
    return out


def local_env(env, local_rank, procs=None):
    """The environment of local process ``local_rank`` of a node from its node's (``torch_worker_env``):
    ``LOCAL_RANK``, and ``RANK`` = ``ROLE_RANK`` = ``GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``.
    An environment without ``RANK`` (a pre-started process, before its assignment) gets the local
    rank and size only.  ``procs`` sets ``LOCAL_WORLD_SIZE`` where the environment lacks it."""
    out = dict(env)
    size = int(out.get("LOCAL_WORLD_SIZE") or procs or 1)
    out["LOCAL_RANK"], out["LOCAL_WORLD_SIZE"] = str(local_rank), str(size)
    if "RANK" in out:
        group = int(out["GROUP_RANK"]) if "GROUP_RANK" in out else int(out["RANK"]) // size
        out["RANK"] = out["ROLE_RANK"] = str(group * size + int(local_rank))
    return out


def node_gpus(environ=None, run=subprocess.run):
    """The GPUs a torch worker of this node may use: ``nvidia-smi -L``'s count (0 without it), at most
    ``CUDA_VISIBLE_DEVICES``' and ``DEEPLEARNING_WORKER_GPU_COUNT`` (``devices``: the node's limit)."""
    environ = os.environ if environ is None else environ
    try:
        out = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
        found = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0
    except (OSError, subprocess.SubprocessError):
        found = 0
    return len(devices.plan_devices(found, devices.gpu_limit(environ), devices.visible_gpus(environ)))


def procs_per_node(setting, engine, gpus=None):
    """Processes per node: MXNet always 1 (its worker uses every GPU of the node); torch, ``setting``
    (a count), or for ``auto`` one per usable GPU (``gpus``, else ``node_gpus()``: the launcher's node,
    the cluster's nodes being alike), 1 on a CPU node."""
    if engine != "torch":
        return 1
    if str(setting) != AUTO:
        return max(1, int(setting))
    return max(1, node_gpus() if gpus is None else int(gpus))
