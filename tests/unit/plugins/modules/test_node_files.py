"""dynatrain.elastic.node_files: a role's directories and small files in one module run (issue 28, item 1:
a node from a baked image is configured in few module runs). Idempotent, check mode honoured, in order."""
from __future__ import annotations

import json
import os
import stat

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
