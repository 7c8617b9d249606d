#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: job_info
short_description: Read the state of an elastic training job from its shared volume
version_added: "0.1.0"
description:
  - Reads, without changing anything, the files the elastic launcher and the
    M(dynatrain.elastic.host_worker) module keep on the shared volume of a
    cluster, and returns them parsed.
  - C(host_worker), the desired membership (one IPv4 address per line, C(#)
    comments and blank lines ignored, the master last).
  - The last entries of C(host_worker_log), the launcher's audit log
    (C(SEQ EVENT IP NS_TIMESTAMP)).
  - C(status.json), the launcher's current state, and what follows from it
    (whether the job is running and can take a membership change, whether it
    has finished).
  - The age of the newest checkpoint and, for each address, its last
    C(host_worker_log) entry (for a per-node view).
  - With O(events=true), the records of C(events.jsonl) (for a timeline of the
    run, see M(dynatrain.elastic.timeline_plot)).
  - A malformed file does not fail the module; the problem is returned in
    RV(host_worker_error), RV(log_error), RV(status_error) or RV(events_bad_lines).
author:
  - dynatrain maintainers (@dynatrain)
options:
  path:
    description:
      - The shared volume (C(EFS_MOUNT), for example C(/myEFSvolume)) that holds
        C(host_worker), C(host_worker_log) and C(status.json).
    type: path
    required: true
  log_entries:
    description:
      - How many of the last C(host_worker_log) entries to return; V(0) returns none.
    type: int
    default: 10
  events:
    description:
      - Also return the records of C(events.jsonl) in RV(events).
    type: bool
    default: false
  stale_after:
    description:
      - A status written more than this many seconds ago means the launcher is
        not running (gone or stuck), whatever state it last wrote.
    type: float
    default: 60
attributes:
  check_mode:
    support: full
    details:
      - The module only reads; it behaves the same in check mode.
  diff_mode:
    support: none
  platform:
    support: N/A
    platforms: posix
notes:
  - Run it on a host that mounts the shared volume, usually the master, so that
    the age of the status is measured with the clock of the launcher that wrote it.
  - The file formats are described in C(docs/INTERNALS.md) of the collection.
seealso:
  - module: dynatrain.elastic.host_worker
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Read the job
  dynatrain.elastic.job_info:
    path: /myEFSvolume
  register: job

- name: Refuse a membership change when the job is not running
  ansible.builtin.assert:
    that: job.running
    fail_msg: "The job is {{ job.state | default('not started', true) }}: start it first."

- name: Show the membership and the last five changes
  dynatrain.elastic.job_info:
    path: /myEFSvolume
    log_entries: 5
  register: job

- name: Print them
  ansible.builtin.debug:
    msg:
      - "{{ job.hosts }}"
      - "{{ job.log_lines }}"
"""

RETURN = r"""
hosts:
  description: Addresses in C(host_worker), in file order (the master last); empty when the file is missing or malformed.
  returned: always
  type: list
  elements: str
  sample: ["172.31.65.62", "172.31.64.10"]
master:
  description: The last address of C(host_worker) (the master), or null when it holds none.
  returned: always
  type: str
  sample: 172.31.64.10
host_worker_error:
  description: Why C(host_worker) could not be read (for example the malformed line), or null.
  returned: always
  type: str
  sample: null
log:
  description: The last O(log_entries) entries of C(host_worker_log), oldest first.
  returned: always
  type: list
  elements: dict
  contains:
    seq:
      description: Sequence number, one more per line across launcher restarts.
      type: int
    event:
      description: C(ADDED), C(REMOVED) or C(FAILED).
      type: str
    ip:
      description: The worker's address.
      type: str
    ns:
      description: When the change took effect, nanoseconds since the epoch.
      type: int
  sample: [{"seq": 0, "event": "ADDED", "ip": "172.31.65.62", "ns": 1542536656974259605}]
log_lines:
  description: The same entries as RV(log) in the file's layout.
  returned: always
  type: list
  elements: str
  sample: ["0 ADDED 172.31.65.62 1542536656974259605"]
log_error:
  description: Lines of C(host_worker_log) that could not be parsed (left out of RV(log)), or null.
  returned: always
  type: str
  sample: null
last_log:
  description:
    - For each address in C(host_worker_log) (the whole file, not only the last
      O(log_entries)), its last entry and how long ago it was written (seconds,
      measured with this host's clock).
  returned: always
  type: dict
  sample: {"172.31.65.62": {"seq": 3, "event": "ADDED", "ns": 1542536656974259605, "age_s": 42.5}}
events:
  description: The records of C(events.jsonl), oldest first; empty when the file does not exist or O(events=false).
  returned: always
  type: list
  elements: dict
  sample: [{"event": "generation_start", "time": 1714560000.5, "source": "launcher", "world": 3}]
events_bad_lines:
  description: Line numbers of C(events.jsonl) that are not a JSON record (left out of RV(events)).
  returned: always
  type: list
  elements: int
  sample: []
last_checkpoint:
  description: The newest committed checkpoint directory, or null.
  returned: always
  type: str
  sample: /myEFSvolume/checkpoints/ckpt-0000000120
checkpoint_age_s:
  description: Seconds since RV(last_checkpoint) was committed (this host's clock), or null.
  returned: always
  type: float
  sample: 12.5
s3_copy:
  description:
    - The state of the master's checkpoint copy to S3 (C(control/s3sync.json), written by
      C(dt-checkpoint-sync) after each pass), or null when it has not run.
  returned: always
  type: dict
  sample: {"url": "s3://dynatrain-checkpoints-123456789012/dtdemo/job/", "last_step": 120, "last_ok_time": 1714560000.5, "error": null}
s3_copy_age_s:
  description: Seconds since the checkpoint sync last copied successfully (this host's clock), or null.
  returned: always
  type: float
  sample: 3.2
status:
  description: The content of C(status.json); empty when the file does not exist (no job has started).
  returned: always
  type: dict
  sample: {"state": "running", "updated": 1714560000.5, "world_size": 3, "epoch": 4, "step": 120}
status_error:
  description: Why C(status.json) could not be read, or null.
  returned: always
  type: str
  sample: null
engine:
  description:
    - The training engine of the job (C(mxnet) or C(torch)), as the launcher wrote it in C(status.json), or null
      when no job has started (or its launcher predates the engine field).
  returned: always
  type: str
  sample: torch
state:
  description: The launcher's state (C(starting), C(running), C(resizing), C(stopped), C(finished), C(failed)), or null.
  returned: always
  type: str
  sample: running
age_s:
  description: Seconds since the launcher last wrote C(status.json), or null.
  returned: always
  type: float
  sample: 0.4
running:
  description:
    - Whether the job is running and would apply a membership change (an active
      state, written less than O(stale_after) seconds ago).
  returned: always
  type: bool
  sample: true
finished:
  description: Whether the job has finished training.
  returned: always
  type: bool
  sample: false
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dynatrain.elastic.plugins.module_utils.job_status import (
    checkpoint_age,
    job_engine,
    latest_checkpoint,
    summarize,
)
from ansible_collections.dynatrain.elastic.plugins.module_utils.shared_volume import (
    HostWorkerError,
    JobFiles,
    JobStatusError,
    format_log_line,
    read_events,
    read_hosts,
    read_log,
    read_log_since,
    read_status,
)


def read_membership(path: str) -> tuple[list[str], str | None]:
    """(hosts, error) of host_worker; a missing file is an empty membership."""
    try:
        return read_hosts(path), None
    except (HostWorkerError, OSError) as exc:
        return [], str(exc)


def read_log_entries(path: str) -> tuple[list[tuple], str | None]:
    """The entries (seq, event, ip, ns) of host_worker_log, and an error or None.

    A malformed line does not hide the others: they are read leniently and the
    bad lines are named in the error.
    """
    try:
        entries = read_log(path)
        error = None
    except HostWorkerError:
        parsed, _offset, bad = read_log_since(path, 0)
        entries = [entry[:4] for entry in parsed]
        error = f"{path} has lines that are not 'SEQ EVENT IP NS_TIMESTAMP': {bad}"
    except OSError as exc:
        return [], str(exc)
    return entries, error


def last_entry_by_ip(entries: list[tuple], now: float) -> dict:
    """{ip: its last entry, with its age in seconds}: what happened last to each node."""
    last = {}
    for seq, event, ip, ns in entries:
        last[ip] = dict(seq=seq, event=event, ns=ns, age_s=round(now - ns / 1e9, 1))
    return last


def read_job_status(path: str) -> tuple[dict, str | None]:
    try:
        return read_status(path), None
    except (JobStatusError, OSError) as exc:
        return {}, str(exc)


def read_s3_copy(path: str) -> dict | None:
    """control/s3sync.json (the checkpoint sync's last pass), or None while it has not run."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run(params: dict, now: float | None = None) -> dict:
    """The module's logic without AnsibleModule: a read-only result."""
    root = params["path"]
    if not os.path.isdir(root):
        raise FileNotFoundError(
            f"{root} is not a directory: is the shared volume mounted on this host (EFS_MOUNT)?"
        )
    now = time.time() if now is None else now
    files = JobFiles(root)
    hosts, host_worker_error = read_membership(files.host_worker)
    entries, log_error = read_log_entries(files.log)
    log = entries[-params["log_entries"]:] if params["log_entries"] > 0 else []
    status, status_error = read_job_status(files.status)
    events, events_bad = read_events(files.events) if params.get("events") else ([], [])
    checkpoint = latest_checkpoint(status, root)
    s3_copy = read_s3_copy(files.s3sync_state)
    result = {
        "changed": False,
        "hosts": hosts,
        "master": hosts[-1] if hosts else None,
        "host_worker_error": host_worker_error,
        "log": [dict(seq=seq, event=event, ip=ip, ns=ns) for seq, event, ip, ns in log],
        "log_lines": [format_log_line(*entry) for entry in log],
        "log_error": log_error,
        "last_log": last_entry_by_ip(entries, now),
        "events": events,
        "events_bad_lines": events_bad,
        "last_checkpoint": checkpoint,
        "checkpoint_age_s": checkpoint_age(checkpoint, now),
        "s3_copy": s3_copy,
        "s3_copy_age_s": (now - s3_copy["last_ok_time"]) if isinstance((s3_copy or {}).get("last_ok_time"), (int, float))
        else None,
        "status": status,
        "status_error": status_error,
        "engine": job_engine(status),
    }
    result.update(summarize(status, now, params["stale_after"]))
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            log_entries=dict(type="int", default=10),
            events=dict(type="bool", default=False),
            stale_after=dict(type="float", default=60),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module.params)
    except FileNotFoundError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
