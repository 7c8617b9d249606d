# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""The compact view of a cluster that ``status.yml`` prints: one row per node and a job line.

Input: the nodes' inventory host variables (``dt_private_ip``, ``dt_role``, ``dt_state``,
``dt_status``, ``dt_lifecycle``, ``dt_instance_id``) and the result of the
``dynatrain.elastic.job_info`` module (or None when there is no master to ask).
Used by the ``dynatrain.elastic.status_table`` filter. Standard library only.
"""

from __future__ import annotations

import ipaddress

from ansible_collections.dynatrain.elastic.plugins.module_utils.shared_volume import is_number

NODE_VARS = ("dt_private_ip", "dt_role", "dt_state", "dt_status", "dt_lifecycle", "dt_instance_id")
COLUMNS = ("NODE", "ROLE", "EC2", "STATUS", "MARKET", "IN JOB", "LAST EVENT", "INSTANCE")


def _text(value, empty="-") -> str:
    return empty if value is None or value == "" else str(value)


def duration(seconds) -> str:
    """12 -> '12s', 125 -> '2m05s', 7300 -> '2h01m' (negative clock skew counts as 0)."""
    seconds = max(0, int(round(float(seconds))))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def ago(seconds) -> str:
    """'12s ago'; None -> '-'."""
    return "-" if seconds is None else f"{duration(seconds)} ago"


def _address_key(address: str):
    try:
        return (0, int(ipaddress.ip_address(address)))
    except ValueError:
        return (1, address)


def node_rows(nodes: list, job: dict | None) -> list[tuple]:
    """One row (COLUMNS) per node, the master first, then by address."""
    job = job or {}
    members = set(job.get("hosts") or [])
    last_log = job.get("last_log") or {}
    known = job.get("host_worker_error") is None and bool(job)
    rows = []
    for node in nodes:
        address = _text(node.get("dt_private_ip"), empty="?")
        last = last_log.get(address)
        rows.append((
            address,
            _text(node.get("dt_role")),
            _text(node.get("dt_state")),
            _text(node.get("dt_status")),
            _text(node.get("dt_lifecycle")),
            ("yes" if address in members else "no") if known else "?",
            f"{last['event']} #{last['seq']} {ago(last.get('age_s'))}" if last else "-",
            _text(node.get("dt_instance_id")),
        ))
    rows.sort(key=lambda row: (row[1] != "master", _address_key(row[0])))
    return rows


def job_line(job: dict | None) -> str:
    """'job: STATE  ENGINE  epoch E step S  world W  R samples/s  checkpoint Ns ago' (or why there is none);
    ENGINE (mxnet, torch) is shown when the launcher wrote it in status.json."""
    if not job:
        return "job: unknown (the inventory has no master to ask)"
    status = job.get("status") or {}
    if job.get("status_error"):
        return f"job: unknown ({job['status_error']})"
    if not status:
        return "job: not started (no status.json on the shared volume)"
    state = _text(job.get("state") or status.get("state"), empty="unknown")
    if not job.get("running") and state in ("starting", "running", "resizing"):
        # The launcher said it was running but has not written for a while: gone or stuck.
        silent = duration(job["age_s"]) if is_number(job.get("age_s")) else "a while"
        state = f"{state}? (no update for {silent})"
    engine = status.get("engine")
    parts = [
        f"job: {state}",
        *([f"engine {engine}"] if isinstance(engine, str) and engine else []),
        f"epoch {_text(status.get('epoch'))} step {_text(status.get('step'))}",
        f"world {_text(status.get('world_size'))}",
        f"{float(status['samples_per_s']):.1f} samples/s" if is_number(status.get("samples_per_s"))
        else "- samples/s",
        f"checkpoint {ago(job.get('checkpoint_age_s'))}" if job.get("checkpoint_age_s") is not None
        else "no checkpoint",
    ]
    return "  ".join(parts)


def s3_line(job: dict | None) -> str | None:
    """'checkpoints in S3: URL  step S copied Ns ago' (and the last pass's error), or None without a copy."""
    copy = (job or {}).get("s3_copy")
    if not copy:
        return None
    parts = [f"checkpoints in S3: {_text(copy.get('url'))}",
             f"step {_text(copy.get('last_step'))} copied {ago(job.get('s3_copy_age_s'))}"
             if is_number(job.get("s3_copy_age_s")) else "nothing copied yet"]
    if copy.get("error"):
        parts.append(f"last pass failed: {copy['error']}")
    return "  ".join(parts)


def format_table(rows: list[tuple], header: tuple = COLUMNS) -> list[str]:
    """Left-aligned columns two spaces apart; trailing spaces stripped."""
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    return ["  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in [header] + rows]


def status_lines(nodes: list, job: dict | None) -> list[str]:
    """The table of nodes, then the job line (and its copy in S3), then any problem reading the shared volume."""
    nodes = [node for node in (nodes or []) if node]
    lines = format_table(node_rows(nodes, job)) if nodes else ["no node of this cluster is in the inventory"]
    lines.append(job_line(job))
    copy = s3_line(job)
    if copy:
        lines.append(copy)
    for key, what in (("host_worker_error", "host_worker"), ("log_error", "host_worker_log")):
        if job and job.get(key):
            lines.append(f"{what}: {job[key]}")
    return lines
