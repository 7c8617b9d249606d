"""dynatrain.elastic.node_files: a role's directories and small files in one module run (issue 28, item 1:
a node from a baked image is configured in few module runs). Idempotent, check mode honoured, in order."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dynatrain.elastic.plugins.modules import node_files


def run(capsys, files, check=False):
    with patch_module_args({"files": files, "_ansible_check_mode": check}):
        with pytest.raises(SystemExit):
            node_files.main()
    return json.loads(capsys.readouterr().out)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_applies_in_order_then_changes_nothing(tmp_path, capsys):
    d, f = tmp_path / "etc" / "dt", tmp_path / "etc" / "dt" / "settings"
    files = [{"path": str(d), "state": "directory", "mode": "0750"},
             {"path": str(f), "content": "A=1\n", "mode": "0600"}]
    out = run(capsys, files)
    assert out["changed"] and out["changed_paths"] == [str(d), str(f)]
    assert f.read_text() == "A=1\n" and mode(d) == 0o750 and mode(f) == 0o600
    again = run(capsys, files)
    assert again["changed"] is False and again["changed_paths"] == []


def test_check_mode_says_what_would_change_and_touches_nothing(tmp_path, capsys):
    d, f = tmp_path / "new", tmp_path / "new" / "unit"
    out = run(capsys, [{"path": str(d), "state": "directory"}, {"path": str(f), "content": "x"}], check=True)
    assert out["changed"] and out["changed_paths"] == [str(d), str(f)] and not d.exists()


def test_a_changed_content_or_mode_is_rewritten_alone(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("old\n")
    b.write_text("same\n")
    os.chmod(b, 0o644)
    out = run(capsys, [{"path": str(a), "content": "new\n"}, {"path": str(b), "content": "same\n", "mode": "0600"}])
    assert out["changed_paths"] == [str(a), str(b)] and a.read_text() == "new\n" and mode(b) == 0o600
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]      # no temporary file left


def test_absent_removes_a_file_and_is_quiet_when_gone(tmp_path, capsys):
    key = tmp_path / "id"
    key.write_text("secret")
    assert run(capsys, [{"path": str(key), "state": "absent"}])["changed_paths"] == [str(key)]
    assert not key.exists()
    assert run(capsys, [{"path": str(key), "state": "absent"}])["changed"] is False


@pytest.mark.parametrize("files, says", [
    ([{"path": "{tmp}/missing/f", "content": "x"}], "does not exist; list it before the file"),
    ([{"path": "{tmp}/f"}], "needs content"),
    ([{"path": "{tmp}", "state": "absent"}], "removes files and links only"),
    ([{"path": "{tmp}", "content": "x"}], "is a directory"),
    ([{"path": "relative/f", "content": "x"}], "not an absolute path"),
    ([{"path": "{tmp}/k", "state": "line"}], "needs line"),
    ([{"path": "{tmp}/k", "state": "line", "line": "x", "match": "("}], "is not a regular expression"),
])
def test_bad_entries_are_refused_with_what_to_do(tmp_path, capsys, files, says):
    files = [dict(e, path=e["path"].format(tmp=tmp_path)) for e in files]
    out = run(capsys, files)
    assert out["failed"] and says in out["msg"]


def test_a_line_entry_keeps_the_other_lines_and_updates_its_own_in_place(tmp_path, capsys):
    keys = tmp_path / "authorized_keys"
    keys.write_text("ssh-rsa AAAAadmin admin@laptop\nssh-ed25519 AAAAcluster old\nssh-ed25519 AAAAcluster dup\n")
    entry = {"path": str(keys), "state": "line", "line": 'from="10.0.1.0/24" ssh-ed25519 AAAAcluster dt',
             "match": r"(^|\s)ssh-ed25519 AAAAcluster(\s|$)", "mode": "0600"}
    out = run(capsys, [entry])
    assert out["changed_paths"] == [str(keys)] and mode(keys) == 0o600
    assert keys.read_text() == 'ssh-rsa AAAAadmin admin@laptop\nfrom="10.0.1.0/24" ssh-ed25519 AAAAcluster dt\n'
    assert run(capsys, [entry])["changed"] is False
    fresh = tmp_path / "new_keys"
    out = run(capsys, [dict(entry, path=str(fresh))], check=True)
    assert out["changed"] and not fresh.exists()
    run(capsys, [dict(entry, path=str(fresh))])
    assert fresh.read_text() == 'from="10.0.1.0/24" ssh-ed25519 AAAAcluster dt\n'


def test_with_line_without_match_finds_the_very_same_line():
    assert node_files.with_line("a\nb\n", "b", None) == "a\nb\n"
    assert node_files.with_line("a\nbb", "b", None) == "a\nbb\nb\n"


def test_a_path_under_a_users_home_is_expanded_on_the_node(tmp_path, capsys, monkeypatch):
    # node_base's known_hosts entry point gives ~<user>/.ssh/...: the node finds the home, no lookup first
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    out = run(capsys, [{"path": "~/.ssh/known_hosts_dynatrain", "content": "127.0.0.2 ssh-ed25519 AAAA\n", "mode": "0644"}])
    made = tmp_path / ".ssh" / "known_hosts_dynatrain"
    assert out["changed"] and out["changed_paths"] == [str(made)]
    assert made.read_text() == "127.0.0.2 ssh-ed25519 AAAA\n" and mode(made) == 0o644


MARKER = "# {mark} dynatrain.elastic cluster hosts (managed by Ansible)"


def blockinfile(capsys, path, block):
    """The file ansible.builtin.blockinfile makes (as node_base's client side used it: no hosts, state=absent)."""
    from ansible.modules import blockinfile as module
    with patch_module_args({"path": str(path), "block": block, "marker": MARKER, "create": True,
                            "state": "present" if block else "absent"}):
        with pytest.raises(SystemExit):
            module.main()
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("before", [
    None,                                                                       # no file yet
    "Host bastion\n    User admin\n",                                           # the user's own, kept
    "Host a\n# BEGIN dynatrain.elastic cluster hosts (managed by Ansible)\nHost 10.0.0.9\n"
    "# END dynatrain.elastic cluster hosts (managed by Ansible)\nHost b\n",      # an old block, in place
    "no newline at the end",
])
@pytest.mark.parametrize("block", ["Host 10.0.0.5 10.0.0.6\n    StrictHostKeyChecking yes", ""])
def test_a_block_entry_makes_the_file_blockinfile_makes(tmp_path, capsys, before, block):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for path in (ours, theirs):
        if before is not None:
            path.write_text(before)
    blockinfile(capsys, theirs, block)
    entry = {"path": str(ours), "state": "block", "content": block, "marker": MARKER}
    out = run(capsys, [entry])
    after = theirs.read_text() if theirs.exists() else None
    assert (ours.read_text() if ours.exists() else None) == after
    assert out["changed"] == (after != before)
    assert run(capsys, [entry])["changed"] is False                            # a second run changes nothing


def test_a_block_entry_needs_its_marker(tmp_path, capsys):
    out = run(capsys, [{"path": str(tmp_path / "c"), "state": "block", "content": "x", "marker": "# ours"}])
    assert out["failed"] and "needs marker, a line with {mark}" in out["msg"]


def watch_modes(monkeypatch, target):
    """Every mode ``target`` is given, by chmod or by the rename that makes it (issue 40: a new file was renamed in
    at the umask's 0644 and chmodded to 0600 after, readable in between)."""
    seen, real_chmod, real_rename, real_replace = [], os.chmod, os.rename, os.replace

    def chmod(path, mode_, *a, **kw):
        if os.fsdecode(path) == str(target):
            seen.append(("chmod", mode_))
        return real_chmod(path, mode_, *a, **kw)

    def rename(src, dst, *a, **kw):
        result = (real_rename if rename.real is real_rename else real_replace)(src, dst, *a, **kw)
        if os.fsdecode(dst) == str(target):
            seen.append(("rename", mode(target)))
        return result

    rename.real = real_rename
    monkeypatch.setattr(os, "chmod", chmod)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", rename)
    return seen


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000])
def test_a_new_file_is_created_with_its_final_mode(tmp_path, capsys, monkeypatch, umask):
    secret = tmp_path / "train.env"
    seen = watch_modes(monkeypatch, secret)
    old = os.umask(umask)
    try:
        out = run(capsys, [{"path": str(secret), "content": "TOKEN=x\n", "mode": "0600"}])
        wide = tmp_path / "settings"
        wide_seen = watch_modes(monkeypatch, wide)
        run(capsys, [{"path": str(wide), "content": "A=1\n", "mode": "0644"}])     # not narrowed by the umask
    finally:
        os.umask(old)
    assert out["changed_paths"] == [str(secret)] and secret.read_text() == "TOKEN=x\n"
    assert seen and all(m == 0o600 for _how, m in seen), seen
    assert wide_seen and all(m == 0o644 for _how, m in wide_seen) and mode(wide) == 0o644


