#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: shared_volume_op
short_description: Archive a job or remove nodes' data markers on the shared volume, without following a link
version_added: "0.1.0"
description:
  - The playbooks' way to the shared volume's files that no other module owns; the names and the logic live in
    C(plugins/module_utils/shared_volume.py), the volume's one contract.
  - O(op=archive_job) moves the job's checkpoints, results, C(status.json), C(events.jsonl) and C(control/)
    (those present) to a new directory C(runs/<UTC time>/) under O(path), each by one rename; C(host_worker) and
    C(host_worker_log) stay. With nothing to move it changes nothing, so a second run is a no-op.
  - O(op=remove_markers) removes the prepare-data success markers of the nodes O(ips).
  - Every node mounts the volume read-write, so any name on it may be a link a node planted. No link is
    followed; a link under one of these names is moved or removed as the link itself.
author:
  - dynatrain maintainers (@dynatrain)
options:
  path:
    description: The shared volume's mount point (the job's root).
    type: path
    required: true
  op:
    description: What to do.
    type: str
    required: true
    choices: [archive_job, remove_markers]
  ips:
    description: With O(op=remove_markers), the private IPv4 addresses of the nodes whose markers go.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Move the job's checkpoints, results and events under runs/
  dynatrain.elastic.shared_volume_op:
    path: /myEFSvolume
    op: archive_job

- name: Remove the data markers of the nodes that leave
  dynatrain.elastic.shared_volume_op:
    path: /myEFSvolume
    op: remove_markers
    ips: [10.0.1.12, 10.0.1.13]
"""

RETURN = r"""
archive:
  description: With O(op=archive_job), the directory the job's files were (in check mode, would be) moved to;
    null when there was nothing to move.
  returned: always
  type: str
moved:
  description: The names moved there.
  returned: always
  type: list
  elements: str
removed:
  description: With O(op=remove_markers), the marker files removed (in check mode, that would be).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dynatrain.elastic.plugins.module_utils.shared_volume import (
    HostWorkerError,
    archive_job,
    remove_prepare_data_markers,
)


def run(params, check_mode=False):
    """The module's result for ``params``; raises HostWorkerError (a bad address) or OSError (a link, a
    directory where a marker belongs, an unmounted volume)."""
    archive, moved, removed = None, [], []
    if params["op"] == "archive_job":
        archive, moved = archive_job(params["path"], check=check_mode)
    else:
        removed = remove_prepare_data_markers(params["path"], params.get("ips") or [], check=check_mode)
    return dict(changed=bool(moved or removed), archive=archive, moved=moved, removed=removed,
                msg=(f"archived {', '.join(moved)} to {archive}" if moved else
                     f"removed {', '.join(removed)}" if removed else "nothing to do"))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            op=dict(type="str", required=True, choices=["archive_job", "remove_markers"]),
            ips=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module.params, check_mode=module.check_mode))
    except (HostWorkerError, OSError) as exc:
        module.fail_json(msg=f"{module.params['op']} on {module.params['path']}: {exc}")


if __name__ == "__main__":
    main()
