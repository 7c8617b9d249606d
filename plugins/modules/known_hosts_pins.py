#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: known_hosts_pins
short_description: Pin and forget SSH host keys in a cluster's known_hosts, safely beside other playbooks
version_added: "0.1.0"
description:
  - Edits the controller's known_hosts of a cluster (C(<dt_state_dir>/<cluster>/known_hosts)), where the
    playbooks pin each node's host key right after its launch and forget it when the node is terminated.
  - Every edit reads, changes and replaces the file under an exclusive C(fcntl) lock on the sidecar file
    C(<path>.lock), and replaces it atomically (temp file in the same directory + rename). Two playbooks that
    run at once (two C(add_workers), an C(add_workers) beside C(reconcile)) therefore keep each other's pins,
    where a read-modify-write without a lock (M(ansible.builtin.known_hosts), M(ansible.builtin.copy) of a
    template) loses the other's.
  - One line per node, C(<name>[,<name>...] <type> <base64 key>), under every name of the node (its private and
    public address). Pinning a node drops every older line naming any of its names (a re-used address);
    forgetting a name drops every line naming it.
  - Comment lines, blank lines, marker lines (C(@cert-authority), C(@revoked)) and hashed names are kept as
    they are.
author:
  - dynatrain maintainers (@dynatrain)
options:
  path:
    description: The known_hosts file. Its directory must exist; the file is created when a key is pinned.
    type: path
    required: true
  present:
    description:
      - Nodes to pin, each a dict with C(names) (the node's host names or addresses, the first the one the
        line starts with) and C(key) (C(<type> <base64>), e.g. as C(ssh-keyscan) prints it after the name).
    type: list
    elements: dict
    default: []
  absent:
    description: Names whose lines are removed (a terminated node's addresses). Applied before O(present).
    type: list
    elements: str
    default: []
  mode:
    description: Mode of the file when it is written.
    type: raw
    default: "0600"
  lock_timeout:
    description: Seconds to wait for the lock on C(<path>.lock).
    type: float
    default: 30
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    support: full
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Pin two new nodes under their private and public addresses
  dynatrain.elastic.known_hosts_pins:
    path: ~/.dynatrain/demo/known_hosts
    present:
      - names: [10.0.1.12, 54.1.2.3]
        key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHf9...
      - names: [10.0.1.13]
        key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKq2...

- name: Forget a terminated node's keys
  dynatrain.elastic.known_hosts_pins:
    path: ~/.dynatrain/demo/known_hosts
    absent: [10.0.1.12, 54.1.2.3]
"""

RETURN = r"""
added:
  description: The lines written for O(present) (only those that were not there already).
  returned: always
  type: list
  elements: str
  sample: ["10.0.1.12,54.1.2.3 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHf9..."]
removed:
  description: The lines dropped (forgotten names, older pins of a node's names).
  returned: always
  type: list
  elements: str
  sample: []
"""

import contextlib
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dynatrain.elastic.plugins.module_utils.known_hosts import locked, merge

KEY_TYPE = re.compile(r"^(ssh-[a-z0-9-]+|ecdsa-sha2-[a-z0-9-]+|sk-[a-z0-9@.-]+)$")


class PinError(ValueError):
    """A request that cannot be carried out; nothing was changed."""


def pin_line(node):
    """The known_hosts line of a node to pin ({'names': [...], 'key': '<type> <base64>'}); raises PinError."""
    names = [str(n).strip() for n in node.get("names") or [] if str(n).strip()]
    fields = str(node.get("key") or "").split()
    if not names or any("," in n or " " in n for n in names):
        raise PinError(f"present: {node!r} needs names, a list of host names or addresses")
    if len(fields) < 2 or not KEY_TYPE.match(fields[0]):
        raise PinError(f"present: the key of {', '.join(names)} must be '<type> <base64 key>', not {node.get('key')!r}")
    return f"{','.join(dict.fromkeys(names))} {fields[0]} {fields[1]}"


def edit(text, present=(), absent=()):
    """The file's new text, the lines added and the lines removed. Pure.

    A line naming a forgotten name goes; so does an older line naming any name of a node pinned now,
    unless it is that very pin (a second run changes nothing)."""
    return merge(text, [pin_line(node) for node in present], absent)


def replace(path, text, mode):
    """Write ``text`` to ``path`` atomically (a temp file in its directory, fsync, rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".known_hosts.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def update(path, present=(), absent=(), mode=0o600, lock_timeout=30.0, check_mode=False):
    """Pin/forget under the lock. Returns dict(changed, added, removed, before, after); raises PinError."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise PinError(f"the directory of {path} does not exist; nothing was changed")
    with locked(path, lock_timeout, PinError):
        try:
            with open(path, encoding="utf-8") as handle:
                before = handle.read()
        except FileNotFoundError:
            before = None
        after, added, removed = edit(before or "", present, absent)
        changed = after != (before or "")
        if changed and not check_mode:
            replace(path, after, mode)
    return dict(changed=changed, added=added, removed=removed, before=before or "", after=after)


def file_mode(value):
    if isinstance(value, int):
        return value
    try:
        return int(str(value), 8)
    except ValueError:
        raise PinError(f"mode must be an octal number such as '0600', not {value!r}") from None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            present=dict(type="list", elements="dict", default=[]),
            absent=dict(type="list", elements="str", default=[]),
            mode=dict(type="raw", default="0600"),
            lock_timeout=dict(type="float", default=30.0),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = update(p["path"], p["present"], p["absent"], file_mode(p["mode"]), p["lock_timeout"],
                        module.check_mode)
    except PinError as exc:
        module.fail_json(msg=str(exc), changed=False, added=[], removed=[])
    except OSError as exc:
        module.fail_json(msg=f"cannot update {p['path']}: {exc}; nothing was changed", changed=False, added=[],
                         removed=[])
    before, after = result.pop("before"), result.pop("after")
    if module._diff:
        result["diff"] = dict(before=before, after=after, before_header=p["path"], after_header=p["path"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