def test_a_rewritten_file_gets_its_new_mode_before_its_new_content(tmp_path, capsys, monkeypatch):
    f = tmp_path / "key"
    f.write_text("public\n")
    os.chmod(f, 0o644)
    seen = watch_modes(monkeypatch, f)
    run(capsys, [{"path": str(f), "content": "secret\n", "mode": "u=rw,g=,o="}])     # symbolic works too
    assert f.read_text() == "secret\n" and seen[0] == ("rename", 0o600) and mode(f) == 0o600
    # no mode given: the file keeps its own
    os.chmod(f, 0o640)
    run(capsys, [{"path": str(f), "content": "again\n"}])
    assert mode(f) == 0o640


KH = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA"


def test_a_known_hosts_entry_merges_and_never_drops_other_hosts(tmp_path, capsys):
    # issue 40: the master's copy was replaced whole by the controller's copy as each add read it; an add that
    # read it before another's pins dropped that add's workers (the launcher's strict checking then failed them)
    kh = tmp_path / "known_hosts_dynatrain"
    kh.write_text(f"# ours\n10.0.0.1 {KH}master\n10.0.0.7 {KH}addB\n10.0.0.5,54.1.2.3 {KH}old\n")
    entry = {"path": str(kh), "state": "known_hosts", "mode": "0644",
             "content": f"10.0.0.1 {KH}master\n10.0.0.5 {KH}new\n10.0.0.6 {KH}addA\n"}
    out = run(capsys, [entry])
    assert out["changed_paths"] == [str(kh)]
    assert kh.read_text() == (f"# ours\n10.0.0.1 {KH}master\n10.0.0.7 {KH}addB\n"
                              f"10.0.0.5 {KH}new\n10.0.0.6 {KH}addA\n")        # the re-used address re-pinned
    assert run(capsys, [entry])["changed"] is False and mode(kh) == 0o644
    assert (tmp_path / "known_hosts_dynatrain.lock").exists()                   # the lock its writers share
    fresh = tmp_path / "fresh"
    check = run(capsys, [dict(entry, path=str(fresh))], check=True)
    assert check["changed"] and not fresh.exists() and not (tmp_path / "fresh.lock").exists()


