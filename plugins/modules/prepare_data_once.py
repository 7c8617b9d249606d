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

import datetime
import os
import pwd
import subprocess
import tempfile

from ansible.module_utils.basic import AnsibleModule

KILL_AFTER = 30
TIMED_OUT = (124, 137)


def _data_dir(module, path, account):
    """The data directory, owned by the user with mode 0755 (created with its parents when missing);
    True when it was (or, in check mode, would be) created or changed."""
    if not path:
        return False
    if os.path.isdir(path):
        st = os.stat(path)
        if (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (account.pw_uid, account.pw_gid, 0o755):
            return False
    elif os.path.lexists(path):
        module.fail_json(msg="prepare_data_data_dir %s exists and is not a directory." % path)
    if module.check_mode:
        return True
    os.makedirs(path, 0o755, exist_ok=True)
    os.chown(path, account.pw_uid, account.pw_gid)
    os.chmod(path, 0o755)
    return True


def _run(module, account):
    """The script as the user, under GNU timeout; returns (rc, stderr lines)."""
    p = module.params
    env = dict(os.environ, HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
    env.update({k: str(v) for k, v in p["environment"].items()})
    argv = ["timeout", "--kill-after=%d" % KILL_AFTER, str(p["timeout"]), p["python"], p["script"]] + p["args"]
    groups = os.getgrouplist(account.pw_name, account.pw_gid)
    try:
        proc = subprocess.run(argv, env=env, cwd=account.pw_dir if os.path.isdir(account.pw_dir) else "/",
                              user=account.pw_uid, group=account.pw_gid, extra_groups=groups,
                              stdin=subprocess.DEVNULL, capture_output=True, check=False)
    except OSError as e:
        module.fail_json(msg="could not run %s: %s (GNU timeout, from coreutils, is needed on the node)." % (argv[0], e))
    return proc.returncode, proc.stderr.decode("utf-8", "replace").splitlines()[-15:]


def _write_marker(module, account):
    p = module.params
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(p["marker"]), prefix=".prepare_data.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(p["marker_content"].rstrip("\n") + "\n" if p["marker_content"] else "")
            fh.write("finished=%sZ\n" % datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None).isoformat())
        os.chown(tmp, account.pw_uid, account.pw_gid)
        os.chmod(tmp, 0o644)
        os.replace(tmp, p["marker"])     # atomic in one directory; atomic_move would reset the owner
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _failure(module, rc, stderr):
    """Remove the marker, say why the run failed."""
    p = module.params
    if os.path.lexists(p["marker"]):
        os.unlink(p["marker"])
    why = "timed out after %d s" % p["timeout"] if rc in TIMED_OUT else "exit code %d" % rc
    missing = [path for path in (p["script"], p["python"]) if not os.path.exists(path)]
    note = ("Missing: %s (prepare_data_script / prepare_data_python; is the shared volume mounted, and did the"
            " mxnet role make the venv?). " % ", ".join(missing)) if missing else ""
    module.fail_json(
        msg="The prepare-data script %s failed on this node (%s); no success marker %s. %sstderr (last lines): %s"
            % (p["script"], why, os.path.basename(p["marker"]), note, " | ".join(stderr)),
        ran=True, rc=rc, stderr_lines=stderr)


def main():
    module = AnsibleModule(
        argument_spec={
            "script": {"type": "path", "required": True},
            "python": {"type": "str", "required": True},
            "args": {"type": "list", "elements": "str", "default": []},
            "environment": {"type": "dict", "default": {}},
            "timeout": {"type": "int", "default": 1800},
            "user": {"type": "str", "required": True},
            "data_dir": {"type": "path", "default": ""},
            "marker": {"type": "path", "required": True},
            "marker_content": {"type": "str", "required": True},
            "force": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    marker_dir = os.path.dirname(p["marker"])
    if not os.path.isdir(marker_dir):
        module.fail_json(msg="prepare_data_marker_dir=%s does not exist on this node: mount the shared volume first"
                             " (efs role) or point prepare_data_marker_dir at it." % marker_dir)
    if p["timeout"] <= 0:
        module.fail_json(msg="prepare_data_timeout must be a number of seconds > 0 (got %d)." % p["timeout"])
    try:
        account = pwd.getpwnam(p["user"])
    except KeyError:
        module.fail_json(msg="prepare_data_user %s does not exist on this node." % p["user"])
    dir_changed = _data_dir(module, p["data_dir"], account)
    if os.path.exists(p["marker"]) and not p["force"]:
        module.exit_json(changed=dir_changed, ran=False)
    if module.check_mode:
        module.exit_json(changed=True, ran=True)
    rc, stderr = _run(module, account)
    if rc != 0:
        _failure(module, rc, stderr)
    _write_marker(module, account)
    module.exit_json(changed=True, ran=True, rc=rc, stderr_lines=stderr)


if __name__ == "__main__":
    main()
