#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: job_array_state
short_description: Record the state of a job array's rows in its array.json
version_added: "0.1.0"
description:
  - Keeps C(array.json), the record of a job array (C(playbooks/job_array.yml)) - the array's name and manifest,
    and for every row its region, cluster, state (C(queued), C(running), C(finished), C(failed)), the S3 URL of
    its result, its error line, start and end times, duration and log path.
  - The array's playbook and each row's C(run_job.yml), running at the same time, change it - every change is
    read, applied and written atomically (temporary file and rename) under an exclusive lock of C(<path>.lock).
  - O(action=init) writes a fresh file with every row queued; O(action=row) changes one row (C(running) sets its
    start time, C(finished) and C(failed) its end time and duration); O(action=end) marks the array ended and
    fails every row that never reported an end; O(action=read) changes nothing.
author:
  - dynatrain maintainers (@dynatrain)
options:
  path:
    description: The array file, C(<dt_state_dir>/arrays/<array>/array.json).
    type: path
    required: true
  action:
    description: What to do with it.
    type: str
    choices: [init, row, end, read]
    default: read
  array:
    description: The array's name (O(action=init)).
    type: str
  manifest:
    description: The manifest's path, recorded (O(action=init)).
    type: str
    default: ""
  rows:
    description:
      - The rows, as the C(dynatrain.elastic.job_array_plan) filter returns them (O(action=init)) - at least
        C(name), C(region) and C(cluster) each.
    type: list
    elements: dict
  log_dir:
    description: Where each row's C(<name>.log) is (O(action=init)); default the file's directory.
    type: path
  name:
    description: The row to change (O(action=row)).
    type: str
  row_state:
    description: The row's new state (O(action=row)).
    type: str
    choices: [queued, running, finished, failed]
  error:
    description: The row's error line (O(action=row)); an empty string clears it.
    type: str
  result:
    description: The S3 URL of the row's result (O(action=row)); an empty string clears it.
    type: str
attributes:
  check_mode:
    support: full
    details:
      - In check mode the new document is computed and returned but not written.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
notes:
  - The file format is described in C(plugins/module_utils/job_array.py).
seealso:
  - module: dynatrain.elastic.job_info
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Record the array, every row queued
  dynatrain.elastic.job_array_state:
    path: /home/me/.dynatrain/arrays/jobs/array.json
    action: init
    array: jobs
    manifest: jobs.csv
    rows: "{{ plan.rows }}"

- name: The row has started
  dynatrain.elastic.job_array_state:
    path: /home/me/.dynatrain/arrays/jobs/array.json
    action: row
    name: first
    row_state: running

- name: The row has finished, its result is in S3
  dynatrain.elastic.job_array_state:
    path: /home/me/.dynatrain/arrays/jobs/array.json
    action: row
    name: first
    row_state: finished
    result: s3://dynatrain-checkpoints-123456789012/jobs-first/first/results/final.json
"""

RETURN = r"""
array:
  description: The array document after the change.
  returned: success
  type: dict
  sample: {"array": "jobs", "manifest": "jobs.csv", "created": "2026-11-24T05:00:00Z", "ended": null,
           "rows": [{"name": "first", "region": "us-east-1", "cluster": "jobs-first", "state": "running",
                     "started": "2026-11-24T05:00:01Z", "ended": null, "duration_s": null, "result": null,
                     "error": null, "log": "/home/me/.dynatrain/arrays/jobs/first.log"}]}
summary:
  description: The array's wall time (first start to last end), the sum of its rows' times, counts per state,
    the failed rows' names.
  returned: success
  type: dict
  sample: {"wall_s": 200.5, "rows_s": 390.0, "speedup": 1.95, "counts": {"queued": 0, "running": 0,
           "finished": 2, "failed": 0}, "failed": []}
lines:
  description: The array's table, one line per job, then the totals.
  returned: success
  type: list
  elements: str
"""

import copy
import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dynatrain.elastic.plugins.module_utils import job_array as ja


def _change(params):
    """The change to apply to the document (or None when the file is missing)."""
    action = params["action"]

    def change(doc):
        if action == "init":
            log_dir = params["log_dir"] or os.path.dirname(params["path"])
            return ja.new_array(params["array"], params["manifest"], params["rows"], log_dir)
        if doc is None:
            why = ("no job array was run under that name (job_array.yml -e manifest=... writes it)" if action == "read"
                   else "it was removed while the array ran (a `localcloud down` removes the state directory)")
            raise ValueError(f"{params['path']} does not exist: {why}")
        if action == "row":
            return ja.set_row(doc, params["name"], params["row_state"], params["error"], params["result"])
        if action == "end":
            return ja.end_array(doc)
        return doc

    return change


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            action=dict(type="str", default="read", choices=["init", "row", "end", "read"]),
            array=dict(type="str"),
            manifest=dict(type="str", default=""),
            rows=dict(type="list", elements="dict"),
            log_dir=dict(type="path"),
            name=dict(type="str"),
            row_state=dict(type="str", choices=list(ja.STATES)),
            error=dict(type="str"),
            result=dict(type="str"),
        ),
        required_if=[("action", "init", ("array", "rows")), ("action", "row", ("name",))],
        supports_check_mode=True,
    )
    params = module.params
    change = _change(params)
    path = params["path"]
    try:
        if params["action"] == "read" or module.check_mode:
            before = ja.read_array(path) if os.path.exists(path) else None
            doc = change(copy.deepcopy(before))
        else:
            before = None
            doc = ja.update_array(path, change)
    except (OSError, ValueError, KeyError) as exc:
        module.fail_json(msg=f"array file {path}: {exc.args[0] if exc.args else exc}")
    changed = params["action"] != "read" and json.dumps(doc, sort_keys=True) != json.dumps(before, sort_keys=True)
    module.exit_json(changed=changed, array=doc, summary=ja.summary(doc), lines=ja.table_lines(doc))


if __name__ == "__main__":
    main()