def test_two_known_hosts_merges_at_once_keep_both(tmp_path):
    # two adds' module runs on the master at the same time, each with the controller's copy it read
    kh = tmp_path / "known_hosts_dynatrain"
    kh.write_text(f"10.0.0.1 {KH}master\n")
    script = (
        "import json, sys\n"
        "from ansible.module_utils.testing import patch_module_args\n"
        "from ansible_collections.dynatrain.elastic.plugins.modules import node_files\n"
        "with patch_module_args({'files': [{'path': sys.argv[1], 'state': 'known_hosts', 'content': sys.argv[2]}]}):\n"
        "    try:\n        node_files.main()\n    except SystemExit:\n        pass\n")
    procs = []
    for n in range(8):
        content = f"10.0.0.1 {KH}master\n10.0.1.{n} {KH}w{n}\n"
        procs.append(subprocess.Popen([sys.executable, "-c", script, str(kh), content], stdout=subprocess.PIPE,
                                      env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))))
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(not o.get("failed") for o in outs), outs
    lines = kh.read_text().splitlines()
    assert sorted(lines) == sorted([f"10.0.0.1 {KH}master"] + [f"10.0.1.{n} {KH}w{n}" for n in range(8)])


@pytest.mark.parametrize("entry", [
    {"state": "known_hosts", "content": f"10.0.0.1 {KH}master\n"},
    {"state": "line", "line": "x"},
    {"state": "block", "content": "x", "marker": MARKER},
])
def test_an_edit_never_copies_a_linked_files_text(tmp_path, capsys, entry):
    # the file is in the node user's home, the module runs as root: a planted link must not pull a secret in
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret:19000::::::\n")
    os.chmod(secret, 0o600)
    link = tmp_path / "known_hosts_dynatrain"
    link.symlink_to(secret)
    out = run(capsys, [dict(entry, path=str(link), mode="0644")])
    assert out["failed"] and "is a link: refused" in out["msg"]
    assert link.is_symlink() and secret.read_text() == "root:$6$secret:19000::::::\n" and mode(secret) == 0o600
