#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_apply
short_description: Apply a baked worker's per-cluster configuration in one module run
version_added: "0.1.0"
description:
  - A worker booted from a baked image (bake_image.yml) holds its packages, its venv and the node runtime; what is
    left to configure is per cluster (the directories and the environment file, the cluster key, the shared
    volume's mount, the training environment, the spot watcher, the data). The roles say what that is (each
    role's C(tasks/plan.yml), on the controller, from the same variables and templates as its own tasks);
    this module applies all of it in one round trip to the node, where the roles' tasks take one per file,
    mount, service and script (issue 28).
  - "In this order: O(files) (as M(dynatrain.elastic.node_files) applies them), O(mounts) (the C(/etc/fstab)
    line, then the mount, as M(ansible.posix.mount) with C(state=mounted) does), O(services) (enabled, started,
    restarted when one of their files changed), then O(prepare_data) (as M(dynatrain.elastic.prepare_data_once))."
  - A change of a mounted volume's line is whole or not at all. The volume is unmounted before C(/etc/fstab) is
    touched, so a busy volume fails the module with nothing changed; a mount that then fails restores
    C(/etc/fstab), mounts the volume again with its old line, and fails the module saying so. A service that does
    not start fails the module too.
  - The contents of O(files) are not logged, whatever the task says (the training environment is a secret).
author:
  - dynatrain maintainers (@dynatrain)
options:
  mounts:
    description: File systems to record in O(fstab) and mount.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The mount point (made when missing).
        type: path
        required: true
      src:
        description: The device, the NFS export or the directory to bind.
        type: str
        required: true
      fstype:
        description: The file system type (C(none) for a bind mount).
        type: str
        required: true
      opts:
        description: The mount options.
        type: str
        default: defaults
      owner:
        description: The owner of the mounted file system's root (set after the mount); unchanged when not given.
        type: str
      group:
        description: Its group; unchanged when not given.
        type: str
      mode:
        description: Its mode, as M(ansible.builtin.file) takes it; unchanged when not given.
        type: raw
  fstab:
    description: The fstab file (another path for tests).
    type: path
    default: /etc/fstab
  services:
    description: systemd services to enable and start, after O(files) and O(mounts).
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The unit's name.
        type: str
        required: true
      enabled:
        description: Whether the service starts at boot.
        type: bool
        default: true
      restart_when_changed:
        description:
          - Paths among O(files) (the unit, its settings). When one of them changed, systemd reloads its units
            and the service is restarted; otherwise it is only started when it is not running.
        type: list
        elements: path
        default: []
  prepare_data:
    description:
      - The options of M(dynatrain.elastic.prepare_data_once) (C(script), C(python), C(user), C(marker),
        C(marker_content) and the others), to prepare the node's data last. Nothing when not given.
    type: dict
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
- name: Configure a baked worker in one module run
  dynatrain.elastic.node_apply:
    files:
      - {path: /etc/default/dynatrain-spot-watch, content: "DT_EFS_MOUNT=/myEFSvolume\n", owner: root, group: root, mode: "0644"}
    mounts:
      - {path: /myEFSvolume, src: "fs-0123456789abcdef0.efs.us-east-1.amazonaws.com:/", fstype: nfs4, opts: "nfsvers=4.1,_netdev"}
    services:
      - {name: dynatrain-spot-watch, restart_when_changed: [/etc/default/dynatrain-spot-watch]}
  become: true
"""

RETURN = r"""
changed_paths:
  description: The paths of O(files), and the mounted roots of O(mounts) whose owner, group or mode was set, that
    were (in check mode, would be) changed.
  returned: always
  type: list
  elements: str
mounted:
  description: The mount points that were (or would be) mounted or mounted again.
  returned: always
  type: list
  elements: str
services:
  description: The services that were (or would be) started, restarted or enabled, each with what was done.
  returned: always
  type: dict
