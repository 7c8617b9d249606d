# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""status_table: the lines status.yml prints (a row per node, then the job line)."""

from __future__ import annotations

from ansible_collections.dynatrain.elastic.plugins.module_utils.status_table import NODE_VARS, status_lines


def status_table(nodes, job=None):
    """Nodes' host variables + a job_info result (or None) -> list of lines."""
    job = job if isinstance(job, dict) and not job.get("skipped") else None
    # Only the variables shown: reading all of a host's hostvars would template every one of them.
    return status_lines([{key: node.get(key) for key in NODE_VARS} for node in (nodes or []) if node], job)


class FilterModule:
    def filters(self):
        return {"status_table": status_table}
