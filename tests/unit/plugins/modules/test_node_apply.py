"""dynatrain.elastic.node_apply: a baked worker's per-cluster configuration in one module run (issue 28, item 1):
files, then the shared volume's fstab line and mount, then services, then the data. mount, umount and systemctl
are stand-in programs on PATH that record their calls (the test cannot mount or run systemd)."""
from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dynatrain.elastic.plugins.modules import node_apply

ME = os.environ.get("USER") or __import__("pwd").getpwuid(os.getuid()).pw_name


@pytest.fixture
def node(tmp_path, monkeypatch):
    """Stand-in mount, umount and systemctl (calls in calls.log; FAIL_<program> makes one fail, and
    FAIL_<program>_IF_FSTAB_HAS=TEXT while tmp/fstab holds TEXT; the services
    named in tmp/enabled and tmp/active are enabled and running); the kernel's mount table in tmp/mounted."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for prog in ("mount", "umount", "systemctl"):
        (bin_dir / prog).write_text(f"""#!/bin/sh
echo "{prog} $*" >> {tmp_path}/calls.log
[ -n "$FAIL_{prog}" ] && {{ echo "{prog}: refused" >&2; exit 32; }}
[ -n "$FAIL_{prog}_IF_FSTAB_HAS" ] && grep -q -- "$FAIL_{prog}_IF_FSTAB_HAS" {tmp_path}/fstab && {{ echo "{prog}: bad option" >&2; exit 32; }}
if [ "{prog}" = systemctl ]; then
  case "$1" in
    is-enabled) grep -qx "$3" {tmp_path}/enabled 2>/dev/null; exit $? ;;
    is-active) grep -qx "$3" {tmp_path}/active 2>/dev/null; exit $? ;;
  esac
