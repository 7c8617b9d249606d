"""The launcher's settings: one frozen, typed record built once from the parsed command line.

The loop and the launch strategies read this, never the argparse namespace: a setting has one name
and one type here, and nothing changes it while the launcher runs.  ``procs`` is the one derived
field (``--procs-per-node auto`` resolved on this node, which the cluster's nodes are alike to).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple, Union

from .torchenv import procs_per_node


@dataclass(frozen=True)
class LauncherConfig:       # pylint: disable=too-many-instance-attributes  # one field per option
    script: str
    efs_mount: str = "/myEFSvolume"
    python: str = "python3"
    engine: str = "mxnet"
    procs_per_node: Union[int, str] = "auto"
    script_api: str = "elastic"
    script_args: Tuple[str, ...] = ()
    # where the processes run
    transport: str = "ssh"
    ssh_user: str = "admin"
    ssh_key: str = "~/.ssh/dynatrain_cluster"
    known_hosts: str = "~/.ssh/known_hosts_dynatrain"
    ssh_connect_timeout: int = 10
    local_ip: Tuple[str, ...] = ()
    master: Optional[str] = None
    port_base: int = 9091
    num_servers: Union[int, str] = 1
    omp_threads: int = 0
    env: Tuple[str, ...] = ()
    # membership changes
    resize_at: str = "step"
    resize_mode: str = "auto"
    regroup_timeout: float = 30.0
    warm_spares: bool = True
    spare_depth: int = 1
    join_warm_timeout: float = 120.0
    # failure detection and recovery
    poll_interval: float = 0.2
    dead_timeout: float = 6.0
    stall_timeout: float = 12.0
    start_timeout: float = 60.0
    timeout_steps: float = 20.0
    stop_timeout: float = 30.0
    recovery: str = "survivor"
    recover_timeout: float = 10.0
    max_restarts: int = 5
    wait_host_worker: float = 300.0
    # the shared volume and the records
    checkpoint_dir: Optional[str] = None
    status_interval: float = 2.0
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    procs: int = 1          # derived: processes per node, ``auto`` resolved (``from_args``)

    @classmethod
    def from_args(cls, args):
        """The config of a parsed command line (``cli.parse_args``); lists become tuples (it is frozen)."""
        values = {}
        for field in dataclasses.fields(cls):
            if field.name == "procs" or not hasattr(args, field.name):
                continue
            value = getattr(args, field.name)
            values[field.name] = tuple(value) if isinstance(value, list) else value
        values["procs"] = procs_per_node(values.get("procs_per_node", "auto"), values.get("engine", "mxnet"))
        return cls(**values)


def as_config(settings):
    """``settings`` as a LauncherConfig: itself, or one built from a parsed command line."""
    return settings if isinstance(settings, LauncherConfig) else LauncherConfig.from_args(settings)
