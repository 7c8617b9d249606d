"""A job the launcher runs locally (``--transport local``, every "host" a 127.x address): its files on
the shared directory and the processes it started for a host.  One home for the tests
(``tests/unit/runtime``) and the benchmarks (``benchmarks/``), which find it on ``sys.path``.
"""

import os

from dynatrain_runtime.contract import shared_volume       # the volume's one contract (make runtime installs it)


def write_hosts(efs, hosts):
    """``host_worker`` with these hosts (the last one the master), written as the host_worker module does."""
    files = shared_volume.JobFiles(str(efs))
    with shared_volume.locked(files.host_worker):
        shared_volume.write_hosts(files.host_worker, hosts)


def log_lines(efs):
    """``host_worker_log``'s lines, split in words ([] before there is one; a malformed line as it is)."""
    try:
        with open(shared_volume.JobFiles(str(efs)).log) as handle:
            return [line.split() for line in handle if line.strip()]
    except OSError:
        return []


def events(efs):
    """``events.jsonl``'s records ([] before there is one; a line still being written is left out)."""
    return shared_volume.read_events(shared_volume.JobFiles(str(efs)).events)[0]


def host_pids(efs, host, command_has=None):
    """PIDs the job on ``efs`` (None: any job) started for ``host``: its child wrappers (``--env
    DT_WORKER_IP=host`` on their command line), workers and spares (in their environment); a lost host
    loses them all.  With ``command_has`` (bytes): only the processes, not wrappers, whose command line
    holds it (e.g. ``b"train_digits"``: the training processes, not the parameter servers)."""
    want = [("DT_WORKER_IP=%s" % host).encode()]
    if efs is not None:
        want.append(("EFS_MOUNT=%s" % os.path.abspath(str(efs))).encode())
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as handle:
                env = handle.read().split(b"\0")
            with open("/proc/%s/cmdline" % name, "rb") as handle:
                cmd = handle.read().split(b"\0")
        except OSError:
            continue
        wrapper = b"child" in cmd
        if command_has is not None and (wrapper or not any(command_has in part for part in cmd)):
            continue
        if all(w in env for w in want) or (wrapper and all(w in cmd for w in want)):
            out.append(int(name))
    return out
