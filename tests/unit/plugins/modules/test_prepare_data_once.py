"""dynatrain.elastic.prepare_data_once: the prepare-data script once per node, in one module run (issue 28,
item 1). The marker only after exit 0, removed after a failure; the message says why; check mode runs nothing."""
from __future__ import annotations

import json
import os
import pwd
import stat
import sys

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dynatrain.elastic.plugins.modules import prepare_data_once

ME = pwd.getpwuid(os.getuid()).pw_name


def run(capsys, tmp_path, script, check=False, **params):
    marker_dir = tmp_path / "efs"
    marker_dir.mkdir(exist_ok=True)
    args = {"script": str(script), "python": sys.executable, "user": ME, "data_dir": str(tmp_path / "data"),
            "marker": str(marker_dir / "prepare_data_success_10.0.0.5"), "marker_content": "ip=10.0.0.5\n",
            "_ansible_check_mode": check}
    args.update(params)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            prepare_data_once.main()
    return json.loads(capsys.readouterr().out)


def script(tmp_path, body):
    path = tmp_path / "prepare.py"
    path.write_text("import os, sys\n" + body)
    return path


def test_runs_once_writes_the_marker_then_does_nothing(tmp_path, capsys):
    s = script(tmp_path, "open(os.path.join(os.environ['HOME'], 'ran'), 'a').write('x')\n"
                         "open(%r, 'a').write(os.environ['DT_SEED'] + ' '.join(sys.argv[1:]))\n" % str(tmp_path / "out"))
    out = run(capsys, tmp_path, s, args=["--n", "2"], environment={"DT_SEED": "7"})
    marker = tmp_path / "efs" / "prepare_data_success_10.0.0.5"
    assert out["changed"] and out["ran"] and out["rc"] == 0
    assert (tmp_path / "out").read_text() == "7--n 2"
    text = marker.read_text()
    assert text.startswith("ip=10.0.0.5\nfinished=") and text.endswith("Z\n")
    assert stat.S_IMODE(os.stat(marker).st_mode) == 0o644 and (tmp_path / "data").is_dir()
    again = run(capsys, tmp_path, s, args=["--n", "2"], environment={"DT_SEED": "7"})
    assert again == {"changed": False, "ran": False, "invocation": again["invocation"]}
    assert (tmp_path / "out").read_text() == "7--n 2"                  # not run again


def test_a_failure_removes_the_marker_and_says_why(tmp_path, capsys):
    marker = tmp_path / "efs" / "prepare_data_success_10.0.0.5"
    (tmp_path / "efs").mkdir()
    marker.write_text("old\n")
    s = script(tmp_path, "sys.stderr.write('boom: no data set\\n'); sys.exit(3)\n")
    out = run(capsys, tmp_path, s, force=True)
    assert out["failed"] and out["rc"] == 3 and not marker.exists()
    assert "exit code 3" in out["msg"] and "boom: no data set" in out["msg"] and "Missing" not in out["msg"]


def test_a_missing_interpreter_is_named_and_a_timeout_is_said(tmp_path, capsys):
    s = script(tmp_path, "pass\n")
    out = run(capsys, tmp_path, s, python=str(tmp_path / "no-venv" / "python"))
    assert out["failed"] and "Missing: %s (prepare_data_script" % (tmp_path / "no-venv" / "python") in out["msg"]
    assert str(s) + "," not in out["msg"]
    slow = script(tmp_path, "import time; time.sleep(30)\n")
    out = run(capsys, tmp_path, slow, timeout=1)
    assert out["failed"] and "timed out after 1 s" in out["msg"]
    assert not (tmp_path / "efs" / "prepare_data_success_10.0.0.5").exists()


def test_check_mode_runs_nothing_and_a_missing_marker_directory_is_refused(tmp_path, capsys):
    s = script(tmp_path, "open(%r, 'w').write('ran')\n" % str(tmp_path / "out"))
    out = run(capsys, tmp_path, s, check=True)
    assert out["changed"] and out["ran"] and not (tmp_path / "out").exists() and not (tmp_path / "data").exists()
    out = run(capsys, tmp_path, s, marker=str(tmp_path / "unmounted" / "prepare_data_success_10.0.0.5"))
    assert out["failed"] and "does not exist on this node: mount the shared volume first" in out["msg"]
    assert not (tmp_path / "out").exists()


def test_the_marker_belongs_to_the_user(tmp_path, capsys, monkeypatch):
    """Owner and mode set on the temporary file stay on the marker (chown is watched: the test runs as one user)."""
    owners = []
    monkeypatch.setattr(os, "chown", lambda path, uid, gid: owners.append((os.path.basename(path), uid)))
    s = script(tmp_path, "pass\n")
    out = run(capsys, tmp_path, s)
    marker = tmp_path / "efs" / "prepare_data_success_10.0.0.5"
    assert out["changed"] and marker.exists() and stat.S_IMODE(os.stat(marker).st_mode) == 0o644
    assert [o for o in owners if o[0].startswith(".prepare_data.")] == [(owners[-1][0], pwd.getpwnam(ME).pw_uid)]
    assert not [f for f in os.listdir(tmp_path / "efs") if f.startswith(".")]
