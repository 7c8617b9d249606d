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
options:
  files:
    description: What to apply, in this order.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path on the node; a leading C(~) or C(~user) is expanded there (a user's home needs
          no lookup first).
        type: path
        required: true
      state:
        description: C(directory), C(file) (with O(files[].content)), C(line) (with O(files[].line)) or C(absent).
        type: str
        choices: [directory, file, line, absent]
        default: file
      content:
        description: The whole content of a C(file). Its directory must exist (list the directory first).
        type: str
      line:
        description: The line a C(line) entry makes (without its newline).
        type: str
      match:
        description: A regular expression (Python's C(re.search)) for the lines a C(line) entry replaces; without
          it, only the very same line is found.
        type: str
      owner:
        description: Owner (name or uid); unchanged when not given.
        type: str
      group:
        description: Group (name or gid); unchanged when not given.
        type: str
      mode:
        description: Mode, as M(ansible.builtin.file) takes it (e.g. C("0644")); unchanged when not given.
        type: raw
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
notes:
  - "The task that writes a secret sets C(no_log=true): the content is a module argument."
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
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

import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes


def _attributes(module, entry, changed):
    """Owner, group and mode where they differ (check mode: only says so)."""
    args = module.load_file_common_arguments({k: entry.get(k) for k in ("path", "owner", "group", "mode")})
    return module.set_fs_attributes_if_different(args, changed)


def _directory(module, entry):
    path = entry["path"]
    if os.path.isdir(path):
        return _attributes(module, entry, False)
    if os.path.lexists(path):
        module.fail_json(msg="%s exists and is not a directory: remove it or choose another path." % path)
    if module.check_mode:
        return True
    os.makedirs(path)
    return _attributes(module, entry, True)


def _file(module, entry, data=None):
    path = entry["path"]
    if data is None:
        if entry.get("content") is None:
            module.fail_json(msg="%s: state=file needs content (the whole file, as text)." % path)
        data = to_bytes(entry["content"], errors="surrogate_or_strict")
    if os.path.isdir(path):
        module.fail_json(msg="%s is a directory: a file cannot replace it." % path)
    current = None
    if os.path.isfile(path):
        with open(path, "rb") as fh:
            current = fh.read()
    if current == data:
        return _attributes(module, entry, False)
    if module.check_mode:
        return True
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        module.fail_json(msg="%s: its directory %s does not exist; list it before the file (state=directory)."
                         % (path, directory))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        module.atomic_move(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return _attributes(module, entry, True)


def with_line(text, line, match):
    """``text`` with ``line`` in place of the lines ``match`` finds (where the first was), or appended. Pure."""
    lines = text.splitlines()
    found = [i for i, have in enumerate(lines) if (re.search(match, have) if match else have == line)]
    if found:
        lines = [have for i, have in enumerate(lines) if i not in found[1:]]
        lines[found[0]] = line
    else:
        lines.append(line)
    return "\n".join(lines) + "\n"


def _line(module, entry):
    path = entry["path"]
    if entry.get("line") is None or "\n" in entry["line"]:
        module.fail_json(msg="%s: state=line needs line (one line of text, no newline)." % path)
    if entry.get("match"):
        try:
            re.compile(entry["match"])
        except re.error as e:
            module.fail_json(msg="%s: match %r is not a regular expression: %s." % (path, entry["match"], e))
    current = ""
    if os.path.isfile(path):
        with open(path, "rb") as fh:
            current = fh.read().decode("utf-8", "surrogateescape")
    text = with_line(current, entry["line"], entry.get("match"))
    return _file(module, entry, to_bytes(text, errors="surrogate_or_strict"))


def _absent(module, entry):
    path = entry["path"]
    if os.path.isdir(path) and not os.path.islink(path):
        module.fail_json(msg="%s is a directory: node_files removes files and links only." % path)
    if not os.path.lexists(path):
        return False
    if not module.check_mode:
        os.unlink(path)
    return True


APPLY = {"directory": _directory, "file": _file, "line": _line, "absent": _absent}


def main():
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "required": True, "options": {
                "path": {"type": "path", "required": True},
                "state": {"type": "str", "choices": ["directory", "file", "line", "absent"], "default": "file"},
                "content": {"type": "str"},
                "line": {"type": "str"},
                "match": {"type": "str"},
                "owner": {"type": "str"},
                "group": {"type": "str"},
                "mode": {"type": "raw"},
            }},
        },
        supports_check_mode=True,
    )
    changed_paths = []
    for entry in module.params["files"]:
        if not os.path.isabs(entry["path"]):
            module.fail_json(msg="%s is not an absolute path." % entry["path"])
        if APPLY[entry["state"]](module, entry):
            changed_paths.append(entry["path"])
    module.exit_json(changed=bool(changed_paths), changed_paths=changed_paths)


if __name__ == "__main__":
    main()