prepare_data:
  description: What the data preparation did (M(dynatrain.elastic.prepare_data_once)'s result); absent without O(prepare_data).
  returned: when O(prepare_data) is given
  type: dict
"""

import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.dynatrain.elastic.plugins.module_utils.node_files import ENTRY_OPTIONS, apply_files, with_line
from ansible_collections.dynatrain.elastic.plugins.module_utils import prepare_data


def _fstab_field(value):
    """A field of an fstab line, escaped as ansible.posix.mount writes it (the same line: no change)."""
    return value.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")


def mountpoints(mountinfo="/proc/self/mountinfo"):
    """The mount points the kernel has (a bind mount of a directory on the same file system included, which
    os.path.ismount does not see)."""
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as fh:
        fields = [line.split() for line in fh]
    return {re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), f[4]) for f in fields if len(f) > 4}


def _write(path, text):
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _mount(module, m):
    """The fstab line and the mount; True when something changed (or would)."""
    path = m["path"].rstrip("/") or "/"
    line = " ".join([_fstab_field(m["src"]), _fstab_field(path), m["fstype"], m["opts"], "0", "0"])
    fstab = module.params["fstab"]
    current = ""
    if os.path.exists(fstab):
        with open(fstab, encoding="utf-8", errors="surrogateescape") as fh:
            current = fh.read()
    # the line of this mount point, whatever its source and options (not a comment)
    wanted = with_line(current, line, r"^\s*[^#\s]\S*\s+%s\s" % re.escape(_fstab_field(path)))
    fstab_changed = wanted != current
    mounted = path in mountpoints()
    if mounted and not fstab_changed:
        return False
    if module.check_mode:
        return True
    made_dir = not os.path.isdir(path)
    if made_dir:
        os.makedirs(path)
    if mounted:
        # Unmounted before fstab is touched: a busy volume fails here, and nothing has changed. (Rewriting fstab
        # first left the new line behind a failed umount, and the next run found nothing to do: the old options
        # stayed in force, e.g. a switch to TLS that never took effect.)
        rc, out, err = module.run_command([module.get_bin_path("umount", required=True), path])
        if rc != 0:
            module.fail_json(msg="%s is mounted and its /etc/fstab line changed (to: %s), but it could not be unmounted"
                                 " to mount it again: %s. Nothing was changed: /etc/fstab and the mount are as they"
                                 " were. Stop what uses it (fuser -vm %s) and run again." % (path, line, (err or out).strip(), path))
    try:
        if fstab_changed:
            _write(fstab, wanted)
        rc, out, err = module.run_command([module.get_bin_path("mount", required=True), path])
    except (OSError, ValueError) as e:      # fstab not writable, mount missing: put back what was
        rc, out, err = 1, "", str(e)
    if rc != 0:
        _undo_mount(module, m, path, fstab if fstab_changed else None, current, mounted, made_dir, (err or out).strip())
    return True


def _undo_mount(module, m, path, fstab, current, was_mounted, made_dir, why):
    """A mount that failed: fstab as it was (``fstab``: its path when it was rewritten), the volume mounted again
    with its old line when it was mounted before; then the module fails, saying which of these held."""
    notes = []
    if fstab is not None:
        try:
            _write(fstab, current)
            notes.append("/etc/fstab is as it was")
        except OSError as e:
            notes.append("/etc/fstab could NOT be restored (%s): it holds the new line" % e)
    else:
        notes.append("/etc/fstab is as it was")
    if was_mounted:
        rc, out, err = module.run_command([module.get_bin_path("mount", required=True), path])
        notes.append("it is mounted again with its old line" if rc == 0 else
                     "mounting it again with its old line failed too (%s): it is NOT mounted, mount %s by hand"
                     % ((err or out).strip(), path))
    if made_dir:
        os.rmdir(path)
    module.fail_json(msg="Could not mount %s at %s (%s, %s): %s. %s."
                         % (m["src"], path, m["fstype"], m["opts"], why, "; ".join(notes)))


def _services(module, changed_paths):
    """Enable and start each service (restart it when one of its files changed); what was done, by name."""
    done = {}
    services = module.params["services"]
    if not services:
        return done
    systemctl = module.get_bin_path("systemctl", required=True)

    def run(*args):
        return module.run_command([systemctl] + list(args))

    changed = set(changed_paths)
    reload_needed = any(set(s["restart_when_changed"]) & changed for s in services)
    if reload_needed and not module.check_mode:
        rc, out, err = run("daemon-reload")
        if rc != 0:
            module.fail_json(msg="systemctl daemon-reload failed: %s" % (err or out).strip())
    for s in services:
        actions = []
        if s["enabled"] and run("is-enabled", "--quiet", s["name"])[0] != 0:
            actions.append("enable")
        if set(s["restart_when_changed"]) & changed:
            actions.append("restart")
        elif run("is-active", "--quiet", s["name"])[0] != 0:
            actions.append("start")
        if actions and not module.check_mode:
            for action in actions:
                rc, out, err = run(action, s["name"])
                if rc != 0:
                    module.fail_json(msg="systemctl %s %s failed: %s (journalctl -u %s on the node says why)."
                                         % (action, s["name"], (err or out).strip(), s["name"]))
        if actions:
            done[s["name"]] = actions
    return done


def main():
    module = AnsibleModule(
        argument_spec={
            # the contents are not logged: the training environment's file is a secret
            "files": {"type": "list", "elements": "dict", "default": [],
                      "options": dict(ENTRY_OPTIONS, content={"type": "str", "no_log": True})},
            "mounts": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "path", "required": True},
                "src": {"type": "str", "required": True},
                "fstype": {"type": "str", "required": True},
                "opts": {"type": "str", "default": "defaults"},
                "owner": {"type": "str"},
                "group": {"type": "str"},
                "mode": {"type": "raw"},
            }},
            "fstab": {"type": "path", "default": "/etc/fstab"},
            "services": {"type": "list", "elements": "dict", "default": [], "options": {
                "name": {"type": "str", "required": True},
                "enabled": {"type": "bool", "default": True},
                "restart_when_changed": {"type": "list", "elements": "path", "default": []},
            }},
            "prepare_data": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    prepare = None
    if module.params["prepare_data"] is not None:
        # checked before anything is applied: a bad request changes nothing
        checked = ArgumentSpecValidator(prepare_data.OPTIONS).validate(module.params["prepare_data"])
        if checked.error_messages:
            module.fail_json(msg="prepare_data: %s" % "; ".join(checked.error_messages))
        prepare = checked.validated_parameters
    changed_paths = apply_files(module, module.params["files"])
    mounted = [m["path"] for m in module.params["mounts"] if _mount(module, m)]
    # the mounted roots' owner and mode (the shared volume's, set by the node that owns it)
    changed_paths += apply_files(module, [dict(path=m["path"], state="directory", owner=m["owner"], group=m["group"],
                                               mode=m["mode"]) for m in module.params["mounts"]
                                          if any(m[k] is not None for k in ("owner", "group", "mode"))])
    services = _services(module, changed_paths)
    result = {"changed_paths": changed_paths, "mounted": mounted, "services": services}
    if prepare is not None:
        result["prepare_data"] = prepare_data.prepare_once(module, prepare)
    changed = bool(changed_paths or mounted or services or (result.get("prepare_data") or {}).get("changed"))
    module.exit_json(changed=changed, **result)


if __name__ == "__main__":
    main()
