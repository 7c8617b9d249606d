"""How the launcher starts a process on a host: locally, or over ssh with the pinned host keys."""

from __future__ import annotations

import os
import shlex

CHILD = ["-m", "dynatrain_runtime.launcher", "child"]


class Transport:
    """Builds the command line that runs ``argv`` on ``host`` under the child wrapper.

    The wrapper and ``argv`` run with ``python`` (the node venv, the same path on every
    node).  ``ssh`` never skips host-key checking: the cluster's own key and known_hosts.
    """

    def __init__(self, kind, python, ssh_user="admin", ssh_key="~/.ssh/dynatrain_cluster",
                 known_hosts="~/.ssh/known_hosts_dynatrain", connect_timeout=10, local_ips=()):
        self.kind = kind
        self.python = python
        self.ssh_user, self.ssh_key, self.known_hosts = ssh_user, ssh_key, known_hosts
        self.connect_timeout = connect_timeout
        self.local_ips = set(local_ips)
        self.master = None

    def is_local(self, host):
        return self.kind == "local" or host == self.master or host in self.local_ips

    def ssh_base(self, host):
        return ["ssh", "-i", os.path.expanduser(self.ssh_key),
                "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={os.path.expanduser(self.known_hosts)}",
                "-o", "BatchMode=yes", "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3",
                "-o", f"ConnectTimeout={self.connect_timeout}",
                f"{self.ssh_user}@{host}"]

    def command(self, host, argv, env):
        wrapper = [self.python] + CHILD
        for key in sorted(env):
            wrapper += ["--env", f"{key}={env[key]}"]
        wrapper += ["--"] + list(argv)
        if self.is_local(host):
            return wrapper
        return self.ssh_base(host) + ["--", " ".join(shlex.quote(x) for x in wrapper)]
