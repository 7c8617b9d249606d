# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""What the controller decides from the launcher's ``status.json``: is the job running, finished,
how old is its status and its last checkpoint.

The file, its keys and its reader have their home in ``shared_volume`` (``STATES``,
``parse_status``, ``read_status``): ``state``, ``pid``, ``updated`` (epoch seconds), ``master``,
``membership``, ``world_size``, ``generation``, ``epoch``, ``step``, ``samples_per_s``,
``last_checkpoint``, ``host_worker_error``, ``resize_at``, ``spares_ready``, ``spares_wanted`` and
``engine`` (``mxnet`` or ``torch``; absent from the status of a launcher older than the engine seam).

Used by the ``dynatrain.elastic.job_info`` module (run on the master, so that
the age of the status is measured with the clock that wrote it) and by the
controller-side tools. Standard library only.
"""

from __future__ import annotations

import os
import time

from ansible_collections.dynatrain.elastic.plugins.module_utils.shared_volume import (
    ACTIVE_STATES,
    CHECKPOINT_DIR,
    CHECKPOINT_META,
    CHECKPOINT_PREFIX,
    STALE_AFTER_S,
)


def status_age(status: dict, now: float | None = None) -> float | None:
    """Seconds since the launcher last wrote the status, or None when it never said."""
    try:
        updated = float(status["updated"])
    except (KeyError, TypeError, ValueError):
        return None
    return round((time.time() if now is None else now) - updated, 1)


def is_running(status: dict, now: float | None = None, stale_after: float = STALE_AFTER_S) -> bool:
    """True when the launcher is in an active state and wrote its status recently."""
    age = status_age(status, now)
    return status.get("state") in ACTIVE_STATES and age is not None and age < stale_after


def job_engine(status: dict) -> str | None:
    """The job's training engine (``mxnet`` / ``torch``) as the launcher wrote it, or None when it did not say."""
    engine = status.get("engine")
    return engine if isinstance(engine, str) and engine else None


def is_finished(status: dict) -> bool:
    return status.get("state") == "finished"


def summarize(status: dict, now: float | None = None, stale_after: float = STALE_AFTER_S) -> dict:
    """The facts the playbooks decide on: state, age_s, running, finished."""
    return {
        "state": status.get("state"),
        "age_s": status_age(status, now),
        "running": is_running(status, now, stale_after),
        "finished": is_finished(status),
    }


def latest_checkpoint(status: dict, efs_mount: str) -> str | None:
    """The newest committed checkpoint: the launcher's ``last_checkpoint``, else the newest
    ``ckpt-*`` under ``<efs_mount>/checkpoints`` (a generation that has not written one yet)."""
    path = status.get("last_checkpoint")
    if isinstance(path, str) and path:
        return path
    directory = os.path.join(efs_mount, CHECKPOINT_DIR)
    try:
        names = [n for n in os.listdir(directory) if n.startswith(CHECKPOINT_PREFIX)]
    except OSError:
        return None
    steps = []
    for name in names:
        try:
            steps.append((int(name[len(CHECKPOINT_PREFIX):]), name))
        except ValueError:
            continue
    return os.path.join(directory, max(steps)[1]) if steps else None


def checkpoint_age(path: str | None, now: float | None = None) -> float | None:
    """Seconds since the checkpoint at ``path`` was committed (its meta.json is written last), or None."""
    if not path:
        return None
    try:
        committed = os.stat(os.path.join(path, CHECKPOINT_META)).st_mtime
    except OSError:
        return None
    return round((time.time() if now is None else now) - committed, 1)
