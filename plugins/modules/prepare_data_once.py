#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: prepare_data_once
short_description: Run a node's prepare-data script once and record its success, in one module run
version_added: "0.1.0"
description:
  - The node-local O(data_dir) is made (owned by O(user), mode 0755). The node's data is prepared when its
    success marker O(marker) exists. When it does not (or with O(force)), the module runs O(python) O(script) O(args) as O(user)
    under GNU C(timeout) (SIGTERM after O(timeout) seconds, SIGKILL 30 s later), and writes the marker
    atomically only when the script exits 0. A run that fails removes the marker and fails with the exit code
    (or the timeout), the last lines of the script's stderr, and which of the script and its interpreter is
    missing.
  - One module run for what the prepare_data role did in five (the marker directory, the data directory, the
    marker, the run and the marker's write), each a round trip to the node (issue 28; a node from a baked image
    is configured in a few module runs).
author:
  - dynatrain maintainers (@dynatrain)
options:
  script:
    description: The script's absolute path on the node.
    type: path
    required: true
  python:
    description: The interpreter that runs it.
    type: str
    required: true
  args:
    description: Its arguments, one item each (no shell).
    type: list
    elements: str
    default: []
  environment:
    description: Extra environment variables of the script.
    type: dict
    default: {}
  timeout:
    description: Seconds the script may run.
    type: int
    default: 1800
  user:
    description: The node user the script runs as; it owns the data directory and the marker.
    type: str
    required: true
  data_dir:
    description: Node-local directory created for the script (owned by O(user)); empty creates none.
    type: path
    default: ""
  marker:
    description: The success marker, in a directory that must exist (the shared volume).
    type: path
    required: true
  marker_content:
    description: What the marker says (written after a run that exited 0); the module adds a last line,
      C(finished=<UTC time>Z).
    type: str
    required: true
  force:
    description: Run the script even when the marker exists.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
notes:
  - Runs as root (C(become)) so that it can create the data directory and run the script as O(user).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Prepare the node's data
  dynatrain.elastic.prepare_data_once:
    script: /opt/dynatrain/venv/bin/dt-prepare-digits
    python: /opt/dynatrain/venv/bin/python
    user: admin
    data_dir: /var/lib/dynatrain/data
    marker: /myEFSvolume/prepare_data_success_10.0.1.12
    marker_content: "ip=10.0.1.12\n"
  become: true
"""

RETURN = r"""
ran:
  description: Whether the script ran (or, in check mode, would run).
  returned: always
  type: bool
rc:
  description: The script's exit code (124 or 137 when it timed out).
  returned: when the script ran
  type: int
stderr_lines:
  description: The last 15 lines of the script's stderr.
  returned: when the script ran
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dynatrain.elastic.plugins.module_utils.prepare_data import OPTIONS, prepare_once


def main():
    module = AnsibleModule(argument_spec=OPTIONS, supports_check_mode=True)
    module.exit_json(**prepare_once(module, module.params))


if __name__ == "__main__":
    main()
