"""The environment a torch generation's workers get: torchrun's, so a script written for torchrun runs.

One process per node (``LOCAL_RANK`` 0, ``LOCAL_WORLD_SIZE`` 1); ``RANK`` 0 is the master, so the
generation's TCPStore (``torch.distributed``'s rendezvous, ``MASTER_ADDR:MASTER_PORT``, a fresh port
every generation) lives on the node that never leaves; the others follow in membership order.
No scheduler or server processes: the workers connect among themselves.  Pure Python.
"""

from __future__ import annotations

import socket


def free_port(port_base, generation, tries=50):
    """The generation's rendezvous port: ``port_base + generation % 500``, or the next free one after it.

    The TCPStore binds every address of the master (where the launcher runs); a port another job
    listens on would fail the whole generation's start, so it is skipped (a TIME_WAIT one is fine).
    """
    for k in range(tries):
        port = port_base + (int(generation) + k) % 500
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("", port))
            except OSError:
                continue
        return port
    return port_base + int(generation) % 500


def torch_ranks(membership, master):
    """``{host: rank}``: the master 0, then the other members in ``host_worker`` order."""
    order = ([master] if master in membership else []) + [h for h in membership if h != master]
    return {host: rank for rank, host in enumerate(order)}


def torch_worker_env(membership, master, port, generation):
    """``{host: env}`` of one generation: torchrun's variables (plus its TORCHELASTIC_* ones)."""
    ranks = torch_ranks(membership, master)
    world = str(len(membership))
    addr = master if master in membership else min(ranks, key=ranks.get)
    out = {}
    for host, rank in ranks.items():
        out[host] = {"RANK": str(rank), "WORLD_SIZE": world, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                     "GROUP_RANK": str(rank), "GROUP_WORLD_SIZE": world, "ROLE_RANK": str(rank),
                     "ROLE_WORLD_SIZE": world, "ROLE_NAME": "default", "MASTER_ADDR": addr,
                     "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "dynatrain",
                     "TORCHELASTIC_RESTART_COUNT": str(max(0, int(generation) - 1)),
                     "TORCHELASTIC_MAX_RESTARTS": "0", "DT_WORKER_IP": host}
    return out
