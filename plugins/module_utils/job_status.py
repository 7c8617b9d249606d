# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""The controller side's one reader of the launcher's ``status.json``.

The launcher (on the master) writes ``<EFS_MOUNT>/status.json`` atomically,
a JSON object with the keys ``state`` (one of ``STATES``), ``pid``,
``updated`` (epoch seconds), ``master``, ``membership``, ``world_size``,
``generation``, ``epoch``, ``step``, ``samples_per_s``, ``last_checkpoint``,
``host_worker_error``, ``resize_at``, ``spares_ready``, ``spares_wanted`` and ``engine``
(``mxnet`` or ``torch``; absent from the status of a launcher older than the engine seam).

Used by the ``dynatrain.elastic.job_info`` module (run on the master, so that
the age of the status is measured with the clock that wrote it) and by the
controller-side tools. Standard library only.
"""

from __future__ import annotations

import json
import os
import time

STATUS_FILE = "status.json"
# The launcher's default checkpoint directory under the shared volume, and the names in it
# (the node side's dynatrain_runtime.checkpoint: ckpt-<step>/ with meta.json written last).
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PREFIX = "ckpt-"
CHECKPOINT_META = "meta.json"
STATES = ("starting", "running", "resizing", "stopped", "finished", "failed")
# States in which the launcher applies host_worker changes.
ACTIVE_STATES = ("starting", "running", "resizing")
# A status written longer ago than this means the launcher is gone or stuck.
STALE_AFTER_S = 60.0


class JobStatusError(ValueError):
    """status.json exists but is not a JSON object; the message says which file."""


def parse_status(text: str, source: str = STATUS_FILE) -> dict:
    """Parse status.json content; an empty text is an empty status."""
    if not text.strip():
        return {}
    try:
        status = json.loads(text)
    except ValueError as exc:
        raise JobStatusError(f"{source} is not valid JSON ({exc})") from None
    if not isinstance(status, dict):
        raise JobStatusError(f"{source} holds a JSON {type(status).__name__}, not an object")
    return status


def read_status(path: str) -> dict:
    """Read and parse status.json; a missing file is an empty status ({})."""
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_status(handle.read(), source=path)
    except FileNotFoundError:
        return {}


def status_path(efs_mount: str) -> str:
    return os.path.join(efs_mount, STATUS_FILE)


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