fi
exit 0
""")
        os.chmod(bin_dir / prog, 0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    mounted = tmp_path / "mounted"
    mounted.write_text("")
    monkeypatch.setattr(node_apply, "mountpoints", lambda: set(mounted.read_text().split()))
    (tmp_path / "fstab").write_text("# static file system information\nUUID=abc / ext4 defaults 0 1\n")
    return tmp_path


def run(capsys, node, check=False, **args):
    args.setdefault("fstab", str(node / "fstab"))
    with patch_module_args(dict(args, _ansible_check_mode=check)):
        with pytest.raises(SystemExit):
            node_apply.main()
    return json.loads(capsys.readouterr().out)


def calls(node):
    log = node / "calls.log"
    out = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return out


def volume(node, src="/localcloud/efs/fs-1", opts="bind"):
    return {"path": str(node / "efs"), "src": src, "fstype": "none", "opts": opts}


def test_mounts_once_and_writes_the_line_the_mount_module_writes(node, capsys):
    out = run(capsys, node, mounts=[volume(node)])
    assert out["changed"] and out["mounted"] == [str(node / "efs")] and (node / "efs").is_dir()
    assert (node / "fstab").read_text().splitlines()[-1] == f"/localcloud/efs/fs-1 {node}/efs none bind 0 0"
    assert calls(node) == [f"mount {node}/efs"]
    (node / "mounted").write_text(str(node / "efs"))
    again = run(capsys, node, mounts=[volume(node)])
    assert again["changed"] is False and calls(node) == []
    # new options: the line is replaced in place, and the volume mounted again
    third = run(capsys, node, mounts=[volume(node, opts="bind,ro")])
    assert third["mounted"] == [str(node / "efs")] and calls(node) == [f"umount {node}/efs", f"mount {node}/efs"]
    assert [line for line in (node / "fstab").read_text().splitlines() if "efs" in line] == [
        f"/localcloud/efs/fs-1 {node}/efs none bind,ro 0 0"]


def test_a_mount_that_fails_leaves_fstab_as_it_was(node, capsys, monkeypatch):
    before = (node / "fstab").read_text()
    monkeypatch.setenv("FAIL_mount", "1")
    prepare = {"script": "/x", "python": "/y", "user": ME, "marker": str(node / "m"), "marker_content": ""}
    out = run(capsys, node, mounts=[volume(node)], prepare_data=prepare)
    assert out["failed"] and "Could not mount /localcloud/efs/fs-1" in out["msg"] and "mount: refused" in out["msg"]
    assert (node / "fstab").read_text() == before and not (node / "efs").exists()


def test_services_start_and_restart_only_when_their_files_changed(node, capsys):
    unit = node / "w.service"
    files = [{"path": str(unit), "content": "[Service]\nExecStart=/bin/true\n"}]
    services = [{"name": "w", "restart_when_changed": [str(unit)]}]
    out = run(capsys, node, files=files, services=services)
    assert out["services"] == {"w": ["enable", "restart"]}
    assert calls(node) == ["systemctl daemon-reload", "systemctl is-enabled --quiet w",
                           "systemctl enable w", "systemctl restart w"]
    (node / "enabled").write_text("w\n")
    (node / "active").write_text("w\n")
    again = run(capsys, node, files=files, services=services)
    assert again["changed"] is False and again["services"] == {}
    assert calls(node) == ["systemctl is-enabled --quiet w", "systemctl is-active --quiet w"]
    (node / "active").write_text("")
    assert run(capsys, node, files=files, services=services)["services"] == {"w": ["start"]}


def test_check_mode_changes_nothing(node, capsys):
    f = node / "etc" / "settings"
    out = run(capsys, node, check=True, files=[{"path": str(f.parent), "state": "directory"},
                                               {"path": str(f), "content": "A=1\n"}],
              mounts=[volume(node)], services=[{"name": "w", "restart_when_changed": [str(f)]}])
    assert out["changed"] and out["mounted"] == [str(node / "efs")] and out["services"] == {"w": ["enable", "restart"]}
    assert not f.parent.exists() and not (node / "efs").exists() and "efs" not in (node / "fstab").read_text()
    assert [c for c in calls(node) if not c.startswith("systemctl is-")] == []


def test_the_data_is_prepared_last_and_once(node, capsys):
    script = node / "prep.py"
    script.write_text(f"import os\nassert os.path.isdir({str(node / 'efs')!r})\n")
    prepare = {"script": str(script), "python": sys.executable, "user": ME, "marker": str(node / "efs" / "ok"),
               "marker_content": "ip=10.0.0.5"}
    out = run(capsys, node, mounts=[volume(node)], prepare_data=prepare)
    assert out["prepare_data"]["ran"] and (node / "efs" / "ok").read_text().startswith("ip=10.0.0.5\n")
    (node / "mounted").write_text(str(node / "efs"))
    again = run(capsys, node, mounts=[volume(node)], prepare_data=prepare)
    assert again["changed"] is False and again["prepare_data"]["ran"] is False


def test_a_bad_data_request_is_refused_before_anything_is_applied(node, capsys):
    f = node / "settings"
    out = run(capsys, node, files=[{"path": str(f), "content": "A=1\n"}], prepare_data={"script": "/x"})
    assert out["failed"] and out["msg"].startswith("prepare_data: ") and "python" in out["msg"]
    assert not f.exists()


def test_file_contents_are_not_logged(node, capsys):
    secret = "TOKEN=s3cr3t-value-123"
    f = node / "train.env"
    out = run(capsys, node, files=[{"path": str(f), "content": secret + "\n", "mode": "0600"}])
    assert out["changed_paths"] == [str(f)] and stat.S_IMODE(os.stat(f).st_mode) == 0o600
    assert "s3cr3t-value-123" not in json.dumps(out)


def test_the_mounted_root_gets_its_owner_and_mode_after_the_mount(node, capsys, monkeypatch):
    # the master's shared volume (efs_set_owner): the root of what is mounted, not the mount point before it
    log, seen, real = node / "calls.log", [], node_apply.apply_files

    def apply_files(module, entries):
        if any(e["path"] == str(node / "efs") for e in entries):
            seen.extend(log.read_text().splitlines() if log.exists() else [])       # the calls made by then
        return real(module, entries)

    monkeypatch.setattr(node_apply, "apply_files", apply_files)
    out = run(capsys, node, mounts=[dict(volume(node), owner=ME, mode="0775")])
    assert seen == [f"mount {node}/efs"]                                            # set once it is mounted
    assert stat.S_IMODE(os.stat(node / "efs").st_mode) == 0o775
    assert out["changed_paths"] == [str(node / "efs")] and out["mounted"] == [str(node / "efs")]
    (node / "mounted").write_text(str(node / "efs"))
    calls(node)
    again = run(capsys, node, mounts=[dict(volume(node), owner=ME, mode="0775")])
    assert again["changed"] is False and again["changed_paths"] == [] and calls(node) == []


def mounted_volume(node, capsys):
    """The volume mounted with its first line (bind); fstab as it is then."""
    run(capsys, node, mounts=[volume(node)])
    (node / "mounted").write_text(str(node / "efs"))
    calls(node)
    return (node / "fstab").read_text()


def test_a_busy_volume_fails_the_remount_with_nothing_changed_and_the_next_run_retries(node, capsys, monkeypatch):
    # issue 40: fstab was rewritten before the umount; a busy volume failed the run and left the new line, and
    # the next run found nothing to do: the old options stayed in force (a switch to TLS never took effect)
    before = mounted_volume(node, capsys)
    monkeypatch.setenv("FAIL_umount", "1")
    out = run(capsys, node, mounts=[volume(node, opts="bind,ro")])
    assert out["failed"] and "could not be unmounted" in out["msg"] and "umount: refused" in out["msg"]
    assert "Nothing was changed" in out["msg"]
    assert (node / "fstab").read_text() == before and calls(node) == [f"umount {node}/efs"]
    monkeypatch.delenv("FAIL_umount")
    again = run(capsys, node, mounts=[volume(node, opts="bind,ro")])
    assert again["changed"] and again["mounted"] == [str(node / "efs")]
    assert calls(node) == [f"umount {node}/efs", f"mount {node}/efs"] and "none bind,ro 0 0" in (node / "fstab").read_text()


def test_a_remount_whose_new_line_fails_restores_fstab_and_the_old_mount(node, capsys, monkeypatch):
    before = mounted_volume(node, capsys)
    monkeypatch.setenv("FAIL_mount_IF_FSTAB_HAS", "bind,tls")      # the new options do not mount; the old ones do
    out = run(capsys, node, mounts=[volume(node, opts="bind,tls")])
    assert out["failed"] and "mount: bad option" in out["msg"]
    assert "/etc/fstab is as it was" in out["msg"] and "mounted again with its old line" in out["msg"]
    assert (node / "fstab").read_text() == before
    assert calls(node) == [f"umount {node}/efs", f"mount {node}/efs", f"mount {node}/efs"]


def test_a_remount_that_cannot_mount_either_line_says_it_is_not_mounted(node, capsys, monkeypatch):
    before = mounted_volume(node, capsys)
    monkeypatch.setenv("FAIL_mount", "1")
    out = run(capsys, node, mounts=[volume(node, opts="bind,tls")])
    assert out["failed"] and "it is NOT mounted" in out["msg"] and (node / "fstab").read_text() == before
