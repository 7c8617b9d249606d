#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_files
short_description: Put a role's directories and small files on a node in one module run
version_added: "0.1.0"
description:
  - Applies a list of directories, files (their whole content given) and removals on the node, in order, in
    one module run. A role that writes several small files (a settings file, a systemd unit, their
    directory) pays one round trip to the node instead of one per file (M(ansible.builtin.file),
    M(ansible.builtin.template) and M(ansible.builtin.copy) each cost a module run, 0.3-1 s on a busy node,
    which is most of what configuring a node from a baked image costs).
  - The content of a file is given as text (render a role template with the C(ansible.builtin.template)
    lookup, read a controller file with the C(ansible.builtin.file) lookup and C(rstrip=false)). A file is
    replaced atomically (a temporary file in its directory, then a rename) only when its content differs;
    owner, group and mode are set when they differ, as M(ansible.builtin.file) does.
  - A directory is created with its parents when missing. A removal removes a file or a link (never a
    directory's contents).
  - A C(line) entry keeps the rest of a file and makes one line of it O(files[].line). The lines that
    O(files[].match) finds are replaced by it (where the first of them was), or it is appended; the file is made
    when missing. An C(authorized_keys) entry for a key is such a line, matched by the key itself, so that its
    options (C(from=...)) are updated in place, as M(ansible.posix.authorized_key) does.
author:
  - dynatrain maintainers (@dynatrain)
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
  - dynatrain.elastic.node_files
"""

EXAMPLES = r"""
- name: Write the watcher's settings and its unit
  dynatrain.elastic.node_files:
    files:
      - {path: /var/log/dynatrain, state: directory, owner: root, group: root, mode: "0755"}
      - path: /etc/default/dynatrain-spot-watch
        content: "{{ lookup('ansible.builtin.template', 'dynatrain-spot-watch.default.j2') }}"
        owner: root
        group: root
        mode: "0644"
  become: true
"""

RETURN = r"""
changed_paths:
  description: The paths that were (or, in check mode, would be) created, rewritten, removed or given new attributes.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dynatrain.elastic.plugins.module_utils.node_files import ENTRY_OPTIONS, apply_files, with_line

__all__ = ["with_line"]     # the pure helper, for the unit tests


def main():
    module = AnsibleModule(
        argument_spec={"files": {"type": "list", "elements": "dict", "default": [], "options": ENTRY_OPTIONS}},
        supports_check_mode=True,
    )
    changed_paths = apply_files(module, module.params["files"])
    module.exit_json(changed=bool(changed_paths), changed_paths=changed_paths)


if __name__ == "__main__":
    main()
