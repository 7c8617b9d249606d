"""Which devices a worker trains on: all GPUs of its node, or the CPU.

The count comes from MXNet (``mx.context.num_gpus()``, which already honours
``CUDA_VISIBLE_DEVICES``), capped by ``DEEPLEARNING_WORKER_GPU_COUNT`` (DL-CFN's
setting: the GPUs a worker may use). A worker the launcher starts over a
non-login SSH session does not source ``/etc/profile.d/deeplearning.sh``, so
when the variable is not in the environment it is read from that file (the
node's own value; ``DT_NODE_ENV_FILE`` moves it). Standard library only at
import time; the choice is a pure function (``plan_devices``), unit-tested
without MXNet or GPUs.  Read by both engines (MXNet's ``contexts``, torch's
``pick_device``) and by the launcher (``launcher.torchenv``: a node's GPUs).
"""

from __future__ import annotations

import os
import re

GPU_COUNT_VAR = "DEEPLEARNING_WORKER_GPU_COUNT"
NODE_ENV_FILE = "/etc/profile.d/deeplearning.sh"
_EXPORT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=['\"]?([^'\"\s]*)['\"]?\s*$")


def read_env_file(path):
    """``KEY=VALUE`` / ``export KEY=VALUE`` lines of a shell env file -> dict ({} when unreadable)."""
    values = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                m = _EXPORT.match(line)
                if m:
                    values[m.group(1)] = m.group(2)
    except OSError:
        pass
    return values


def gpu_limit(environ=None):
    """The node's DEEPLEARNING_WORKER_GPU_COUNT (environment, else the node env file), or None when unset/invalid."""
    environ = os.environ if environ is None else environ
    raw = environ.get(GPU_COUNT_VAR)
    if raw is None:
        raw = read_env_file(environ.get("DT_NODE_ENV_FILE", NODE_ENV_FILE)).get(GPU_COUNT_VAR)
    try:
        return max(0, int(str(raw).strip())) if raw not in (None, "") else None
    except ValueError:
        return None


def visible_gpus(environ=None):
    """The number of devices CUDA_VISIBLE_DEVICES names (None: not set, all are visible)."""
    environ = os.environ if environ is None else environ
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    ids = [x for x in raw.split(",") if x.strip()]
    # CUDA stops at the first invalid entry (e.g. "-1" hides every device)
    count = 0
    for x in ids:
        if x.strip().lstrip("-").isdigit() and int(x) < 0:
            break
        count += 1
    return count


def plan_devices(available, limit=None, visible=None):
    """GPU ids to use: all ``available`` (already limited by CUDA to the visible ones), at most ``limit``.

    ``[]`` means train on the CPU (no GPU, or a limit of 0).
    """
    n = max(0, int(available or 0))
    if visible is not None:
        n = min(n, visible)
    if limit is not None:
        n = min(n, limit)
    return list(range(n))


def num_gpus(mx):
    """GPUs MXNet can see (0 for a CPU build, or when the driver does not answer)."""
    try:
        return int(mx.context.num_gpus())
    except Exception:  # a CPU build raises on CUDA calls; no driver: CUDA error  # pylint: disable=broad-except
        return 0


def contexts(mx, environ=None):
    """The MXNet contexts of this worker: ``[mx.gpu(0), ...]``, or ``[mx.cpu()]``."""
    ids = plan_devices(num_gpus(mx), gpu_limit(environ), visible_gpus(environ))
    return [mx.gpu(i) for i in ids] or [mx.cpu()]


def describe(ctx):
    """``gpu(0),gpu(1)`` / ``cpu(0)`` for logs."""
    return ",".join(str(c) for c in ctx)
