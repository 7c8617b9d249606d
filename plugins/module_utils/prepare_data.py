# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""A node's prepare-data script run once, its success recorded by a marker on the shared volume: the logic of
dynatrain.elastic.prepare_data_once, also run by dynatrain.elastic.node_apply (a baked worker in one module run)."""

from __future__ import annotations

import datetime
import os
import pwd
import subprocess
import tempfile


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


def _run(module, p, account):
    """The script as the user, under GNU timeout; returns (rc, stderr lines)."""
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


def _write_marker(p, account):
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


def _failure(module, p, rc, stderr):
    """Remove the marker, say why the run failed."""
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


# The module's options (prepare_data_once's, and node_apply's O(prepare_data)).
OPTIONS = {
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
}


def prepare_once(module, p):
    """Prepare the node's data unless its marker says it is (p: OPTIONS' values); the result to return
    (changed, ran, rc, stderr_lines). A failure fails the module."""
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
        return {"changed": dir_changed, "ran": False}
    if module.check_mode:
        return {"changed": True, "ran": True}
    rc, stderr = _run(module, p, account)
    if rc != 0:
        _failure(module, p, rc, stderr)
    _write_marker(p, account)
    return {"changed": True, "ran": True, "rc": rc, "stderr_lines": stderr}
