"""How the launcher starts a process on a host: locally, or over ssh with the pinned host keys."""

from __future__ import annotations

import json
import os
import shlex

CHILD = ["-m", "dynatrain_runtime.launcher", "child"]
SECRET_NAMES_VAR = "DT_TRAIN_ENV_NAMES"     # train.env names the job's secrets (names only)


def secret_env(environ=None):
    """``{name: value}`` of the job's secrets (``dt_train_env``) in the launcher's environment.

    systemd gives them to the launcher from the root-owned ``train.env`` (``EnvironmentFile=``),
    with ``DT_TRAIN_ENV_NAMES`` naming them; a local process inherits them, a remote one gets
    them on its stdin (``stdin_head``), never on a command line.
    """
    environ = os.environ if environ is None else environ
    names = environ.get(SECRET_NAMES_VAR, "").split()
    return {name: environ[name] for name in names if name in environ}


class Transport:
    """Builds the command line that runs ``argv`` on ``host`` under the child wrapper.

    The wrapper and ``argv`` run with ``python`` (the node venv, the same path on every
    node).  ``ssh`` never skips host-key checking: the cluster's own key and known_hosts.
    """

    def __init__(self, kind, python, ssh_user="admin", ssh_key="~/.ssh/dynatrain_cluster",
                 known_hosts="~/.ssh/known_hosts_dynatrain", connect_timeout=10, local_ips=(), secrets=None):
        self.kind = kind
        self.secrets = dict(secrets or {})
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

    def command(self, host, argv, env, alive=0.0, procs=1):
        """The command line; public settings only (a remote process's secrets: ``stdin_head``).
        ``alive``: the wrapper says "alive" for the process every this many s (one that cannot);
        ``procs`` > 1: the wrapper runs that many copies, one per local rank (torch, one per GPU)."""
        wrapper = [self.python] + CHILD + (["--alive", str(alive)] if alive else [])
        if procs > 1:
            wrapper += ["--procs", str(procs)]
        for key in sorted(env):
            wrapper += ["--env", f"{key}={env[key]}"]
        if self.stdin_head(host):
            wrapper += ["--env-stdin"]
        wrapper += ["--"] + list(argv)
        if self.is_local(host):
            return wrapper
        return self.ssh_base(host) + ["--", " ".join(shlex.quote(x) for x in wrapper)]

    def stdin_head(self, host):
        """The first line a process on ``host`` reads (``--env-stdin``): its secrets, or ``b""``.

        A local process inherits them from the launcher's environment, so it gets none here.
        """
        if not self.secrets or self.is_local(host):
            return b""
        return (json.dumps(self.secrets, sort_keys=True) + "\n").encode()


def script_argv(script):
    """How the node Python runs the training script: a file path, or ``-m module`` for a dotted name."""
    if os.sep in script or script.endswith(".py"):
        return [script]
    return ["-m", script]


def worker_argv(config):
    """A worker's command line: the node Python running the training script with its arguments."""
    return [config.python] + script_argv(config.script) + list(config.script_args)
